/*
 * The shard's optimizers (server/ts_optim.h) against a plain double-precision reference:
 * SGD, momentum (TensorFlow: v = m v + g; w -= lr v) and Adam (TensorFlow's bias-corrected
 * form, t = 1-based update count), over several steps and sizes 0, 1, 17 and 1000, with the
 * `scale` argument; the state-buffer count; and the finiteness check with NaN, infinities,
 * -0.0, denormals and FLT_MAX at various positions; the learning rate's schedules
 * (exponential, staircase, cosine with a floor) against their formulas.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_config.h"
#include "ts_optim.h"

#define GUARD 4
#define GUARD_VALUE 12345.0f

static const size_t sizes[] = {0, 1, 17, 1000};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Deterministic values in [-1, 1). */
static uint64_t rng_state;
static float rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(rng_state >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static ts_optim_t make(ts_optimizer_t kind) {
  ts_optim_t o = {.kind = kind,
                  .lr = 0.05f,
                  .momentum = 0.9f,
                  .beta1 = 0.9f,
                  .beta2 = 0.999f,
                  .epsilon = 1e-8f};
  return o;
}

/* One reference step in double precision. */
static void ref_step(const ts_optim_t *o, double *w, const float *g, double scale, size_t n,
                     double *s0, double *s1, uint64_t t) {
  const double lr = (double)o->lr;
  for (size_t i = 0; i < n; i++) {
    double gi = scale * (double)g[i];
    switch (o->kind) {
      case TS_OPT_SGD:
        w[i] -= lr * gi;
        break;
      case TS_OPT_MOMENTUM:
        s0[i] = (double)o->momentum * s0[i] + gi;
        w[i] -= lr * s0[i];
        break;
      case TS_OPT_ADAM: {
        double b1 = (double)o->beta1, b2 = (double)o->beta2;
        double lr_t = lr * sqrt(1.0 - pow(b2, (double)t)) / (1.0 - pow(b1, (double)t));
        s0[i] = b1 * s0[i] + (1.0 - b1) * gi;
        s1[i] = b2 * s1[i] + (1.0 - b2) * gi * gi;
        w[i] -= lr_t * s0[i] / (sqrt(s1[i]) + (double)o->epsilon);
        break;
      }
    }
  }
}

static void check_close(const char *what, size_t n, const float *got, const double *want,
                        double tol, int step) {
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= tol * (1.0 + fabs(want[i]))))
      fail_msg("%s n=%zu step %d: element %zu is %.9g, reference %.9g (diff %.3g)", what, n, step,
               i, (double)got[i], want[i], d);
  }
}

static void check_guard(const char *what, const float *buf, size_t n) {
  if (!buf) return;
  for (size_t i = n; i < n + GUARD; i++)
    if (buf[i] != GUARD_VALUE)
      fail_msg("%s: element %zu past n=%zu was written: %.9g", what, i, n, (double)buf[i]);
}

static float *alloc_guarded(size_t n) {
  float *b = calloc(n + GUARD, sizeof *b);
  assert_non_null(b);
  for (size_t i = n; i < n + GUARD; i++) b[i] = GUARD_VALUE;
  return b;
}

/* Run `steps` updates of optimizer `kind` at size n with the given scale against the
 * reference. State buffers are passed only when the optimizer needs them (NULL otherwise). */
static void run_case(ts_optimizer_t kind, size_t n, float scale, int steps, double tol) {
  ts_optim_t o = make(kind);
  int ns = ts_optim_state_buffers(&o);
  float *w = alloc_guarded(n), *g = alloc_guarded(n);
  float *s0 = ns >= 1 ? alloc_guarded(n) : NULL;
  float *s1 = ns >= 2 ? alloc_guarded(n) : NULL;
  double *rw = calloc(n + 1, sizeof *rw), *r0 = calloc(n + 1, sizeof *r0),
         *r1 = calloc(n + 1, sizeof *r1);
  assert_non_null(rw);
  assert_non_null(r0);
  assert_non_null(r1);
  rng_state = 0x1234u + n * 7u + (uint64_t)kind;
  for (size_t i = 0; i < n; i++) {
    w[i] = rnd();
    rw[i] = (double)w[i];
  }
  const char *name = kind == TS_OPT_SGD ? "sgd" : kind == TS_OPT_MOMENTUM ? "momentum" : "adam";
  for (int step = 1; step <= steps; step++) {
    for (size_t i = 0; i < n; i++) g[i] = rnd() * (step % 2 ? 1.0f : 0.25f);
    if (n > 3) g[3] = 0.0f; /* a zero gradient: Adam must not divide 0 by 0 */
    ts_optim_apply(&o, w, g, scale, n, s0, s1, (uint64_t)step);
    ref_step(&o, rw, g, (double)scale, n, r0, r1, (uint64_t)step);
    check_close(name, n, w, rw, tol, step);
    if (s0) check_close("first state buffer", n, s0, r0, tol, step);
    if (s1) check_close("second state buffer", n, s1, r1, tol, step);
  }
  check_guard("w", w, n);
  check_guard("g", g, n);
  check_guard("s0", s0, n);
  check_guard("s1", s1, n);
  free(w);
  free(g);
  free(s0);
  free(s1);
  free(rw);
  free(r0);
  free(r1);
}

static void test_state_buffers(void **state) {
  (void)state;
  ts_optim_t o = make(TS_OPT_SGD);
  assert_int_equal(ts_optim_state_buffers(&o), 0);
  o.kind = TS_OPT_MOMENTUM;
  assert_int_equal(ts_optim_state_buffers(&o), 1);
  o.kind = TS_OPT_ADAM;
  assert_int_equal(ts_optim_state_buffers(&o), 2);
}

static void test_from_config(void **state) {
  (void)state;
  ts_config_t cfg;
  assert_int_equal(ts_config_defaults(&cfg), 0);
  cfg.optimizer = TS_OPT_ADAM;
  cfg.learning_rate = 0.125;
  cfg.momentum = 0.5;
  cfg.beta1 = 0.75;
  cfg.beta2 = 0.875;
  cfg.epsilon = 0.25;
  cfg.decay = TS_DECAY_COSINE;
  cfg.decay_steps = 928;
  cfg.decay_rate = 0.5;
  cfg.decay_alpha = 0.125;
  cfg.staircase = true;
  ts_optim_t o;
  ts_optim_from_config(&o, &cfg);
  assert_int_equal(o.decay, TS_DECAY_COSINE);
  assert_true(o.decay_steps == 928 && o.decay_rate == 0.5 && o.decay_alpha == 0.125);
  assert_true(o.staircase);
  assert_int_equal(o.kind, TS_OPT_ADAM);
  assert_true(o.lr == 0.125f);
  assert_true(o.momentum == 0.5f);
  assert_true(o.beta1 == 0.75f);
  assert_true(o.beta2 == 0.875f);
  assert_true(o.epsilon == 0.25f);
  ts_config_free(&cfg);
}

/* optimizer.decay: update t (1-based) uses the rate of step t - 1 of TensorFlow's
 * exponential_decay and Keras' CosineDecay; past decay_steps the cosine stays at its floor. */
static void test_rate_schedules(void **state) {
  (void)state;
  ts_optim_t o = make(TS_OPT_SGD);
  o.lr = 0.5f;
  o.decay = TS_DECAY_NONE;
  o.decay_steps = 4;
  o.decay_rate = 0.5;
  o.decay_alpha = 0.1;
  for (uint64_t t = 1; t <= 20; t++) assert_true(ts_optim_rate(&o, t) == 0.5f); /* none */
  o.decay = TS_DECAY_EXPONENTIAL;
  for (uint64_t t = 1; t <= 20; t++) {
    double want = 0.5 * pow(0.5, (double)(t - 1) / 4.0);
    assert_true(fabs((double)ts_optim_rate(&o, t) - want) < 1e-7);
  }
  assert_true(ts_optim_rate(&o, 5) == 0.25f);
  o.staircase = 1;
  const float stairs[] = {0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f, 0.125f};
  for (uint64_t t = 1; t <= 9; t++) assert_true(ts_optim_rate(&o, t) == stairs[t - 1]);
  o.decay = TS_DECAY_COSINE;
  for (uint64_t t = 1; t <= 20; t++) {
    double done = t - 1 < 4 ? (double)(t - 1) / 4.0 : 1.0;
    double want = 0.5 * (0.9 * 0.5 * (1.0 + cos(M_PI * done)) + 0.1);
    assert_true(fabs((double)ts_optim_rate(&o, t) - want) < 1e-7);
  }
  assert_true(fabs((double)ts_optim_rate(&o, 3) - 0.5 * (0.9 * 0.5 + 0.1)) < 1e-7); /* half way */
  assert_true(fabs((double)ts_optim_rate(&o, 1000) - 0.05) < 1e-7); /* the floor */
  /* The update applies the scheduled rate: SGD, w -= rate(t) g. */
  o.decay = TS_DECAY_EXPONENTIAL;
  float w = 0.0f, g = 1.0f;
  for (uint64_t t = 1; t <= 9; t++) ts_optim_apply(&o, &w, &g, 1.0f, 1, NULL, NULL, t);
  assert_true(w == -(4 * 0.5f + 4 * 0.25f + 0.125f));
}

/* n = 0 touches nothing, even with NULL buffers. */
static void test_empty(void **state) {
  (void)state;
  for (int k = TS_OPT_SGD; k <= TS_OPT_ADAM; k++) {
    ts_optim_t o = make((ts_optimizer_t)k);
    ts_optim_apply(&o, NULL, NULL, 1.0f, 0, NULL, NULL, 1);
  }
  assert_true(ts_optim_all_finite(NULL, 0));
}

static void test_sgd(void **state) {
  (void)state;
  for (size_t i = 0; i < NSIZES; i++) run_case(TS_OPT_SGD, sizes[i], 1.0f, 6, 1e-6);
}

static void test_momentum(void **state) {
  (void)state;
  for (size_t i = 0; i < NSIZES; i++) run_case(TS_OPT_MOMENTUM, sizes[i], 1.0f, 8, 1e-5);
}

static void test_adam(void **state) {
  (void)state;
  for (size_t i = 0; i < NSIZES; i++) run_case(TS_OPT_ADAM, sizes[i], 1.0f, 8, 1e-5);
}

static void test_scale(void **state) {
  (void)state;
  const float scales[] = {0.5f, 0.25f, 1.0f / 3.0f, 0.0f};
  for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
    for (size_t i = 0; i < NSIZES; i++) {
      run_case(TS_OPT_SGD, sizes[i], scales[s], 4, 1e-6);
      run_case(TS_OPT_MOMENTUM, sizes[i], scales[s], 4, 1e-5);
      run_case(TS_OPT_ADAM, sizes[i], scales[s], 4, 1e-5);
    }
}

/* The sync use of scale: a sum of k gradients applied with 1/k equals their mean applied
 * with 1 (up to float rounding of the sum). */
static void test_scale_is_mean(void **state) {
  (void)state;
  enum { N = 17, K = 3 };
  for (int kind = TS_OPT_SGD; kind <= TS_OPT_ADAM; kind++) {
    ts_optim_t o = make((ts_optimizer_t)kind);
    float wa[N], wb[N], a0[N] = {0}, a1[N] = {0}, b0[N] = {0}, b1[N] = {0};
    float sum[N] = {0}, mean[N];
    rng_state = 99;
    for (int i = 0; i < N; i++) wa[i] = wb[i] = rnd();
    for (int k = 0; k < K; k++)
      for (int i = 0; i < N; i++) sum[i] += rnd();
    for (int i = 0; i < N; i++) mean[i] = sum[i] / (float)K;
    ts_optim_apply(&o, wa, sum, 1.0f / (float)K, N, a0, a1, 1);
    ts_optim_apply(&o, wb, mean, 1.0f, N, b0, b1, 1);
    for (int i = 0; i < N; i++)
      if (fabsf(wa[i] - wb[i]) > 1e-6f)
        fail_msg("optimizer %d element %d: sum/k gives %.9g, mean gives %.9g", kind, i,
                 (double)wa[i], (double)wb[i]);
  }
}

/* Adam's bias correction uses t: the first step moves every weight by about lr whatever
 * the gradient's size, and a later t with fresh state moves it less. */
static void test_adam_bias_correction(void **state) {
  (void)state;
  ts_optim_t o = make(TS_OPT_ADAM);
  const float gs[] = {1e-3f, 0.5f, -7.0f, 300.0f};
  for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
    float w = 1.0f, m = 0.0f, v = 0.0f;
    ts_optim_apply(&o, &w, &gs[i], 1.0f, 1, &m, &v, 1);
    float moved = 1.0f - w;
    float want = gs[i] > 0 ? o.lr : -o.lr;
    if (fabsf(moved - want) > 1e-4f)
      fail_msg("g=%g: first Adam step moved w by %.9g, want %.9g", (double)gs[i], (double)moved,
               (double)want);
    float w10 = 1.0f, m10 = 0.0f, v10 = 0.0f;
    ts_optim_apply(&o, &w10, &gs[i], 1.0f, 1, &m10, &v10, 10);
    assert_true(fabsf(1.0f - w10) < fabsf(moved));
  }
}

static void test_all_finite(void **state) {
  (void)state;
  float special_bad[5];
  special_bad[0] = NAN;
  special_bad[1] = -NAN;
  special_bad[2] = INFINITY;
  special_bad[3] = -INFINITY;
  uint32_t snan_bits = 0x7fa00000u; /* a signalling NaN */
  memcpy(&special_bad[4], &snan_bits, sizeof snan_bits);
  const float special_ok[] = {-0.0f,          0.0f,         FLT_MAX,       -FLT_MAX, FLT_MIN,
                              FLT_MIN / 2.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, 1.0f,     -1.0f};
  const size_t ns[] = {1, 2, 17, 1000};
  for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
    size_t n = ns[si];
    float *g = malloc(n * sizeof *g);
    assert_non_null(g);
    /* Finite specials everywhere, including many FLT_MAX whose sum would overflow. */
    for (size_t i = 0; i < n; i++)
      g[i] = special_ok[i % (sizeof special_ok / sizeof special_ok[0])];
    if (!ts_optim_all_finite(g, n)) fail_msg("n=%zu: finite specials reported non-finite", n);
    for (size_t i = 0; i < n; i++) g[i] = FLT_MAX;
    if (!ts_optim_all_finite(g, n)) fail_msg("n=%zu: all FLT_MAX reported non-finite", n);
    for (size_t i = 0; i < n; i++) g[i] = -0.0f;
    if (!ts_optim_all_finite(g, n)) fail_msg("n=%zu: all -0.0 reported non-finite", n);
    for (size_t i = 0; i < n; i++) g[i] = FLT_TRUE_MIN;
    if (!ts_optim_all_finite(g, n)) fail_msg("n=%zu: all denormal reported non-finite", n);

    const size_t pos[] = {0, 1, n / 2, n > 1 ? n - 2 : 0, n - 1};
    for (size_t b = 0; b < sizeof special_bad / sizeof special_bad[0]; b++)
      for (size_t pi = 0; pi < sizeof pos / sizeof pos[0]; pi++) {
        size_t at = pos[pi] < n ? pos[pi] : n - 1;
        for (size_t i = 0; i < n; i++)
          g[i] = special_ok[(i + b) % (sizeof special_ok / sizeof special_ok[0])];
        g[at] = special_bad[b];
        if (ts_optim_all_finite(g, n))
          fail_msg("n=%zu: %g at %zu reported finite", n, (double)special_bad[b], at);
        /* Only the first n values count. */
        if (at == n - 1 && ts_optim_all_finite(g, n - 1) != 1)
          fail_msg("n=%zu: the value past n-1 was read", n);
      }
    /* +Inf and -Inf together (their sum is NaN, their products with 0 too). */
    if (n >= 2) {
      for (size_t i = 0; i < n; i++) g[i] = 1.0f;
      g[0] = INFINITY;
      g[n - 1] = -INFINITY;
      assert_false(ts_optim_all_finite(g, n));
    }
    free(g);
  }
}

/* The same three updates as one float at a time, volatile so the compiler cannot vectorise
 * them: whichever vector width ts_optim_apply runs at on this CPU (ts_optim.c picks an AVX2
 * build where it can), its results must be these, bit for bit. */
static void scalar_apply(const ts_optim_t *o, float *w, const float *g, float scale, size_t n,
                         float *s0, float *s1, uint64_t t) {
  const float lr = ts_optim_rate(o, t);
  for (volatile size_t i = 0; i < n; i++) {
    if (o->kind == TS_OPT_SGD) {
      w[i] -= lr * scale * g[i];
    } else if (o->kind == TS_OPT_MOMENTUM) {
      s0[i] = o->momentum * s0[i] + scale * g[i];
      w[i] -= lr * s0[i];
    } else {
      const double tt = (double)t;
      const float c1 = (float)(1.0 - pow((double)o->beta1, tt));
      const float c2 = (float)(1.0 - pow((double)o->beta2, tt));
      const float step = lr * sqrtf(c2) / c1;
      float gi = scale * g[i];
      s0[i] = o->beta1 * s0[i] + (1.0f - o->beta1) * gi;
      s1[i] = o->beta2 * s1[i] + (1.0f - o->beta2) * gi * gi;
      w[i] -= step * s0[i] / (sqrtf(s1[i]) + o->epsilon);
    }
  }
}

static void test_bit_identical(void **state) {
  (void)state;
  const size_t n = 1037; /* vector body and a tail, at any width */
  float *buf = calloc(8 * n, sizeof *buf);
  assert_non_null(buf);
  float *w = buf, *s0 = buf + n, *s1 = buf + 2 * n, *g = buf + 3 * n;
  float *rw = buf + 4 * n, *rs0 = buf + 5 * n, *rs1 = buf + 6 * n;
  for (int k = TS_OPT_SGD; k <= TS_OPT_ADAM; k++) {
    ts_optim_t o = make((ts_optimizer_t)k);
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
      x = x * 1664525u + 1013904223u;
      w[i] = rw[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
      s0[i] = rs0[i] = s1[i] = rs1[i] = 0.0f;
    }
    for (uint64_t t = 1; t <= 5; t++) {
      for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        g[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 3.0f;
      }
      ts_optim_apply(&o, w, g, 0.5f, n, s0, s1, t);
      scalar_apply(&o, rw, g, 0.5f, n, rs0, rs1, t);
    }
    assert_memory_equal(w, rw, n * sizeof *w);
    assert_memory_equal(s0, rs0, n * sizeof *s0);
    assert_memory_equal(s1, rs1, n * sizeof *s1);
  }
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_state_buffers),
      cmocka_unit_test(test_from_config),
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_sgd),
      cmocka_unit_test(test_momentum),
      cmocka_unit_test(test_adam),
      cmocka_unit_test(test_scale),
      cmocka_unit_test(test_scale_is_mean),
      cmocka_unit_test(test_adam_bias_correction),
      cmocka_unit_test(test_all_finite),
      cmocka_unit_test(test_rate_schedules),
      cmocka_unit_test(test_bit_identical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
