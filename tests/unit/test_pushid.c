/* The applied-push-id table (server/ts_pushid.h): the window of one partition (new ids,
 * repeats, out-of-order retries inside the window, ids below it), clients of one task in
 * their slots (least recently used taken over, counted), tasks apart, a new model, bounded
 * memory whatever ids and clients arrive, and detection turned off. Pure: milliseconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_err.h"
#include "ts_pushid.h"

static void test_window(void **state) {
  (void)state;
  ts_pushid_window_t w = {0, 0};
  assert_false(ts_pushid_seen(&w, 0));
  assert_false(ts_pushid_seen(&w, 1));
  ts_pushid_record(&w, 0); /* no id: nothing recorded */
  assert_int_equal(w.top, 0);
  ts_pushid_record(&w, 5);
  assert_true(ts_pushid_seen(&w, 5));
  assert_false(ts_pushid_seen(&w, 0));
  assert_false(ts_pushid_seen(&w, 6));
  assert_false(ts_pushid_seen(&w, 4)); /* never applied, inside the window */
  ts_pushid_record(&w, 7);
  assert_true(ts_pushid_seen(&w, 5));
  assert_true(ts_pushid_seen(&w, 7));
  assert_false(ts_pushid_seen(&w, 6));
  ts_pushid_record(&w, 6); /* a retry that arrives after a later push: applied once */
  assert_true(ts_pushid_seen(&w, 6));
  assert_int_equal(w.top, 7);
  /* 64 ids back is the edge of the window; 65 back is below it: taken as applied. */
  ts_pushid_record(&w, 7 + 64);
  assert_true(ts_pushid_seen(&w, 7));
  assert_false(ts_pushid_seen(&w, 8));
  assert_true(ts_pushid_seen(&w, 6));
  ts_pushid_record(&w, 7 + 65);
  assert_true(ts_pushid_seen(&w, 7 + 64));
  assert_false(ts_pushid_seen(&w, 9));
  /* A jump past the window forgets it all but the top. */
  ts_pushid_record(&w, 1000);
  assert_true(ts_pushid_seen(&w, 1000));
  assert_false(ts_pushid_seen(&w, 999));
  assert_true(ts_pushid_seen(&w, 1000 - 65));
}

/* Every id in a window of 64 behind the top, recorded out of order, is seen exactly once. */
static void test_window_exhaustive(void **state) {
  (void)state;
  ts_pushid_window_t w = {0, 0};
  ts_pushid_record(&w, 200);
  for (uint64_t id = 199; id >= 136; id -= 2) {
    assert_false(ts_pushid_seen(&w, id));
    ts_pushid_record(&w, id);
  }
  for (uint64_t id = 136; id <= 200; id++)
    assert_int_equal(ts_pushid_seen(&w, id), (id % 2) == 1 || id == 200);
  for (uint64_t id = 1; id < 136; id++) assert_true(ts_pushid_seen(&w, id));
}

static void test_slots(void **state) {
  (void)state;
  ts_pushid_t t;
  assert_int_equal(ts_pushid_init(&t, 2, 2), 0);
  bool ev;
  assert_null(ts_pushid_lookup(&t, -1, 1, 4, &ev));
  assert_null(ts_pushid_lookup(&t, 2, 1, 4, &ev));
  ts_pushid_window_t *a = ts_pushid_lookup(&t, 0, 0xA, 4, &ev);
  assert_non_null(a);
  assert_false(ev);
  ts_pushid_record(&a[3], 9);
  /* Another client of the same task has its own windows; so has another task. */
  ts_pushid_window_t *b = ts_pushid_lookup(&t, 0, 0xB, 4, &ev);
  assert_false(ev);
  assert_false(ts_pushid_seen(&b[3], 9));
  ts_pushid_window_t *o = ts_pushid_lookup(&t, 1, 0xA, 4, &ev);
  assert_false(ts_pushid_seen(&o[3], 9));
  a = ts_pushid_lookup(&t, 0, 0xA, 4, &ev);
  assert_true(ts_pushid_seen(&a[3], 9));
  assert_false(ts_pushid_seen(&a[2], 9));
  /* A third client of task 0 takes the least recently used slot: B's, not A's. */
  ts_pushid_window_t *c = ts_pushid_lookup(&t, 0, 0xC, 4, &ev);
  assert_true(ev);
  assert_int_equal(t.evictions, 1);
  assert_false(ts_pushid_seen(&c[3], 9));
  a = ts_pushid_lookup(&t, 0, 0xA, 4, &ev);
  assert_false(ev);
  assert_true(ts_pushid_seen(&a[3], 9));
  b = ts_pushid_lookup(&t, 0, 0xB, 4, &ev); /* B comes back as new, taking C's */
  assert_true(ev);
  assert_false(ts_pushid_seen(&b[3], 9));
  /* A new model (another partition count) forgets every client. */
  a = ts_pushid_lookup(&t, 0, 0xA, 5, &ev);
  assert_false(ev);
  assert_false(ts_pushid_seen(&a[3], 9));
  ts_pushid_record(&a[4], 3);
  ts_pushid_reset(&t);
  a = ts_pushid_lookup(&t, 0, 0xA, 5, &ev);
  assert_false(ts_pushid_seen(&a[4], 3));
  ts_pushid_free(&t);
}

/* Whatever ids and clients arrive, the memory stays what the job allows. */
static void test_bounded(void **state) {
  (void)state;
  ts_pushid_t t;
  const uint32_t workers = 3, per = 4;
  const size_t parts = 10;
  assert_int_equal(ts_pushid_init(&t, workers, per), 0);
  uint64_t bound = workers * per * (sizeof(ts_pushid_slot_t) + parts * sizeof(ts_pushid_window_t));
  for (uint64_t k = 1; k <= 20000; k++) {
    ts_pushid_window_t *w =
        ts_pushid_lookup(&t, (int)(k % workers), k * 0x9E3779B97F4A7C15u, parts, NULL);
    assert_non_null(w);
    ts_pushid_record(&w[k % parts], k);
    assert_true(t.bytes <= bound);
  }
  assert_int_equal(t.bytes, bound);
  assert_int_equal(t.evictions, 20000 - workers * per);
  ts_pushid_free(&t);
  assert_int_equal(t.bytes, 0);
}

static void test_off(void **state) {
  (void)state;
  ts_pushid_t t;
  assert_int_equal(ts_pushid_init(&t, 4, 0), 0);
  assert_null(ts_pushid_lookup(&t, 0, 1, 4, NULL));
  assert_int_equal(t.bytes, 0);
  ts_pushid_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window), cmocka_unit_test(test_window_exhaustive),
      cmocka_unit_test(test_slots),  cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
