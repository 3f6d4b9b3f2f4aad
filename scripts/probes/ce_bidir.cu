// Copy-engine peer bandwidth between GPU 0 and GPU 1: one way, and both ways at once (the
// traffic of a 2-rank all-reduce on the copy engines). Build and run on the GPU machine:
//   nvcc -O2 -o ce_bidir scripts/probes/ce_bidir.cu && ./ce_bidir [MiB]
// Prints GB/s per direction (bytes / time of the slower direction), median of 10 runs.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e), __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  size_t bytes = mib << 20;
  void *src[2], *dst[2];
  cudaStream_t s[2];
  cudaEvent_t a[2], b[2];
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CHECK(cudaMalloc(&src[g], bytes));
    CHECK(cudaMalloc(&dst[g], bytes));
    CHECK(cudaMemset(src[g], g + 1, bytes));
    CHECK(cudaStreamCreateWithFlags(&s[g], cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&a[g]));
    CHECK(cudaEventCreate(&b[g]));
  }
  for (int both = 0; both < 2; ++both) {
    std::vector<double> gbs;
    for (int it = 0; it < 12; ++it) {
      int n = both ? 2 : 1;
      for (int g = 0; g < n; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(a[g], s[g]));
        // GPU g's copy engine pushes its buffer into the other GPU.
        CHECK(cudaMemcpyPeerAsync(dst[1 - g], 1 - g, src[g], g, bytes, s[g]));
        CHECK(cudaEventRecord(b[g], s[g]));
      }
      float worst = 0;
      for (int g = 0; g < n; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventSynchronize(b[g]));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a[g], b[g]));
        worst = std::max(worst, ms);
      }
      if (it >= 2) gbs.push_back(bytes / (worst * 1e-3) / 1e9);
    }
    std::sort(gbs.begin(), gbs.end());
    std::printf("%s, %zu MiB: %.1f GB/s per direction (median of %zu; min %.1f, max %.1f)\n",
                both ? "both ways at once" : "one way (GPU 0 -> GPU 1)", mib,
                gbs[gbs.size() / 2], gbs.size(), gbs.front(), gbs.back());
  }
  return 0;
}
