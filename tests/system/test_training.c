/*
 * System tests: ps-server shards and ps-worker processes training on Fashion-MNIST
 * (Debian's dataset-fashion-mnist) on loopback, checked through their output and the
 * shards' parameters.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "model_pull.h"
#include "ts_config.h"
#include "ts_idx.h"
#include "ts_kernels.h"
#include "ts_model.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static ts_config_t demo; /* deploy/local/cluster.cfg */

static int load_demo(void **state) {
  (void)state;
  char err[512];
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0) {
    fprintf(stderr, "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
    return -1;
  }
  if (ts_config_load(&demo, TS_SOURCE_ROOT "/deploy/local/cluster.cfg", NULL, NULL, 0, err,
                     sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  return 0;
}

static int free_demo(void **state) {
  (void)state;
  ts_config_free(&demo);
  return 0;
}

/* The demo job's optimizer and model, with mode and training length given. */
static void job_text(char *buf, size_t n, const char *mode, const char *train) {
  size_t len = (size_t)snprintf(buf, n,
                                "job = { mode = \"%s\"; };\n"
                                "optimizer = { name = \"%s\"; learning_rate = %.17g; momentum = %.17g; };\n"
                                "model = { activation = \"%s\"; seed = %lld; layers = [",
                                mode, ts_optimizer_name(demo.optimizer), demo.learning_rate,
                                demo.momentum, demo.activation == TS_ACT_TANH ? "tanh" : "relu",
                                (long long)demo.seed);
  for (size_t i = 0; i < demo.num_layers; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? ", " : "", demo.layers[i]);
  snprintf(buf + len, n - len, "]; };\ntrain = { %s };\n", train);
}

/* The test accuracy of the parameters the shards hold once the workers are done: in async
 * mode a worker's done: line evaluates the parameters it last pulled, a moment of the job
 * that depends on how the two workers' pushes interleaved, not the job's result. */
static double final_accuracy(ts_cluster_t *c) {
  char err[512];
  ts_dataset_t test;
  assert_int_equal(ts_idx_load_pair(DATA "t10k-images-idx3-ubyte.gz", DATA "t10k-labels-idx1-ubyte.gz",
                                    &test, err, sizeof err),
                   0);
  ts_model_t m;
  assert_int_equal(ts_model_init(&m, demo.layers, demo.num_layers, demo.activation, 1000,
                                 ts_kernels_cpu(), err, sizeof err),
                   0);
  float *p = ts_pull_model_params(c, &m, (uint64_t)demo.seed, "final accuracy");
  assert_int_equal(ts_model_set_params(&m, 0, p, m.param_count), 0);
  float acc = 0;
  assert_int_equal(ts_model_evaluate(&m, test.x, test.labels, test.n, &acc, NULL), 0);
  free(p);
  ts_model_destroy(&m);
  ts_dataset_free(&test);
  return acc;
}

/* The job's final accuracy as `psctl -o json status` shows it (the reporting worker sent
 * it to every shard): NAN when it is null. */
static double psctl_final_accuracy(ts_cluster_t *c) {
  static char out[1 << 16], err[4096];
  const char *argv[] = {ts_psctl_path, "-c", c->config, "-o", "json", "status", NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "psctl: %s\n", err);
  assert_int_equal(rc, 0);
  const char *f = strstr(out, "\"final_test_accuracy\":");
  assert_non_null(f);
  f += strlen("\"final_test_accuracy\":");
  while (*f == ' ' || *f == '\t') f++;
  return strncmp(f, "null", 4) == 0 ? (double)NAN : atof(f);
}

/* Exactly one worker's done: line has final_test_accuracy=, evaluated on the parameters the
 * shards hold once every worker finished: equal (to the printed 1e-6) to what the test
 * computes from them itself, and to what psctl shows. */
static void check_final_report(ts_cluster_t *c, const ts_proc_t *w, int workers, double fin) {
  int reports = 0;
  double reported = -1;
  for (int t = 0; t < workers; t++) {
    double v = ts_done_field(&w[t], "final_test_accuracy=");
    if (v < 0) continue;
    reports++;
    reported = v;
    assert_true(ts_file_has(w[t].err, "every worker finished: the final parameters' test accuracy"));
  }
  fprintf(stderr, "final_test_accuracy reported by %d worker(s): %.6f (test: %.6f)\n", reports,
          reported, fin);
  assert_int_equal(reports, 1);
  if (fabs(reported - fin) > 1.000001e-6) fail_msg("reported %.6f, evaluated %.6f", reported, fin);
  double shown = psctl_final_accuracy(c);
  if (!(fabs(shown - fin) <= 1e-6)) fail_msg("psctl shows %.9f, evaluated %.6f", shown, fin);
}

/* With tls, the whole job speaks TLS 1.3 (auth.tls): shards, workers, psctl and the test's
 * own client. */
static double train_and_check(const char *mode, int workers, double min_acc, bool tls) {
  char job[4096], certs[256] = "", auth[1200] = "";
  job_text(job, sizeof job, mode, "batch_size = 64; epochs = 2; log_interval_s = 1.0;");
  if (tls) {
    assert_int_equal(ts_tls_certs(certs, sizeof certs, auth, sizeof auth), 0);
    strncat(job, auth, sizeof job - strlen(job) - 1);
  }
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, workers, job), 0);
  snprintf(c.tls_dir, sizeof c.tls_dir, "%s", certs);
  ts_proc_t w[4];
  for (int t = 0; t < workers; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  for (int t = 0; t < workers; t++) {
    int rc = ts_proc_wait(&w[t], 110);
    double acc = ts_done_field(&w[t], "test_accuracy=");
    fprintf(stderr, "%s worker %d: exit %d, test accuracy %.4f\n", mode, t, rc, acc);
    /* Sync: every worker ends with the job's parameters. Async: the worker's last pull
     * (see final_accuracy), a few hundredths either side of the result. */
    double floor = strcmp(mode, "sync") == 0 ? min_acc : min_acc - 0.05;
    if (rc != 0 || acc < floor) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
    assert_true(acc >= floor);
    /* Progress lines with step, loss and examples/s. */
    assert_true(ts_file_has(w[t].err, "examples/s"));
  }
  double fin = final_accuracy(&c);
  fprintf(stderr, "%s: the final parameters' test accuracy %.4f\n", mode, fin);
  assert_true(fin >= min_acc);
  check_final_report(&c, w, workers, fin);
  if (tls) {
    for (int i = 0; i < 2; i++) assert_false(ts_cluster_log_has(&c, i, "TLS handshake with"));
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
  if (tls) ts_tls_certs_rm(certs);
  return fin;
}

/* 2 shards + 2 workers in sync mode, in plaintext and over TLS (auth.tls): the same data
 * order and the same averaged steps, so the same final parameters (0.8593 both ways,
 * 2026-12-02); the tolerance only allows for a step a loaded machine drops. */
static void test_fashion_mnist_sync(void **state) {
  (void)state;
  double plain = train_and_check("sync", 2, 0.84, false);
  double tls = train_and_check("sync", 2, 0.84, true);
  fprintf(stderr, "sync: final accuracy %.4f in plaintext, %.4f over TLS\n", plain, tls);
  assert_true(fabs(plain - tls) <= 0.01);
}

/* Async with momentum ends where the two workers' last interleaved pushes leave it: the
 * final parameters measured 0.852-0.864 in 4 runs on a quiet machine and 0.818 once in CI
 * (2026-12-02), so the floor is 0.80 (a dead network stays at 0.10). */
static void test_fashion_mnist_async(void **state) {
  (void)state;
  train_and_check("async", 2, 0.80, false);
}

/* --- sync exactness: 2 workers x batch B == 1 worker x batch 2B ------------------------ */

static float *final_params(ts_cluster_t *c, size_t *count) {
  ts_model_t m;
  char err[512];
  int widths[] = {784, 32, 10};
  assert_int_equal(ts_model_init(&m, widths, 3, TS_ACT_RELU, 8, ts_kernels_cpu(), err, sizeof err), 0);
  float *p = ts_pull_model_params(c, &m, 7, NULL);
  *count = m.param_count;
  ts_model_destroy(&m);
  return p;
}

static float *run_exact_args(int workers, int batch, const char *const *args, size_t *count) {
  char job[1024], tr[128];
  snprintf(tr, sizeof tr, "batch_size = %d; max_steps = 25;", batch);
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; partition_bytes = 16384; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.1; };\n"
           "model = { layers = [784, 32, 10]; seed = 7; };\ntrain = { %s };\n",
           tr);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, workers, job), 0);
  ts_proc_t w[2];
  assert_int_equal(ts_workers_run(&c, workers, args, 60, w), 0);
  for (int t = 0; t < workers; t++) {
    if (args && !ts_file_has(w[t].err, "towers: 2 (/cpu:0, /cpu:0), micro-batch"))
      ts_proc_dump(&w[t]);
    if (args) assert_true(ts_file_has(w[t].err, "towers: 2 (/cpu:0, /cpu:0), micro-batch"));
  }
  float *p = final_params(&c, count);
  assert_int_equal(ts_cluster_stop(&c), 0);
  return p;
}

static float *run_exact(int workers, int batch, size_t *count) {
  return run_exact_args(workers, batch, NULL, count);
}

/* The relative L2 difference of two parameter vectors, logged. */
static double rel_diff(const char *what, const float *two, const float *one, size_t n1) {
  double diff = 0, norm = 0, maxrel = 0;
  for (size_t i = 0; i < n1; i++) {
    double d = (double)two[i] - (double)one[i];
    diff += d * d;
    norm += (double)one[i] * (double)one[i];
    double r = fabs(d) / (fabs((double)one[i]) + 1e-3);
    if (r > maxrel) maxrel = r;
  }
  double rel = sqrt(diff / norm);
  fprintf(stderr, "%s: relative difference %.3g (largest element-wise %.3g)\n", what, rel, maxrel);
  return rel;
}

/* Towers: one worker with two (virtual, CPU) towers of micro-batch 16 equals one worker with
 * batch 32, step for step; the same contract the GPU towers keep (tests/gpu). */
static void test_towers_exactness(void **state) {
  (void)state;
  size_t nt = 0, n1 = 0;
  const char *towers[] = {"--set", "device.towers=2", NULL};
  float *two = run_exact_args(1, 32, towers, &nt);
  float *one = run_exact(1, 32, &n1);
  assert_int_equal(n1, nt);
  assert_true(rel_diff("towers exactness", two, one, n1) < 1e-5);
  free(one);
  free(two);
}

static void test_sync_exactness(void **state) {
  (void)state;
  size_t n2 = 0, n1 = 0;
  float *two = run_exact(2, 16, &n2);
  float *one = run_exact(1, 32, &n1);
  assert_int_equal(n1, n2);
  double diff = 0, norm = 0, maxrel = 0;
  for (size_t i = 0; i < n1; i++) {
    double d = (double)two[i] - (double)one[i];
    diff += d * d;
    norm += (double)one[i] * (double)one[i];
    double r = fabs(d) / (fabs((double)one[i]) + 1e-3);
    if (r > maxrel) maxrel = r;
  }
  double rel = sqrt(diff / norm);
  fprintf(stderr, "sync exactness: relative difference %.3g (largest element-wise %.3g)\n", rel, maxrel);
  assert_true(rel < 1e-5);
  free(one);
  free(two);
}

/* --- device placement on a machine without a GPU ----------------------------------- */

static void test_placement(void **state) {
  (void)state;
  ts_cluster_t c;
  /* Async: each run below trains its own steps on the same shard (a sync job at its last
   * step has nothing left to train: exit 3). */
  assert_int_equal(
      ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };\nmodel = { layers = [784, 16, 10]; };"),
      0);
  ts_proc_t w;
  const char *soft[] = {"--set", "device.placement=\"/gpu:0\"", "--set", "device.allow_soft_placement=true",
                        "--set", "device.log_device_placement=true", "--set", "train.max_steps=5",
                        "--set", "device.intra_op_parallelism_threads=1", NULL};
  assert_int_equal(ts_worker_start(&c, 0, soft, &w), 0);
  int rc = ts_proc_wait(&w, 60);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  /* One line per op soft placement moved, saying what it asked for and why. */
  assert_true(ts_file_has(w.err, "allow_soft_placement: op fc1/matmul (MatMul) asked for "
                                 "'/device:GPU:0', placed on "
                                 "/job:worker/replica:0/task:0/device:CPU:0: no GPU is visible ("));
  assert_true(
      ts_file_has(w.err, "CPU ops use 1 thread(s) each (device.intra_op_parallelism_threads = 1)"));
  /* Where OpenBLAS fell back to kernels older than this CPU, the worker re-executed itself
   * with the CPU's own and says so; elsewhere it says nothing. */
  const char *core = ts_kernels_cpu_better_core();
  char line[160];
  snprintf(line, sizeof line, "OpenBLAS: %s kernels (it chose ", core ? core : "");
  if (core) fprintf(stderr, "OpenBLAS here: the worker should use %s\n", core);
  assert_true(ts_file_has(w.err, line) == (core != NULL));
  assert_true(ts_file_has(w.out, "done: task=0 steps=5"));
  /* One placement line per op, in TensorFlow's format. */
  ts_model_t m;
  char err[256];
  int widths[] = {784, 16, 10};
  assert_int_equal(ts_model_init(&m, widths, 3, TS_ACT_RELU, 8, ts_kernels_cpu(), err, sizeof err), 0);
  char *log = ts_read_file(w.err);
  size_t lines = 0, moved = 0;
  for (const char *p = log; (p = strstr(p, "): /job:worker/replica:0/task:0/device:CPU:0\n")); p++) lines++;
  for (const char *p = log; (p = strstr(p, "allow_soft_placement: op ")); p++) moved++;
  assert_non_null(strstr(log, "fc1/matmul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  /* The input pipeline's decode too, once: it is outside device.placement's scope, so it
   * was never asked onto the GPU and did not move. */
  assert_non_null(strstr(log, "\ninput/decode: (DecodeRaw): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_int_equal(lines, m.num_ops + 1);
  assert_int_equal(moved, m.num_ops);
  /* And every variable on the shard that holds it (one shard, one partition each). */
  for (size_t i = 0; i < m.num_tensors; i++) {
    char var[160];
    snprintf(var, sizeof var, "\n%s: (VariableV2): /job:ps/replica:0/task:0/device:CPU:0\n",
             m.tensors[i].name);
    if (!strstr(log, var)) fprintf(stderr, "missing: %s", var + 1);
    assert_non_null(strstr(log, var));
  }
  free(log);

  /* Two towers: every op of each, the second's named tower_1/ as TensorFlow's towers are. */
  const char *two[] = {"--set", "device.towers=2", "--set", "device.log_device_placement=true",
                       "--set", "train.max_steps=2", NULL};
  assert_int_equal(ts_worker_start(&c, 0, two, &w), 0);
  rc = ts_proc_wait(&w, 60);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  log = ts_read_file(w.err);
  lines = 0;
  for (const char *p = log; (p = strstr(p, "): /job:worker/replica:0/task:0/device:CPU:0\n")); p++) lines++;
  assert_non_null(
      strstr(log, "\ntower_1/fc1/matmul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_non_null(
      strstr(log, "\ntower_0/fc1/matmul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_int_equal(lines, 2 * m.num_ops + 1);
  free(log);
  ts_model_destroy(&m);

  /* No device.placement: TensorFlow's default, here the CPU, with nothing to say about it. */
  const char *dflt[] = {"--set", "train.max_steps=2", NULL};
  assert_int_equal(ts_worker_start(&c, 0, dflt, &w), 0);
  assert_int_equal(ts_proc_wait(&w, 60), 0);
  assert_false(ts_file_has(w.err, "allow_soft_placement"));
  assert_false(ts_file_has(w.err, "Cannot assign a device"));
  assert_true(ts_file_has(w.out, "done: task=0 "));

  /* Per-layer rules, printed by log_device_placement: fc2 on the CPU by rule, the rest in
   * the scope (the CPU by soft placement here); a rule matching nothing is reported. */
  const char *ruled[] = {"--set", "device.placement=\"/gpu:0\"", "--set",
                         "device.allow_soft_placement=true", "--set",
                         "device.rules=[\"fc2=/cpu:0\", \"conv9/*=/gpu:0\"]", "--set",
                         "device.log_device_placement=true", "--set", "train.max_steps=2", NULL};
  assert_int_equal(ts_worker_start(&c, 0, ruled, &w), 0);
  rc = ts_proc_wait(&w, 60);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  assert_true(ts_file_has(w.err, "\nfc2/matmul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_true(ts_file_has(w.err, "allow_soft_placement: op fc1/matmul (MatMul) asked for '/device:GPU:0'"));
  assert_false(ts_file_has(w.err, "allow_soft_placement: op fc2/matmul"));
  assert_true(ts_file_has(w.err, "device.rules: \"conv9/*=/gpu:0\" match no op of this model"));
  /* A rule sending the decode to a GPU, without soft placement: TensorFlow's sentence. */
  const char *decode[] = {"--set", "device.rules=[\"input/*=/gpu:0\"]", NULL};
  assert_int_equal(ts_worker_start(&c, 0, decode, &w), 0);
  assert_int_equal(ts_proc_wait(&w, 60), 78);
  assert_true(ts_file_has(w.err, "Cannot assign a device for operation input/decode: Could not "
                                 "satisfy explicit device specification '/device:GPU:0' because "
                                 "no devices matching that specification are registered"));

  const char *hard[] = {"--set", "device.placement=\"/gpu:0\"", "--set",
                        "device.allow_soft_placement=false", NULL};
  assert_int_equal(ts_worker_start(&c, 0, hard, &w), 0);
  rc = ts_proc_wait(&w, 60);
  assert_true(rc != 0);
  /* TensorFlow's sentence for a device this process does not have, and the reason beside. */
  assert_true(ts_file_has(w.err,
                          "Could not satisfy explicit device specification '/device:GPU:0' "
                          "because no devices matching that specification are registered "
                          "in this process; available devices: "
                          "/job:worker/replica:0/task:0/device:CPU:0"));
  assert_true(ts_file_has(w.err, "no GPU in this process: "));
  const char *malformed[] = {"--set", "device.placement=\"/gpu:zero\"", NULL};
  assert_int_equal(ts_worker_start(&c, 0, malformed, &w), 0);
  assert_int_equal(ts_proc_wait(&w, 60), 78);
  assert_true(ts_file_has(w.err, "malformed device name '/gpu:zero'"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- bad data: a clear error, exit 78, nothing sent to the shards ------------------ */

static void write_truncated_copy(const char *src, const char *dst, size_t keep) {
  gzFile in = gzopen(src, "rb");
  assert_non_null(in);
  char *buf = malloc(keep);
  int got = gzread(in, buf, (unsigned)keep);
  gzclose(in);
  assert_true(got > 0);
  FILE *f = fopen(dst, "wb");
  fwrite(buf, 1, (size_t)got, f);
  fclose(f);
  free(buf);
}

static void assert_shard_untouched(ts_cluster_t *c) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs, .num_shards = 1, .admin = true, .task = -1,
                        .connect_timeout_s = 5, .request_timeout_s = 5, .require_all = true};
  ts_client_t *cl = NULL;
  char err[256];
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), 0);
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(cl, 0, &st, err, sizeof err), 0);
  assert_int_equal(st->tensors, 0);
  assert_int_equal(st->num_workers_seen, 0);
  assert_int_equal(st->pushes, 0);
  ts_client_status_free(st);
  ts_client_close(cl);
}

static void expect_bad_data(ts_cluster_t *c, const char *const *args, const char *needle) {
  ts_proc_t w;
  assert_int_equal(ts_worker_start(c, 0, args, &w), 0);
  int rc = ts_proc_wait(&w, 60);
  if (rc != 78 || !ts_file_has(w.err, needle)) {
    ts_proc_dump(&w);
    fprintf(stderr, "expected exit 78 and '%s'\n", needle);
  }
  assert_int_equal(rc, 78);
  assert_true(ts_file_has(w.err, needle));
  assert_shard_untouched(c);
}

static void test_bad_data(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  char trunc[400], labels[400], set1[450], set2[450];
  snprintf(trunc, sizeof trunc, "%s/truncated-images", c.dir);
  snprintf(labels, sizeof labels, "%s/short-labels", c.dir);
  write_truncated_copy(DATA "t10k-images-idx3-ubyte.gz", trunc, 16 + 784 * 100 + 5);
  /* A labels file that holds 10000 labels header-wise but is cut: truncated too; and a
   * consistent but shorter labels file (header rewritten to 500). */
  write_truncated_copy(DATA "t10k-labels-idx1-ubyte.gz", labels, 8 + 500);
  FILE *f = fopen(labels, "r+b");
  unsigned char cnt[4] = {0, 0, 0x01, 0xf4};
  fseek(f, 4, SEEK_SET);
  fwrite(cnt, 1, 4, f);
  fclose(f);

  const char *missing[] = {"--set", "data.train_images=\"/nonexistent/train-images.gz\"", NULL};
  expect_bad_data(&c, missing, "/nonexistent/train-images.gz");

  snprintf(set1, sizeof set1, "data.test_images=\"%s\"", trunc);
  const char *truncated[] = {"--set", set1, NULL};
  expect_bad_data(&c, truncated, "truncated");

  snprintf(set2, sizeof set2, "data.test_labels=\"%s\"", labels);
  const char *mismatch[] = {"--set", set2, NULL};
  expect_bad_data(&c, mismatch, "500");

  const char *layers[] = {"--set", "model.layers=[100, 10]", NULL};
  expect_bad_data(&c, layers, "model.layers starts with 100 inputs");
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- a killed async worker does not stop the other -------------------------------- */

static void test_async_worker_killed(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"async\"; };\n"
                                    "model = { layers = [784, 64, 10]; };\n"
                                    "train = { batch_size = 32; epochs = 10; max_steps = 6000; log_interval_s = 0.5; };"),
                   0);
  ts_proc_t w0, w1;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w0), 0);
  assert_int_equal(ts_worker_start(&c, 1, NULL, &w1), 0);
  /* Kill worker 1 once it is training: 6000 global steps take seconds, so it still is on a
   * loaded machine (with 1500, worker 1 had once finished before this saw its first line). */
  for (int i = 0; i < 600 && !ts_file_has(w1.err, "step "); i++) usleep(10000);
  kill(w1.pid, SIGKILL);
  assert_int_equal(ts_proc_wait(&w1, 10), 128 + SIGKILL);
  int rc = ts_proc_wait(&w0, 90);
  if (rc != 0) ts_proc_dump(&w0);
  assert_int_equal(rc, 0);
  /* train.max_steps is the global step (async: every push counts): worker 1's steps before
   * it was killed count too, so worker 0 makes fewer than 6000 and stops when the shards'
   * version says the job is there. */
  char *out = ts_read_file(w0.out);
  const char *steps = out ? strstr(out, "done: task=0 steps=") : NULL;
  long s0 = steps ? atol(steps + strlen("done: task=0 steps=")) : -1;
  free(out);
  fprintf(stderr, "worker 0 made %ld of the job's 6000 steps\n", s0);
  assert_true(s0 > 0 && s0 < 6000);
  assert_true(ts_file_has(w0.err, "the job reached its global step"));
  /* The shards saw it go. */
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(strstr(log, "worker 1 disconnected"));
  free(log);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_worker_sigterm(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };\ntrain = { epochs = 50; log_interval_s = 0.2; };"), 0);
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  for (int i = 0; i < 600 && !ts_file_has(w.err, "step "); i++) usleep(10000);
  kill(w.pid, SIGTERM);
  assert_int_equal(ts_proc_wait(&w, 20), 0);
  assert_true(ts_file_has(w.err, "stopped by a signal"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sync_exactness),
      cmocka_unit_test(test_towers_exactness),
      cmocka_unit_test(test_placement),
      cmocka_unit_test(test_bad_data),
      cmocka_unit_test(test_async_worker_killed),
      cmocka_unit_test(test_worker_sigterm),
      cmocka_unit_test(test_fashion_mnist_sync),
      cmocka_unit_test(test_fashion_mnist_async),
  };
  return cmocka_run_group_tests_name("training", tests, load_demo, free_demo);
}
