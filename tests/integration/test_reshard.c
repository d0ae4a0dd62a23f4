/*
 * Restoring checkpoints into another shard count (docs/operations.md, "Changing the number
 * of shards"): a sync job with Adam trains on 2 shards, checkpoints and stops; 3 shards
 * restore that set (from the shared checkpoint.dir) and go on; 2 shards again restore the
 * newer 3-shard set rather than their own older files; the 3-shard set is copied into one
 * directory per old shard and a single shard with a larger job.partition_bytes restores it
 * through checkpoint.restore_from; its final checkpoint (SIGTERM) is restored by 2 shards
 * with partitions that straddle the old ones. Every pull is compared bit for bit with an
 * uninterrupted run on one shard, so parameters, Adam's moments and update counts and the
 * versions must all have come through exactly (a sync push tagged with step t is applied only by a
 * partition at version t). An incomplete set is refused: the shard does not start.
 */
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

#include "calls.h"
#include "harness.h"
#include "ts_err.h"

#define NA (37 * 100)
#define NB 1000
#define STEPS 6 /* 3 on 2 shards, 1 on 3 shards, 1 on 1 shard, 1 on 2 shards */

static const uint64_t shape_a[] = {37, 100}, shape_b[] = {NB};
static const ts_client_tensor_t model[] = {
    {.name = "layer/kernel", .shape = shape_a, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
    {.name = "layer/bias", .shape = shape_b, .rank = 1, .init = TS_CLIENT_INIT_ZEROS}};

/* Parameters after each step of the uninterrupted run: ref[k] after k steps. */
static float ref_a[STEPS + 1][NA], ref_b[STEPS + 1][NB];

static const char *job(char *buf, size_t n, const char *dir, uint64_t partition_bytes,
                       const char *extra) {
  snprintf(buf, n,
           "job = { mode = \"sync\"; partition_bytes = %llu; };\n"
           "optimizer = { name = \"adam\"; learning_rate = 0.01; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 3; %s };",
           (unsigned long long)partition_bytes, dir, extra ? extra : "");
  return buf;
}

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_opts_t o;
  tc_opts_role(&o, c->addrs, (size_t)c->num_shards, admin);
  o.connect_timeout_s = 5;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, admin ? NULL : model, 2, 7), 0);
  return cl;
}

static void grad(int k, float *ga, float *gb) {
  for (int i = 0; i < NA; i++) ga[i] = (float)((i * 7 + k * 13) % 17 - 8) * 0.01f;
  for (int i = 0; i < NB; i++) gb[i] = (float)((i * 5 + k * 3) % 11 - 5) * 0.02f;
}

/* One sync step tagged `step`: every partition must be at that version and apply it. */
static void push_step(ts_client_t *cl, int step) {
  static float ga[NA], gb[NB];
  grad(step, ga, gb);
  const float *g[] = {ga, gb};
  tc_result_t r;
  char err[512];
  int rc = tc_push(cl, g, (uint64_t)step, &r, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push step %d: %s\n", step, err);
  assert_int_equal(rc, 0);
  size_t parts = tc_tensor_parts(cl, 0) + tc_tensor_parts(cl, 1);
  /* Applied at once, or held while a pull reply is still being written from the partition
   * (then applied as that write completes): either way the partition was at `step`. */
  if (r.applied + r.accumulated != parts)
    fprintf(stderr, "step %d: applied %llu accumulated %llu stale %llu duplicate %llu of %zu\n",
            step, (unsigned long long)r.applied, (unsigned long long)r.accumulated,
            (unsigned long long)r.stale, (unsigned long long)r.duplicate, parts);
  assert_int_equal(r.applied + r.accumulated, parts);
  assert_int_equal(r.stale + r.duplicate, 0);
}

/* Pull (once every partition is at version `step`) and compare bit for bit with the
 * reference after `step` steps; no partition may be further. */
static void expect_state(ts_client_t *cl, int step) {
  static float a[NA], b[NB];
  float *dst[] = {a, b};
  uint64_t version = 0;
  char err[512];
  assert_int_equal(tc_pull(cl, dst, (uint64_t)step, 0, &version, err, sizeof err), 0);
  assert_int_equal(version, step);
  assert_memory_equal(a, ref_a[step], sizeof a);
  assert_memory_equal(b, ref_b[step], sizeof b);
}

static void expect_restored(ts_cluster_t *c, uint64_t step, const char *needle) {
  ts_client_t *adm = open_client(c, true);
  for (int i = 0; i < c->num_shards; i++) {
    ts_client_shard_status_t *st = NULL;
    char err[512];
    assert_int_equal(ts_client_status(adm, (uint32_t)i, &st, err, sizeof err), 0);
    assert_int_equal(st->restored_step, step);
    ts_client_status_free(st);
    assert_true(ts_cluster_log_has(c, i, needle));
  }
  ts_client_close(adm);
}

/* Checkpoint every shard; path[i] gets shard i's file. */
static void checkpoint_all(ts_cluster_t *c, char path[][600], uint64_t step) {
  ts_client_t *adm = open_client(c, true);
  for (int i = 0; i < c->num_shards; i++) {
    uint64_t s = 0;
    char err[512];
    int rc = ts_client_checkpoint(adm, (uint32_t)i, path[i], 600, &s, err, sizeof err);
    if (rc < 0) fprintf(stderr, "checkpoint %d: %s\n", i, err);
    assert_int_equal(rc, 0);
    assert_int_equal(s, step);
  }
  ts_client_close(adm);
}

static void run(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  assert_int_equal(system(cmd), 0);
}

static void reference(void) {
  char cfg[1024], dir[] = "/tmp/tessera-reshard-ref-XXXXXX";
  assert_non_null(mkdtemp(dir));
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job(cfg, sizeof cfg, dir, 4096, NULL)), 0);
  ts_client_t *w = open_client(&c, false);
  float *dst[] = {ref_a[0], ref_b[0]};
  char err[512];
  assert_int_equal(tc_pull(w, dst, 0, 0, NULL, err, sizeof err), 0);
  for (int k = 0; k < STEPS; k++) {
    push_step(w, k);
    float *d[] = {ref_a[k + 1], ref_b[k + 1]};
    assert_int_equal(tc_pull(w, d, (uint64_t)k + 1, 0, NULL, err, sizeof err), 0);
  }
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);
  run("rm -rf '%s'", dir);
  /* Adam moved every parameter: the comparisons below compare something. */
  assert_memory_not_equal(ref_a[0], ref_a[STEPS], sizeof ref_a[0]);
}

static void test_reshard(void **state) {
  (void)state;
  reference();
  char root[] = "/tmp/tessera-reshard-XXXXXX", shared[300], cfg[1500], path[3][600];
  assert_non_null(mkdtemp(root));
  snprintf(shared, sizeof shared, "%s/shared", root);

  /* 2 shards: three steps, a checkpoint of each shard, stop. */
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, job(cfg, sizeof cfg, shared, 4096, NULL)), 0);
  ts_client_t *w = open_client(&c, false);
  assert_true(tc_shard_parts(w, 0) > 0 && tc_shard_parts(w, 1) > 0);
  for (int k = 0; k < 3; k++) push_step(w, k);
  expect_state(w, 3);
  ts_client_close(w);
  checkpoint_all(&c, path, 3);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* 3 shards on the same directory: each takes its partitions out of the 2-shard set. */
  assert_int_equal(ts_cluster_start(&c, 3, 1, job(cfg, sizeof cfg, shared, 4096, NULL)), 0);
  expect_restored(&c, 3, "re-sharded from");
  w = open_client(&c, false);
  for (int i = 0; i < 3; i++) assert_true(tc_shard_parts(w, (uint32_t)i) > 0);
  expect_state(w, 3);
  push_step(w, 3);
  expect_state(w, 4);
  ts_client_close(w);
  checkpoint_all(&c, path, 4);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* Back to 2 shards: their own files (step 3) are older than the 3-shard set (step 4),
   * which wins. */
  assert_int_equal(ts_cluster_start(&c, 2, 1, job(cfg, sizeof cfg, shared, 4096, NULL)), 0);
  expect_restored(&c, 4, "is newer than");
  w = open_client(&c, false);
  expect_state(w, 4);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* Each old shard's file in a directory of its own (a state directory per shard), and one
   * shard with twice the partition size reading them through checkpoint.restore_from. */
  char from[800];
  size_t len = (size_t)snprintf(from, sizeof from, "restore_from = [");
  for (int i = 0; i < 3; i++) {
    run("mkdir -p '%s/old%d' && cp '%s' '%s/old%d/'", root, i, path[i], root, i);
    len +=
        (size_t)snprintf(from + len, sizeof from - len, "%s\"%s/old%d\"", i ? ", " : "", root, i);
  }
  snprintf(from + len, sizeof from - len, "];");
  char fresh[300];
  snprintf(fresh, sizeof fresh, "%s/new", root);
  assert_int_equal(ts_cluster_start(&c, 1, 1, job(cfg, sizeof cfg, fresh, 8192, from)), 0);
  expect_restored(&c, 4, "re-sharded from");
  w = open_client(&c, false);
  assert_int_equal(tc_tensor_parts(w, 0), 2); /* 4 old partitions gathered into 2 */
  expect_state(w, 4);
  push_step(w, 4);
  expect_state(w, 5);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0); /* SIGTERM writes a final checkpoint */

  /* 2 shards with partitions of 750 values out of that one of 1850: boundaries that do
   * not line up with the old ones. */
  assert_int_equal(ts_cluster_start(&c, 2, 1, job(cfg, sizeof cfg, fresh, 3000, NULL)), 0);
  expect_restored(&c, 5, "re-sharded from");
  w = open_client(&c, false);
  assert_int_equal(tc_tensor_parts(w, 0), 5);
  expect_state(w, 5);
  push_step(w, 5);
  expect_state(w, 6);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);
  run("rm -rf '%s'", root);
}

/* Exit status and stderr of one ps-server started on job text cfg. */
static int start_alone(const char *cfg, char *err, size_t errn) {
  char dir[] = "/tmp/tessera-reshard-job-XXXXXX", file[300], out[256];
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof file, "%s/job.cfg", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fprintf(f, "cluster = { ps = [\"127.0.0.1:%d\"]; workers = [\"127.0.0.1:%d\"]; };\n%s\n",
          ts_free_port(), ts_free_port(), cfg);
  fclose(f);
  const char *argv[] = {ts_ps_server_path, "-c", file, "--shard", "0", NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, errn);
  run("rm -rf '%s'", dir);
  return rc;
}

/* A set with a corrupt file, or missing one old shard's file, is refused: the shard does
 * not start fresh. */
static void test_incomplete_set_refused(void **state) {
  (void)state;
  char root[] = "/tmp/tessera-reshard-XXXXXX", dir[300], cfg[1500], path[3][600];
  assert_non_null(mkdtemp(root));
  snprintf(dir, sizeof dir, "%s/ckpt", root);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 3, 1, job(cfg, sizeof cfg, dir, 4096, NULL)), 0);
  ts_client_t *w = open_client(&c, false);
  push_step(w, 0);
  ts_client_close(w);
  checkpoint_all(&c, path, 1);
  assert_int_equal(ts_cluster_stop(&c), 0);
  char err[8192];
  /* One file of the only set corrupt: the set is rejected, so is the start. */
  FILE *f = fopen(path[1], "r+b");
  assert_non_null(f);
  fseek(f, -100, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -100, SEEK_END);
  fputc(ch ^ 0x10, f);
  fclose(f);
  int rc = start_alone(job(cfg, sizeof cfg, dir, 4096, NULL), err, sizeof err);
  if (rc != 78 || !strstr(err, "was rejected")) fprintf(stderr, "exit %d:\n%s\n", rc, err);
  assert_int_equal(rc, 78);
  assert_non_null(strstr(err, "checksum mismatch"));
  assert_non_null(strstr(err, "every complete checkpoint set of another layout was rejected"));

  /* One file missing: no complete set. */
  assert_int_equal(unlink(path[1]), 0);
  rc = start_alone(job(cfg, sizeof cfg, dir, 4096, NULL), err, sizeof err);
  if (rc != 78 || !strstr(err, "no complete checkpoint set"))
    fprintf(stderr, "exit %d:\n%s\n", rc, err);
  assert_int_equal(rc, 78);
  assert_non_null(strstr(err, "no complete checkpoint set to re-shard from"));
  assert_non_null(strstr(err, "step 1: shard(s) 0,2 of 3"));
  assert_non_null(strstr(err, "checkpoint.restore_from"));
  run("rm -rf '%s'", root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reshard),
      cmocka_unit_test(test_incomplete_set_refused),
  };
  return cmocka_run_group_tests_name("reshard", tests, NULL, NULL);
}
