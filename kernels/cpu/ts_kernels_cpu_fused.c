/*
 * The CPU back end's fused bias + ReLU kernels (bias_relu, relu_bwd_bias_grad of
 * ts_kernels.h): one pass over a layer's output where bias_add + relu_fwd and relu_bwd +
 * bias_grad make two each.
 *
 * Narrow rows. A convolution's output is a matrix of batch * out_h * out_w rows of out_c
 * columns, and out_c is small (6 for LeNet-5's first layer): a loop along one row is too
 * short to vectorise. So for up to TILE_MAX_COLS columns the matrix is walked in blocks of
 * TILE_ROWS rows, which are contiguous, against the bias repeated TILE_ROWS times (and the
 * bias gradient is summed into TILE_ROWS copies, folded at the end). Wider rows go row by
 * row. The loops are compiled for each vector instruction set (TS_CPU_DISPATCH).
 */
#include "ts_err.h"
#include "ts_kernels_cpu_int.h"

#define TILE_ROWS 16
#define TILE_MAX_COLS 64

/* A block of `len` floats, a whole number of rows (or the tail of the matrix), against the
 * first len floats of the tiled bias t. */
TS_CPU_BODY void bias_relu_block(size_t len, const float *restrict t, float *restrict y) {
  for (size_t j = 0; j < len; j++) {
    float v = y[j] + t[j];
    y[j] = v > 0.0f ? v : 0.0f;
  }
}

TS_CPU_BODY void relu_grad_block(size_t len, const float *restrict y, const float *restrict dy,
                                 float *restrict dx, float *restrict acc) {
  for (size_t j = 0; j < len; j++) {
    float g = dy[j]; /* read unconditionally: the select vectorises, a branch would not */
    float d = y[j] > 0.0f ? g : 0.0f;
    dx[j] = d;
    acc[j] += d;
  }
}

/* The block length: TILE_ROWS rows of narrow columns, else one row. */
static size_t block_len(size_t cols) {
  return cols <= TILE_MAX_COLS ? cols * TILE_ROWS : cols;
}

TS_CPU_BODY void bias_relu_rows_body(size_t rows, size_t cols, const float *bias, float *y) {
  float tile[TILE_MAX_COLS * TILE_ROWS];
  const float *t = bias;
  size_t len = block_len(cols), total = rows * cols, i = 0;
  if (len != cols) {
    for (size_t j = 0; j < len; j++) tile[j] = bias[j % cols];
    t = tile;
  }
  for (; i + len <= total; i += len) bias_relu_block(len, t, y + i);
  bias_relu_block(total - i, t, y + i);
}

TS_CPU_BODY void relu_bias_grad_rows_body(size_t rows, size_t cols, const float *y, const float *dy,
                                          float *dx, float *db) {
  float tile[TILE_MAX_COLS * TILE_ROWS];
  size_t len = block_len(cols), total = rows * cols, i = 0;
  float *acc = len != cols ? tile : db; /* wide rows sum straight into db */
  for (size_t j = 0; j < len; j++) acc[j] = 0.0f;
  for (; i + len <= total; i += len) relu_grad_block(len, y + i, dy + i, dx + i, acc);
  relu_grad_block(total - i, y + i, dy + i, dx + i, acc);
  if (acc == db) return;
  for (size_t c = 0; c < cols; c++) {
    float s = 0.0f;
    for (size_t r = 0; r < TILE_ROWS; r++) s += tile[r * cols + c];
    db[c] = s;
  }
}

TS_CPU_DISPATCH(bias_relu_rows, (size_t rows, size_t cols, const float *bias, float *y),
                (rows, cols, bias, y))
TS_CPU_DISPATCH(relu_bias_grad_rows,
                (size_t rows, size_t cols, const float *y, const float *dy, float *dx, float *db),
                (rows, cols, y, dy, dx, db))

int ts_cpu_bias_relu(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias, float *y) {
  (void)k;
  if (rows == 0 || cols == 0) return 0;
  if (!bias || !y) return TS_EINVAL;
  bias_relu_rows(rows, cols, bias, y);
  return 0;
}

int ts_cpu_relu_bwd_bias_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *y,
                              const float *dy, float *dx, float *db) {
  (void)k;
  if (cols && !db) return TS_EINVAL;
  if (rows && cols && (!y || !dy || !dx)) return TS_EINVAL;
  if (rows == 0) {
    for (size_t c = 0; c < cols; c++) db[c] = 0.0f;
    return 0;
  }
  relu_bias_grad_rows(rows, cols, y, dy, dx, db);
  return 0;
}
