/*
 * A worker's TensorBoard event files (issue 30, "Right numbers" and "TensorBoard like
 * Keras"), read back from the real ps-worker's files:
 *  - the layout is Keras's: train.logdir/RUN/worker-T/{train,validation}, with its tags
 *    (epoch_loss, epoch_accuracy: the training accuracy, epoch_learning_rate in train/;
 *    epoch_accuracy, epoch_loss in validation/);
 *  - epoch_learning_rate is the rate the shards applied at that step under
 *    optimizer.decay, not the base rate;
 *  - a worker that joins a running sync job writes its test results at the job's step,
 *    as its losses are, not at its own count of steps;
 *  - in async mode every scalar is at the job's (global) step too, as TensorFlow's
 *    summaries are: a worker that goes on from a job at step 40 writes at 41..600;
 *  - a worker that fails to start (refused by its shard) leaves no event file.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "ts_alloc.h"
#include "ts_events.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

/* The records of the one event file in dir (ts_free), or NULL with *n = 0. */
static ts_events_record_t *read_dir(const char *dir, size_t *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char path[1024] = "";
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
  closedir(d);
  if (!path[0]) return NULL;
  ts_events_record_t *r = NULL;
  char err[512];
  if (ts_events_read(path, &r, n, err, sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    return NULL;
  }
  return r;
}

/* How many event files lie anywhere under dir. */
static int count_event_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
      n += count_event_files(path);
    else if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
      n++;
  }
  closedir(d);
  return n;
}

/* A worker run of the job: run name and max_steps; returns its exit status. */
static int run_worker(ts_cluster_t *c, const char *logdir, const char *run, int max_steps,
                      ts_proc_t *w) {
  char set_logdir[420], set_run[64], set_steps[64];
  snprintf(set_logdir, sizeof set_logdir, "train.logdir=\"%s\"", logdir);
  snprintf(set_run, sizeof set_run, "train.run_name=\"%s\"", run);
  snprintf(set_steps, sizeof set_steps, "train.max_steps=%d", max_steps);
  const char *extra[] = {"--set", set_logdir, "--set", set_run, "--set", set_steps, NULL};
  if (ts_worker_start(c, 0, extra, w) < 0) return -1;
  int st = ts_proc_wait(w, 300);
  if (st != 0) ts_proc_dump(w);
  return st;
}

/* A 1-shard, 1-worker job of a small MLP (job_text: the job and optimizer groups), the
 * worker run to step 40 ("first") then again to step `to` ("second"): the second run's
 * train/ and validation/ records (ts_free both). Skips the test without the data. */
static void two_runs(ts_cluster_t *c, const char *job_text, int to, ts_events_record_t **r,
                     size_t *n, ts_events_record_t **vr, size_t *vn, ts_proc_t *w) {
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  assert_int_equal(ts_cluster_start(c, 1, 1, job_text), 0);
  char logdir[400], dir[600];
  snprintf(logdir, sizeof logdir, "%s/tb", c->dir);
  assert_int_equal(run_worker(c, logdir, "first", 40, w), 0);
  assert_int_equal(run_worker(c, logdir, "second", to, w), 0);
  snprintf(dir, sizeof dir, "%s/second/worker-0/train", logdir);
  *r = read_dir(dir, n);
  snprintf(dir, sizeof dir, "%s/second/worker-0/validation", logdir);
  *vr = read_dir(dir, vn);
  assert_non_null(*r);
  assert_non_null(*vr);
}

static void test_layout_rate_and_steps(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_proc_t w;
  size_t n = 0, vn = 0;
  ts_events_record_t *r, *vr;
  /* The same worker twice: the second run joins the job at step 40 and makes 20. */
  two_runs(&c,
           "job = { mode = \"sync\"; };\n"
           "model = { layers = [784, 16, 10]; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.1; "
           "decay = \"exponential\"; decay_steps = 10; decay_rate = 0.5; };\n"
           "train = { batch_size = 32; log_interval_s = 0.1; };",
           60, &r, &n, &vr, &vn, &w);
  assert_true(ts_proc_wait_log(&w, "joining the job at step 40", 1));
  assert_true(ts_file_has(w.out, "done: task=0 steps=20 "));
  /* train/: the loss, the training accuracy and the scheduled rate at the job's steps
   * 41..60. */
  int rates = 0, losses = 0, accs = 0;
  double acc_sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(r[i].tag, "epoch_accuracy") == 0) {
      assert_true(r[i].value >= 0.0f && r[i].value <= 1.0f);
      acc_sum += (double)r[i].value;
      accs++;
    }
    if (strcmp(r[i].tag, "epoch_loss") == 0) {
      assert_true(r[i].step > 40 && r[i].step <= 60);
      losses++;
    }
    if (strcmp(r[i].tag, "epoch_learning_rate") != 0) continue;
    double want = (double)(float)(0.1 * pow(0.5, (double)(r[i].step - 1) / 10.0));
    if (fabs((double)r[i].value - want) > 1e-9)
      fail_msg("step %lld: epoch_learning_rate %.9g, the schedule gives %.9g",
               (long long)r[i].step, (double)r[i].value, want);
    rates++;
  }
  assert_true(losses >= 1);
  assert_true(rates == losses);
  assert_true(accs == losses);
  fprintf(stderr, "training accuracy over steps 41..60: %.3f\n", acc_sum / accs);
  /* Ten classes: 0.1 is a guess; 40 steps of SGD before learn more. */
  assert_true(acc_sum / accs > 0.2);
  /* validation/: the test results at the job's step 60 (before: at 20, this worker's own
   * count, behind its own losses). */
  bool acc = false, loss = false;
  for (size_t i = 0; i < vn; i++) {
    if (vr[i].version[0]) continue;
    if (strcmp(vr[i].tag, "epoch_accuracy") == 0) {
      fprintf(stderr, "test accuracy at step 60: %.3f\n", (double)vr[i].value);
      acc = true;
    }
    if (strcmp(vr[i].tag, "epoch_loss") == 0) loss = true;
    if (vr[i].step != 60) fail_msg("validation '%s' at step %lld, not 60", vr[i].tag, (long long)vr[i].step);
  }
  assert_true(acc && loss);
  ts_free(r);
  ts_free(vr);
  /* The first run is a run of its own. */
  char dir[600];
  snprintf(dir, sizeof dir, "%s/tb/first/worker-0/validation", c.dir);
  vr = read_dir(dir, &vn);
  assert_non_null(vr);
  ts_free(vr);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Async: train.max_steps is the job's global step; a second run of the worker goes on from
 * step 40 to 600, making 560 steps of its own, and writes every scalar at the job's steps. */
static void test_async_scalars_at_the_global_step(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_proc_t w;
  size_t n = 0, vn = 0;
  ts_events_record_t *r, *vr;
  two_runs(&c,
           "job = { mode = \"async\"; };\n"
           "model = { layers = [784, 16, 10]; };\n"
           "train = { batch_size = 32; log_interval_s = 0.1; };",
           600, &r, &n, &vr, &vn, &w);
  assert_true(ts_file_has(w.out, "done: task=0 steps=560 "));
  int scalars = 0;
  int64_t last = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].version[0]) continue;
    if (r[i].step <= 40 || r[i].step > 600)
      fail_msg("train '%s' at step %lld, not within the job's steps 41..600", r[i].tag,
               (long long)r[i].step);
    scalars++;
    if (r[i].step > last) last = r[i].step;
  }
  /* logged at every tenth of an epoch (187 steps) at least: some past the worker's own
   * 560 steps, which only the job's step reaches */
  assert_true(scalars >= 1);
  if (last <= 560) fail_msg("the last training scalar at step %lld: the worker's own count", (long long)last);
  for (size_t i = 0; i < vn; i++)
    if (!vr[i].version[0] && vr[i].step != 600)
      fail_msg("validation '%s' at step %lld, not 600", vr[i].tag, (long long)vr[i].step);
  ts_free(r);
  ts_free(vr);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_failed_start_leaves_nothing(void **state) {
  (void)state;
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };\n"
                                              "model = { layers = [784, 16, 10]; };"),
                   0);
  char logdir[400], set_logdir[420];
  snprintf(logdir, sizeof logdir, "%s/tb", c.dir);
  snprintf(set_logdir, sizeof set_logdir, "train.logdir=\"%s\"", logdir);
  /* Refused by its shard: another job.mode. */
  const char *extra[] = {"--set", set_logdir, "--set", "job.mode=\"sync\"", NULL};
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, extra, &w), 0);
  int st = ts_proc_wait(&w, 60);
  if (st != 78) ts_proc_dump(&w);
  assert_int_equal(st, 78);
  assert_int_equal(count_event_files(logdir), 0);
  /* A train.logdir that cannot be used still fails at once, naming it. */
  char file[420], set_bad[460];
  snprintf(file, sizeof file, "%s/plain-file", c.dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(set_bad, sizeof set_bad, "train.logdir=\"%s/tb\"", file);
  const char *bad[] = {"--set", set_bad, NULL};
  assert_int_equal(ts_worker_start(&c, 0, bad, &w), 0);
  st = ts_proc_wait(&w, 60);
  if (st != 78) ts_proc_dump(&w);
  assert_int_equal(st, 78);
  assert_true(ts_file_has(w.err, "train.logdir: cannot use the event directory"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_rate_and_steps),
      cmocka_unit_test(test_async_scalars_at_the_global_step),
      cmocka_unit_test(test_failed_start_leaves_nothing),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
