// Internal to the CUDA back end (kernels/cuda/*.cu): the per-table context, the check
// macros and the kernel launchers. C++ only; C files include ts_kernels_cuda.h instead.
#ifndef TS_CUDA_H
#define TS_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_kernels.h"
#include "ts_kernels_cuda.h"
#include "ts_pool.h"
}

// Results that kernels hand back to the host, in one small device block so one copy brings
// them all (and one pinned mirror receives them).
struct ts_cuda_result {
  float loss;                  // softmax_xent: the mean loss
  int bad_label;               // set by any kernel that met a label outside [0, cols)
  unsigned long long correct;  // argmax_correct: the count
};

struct ts_cuda_devpool;  // one per GPU, shared by its tables (ts_kernels_cuda.cu)
struct ts_cudnn_state;   // per table, in ts_cuda_cudnn.cu

struct ts_cuda_ctx {
  ts_kernels_t table;  // what callers hold; table.ctx points back here
  int device;
  int sm_count;
  cudaStream_t stream;
  cublasHandle_t blas;
  ts_cuda_devpool *pool;
  void *blas_workspace;      // from the pool, so cuBLAS never allocates behind it
  ts_cuda_result *d_result;  // device
  ts_cuda_result *h_result;  // pinned host mirror
  float *d_rowloss;          // per-row losses of softmax_xent, rowloss_cap floats
  size_t rowloss_cap;
  bool allow_tf32;      // TF32 tensor cores for cuBLAS and cuDNN (device.allow_tf32)
  ts_cudnn_state *dnn;  // cuDNN handle, algorithm cache, pooling scratch (ts_cuda_cudnn.cu);
                        // made by the first convolution or pooling, NULL before
  char errmsg[512];
};

static inline ts_cuda_ctx *ts_cuda_ctx_of(const ts_kernels_t *k) {
  return k ? static_cast<ts_cuda_ctx *>(k->ctx) : nullptr;
}

// Record a failed CUDA call in ctx->errmsg and return the code to give back (TS_ENOMEM for
// cudaErrorMemoryAllocation, TS_EDEVICE otherwise).
int ts_cuda_fail(ts_cuda_ctx *ctx, cudaError_t e, const char *call, const char *file, int line);
int ts_cublas_fail(ts_cuda_ctx *ctx, cublasStatus_t s, const char *call, const char *file,
                   int line);

// Inside a function returning int with a ts_cuda_ctx *ctx at hand: check a CUDA runtime call
// (a launcher below too: it returns the launch's error; faults inside a kernel appear at the
// next synchronisation) or a cuBLAS call.
#define TS_CUDA_CHECK(call)                                                               \
  do {                                                                                    \
    cudaError_t ts_e_ = (call);                                                           \
    if (ts_e_ != cudaSuccess) return ts_cuda_fail(ctx, ts_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define TS_CUBLAS_CHECK(call)                                       \
  do {                                                              \
    cublasStatus_t ts_s_ = (call);                                  \
    if (ts_s_ != CUBLAS_STATUS_SUCCESS)                             \
      return ts_cublas_fail(ctx, ts_s_, #call, __FILE__, __LINE__); \
  } while (0)

// The pool of the table's GPU (ts_kernels_cuda.cu), for scratch outside k->alloc.
ts_pool_t *ts_cuda_pool(ts_cuda_ctx *ctx);
// Its memory policy's limit in bytes (0 = none but the GPU's own memory).
size_t ts_cuda_pool_limit(ts_cuda_ctx *ctx);

// --- cuDNN (ts_cuda_cudnn.cu, built where meson finds cuDNN: TS_HAVE_CUDNN) ---------------
// Set the table's conv2d_* and maxpool_* entries to the cuDNN kernels.
void ts_cudnn_fill_table(ts_kernels_t *t);
// Free ctx->dnn (NULL is a no-op); the stream must be idle.
void ts_cudnn_destroy(ts_cuda_ctx *ctx);

// --- launchers (ts_cuda_ops.cu): enqueue one kernel on the stream; they return the launch
// error, if any. `blocks` bounds the grid of grid-stride kernels.
cudaError_t ts_cuda_bias_add(cudaStream_t s, int blocks, size_t rows, size_t cols,
                             const float *bias, float *y);
cudaError_t ts_cuda_bias_grad(cudaStream_t s, size_t rows, size_t cols, const float *dy, float *db);
cudaError_t ts_cuda_axpy(cudaStream_t s, int blocks, size_t n, float alpha, const float *x,
                         float *y);
cudaError_t ts_cuda_scale(cudaStream_t s, int blocks, size_t n, float alpha, float *x);
cudaError_t ts_cuda_fill(cudaStream_t s, int blocks, size_t n, float value, float *x);
// C[i][j] (i < m, j < n, row stride ldc) = beta == 0 ? 0 : beta * C[i][j]
cudaError_t ts_cuda_scale_matrix(cudaStream_t s, int blocks, size_t m, size_t n, size_t ldc,
                                 float beta, float *c);
// y[i] = a[i] * b[i]; y may be a.
cudaError_t ts_cuda_mul(cudaStream_t s, int blocks, size_t n, const float *a, const float *b,
                        float *y);
cudaError_t ts_cuda_relu_fwd(cudaStream_t s, int blocks, size_t n, const float *x, float *y);
cudaError_t ts_cuda_relu_bwd(cudaStream_t s, int blocks, size_t n, const float *y, const float *dy,
                             float *dx);
cudaError_t ts_cuda_tanh_fwd(cudaStream_t s, int blocks, size_t n, const float *x, float *y);
cudaError_t ts_cuda_tanh_bwd(cudaStream_t s, int blocks, size_t n, const float *y, const float *dy,
                             float *dx);
// probs and per-row losses (rowloss may be NULL), then the mean of rowloss into result->loss.
cudaError_t ts_cuda_softmax_xent(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                 const float *logits, const int32_t *labels, float *probs,
                                 float *rowloss, ts_cuda_result *result);
cudaError_t ts_cuda_softmax_xent_grad(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                      const float *probs, const int32_t *labels, float *dlogits,
                                      ts_cuda_result *result);
cudaError_t ts_cuda_argmax_correct(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                   const float *logits, const int32_t *labels,
                                   ts_cuda_result *result);

#endif
