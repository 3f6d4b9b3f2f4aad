/* Every collective of nccl.h through ringccl's libnccl.so.2, every type, against a CPU
 * reference, on the GPUs of one machine.
 *
 *   collectives sp                     one process, ncclCommInitAll over every visible GPU,
 *                                      each call issued for all ranks inside a group
 *   collectives mp RANK NRANKS IDFILE  one process per GPU: rank 0 writes ncclGetUniqueId's
 *                                      id to IDFILE, the others read it; ncclCommInitRank
 *   collectives perf RANK NRANKS IDFILE  as mp, but times ncclAllReduce (f32, 8 B - 512 MiB)
 *
 * Build (CUDA runtime and nccl.h needed):
 *   cc -std=c11 -O2 -I$CUDA/include -I$NCCL_INCLUDE collectives.c -L$LIBDIR -l:libnccl.so.2
 *      -L$CUDA/lib64 -lcudart -o collectives
 * Prints one line per failure and a summary line "collectives MODE: N checks, F failed". */
#define _DEFAULT_SOURCE
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define MAXR 8
static int nranks, nlocal, ranks[MAXR], devs[MAXR];
static ncclComm_t comms[MAXR];
static cudaStream_t streams[MAXR];
static int checks = 0, failures = 0;

#define CUDA(x)                                                                       \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                        \
    }                                                                                 \
  } while (0)
#define NCCL(x)                                                                         \
  do {                                                                                  \
    ncclResult_t r_ = (x);                                                              \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                  \
      exit(3);                                                                          \
    }                                                                                   \
  } while (0)

/* --- element types: to and from double (every value used is a small integer, exact in all). */
static const char *tname[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                              "float16", "float32", "float64", "bfloat16"};
static size_t tsize(int t) {
  static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return s[t];
}
static uint16_t f2h(float f) { /* exact for the small integers used here */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (f == 0.0f) return (uint16_t)sign;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | (mant >> 13));
}
static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0 && mant == 0) x = sign;
  else if (exp == 0) { float v = ldexpf((float)mant, -24); return sign ? -v : v; }
  else x = sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static void put(void *p, size_t i, int t, double v) {
  switch (t) {
    case 0: ((int8_t *)p)[i] = (int8_t)v; break;
    case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case 2: ((int32_t *)p)[i] = (int32_t)v; break;
    case 3: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case 4: ((int64_t *)p)[i] = (int64_t)v; break;
    case 5: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case 6: ((uint16_t *)p)[i] = f2h((float)v); break;
    case 7: ((float *)p)[i] = (float)v; break;
    case 8: ((double *)p)[i] = v; break;
    case 9: { float f = (float)v; uint32_t x; memcpy(&x, &f, 4); ((uint16_t *)p)[i] = (uint16_t)(x >> 16); break; }
  }
}
static double get(const void *p, size_t i, int t) {
  switch (t) {
    case 0: return ((const int8_t *)p)[i];
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const int32_t *)p)[i];
    case 3: return ((const uint32_t *)p)[i];
    case 4: return (double)((const int64_t *)p)[i];
    case 5: return (double)((const uint64_t *)p)[i];
    case 6: return h2f(((const uint16_t *)p)[i]);
    case 7: return ((const float *)p)[i];
    case 8: return ((const double *)p)[i];
    case 9: { uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &x, 4); return f; }
  }
  return 0;
}

/* Rank r's input element i: small, distinct per rank, sums of all ranks divisible by n. */
static double input(int r, size_t i) { return (double)(i % 5 + 1 + 2 * r); }
static double reduce_ref(int op, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < nranks; r++) {
    double v = input(r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    else if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = v > acc ? v : acc;
    else if (op == ncclMin) acc = v < acc ? v : acc;
  }
  return op == ncclAvg ? acc / nranks : acc;
}
/* PreMulSum's result: the sum over ranks of input(r, i) times rank r's factor (0.5 on every
 * rank, or r + 1 with `dev`): exact in float for these small integers. */
static double pm_ref(int dev, size_t i) {
  double acc = 0;
  for (int q = 0; q < nranks; q++) acc += input(q, i) * (dev ? q + 1 : 0.5);
  return acc;
}
static const char *opname[] = {"sum", "prod", "max", "min", "avg"};

/* Device buffers per local rank, with host mirrors. */
static void *dsend[MAXR], *drecv[MAXR];
static void *host;
static size_t cap;

static void fill(int l, void *d, size_t elems, int t, int rankOf /* -1: garbage */) {
  for (size_t i = 0; i < elems; i++) put(host, i, t, rankOf < 0 ? 99 : input(rankOf, i));
  CUDA(cudaSetDevice(devs[l]));
  CUDA(cudaMemcpy(d, host, elems * tsize(t), cudaMemcpyHostToDevice));
}
static void fetch(int l, const void *d, size_t elems, int t) {
  CUDA(cudaSetDevice(devs[l]));
  CUDA(cudaStreamSynchronize(streams[l]));
  CUDA(cudaMemcpy(host, d, elems * tsize(t), cudaMemcpyDeviceToHost));
}
static void expect(const char *what, int t, int l, size_t i, double got, double want) {
  checks++;
  if (got != want) {
    if (failures++ < 40)
      fprintf(stderr, "FAIL %s %s rank %d element %zu: got %g, want %g\n", what, tname[t], ranks[l], i, got, want);
  }
}

static void sync_all(void) {
  for (int l = 0; l < nlocal; l++) {
    CUDA(cudaSetDevice(devs[l]));
    CUDA(cudaStreamSynchronize(streams[l]));
  }
}

#define GROUP_NOSYNC(body)                  \
  do {                                      \
    NCCL(ncclGroupStart());                 \
    for (int l = 0; l < nlocal; l++) {      \
      CUDA(cudaSetDevice(devs[l]));         \
      body;                                 \
    }                                       \
    NCCL(ncclGroupEnd());                   \
  } while (0)

/* The fills are cudaMemcpy from pageable memory on the legacy default stream: that call may
 * return before its DMA lands, and the communicator's streams are non-blocking, so each device
 * is synchronised before the collective is issued. */
#define GROUP(body)                         \
  do {                                      \
    for (int l = 0; l < nlocal; l++) {      \
      CUDA(cudaSetDevice(devs[l]));         \
      CUDA(cudaDeviceSynchronize());        \
    }                                       \
    NCCL(ncclGroupStart());                 \
    for (int l = 0; l < nlocal; l++) {      \
      int r = ranks[l];                     \
      (void)r;                              \
      CUDA(cudaSetDevice(devs[l]));         \
      body;                                 \
    }                                       \
    NCCL(ncclGroupEnd());                   \
    sync_all();                             \
  } while (0)

static void run_type(int t, size_t C) {
  size_t es = tsize(t);
  int n = nranks;
  char what[128];
  /* all_reduce: every op, out of place and in place */
  for (int op = 0; op < 5; op++) {
    for (int inplace = 0; inplace < 2; inplace++) {
      for (int l = 0; l < nlocal; l++) {
        fill(l, dsend[l], C, t, ranks[l]);
        fill(l, drecv[l], C, t, -1);
      }
      GROUP(NCCL(ncclAllReduce(dsend[l], inplace ? dsend[l] : drecv[l], C, t, op, comms[l], streams[l])));
      snprintf(what, sizeof what, "all_reduce %s %s", opname[op], inplace ? "in-place" : "out-of-place");
      for (int l = 0; l < nlocal; l++) {
        fetch(l, inplace ? dsend[l] : drecv[l], C, t);
        for (size_t i = 0; i < C; i++) expect(what, t, l, i, get(host, i, t), reduce_ref(op, i));
      }
    }
  }
  /* broadcast from the last rank, out of place and in place (ncclBcast) */
  for (int inplace = 0; inplace < 2; inplace++) {
    int root = n - 1;
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], C, t, ranks[l]);
      fill(l, drecv[l], C, t, -1);
    }
    if (inplace) GROUP(NCCL(ncclBcast(dsend[l], C, t, root, comms[l], streams[l])));
    else GROUP(NCCL(ncclBroadcast(dsend[l], drecv[l], C, t, root, comms[l], streams[l])));
    snprintf(what, sizeof what, "broadcast %s", inplace ? "in-place" : "out-of-place");
    for (int l = 0; l < nlocal; l++) {
      fetch(l, inplace ? dsend[l] : drecv[l], C, t);
      for (size_t i = 0; i < C; i++) expect(what, t, l, i, get(host, i, t), input(root, i));
    }
  }
  /* reduce to rank 0: sum and max */
  for (int op = 0; op < 3; op += 2) {
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], C, t, ranks[l]);
      fill(l, drecv[l], C, t, -1);
    }
    GROUP(NCCL(ncclReduce(dsend[l], drecv[l], C, t, op, 0, comms[l], streams[l])));
    snprintf(what, sizeof what, "reduce %s", opname[op]);
    for (int l = 0; l < nlocal; l++) {
      if (ranks[l] != 0) continue;
      fetch(l, drecv[l], C, t);
      for (size_t i = 0; i < C; i++) expect(what, t, l, i, get(host, i, t), reduce_ref(op, i));
    }
  }
  /* all_gather, out of place and in place (sendbuff = recvbuff + rank * C) */
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int l = 0; l < nlocal; l++) {
      fill(l, drecv[l], n * C, t, -1);
      fill(l, inplace ? (char *)drecv[l] + ranks[l] * C * es : dsend[l], C, t, ranks[l]);
    }
    GROUP(NCCL(ncclAllGather(inplace ? (char *)drecv[l] + r * C * es : dsend[l], drecv[l], C, t, comms[l], streams[l])));
    snprintf(what, sizeof what, "all_gather %s", inplace ? "in-place" : "out-of-place");
    for (int l = 0; l < nlocal; l++) {
      fetch(l, drecv[l], n * C, t);
      for (int p = 0; p < n; p++)
        for (size_t i = 0; i < C; i++) expect(what, t, l, p * C + i, get(host, p * C + i, t), input(p, i));
    }
  }
  /* reduce_scatter sum, out of place and in place (recvbuff = sendbuff + rank * C) */
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], n * C, t, ranks[l]);
      fill(l, drecv[l], C, t, -1);
    }
    GROUP(NCCL(ncclReduceScatter(dsend[l], inplace ? (char *)dsend[l] + r * C * es : drecv[l], C, t, ncclSum, comms[l], streams[l])));
    snprintf(what, sizeof what, "reduce_scatter %s", inplace ? "in-place" : "out-of-place");
    for (int l = 0; l < nlocal; l++) {
      if (inplace) {
        fetch(l, dsend[l], n * C, t);
        for (size_t i = 0; i < C; i++)
          expect(what, t, l, i, get(host, ranks[l] * C + i, t), reduce_ref(ncclSum, ranks[l] * C + i));
      } else {
        fetch(l, drecv[l], C, t);
        for (size_t i = 0; i < C; i++) expect(what, t, l, i, get(host, i, t), reduce_ref(ncclSum, ranks[l] * C + i));
      }
    }
  }
  /* all_to_all: block j of rank i's input goes to block i of rank j's output */
  for (int l = 0; l < nlocal; l++) {
    fill(l, dsend[l], n * C, t, ranks[l]);
    fill(l, drecv[l], n * C, t, -1);
  }
  GROUP(NCCL(ncclAlltoAll(dsend[l], drecv[l], C, t, comms[l], streams[l])));
  for (int l = 0; l < nlocal; l++) {
    fetch(l, drecv[l], n * C, t);
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < C; i++)
        expect("all_to_all", t, l, p * C + i, get(host, p * C + i, t), input(p, ranks[l] * C + i));
  }
  /* gather to and scatter from the last rank */
  {
    int root = n - 1;
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], C, t, ranks[l]);
      fill(l, drecv[l], n * C, t, -1);
    }
    GROUP(NCCL(ncclGather(dsend[l], drecv[l], C, t, root, comms[l], streams[l])));
    for (int l = 0; l < nlocal; l++) {
      if (ranks[l] != root) continue;
      fetch(l, drecv[l], n * C, t);
      for (int p = 0; p < n; p++)
        for (size_t i = 0; i < C; i++) expect("gather", t, l, p * C + i, get(host, p * C + i, t), input(p, i));
    }
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], n * C, t, ranks[l]);
      fill(l, drecv[l], C, t, -1);
    }
    GROUP(NCCL(ncclScatter(dsend[l], drecv[l], C, t, root, comms[l], streams[l])));
    for (int l = 0; l < nlocal; l++) {
      fetch(l, drecv[l], C, t);
      for (size_t i = 0; i < C; i++) expect("scatter", t, l, i, get(host, i, t), input(root, ranks[l] * C + i));
    }
  }
  /* send/recv ring inside a group */
  if (n > 1) {
    for (int l = 0; l < nlocal; l++) {
      fill(l, dsend[l], C, t, ranks[l]);
      fill(l, drecv[l], C, t, -1);
    }
    GROUP({
      NCCL(ncclSend(dsend[l], C, t, (r + 1) % n, comms[l], streams[l]));
      NCCL(ncclRecv(drecv[l], C, t, (r + n - 1) % n, comms[l], streams[l]));
    });
    for (int l = 0; l < nlocal; l++) {
      fetch(l, drecv[l], C, t);
      for (size_t i = 0; i < C; i++) expect("send_recv ring", t, l, i, get(host, i, t), input((ranks[l] + n - 1) % n, i));
    }
  }
}

/* ncclAllReduce (float32 sum, in place) time per call, 8 B - 512 MiB: 5 warm-up calls, then
 * `iters` calls timed with events on the stream of local rank 0; printed by global rank 0. */
static void perf(void) {
  int n = nranks;
  float *buf[MAXR];
  size_t maxb = (size_t)1 << 30;
  for (int l = 0; l < nlocal; l++) {
    CUDA(cudaSetDevice(devs[l]));
    CUDA(cudaMalloc((void **)&buf[l], maxb));
    CUDA(cudaMemset(buf[l], 0, maxb));
  }
  cudaEvent_t e0, e1;
  CUDA(cudaSetDevice(devs[0]));
  CUDA(cudaEventCreate(&e0));
  CUDA(cudaEventCreate(&e1));
  for (size_t bytes = 8; bytes <= maxb / 2; bytes *= 2) {
    size_t count = bytes / 4;
    int iters = bytes <= ((size_t)128 << 20) ? 50 : 10;
    struct timespec h0 = {0, 0}, h1;
    for (int it = -5; it < iters; it++) {
      if (it == 0) {
        sync_all();
        CUDA(cudaSetDevice(devs[0]));
        CUDA(cudaEventRecord(e0, streams[0]));
        clock_gettime(CLOCK_MONOTONIC, &h0);
      }
      GROUP_NOSYNC(NCCL(ncclAllReduce(buf[l], buf[l], count, ncclFloat32, ncclSum, comms[l], streams[l])));
    }
    clock_gettime(CLOCK_MONOTONIC, &h1);
    CUDA(cudaSetDevice(devs[0]));
    CUDA(cudaEventRecord(e1, streams[0]));
    sync_all();
    double host_us = ((h1.tv_sec - h0.tv_sec) * 1e9 + (h1.tv_nsec - h0.tv_nsec)) / 1e3 / iters;
    float ms = 0;
    CUDA(cudaEventElapsedTime(&ms, e0, e1));
    double us = ms * 1000.0 / iters;
    if (ranks[0] == 0)
      printf("perf all_reduce float32 %zu B: %.2f us, busbw %.2f GB/s, host %.2f us per call\n", bytes, us,
             2.0 * (n - 1) / n * bytes / (us * 1e-6) / 1e9, host_us);
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "sp";
  const char *(*lib)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "ringcclGetVersionString");
  int version = 0;
  NCCL(ncclGetVersion(&version));
  printf("library: %s, ncclGetVersion %d\n", lib ? lib() : "NCCL", version);
  int ndev = 0;
  CUDA(cudaGetDeviceCount(&ndev));
  if (strcmp(mode, "sp") == 0) {
    nranks = nlocal = ndev < MAXR ? ndev : MAXR;
    for (int i = 0; i < nlocal; i++) ranks[i] = devs[i] = i;
    NCCL(ncclCommInitAll(comms, nlocal, devs));
  } else if ((strcmp(mode, "mp") == 0 || strcmp(mode, "perf") == 0) && argc == 5) {
    int rank = atoi(argv[2]);
    nranks = atoi(argv[3]);
    nlocal = 1;
    ranks[0] = rank;
    devs[0] = rank % ndev;
    ncclUniqueId id;
    if (rank == 0) {
      NCCL(ncclGetUniqueId(&id));
      char tmp[512];
      snprintf(tmp, sizeof tmp, "%s.tmp", argv[4]);
      FILE *f = fopen(tmp, "wb");
      if (!f || fwrite(&id, sizeof id, 1, f) != 1) { perror("id file"); return 2; }
      fclose(f);
      rename(tmp, argv[4]);
    } else {
      FILE *f = NULL;
      for (int tries = 0; tries < 600 && !(f = fopen(argv[4], "rb")); tries++) usleep(50000);
      if (!f || fread(&id, sizeof id, 1, f) != 1) { fprintf(stderr, "no id in %s\n", argv[4]); return 2; }
      fclose(f);
    }
    CUDA(cudaSetDevice(devs[0]));
    if (strcmp(mode, "mp") == 0) {
      /* A non-blocking communicator: ncclInProgress, then poll ncclCommGetAsyncError. */
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t r = ncclCommInitRankConfig(&comms[0], nranks, id, rank, &config);
      checks++;
      if (r != ncclInProgress && r != ncclSuccess) {
        fprintf(stderr, "FAIL non-blocking init returned %d\n", (int)r);
        failures++;
      }
      ncclResult_t state = ncclInProgress;
      int polls = 0;
      while (state == ncclInProgress) {
        NCCL(ncclCommGetAsyncError(comms[0], &state));
        polls++;
      }
      printf("non-blocking init: %s, then ncclSuccess after %d polls\n", ncclGetErrorString(r), polls);
      NCCL(state);
    } else {
      NCCL(ncclCommInitRank(&comms[0], nranks, id, rank));
    }
  } else {
    fprintf(stderr, "usage: %s sp | mp RANK NRANKS IDFILE\n", argv[0]);
    return 2;
  }
  int count = 0, dev = -1, rank = -1;
  for (int l = 0; l < nlocal; l++) {
    NCCL(ncclCommCount(comms[l], &count));
    NCCL(ncclCommCuDevice(comms[l], &dev));
    NCCL(ncclCommUserRank(comms[l], &rank));
    checks += 3;
    if (count != nranks || dev != devs[l] || rank != ranks[l]) {
      failures++;
      fprintf(stderr, "FAIL queries: count %d dev %d rank %d\n", count, dev, rank);
    }
    CUDA(cudaSetDevice(devs[l]));
    CUDA(cudaStreamCreateWithFlags(&streams[l], cudaStreamNonBlocking));
  }
  if (strcmp(mode, "perf") == 0) {
    perf();
    for (int l = 0; l < nlocal; l++) NCCL(ncclCommDestroy(comms[l]));
    return 0;
  }
  size_t sizes[] = {1, 1000, 1 << 18};
  cap = (size_t)nranks * (1 << 18) * 8;
  host = malloc(cap);
  for (int l = 0; l < nlocal; l++) {
    CUDA(cudaSetDevice(devs[l]));
    CUDA(cudaMalloc(&dsend[l], cap));
    CUDA(cudaMalloc(&drecv[l], cap));
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int s = 0; s < 3; s++)
    for (int t = 0; t < 10; t++) run_type(t, sizes[s]);
  /* count 0 is valid and does nothing */
  GROUP(NCCL(ncclAllReduce(dsend[l], drecv[l], 0, ncclFloat32, ncclSum, comms[l], streams[l])));
  /* argument errors on a live communicator */
  checks += 4;
  if (ncclAllReduce(dsend[0], drecv[0], 4, (ncclDataType_t)12, ncclSum, comms[0], streams[0]) != ncclInvalidArgument) failures++;
  if (ncclAllReduce(dsend[0], drecv[0], 4, ncclFloat32, (ncclRedOp_t)7, comms[0], streams[0]) != ncclInvalidArgument) failures++;
  if (ncclBroadcast(dsend[0], drecv[0], 4, ncclFloat32, nranks, comms[0], streams[0]) != ncclInvalidArgument) failures++;
  if (ncclAllReduce(NULL, drecv[0], 4, ncclFloat32, ncclSum, comms[0], streams[0]) != ncclInvalidArgument) failures++;
  /* PreMulSum operators on a live communicator: each rank's input times its factor, summed
   * (host factor 0.5 on every rank; device factor rank + 1, read when the call runs), for
   * all-reduce in and out of place, reduce-scatter and reduce. Then: checked by type,
   * destroyed, refused everywhere. A failed create writes ncclMaxRedOp, which collectives
   * refuse. */
  {
    const size_t C = 1000;
    float hf = 0.5f;
    ncclRedOp_t hop[MAXR], dop[MAXR];
    void *dscal[MAXR];
    for (int l = 0; l < nlocal; l++) {
      float f = (float)(ranks[l] + 1);
      CUDA(cudaSetDevice(devs[l]));
      CUDA(cudaMalloc(&dscal[l], sizeof(float)));
      CUDA(cudaMemcpy(dscal[l], &f, sizeof f, cudaMemcpyHostToDevice));
      NCCL(ncclRedOpCreatePreMulSum(&hop[l], &hf, ncclFloat32, ncclScalarHostImmediate, comms[l]));
      NCCL(ncclRedOpCreatePreMulSum(&dop[l], dscal[l], ncclFloat32, ncclScalarDevice, comms[l]));
    }
    for (int dev = 0; dev < 2; dev++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int l = 0; l < nlocal; l++) {
          fill(l, dsend[l], C, 7, ranks[l]);
          fill(l, drecv[l], C, 7, -1);
        }
        GROUP(NCCL(ncclAllReduce(dsend[l], inplace ? dsend[l] : drecv[l], C, ncclFloat32, dev ? dop[l] : hop[l], comms[l], streams[l])));
        char what[96];
        snprintf(what, sizeof what, "premulsum (%s factor) all_reduce %s", dev ? "device" : "host", inplace ? "in-place" : "out-of-place");
        for (int l = 0; l < nlocal; l++) {
          fetch(l, inplace ? dsend[l] : drecv[l], C, 7);
          for (size_t i = 0; i < C; i++) expect(what, 7, l, i, get(host, i, 7), pm_ref(dev, i));
        }
      }
      /* reduce_scatter in place: the input is not scaled in the caller's memory (only the
       * rank's own block is written) */
      for (int l = 0; l < nlocal; l++) fill(l, dsend[l], (size_t)nranks * C, 7, ranks[l]);
      GROUP(NCCL(ncclReduceScatter(dsend[l], (char *)dsend[l] + (size_t)r * C * 4, C, ncclFloat32, dev ? dop[l] : hop[l], comms[l], streams[l])));
      for (int l = 0; l < nlocal; l++) {
        fetch(l, dsend[l], (size_t)nranks * C, 7);
        for (int p = 0; p < nranks; p++)
          for (size_t i = 0; i < C; i++) {
            size_t e = (size_t)p * C + i;
            expect("premulsum reduce_scatter in-place", 7, l, e, get(host, e, 7), p == ranks[l] ? pm_ref(dev, e) : input(ranks[l], e));
          }
      }
      for (int l = 0; l < nlocal; l++) {
        fill(l, dsend[l], C, 7, ranks[l]);
        fill(l, drecv[l], C, 7, -1);
      }
      GROUP(NCCL(ncclReduce(dsend[l], drecv[l], C, ncclFloat32, dev ? dop[l] : hop[l], 0, comms[l], streams[l])));
      for (int l = 0; l < nlocal; l++) {
        fetch(l, ranks[l] == 0 ? drecv[l] : dsend[l], C, 7);
        for (size_t i = 0; i < C; i++)
          expect("premulsum reduce", 7, l, i, get(host, i, 7), ranks[l] == 0 ? pm_ref(dev, i) : input(ranks[l], i));
      }
    }
    for (int l = 0; l < nlocal; l++) {
      NCCL(ncclRedOpDestroy(hop[l], comms[l]));
      NCCL(ncclRedOpDestroy(dop[l], comms[l]));
      CUDA(cudaSetDevice(devs[l]));
      CUDA(cudaFree(dscal[l]));
    }
  }
  {
    float half = 0.5f;
    ncclRedOp_t op = ncclSum, op2 = ncclSum, bad = ncclSum;
    checks += 10;
    if (ncclRedOpCreatePreMulSum(&op, &half, ncclFloat32, ncclScalarHostImmediate, comms[0]) != ncclSuccess) failures++;
    if (op < ncclNumOps) failures++;
    if (ncclRedOpCreatePreMulSum(&op2, dsend[0], ncclFloat32, ncclScalarDevice, comms[0]) != ncclSuccess || op2 == op) failures++;
    if (ncclAllReduce(dsend[0], drecv[0], 4, ncclBfloat16, op, comms[0], streams[0]) != ncclInvalidArgument) failures++;
    if (ncclRedOpCreatePreMulSum(&bad, &half, (ncclDataType_t)99, ncclScalarHostImmediate, comms[0]) != ncclInvalidArgument || bad != ncclMaxRedOp) failures++;
    if (ncclReduceScatter(dsend[0], drecv[0], 4, ncclFloat32, bad, comms[0], streams[0]) != ncclInvalidArgument) failures++;
    if (ncclRedOpDestroy(op, comms[0]) != ncclSuccess) failures++;
    if (ncclReduce(dsend[0], drecv[0], 4, ncclFloat32, op, 0, comms[0], streams[0]) != ncclInvalidArgument) failures++;
    if (ncclRedOpDestroy(op, comms[0]) != ncclInvalidArgument) failures++;
    if (ncclRedOpDestroy(op2, comms[0]) != ncclSuccess) failures++;
    if (nlocal > 1) {
      /* an operator of one rank's communicator is unknown to another's */
      ncclRedOp_t mine = ncclSum;
      checks += 2;
      if (ncclRedOpCreatePreMulSum(&mine, &half, ncclFloat32, ncclScalarHostImmediate, comms[0]) != ncclSuccess) failures++;
      if (ncclRedOpDestroy(mine, comms[1]) != ncclInvalidArgument) failures++;
      (void)ncclRedOpDestroy(mine, comms[0]);
    }
  }
  /* Registration: tracked handles, checked on deregister; windows the same; NCCL's memory. */
  {
    void *h1 = NULL, *h2 = NULL, *mem = NULL;
    ncclWindow_t win = NULL;
    checks += 11;
    if (ncclCommRegister(comms[0], dsend[0], cap, &h1) != ncclSuccess || h1 == NULL) failures++;
    if (ncclCommRegister(comms[0], dsend[0], cap, &h2) != ncclSuccess || h2 != h1) failures++;
    if (ncclCommDeregister(comms[0], h1) != ncclSuccess) failures++;
    if (ncclCommDeregister(comms[0], h2) != ncclSuccess) failures++;
    if (ncclCommDeregister(comms[0], h1) != ncclInvalidUsage) failures++;
    if (ncclCommDeregister(comms[0], NULL) != ncclSuccess) failures++;
    if (ncclCommWindowRegister(comms[0], drecv[0], cap, &win, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess || win == NULL) failures++;
    if (ncclCommWindowDeregister(comms[0], win) != ncclSuccess) failures++;
    if (ncclCommWindowDeregister(comms[0], win) != ncclInvalidUsage) failures++;
    /* Windows are collective: the same range twice is two windows; unknown flags are refused;
     * NULL or empty buffers are accepted with *win untouched. (Every local rank registers.) */
    {
      ncclWindow_t w1[8] = {0}, w2[8] = {0}, none = NULL;
      checks += 4;
      int bad = 0;
      NCCL(ncclGroupStart());
      for (int l = 0; l < nlocal && l < 8; l++) {
        if (ncclCommWindowRegister(comms[l], drecv[l], cap, &w1[l], NCCL_WIN_DEFAULT) != ncclSuccess) bad++;
        if (ncclCommWindowRegister(comms[l], drecv[l], cap, &w2[l], NCCL_WIN_DEFAULT) != ncclSuccess) bad++;
      }
      NCCL(ncclGroupEnd());
      if (bad || w1[0] == NULL || w1[0] == w2[0]) failures++;
      if (ncclCommWindowRegister(comms[0], drecv[0], cap, &none, 0x80) != ncclInvalidArgument || none != NULL) failures++;
      if (ncclCommWindowRegister(comms[0], NULL, cap, &none, NCCL_WIN_DEFAULT) != ncclSuccess || none != NULL) failures++;
      bad = 0;
      for (int l = 0; l < nlocal && l < 8; l++) {
        if (ncclCommWindowDeregister(comms[l], w2[l]) != ncclSuccess) bad++;
        if (ncclCommWindowDeregister(comms[l], w1[l]) != ncclSuccess) bad++;
      }
      if (bad) failures++;
    }
    if (ncclMemAlloc(&mem, 1 << 20) != ncclSuccess || mem == NULL) failures++;
    if (ncclMemFree(mem) != ncclSuccess) failures++;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  for (int l = 0; l < nlocal; l++) {
    NCCL(ncclCommFinalize(comms[l]));
    NCCL(ncclCommDestroy(comms[l]));
  }
  /* a communicator used after destroy; destroyed twice (NCCL: ncclInvalidArgument); aborted
   * after destroy, and NULL (both ncclSuccess: PyTorch's watchdog) */
  checks += 4;
  if (ncclCommCount(comms[0], &count) != ncclInvalidUsage) failures++;
  if (ncclCommDestroy(comms[0]) != ncclInvalidArgument) failures++;
  if (ncclCommAbort(comms[0]) != ncclSuccess) failures++;
  if (ncclCommAbort(NULL) != ncclSuccess) failures++;
  printf("collectives %s (rank %d of %d): %d checks, %d failed, %.1f s\n", mode, ranks[0], nranks, checks,
         failures, (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
  return failures ? 1 : 0;
}
