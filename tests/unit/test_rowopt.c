/*
 * Row-wise lazy optimizers (server/ts_rowopt.h): every kind against a double-precision
 * reference written from the formulas of its header, over many steps of random rows, with
 * rows touched at different times (adam's per-row step), within float rounding of 150-odd
 * updates (5e-5 relative; ftrl, whose weight is a quotient of accumulated sums, 1e-4); sgd on a
 * sync step's sum with scale 1/W equals the mean's update; a new row's state.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "ts_rowopt.h"

#define DIM 32
#define STEPS 200

static uint64_t rng = 88172645463325252ULL;
static double uniform(void) { /* xorshift64 in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* The reference: one update in double. */
static void reference(const ts_rowopt_t *o, double *w, const double *g, double scale, double *s0,
                      double *s1, uint64_t t) {
  double lr = o->lr, eps = o->epsilon, l1 = o->l1, l2 = o->l2, beta = o->beta;
  for (int j = 0; j < DIM; j++) {
    double gj = g[j] * scale;
    switch (o->kind) {
      case TS_ROWOPT_SGD:
        w[j] -= lr * gj;
        break;
      case TS_ROWOPT_ADAGRAD:
        s0[j] += gj * gj;
        w[j] -= lr * gj / sqrt(s0[j] + eps);
        break;
      case TS_ROWOPT_ADAM: {
        double b1 = (double)o->beta1, b2 = (double)o->beta2;
        s0[j] = b1 * s0[j] + (1 - b1) * gj;
        s1[j] = b2 * s1[j] + (1 - b2) * gj * gj;
        double step = lr * sqrt(1 - pow(b2, (double)t)) / (1 - pow(b1, (double)t));
        w[j] -= step * s0[j] / (sqrt(s1[j]) + eps);
        break;
      }
      case TS_ROWOPT_FTRL: {
        double n2 = s1[j] + gj * gj;
        s0[j] += gj - (sqrt(n2) - sqrt(s1[j])) / lr * w[j];
        s1[j] = n2;
        double z = s0[j];
        w[j] = fabs(z) <= l1 ? 0.0 : ((z > 0 ? l1 : -l1) - z) / ((beta + sqrt(n2)) / lr + 2.0 * l2);
        break;
      }
    }
  }
}

/* Largest |a - b| / max(|b|, floor) over the row. */
static double rel_diff(const float *a, const double *b, double floor) {
  double worst = 0;
  for (int j = 0; j < DIM; j++) {
    double d = fabs((double)a[j] - b[j]) / fmax(fabs(b[j]), floor);
    if (d > worst) worst = d;
  }
  return worst;
}

static void against_reference(const ts_rowopt_t *o, double tolerance) {
  float w[DIM], s0[DIM], s1[DIM], g[DIM];
  double wd[DIM], s0d[DIM], s1d[DIM], gd[DIM];
  for (int j = 0; j < DIM; j++) wd[j] = w[j] = (float)(0.05 * uniform());
  int nstate = ts_rowopt_state_buffers(o);
  ts_rowopt_init_state(o, nstate > 0 ? s0 : NULL, nstate > 1 ? s1 : NULL, DIM);
  for (int j = 0; j < DIM; j++) {
    s0d[j] = nstate > 0 ? s0[j] : 0;
    s1d[j] = nstate > 1 ? s1[j] : 0;
  }
  uint64_t t = 0;
  for (int step = 0; step < STEPS; step++) {
    /* A lazy row is touched on some steps only: t counts its own updates. */
    if (uniform() < -0.5) continue;
    t++;
    for (int j = 0; j < DIM; j++) gd[j] = g[j] = (float)(0.1 * uniform());
    ts_rowopt_apply(o, w, g, 0.5f, DIM, s0, s1, t);
    reference(o, wd, gd, 0.5, s0d, s1d, t);
  }
  double d = rel_diff(w, wd, 1e-3);
  if (d > tolerance)
    fail_msg("kind %d: relative difference %.3g after %llu updates", o->kind, d,
             (unsigned long long)t);
}

static void test_sgd(void **state) {
  (void)state;
  ts_rowopt_t o;
  ts_rowopt_defaults(&o, TS_ROWOPT_SGD, 0.1f);
  against_reference(&o, 5e-5);
}

static void test_adagrad(void **state) {
  (void)state;
  ts_rowopt_t o;
  ts_rowopt_defaults(&o, TS_ROWOPT_ADAGRAD, 0.05f);
  against_reference(&o, 5e-5);
}

static void test_adam(void **state) {
  (void)state;
  ts_rowopt_t o;
  ts_rowopt_defaults(&o, TS_ROWOPT_ADAM, 0.001f);
  against_reference(&o, 5e-5);
}

static void test_ftrl(void **state) {
  (void)state;
  ts_rowopt_t o;
  ts_rowopt_defaults(&o, TS_ROWOPT_FTRL, 0.05f);
  o.l1 = 0.001f;
  o.l2 = 0.01f;
  o.beta = 0.1f;
  against_reference(&o, 1e-4);
  /* A large l1 keeps every weight at 0: FTRL's sparsity. */
  o.l1 = 10.0f;
  float w[DIM], s0[DIM], s1[DIM], g[DIM];
  for (int j = 0; j < DIM; j++) {
    w[j] = 0.0f;
    g[j] = (float)uniform();
  }
  ts_rowopt_init_state(&o, s0, s1, DIM);
  for (int k = 1; k <= 5; k++) ts_rowopt_apply(&o, w, g, 1.0f, DIM, s0, s1, (uint64_t)k);
  for (int j = 0; j < DIM; j++) assert_true(w[j] == 0.0f);
}

/* Sync: the sum of W workers' gradients with scale 1/W updates as their mean would. */
static void test_scale_is_mean(void **state) {
  (void)state;
  ts_rowopt_t o;
  ts_rowopt_defaults(&o, TS_ROWOPT_SGD, 0.5f);
  float a[DIM], b[DIM], sum[DIM], mean[DIM];
  for (int j = 0; j < DIM; j++) {
    float g1 = (float)uniform(), g2 = (float)uniform();
    sum[j] = g1 + g2;
    mean[j] = sum[j] * 0.5f;
    a[j] = b[j] = 1.0f;
  }
  ts_rowopt_apply(&o, a, sum, 0.5f, DIM, NULL, NULL, 1);
  ts_rowopt_apply(&o, b, mean, 1.0f, DIM, NULL, NULL, 1);
  assert_memory_equal(a, b, sizeof a);
}

static void test_state(void **state) {
  (void)state;
  ts_rowopt_t o;
  float s0[4], s1[4];
  ts_rowopt_defaults(&o, TS_ROWOPT_SGD, 0.1f);
  assert_int_equal(ts_rowopt_state_buffers(&o), 0);
  ts_rowopt_defaults(&o, TS_ROWOPT_ADAGRAD, 0.1f);
  assert_int_equal(ts_rowopt_state_buffers(&o), 1);
  ts_rowopt_init_state(&o, s0, NULL, 4);
  assert_true(s0[3] == 0.1f);
  ts_rowopt_defaults(&o, TS_ROWOPT_FTRL, 0.1f);
  assert_int_equal(ts_rowopt_state_buffers(&o), 2);
  ts_rowopt_init_state(&o, s0, s1, 4);
  assert_true(s0[0] == 0.0f && s1[0] == 0.1f);
  ts_rowopt_defaults(&o, TS_ROWOPT_ADAM, 0.1f);
  ts_rowopt_init_state(&o, s0, s1, 4);
  assert_true(s0[2] == 0.0f && s1[2] == 0.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd),           cmocka_unit_test(test_adagrad),
      cmocka_unit_test(test_adam),          cmocka_unit_test(test_ftrl),
      cmocka_unit_test(test_scale_is_mean), cmocka_unit_test(test_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
