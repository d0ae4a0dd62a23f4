/* Bounded busy-polling of a libuv loop (net/ts_poll.h): when it polls, when it sleeps,
 * and that it ends exactly when the loop's handles are closed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include <cmocka.h>

#include "ts_poll.h"

#define MS UINT64_C(1000000) /* nanoseconds */

typedef struct {
  uint64_t start_ns;
  uint64_t busy_until_ns;   /* active() returns true until then (work in flight) */
  uint64_t calls;           /* active() calls in all */
  uint64_t late_calls;      /* calls at or after late_from_ns */
  uint64_t late_from_ns;
  uint64_t mid_calls;       /* calls in [mid_from_ns, mid_to_ns) */
  uint64_t mid_from_ns, mid_to_ns;
  uv_timer_t timer;
  uv_async_t async;
  int fired;
} fixture_t;

static bool count_active(void *arg) {
  fixture_t *f = arg;
  uint64_t now = uv_hrtime();
  f->calls++;
  if (now >= f->late_from_ns) f->late_calls++;
  if (now >= f->mid_from_ns && now < f->mid_to_ns) f->mid_calls++;
  return now < f->busy_until_ns;
}

static void on_close_noop(uv_handle_t *h) { (void)h; }

/* Fires once and closes the loop's only handle: the loop must then end. */
static void on_timer_close(uv_timer_t *t) {
  fixture_t *f = t->data;
  f->fired++;
  uv_close((uv_handle_t *)t, on_close_noop);
}

static void start(uv_loop_t *loop, fixture_t *f, uint64_t timer_ms) {
  assert_int_equal(uv_loop_init(loop), 0);
  assert_int_equal(uv_timer_init(loop, &f->timer), 0);
  f->timer.data = f;
  assert_int_equal(uv_timer_start(&f->timer, on_timer_close, timer_ms, 0), 0);
  f->start_ns = uv_hrtime();
}

static void test_zero_is_uv_run_default(void **state) {
  (void)state;
  uv_loop_t loop;
  fixture_t f = {0};
  start(&loop, &f, 5);
  assert_int_equal(ts_poll_run(&loop, 0, count_active, &f), 0);
  assert_int_equal(f.fired, 1);
  assert_int_equal(f.calls, 0); /* never asked: nothing polls */
  assert_int_equal(uv_loop_close(&loop), 0);

  /* Without a callback there is nothing to poll for, whatever poll_us says. */
  fixture_t g = {0};
  start(&loop, &g, 5);
  assert_int_equal(ts_poll_run(&loop, 1000, NULL, NULL), 0);
  assert_int_equal(g.fired, 1);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_empty_loop_returns_at_once(void **state) {
  (void)state;
  uv_loop_t loop;
  fixture_t f = {0};
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(ts_poll_run(&loop, 1000000, count_active, &f), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Start counts as activity: the loop polls (many turns) for the window, then sleeps until
 * the timer (a turn or two), and ends when the timer closes its handle. */
static void test_polls_for_the_window_then_sleeps(void **state) {
  (void)state;
  uv_loop_t loop;
  fixture_t f = {0};
  start(&loop, &f, 300);
  f.late_from_ns = f.start_ns + 150 * MS; /* well after the 50 ms window */
  assert_int_equal(ts_poll_run(&loop, 50000, count_active, &f), 0);
  assert_int_equal(f.fired, 1);
  uint64_t elapsed = uv_hrtime() - f.start_ns;
  assert_true(elapsed >= 290 * MS);
  /* A loop asleep until its timer makes no turn before it. A polling turn takes microseconds
   * on an idle machine; on one with every CPU busy each sched_yield() lets the others run a
   * time slice first (a few ms), which still leaves several turns in 50 ms. */
  assert_true(f.calls - f.late_calls >= 3);
  /* Asleep from the end of the window to the timer: only the timer's turn. */
  assert_true(f.late_calls <= 3);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Work in flight (active() true) keeps the loop polling past the window; once it stops,
 * the loop polls one more window and sleeps. */
static void test_activity_extends_the_window(void **state) {
  (void)state;
  uv_loop_t loop;
  fixture_t f = {0};
  start(&loop, &f, 300);
  f.busy_until_ns = f.start_ns + 100 * MS;
  f.late_from_ns = f.start_ns + 180 * MS; /* busy 100 ms + window 10 ms + slack */
  f.mid_from_ns = f.start_ns + 30 * MS;   /* the window of the start alone ends at 10 ms */
  f.mid_to_ns = f.start_ns + 100 * MS;
  assert_int_equal(ts_poll_run(&loop, 10000, count_active, &f), 0);
  assert_int_equal(f.fired, 1);
  /* Turns that only polling explains: the loop's sole timer is due at 300 ms. */
  assert_true(f.mid_calls >= 3);
  assert_true(f.late_calls <= 3);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Another thread hands work over with uv_async_send while the loop sleeps: it is woken as
 * usual, and closing the handles from a callback ends ts_poll_run. */
static void on_async_close(uv_async_t *a) {
  fixture_t *f = a->data;
  f->fired++;
  uv_close((uv_handle_t *)a, on_close_noop);
}

static void sender(void *arg) {
  fixture_t *f = arg;
  uv_sleep(30); /* the 1 ms window is long over: the loop is asleep */
  uv_async_send(&f->async);
}

static void test_wakes_from_sleep(void **state) {
  (void)state;
  uv_loop_t loop;
  fixture_t f = {0};
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(uv_async_init(&loop, &f.async, on_async_close), 0);
  f.async.data = &f;
  f.start_ns = uv_hrtime();
  f.late_from_ns = f.start_ns + 10 * MS;
  uv_thread_t th;
  assert_int_equal(uv_thread_create(&th, sender, &f), 0);
  assert_int_equal(ts_poll_run(&loop, 1000, count_active, &f), 0);
  assert_int_equal(uv_thread_join(&th), 0);
  assert_int_equal(f.fired, 1);
  assert_true(f.late_calls <= 3); /* asleep until the async arrived */
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_zero_is_uv_run_default),
      cmocka_unit_test(test_empty_loop_returns_at_once),
      cmocka_unit_test(test_polls_for_the_window_then_sleeps),
      cmocka_unit_test(test_activity_extends_the_window),
      cmocka_unit_test(test_wakes_from_sleep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
