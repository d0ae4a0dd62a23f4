/*
 * Window geometry with TensorFlow's padding arithmetic (ts_conv.h).
 */
#include "ts_conv.h"

#include <stdint.h>
#include <string.h>

#include "ts_err.h"

int ts_conv_output_size(size_t in, size_t win, size_t stride, ts_padding_t padding, size_t *out,
                        size_t *pad_before) {
  if (!out || !pad_before || in == 0 || win == 0 || stride == 0) return TS_EINVAL;
  if (padding == TS_PAD_VALID) {
    if (win > in) return TS_EINVAL;
    *out = (in - win) / stride + 1; /* = ceil((in - win + 1) / stride) */
    *pad_before = 0;
    return 0;
  }
  if (padding == TS_PAD_SAME) {
    size_t o = (in + stride - 1) / stride;
    size_t span = (o - 1) * stride + win;
    size_t total = span > in ? span - in : 0;
    *out = o;
    *pad_before = total / 2;
    return 0;
  }
  return TS_EINVAL;
}

static int dim_ok(size_t d) {
  return d >= 1 && d <= TS_CONV_MAX_DIM;
}

int ts_conv_geometry(ts_conv2d_t *g, size_t batch, size_t in_h, size_t in_w, size_t in_c,
                     size_t win_h, size_t win_w, size_t stride_h, size_t stride_w,
                     ts_padding_t padding, size_t out_c) {
  if (!g) return TS_EINVAL;
  memset(g, 0, sizeof *g);
  if (out_c == 0) out_c = in_c;
  if (batch < 1 || batch > TS_CONV_MAX_BATCH || !dim_ok(in_h) || !dim_ok(in_w) || !dim_ok(in_c) ||
      !dim_ok(win_h) || !dim_ok(win_w) || !dim_ok(stride_h) || !dim_ok(stride_w) || !dim_ok(out_c))
    return TS_EINVAL;
  size_t oh, ow, pt, pl;
  int rc = ts_conv_output_size(in_h, win_h, stride_h, padding, &oh, &pt);
  if (rc == 0) rc = ts_conv_output_size(in_w, win_w, stride_w, padding, &ow, &pl);
  if (rc < 0) return rc;
  /* Every factor is at most 2^16, so each product of two or three of them fits 64 bits. */
  if (in_h * in_w > TS_CONV_MAX_IMAGE / in_c || oh * ow > TS_CONV_MAX_IMAGE / out_c ||
      win_h * win_w * in_c > TS_CONV_MAX_IMAGE / out_c ||
      oh * ow > TS_CONV_MAX_IMAGE / (win_h * win_w * in_c))
    return TS_EINVAL;
  *g = (ts_conv2d_t){.batch = batch,
                     .in_h = in_h,
                     .in_w = in_w,
                     .in_c = in_c,
                     .win_h = win_h,
                     .win_w = win_w,
                     .stride_h = stride_h,
                     .stride_w = stride_w,
                     .out_h = oh,
                     .out_w = ow,
                     .out_c = out_c,
                     .pad_top = pt,
                     .pad_left = pl};
  return 0;
}

const char *ts_conv_padding_name(ts_padding_t p) {
  switch (p) {
    case TS_PAD_VALID:
      return "valid";
    case TS_PAD_SAME:
      return "same";
  }
  return NULL;
}

int ts_conv_parse_padding(const char *s, ts_padding_t *out) {
  if (!s || !out) return -1;
  if (strcmp(s, "valid") == 0) {
    *out = TS_PAD_VALID;
    return 0;
  }
  if (strcmp(s, "same") == 0) {
    *out = TS_PAD_SAME;
    return 0;
  }
  return -1;
}
