/*
 * Partition plan (proto/ts_plan.h): argument checks, the near-equal split, size-balanced
 * placement, determinism, and a property test over random tensor lists.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_plan.h"

/* Every invariant the header promises, for any valid plan. */
static void check_plan(const ts_plan_t *p, const uint64_t *elems, uint32_t nt, uint32_t ns,
                       uint64_t partition_bytes) {
  uint64_t max_elems = partition_bytes / 4;
  assert_int_equal(p->num_tensors, nt);
  assert_int_equal(p->num_shards, ns);
  assert_non_null(p->parts);

  uint64_t largest = 0, total = 0;
  size_t k = 0;
  for (uint32_t t = 0; t < nt; t++) {
    assert_int_equal(p->tensor_first[t], k);
    uint64_t want_parts = elems[t] / max_elems + (elems[t] % max_elems != 0);
    assert_int_equal(p->tensor_parts[t], want_parts);
    /* Partitions cover the tensor in order, no gap, no overlap; sizes differ by <= 1. */
    uint64_t offset = 0, lo = UINT64_MAX, hi = 0;
    for (uint32_t i = 0; i < p->tensor_parts[t]; i++, k++) {
      const ts_part_t *q = &p->parts[k];
      assert_ptr_equal(ts_plan_part(p, t, i), q);
      assert_int_equal(q->tensor, t);
      assert_int_equal(q->part, i);
      assert_int_equal(q->offset, offset);
      assert_true(q->count > 0);
      assert_true(q->count <= max_elems);
      assert_true(q->count * 4 <= partition_bytes);
      assert_in_range(q->shard, 0, ns - 1);
      offset += q->count;
      if (q->count < lo) lo = q->count;
      if (q->count > hi) hi = q->count;
      if (q->count * 4 > largest) largest = q->count * 4;
    }
    assert_int_equal(offset, elems[t]);
    assert_true(hi - lo <= 1);
    assert_null(ts_plan_part(p, t, p->tensor_parts[t]));
    total += elems[t] * 4;
  }
  assert_int_equal(p->num_parts, k);
  assert_null(ts_plan_part(p, nt, 0));

  /* Per-shard tallies agree with the partitions, sum to the whole model, and are balanced
   * to within one partition. */
  uint64_t sum = 0, smin = UINT64_MAX, smax = 0;
  for (uint32_t s = 0; s < ns; s++) {
    uint64_t bytes = 0;
    uint32_t parts = 0;
    for (size_t i = 0; i < p->num_parts; i++) {
      if (p->parts[i].shard != s) continue;
      bytes += p->parts[i].count * 4;
      parts++;
    }
    assert_int_equal(p->shard_bytes[s], bytes);
    assert_int_equal(p->shard_parts[s], parts);
    sum += bytes;
    if (bytes < smin) smin = bytes;
    if (bytes > smax) smax = bytes;
  }
  assert_int_equal(sum, total);
  if (smax - smin > largest)
    fail_msg("shards unbalanced: max %llu - min %llu > largest partition %llu",
             (unsigned long long)smax, (unsigned long long)smin, (unsigned long long)largest);
}

static void test_invalid_args(void **state) {
  (void)state;
  ts_plan_t p;
  const uint64_t elems[] = {10, 20};
  const uint64_t with_zero[] = {10, 0};
  memset(&p, 0xa5, sizeof p);
  assert_int_equal(ts_plan_build(elems, 0, 2, 64, &p), TS_EINVAL);
  /* A failed build leaves an empty plan that is safe to free. */
  assert_null(p.parts);
  assert_int_equal(p.num_parts, 0);
  ts_plan_free(&p);
  assert_int_equal(ts_plan_build(elems, 2, 0, 64, &p), TS_EINVAL);
  assert_int_equal(ts_plan_build(elems, 2, 2, 0, &p), TS_EINVAL);
  assert_int_equal(ts_plan_build(elems, 2, 2, 3, &p), TS_EINVAL);
  assert_int_equal(ts_plan_build(with_zero, 2, 2, 64, &p), TS_EINVAL);
  assert_null(p.parts);

  /* More than 2^32 partitions for one tensor. */
  const uint64_t too_many[] = {(1ull << 32) + 1};
  assert_int_equal(ts_plan_build(too_many, 1, 2, 4, &p), TS_EINVAL);
  /* Element counts near 2^64 must not wrap the partition count. */
  const uint64_t huge[] = {UINT64_MAX};
  assert_int_equal(ts_plan_build(huge, 1, 2, 8, &p), TS_EINVAL);
  assert_int_equal(ts_plan_build(huge, 1, 2, 4, &p), TS_EINVAL);
  const uint64_t near[] = {UINT64_MAX - 1};
  assert_int_equal(ts_plan_build(near, 1, 2, 1ull << 40, &p), TS_EINVAL);

  /* partition_bytes of 4 is the minimum, and allowed. */
  assert_int_equal(ts_plan_build(elems, 2, 2, 4, &p), 0);
  check_plan(&p, elems, 2, 2, 4);
  assert_int_equal(p.num_parts, 30);
  ts_plan_free(&p);
  assert_null(p.parts);
}

/* The largest model whose bytes fit in 64 bits plans without wrapping; one element more,
 * or the same bytes spread over two tensors plus one, is refused. */
static void test_huge_tensor(void **state) {
  (void)state;
  ts_plan_t p;
  const uint64_t max1[] = {UINT64_MAX / 4}; /* 2^62 - 1 elements */
  assert_int_equal(ts_plan_build(max1, 1, 3, 1ull << 62, &p), 0);
  assert_int_equal(p.num_parts, 4); /* 2^60 elements per partition at most */
  assert_true(p.parts[0].count == 1ull << 60);
  assert_true(p.parts[3].count == (1ull << 60) - 1);
  assert_true(p.parts[3].offset + p.parts[3].count == UINT64_MAX / 4);
  assert_true(p.shard_bytes[0] + p.shard_bytes[1] + p.shard_bytes[2] == (UINT64_MAX / 4) * 4);
  ts_plan_free(&p);

  const uint64_t over1[] = {UINT64_MAX / 4 + 1};
  assert_int_equal(ts_plan_build(over1, 1, 3, 1ull << 62, &p), TS_EINVAL);
  const uint64_t halves[] = {1ull << 61, (1ull << 61) - 1};
  assert_int_equal(ts_plan_build(halves, 2, 2, 1ull << 62, &p), 0);
  assert_true(p.shard_bytes[0] + p.shard_bytes[1] == UINT64_MAX - 3);
  ts_plan_free(&p);
  const uint64_t halves_over[] = {1ull << 61, 1ull << 61};
  assert_int_equal(ts_plan_build(halves_over, 2, 2, 1ull << 62, &p), TS_EINVAL);
  assert_null(p.parts);
}

static void test_single_small_tensor(void **state) {
  (void)state;
  ts_plan_t p;
  const uint64_t elems[] = {100};
  assert_int_equal(ts_plan_build(elems, 1, 4, 4 << 20, &p), 0);
  check_plan(&p, elems, 1, 4, 4 << 20);
  assert_int_equal(p.num_parts, 1);
  assert_int_equal(p.parts[0].offset, 0);
  assert_int_equal(p.parts[0].count, 100);
  assert_int_equal(p.parts[0].shard, 0);
  assert_int_equal(p.shard_bytes[0], 400);
  assert_int_equal(p.shard_bytes[1], 0);
  assert_int_equal(p.shard_parts[0], 1);
  ts_plan_free(&p);
}

static void test_exact_multiples(void **state) {
  (void)state;
  ts_plan_t p;
  /* 12 elements in partitions of 4 elements: 3 equal partitions; exactly one partition. */
  const uint64_t elems[] = {12, 4};
  assert_int_equal(ts_plan_build(elems, 2, 2, 16, &p), 0);
  check_plan(&p, elems, 2, 2, 16);
  assert_int_equal(p.tensor_parts[0], 3);
  assert_int_equal(p.tensor_parts[1], 1);
  for (size_t i = 0; i < p.num_parts; i++) assert_int_equal(p.parts[i].count, 4);
  /* Four equal partitions over two shards: two each. */
  assert_int_equal(p.shard_parts[0], 2);
  assert_int_equal(p.shard_parts[1], 2);
  ts_plan_free(&p);

  /* One element more than a multiple needs one partition more. */
  const uint64_t plus1[] = {13};
  assert_int_equal(ts_plan_build(plus1, 1, 2, 16, &p), 0);
  check_plan(&p, plus1, 1, 2, 16);
  assert_int_equal(p.num_parts, 4);
  ts_plan_free(&p);

  /* partition_bytes that is not a multiple of 4 rounds down to whole elements. */
  const uint64_t six[] = {6};
  assert_int_equal(ts_plan_build(six, 1, 1, 15, &p), 0);
  check_plan(&p, six, 1, 1, 15);
  assert_int_equal(p.num_parts, 2);
  assert_int_equal(p.parts[0].count, 3);
  ts_plan_free(&p);
}

/* 10 elements, at most 3 per partition: 4 partitions of 3, 3, 2, 2 (not 3, 3, 3, 1). */
static void test_near_equal_split(void **state) {
  (void)state;
  ts_plan_t p;
  const uint64_t elems[] = {10};
  assert_int_equal(ts_plan_build(elems, 1, 1, 12, &p), 0);
  check_plan(&p, elems, 1, 1, 12);
  assert_int_equal(p.num_parts, 4);
  static const uint64_t counts[] = {3, 3, 2, 2}, offsets[] = {0, 3, 6, 8};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(p.parts[i].count, counts[i]);
    assert_int_equal(p.parts[i].offset, offsets[i]);
  }
  ts_plan_free(&p);
}

/* One large tensor and two shards: both hold half of it; no shard idles. */
static void test_large_tensor_spread(void **state) {
  (void)state;
  ts_plan_t p;
  const uint64_t elems[] = {784 * 256, 256, 256 * 10, 10};
  const uint64_t pb = 64 << 10; /* 16384 elements: the weights make 13 partitions */
  assert_int_equal(ts_plan_build(elems, 4, 2, pb, &p), 0);
  check_plan(&p, elems, 4, 2, pb);
  assert_int_equal(p.tensor_parts[0], 13);
  uint32_t on[2] = {0, 0};
  for (uint32_t i = 0; i < p.tensor_parts[0]; i++) on[ts_plan_part(&p, 0, i)->shard]++;
  assert_true(on[0] >= 6);
  assert_true(on[1] >= 6);
  assert_true(p.shard_bytes[0] > 0);
  assert_true(p.shard_bytes[1] > 0);
  ts_plan_free(&p);

  /* Largest first onto the emptiest shard, ties to the lower index. */
  const uint64_t three[] = {5, 7, 6};
  assert_int_equal(ts_plan_build(three, 3, 2, 1 << 20, &p), 0);
  check_plan(&p, three, 3, 2, 1 << 20);
  assert_int_equal(ts_plan_part(&p, 1, 0)->shard, 0); /* 7 -> shard 0 */
  assert_int_equal(ts_plan_part(&p, 2, 0)->shard, 1); /* 6 -> shard 1 */
  assert_int_equal(ts_plan_part(&p, 0, 0)->shard, 1); /* 5 -> shard 1 (24 < 28 bytes) */
  ts_plan_free(&p);

  /* More shards than partitions: each partition alone, the rest empty. */
  const uint64_t two[] = {8, 8};
  assert_int_equal(ts_plan_build(two, 2, 5, 1 << 20, &p), 0);
  check_plan(&p, two, 2, 5, 1 << 20);
  assert_int_equal(p.parts[0].shard, 0);
  assert_int_equal(p.parts[1].shard, 1);
  assert_int_equal(p.shard_bytes[4], 0);
  ts_plan_free(&p);
}

static void assert_plans_equal(const ts_plan_t *a, const ts_plan_t *b) {
  assert_int_equal(a->num_tensors, b->num_tensors);
  assert_int_equal(a->num_shards, b->num_shards);
  assert_int_equal(a->num_parts, b->num_parts);
  for (size_t i = 0; i < a->num_parts; i++) {
    assert_int_equal(a->parts[i].tensor, b->parts[i].tensor);
    assert_int_equal(a->parts[i].part, b->parts[i].part);
    assert_int_equal(a->parts[i].offset, b->parts[i].offset);
    assert_int_equal(a->parts[i].count, b->parts[i].count);
    assert_int_equal(a->parts[i].shard, b->parts[i].shard);
  }
  assert_memory_equal(a->tensor_first, b->tensor_first, a->num_tensors * sizeof *a->tensor_first);
  assert_memory_equal(a->tensor_parts, b->tensor_parts, a->num_tensors * sizeof *a->tensor_parts);
  assert_memory_equal(a->shard_bytes, b->shard_bytes, a->num_shards * sizeof *a->shard_bytes);
  assert_memory_equal(a->shard_parts, b->shard_parts, a->num_shards * sizeof *a->shard_parts);
}

static void test_deterministic(void **state) {
  (void)state;
  /* Many equal-sized partitions make the tie-break rules matter. */
  const uint64_t elems[] = {1000, 1000, 999, 3000, 7, 7, 7, 4096};
  ts_plan_t a, b;
  assert_int_equal(ts_plan_build(elems, 8, 3, 1024, &a), 0);
  assert_int_equal(ts_plan_build(elems, 8, 3, 1024, &b), 0);
  check_plan(&a, elems, 8, 3, 1024);
  assert_plans_equal(&a, &b);
  ts_plan_free(&a);
  ts_plan_free(&b);
}

static void test_alloc_failure(void **state) {
  (void)state;
  const uint64_t elems[] = {100, 200, 300};
  ts_plan_t p;
  int failures = 0;
  for (long k = 1; k < 100; k++) {
    ts_alloc_fail_after(k);
    int rc = ts_plan_build(elems, 3, 2, 64, &p);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      check_plan(&p, elems, 3, 2, 64);
      ts_plan_free(&p);
      break;
    }
    assert_int_equal(rc, TS_ENOMEM);
    assert_null(p.parts);
    failures++;
  }
  assert_int_equal(failures, 6);
}

/* xorshift64*: a fixed-seed generator so the property test is reproducible. */
static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dULL;
}

static void test_property_random(void **state) {
  (void)state;
  uint64_t seed = 0x7e55e7a;
  uint64_t elems[64];
  for (int iter = 0; iter < 500; iter++) {
    uint32_t nt = 1 + (uint32_t)(rng_next(&seed) % 64);
    uint32_t ns = 1 + (uint32_t)(rng_next(&seed) % 9);
    uint64_t pb = 4 + rng_next(&seed) % 4096;
    for (uint32_t t = 0; t < nt; t++) {
      /* Mostly small tensors, some spanning many partitions. */
      uint64_t r = rng_next(&seed);
      elems[t] = 1 + (r % 8 == 0 ? rng_next(&seed) % 100000 : rng_next(&seed) % 2000);
    }
    ts_plan_t a, b;
    int rc = ts_plan_build(elems, nt, ns, pb, &a);
    if (rc != 0) fail_msg("iteration %d: ts_plan_build returned %d", iter, rc);
    check_plan(&a, elems, nt, ns, pb);
    assert_int_equal(ts_plan_build(elems, nt, ns, pb, &b), 0);
    assert_plans_equal(&a, &b);
    ts_plan_free(&a);
    ts_plan_free(&b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invalid_args),
      cmocka_unit_test(test_huge_tensor),
      cmocka_unit_test(test_single_small_tensor),
      cmocka_unit_test(test_exact_multiples),
      cmocka_unit_test(test_near_equal_split),
      cmocka_unit_test(test_large_tensor_spread),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_alloc_failure),
      cmocka_unit_test(test_property_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
