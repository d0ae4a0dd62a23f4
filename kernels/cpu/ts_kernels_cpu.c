/*
 * The CPU back end: the reference implementation of ts_kernels.h.
 *
 * Matrix products go to OpenBLAS. Everything else is a plain loop over restrict pointers
 * with no calls inside, which GCC and Clang vectorise at -O2/-O3; the loops are written for
 * clarity first because every other back end is tested against them. The convolution and
 * pooling kernels (ts_kernels_cpu_conv.c, ts_kernels_cpu_direct.c) and the fused bias +
 * ReLU (ts_kernels_cpu_fused.c) are in files of their own, with loops compiled per vector
 * instruction set; ts_cpu_isa() below says which set this CPU runs.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_kernels.h"
#include "ts_kernels_cpu_int.h"

/* A NULL buffer is only acceptable when there is nothing to touch. */
#define CHECK_BUF(p, n)                \
  do {                                 \
    if ((n) && !(p)) return TS_EINVAL; \
  } while (0)

static int cpu_alloc(const ts_kernels_t *k, size_t bytes, void **out) {
  (void)k;
  if (!out) return TS_EINVAL;
  *out = ts_aligned_alloc(bytes);
  return *out ? 0 : TS_ENOMEM;
}

static void cpu_free_buf(const ts_kernels_t *k, void *buf) {
  (void)k;
  ts_free(buf);
}

static int cpu_copy(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  (void)k;
  CHECK_BUF(dst, bytes);
  CHECK_BUF(src, bytes);
  if (bytes) memcpy(dst, src, bytes);
  return 0;
}

static int cpu_synchronize(const ts_kernels_t *k) {
  (void)k;
  return 0;
}

static int cpu_host_alloc(const ts_kernels_t *k, size_t bytes, void **out) {
  return cpu_alloc(k, bytes, out);
}

static void cpu_host_free(const ts_kernels_t *k, void *buf) {
  (void)k;
  ts_free(buf);
}

/* Every CPU failure is an argument or memory error whose code says it all. */
static const char *cpu_last_error(const ts_kernels_t *k) {
  (void)k;
  return "";
}

static int cpu_gemm(const ts_kernels_t *k, bool trans_a, bool trans_b, size_t m, size_t n,
                    size_t kk, float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                    float beta, float *c, size_t ldc) {
  (void)k;
  if (m > INT_MAX || n > INT_MAX || kk > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
    return TS_EINVAL;
  /* Stored shapes: A is m x kk (kk x m transposed), B is kk x n (n x kk transposed). */
  size_t a_cols = trans_a ? m : kk, b_cols = trans_b ? kk : n;
  if (lda < a_cols || ldb < b_cols || ldc < n) return TS_EINVAL;
  if (m == 0 || n == 0) return 0;
  CHECK_BUF(c, 1);
  if (kk == 0) { /* alpha * (empty product) = 0; BLAS handles it, but keep beta == 0 exact */
    for (size_t i = 0; i < m; i++)
      for (size_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return 0;
  }
  CHECK_BUF(a, 1);
  CHECK_BUF(b, 1);
  /* BLAS rejects ld = 0 even where no row is stored; an ld of at least 1 is harmless. */
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)kk, alpha, a,
              (int)(lda ? lda : 1), b, (int)(ldb ? ldb : 1), beta, c, (int)(ldc ? ldc : 1));
  return 0;
}

static int cpu_bias_add(const ts_kernels_t *k, size_t rows, size_t cols, const float *restrict bias,
                        float *restrict y) {
  (void)k;
  CHECK_BUF(bias, rows && cols);
  CHECK_BUF(y, rows && cols);
  for (size_t i = 0; i < rows; i++) {
    float *restrict row = y + i * cols;
    for (size_t j = 0; j < cols; j++) row[j] += bias[j];
  }
  return 0;
}

static int cpu_bias_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *restrict dy,
                         float *restrict db) {
  (void)k;
  CHECK_BUF(db, cols);
  CHECK_BUF(dy, rows && cols);
  for (size_t j = 0; j < cols; j++) db[j] = 0.0f;
  /* Row by row, so the inner loop is contiguous and vectorises. */
  for (size_t i = 0; i < rows; i++) {
    const float *restrict row = dy + i * cols;
    for (size_t j = 0; j < cols; j++) db[j] += row[j];
  }
  return 0;
}

static int cpu_axpy(const ts_kernels_t *k, size_t n, float alpha, const float *restrict x,
                    float *restrict y) {
  (void)k;
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
  return 0;
}

static int cpu_scale(const ts_kernels_t *k, size_t n, float alpha, float *restrict x) {
  (void)k;
  CHECK_BUF(x, n);
  for (size_t i = 0; i < n; i++) x[i] *= alpha;
  return 0;
}

static int cpu_fill(const ts_kernels_t *k, size_t n, float value, float *restrict x) {
  (void)k;
  CHECK_BUF(x, n);
  for (size_t i = 0; i < n; i++) x[i] = value;
  return 0;
}

static int cpu_relu_fwd(const ts_kernels_t *k, size_t n, const float *restrict x,
                        float *restrict y) {
  (void)k;
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return 0;
}

static int cpu_relu_bwd(const ts_kernels_t *k, size_t n, const float *restrict y,
                        const float *restrict dy, float *restrict dx) {
  (void)k;
  CHECK_BUF(y, n);
  CHECK_BUF(dy, n);
  CHECK_BUF(dx, n);
  for (size_t i = 0; i < n; i++) {
    float g = dy[i]; /* read unconditionally: the select vectorises, a branch would not */
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
  return 0;
}

static int cpu_tanh_fwd(const ts_kernels_t *k, size_t n, const float *restrict x,
                        float *restrict y) {
  (void)k;
  CHECK_BUF(x, n);
  CHECK_BUF(y, n);
  for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
  return 0;
}

static int cpu_tanh_bwd(const ts_kernels_t *k, size_t n, const float *restrict y,
                        const float *restrict dy, float *restrict dx) {
  (void)k;
  CHECK_BUF(y, n);
  CHECK_BUF(dy, n);
  CHECK_BUF(dx, n);
  for (size_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  return 0;
}

static int check_labels(size_t rows, size_t cols, const int32_t *labels) {
  for (size_t i = 0; i < rows; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= cols) return TS_EINVAL;
  return 0;
}

static int cpu_softmax_xent(const ts_kernels_t *k, size_t rows, size_t cols,
                            const float *restrict logits, const int32_t *restrict labels,
                            float *restrict probs, float *loss_host) {
  (void)k;
  if (rows == 0 || cols == 0 || !logits || !labels || !probs) return TS_EINVAL;
  int rc = check_labels(rows, cols, labels);
  if (rc < 0) return rc;
  double total = 0.0; /* a sum of thousands of losses: keep it in double */
  for (size_t i = 0; i < rows; i++) {
    const float *restrict z = logits + i * cols;
    float *restrict p = probs + i * cols;
    float max = z[0];
    for (size_t j = 1; j < cols; j++) max = z[j] > max ? z[j] : max;
    /* In double: a float sum of tens of thousands of classes drifts by 1e-5 and more (the
     * probabilities 4e-5 off the GPU's warp-split sum at 40000 classes). */
    double dsum = 0.0;
    for (size_t j = 0; j < cols; j++) {
      p[j] = expf(z[j] - max);
      dsum += (double)p[j];
    }
    float sum = (float)dsum;
    float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
    for (size_t j = 0; j < cols; j++) p[j] *= inv;
    /* -log softmax = log(sum) - (z_label - max), exact even where p rounds to 0 */
    total += (double)(logf(sum) - (z[labels[i]] - max));
  }
  if (loss_host) *loss_host = (float)(total / (double)rows);
  return 0;
}

/* Not restrict: dlogits may be probs (each element is read, then written, in place). */
static int cpu_softmax_xent_grad(const ts_kernels_t *k, size_t rows, size_t cols,
                                 const float *probs, const int32_t *restrict labels,
                                 float *dlogits) {
  (void)k;
  if (rows == 0 || cols == 0 || !probs || !labels || !dlogits) return TS_EINVAL;
  int rc = check_labels(rows, cols, labels);
  if (rc < 0) return rc;
  float inv = 1.0f / (float)rows;
  for (size_t i = 0; i < rows; i++) {
    const float *p = probs + i * cols;
    float *d = dlogits + i * cols;
    for (size_t j = 0; j < cols; j++) d[j] = p[j] * inv;
    d[labels[i]] -= inv;
  }
  return 0;
}

static int cpu_argmax_correct(const ts_kernels_t *k, size_t rows, size_t cols,
                              const float *restrict logits, const int32_t *restrict labels,
                              size_t *correct_host) {
  (void)k;
  if (!correct_host || cols == 0) return TS_EINVAL;
  CHECK_BUF(logits, rows);
  CHECK_BUF(labels, rows);
  size_t correct = 0;
  for (size_t i = 0; i < rows; i++) {
    const float *restrict z = logits + i * cols;
    size_t best = 0;
    for (size_t j = 1; j < cols; j++)
      if (z[j] > z[best]) best = j;
    if (labels[i] >= 0 && (size_t)labels[i] == best) correct++;
  }
  *correct_host = correct;
  return 0;
}

static const ts_kernels_t cpu_kernels = {
    .name = "cpu",
    .device_type = "CPU",
    .device_index = 0,
    .ctx = NULL,
    .device_is_host = true,
    .alloc = cpu_alloc,
    .free_buf = cpu_free_buf,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .last_error = cpu_last_error,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .fill = cpu_fill,
    .relu_fwd = cpu_relu_fwd,
    .relu_bwd = cpu_relu_bwd,
    .tanh_fwd = cpu_tanh_fwd,
    .tanh_bwd = cpu_tanh_bwd,
    .bias_relu = ts_cpu_bias_relu,
    .relu_bwd_bias_grad = ts_cpu_relu_bwd_bias_grad,
    .softmax_xent = cpu_softmax_xent,
    .softmax_xent_grad = cpu_softmax_xent_grad,
    .argmax_correct = cpu_argmax_correct,
    .conv2d_workspace = ts_cpu_conv2d_workspace,
    .conv2d_fwd = ts_cpu_conv2d_fwd,
    .conv2d_bwd_data = ts_cpu_conv2d_bwd_data,
    .conv2d_bwd_filter = ts_cpu_conv2d_bwd_filter,
    .maxpool_fwd = ts_cpu_maxpool_fwd,
    .maxpool_bwd = ts_cpu_maxpool_bwd,
    .mul = ts_cpu_mul,
};

/* -1: not yet known. Relaxed atomics: every thread computes the same value. */
static int isa_found = -1, isa_cap = TS_CPU_ISA_AVX512;

static int isa_detect(void) {
#ifdef TS_CPU_MULTI_ISA
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return TS_CPU_ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return TS_CPU_ISA_AVX2;
#endif
  return TS_CPU_ISA_BASE;
}

ts_cpu_isa_t ts_cpu_isa(void) {
  int found = __atomic_load_n(&isa_found, __ATOMIC_RELAXED);
  if (found < 0) {
    found = isa_detect();
    __atomic_store_n(&isa_found, found, __ATOMIC_RELAXED);
  }
  int cap = __atomic_load_n(&isa_cap, __ATOMIC_RELAXED);
  return (ts_cpu_isa_t)(found < cap ? found : cap);
}

ts_cpu_isa_t ts_cpu_isa_limit(ts_cpu_isa_t max) {
  return (ts_cpu_isa_t)__atomic_exchange_n(&isa_cap, (int)max, __ATOMIC_RELAXED);
}

const ts_kernels_t *ts_kernels_cpu(void) {
  return &cpu_kernels;
}

int ts_kernels_cpu_set_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
  return openblas_get_num_threads();
}

const char *ts_kernels_cpu_better_core(void) {
#if defined(__x86_64__)
  if (getenv("OPENBLAS_CORETYPE")) return NULL;
  static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem",
                                        "Atom", "Sandybridge"};
  const char *core = openblas_get_corename();
  bool weak = false;
  for (size_t i = 0; core && i < sizeof generic / sizeof generic[0]; i++)
    if (strcasecmp(core, generic[i]) == 0) weak = true;
  if (!weak) return NULL;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      strcasecmp(core, "Sandybridge") != 0)
    return "Haswell";
#endif
  return NULL;
}

void ts_kernels_cpu_reexec_for_core(char **argv) {
  const char *want = ts_kernels_cpu_better_core();
  if (!want) return;
  setenv("TS_OPENBLAS_CORE_WAS", openblas_get_corename(), 1);
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); /* exec failed: carry on with what OpenBLAS chose */
  unsetenv("TS_OPENBLAS_CORE_WAS");
}
