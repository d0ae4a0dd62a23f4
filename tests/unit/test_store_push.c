/*
 * The shard store (server/ts_store.h) without a network, updates: async pushes (immediate,
 * or deferred while a pull reply is being written), the sync barrier (accumulate,
 * duplicate, stale, average-and-apply, apply deferred by writers, direct apply), and the
 * lowest version. Declaring, slice checks and allocation failure are in test_store.c.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "store_fixtures.h"

/* --- async ------------------------------------------------------------------------------ */

static void sgd_ref(float *w, const float *g, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) w[i] -= LR * scale * g[i];
}

static void test_async_push(void **state) {
  (void)state;
  const setup_t u = {1, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  ts_spart_t *p = ts_store_find(&s, 0, 3);
  assert_non_null(p);
  size_t n = p->plan->count;
  float *g = malloc(n * sizeof *g);
  assert_non_null(g);
  float *want = copy_w(p);
  for (int k = 1; k <= 3; k++) {
    fill_grad(g, n, 0.1f * (float)k);
    ts_store_async_push(&s, p, g);
    sgd_ref(want, g, n, 1.0f);
    check_close("async push", p->w, want, n);
    assert_int_equal(p->version, (uint64_t)k);
    assert_int_equal(p->updates, (uint64_t)k);
    assert_int_equal(s.applied, (uint64_t)k);
  }
  /* Other partitions did not move. */
  assert_int_equal(ts_store_find(&s, 0, 2)->version, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  /* writer_done with no writer and nothing pending is a no-op. */
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 0);
  assert_int_equal(p->version, 3);
  free(g);
  free(want);
  ts_store_free(&s);
}

static void test_async_waits_for_writers(void **state) {
  (void)state;
  const setup_t u = {1, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  ts_spart_t *p = ts_store_find(&s, 2, 1);
  assert_non_null(p);
  size_t n = p->plan->count;
  float *g = malloc(n * sizeof *g);
  assert_non_null(g);
  float *w0 = copy_w(p), *want = copy_w(p);

  p->writers = 2; /* two pull replies are being written from p->w */
  fill_grad(g, n, -0.2f);
  assert_false(ts_store_async_push(&s, p, g));
  check_equal("a push must not touch w while it is written", p->w, w0, n);
  assert_int_equal(p->version, 0);
  assert_int_equal(s.applied, 0);
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 1);
  assert_false(ts_store_async_push(&s, p, g));
  assert_false(ts_store_writer_done(&s, p)); /* no sync update waited: nothing applied */
  assert_int_equal(p->writers, 0);
  check_equal("writers done, push not retried yet", p->w, w0, n);
  /* The caller retries once the writers are done: applied as usual. */
  assert_true(ts_store_async_push(&s, p, g));
  sgd_ref(want, g, n, 1.0f);
  check_close("retried push", p->w, want, n);
  assert_int_equal(p->version, 1);
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 0);
  free(g);
  free(w0);
  free(want);
  ts_store_free(&s);
}

/* --- sync ------------------------------------------------------------------------------- */

typedef struct {
  ts_store_t s;
  ts_spart_t *p;
  size_t n;
  float *g0, *g1, *g2, *want;
} sync_fx_t;

static void sync_setup(sync_fx_t *f, ts_optimizer_t opt) {
  const setup_t u = {2, 3, TS_MODE_SYNC, 1024, opt};
  store_init(&f->s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&f->s, &x);
  f->p = first_part(&f->s);
  f->n = f->p->plan->count;
  f->g0 = malloc(f->n * sizeof(float));
  f->g1 = malloc(f->n * sizeof(float));
  f->g2 = malloc(f->n * sizeof(float));
  assert_non_null(f->g0);
  assert_non_null(f->g1);
  assert_non_null(f->g2);
  fill_grad(f->g0, f->n, 0.25f);
  fill_grad(f->g1, f->n, -0.5f);
  fill_grad(f->g2, f->n, 2.0f);
  f->want = copy_w(f->p);
}

static void sync_teardown(sync_fx_t *f) {
  free(f->g0);
  free(f->g1);
  free(f->g2);
  free(f->want);
  ts_store_free(&f->s);
}

static void expect_push(sync_fx_t *f, const float *g, int task, uint64_t step,
                        Tessera__PushResult want) {
  Tessera__PushResult r = ts_store_sync_push(&f->s, f->p, g, task, step, 1000 + step, 2);
  if (r != want)
    fail_msg("task %d step %llu: push result %d, want %d", task, (unsigned long long)step, (int)r,
             (int)want);
}

static void test_sync_barrier(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_SGD);
  ts_spart_t *p = f.p;
  float *w0 = copy_w(p);

  expect_push(&f, f.g0, 0, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(p->opened_ms, 1000);
  expect_push(&f, f.g1, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  /* Task 0 again: a duplicate, not counted. */
  expect_push(&f, f.g2, 0, 0, TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  assert_int_equal(p->accum_n, 2);
  check_equal("nothing applied before the barrier closes", p->w, w0, f.n);
  assert_int_equal(p->version, 0);

  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * (0.5f * (f.g0[i] + f.g1[i]));
  check_close("mean of two gradients applied once", p->w, f.want, f.n);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->updates, 1);
  assert_int_equal(f.s.applied, 1);
  assert_int_equal(p->accum_n, 0);
  for (uint32_t t = 0; t < 3; t++) assert_int_equal(p->contributed[t], 0);
  /* Nothing to complete now. */
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 1);

  /* A late push for step 0 is stale: dropped and counted. */
  float *w1 = copy_w(p);
  expect_push(&f, f.g2, 2, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 1);
  assert_int_equal(p->accum_n, 0);
  check_equal("stale push changes nothing", p->w, w1, f.n);

  /* Step 1: task 0 may push again; three gradients averaged. */
  expect_push(&f, f.g0, 0, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 2, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g2, 1, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g2, 1, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 2);
  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++)
    f.want[i] -= LR * ((f.g0[i] + f.g1[i] + f.g2[i]) * (1.0f / 3.0f));
  check_close("mean of three", p->w, f.want, f.n);
  assert_int_equal(p->version, 2);
  assert_int_equal(ts_store_min_version(&f.s), f.s.num_parts == 1 ? 2 : 0);
  free(w0);
  free(w1);
  sync_teardown(&f);
}

static void test_sync_deferred_by_writers(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_SGD);
  ts_spart_t *p = f.p;
  float *w0 = copy_w(p);
  expect_push(&f, f.g0, 0, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  p->writers = 2;
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_true(p->apply_pending);
  assert_int_equal(p->version, 0);
  check_equal("apply waits for the writers", p->w, w0, f.n);
  /* Completing again while pending does nothing more. */
  assert_false(ts_store_sync_complete(&f.s, p));

  /* Task 2 arrives late for step 0: the barrier is closed, so it is stale. */
  expect_push(&f, f.g2, 2, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 1);
  /* And task 0 again for step 0 also stale (not duplicate). */
  expect_push(&f, f.g2, 0, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 2);
  assert_int_equal(p->accum_n, 2);

  assert_false(ts_store_writer_done(&f.s, p));
  check_equal("one writer left", p->w, w0, f.n);
  assert_true(ts_store_writer_done(&f.s, p));
  assert_false(p->apply_pending);
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * (0.5f * (f.g0[i] + f.g1[i]));
  check_close("applied when the last writer finished", p->w, f.want, f.n);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->updates, 1);
  assert_int_equal(p->accum_n, 0);

  /* The next step is open to every task. */
  expect_push(&f, f.g2, 2, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g0, 0, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_true(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 2);
  free(w0);
  sync_teardown(&f);
}

/* One gradient closes a barrier (the timeout path with one live worker); tasks outside
 * [0, num_workers) are not tracked for duplicates. Momentum state moves once per barrier. */
static void test_sync_single_and_untracked(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_MOMENTUM);
  ts_spart_t *p = f.p;
  expect_push(&f, f.g0, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * f.g0[i];
  check_close("one gradient", p->w, f.want, f.n);
  check_close("velocity", p->s0, f.g0, f.n);

  expect_push(&f, f.g1, -1, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 7, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(p->accum_n, 2);
  assert_true(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 2);
  sync_teardown(&f);
}

/* A barrier that one gradient closes applies it straight from the caller's buffer; with
 * writers, or a second gradient needed, it goes through the accumulator as before. */
static void test_sync_direct_apply(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_MOMENTUM);
  ts_spart_t *p = f.p;
  Tessera__PushResult r = ts_store_sync_push(&f.s, p, f.g0, 0, 0, 1000, 1);
  assert_int_equal(r, TESSERA__PUSH_RESULT__PUSH_APPLIED);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->accum_n, 0);
  assert_int_equal(ts_store_sync_count(p), 0);
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * f.g0[i];
  check_close("direct apply", p->w, f.want, f.n);
  /* The same step again: stale. */
  assert_int_equal(ts_store_sync_push(&f.s, p, f.g1, 1, 0, 1001, 1), TESSERA__PUSH_RESULT__PUSH_STALE);
  /* With a writer the gradient waits in the accumulator. */
  p->writers = 1;
  assert_int_equal(ts_store_sync_push(&f.s, p, f.g1, 0, 1, 1002, 1),
                   TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_true(ts_store_writer_done(&f.s, p));
  assert_int_equal(p->version, 2);
  sync_teardown(&f);
}

/* --- lowest version --------------------------------------------------------------------- */

static void test_min_version(void **state) {
  (void)state;
  const setup_t u = {2, 1, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  assert_true(s.num_parts >= 2);
  float *g = calloc(3000, sizeof *g);
  assert_non_null(g);
  for (size_t i = 0; i < s.num_parts; i++)
    for (size_t k = 0; k < 2 + i; k++) ts_store_async_push(&s, &s.parts[i], g);
  assert_int_equal(ts_store_min_version(&s), 2);
  ts_store_async_push(&s, &s.parts[0], g);
  assert_int_equal(ts_store_min_version(&s), 3);
  ts_store_free(&s);

  /* A shard that holds no partition. */
  const setup_t many = {8, 1, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  store_init(&s, &many, 7);
  decl_init(&x, SEED);
  decl_add(&x, "tiny", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){3});
  declare_ok(&s, &x);
  assert_int_equal(s.num_parts, 0);
  assert_int_equal(s.bytes, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  assert_null(ts_store_find(&s, 0, 0));
  free(g);
  ts_store_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_push),
      cmocka_unit_test(test_async_waits_for_writers),
      cmocka_unit_test(test_sync_barrier),
      cmocka_unit_test(test_sync_deferred_by_writers),
      cmocka_unit_test(test_sync_single_and_untracked),
      cmocka_unit_test(test_sync_direct_apply),
      cmocka_unit_test(test_min_version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
