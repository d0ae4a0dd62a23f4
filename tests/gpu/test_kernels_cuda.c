/*
 * The CUDA back end against the CPU reference (docs/dev/ARCHITECTURE.md), through ts_kernels.h
 * only: C, no CUDA header. Every kernel runs on fresh random inputs of several shapes (the seed is
 * printed; TS_SEED=N repeats a run), with its outputs poisoned with NaN before each run on
 * both back ends, and must agree with the CPU within a relative error of 1e-5: elementwise
 * for elementwise kernels, in the L2 norm for products and sums (whose order differs), exactly
 * for argmax counts. Convolution (forward, backward-data, backward-filter) and max pooling
 * (forward, backward) with cuDNN within 1e-4 in the L2 norm (the pooling maxima exactly), on
 * strides 1 and 2, both paddings, odd total padding, overlapping 3x3/2 windows, batches > 1;
 * mul elementwise. Then the argument contract, the label check, the towers' gradient
 * average on the GPU (two towers of one GPU, and a GPU tower with a CPU tower through pinned
 * memory) against one CPU model, and memory and error reporting.
 *
 * Exit status: 0 all passed, 1 a failure, 77 no GPU (meson counts it as skipped).
 * `--bench` then prints a table of kernel times, GPU against CPU.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_kernels.h"
#include "ts_kernels_cuda.h"
#include "ts_model.h"
#include "ts_towers.h"

#define TOL 1e-5
/* Convolution and pooling gradients (cuDNN, TF32 off): sums of hundreds of products in
 * another order than the CPU's im2col and sgemm. */
#define CONV_TOL 1e-4

static const ts_kernels_t *CPU;
static ts_kernels_t *GPU;
static int failures, checks;

/* --- random numbers ------------------------------------------------------------------------ */

static uint64_t rng_state;

static double urand(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}

static float frand(float lo, float hi) {
  return lo + (hi - lo) * (float)urand();
}

static float *host_random(size_t n, float lo, float hi) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = frand(lo, hi);
  return p;
}

/* --- device buffers: one on each back end, with the same content ---------------------------- */

typedef struct {
  size_t n; /* floats (or int32s) */
  void *cpu, *gpu;
} pair_t;

static void die(const char *what, int rc) {
  fprintf(stderr, "FATAL: %s: %s (%s)\n", what, ts_strerror(rc), GPU ? GPU->last_error(GPU) : "");
  exit(1);
}

static pair_t pair_new(size_t n, const void *host) {
  pair_t p = {.n = n};
  int rc = CPU->alloc(CPU, n * 4, &p.cpu);
  if (rc == 0) rc = GPU->alloc(GPU, n * 4, &p.gpu);
  if (rc < 0) die("alloc", rc);
  if (host && n) {
    memcpy(p.cpu, host, n * 4);
    rc = GPU->copy_to_device(GPU, p.gpu, host, n * 4);
    if (rc < 0) die("copy_to_device", rc);
  }
  return p;
}

/* Outputs are poisoned before each run: a kernel that skips an element leaves a NaN. */
static void pair_poison(pair_t *p) {
  float *nan = malloc((p->n ? p->n : 1) * sizeof *nan);
  for (size_t i = 0; i < p->n; i++) nan[i] = NAN;
  memcpy(p->cpu, nan, p->n * 4);
  int rc = GPU->copy_to_device(GPU, p->gpu, nan, p->n * 4);
  if (rc == 0) rc = GPU->synchronize(GPU);
  if (rc < 0) die("poison", rc);
  free(nan);
}

static float *pair_fetch(const pair_t *p) {
  float *h = malloc((p->n ? p->n : 1) * sizeof *h);
  int rc = GPU->copy_to_host(GPU, h, p->gpu, p->n * 4);
  if (rc < 0) die("copy_to_host", rc);
  return h;
}

static void pair_free(pair_t *p) {
  CPU->free_buf(CPU, p->cpu);
  GPU->free_buf(GPU, p->gpu);
}

/* --- comparisons --------------------------------------------------------------------------- */

static void report(const char *name, const char *shape, double err, bool ok) {
  checks++;
  if (!ok) failures++;
  printf("%-4s %-18s %-28s rel err %.2e\n", ok ? "ok" : "FAIL", name, shape, err);
}

/* Elementwise: max |g - c| / max(|c|, 1e-6); a NaN anywhere fails. */
static void compare_elementwise(const char *name, const char *shape, const pair_t *p) {
  float *g = pair_fetch(p);
  const float *c = p->cpu;
  double worst = 0;
  bool ok = true;
  for (size_t i = 0; i < p->n; i++) {
    if (isnan(g[i]) || isnan(c[i])) {
      ok = false;
      worst = (double)INFINITY;
      break;
    }
    double d = fabs((double)g[i] - (double)c[i]) / fmax(fabs((double)c[i]), 1e-6);
    if (d > worst) worst = d;
  }
  report(name, shape, worst, ok && worst < TOL);
  free(g);
}

/* Norm-relative: ||g - c||_2 / ||c||_2 over rows x cols with row stride ld, below tol. */
static void compare_norm_tol(const char *name, const char *shape, const pair_t *p, size_t rows,
                             size_t cols, size_t ld, double tol) {
  float *g = pair_fetch(p);
  const float *c = p->cpu;
  double diff = 0, norm = 0;
  bool ok = true;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      double a = g[i * ld + j], b = c[i * ld + j];
      if (isnan(a) || isnan(b)) ok = false;
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  /* Padding between rows must be untouched: still the poison or the input. */
  for (size_t i = 0; i < rows && ld > cols; i++)
    for (size_t j = cols; j < ld; j++) {
      float a = g[i * ld + j], b = c[i * ld + j];
      if (!(isnan(a) && isnan(b)) && a != b) ok = false;
    }
  double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
  report(name, shape, ok ? rel : (double)INFINITY, ok && rel < tol);
  free(g);
}

static void compare_norm(const char *name, const char *shape, const pair_t *p, size_t rows,
                         size_t cols, size_t ld) {
  compare_norm_tol(name, shape, p, rows, cols, ld, TOL);
}

static void check_rc(const char *what, int rc_cpu, int rc_gpu) {
  if (rc_cpu != 0 || rc_gpu != 0) {
    printf("FAIL %s: cpu %d (%s), gpu %d (%s: %s)\n", what, rc_cpu, ts_strerror(rc_cpu), rc_gpu,
           ts_strerror(rc_gpu), GPU->last_error(GPU));
    failures++;
  }
}

/* --- kernels ------------------------------------------------------------------------------- */

static void test_gemm(void) {
  static const size_t shapes[][3] = {{1, 1, 1},       {7, 13, 5},    {64, 128, 784},
                                     {1000, 10, 128}, {33, 65, 257}, {256, 512, 1024},
                                     {5, 3, 0}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t m = shapes[s][0], n = shapes[s][1], kk = shapes[s][2];
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int variant = 0; variant < 2; variant++) { /* dense beta 0 / padded beta 0.5 */
          size_t pad = variant ? 3 : 0;
          size_t a_rows = ta ? kk : m, a_cols = ta ? m : kk;
          size_t b_rows = tb ? n : kk, b_cols = tb ? kk : n;
          size_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
          float beta = variant ? 0.5f : 0.0f, alpha = variant ? -1.25f : 1.0f;
          float *ha = host_random(a_rows * lda, -1, 1), *hb = host_random(b_rows * ldb, -1, 1);
          float *hc = host_random(m * ldc, -1, 1);
          pair_t a = pair_new(a_rows * lda, ha), b = pair_new(b_rows * ldb, hb);
          pair_t c = pair_new(m * ldc, hc);
          if (beta == 0.0f) pair_poison(&c); /* beta 0: C is not read */
          int r1 =
              CPU->gemm(CPU, ta, tb, m, n, kk, alpha, a.cpu, lda, b.cpu, ldb, beta, c.cpu, ldc);
          int r2 =
              GPU->gemm(GPU, ta, tb, m, n, kk, alpha, a.gpu, lda, b.gpu, ldb, beta, c.gpu, ldc);
          check_rc("gemm", r1, r2);
          char shape[64];
          snprintf(shape, sizeof shape, "%zux%zux%zu %c%c%s", m, n, kk, ta ? 'T' : 'N',
                   tb ? 'T' : 'N', variant ? " ld+3 b.5" : "");
          compare_norm("gemm", shape, &c, m, n, ldc);
          pair_free(&a);
          pair_free(&b);
          pair_free(&c);
          free(ha);
          free(hb);
          free(hc);
        }
  }
}

static void test_bias(void) {
  static const size_t shapes[][2] = {{1, 1}, {64, 128}, {1000, 10}, {3, 1025}, {4096, 33}, {0, 7}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t rows = shapes[s][0], cols = shapes[s][1];
    char shape[48];
    snprintf(shape, sizeof shape, "%zux%zu", rows, cols);
    float *hy = host_random(rows * cols, -2, 2), *hb = host_random(cols, -1, 1);
    pair_t y = pair_new(rows * cols, hy), bias = pair_new(cols, hb);
    check_rc("bias_add", CPU->bias_add(CPU, rows, cols, bias.cpu, y.cpu),
             GPU->bias_add(GPU, rows, cols, bias.gpu, y.gpu));
    compare_elementwise("bias_add", shape, &y);
    pair_t db = pair_new(cols, NULL);
    pair_poison(&db);
    check_rc("bias_grad", CPU->bias_grad(CPU, rows, cols, y.cpu, db.cpu),
             GPU->bias_grad(GPU, rows, cols, y.gpu, db.gpu));
    compare_norm("bias_grad", shape, &db, 1, cols, cols);
    pair_free(&y);
    pair_free(&bias);
    pair_free(&db);
    free(hy);
    free(hb);
  }
}

static void test_elementwise(void) {
  static const size_t sizes[] = {1, 1000, (1u << 20) + 3};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    char shape[48];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *hx = host_random(n, -3, 3), *hdy = host_random(n, -1, 1), *hy0 = host_random(n, -1, 1);
    pair_t x = pair_new(n, hx), dy = pair_new(n, hdy), y = pair_new(n, NULL),
           dx = pair_new(n, NULL);
    pair_poison(&y);
    check_rc("relu_fwd", CPU->relu_fwd(CPU, n, x.cpu, y.cpu), GPU->relu_fwd(GPU, n, x.gpu, y.gpu));
    compare_elementwise("relu_fwd", shape, &y);
    pair_poison(&dx);
    check_rc("relu_bwd", CPU->relu_bwd(CPU, n, y.cpu, dy.cpu, dx.cpu),
             GPU->relu_bwd(GPU, n, y.gpu, dy.gpu, dx.gpu));
    compare_elementwise("relu_bwd", shape, &dx);
    pair_poison(&y);
    check_rc("tanh_fwd", CPU->tanh_fwd(CPU, n, x.cpu, y.cpu), GPU->tanh_fwd(GPU, n, x.gpu, y.gpu));
    compare_elementwise("tanh_fwd", shape, &y);
    pair_poison(&dx);
    /* The same y on both sides: 1 - y^2 near |y| = 1 would magnify tanh_fwd's last-bit
     * differences past the tolerance (1.2e-5 seen on an H200). */
    pair_t ty = pair_new(n, y.cpu);
    check_rc("tanh_bwd", CPU->tanh_bwd(CPU, n, ty.cpu, dy.cpu, dx.cpu),
             GPU->tanh_bwd(GPU, n, ty.gpu, dy.gpu, dx.gpu));
    compare_elementwise("tanh_bwd", shape, &dx);
    pair_free(&ty);
    pair_t yy = pair_new(n, hy0);
    check_rc("axpy", CPU->axpy(CPU, n, 0.75f, x.cpu, yy.cpu),
             GPU->axpy(GPU, n, 0.75f, x.gpu, yy.gpu));
    compare_elementwise("axpy", shape, &yy);
    check_rc("scale", CPU->scale(CPU, n, -0.3f, yy.cpu), GPU->scale(GPU, n, -0.3f, yy.gpu));
    compare_elementwise("scale", shape, &yy);
    pair_poison(&yy);
    check_rc("fill", CPU->fill(CPU, n, 2.5f, yy.cpu), GPU->fill(GPU, n, 2.5f, yy.gpu));
    compare_elementwise("fill", shape, &yy);
    pair_poison(&dx);
    check_rc("copy", CPU->copy(CPU, dx.cpu, x.cpu, n * 4), GPU->copy(GPU, dx.gpu, x.gpu, n * 4));
    compare_elementwise("copy", shape, &dx);
    pair_free(&x);
    pair_free(&dy);
    pair_free(&y);
    pair_free(&dx);
    pair_free(&yy);
    free(hx);
    free(hdy);
    free(hy0);
  }
}

static void test_softmax(void) {
  static const size_t shapes[][2] = {{1, 2},     {64, 10},   {1000, 10},
                                     {17, 1000}, {5, 40000}, {300, 33}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t rows = shapes[s][0], cols = shapes[s][1];
    char shape[48];
    snprintf(shape, sizeof shape, "%zux%zu", rows, cols);
    float *hz = host_random(rows * cols, -8, 8);
    int32_t *hl = malloc(rows * sizeof *hl);
    for (size_t i = 0; i < rows; i++) hl[i] = (int32_t)(urand() * (double)cols);
    pair_t z = pair_new(rows * cols, hz), lab = pair_new(rows, hl), p = pair_new(rows * cols, NULL);
    pair_poison(&p);
    float lc = NAN, lg = NAN;
    check_rc("softmax_xent", CPU->softmax_xent(CPU, rows, cols, z.cpu, lab.cpu, p.cpu, &lc),
             GPU->softmax_xent(GPU, rows, cols, z.gpu, lab.gpu, p.gpu, &lg));
    compare_elementwise("softmax_xent probs", shape, &p);
    double lerr = fabs((double)lg - (double)lc) / fmax(fabs((double)lc), 1e-6);
    report("softmax_xent loss", shape, lerr, !isnan(lg) && lerr < TOL);
    /* Probs only (no loss), then the gradient in place and out of place. */
    pair_poison(&p);
    check_rc("softmax_xent", CPU->softmax_xent(CPU, rows, cols, z.cpu, lab.cpu, p.cpu, NULL),
             GPU->softmax_xent(GPU, rows, cols, z.gpu, lab.gpu, p.gpu, NULL));
    compare_elementwise("softmax_xent noloss", shape, &p);
    pair_t d = pair_new(rows * cols, NULL);
    pair_poison(&d);
    check_rc("softmax_xent_grad", CPU->softmax_xent_grad(CPU, rows, cols, p.cpu, lab.cpu, d.cpu),
             GPU->softmax_xent_grad(GPU, rows, cols, p.gpu, lab.gpu, d.gpu));
    compare_norm("softmax_xent_grad", shape, &d, rows, cols, cols);
    check_rc("softmax_xent_grad", CPU->softmax_xent_grad(CPU, rows, cols, p.cpu, lab.cpu, p.cpu),
             GPU->softmax_xent_grad(GPU, rows, cols, p.gpu, lab.gpu, p.gpu));
    compare_norm("xent_grad in place", shape, &p, rows, cols, cols);
    size_t cc = 99, cg = 98;
    check_rc("argmax_correct", CPU->argmax_correct(CPU, rows, cols, z.cpu, lab.cpu, &cc),
             GPU->argmax_correct(GPU, rows, cols, z.gpu, lab.gpu, &cg));
    report("argmax_correct", shape, cc == cg ? 0.0 : 1.0, cc == cg);
    /* Labels that are mostly right, so the count is not trivially 0. */
    for (size_t i = 0; i < rows; i++) {
      size_t best = 0;
      for (size_t j = 1; j < cols; j++)
        if (hz[i * cols + j] > hz[i * cols + best]) best = j;
      hl[i] = (i % 3) ? (int32_t)best : (int32_t)((best + 1) % cols);
    }
    pair_t lab2 = pair_new(rows, hl);
    check_rc("argmax_correct", CPU->argmax_correct(CPU, rows, cols, z.cpu, lab2.cpu, &cc),
             GPU->argmax_correct(GPU, rows, cols, z.gpu, lab2.gpu, &cg));
    char s2[64];
    snprintf(s2, sizeof s2, "%s (%zu right)", shape, cc);
    report("argmax_correct", s2, cc == cg ? 0.0 : 1.0, cc == cg);
    pair_free(&z);
    pair_free(&lab);
    pair_free(&lab2);
    pair_free(&p);
    pair_free(&d);
    free(hz);
    free(hl);
  }
}

/* --- the contract on the GPU --------------------------------------------------------------- */

/* --- convolution, pooling and mul (cuDNN where the build has it) --------------------------- */

static void test_mul(void) {
  static const size_t sizes[] = {1, 1000, 65537, 3000000};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t n = sizes[s];
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    float *ha = host_random(n, -2, 2), *hb = host_random(n, -2, 2);
    pair_t a = pair_new(n, ha), b = pair_new(n, hb), y = pair_new(n, NULL);
    pair_poison(&y);
    check_rc("mul", CPU->mul(CPU, n, a.cpu, b.cpu, y.cpu), GPU->mul(GPU, n, a.gpu, b.gpu, y.gpu));
    compare_elementwise("mul", shape, &y);
    /* In place: y = a. */
    check_rc("mul", CPU->mul(CPU, n, a.cpu, b.cpu, a.cpu), GPU->mul(GPU, n, a.gpu, b.gpu, a.gpu));
    compare_elementwise("mul (in place)", shape, &a);
    pair_free(&a);
    pair_free(&b);
    pair_free(&y);
    free(ha);
    free(hb);
  }
}

typedef struct {
  size_t n, h, w, c, kh, kw, sh, sw;
  ts_padding_t pad;
  size_t out_c; /* filters; 0 for pooling */
} window_case_t;

static void window_shape(const window_case_t *t, char *buf, size_t len) {
  snprintf(buf, len, "%zux%zux%zux%zu %zux%zu/%zu%zu %s%s%zu", t->n, t->h, t->w, t->c, t->kh, t->kw,
           t->sh, t->sw, t->pad == TS_PAD_SAME ? "same" : "valid", t->out_c ? "->" : "", t->out_c);
}

/* Every case against the CPU: stride 1 and 2, both paddings, odd total padding (TensorFlow's
 * extra row or column after, which cuDNN cannot pad), channel counts 1 to 32, batches > 1. */
static void test_conv(void) {
  if (!GPU->conv2d_fwd) {
    printf("FAIL conv2d: this build has no cuDNN (configure with -Dcudnn=enabled)\n");
    failures++;
    return;
  }
  static const window_case_t cases[] = {
      {2, 7, 7, 3, 3, 3, 1, 1, TS_PAD_SAME, 4},     /* total padding 2 (symmetric) */
      {2, 6, 6, 2, 4, 4, 1, 1, TS_PAD_SAME, 3},     /* total 3: odd, stride 1 */
      {3, 9, 8, 5, 3, 3, 2, 2, TS_PAD_SAME, 6},     /* H total 2, W total 1 (odd), stride 2 */
      {2, 10, 11, 4, 5, 5, 2, 2, TS_PAD_SAME, 8},   /* H total 3 (odd), W total 4 */
      {8, 14, 14, 16, 3, 3, 2, 2, TS_PAD_SAME, 32}, /* total 1 on both sides */
      {1, 4, 4, 2, 2, 2, 2, 2, TS_PAD_SAME, 2},     /* no padding needed */
      {5, 28, 28, 1, 5, 5, 1, 1, TS_PAD_SAME, 6},   /* LeNet's first layer */
      {4, 9, 9, 3, 3, 3, 2, 2, TS_PAD_VALID, 5},
      {2, 8, 7, 6, 5, 3, 1, 2, TS_PAD_VALID, 7},    /* unequal windows and strides */
      {3, 10, 10, 12, 3, 3, 2, 2, TS_PAD_VALID, 1}, /* one row left over */
      {2, 5, 5, 8, 1, 1, 1, 1, TS_PAD_VALID, 3},    /* pointwise */
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const window_case_t *c = &cases[t];
    ts_conv2d_t g;
    if (ts_conv_geometry(&g, c->n, c->h, c->w, c->c, c->kh, c->kw, c->sh, c->sw, c->pad, c->out_c) <
        0)
      die("ts_conv_geometry", TS_EINVAL);
    char shape[64];
    window_shape(c, shape, sizeof shape);
    size_t nx = g.batch * g.in_h * g.in_w * g.in_c, ny = g.batch * g.out_h * g.out_w * g.out_c;
    size_t nw = g.win_h * g.win_w * g.in_c * g.out_c;
    size_t ws_cpu = CPU->conv2d_workspace(CPU, &g), ws_gpu = GPU->conv2d_workspace(GPU, &g);
    if (ws_gpu == 0) {
      printf("FAIL conv2d_workspace %s: 0 (%s)\n", shape, GPU->last_error(GPU));
      failures++;
      continue;
    }
    void *wsc = NULL, *wsg = NULL;
    int rc = CPU->alloc(CPU, ws_cpu, &wsc);
    if (rc == 0) rc = GPU->alloc(GPU, ws_gpu, &wsg);
    if (rc < 0) die("alloc workspace", rc);
    float *hx = host_random(nx, -1, 1), *hw = host_random(nw, -0.5f, 0.5f);
    float *hdy = host_random(ny, -1, 1);
    pair_t x = pair_new(nx, hx), w = pair_new(nw, hw), dy = pair_new(ny, hdy);
    pair_t y = pair_new(ny, NULL), dx = pair_new(nx, NULL), dw = pair_new(nw, NULL);
    pair_poison(&y);
    check_rc("conv2d_fwd", CPU->conv2d_fwd(CPU, &g, x.cpu, w.cpu, y.cpu, wsc, ws_cpu),
             GPU->conv2d_fwd(GPU, &g, x.gpu, w.gpu, y.gpu, wsg, ws_gpu));
    compare_norm_tol("conv2d_fwd", shape, &y, 1, ny, ny, CONV_TOL);
    pair_poison(&dx);
    check_rc("conv2d_bwd_data", CPU->conv2d_bwd_data(CPU, &g, w.cpu, dy.cpu, dx.cpu, wsc, ws_cpu),
             GPU->conv2d_bwd_data(GPU, &g, w.gpu, dy.gpu, dx.gpu, wsg, ws_gpu));
    compare_norm_tol("conv2d_bwd_data", shape, &dx, 1, nx, nx, CONV_TOL);
    pair_poison(&dw);
    check_rc("conv2d_bwd_filter",
             CPU->conv2d_bwd_filter(CPU, &g, x.cpu, dy.cpu, dw.cpu, wsc, ws_cpu),
             GPU->conv2d_bwd_filter(GPU, &g, x.gpu, dy.gpu, dw.gpu, wsg, ws_gpu));
    compare_norm_tol("conv2d_bwd_filter", shape, &dw, 1, nw, nw, CONV_TOL);
    /* A workspace below what conv2d_workspace asked is refused, not overrun. */
    if (ws_gpu > 0) {
      checks++;
      int r = GPU->conv2d_fwd(GPU, &g, x.gpu, w.gpu, y.gpu, wsg, ws_gpu - 1);
      if (r != TS_EINVAL) {
        failures++;
        printf("FAIL conv2d_fwd %s with a workspace 1 byte short: %s\n", shape, ts_err_name(r));
      }
    }
    pair_free(&x);
    pair_free(&w);
    pair_free(&dy);
    pair_free(&y);
    pair_free(&dx);
    pair_free(&dw);
    CPU->free_buf(CPU, wsc);
    GPU->free_buf(GPU, wsg);
    free(hx);
    free(hw);
    free(hdy);
  }
}

/* Max pooling: inputs of both signs (a padded position must never win, as on the CPU, which
 * skips padding), overlapping 3x3/2 windows (their gradients add up), odd total padding. The
 * forward maxima are exact; the gradient sums agree to rounding. */
static void test_maxpool(void) {
  if (!GPU->maxpool_fwd) {
    printf("FAIL maxpool: this build has no cuDNN (configure with -Dcudnn=enabled)\n");
    failures++;
    return;
  }
  static const window_case_t cases[] = {
      {2, 8, 8, 3, 2, 2, 2, 2, TS_PAD_VALID, 0},  /* 2x2/2, no overlap */
      {2, 9, 7, 2, 3, 3, 2, 2, TS_PAD_VALID, 0},  /* overlapping 3x3/2 */
      {2, 10, 9, 3, 3, 3, 2, 2, TS_PAD_VALID, 0}, /* the last row is in no window: dx 0 */
      {3, 9, 9, 4, 3, 3, 2, 2, TS_PAD_SAME, 0},   /* total 2 */
      {2, 10, 10, 5, 3, 3, 2, 2, TS_PAD_SAME, 0}, /* total 1: the extra row after */
      {2, 7, 7, 3, 2, 2, 2, 2, TS_PAD_SAME, 0},   /* total 1 */
      {4, 28, 28, 6, 3, 3, 1, 1, TS_PAD_SAME, 0}, /* stride 1: every input in 9 windows */
      {2, 11, 6, 16, 3, 2, 2, 1, TS_PAD_SAME, 0}, /* unequal windows and strides */
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    const window_case_t *c = &cases[t];
    ts_conv2d_t g;
    if (ts_conv_geometry(&g, c->n, c->h, c->w, c->c, c->kh, c->kw, c->sh, c->sw, c->pad, 0) < 0)
      die("ts_conv_geometry", TS_EINVAL);
    char shape[64];
    window_shape(c, shape, sizeof shape);
    size_t nx = g.batch * g.in_h * g.in_w * g.in_c, ny = g.batch * g.out_h * g.out_w * g.out_c;
    float *hx = host_random(nx, -1, 1), *hdy = host_random(ny, -1, 1);
    pair_t x = pair_new(nx, hx), dy = pair_new(ny, hdy), y = pair_new(ny, NULL);
    pair_t am = pair_new(ny, NULL), dx = pair_new(nx, NULL);
    pair_poison(&y);
    check_rc("maxpool_fwd", CPU->maxpool_fwd(CPU, &g, x.cpu, y.cpu, am.cpu),
             GPU->maxpool_fwd(GPU, &g, x.gpu, y.gpu, am.gpu));
    compare_elementwise("maxpool_fwd", shape, &y);
    pair_poison(&dx);
    check_rc("maxpool_bwd", CPU->maxpool_bwd(CPU, &g, x.cpu, y.cpu, dy.cpu, am.cpu, dx.cpu),
             GPU->maxpool_bwd(GPU, &g, x.gpu, y.gpu, dy.gpu, am.gpu, dx.gpu));
    compare_norm_tol("maxpool_bwd", shape, &dx, 1, nx, nx, CONV_TOL);
    pair_free(&x);
    pair_free(&dy);
    pair_free(&y);
    pair_free(&am);
    pair_free(&dx);
    free(hx);
    free(hdy);
  }
}

static void expect(const char *what, int got, int want) {
  checks++;
  bool ok = got == want;
  if (!ok) failures++;
  printf("%-4s contract: %-50s %s\n", ok ? "ok" : "FAIL", what, ts_err_name(got));
}

static void test_contract(void) {
  void *buf = NULL;
  expect("alloc 1 MiB", GPU->alloc(GPU, 1 << 20, &buf), 0);
  float *f = buf;
  expect("fill NULL with n > 0", GPU->fill(GPU, 4, 0.0f, NULL), TS_EINVAL);
  expect("fill n = 0", GPU->fill(GPU, 0, 0.0f, NULL), 0);
  expect("gemm lda < cols", GPU->gemm(GPU, false, false, 2, 2, 3, 1, f, 2, f, 2, 0, f, 2),
         TS_EINVAL);
  expect("gemm m = 0", GPU->gemm(GPU, false, false, 0, 2, 3, 1, f, 3, f, 2, 0, f, 2), 0);
  expect("softmax rows = 0", GPU->softmax_xent(GPU, 0, 3, f, (int32_t *)f, f, NULL), TS_EINVAL);
  expect("argmax cols = 0", GPU->argmax_correct(GPU, 1, 0, f, (int32_t *)f, &(size_t){0}),
         TS_EINVAL);
  /* A label out of range, found on the device. */
  int32_t bad[2] = {1, 7};
  float z[6] = {0, 1, 2, 3, 4, 5}, loss = 0;
  void *dz = NULL, *dl = NULL, *dp = NULL;
  GPU->alloc(GPU, sizeof z, &dz);
  GPU->alloc(GPU, sizeof bad, &dl);
  GPU->alloc(GPU, sizeof z, &dp);
  GPU->copy_to_device(GPU, dz, z, sizeof z);
  GPU->copy_to_device(GPU, dl, bad, sizeof bad);
  expect("softmax_xent label 7 of 3 classes", GPU->softmax_xent(GPU, 2, 3, dz, dl, dp, &loss),
         TS_EINVAL);
  printf("     (last_error: %s)\n", GPU->last_error(GPU));
  expect("then a clean call", GPU->synchronize(GPU), 0);
  expect("softmax_xent_grad label 7, at synchronize",
         GPU->softmax_xent_grad(GPU, 2, 3, dp, dl, dp) == 0 ? GPU->synchronize(GPU) : -1,
         TS_EINVAL);
  GPU->free_buf(GPU, dz);
  GPU->free_buf(GPU, dl);
  GPU->free_buf(GPU, dp);
  GPU->free_buf(GPU, buf);
  GPU->free_buf(GPU, NULL);
  void *h = NULL;
  expect("host_alloc (pinned) 64 MiB", GPU->host_alloc(GPU, 64u << 20, &h), 0);
  memset(h, 0, 64u << 20);
  GPU->host_free(GPU, h);
  expect("create /gpu:999",
         ts_kernels_cuda_create(999, NULL, &(ts_kernels_t *){NULL}, (char[256]){0}, 256),
         TS_EINVAL);
}

/* --- towers on the GPU: the gradient average paths against one CPU model ------------------- */

static void check_towers(const char *what, const ts_kernels_t *const *tables, size_t n,
                         ts_towers_reduce_t want) {
  int widths[] = {784, 64, 32, 10};
  const size_t nw = 4, batch = 64, dim = 784;
  char err[512] = "";
  ts_towers_t tw;
  int rc = ts_towers_init(&tw, tables, n, widths, nw, TS_ACT_RELU, batch, NULL, err, sizeof err);
  if (rc < 0) {
    printf("FAIL towers %s: %s\n", what, err);
    failures++;
    return;
  }
  ts_model_t one;
  if (ts_model_init(&one, widths, nw, TS_ACT_RELU, batch, CPU, err, sizeof err) < 0 ||
      ts_model_init_params(&one, 11) < 0)
    die("cpu model", TS_ENOMEM);
  float *x = host_random(batch * dim, 0, 1);
  int32_t y[64];
  for (size_t i = 0; i < batch; i++) y[i] = (int32_t)(urand() * 10);
  float *const *dst = ts_towers_pull_targets(&tw);
  for (size_t t = 0; t < one.num_tensors; t++)
    memcpy(dst[t], one.params + one.tensors[t].offset, one.tensors[t].count * sizeof(float));
  float lt = 0, l1 = 0;
  rc = ts_towers_load(&tw, x, y, batch, dim, err, sizeof err);
  if (rc == 0) rc = ts_towers_pulled(&tw, err, sizeof err);
  if (rc == 0) rc = ts_towers_step(&tw, &lt, err, sizeof err);
  if (rc == 0) rc = ts_model_forward_backward(&one, x, y, batch, &l1);
  if (rc < 0) {
    printf("FAIL towers %s: %s\n", what, err);
    failures++;
  } else {
    const float *const *src = ts_towers_push_sources(&tw);
    double diff = 0, norm = 0;
    for (size_t t = 0; t < one.num_tensors; t++)
      for (size_t i = 0; i < one.tensors[t].count; i++) {
        double a = src[t][i], b = one.grads[one.tensors[t].offset + i];
        diff += (a - b) * (a - b);
        norm += b * b;
      }
    double rel = sqrt(diff / norm);
    char shape[96];
    snprintf(shape, sizeof shape, "%s (%s)", what, ts_towers_reduce_name(tw.reduce));
    report("towers gradient", shape, rel, rel < TOL && tw.reduce == want);
    double lerr = fabs((double)lt - (double)l1) / fabs((double)l1);
    report("towers loss", shape, lerr, lerr < TOL);
  }
  free(x);
  ts_model_destroy(&one);
  ts_towers_destroy(&tw);
}

static void test_towers(int gpus) {
  ts_kernels_t *second = NULL;
  char err[256];
  if (ts_kernels_cuda_create(0, NULL, &second, err, sizeof err) < 0) {
    printf("FAIL second context on /gpu:0: %s\n", err);
    failures++;
    return;
  }
  const ts_kernels_t *one_gpu[2] = {GPU, second};
  check_towers("1 tower /gpu:0", one_gpu, 1, TS_TOWERS_REDUCE_NONE);
  check_towers("2 towers /gpu:0", one_gpu, 2, TS_TOWERS_REDUCE_DEVICE);
  const ts_kernels_t *mixed[2] = {GPU, CPU};
  check_towers("/gpu:0 + /cpu:0", mixed, 2, TS_TOWERS_REDUCE_PINNED);
  if (gpus >= 2) {
    ts_kernels_t *g1 = NULL;
    if (ts_kernels_cuda_create(1, NULL, &g1, err, sizeof err) == 0) {
      const ts_kernels_t *two[2] = {GPU, g1};
      check_towers("/gpu:0 + /gpu:1", two, 2,
                   ts_kernels_cuda_have_nccl() ? TS_TOWERS_REDUCE_NCCL : TS_TOWERS_REDUCE_PINNED);
      ts_kernels_cuda_destroy(g1);
    }
  }
  ts_kernels_cuda_destroy(second);
}

/* --- timings ------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef enum {
  B_GEMM,
  B_BIAS_ADD,
  B_BIAS_GRAD,
  B_RELU,
  B_TANH,
  B_SOFTMAX,
  B_XENT_GRAD,
  B_ARGMAX,
  B_AXPY
} bench_t;

static int run_bench(const ts_kernels_t *k, bench_t b, size_t m, size_t n, size_t kk, void **buf) {
  float *a = buf[0], *bb = buf[1], *c = buf[2];
  int32_t *lab = buf[3];
  float loss;
  size_t cnt;
  switch (b) {
    case B_GEMM:
      return k->gemm(k, false, false, m, n, kk, 1, a, kk, bb, n, 0, c, n);
    case B_BIAS_ADD:
      return k->bias_add(k, m, n, bb, c);
    case B_BIAS_GRAD:
      return k->bias_grad(k, m, n, a, c);
    case B_RELU:
      return k->relu_fwd(k, m * n, a, c);
    case B_TANH:
      return k->tanh_fwd(k, m * n, a, c);
    case B_SOFTMAX:
      return k->softmax_xent(k, m, n, a, lab, c, &loss);
    case B_XENT_GRAD:
      return k->softmax_xent_grad(k, m, n, a, lab, c);
    case B_ARGMAX:
      return k->argmax_correct(k, m, n, a, lab, &cnt);
    case B_AXPY:
      return k->axpy(k, m * n, 0.5f, a, c);
  }
  return TS_EINVAL;
}

static double time_kernel(const ts_kernels_t *k, bench_t b, size_t m, size_t n, size_t kk) {
  size_t big = (m * kk > m * n ? m * kk : m * n);
  if (kk * n > big) big = kk * n;
  void *buf[4];
  float *h = host_random(big, 0, 1);
  int32_t *lab = calloc(m, sizeof *lab);
  for (int i = 0; i < 3; i++) {
    if (k->alloc(k, big * 4, &buf[i]) < 0) die("bench alloc", TS_ENOMEM);
    k->copy_to_device(k, buf[i], h, big * 4);
  }
  k->alloc(k, m * 4, &buf[3]);
  k->copy_to_device(k, buf[3], lab, m * 4);
  run_bench(k, b, m, n, kk, buf); /* warm-up */
  k->synchronize(k);
  int iters = 0;
  double t0 = now_s(), t;
  do {
    if (run_bench(k, b, m, n, kk, buf) < 0) die("bench", TS_EDEVICE);
    iters++;
    if (iters % 8 == 0) k->synchronize(k);
    t = now_s();
  } while (t - t0 < 0.2 || iters < 8);
  k->synchronize(k);
  t = now_s();
  for (int i = 0; i < 4; i++) k->free_buf(k, buf[i]);
  free(h);
  free(lab);
  return (t - t0) / iters * 1e6;
}

static void bench(void) {
  static const struct {
    const char *name;
    bench_t b;
    size_t m, n, kk;
  } rows[] = {
      {"gemm 64x128x784", B_GEMM, 64, 128, 784},
      {"gemm 512x1024x784", B_GEMM, 512, 1024, 784},
      {"gemm 2048^3", B_GEMM, 2048, 2048, 2048},
      {"bias_add 512x1024", B_BIAS_ADD, 512, 1024, 1},
      {"bias_grad 512x1024", B_BIAS_GRAD, 512, 1024, 1},
      {"relu 512x1024", B_RELU, 512, 1024, 1},
      {"tanh 512x1024", B_TANH, 512, 1024, 1},
      {"axpy 4M", B_AXPY, 4096, 1024, 1},
      {"softmax_xent 1000x10", B_SOFTMAX, 1000, 10, 1},
      {"xent_grad 1000x10", B_XENT_GRAD, 1000, 10, 1},
      {"argmax 1000x10", B_ARGMAX, 1000, 10, 1},
  };
  printf("\nkernel times (microseconds per call; the GPU's include the launch)\n");
  printf("| %-22s | %12s | %12s | %8s |\n", "kernel", "GPU us", "CPU us", "speed-up");
  printf("|%s|%s|%s|%s|\n", "------------------------", "--------------", "--------------",
         "----------");
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    double g = time_kernel(GPU, rows[i].b, rows[i].m, rows[i].n, rows[i].kk);
    double c = time_kernel(CPU, rows[i].b, rows[i].m, rows[i].n, rows[i].kk);
    printf("| %-22s | %12.1f | %12.1f | %7.1fx |\n", rows[i].name, g, c, c / g);
  }
}

int main(int argc, char **argv) {
  bool do_bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  char why[256] = "";
  int gpus = ts_gpu_count(why, sizeof why);
  if (gpus == 0) {
    printf("SKIP: no GPU: %s\n", why);
    return 77;
  }
  ts_gpu_info_t info;
  if (ts_gpu_info(0, &info) == 0)
    printf("/gpu:0 is %s (PCI %s, compute capability %d.%d); %d GPU(s) visible\n", info.name,
           info.pci_bus_id, info.major, info.minor, gpus);
  const char *seed_env = getenv("TS_SEED");
  uint64_t seed =
      seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  if (seed == 0) seed = 1;
  rng_state = seed;
  printf("seed %llu (TS_SEED=%llu repeats this run)\n", (unsigned long long)seed,
         (unsigned long long)seed);
  CPU = ts_kernels_cpu();
  char err[512];
  ts_kernels_cuda_opts_t opts = {.memory = {.allow_growth = true}};
  if (ts_kernels_cuda_create(0, &opts, &GPU, err, sizeof err) < 0) {
    printf("FAIL: creating the CUDA back end on /gpu:0: %s\n", err);
    return 1;
  }
  test_gemm();
  test_bias();
  test_elementwise();
  test_softmax();
  test_mul();
  test_conv();
  test_maxpool();
  test_contract();
  test_towers(gpus);
  ts_pool_stats_t st;
  if (ts_kernels_cuda_memory(GPU, &st, NULL) == 0)
    printf("pool: %zu bytes held in %zu chunk(s), peak in use %zu, %zu block(s) still out\n",
           st.held, st.chunks, st.peak, st.blocks);
  if (do_bench && failures == 0) bench();
  ts_kernels_cuda_destroy(GPU);
  printf("\n%s: %d of %d checks passed\n", failures ? "FAILED" : "PASSED", checks - failures,
         checks);
  return failures ? 1 : 0;
}
