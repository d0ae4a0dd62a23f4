/*
 * The CUDA back end of ts_kernels.h (docs/dev/ARCHITECTURE.md), behind a plain C interface: no CUDA type
 * crosses this header, so C files include it freely. In a build without CUDA the same
 * functions exist and fail with "this build has no CUDA back end".
 *
 * One table per device context: ts_kernels_cuda_create(device, ...) makes a table whose
 * kernels run on GPU `device` (the N of /gpu:N, counted among the GPUs CUDA_VISIBLE_DEVICES
 * leaves visible), in order, on one CUDA stream of its own, with one cuBLAS handle. Matrix
 * products are cuBLAS sgemm in float32 (no TF32 unless opts->allow_tf32); convolution and
 * max pooling are cuDNN's where the build has it (one cuDNN handle per table, made by its
 * first such call; CUDNN_FMA_MATH unless opts->allow_tf32); everything else is a kernel of
 * kernels/cuda/. Every CUDA, cuBLAS and cuDNN call is checked: a failure returns
 * TS_EDEVICE (TS_ENOMEM for memory) and k->last_error(k) says which call failed and why.
 *
 * Memory. Device buffers (k->alloc) come from one pool per GPU (kernels/ts_pool.h), shared
 * by every table of that GPU in the process, planned from the memory policy by
 * ts_gpu_memory_plan (kernels/ts_gpu.h): grown on demand under device.allow_growth (never
 * beyond device.memory_fraction when it is set), else reserved up front. Plain cudaMalloc underneath, never managed
 * memory. A request the policy cannot satisfy is TS_ENOMEM and last_error names the limit,
 * what is in use and what was asked. The first table of a GPU fixes its pool's policy; later
 * tables of that GPU share it whatever policy they pass. k->host_alloc gives pinned host
 * memory (cudaHostAlloc, portable to every GPU) for staging transfers.
 *
 * Threads: a table may be used by one thread at a time; different tables (also of one GPU)
 * may be used by different threads at once.
 *
 * Ownership: the caller owns a created table until ts_kernels_cuda_destroy, which waits for
 * its work and frees its stream, handle and scratch; buffers it handed out must be freed
 * with its free_buf before (the pool frees any left when the last table of the GPU goes).
 */
#ifndef TS_KERNELS_CUDA_H
#define TS_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "ts_gpu.h"
#include "ts_kernels.h"
#include "ts_pool.h"

typedef struct {
  ts_gpu_memory_policy_t memory;
  bool allow_tf32; /* let cuBLAS and cuDNN use TF32 tensor cores (device.allow_tf32) */
} ts_kernels_cuda_opts_t;

/* True when this build has the CUDA back end (nvcc was found at configure time). */
bool ts_kernels_cuda_built(void);

/* True when this build has cuDNN's convolution and max pooling in the CUDA back end (cuDNN
 * was found); without it those kernels are NULL and placement keeps such layers off the GPU. */
bool ts_kernels_cuda_have_cudnn(void);

/* True when this build averages tower gradients with NCCL (NCCL was found). */
bool ts_kernels_cuda_have_nccl(void);

/* A table showing which ops the CUDA back end has kernels for (a NULL pointer: none), for
 * device placement before any GPU is touched. Its kernels must not be called (they return
 * TS_EINVAL). NULL in a build without CUDA. Static; never freed. */
const ts_kernels_t *ts_kernels_cuda_ops(void);

/* Create a table for GPU `device`. opts may be NULL (allow_growth, no TF32). Returns 0, or
 * TS_EINVAL (device out of range), TS_ENOMEM (the memory policy cannot be met: errmsg says
 * why), TS_EDEVICE (no GPU, no driver, a failing CUDA call; errmsg says which). On failure
 * *out is NULL. */
int ts_kernels_cuda_create(int device, const ts_kernels_cuda_opts_t *opts, ts_kernels_t **out,
                           char *errmsg, size_t errlen);

/* Wait for the table's work and free it. NULL is a no-op. */
void ts_kernels_cuda_destroy(ts_kernels_t *k);

/* The pool of the table's GPU: its stats and the plan it was made from. Returns 0, or
 * TS_EINVAL for a table that is not a CUDA one. */
int ts_kernels_cuda_memory(const ts_kernels_t *k, ts_pool_stats_t *stats,
                           ts_gpu_memory_plan_t *plan);

/* --- averaging tower gradients with NCCL ----------------------------------------------- */

typedef struct ts_kernels_cuda_nccl ts_kernels_cuda_nccl_t;

/* One NCCL communicator per table, all in this process (ncclCommInitAll). The tables must
 * be CUDA tables of n distinct GPUs (NCCL runs one rank per GPU). Returns 0, or TS_EDEVICE
 * when NCCL is not built in, a GPU repeats, or NCCL fails (errmsg says which); the caller
 * then averages through host memory. */
int ts_kernels_cuda_nccl_create(ts_kernels_t *const *towers, size_t n, ts_kernels_cuda_nccl_t **out,
                                char *errmsg, size_t errlen);

/* bufs[0] = the mean of bufs[0..n) (count floats each, bufs[i] a device buffer of tower i),
 * computed on the GPUs (ncclReduce with ncclAvg to tower 0), enqueued on each tower's stream
 * after the work already there. Returns once every GPU is done; 0 or TS_EDEVICE. */
int ts_kernels_cuda_nccl_mean(ts_kernels_cuda_nccl_t *c, float *const *bufs, size_t count,
                              char *errmsg, size_t errlen);

void ts_kernels_cuda_nccl_destroy(ts_kernels_cuda_nccl_t *c);

#endif
