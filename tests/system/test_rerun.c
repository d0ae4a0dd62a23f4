/*
 * A worker that joins a sync job with nothing left to train says so and exits 3, without
 * a "done:" line (whose loss would be made up): a re-run of a finished job, and the same
 * after the shard restarted from its checkpoint. The first run's done line is untouched.
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

#include "harness.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

/* Run worker 0 to its end: its exit status. */
static int run_worker(ts_cluster_t *c, ts_proc_t *w) {
  assert_int_equal(ts_worker_start(c, 0, NULL, w), 0);
  return ts_proc_wait(w, 120);
}

static void expect_nothing_to_train(ts_cluster_t *c) {
  ts_proc_t w;
  int rc = run_worker(c, &w);
  if (rc != 3) ts_proc_dump(&w);
  assert_int_equal(rc, 3);
  assert_true(ts_file_has(w.err, "the job is at step 6 of 6: nothing to train; raise "
                                 "train.epochs or train.max_steps, or psctl model reset"));
  assert_false(ts_file_has(w.out, "done:"));
}

static void test_rerun_of_a_finished_job(void **state) {
  (void)state;
  if (access(DATA "train-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  char dir[] = "/tmp/tessera-rerun-XXXXXX", job[600];
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; };\nmodel = { layers = [784, 16, 10]; };\n"
           "train = { max_steps = 6; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; };",
           dir);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  ts_proc_t w;
  int rc = run_worker(&c, &w);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  assert_true(ts_file_has(w.out, "done: task=0 steps=6 "));

  expect_nothing_to_train(&c);
  /* The shard restarted from its final checkpoint: the same. */
  ts_cluster_signal(&c, 0, SIGTERM);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  expect_nothing_to_train(&c);
  assert_int_equal(ts_cluster_stop_rm(&c, dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rerun_of_a_finished_job),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("rerun", tests, NULL, NULL));
}
