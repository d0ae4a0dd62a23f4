/*
 * The CPU kernels: the argument contract, each kernel against a naive double-precision
 * reference on random shapes (gemm in all four transpose combinations, with padded leading
 * dimensions), and every differentiable op's gradient kernel against central finite
 * differences.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/ts_kernels_cpu_int.h"
#include "rng_fixture.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_kernels.h"

static const ts_kernels_t *K;

/* --- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x1234567u;

static double urand(void) { return rng_uniform(&rng_state); } /* in [0, 1) */

static float frand(float lo, float hi) {
  return lo + (hi - lo) * (float)urand();
}

static size_t irand(size_t lo, size_t hi) { /* inclusive */
  return lo + (size_t)(urand() * (double)(hi - lo + 1));
}

static float *rand_buf(size_t n, float lo, float hi) {
  float *p = ts_malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
  return p;
}

static void assert_close_at(double got, double want, double rtol, double atol, const char *what,
                            size_t i) {
  double err = fabs(got - want);
  double lim = atol + rtol * fmax(fabs(got), fabs(want));
  if (!(err <= lim))
    fail_msg("%s[%zu]: got %.9g, want %.9g (|diff| %.3g > %.3g)", what, i, got, want, err, lim);
}

static void assert_all_close(const float *got, const double *want, size_t n, double rtol,
                             double atol, const char *what) {
  for (size_t i = 0; i < n; i++) assert_close_at((double)got[i], want[i], rtol, atol, what, i);
}

static double *dbuf(size_t n) {
  double *p = ts_calloc(n ? n : 1, sizeof *p);
  assert_non_null(p);
  return p;
}

/* --- contract ----------------------------------------------------------------------------- */

static void test_table_complete(void **state) {
  (void)state;
  assert_string_equal(K->name, "cpu");
  assert_string_equal(K->device_type, "CPU");
  assert_int_equal(K->device_index, 0);
  const void *fns[] = {
      (const void *)K->alloc,          (const void *)K->free_buf,
      (const void *)K->copy_to_device, (const void *)K->copy_to_host,
      (const void *)K->copy,           (const void *)K->synchronize,
      (const void *)K->gemm,           (const void *)K->bias_add,
      (const void *)K->bias_grad,      (const void *)K->axpy,
      (const void *)K->scale,          (const void *)K->fill,
      (const void *)K->relu_fwd,       (const void *)K->relu_bwd,
      (const void *)K->tanh_fwd,       (const void *)K->tanh_bwd,
      (const void *)K->softmax_xent,   (const void *)K->softmax_xent_grad,
      (const void *)K->argmax_correct, (const void *)K->host_alloc,
      (const void *)K->host_free,      (const void *)K->last_error,
      (const void *)K->bias_relu,      (const void *)K->relu_bwd_bias_grad,
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) assert_non_null(fns[i]);
  assert_ptr_equal(ts_kernels_cpu(), K);
  /* Host memory is device memory here: the worker pulls into the parameters directly. */
  assert_true(K->device_is_host);
  void *h = NULL;
  assert_int_equal(K->host_alloc(K, 1000, &h), 0);
  assert_int_equal((uintptr_t)h % 64, 0);
  memset(h, 1, 1000);
  K->host_free(K, h);
  K->host_free(K, NULL);
  assert_string_equal(K->last_error(K), "");
}

static void test_invalid_arguments(void **state) {
  (void)state;
  float buf[4] = {0};
  int32_t lab[2] = {0, 5};
  float loss = 0.0f;
  size_t correct = 0;
  assert_int_equal(K->alloc(K, 16, NULL), TS_EINVAL);
  assert_int_equal(K->fill(K, 4, 1.0f, NULL), TS_EINVAL);
  assert_int_equal(K->fill(K, 0, 1.0f, NULL), 0); /* nothing to touch */
  assert_int_equal(K->axpy(K, 4, 1.0f, NULL, buf), TS_EINVAL);
  assert_int_equal(K->copy(K, buf, NULL, 4), TS_EINVAL);
  assert_int_equal(K->relu_bwd(K, 4, buf, NULL, buf + 0), TS_EINVAL);
  /* gemm: a leading dimension below the stored row length, a size above INT_MAX */
  assert_int_equal(K->gemm(K, false, false, 2, 2, 2, 1.0f, buf, 1, buf, 2, 0.0f, buf, 2),
                   TS_EINVAL);
  assert_int_equal(K->gemm(K, true, false, 2, 2, 1, 1.0f, buf, 1, buf, 2, 0.0f, buf, 2),
                   TS_EINVAL); /* A^T stored 1 x 2 needs lda >= 2 */
  assert_int_equal(
      K->gemm(K, false, false, (size_t)1 << 31, 1, 1, 1.0f, buf, 1, buf, 1, 0.0f, buf, 1),
      TS_EINVAL);
  /* softmax: a label outside [0, cols), no rows */
  assert_int_equal(K->softmax_xent(K, 2, 2, buf, lab, buf, &loss), TS_EINVAL);
  lab[1] = -1;
  assert_int_equal(K->softmax_xent_grad(K, 2, 2, buf, lab, buf), TS_EINVAL);
  assert_int_equal(K->softmax_xent(K, 0, 2, buf, lab, buf, &loss), TS_EINVAL);
  /* argmax counts a bad label as wrong instead of failing */
  lab[0] = 0;
  lab[1] = 7;
  float z[4] = {1, 0, 1, 0};
  assert_int_equal(K->argmax_correct(K, 2, 2, z, lab, &correct), 0);
  assert_int_equal(correct, 1);
  assert_int_equal(K->argmax_correct(K, 2, 2, z, lab, NULL), TS_EINVAL);
}

static void test_alloc_copy(void **state) {
  (void)state;
  void *p = NULL, *q = NULL;
  assert_int_equal(K->alloc(K, 1000, &p), 0);
  assert_int_equal(K->alloc(K, 1000, &q), 0);
  assert_int_equal((uintptr_t)p % 64, 0);
  float host[250], back[250];
  for (int i = 0; i < 250; i++) host[i] = (float)i * 0.5f;
  assert_int_equal(K->copy_to_device(K, p, host, sizeof host), 0);
  assert_int_equal(K->copy(K, q, p, sizeof host), 0);
  assert_int_equal(K->copy_to_host(K, back, q, sizeof back), 0);
  assert_memory_equal(host, back, sizeof host);
  assert_int_equal(K->synchronize(K), 0);
  K->free_buf(K, p);
  K->free_buf(K, q);
  K->free_buf(K, NULL);
  /* allocation failures surface as TS_ENOMEM */
  ts_alloc_fail_after(1);
  p = (void *)1;
  assert_int_equal(K->alloc(K, 64, &p), TS_ENOMEM);
  assert_null(p);
  ts_alloc_fail_after(0);
}

/* --- kernels vs naive references ------------------------------------------------------------ */

/* C = alpha op(A) op(B) + beta C in double, with the same stored layouts as the kernel. */
static void gemm_ref(bool ta, bool tb, size_t m, size_t n, size_t kk, double alpha, const float *a,
                     size_t lda, const float *b, size_t ldb, double beta, const float *c_in,
                     double *c, size_t ldc) {
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double s = 0.0;
      for (size_t p = 0; p < kk; p++) {
        double av = ta ? (double)a[p * lda + i] : (double)a[i * lda + p];
        double bv = tb ? (double)b[j * ldb + p] : (double)b[p * ldb + j];
        s += av * bv;
      }
      c[i * ldc + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * (double)c_in[i * ldc + j]);
    }
}

static void test_gemm_vs_reference(void **state) {
  (void)state;
  for (int trial = 0; trial < 64; trial++) {
    bool ta = trial & 1, tb = (trial >> 1) & 1;
    size_t m = irand(1, 37), n = irand(1, 29), kk = irand(1, 45);
    size_t a_rows = ta ? kk : m, a_cols = ta ? m : kk;
    size_t b_rows = tb ? n : kk, b_cols = tb ? kk : n;
    size_t lda = a_cols + irand(0, 3), ldb = b_cols + irand(0, 3), ldc = n + irand(0, 3);
    float alpha = trial % 3 == 0 ? 1.0f : frand(-2.0f, 2.0f);
    float beta = trial % 4 == 0 ? 0.0f : frand(-1.0f, 1.0f);
    float *a = rand_buf(a_rows * lda, -1.0f, 1.0f);
    float *b = rand_buf(b_rows * ldb, -1.0f, 1.0f);
    float *c = rand_buf(m * ldc, -1.0f, 1.0f);
    double *want = dbuf(m * ldc);
    if (beta == 0.0f)
      for (size_t i = 0; i < m * ldc; i++) c[i] = NAN; /* beta == 0: C must not be read */
    gemm_ref(ta, tb, m, n, kk, (double)alpha, a, lda, b, ldb, (double)beta, c, want, ldc);
    float pad = c[n < ldc ? n : 0];
    assert_int_equal(K->gemm(K, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc), 0);
    for (size_t i = 0; i < m; i++)
      for (size_t j = 0; j < n; j++)
        assert_close_at((double)c[i * ldc + j], want[i * ldc + j], 1e-5, 1e-5 * (double)kk,
                        ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"),
                        i * ldc + j);
    if (n < ldc && beta != 0.0f) assert_true(c[n] == pad); /* padding untouched */
    ts_free(a);
    ts_free(b);
    ts_free(c);
    ts_free(want);
  }
}

static void test_elementwise_vs_reference(void **state) {
  (void)state;
  for (int trial = 0; trial < 16; trial++) {
    size_t rows = irand(1, 50), cols = irand(1, 70), n = rows * cols;
    float *x = rand_buf(n, -3.0f, 3.0f), *y = rand_buf(n, -1.0f, 1.0f);
    float *dy = rand_buf(n, -1.0f, 1.0f), *out = rand_buf(n, 0.0f, 1.0f);
    float *bias = rand_buf(cols, -1.0f, 1.0f);
    double *want = dbuf(n);

    /* bias_add */
    memcpy(out, y, n * sizeof *out);
    for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + (double)bias[i % cols];
    assert_int_equal(K->bias_add(K, rows, cols, bias, out), 0);
    assert_all_close(out, want, n, 1e-6, 1e-7, "bias_add");

    /* bias_grad: column sums */
    for (size_t j = 0; j < cols; j++) {
      want[j] = 0.0;
      for (size_t i = 0; i < rows; i++) want[j] += (double)dy[i * cols + j];
    }
    assert_int_equal(K->bias_grad(K, rows, cols, dy, out), 0);
    assert_all_close(out, want, cols, 1e-5, 1e-5, "bias_grad");

    /* axpy, scale, fill */
    float alpha = frand(-2.0f, 2.0f);
    memcpy(out, y, n * sizeof *out);
    for (size_t i = 0; i < n; i++) want[i] = (double)y[i] + (double)alpha * (double)x[i];
    assert_int_equal(K->axpy(K, n, alpha, x, out), 0);
    assert_all_close(out, want, n, 1e-6, 1e-6, "axpy");
    for (size_t i = 0; i < n; i++) want[i] = (double)out[i] * (double)alpha;
    assert_int_equal(K->scale(K, n, alpha, out), 0);
    assert_all_close(out, want, n, 1e-6, 1e-7, "scale");
    for (size_t i = 0; i < n; i++) want[i] = -0.25;
    assert_int_equal(K->fill(K, n, -0.25f, out), 0);
    assert_all_close(out, want, n, 0.0, 0.0, "fill");

    /* relu and tanh, forward and backward from the output */
    float *act = rand_buf(n, 0.0f, 1.0f);
    for (size_t i = 0; i < n; i++) want[i] = x[i] > 0.0f ? (double)x[i] : 0.0;
    assert_int_equal(K->relu_fwd(K, n, x, act), 0);
    assert_all_close(act, want, n, 0.0, 0.0, "relu_fwd");
    for (size_t i = 0; i < n; i++) want[i] = x[i] > 0.0f ? (double)dy[i] : 0.0;
    assert_int_equal(K->relu_bwd(K, n, act, dy, out), 0);
    assert_all_close(out, want, n, 0.0, 0.0, "relu_bwd");
    for (size_t i = 0; i < n; i++) want[i] = tanh((double)x[i]);
    assert_int_equal(K->tanh_fwd(K, n, x, act), 0);
    assert_all_close(act, want, n, 1e-6, 1e-7, "tanh_fwd");
    for (size_t i = 0; i < n; i++) {
      double t = tanh((double)x[i]);
      want[i] = (double)dy[i] * (1.0 - t * t);
    }
    assert_int_equal(K->tanh_bwd(K, n, act, dy, out), 0);
    assert_all_close(out, want, n, 1e-5, 1e-6, "tanh_bwd");

    ts_free(x);
    ts_free(y);
    ts_free(dy);
    ts_free(out);
    ts_free(bias);
    ts_free(act);
    ts_free(want);
  }
}

/* bias_relu and relu_bwd_bias_grad against a double reference, on narrow rows (a
 * convolution's channels: blocks of 16 rows, and a tail) and wide ones (row by row), at each
 * vector instruction set the CPU has. */
static void check_fused(size_t rows, size_t cols) {
  size_t n = rows * cols;
  float *y = rand_buf(n, -1.0f, 1.0f), *dy = rand_buf(n, -1.0f, 1.0f);
  float *bias = rand_buf(cols, -0.5f, 0.5f), *dx = rand_buf(n, 0.0f, 1.0f);
  float *db = rand_buf(cols, 0.0f, 1.0f);
  double *want = dbuf(n), *want_db = dbuf(cols);
  for (size_t i = 0; i < n; i++) want[i] = fmax((double)(y[i] + bias[i % cols]), 0.0);
  assert_int_equal(K->bias_relu(K, rows, cols, bias, y), 0);
  assert_all_close(y, want, n, 0.0, 0.0, "bias_relu");
  for (size_t i = 0; i < n; i++) {
    want[i] = y[i] > 0.0f ? (double)dy[i] : 0.0;
    want_db[i % cols] += want[i];
  }
  assert_int_equal(K->relu_bwd_bias_grad(K, rows, cols, y, dy, dx, db), 0);
  assert_all_close(dx, want, n, 0.0, 0.0, "relu_bwd_bias_grad dx");
  assert_all_close(db, want_db, cols, 1e-5, 1e-5, "relu_bwd_bias_grad db");
  ts_free(y), ts_free(dy), ts_free(bias), ts_free(dx), ts_free(db);
  ts_free(want), ts_free(want_db);
}

static void test_fused_vs_reference(void **state) {
  (void)state;
  static const size_t shapes[][2] = {{1, 1},   {15, 6},  {16, 6},   {100, 6}, {333, 16},
                                     {32, 64}, {37, 65}, {32, 120}, {5, 84},  {1, 300}};
  ts_cpu_isa_t best = ts_cpu_isa();
  for (int isa = TS_CPU_ISA_BASE; isa <= (int)best; isa++) {
    ts_cpu_isa_limit((ts_cpu_isa_t)isa);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      check_fused(shapes[i][0], shapes[i][1]);
  }
  ts_cpu_isa_limit(TS_CPU_ISA_AVX512);
  float b[2] = {0}, out[2] = {5, 5};
  assert_int_equal(K->bias_relu(K, 0, 3, NULL, NULL), 0);
  assert_int_equal(K->bias_relu(K, 2, 1, NULL, b), TS_EINVAL);
  assert_int_equal(K->relu_bwd_bias_grad(K, 0, 2, NULL, NULL, NULL, out), 0);
  assert_true(out[0] == 0.0f && out[1] == 0.0f); /* no rows: zero gradient */
  assert_int_equal(K->relu_bwd_bias_grad(K, 1, 2, b, NULL, out, out), TS_EINVAL);
  assert_int_equal(K->relu_bwd_bias_grad(K, 1, 2, b, b, out, NULL), TS_EINVAL);
}

static void softmax_ref(size_t rows, size_t cols, const float *z, const int32_t *lab, double *probs,
                        double *loss) {
  *loss = 0.0;
  for (size_t i = 0; i < rows; i++) {
    double mx = -(double)INFINITY, s = 0.0;
    for (size_t j = 0; j < cols; j++) mx = fmax(mx, (double)z[i * cols + j]);
    for (size_t j = 0; j < cols; j++) s += exp((double)z[i * cols + j] - mx);
    for (size_t j = 0; j < cols; j++) probs[i * cols + j] = exp((double)z[i * cols + j] - mx) / s;
    *loss += log(s) + mx - (double)z[i * cols + (size_t)lab[i]];
  }
  *loss /= (double)rows;
}

static void test_softmax_xent_vs_reference(void **state) {
  (void)state;
  for (int trial = 0; trial < 16; trial++) {
    size_t rows = irand(1, 64), cols = irand(1, 12), n = rows * cols;
    /* Some trials with huge logits: the kernel must subtract the row maximum. */
    float range = trial % 4 == 3 ? 500.0f : 5.0f;
    float *z = rand_buf(n, -range, range), *p = rand_buf(n, 0, 1), *g = rand_buf(n, 0, 1);
    int32_t *lab = ts_malloc(rows * sizeof *lab);
    assert_non_null(lab);
    for (size_t i = 0; i < rows; i++) lab[i] = (int32_t)irand(0, cols - 1);
    double *want = dbuf(n), want_loss = 0.0;
    softmax_ref(rows, cols, z, lab, want, &want_loss);
    float loss = NAN;
    assert_int_equal(K->softmax_xent(K, rows, cols, z, lab, p, &loss), 0);
    assert_true(isfinite(loss));
    assert_close_at((double)loss, want_loss, 1e-5, 1e-5, "softmax_xent loss", 0);
    assert_all_close(p, want, n, 1e-5, 1e-7, "softmax_xent probs");
    for (size_t i = 0; i < rows; i++) want[i * cols + (size_t)lab[i]] -= 1.0;
    for (size_t i = 0; i < n; i++) want[i] /= (double)rows;
    assert_int_equal(K->softmax_xent_grad(K, rows, cols, p, lab, g), 0);
    assert_all_close(g, want, n, 1e-5, 1e-7, "softmax_xent_grad");
    /* in place: dlogits may be probs */
    assert_int_equal(K->softmax_xent_grad(K, rows, cols, p, lab, p), 0);
    assert_memory_equal(p, g, n * sizeof *p);
    /* loss_host may be NULL */
    assert_int_equal(K->softmax_xent(K, rows, cols, z, lab, p, NULL), 0);

    /* argmax_correct against a reference (first maximum on ties) */
    size_t want_correct = 0, correct = 0;
    for (size_t i = 0; i < rows; i++) {
      size_t best = 0;
      for (size_t j = 1; j < cols; j++)
        if (z[i * cols + j] > z[i * cols + best]) best = j;
      if ((size_t)lab[i] == best) want_correct++;
    }
    assert_int_equal(K->argmax_correct(K, rows, cols, z, lab, &correct), 0);
    assert_int_equal(correct, want_correct);
    ts_free(z);
    ts_free(p);
    ts_free(g);
    ts_free(lab);
    ts_free(want);
  }
  /* ties: the first maximum wins */
  float tie[6] = {1, 3, 3, 2, 2, 0};
  int32_t tl[2] = {1, 0};
  size_t correct = 0;
  assert_int_equal(K->argmax_correct(K, 2, 3, tie, tl, &correct), 0);
  assert_int_equal(correct, 2);
}

/* --- finite-difference gradient checks per op ----------------------------------------------- *
 * Each op y = f(inputs) is turned into a scalar L = sum_i r_i y_i with fixed random weights
 * r; the backward kernel, given dy = r, must return dL/dinput, which we compare with central
 * differences (L(x + eps) - L(x - eps)) / 2 eps for every input element, L summed in double. */

#define FD_EPS 1e-2f
#define FD_RTOL 1e-2
#define FD_ATOL 1e-3

static double weighted_sum(const float *y, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)y[i] * (double)r[i];
  return s;
}

/* y = op(x) for the op under test */
typedef void (*fwd_fn)(void *ctx, float *y);

static void fd_check(const char *what, float *x, size_t nx, const float *analytic, fwd_fn fwd,
                     void *ctx, float *y, size_t ny, const float *r) {
  for (size_t i = 0; i < nx; i++) {
    float keep = x[i];
    x[i] = keep + FD_EPS;
    fwd(ctx, y);
    double up = weighted_sum(y, r, ny);
    x[i] = keep - FD_EPS;
    fwd(ctx, y);
    double down = weighted_sum(y, r, ny);
    x[i] = keep;
    double numeric = (up - down) / (2.0 * (double)FD_EPS);
    assert_close_at((double)analytic[i], numeric, FD_RTOL, FD_ATOL, what, i);
  }
}

typedef struct {
  size_t m, n, kk;
  bool ta, tb;
  float *a, *b;
  float *bias;
  size_t len;
  float *x;
} op_ctx_t;

static void fwd_gemm(void *vctx, float *y) {
  op_ctx_t *c = vctx;
  assert_int_equal(K->gemm(K, c->ta, c->tb, c->m, c->n, c->kk, 1.0f, c->a, c->ta ? c->m : c->kk,
                           c->b, c->tb ? c->kk : c->n, 0.0f, y, c->n),
                   0);
}

static void test_fd_matmul(void **state) {
  (void)state;
  for (int t = 0; t < 4; t++) {
    op_ctx_t c = {.m = 3 + (size_t)t, .n = 4, .kk = 5, .ta = t & 1, .tb = (t >> 1) & 1};
    size_t na = c.m * c.kk, nb = c.kk * c.n, ny = c.m * c.n;
    c.a = rand_buf(na, -1.0f, 1.0f);
    c.b = rand_buf(nb, -1.0f, 1.0f);
    float *r = rand_buf(ny, -1.0f, 1.0f), *y = rand_buf(ny, 0, 1);
    float *da = rand_buf(na, 0, 1), *db = rand_buf(nb, 0, 1);
    /* dL/dop(A) = R op(B)^T and dL/dop(B) = op(A)^T R; transposed stores give the
     * transposed products. */
    size_t lda = c.ta ? c.m : c.kk, ldb = c.tb ? c.kk : c.n;
    if (!c.ta) /* dA (m x kk) = R (m x n) op(B)^T */
      assert_int_equal(
          K->gemm(K, false, !c.tb, c.m, c.kk, c.n, 1.0f, r, c.n, c.b, ldb, 0.0f, da, lda), 0);
    else /* dA stored kk x m = op(B) R^T */
      assert_int_equal(
          K->gemm(K, c.tb, true, c.kk, c.m, c.n, 1.0f, c.b, ldb, r, c.n, 0.0f, da, lda), 0);
    if (!c.tb) /* dB (kk x n) = op(A)^T R */
      assert_int_equal(
          K->gemm(K, !c.ta, false, c.kk, c.n, c.m, 1.0f, c.a, lda, r, c.n, 0.0f, db, ldb), 0);
    else /* dB stored n x kk = R^T op(A) */
      assert_int_equal(
          K->gemm(K, true, c.ta, c.n, c.kk, c.m, 1.0f, r, c.n, c.a, lda, 0.0f, db, ldb), 0);
    fd_check("matmul dA", c.a, na, da, fwd_gemm, &c, y, ny, r);
    fd_check("matmul dB", c.b, nb, db, fwd_gemm, &c, y, ny, r);
    ts_free(c.a);
    ts_free(c.b);
    ts_free(r);
    ts_free(y);
    ts_free(da);
    ts_free(db);
  }
}

static void fwd_bias(void *vctx, float *y) {
  op_ctx_t *c = vctx;
  memcpy(y, c->x, c->m * c->n * sizeof *y);
  assert_int_equal(K->bias_add(K, c->m, c->n, c->bias, y), 0);
}

static void test_fd_bias_add(void **state) {
  (void)state;
  op_ctx_t c = {.m = 6, .n = 5};
  size_t ny = c.m * c.n;
  c.x = rand_buf(ny, -1.0f, 1.0f);
  c.bias = rand_buf(c.n, -1.0f, 1.0f);
  float *r = rand_buf(ny, -1.0f, 1.0f), *y = rand_buf(ny, 0, 1), *db = rand_buf(c.n, 0, 1);
  assert_int_equal(K->bias_grad(K, c.m, c.n, r, db), 0);
  fd_check("bias_add db", c.bias, c.n, db, fwd_bias, &c, y, ny, r);
  /* and the input passes the gradient through unchanged */
  fd_check("bias_add dx", c.x, ny, r, fwd_bias, &c, y, ny, r);
  ts_free(c.x);
  ts_free(c.bias);
  ts_free(r);
  ts_free(y);
  ts_free(db);
}

static void fwd_relu(void *vctx, float *y) {
  op_ctx_t *c = vctx;
  assert_int_equal(K->relu_fwd(K, c->len, c->x, y), 0);
}

static void fwd_tanh(void *vctx, float *y) {
  op_ctx_t *c = vctx;
  assert_int_equal(K->tanh_fwd(K, c->len, c->x, y), 0);
}

static void test_fd_activations(void **state) {
  (void)state;
  op_ctx_t c = {.len = 40};
  c.x = rand_buf(c.len, -2.0f, 2.0f);
  /* keep inputs away from relu's kink, further than the finite-difference step */
  for (size_t i = 0; i < c.len; i++)
    if (fabsf(c.x[i]) < 4.0f * FD_EPS) c.x[i] = c.x[i] < 0.0f ? -0.5f : 0.5f;
  float *r = rand_buf(c.len, -1.0f, 1.0f), *y = rand_buf(c.len, 0, 1);
  float *dx = rand_buf(c.len, 0, 1);
  fwd_relu(&c, y);
  assert_int_equal(K->relu_bwd(K, c.len, y, r, dx), 0);
  fd_check("relu dx", c.x, c.len, dx, fwd_relu, &c, y, c.len, r);
  fwd_tanh(&c, y);
  assert_int_equal(K->tanh_bwd(K, c.len, y, r, dx), 0);
  fd_check("tanh dx", c.x, c.len, dx, fwd_tanh, &c, y, c.len, r);
  ts_free(c.x);
  ts_free(r);
  ts_free(y);
  ts_free(dx);
}

typedef struct {
  size_t rows, cols;
  float *z, *p;
  int32_t *lab;
} xent_ctx_t;

/* The op's output is the scalar loss: y has one element and r = {1}. */
static void fwd_xent(void *vctx, float *y) {
  xent_ctx_t *c = vctx;
  assert_int_equal(K->softmax_xent(K, c->rows, c->cols, c->z, c->lab, c->p, y), 0);
}

static void test_fd_softmax_xent(void **state) {
  (void)state;
  xent_ctx_t c = {.rows = 5, .cols = 4};
  size_t n = c.rows * c.cols;
  c.z = rand_buf(n, -2.0f, 2.0f);
  c.p = rand_buf(n, 0, 1);
  c.lab = ts_malloc(c.rows * sizeof *c.lab);
  assert_non_null(c.lab);
  for (size_t i = 0; i < c.rows; i++) c.lab[i] = (int32_t)(i % c.cols);
  float loss = 0.0f, one = 1.0f;
  float *g = rand_buf(n, 0, 1);
  fwd_xent(&c, &loss);
  assert_int_equal(K->softmax_xent_grad(K, c.rows, c.cols, c.p, c.lab, g), 0);
  fd_check("softmax_xent dlogits", c.z, n, g, fwd_xent, &c, &loss, 1, &one);
  ts_free(c.z);
  ts_free(c.p);
  ts_free(c.lab);
  ts_free(g);
}

static int setup(void **state) {
  (void)state;
  K = ts_kernels_cpu();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_complete),
      cmocka_unit_test(test_invalid_arguments),
      cmocka_unit_test(test_alloc_copy),
      cmocka_unit_test(test_gemm_vs_reference),
      cmocka_unit_test(test_elementwise_vs_reference),
      cmocka_unit_test(test_softmax_xent_vs_reference),
      cmocka_unit_test(test_fused_vs_reference),
      cmocka_unit_test(test_fd_matmul),
      cmocka_unit_test(test_fd_bias_add),
      cmocka_unit_test(test_fd_activations),
      cmocka_unit_test(test_fd_softmax_xent),
  };
  return cmocka_run_group_tests_name("kernels_cpu", tests, setup, NULL);
}
