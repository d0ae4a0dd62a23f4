/*
 * The geometry of a 2-D window op (convolution or pooling) over NHWC tensors, with
 * TensorFlow's padding arithmetic. Plain C, shared by every back end and by the model, so a
 * shape is computed once and the same way everywhere.
 *
 * Glossary.
 *   NHWC     a batch of images stored image after image, row after row, pixel after pixel,
 *            channels innermost: element (n, y, x, c) at ((n * H + y) * W + x) * C + c
 *            (TensorFlow's default data_format).
 *   HWIO     a convolution kernel stored as [win_h][win_w][in_c][out_c] (TensorFlow's
 *            conv2d/kernel layout): read as a (win_h * win_w * in_c) x out_c row-major matrix
 *            it multiplies the im2col rows directly.
 *   valid    no padding: out = ceil((in - win + 1) / stride); the window must fit the input.
 *   same     out = ceil(in / stride); the total padding max((out - 1) * stride + win - in, 0)
 *            is split with the smaller half BEFORE (top, left) and the rest after, exactly as
 *            TensorFlow's GetWindowedOutputSize. Padded positions are zeros for a convolution
 *            and are skipped by max pooling (every window holds at least one input element).
 */
#ifndef TS_CONV_H
#define TS_CONV_H

#include <stddef.h>
#include <stdint.h>

/* Bounds that keep every product of the geometry inside int (BLAS, int32 argmax indices). */
#define TS_CONV_MAX_DIM (1 << 16) /* one of H, W, C, a window side or a stride */
/* Elements of one image, in or out; also bounds one image's im2col matrix and a kernel. */
#define TS_CONV_MAX_IMAGE ((size_t)INT32_MAX)
#define TS_CONV_MAX_BATCH (1 << 20)

typedef enum { TS_PAD_VALID = 1, TS_PAD_SAME = 2 } ts_padding_t;

typedef struct {
  size_t batch;            /* N */
  size_t in_h, in_w, in_c; /* input H, W, C */
  size_t win_h, win_w;     /* kernel (convolution) or window (pooling) */
  size_t stride_h, stride_w;
  size_t out_h, out_w, out_c; /* output H, W, C: out_c = filters, or in_c for pooling */
  size_t pad_top, pad_left;   /* padding before; the rest (if any) is after */
} ts_conv2d_t;

/* Fill *g for a window op: out_c is the number of filters of a convolution, or 0 for pooling
 * (out_c = in_c). Returns 0, or TS_EINVAL for a size of 0 or above the bounds, an unknown
 * padding, a valid-padded window larger than its input (the caller names the layer), or a
 * geometry whose products would exceed TS_CONV_MAX_IMAGE. */
int ts_conv_geometry(ts_conv2d_t *g, size_t batch, size_t in_h, size_t in_w, size_t in_c,
                     size_t win_h, size_t win_w, size_t stride_h, size_t stride_w,
                     ts_padding_t padding, size_t out_c);

/* One side of the arithmetic above: *out and *pad_before for an input of `in`, a window and a
 * stride (all >= 1). Returns 0, or TS_EINVAL when a valid window does not fit. */
int ts_conv_output_size(size_t in, size_t win, size_t stride, ts_padding_t padding, size_t *out,
                        size_t *pad_before);

/* "valid" / "same"; NULL for anything else (parse returns -1 for an unknown name). */
const char *ts_conv_padding_name(ts_padding_t p);
int ts_conv_parse_padding(const char *s, ts_padding_t *out);

#endif
