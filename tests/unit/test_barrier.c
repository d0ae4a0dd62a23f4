/* The barrier rules (server/ts_barrier.h) with the time as an argument: liveness and
 * heartbeats, done workers, backup workers (replicas_to_aggregate below the worker count),
 * the sync timeout, a worker that leaves or rejoins, uneven workers run in simulated time,
 * and the ssp clock bound. No sockets and no sleeping: the whole file runs in milliseconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_barrier.h"
#include "ts_err.h"

#define HB_MS 2000
#define SYNC_MS 5000

static void setup(ts_barrier_t *b, uint32_t workers, uint32_t replicas, uint64_t staleness) {
  assert_int_equal(ts_barrier_init(b, workers, replicas, SYNC_MS, HB_MS, staleness), 0);
  for (uint32_t t = 0; t < workers; t++) ts_barrier_join(b, (int)t, 0);
}

static void test_membership(void **state) {
  (void)state;
  ts_barrier_t b;
  assert_int_equal(ts_barrier_init(&b, 3, 0, SYNC_MS, HB_MS, 0), 0);
  assert_false(ts_barrier_live(&b, 0));
  assert_true(ts_barrier_join(&b, 0, 10));   /* joined */
  assert_false(ts_barrier_join(&b, 0, 20));  /* a second connection: reconnected */
  assert_false(ts_barrier_join(&b, 3, 20));  /* not a task of the job */
  assert_false(ts_barrier_join(&b, -1, 20)); /* an admin session */
  assert_null(ts_barrier_worker(&b, 3));
  assert_true(ts_barrier_live(&b, 0));
  assert_false(ts_barrier_live(&b, -1));
  assert_false(ts_barrier_leave(&b, 0)); /* one connection left */
  assert_true(ts_barrier_live(&b, 0));
  assert_true(ts_barrier_leave(&b, 0));
  assert_false(ts_barrier_live(&b, 0));
  assert_false(ts_barrier_leave(&b, 0)); /* never below zero */
  ts_barrier_free(&b);
  ts_alloc_fail_after(1);
  assert_int_equal(ts_barrier_init(&b, 3, 0, SYNC_MS, HB_MS, 0), TS_ENOMEM);
  ts_alloc_fail_after(0);
  ts_barrier_free(&b);
}

/* Heartbeats: dead after heartbeat_ms of silence, not before; alive again on any frame. A
 * dead worker is not waited for. */
static void test_dead_and_heard(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 0, 0);
  uint8_t contrib[3] = {1, 1, 0};
  assert_int_equal(ts_barrier_required(&b, contrib), 3);
  ts_barrier_heard(&b, 0, 1500);
  ts_barrier_heard(&b, 1, 1500);
  uint32_t dead[3];
  assert_int_equal(ts_barrier_expire(&b, HB_MS, dead, 3), 0); /* exactly the limit: alive */
  assert_int_equal(ts_barrier_expire(&b, HB_MS + 1, dead, 3), 1);
  assert_int_equal(dead[0], 2);
  assert_false(ts_barrier_live(&b, 2));
  assert_int_equal(ts_barrier_expire(&b, HB_MS + 2, dead, 3), 0); /* reported once */
  /* At most max per call: the rest on the next one. */
  ts_barrier_heard(&b, 2, 0);
  assert_int_equal(ts_barrier_expire(&b, 10 * HB_MS, dead, 2), 2);
  assert_int_equal(ts_barrier_expire(&b, 10 * HB_MS, dead, 2), 1);
  assert_int_equal(dead[0], 2);
  ts_barrier_heard(&b, 0, 10 * HB_MS);
  ts_barrier_heard(&b, 1, 10 * HB_MS);
  assert_int_equal(ts_barrier_required(&b, contrib), 2);
  assert_int_equal(ts_barrier_check(&b, contrib, 2, 0, HB_MS + 1, false), TS_BARRIER_CLOSE);
  /* Not waited for, not listed as waited for. */
  int32_t waiting[3];
  assert_int_equal(ts_barrier_waiting_for(&b, contrib, waiting), 0);
  /* A frame from it: alive again (reported once), and waited for again. */
  assert_true(ts_barrier_heard(&b, 2, 10 * HB_MS));
  assert_false(ts_barrier_heard(&b, 2, 10 * HB_MS + 1));
  assert_true(ts_barrier_live(&b, 2));
  assert_int_equal(ts_barrier_required(&b, contrib), 3);
  assert_int_equal(ts_barrier_waiting_for(&b, contrib, waiting), 1);
  assert_int_equal(waiting[0], 2);
  ts_barrier_free(&b);
}

/* Done workers are not waited for; a done worker that handshakes again trains again. */
static void test_done_and_rejoin(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 2, 0, 0);
  uint8_t none[2] = {0, 0}, first[2] = {1, 0};
  assert_int_equal(ts_barrier_required(&b, none), 2);
  assert_true(ts_barrier_done(&b, 1));
  assert_false(ts_barrier_done(&b, 1));
  assert_int_equal(ts_barrier_required(&b, first), 1);
  assert_int_equal(ts_barrier_check(&b, first, 1, 0, 1, false), TS_BARRIER_CLOSE);
  int32_t waiting[2];
  assert_int_equal(ts_barrier_waiting_for(&b, first, waiting), 0);
  /* It leaves, then comes back: a reconnection, no longer done, waited for again. */
  assert_true(ts_barrier_leave(&b, 1));
  assert_false(ts_barrier_join(&b, 1, 100));
  assert_true(ts_barrier_live(&b, 1));
  assert_int_equal(ts_barrier_required(&b, first), 2);
  assert_int_equal(ts_barrier_check(&b, first, 1, 0, 100, false), TS_BARRIER_WAIT);
  /* Every worker done: a barrier still needs one gradient, never zero. */
  ts_barrier_done(&b, 0);
  ts_barrier_done(&b, 1);
  assert_int_equal(ts_barrier_required(&b, none), 1);
  assert_int_equal(ts_barrier_check(&b, none, 0, 0, 100, true), TS_BARRIER_WAIT);
  ts_barrier_free(&b);
}

/* A worker that left after giving this barrier its gradient still counts for it, so the
 * barrier does not close before the others' gradients; one that left without pushing does
 * not hold the barrier up. Workers never seen are waited for (replicas = all). */
static void test_leaver_counts(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 0, 0);
  uint8_t contrib[3] = {1, 0, 0};
  ts_barrier_leave(&b, 0);
  assert_int_equal(ts_barrier_required(&b, contrib), 3);
  assert_int_equal(ts_barrier_check(&b, contrib, 1, 0, 10, false), TS_BARRIER_WAIT);
  uint8_t next[3] = {0, 1, 1};
  assert_int_equal(ts_barrier_required(&b, next), 2); /* the next step: it is gone */
  ts_barrier_free(&b);
  assert_int_equal(ts_barrier_init(&b, 2, 0, SYNC_MS, HB_MS, 0), 0);
  ts_barrier_join(&b, 0, 0);
  uint8_t one[2] = {1, 0};
  assert_int_equal(ts_barrier_required(&b, one), 2);
  int32_t waiting[2];
  assert_int_equal(ts_barrier_waiting_for(&b, one, waiting), 1);
  assert_int_equal(waiting[0], 1);
  ts_barrier_free(&b);
}

/* Backup workers: with replicas_to_aggregate below the worker count, the first `replicas`
 * gradients close the barrier and the rest are late; the count never exceeds what the
 * workers still there can give. */
static void test_backup_workers(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 2, 0);
  uint8_t c[3] = {0, 0, 0};
  assert_int_equal(ts_barrier_required(&b, c), 2);
  c[2] = 1;
  assert_int_equal(ts_barrier_check(&b, c, 1, 0, 5, false), TS_BARRIER_WAIT);
  c[0] = 1;
  assert_int_equal(ts_barrier_check(&b, c, 2, 0, 6, false), TS_BARRIER_CLOSE);
  /* Two gone without pushing: one gradient is enough. */
  ts_barrier_leave(&b, 1);
  ts_barrier_leave(&b, 2);
  uint8_t only0[3] = {1, 0, 0};
  assert_int_equal(ts_barrier_required(&b, only0), 1);
  ts_barrier_free(&b);
}

/* The property behind test_sync_backup_worker_stopped (tests/system/test_failures.c): a
 * stopped worker is still live (connected, heartbeats not yet missed), yet with replicas
 * below the worker count no barrier waits for it once enough others have pushed, whether
 * or not it gave a gradient before it stopped, at every step, long before it is marked
 * dead. */
static void test_stopped_backup_not_waited_for(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 2, 0);
  uint64_t now = 0;
  for (uint64_t step = 0; step < 100; step++, now += 10) {
    /* Worker 2 stopped at step 0 after pushing it; 0 and 1 keep pushing, 10 ms a step. */
    uint8_t c[3] = {1, 1, step == 0};
    ts_barrier_heard(&b, 0, now);
    ts_barrier_heard(&b, 1, now);
    assert_true(ts_barrier_live(&b, 2) || now > HB_MS);
    assert_int_equal(ts_barrier_check(&b, c, 2 + (step == 0), now, now, false),
                     TS_BARRIER_CLOSE);
    uint32_t dead[3];
    ts_barrier_expire(&b, now, dead, 3);
  }
  assert_true(ts_barrier_live(&b, 2)); /* 1 s in: not dead yet, never waited for */
  ts_barrier_free(&b);
}

/* The timeout closes a barrier that has at least one gradient after sync_timeout_ms, and
 * only on the periodic check. */
static void test_timeout(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 0, 0);
  uint8_t c[3] = {0, 1, 0};
  assert_int_equal(ts_barrier_check(&b, c, 1, 1000, 1000 + SYNC_MS - 1, true), TS_BARRIER_WAIT);
  assert_int_equal(ts_barrier_check(&b, c, 1, 1000, 1000 + SYNC_MS, false), TS_BARRIER_WAIT);
  assert_int_equal(ts_barrier_check(&b, c, 1, 1000, 1000 + SYNC_MS, true), TS_BARRIER_TIMEOUT);
  uint8_t none[3] = {0, 0, 0};
  assert_int_equal(ts_barrier_check(&b, none, 0, 0, 10 * SYNC_MS, true), TS_BARRIER_WAIT);
  int32_t waiting[3];
  assert_int_equal(ts_barrier_waiting_for(&b, c, waiting), 2);
  assert_int_equal(waiting[0], 0);
  assert_int_equal(waiting[1], 2);
  ts_barrier_free(&b);
}

/* Uneven workers in simulated time: worker t takes period[t] ms a step and pushes for the
 * open step when ready (once per step: a second push would be a duplicate). Every step
 * closes, none waits longer than the slowest worker it needs, and none closes with fewer
 * than `replicas` gradients. One worker also stops pushing half way (it finished: done). */
static void run_uneven(uint32_t replicas, const uint64_t *period, uint32_t n, uint64_t steps) {
  ts_barrier_t b;
  setup(&b, n, replicas, 0);
  uint64_t ready[8] = {0}, now = 0, opened = 0, done_at = steps / 2;
  uint8_t c[8] = {0};
  uint32_t have = 0;
  uint64_t slowest = 0;
  for (uint32_t t = 0; t < n; t++) slowest = period[t] > slowest ? period[t] : slowest;
  for (uint64_t step = 0; step < steps;) {
    now++;
    assert_true(now - opened <= slowest + 1); /* never stuck, never on the timeout */
    for (uint32_t t = 0; t < n; t++) {
      if (t == n - 1 && step >= done_at) {
        ts_barrier_done(&b, (int)t);
        continue;
      }
      ts_barrier_heard(&b, (int)t, now);
      if (now < ready[t] || c[t]) continue;
      if (have == 0) opened = now;
      c[t] = 1;
      have++;
      ts_barrier_pushed(&b, (int)t, step);
      ready[t] = now + period[t];
    }
    ts_barrier_verdict_t v = ts_barrier_check(&b, c, have, opened, now, true);
    assert_int_not_equal(v, TS_BARRIER_TIMEOUT);
    if (v == TS_BARRIER_CLOSE) {
      uint32_t want = replicas ? replicas : n;
      if (step >= done_at && want > n - 1) want = n - 1;
      assert_true(have >= want);
      memset(c, 0, sizeof c);
      have = 0;
      step++;
      opened = now;
    }
  }
  ts_barrier_free(&b);
}

static void test_uneven_workers(void **state) {
  (void)state;
  static const uint64_t speeds[] = {3, 7, 20};
  run_uneven(0, speeds, 3, 200);  /* everyone: paced by the slowest */
  run_uneven(2, speeds, 3, 200);  /* a backup worker */
  static const uint64_t five[] = {1, 2, 3, 50, 5};
  run_uneven(3, five, 5, 300);
  run_uneven(0, five, 5, 100);
}

/* Ssp: a pull at clock c waits while a live worker is more than `staleness` behind c;
 * dead, done and departed workers do not hold it. */
static void test_ssp_bound(void **state) {
  (void)state;
  ts_barrier_t b;
  setup(&b, 3, 0, 2);
  assert_true(ts_barrier_ssp_ready(&b, 0));
  assert_true(ts_barrier_ssp_ready(&b, 2)); /* within staleness of clock 0 */
  assert_false(ts_barrier_ssp_ready(&b, 3));
  ts_barrier_pushed(&b, 0, 4);
  ts_barrier_pushed(&b, 1, 4);
  ts_barrier_pushed(&b, 2, 0); /* clock 1 */
  ts_barrier_pushed(&b, 0, 1); /* clocks never go back */
  assert_int_equal(ts_barrier_worker(&b, 0)->clock, 5);
  assert_true(ts_barrier_ssp_ready(&b, 3));
  assert_false(ts_barrier_ssp_ready(&b, 4));
  /* The slow one dies: nobody waits for it; it comes back: they do again. */
  ts_barrier_heard(&b, 0, 3000);
  ts_barrier_heard(&b, 1, 3000);
  uint32_t dead[3];
  assert_int_equal(ts_barrier_expire(&b, 3000, dead, 3), 1);
  assert_true(ts_barrier_ssp_ready(&b, 6));
  assert_false(ts_barrier_ssp_ready(&b, 8)); /* 0 and 1 are at clock 5 */
  ts_barrier_heard(&b, 2, 3001);
  assert_false(ts_barrier_ssp_ready(&b, 6));
  ts_barrier_done(&b, 2);
  assert_true(ts_barrier_ssp_ready(&b, 6));
  ts_barrier_join(&b, 2, 3002);
  assert_false(ts_barrier_ssp_ready(&b, 6));
  ts_barrier_leave(&b, 2);
  ts_barrier_leave(&b, 2);
  assert_true(ts_barrier_ssp_ready(&b, 6));
  ts_barrier_free(&b);
}

/* The end of the job: done workers, silent ones (gone or never seen) after the heartbeat
 * timeout, and a worker that comes back. */
static void test_finished(void **state) {
  (void)state;
  ts_barrier_t b;
  assert_int_equal(ts_barrier_init(&b, 3, 0, SYNC_MS, HB_MS, 0), 0);
  const uint64_t since = 100;
  ts_barrier_join(&b, 0, 100);
  ts_barrier_join(&b, 1, 100);
  /* Task 2 never seen: not finished until the shard has been up a heartbeat timeout. */
  assert_false(ts_barrier_finished(&b, 2, since + HB_MS, since));
  assert_true(ts_barrier_finished(&b, 2, since + HB_MS + 1, since));
  assert_int_equal(ts_barrier_count_finished(&b, 1000, since), 0);
  /* Done counts at once. */
  assert_true(ts_barrier_done(&b, 0));
  assert_true(ts_barrier_finished(&b, 0, 1000, since));
  /* Gone (its connection closed): finished a heartbeat timeout after it was last heard. */
  ts_barrier_heard(&b, 1, 1500);
  assert_true(ts_barrier_leave(&b, 1));
  assert_false(ts_barrier_finished(&b, 1, 1500 + HB_MS, since));
  assert_true(ts_barrier_finished(&b, 1, 1501 + HB_MS, since));
  assert_int_equal(ts_barrier_count_finished(&b, 1501 + HB_MS, since), 3);
  /* It comes back: live, so not finished any more, whatever the time. */
  ts_barrier_join(&b, 1, 5000);
  ts_barrier_heard(&b, 1, 5000);
  assert_false(ts_barrier_finished(&b, 1, 5000 + HB_MS, since));
  /* Still connected but silent: marked dead, then finished. */
  uint32_t dead[3];
  assert_int_equal(ts_barrier_expire(&b, 5001 + HB_MS, dead, 3), 1);
  assert_true(ts_barrier_finished(&b, 1, 5001 + HB_MS, since));
  /* A model reset at 9000: task 0's done was the old model's; not heard from since, it
   * counts as never seen (finished a heartbeat timeout after the reset). */
  assert_false(ts_barrier_finished(&b, 0, 9000 + HB_MS, 9000));
  assert_true(ts_barrier_finished(&b, 0, 9001 + HB_MS, 9000));
  /* Heard from in the reset's own millisecond (the loop's clock is cached): its done is
   * the old model's too, once the reset forgets it. */
  ts_barrier_heard(&b, 0, 9000);
  assert_true(ts_barrier_finished(&b, 0, 9001, 9000));
  ts_barrier_forget_done(&b);
  assert_false(ts_barrier_finished(&b, 0, 9001, 9000));
  assert_false(ts_barrier_finished(&b, 3, 99999, since)); /* not a task of the job */
  assert_false(ts_barrier_finished(&b, -1, 99999, since));
  ts_barrier_free(&b);
}

/* Who took part: workers heard from since the job began (the shard's start or a reset). */
static void test_count_joined(void **state) {
  (void)state;
  ts_barrier_t b;
  assert_int_equal(ts_barrier_init(&b, 3, 0, SYNC_MS, HB_MS, 0), 0);
  assert_int_equal(ts_barrier_count_joined(&b, 0), 0);
  ts_barrier_join(&b, 0, 10);
  ts_barrier_heard(&b, 0, 10);
  ts_barrier_join(&b, 2, 20);
  ts_barrier_heard(&b, 2, 20);
  assert_int_equal(ts_barrier_count_joined(&b, 0), 2);
  ts_barrier_leave(&b, 2); /* one that left still took part */
  assert_int_equal(ts_barrier_count_joined(&b, 0), 2);
  /* A reset at 15: only worker 2, heard at 20, is of the new job. */
  assert_int_equal(ts_barrier_count_joined(&b, 15), 1);
  ts_barrier_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_membership),
      cmocka_unit_test(test_dead_and_heard),
      cmocka_unit_test(test_done_and_rejoin),
      cmocka_unit_test(test_leaver_counts),
      cmocka_unit_test(test_backup_workers),
      cmocka_unit_test(test_stopped_backup_not_waited_for),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_uneven_workers),
      cmocka_unit_test(test_ssp_bound),
      cmocka_unit_test(test_finished),
      cmocka_unit_test(test_count_joined),
  };
  return cmocka_run_group_tests_name("barrier", tests, NULL, NULL);
}
