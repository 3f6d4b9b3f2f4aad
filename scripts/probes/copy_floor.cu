// The floor of moving a point-to-point message on one GPU: the time per call of a
// device-to-device copy through the copy engines (cudaMemcpyAsync) and through a copy kernel
// (every SM, 16-byte loads and stores), back to back on one stream, at the sizes ringccl-perf
// measures send_recv. A message between two processes on one GPU crosses HBM at least once, so
// neither path can beat these figures there.
// Build and run on the GPU machine (twice at once under MPS to see two processes' share):
//   nvcc -O2 -arch=sm_90 -o copy_floor scripts/probes/copy_floor.cu && ./copy_floor
// Prints, per size, µs per copy (GPU time of 200 copies, event-timed) and GB/s of payload.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
__global__ void copy16(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}
int main() {
  CK(cudaSetDevice(0));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t sizes[] = {8, 4096, 32768, 262144, 1 << 20, 2 << 20, 16 << 20};
  const size_t maxb = 16 << 20;
  void *a, *b; CK(cudaMalloc(&a, maxb)); CK(cudaMalloc(&b, maxb));
  CK(cudaMemset(a, 1, maxb));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const int n = 200;
  printf("%10s %14s %10s %14s %10s\n", "bytes", "memcpy_us", "GB/s", "kernel_us", "GB/s");
  for (size_t bytes : sizes) {
    float ms_ce, ms_k;
    for (int w = 0; w < 20; w++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < n; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&ms_ce, e0, e1));
    size_t n16 = (bytes + 15) / 16;
    int blocks = (int)((n16 + 511) / 512); if (blocks > 2 * sms) blocks = 2 * sms;
    for (int w = 0; w < 20; w++) copy16<<<blocks, 512, 0, s>>>((const int4 *)a, (int4 *)b, n16);
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < n; i++) copy16<<<blocks, 512, 0, s>>>((const int4 *)a, (int4 *)b, n16);
    CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&ms_k, e0, e1));
    CK(cudaGetLastError());
    double ce = ms_ce * 1000.0 / n, k = ms_k * 1000.0 / n;
    printf("%10zu %14.2f %10.1f %14.2f %10.1f\n", bytes, ce, bytes / ce / 1e3, k, bytes / k / 1e3);
  }
  return 0;
}
