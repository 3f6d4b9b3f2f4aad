// How fast a block copies into ANOTHER process's memory on the same GPU (CUDA IPC, processes
// under MPS), against into its own: the two ends of a point-to-point kernel's zero-copy
// transfer between two processes sharing one GPU (`gpu_kernels::p2p`, `kind::POSTED`: each
// channel, one block, copies its share of the message into the receiver's buffer).
// Two processes, started together, exchange their buffers' IPC handles through files in DIR;
// each then copies with each grid (each block one contiguous share, 16 vectors of 16 bytes in
// flight per thread, as `prim::copy_deep`), into its own buffer, into the peer's (writes
// across) and from the peer's into its own (reads across), both processes at once.
// Build and run on the GPU machine (MPS daemon running):
//   nvcc -O2 -arch=sm_90 -o ipc_copy scripts/probes/ipc_copy.cu
//   ./ipc_copy 0 DIR & ./ipc_copy 1 DIR; wait
// Prints, per size, target and grid, µs per copy (GPU time of 200 copies, event-timed), GB/s
// and GB/s per block.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
#define DEEP 16
__global__ void share_copy(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n16) {
  size_t per = (n16 + gridDim.x - 1) / gridDim.x;
  size_t lo = blockIdx.x * per, hi = lo + per < n16 ? lo + per : n16;
  size_t v = lo + threadIdx.x, step = blockDim.x;
  for (; v + (DEEP - 1) * step < hi; v += DEEP * step) {
    int4 p[DEEP];
#pragma unroll
    for (int u = 0; u < DEEP; u++) p[u] = src[v + u * step];
#pragma unroll
    for (int u = 0; u < DEEP; u++) dst[v + u * step] = p[u];
  }
  for (; v < hi; v += step) dst[v] = src[v];
}
// Waits until every process has written `name.<r>` in `dir` (a crude barrier through files).
static void barrier(const char *dir, const char *name, int me) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.%d", dir, name, me);
  FILE *f = fopen(p, "w"); if (f) fclose(f);
  snprintf(p, sizeof p, "%s/%s.%d", dir, name, 1 - me);
  while (access(p, F_OK) != 0) usleep(1000);
}
int main(int argc, char **argv) {
  if (argc < 3) { printf("usage: ipc_copy RANK(0|1) DIR\n"); return 2; }
  int me = atoi(argv[1]);
  const char *dir = argv[2];
  CK(cudaSetDevice(0));
  const size_t maxb = 8 << 20;
  void *src, *own; CK(cudaMalloc(&src, maxb)); CK(cudaMalloc(&own, maxb));
  CK(cudaMemset(src, 1, maxb));
  cudaIpcMemHandle_t h; CK(cudaIpcGetMemHandle(&h, own));
  char p[512];
  snprintf(p, sizeof p, "%s/handle.%d", dir, me);
  FILE *f = fopen(p, "wb"); fwrite(&h, sizeof h, 1, f); fclose(f);
  barrier(dir, "written", me);
  snprintf(p, sizeof p, "%s/handle.%d", dir, 1 - me);
  f = fopen(p, "rb"); cudaIpcMemHandle_t ph; if (fread(&ph, sizeof ph, 1, f) != 1) return 1; fclose(f);
  void *peer; CK(cudaIpcOpenMemHandle(&peer, ph, cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const size_t sizes[] = {2 << 20, 8 << 20};
  const int grids[] = {1, 8, 16};
  const int n = 200;
  int step = 0;
  printf("%10s %6s %6s %10s %10s %12s\n", "bytes", "what", "grid", "us", "GB/s", "GB/s/block");
  for (size_t bytes : sizes)
    for (int target = 0; target < 3; target++)
      for (int g : grids) {
        // 0: own buffer to own; 1: own to the peer's (writes across); 2: the peer's to own (reads).
        void *from = target == 2 ? peer : src, *dst = target == 1 ? peer : own;
        size_t n16 = bytes / 16;
        char name[32]; snprintf(name, sizeof name, "step%d", step++);
        barrier(dir, name, me);
        for (int w = 0; w < 20; w++) share_copy<<<g, 512, 0, s>>>((const int4 *)from, (int4 *)dst, n16);
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < n; i++) share_copy<<<g, 512, 0, s>>>((const int4 *)from, (int4 *)dst, n16);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = ms * 1000.0 / n, gbs = bytes / us / 1e3;
        printf("%10zu %6s %6d %10.2f %10.1f %12.1f\n", bytes, target == 0 ? "own" : target == 1 ? "write" : "read", g, us, gbs, gbs / g);
      }
  barrier(dir, "done", me);
  CK(cudaIpcCloseMemHandle(peer));
  return 0;
}
