/*
 * The CPU window kernels: convolution as im2col + OpenBLAS sgemm, max pooling with argmax
 * indices, and the elementwise product dropout uses.
 *
 * im2col. For a chunk of nb images the workspace holds the matrix col with one row per
 * output pixel (image, oy, ox) and one column per kernel tap (ky, kx, ci), the order of an
 * HWIO kernel's rows; padded taps are zeros. Then, with K = win_h * win_w * in_c:
 *   forward        y[rows x out_c]  = col[rows x K] * w[K x out_c]
 *   filter grad    dw[K x out_c]   += col^T * dy        (beta = 1 after the first chunk)
 *   input grad     dcol[rows x K]   = dy * w^T, then col2im adds each tap back into dx
 * A row's taps at one (ky, kx) are in_c contiguous floats of the input, so im2col and col2im
 * move whole channel vectors (memcpy, and an add loop the compiler vectorises). A 1x1
 * convolution with stride 1 and no padding needs no im2col: col is x itself. A convolution
 * of stride 1 over at most 4 input channels goes to the direct kernels of
 * ts_kernels_cpu_direct.c instead (why there).
 *
 * Threads: the loops here run on the caller's thread; sgemm uses OpenBLAS's threads.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "ts_err.h"
#include "ts_kernels_cpu_int.h"

/* What the CPU back end asks for beyond one image's im2col matrix. */
#define CPU_CONV_WORKSPACE_TARGET ((size_t)8 << 20)

static size_t taps(const ts_conv2d_t *g) {
  return g->win_h * g->win_w * g->in_c;
}

static size_t image_in(const ts_conv2d_t *g) {
  return g->in_h * g->in_w * g->in_c;
}

static size_t image_out(const ts_conv2d_t *g) {
  return g->out_h * g->out_w * g->out_c;
}

static bool is_pointwise(const ts_conv2d_t *g) {
  return g->win_h == 1 && g->win_w == 1 && g->stride_h == 1 && g->stride_w == 1;
}

/* A geometry a caller could have built by hand: recheck it with ts_conv_geometry's rules. */
static bool geometry_ok(const ts_conv2d_t *g) {
  if (!g) return false;
  ts_conv2d_t want;
  /* Recomputing the outputs and the padding from the inputs tells same from valid. */
  for (int p = TS_PAD_VALID; p <= TS_PAD_SAME; p++) {
    if (ts_conv_geometry(&want, g->batch, g->in_h, g->in_w, g->in_c, g->win_h, g->win_w,
                         g->stride_h, g->stride_w, (ts_padding_t)p, g->out_c) == 0 &&
        memcmp(&want, g, sizeof want) == 0)
      return true;
  }
  return false;
}

/* Images per chunk that the workspace holds (0: not even one). */
static size_t chunk_images(const ts_conv2d_t *g, size_t ws_bytes) {
  size_t per_image = g->out_h * g->out_w * taps(g) * sizeof(float);
  size_t nb = ws_bytes / per_image;
  size_t max_rows_images = (size_t)INT_MAX / (g->out_h * g->out_w);
  if (nb > max_rows_images) nb = max_rows_images;
  return nb < g->batch ? nb : g->batch;
}

size_t ts_cpu_conv2d_workspace(const ts_kernels_t *k, const ts_conv2d_t *g) {
  (void)k;
  if (!geometry_ok(g)) return 0;
  if (is_pointwise(g)) return sizeof(float); /* no im2col; dcol is dx itself */
  size_t per_image = g->out_h * g->out_w * taps(g) * sizeof(float);
  size_t nb = CPU_CONV_WORKSPACE_TARGET / per_image;
  if (nb < 1) nb = 1;
  if (nb > g->batch) nb = g->batch;
  return nb * per_image;
}

/* col = im2col of images [0, nb) of x (x points at the chunk's first image). */
static void im2col(const ts_conv2d_t *g, size_t nb, const float *restrict x, float *restrict col) {
  size_t C = g->in_c, K = taps(g);
  for (size_t n = 0; n < nb; n++) {
    const float *restrict img = x + n * image_in(g);
    for (size_t oy = 0; oy < g->out_h; oy++) {
      for (size_t ox = 0; ox < g->out_w; ox++) {
        float *restrict row = col + ((n * g->out_h + oy) * g->out_w + ox) * K;
        for (size_t ky = 0; ky < g->win_h; ky++) {
          /* iy = oy * stride + ky - pad_top, unsigned: out of range wraps to a huge value */
          size_t iy = oy * g->stride_h + ky - g->pad_top;
          float *restrict dst = row + ky * g->win_w * C;
          if (iy >= g->in_h) {
            memset(dst, 0, g->win_w * C * sizeof(float));
            continue;
          }
          size_t ix0 = ox * g->stride_w - g->pad_left; /* wraps when in the padding */
          if (ix0 < g->in_w && g->win_w <= g->in_w - ix0) {
            /* the whole kernel row is inside: win_w * C contiguous input floats */
            memcpy(dst, img + (iy * g->in_w + ix0) * C, g->win_w * C * sizeof(float));
            continue;
          }
          for (size_t kx = 0; kx < g->win_w; kx++) {
            size_t ix = ix0 + kx;
            if (ix >= g->in_w)
              memset(dst + kx * C, 0, C * sizeof(float));
            else
              memcpy(dst + kx * C, img + (iy * g->in_w + ix) * C, C * sizeof(float));
          }
        }
      }
    }
  }
}

/* dx += col2im(dcol) for images [0, nb) (dx points at the chunk's first image). */
static void col2im_add(const ts_conv2d_t *g, size_t nb, const float *restrict dcol,
                       float *restrict dx) {
  size_t C = g->in_c, K = taps(g);
  for (size_t n = 0; n < nb; n++) {
    float *restrict img = dx + n * image_in(g);
    for (size_t oy = 0; oy < g->out_h; oy++) {
      for (size_t ox = 0; ox < g->out_w; ox++) {
        const float *restrict row = dcol + ((n * g->out_h + oy) * g->out_w + ox) * K;
        for (size_t ky = 0; ky < g->win_h; ky++) {
          size_t iy = oy * g->stride_h + ky - g->pad_top;
          if (iy >= g->in_h) continue;
          size_t ix0 = ox * g->stride_w - g->pad_left;
          const float *restrict s = row + ky * g->win_w * C;
          if (ix0 < g->in_w && g->win_w <= g->in_w - ix0) { /* the whole row is inside */
            float *restrict d = img + (iy * g->in_w + ix0) * C;
            for (size_t j = 0; j < g->win_w * C; j++) d[j] += s[j];
            continue;
          }
          for (size_t kx = 0; kx < g->win_w; kx++) {
            size_t ix = ix0 + kx;
            if (ix >= g->in_w) continue;
            float *restrict d = img + (iy * g->in_w + ix) * C;
            for (size_t c = 0; c < C; c++) d[c] += s[kx * C + c];
          }
        }
      }
    }
  }
}

/* The col matrix of images [n0, n0 + cnt) of x: x itself for a pointwise convolution, else
 * their im2col, written into ws (which must hold it). */
static const float *chunk_col(const ts_conv2d_t *g, const float *x, size_t n0, size_t cnt,
                              float *ws) {
  const float *col = x + n0 * image_in(g);
  if (is_pointwise(g)) return col;
  im2col(g, cnt, col, ws);
  return ws;
}

/* Row-major sgemm on sizes the geometry bounds keep within int. */
static void sgemm(bool ta, bool tb, size_t m, size_t n, size_t kk, const float *a, size_t lda,
                  const float *b, size_t ldb, float beta, float *c, size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
              (int)n, (int)kk, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* The checks every convolution kernel starts with; *nb = images per chunk. */
static int conv_args(const ts_conv2d_t *g, const void *p1, const void *p2, const void *p3,
                     const void *ws, size_t ws_bytes, size_t *nb) {
  if (!geometry_ok(g) || !p1 || !p2 || !p3) return TS_EINVAL;
  if (is_pointwise(g)) {
    *nb = g->batch;
    return 0;
  }
  if (!ws) return TS_EINVAL;
  *nb = chunk_images(g, ws_bytes);
  return *nb ? 0 : TS_EINVAL;
}

int ts_cpu_conv2d_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *w,
                      float *y, void *ws, size_t ws_bytes) {
  (void)k;
  size_t nb;
  int rc = conv_args(g, x, w, y, ws, ws_bytes, &nb);
  if (rc < 0) return rc;
  if (ts_cpu_direct_fits(g, ws_bytes)) {
    ts_cpu_direct_fwd(g, x, w, y, ws);
    return 0;
  }
  size_t K = taps(g), pix = g->out_h * g->out_w;
  for (size_t n0 = 0; n0 < g->batch; n0 += nb) {
    size_t cnt = g->batch - n0 < nb ? g->batch - n0 : nb;
    sgemm(false, false, cnt * pix, g->out_c, K, chunk_col(g, x, n0, cnt, ws), K, w, g->out_c,
          0.0f, y + n0 * image_out(g), g->out_c);
  }
  return 0;
}

int ts_cpu_conv2d_bwd_filter(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x,
                             const float *dy, float *dw, void *ws, size_t ws_bytes) {
  (void)k;
  size_t nb;
  int rc = conv_args(g, x, dy, dw, ws, ws_bytes, &nb);
  if (rc < 0) return rc;
  if (ts_cpu_direct_fits(g, ws_bytes)) {
    ts_cpu_direct_bwd_filter(g, x, dy, dw, ws);
    return 0;
  }
  size_t K = taps(g), pix = g->out_h * g->out_w;
  for (size_t n0 = 0; n0 < g->batch; n0 += nb) {
    size_t cnt = g->batch - n0 < nb ? g->batch - n0 : nb;
    sgemm(true, false, K, g->out_c, cnt * pix, chunk_col(g, x, n0, cnt, ws), K,
          dy + n0 * image_out(g), g->out_c, n0 == 0 ? 0.0f : 1.0f, dw, g->out_c);
  }
  return 0;
}

int ts_cpu_conv2d_bwd_data(const ts_kernels_t *k, const ts_conv2d_t *g, const float *w,
                           const float *dy, float *dx, void *ws, size_t ws_bytes) {
  (void)k;
  size_t nb;
  int rc = conv_args(g, w, dy, dx, ws, ws_bytes, &nb);
  if (rc < 0) return rc;
  size_t K = taps(g), pix = g->out_h * g->out_w;
  if (is_pointwise(g)) { /* dx = dy w^T directly: col is x */
    sgemm(false, true, g->batch * pix, K, g->out_c, dy, g->out_c, w, g->out_c, 0.0f, dx, K);
    return 0;
  }
  if (ts_cpu_direct_fits(g, ws_bytes)) {
    ts_cpu_direct_bwd_data(g, w, dy, dx, ws);
    return 0;
  }
  memset(dx, 0, g->batch * image_in(g) * sizeof(float));
  for (size_t n0 = 0; n0 < g->batch; n0 += nb) {
    size_t cnt = g->batch - n0 < nb ? g->batch - n0 : nb;
    sgemm(false, true, cnt * pix, K, g->out_c, dy + n0 * image_out(g), g->out_c, w, g->out_c, 0.0f,
          ws, K);
    col2im_add(g, cnt, ws, dx + n0 * image_in(g));
  }
  return 0;
}

/* Max pooling, fast path: every window inside the input across (no padding left or right),
 * and an output row of at most ROW_MAX floats. One output row at a time, each window tap
 * (ky, kx) in turn is compared with the whole row's running maximum: a loop over the row's
 * out_w * C floats, which reads tap kx of element j = ox * C + c at col[j] + kx * C with
 * col[j] = ox * stride_w * C + c (a gather where stride_w > 1), so it vectorises whatever C
 * is (AVX-512 where the CPU has it). The taps go in the same order as the general loop below,
 * so ties resolve the same way. */
#define ROW_MAX 2048

static bool pool_rows_fit(const ts_conv2d_t *g) {
  return g->pad_left == 0 && (g->out_w - 1) * g->stride_w + g->win_w <= g->in_w &&
         g->out_w * g->in_c <= ROW_MAX;
}

/* One window tap against the running maximum of an output row of `row` floats: src is the
 * tap's input row, base its offset in the image. first: the row's first tap (copy it). */
TS_CPU_BODY void pool_tap_body(size_t row, const int32_t *restrict col, const float *restrict src,
                               int32_t base, bool first, float *restrict best,
                               int32_t *restrict at) {
  for (size_t j = 0; j < row; j++) {
    float v = src[col[j]];
    if (first || v > best[j]) { /* strict: the first maximum wins ties */
      best[j] = v;
      at[j] = base + col[j];
    }
  }
}

#ifdef TS_CPU_MULTI_ISA
#include <immintrin.h>

/* The same with AVX-512: 16 elements per step, a gather for the tap, a masked tail. GCC does
 * not vectorise the loop above (the gather and the two selects). */
TS_CPU_TARGET_AVX512 static void pool_tap_avx512(size_t row, const int32_t *restrict col,
                                                 const float *restrict src, int32_t base,
                                                 bool first, float *restrict best,
                                                 int32_t *restrict at) {
  __m512i vbase = _mm512_set1_epi32(base);
  for (size_t j = 0; j < row; j += 16) {
    __mmask16 live = row - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (row - j)) - 1);
    __m512i idx = _mm512_maskz_loadu_epi32(live, col + j);
    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx, src, 4);
    __m512i here = _mm512_add_epi32(vbase, idx);
    __mmask16 take = live;
    if (!first) take &= _mm512_cmp_ps_mask(v, _mm512_maskz_loadu_ps(live, best + j), _CMP_GT_OQ);
    _mm512_mask_storeu_ps(best + j, take, v);
    _mm512_mask_storeu_epi32(at + j, take, here);
  }
}
#endif

TS_CPU_DISPATCH_OWN_AVX512(pool_tap, pool_tap_avx512,
                           (size_t row, const int32_t *col, const float *src, int32_t base,
                            bool first, float *best, int32_t *at),
                           (row, col, src, base, first, best, at))

static void pool_rows(const ts_conv2d_t *g, const float *x, float *y, int32_t *argmax) {
  size_t C = g->in_c, row = g->out_w * C;
  int32_t col[ROW_MAX];
  for (size_t j = 0; j < row; j++) col[j] = (int32_t)(j / C * g->stride_w * C + j % C);
  for (size_t n = 0; n < g->batch; n++) {
    const float *img = x + n * image_in(g);
    for (size_t oy = 0; oy < g->out_h; oy++) {
      size_t o = (n * g->out_h + oy) * row;
      bool first = true; /* every window has an input row (ts_conv.h) */
      for (size_t ky = 0; ky < g->win_h; ky++) {
        size_t iy = oy * g->stride_h + ky - g->pad_top; /* wraps when in the padding */
        if (iy >= g->in_h) continue;
        for (size_t kx = 0; kx < g->win_w; kx++) {
          int32_t base = (int32_t)((iy * g->in_w + kx) * C);
          pool_tap(row, col, img + base, base, first, y + o, argmax + o);
          first = false;
        }
      }
    }
  }
}

int ts_cpu_maxpool_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, float *y,
                       int32_t *argmax) {
  (void)k;
  if (!geometry_ok(g) || g->out_c != g->in_c || !x || !y || !argmax) return TS_EINVAL;
  if (pool_rows_fit(g)) {
    pool_rows(g, x, y, argmax);
    return 0;
  }
  size_t C = g->in_c;
  for (size_t n = 0; n < g->batch; n++) {
    const float *restrict img = x + n * image_in(g);
    for (size_t oy = 0; oy < g->out_h; oy++) {
      for (size_t ox = 0; ox < g->out_w; ox++) {
        size_t o = ((n * g->out_h + oy) * g->out_w + ox) * C;
        float *restrict best = y + o;
        int32_t *restrict at = argmax + o;
        bool first = true;
        for (size_t ky = 0; ky < g->win_h; ky++) {
          size_t iy = oy * g->stride_h + ky - g->pad_top;
          if (iy >= g->in_h) continue;
          for (size_t kx = 0; kx < g->win_w; kx++) {
            size_t ix = ox * g->stride_w + kx - g->pad_left;
            if (ix >= g->in_w) continue;
            size_t pos = (iy * g->in_w + ix) * C;
            const float *restrict v = img + pos;
            if (first) { /* every window has an input element (ts_conv.h) */
              for (size_t c = 0; c < C; c++) {
                best[c] = v[c];
                at[c] = (int32_t)(pos + c);
              }
              first = false;
              continue;
            }
            for (size_t c = 0; c < C; c++) {
              bool more = v[c] > best[c]; /* strict: the first maximum wins ties */
              best[c] = more ? v[c] : best[c];
              at[c] = more ? (int32_t)(pos + c) : at[c];
            }
          }
        }
      }
    }
  }
  return 0;
}

int ts_cpu_maxpool_bwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *y,
                       const float *dy, const int32_t *argmax, float *dx) {
  (void)k;
  (void)x;
  (void)y;
  if (!geometry_ok(g) || g->out_c != g->in_c || !dy || !argmax || !dx) return TS_EINVAL;
  size_t in = image_in(g), out = image_out(g);
  memset(dx, 0, g->batch * in * sizeof(float));
  for (size_t n = 0; n < g->batch; n++) {
    float *img = dx + n * in;
    const float *d = dy + n * out;
    const int32_t *at = argmax + n * out;
    for (size_t i = 0; i < out; i++) {
      if (at[i] < 0 || (size_t)at[i] >= in) return TS_EINVAL; /* not from maxpool_fwd */
      img[at[i]] += d[i];
    }
  }
  return 0;
}

/* Not restrict: y may be a. */
int ts_cpu_mul(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y) {
  (void)k;
  if (n && (!a || !b || !y)) return TS_EINVAL;
  for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
  return 0;
}
