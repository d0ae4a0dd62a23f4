/*
 * A shard's row table (server/ts_table.h): a million random inserts, finds and erases
 * against a reference; rows never move while the index grows; max_rows; the walk over live
 * rows; allocation failures leave the table as it was; memory per row against the raw
 * value + state bytes; a key listing in pages (ts_table_keys) across growth and erasures;
 * a large table's next index made ahead on a thread and taken by the grow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_key.h"
#include "ts_table.h"

#define DOMAIN 100000

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Key k of the domain: spread over 64 bits (and colliding in the index's low bits often). */
static uint64_t key_of(uint32_t k) {
  return (uint64_t)k * 0x100000001ULL + ((uint64_t)k << 52);
}

static void test_random_operations(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 4, 1, 0), 0);
  uint32_t *ref = malloc(DOMAIN * sizeof *ref); /* row id of key k, or NONE */
  assert_non_null(ref);
  memset(ref, 0xff, DOMAIN * sizeof *ref);
  size_t live = 0;
  for (int op = 0; op < 1000000; op++) {
    uint32_t k = (uint32_t)(next() % DOMAIN);
    uint64_t key = key_of(k);
    uint64_t r = next() % 10;
    if (r < 5) {
      bool created;
      int err;
      uint32_t id = ts_table_insert(&t, key, &created, &err);
      assert_int_equal(err, 0);
      assert_true(id != TS_TABLE_NONE);
      assert_int_equal(created, ref[k] == TS_TABLE_NONE);
      if (created) {
        float *row = ts_table_row(&t, id);
        for (int j = 0; j < 8; j++) assert_true(row[j] == 0.0f);
        row[0] = (float)k; /* the row remembers its key */
        ref[k] = id;
        live++;
      } else {
        assert_int_equal(id, ref[k]);
      }
    } else if (r < 8) {
      uint32_t id = ts_table_find(&t, key);
      assert_int_equal(id, ref[k]);
      if (id != TS_TABLE_NONE) {
        assert_true(ts_table_row(&t, id)[0] == (float)k);
        assert_true(ts_table_meta(&t, id)->key == key && ts_table_live(ts_table_meta(&t, id)));
      }
    } else {
      bool had = ts_table_erase(&t, key);
      assert_int_equal(had, ref[k] != TS_TABLE_NONE);
      if (had) live--;
      ref[k] = TS_TABLE_NONE;
      assert_int_equal(ts_table_find(&t, key), TS_TABLE_NONE);
    }
    assert_int_equal(t.size, live);
  }
  /* Every key found or not as the reference says; the walk gives the live rows once. */
  size_t walked = 0;
  uint32_t cursor = 0, id;
  while ((id = ts_table_next(&t, &cursor)) != TS_TABLE_NONE) {
    uint32_t k = (uint32_t)ts_table_row(&t, id)[0];
    assert_int_equal(ref[k], id);
    walked++;
  }
  assert_int_equal(walked, live);
  for (uint32_t k = 0; k < DOMAIN; k++) assert_int_equal(ts_table_find(&t, key_of(k)), ref[k]);
  /* Erased rows' slots are reused: never more rows handed out than ever lived at once. */
  assert_true(t.next_row <= DOMAIN);
  free(ref);
  ts_table_free(&t);
}

static void test_rows_do_not_move(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 16, 2, 0), 0);
  bool created;
  int err;
  uint32_t first = ts_table_insert(&t, 42, &created, &err);
  float *p = ts_table_row(&t, first);
  p[5] = 1.5f;
  for (uint64_t k = 1000; k < 200000; k++) ts_table_insert(&t, k, &created, &err);
  assert_true(t.cap >= 2 * t.size);
  assert_ptr_equal(ts_table_row(&t, ts_table_find(&t, 42)), p);
  assert_true(p[5] == 1.5f);
  ts_table_free(&t);
  assert_int_equal(t.size, 0);
  assert_int_equal(ts_table_find(&t, 42), TS_TABLE_NONE);
}

/* Pages of 7 keys, at most 9 slots a page: every live key once, the erased ones not,
 * keys inserted between pages (the index growing) do not repeat the old ones, and
 * `erased` counts erasures and a clear. */
static void test_keys_in_pages(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 2, 0, 0), 0);
  bool created;
  int err;
  for (uint64_t k = 0; k < 300; k++) ts_table_insert(&t, k * 31, &created, &err);
  for (uint64_t k = 0; k < 300; k += 3) assert_true(ts_table_erase(&t, k * 31));
  assert_int_equal(t.erased, 100);
  static uint8_t seen[60000];
  uint64_t cursor = 0, out[7];
  size_t total = 0, pages = 0;
  while (cursor < t.next_row) {
    size_t n = ts_table_keys(&t, &cursor, out, 7, 9);
    assert_true(n <= 7);
    for (size_t i = 0; i < n; i++) {
      assert_true(out[i] < sizeof seen);
      assert_int_equal(seen[out[i]]++, 0);
    }
    total += n;
    if (++pages == 3) /* the table grows 30-fold mid-walk: old keys keep their slots */
      for (uint64_t k = 0; k < 9000; k++) ts_table_insert(&t, 20000 + k * 4, &created, &err);
  }
  for (uint64_t k = 0; k < 300; k++) assert_int_equal(seen[k * 31], k % 3 != 0);
  /* the new rows: in the free slots (those before the cursor unlisted), then past it */
  assert_true(total >= 200 + 9000 - 9 * 3 - 100);
  cursor = t.next_row;
  assert_int_equal(ts_table_keys(&t, &cursor, out, 7, 9), 0);
  size_t live = t.size;
  ts_table_free(&t);
  assert_int_equal(t.erased, 100 + live);
}

static void test_max_rows(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 8, 0, 100), 0);
  bool created;
  int err;
  for (uint64_t k = 0; k < 100; k++)
    assert_true(ts_table_insert(&t, k, &created, &err) != TS_TABLE_NONE);
  assert_int_equal(ts_table_insert(&t, 100, &created, &err), TS_TABLE_NONE);
  assert_int_equal(err, TS_ETOOBIG);
  assert_true(ts_table_insert(&t, 7, &created, &err) != TS_TABLE_NONE && !created); /* present */
  assert_true(ts_table_erase(&t, 7));
  assert_true(ts_table_insert(&t, 100, &created, &err) != TS_TABLE_NONE && created);
  ts_table_free(&t);
  assert_int_equal(ts_table_init(&t, 0, 0, 0), TS_EINVAL);
  assert_int_equal(ts_table_init(&t, 4, 3, 0), TS_EINVAL);
}

static void test_allocation_failures(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 8, 1, 0), 0);
  bool created;
  int err;
  /* Each of the first allocations failing in turn: no row, no change. */
  for (long n = 1; n <= 6; n++) {
    ts_alloc_fail_after(n);
    uint32_t id = TS_TABLE_NONE;
    uint64_t k = 0;
    for (; k < 20000; k++) {
      id = ts_table_insert(&t, k, &created, &err);
      if (id == TS_TABLE_NONE) break;
    }
    ts_alloc_fail_after(0);
    if (id == TS_TABLE_NONE) {
      assert_int_equal(err, TS_ENOMEM);
      assert_int_equal(ts_table_find(&t, k), TS_TABLE_NONE);
      assert_int_equal(t.size, k);
    }
    for (uint64_t j = 0; j < k; j++) assert_true(ts_table_find(&t, j) != TS_TABLE_NONE);
    ts_table_free(&t);
  }
}

/* dim 64 with Adam's two state buffers, a million rows: what the table holds per row
 * against the raw value + state bytes (the budget's per-row bound too). */
static void test_bytes_per_row(void **state) {
  (void)state;
  ts_table_t t;
  assert_int_equal(ts_table_init(&t, 64, 2, 0), 0);
  bool created;
  int err;
  const uint64_t rows = 1000000;
  for (uint64_t k = 0; k < rows; k++) ts_table_insert(&t, ts_key_hash(k), &created, &err);
  double raw = 64.0 * 3 * sizeof(float);
  double per = (double)ts_table_bytes(&t) / (double)rows;
  print_message("dim 64 + 2 state buffers: %.1f bytes a row, %.3f x the raw %.0f\n", per, per / raw,
                raw);
  assert_true(per <= 1.3 * raw);
  assert_true(per <= (double)ts_table_row_bytes(64, 2) * 1.01);
  ts_table_free(&t);
}

/* Insert keys [from, to) of table t, each new. */
static void insert_range(ts_table_t *t, uint64_t from, uint64_t to) {
  bool created;
  int err;
  for (uint64_t k = from; k < to; k++) {
    assert_true(ts_table_insert(t, ts_key_hash(k), &created, &err) != TS_TABLE_NONE);
    assert_true(created);
  }
}

/* The next index is made ahead once the index has TS_TABLE_PREPARE_MIN slots and 3/8 of
 * them hold rows: counted in the table's bytes from then on, not again by the insert that
 * grows the index, which takes it; the table ends as one grown without it. */
static void test_index_made_ahead(void **state) {
  (void)state;
  ts_table_t t, plain;
  assert_int_equal(ts_table_init(&t, 1, 0, 0), 0);
  assert_int_equal(ts_table_init(&plain, 1, 0, 0), 0);
  const size_t cap = TS_TABLE_PREPARE_MIN, at = cap / 8 * 3;
  insert_range(&t, 0, at - 1);
  assert_int_equal(t.cap, cap);
  assert_int_equal(ts_table_prepare_cost(&t), 0); /* under 3/8 */
  insert_range(&t, at - 1, at);
  assert_int_equal(ts_table_prepare_cost(&t), cap * 2 * sizeof(uint64_t));
  /* and room for the rows before the grow, (cap / 2 - at) of 4 + 32 bytes */
  assert_true(ts_table_prepare_room(&t) >= cap * 2 * sizeof(uint64_t) + (cap / 2 - at) * 36);
  uint64_t before = ts_table_bytes(&t);
  ts_table_prepare_grow(&t);
  assert_non_null(t.next_index);
  assert_int_equal(ts_table_bytes(&t), before + cap * 2 * sizeof(uint64_t));
  assert_int_equal(ts_table_prepare_cost(&t), 0); /* one at a time */
  insert_range(&t, at, cap / 2);
  assert_true(ts_table_insert_cost(&t) < cap * 2 * sizeof(uint64_t)); /* its index paid for */
  insert_range(&t, cap / 2, cap / 2 + 1000);
  assert_int_equal(t.cap, cap * 2);
  assert_null(t.next_index);
  insert_range(&plain, 0, cap / 2 + 1000);
  assert_int_equal(ts_table_bytes(&t), ts_table_bytes(&plain));
  for (uint64_t k = 0; k < cap / 2 + 1000; k++)
    assert_int_equal(ts_table_find(&t, ts_key_hash(k)), ts_table_find(&plain, ts_key_hash(k)));
  assert_int_equal(ts_table_find(&t, ts_key_hash(cap)), TS_TABLE_NONE);
  ts_table_free(&plain);
  /* A table freed while its next index is being made (the thread frees it when done). */
  insert_range(&t, cap / 2 + 1000, cap / 8 * 6 + 1);
  ts_table_prepare_grow(&t);
  assert_non_null(t.next_index);
  ts_table_free(&t);
  assert_null(t.next_index);
  /* None where the table may not grow that far, nor for a small index. */
  assert_int_equal(ts_table_init(&t, 1, 0, cap / 2), 0);
  insert_range(&t, 0, at);
  assert_int_equal(ts_table_prepare_cost(&t), 0);
  ts_table_free(&t);
  assert_int_equal(ts_table_init(&t, 1, 0, 0), 0);
  insert_range(&t, 0, 1000);
  assert_int_equal(ts_table_prepare_cost(&t), 0);
  ts_table_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_operations), cmocka_unit_test(test_rows_do_not_move),
      cmocka_unit_test(test_max_rows),          cmocka_unit_test(test_allocation_failures),
      cmocka_unit_test(test_bytes_per_row),     cmocka_unit_test(test_keys_in_pages),
      cmocka_unit_test(test_index_made_ahead),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
