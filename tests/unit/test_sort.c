/*
 * The stable key sort (base/ts_sort.h) against qsort of (key, index) pairs: lists below and
 * above the radix sort's threshold, ids of every width (packed with their index in one word,
 * and 64-bit hashes that are not), duplicates, one repeated key, bits that vary only high.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rng_fixture.h"
#include "ts_sort.h"

typedef struct {
  uint64_t key;
  uint32_t idx;
} ref_t;

static int cmp_ref(const void *a, const void *b) {
  const ref_t *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Sort keys[0..n) both ways and compare every key and index. */
static void check(const uint64_t *keys, size_t n) {
  ref_t *ref = malloc((n ? n : 1) * sizeof *ref);
  uint64_t *skey = malloc((n ? n : 1) * sizeof *skey);
  uint32_t *sidx = malloc((n ? n : 1) * sizeof *sidx);
  void *scratch = malloc(ts_sort_scratch_bytes(n));
  assert_non_null(ref);
  assert_non_null(skey);
  assert_non_null(sidx);
  assert_non_null(scratch);
  for (size_t i = 0; i < n; i++) ref[i] = (ref_t){keys[i], (uint32_t)i};
  qsort(ref, n, sizeof *ref, cmp_ref);
  ts_sort_keys(keys, n, scratch, skey, sidx);
  for (size_t i = 0; i < n; i++) {
    if (skey[i] != ref[i].key || sidx[i] != ref[i].idx)
      fail_msg("n %zu, at %zu: key %llx index %u, expected %llx %u", n, i,
               (unsigned long long)skey[i], sidx[i], (unsigned long long)ref[i].key, ref[i].idx);
  }
  free(ref);
  free(skey);
  free(sidx);
  free(scratch);
}

/* n keys: (draw & mask) << shift | high, where draw is uniform 64-bit or, with zipf, an id
 * whose small values recur (duplicates). */
static void run(size_t n, uint64_t mask, unsigned shift, uint64_t high, int zipf, uint64_t *rng) {
  uint64_t *keys = malloc((n ? n : 1) * sizeof *keys);
  assert_non_null(keys);
  for (size_t i = 0; i < n; i++) {
    double u = rng_uniform(rng);
    uint64_t d = zipf ? (uint64_t)(1.0 / (u * u + 1e-12)) : (uint64_t)(u * 18446744073709551615.0);
    if (!zipf) d ^= (uint64_t)(rng_uniform(rng) * 4294967296.0); /* the low bits too */
    keys[i] = (d & mask) << shift | high;
  }
  check(keys, n);
  free(keys);
}

static void test_sizes_and_widths(void **state) {
  (void)state;
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  const size_t sizes[] = {0, 1, 2, 7, 511, 512, 513, 4096, 65536, 100003};
  const uint64_t masks[] = {1, 0xff, 0xfffff, 0xffffffffULL, 0xffffffffffffULL, ~0ULL};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++)
      for (int zipf = 0; zipf < 2; zipf++) run(sizes[s], masks[m], 0, 0, zipf, &rng);
}

static void test_bits_that_vary_high_or_in_the_middle(void **state) {
  (void)state;
  uint64_t rng = 12345;
  /* ids shifted up (low bits constant), a constant high prefix, negative int64 ids */
  run(70000, 0xfffff, 40, 0x5, 1, &rng);
  run(70000, 0xfff, 20, 0xabc0000000000000ULL, 0, &rng);
  run(70000, 0xffff, 0, 0xffffffffffff0000ULL, 1, &rng);
  /* varying bits plus the index's 17 bits exactly 64: packed; one more: two arrays */
  run(70000, (1ULL << 47) - 1, 0, 0, 0, &rng);
  run(70000, (1ULL << 48) - 1, 0, 0, 0, &rng);
}

static void test_one_key_repeated(void **state) {
  (void)state;
  size_t n = 5000;
  uint64_t *keys = malloc(n * sizeof *keys);
  assert_non_null(keys);
  for (size_t i = 0; i < n; i++) keys[i] = 42;
  check(keys, n);
  /* and two keys, alternating, at the ends of the range */
  for (size_t i = 0; i < n; i++) keys[i] = i % 2 ? ~0ULL : 0;
  check(keys, n);
  free(keys);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_and_widths),
      cmocka_unit_test(test_bits_that_vary_high_or_in_the_middle),
      cmocka_unit_test(test_one_key_repeated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
