/*
 * Checkpoints through a real ps-server: written on demand, restored at start, corrupt or
 * truncated files rejected with a clear message and an older one used, non-finite
 * parameters never written.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "calls.h"
#include "ts_err.h"

#define N 5000
static const uint64_t shape[] = {50, 100};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_ZEROS}};

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs, .num_shards = 1, .admin = admin, .task = admin ? -1 : 0,
                        .connect_timeout_s = 5, .request_timeout_s = 10, .require_all = true};
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, admin ? NULL : model, 1, 3), 0);
  return cl;
}

static void push_value(ts_client_t *cl, float v, int times) {
  float *g = malloc(N * sizeof *g);
  for (int i = 0; i < N; i++) g[i] = v;
  char err[512];
  for (int i = 0; i < times; i++) {
    const float *gp[] = {g};
    assert_int_equal(tc_push(cl, gp, 0, NULL, err, sizeof err), 0);
  }
  free(g);
}

static float pulled_first(ts_client_t *cl) {
  float *w = malloc(N * sizeof *w);
  float *dst[] = {w};
  char err[512];
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  float v = w[17];
  free(w);
  return v;
}

static void checkpoint(ts_cluster_t *c, char *path, size_t n) {
  ts_client_t *a = open_client(c, true);
  char err[512];
  uint64_t step = 0;
  int rc = ts_client_checkpoint(a, 0, path, n, &step, err, sizeof err);
  if (rc < 0) fprintf(stderr, "checkpoint: %s\n", err);
  assert_int_equal(rc, 0);
  ts_client_close(a);
}

static uint64_t restored_step(ts_cluster_t *c) {
  ts_client_t *a = open_client(c, true);
  char err[512];
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(a, 0, &st, err, sizeof err), 0);
  uint64_t r = st->restored_step;
  ts_client_status_free(st);
  ts_client_close(a);
  return r;
}

static void restart(ts_cluster_t *c) {
  ts_cluster_signal(c, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(c, 0), 0);
}

static void test_corrupt_and_truncated(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-ckpt-XXXXXX", job[600];
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\noptimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 5; };",
           dir);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  ts_client_t *w = open_client(&c, false);
  char a[600], b[600], cpath[600];
  push_value(w, 1.0f, 3); /* w = -1.5 */
  checkpoint(&c, a, sizeof a);
  push_value(w, 1.0f, 2); /* w = -2.5 */
  checkpoint(&c, b, sizeof b);
  ts_client_close(w);

  /* Truncate the newest: the shard says so and restores the older one. */
  struct stat st;
  assert_int_equal(stat(b, &st), 0);
  assert_int_equal(truncate(b, st.st_size / 2), 0);
  restart(&c);
  assert_true(ts_cluster_log_has(&c, 0, "checkpoint rejected"));
  assert_true(ts_cluster_log_has(&c, 0, "restored checkpoint"));
  assert_int_equal(restored_step(&c), 3);
  w = open_client(&c, false);
  assert_true(pulled_first(w) == -1.5f);

  /* A newer one with one flipped byte in its data is rejected too. */
  push_value(w, 1.0f, 4); /* w = -3.5, step 7 */
  checkpoint(&c, cpath, sizeof cpath);
  ts_client_close(w);
  FILE *f = fopen(cpath, "r+b");
  assert_non_null(f);
  fseek(f, -100, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -100, SEEK_END);
  fputc(ch ^ 0x10, f);
  fclose(f);
  restart(&c);
  assert_true(ts_cluster_log_has(&c, 0, "checksum mismatch"));
  assert_int_equal(restored_step(&c), 3);
  w = open_client(&c, false);
  assert_true(pulled_first(w) == -1.5f);

  /* Parameters that overflowed to infinity are never checkpointed. */
  push_value(w, 3e38f, 3);
  assert_true(isinf(pulled_first(w)));
  ts_client_t *adm = open_client(&c, true);
  char err[512], path[600];
  int rc = ts_client_checkpoint(adm, 0, path, sizeof path, NULL, err, sizeof err);
  assert_int_equal(rc, TS_ENONFINITE);
  assert_non_null(strstr(err, "NaN or Inf"));
  ts_client_close(adm);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_checkpoint_without_dir(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  ts_client_t *w = open_client(&c, false);
  ts_client_t *a = open_client(&c, true);
  char err[512], path[600];
  assert_int_equal(ts_client_checkpoint(a, 0, path, sizeof path, NULL, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "checkpoint.dir is not set"));
  /* A worker may not ask for one. */
  assert_int_equal(ts_client_checkpoint(w, 0, path, sizeof path, NULL, err, sizeof err), TS_EPERM);
  ts_client_close(a);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_corrupt_and_truncated),
      cmocka_unit_test(test_checkpoint_without_dir),
  };
  return cmocka_run_group_tests_name("checkpoint", tests, NULL, NULL);
}
