/*
 * Row-wise lazy optimizers for embedding tables (docs/architecture.md, "Tables"): one update
 * of one row of width dim from its gradient, touching that row's value and state only, so a
 * step costs the rows a batch touched, not the table.
 *
 *   sgd      w -= lr g
 *   adagrad  a += g^2; w -= lr g / sqrt(a + eps)              (Keras's Adagrad; a starts at
 *            initial_accumulator)
 *   adam     lazy Adam with the row's own step t for the bias correction: m = b1 m + (1 - b1) g,
 *            v = b2 v + (1 - b2) g^2, w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)
 *            (TensorFlow Addons' LazyAdam, which corrects with the global step instead)
 *   ftrl     FTRL-proximal as TensorFlow's ApplyFtrlV2 with lr_power -1/2: n' = n + g^2,
 *            z += g - (sqrt(n') - sqrt(n)) / lr w, n = n', then w = 0 when |z| <= l1, else
 *            w = (sign(z) l1 - z) / ((beta + sqrt(n)) / lr + 2 l2); n starts at
 *            initial_accumulator
 *
 * `scale` multiplies the gradient first (1/W for a sync step's sum of W workers' rows). The
 * state is s0 (and s1) of dim floats each, beside the row: adagrad's accumulator; adam's m
 * and v; ftrl's z and n. Pure: no allocation, no I/O.
 */
#ifndef TS_ROWOPT_H
#define TS_ROWOPT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  TS_ROWOPT_SGD = 0,
  TS_ROWOPT_ADAGRAD = 1,
  TS_ROWOPT_ADAM = 2,
  TS_ROWOPT_FTRL = 3,
} ts_rowopt_kind_t;

typedef struct {
  ts_rowopt_kind_t kind;
  float lr;
  float beta1, beta2, epsilon; /* adam; epsilon also adagrad's */
  float initial_accumulator;   /* adagrad's a, ftrl's n at a row's creation */
  float l1, l2, beta;          /* ftrl */
} ts_rowopt_t;

/* Defaults of each kind, as Keras's optimizers have them (learning rate lr). */
void ts_rowopt_defaults(ts_rowopt_t *o, ts_rowopt_kind_t kind, float lr);

/* State buffers of dim floats a row needs: 0 (sgd), 1 (adagrad) or 2 (adam, ftrl). */
int ts_rowopt_state_buffers(const ts_rowopt_t *o);

/* A new row's state: zeros, and the accumulator at initial_accumulator (adagrad's s0,
 * ftrl's n in s1). s0/s1 may be NULL where the kind has no such buffer. */
void ts_rowopt_init_state(const ts_rowopt_t *o, float *s0, float *s1, size_t dim);

/* One update of row w[0..dim) from gradient g; t is the row's 1-based update count (adam's
 * bias correction). */
void ts_rowopt_apply(const ts_rowopt_t *o, float *restrict w, const float *restrict g, float scale,
                     size_t dim, float *restrict s0, float *restrict s1, uint64_t t);

#endif
