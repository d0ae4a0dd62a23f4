/*
 * ps-server through the client library: async, sync and ssp semantics, exact values.
 * Every test starts real ps-server processes on ephemeral loopback ports.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "harness.h"
#include "calls.h"
#include "ts_err.h"

#define BIG 10000   /* elements of the large tensor: 40000 bytes, over partition_bytes */

static const uint64_t big_shape[] = {100, 100};
static const uint64_t small_shape[] = {7};

static const ts_client_tensor_t model[] = {
    {.name = "big", .shape = big_shape, .rank = 2, .init = TS_CLIENT_INIT_ZEROS},
    {.name = "small", .shape = small_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
};
static const size_t model_elems[] = {BIG, 7};

/* busy_poll_us > 0: the client polls for replies (both of its waiting paths are tested). */
static ts_client_t *open_worker_polling(ts_cluster_t *c, int task, uint32_t busy_poll_us) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs,
                        .num_shards = (size_t)c->num_shards,
                        .task = task,
                        .identity = "test",
                        .connect_timeout_s = 5,
                        .request_timeout_s = 20,
                        .heartbeat_interval_s = 0.5,
                        .require_all = true,
                        .busy_poll_us = busy_poll_us};
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, model, 2, 42), 0);
  return cl;
}

static ts_client_t *open_worker(ts_cluster_t *c, int task) { return open_worker_polling(c, task, 0); }

typedef struct {
  float *t[2];
} bufs_t;

static void bufs_init(bufs_t *b) {
  for (int i = 0; i < 2; i++) b->t[i] = calloc(model_elems[i], sizeof(float));
}

static void bufs_fill(bufs_t *b, float v) {
  for (int i = 0; i < 2; i++)
    for (size_t k = 0; k < model_elems[i]; k++) b->t[i][k] = v;
}

static void bufs_free(bufs_t *b) {
  for (int i = 0; i < 2; i++) free(b->t[i]);
}

static void pull_ok(ts_client_t *cl, bufs_t *b, uint64_t min_version, uint64_t clock, uint64_t *v) {
  char err[512];
  int rc = tc_pull(cl, b->t, min_version, clock, v, err, sizeof err);
  if (rc < 0) fprintf(stderr, "pull: %s\n", err);
  assert_int_equal(rc, 0);
}

static void push_ok(ts_client_t *cl, bufs_t *g, uint64_t step, tc_result_t *res) {
  char err[512];
  int rc = tc_push(cl, (const float *const *)g->t, step, res, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push: %s\n", err);
  assert_int_equal(rc, 0);
}

static void assert_all(const bufs_t *b, double want, double rel) {
  for (int i = 0; i < 2; i++) {
    for (size_t k = 0; k < model_elems[i]; k++) {
      double got = b->t[i][k];
      if (fabs(got - want) > rel * fabs(want) + 1e-12) {
        fprintf(stderr, "tensor %d element %zu: got %.9g, want %.9g\n", i, k, got, want);
        fail();
      }
    }
  }
}

/* --- async: concurrent pushes give the exact sum ------------------------------------ */

typedef struct {
  ts_cluster_t *c;
  int task, rounds;
} async_arg_t;

static void *async_worker(void *p) {
  async_arg_t *a = p;
  ts_client_t *cl = open_worker(a->c, a->task);
  bufs_t g;
  bufs_init(&g);
  bufs_fill(&g, (float)(a->task + 1));
  for (int r = 0; r < a->rounds; r++) push_ok(cl, &g, (uint64_t)r, NULL);
  bufs_free(&g);
  ts_client_close(cl);
  return NULL;
}

static void test_async_exact(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 3,
                                    "job = { mode = \"async\"; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.5; };"),
                   0);
  enum { W = 3, R = 20 };
  pthread_t th[W];
  async_arg_t args[W];
  for (int t = 0; t < W; t++) {
    args[t] = (async_arg_t){&c, t, R};
    pthread_create(&th[t], NULL, async_worker, &args[t]);
  }
  for (int t = 0; t < W; t++) pthread_join(th[t], NULL);
  ts_client_t *cl = open_worker(&c, 0);
  bufs_t b;
  bufs_init(&b);
  pull_ok(cl, &b, 0, 0, NULL);
  /* w = 0 - 0.5 * R * (1 + 2 + 3): all values dyadic, so the float result is exact. */
  assert_all(&b, -0.5 * R * 6.0, 0.0);
  /* The large tensor really is spread over both shards. */
  assert_true(ts_client_num_parts(cl) > 0);
  assert_true(tc_tensor_parts(cl, 0) >= 2);
  assert_true(tc_shard_parts(cl, 0) > 0 && tc_shard_parts(cl, 1) > 0);
  bufs_free(&b);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- the learning rate's schedule applies per partition update ---------------------- */

static void test_decay_schedule(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.5; "
                                    "decay = \"exponential\"; decay_steps = 2; decay_rate = 0.5; "
                                    "staircase = true; };"),
                   0);
  ts_client_t *cl = open_worker(&c, 0);
  bufs_t g, b;
  bufs_init(&g);
  bufs_init(&b);
  bufs_fill(&g, 1.0f);
  for (int r = 0; r < 6; r++) push_ok(cl, &g, (uint64_t)r, NULL);
  pull_ok(cl, &b, 0, 0, NULL);
  /* Rates 0.5, 0.5, 0.25, 0.25, 0.125, 0.125 on every partition of both shards. */
  assert_all(&b, -1.75, 0.0);
  bufs_free(&g);
  bufs_free(&b);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync: every round equals the hand-computed average ------------------------------ */

typedef struct {
  ts_cluster_t *c;
  int task, workers, rounds;
  double lr;
  int failures;
} sync_arg_t;

/* Gradient of worker t in round i: (t + 1) * (i + 1). Expected after round i:
 * w_i = w_{i-1} - lr * mean_t((t + 1) * (i + 1)) = w_{i-1} - lr * (i + 1) * (W + 1) / 2. */
static double sync_expected(int workers, int rounds_done, double lr) {
  double w = 0;
  for (int i = 0; i < rounds_done; i++) w -= lr * (i + 1) * (workers + 1) / 2.0;
  return w;
}

static void *sync_worker(void *p) {
  sync_arg_t *a = p;
  ts_client_t *cl = open_worker(a->c, a->task);
  bufs_t w, g;
  bufs_init(&w);
  bufs_init(&g);
  uint64_t version = 0;
  pull_ok(cl, &w, 0, 0, &version);
  for (int i = 0; i < a->rounds; i++) {
    bufs_fill(&g, (float)((a->task + 1) * (i + 1)));
    tc_result_t res;
    push_ok(cl, &g, version, &res);
    if (res.accumulated + res.applied == 0) a->failures++;
    pull_ok(cl, &w, version + 1, 0, &version);
    if (version != (uint64_t)i + 1) a->failures++;
    double want = sync_expected(a->workers, i + 1, a->lr);
    for (int t = 0; t < 2; t++)
      for (size_t k = 0; k < model_elems[t]; k++)
        if (fabs((double)w.t[t][k] - want) > 1e-6 * fabs(want)) {
          if (a->failures++ == 0)
            fprintf(stderr, "task %d round %d: tensor %d [%zu] = %.9g, want %.9g\n", a->task, i, t,
                    k, (double)w.t[t][k], want);
        }
  }
  bufs_free(&w);
  bufs_free(&g);
  ts_client_close(cl);
  return NULL;
}

static void run_sync(int workers) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, workers,
                                    "job = { mode = \"sync\"; partition_bytes = 4096; "
                                    "sync_timeout_s = 30.0; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.25; };"),
                   0);
  enum { R = 8 };
  pthread_t th[4];
  sync_arg_t args[4];
  for (int t = 0; t < workers; t++) {
    args[t] = (sync_arg_t){&c, t, workers, R, 0.25, 0};
    pthread_create(&th[t], NULL, sync_worker, &args[t]);
  }
  for (int t = 0; t < workers; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < workers; t++) assert_int_equal(args[t].failures, 0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_sync_two(void **state) {
  (void)state;
  run_sync(2);
}

static void test_sync_three(void **state) {
  (void)state;
  run_sync(3);
}

/* --- sync: stale pushes are dropped and counted; backup workers ---------------------- */

static void test_sync_stale_and_backup(void **state) {
  (void)state;
  ts_cluster_t c;
  /* Three workers, two gradients close a step (one backup worker). */
  assert_int_equal(ts_cluster_start(&c, 2, 3,
                                    "job = { mode = \"sync\"; replicas_to_aggregate = 2; "
                                    "partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *w0 = open_worker(&c, 0), *w1 = open_worker(&c, 1), *w2 = open_worker(&c, 2);
  bufs_t b, g;
  bufs_init(&b);
  bufs_init(&g);
  tc_result_t res;
  bufs_fill(&g, 2.0f);
  push_ok(w0, &g, 0, &res);
  assert_true(res.accumulated > 0);
  bufs_fill(&g, 4.0f);
  push_ok(w1, &g, 0, &res);
  /* Two of three closed step 0: w = 0 - 1.0 * (2 + 4) / 2 = -3. */
  uint64_t v = 0;
  pull_ok(w2, &b, 1, 0, &v);
  assert_int_equal(v, 1);
  assert_all(&b, -3.0, 0.0);
  /* The third worker's gradient for step 0 is now stale: dropped, counted, no change. */
  bufs_fill(&g, 100.0f);
  push_ok(w2, &g, 0, &res);
  assert_int_equal(res.stale, ts_client_num_parts(w2));
  assert_int_equal(res.accumulated, 0);
  pull_ok(w0, &b, 0, 0, &v);
  assert_int_equal(v, 1);
  assert_all(&b, -3.0, 0.0);
  /* A push for a step the parameters have not reached is refused. */
  char err[512];
  int rc = tc_push(w0, (const float *const *)g.t, 7, &res, err, sizeof err);
  assert_int_equal(rc, TS_EFUTURE);
  /* The shards count what they dropped. */
  uint64_t dropped = 0;
  for (uint32_t s = 0; s < 2; s++) {
    ts_client_shard_status_t *st = NULL;
    assert_int_equal(ts_client_status(w0, s, &st, err, sizeof err), 0);
    dropped += st->stale_dropped;
    ts_client_status_free(st);
  }
  assert_int_equal(dropped, ts_client_num_parts(w2));
  bufs_free(&b);
  bufs_free(&g);
  ts_client_close(w0);
  ts_client_close(w1);
  ts_client_close(w2);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- ssp: a worker too far ahead is held until the slowest catches up --------------- */

typedef struct {
  ts_client_t *cl;
  uint64_t clock;
  volatile int done;
  int rc;
} held_pull_t;

static void *held_pull(void *p) {
  held_pull_t *h = p;
  bufs_t b;
  bufs_init(&b);
  char err[512];
  h->rc = tc_pull(h->cl, b.t, 0, h->clock, NULL, err, sizeof err);
  if (h->rc < 0) fprintf(stderr, "held pull: %s\n", err);
  bufs_free(&b);
  __atomic_store_n(&h->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_ssp_bound(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"ssp\"; staleness = 1; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.5; };"),
                   0);
  ts_client_t *fast = open_worker(&c, 0), *slow = open_worker(&c, 1);
  bufs_t g;
  bufs_init(&g);
  bufs_fill(&g, 1.0f);
  /* Both at clock 1, then the fast one runs to clock 3. */
  push_ok(slow, &g, 0, NULL);
  for (uint64_t s = 0; s < 3; s++) push_ok(fast, &g, s, NULL);
  /* Fast at clock 3 with staleness 1 needs everyone at clock >= 2: slow is at 1. */
  held_pull_t h = {.cl = fast, .clock = 3};
  pthread_t th;
  pthread_create(&th, NULL, held_pull, &h);
  sleep_ms(500);
  assert_int_equal(__atomic_load_n(&h.done, __ATOMIC_SEQ_CST), 0);
  /* The slow worker reaches clock 2: the fast one is released. */
  push_ok(slow, &g, 1, NULL);
  for (int i = 0; i < 300 && !__atomic_load_n(&h.done, __ATOMIC_SEQ_CST); i++) sleep_ms(10);
  assert_int_equal(__atomic_load_n(&h.done, __ATOMIC_SEQ_CST), 1);
  pthread_join(th, NULL);
  assert_int_equal(h.rc, 0);
  /* Within the bound a pull is answered at once. */
  bufs_t b;
  bufs_init(&b);
  pull_ok(slow, &b, 0, 2, NULL);
  /* Updates applied at once: 5 pushes of 1.0 with lr 0.5. */
  assert_all(&b, -2.5, 0.0);
  bufs_free(&b);
  bufs_free(&g);
  ts_client_close(fast);
  ts_client_close(slow);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- push_pull: a push and the next pull in one round trip --------------------------- */

static void push_pull_ok(ts_client_t *cl, bufs_t *g, uint64_t step, bufs_t *w, uint64_t clock,
                         uint64_t *v, tc_result_t *res) {
  char err[512];
  int rc = tc_push_pull(cl, (const float *const *)g->t, step, w->t, 0, clock, v, res, err,
                               sizeof err);
  if (rc < 0) fprintf(stderr, "push_pull: %s\n", err);
  assert_int_equal(rc, 0);
}

typedef struct {
  ts_cluster_t *c;
  int task, rounds;
  uint32_t busy_poll_us;
  int failures;
} pp_arg_t;

/* How many elements of w are not want (relative 1e-6), or with at_most, are above it; the
 * first is printed. */
static int count_off(const bufs_t *w, double want, bool at_most, int task, int round) {
  int off = 0;
  for (int t = 0; t < 2; t++) {
    for (size_t k = 0; k < model_elems[t]; k++) {
      double got = w->t[t][k];
      bool bad = at_most ? got > want : fabs(got - want) > 1e-6 * fabs(want);
      if (bad && off++ == 0)
        fprintf(stderr, "task %d round %d: tensor %d [%zu] = %.9g, want %s%.9g\n", task, round, t,
                k, got, at_most ? "at most " : "", want);
    }
  }
  return off;
}

/* Each pull sees at least this worker's own pushes so far, applied: the shards handle a
 * connection's push before the pull behind it. */
static void *push_pull_worker(void *p) {
  pp_arg_t *a = p;
  ts_client_t *cl = open_worker_polling(a->c, a->task, a->busy_poll_us);
  bufs_t w, g;
  bufs_init(&w);
  bufs_init(&g);
  bufs_fill(&g, (float)(a->task + 1));
  for (int r = 0; r < a->rounds; r++) {
    tc_result_t res;
    uint64_t v = 0;
    push_pull_ok(cl, &g, (uint64_t)r, &w, (uint64_t)r + 1, &v, &res);
    if (res.push_rc != 0 || res.pull_rc != 0 || res.applied != ts_client_num_parts(cl))
      a->failures++;
    a->failures += count_off(&w, -0.5 * (a->task + 1) * (r + 1), true, a->task, r);
  }
  bufs_free(&w);
  bufs_free(&g);
  ts_client_close(cl);
  return NULL;
}

static void test_push_pull_async_exact(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"async\"; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.5; };"),
                   0);
  /* Alone, every call returns exactly the parameters after its own push. */
  ts_client_t *cl = open_worker_polling(&c, 0, 50);
  bufs_t w, g;
  bufs_init(&w);
  bufs_init(&g);
  bufs_fill(&g, 1.0f);
  uint64_t v = 0, last = 0;
  for (int r = 0; r < 3; r++) {
    push_pull_ok(cl, &g, (uint64_t)r, &w, (uint64_t)r + 1, &v, NULL);
    assert_all(&w, -0.5 * (r + 1), 0.0);
    assert_true(v > last);
    last = v;
  }
  ts_client_close(cl);
  /* Two workers at once, one polling and one not. */
  enum { R = 30 };
  pthread_t th[2];
  pp_arg_t args[2];
  for (int t = 0; t < 2; t++) {
    args[t] = (pp_arg_t){&c, t, R, t == 0 ? 50 : 0, 0};
    pthread_create(&th[t], NULL, push_pull_worker, &args[t]);
  }
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < 2; t++) assert_int_equal(args[t].failures, 0);
  cl = open_worker(&c, 0);
  pull_ok(cl, &w, 0, 0, NULL);
  /* -0.5 * 3 alone, then -0.5 * R * (1 + 2): dyadic, so exact. */
  assert_all(&w, -1.5 - 0.5 * R * 3.0, 0.0);
  bufs_free(&w);
  bufs_free(&g);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* sync_worker's rounds with push_pull_next: each call's pull waits for the step its push
 * took part in, and returns exactly the formula's parameters. */
static void *sync_push_pull_worker(void *p) {
  sync_arg_t *a = p;
  ts_client_t *cl = open_worker_polling(a->c, a->task, a->task == 0 ? 50 : 0);
  bufs_t w, g;
  bufs_init(&w);
  bufs_init(&g);
  char err[512];
  uint64_t version = 0;
  int rc = tc_pull(cl, w.t, TS_CLIENT_VERSION_NEXT, 0, &version, err, sizeof err);
  if (rc < 0 || version != 0) a->failures++;
  for (int i = 0; i < a->rounds; i++) {
    bufs_fill(&g, (float)((a->task + 1) * (i + 1)));
    tc_result_t res;
    /* The last round the old way: push_pull_next left the versions to tag and wait by. */
    if (i + 1 < a->rounds) {
      rc = tc_push_pull(cl, (const float *const *)g.t, TS_CLIENT_STEP_PULLED, w.t, TS_CLIENT_VERSION_NEXT, (uint64_t)i + 1, &version,
                                    &res, err, sizeof err);
    } else {
      rc = tc_push(cl, (const float *const *)g.t, TS_CLIENT_STEP_PULLED, &res, err, sizeof err);
      if (rc == 0) rc = tc_pull(cl, w.t, TS_CLIENT_VERSION_NEXT, (uint64_t)i + 1, &version, err, sizeof err);
    }
    if (rc < 0) fprintf(stderr, "task %d round %d: %s\n", a->task, i, err);
    if (rc < 0 || res.accumulated == 0 || version != (uint64_t)i + 1) a->failures++;
    a->failures += count_off(&w, sync_expected(a->workers, i + 1, a->lr), false, a->task, i);
  }
  bufs_free(&w);
  bufs_free(&g);
  ts_client_close(cl);
  return NULL;
}

static void test_push_pull_next_sync(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"sync\"; partition_bytes = 4096; "
                                    "sync_timeout_s = 30.0; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.25; };"),
                   0);
  enum { W = 2, R = 8 };
  pthread_t th[W];
  sync_arg_t args[W];
  for (int t = 0; t < W; t++) {
    args[t] = (sync_arg_t){&c, t, W, R, 0.25, 0};
    pthread_create(&th[t], NULL, sync_push_pull_worker, &args[t]);
  }
  for (int t = 0; t < W; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < W; t++) assert_int_equal(args[t].failures, 0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* One polling worker alone on two shards, lr 0.5, and its parameter and gradient buffers. */
typedef struct {
  ts_cluster_t c;
  ts_client_t *cl;
  bufs_t w, g;
} solo_t;

static void solo_start(solo_t *f, const char *mode) {
  char cfg[256];
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"%s\"; partition_bytes = 4096; sync_timeout_s = 30.0; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.5; };",
           mode);
  assert_int_equal(ts_cluster_start(&f->c, 2, 1, cfg), 0);
  f->cl = open_worker_polling(&f->c, 0, 50);
  bufs_init(&f->w);
  bufs_init(&f->g);
}

static void solo_stop(solo_t *f) {
  bufs_free(&f->w);
  bufs_free(&f->g);
  ts_client_close(f->cl);
  assert_int_equal(ts_cluster_stop(&f->c), 0);
}

/* Seconds since t0 (uv_hrtime). */
static double since(uint64_t t0) { return (double)(uv_hrtime() - t0) * 1e-9; }

/* A refused push is the call's error, reported at once; the pull behind it is still
 * answered (and read), and the connection stays usable. */
static void test_push_pull_errors(void **state) {
  (void)state;
  solo_t f;
  solo_start(&f, "async");
  ts_client_t *cl = f.cl;
  bufs_t w = f.w, g = f.g;
  char err[512];
  tc_result_t res;
  /* Buffers that overlap are refused before anything is sent. */
  int rc = tc_push_pull(cl, (const float *const *)g.t, 0, g.t, 0, 0, NULL, &res, err,
                               sizeof err);
  assert_int_equal(rc, TS_EINVAL);
  assert_non_null(strstr(err, "overlap"));
  assert_int_equal(res.push_rc, TS_EINVAL);
  assert_int_equal(res.pull_rc, TS_EINVAL);
  /* A NaN in the partitions of one shard: that shard refuses the push, both pulls answer. */
  bufs_fill(&g, 1.0f);
  g.t[0][0] = NAN;
  uint64_t t0 = uv_hrtime();
  rc = tc_push_pull(cl, (const float *const *)g.t, 0, w.t, 0, 1, NULL, &res, err, sizeof err);
  assert_true(since(t0) < 5.0);
  assert_int_equal(rc, TS_ENONFINITE);
  assert_non_null(strstr(err, "NaN"));
  assert_int_equal(res.push_rc, TS_ENONFINITE);
  assert_int_equal(res.pull_rc, 0);
  /* The other shard applied its part; the refusing one changed nothing. */
  size_t nparts = ts_client_num_parts(cl);
  assert_true(res.applied > 0 && res.applied < nparts);
  bufs_fill(&g, 1.0f);
  uint64_t v = 0;
  push_pull_ok(cl, &g, 1, &w, 2, &v, &res);
  assert_int_equal(res.applied, nparts);
  ts_client_part_t p0;
  assert_int_equal(ts_client_part(cl, 0, &p0), 0);
  for (size_t k = 0; k < nparts; k++) {
    ts_client_part_t pt;
    assert_int_equal(ts_client_part(cl, k, &pt), 0);
    double want = pt.shard == p0.shard ? -0.5 : -1.0;
    for (uint64_t e = 0; e < pt.count; e++)
      assert_true((double)w.t[pt.tensor][pt.offset + e] == want);
  }
  solo_stop(&f);
}

/* Sync: a refused push is heard from (the barrier does not wait for it), so the pull
 * behind it gets the next version without hanging. The shards' versions stay as they were
 * for the client: the next call's push is tagged with the old step (stale now) and its
 * pull returns at once; the one after takes part again. */
static void test_push_pull_next_refused(void **state) {
  (void)state;
  solo_t f;
  solo_start(&f, "sync");
  ts_client_t *cl = f.cl;
  bufs_t w = f.w, g = f.g;
  char err[512];
  uint64_t v = 99;
  assert_int_equal(tc_pull(cl, w.t, TS_CLIENT_VERSION_NEXT, 0, &v, err, sizeof err), 0);
  assert_int_equal(v, 0);
  bufs_fill(&g, NAN);
  tc_result_t res;
  uint64_t t0 = uv_hrtime();
  int rc = tc_push_pull(cl, (const float *const *)g.t, TS_CLIENT_STEP_PULLED, w.t, TS_CLIENT_VERSION_NEXT, 1, &v, &res, err,
                                    sizeof err);
  assert_true(since(t0) < 5.0);
  assert_int_equal(rc, TS_ENONFINITE);
  assert_int_equal(res.push_rc, TS_ENONFINITE);
  assert_int_equal(res.pull_rc, 0);
  bufs_fill(&g, 2.0f);
  rc = tc_push_pull(cl, (const float *const *)g.t, TS_CLIENT_STEP_PULLED, w.t, TS_CLIENT_VERSION_NEXT, 1, &v, &res, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push_pull_next: %s\n", err);
  assert_int_equal(rc, 0);
  assert_int_equal(res.stale, ts_client_num_parts(cl));
  assert_int_equal(v, 1); /* the skipped step: nothing changed */
  assert_all(&w, 0.0, 0.0);
  rc = tc_push_pull(cl, (const float *const *)g.t, TS_CLIENT_STEP_PULLED, w.t, TS_CLIENT_VERSION_NEXT, 2, &v, &res, err, sizeof err);
  assert_int_equal(rc, 0);
  /* One worker: each barrier closes with this gradient alone, applied straight away. */
  assert_int_equal(res.applied, ts_client_num_parts(cl));
  assert_int_equal(v, 2);
  assert_all(&w, -1.0, 0.0);
  solo_stop(&f);
}

/* --- declarations ------------------------------------------------------------------- */

static void test_redeclare_mismatch(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, "job = { mode = \"async\"; };"), 0);
  ts_client_t *a = open_worker(&c, 0);
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c.addrs, .num_shards = 2, .task = 1, .connect_timeout_s = 5,
                        .request_timeout_s = 10, .require_all = true};
  ts_client_t *b = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&b, &o, err, sizeof err), 0);
  static const uint64_t other[] = {100, 99};
  ts_client_tensor_t wrong[] = {
      {.name = "big", .shape = other, .rank = 2, .init = TS_CLIENT_INIT_ZEROS},
      {.name = "small", .shape = small_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
  };
  int rc = ts_client_declare(b, wrong, 2, 42, err, sizeof err);
  assert_int_equal(rc, TS_ESHAPE);
  assert_non_null(strstr(err, "'big' is already declared with shape [100,100], not [100,99]"));
  /* The same model again is fine. */
  assert_int_equal(ts_client_declare(b, model, 2, 42, err, sizeof err), 0);
  ts_client_close(a);
  ts_client_close(b);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A worker that leaves the job (done) right after its last push still counts for that
 * step's barrier: the barrier waits for the other worker's gradient instead of closing
 * with the leaver's alone (which made the end of a sync run depend on timing). Steps after
 * it close with the remaining worker alone. */
static void test_sync_leaver_counts_for_its_last_step(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"sync\"; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *w0 = open_worker(&c, 0), *w1 = open_worker(&c, 1);
  bufs_t b, g;
  bufs_init(&b);
  bufs_init(&g);
  tc_result_t res;
  bufs_fill(&g, 2.0f);
  push_ok(w0, &g, 0, &res);
  char err[512];
  ts_client_set_progress(w0, 1, 0.0, 0.0, 1.0, true);
  assert_int_equal(ts_client_heartbeat(w0, err, sizeof err), 0);
  bufs_fill(&g, 4.0f);
  push_ok(w1, &g, 0, &res);
  assert_int_equal(res.stale, 0);
  uint64_t v = 0;
  pull_ok(w1, &b, 1, 0, &v);
  assert_all(&b, -3.0, 0.0); /* (2 + 4) / 2 */
  /* Step 1: worker 1 alone now. */
  push_ok(w1, &g, 1, &res);
  pull_ok(w1, &b, 2, 0, &v);
  assert_int_equal(v, 2);
  assert_all(&b, -7.0, 0.0);
  bufs_free(&b);
  bufs_free(&g);
  ts_client_close(w0);
  ts_client_close(w1);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_exact),
      cmocka_unit_test(test_decay_schedule),
      cmocka_unit_test(test_sync_two),
      cmocka_unit_test(test_sync_three),
      cmocka_unit_test(test_sync_stale_and_backup),
      cmocka_unit_test(test_sync_leaver_counts_for_its_last_step),
      cmocka_unit_test(test_ssp_bound),
      cmocka_unit_test(test_redeclare_mismatch),
      cmocka_unit_test(test_push_pull_async_exact),
      cmocka_unit_test(test_push_pull_next_sync),
      cmocka_unit_test(test_push_pull_errors),
      cmocka_unit_test(test_push_pull_next_refused),
  };
  return cmocka_run_group_tests_name("ps", tests, NULL, NULL);
}
