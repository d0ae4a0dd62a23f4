/*
 * Table keys (proto/ts_key.h): keys spread evenly over any shard count, consecutive ids
 * included; a new row depends on (table, key) alone and has its initialiser's
 * distribution.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "ts_init.h"
#include "ts_key.h"

static void test_shards_even(void **state) {
  (void)state;
  const uint32_t counts[] = {1, 2, 3, 7, 64, 256};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    uint32_t n = counts[c];
    static uint32_t per[256];
    memset(per, 0, sizeof per);
    /* Consecutive ids (a vocabulary's indices) and ids with only high bits set. */
    const uint64_t keys = 1000000;
    for (uint64_t k = 0; k < keys; k++) {
      uint32_t s = ts_key_shard(k, n), t = ts_key_shard(k << 40, n);
      assert_true(s < n && t < n);
      per[s]++;
      per[t]++;
    }
    double want = 2.0 * (double)keys / n;
    for (uint32_t s = 0; s < n; s++)
      if (fabs(per[s] - want) > 6.0 * sqrt(want) + 1.0)
        fail_msg("%u shards: shard %u got %u keys, expected about %.0f", n, s, per[s], want);
  }
}

static void test_hash_mixes(void **state) {
  (void)state;
  /* Flipping one input bit flips about half of the output bits. */
  double flipped = 0;
  int trials = 0;
  for (uint64_t k = 1; k < 2000; k += 7)
    for (int b = 0; b < 64; b++, trials++)
      flipped += __builtin_popcountll(ts_key_hash(k) ^ ts_key_hash(k ^ (1ULL << b)));
  double mean = flipped / trials;
  assert_true(mean > 31.0 && mean < 33.0);
}

static void test_row_depends_on_table_and_key_only(void **state) {
  (void)state;
  uint64_t table = ts_init_key(42, "user_id"), other = ts_init_key(42, "item_id");
  float a[64], b[64], c[64], d[64];
  ts_key_row_init(a, 64, TS_KEY_INIT_UNIFORM, 0.05, table, 12345);
  ts_key_row_init(b, 64, TS_KEY_INIT_UNIFORM, 0.05, table, 12345);
  assert_memory_equal(a, b, sizeof a);
  ts_key_row_init(c, 64, TS_KEY_INIT_UNIFORM, 0.05, table, 12346);
  ts_key_row_init(d, 64, TS_KEY_INIT_UNIFORM, 0.05, other, 12345);
  int same_c = 0, same_d = 0;
  for (int j = 0; j < 64; j++) {
    same_c += a[j] == c[j];
    same_d += a[j] == d[j];
  }
  assert_true(same_c < 2 && same_d < 2);
  /* A prefix of a wider row is the narrower row: element j depends on j alone. */
  float narrow[16];
  ts_key_row_init(narrow, 16, TS_KEY_INIT_UNIFORM, 0.05, table, 12345);
  assert_memory_equal(narrow, a, sizeof narrow);
  ts_key_row_init(c, 64, TS_KEY_INIT_ZEROS, 0.05, table, 12345);
  for (int j = 0; j < 64; j++) assert_true(c[j] == 0.0f);
}

/* Mean, standard deviation and extremes of dim-8 rows of many keys. */
static void moments(ts_key_init_t init, double param, double *mean, double *sd, double *lo,
                    double *hi) {
  uint64_t table = ts_init_key(7, "emb");
  double s = 0, s2 = 0;
  *lo = INFINITY;
  *hi = -INFINITY;
  const int keys = 50000, dim = 8;
  for (int k = 0; k < keys; k++) {
    float row[8];
    ts_key_row_init(row, (size_t)dim, init, param, table, (uint64_t)k * 2654435761u);
    for (int j = 0; j < dim; j++) {
      double v = (double)row[j];
      s += v;
      s2 += v * v;
      if (v < *lo) *lo = v;
      if (v > *hi) *hi = v;
    }
  }
  double n = (double)keys * dim;
  *mean = s / n;
  *sd = sqrt(s2 / n - *mean * *mean);
}

static void test_distributions(void **state) {
  (void)state;
  double m, sd, lo, hi;
  moments(TS_KEY_INIT_UNIFORM, 0.05, &m, &sd, &lo, &hi);
  assert_true(fabs(m) < 0.001 && fabs(sd - 0.05 / sqrt(3.0)) < 0.001);
  assert_true(lo >= -0.05 && hi < 0.05 && lo < -0.0499 && hi > 0.0499);
  moments(TS_KEY_INIT_NORMAL, 0.5, &m, &sd, &lo, &hi);
  assert_true(fabs(m) < 0.01 && fabs(sd - 0.5) < 0.01 && hi > 1.5 && lo < -1.5);
  /* Truncated at 2 sd: sd * 0.8796 (the standard normal truncated to [-2, 2]). */
  moments(TS_KEY_INIT_TRUNCATED_NORMAL, 0.5, &m, &sd, &lo, &hi);
  assert_true(fabs(m) < 0.01 && fabs(sd - 0.5 * 0.8796) < 0.01);
  assert_true(lo >= -1.0 && hi <= 1.0 && hi > 0.99);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shards_even),
      cmocka_unit_test(test_hash_mixes),
      cmocka_unit_test(test_row_depends_on_table_and_key_only),
      cmocka_unit_test(test_distributions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
