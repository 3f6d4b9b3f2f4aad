/* ncclCommSplit and ncclCommShrink through the C API, one process per rank (GPU r % ndev;
 * processes sharing a GPU need the MPS daemon):
 *   split RANK NRANKS IDFILE    rank 0 writes the id to IDFILE, the others read it
 * Every rank: a world by ncclCommInitRank; pairs by a blocking ncclCommSplit (color rank / 2,
 * descending keys); a non-blocking ncclCommSplit with NCCL_SPLIT_NOCOLOR for the last rank
 * (polled with ncclCommGetAsyncError); ncclCommShrink without rank 0 (rank 0 does not call it,
 * and its call with itself in the list is refused). The sum all-reduces of the world and of
 * the children are issued interleaved on streams of their own, then checked exactly. Prints
 * "split (rank R of N): C checks, F failed". Build like collectives.c (see gpu-check.sh). */
#define _DEFAULT_SOURCE
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl.h"

#define COUNT 100000
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
#define CHECK(cond, ...)                  \
  do {                                    \
    checks++;                             \
    if (!(cond)) {                        \
      failures++;                         \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");              \
    }                                     \
  } while (0)

static float input(int r, int i) { return (float)((r * 7 + i * 3) % 13) - 4.0f; }

/* One all-reduce in flight: the buffer, its stream, the parent ranks it sums over. */
struct pending {
  const char *what;
  float *buf;
  cudaStream_t stream;
  int ranks[64], n;
};

static void issue(struct pending *p, const char *what, ncclComm_t comm, int rank, const int *ranks, int n) {
  static float host[COUNT];
  p->what = what;
  p->n = n;
  memcpy(p->ranks, ranks, sizeof(int) * (size_t)n);
  for (int i = 0; i < COUNT; i++) host[i] = input(rank, i);
  CUDA(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
  CUDA(cudaMalloc((void **)&p->buf, sizeof host));
  CUDA(cudaMemcpyAsync(p->buf, host, sizeof host, cudaMemcpyHostToDevice, p->stream));
  NCCL(ncclAllReduce(p->buf, p->buf, COUNT, ncclFloat32, ncclSum, comm, p->stream));
}

static void settle(struct pending *p) {
  static float host[COUNT];
  CUDA(cudaMemcpyAsync(host, p->buf, sizeof host, cudaMemcpyDeviceToHost, p->stream));
  CUDA(cudaStreamSynchronize(p->stream));
  int bad = 0;
  for (int i = 0; i < COUNT; i++) {
    float want = 0;
    for (int k = 0; k < p->n; k++) want += input(p->ranks[k], i);
    if (host[i] != want && bad++ < 3) fprintf(stderr, "%s: element %d = %g, %g expected\n", p->what, i, host[i], want);
  }
  CHECK(bad == 0, "%s: %d wrong elements", p->what, bad);
  CUDA(cudaFree(p->buf));
  CUDA(cudaStreamDestroy(p->stream));
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s RANK NRANKS IDFILE\n", argv[0]);
    return 2;
  }
  int rank = atoi(argv[1]), n = atoi(argv[2]), ndev = 0;
  if (n < 2 || n > 64 || rank < 0 || rank >= n) {
    fprintf(stderr, "2 to 64 ranks, rank in range\n");
    return 2;
  }
  CUDA(cudaGetDeviceCount(&ndev));
  CUDA(cudaSetDevice(rank % ndev));
  ncclUniqueId id;
  if (rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[3]);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1) { perror("id file"); return 2; }
    fclose(f);
    rename(tmp, argv[3]);
  } else {
    FILE *f = NULL;
    for (int tries = 0; tries < 600 && !(f = fopen(argv[3], "rb")); tries++) usleep(50000);
    if (!f || fread(&id, sizeof id, 1, f) != 1) { fprintf(stderr, "no id in %s\n", argv[3]); return 2; }
    fclose(f);
  }
  ncclComm_t world;
  NCCL(ncclCommInitRank(&world, n, id, rank));
  int all[64];
  for (int i = 0; i < n; i++) all[i] = i;

  /* Pairs, descending keys: the higher parent rank is child rank 0. */
  ncclComm_t pair = NULL;
  NCCL(ncclCommSplit(world, rank / 2, -rank, &pair, NULL));
  int lo = rank / 2 * 2, size = lo + 1 < n ? 2 : 1, crank = -1, ccount = -1;
  int members[2] = {lo + size - 1, lo};
  NCCL(ncclCommCount(pair, &ccount));
  NCCL(ncclCommUserRank(pair, &crank));
  CHECK(ccount == size && crank == (size == 2 ? 1 - rank % 2 : 0), "pair: count %d rank %d", ccount, crank);

  /* Non-blocking, the last rank without a color. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t rest = (ncclComm_t)&config; /* overwritten: NULL for no color */
  ncclResult_t r = ncclCommSplit(world, rank == n - 1 ? NCCL_SPLIT_NOCOLOR : 3, rank, &rest, &config);
  if (rank == n - 1) {
    CHECK(r == ncclSuccess && rest == NULL, "nocolor: %d %p", (int)r, (void *)rest);
  } else {
    CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking split returned %d", (int)r);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) NCCL(ncclCommGetAsyncError(rest, &state));
    NCCL(state);
    NCCL(ncclCommCount(rest, &ccount));
    CHECK(ccount == n - 1, "rest: count %d", ccount);
  }

  /* Interleaved: world, pair, rest, world, on streams of their own; then every result. */
  struct pending p[4];
  issue(&p[0], "world", world, rank, all, n);
  issue(&p[1], "pair", pair, rank, members + (size == 1), size);
  int np = 2;
  if (rest) issue(&p[np++], "rest", rest, rank, all, n - 1);
  issue(&p[np++], "world again", world, rank, all, n);
  for (int k = 0; k < np; k++) settle(&p[k]);

  /* Shrink without rank 0: rank 0's own call with itself excluded is refused. */
  int exclude[1] = {0};
  ncclComm_t shrunk = NULL;
  if (rank == 0) {
    CHECK(ncclCommShrink(world, exclude, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument,
          "an excluded rank's shrink");
  } else {
    NCCL(ncclCommShrink(world, exclude, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT));
    NCCL(ncclCommCount(shrunk, &ccount));
    NCCL(ncclCommUserRank(shrunk, &crank));
    CHECK(ccount == n - 1 && crank == rank - 1, "shrunk: count %d rank %d", ccount, crank);
    issue(&p[0], "shrunk", shrunk, rank, all + 1, n - 1);
    settle(&p[0]);
  }
  issue(&p[0], "world at the end", world, rank, all, n);
  settle(&p[0]);

  if (shrunk) NCCL(ncclCommDestroy(shrunk));
  if (rest) NCCL(ncclCommDestroy(rest));
  NCCL(ncclCommDestroy(pair));
  NCCL(ncclCommDestroy(world));
  printf("split (rank %d of %d): %d checks, %d failed\n", rank, n, checks, failures);
  return failures ? 1 : 0;
}
