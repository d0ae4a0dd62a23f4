/*
 * Admission and eviction (server/ts_admit.h) in simulated steps: the sketch never
 * undercounts; admission after K sightings and by probability, the same for a key every
 * time; the steps-to-live sweep, whole or a piece per tick; the sampled LRU and its hand
 * pick old rows; a stream of 10 x the capacity in distinct keys keeps the table at its capacity.
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

/* A step later than any row's: every row may go. */
#define NOW UINT64_MAX

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
 * `sample` rows drawn an eviction and the samples choosing every victim (the hand never
 * has a bar); the table is left at 9,800 rows. */
static double mean_sampled_rank(uint32_t sample, uint64_t rng) {
  ts_admit_policy_t p = {.sample = sample, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 10000);
  ts_admit_pool_t pool = {0};
  uint64_t key;
  double rank = 0;
  for (int i = 0; i < 200; i++) {
    pool.have_bar = false;
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key));
    rank += step_of(key) / 10000.0; /* the row's step is its index */
  }
  assert_int_equal(t.size, 9800);
  ts_table_free(&t);
  assert_false(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key)); /* empty */
  return rank / 200;
}

static void test_lru_samples_pick_old_rows(void **state) {
  (void)state;
  /* The oldest of 16 random rows is at rank 1/17 = 0.059 on average; the pool does better. */
  assert_true(mean_sampled_rank(16, 12345) < 0.1);
  /* The shard's setting, 8 an eviction: the pool makes each victim the oldest of many more
   * rows than its own 8 (without it the mean rank would be 1/9 = 0.111; it is 0.068). */
  assert_true(mean_sampled_rank(8, 777) < 0.08);
}

/* Live rows counted by last_step (a Fenwick tree), for a victim's exact age rank. */
typedef struct {
  int32_t *c;
  size_t n;
} by_step_t;
static void by_step_add(by_step_t *f, uint64_t step, int32_t d) {
  for (size_t i = step + 1; i <= f->n; i += i & (~i + 1)) f->c[i - 1] += d;
}
static uint64_t by_step_below(const by_step_t *f, uint64_t step) {
  uint64_t n = 0;
  for (size_t i = step; i > 0; i -= i & (~i + 1)) n += (uint64_t)f->c[i - 1];
  return n;
}

/* A table of 20,000 rows in a long job (its draws seeded by rng): each step touches 40
 * keys drawn from the 30,000 made last (those still rows are used again, so ages end up
 * in no order of row id) and makes 10 new ones, each evicting a row; 100,000 evictions.
 * Returns their mean age rank (the share of live rows used before the victim), with the
 * hand (hand true) or the samples choosing every victim; *by_hand counts the hand's. */
static double long_job_rank(bool hand, uint64_t rng, uint64_t *by_hand) {
  enum { CAP = 20000, STEPS = 12000, TOUCH = 40, NEW = 10, RECENT = 30000 };
  ts_admit_policy_t p = {.sample = 8, .admit_probability = 1.0};
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 4, 0, CAP), 0);
  by_step_t live = {calloc(STEPS + 2, sizeof(int32_t)), STEPS + 2};
  uint64_t *step_of_key = calloc((size_t)STEPS * NEW, sizeof *step_of_key); /* key k's step */
  assert_non_null(live.c);
  assert_non_null(step_of_key);
  ts_admit_pool_t pool = {0};
  uint64_t next_key = 0, draw = rng, evictions = 0;
  double rank = 0;
  for (uint64_t step = 1; step <= STEPS; step++) {
    for (int i = 0; i < TOUCH && next_key > 0; i++) {
      draw = ts_key_hash(draw);
      uint64_t span = next_key < RECENT ? next_key : RECENT, k = next_key - 1 - draw % span;
      uint32_t id = ts_table_find(&t, k);
      if (id == TS_TABLE_NONE) continue;
      by_step_add(&live, step_of_key[k], -1);
      by_step_add(&live, step, 1);
      step_of_key[k] = step;
      ts_table_meta(&t, id)->last_step = step;
    }
    for (int i = 0; i < NEW; i++, next_key++) {
      if (t.size == CAP) {
        uint64_t victim;
        if (!hand) pool.have_bar = false;
        uint32_t run = pool.run;
        assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, step, &victim));
        *by_hand += pool.run == run + 1;
        rank += (double)by_step_below(&live, step_of_key[victim]) / CAP;
        by_step_add(&live, step_of_key[victim], -1);
        evictions++;
      }
      bool created;
      int err;
      uint32_t id = ts_table_insert(&t, next_key, &created, &err);
      assert_true(id != TS_TABLE_NONE && created);
      ts_table_meta(&t, id)->last_step = step;
      step_of_key[next_key] = step;
      by_step_add(&live, step, 1);
    }
  }
  assert_int_equal(evictions, (uint64_t)STEPS * NEW - CAP);
  free(live.c);
  free(step_of_key);
  ts_table_free(&t);
  return rank / (double)evictions;
}

/* The hand takes rows used no later than the samples' last victim, and the samples set
 * that bar again every TS_ADMIT_HAND_RUN of its rows: in a long job with ages in no order
 * of row id its victims are as old as the samples' own. */
static void test_lru_hand_as_old_as_samples(void **state) {
  (void)state;
  uint64_t by_hand = 0, none = 0;
  double hand = 0, sampled = 0;
  for (uint64_t seed = 1; seed <= 5; seed++) {
    hand += long_job_rank(true, seed * 4242, &by_hand) / 5;
    sampled += long_job_rank(false, seed * 4242, &none) / 5;
  }
  print_message(
      "mean victim rank over 5 x 100,000 evictions: hand %.4f (%.1f %% of them the hand's), "
      "samples alone %.4f\n",
      hand, by_hand / 5000.0, sampled);
  assert_true(sampled < 0.1);
  assert_true(hand <= sampled * 1.1);
  assert_true(by_hand > 5 * 80000);
  assert_int_equal(none, 0);
}

/* The hand, given a bar, takes the rows in row order that were used no later, passes the
 * ones used since, and hands the choice back to the samples after TS_ADMIT_HAND_RUN. */
static void test_lru_hand_takes_rows_in_order(void **state) {
  (void)state;
  ts_admit_policy_t p = {.sample = 8, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 10000); /* row i (key i) at step i */
  for (uint32_t i = 10; i < 20; i++) ts_table_meta(&t, i)->last_step = 50000; /* used since */
  ts_admit_pool_t pool = {.have_bar = true, .bar = 5000};
  uint64_t rng = 31, key;
  uint32_t want = 0;
  for (int i = 0; i < TS_ADMIT_HAND_RUN; i++) {
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key));
    if (want == 10) want = 20; /* passed */
    assert_int_equal(step_of(key), want++);
  }
  for (uint32_t i = 10; i < 20; i++)
    assert_true(ts_table_find(&t, ts_key_hash(i)) != TS_TABLE_NONE);
  /* The next is the samples' (anywhere in the table), and sets a new bar. */
  assert_true(pool.sample_next);
  assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key));
  assert_true(pool.run == 0 && pool.bar == step_of(key));
  ts_table_free(&t);
}

/* Rows in use laid out first (the hot rows of a stream) are never the hand's: it passes
 * them a stretch at a time while the samples choose, and then takes the old rows after
 * them in order. Nor is a row used by the request being served, whatever the bar. */
static void test_lru_hand_spares_rows_in_use(void **state) {
  (void)state;
  ts_admit_policy_t p = {.sample = 8, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 10000);
  for (uint32_t i = 0; i < 2000; i++) ts_table_meta(&t, i)->last_step = 20000 + i;
  ts_admit_pool_t pool = {0};
  uint64_t rng = 5, key;
  uint32_t in_order = 0;
  for (int i = 0; i < 4000; i++) {
    uint32_t chosen = pool.have_bar && !pool.sample_next ? pool.next : TS_TABLE_NONE;
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, 30000, &key));
    assert_true(step_of(key) >= 2000);  /* the hot rows stay */
    in_order += step_of(key) == chosen; /* the hand's (fill: row i holds key i) */
  }
  assert_true(pool.hand > 2000); /* past the hot rows */
  assert_true(in_order > 3000);  /* most victims the hand's */
  assert_int_equal(t.size, 6000);
  ts_table_free(&t);

  fill(&t, 1000);
  ts_table_meta(&t, 0)->last_step = 777; /* made or used by the request at step 777 */
  pool = (ts_admit_pool_t){.have_bar = true, .bar = 1u << 20};
  assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, 777, &key));
  assert_int_equal(step_of(key), 1); /* passed row 0 */
  ts_table_free(&t);
}

/* A candidate touched after it was sampled, or erased (and its slot made another key's),
 * is never the samples' victim: the pool checks its row is still as sampled. */
static void test_lru_pool_skips_changed_rows(void **state) {
  (void)state;
  ts_admit_policy_t p = {.sample = 16, .admit_probability = 1.0};
  ts_table_t t;
  fill(&t, 1000);
  ts_admit_pool_t pool = {0};
  uint64_t rng = 4242, key;
  assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key));
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
    pool.have_bar = false; /* the samples' choice every time */
    assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, NOW, &key));
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
      assert_true(ts_admit_evict_lru(&p, &t, &pool, &rng, step, &evicted));
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
      cmocka_unit_test(test_lru_samples_pick_old_rows),
      cmocka_unit_test(test_lru_hand_as_old_as_samples),
      cmocka_unit_test(test_lru_hand_takes_rows_in_order),
      cmocka_unit_test(test_lru_hand_spares_rows_in_use),
      cmocka_unit_test(test_lru_pool_skips_changed_rows),
      cmocka_unit_test(test_stream_through_capacity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
