/*
 * Two shard metrics that used to read a shared "current request" (server/ts_server_int.h):
 * the push latency histogram covers a push from its meta to its reply, so the optimizer
 * work done piece by piece while the payload arrives is in it; and every failed checkpoint,
 * whether it fails before its write or in it, counts as result="error", whoever asked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "bigtensor.h"
#include "harness.h"
#include "calls.h"
#include "ts_err.h"

static char body[1 << 18];

/* The value of series in shard 0's /metrics once it equals want (the snapshot is published
 * every 250 ms), or its last value after 10 s. */
static double metric_when(ts_cluster_t *c, const char *series, double want) {
  double v = -1;
  for (int i = 0; i < 500; i++) {
    if (ts_http_get(c->http_port[0], "/metrics", body, sizeof body, NULL, 0) == 200) {
      v = ts_metric_value(body, series);
      if (v == want) return v;
    }
    usleep(20000);
  }
  fprintf(stderr, "%s is %g, expected %g\n", series, v, want);
  return v;
}

/* --- push latency: from the meta to the reply ------------------------------------------ */

#define PARTS 8
#define PART_FLOATS (1u << 20) /* 4 MiB partitions, 32 MiB pushes */
#define PUSHES 4

static void test_push_latency_includes_apply(void **state) {
  (void)state;
  ts_cluster_t c;
  /* Adam: the heaviest optimizer, so the apply is a visible part of each push. */
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"async\"; partition_bytes = 4194304; };\n"
                                    "optimizer = { name = \"adam\"; learning_rate = 0.001; };"),
                   0);
  ts_big_t big;
  ts_big_init(&big, PARTS, PART_FLOATS);
  ts_client_t *cl = ts_big_worker(&c, &big, 0, "latency", 30, 0.5);
  float *g = ts_big_filled(&big, 1.0f);
  char err[512];
  double client_s = 0;
  for (int i = 0; i < PUSHES; i++) {
    double t0 = ts_now_s();
    assert_int_equal(
        tc_push(cl, (const float *const *)&g, (uint64_t)i, NULL, err, sizeof err), 0);
    client_s += ts_now_s() - t0;
  }
  assert_int_equal(
      metric_when(&c, "tessera_ps_request_duration_seconds_count{request=\"push\"}", PUSHES),
      PUSHES);
  double server_s =
      ts_metric_value(body, "tessera_ps_request_duration_seconds_sum{request=\"push\"}");
  fprintf(stderr, "%d pushes of %zu MiB: %.1f ms at the client, %.1f ms in the shard's histogram\n",
          PUSHES, big.n * sizeof(float) >> 20, client_s * 1e3, server_s * 1e3);
  /* The shard's clock starts when the meta arrives, before the payload is read and applied:
   * it sees most of what the client waits for. Timed from the last byte, as before, it saw
   * only the reply being queued (microseconds). */
  assert_true(server_s >= 0.5 * client_s);
  assert_true(server_s <= client_s * 1.05 + 0.01);
  free(g);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- failed checkpoints ---------------------------------------------------------------- */

static ts_client_t *open_admin(ts_cluster_t *c) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, 1);
  o.admin = true;
  o.task = -1;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  return cl;
}

static void test_failed_checkpoints_count(void **state) {
  (void)state;
  ts_cluster_t c;
  /* The directory replaced by a regular file once the shard has started (a directory that
   * takes no file at start stops the start): every write fails. */
  char dir[] = "/tmp/tessera-metrics-ckpt-XXXXXX", job[300];
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\ncheckpoint = { dir = \"%s\"; interval_s = 3600; };",
           dir);
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  assert_int_equal(rmdir(dir), 0);
  FILE *plain = fopen(dir, "w");
  assert_non_null(plain);
  fclose(plain);
  const char *errors = "tessera_ps_checkpoints_total{result=\"error\"}";
  assert_int_equal(metric_when(&c, errors, 0), 0);
  ts_client_t *a = open_admin(&c);
  char err[512], path[600];
  /* Nothing declared: the checkpoint fails before its write. */
  assert_int_equal(ts_client_checkpoint(a, 0, path, sizeof path, NULL, err, sizeof err),
                   TS_ENOTDECLARED);
  assert_int_equal(metric_when(&c, errors, 1), 1);
  /* Declared and trained: the write fails. */
  ts_big_t big;
  ts_big_init(&big, 2, 1024);
  ts_client_t *w = ts_big_worker(&c, &big, 0, "ckpt", 10, 0);
  float *g = ts_big_filled(&big, 1.0f);
  assert_int_equal(tc_push(w, (const float *const *)&g, 0, NULL, err, sizeof err), 0);
  assert_true(ts_client_checkpoint(a, 0, path, sizeof path, NULL, err, sizeof err) < 0);
  assert_int_equal(metric_when(&c, errors, 2), 2);
  assert_int_equal(ts_metric_value(body, "tessera_ps_checkpoints_total{result=\"ok\"}"), 0);
  /* Refused as admin requests, never as pushes (the last request before the reply). */
  assert_int_equal(ts_metric_value(body, "tessera_ps_push_requests_total{result=\"refused\"}"), 0);
  assert_int_equal(
      ts_metric_value(
          body, "tessera_ps_refused_requests_total{request=\"other\",reason=\"notdeclared\"}"),
      1);
  /* Busy and "no checkpoint.dir" refuse before trying: not failed checkpoints. (The
   * latter is test_checkpoint's test_checkpoint_without_dir; its count is checked here.) */
  free(g);
  ts_client_close(w);
  ts_client_close(a);
  assert_int_equal(ts_cluster_stop(&c), 0);
  assert_int_equal(unlink(dir), 0);

  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  a = open_admin(&c);
  assert_int_equal(ts_client_checkpoint(a, 0, path, sizeof path, NULL, err, sizeof err),
                   TS_ECONFIG);
  assert_int_equal(
      metric_when(&c, "tessera_ps_refused_requests_total{request=\"other\",reason=\"config\"}", 1),
      1);
  assert_int_equal(ts_metric_value(body, errors), 0);
  ts_client_close(a);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_latency_includes_apply),
      cmocka_unit_test(test_failed_checkpoints_count),
  };
  return cmocka_run_group_tests_name("server_metrics", tests, NULL, NULL);
}
