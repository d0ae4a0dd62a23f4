/*
 * A worker joining its job (issue "TensorFlow fidelity", items 5 and 6), through the real
 * ps-server and ps-worker binaries on loopback:
 *  - a worker whose job file differs from its shard's (job.mode, cluster.workers,
 *    optimizer.name, optimizer.learning_rate, model.layers) is refused at the handshake with
 *    one line naming the key and both values, in its log and the shard's, exits 78, and a
 *    good worker training beside it is not disturbed; a worker whose model differs from
 *    the one another program declared exits 78 too;
 *  - a worker started before its shard logs which shard it waits for and why at least every
 *    5 s, and trains once the shard is up;
 *  - SIGINT while it waits stops it at once with exit 0;
 *  - job.connect_timeout_s passing makes it give up with exit 1 and a line saying so;
 *  - train.max_steps is the global step in async mode (all workers' steps together).
 * Times are printed; the assertions on them are generous (a loaded 2-core machine).
 */
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

/* ts_worker_start, after removing the log of an earlier worker of the same task: the child
 * truncates it only once it runs, and a wait_log meanwhile would read the old one. */
static int start_worker(ts_cluster_t *c, int task, const char *const *extra, ts_proc_t *p) {
  char path[320];
  snprintf(path, sizeof path, "%s/worker-%d.log", c->dir, task);
  unlink(path);
  return ts_worker_start(c, task, extra, p);
}

static long done_steps(const ts_proc_t *p) {
  char *out = ts_read_file(p->out);
  const char *s = out ? strstr(out, "done: ") : NULL;
  s = s ? strstr(s, "steps=") : NULL;
  long n = s ? atol(s + strlen("steps=")) : -1;
  free(out);
  return n;
}

/* --- item 5: a worker of another job is refused; the good one trains on --------------- */

typedef struct {
  const char *set;      /* the override that makes the bad worker differ */
  const char *expected; /* the line its log and the shard's must hold */
} mismatch_t;

static void test_mismatch_refused(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2,
                                    "job = { mode = \"async\"; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.05; };\n"
                                    "train = { batch_size = 32; max_steps = 4000; "
                                    "log_interval_s = 0.5; };"),
                   0);
  char workers3[200];
  snprintf(workers3, sizeof workers3,
           "cluster.workers=[\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"]",
           c.worker_port[0], c.worker_port[1], ts_free_port());
  const mismatch_t cases[] = {
      {"job.mode=sync", "job.mode: this worker has \"sync\", shard 0 has \"async\""},
      {workers3, "cluster.workers: this worker has 3 workers, shard 0 has 2 workers"},
      {"optimizer.name=adam", "optimizer.name: this worker has \"adam\", shard 0 has \"sgd\""},
      {"optimizer.learning_rate=0.1",
       "optimizer.learning_rate: this worker has 0.1, shard 0 has 0.05"},
      {"model.layers=[784, 64, 10]",
       "model.layers: this worker has [784, 64, 10], shard 0 has [784, 32, 10]"},
  };
  const size_t ncases = sizeof cases / sizeof cases[0];

  /* The good worker trains all along. */
  ts_proc_t good;
  assert_int_equal(start_worker(&c, 0, NULL, &good), 0);
  assert_true(ts_proc_wait_log(&good, "declared on", 30));

  for (size_t i = 0; i < ncases; i++) {
    const char *extra[] = {"--set", cases[i].set, NULL};
    ts_proc_t bad;
    assert_int_equal(start_worker(&c, 1, extra, &bad), 0);
    /* The data is loaded before any shard is contacted: time the refusal from the line
     * the worker logs just before it connects. */
    bool connecting = ts_proc_wait_log(&bad, "connecting to 1 shard", 30);
    double t0 = ts_now_s();
    int st = ts_proc_wait(&bad, 30);
    double refused_after = ts_now_s() - t0;
    fprintf(stderr, "%s: exit %d, %.3f s after the worker began connecting\n", cases[i].set, st,
            refused_after);
    if (st != 78 || !ts_file_has(bad.err, cases[i].expected)) ts_proc_dump(&bad);
    assert_true(connecting);
    assert_int_equal(st, 78);
    assert_true(refused_after <= 5.0); /* the issue asks for 1 s; measured figures above */
    /* One line names it on each side. */
    assert_int_equal(ts_file_count(bad.err, cases[i].expected), 1);
    char *log = ts_cluster_log(&c, 0);
    char key[64];
    snprintf(key, sizeof key, "%.*s:", (int)strcspn(cases[i].expected, ":"), cases[i].expected);
    assert_non_null(log);
    assert_non_null(strstr(log, "refused: "));
    assert_non_null(strstr(log, key));
    free(log);
  }
  double refused = ts_metric_wait(c.http_port[0],
                                  "tessera_ps_refused_requests_total{request=\"handshake\","
                                  "reason=\"config\"}",
                                  (double)ncases, (double)ncases);
  assert_true(refused == (double)ncases);

  /* The good worker was never disturbed: it finishes its job. */
  int st = ts_proc_wait(&good, 120);
  if (st != 0) ts_proc_dump(&good);
  assert_int_equal(st, 0);
  assert_true(done_steps(&good) > 0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A job whose model was declared by another program: the worker's job file matches the
 * shard's, but its model does not (the shard's Declare check, ESHAPE): exit 78 as well. */
static void test_other_model_declared(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "model = { layers = [784, 16, 10]; };"), 0);
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = c.addrs;
  o.num_shards = 1;
  o.require_all = true;
  ts_client_t *cl = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), 0);
  static const uint64_t shape[] = {64};
  ts_client_tensor_t t = {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS};
  assert_int_equal(ts_client_declare(cl, &t, 1, 42, err, sizeof err), 0);
  ts_client_close(cl);
  ts_proc_t w;
  assert_int_equal(start_worker(&c, 0, NULL, &w), 0);
  int st = ts_proc_wait(&w, 60);
  if (st != 78) ts_proc_dump(&w);
  assert_int_equal(st, 78);
  assert_true(ts_file_has(w.err, "declaring the model: "));
  assert_true(ts_file_has(w.err, "is not part of the declared model"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- item 6: a worker waiting for its shard ---------------------------------------- */

static void test_waits_and_logs_then_trains(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"sync\"; };\n"
                                    "model = { layers = [784, 16, 10]; };\n"
                                    "train = { batch_size = 64; max_steps = 20; };"),
                   0);
  ts_cluster_signal(&c, 0, SIGTERM); /* the worker starts before its shard */
  ts_proc_t w;
  assert_int_equal(start_worker(&c, 0, NULL, &w), 0);
  assert_true(ts_proc_wait_log(&w, "connecting to 1 shard", 30));
  char who[96];
  snprintf(who, sizeof who, "waiting for shard 0 (%s)", c.addr[0]);
  /* Two lines within 11 s: one at least every 5 s, naming the address and why. */
  double t0 = ts_now_s();
  while (ts_now_s() - t0 < 11.5 && ts_file_count(w.err, who) < 2) ts_sleep_ms(50);
  fprintf(stderr, "%d waiting lines after %.1f s\n", ts_file_count(w.err, who), ts_now_s() - t0);
  if (ts_file_count(w.err, who) < 2) ts_proc_dump(&w);
  assert_true(ts_file_count(w.err, who) >= 2);
  assert_true(ts_file_has(w.err, "connection refused"));
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  int st = ts_proc_wait(&w, 60);
  if (st != 0) ts_proc_dump(&w);
  assert_int_equal(st, 0);
  assert_int_equal(done_steps(&w), 20);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_sigint_while_waiting(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "model = { layers = [784, 16, 10]; };"), 0);
  ts_cluster_signal(&c, 0, SIGTERM);
  for (int sig = SIGINT; sig; sig = sig == SIGINT ? SIGTERM : 0) {
    ts_proc_t w;
    assert_int_equal(start_worker(&c, 0, NULL, &w), 0);
    assert_true(ts_proc_wait_log(&w, "connecting to 1 shard", 30));
    ts_sleep_ms(300);
    double t0 = ts_now_s();
    kill(w.pid, sig);
    int st = ts_proc_wait(&w, 30);
    double took = ts_now_s() - t0;
    fprintf(stderr, "signal %d while waiting: exit %d after %.3f s\n", sig, st, took);
    if (st != 0) ts_proc_dump(&w);
    assert_int_equal(st, 0);
    assert_true(took <= 5.0); /* the issue asks for 1 s; the measured figure is above */
    assert_true(ts_file_has(w.err, "stopped by a signal while waiting for the shards"));
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_connect_timeout(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "model = { layers = [784, 16, 10]; };"), 0);
  ts_cluster_signal(&c, 0, SIGTERM);
  const char *extra[] = {"--set", "job.connect_timeout_s=2", NULL};
  ts_proc_t w;
  assert_int_equal(start_worker(&c, 0, extra, &w), 0);
  assert_true(ts_proc_wait_log(&w, "connecting to 1 shard", 30));
  double t0 = ts_now_s();
  int st = ts_proc_wait(&w, 30);
  double took = ts_now_s() - t0;
  fprintf(stderr, "job.connect_timeout_s = 2: exit %d after %.2f s\n", st, took);
  if (st != 1) ts_proc_dump(&w);
  assert_int_equal(st, 1);
  assert_true(took >= 1.5 && took <= 10.0);
  assert_true(ts_file_has(w.err, "gave up after 2 s (job.connect_timeout_s)"));
  assert_true(ts_file_has(w.err, "connection refused"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- train.max_steps: the global step in async mode ---------------------------------- */

static void test_async_max_steps_global(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"async\"; };\n"
                                    "model = { layers = [784, 16, 10]; };\n"
                                    "train = { batch_size = 32; max_steps = 60; };"),
                   0);
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(start_worker(&c, t, NULL, &w[t]), 0);
  long sum = 0;
  for (int t = 0; t < 2; t++) {
    int st = ts_proc_wait(&w[t], 120);
    if (st != 0) ts_proc_dump(&w[t]);
    assert_int_equal(st, 0);
    long n = done_steps(&w[t]);
    fprintf(stderr, "worker %d: %ld steps\n", t, n);
    assert_true(n >= 0 && n <= 60);
    sum += n;
  }
  /* Together max_steps (however they shared them: a worker that starts first may make
   * most); one more when both pulled the last step before either pushed it. Before, each
   * worker made max_steps: 120 in all. */
  assert_true(sum >= 60 && sum <= 61);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mismatch_refused),
      cmocka_unit_test(test_other_model_declared),
      cmocka_unit_test(test_waits_and_logs_then_trains),
      cmocka_unit_test(test_sigint_while_waiting),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_async_max_steps_global),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
