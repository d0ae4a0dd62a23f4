/*
 * Row-wise lazy optimizers (ts_rowopt.h). Each loop is over one row; float arithmetic as
 * written (ISO C mode keeps -ffp-contract=off), so a result depends only on the row's own
 * history and the unit tests compare it with a double-precision reference.
 */
#include "ts_rowopt.h"

#include <math.h>

void ts_rowopt_defaults(ts_rowopt_t *o, ts_rowopt_kind_t kind, float lr) {
  *o = (ts_rowopt_t){.kind = kind, .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .epsilon = 1e-7f};
  if (kind == TS_ROWOPT_ADAGRAD) o->initial_accumulator = 0.1f;
  if (kind == TS_ROWOPT_FTRL) o->initial_accumulator = 0.1f;
}

int ts_rowopt_state_buffers(const ts_rowopt_t *o) {
  switch (o->kind) {
    case TS_ROWOPT_SGD:
      return 0;
    case TS_ROWOPT_ADAGRAD:
      return 1;
    case TS_ROWOPT_ADAM:
    case TS_ROWOPT_FTRL:
      return 2;
  }
  return 0;
}

void ts_rowopt_init_state(const ts_rowopt_t *o, float *s0, float *s1, size_t dim) {
  float a0 = o->kind == TS_ROWOPT_ADAGRAD ? o->initial_accumulator : 0.0f;
  float a1 = o->kind == TS_ROWOPT_FTRL ? o->initial_accumulator : 0.0f;
  for (size_t j = 0; s0 && j < dim; j++) s0[j] = a0;
  for (size_t j = 0; s1 && j < dim; j++) s1[j] = a1;
}

void ts_rowopt_apply(const ts_rowopt_t *o, float *restrict w, const float *restrict g, float scale,
                     size_t dim, float *restrict s0, float *restrict s1, uint64_t t) {
  const float lr = o->lr;
  switch (o->kind) {
    case TS_ROWOPT_SGD:
      for (size_t j = 0; j < dim; j++) w[j] -= lr * (g[j] * scale);
      break;
    case TS_ROWOPT_ADAGRAD:
      for (size_t j = 0; j < dim; j++) {
        float gj = g[j] * scale;
        s0[j] += gj * gj;
        w[j] -= lr * gj / sqrtf(s0[j] + o->epsilon);
      }
      break;
    case TS_ROWOPT_ADAM: {
      double tt = (double)(t ? t : 1);
      float step = (float)((double)lr * sqrt(1.0 - pow((double)o->beta2, tt)) /
                           (1.0 - pow((double)o->beta1, tt)));
      const float b1 = o->beta1, b2 = o->beta2;
      for (size_t j = 0; j < dim; j++) {
        float gj = g[j] * scale;
        s0[j] = b1 * s0[j] + (1.0f - b1) * gj;
        s1[j] = b2 * s1[j] + (1.0f - b2) * gj * gj;
        w[j] -= step * s0[j] / (sqrtf(s1[j]) + o->epsilon);
      }
      break;
    }
    case TS_ROWOPT_FTRL:
      for (size_t j = 0; j < dim; j++) {
        float gj = g[j] * scale;
        float n = s1[j], n2 = n + gj * gj;
        float sigma = (sqrtf(n2) - sqrtf(n)) / lr;
        s0[j] += gj - sigma * w[j];
        s1[j] = n2;
        float z = s0[j];
        if (fabsf(z) <= o->l1) {
          w[j] = 0.0f;
        } else {
          float quad = (o->beta + sqrtf(n2)) / lr + 2.0f * o->l2;
          w[j] = ((z > 0.0f ? o->l1 : -o->l1) - z) / quad;
        }
      }
      break;
  }
}
