/* The client library's job check (ts_client_opts_t.job): a shard compares the settings a
 * worker sends in its handshake with its own job file. A difference fails ts_client_open
 * with ECONFIG and one line naming the key and both values, and the shard logs and counts
 * it; equal settings, a key the shard does not know, and no settings at all (an older
 * client) are let in; a good client is served all along. Also: a cancel flag ends an open
 * that waits for an unreachable shard. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "ts_err.h"

static int open_job(ts_cluster_t *c, int task, const ts_client_job_setting_t *job, size_t n,
                    bool keep, ts_client_t **out, char *err, size_t errn) {
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = c->addrs;
  o.num_shards = (size_t)c->num_shards;
  o.task = task;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 5;
  o.require_all = true;
  o.job = job;
  o.num_job = n;
  ts_client_t *cl = NULL;
  int rc = ts_client_open(&cl, &o, err, errn);
  if (keep && out)
    *out = cl;
  else
    ts_client_close(cl);
  return rc;
}

static void test_job_settings(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"sync\"; };\n"
                                    "optimizer = { name = \"momentum\"; learning_rate = 0.05; };\n"
                                    "model = { layers = [784, 32, 10]; };"),
                   0);
  char err[512];
  /* A good client, served all along. */
  ts_client_t *good = NULL;
  assert_int_equal(open_job(&c, 0, NULL, 0, true, &good, err, sizeof err), 0);
  static const uint64_t shape[] = {64};
  ts_client_tensor_t t = {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS};
  assert_int_equal(ts_client_declare(good, &t, 1, 1, err, sizeof err), 0);
  float v[64];

  const ts_client_job_setting_t same[] = {
      {"job.mode", "\"sync\""},           {"cluster.workers", "2 workers"},
      {"optimizer.name", "\"momentum\""}, {"optimizer.learning_rate", "0.05"},
      {"optimizer.momentum", "0.9"},      {"model.layers", "[784, 32, 10]"},
      {"job.some_future_key", "7"}};
  assert_int_equal(open_job(&c, 1, same, sizeof same / sizeof *same, false, NULL, err, sizeof err),
                   0);

  /* Either shard may answer first: the line is "KEY: this worker has X, shard N has Y". */
  const struct {
    ts_client_job_setting_t s;
    const char *worker, *shard;
  } bad[] = {
      {{"job.mode", "\"async\""}, "job.mode: this worker has \"async\", shard ", " has \"sync\""},
      {{"job.name", "\"other\""}, "job.name: this worker has \"other\", shard ", " has \"\""},
      {{"cluster.workers", "3 workers"},
       "cluster.workers: this worker has 3 workers, shard ",
       " has 2 workers"},
      {{"optimizer.momentum", "0.5"},
       "optimizer.momentum: this worker has 0.5, shard ",
       " has 0.9"},
      {{"model.layers", "[784, 10]"},
       "model.layers: this worker has [784, 10], shard ",
       " has [784, 32, 10]"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    double t0 = ts_now_s();
    int rc = open_job(&c, 1, &bad[i].s, 1, false, NULL, err, sizeof err);
    double took = ts_now_s() - t0;
    fprintf(stderr, "%s: %s after %.3f s: %s\n", bad[i].s.key, ts_client_strerror(rc), took, err);
    assert_int_equal(rc, TS_CLIENT_ECONFIG);
    const char *a = strstr(err, bad[i].worker);
    assert_non_null(a);
    const char *b = strstr(a, bad[i].shard);
    assert_non_null(b);
    assert_string_equal(b, bad[i].shard); /* the line ends there */
    assert_true(took < 4.0);              /* refused at once, not at connect_timeout_s (5 s) */
    /* The good client is not disturbed. */
    float *dst[] = {v};
    ts_client_req_t q;
    ts_client_req_init(&q, TS_CLIENT_PULL);
    q.dst = dst;
    assert_int_equal(ts_client_run(good, &q), 0);
  }
  /* Logged by the shards, each with the key, and counted (the client tried both at once;
   * a shard whose refusal came second may have answered too). */
  bool logged = false;
  double refused = 0;
  for (int s = 0; s < 2; s++) {
    char *log = ts_cluster_log(&c, s);
    assert_non_null(log);
    logged |=
        strstr(log, "refused: optimizer.momentum: the worker has 0.5, this shard has 0.9") != NULL;
    free(log);
    double n = ts_metric_wait(c.http_port[s],
                              "tessera_ps_refused_requests_total{request=\"handshake\","
                              "reason=\"config\"}",
                              0, 5);
    assert_true(n >= 0 && n <= 5);
    refused += n;
  }
  assert_true(logged);
  assert_true(refused >= 5);
  ts_client_close(good);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static volatile sig_atomic_t cancel_flag;

static void *set_cancel(void *arg) {
  (void)arg;
  ts_sleep_ms(300);
  cancel_flag = 1;
  return NULL;
}

static void test_cancel_while_waiting(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  ts_cluster_signal(&c, 0, SIGTERM);
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = c.addrs;
  o.num_shards = 1;
  o.connect_timeout_s = 30;
  o.require_all = true;
  o.cancel = &cancel_flag;
  cancel_flag = 0;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, set_cancel, NULL), 0);
  ts_client_t *cl = NULL;
  char err[256];
  double t0 = ts_now_s();
  int rc = ts_client_open(&cl, &o, err, sizeof err);
  double took = ts_now_s() - t0;
  pthread_join(th, NULL);
  fprintf(stderr, "cancelled open: %s after %.3f s\n", ts_client_strerror(rc), took);
  assert_int_equal(rc, TS_CLIENT_ESHUTDOWN);
  assert_null(cl);
  assert_true(took < 5.0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_job_settings),
      cmocka_unit_test(test_cancel_while_waiting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
