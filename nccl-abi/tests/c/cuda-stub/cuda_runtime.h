/* The one thing nccl.h needs from the CUDA runtime's headers, for building the ABI check on a
 * machine without the CUDA toolkit: cudaStream_t (the runtime's stream is the driver's
 * CUstream). */
#ifndef RINGCCL_CUDA_RUNTIME_STUB_H
#define RINGCCL_CUDA_RUNTIME_STUB_H
#define CUDART_VERSION 13000
typedef struct CUstream_st *cudaStream_t;
#endif
