/*
 * The CTR job of ps-worker end to end (docs/embeddings.md): bench/criteo_gen writes
 * Criteo-shaped rows, 2 shards and 2 workers train the embedding + MLP model in sync mode,
 * and the test rows' AUC comes close to the best the generator's hidden model allows.
 *
 *   - criteo_gen is deterministic: the same arguments give the same bytes; another seed or
 *     stream, other rows;
 *   - the job (200k rows of 26 fields capped at 100 ids, Zipf 1.05, 2 epochs, batch 256,
 *     Adam 0.002) reaches a test AUC within 0.01 of the best (the bound; measured:
 *     0.8612 against 0.8685, a gap of 0.0073, the same in every run: sync, seeded; 0.855
 *     before the network saw which integers were missing), both workers report the same AUC and log loss (sync: the
 *     same final parameters), and the log, worker 0's /metrics (while it trains) and
 *     its TensorBoard events (each interval's epoch_auc in train/, the test rows' in
 *     validation/) and psctl workers (the last interval's AUC, the test AUC and log loss)
 *     show the AUC;
 *   - a shard killed and started again in an async job: the workers retry and finish;
 *   - a bad line in the training file: the worker exits 78 naming the file and the line;
 *   - DLRM's dot interactions (a dot layer) train too: AUC above 0.75 after one epoch of
 *     50k rows on one shard and one worker.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <glob.h>

#include "harness.h"
#include "ts_alloc.h"
#include "ts_events.h"

#define ROWS "200000"
#define CARD "100"

static char dir[] = "/tmp/ts_ctr_XXXXXX";

/* Run criteo_gen with args into path; the best AUC it prints, or -1. */
static double generate(const char *path, const char *const *args) {
  const char *argv[16] = {TS_CRITEO_GEN, "-o", path};
  size_t n = 3;
  for (size_t i = 0; args[i]; i++) argv[n++] = args[i];
  argv[n] = NULL;
  static char out[256], err[1024];
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  const char *best = strstr(err, "best_auc=");
  if (rc != 0 || !best) {
    fprintf(stderr, "criteo_gen exited %d: %s\n", rc, err);
    return -1;
  }
  return atof(best + strlen("best_auc="));
}

static bool same_file(const char *a, const char *b) {
  char *x = ts_read_file(a), *y = ts_read_file(b);
  bool same = x && y && strcmp(x, y) == 0;
  free(x);
  free(y);
  return same;
}

static void path_of(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", dir, name);
}

static void test_generator_deterministic(void **state) {
  (void)state;
  char a[300], b[300], c[300], d[300];
  path_of(a, sizeof a, "a.tsv");
  path_of(b, sizeof b, "b.tsv");
  path_of(c, sizeof c, "c.tsv");
  path_of(d, sizeof d, "d.tsv");
  const char *base[] = {"--rows", "3000", "--seed", "5", "--zipf", "1.2", NULL};
  const char *seed[] = {"--rows", "3000", "--seed", "6", "--zipf", "1.2", NULL};
  const char *stream[] = {"--rows", "3000", "--seed", "5", "--zipf", "1.2", "--stream", "1", NULL};
  double best = generate(a, base);
  assert_true(best > 0.6 && best < 1.0);
  assert_true(generate(b, base) == best);
  assert_true(generate(c, seed) > 0);
  assert_true(generate(d, stream) > 0);
  assert_true(same_file(a, b));
  assert_false(same_file(a, c));
  assert_false(same_file(a, d));
  /* 40 fields a line, 3000 lines. */
  char *text = ts_read_file(a);
  assert_non_null(text);
  size_t lines = 0, tabs = 0;
  for (const char *p = text; *p; p++) {
    lines += *p == '\n';
    tabs += *p == '\t';
  }
  assert_int_equal(lines, 3000);
  assert_int_equal(tabs, 3000 * 39);
  free(text);
  const char *bad[] = {TS_CRITEO_GEN, "--zipf", "x", NULL};
  static char out[256], err[512];
  assert_int_equal(ts_run_capture(bad, out, sizeof out, err, sizeof err), 2);
  assert_non_null(strstr(err, "bad value 'x' for --zipf"));
  unlink(a), unlink(b), unlink(c), unlink(d);
}

static const char *job_text_dot(const char *train, const char *test, bool dot) {
  static char job[4096];
  char fields[128] = "";
  for (int f = 1; f <= 26; f++) {
    size_t used = strlen(fields);
    snprintf(fields + used, sizeof fields - used, "%s%d", f > 1 ? ", " : "", f);
  }
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; sync_timeout_s = 30.0; };\n"
           "optimizer = { name = \"adam\"; learning_rate = 0.002; };\n"
           "model = { seed = 42; layers = (\n"
           "  { type = \"embedding\"; table = \"criteo\"; dim = 8; field = [%s]; },\n%s"
           "  { type = \"dense\"; units = 64; activation = \"relu\"; },\n"
           "  { type = \"dense\"; units = 32; activation = \"relu\"; },\n"
           "  { type = \"dense\"; units = 2; name = \"logits\"; }\n"
           "); };\n"
           "data = { format = \"criteo\"; train_path = \"%s\"; test_path = \"%s\"; };\n"
           "train = { batch_size = 256; epochs = 2; log_interval_s = 1.0; };\n",
           fields, dot ? "  { type = \"dot\"; },\n" : "", train, test);
  return job;
}

static const char *job_text(const char *train, const char *test) {
  return job_text_dot(train, test, false);
}

/* The job's rows: ROWS training rows and 20000 test rows (stream 1) into train and test
 * (300 bytes each); the best AUC the generator's hidden model allows on the test rows. */
static double job_data(char *train, char *test) {
  path_of(train, 300, "train.tsv");
  path_of(test, 300, "test.tsv");
  const char *gtrain[] = {"--rows", ROWS, "--seed", "3", "--max-cardinality", CARD, NULL};
  const char *gtest[] = {"--rows", "20000", "--seed", "3", "--stream", "1", "--max-cardinality",
                         CARD,     NULL};
  assert_true(generate(train, gtrain) > 0);
  double best = generate(test, gtest);
  assert_true(best > 0.8);
  return best;
}

static void test_ctr_job_auc(void **state) {
  (void)state;
  char train[300], test[300];
  double best = job_data(train, test);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, job_text(train, test)), 0);
  char logdir[400];
  snprintf(logdir, sizeof logdir, "train.logdir=\"%s/tb\"", c.dir);
  const char *extra[] = {"--set", logdir, NULL};
  ts_proc_t w[2];
  for (int i = 0; i < 2; i++) assert_int_equal(ts_worker_start(&c, i, extra, &w[i]), 0);
  /* While it trains: the interval's AUC on worker 0's /metrics. */
  double live = -1;
  for (double t0 = ts_now_s(); ts_now_s() - t0 < 200 && !(live > 0.5);)
    live = ts_metric_wait(c.worker_port[0], "tessera_worker_auc", 0.5, 1.0);
  for (int i = 0; i < 2; i++)
    if (ts_proc_wait(&w[i], 500) != 0) {
      ts_proc_dump(&w[i]);
      fail_msg("worker %d failed", i);
    }
  assert_true(live > 0.5 && live <= 1.0);
  double auc0 = ts_done_field(&w[0], "auc="), auc1 = ts_done_field(&w[1], "auc=");
  double ll0 = ts_done_field(&w[0], "logloss="), ll1 = ts_done_field(&w[1], "logloss=");
  fprintf(stderr, "test AUC %.4f (best %.4f, gap %.4f), log loss %.4f\n", auc0, best, best - auc0,
          ll0);
  if (!(auc0 >= best - 0.01)) {
    ts_proc_dump(&w[0]);
    fail_msg("test AUC %.4f is not within 0.01 of the best %.4f", auc0, best);
  }
  assert_true(auc0 == auc1 && ll0 == ll1);
  assert_true(ll0 > 0.2 && ll0 < 0.5); /* ln 2 = 0.693 is a coin */
  assert_true(ts_done_field(&w[0], "steps=") == 2.0 * 390);
  assert_true(ts_file_has(w[0].err, "logloss") && ts_file_has(w[0].err, " auc 0."));
  assert_true(ts_file_has(w[0].err, "embedding table(s)"));
  /* TensorBoard, as Keras lays it out: the intervals' epoch_auc in train/, the test rows'
   * (the done: line's auc) in validation/. */
  size_t intervals = 0;
  double test_auc = -1;
  for (int part = 0; part < 2; part++) {
    char pattern[460];
    snprintf(pattern, sizeof pattern, "%s/tb/*/worker-0/%s/events.out.tfevents.*", c.dir,
             part ? "validation" : "train");
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    ts_events_record_t *r = NULL;
    size_t n = 0;
    char err[256];
    assert_int_equal(ts_events_read(g.gl_pathv[0], &r, &n, err, sizeof err), 0);
    globfree(&g);
    for (size_t i = 0; i < n; i++) {
      if (strcmp(r[i].tag, "epoch_auc") != 0) continue;
      if (part)
        test_auc = (double)r[i].value;
      else
        intervals++;
    }
    ts_free(r);
  }
  assert_true(intervals >= 1);
  assert_true(fabs(test_auc - auc0) < 1e-6);
  /* psctl workers: each worker's last interval AUC, and its test AUC and log loss. */
  static char out[65536], perr[4096];
  const char *json[] = {"-c", c.config, "workers", "-o", "json", NULL};
  assert_int_equal(ts_run_psctl(json, out, sizeof out, perr, sizeof perr), 0);
  const char *at = strstr(out, "\"test_auc\":"), *ll = strstr(out, "\"test_logloss\":");
  const char *live_auc = strstr(out, "\"auc\":");
  assert_non_null(at);
  assert_non_null(ll);
  assert_non_null(live_auc);
  double shown = atof(at + strlen("\"test_auc\":")), shown_ll = atof(ll + strlen("\"test_logloss\":"));
  double shown_live = atof(live_auc + strlen("\"auc\":"));
  fprintf(stderr, "psctl workers: auc %.4f, test auc %.6f, test logloss %.6f\n", shown_live, shown,
          shown_ll);
  assert_true(fabs(shown - auc0) < 1e-5 && fabs(shown_ll - ll0) < 1e-5);
  assert_true(shown_live > 0.5 && shown_live <= 1.0);
  const char *table[] = {"-c", c.config, "workers", NULL};
  assert_int_equal(ts_run_psctl(table, out, sizeof out, perr, sizeof perr), 0);
  assert_non_null(strstr(out, "TEST AUC"));
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* A bad line: exit 78 with the file and line. */
  FILE *f = fopen(train, "a");
  assert_non_null(f);
  fprintf(f, "1\t2\t3\n");
  fclose(f);
  assert_int_equal(ts_cluster_start(&c, 1, 1, job_text(train, test)), 0);
  ts_proc_t bad;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &bad), 0);
  assert_int_equal(ts_proc_wait(&bad, 120), 78);
  char want[400];
  snprintf(want, sizeof want, "%s:200001: 3 tab-separated fields, expected 40", train);
  if (!ts_file_has(bad.err, want)) {
    ts_proc_dump(&bad);
    fail_msg("the worker's log lacks \"%s\"", want);
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
  unlink(train);
  unlink(test);
}

/* Both workers of a sync CTR job to the end; worker 1 killed (SIGKILL) once worker 0 has made
 * a step and started again when kill_one. The test AUC of worker 0, which saw it all; the
 * step the restarted worker joined at and the steps it made (when kill_one). */
static double ctr_job(const char *train, const char *test, bool kill_one, long long *joined,
                      double *steps) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, job_text(train, test)), 0);
  ts_proc_t w[2];
  for (int i = 0; i < 2; i++) assert_int_equal(ts_worker_start(&c, i, NULL, &w[i]), 0);
  if (kill_one) {
    /* Worker 0 past 2 steps: its step 1 began with a pull past step 0's barrier, so both
     * workers pushed step 0 and the job is at step 1 or later (a worker's step counts once
     * its push is in, before the barrier: at 1 the job may still be at step 0, and the
     * worker started again would begin the job, not join it). */
    double step = -1;
    for (double t0 = ts_now_s(); ts_now_s() - t0 < 200 && !(step >= 2);)
      step = ts_metric_wait(c.worker_port[0], "tessera_worker_step", 2, 1e12);
    assert_true(step >= 2);
    /* The shards held (SIGSTOP) while it starts again, so that a fast host does not end
     * the job first; worker 0 waits at the step's barrier meanwhile. */
    kill(w[1].pid, SIGKILL);
    assert_int_equal(ts_proc_wait(&w[1], 10), 128 + SIGKILL);
    for (int s = 0; s < 2; s++) ts_cluster_signal(&c, s, SIGSTOP);
    assert_int_equal(ts_worker_start(&c, 1, NULL, &w[1]), 0);
    bool loaded = ts_proc_wait_log(&w[1], "connecting to 2 shard(s)", 60);
    for (int s = 0; s < 2; s++) ts_cluster_signal(&c, s, SIGCONT);
    assert_true(loaded);
  }
  for (int i = 0; i < 2; i++)
    if (ts_proc_wait(&w[i], 500) != 0) {
      ts_proc_dump(&w[i]);
      fail_msg("worker %d failed", i);
    }
  double auc = ts_done_field(&w[0], "auc=");
  if (kill_one) {
    char *log = ts_read_file(w[1].err);
    const char *at = log ? strstr(log, "joining the job at step ") : NULL;
    if (!at) {
      ts_proc_dump(&w[1]);
      fail_msg("the restarted worker did not join at the job's step");
    }
    *joined = atoll(at + strlen("joining the job at step "));
    *steps = ts_done_field(&w[1], "steps=");
    /* the step's rows: the job's 2 x 256 a step, from the start of its epoch */
    char want[96];
    snprintf(want, sizeof want, "epoch %lld from row %lld of ", *joined / 390 + 1,
             (*joined % 390) * 512 + 1);
    if (!strstr(at, want)) {
      ts_proc_dump(&w[1]);
      fail_msg("the restarted worker's log lacks \"%s\"", want);
    }
    free(log);
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
  return auc;
}

/* A worker of a sync CTR job killed and started again joins the job at its step, with the
 * rows of that step (not the file's first), and makes the job's remaining steps. The job
 * ends where it does without the kill, but for the step the killed worker was in: the
 * shards closed it without that worker's gradients (the others go on without a worker
 * that left), so the test AUC is within 0.003 of the uninterrupted job's rather than
 * equal. */
static void test_ctr_worker_rejoins(void **state) {
  (void)state;
  char train[300], test[300];
  job_data(train, test);
  double whole = ctr_job(train, test, false, NULL, NULL);
  long long k0 = -1;
  double steps = -1;
  double rejoined = ctr_job(train, test, true, &k0, &steps);
  fprintf(stderr, "worker 1 joined at step %lld and made %.0f steps; test AUC %.6f, %.6f "
          "without the kill\n", k0, steps, rejoined, whole);
  assert_true(k0 >= 1 && k0 < 2 * 390);
  assert_true(steps == 2.0 * 390 - (double)k0);
  assert_true(fabs(rejoined - whole) < 0.003);
}

/* DLRM's dot interactions (a dot layer): one shard, one worker, one epoch of 50k rows. */
/* A shard killed (SIGKILL) and started again while an async CTR job trains: the workers'
 * requests out at that moment fail and are retried (a push with its push ids, so no shard
 * applies it twice) once the client has reconnected and declared the model again on the
 * new shard, and the job finishes; the restarted shard's half of the rows and layers starts over from
 * the initialiser, so the AUC ends lower than the job's but far from a coin's 0.5. */
static void test_ctr_shard_restart(void **state) {
  (void)state;
  char train[300], test[300], job[4096];
  job_data(train, test);
  snprintf(job, sizeof job, "%s", job_text(train, test));
  char *mode = strstr(job, "mode = \"sync\"");
  assert_non_null(mode);
  memcpy(mode, "mode =\"async\"", strlen("mode = \"sync\"")); /* same length */
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, job), 0);
  ts_proc_t w[2];
  for (int i = 0; i < 2; i++) assert_int_equal(ts_worker_start(&c, i, NULL, &w[i]), 0);
  /* Killed as soon as worker 0 has made a step: a fast host trains the job in 2 s. */
  double step = -1;
  for (double t0 = ts_now_s(); ts_now_s() - t0 < 200 && !(step >= 1);)
    step = ts_metric_wait(c.worker_port[0], "tessera_worker_step", 1, 1e12);
  assert_true(step >= 1);
  ts_cluster_signal(&c, 1, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&c, 1), 0);
  for (int i = 0; i < 2; i++)
    if (ts_proc_wait(&w[i], 500) != 0) {
      ts_proc_dump(&w[i]);
      fail_msg("worker %d failed after the shard's restart", i);
    }
  /* They saw the shard go: a request of theirs failed and was retried, or (no request was
   * out when it went) the client library reconnected before the next one. */
  bool seen = false;
  for (int i = 0; i < 2; i++)
    seen |= ts_file_has(w[i].err, "failed, retrying") ||
            ts_file_has(w[i].err, "lost connection to shard 1");
  assert_true(seen);
  double auc = ts_done_field(&w[0], "auc=");
  fprintf(stderr, "after a shard restart: test AUC %.4f\n", auc);
  assert_true(auc > 0.75);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_ctr_dot(void **state) {
  (void)state;
  char train[300], test[300];
  path_of(train, sizeof train, "dtrain.tsv");
  path_of(test, sizeof test, "dtest.tsv");
  const char *gtrain[] = {"--rows", "50000", "--seed", "4", "--max-cardinality", CARD, NULL};
  const char *gtest[] = {"--rows", "10000", "--seed", "4", "--stream", "1", "--max-cardinality",
                         CARD,     NULL};
  assert_true(generate(train, gtrain) > 0);
  double best = generate(test, gtest);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job_text_dot(train, test, true)), 0);
  const char *extra[] = {"--set", "train.epochs=1", NULL};
  ts_proc_t w;
  assert_int_equal(ts_workers_run(&c, 1, extra, 300, &w), 0);
  double auc = ts_done_field(&w, "auc=");
  fprintf(stderr, "dot interactions: test AUC %.4f (best %.4f)\n", auc, best);
  assert_true(ts_file_has(w.err, "network input 559")); /* 13 + 13 + 26 x 8 + 26 x 25 / 2 */
  if (!(auc > 0.75)) {
    ts_proc_dump(&w);
    fail_msg("test AUC %.4f with dot interactions", auc);
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
  unlink(train);
  unlink(test);
}

static int setup(void **state) {
  (void)state;
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  rmdir(dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generator_deterministic),
      cmocka_unit_test(test_ctr_job_auc),
      cmocka_unit_test(test_ctr_shard_restart),
      cmocka_unit_test(test_ctr_worker_rejoins),
      cmocka_unit_test(test_ctr_dot),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
