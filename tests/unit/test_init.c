/*
 * Deterministic initialisation (proto/ts_init.h): same (seed, name) gives the same values,
 * anything else does not; Glorot bounds and mean, with Keras's fans; offsets compose;
 * zeros and ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "ts_init.h"

#define N 100000

static float *alloc_floats(size_t n) {
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  return p;
}

static size_t count_equal(const float *a, const float *b, size_t n) {
  size_t same = 0;
  for (size_t i = 0; i < n; i++) same += a[i] == b[i];
  return same;
}

static void test_deterministic(void **state) {
  (void)state;
  const uint64_t shape[] = {784, 256};
  float *a = alloc_floats(N), *b = alloc_floats(N);
  ts_init_fill(a, TS_INIT_GLOROT_UNIFORM, 42, "fc1/weights", shape, 2, 0, N);
  ts_init_fill(b, TS_INIT_GLOROT_UNIFORM, 42, "fc1/weights", shape, 2, 0, N);
  assert_memory_equal(a, b, N * sizeof *a);
  assert_true(ts_init_key(42, "fc1/weights") == ts_init_key(42, "fc1/weights"));
  assert_true(ts_init_uniform(7, 9) == ts_init_uniform(7, 9));

  /* Not a constant: the values vary along the tensor. */
  size_t distinct_from_first = 0;
  for (size_t i = 1; i < N; i++) distinct_from_first += a[i] != a[0];
  assert_true(distinct_from_first > N - 100);
  free(a);
  free(b);
}

static void test_different_name_or_seed(void **state) {
  (void)state;
  const uint64_t shape[] = {784, 256};
  float *a = alloc_floats(N), *b = alloc_floats(N);
  ts_init_fill(a, TS_INIT_GLOROT_UNIFORM, 42, "fc1/weights", shape, 2, 0, N);

  /* Another name: at most a handful of float coincidences. */
  ts_init_fill(b, TS_INIT_GLOROT_UNIFORM, 42, "fc2/weights", shape, 2, 0, N);
  assert_in_range(count_equal(a, b, N), 0, 100);
  /* Names that differ only in a prefix byte or by length. */
  ts_init_fill(b, TS_INIT_GLOROT_UNIFORM, 42, "fc1/weights ", shape, 2, 0, N);
  assert_in_range(count_equal(a, b, N), 0, 100);
  /* Another seed. */
  ts_init_fill(b, TS_INIT_GLOROT_UNIFORM, 43, "fc1/weights", shape, 2, 0, N);
  assert_in_range(count_equal(a, b, N), 0, 100);
  ts_init_fill(b, TS_INIT_GLOROT_UNIFORM, 0, "fc1/weights", shape, 2, 0, N);
  assert_in_range(count_equal(a, b, N), 0, 100);

  assert_true(ts_init_key(42, "a") != ts_init_key(42, "b"));
  assert_true(ts_init_key(42, "a") != ts_init_key(43, "a"));
  assert_true(ts_init_key(0, "") != ts_init_key(1, ""));
  free(a);
  free(b);
}

static void test_uniform_range(void **state) {
  (void)state;
  double sum = 0;
  for (uint64_t i = 0; i < N; i++) {
    double u = ts_init_uniform(0x1234, i);
    assert_true(u >= 0.0 && u < 1.0);
    sum += u;
  }
  assert_true(fabs(sum / N - 0.5) < 0.01);
  /* The extreme counters are fine too. */
  assert_true(ts_init_uniform(0, UINT64_MAX) < 1.0);
  assert_true(ts_init_uniform(UINT64_MAX, 0) >= 0.0);
}

static void check_glorot(const uint64_t *shape, size_t rank, double fan_in, double fan_out) {
  float *a = alloc_floats(N);
  ts_init_fill(a, TS_INIT_GLOROT_UNIFORM, 7, "w", shape, rank, 0, N);
  double limit = sqrt(6.0 / (fan_in + fan_out));
  float flimit = (float)limit;
  double sum = 0, lo = 0, hi = 0;
  for (size_t i = 0; i < N; i++) {
    if (!(a[i] >= -flimit && a[i] <= flimit))
      fail_msg("value %zu = %g outside [-%g, %g]", i, (double)a[i], limit, limit);
    double x = (double)a[i];
    sum += x;
    if (x < lo) lo = x;
    if (x > hi) hi = x;
  }
  /* Mean of U(-l, l) over 100k draws: sd of the mean is l / sqrt(3 N) ~ 0.0018 l. */
  double mean = sum / N;
  if (fabs(mean) > 0.01 * limit) fail_msg("mean %g not near 0 (limit %g)", mean, limit);
  /* The draws fill the interval. */
  assert_true(hi > 0.99 * limit);
  assert_true(lo < -0.99 * limit);
  free(a);
}

static void test_glorot_bounds_and_mean(void **state) {
  (void)state;
  const uint64_t s2[] = {784, 256};
  check_glorot(s2, 2, 784, 256);
  const uint64_t s1[] = {10};
  check_glorot(s1, 1, 10, 10);         /* rank 1: fan_in = fan_out = n */
  const uint64_t s4[] = {3, 5, 5, 16}; /* a 3x5 window, 5 -> 16 channels */
  check_glorot(s4, 4, 3 * 5 * 5, 3 * 5 * 16);
  const uint64_t big[] = {100000, 100000};
  check_glorot(big, 2, 100000, 100000);
}

/* The fans and limits Keras's GlorotUniform gives these shapes (keras.initializers'
 * compute_fans; conv kernels HWIO, as ps-worker's and TensorFlow's), written out. */
static void check_fans(const uint64_t *shape, size_t rank, double fan_in, double fan_out,
                       double limit) {
  double in = 0, out = 0;
  ts_init_fans(shape, rank, &in, &out);
  if (in != fan_in || out != fan_out)
    fail_msg("rank %zu: fans %g, %g, not %g, %g", rank, in, out, fan_in, fan_out);
  double l = ts_init_glorot_limit(shape, rank);
  if (fabs(l - limit) > 1e-16) fail_msg("rank %zu: limit %.17g, not %.17g", rank, l, limit);
}

static void test_glorot_fans_as_keras(void **state) {
  (void)state;
  /* 3x3 conv, 1 -> 16: receptive 9, fan_in 9, fan_out 144, sqrt(6/153). */
  check_fans((const uint64_t[]){3, 3, 1, 16}, 4, 9, 144, 0.19802950859533486);
  /* 3x3 conv, 16 -> 32: fan_in 144, fan_out 288, sqrt(6/432). */
  check_fans((const uint64_t[]){3, 3, 16, 32}, 4, 144, 288, 0.11785113019775792);
  /* LeNet-5's first layer, 5x5, 1 -> 6: fan_in 25, fan_out 150, sqrt(6/175). */
  check_fans((const uint64_t[]){5, 5, 1, 6}, 4, 25, 150, 0.1851640199545103);
  /* A dense kernel [in, out]: sqrt(6/912). */
  check_fans((const uint64_t[]){784, 128}, 2, 784, 128, 0.08111071056538127);
  check_fans((const uint64_t[]){10}, 1, 10, 10, sqrt(6.0 / 20));
  /* A 1-D conv kernel [w, in, out] and a 3-D one [d, h, w, in, out]. */
  check_fans((const uint64_t[]){3, 8, 4}, 3, 24, 12, sqrt(6.0 / 36));
  check_fans((const uint64_t[]){2, 3, 3, 4, 5}, 5, 72, 90, sqrt(6.0 / 162));
  /* The draws of a conv kernel fill exactly Keras's interval. */
  check_glorot((const uint64_t[]){3, 3, 16, 32}, 4, 144, 288);
}

/* Filling [0, n) at once equals filling the two halves with offsets, at any split. */
static void test_offset_consistency(void **state) {
  (void)state;
  const uint64_t shape[] = {1000, 100};
  float *whole = alloc_floats(N), *parts = alloc_floats(N);
  ts_init_fill(whole, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, 0, N);
  static const uint64_t splits[] = {0, 1, 3, N / 2, N - 1, N};
  for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
    uint64_t k = splits[s];
    memset(parts, 0, N * sizeof *parts);
    ts_init_fill(parts, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, 0, k);
    ts_init_fill(parts + k, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, k, N - k);
    assert_memory_equal(whole, parts, N * sizeof *whole);
  }
  /* Three pieces, filled out of order. */
  memset(parts, 0, N * sizeof *parts);
  ts_init_fill(parts + 70000, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, 70000, 30000);
  ts_init_fill(parts, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, 0, 12345);
  ts_init_fill(parts + 12345, TS_INIT_GLOROT_UNIFORM, 99, "layer", shape, 2, 12345, 57655);
  assert_memory_equal(whole, parts, N * sizeof *whole);
  free(whole);
  free(parts);
}

static void test_zeros_ones(void **state) {
  (void)state;
  const uint64_t shape[] = {17, 3};
  float v[51];
  for (size_t i = 0; i < 51; i++) v[i] = 123.0f;
  ts_init_fill(v, TS_INIT_ZEROS, 1, "b", shape, 2, 0, 51);
  for (size_t i = 0; i < 51; i++) assert_true(v[i] == 0.0f && !signbit(v[i]));
  ts_init_fill(v, TS_INIT_ONES, 1, "b", shape, 2, 5, 46);
  for (size_t i = 0; i < 46; i++) assert_true(v[i] == 1.0f);
  for (size_t i = 46; i < 51; i++) assert_true(v[i] == 0.0f);
  /* count 0 writes nothing. */
  v[0] = 5.0f;
  ts_init_fill(v, TS_INIT_ONES, 1, "b", shape, 2, 0, 0);
  ts_init_fill(v, TS_INIT_GLOROT_UNIFORM, 1, "b", shape, 2, 0, 0);
  assert_true(v[0] == 5.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_different_name_or_seed),
      cmocka_unit_test(test_uniform_range),
      cmocka_unit_test(test_glorot_bounds_and_mean),
      cmocka_unit_test(test_glorot_fans_as_keras),
      cmocka_unit_test(test_offset_consistency),
      cmocka_unit_test(test_zeros_ones),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
