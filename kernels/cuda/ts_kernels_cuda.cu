// The CUDA back end's table (kernels/ts_kernels_cuda.h): device contexts, the per-GPU memory
// pools, transfers, cuBLAS matrix products and the kernel launches of ts_cuda_ops.cu.
//
// Every entry point makes its table's GPU current first (cudaSetDevice is per thread and
// cheap), so towers of several GPUs can share a thread or use one each.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <climits>

#include "ts_cuda.h"

extern "C" {
#include "ts_alloc.h"
}

namespace {

constexpr int kMaxDevices = 64;
constexpr size_t kBlasWorkspace = (size_t)32 << 20;  // cuBLAS's advice for Hopper
constexpr size_t kBlasWorkspaceMinLimit = (size_t)256 << 20;
constexpr size_t kRowLossMin = 4096;

}  // namespace

// One pool per GPU, shared by every table of that GPU; made by the first table, freed with
// the last.
struct ts_cuda_devpool {
  int device;
  int refs;
  ts_pool_t *pool;
  ts_gpu_memory_plan_t plan;
};

namespace {

pthread_mutex_t g_pools_mu = PTHREAD_MUTEX_INITIALIZER;
ts_cuda_devpool g_pools[kMaxDevices];

const char *fmt_bytes(size_t b, char *buf, size_t n) {
  return ts_pool_format_bytes(b, buf, n);
}

int backing_alloc(void *arg, size_t bytes, void **out, char *errmsg, size_t errlen) {
  ts_cuda_devpool *dp = static_cast<ts_cuda_devpool *>(arg);
  *out = nullptr;
  cudaError_t e = cudaSetDevice(dp->device);
  if (e == cudaSuccess) e = cudaMalloc(out, bytes);
  if (e == cudaSuccess) return 0;
  cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
  size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  cudaGetLastError();
  char a[32], f[32], t[32];
  ts_errmsg_printf(errmsg, errlen, "GPU %d: cudaMalloc(%s): %s; %s of %s free", dp->device,
                   fmt_bytes(bytes, a, sizeof a), cudaGetErrorString(e), fmt_bytes(fr, f, sizeof f),
                   fmt_bytes(tot, t, sizeof t));
  return e == cudaErrorMemoryAllocation ? TS_ENOMEM : TS_EDEVICE;
}

void backing_free(void *arg, void *chunk) {
  ts_cuda_devpool *dp = static_cast<ts_cuda_devpool *>(arg);
  cudaSetDevice(dp->device);
  cudaFree(chunk);
}

// The pool of `device`, made from `policy` by its first user.
int pool_acquire(int device, const ts_gpu_memory_policy_t *policy, ts_cuda_devpool **out,
                 char *errmsg, size_t errlen) {
  if (device < 0 || device >= kMaxDevices) {
    ts_errmsg_printf(errmsg, errlen, "GPU %d: at most %d GPUs are supported", device, kMaxDevices);
    return TS_EINVAL;
  }
  pthread_mutex_lock(&g_pools_mu);
  ts_cuda_devpool *dp = &g_pools[device];
  int rc = 0;
  if (dp->refs == 0) {
    size_t fr = 0, tot = 0;
    rc = ts_gpu_memory(device, &fr, &tot);
    if (rc < 0) {
      ts_errmsg_printf(errmsg, errlen, "GPU %d: cudaMemGetInfo failed", device);
      goto out;
    }
    rc = ts_gpu_memory_plan(device, tot, fr, policy, &dp->plan, errmsg, errlen);
    if (rc < 0) goto out;
    char name[32];
    snprintf(name, sizeof name, "GPU %d", device);
    dp->device = device;
    ts_pool_opts_t o = {};
    o.reserve = dp->plan.reserve;
    o.limit = dp->plan.limit;
    o.grow = dp->plan.grow;
    o.backing_alloc = backing_alloc;
    o.backing_free = backing_free;
    o.arg = dp;
    o.name = name;
    o.limit_reason = dp->plan.limit_reason;
    rc = ts_pool_create(&o, &dp->pool, errmsg, errlen);
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "GPU %d: %s", device, dp->plan.summary);
      goto out;
    }
  }
  dp->refs++;
  *out = dp;
out:
  pthread_mutex_unlock(&g_pools_mu);
  return rc;
}

void pool_release(ts_cuda_devpool *dp) {
  if (!dp) return;
  pthread_mutex_lock(&g_pools_mu);
  if (--dp->refs == 0) {
    ts_pool_destroy(dp->pool);
    dp->pool = nullptr;
  }
  pthread_mutex_unlock(&g_pools_mu);
}

}  // namespace

int ts_cuda_fail(ts_cuda_ctx *ctx, cudaError_t e, const char *call, const char *file, int line) {
  cudaGetLastError();  // clear what is clearable; a sticky error stays and fails later calls
  if (ctx)
    snprintf(ctx->errmsg, sizeof ctx->errmsg, "GPU %d: %s: %s (%s) at %s:%d", ctx->device, call,
             cudaGetErrorString(e), cudaGetErrorName(e), file, line);
  return e == cudaErrorMemoryAllocation ? TS_ENOMEM : TS_EDEVICE;
}

int ts_cublas_fail(ts_cuda_ctx *ctx, cublasStatus_t s, const char *call, const char *file,
                   int line) {
  if (ctx)
    snprintf(ctx->errmsg, sizeof ctx->errmsg, "GPU %d: %s: %s (%s) at %s:%d", ctx->device, call,
             cublasGetStatusString(s), cublasGetStatusName(s), file, line);
  return s == CUBLAS_STATUS_ALLOC_FAILED ? TS_ENOMEM : TS_EDEVICE;
}

namespace {

// Entry of every kernel: the context (TS_EINVAL for the placement-only table) and its GPU.
#define TS_CUDA_ENTER(k)                \
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k); \
  if (!ctx) return TS_EINVAL;           \
  TS_CUDA_CHECK(cudaSetDevice(ctx->device))

#define CHECK_BUF(p, n)                \
  do {                                 \
    if ((n) && !(p)) return TS_EINVAL; \
  } while (0)

int grid_cap(const ts_cuda_ctx *ctx) {
  return ctx->sm_count * 8;  // enough blocks to fill every SM; grid-stride loops do the rest
}

// Bring d_result to the host; a label found out of range since the last look is TS_EINVAL.
int fetch_result(ts_cuda_ctx *ctx) {
  TS_CUDA_CHECK(cudaMemcpyAsync(ctx->h_result, ctx->d_result, sizeof *ctx->h_result,
                                cudaMemcpyDeviceToHost, ctx->stream));
  TS_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
  if (ctx->h_result->bad_label) {
    TS_CUDA_CHECK(cudaMemsetAsync(&ctx->d_result->bad_label, 0, sizeof(int), ctx->stream));
    snprintf(ctx->errmsg, sizeof ctx->errmsg,
             "GPU %d: a label outside [0, classes) was found on the device", ctx->device);
    return TS_EINVAL;
  }
  return 0;
}

int cuda_alloc(const ts_kernels_t *k, size_t bytes, void **out) {
  if (!out) return TS_EINVAL;
  *out = nullptr;
  TS_CUDA_ENTER(k);
  return ts_pool_alloc(ctx->pool->pool, bytes, out, ctx->errmsg, sizeof ctx->errmsg);
}

void cuda_free_buf(const ts_kernels_t *k, void *buf) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  if (!ctx || !buf) return;
  // Kernels already queued may still use the buffer; the pool would hand it out again.
  cudaSetDevice(ctx->device);
  cudaStreamSynchronize(ctx->stream);
  ts_pool_free(ctx->pool->pool, buf);
}

int cuda_copy_to_device(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(dst, bytes);
  CHECK_BUF(src, bytes);
  if (!bytes) return 0;
  TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
  return 0;
}

int cuda_copy_to_host(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(dst, bytes);
  CHECK_BUF(src, bytes);
  if (!bytes) return 0;
  TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
  TS_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
  return 0;
}

int cuda_copy(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(dst, bytes);
  CHECK_BUF(src, bytes);
  if (!bytes) return 0;
  TS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
  return 0;
}

int cuda_synchronize(const ts_kernels_t *k) {
  TS_CUDA_ENTER(k);
  return fetch_result(ctx);
}

int cuda_host_alloc(const ts_kernels_t *k, size_t bytes, void **out) {
  if (!out) return TS_EINVAL;
  *out = nullptr;
  TS_CUDA_ENTER(k);
  // Portable: pinned for every GPU's context, so one staging buffer serves every tower.
  TS_CUDA_CHECK(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable));
  return 0;
}

void cuda_host_free(const ts_kernels_t *k, void *buf) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  if (!ctx || !buf) return;
  cudaSetDevice(ctx->device);
  cudaFreeHost(buf);
}

const char *cuda_last_error(const ts_kernels_t *k) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  return ctx ? ctx->errmsg : "";
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, with
// the row strides as leading dimensions, and computes n x m.
int cuda_gemm(const ts_kernels_t *k, bool trans_a, bool trans_b, size_t m, size_t n, size_t kk,
              float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
              float *c, size_t ldc) {
  TS_CUDA_ENTER(k);
  if (m > INT_MAX || n > INT_MAX || kk > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return TS_EINVAL;
  size_t a_cols = trans_a ? m : kk, b_cols = trans_b ? kk : n;
  if (lda < a_cols || ldb < b_cols || ldc < n) return TS_EINVAL;
  if (m == 0 || n == 0) return 0;
  CHECK_BUF(c, 1);
  if (kk == 0) {  // alpha * (empty product) = 0, and beta == 0 exactly 0 as on the CPU
    TS_CUDA_CHECK(ts_cuda_scale_matrix(ctx->stream, grid_cap(ctx), m, n, ldc, beta, c));
    return 0;
  }
  CHECK_BUF(a, 1);
  CHECK_BUF(b, 1);
  TS_CUBLAS_CHECK(cublasSgemm(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)kk, &alpha,
                              b, (int)(ldb ? ldb : 1), a, (int)(lda ? lda : 1), &beta, c,
                              (int)(ldc ? ldc : 1)));
  return 0;
}

int cuda_bias_add(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias, float *y) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(bias, rows && cols);
  CHECK_BUF(y, rows && cols);
  if (!rows || !cols) return 0;
  TS_CUDA_CHECK(ts_cuda_bias_add(ctx->stream, grid_cap(ctx), rows, cols, bias, y));
  return 0;
}

int cuda_bias_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *dy, float *db) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(db, cols);
  CHECK_BUF(dy, rows && cols);
  if (!cols) return 0;
  if (!rows) {
    TS_CUDA_CHECK(ts_cuda_fill(ctx->stream, grid_cap(ctx), cols, 0.0f, db));
    return 0;
  }
  TS_CUDA_CHECK(ts_cuda_bias_grad(ctx->stream, rows, cols, dy, db));
  return 0;
}

int cuda_axpy(const ts_kernels_t *k, size_t n, float alpha, const float *x, float *y) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_axpy(ctx->stream, grid_cap(ctx), n, alpha, x, y));
  return 0;
}

int cuda_scale(const ts_kernels_t *k, size_t n, float alpha, float *x) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(x, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_scale(ctx->stream, grid_cap(ctx), n, alpha, x));
  return 0;
}

int cuda_fill(const ts_kernels_t *k, size_t n, float value, float *x) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(x, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_fill(ctx->stream, grid_cap(ctx), n, value, x));
  return 0;
}

int cuda_mul(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(a, n);
  CHECK_BUF(b, n);
  CHECK_BUF(y, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_mul(ctx->stream, grid_cap(ctx), n, a, b, y));
  return 0;
}

int cuda_relu_fwd(const ts_kernels_t *k, size_t n, const float *x, float *y) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_relu_fwd(ctx->stream, grid_cap(ctx), n, x, y));
  return 0;
}

int cuda_relu_bwd(const ts_kernels_t *k, size_t n, const float *y, const float *dy, float *dx) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(y, n);
  CHECK_BUF(dy, n);
  CHECK_BUF(dx, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_relu_bwd(ctx->stream, grid_cap(ctx), n, y, dy, dx));
  return 0;
}

int cuda_tanh_fwd(const ts_kernels_t *k, size_t n, const float *x, float *y) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_tanh_fwd(ctx->stream, grid_cap(ctx), n, x, y));
  return 0;
}

int cuda_tanh_bwd(const ts_kernels_t *k, size_t n, const float *y, const float *dy, float *dx) {
  TS_CUDA_ENTER(k);
  CHECK_BUF(y, n);
  CHECK_BUF(dy, n);
  CHECK_BUF(dx, n);
  if (!n) return 0;
  TS_CUDA_CHECK(ts_cuda_tanh_bwd(ctx->stream, grid_cap(ctx), n, y, dy, dx));
  return 0;
}

// Per-row loss scratch for `rows` rows, grown (never shrunk) from the pool.
int ensure_rowloss(ts_cuda_ctx *ctx, size_t rows) {
  if (ctx->rowloss_cap >= rows) return 0;
  size_t cap = rows > kRowLossMin ? rows : kRowLossMin;
  void *p = nullptr;
  TS_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
  int rc = ts_pool_alloc(ctx->pool->pool, cap * sizeof(float), &p, ctx->errmsg, sizeof ctx->errmsg);
  if (rc < 0) return rc;
  ts_pool_free(ctx->pool->pool, ctx->d_rowloss);
  ctx->d_rowloss = static_cast<float *>(p);
  ctx->rowloss_cap = cap;
  return 0;
}

int cuda_softmax_xent(const ts_kernels_t *k, size_t rows, size_t cols, const float *logits,
                      const int32_t *labels, float *probs, float *loss_host) {
  TS_CUDA_ENTER(k);
  if (rows == 0 || cols == 0 || !logits || !labels || !probs) return TS_EINVAL;
  if (loss_host) {
    int rc = ensure_rowloss(ctx, rows);
    if (rc < 0) return rc;
  }
  TS_CUDA_CHECK(ts_cuda_softmax_xent(ctx->stream, grid_cap(ctx), rows, cols, logits, labels, probs,
                                     loss_host ? ctx->d_rowloss : nullptr, ctx->d_result));
  if (!loss_host) return 0;
  int rc = fetch_result(ctx);
  if (rc < 0) return rc;
  *loss_host = ctx->h_result->loss;
  return 0;
}

int cuda_softmax_xent_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *probs,
                           const int32_t *labels, float *dlogits) {
  TS_CUDA_ENTER(k);
  if (rows == 0 || cols == 0 || !probs || !labels || !dlogits) return TS_EINVAL;
  TS_CUDA_CHECK(ts_cuda_softmax_xent_grad(ctx->stream, grid_cap(ctx), rows, cols, probs, labels,
                                          dlogits, ctx->d_result));
  return 0;
}

int cuda_argmax_correct(const ts_kernels_t *k, size_t rows, size_t cols, const float *logits,
                        const int32_t *labels, size_t *correct_host) {
  TS_CUDA_ENTER(k);
  if (!correct_host || cols == 0) return TS_EINVAL;
  CHECK_BUF(logits, rows);
  CHECK_BUF(labels, rows);
  if (rows == 0) {
    *correct_host = 0;
    return 0;
  }
  TS_CUDA_CHECK(ts_cuda_argmax_correct(ctx->stream, grid_cap(ctx), rows, cols, logits, labels,
                                       ctx->d_result));
  int rc = fetch_result(ctx);
  if (rc < 0) return rc;
  *correct_host = (size_t)ctx->h_result->correct;
  return 0;
}

ts_kernels_t make_table() {
  ts_kernels_t t;
  memset(&t, 0, sizeof t);
  t.name = "cuda";
  t.device_type = "GPU";
  t.device_is_host = false;
  t.alloc = cuda_alloc;
  t.free_buf = cuda_free_buf;
  t.copy_to_device = cuda_copy_to_device;
  t.copy_to_host = cuda_copy_to_host;
  t.copy = cuda_copy;
  t.synchronize = cuda_synchronize;
  t.host_alloc = cuda_host_alloc;
  t.host_free = cuda_host_free;
  t.last_error = cuda_last_error;
  t.gemm = cuda_gemm;
  t.bias_add = cuda_bias_add;
  t.bias_grad = cuda_bias_grad;
  t.axpy = cuda_axpy;
  t.scale = cuda_scale;
  t.fill = cuda_fill;
  t.relu_fwd = cuda_relu_fwd;
  t.relu_bwd = cuda_relu_bwd;
  t.tanh_fwd = cuda_tanh_fwd;
  t.tanh_bwd = cuda_tanh_bwd;
  t.softmax_xent = cuda_softmax_xent;
  t.softmax_xent_grad = cuda_softmax_xent_grad;
  t.argmax_correct = cuda_argmax_correct;
  t.mul = cuda_mul;
#if TS_HAVE_CUDNN
  ts_cudnn_fill_table(&t);  // convolution and max pooling; NULL without cuDNN
#endif
  return t;
}

const ts_kernels_t g_ops_table = make_table();

// Everything create needs after the context struct exists; destroy_ctx undoes any prefix.
int setup(ts_cuda_ctx *ctx, const ts_kernels_cuda_opts_t *opts) {
  TS_CUDA_CHECK(cudaSetDevice(ctx->device));
  TS_CUDA_CHECK(
      cudaDeviceGetAttribute(&ctx->sm_count, cudaDevAttrMultiProcessorCount, ctx->device));
  if (ctx->sm_count < 1) ctx->sm_count = 1;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  int rc = pool_acquire(ctx->device, &opts->memory, &ctx->pool, ctx->errmsg, sizeof ctx->errmsg);
  if (rc < 0) return rc;
  TS_CUBLAS_CHECK(cublasCreate(&ctx->blas));
  TS_CUBLAS_CHECK(cublasSetStream(ctx->blas, ctx->stream));
  ctx->allow_tf32 = opts->allow_tf32;
  TS_CUBLAS_CHECK(cublasSetMathMode(
      ctx->blas, opts->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  // cuBLAS's workspace comes from our pool so memory_fraction holds; a small limit gets
  // none (cuBLAS then picks algorithms that need none, rather than allocating its own).
  size_t limit = ctx->pool->plan.limit;
  size_t ws = (limit == 0 || limit >= kBlasWorkspaceMinLimit) ? kBlasWorkspace : 0;
  if (ws) {
    rc = ts_pool_alloc(ctx->pool->pool, ws, &ctx->blas_workspace, ctx->errmsg, sizeof ctx->errmsg);
    if (rc < 0) return rc;
  }
  TS_CUBLAS_CHECK(cublasSetWorkspace(ctx->blas, ctx->blas_workspace, ws));
  void *p = nullptr;
  rc = ts_pool_alloc(ctx->pool->pool, sizeof(ts_cuda_result), &p, ctx->errmsg, sizeof ctx->errmsg);
  if (rc < 0) return rc;
  ctx->d_result = static_cast<ts_cuda_result *>(p);
  TS_CUDA_CHECK(cudaMemsetAsync(ctx->d_result, 0, sizeof(ts_cuda_result), ctx->stream));
  TS_CUDA_CHECK(cudaHostAlloc(&p, sizeof(ts_cuda_result), cudaHostAllocPortable));
  ctx->h_result = static_cast<ts_cuda_result *>(p);
  memset(ctx->h_result, 0, sizeof *ctx->h_result);
  TS_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
  return 0;
}

void destroy_ctx(ts_cuda_ctx *ctx) {
  cudaSetDevice(ctx->device);
  if (ctx->stream) cudaStreamSynchronize(ctx->stream);
#if TS_HAVE_CUDNN
  ts_cudnn_destroy(ctx);
#endif
  if (ctx->blas) cublasDestroy(ctx->blas);
  if (ctx->pool) {
    ts_pool_free(ctx->pool->pool, ctx->d_rowloss);
    ts_pool_free(ctx->pool->pool, ctx->d_result);
    ts_pool_free(ctx->pool->pool, ctx->blas_workspace);
    pool_release(ctx->pool);
  }
  if (ctx->h_result) cudaFreeHost(ctx->h_result);
  if (ctx->stream) cudaStreamDestroy(ctx->stream);
  cudaGetLastError();
  ts_free(ctx);
}

}  // namespace

ts_pool_t *ts_cuda_pool(ts_cuda_ctx *ctx) {
  return ctx->pool->pool;
}

size_t ts_cuda_pool_limit(ts_cuda_ctx *ctx) {
  return ctx->pool->plan.limit;
}

extern "C" bool ts_kernels_cuda_built(void) {
  return true;
}

extern "C" bool ts_kernels_cuda_have_cudnn(void) {
#if TS_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

extern "C" const ts_kernels_t *ts_kernels_cuda_ops(void) {
  return &g_ops_table;
}

extern "C" int ts_kernels_cuda_create(int device, const ts_kernels_cuda_opts_t *opts,
                                      ts_kernels_t **out, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!out) return TS_EINVAL;
  *out = nullptr;
  ts_kernels_cuda_opts_t def;
  memset(&def, 0, sizeof def);
  def.memory.allow_growth = true;
  if (!opts) opts = &def;
  char why[256];
  int n = ts_gpu_count(why, sizeof why);
  if (n == 0) {
    ts_errmsg_printf(errmsg, errlen, "no GPU for the CUDA back end: %s", why);
    return TS_EDEVICE;
  }
  if (device < 0 || device >= n) {
    ts_errmsg_printf(errmsg, errlen, "/gpu:%d does not exist: %d GPU(s) are visible", device, n);
    return TS_EINVAL;
  }
  ts_cuda_ctx *ctx = static_cast<ts_cuda_ctx *>(ts_calloc(1, sizeof(ts_cuda_ctx)));
  if (!ctx) {
    ts_errmsg_printf(errmsg, errlen, "out of host memory");
    return TS_ENOMEM;
  }
  ctx->table = make_table();
  ctx->table.ctx = ctx;
  ctx->table.device_index = device;
  ctx->device = device;
  int rc = setup(ctx, opts);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "%s", ctx->errmsg);
    destroy_ctx(ctx);
    return rc;
  }
  *out = &ctx->table;
  return 0;
}

extern "C" void ts_kernels_cuda_destroy(ts_kernels_t *k) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  if (ctx) destroy_ctx(ctx);
}

extern "C" int ts_kernels_cuda_memory(const ts_kernels_t *k, ts_pool_stats_t *stats,
                                      ts_gpu_memory_plan_t *plan) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  if (!ctx || k->alloc != cuda_alloc) return TS_EINVAL;
  if (stats) ts_pool_stats(ctx->pool->pool, stats);
  if (plan) *plan = ctx->pool->plan;
  return 0;
}
