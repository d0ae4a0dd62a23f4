/*
 * Task keys through the real binaries (docs/security.md, "Who speaks for a task"): a sync
 * job of two ps-workers, each with its own task key from `psctl token derive` in its
 * auth.token_file and not the job's token, trains to the end; each shard logs that the
 * worker proved its task, and the final accuracy is reported. A worker started with
 * another task's key is refused (authentication failed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

#define TOKEN "correct horse battery staple"

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* psctl token derive --task t into path. */
static void derive(ts_cluster_t *c, int t, const char *path) {
  char task[8], out[256], err[1024];
  snprintf(task, sizeof task, "%d", t);
  const char *argv[] = {ts_psctl_path, "-c", c->config, "token", "derive", "--task", task, NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  assert_int_equal(strlen(out), 65); /* 64 hex characters and a line end */
  write_file(path, out);
}

static void test_workers_with_task_keys(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-idjob-XXXXXX", token[64], key[2][64], cfg[1024];
  assert_non_null(mkdtemp(dir));
  snprintf(token, sizeof token, "%s/token", dir);
  write_file(token, TOKEN "\n");
  snprintf(cfg, sizeof cfg,
           "auth = { token_file = \"%s\"; };\n"
           "job = { mode = \"sync\"; };\n"
           "model = { layers = [784, 32, 10]; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.05; };\n"
           "train = { batch_size = 32; max_steps = 40; log_interval_s = 0.5; };\n",
           token);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, cfg), 0);
  for (int t = 0; t < 2; t++) {
    snprintf(key[t], sizeof key[t], "%s/worker-%d.token", dir, t);
    derive(&c, t, key[t]);
  }
  ts_proc_t w[2], bad;
  char set[2][360];
  for (int t = 0; t < 2; t++) snprintf(set[t], sizeof set[t], "auth.token_file=\"%s\"", key[t]);
  /* Task 0 with task 1's key: refused by the shards, for good (first: a worker's log is
   * named by its task). */
  const char *wrong[] = {"--set", set[1], NULL};
  assert_int_equal(ts_worker_start(&c, 0, wrong, &bad), 0);
  double t0 = ts_now_s();
  int st = ts_proc_wait(&bad, 60);
  fprintf(stderr, "task 0 with task 1's key: exit %d after %.1f s\n", st, ts_now_s() - t0);
  if (st == 0 || !ts_file_has(bad.err, "authentication failed")) ts_proc_dump(&bad);
  assert_true(st != 0);
  assert_true(ts_file_has(bad.err, "authentication failed"));
  for (int t = 0; t < 2; t++) {
    const char *extra[] = {"--set", set[t], NULL};
    assert_int_equal(ts_worker_start(&c, t, extra, &w[t]), 0);
  }
  for (int t = 0; t < 2; t++) {
    st = ts_proc_wait(&w[t], 300);
    if (st != 0) ts_proc_dump(&w[t]);
    assert_int_equal(st, 0);
  }
  for (int s = 0; s < 2; s++) {
    assert_true(ts_cluster_log_has(&c, s, "worker 0 joined"));
    assert_true(ts_cluster_log_has(&c, s, "proved by its task key"));
  }
  double acc[2] = {ts_done_field(&w[0], "final_test_accuracy="),
                   ts_done_field(&w[1], "final_test_accuracy=")};
  fprintf(stderr, "final test accuracy: %g / %g (one worker reports)\n", acc[0], acc[1]);
  assert_true((acc[0] >= 0) != (acc[1] >= 0));
  assert_true(ts_cluster_log_has(&c, 0, "the job's final test accuracy"));
  assert_int_equal(ts_cluster_stop(&c), 0);
  for (int t = 0; t < 2; t++) remove(key[t]);
  remove(token);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workers_with_task_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
