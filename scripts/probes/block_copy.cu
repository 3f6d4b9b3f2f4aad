// How fast one block copies: the rate that bounds a point-to-point kernel whose channels are
// one block each (ringccl's `gpu_kernels::p2p`: a posted transfer's channel copies one
// contiguous share of the message straight into the receive buffer, 16 vectors of 16 bytes in
// flight per thread, `prim::copy_deep`). The same copy here, device memory to device memory,
// each block one contiguous share of `bytes`, for several grids and block sizes, back to back
// on one stream.
// Build and run on the GPU machine (twice at once under MPS to see two processes' share):
//   nvcc -O2 -arch=sm_90 -o block_copy scripts/probes/block_copy.cu && ./block_copy
// Prints, per size, block size and grid, µs per copy (GPU time of 200 copies, event-timed),
// GB/s of payload and GB/s per block.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
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
int main() {
  CK(cudaSetDevice(0));
  const size_t sizes[] = {512 << 10, 2 << 20, 8 << 20};
  const int threads[] = {512, 256};
  const int grids[] = {1, 2, 4, 8, 11, 16, 32, 64, 132};
  const size_t maxb = 8 << 20;
  void *a, *b; CK(cudaMalloc(&a, maxb)); CK(cudaMalloc(&b, maxb));
  CK(cudaMemset(a, 1, maxb));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const int n = 200;
  printf("%10s %8s %6s %10s %10s %12s\n", "bytes", "threads", "grid", "us", "GB/s", "GB/s/block");
  for (size_t bytes : sizes)
    for (int t : threads)
      for (int g : grids) {
        size_t n16 = bytes / 16;
        for (int w = 0; w < 20; w++) share_copy<<<g, t, 0, s>>>((const int4 *)a, (int4 *)b, n16);
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < n; i++) share_copy<<<g, t, 0, s>>>((const int4 *)a, (int4 *)b, n16);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = ms * 1000.0 / n, gbs = bytes / us / 1e3;
        printf("%10zu %8d %6d %10.2f %10.1f %12.1f\n", bytes, t, g, us, gbs, gbs / g);
      }
  return 0;
}
