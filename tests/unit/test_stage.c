/* The staging buffer pool (server/ts_stage.h): its size, first come first served for the
 * sessions queued for a buffer, taking a waiter out of the queue anywhere in it, and
 * allocation failure (queue while someone holds a buffer that will come back; an error
 * when nobody does); the buffers, as parameter memory, come from ts_huge_alloc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_stage.h"

#define MIB ((size_t)1 << 20)

static void test_cap(void **state) {
  (void)state;
  ts_stage_t st;
  assert_int_equal(ts_stage_init(&st, 4 * MIB, 16 * MIB), 0);
  assert_int_equal(st.cap, 4);
  ts_stage_free(&st);
  /* Never fewer than two, even when one buffer is over the budget. */
  assert_int_equal(ts_stage_init(&st, 64 * MIB, 16 * MIB), 0);
  assert_int_equal(st.cap, 2);
  ts_stage_free(&st);
  ts_alloc_fail_after(1);
  assert_int_equal(ts_stage_init(&st, MIB, 16 * MIB), TS_ENOMEM);
  ts_alloc_fail_after(0);
}

static void test_fifo_and_cancel(void **state) {
  (void)state;
  ts_stage_t st;
  assert_int_equal(ts_stage_init(&st, MIB, 2 * MIB), 0);
  ts_stage_waiter_t w[5] = {{0}};
  float *a, *b, *x;
  assert_int_equal(ts_stage_acquire(&st, &w[0], &a), 0);
  assert_int_equal(ts_stage_acquire(&st, &w[1], &b), 0);
  assert_non_null(a);
  assert_non_null(b);
  for (int i = 2; i < 5; i++) {
    assert_int_equal(ts_stage_acquire(&st, &w[i], &x), 1);
    assert_null(x);
    assert_true(w[i].queued);
  }
  /* The middle waiter leaves, then the last: the tail must follow. */
  ts_stage_cancel(&st, &w[3]);
  assert_false(w[3].queued);
  ts_stage_cancel(&st, &w[4]);
  ts_stage_cancel(&st, &w[4]); /* not queued: nothing happens */
  assert_ptr_equal(ts_stage_release(&st, a), &w[2]);
  assert_ptr_equal(w[2].buf, a);
  assert_false(w[2].queued);
  /* Queue empty: a newcomer after a cancel at the tail is queued and served in order. */
  assert_int_equal(ts_stage_acquire(&st, &w[3], &x), 1);
  assert_ptr_equal(ts_stage_release(&st, b), &w[3]);
  assert_null(ts_stage_release(&st, a));
  assert_null(ts_stage_release(&st, b));
  assert_int_equal(st.in_use, 0);
  assert_int_equal(st.nfree, 2);
  assert_int_equal(ts_stage_bytes(&st), 2 * MIB);
  ts_stage_free(&st);
}

static void test_alloc_failure(void **state) {
  (void)state;
  ts_stage_t st;
  assert_int_equal(ts_stage_init(&st, MIB, 4 * MIB), 0);
  ts_stage_waiter_t w[3] = {{0}};
  float *a, *x;
  /* Nobody holds a buffer: nothing would ever come back, so an error. */
  ts_alloc_fail_after(1);
  assert_int_equal(ts_stage_acquire(&st, &w[0], &x), TS_ENOMEM);
  ts_alloc_fail_after(0);
  assert_false(w[0].queued);
  assert_int_equal(st.count, 0);
  assert_int_equal(ts_stage_acquire(&st, &w[0], &a), 0);
  /* Someone holds one: wait for it, and a newcomer waits behind (no overtaking), even once
   * memory is back. */
  ts_alloc_fail_after(1);
  assert_int_equal(ts_stage_acquire(&st, &w[1], &x), 1);
  ts_alloc_fail_after(0);
  assert_int_equal(ts_stage_acquire(&st, &w[2], &x), 1);
  assert_ptr_equal(ts_stage_release(&st, a), &w[1]);
  assert_ptr_equal(ts_stage_release(&st, a), &w[2]);
  assert_null(ts_stage_release(&st, a));
  assert_int_equal(st.in_use, 0);
  assert_int_equal(st.count, 1);
  ts_stage_free(&st);
}

/* From 2 MiB on, ts_huge_alloc's memory starts on a 2 MiB boundary (a transparent huge page
 * can back it whole); below, it is ts_aligned_alloc's (64-byte aligned). Both are written
 * whole and freed with ts_huge_free, and an injected failure is an error. */
static void test_huge_alloc(void **state) {
  (void)state;
  size_t sizes[] = {64, MIB, 2 * MIB, 4 * MIB + 4096, 5 * MIB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char *p = ts_huge_alloc(sizes[i]);
    assert_non_null(p);
    size_t align = sizes[i] >= 2 * MIB ? 2 * MIB : 64;
    assert_int_equal((uintptr_t)p % align, 0);
    memset(p, 0x5a, sizes[i]);
    assert_int_equal(p[sizes[i] - 1], 0x5a);
    ts_huge_free(p, sizes[i]);
  }
  ts_alloc_fail_after(1);
  assert_null(ts_huge_alloc(4 * MIB));
  assert_null(ts_huge_alloc(64));
  ts_alloc_fail_after(0);
  /* The pool's buffers are huge-page aligned once they are 2 MiB or more. */
  ts_stage_t st;
  assert_int_equal(ts_stage_init(&st, 4 * MIB, 16 * MIB), 0);
  ts_stage_waiter_t w = {0};
  float *a;
  assert_int_equal(ts_stage_acquire(&st, &w, &a), 0);
  assert_int_equal((uintptr_t)a % (2 * MIB), 0);
  assert_null(ts_stage_release(&st, a));
  ts_stage_free(&st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cap),
      cmocka_unit_test(test_fifo_and_cancel),
      cmocka_unit_test(test_alloc_failure),
      cmocka_unit_test(test_huge_alloc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
