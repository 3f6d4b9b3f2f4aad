/* ringccl's NCCL C API against NCCL's own header (nccl.h of NCCL 2.28).
 *
 * 1. Every function the library implements is taken by address into a pointer of the type
 *    nccl.h declares (compiled with -Werror: a prototype that drifts from these fails the
 *    build), and the program links against the library (a missing symbol fails the link).
 * 2. The calls that need no GPU run: version, error strings, unique id, argument errors,
 *    unsupported functions, groups.
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -I cuda-stub -I $NCCL_INCLUDE_DIR abi_check.c
 *        -L DIR -lnccl (DIR holding libnccl.so.2 -> libringccl_nccl.so) */
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "nccl.h"

/* nccl_device.h needs CUDA's device headers; its two host functions are declared here with
 * opaque pointers (their ABI: three / two pointer arguments). */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void *devComm);

static int failures = 0;
static int checks = 0;
#define CHECK(cond, ...)                                                                   \
  do {                                                                                    \
    checks++;                                                                             \
    if (!(cond)) {                                                                        \
      failures++;                                                                         \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                   \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fprintf(stderr, "\n");                                                              \
    }                                                                                     \
  } while (0)

/* The layouts nccl.h gives (LP64). */
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId");
_Static_assert(sizeof(ncclConfig_t) == 80, "ncclConfig_t size");
_Static_assert(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t.blocking");
_Static_assert(offsetof(ncclConfig_t, netName) == 32, "ncclConfig_t.netName");
_Static_assert(offsetof(ncclConfig_t, commName) == 48, "ncclConfig_t.commName");
_Static_assert(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "ncclConfig_t.nvlinkCentricSched");
_Static_assert(sizeof(ncclSimInfo_t) == 24, "ncclSimInfo_t");
_Static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclDataType_t) == 4 && sizeof(ncclRedOp_t) == 4, "enums");
_Static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 &&
               ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5 &&
               ncclRemoteError == 6 && ncclInProgress == 7 && ncclNumResults == 8, "results");
_Static_assert(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3 &&
               ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7 &&
               ncclFloat64 == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
               ncclFloat8e5m2 == 11 && ncclNumTypes == 12, "types");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "ops");

/* Every function, with the prototype nccl.h gives it. */
static void take_addresses(void) {
  ncclResult_t (*p_ncclGetVersion)(int *) = ncclGetVersion;
  ncclResult_t (*p_ncclGetUniqueId)(ncclUniqueId *) = ncclGetUniqueId;
  ncclResult_t (*p_ncclCommInitRank)(ncclComm_t *, int, ncclUniqueId, int) = ncclCommInitRank;
  ncclResult_t (*p_ncclCommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *) = ncclCommInitRankConfig;
  ncclResult_t (*p_ncclCommInitRankScalable)(ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *) = ncclCommInitRankScalable;
  ncclResult_t (*p_ncclCommInitAll)(ncclComm_t *, int, const int *) = ncclCommInitAll;
  ncclResult_t (*p_ncclCommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *) = ncclCommSplit;
  ncclResult_t (*p_ncclCommShrink)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int) = ncclCommShrink;
  ncclResult_t (*p_ncclCommRevoke)(ncclComm_t, int) = ncclCommRevoke;
  ncclResult_t (*p_ncclCommFinalize)(ncclComm_t) = ncclCommFinalize;
  ncclResult_t (*p_ncclCommDestroy)(ncclComm_t) = ncclCommDestroy;
  ncclResult_t (*p_ncclCommAbort)(ncclComm_t) = ncclCommAbort;
  ncclResult_t (*p_ncclCommGetAsyncError)(ncclComm_t, ncclResult_t *) = ncclCommGetAsyncError;
  const char *(*p_ncclGetErrorString)(ncclResult_t) = ncclGetErrorString;
  const char *(*p_ncclGetLastError)(ncclComm_t) = ncclGetLastError;
  ncclResult_t (*p_ncclCommCount)(const ncclComm_t, int *) = ncclCommCount;
  ncclResult_t (*p_ncclCommCuDevice)(const ncclComm_t, int *) = ncclCommCuDevice;
  ncclResult_t (*p_ncclCommUserRank)(const ncclComm_t, int *) = ncclCommUserRank;
  ncclResult_t (*p_ncclCommRegister)(const ncclComm_t, void *, size_t, void **) = ncclCommRegister;
  ncclResult_t (*p_ncclCommDeregister)(const ncclComm_t, void *) = ncclCommDeregister;
  ncclResult_t (*p_ncclCommWindowRegister)(ncclComm_t, void *, size_t, ncclWindow_t *, int) = ncclCommWindowRegister;
  ncclResult_t (*p_ncclCommWindowDeregister)(ncclComm_t, ncclWindow_t) = ncclCommWindowDeregister;
  ncclResult_t (*p_ncclRedOpCreatePreMulSum)(ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t) = ncclRedOpCreatePreMulSum;
  ncclResult_t (*p_ncclRedOpDestroy)(ncclRedOp_t, ncclComm_t) = ncclRedOpDestroy;
  ncclResult_t (*p_ncclReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) = ncclReduce;
  ncclResult_t (*p_ncclBcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclBcast;
  ncclResult_t (*p_ncclBroadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclBroadcast;
  ncclResult_t (*p_ncclAllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = ncclAllReduce;
  ncclResult_t (*p_ncclReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = ncclReduceScatter;
  ncclResult_t (*p_ncclAllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = ncclAllGather;
  ncclResult_t (*p_ncclAlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = ncclAlltoAll;
  ncclResult_t (*p_ncclGather)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclGather;
  ncclResult_t (*p_ncclScatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclScatter;
  ncclResult_t (*p_ncclSend)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclSend;
  ncclResult_t (*p_ncclRecv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclRecv;
  ncclResult_t (*p_ncclGroupStart)(void) = ncclGroupStart;
  ncclResult_t (*p_ncclGroupEnd)(void) = ncclGroupEnd;
  ncclResult_t (*p_ncclGroupSimulateEnd)(ncclSimInfo_t *) = ncclGroupSimulateEnd;
  ncclResult_t (*p_ncclMemAlloc)(void **, size_t) = ncclMemAlloc;
  ncclResult_t (*p_ncclMemFree)(void *) = ncclMemFree;
  ncclResult_t (*p_ncclDevCommCreate)(ncclComm_t, const void *, void *) = ncclDevCommCreate;
  ncclResult_t (*p_ncclDevCommDestroy)(ncclComm_t, const void *) = ncclDevCommDestroy;
  const void *all[] = {
      (const void *)p_ncclGetVersion, (const void *)p_ncclGetUniqueId, (const void *)p_ncclCommInitRank,
      (const void *)p_ncclCommInitRankConfig, (const void *)p_ncclCommInitRankScalable,
      (const void *)p_ncclCommInitAll, (const void *)p_ncclCommSplit, (const void *)p_ncclCommShrink,
      (const void *)p_ncclCommRevoke, (const void *)p_ncclCommFinalize, (const void *)p_ncclCommDestroy,
      (const void *)p_ncclCommAbort, (const void *)p_ncclCommGetAsyncError, (const void *)p_ncclGetErrorString,
      (const void *)p_ncclGetLastError, (const void *)p_ncclCommCount, (const void *)p_ncclCommCuDevice,
      (const void *)p_ncclCommUserRank, (const void *)p_ncclCommRegister, (const void *)p_ncclCommDeregister,
      (const void *)p_ncclCommWindowRegister, (const void *)p_ncclCommWindowDeregister,
      (const void *)p_ncclRedOpCreatePreMulSum, (const void *)p_ncclRedOpDestroy, (const void *)p_ncclReduce,
      (const void *)p_ncclBcast, (const void *)p_ncclBroadcast, (const void *)p_ncclAllReduce,
      (const void *)p_ncclReduceScatter, (const void *)p_ncclAllGather, (const void *)p_ncclAlltoAll,
      (const void *)p_ncclGather, (const void *)p_ncclScatter, (const void *)p_ncclSend, (const void *)p_ncclRecv,
      (const void *)p_ncclGroupStart, (const void *)p_ncclGroupEnd, (const void *)p_ncclGroupSimulateEnd,
      (const void *)p_ncclMemAlloc, (const void *)p_ncclMemFree, (const void *)p_ncclDevCommCreate,
      (const void *)p_ncclDevCommDestroy,
  };
  size_t n = sizeof all / sizeof all[0];
  for (size_t i = 0; i < n; i++) CHECK(all[i] != NULL, "function %zu has no address", i);
  printf("abi check: %zu functions taken with nccl.h's prototypes\n", n);
}

static int starts_with(const char *s, const char *prefix) {
  return s != NULL && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ncclCommSplit, ncclCommShrink, ncclCommInitRankScalable: what is checked before any
 * communicator exists (the rest needs GPUs: tests/tests/split.rs). NCCL has no "bad color":
 * every value but NCCL_SPLIT_NOCOLOR is a color. */
static void split_checks(ncclComm_t bogus, ncclUniqueId good) {
  _Static_assert(NCCL_SPLIT_NOCOLOR == -1, "NCCL_SPLIT_NOCOLOR");
  _Static_assert(NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1, "shrink flags");
  int y = 0;
  ncclComm_t untouched = (ncclComm_t)&y;
  ncclComm_t out = untouched;
  CHECK(ncclCommSplit(NULL, 0, 0, &out, NULL) == ncclInvalidArgument, "split NULL comm");
  CHECK(ncclCommSplit(bogus, 0, 0, &out, NULL) == ncclInvalidArgument, "split bogus comm");
  CHECK(strstr(ncclGetLastError(NULL), "not a communicator") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(ncclCommSplit(bogus, NCCL_SPLIT_NOCOLOR, 0, &out, NULL) == ncclInvalidArgument, "split nocolor bogus");
  CHECK(ncclCommSplit(bogus, -5, 3, NULL, NULL) == ncclInvalidArgument, "split NULL newcomm");
  CHECK(out == untouched, "newcomm written by a refused split");
  int list[2] = {3, 1};
  CHECK(ncclCommShrink(NULL, list, 2, &out, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument, "shrink NULL comm");
  CHECK(ncclCommShrink(bogus, list, 2, &out, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument, "shrink bogus");
  CHECK(ncclCommShrink(bogus, NULL, 0, &out, NULL, NCCL_SHRINK_ABORT) == ncclInvalidArgument, "shrink NULL list");
  CHECK(out == untouched, "newcomm written by a refused shrink");
  ncclUniqueId ids[2];
  memset(ids, 0, sizeof ids);
  ids[0] = good;
  CHECK(ncclCommInitRankScalable(&out, 2, 0, 0, ids, NULL) == ncclInvalidArgument, "scalable nId 0");
  CHECK(ncclCommInitRankScalable(&out, 2, 0, 1, NULL, NULL) == ncclInvalidArgument, "scalable NULL ids");
  CHECK(ncclCommInitRankScalable(&out, 2, 0, 2, ids, NULL) == ncclInvalidArgument, "scalable bad second id");
  CHECK(strstr(ncclGetLastError(NULL), "commIds[1]") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(ncclCommInitRankScalable(&out, 2, 2, 1, ids, NULL) == ncclInvalidArgument, "scalable rank 2 of 2");
  CHECK(out == untouched, "newcomm written by a refused scalable init");
}

int main(void) {
  take_addresses();

  int version = 0;
  CHECK(ncclGetVersion(&version) == ncclSuccess, "ncclGetVersion failed");
  CHECK(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL)");
  CHECK(starts_with(ncclGetLastError(NULL), "ringccl: ncclGetVersion: version is NULL"),
        "last error '%s'", ncclGetLastError(NULL));

  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "%s", ncclGetErrorString(ncclSuccess));
  CHECK(starts_with(ncclGetErrorString(ncclInvalidUsage), "invalid usage"), "%s",
        ncclGetErrorString(ncclInvalidUsage));
  CHECK(starts_with(ncclGetErrorString(ncclInProgress), "NCCL operation in progress"), "in progress");
  CHECK(strcmp(ncclGetErrorString((ncclResult_t)42), "unknown result code") == 0, "unknown code");

  const char *(*ringccl_version)(void) =
      (const char *(*)(void))dlsym(RTLD_DEFAULT, "ringcclGetVersionString");
  CHECK(ringccl_version != NULL && starts_with(ringccl_version(), "ringccl "),
        "ringcclGetVersionString missing");
  if (ringccl_version) printf("library: %s\n", ringccl_version());

  /* Unique ids: 128 bytes, two calls give two ids (each starts its own rendezvous). */
  ncclUniqueId a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  CHECK(ncclGetUniqueId(&a) == ncclSuccess, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
  CHECK(ncclGetUniqueId(&b) == ncclSuccess, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
  CHECK(memcmp(&a, &b, sizeof a) != 0, "two ids are equal");
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  CHECK(memcmp(&a, &zero, sizeof a) != 0, "the id is all zeros");
  CHECK(ncclGetUniqueId(NULL) == ncclInvalidArgument, "ncclGetUniqueId(NULL)");

  /* Argument errors before any GPU is touched. */
  ncclComm_t comm = NULL;
  CHECK(ncclCommInitRank(&comm, 0, a, 0) == ncclInvalidArgument, "nranks 0");
  CHECK(starts_with(ncclGetLastError(NULL), "ringccl: ncclCommInitRank: nranks 0"), "'%s'", ncclGetLastError(NULL));
  CHECK(ncclCommInitRank(&comm, 2, a, 2) == ncclInvalidArgument, "rank 2 of 2");
  CHECK(ncclCommInitRank(&comm, 2, a, -1) == ncclInvalidArgument, "rank -1");
  CHECK(ncclCommInitRank(NULL, 2, a, 0) == ncclInvalidArgument, "comm NULL");
  CHECK(ncclCommInitRank(&comm, 2, zero, 0) == ncclInvalidArgument, "an id of zeros");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  CHECK(ncclCommInitRankConfig(&comm, 2, a, 0, &config) == ncclInvalidArgument, "bad config magic");
  CHECK(ncclCommInitRankScalable(&comm, 2, 0, 0, NULL, NULL) == ncclInvalidArgument, "no ids");
  CHECK(ncclCommInitAll(NULL, 2, NULL) == ncclInvalidArgument, "comms NULL");
  CHECK(ncclCommInitAll(&comm, 0, NULL) == ncclInvalidArgument, "ndev 0");
  CHECK(comm == NULL, "comm written on failure");

  /* A pointer that is not a communicator of this library. */
  ncclResult_t async_dummy = ncclSuccess;
  int x = 0;
  ncclComm_t bogus = (ncclComm_t)&x;
  int n = -1;
  CHECK(ncclCommCount(NULL, &n) == ncclInvalidArgument, "count NULL comm");
  CHECK(ncclCommCount(bogus, &n) == ncclInvalidArgument, "count bogus comm");
  CHECK(starts_with(ncclGetLastError(NULL), "ringccl: ncclCommCount: comm"), "'%s'", ncclGetLastError(NULL));
  CHECK(ncclCommUserRank(bogus, &n) == ncclInvalidArgument, "rank bogus comm");
  CHECK(ncclCommCuDevice(bogus, &n) == ncclInvalidArgument, "device bogus comm");
  CHECK(ncclCommDestroy(bogus) == ncclInvalidArgument, "destroy bogus comm");
  CHECK(ncclCommAbort(bogus) == ncclInvalidArgument, "abort bogus comm");
  CHECK(ncclCommFinalize(bogus) == ncclInvalidArgument, "finalize bogus");
  /* NULL communicators, as NCCL 2.28 (src/init.cc): destroy, abort and finalize succeed
   * (PyTorch's watchdog aborts with NULL); queries refuse. */
  CHECK(ncclCommDestroy(NULL) == ncclSuccess, "destroy NULL");
  CHECK(ncclCommAbort(NULL) == ncclSuccess, "abort NULL");
  CHECK(ncclCommAbort(NULL) == ncclSuccess, "abort NULL again");
  CHECK(ncclCommFinalize(NULL) == ncclSuccess, "finalize NULL");
  CHECK(ncclCommGetAsyncError(NULL, &async_dummy) == ncclInvalidArgument, "async NULL");
  CHECK(ncclCommUserRank(NULL, &n) == ncclInvalidArgument, "rank NULL comm");
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(bogus, &async) == ncclInvalidArgument, "async bogus");
  float buf[4];
  CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, bogus, NULL) == ncclInvalidArgument, "allreduce bogus comm");
  CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument, "allreduce NULL comm");
  CHECK(ncclBroadcast(buf, buf, 4, ncclFloat32, 0, bogus, NULL) == ncclInvalidArgument, "broadcast");
  CHECK(ncclSend(buf, 4, ncclFloat32, 0, bogus, NULL) == ncclInvalidArgument, "send");
  CHECK(ncclRecv(buf, 4, ncclFloat32, 0, bogus, NULL) == ncclInvalidArgument, "recv");
  void *handle = NULL;
  CHECK(ncclCommRegister(bogus, buf, sizeof buf, &handle) == ncclInvalidArgument, "register");
  CHECK(ncclCommRegister(NULL, buf, sizeof buf, &handle) == ncclInvalidArgument, "register NULL comm");
  CHECK(ncclCommDeregister(bogus, buf) == ncclInvalidArgument, "deregister bogus comm");
  ncclWindow_t win = NULL;
  CHECK(ncclCommWindowRegister(bogus, buf, sizeof buf, &win, NCCL_WIN_DEFAULT) == ncclInvalidArgument, "window bogus comm");
  CHECK(ncclCommWindowRegister(NULL, buf, sizeof buf, &win, NCCL_WIN_DEFAULT) == ncclInvalidArgument, "window NULL comm");
  CHECK(win == NULL, "window written on failure");
  CHECK(ncclCommWindowDeregister(bogus, NULL) == ncclInvalidArgument, "window dereg bogus comm");

  /* Reduction operators. A failed ncclRedOpCreatePreMulSum writes a value every collective
   * refuses (ncclMaxRedOp), never leaves a built-in behind (PyTorch ignores its result). */
  ncclRedOp_t op = ncclSum;
  float scalar = 0.5f;
  CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, bogus) == ncclInvalidArgument, "premulsum bogus comm");
  CHECK(strstr(ncclGetLastError(NULL), "not a communicator") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(op == ncclMaxRedOp, "a failed create left op %d", (int)op);
  op = ncclSum;
  CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, NULL) == ncclInvalidArgument, "premulsum NULL comm");
  CHECK(op == ncclMaxRedOp, "a failed create left op %d", (int)op);
  CHECK(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat32, ncclScalarHostImmediate, bogus) == ncclInvalidArgument, "premulsum NULL op");
  CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, op, bogus, NULL) == ncclInvalidArgument, "allreduce with a failed op");
  for (int b = ncclSum; b < ncclNumOps; b++)
    CHECK(ncclRedOpDestroy((ncclRedOp_t)b, bogus) == ncclInvalidArgument, "destroy built-in %d", b);
  CHECK(strstr(ncclGetLastError(NULL), "built-in") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(ncclRedOpDestroy((ncclRedOp_t)-1, NULL) == ncclInvalidArgument, "destroy garbage");
  CHECK(ncclRedOpDestroy((ncclRedOp_t)5, NULL) == ncclInvalidArgument, "destroy, NULL comm");
  CHECK(ncclRedOpDestroy((ncclRedOp_t)5, bogus) == ncclInvalidArgument, "destroy, bogus comm");
  CHECK(ncclRedOpDestroy(ncclMaxRedOp, bogus) == ncclInvalidArgument, "destroy the failed value");

  /* Groups: a call that fails inside a group fails the group: ncclGroupEnd returns its error
   * (as NCCL's ncclGroupErrCheck), and the next group starts clean. */
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, bogus, NULL) == ncclInvalidArgument, "allreduce in a group");
  CHECK(ncclSend(buf, 4, ncclFloat32, 0, NULL, NULL) == ncclInvalidArgument, "send in a group");
  CHECK(ncclGroupEnd() == ncclInvalidArgument, "the group's end reports its first error");
  CHECK(strstr(ncclGetLastError(NULL), "ncclGroupEnd") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclGroupEnd() == ncclSuccess, "a clean group after a failed one");

  /* What ringccl does not support says so. */
  split_checks(bogus, a);
  CHECK(ncclDevCommCreate(bogus, NULL, NULL) == ncclInvalidUsage, "devcomm");
  CHECK(ncclDevCommDestroy(bogus, NULL) == ncclInvalidUsage, "devcomm destroy");

  /* Groups: balanced is fine (an empty group issues nothing), an extra end is an error. */
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclGroupStart() == ncclSuccess, "nested group start");
  CHECK(ncclGroupEnd() == ncclSuccess, "nested group end");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart() == ncclSuccess, "nested group start");
  CHECK(ncclGroupSimulateEnd(&sim) == ncclSuccess, "simulate at an inner level: nothing, as NCCL");
  /* The outermost simulated end closes the group as NCCL's does (nothing issued), but has no
   * estimate to give. */
  CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage, "simulate");
  CHECK(strstr(ncclGetLastError(NULL), "no cost model") != NULL, "'%s'", ncclGetLastError(NULL));
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "the simulated end closed the group");
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  sim.magic = 0;
  CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidArgument, "simulate with a bad magic");
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclGroupSimulateEnd(NULL) == ncclSuccess, "simulate(NULL) is ncclGroupEnd");
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "group end without start");

  CHECK(ncclMemFree(NULL) == ncclSuccess, "free NULL");
  CHECK(ncclMemAlloc(NULL, 16) == ncclInvalidArgument, "alloc NULL");
  void *mem = buf;
  CHECK(ncclMemAlloc(&mem, 0) == ncclSuccess && mem == NULL, "alloc 0 bytes: NULL, as NCCL");
  CHECK(ncclGetLastError(NULL) != NULL, "ncclGetLastError(NULL) is a string");

  if (failures) {
    fprintf(stderr, "abi check: %d of %d checks FAILED\n", failures, checks);
    return 1;
  }
  printf("abi check: %d checks passed\n", checks);
  return 0;
}
