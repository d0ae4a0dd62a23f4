/*
 * A model's own values and state tensors on real ps-server shards (docs/architecture.md,
 * "Partitions"): a declare with values_follow leaves the model waiting for the chief's
 * values (pulls and gradient pushes refused ENOTREADY, awaiting_values in the reply), an
 * ASSIGN_INITIAL sets them once (a second one, as from a restarted chief, changes nothing),
 * ASSIGN replaces values and is refused where a sync step is open, and a state tensor keeps
 * the mean of the workers' values: sync, the step's mean; async, 1/W of the way per push.
 * Values are dyadic, so every comparison is exact.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

#define NT 2
#define N0 24
#define N1 6
static const uint64_t shape0[] = {4, 6}, shape1[] = {6};
static const ts_client_tensor_t model[NT] = {
    {.name = "dense/kernel", .shape = shape0, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
    {.name = "bn/moving_mean", .shape = shape1, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
};
static const ts_client_kind_t kinds[NT] = {TS_CLIENT_TRAINABLE, TS_CLIENT_STATE};

/* A client of task t with the model declared (values_follow); *awaiting gets the reply's. */
/* Declare the model with values_follow and the given kinds (NULL: all trainable); *awaiting
 * gets the reply's. Returns the declare's code, errmsg in err. */
static int declare(ts_client_t *cl, const ts_client_kind_t *k, bool *awaiting, char *err,
                   size_t errlen) {
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.seed = 3;
  d.values_follow = true;
  d.kinds = k;
  int rc = ts_client_declare_ex(cl, model, NT, &d, err, errlen);
  *awaiting = d.awaiting_values;
  return rc;
}

static ts_client_t *open_declared(ts_cluster_t *c, int task, bool *awaiting) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.task = task;
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  char err[256];
  if (declare(cl, kinds, awaiting, err, sizeof err) != 0) fail_msg("declare: %s", err);
  return cl;
}

/* Run one request of kind k over the whole model from bufs (values or gradients) and,
 * for pulls, into bufs. Returns its rc; *out (optional) gets the request. */
static int run(ts_client_t *cl, ts_client_req_kind_t k, float *b0, float *b1, uint64_t step,
               uint64_t min_version, ts_client_req_t *out) {
  const float *src[NT] = {b0, b1};
  float *dst[NT] = {b0, b1};
  ts_client_req_t r;
  ts_client_req_init(&r, k);
  if (k == TS_CLIENT_PULL)
    r.dst = dst;
  else
    r.grad = src;
  r.step = step;
  r.min_version = min_version;
  int rc = ts_client_run(cl, &r);
  if (out) *out = r;
  return rc;
}

/* 2 shards, 2 workers, the job's mode, several partitions per tensor, sgd at rate 1;
 * checkpoints in ckpt_dir when not NULL. */
static void start(ts_cluster_t *c, const char *mode, const char *ckpt_dir) {
  char cfg[1024], ck[600] = "";
  if (ckpt_dir)
    snprintf(ck, sizeof ck, "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 2; };",
             ckpt_dir);
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"%s\"; partition_bytes = 32; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 1.0; };\n%s",
           mode, ck);
  assert_int_equal(ts_cluster_start(c, 2, 2, cfg), 0);
}

/* Admin: have every shard write a checkpoint now; returns the first failure's code. */
static int checkpoint_all(ts_cluster_t *c, char *err, size_t errlen) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.admin = true;
  o.task = -1;
  o.require_all = true;
  ts_client_t *a = NULL;
  assert_int_equal(tc_open(&a, &o, NULL, 0, 0), 0);
  int rc = 0;
  for (uint32_t i = 0; i < (uint32_t)c->num_shards && rc == 0; i++)
    rc = ts_client_checkpoint(a, i, NULL, 0, NULL, err, errlen);
  ts_client_close(a);
  return rc;
}

static void fill(float *v, size_t n, float base) {
  for (size_t i = 0; i < n; i++) v[i] = base + 0.25f * (float)i;
}

static void test_chief_values_then_assign(void **state) {
  (void)state;
  ts_cluster_t c;
  start(&c, "async", NULL);
  bool awaiting = false;
  ts_client_t *w1 = open_declared(&c, 1, &awaiting);
  assert_true(awaiting); /* task 1 came first: the model waits for the chief's values */
  float v0[N0], v1[N1], g0[N0], g1[N1];
  ts_client_req_t r;
  assert_int_equal(run(w1, TS_CLIENT_PULL, v0, v1, 0, 0, &r), TS_CLIENT_ENOTREADY);
  assert_non_null(strstr(r.errmsg, "task 0"));
  fill(g0, N0, 1.0f);
  fill(g1, N1, 1.0f);
  assert_int_equal(run(w1, TS_CLIENT_PUSH, g0, g1, 0, 0, NULL), TS_CLIENT_ENOTREADY);

  ts_client_t *w0 = open_declared(&c, 0, &awaiting);
  assert_true(awaiting);
  float own0[N0], own1[N1];
  fill(own0, N0, -2.0f);
  fill(own1, N1, 0.5f);
  assert_int_equal(run(w0, TS_CLIENT_ASSIGN_INITIAL, own0, own1, 0, 0, &r), 0);
  assert_int_equal(r.applied, ts_client_num_parts(w0));
  /* The model is ready: both workers read the chief's values. */
  bool again = true;
  ts_client_t *w1b = open_declared(&c, 1, &again);
  assert_false(again);
  assert_int_equal(run(w1b, TS_CLIENT_PULL, v0, v1, 0, 0, NULL), 0);
  assert_memory_equal(v0, own0, sizeof v0);
  assert_memory_equal(v1, own1, sizeof v1);
  /* A second ASSIGN_INITIAL (a restarted chief with other values) changes nothing. */
  float other0[N0], other1[N1];
  fill(other0, N0, 7.0f);
  fill(other1, N1, 7.0f);
  assert_int_equal(run(w0, TS_CLIENT_ASSIGN_INITIAL, other0, other1, 0, 0, &r), 0);
  assert_int_equal(r.applied, 0);
  assert_int_equal(r.duplicate, ts_client_num_parts(w0));
  assert_int_equal(run(w1b, TS_CLIENT_PULL, v0, v1, 0, 0, NULL), 0);
  assert_memory_equal(v0, own0, sizeof v0);

  /* Async: a gradient is applied (sgd, rate 1) and the state moves 1/2 of the way. */
  fill(g0, N0, 1.0f);
  for (size_t i = 0; i < N1; i++) g1[i] = own1[i] + 2.0f;
  assert_int_equal(run(w1b, TS_CLIENT_PUSH, g0, g1, 0, 0, NULL), 0);
  assert_int_equal(run(w1b, TS_CLIENT_PULL, v0, v1, 0, 0, NULL), 0);
  for (size_t i = 0; i < N0; i++) assert_true(v0[i] == own0[i] - g0[i]);
  for (size_t i = 0; i < N1; i++) assert_true(v1[i] == own1[i] + 1.0f);
  /* ASSIGN replaces the values. */
  assert_int_equal(run(w0, TS_CLIENT_ASSIGN, other0, other1, 0, 0, &r), 0);
  assert_int_equal(r.applied, ts_client_num_parts(w0));
  assert_int_equal(run(w1b, TS_CLIENT_PULL, v0, v1, 0, 0, NULL), 0);
  assert_memory_equal(v0, other0, sizeof v0);
  assert_memory_equal(v1, other1, sizeof v1);
  ts_client_close(w0);
  ts_client_close(w1);
  ts_client_close(w1b);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_sync_state_mean_and_assign_between_steps(void **state) {
  (void)state;
  ts_cluster_t c;
  start(&c, "sync", NULL);
  bool awaiting = false;
  ts_client_t *w[2];
  w[0] = open_declared(&c, 0, &awaiting);
  assert_true(awaiting);
  float own0[N0], own1[N1];
  fill(own0, N0, 0.0f);
  fill(own1, N1, 1.0f);
  assert_int_equal(run(w[0], TS_CLIENT_ASSIGN_INITIAL, own0, own1, 0, 0, NULL), 0);
  w[1] = open_declared(&c, 1, &awaiting);
  assert_false(awaiting);
  float g0[2][N0], g1[2][N1], v0[N0], v1[N1];
  for (int t = 0; t < 2; t++) {
    fill(g0[t], N0, (float)(t + 1));
    for (size_t i = 0; i < N1; i++) g1[t][i] = (float)(4 * t) + 0.5f * (float)i;
  }
  /* Worker 0 pushes for step 0: the step is open, so an assign is refused (stale). */
  assert_int_equal(run(w[0], TS_CLIENT_PUSH, g0[0], g1[0], 0, 0, NULL), 0);
  ts_client_req_t r;
  assert_int_equal(run(w[0], TS_CLIENT_ASSIGN, own0, own1, 0, 0, &r), 0);
  assert_int_equal(r.applied, 0);
  assert_int_equal(r.stale, ts_client_num_parts(w[0]));
  /* Worker 1 closes the step: gradients averaged, state = the mean of the two values. */
  assert_int_equal(run(w[1], TS_CLIENT_PUSH, g0[1], g1[1], 0, 0, NULL), 0);
  assert_int_equal(run(w[1], TS_CLIENT_PULL, v0, v1, 0, 1, &r), 0);
  assert_int_equal(r.version, 1);
  for (size_t i = 0; i < N0; i++) assert_true(v0[i] == own0[i] - (g0[0][i] + g0[1][i]) / 2.0f);
  for (size_t i = 0; i < N1; i++) assert_true(v1[i] == (g1[0][i] + g1[1][i]) / 2.0f);
  /* Between steps an assign lands, and the version stays. */
  assert_int_equal(run(w[0], TS_CLIENT_ASSIGN, own0, own1, 0, 0, &r), 0);
  assert_int_equal(r.applied, ts_client_num_parts(w[0]));
  assert_int_equal(run(w[1], TS_CLIENT_PULL, v0, v1, 0, 0, &r), 0);
  assert_int_equal(r.version, 1);
  assert_memory_equal(v0, own0, sizeof v0);
  assert_memory_equal(v1, own1, sizeof v1);
  for (int t = 0; t < 2; t++) ts_client_close(w[t]);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* No checkpoint while the chief's values are awaited (there is nothing to keep yet); once
 * set, the values and the state tensors' kind are in the checkpoint: restarted from it the
 * shards hold them, answer a values_follow declare as not waiting (the chief's values stay
 * unsent) and refuse the tensor declared as trainable. */
static void test_checkpoint_keeps_values_and_kinds(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-values-XXXXXX", cmd[600];
  assert_non_null(mkdtemp(dir));
  ts_cluster_t c;
  start(&c, "async", dir);
  bool awaiting = false;
  ts_client_t *w0 = open_declared(&c, 0, &awaiting);
  assert_true(awaiting);
  char err[512];
  assert_int_equal(checkpoint_all(&c, err, sizeof err), TS_CLIENT_ENOTREADY);
  assert_non_null(strstr(err, "initial values"));
  float own0[N0], own1[N1], v0[N0], v1[N1];
  fill(own0, N0, -1.0f);
  fill(own1, N1, 2.0f);
  assert_int_equal(run(w0, TS_CLIENT_ASSIGN_INITIAL, own0, own1, 0, 0, NULL), 0);
  assert_int_equal(checkpoint_all(&c, err, sizeof err), 0);
  ts_client_close(w0);
  for (int i = 0; i < 2; i++) {
    ts_cluster_signal(&c, i, SIGKILL);
    assert_int_equal(ts_cluster_start_shard(&c, i), 0);
    assert_true(ts_cluster_log_has(&c, i, "restored checkpoint"));
  }
  w0 = open_declared(&c, 0, &awaiting);
  assert_false(awaiting);
  assert_int_equal(run(w0, TS_CLIENT_PULL, v0, v1, 0, 0, NULL), 0);
  assert_memory_equal(v0, own0, sizeof v0);
  assert_memory_equal(v1, own1, sizeof v1);
  ts_client_close(w0);
  ts_client_opts_t o;
  tc_opts(&o, c.addrs, (size_t)c.num_shards);
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  /* kinds NULL: every tensor trainable */
  assert_int_equal(declare(cl, NULL, &awaiting, err, sizeof err), TS_CLIENT_ESHAPE);
  assert_non_null(strstr(err, "state tensor"));
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checkpoint_keeps_values_and_kinds),
      cmocka_unit_test(test_chief_values_then_assign),
      cmocka_unit_test(test_sync_state_mean_and_assign_between_steps),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
