// Host cost of the driver calls a collective's host path issues (a launch, an event record, a
// stream wait on an event, a stream memory write; the queries of a call's validation and
// plan: cuCtxGetCurrent, cuStreamGetCtx, cuStreamGetId, cuStreamGetCaptureInfo_v3,
// cuPointerGetAttributes with the three attributes ringccl asks per buffer), and the round trip of a flag between two
// blocks of one GPU through L2 (the floor of a flag exchange between ranks sharing a GPU); and a
// launch of the LL kernels' shape (their parameter list, 1 and 8 blocks of 512 threads).
// Build and run on the GPU machine (twice at once under MPS to see two processes' cost):
//   nvcc -O2 -arch=sm_90 -o host_cost scripts/probes/host_cost.cu -lcuda && ./host_cost
// Prints µs of host time per iteration of 20000-iteration loops, and the round trip in µs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <chrono>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
#define CD(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { printf("%s: %d\n", #x, (int)e); exit(1);} } while (0)
__global__ void empty() {}
// The LL kernels' parameter list (gpu-kernels/src/entry.rs, `EntryKind::Ll`): src, dst, count,
// scatter, postdiv, 8 LL areas, nranks, rank, ctl, timeout_ns; the body does nothing.
__global__ void ll_shape(unsigned long long src, unsigned long long dst, unsigned long long count,
                         unsigned scatter, unsigned postdiv, unsigned long long a0, unsigned long long a1,
                         unsigned long long a2, unsigned long long a3, unsigned long long a4,
                         unsigned long long a5, unsigned long long a6, unsigned long long a7,
                         unsigned nranks, unsigned rank, unsigned long long ctl, unsigned long long timeout_ns) {}
__global__ void pingpong(volatile unsigned long long *f, int iters, unsigned long long *out) {
  int me = blockIdx.x;
  long long t0 = clock64();
  for (int i = 1; i <= iters; i++) {
    if (me == 0) { f[0] = i; while (f[1] < (unsigned long long)i) {} }
    else { while (f[0] < (unsigned long long)i) {} f[1] = i; }
  }
  if (me == 0 && threadIdx.x == 0) out[0] = clock64() - t0;
}
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char **argv) {
  int n = 20000;
  CK(cudaSetDevice(0));
  cudaStream_t s, s2; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t ev; CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  unsigned long long *word; CK(cudaMalloc(&word, 64));
  void *out0; CK(cudaMalloc(&out0, 4096));
  for (int i = 0; i < 1000; i++) empty<<<1, 32, 0, s>>>();
  CK(cudaStreamSynchronize(s));
  double t;
  t = now(); for (int i = 0; i < n; i++) empty<<<1, 32, 0, s>>>(); double a = (now() - t) / n; CK(cudaStreamSynchronize(s));
  t = now(); for (int i = 0; i < n; i++) { empty<<<1, 32, 0, s>>>(); CK(cudaEventRecord(ev, s)); } double b = (now() - t) / n; CK(cudaStreamSynchronize(s));
  t = now(); for (int i = 0; i < n; i++) { CK(cudaStreamWaitEvent(s, ev, 0)); empty<<<1, 32, 0, s>>>(); CK(cudaEventRecord(ev, s)); } double c = (now() - t) / n; CK(cudaStreamSynchronize(s));
  t = now(); for (int i = 0; i < n; i++) { CK(cudaEventRecord(ev, s)); } double d = (now() - t) / n; CK(cudaStreamSynchronize(s));
  t = now(); for (int i = 0; i < n; i++) { CD(cuStreamWriteValue64((CUstream)s, (CUdeviceptr)word, i, 0)); } double e = (now() - t) / n; CK(cudaStreamSynchronize(s));
  t = now(); for (int i = 0; i < n; i++) { cudaStream_t x = (i & 1) ? s2 : s; CK(cudaStreamWaitEvent(x, ev, 0)); empty<<<1, 32, 0, x>>>(); CK(cudaEventRecord(ev, x)); } double g = (now() - t) / n; CK(cudaDeviceSynchronize());
  printf("host_us launch=%.2f launch+record=%.2f wait+launch+record=%.2f record=%.2f writevalue64=%.2f alt_streams_wait+launch+record=%.2f\n", a, b, c, d, e, g);
  // The queries of one call (as ringccl makes them: the context, the stream's context, id and
  // capture state, and the three pointer attributes of each buffer).
  CUcontext cx; CUstream cs = (CUstream)s; unsigned long long sid;
  CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  CUcontext pc; CUmemoryPool pool; int ord; void *pd[3] = {&pc, &pool, &ord};
  CUstreamCaptureStatus st; cuuint64_t cid; CUgraph gr; const CUgraphNode *deps; const CUgraphEdgeData *edges; size_t nd;
  t = now(); for (int i = 0; i < n; i++) CD(cuCtxGetCurrent(&cx)); double q1 = (now() - t) / n;
  t = now(); for (int i = 0; i < n; i++) CD(cuStreamGetCtx(cs, &cx)); double q2 = (now() - t) / n;
  t = now(); for (int i = 0; i < n; i++) CD(cuStreamGetId(cs, &sid)); double q3 = (now() - t) / n;
  t = now(); for (int i = 0; i < n; i++) CD(cuStreamGetCaptureInfo(cs, &st, &cid, &gr, &deps, &edges, &nd)); double q4 = (now() - t) / n;
  t = now(); for (int i = 0; i < n; i++) CD(cuPointerGetAttributes(3, at, pd, (CUdeviceptr)word)); double q5 = (now() - t) / n;
  t = now(); for (int i = 0; i < n; i++) {
    CD(cuCtxGetCurrent(&cx)); CD(cuStreamGetCtx(cs, &cx)); CD(cuStreamGetId(cs, &sid));
    CD(cuStreamGetCaptureInfo(cs, &st, &cid, &gr, &deps, &edges, &nd));
    CD(cuPointerGetAttributes(3, at, pd, (CUdeviceptr)word)); CD(cuPointerGetAttributes(3, at, pd, (CUdeviceptr)out0));
    empty<<<1, 32, 0, s>>>(); CK(cudaEventRecord(ev, s));
  } double q6 = (now() - t) / n; CK(cudaStreamSynchronize(s));
  printf("host_us ctx_get_current=%.3f stream_get_ctx=%.3f stream_get_id=%.3f stream_get_capture_info=%.3f pointer_get_attributes3=%.3f ringccl_call_shape=%.2f\n", q1, q2, q3, q4, q5, q6);
  // A launch of the LL kernels' shape (17 parameters, 512 threads; 1 and 8 blocks) through the
  // driver API as ringccl launches it, and the eager LL call's driver part as ringccl-perf
  // times it: that launch, the call's end event, the timing event.
  {
    CUfunction f; CK(cudaGetFuncBySymbol((cudaFunction_t *)&f, (const void *)ll_shape));
    unsigned long long z = 0, cnt = 2; unsigned u = 0, one = 1, two = 2;
    void *params[17] = {&z, &z, &cnt, &u, &one, &z, &z, &z, &z, &z, &z, &z, &z, &two, &u, &z, &z};
    cudaEvent_t ev2; CK(cudaEventCreateWithFlags(&ev2, cudaEventDisableTiming));
    for (int i = 0; i < 1000; i++) CD(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, cs, params, 0));
    CK(cudaStreamSynchronize(s));
    t = now(); for (int i = 0; i < n; i++) CD(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, cs, params, 0)); double l1 = (now() - t) / n; CK(cudaStreamSynchronize(s));
    t = now(); for (int i = 0; i < n; i++) CD(cuLaunchKernel(f, 8, 1, 1, 512, 1, 1, 0, cs, params, 0)); double l8 = (now() - t) / n; CK(cudaStreamSynchronize(s));
    t = now(); for (int i = 0; i < n; i++) { CD(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, cs, params, 0)); CK(cudaEventRecord(ev, s)); CK(cudaEventRecord(ev2, s)); } double l3 = (now() - t) / n; CK(cudaStreamSynchronize(s));
    printf("host_us ll_shape_launch_1x512=%.2f ll_shape_launch_8x512=%.2f ll_shape_launch+2_records=%.2f\n", l1, l8, l3);
  }
  unsigned long long *out; CK(cudaMalloc(&out, 8)); CK(cudaMemset(word, 0, 64));
  int iters = 10000;
  pingpong<<<2, 1, 0, s>>>(word, iters, out); CK(cudaStreamSynchronize(s));
  unsigned long long cyc; CK(cudaMemcpy(&cyc, out, 8, cudaMemcpyDeviceToHost));
  int clk; CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  printf("l2_flag_round_trip_us=%.3f (clock %d kHz)\n", (double)cyc / iters / (clk / 1000.0), clk);
  return 0;
}
