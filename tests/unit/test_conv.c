/*
 * The CPU window kernels (kernels/ts_conv.h, conv2d_* / maxpool_* / mul of ts_kernels.h):
 * TensorFlow's padding arithmetic on known cases, then, on shapes with odd sizes, strides 1
 * and 2, both paddings and several channels:
 *   - the forward pass against a direct double-precision convolution / pooling;
 *   - each gradient kernel against central finite differences, taken in double precision
 *     on that reference, of L = sum(r * f(x, w)) for a random r (so dL/dy = r).
 *
 * Why double-precision differences: f is linear in x and in w for a convolution, and
 * piecewise linear for max pooling, so a double central difference is exact up to ~1e-12;
 * the float kernels are then compared with a tolerance that reflects only float32 rounding
 * of short sums (relative 1e-4 plus absolute 1e-5), with no step size to tune and no noise
 * from float32 differences. Pooling inputs are distinct values spaced far wider than the
 * step, so no difference crosses a tie. The whole network's gradient, with its kinks and its
 * float32 loss, is checked by tests/unit/test_seq.c.
 *
 * The CPU back end takes stride-1 convolutions of at most 4 input channels through its direct
 * kernels (kernels/cpu/ts_kernels_cpu_direct.c) and the rest through im2col; the cases cover
 * both, and the convolutions run once more for each narrower vector instruction set the CPU
 * has (the back end compiles its loops for AVX-512, AVX2 and the baseline).
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
#include "ts_conv.h"
#include "ts_err.h"
#include "ts_kernels.h"

static const ts_kernels_t *K;

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static double urand(void) { return rng_uniform(&rng_state); } /* in [0, 1) */

static float *fbuf(size_t n) {
  float *p = ts_calloc(n ? n : 1, sizeof *p);
  assert_non_null(p);
  return p;
}

static double *dbuf(size_t n) {
  double *p = ts_calloc(n ? n : 1, sizeof *p);
  assert_non_null(p);
  return p;
}

static void fill_rand(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (float)(2.0 * urand() - 1.0);
}

static void check_close(const float *got, const double *want, size_t n, const char *what,
                        const char *shape) {
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    double lim = 1e-5 + 1e-4 * fmax(fabs((double)got[i]), fabs(want[i]));
    if (!(err <= lim))
      fail_msg("%s %s[%zu]: got %.9g, want %.9g (|diff| %.3g > %.3g)", shape, what, i,
               (double)got[i], want[i], err, lim);
  }
}

/* --- geometry ----------------------------------------------------------------------------- */

static void test_padding_arithmetic(void **state) {
  (void)state;
  /* in, win, stride, padding -> out, pad_before (TensorFlow's GetWindowedOutputSize) */
  static const struct {
    size_t in, win, stride;
    ts_padding_t pad;
    size_t out, before;
  } cases[] = {
      {28, 5, 1, TS_PAD_SAME, 28, 2},  {28, 5, 1, TS_PAD_VALID, 24, 0},
      {7, 3, 2, TS_PAD_SAME, 4, 1},    {8, 3, 2, TS_PAD_SAME, 4, 0}, /* total 1: all after */
      {5, 2, 2, TS_PAD_SAME, 3, 0},    {6, 3, 2, TS_PAD_VALID, 2, 0},
      {7, 3, 2, TS_PAD_VALID, 3, 0},   {4, 5, 1, TS_PAD_SAME, 4, 2}, /* window > input */
      {28, 2, 2, TS_PAD_VALID, 14, 0}, {9, 4, 2, TS_PAD_SAME, 5, 1}, /* total 3: 1 + 2 */
      {1, 1, 5, TS_PAD_SAME, 1, 0},    {10, 10, 1, TS_PAD_VALID, 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t out = 0, before = 99;
    assert_int_equal(ts_conv_output_size(cases[i].in, cases[i].win, cases[i].stride, cases[i].pad,
                                         &out, &before),
                     0);
    if (out != cases[i].out || before != cases[i].before)
      fail_msg("case %zu: in %zu win %zu stride %zu %s: out %zu pad %zu, want %zu %zu", i,
               cases[i].in, cases[i].win, cases[i].stride, ts_conv_padding_name(cases[i].pad), out,
               before, cases[i].out, cases[i].before);
  }
  size_t out, before;
  assert_int_equal(ts_conv_output_size(4, 5, 1, TS_PAD_VALID, &out, &before), TS_EINVAL);
  assert_int_equal(ts_conv_output_size(4, 0, 1, TS_PAD_VALID, &out, &before), TS_EINVAL);
  assert_int_equal(ts_conv_output_size(4, 2, 0, TS_PAD_SAME, &out, &before), TS_EINVAL);
  assert_int_equal(ts_conv_output_size(4, 2, 1, (ts_padding_t)7, &out, &before), TS_EINVAL);

  ts_conv2d_t g;
  assert_int_equal(ts_conv_geometry(&g, 64, 28, 28, 1, 5, 5, 1, 1, TS_PAD_SAME, 6), 0);
  assert_int_equal(g.out_h, 28);
  assert_int_equal(g.out_c, 6);
  assert_int_equal(g.pad_left, 2);
  assert_int_equal(ts_conv_geometry(&g, 64, 28, 28, 6, 2, 2, 2, 2, TS_PAD_VALID, 0), 0);
  assert_int_equal(g.out_w, 14);
  assert_int_equal(g.out_c, 6); /* pooling keeps the channels */
  assert_int_equal(ts_conv_geometry(&g, 1, 3, 3, 1, 5, 5, 1, 1, TS_PAD_VALID, 1), TS_EINVAL);
  assert_int_equal(ts_conv_geometry(&g, 0, 3, 3, 1, 1, 1, 1, 1, TS_PAD_VALID, 1), TS_EINVAL);
  assert_int_equal(ts_conv_geometry(&g, 1, TS_CONV_MAX_DIM + 1, 3, 1, 1, 1, 1, 1, TS_PAD_VALID, 1),
                   TS_EINVAL);
  /* 65536 x 65536 pixels: over the image bound */
  assert_int_equal(
      ts_conv_geometry(&g, 1, TS_CONV_MAX_DIM, TS_CONV_MAX_DIM, 1, 1, 1, 1, 1, TS_PAD_VALID, 1),
      TS_EINVAL);
  ts_padding_t p;
  assert_int_equal(ts_conv_parse_padding("same", &p), 0);
  assert_int_equal(p, TS_PAD_SAME);
  assert_int_equal(ts_conv_parse_padding("SAME", &p), -1);
  assert_string_equal(ts_conv_padding_name(TS_PAD_VALID), "valid");
}

/* --- double-precision references ------------------------------------------------------ */

static long in_at(const ts_conv2d_t *g, size_t oy, size_t ky, size_t ox, size_t kx, size_t *iy,
                  size_t *ix) {
  long y = (long)(oy * g->stride_h + ky) - (long)g->pad_top;
  long x = (long)(ox * g->stride_w + kx) - (long)g->pad_left;
  if (y < 0 || x < 0 || y >= (long)g->in_h || x >= (long)g->in_w) return -1;
  *iy = (size_t)y;
  *ix = (size_t)x;
  return 0;
}

/* y = conv(x, w), all double, direct loops. */
static void ref_conv(const ts_conv2d_t *g, const double *x, const double *w, double *y) {
  for (size_t n = 0; n < g->batch; n++)
    for (size_t oy = 0; oy < g->out_h; oy++)
      for (size_t ox = 0; ox < g->out_w; ox++)
        for (size_t co = 0; co < g->out_c; co++) {
          double s = 0.0;
          for (size_t ky = 0; ky < g->win_h; ky++)
            for (size_t kx = 0; kx < g->win_w; kx++) {
              size_t iy, ix;
              if (in_at(g, oy, ky, ox, kx, &iy, &ix) < 0) continue;
              for (size_t ci = 0; ci < g->in_c; ci++)
                s += x[((n * g->in_h + iy) * g->in_w + ix) * g->in_c + ci] *
                     w[((ky * g->win_w + kx) * g->in_c + ci) * g->out_c + co];
            }
          y[((n * g->out_h + oy) * g->out_w + ox) * g->out_c + co] = s;
        }
}

static void ref_pool(const ts_conv2d_t *g, const double *x, double *y) {
  for (size_t n = 0; n < g->batch; n++)
    for (size_t oy = 0; oy < g->out_h; oy++)
      for (size_t ox = 0; ox < g->out_w; ox++)
        for (size_t c = 0; c < g->in_c; c++) {
          double m = -INFINITY;
          for (size_t ky = 0; ky < g->win_h; ky++)
            for (size_t kx = 0; kx < g->win_w; kx++) {
              size_t iy, ix;
              if (in_at(g, oy, ky, ox, kx, &iy, &ix) < 0) continue;
              m = fmax(m, x[((n * g->in_h + iy) * g->in_w + ix) * g->in_c + c]);
            }
          y[((n * g->out_h + oy) * g->out_w + ox) * g->in_c + c] = m;
        }
}

typedef struct {
  const ts_conv2d_t *g;
  double *x, *w, *y;
  const float *r;
  bool pool;
} ref_loss_t;

static double ref_loss(ref_loss_t *L) {
  size_t ny = L->g->batch * L->g->out_h * L->g->out_w * L->g->out_c;
  if (L->pool)
    ref_pool(L->g, L->x, L->y);
  else
    ref_conv(L->g, L->x, L->w, L->y);
  double s = 0.0;
  for (size_t i = 0; i < ny; i++) s += (double)L->r[i] * L->y[i];
  return s;
}

/* d ref_loss / d v[i] for every i, by central differences in double. */
static void ref_grad(ref_loss_t *L, double *v, size_t n, double step, double *out) {
  for (size_t i = 0; i < n; i++) {
    double keep = v[i];
    v[i] = keep + step;
    double up = ref_loss(L);
    v[i] = keep - step;
    double down = ref_loss(L);
    v[i] = keep;
    out[i] = (up - down) / (2.0 * step);
  }
}

/* --- convolution ---------------------------------------------------------------------- */

typedef struct {
  size_t n, h, w, c, kh, kw, sh, sw;
  ts_padding_t pad;
  size_t filters;
} conv_case_t;

static const conv_case_t conv_cases[] = {
    {2, 7, 9, 3, 3, 3, 1, 1, TS_PAD_SAME, 4},   {2, 7, 9, 3, 3, 3, 1, 1, TS_PAD_VALID, 4},
    {2, 7, 9, 3, 3, 3, 2, 2, TS_PAD_SAME, 4},   {2, 7, 9, 3, 3, 3, 2, 2, TS_PAD_VALID, 4},
    {3, 8, 8, 2, 5, 5, 2, 1, TS_PAD_SAME, 3},   /* padding 1 before, 2 after in H */
    {1, 5, 5, 1, 5, 5, 1, 1, TS_PAD_VALID, 2},  /* kernel = input: one output pixel */
    {2, 6, 5, 4, 1, 1, 1, 1, TS_PAD_VALID, 3},  /* pointwise: no im2col */
    {2, 4, 4, 2, 5, 5, 1, 1, TS_PAD_SAME, 2},   /* kernel larger than the input */
    {2, 11, 13, 3, 2, 4, 3, 2, TS_PAD_SAME, 5}, /* non-square everything */
    {3, 9, 7, 5, 3, 2, 2, 3, TS_PAD_VALID, 6},
    {2, 12, 10, 1, 5, 5, 1, 1, TS_PAD_SAME, 6}, /* LeNet-5's first layer, smaller: direct */
    {2, 9, 11, 4, 3, 4, 1, 1, TS_PAD_VALID, 7}, /* the widest input the direct path takes */
    {1, 8, 8, 5, 3, 3, 1, 1, TS_PAD_SAME, 3},   /* one channel more: im2col */
};

static void case_name(const conv_case_t *c, char *buf, size_t len) {
  snprintf(buf, len, "[%zux%zux%zux%zu k%zux%zu s%zux%zu %s f%zu]", c->n, c->h, c->w, c->c, c->kh,
           c->kw, c->sh, c->sw, ts_conv_padding_name(c->pad), c->filters);
}

/* Runs the three kernels with a workspace of ws_bytes (0: what conv2d_workspace asks). */
static void check_conv_case(const conv_case_t *cc, size_t ws_bytes) {
  char name[96];
  case_name(cc, name, sizeof name);
  ts_conv2d_t g;
  assert_int_equal(ts_conv_geometry(&g, cc->n, cc->h, cc->w, cc->c, cc->kh, cc->kw, cc->sh, cc->sw,
                                    cc->pad, cc->filters),
                   0);
  size_t nx = g.batch * g.in_h * g.in_w * g.in_c, nw = g.win_h * g.win_w * g.in_c * g.out_c;
  size_t ny = g.batch * g.out_h * g.out_w * g.out_c;
  float *x = fbuf(nx), *w = fbuf(nw), *y = fbuf(ny), *r = fbuf(ny), *dx = fbuf(nx), *dw = fbuf(nw);
  fill_rand(x, nx);
  fill_rand(w, nw);
  fill_rand(r, ny);
  size_t want_ws = K->conv2d_workspace(K, &g);
  assert_true(want_ws > 0);
  if (ws_bytes == 0) ws_bytes = want_ws;
  void *ws = NULL;
  assert_int_equal(K->alloc(K, ws_bytes, &ws), 0);
  memset(ws, 0xff, ws_bytes); /* NaN everywhere: the kernels must not read stale scratch */
  memset(dx, 0xff, nx * sizeof *dx);
  memset(dw, 0xff, nw * sizeof *dw);

  assert_int_equal(K->conv2d_fwd(K, &g, x, w, y, ws, ws_bytes), 0);
  assert_int_equal(K->conv2d_bwd_data(K, &g, w, r, dx, ws, ws_bytes), 0);
  assert_int_equal(K->conv2d_bwd_filter(K, &g, x, r, dw, ws, ws_bytes), 0);

  double *xd = dbuf(nx), *wd = dbuf(nw), *yd = dbuf(ny), *gx = dbuf(nx), *gw = dbuf(nw);
  for (size_t i = 0; i < nx; i++) xd[i] = x[i];
  for (size_t i = 0; i < nw; i++) wd[i] = w[i];
  ref_conv(&g, xd, wd, yd);
  check_close(y, yd, ny, "conv2d_fwd", name);
  ref_loss_t L = {.g = &g, .x = xd, .w = wd, .y = yd, .r = r};
  ref_grad(&L, xd, nx, 1e-3, gx);
  ref_grad(&L, wd, nw, 1e-3, gw);
  check_close(dx, gx, nx, "conv2d_bwd_data", name);
  check_close(dw, gw, nw, "conv2d_bwd_filter", name);

  K->free_buf(K, ws);
  ts_free(x), ts_free(w), ts_free(y), ts_free(r), ts_free(dx), ts_free(dw);
  ts_free(xd), ts_free(wd), ts_free(yd), ts_free(gx), ts_free(gw);
}

static void test_conv_against_reference(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
    check_conv_case(&conv_cases[i], 0);
}

/* The same with the vector loops capped at each narrower instruction set than the CPU's. */
static void test_conv_every_isa(void **state) {
  (void)state;
  ts_cpu_isa_t best = ts_cpu_isa();
  for (int isa = TS_CPU_ISA_BASE; isa < (int)best; isa++) {
    ts_cpu_isa_limit((ts_cpu_isa_t)isa);
    assert_int_equal(ts_cpu_isa(), isa);
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
      check_conv_case(&conv_cases[i], 0);
  }
  ts_cpu_isa_limit(TS_CPU_ISA_AVX512);
  assert_int_equal(ts_cpu_isa(), best);
}

/* A workspace of exactly one image's im2col matrix: the batch goes through in chunks, and the
 * filter gradient accumulates across them. */
static void test_conv_chunked(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
    const conv_case_t *c = &conv_cases[i];
    if (c->kh == 1 && c->kw == 1) continue; /* pointwise: no workspace used */
    ts_conv2d_t g;
    assert_int_equal(ts_conv_geometry(&g, c->n, c->h, c->w, c->c, c->kh, c->kw, c->sh, c->sw,
                                      c->pad, c->filters),
                     0);
    check_conv_case(c, g.out_h * g.out_w * g.win_h * g.win_w * g.in_c * sizeof(float));
  }
}

static void test_conv_invalid(void **state) {
  (void)state;
  ts_conv2d_t g;
  assert_int_equal(ts_conv_geometry(&g, 2, 5, 5, 2, 3, 3, 1, 1, TS_PAD_SAME, 3), 0);
  float buf[400] = {0};
  size_t one = g.out_h * g.out_w * g.win_h * g.win_w * g.in_c * sizeof(float);
  float *ws = fbuf(one / sizeof(float));
  assert_int_equal(K->conv2d_fwd(K, &g, buf, buf, NULL, ws, one), TS_EINVAL);
  assert_int_equal(K->conv2d_fwd(K, &g, buf, buf, buf + 100, NULL, one), TS_EINVAL);
  assert_int_equal(K->conv2d_fwd(K, &g, buf, buf, buf + 100, ws, one - 4), TS_EINVAL);
  assert_int_equal(K->conv2d_bwd_data(K, &g, buf, buf, buf + 100, ws, one - 4), TS_EINVAL);
  assert_int_equal(K->conv2d_bwd_filter(K, &g, buf, buf, NULL, ws, one), TS_EINVAL);
  ts_conv2d_t bad = g;
  bad.out_h = 7; /* does not follow from the inputs */
  assert_int_equal(K->conv2d_fwd(K, &bad, buf, buf, buf + 100, ws, one), TS_EINVAL);
  assert_int_equal(K->conv2d_workspace(K, &bad), 0);
  assert_int_equal(K->conv2d_fwd(K, NULL, buf, buf, buf + 100, ws, one), TS_EINVAL);
  /* pooling needs out_c == in_c */
  int32_t idx[100];
  assert_int_equal(K->maxpool_fwd(K, &g, buf, buf + 100, idx), TS_EINVAL);
  assert_int_equal(K->mul(K, 3, buf, NULL, buf), TS_EINVAL);
  assert_int_equal(K->mul(K, 0, NULL, NULL, NULL), 0);
  ts_free(ws);
}

/* --- pooling ------------------------------------------------------------------------------ */

static const conv_case_t pool_cases[] = {
    {2, 7, 9, 3, 2, 2, 2, 2, TS_PAD_VALID, 0}, {2, 7, 9, 3, 2, 2, 2, 2, TS_PAD_SAME, 0},
    {2, 7, 7, 2, 3, 3, 2, 2, TS_PAD_SAME, 0}, /* overlapping windows */
    {1, 5, 6, 3, 3, 3, 1, 1, TS_PAD_VALID, 0}, {2, 28, 28, 1, 2, 2, 2, 2, TS_PAD_VALID, 0},
    {3, 5, 4, 4, 3, 2, 1, 2, TS_PAD_SAME, 0},
    {2, 12, 12, 6, 2, 2, 2, 2, TS_PAD_VALID, 0}, /* LeNet-5's pools, smaller: rows of 36 */
    {1, 10, 10, 16, 2, 2, 2, 2, TS_PAD_VALID, 0}, /* and 80 floats */
};

/* Each case against the reference, at each vector instruction set the CPU has (the fast path
 * for windows inside the input across has an AVX-512 loop). */
static void check_pool_cases(void);

static void test_maxpool(void **state) {
  (void)state;
  ts_cpu_isa_t best = ts_cpu_isa();
  for (int isa = TS_CPU_ISA_BASE; isa <= (int)best; isa++) {
    ts_cpu_isa_limit((ts_cpu_isa_t)isa);
    check_pool_cases();
  }
  ts_cpu_isa_limit(TS_CPU_ISA_AVX512);
}

static void check_pool_cases(void) {
  for (size_t ci = 0; ci < sizeof pool_cases / sizeof pool_cases[0]; ci++) {
    const conv_case_t *c = &pool_cases[ci];
    char name[96];
    case_name(c, name, sizeof name);
    ts_conv2d_t g;
    assert_int_equal(
        ts_conv_geometry(&g, c->n, c->h, c->w, c->c, c->kh, c->kw, c->sh, c->sw, c->pad, 0), 0);
    size_t nx = g.batch * g.in_h * g.in_w * g.in_c, ny = g.batch * g.out_h * g.out_w * g.out_c;
    float *x = fbuf(nx), *y = fbuf(ny), *r = fbuf(ny), *dx = fbuf(nx);
    int32_t *idx = ts_calloc(ny, sizeof *idx);
    assert_non_null(idx);
    /* Distinct values 0.01 apart, shuffled: no ties, and a step of 1e-4 crosses none. */
    for (size_t i = 0; i < nx; i++) x[i] = (float)((double)i * 0.01 - (double)nx * 0.005);
    for (size_t i = nx - 1; i > 0; i--) {
      size_t j = (size_t)(urand() * (double)(i + 1));
      float t = x[i];
      x[i] = x[j];
      x[j] = t;
    }
    fill_rand(r, ny);
    memset(dx, 0xff, nx * sizeof *dx);
    assert_int_equal(K->maxpool_fwd(K, &g, x, y, idx), 0);
    assert_int_equal(K->maxpool_bwd(K, &g, x, y, r, idx, dx), 0);
    double *xd = dbuf(nx), *yd = dbuf(ny), *gx = dbuf(nx);
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    ref_pool(&g, xd, yd);
    check_close(y, yd, ny, "maxpool_fwd", name);
    ref_loss_t L = {.g = &g, .x = xd, .y = yd, .r = r, .pool = true};
    ref_grad(&L, xd, nx, 1e-4, gx);
    check_close(dx, gx, nx, "maxpool_bwd", name);
    ts_free(x), ts_free(y), ts_free(r), ts_free(dx), ts_free(idx);
    ts_free(xd), ts_free(yd), ts_free(gx);
  }
}

/* Ties go to the first maximum in window order (row by row), as TensorFlow's CPU kernel. */
static void test_maxpool_ties(void **state) {
  (void)state;
  ts_conv2d_t g;
  assert_int_equal(ts_conv_geometry(&g, 1, 2, 2, 1, 2, 2, 2, 2, TS_PAD_VALID, 0), 0);
  float x[4] = {1, 3, 3, 2}, y[1], dy[1] = {5}, dx[4];
  int32_t idx[1];
  ts_cpu_isa_t best = ts_cpu_isa();
  for (int isa = TS_CPU_ISA_BASE; isa <= (int)best; isa++) {
    ts_cpu_isa_limit((ts_cpu_isa_t)isa);
    idx[0] = -1;
    assert_int_equal(K->maxpool_fwd(K, &g, x, y, idx), 0);
    assert_int_equal(idx[0], 1);
  }
  ts_cpu_isa_limit(TS_CPU_ISA_AVX512);
  assert_int_equal(K->maxpool_bwd(K, &g, x, y, dy, idx, dx), 0);
  assert_true(dx[0] == 0.0f && dx[1] == 5.0f && dx[2] == 0.0f && dx[3] == 0.0f);
  idx[0] = 4; /* not an index maxpool_fwd writes */
  assert_int_equal(K->maxpool_bwd(K, &g, x, y, dy, idx, dx), TS_EINVAL);
}

static void test_mul(void **state) {
  (void)state;
  float a[5] = {1, -2, 3, 4, 5}, b[5] = {0, 2, 0.5f, 0, -1}, y[5];
  assert_int_equal(K->mul(K, 5, a, b, y), 0);
  float want[5] = {0, -4, 1.5f, 0, -5};
  for (int i = 0; i < 5; i++) assert_true(y[i] == want[i]);
  assert_int_equal(K->mul(K, 5, a, b, a), 0); /* in place */
  for (int i = 0; i < 5; i++) assert_true(a[i] == want[i]);
}

int main(void) {
  K = ts_kernels_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_padding_arithmetic),
      cmocka_unit_test(test_conv_against_reference),
      cmocka_unit_test(test_conv_every_isa),
      cmocka_unit_test(test_conv_chunked),
      cmocka_unit_test(test_conv_invalid),
      cmocka_unit_test(test_maxpool),
      cmocka_unit_test(test_maxpool_ties),
      cmocka_unit_test(test_mul),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
