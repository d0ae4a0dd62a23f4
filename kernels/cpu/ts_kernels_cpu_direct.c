/*
 * Direct convolution for few input channels (the first layer of an image network: 1 or 3
 * channels), the CPU back end's alternative to im2col + sgemm (ts_kernels_cpu_conv.c).
 *
 * Why. With in_c = 1 an im2col row holds win_w floats per kernel row (5 for LeNet-5's first
 * layer), so im2col is a storm of tiny copies, and the product that follows is out_c wide
 * (6): both fit a CPU badly. Here every inner loop runs over a whole image plane instead,
 * and the compiler vectorises it.
 *
 * How, one image at a time (stride 1 only). Planes are stored with a row pitch of
 * pw = out_w + win_w - 1, the padded input's width:
 *   xp    the image in planar layout with its padding made explicit: in_c planes of
 *         ph = out_h + win_h - 1 rows, zeros around the input (and after the last row), so
 *         tap (ky, kx) of output pixel j = oy * pw + ox reads the plane at j + ky * pw + kx.
 *   out   "wide" output planes: out_c planes of out_h rows of pw, where the columns from
 *         out_w on are junk (forward) or zeros (a gradient); `span` = out_h * pw.
 *   forward      out[co][j] += w[ky][kx][ci][co] * xp[ci][j + ky * pw + kx] for every tap,
 *                each a contiguous y += a * x over the plane; then y = out's real columns.
 *   filter grad  dw[ky][kx][ci][co] += the dot product of dyp[co] (zero in the junk columns)
 *                and xp[ci] from ky * pw + kx, summed over the batch.
 *   input grad   dxp[ci][j + ky * pw + kx] += w * dyp[co][j], then dx = dxp's interior.
 */
#include <string.h>

#include "ts_kernels_cpu_int.h"

/* The widest input the direct path takes: beyond it im2col's rows are long enough. */
#define DIRECT_MAX_IN_C 4
/* Partial sums of a dot product: 32 floats are two AVX-512 or four AVX2 registers, enough
 * independent chains to hide the latency of the multiply-adds. */
#define LANES 32

typedef struct {
  size_t pw;   /* row pitch of every plane */
  size_t span; /* out_h * pw: the wide output plane */
  size_t nj;   /* span rounded up to LANES: the pitch of the output planes */
  size_t xs;   /* the pitch of the input planes: every tap's read of nj floats fits */
} direct_t;

static size_t round_up(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}

static direct_t direct_layout(const ts_conv2d_t *g) {
  direct_t d;
  d.pw = g->out_w + g->win_w - 1;
  d.span = g->out_h * d.pw;
  d.nj = round_up(d.span, LANES);
  d.xs = round_up(d.nj + (g->win_h - 1) * d.pw + g->win_w - 1, 16);
  return d;
}

/* Floats of workspace: xp, dxp (in_c planes each), the output planes. */
static size_t direct_floats(const ts_conv2d_t *g) {
  direct_t d = direct_layout(g);
  return 2 * g->in_c * d.xs + g->out_c * d.nj;
}

bool ts_cpu_direct_fits(const ts_conv2d_t *g, size_t ws_bytes) {
  return g->stride_h == 1 && g->stride_w == 1 && g->in_c <= DIRECT_MAX_IN_C &&
         (g->win_h > 1 || g->win_w > 1) && direct_floats(g) * sizeof(float) <= ws_bytes;
}

/* y[0, n) += a * x[0, n). */
TS_CPU_BODY void row_fma(size_t n, float a, const float *restrict x, float *restrict y) {
  for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* The dot product of a[0, n) and b[0, n), n a multiple of LANES. */
TS_CPU_BODY float dot(size_t n, const float *restrict a, const float *restrict b) {
  float s[LANES] = {0};
  for (size_t j = 0; j < n; j += LANES)
    for (size_t l = 0; l < LANES; l++) s[l] += a[j + l] * b[j + l];
  float t = 0.0f;
  for (size_t l = 0; l < LANES; l++) t += s[l];
  return t;
}

/* xp = one NHWC image, planar and padded (see above). */
TS_CPU_BODY void pad_planar(const ts_conv2d_t *g, const direct_t *d, const float *restrict img,
                            float *restrict xp) {
  size_t C = g->in_c;
  memset(xp, 0, C * d->xs * sizeof(float));
  for (size_t iy = 0; iy < g->in_h; iy++) {
    const float *restrict src = img + iy * g->in_w * C;
    if (C == 1) { /* a row is already planar */
      memcpy(xp + (iy + g->pad_top) * d->pw + g->pad_left, src, g->in_w * sizeof(float));
      continue;
    }
    for (size_t ci = 0; ci < C; ci++) {
      float *restrict dst = xp + ci * d->xs + (iy + g->pad_top) * d->pw + g->pad_left;
      for (size_t ix = 0; ix < g->in_w; ix++) dst[ix] = src[ix * C + ci];
    }
  }
}

/* dyp = one NHWC output gradient image as wide planes, zero outside its columns. */
TS_CPU_BODY void grad_planar(const ts_conv2d_t *g, const direct_t *d, const float *restrict dy,
                             float *restrict dyp) {
  size_t C = g->out_c;
  memset(dyp, 0, C * d->nj * sizeof(float));
  for (size_t oy = 0; oy < g->out_h; oy++)
    for (size_t ox = 0; ox < g->out_w; ox++) {
      const float *restrict px = dy + (oy * g->out_w + ox) * C;
      for (size_t co = 0; co < C; co++) dyp[co * d->nj + oy * d->pw + ox] = px[co];
    }
}

/* yi = the real columns of the wide output planes, as one NHWC image. */
TS_CPU_BODY void planes_to_image(const ts_conv2d_t *g, const direct_t *d, const float *restrict out,
                                 float *restrict yi) {
  size_t OC = g->out_c;
  for (size_t oy = 0; oy < g->out_h; oy++)
    for (size_t ox = 0; ox < g->out_w; ox++)
      for (size_t co = 0; co < OC; co++)
        yi[(oy * g->out_w + ox) * OC + co] = out[co * d->nj + oy * d->pw + ox];
}

TS_CPU_BODY void direct_fwd_body(const ts_conv2d_t *g, const float *x, const float *w, float *y,
                                 float *ws) {
  direct_t d = direct_layout(g);
  size_t OC = g->out_c;
  float *restrict xp = ws, *restrict out = ws + 2 * g->in_c * d.xs;
  for (size_t n = 0; n < g->batch; n++) {
    pad_planar(g, &d, x + n * g->in_h * g->in_w * g->in_c, xp);
    memset(out, 0, OC * d.nj * sizeof(float));
    for (size_t ky = 0; ky < g->win_h; ky++)
      for (size_t kx = 0; kx < g->win_w; kx++)
        for (size_t ci = 0; ci < g->in_c; ci++) {
          const float *restrict src = xp + ci * d.xs + ky * d.pw + kx;
          const float *restrict wr = w + ((ky * g->win_w + kx) * g->in_c + ci) * OC;
          for (size_t co = 0; co < OC; co++) row_fma(d.span, wr[co], src, out + co * d.nj);
        }
    planes_to_image(g, &d, out, y + n * g->out_h * g->out_w * OC);
  }
}

TS_CPU_BODY void direct_bwd_filter_body(const ts_conv2d_t *g, const float *x, const float *dy,
                                        float *dw, float *ws) {
  direct_t d = direct_layout(g);
  size_t OC = g->out_c, K = g->win_h * g->win_w * g->in_c;
  float *restrict xp = ws, *restrict dyp = ws + 2 * g->in_c * d.xs;
  memset(dw, 0, K * OC * sizeof(float));
  for (size_t n = 0; n < g->batch; n++) {
    pad_planar(g, &d, x + n * g->in_h * g->in_w * g->in_c, xp);
    grad_planar(g, &d, dy + n * g->out_h * g->out_w * OC, dyp);
    for (size_t ky = 0; ky < g->win_h; ky++)
      for (size_t kx = 0; kx < g->win_w; kx++)
        for (size_t ci = 0; ci < g->in_c; ci++) {
          const float *restrict src = xp + ci * d.xs + ky * d.pw + kx;
          float *restrict dr = dw + ((ky * g->win_w + kx) * g->in_c + ci) * OC;
          for (size_t co = 0; co < OC; co++) dr[co] += dot(d.nj, dyp + co * d.nj, src);
        }
  }
}

TS_CPU_BODY void direct_bwd_data_body(const ts_conv2d_t *g, const float *w, const float *dy,
                                      float *dx, float *ws) {
  direct_t d = direct_layout(g);
  size_t OC = g->out_c, C = g->in_c;
  float *restrict dxp = ws + C * d.xs, *restrict dyp = ws + 2 * C * d.xs;
  for (size_t n = 0; n < g->batch; n++) {
    memset(dxp, 0, C * d.xs * sizeof(float));
    grad_planar(g, &d, dy + n * g->out_h * g->out_w * OC, dyp);
    for (size_t ky = 0; ky < g->win_h; ky++)
      for (size_t kx = 0; kx < g->win_w; kx++)
        for (size_t ci = 0; ci < C; ci++) {
          float *restrict dst = dxp + ci * d.xs + ky * d.pw + kx;
          const float *restrict wr = w + ((ky * g->win_w + kx) * C + ci) * OC;
          for (size_t co = 0; co < OC; co++) row_fma(d.span, wr[co], dyp + co * d.nj, dst);
        }
    float *restrict img = dx + n * g->in_h * g->in_w * C;
    for (size_t iy = 0; iy < g->in_h; iy++)
      for (size_t ci = 0; ci < C; ci++) {
        const float *restrict src = dxp + ci * d.xs + (iy + g->pad_top) * d.pw + g->pad_left;
        for (size_t ix = 0; ix < g->in_w; ix++) img[(iy * g->in_w + ix) * C + ci] = src[ix];
      }
  }
}

#ifdef TS_CPU_MULTI_ISA
#include <immintrin.h>

/* AVX-512 forms of the forward and filter-gradient loops, register-blocked: the loops above
 * load and store the output plane (or read two planes) for every multiply-add, these keep
 * a tile of results in registers. A tile covers CO_TILE output channels; where out_c is not
 * a multiple, the missing channels repeat the last one and are not stored. */
#define CO_TILE 8

/* The index of channel c of a tile of `cob` live channels (see above). */
#define LIVE(c, cob) ((c) < (cob) ? (c) : (cob)-1)

/* Window taps in HWIO order (ky, kx, ci), and each one's offset in the planes of xp. */
typedef struct {
  size_t ky, kx, ci;
} tap_t;

static inline size_t tap_offset(const direct_t *d, size_t xs, tap_t t) {
  return t.ci * xs + t.ky * d->pw + t.kx;
}

static inline void tap_next(const ts_conv2d_t *g, tap_t *t) {
  if (++t->ci < g->in_c) return;
  t->ci = 0;
  if (++t->kx < g->win_w) return;
  t->kx = 0;
  t->ky++;
}

/* Forward: out[co][j, j + 32) for CO_TILE channels at a time, summed over every tap. */
TS_CPU_TARGET_AVX512 static void fwd_tiles_avx512(const ts_conv2d_t *g, const direct_t *d,
                                                  const float *restrict xp, const float *restrict w,
                                                  float *restrict out) {
  size_t OC = g->out_c, taps = g->win_h * g->win_w * g->in_c;
  for (size_t co0 = 0; co0 < OC; co0 += CO_TILE) {
    size_t cob = OC - co0 < CO_TILE ? OC - co0 : CO_TILE;
    for (size_t j = 0; j < d->nj; j += 32) {
      __m512 a0[CO_TILE], a1[CO_TILE];
#pragma GCC unroll 8
      for (size_t c = 0; c < CO_TILE; c++) a0[c] = a1[c] = _mm512_setzero_ps();
      tap_t tp = {0, 0, 0};
      for (size_t t = 0; t < taps; t++, tap_next(g, &tp)) {
        const float *src = xp + tap_offset(d, d->xs, tp) + j;
        __m512 x0 = _mm512_loadu_ps(src), x1 = _mm512_loadu_ps(src + 16);
        const float *wr = w + t * OC + co0;
#pragma GCC unroll 8
        for (size_t c = 0; c < CO_TILE; c++) {
          __m512 wv = _mm512_set1_ps(wr[LIVE(c, cob)]);
          a0[c] = _mm512_fmadd_ps(wv, x0, a0[c]);
          a1[c] = _mm512_fmadd_ps(wv, x1, a1[c]);
        }
      }
#pragma GCC unroll 8
      for (size_t c = 0; c < CO_TILE; c++)
        if (c < cob) {
          _mm512_storeu_ps(out + (co0 + c) * d->nj + j, a0[c]);
          _mm512_storeu_ps(out + (co0 + c) * d->nj + j + 16, a1[c]);
        }
    }
  }
}

/* Filter gradient: dw[t][co] += the dot products for TAP_TILE taps x CO_TILE channels at a
 * time, 16 partial sums each in a register. */
#define TAP_TILE 3

TS_CPU_TARGET_AVX512 static void filter_tiles_avx512(const ts_conv2d_t *g, const direct_t *d,
                                                     const float *restrict xp,
                                                     const float *restrict dyp,
                                                     float *restrict dw) {
  size_t OC = g->out_c, taps = g->win_h * g->win_w * g->in_c;
  for (size_t co0 = 0; co0 < OC; co0 += CO_TILE) {
    size_t cob = OC - co0 < CO_TILE ? OC - co0 : CO_TILE;
    tap_t tp = {0, 0, 0};
    for (size_t t0 = 0; t0 < taps; t0 += TAP_TILE) {
      size_t tb = taps - t0 < TAP_TILE ? taps - t0 : TAP_TILE;
      const float *src[TAP_TILE];
      for (size_t k = 0; k < TAP_TILE; k++) { /* a missing tap repeats the last one */
        src[k] = xp + tap_offset(d, d->xs, tp);
        if (k + 1 < tb) tap_next(g, &tp);
      }
      tap_next(g, &tp);
      const float *dr[CO_TILE];
      for (size_t c = 0; c < CO_TILE; c++) dr[c] = dyp + (co0 + LIVE(c, cob)) * d->nj;
      __m512 acc[TAP_TILE][CO_TILE];
#pragma GCC unroll 8
      for (size_t k = 0; k < TAP_TILE; k++)
#pragma GCC unroll 8
        for (size_t c = 0; c < CO_TILE; c++) acc[k][c] = _mm512_setzero_ps();
      for (size_t j = 0; j < d->nj; j += 16) {
        __m512 xv[TAP_TILE];
#pragma GCC unroll 8
        for (size_t k = 0; k < TAP_TILE; k++) xv[k] = _mm512_loadu_ps(src[k] + j);
#pragma GCC unroll 8
        for (size_t c = 0; c < CO_TILE; c++) {
          __m512 dv = _mm512_loadu_ps(dr[c] + j);
#pragma GCC unroll 8
          for (size_t k = 0; k < TAP_TILE; k++) acc[k][c] = _mm512_fmadd_ps(dv, xv[k], acc[k][c]);
        }
      }
#pragma GCC unroll 8
      for (size_t k = 0; k < TAP_TILE; k++)
#pragma GCC unroll 8
        for (size_t c = 0; c < CO_TILE; c++)
          if (k < tb && c < cob) dw[(t0 + k) * OC + co0 + c] += _mm512_reduce_add_ps(acc[k][c]);
    }
  }
}

TS_CPU_TARGET_AVX512 static void fwd_avx512(const ts_conv2d_t *g, const float *x, const float *w,
                                            float *y, float *ws) {
  direct_t d = direct_layout(g);
  float *restrict xp = ws, *restrict out = ws + 2 * g->in_c * d.xs;
  for (size_t n = 0; n < g->batch; n++) {
    pad_planar(g, &d, x + n * g->in_h * g->in_w * g->in_c, xp);
    fwd_tiles_avx512(g, &d, xp, w, out);
    planes_to_image(g, &d, out, y + n * g->out_h * g->out_w * g->out_c);
  }
}

TS_CPU_TARGET_AVX512 static void filter_avx512(const ts_conv2d_t *g, const float *x,
                                               const float *dy, float *dw, float *ws) {
  direct_t d = direct_layout(g);
  float *restrict xp = ws, *restrict dyp = ws + 2 * g->in_c * d.xs;
  memset(dw, 0, g->win_h * g->win_w * g->in_c * g->out_c * sizeof(float));
  for (size_t n = 0; n < g->batch; n++) {
    pad_planar(g, &d, x + n * g->in_h * g->in_w * g->in_c, xp);
    grad_planar(g, &d, dy + n * g->out_h * g->out_w * g->out_c, dyp);
    filter_tiles_avx512(g, &d, xp, dyp, dw);
  }
}
#endif

TS_CPU_DISPATCH_OWN_AVX512(direct_fwd, fwd_avx512,
                           (const ts_conv2d_t *g, const float *x, const float *w, float *y,
                            float *ws),
                           (g, x, w, y, ws))
TS_CPU_DISPATCH_OWN_AVX512(direct_bwd_filter, filter_avx512,
                           (const ts_conv2d_t *g, const float *x, const float *dy, float *dw,
                            float *ws),
                           (g, x, dy, dw, ws))
TS_CPU_DISPATCH(direct_bwd_data,
                (const ts_conv2d_t *g, const float *w, const float *dy, float *dx, float *ws),
                (g, w, dy, dx, ws))

void ts_cpu_direct_fwd(const ts_conv2d_t *g, const float *x, const float *w, float *y, float *ws) {
  direct_fwd(g, x, w, y, ws);
}

void ts_cpu_direct_bwd_filter(const ts_conv2d_t *g, const float *x, const float *dy, float *dw,
                              float *ws) {
  direct_bwd_filter(g, x, dy, dw, ws);
}

void ts_cpu_direct_bwd_data(const ts_conv2d_t *g, const float *w, const float *dy, float *dx,
                            float *ws) {
  direct_bwd_data(g, w, dy, dx, ws);
}
