/*
 * Kernels: the compute interface of a worker (docs/dev/ARCHITECTURE.md).
 *
 * A back end is a table of function pointers over float buffers that live in the back end's
 * memory ("device memory": host memory for the CPU back end, GPU memory for CUDA). The model
 * calls only this table, so the same model code runs on either back end, and the CPU back end
 * is the reference every other back end is tested against. This header includes no CUDA
 * header and never will.
 *
 * Glossary.
 *   device buffer  memory from k->alloc; only kernels of the same back end may touch it.
 *   host buffer    ordinary memory of the process.
 *   row-major      matrices are stored row after row; a rows x cols matrix has element (i, j)
 *                  at [i * ld + j] with ld >= cols (ld = cols for a dense matrix).
 *
 * Calling convention. Every kernel takes the table itself first (k), so a back end that needs
 * state (a CUDA device, stream and cuBLAS handle) finds it in k->ctx. Every kernel returns 0
 * or a negative code from ts_err.h: TS_EINVAL for arguments outside the contract (a NULL
 * buffer with a non-zero size, a dimension above INT_MAX for gemm, a label outside
 * [0, cols)), TS_ENOMEM from alloc, TS_EDEVICE for a failure inside the device. A kernel that
 * fails leaves its outputs unspecified. Sizes of 0 are valid and do nothing (fill, axpy ...)
 * or produce the neutral result (bias_grad of 0 rows is zeros).
 *
 * Aliasing. Unless a kernel says otherwise, its output must not overlap any of its inputs
 * (the CPU back end declares its pointers restrict).
 *
 * Ordering. Kernels of one back end run in the order they are called. A back end may run
 * them asynchronously (CUDA on one stream), but copy_to_host, and every kernel that returns
 * a result in host memory (softmax_xent's loss, argmax_correct's count), returns only once
 * the result is there. synchronize() waits for all outstanding work. An asynchronous back
 * end reports a failure inside a kernel (a fault, or a label out of range found on the
 * device) from the next call that waits: copy_to_host, a kernel with a host result, or
 * synchronize.
 *
 * Host memory for transfers. host_alloc gives host memory the back end can copy from and to
 * at full speed (pinned, page-locked memory for CUDA; ordinary aligned memory for the CPU).
 * copy_to_device from such memory may still be reading it after the call returns, until the
 * next call that waits (above); from any other host memory the source may be reused as soon
 * as the call returns.
 *
 * Errors with detail. last_error returns a one-line description of the table's most recent
 * failure ("cudaMalloc: out of memory", "device.memory_fraction = 0.01 limits GPU 0 to 1.4
 * GiB: 1.3 GiB in use, 0.5 GiB more asked"), or "" when there is none. The string belongs to
 * the table and is overwritten by the next failure of the same table.
 *
 * Missing kernels. A back end may leave an op's pointer NULL when it has no kernel for it;
 * device placement (worker/) then reports "no supported kernel" or places that op on the CPU
 * (allow_soft_placement). The CPU back end implements every kernel.
 */
#ifndef TS_KERNELS_H
#define TS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_conv.h"

typedef struct ts_kernels ts_kernels_t;

struct ts_kernels {
  const char *name;        /* back end: "cpu", "cuda" */
  const char *device_type; /* TensorFlow's device type in placement lines: "CPU", "GPU" */
  int device_index;        /* N in /device:GPU:N; 0 for the CPU */
  void *ctx;               /* the back end's state; NULL for the CPU */
  /* True when device buffers are ordinary host memory (the CPU back end): the worker then
   * pulls straight into the parameters and pushes straight from the gradients. */
  bool device_is_host;

  /* --- memory -------------------------------------------------------------------------
   * alloc: *out = a device buffer of `bytes` bytes, aligned for float (64 bytes on the CPU),
   * contents undefined; bytes == 0 gives a unique pointer. Freed with free_buf (NULL is a
   * no-op). The CPU back end allocates through ts_aligned_alloc, so ts_alloc_fail_after
   * reaches it. */
  int (*alloc)(const ts_kernels_t *k, size_t bytes, void **out);
  void (*free_buf)(const ts_kernels_t *k, void *buf);
  /* Copies of `bytes` bytes: host -> device, device -> host, device -> device (the CPU back
   * end's three are memcpy). The ranges must not overlap. */
  int (*copy_to_device)(const ts_kernels_t *k, void *dst_dev, const void *src_host, size_t bytes);
  int (*copy_to_host)(const ts_kernels_t *k, void *dst_host, const void *src_dev, size_t bytes);
  int (*copy)(const ts_kernels_t *k, void *dst_dev, const void *src_dev, size_t bytes);
  /* Wait until every kernel called so far has finished. */
  int (*synchronize)(const ts_kernels_t *k);
  /* Host memory for transfers (see above): *out = `bytes` bytes of host memory, aligned to 64
   * bytes, contents undefined; freed with host_free (NULL is a no-op). TS_ENOMEM when it
   * cannot be had. */
  int (*host_alloc)(const ts_kernels_t *k, size_t bytes, void **out);
  void (*host_free)(const ts_kernels_t *k, void *buf);
  /* The last failure in words; never NULL (see above). */
  const char *(*last_error)(const ts_kernels_t *k);

  /* --- dense algebra ------------------------------------------------------------------
   * C = alpha * op(A) * op(B) + beta * C, row-major, as cblas_sgemm(CblasRowMajor, ...).
   * op(A) is m x kk (A is m x kk, or kk x m when trans_a); op(B) is kk x n (B is kk x n, or
   * n x kk when trans_b); C is m x n. lda, ldb, ldc are the row strides of A, B, C as
   * stored. With beta == 0, C is not read (it may hold NaN). m, n, kk <= INT_MAX. */
  int (*gemm)(const ts_kernels_t *k, bool trans_a, bool trans_b, size_t m, size_t n, size_t kk,
              float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
              float *c, size_t ldc);
  /* y[i][j] += bias[j] for a dense rows x cols matrix y (in place). */
  int (*bias_add)(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias, float *y);
  /* db[j] = sum over i of dy[i][j] (column sums of a dense rows x cols matrix). */
  int (*bias_grad)(const ts_kernels_t *k, size_t rows, size_t cols, const float *dy, float *db);
  /* y += alpha * x over n elements. */
  int (*axpy)(const ts_kernels_t *k, size_t n, float alpha, const float *x, float *y);
  /* x *= alpha over n elements (in place). */
  int (*scale)(const ts_kernels_t *k, size_t n, float alpha, float *x);
  /* x[i] = value over n elements. */
  int (*fill)(const ts_kernels_t *k, size_t n, float value, float *x);

  /* --- activations (elementwise over n) -----------------------------------------------
   * relu_fwd: y = max(x, 0). relu_bwd: dx = dy where y > 0, else 0; it takes the forward
   * OUTPUT y (y > 0 exactly where x > 0), so the input need not be kept.
   * tanh_fwd: y = tanh(x). tanh_bwd: dx = dy * (1 - y * y), again from the output y. */
  int (*relu_fwd)(const ts_kernels_t *k, size_t n, const float *x, float *y);
  int (*relu_bwd)(const ts_kernels_t *k, size_t n, const float *y, const float *dy, float *dx);
  int (*tanh_fwd)(const ts_kernels_t *k, size_t n, const float *x, float *y);
  int (*tanh_bwd)(const ts_kernels_t *k, size_t n, const float *y, const float *dy, float *dx);
  /* Fused forms, for a layer's product with a bias and a ReLU: one pass where the kernels
   * above make two or three. Optional: a back end may leave them NULL (the CUDA back end
   * does), and the model then calls bias_add, relu_fwd, relu_bwd and bias_grad instead.
   * bias_relu: y[i][j] = max(y[i][j] + bias[j], 0) for a dense rows x cols matrix, in place
   * (the layer keeps only its output: relu_bwd needs no more).
   * relu_bwd_bias_grad: dx = relu_bwd(y, dy) over rows x cols, and db[j] = sum over i of
   * dx[i][j] (bias_grad of dx). dx must not overlap y or dy. */
  int (*bias_relu)(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias, float *y);
  int (*relu_bwd_bias_grad)(const ts_kernels_t *k, size_t rows, size_t cols, const float *y,
                            const float *dy, float *dx, float *db);

  /* --- loss and metrics ---------------------------------------------------------------
   * Softmax cross-entropy over `rows` examples of `cols` classes (TensorFlow's
   * SoftmaxCrossEntropyWithLogits with sparse labels). logits is a dense rows x cols device
   * matrix, labels rows device int32 values in [0, cols).
   *   softmax_xent: probs = softmax(logits) row by row (computed stably, after subtracting
   *   the row maximum) and *loss_host = mean over rows of -log softmax(logits)[i][label_i]
   *   (computed as logsumexp - logit, never log of a rounded-to-zero probability). loss_host
   *   is host memory; it may be NULL when only probs is wanted. rows must be > 0.
   *   softmax_xent_grad: dlogits = (probs - onehot(labels)) / rows, the gradient of the mean
   *   loss with respect to the logits. dlogits MAY be the same buffer as probs (in place). */
  int (*softmax_xent)(const ts_kernels_t *k, size_t rows, size_t cols, const float *logits,
                      const int32_t *labels, float *probs, float *loss_host);
  int (*softmax_xent_grad)(const ts_kernels_t *k, size_t rows, size_t cols, const float *probs,
                           const int32_t *labels, float *dlogits);
  /* *correct_host = number of rows whose argmax (the first maximum on ties) equals the
   * label. Labels outside [0, cols) count as wrong rather than failing. */
  int (*argmax_correct)(const ts_kernels_t *k, size_t rows, size_t cols, const float *logits,
                        const int32_t *labels, size_t *correct_host);

  /* --- convolution and pooling (NHWC; geometry and padding in ts_conv.h) ---------------
   * A back end without these leaves them NULL (the CUDA back end of a build without cuDNN;
   * with it they are cuDNN's, kernels/cuda/ts_cuda_cudnn.cu).
   *
   * conv2d_workspace: the device scratch, in bytes, the three convolution kernels want for
   * geometry g (its batch included). The caller allocates it with k->alloc (so a GPU's memory
   * policy counts it) and passes it to each call with its size. The CPU back end works with
   * any size that holds one image's im2col matrix (oh * ow x win_h * win_w * in_c floats),
   * going through the batch in chunks of as many images as fit; it asks for at most about 8
   * MiB beyond that. A size below what the back end needs is TS_EINVAL.
   * conv2d_fwd: y = x (*) w: x is g->batch x in_h x in_w x in_c, w is HWIO (win_h x win_w x
   * in_c x out_c), y is batch x out_h x out_w x out_c. No bias: bias_add over batch * out_h
   * * out_w rows of out_c does it, as TensorFlow's BiasAdd.
   * conv2d_bwd_data: dx = the gradient with respect to x of sum(dy * y) (TensorFlow's
   * Conv2DBackpropInput); dx is overwritten.
   * conv2d_bwd_filter: dw = the gradient with respect to w (Conv2DBackpropFilter); dw is
   * overwritten. */
  size_t (*conv2d_workspace)(const ts_kernels_t *k, const ts_conv2d_t *g);
  int (*conv2d_fwd)(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *w,
                    float *y, void *ws, size_t ws_bytes);
  int (*conv2d_bwd_data)(const ts_kernels_t *k, const ts_conv2d_t *g, const float *w,
                         const float *dy, float *dx, void *ws, size_t ws_bytes);
  int (*conv2d_bwd_filter)(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x,
                           const float *dy, float *dw, void *ws, size_t ws_bytes);
  /* maxpool_fwd: y = the maximum of each window of x (padding skipped; g->out_c == in_c), and
   * argmax[i] = where in its image (y * in_w + x) * in_c + c the maximum of output element i
   * was, the first one on ties. argmax is a device buffer of as many int32 as y has floats;
   * a back end that does not need it (cuDNN recomputes from x and y) may leave it unwritten.
   * maxpool_bwd: dx = dy routed to each window's maximum (summed where windows overlap);
   * dx is overwritten. It takes x, y and argmax from the forward pass. */
  int (*maxpool_fwd)(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, float *y,
                     int32_t *argmax);
  int (*maxpool_bwd)(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *y,
                     const float *dy, const int32_t *argmax, float *dx);
  /* y[i] = a[i] * b[i] over n elements (dropout applies its mask with it, both ways). y may be
   * the same buffer as a (in place). */
  int (*mul)(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y);
};

/* The CPU back end: OpenBLAS for gemm and the im2col convolutions, loops compiled for the
 * CPU's vector instructions for the rest (docs/dev/ARCHITECTURE.md, "Convolution on the
 * CPU"). A static table, valid for
 * the life of the process; never freed. Thread-safe (its one piece of state, the vector
 * instruction set found, is kept atomically; OpenBLAS's own threading is set by
 * OPENBLAS_NUM_THREADS or ts_kernels_cpu_set_threads). */
const ts_kernels_t *ts_kernels_cpu(void);

/* The threads one CPU op may use (OpenBLAS's): n > 0 sets them, 0 keeps OpenBLAS's choice.
 * Returns the number in force. Call before training starts (it is process-wide). */
int ts_kernels_cpu_set_threads(int n);

/* OpenBLAS picks its kernels by the CPU's model number when it loads, and a release older
 * than the CPU (Debian 12's 0.3.21 on Sapphire Rapids) falls back to its oldest x86-64
 * kernels (Prescott: SSE3), several times slower than the CPU's AVX-512 or AVX2 ones. When
 * that happened and OPENBLAS_CORETYPE is not set, this returns the core type the CPU's
 * features support ("SkylakeX": AVX-512 F/BW/DQ/VL; "Haswell": AVX2 and FMA), else NULL.
 * It takes effect only through OPENBLAS_CORETYPE in a new process image: a binary sets the
 * variable and re-executes itself (ts_kernels_cpu_reexec_for_core). */
const char *ts_kernels_cpu_better_core(void);

/* When ts_kernels_cpu_better_core names a core: sets OPENBLAS_CORETYPE to it (and
 * TS_OPENBLAS_CORE_WAS to the core OpenBLAS chose) and execv's /proc/self/exe with argv.
 * Returns only when there is nothing to do or the exec failed. Call first in main, before
 * any thread starts. */
void ts_kernels_cpu_reexec_for_core(char **argv);

#endif
