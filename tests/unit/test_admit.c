/*
 * Admission and eviction (server/ts_admit.h) in simulated steps: the sketch never
 * undercounts; admission after K sightings and by probability, the same for a key every
 * time; the steps-to-live sweep, whole or a piece per tick; the sampled LRU picks old rows;
 * a stream of 10 x the capacity in distinct keys keeps the table at its capacity.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_admit.h"
#include "ts_err.h"
#include "ts_key.h"
#include "ts_table.h"

static void test_sketch_never_undercounts(void **state) {
  (void)state;
  ts_admit_sketch_t s;
  assert_int_equal(ts_admit_sketch_init(&s, 1 << 16, 7), 0);
  const uint32_t keys = 20000;
  double over = 0;
  for (uint32_t k = 0; k < keys; k++) {
    uint32_t times = k % 5 + 1, est = 0;
    for (uint32_t i = 0; i < times; i++) est = ts_admit_sketch_add(&s, ts_key_hash(k));
    assert_true(est >= times);
    over += est - times;
  }
  assert_true(over / keys < 0.05); /* 60k sightings in 4 x 65536 counters: few collisions */
  ts_admit_sketch_free(&s);
}

static void test_admit_by_count(void **state) {
  (void)state;
  ts_admit_policy_t p = {.admit_count = 3, .admit_probability = 1.0};
  ts_admit_sketch_t s;
  assert_int_equal(ts_admit_sketch_init(&s, 4096, 1), 0);
  assert_false(ts_admit_key(&p, &s, 99));
  assert_false(ts_admit_key(&p, &s, 99));
  assert_true(ts_admit_key(&p, &s, 99));
  assert_false(ts_admit_key(&p, &s, 100));
  p.admit_count = 1;
  assert_true(ts_admit_key(&p, NULL, 101));
  ts_admit_sketch_free(&s);
}

static void test_admit_by_probability(void **state) {
  (void)state;
  ts_admit_policy_t p = {.admit_count = 0, .admit_probability = 0.3, .seed = 5};
  uint32_t in = 0;
  const uint32_t keys = 100000;
  for (uint32_t k = 0; k < keys; k++) {
    bool a = ts_admit_key(&p, NULL, k);
    assert_int_equal(a, ts_admit_key(&p, NULL, k)); /* the same answer for a key */
    in += a;
  }
  assert_true(in > 0.29 * keys && in < 0.31 * keys);
  /* Another seed admits other keys. */
  ts_admit_policy_t q = p;
  q.seed = 6;
  uint32_t both = 0;
  for (uint32_t k = 0; k < keys; k++)
    both += ts_admit_key(&p, NULL, k) && ts_admit_key(&q, NULL, k);
  assert_true(both > 0.08 * keys && both < 0.10 * keys);
}

/* A table of n rows, row i last touched at step i. */
static void fill(ts_table_t *t, uint32_t n) {
  assert_int_equal(ts_table_init(t, 4, 0, 0), 0);
  for (uint32_t i = 0; i < n; i++) {
    bool created;
    int err;
    uint32_t id = ts_table_insert(t, ts_key_hash(i), &created, &err);
    assert_true(id != TS_TABLE_NONE);
    ts_table_meta(t, id)->last_step = i;
  }
}

/* The step of a row of fill()'s table: its key's index. */
static uint32_t step_of(uint64_t key) {
  uint32_t k = 0;
  while (ts_key_hash(k) != key) k++;
  return k;
}

static void test_expire(void **state) {
  (void)state;
  ts_admit_policy_t p = {.steps_to_live = 500, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 1000);
  uint32_t cursor = 0;
  /* A piece of 100 slots per tick: after 10 ticks every row was looked at once. */
  size_t gone = 0;
  uint64_t keys[100];
  for (int tick = 0; tick < 10; tick++) {
    size_t n = ts_admit_expire(&p, &t, 1000, &cursor, 100, keys);
    for (size_t i = 0; i < n; i++) assert_int_equal(ts_table_find(&t, keys[i]), TS_TABLE_NONE);
    gone += n;
  }
  assert_int_equal(gone, 500); /* steps 0..499 are more than 500 steps old at 1000 */
  assert_int_equal(t.size, 500);
  for (uint32_t i = 0; i < 1000; i++)
    assert_int_equal(ts_table_find(&t, ts_key_hash(i)) != TS_TABLE_NONE, i >= 500);
  p.steps_to_live = 0; /* never */
  assert_int_equal(ts_admit_expire(&p, &t, 1u << 30, &cursor, 1000, NULL), 0);
  ts_table_free(&t);
}

/* The mean age rank (0: the oldest row) of 200 rows evicted from 10,000 aged by index, with
 * `sample` rows drawn an eviction; the table is left at 9,800 rows. */
static double mean_victim_rank(uint32_t sample, uint64_t rng) {
  ts_admit_policy_t p = {.sample = sample, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 10000);
  ts_admit_pool_t pool = {0};
  uint64_t key;
  double rank = 0;
  for (int i = 0; i < 200; i++) {
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, &key));
    rank += step_of(key) / 10000.0; /* the row's step is its index */
  }
  assert_int_equal(t.size, 9800);
  ts_table_free(&t);
  assert_false(ts_admit_evict_lru(&p, &t, &pool, &rng, &key)); /* empty */
  return rank / 200;
}

static void test_lru_picks_old_rows(void **state) {
  (void)state;
  /* The oldest of 16 random rows is at rank 1/17 = 0.059 on average; the pool does better. */
  assert_true(mean_victim_rank(16, 12345) < 0.1);
  /* The shard's setting, 8 an eviction: the pool makes each victim the oldest of many more
   * rows than its own 8 (without it the mean rank would be 1/9 = 0.111; it is 0.068). */
  assert_true(mean_victim_rank(8, 777) < 0.08);
}

/* A candidate touched after it was sampled, or erased (and its slot made another key's),
 * is never the victim: the pool checks its row is still as sampled. */
static void test_lru_pool_skips_changed_rows(void **state) {
  (void)state;
  ts_admit_policy_t p = {.sample = 16, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 1000);
  ts_admit_pool_t pool = {0};
  uint64_t rng = 4242, key;
  assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, &key));
  assert_true(pool.n >= 2);
  /* the pool's oldest now touched, its next erased and its slot reused by a new key */
  ts_admit_cand_t touched = pool.c[0], gone = pool.c[1];
  ts_table_meta(&t, touched.id)->last_step = 1u << 20;
  assert_true(ts_table_erase(&t, gone.key));
  bool created;
  int err;
  uint32_t id = ts_table_insert(&t, ts_key_hash(5000), &created, &err);
  assert_int_equal(id, gone.id);
  ts_table_meta(&t, id)->last_step = 0; /* older than anything: but not a sampled row */
  for (int i = 0; i < 50; i++) {
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, &key));
    assert_true(key != touched.key && key != gone.key);
    if (key == ts_key_hash(5000)) break; /* sampled afresh: then it may go */
  }
  ts_table_free(&t);
}

/* Capacity 1000, 10,000 distinct keys streaming through, each step touching its key: the
 * table stays at 1000 rows and its memory stops growing once full. */
static void test_stream_through_capacity(void **state) {
  (void)state;
  ts_admit_policy_t p = {.sample = 8, .admit_probability = 1.0};
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 16, 2, 1000), 0);
  ts_admit_pool_t pool = {0};
  uint64_t rng = 99, evicted, full_bytes = 0;
  for (uint64_t step = 0; step < 10000; step++) {
    bool created;
    int err;
    uint32_t id = ts_table_insert(&t, ts_key_hash(step), &created, &err);
    if (id == TS_TABLE_NONE) {
      assert_int_equal(err, TS_ETOOBIG);
      assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, &evicted));
      id = ts_table_insert(&t, ts_key_hash(step), &created, &err);
    }
    assert_true(id != TS_TABLE_NONE && created);
    ts_table_meta(&t, id)->last_step = step;
    assert_true(t.size <= 1000);
    if (step == 1000) full_bytes = ts_table_bytes(&t);
  }
  assert_int_equal(t.size, 1000);
  assert_int_equal(ts_table_bytes(&t), full_bytes);
  ts_table_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sketch_never_undercounts),
      cmocka_unit_test(test_admit_by_count),
      cmocka_unit_test(test_admit_by_probability),
      cmocka_unit_test(test_expire),
      cmocka_unit_test(test_lru_picks_old_rows),
      cmocka_unit_test(test_lru_pool_skips_changed_rows),
      cmocka_unit_test(test_stream_through_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
