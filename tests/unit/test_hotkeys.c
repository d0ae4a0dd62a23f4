/*
 * The hottest keys of a table (server/ts_hotkeys.h) on Zipf streams against exact counts:
 * the true top keys are found, in order, with every key's count an overestimate by at most
 * its error; the share of the top keys is a lower bound close to the exact share, also when
 * one key in 16 is sampled; decay halves, and a stream that moves on is followed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_hotkeys.h"

#define VOCAB 100000
#define DRAWS 1000000

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* DRAWS keys of Zipf(s) over VOCAB ids, rank r drawn as key r * 7919 + base. */
static uint64_t *zipf_stream(double s, uint64_t base, uint32_t *counts) {
  double *cdf = malloc(VOCAB * sizeof *cdf), z = 0, acc = 0;
  for (int k = 0; k < VOCAB; k++) z += 1.0 / pow(k + 1, s);
  for (int k = 0; k < VOCAB; k++) cdf[k] = (acc += 1.0 / pow(k + 1, s) / z);
  uint64_t *keys = malloc(DRAWS * sizeof *keys), st = 0x9E3779B97F4A7C15ull;
  memset(counts, 0, VOCAB * sizeof *counts);
  for (int i = 0; i < DRAWS; i++) {
    double u = (double)(rng_next(&st) >> 11) / 9007199254740992.0;
    int lo = 0, hi = VOCAB - 1;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (cdf[mid] < u)
        lo = mid + 1;
      else
        hi = mid;
    }
    counts[lo]++;
    keys[i] = (uint64_t)lo * 7919 + base;
  }
  free(cdf);
  return keys;
}

static void check_stream(double s, uint32_t every) {
  uint32_t *counts = malloc(VOCAB * sizeof *counts);
  uint64_t *keys = zipf_stream(s, 5, counts);
  ts_hotkeys_t h;
  ts_hotkeys_init(&h, every);
  for (int i = 0; i < DRAWS; i++) ts_hotkeys_see(&h, keys[i]);
  /* One key in `every` on average (the gaps are random: within 2 % of it here). */
  assert_true(fabs((double)h.total - (double)DRAWS / every) <= 0.02 * DRAWS / every);
  ts_hotkey_t top[8];
  assert_int_equal(ts_hotkeys_top(&h, top, 8), 8);
  double exact = 0;
  for (int r = 0; r < 8; r++) {
    /* Zipf ranks are the hottest keys; the 8 hottest are found, hottest first. */
    if (top[r].key != (uint64_t)r * 7919 + 5)
      fail_msg("s %.1f every %u: rank %d is key %llu (count %llu error %llu), exact %u", s, every, r,
               (unsigned long long)top[r].key, (unsigned long long)top[r].count,
               (unsigned long long)top[r].error, counts[r]);
    if (every == 1) {
      assert_true(top[r].count >= counts[r]);
      assert_true(top[r].count - top[r].error <= counts[r]);
    }
    exact += counts[r];
  }
  exact /= DRAWS;
  double share = ts_hotkeys_share(&h, 8);
  assert_true(share <= exact + (every == 1 ? 1e-12 : 0.01));
  assert_true(share >= exact - 0.02);
  free(keys);
  free(counts);
}

static void test_zipf_streams(void **state) {
  (void)state;
  check_stream(1.0, 1);
  check_stream(1.2, 1);
  check_stream(1.0, 16);
}

/* A key that comes at a fixed place in a period of the stream is sampled all the same. */
static void test_periodic_stream(void **state) {
  (void)state;
  ts_hotkeys_t h;
  ts_hotkeys_init(&h, 16);
  for (int i = 0; i < 160000; i++) ts_hotkeys_see(&h, i % 16 == 5 ? 42 : 1000 + (uint64_t)i);
  ts_hotkey_t top[1];
  assert_int_equal(ts_hotkeys_top(&h, top, 1), 1);
  assert_true(top[0].key == 42);
  double share = ts_hotkeys_share(&h, 1);
  assert_true(share > 0.04 && share <= 1.0 / 16 + 0.01);
}

static void test_decay_follows_the_stream(void **state) {
  (void)state;
  ts_hotkeys_t h;
  ts_hotkeys_init(&h, 1);
  for (int i = 0; i < 1000; i++) ts_hotkeys_see(&h, 42);
  for (int i = 0; i < 1000; i++) ts_hotkeys_see(&h, (uint64_t)i + 1000);
  ts_hotkey_t top[1];
  ts_hotkeys_top(&h, top, 1);
  assert_true(top[0].key == 42);
  /* The traffic moves to key 7: after a few decays it is the hottest. */
  for (int round = 0; round < 4; round++) {
    ts_hotkeys_decay(&h);
    for (int i = 0; i < 500; i++) ts_hotkeys_see(&h, 7);
  }
  ts_hotkeys_top(&h, top, 1);
  assert_true(top[0].key == 7);
  /* Decay to nothing empties it. */
  for (int i = 0; i < 20; i++) ts_hotkeys_decay(&h);
  assert_int_equal(h.used, 0);
  assert_true(ts_hotkeys_share(&h, 8) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_zipf_streams),
      cmocka_unit_test(test_periodic_stream),
      cmocka_unit_test(test_decay_follows_the_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
