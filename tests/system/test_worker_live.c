/*
 * System tests of what a person or a probe sees of a worker while it trains:
 *  - /livez calls a worker stuck when its training loop cannot advance, for a real reason:
 *    its shard is stopped (SIGSTOP), so its requests go unanswered; the answer names what
 *    the loop waits on and the shard its client is not connected to, and it is 200 again
 *    once the shard continues. A sync worker whose
 *    peer stalls waits on a barrier that closes within job.sync_timeout_s, and is not
 *    called stuck.
 *  - On a terminal (util-linux script(1) gives it a pseudo-terminal) ps-worker redraws a
 *    progress line in place, and its log lines are not garbled by it.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static char body[1 << 16];

/* A job of a small MLP with a 1 s heartbeat timeout, mode, sync_timeout_s and the train
 * group's keys given; skips the test without the data. */
static void start_job(ts_cluster_t *c, int shards, int workers, const char *mode,
                      double sync_timeout_s, const char *train) {
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  char job[512];
  snprintf(job, sizeof job,
           "job = { mode = \"%s\"; heartbeat_interval_s = 0.2; heartbeat_timeout_s = 1.0; "
           "sync_timeout_s = %g; };\nmodel = { layers = [784, 32, 10]; };\ntrain = { %s };",
           mode, sync_timeout_s, train);
  assert_int_equal(ts_cluster_start(c, shards, workers, job), 0);
}

/* Poll the worker's admin endpoint until it is ready and has made a step (up to 30 s). */
static void wait_training(int port) {
  double step = -1;
  for (int i = 0; i < 600 && step < 1; i++) {
    if (ts_http_get(port, "/metrics", body, sizeof body, NULL, 0) == 200)
      step = ts_metric_value(body, "tessera_worker_step");
    if (step < 1) usleep(50000);
  }
  if (step < 1) fail_msg("the worker did not start training within 30 s");
}

/* /livez's status, polled every 100 ms until it is `want` or timeout_s passed; body holds
 * the last answer. */
static int livez_until(int port, int want, double timeout_s) {
  int st = -1;
  for (double t0 = ts_now_s(); ts_now_s() - t0 < timeout_s;) {
    st = ts_http_get(port, "/livez", body, sizeof body, NULL, 0);
    if (st == want) break;
    usleep(100000);
  }
  return st;
}

static void test_livez_stopped_shard(void **state) {
  (void)state;
  ts_cluster_t c;
  start_job(&c, 2, 1, "async", 1.0, "epochs = 100000; stall_timeout_s = 3.0;");
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  int port = c.worker_port[0];
  wait_training(port);
  assert_int_equal(ts_http_get(port, "/livez", body, sizeof body, NULL, 0), 200);

  /* Shard 1 stops: the worker's requests to it go unanswered, its loop cannot advance. */
  double t_stop = ts_now_s();
  kill(c.pid[1], SIGSTOP);
  int st = livez_until(port, 503, 30);
  double after = ts_now_s() - t_stop;
  fprintf(stderr, "livez after %.1f s: %d %s", after, st, body);
  /* The first answer may come while the request is still in flight; once the client gives
   * up on the silent shard (job.heartbeat_timeout_s) and retries, it names the shard. */
  for (int i = 0; i < 300 && st == 503 && !strstr(body, c.addr[1]); i++) {
    usleep(100000);
    st = ts_http_get(port, "/livez", body, sizeof body, NULL, 0);
  }
  fprintf(stderr, "livez after %.1f s: %d %s", ts_now_s() - t_stop, st, body);
  /* /metrics is a snapshot refreshed every 250 ms: wait for it to pass the threshold, and
   * read it while the shard is still stopped (once it continues, the loop progresses). */
  double age = ts_metric_wait(port, "tessera_worker_loop_progress_age_seconds", 3.0001, 1e9);
  kill(c.pid[1], SIGCONT);
  if (st != 503) ts_proc_dump(&w);
  assert_int_equal(st, 503);
  assert_true(after >= 3.0); /* never before the threshold */
  assert_non_null(strstr(body, "training loop stuck: no progress for "));
  assert_non_null(strstr(body, "train.stall_timeout_s 3"));
  /* What it waits on: the step's phase, and the shard its last retry failed on. */
  assert_non_null(strstr(body, "step "));
  assert_non_null(strstr(body, c.addr[1]));
  /* And the client's view of it, whatever the loop waits in: a request made while the
   * shard reconnects waits without a retry to report (it once failed only at its 30 s
   * deadline). */
  char down[64];
  snprintf(down, sizeof down, "not connected: shard 1 (%s): ", c.addr[1]);
  assert_non_null(strstr(body, down));
  assert_true(age > 3.0);

  /* The shard continues: the worker reconnects, trains on, and is live again. */
  st = livez_until(port, 200, 60);
  if (st != 200) ts_proc_dump(&w);
  assert_int_equal(st, 200);
  kill(w.pid, SIGTERM);
  assert_int_equal(ts_proc_wait(&w, 30), 0);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Sync: worker 1 stalls (SIGSTOP) for longer than the heartbeat timeout; worker 0's pull
 * waits on the barrier, which proceeds without the silent worker within sync_timeout_s.
 * /livez of worker 0 stays 200 all along: a wait on a live shard, bounded below the
 * threshold, is not stuck. */
static void test_livez_sync_barrier_wait(void **state) {
  (void)state;
  ts_cluster_t c;
  /* The job must outlast the test: 50 epochs of this MLP took 5.5 s here, and worker 0 then
   * finished (worker 1, silent, counts as finished) and exited. */
  start_job(&c, 1, 2, "sync", 2.0, "epochs = 100000; stall_timeout_s = 3.5;");
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  for (int t = 0; t < 2; t++) wait_training(c.worker_port[t]);
  kill(w[1].pid, SIGSTOP);
  int bad = 0;
  double t0 = ts_now_s();
  while (ts_now_s() - t0 < 6.0) {
    int st = ts_http_get(c.worker_port[0], "/livez", body, sizeof body, NULL, 0);
    if (st != 200) {
      fprintf(stderr, "worker 0's livez: %d %s", st, body);
      bad++;
    }
    usleep(100000);
  }
  kill(w[1].pid, SIGCONT);
  if (bad) ts_proc_dump(&w[0]);
  /* Worker 0 went on without worker 1 meanwhile (the barrier closed at its timeout). */
  assert_int_equal(ts_http_get(c.worker_port[0], "/status", body, sizeof body, NULL, 0), 200);
  assert_non_null(strstr(body, "\"loop_doing\""));
  assert_int_equal(bad, 0);
  for (int t = 0; t < 2; t++) {
    kill(w[t].pid, SIGTERM);
    assert_int_equal(ts_proc_wait(&w[t], 30), 0);
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* The states a terminal was shown: the typescript split at carriage returns and newlines,
 * each progress-line drawing ("\r\033[K" then "worker 0  step S/T") read for its step.
 * Returns how many distinct steps were drawn; *garbled counts log lines with a progress
 * line inside them. */
static int progress_states(const char *ts, int *garbled, int *log_lines) {
  int distinct = 0;
  unsigned long long last = 0;
  *garbled = 0;
  *log_lines = 0;
  for (const char *p = ts; (p = strstr(p, "\r\033[K")) != NULL;) {
    p += 4;
    unsigned long long s, total;
    if (sscanf(p, "worker 0  step %llu/%llu", &s, &total) == 2 && s != last) {
      distinct++;
      last = s;
    }
  }
  /* Every log line starts at the beginning of a line of its own: after a newline, or after
   * the erase that cleared the progress line. */
  for (const char *p = ts; (p = strstr(p, " ps-worker[0] ")) != NULL; p++) {
    (*log_lines)++;
    const char *bol = p;
    while (bol > ts && bol[-1] != '\n' && bol[-1] != 'K') bol--;
    /* 24 characters of timestamp: 2026-12-01T01:02:03.456Z */
    if (p - bol != 24 || (bol > ts && bol[-1] == 'K' && (bol - ts < 4 || bol[-4] != '\r')))
      (*garbled)++;
    const char *eol = strchr(p, '\n');
    const char *draw = strstr(p, "worker 0  step ");
    if (draw && (!eol || draw < eol)) (*garbled)++;
  }
  return distinct;
}

static void test_progress_on_terminal(void **state) {
  (void)state;
  if (system("script --version >/dev/null 2>&1") != 0)
    TS_SKIP("script(1) is missing (apt-get install bsdutils): no terminal to draw on");
  ts_cluster_t c;
  start_job(&c, 1, 1, "async", 1.0, "max_steps = 6000; log_interval_s = 1.0;");
  char cmd[2048], out[400];
  snprintf(out, sizeof out, "%s/terminal.out", c.dir);
  /* script(1): the worker's stdout and stderr are a pseudo-terminal; what it drew lands in
   * terminal.out, byte for byte. */
  snprintf(cmd, sizeof cmd, "script -qfec '%s -c %s --task 0' /dev/null > %s 2>&1 </dev/null",
           ts_ps_worker_path, c.config, out);
  int rc = system(cmd);
  char *ts = ts_read_file(out);
  assert_non_null(ts);
  if (rc != 0) fprintf(stderr, "%s\n", ts);
  assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 0);
  int garbled, lines;
  int states = progress_states(ts, &garbled, &lines);
  fprintf(stderr, "terminal: %d distinct progress states, %d log lines, %d garbled\n", states,
          lines, garbled);
  assert_true(states >= 3);
  assert_true(lines >= 3);
  assert_int_equal(garbled, 0);
  /* The line has every part, and is erased at the end: the done: line starts a line. */
  assert_non_null(strstr(ts, " examples/s  loss "));
  assert_non_null(strstr(ts, "  ETA "));
  assert_non_null(strstr(ts, " epoch 1 ["));
  const char *done = strstr(ts, "done: task=0 ");
  assert_non_null(done);
  assert_true(done[-1] == '\n' || done[-1] == 'K');
  free(ts);

  /* Not on a terminal: no drawing at all, and log lines at each tenth of an epoch, up to
   * ten a second, so a 3-epoch job of a second or two an epoch (7500 steps of batch 8)
   * shows several per epoch. */
  ts_proc_t w;
  const char *extra[] = {"--set", "train.max_steps=0", "--set", "train.epochs=3", "--set",
                         "train.batch_size=8", "--set", "train.log_interval_s=5.0", NULL};
  assert_int_equal(ts_worker_start(&c, 0, extra, &w), 0);
  assert_int_equal(ts_proc_wait(&w, 300), 0);
  char *log = ts_read_file(w.err);
  assert_non_null(log);
  assert_null(strstr(log, "\033[K"));
  int per_epoch[3] = {0, 0, 0};
  for (const char *l = strstr(log, " info: step "); l; l = strstr(l + 1, " info: step ")) {
    unsigned long long s, total, epoch;
    if (sscanf(l, " info: step %llu/%llu epoch %llu", &s, &total, &epoch) == 3 && epoch >= 1 &&
        epoch <= 3)
      per_epoch[epoch - 1]++;
  }
  fprintf(stderr, "log lines per epoch: %d %d %d\n", per_epoch[0], per_epoch[1], per_epoch[2]);
  for (int e = 0; e < 3; e++)
    if (per_epoch[e] < 3) fail_msg("epoch %d: %d log line(s); the log:\n%s", e + 1, per_epoch[e], log);
  free(log);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_livez_stopped_shard),
      cmocka_unit_test(test_livez_sync_barrier_wait),
      cmocka_unit_test(test_progress_on_terminal),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
