/*
 * A checkpoint directory that holds checkpoints, none of them usable, is never a fresh
 * start: the shard exits 78 naming each file and its reason (a few, then a count: 3,000
 * junk files make a bounded message), unless started with --fresh, which says so. A file
 * of NaN parameters whose hash was recomputed is refused by tensor and element. A
 * checkpoint.dir that takes no file (under a regular file, not writable) is refused at
 * start, and so is checkpoint.sign without an admin token. A job with another mode or
 * optimizer, or only another job.name, refuses the directory unless --adopt, also when its
 * files are of another layout (job.partition_bytes) and would be re-sharded.
 */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <sodium.h>

#include "calls.h"
#include "harness.h"

#define N 5000
static const uint64_t shape[] = {50, 100};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_ZEROS}};

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_t *cl = tc_open_role(c->addrs, 1, admin, model, 1, 3);
  assert_non_null(cl);
  return cl;
}

static void push_ones(ts_client_t *cl, int times) {
  assert_int_equal(tc_push_filled(cl, 1.0f, N, times), 0);
}

static float pulled_first(ts_client_t *cl) {
  static float w[N];
  float *dst[] = {w};
  char err[512];
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  return w[17];
}

static void checkpoint(ts_cluster_t *c, char *path, size_t n) {
  assert_int_equal(tc_checkpoint(c->addrs, 1, 0, path, n), 0);
}

/* A job of one shard checkpointing into dir; two checkpoints written (w = -1.5, then
 * -2.5, SGD with lr 0.5), their paths in a and b; the shard is then killed. */
static void two_checkpoints(ts_cluster_t *c, const char *dir, char *a, char *b) {
  char job[600];
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\noptimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 5; };",
           dir);
  assert_int_equal(ts_cluster_start(c, 1, 1, job), 0);
  ts_client_t *w = open_client(c, false);
  push_ones(w, 3);
  checkpoint(c, a, 600);
  push_ones(w, 2);
  checkpoint(c, b, 600);
  ts_client_close(w);
  ts_cluster_signal(c, 0, SIGKILL);
}

/* Start shard 0 of c's job in the foreground: its exit status, stderr in err. One that
 * starts serving instead of refusing is stopped after 30 s (status 124). */
static int start_alone(const ts_cluster_t *c, char *err, size_t errn) {
  char out[256];
  const char *argv[] = {"/usr/bin/timeout", "30", ts_ps_server_path, "-c", c->config,
                        "--shard", "0", NULL};
  return ts_run_capture(argv, out, sizeof out, err, errn);
}

static void expect_refused(const ts_cluster_t *c, const char *const *needles) {
  static char err[65536];
  int rc = start_alone(c, err, sizeof err);
  bool ok = rc == 78;
  for (size_t i = 0; needles[i]; i++) ok = ok && strstr(err, needles[i]) != NULL;
  if (!ok) fprintf(stderr, "exit %d:\n%s\n", rc, err);
  assert_int_equal(rc, 78);
  for (size_t i = 0; needles[i]; i++) assert_non_null(strstr(err, needles[i]));
  /* Bounded whatever the directory holds: a line per file for the first 20 at most. */
  assert_true(strlen(err) < 16384);
}

static void flip_byte(const char *path, long from_end) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, -from_end, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -from_end, SEEK_END);
  fputc(ch ^ 0x10, f);
  assert_int_equal(fclose(f), 0);
}

static void write_file(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void test_unusable_refused_unless_fresh(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-ckpt-refuse-XXXXXX", a[600], b[600], p[700];
  assert_non_null(mkdtemp(dir));
  ts_cluster_t c;
  two_checkpoints(&c, dir, a, b);

  /* The newer with a flipped byte, the older truncated: both named, with their reasons. */
  flip_byte(b, 100);
  struct stat st;
  assert_int_equal(stat(a, &st), 0);
  assert_int_equal(truncate(a, st.st_size / 2), 0);
  expect_refused(&c, (const char *const[]){strrchr(a, '/') + 1, strrchr(b, '/') + 1,
                                           "checksum mismatch", "truncated",
                                           "2 file(s) rejected", "--fresh", NULL});
  /* psctl checkpoint list says the same of each file. */
  static char out[16384], perr[4096];
  const char *list[] = {ts_psctl_path, "-c", c.config, "checkpoint", "list", NULL};
  assert_int_equal(ts_run_capture(list, out, sizeof out, perr, sizeof perr), 1);
  assert_non_null(strstr(out, "SHARD FILE"));
  assert_non_null(strstr(out, "NO: checksum mismatch"));
  assert_non_null(strstr(out, strrchr(b, '/') + 1));

  /* A newer file announcing a 4 GiB header. */
  uint8_t head[64] = "TSCKPT01\xff\xff\xff\xff";
  snprintf(p, sizeof p, "%s/shard-0-%020d.ckpt", dir, 50);
  write_file(p, head, sizeof head);
  expect_refused(&c, (const char *const[]){"shard-0-00000000000000000050.ckpt",
                                           "the header is larger than the file",
                                           "3 file(s) rejected", NULL});

  /* 3,000 junk files: three named, the rest counted; the message stays small. */
  for (int i = 100; i < 3100; i++) {
    snprintf(p, sizeof p, "%s/shard-0-%020d.ckpt", dir, i);
    write_file(p, "junk", 4);
  }
  expect_refused(&c, (const char *const[]){"3003 file(s) rejected", "shard-0-00000000000000003099",
                                           "and 3000 more", NULL});

  /* --fresh starts with no model, says so, and its next checkpoint is the newest. */
  assert_int_equal(ts_cluster_start_shard_arg(&c, 0, "--fresh"), 0);
  assert_true(ts_cluster_log_has(&c, 0, "--fresh: not restoring"));
  ts_client_t *w = open_client(&c, false);
  assert_true(pulled_first(w) == 0.0f);
  push_ones(w, 1);
  char fresh[600];
  checkpoint(&c, fresh, sizeof fresh);
  ts_client_close(w);
  assert_non_null(strstr(fresh, "shard-0-00000000000000003100.ckpt"));
  /* Restarted plainly, it restores that one. */
  ts_cluster_signal(&c, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  w = open_client(&c, false);
  assert_true(pulled_first(w) == -0.5f);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop_rm(&c, dir), 0);
}

/* Put a NaN at parameter element 17 of the only checkpoint and recompute its BLAKE2b hash,
 * as anyone who can write the directory can. */
static void forge_nan(const char *path) {
  char *bytes = NULL;
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  bytes = malloc((size_t)n);
  assert_non_null(bytes);
  assert_int_equal(fread(bytes, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  uint32_t meta_len = (uint32_t)(uint8_t)bytes[8] | (uint32_t)(uint8_t)bytes[9] << 8 |
                      (uint32_t)(uint8_t)bytes[10] << 16 | (uint32_t)(uint8_t)bytes[11] << 24;
  float nan = NAN;
  memcpy(bytes + 12 + meta_len + 17 * sizeof(float), &nan, sizeof nan);
  size_t body = (size_t)n - crypto_generichash_BYTES;
  crypto_generichash((unsigned char *)bytes + body, crypto_generichash_BYTES,
                     (const unsigned char *)bytes, body, NULL, 0);
  write_file(path, bytes, (size_t)n);
  free(bytes);
}

static void test_nan_with_valid_hash_refused(void **state) {
  (void)state;
  assert_true(sodium_init() >= 0);
  char dir[] = "/tmp/tessera-ckpt-nan-XXXXXX", a[600], b[600];
  assert_non_null(mkdtemp(dir));
  ts_cluster_t c;
  two_checkpoints(&c, dir, a, b);
  assert_int_equal(unlink(a), 0);
  /* Before: valid, at step 5 (psctl checkpoint list, JSON). */
  static char out[16384], perr[4096];
  const char *list[] = {ts_psctl_path, "-c", c.config, "-o", "json", "checkpoint", "list", NULL};
  assert_int_equal(ts_run_capture(list, out, sizeof out, perr, sizeof perr), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_int_equal(cJSON_GetArraySize(j), 1);
  cJSON *e = cJSON_GetArrayItem(j, 0);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(e, "valid")));
  assert_int_equal(cJSON_GetObjectItem(e, "step")->valuedouble, 5);
  assert_string_equal(cJSON_GetObjectItem(e, "file")->valuestring, strrchr(b, '/') + 1);
  cJSON_Delete(j);
  forge_nan(b);
  expect_refused(&c, (const char *const[]){strrchr(b, '/') + 1,
                                           "tensor 'w' parameter element 17 is NaN", NULL});
  /* The hash checks, the values do not: psctl says which. */
  const char *table[] = {ts_psctl_path, "-c", c.config, "checkpoint", "list", NULL};
  assert_int_equal(ts_run_capture(table, out, sizeof out, perr, sizeof perr), 1);
  assert_non_null(strstr(out, "NO: tensor 'w' parameter element 17 is not finite"));
  assert_int_equal(ts_cluster_stop_rm(&c, dir), 0);
}

/* Point c's job file at checkpoint directory to instead of from. */
static void retarget(const ts_cluster_t *c, const char *from, const char *to) {
  char *text = ts_read_file(c->config);
  assert_non_null(text);
  char *at = strstr(text, from);
  assert_non_null(at);
  FILE *f = fopen(c->config, "w");
  assert_non_null(f);
  fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  assert_int_equal(fclose(f), 0);
  free(text);
}

/* checkpoint.dir under a regular file, or not writable: refused at start, not at the
 * first checkpoint. */
static void test_dir_that_takes_no_file(void **state) {
  (void)state;
  char root[] = "/tmp/tessera-ckpt-dir-XXXXXX", ok[300], file[300], bad[400], job[600];
  assert_non_null(mkdtemp(root));
  snprintf(ok, sizeof ok, "%s/ok", root);
  snprintf(file, sizeof file, "%s/plain", root);
  write_file(file, "x", 1);
  snprintf(job, sizeof job, "checkpoint = { dir = \"%s\"; };", ok);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  ts_cluster_signal(&c, 0, SIGKILL);
  snprintf(bad, sizeof bad, "%s/ckpt", file);
  retarget(&c, ok, bad);
  expect_refused(&c, (const char *const[]){"cannot create checkpoint directory", bad,
                                           "Not a directory", NULL});
  if (geteuid() != 0) {
    /* Not writable (root writes anyway: then only the file case runs). */
    char ro[300];
    snprintf(ro, sizeof ro, "%s/ro", root);
    assert_int_equal(mkdir(ro, 0500), 0);
    retarget(&c, bad, ro);
    expect_refused(&c, (const char *const[]){"takes no file", "Permission denied", NULL});
    chmod(ro, 0700);
  }
  /* checkpoint.sign without the admin token its key comes from. */
  retarget(&c, "checkpoint = { dir", "checkpoint = { sign = true; dir");
  expect_refused(&c, (const char *const[]){"checkpoint.sign needs auth.admin_token_file", NULL});
  assert_int_equal(ts_cluster_stop_rm(&c, root), 0);
}

/* The job id psctl status -o json shows ("" before a model). */
static void job_id(const ts_cluster_t *c, char *id, size_t n) {
  static char out[65536], perr[4096];
  const char *argv[] = {ts_psctl_path, "-c", c->config, "-o", "json", "status", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, perr, sizeof perr), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  const cJSON *v = cJSON_GetObjectItem(j, "job_id");
  snprintf(id, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
  cJSON_Delete(j);
}

/* How the second job differs from the first. */
typedef enum { OPTIMIZER, OPTIMIZER_RESHARD, NAME } other_t;

/* A job with another optimizer reusing the directory: refused naming both jobs, unless
 * --adopt, which continues the training as the new job. With OPTIMIZER_RESHARD, the new job
 * also has another job.partition_bytes, so the old files are a set of another layout to
 * re-shard; with NAME it has the same settings but a job.name. */
static void other_job_refused_unless_adopt(other_t how) {
  bool reshard = how == OPTIMIZER_RESHARD;
  char dir[] = "/tmp/tessera-ckpt-job-XXXXXX", a[600], b[600], first[32], second[32];
  assert_non_null(mkdtemp(dir));
  ts_cluster_t c;
  two_checkpoints(&c, dir, a, b);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  job_id(&c, first, sizeof first);
  assert_int_equal(strlen(first), 16);
  ts_cluster_signal(&c, 0, SIGKILL);
  if (how == NAME) {
    retarget(&c, "mode = \"async\";", "mode = \"async\"; name = \"exp-b\";");
  } else {
    retarget(&c, "name = \"sgd\"", "name = \"momentum\"");
  }
  if (reshard) retarget(&c, "mode = \"async\";", "mode = \"async\"; partition_bytes = 4096;");
  expect_refused(&c, (const char *const[]){"written by job", first, "optimizer sgd",
                                           how == NAME ? "job.name 'exp-b'"
                                                       : "optimizer.name momentum",
                                           "--adopt",
                                           reshard ? "every complete checkpoint set" : "",
                                           NULL});
  assert_int_equal(ts_cluster_start_shard_arg(&c, 0, "--adopt"), 0);
  assert_true(ts_cluster_log_has(&c, 0, reshard ? "re-sharded from" : "restored checkpoint"));
  ts_client_t *w = open_client(&c, false);
  assert_true(pulled_first(w) == -2.5f); /* the old job's parameters */
  ts_client_close(w);
  job_id(&c, second, sizeof second);
  assert_int_equal(strlen(second), 16);
  assert_string_not_equal(first, second);
  /* Its next checkpoint is the new job's: a plain restart takes it. */
  char p[600];
  checkpoint(&c, p, sizeof p);
  ts_cluster_signal(&c, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
  job_id(&c, first, sizeof first);
  assert_string_equal(first, second);
  assert_int_equal(ts_cluster_stop_rm(&c, dir), 0);
}

static void test_other_job_refused_unless_adopt(void **state) {
  (void)state;
  other_job_refused_unless_adopt(OPTIMIZER);
}

static void test_other_job_reshard_refused_unless_adopt(void **state) {
  (void)state;
  other_job_refused_unless_adopt(OPTIMIZER_RESHARD);
}

/* job.name alone makes another job: the same model and settings no longer share an id. */
static void test_other_job_by_name_refused_unless_adopt(void **state) {
  (void)state;
  other_job_refused_unless_adopt(NAME);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unusable_refused_unless_fresh),
      cmocka_unit_test(test_nan_with_valid_hash_refused),
      cmocka_unit_test(test_dir_that_takes_no_file),
      cmocka_unit_test(test_other_job_refused_unless_adopt),
      cmocka_unit_test(test_other_job_reshard_refused_unless_adopt),
      cmocka_unit_test(test_other_job_by_name_refused_unless_adopt),
  };
  return cmocka_run_group_tests_name("ckpt_refuse", tests, NULL, NULL);
}
