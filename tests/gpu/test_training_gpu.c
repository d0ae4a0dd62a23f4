/*
 * GPU training end to end (tests/gpu/run.sh, issue "GPU workers"): ps-server shards and
 * ps-worker processes on loopback, the workers' ops placed on /gpu:0.
 *   - Fashion-MNIST on /gpu:0 with 2 shards and 2 sync workers (the demo job, 2 epochs)
 *     reaches test accuracy 0.84;
 *     the worker logs which physical GPU /gpu:0 is and places every op on it.
 *   - Two towers on one GPU (micro-batch 16) end where one tower with batch 32 ends; and one
 *     GPU tower where one CPU worker ends (cuBLAS against OpenBLAS after 25 steps).
 *   - device.memory_fraction without allow_growth: the reservation is logged, is what the GPU
 *     loses while the worker runs, and is never exceeded; with allow_growth (the default) the
 *     pool grows on demand and stays under it; a model too large for it fails cleanly (exit 1,
 *     a message naming the limit and the need) before any shard is contacted.
 *   - /gpu:N beyond the visible GPUs soft-places onto /gpu:0, or fails with TensorFlow's
 *     message without soft placement.
 *   - examples/s on the GPU against the CPU, printed as a table.
 *   - A model split over two devices (LeNet-5, convolutions and pooling on /gpu:0 by
 *     device.rules, dense layers on /cpu:0): one step's loss and every gradient against the
 *     CPU back end alone (relative 1e-4), 25 SGD steps of a cluster against the same job on
 *     /cpu:0 (1e-4), and one epoch of Fashion-MNIST reaching test accuracy 0.82 with every op
 *     logged on the device where it runs.
 * Exit 77 (skipped) on a machine without a GPU.
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

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "model_pull.h"
#include "ts_gpu.h"
#include "ts_kernels.h"
#include "ts_kernels_cuda.h"
#include "ts_model.h"
#include "ts_seq.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static int gpu_count;

/* A line of the worker's log that holds needle, printed (for the run's record). */
static void show_line(const ts_proc_t *p, const char *needle) {
  char *s = ts_read_file(p->err);
  const char *at = s ? strstr(s, needle) : NULL;
  if (at) {
    const char *b = at;
    while (b > s && b[-1] != '\n') b--;
    const char *e = strchr(at, '\n');
    fprintf(stderr, "  | %.*s\n", (int)(e ? e - b : (long)strlen(b)), b);
  }
  free(s);
}

/* --- (b) Fashion-MNIST on /gpu:0 ---------------------------------------------------------- */

static void test_fashion_mnist_gpu(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(
      ts_cluster_start(&c, 2, 2,
                       "job = { mode = \"sync\"; partition_bytes = 131072; };\n"
                       "optimizer = { name = \"adam\"; learning_rate = 0.002; };\n"
                       "model = { layers = [784, 128, 10]; activation = \"relu\"; seed = 42; };\n"
                       "train = { batch_size = 64; epochs = 2; log_interval_s = 2.0; };\n"
                       "device = { placement = \"/gpu:0\"; allow_soft_placement = false; "
                       "log_device_placement = true; };\n"),
      0);
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  for (int t = 0; t < 2; t++) {
    int rc = ts_proc_wait(&w[t], 240);
    double acc = ts_done_field(&w[t], "test_accuracy=");
    fprintf(stderr, "GPU worker %d: exit %d, test accuracy %.4f, %.0f examples/s\n", t, rc, acc,
            ts_done_field(&w[t], "examples_per_sec="));
    if (rc != 0 || acc < 0.84) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
    assert_true(acc >= 0.84);
    assert_true(ts_file_has(w[t].err, "/gpu:0 is "));
    char created[96];
    snprintf(created, sizeof created,
             "Created device /job:worker/replica:0/task:%d/device:GPU:0 with ", t);
    assert_true(ts_file_has(w[t].err, created));
    assert_true(ts_file_has(w[t].err, "fc1/matmul: (MatMul): /job:worker/replica:0/task"));
    assert_true(ts_file_has(w[t].err, "/device:GPU:0\n"));
    /* The chapter's mixed placement: the model on the GPU, the input pipeline's decode (no
     * GPU kernel, outside the placement's scope) on the worker's CPU, and nothing else there
     * (the variables are on the shards' CPUs). */
    char decode[128], worker_cpu[96];
    snprintf(decode, sizeof decode,
             "\ninput/decode: (DecodeRaw): /job:worker/replica:0/task:%d/device:CPU:0\n", t);
    snprintf(worker_cpu, sizeof worker_cpu, "/job:worker/replica:0/task:%d/device:CPU:0\n", t);
    assert_true(ts_file_has(w[t].err, decode));
    char *log = ts_read_file(w[t].err);
    int on_cpu = 0;
    for (const char *p = log; p && (p = strstr(p, worker_cpu)); p++) on_cpu++;
    free(log);
    assert_int_equal(on_cpu, 1);
  }
  show_line(&w[0], "/gpu:0 is ");
  show_line(&w[0], "Created device ");
  show_line(&w[0], "towers: ");
  show_line(&w[0], "/gpu:0 memory: pool held");
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- (c) towers: exactness -------------------------------------------------------------- */

/* LeNet-5 (deploy/local/lenet5.cfg's layers) with its convolutions and pooling on /gpu:0 and
 * its dense layers on /cpu:0 by device.rules, as `with tf.device()` scopes would put them. */
#define SPLIT_LENET5                                                                            \
  "model = { seed = 7; layers = (\n"                                                            \
  "  { type = \"conv2d\"; filters = 6; kernel = 5; padding = \"same\"; activation = \"relu\"; " \
  "},\n"                                                                                        \
  "  { type = \"max_pool\"; size = 2; },\n"                                                     \
  "  { type = \"conv2d\"; filters = 16; kernel = 5; activation = \"relu\"; },\n"                \
  "  { type = \"max_pool\"; size = 2; },\n"                                                     \
  "  { type = \"flatten\"; },\n"                                                                \
  "  { type = \"dense\"; units = 120; activation = \"relu\"; },\n"                              \
  "  { type = \"dense\"; units = 84; activation = \"relu\"; },\n"                               \
  "  { type = \"dense\"; units = 10; }); };\n"
#define SPLIT_RULES "rules = [\"conv*=/gpu:0\", \"pool*=/gpu:0\", \"fc*=/cpu:0\"];"

/* The same layers as specs (worker/ts_layers.h). */
static const ts_layer_spec_t lenet5_specs[] = {
    {.type = TS_LAYER_CONV2D,
     .filters = 6,
     .win_h = 5,
     .win_w = 5,
     .padding = TS_PAD_SAME,
     .activation = TS_LAYER_RELU},
    {.type = TS_LAYER_MAX_POOL, .win_h = 2, .win_w = 2},
    {.type = TS_LAYER_CONV2D, .filters = 16, .win_h = 5, .win_w = 5, .activation = TS_LAYER_RELU},
    {.type = TS_LAYER_MAX_POOL, .win_h = 2, .win_w = 2},
    {.type = TS_LAYER_FLATTEN},
    {.type = TS_LAYER_DENSE, .units = 120, .activation = TS_LAYER_RELU},
    {.type = TS_LAYER_DENSE, .units = 84, .activation = TS_LAYER_RELU},
    {.type = TS_LAYER_DENSE, .units = 10}};

/* The parameters the shards hold, as the MLP [784, 32, 10] (lenet5 false) or LeNet-5 lays
 * them out. */
static float *final_params(ts_cluster_t *c, bool lenet5, size_t *count) {
  ts_model_t m;
  char err[512];
  int widths[] = {784, 32, 10};
  ts_layer_shape_t in = {28, 28, 1};
  int rc = lenet5 ? ts_model_init_seq(&m, lenet5_specs, 8, in, 1, ts_kernels_cpu(), err, sizeof err)
                  : ts_model_init(&m, widths, 3, TS_ACT_RELU, 8, ts_kernels_cpu(), err, sizeof err);
  assert_int_equal(rc, 0);
  float *p = ts_pull_model_params(c, &m, 7, NULL);
  *count = m.param_count;
  ts_model_destroy(&m);
  return p;
}

/* One worker and 2 shards run job to its end; the shards' final parameters. */
static float *run_job_params(const char *job, bool lenet5, size_t *count) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, job), 0);
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  int rc = ts_proc_wait(&w, 120);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  show_line(&w, "towers: ");
  float *p = final_params(&c, lenet5, count);
  assert_int_equal(ts_cluster_stop(&c), 0);
  return p;
}

static float *run_exact(const char *placement, int towers, int batch, size_t *count) {
  char job[1024];
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; partition_bytes = 16384; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.1; };\n"
           "model = { layers = [784, 32, 10]; seed = 7; };\n"
           "train = { batch_size = %d; max_steps = 25; };\n"
           "device = { placement = \"%s\"; allow_soft_placement = false; towers = %d; };\n",
           batch, placement, towers);
  return run_job_params(job, false, count);
}

static double rel_diff(const char *what, const float *a, const float *b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    diff += d * d;
    norm += (double)b[i] * (double)b[i];
  }
  double rel = sqrt(diff / norm);
  fprintf(stderr, "%s: relative difference %.3g\n", what, rel);
  return rel;
}

static void test_towers_exactness(void **state) {
  (void)state;
  size_t n2 = 0, n1 = 0, nc = 0;
  float *two = run_exact("/gpu:0", 2, 32, &n2);
  float *one = run_exact("/gpu:0", 1, 32, &n1);
  float *cpu = run_exact("/cpu:0", 1, 32, &nc);
  assert_int_equal(n1, n2);
  assert_int_equal(n1, nc);
  assert_true(rel_diff("2 towers (micro-batch 16) vs 1 tower (batch 32) on /gpu:0", two, one, n1) <
              1e-5);
  assert_true(rel_diff("1 GPU tower vs the CPU back end, 25 steps", one, cpu, n1) < 1e-4);
  free(two);
  free(one);
  free(cpu);
}

/* --- (d) memory policy -------------------------------------------------------------------- */

/* Fraction f of total, rounded down to the pool's 2 MiB granule. */
static size_t fraction_bytes(double f, size_t total) {
  return (size_t)floor(f * (double)total) / ((size_t)2 << 20) * ((size_t)2 << 20);
}

/* In log text s, the byte count in parentheses after needle ("... 7.0 GiB (7516192768
 * bytes) ..."); 0 when absent. */
static size_t logged_bytes(const char *s, const char *needle) {
  const char *a = s ? strstr(s, needle) : NULL;
  const char *paren = a ? strchr(a, '(') : NULL;
  return paren ? (size_t)strtoull(paren + 1, NULL, 10) : 0;
}

/* A 1-shard async job on /gpu:0 under memory_fraction = 0.05 (allow_growth as given), its
 * worker started and past its first progress line. */
static void start_fraction_job(ts_cluster_t *c, ts_proc_t *w, bool allow_growth) {
  char job[512];
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\n"
           "train = { batch_size = 64; epochs = 50; log_interval_s = 0.5; };\n"
           "device = { placement = \"/gpu:0\"; allow_growth = %s; "
           "memory_fraction = 0.05; };\n",
           allow_growth ? "true" : "false");
  assert_int_equal(ts_cluster_start(c, 1, 1, job), 0);
  assert_int_equal(ts_worker_start(c, 0, NULL, w), 0);
  for (int i = 0; i < 3000 && !ts_file_has(w->err, "step "); i++) usleep(10000);
  assert_true(ts_file_has(w->err, "step "));
}

/* Stops w with SIGTERM: it exits 0 (its log printed when not). */
static void stop_worker(ts_proc_t *w) {
  kill(w->pid, SIGTERM);
  int rc = ts_proc_wait(w, 30);
  if (rc != 0) ts_proc_dump(w);
  assert_int_equal(rc, 0);
}

static void test_memory_fraction(void **state) {
  (void)state;
  size_t free0 = 0, total = 0;
  assert_int_equal(ts_gpu_memory(0, &free0, &total), 0);
  const double f = 0.05;
  size_t want = fraction_bytes(f, total);
  ts_cluster_t c;
  ts_proc_t w;
  start_fraction_job(&c, &w, false);
  size_t free1 = 0;
  assert_int_equal(ts_gpu_memory(0, &free1, NULL), 0);
  stop_worker(&w);
  show_line(&w, "/gpu:0 memory: reserving");
  show_line(&w, "/gpu:0 memory: pool held");
  /* "reserving 7.0 GiB (7516192768 bytes) ...": the number in parentheses */
  char *s = ts_read_file(w.err);
  size_t reserved = logged_bytes(s, "/gpu:0 memory: reserving ");
  size_t held = logged_bytes(s, "/gpu:0 memory: pool held ");
  free(s);
  fprintf(stderr,
          "memory_fraction %.2f of %zu bytes: want %zu, logged reservation %zu, pool held %zu at "
          "the end; the GPU lost %zu bytes while the worker ran (its CUDA context included)\n",
          f, total, want, reserved, held, free0 > free1 ? free0 - free1 : 0);
  assert_int_equal(reserved, want);
  assert_int_equal(held, want); /* never grown past the reservation */
  assert_true(free0 > free1 && free0 - free1 >= want);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* allow_growth with memory_fraction: nothing up front, growth on demand, never beyond. */
static void test_memory_fraction_growth(void **state) {
  (void)state;
  size_t total = 0;
  assert_int_equal(ts_gpu_memory(0, NULL, &total), 0);
  size_t want = fraction_bytes(0.05, total);
  ts_cluster_t c;
  ts_proc_t w;
  start_fraction_job(&c, &w, true);
  stop_worker(&w);
  show_line(&w, "/gpu:0 memory: growing on demand up to");
  show_line(&w, "Created device ");
  show_line(&w, "/gpu:0 memory: pool held");
  char *s = ts_read_file(w.err);
  size_t held = logged_bytes(s, "/gpu:0 memory: pool held ");
  char created[96];
  snprintf(created, sizeof created, "with %zu MB memory:  -> device: ", want >> 20);
  bool logged = s && strstr(s, "/gpu:0 memory: growing on demand up to") && strstr(s, created);
  free(s);
  fprintf(stderr, "allow_growth under memory_fraction 0.05: limit %zu, pool held %zu at the end\n",
          want, held);
  assert_true(logged);
  assert_true(held > 0 && held < want); /* grown, and far from the limit for this model */
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_model_too_large(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  ts_proc_t w;
  const char *args[] = {
      "--set", "device.placement=\"/gpu:0\"",          "--set", "device.memory_fraction=0.02",
      "--set", "model.layers=[784, 65536, 65536, 10]", NULL};
  assert_int_equal(ts_worker_start(&c, 0, args, &w), 0);
  int rc = ts_proc_wait(&w, 120);
  show_line(&w, "out of memory");
  if (rc != 1 || !ts_file_has(w.err, "device.memory_fraction = 0.02")) ts_proc_dump(&w);
  assert_int_equal(rc, 1);
  assert_true(ts_file_has(w.err, "out of memory under device.memory_fraction = 0.02"));
  assert_true(ts_file_has(w.err, "more asked"));
  assert_true(ts_file_has(w.err, "in all)"));      /* the model's whole need */
  assert_false(ts_file_has(w.err, "declared on")); /* no shard was touched */
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- placement of a GPU that is not there ------------------------------------------------- */

static void test_missing_gpu_placement(void **state) {
  (void)state;
  if (gpu_count > 3) skip(); /* /gpu:3 exists here */
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "model = { layers = [784, 16, 10]; };"), 0);
  ts_proc_t w;
  const char *soft[] = {"--set", "device.placement=\"/gpu:3\"",
                        "--set", "device.allow_soft_placement=true",
                        "--set", "device.towers=1",
                        "--set", "train.max_steps=5",
                        NULL};
  assert_int_equal(ts_worker_start(&c, 0, soft, &w), 0);
  int rc = ts_proc_wait(&w, 60);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  show_line(&w, "allow_soft_placement");
  assert_true(ts_file_has(w.err, "allow_soft_placement: op fc1/matmul (MatMul) asked for "
                                 "'/device:GPU:3', placed on "
                                 "/job:worker/replica:0/task:0/device:GPU:0: only "));
  assert_true(ts_file_has(w.err, "device:GPU:0"));
  const char *hard[] = {"--set", "device.placement=\"/gpu:3\"", "--set",
                        "device.allow_soft_placement=false", NULL};
  assert_int_equal(ts_worker_start(&c, 0, hard, &w), 0);
  rc = ts_proc_wait(&w, 60);
  show_line(&w, "Could not satisfy");
  assert_int_equal(rc, 78);
  assert_true(ts_file_has(w.err,
                          "Could not satisfy explicit device specification '/device:GPU:3' because "
                          "no devices matching that specification are registered in this process"));
  /* No device.placement: TensorFlow's default puts the model on /gpu:0, silently. The job is
   * at global step 5 (the first worker's): 2 more steps (a lower train.max_steps leaves
   * nothing to train, exit 3). */
  const char *dflt[] = {"--set", "device.log_device_placement=true", "--set", "device.towers=1",
                        "--set", "train.max_steps=7", NULL};
  assert_int_equal(ts_worker_start(&c, 0, dflt, &w), 0);
  rc = ts_proc_wait(&w, 60);
  show_line(&w, "fc1/matmul: ");
  assert_int_equal(rc, 0);
  assert_true(
      ts_file_has(w.err, "\nfc1/matmul: (MatMul): /job:worker/replica:0/task:0/device:GPU:0\n"));
  assert_false(ts_file_has(w.err, "allow_soft_placement"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- (f) a model split over /gpu:0 and /cpu:0 ------------------------------------------- */

/* Training the split LeNet-5 on Fashion-MNIST, one epoch, every op logged where it runs. */
static void test_split_lenet5_training(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(
      ts_cluster_start(&c, 2, 1,
                       "job = { mode = \"sync\"; partition_bytes = 65536; };\n"
                       "optimizer = { name = \"adam\"; learning_rate = 0.002; };\n" SPLIT_LENET5
                       "train = { batch_size = 64; epochs = 1; log_interval_s = 2.0; };\n"
                       "device = { placement = \"\"; allow_soft_placement = false; "
                       "log_device_placement = true; towers = 1; " SPLIT_RULES " };\n"),
      0);
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  int rc = ts_proc_wait(&w, 300);
  double acc = ts_done_field(&w, "test_accuracy=");
  fprintf(stderr,
          "split LeNet-5 (convs /gpu:0, dense /cpu:0): exit %d, test accuracy %.4f, "
          "%.0f examples/s\n",
          rc, acc, ts_done_field(&w, "examples_per_sec="));
  if (rc != 0 || acc < 0.82) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  assert_true(acc >= 0.82);
  show_line(&w, "model split over devices: ");
  /* flatten1 has no rule: TensorFlow's default, the GPU. */
  assert_true(ts_file_has(w.err,
                          "model split over devices: conv1..flatten1 on /gpu:0, "
                          "fc1..fc3 on /cpu:0 (each tower split alike"));
  assert_true(
      ts_file_has(w.err, "\nconv1/Conv2D: (Conv2D): /job:worker/replica:0/task:0/device:GPU:0\n"));
  assert_true(ts_file_has(
      w.err, "\npool2/MaxPool: (MaxPool): /job:worker/replica:0/task:0/device:GPU:0\n"));
  assert_true(
      ts_file_has(w.err, "\nfc1/MatMul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_true(
      ts_file_has(w.err, "\nfc3/MatMul: (MatMul): /job:worker/replica:0/task:0/device:CPU:0\n"));
  assert_false(ts_file_has(w.err, "allow_soft_placement"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* The split LeNet-5's parameters after 25 SGD steps, against the same job on /cpu:0. */
static float *run_split_exact(const char *device, size_t *count) {
  char job[4096];
  snprintf(job, sizeof job,
           "job = { mode = \"sync\"; partition_bytes = 16384; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.05; };\n" SPLIT_LENET5
           "train = { batch_size = 32; max_steps = 25; };\n"
           "device = { allow_soft_placement = false; towers = 1; %s };\n",
           device);
  return run_job_params(job, true, count);
}

/* One step's loss and gradients of the split network (cuDNN and cuBLAS for the convolutions,
 * OpenBLAS for the dense layers, the boundary copied through pinned memory) against the CPU
 * back end alone; then 25 steps of the cluster, split against /cpu:0. */
static void test_split_gradients_vs_cpu(void **state) {
  (void)state;
  ts_kernels_cuda_opts_t opts = {.allow_tf32 = false};
  ts_kernels_t *gpu = NULL;
  char err[512] = "";
  assert_int_equal(ts_kernels_cuda_create(0, &opts, &gpu, err, sizeof err), 0);
  const ts_kernels_t *cpu = ts_kernels_cpu();
  const ts_layer_spec_t *s = lenet5_specs;
  const ts_kernels_t *lk[8] = {gpu, gpu, gpu, gpu, gpu, cpu, cpu, cpu};
  ts_layer_shape_t in = {28, 28, 1};
  enum { B = 32 };
  ts_seq_t split, ref;
  assert_int_equal(ts_seq_init_split(&split, s, 8, in, B, lk, err, sizeof err), 0);
  assert_int_equal(split.num_segments, 2);
  assert_int_equal(ts_seq_init(&ref, s, 8, in, B, cpu, err, sizeof err), 0);
  assert_int_equal(ts_seq_init_params(&split, 3), 0);
  assert_int_equal(ts_seq_init_params(&ref, 3), 0);
  size_t P = ref.desc.param_count;
  float *x = malloc(B * 784 * sizeof *x), *g = malloc(P * sizeof *g);
  assert_non_null(x);
  assert_non_null(g);
  for (size_t i = 0; i < B * 784; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
  int32_t y[B];
  for (int i = 0; i < B; i++) y[i] = i % 10;
  float ls = 0, lr = 0;
  assert_int_equal(ts_seq_forward_backward(&split, x, y, B, &ls), 0);
  assert_int_equal(ts_seq_forward_backward(&ref, x, y, B, &lr), 0);
  fprintf(stderr, "split network vs CPU: loss %.7f vs %.7f\n", (double)ls, (double)lr);
  assert_true(fabsf(ls - lr) <= 1e-5f * fabsf(lr));
  assert_int_equal(ts_seq_get_grads(&split, 0, g, P), 0);
  for (size_t t = 0; t < ref.desc.num_tensors; t++) {
    const ts_layer_tensor_t *tn = &ref.desc.tensors[t];
    char what[96];
    snprintf(what, sizeof what, "split gradient of %s vs CPU", tn->name);
    assert_true(rel_diff(what, g + tn->offset, ref.grads + tn->offset, tn->count) < 1e-4);
  }
  float as = 0, ar = 0;
  assert_int_equal(ts_seq_evaluate(&split, x, y, B, &as, &ls), 0);
  assert_int_equal(ts_seq_evaluate(&ref, x, y, B, &ar, &lr), 0);
  assert_true(fabsf(as - ar) <= 1.0f / B + 1e-6f);
  assert_true(fabsf(ls - lr) <= 1e-5f * fabsf(lr));
  free(x);
  free(g);
  ts_seq_destroy(&split);
  ts_seq_destroy(&ref);
  ts_kernels_cuda_destroy(gpu);

  size_t ns = 0, nc = 0;
  float *sp = run_split_exact("placement = \"\"; " SPLIT_RULES, &ns);
  float *cp = run_split_exact("placement = \"/cpu:0\";", &nc);
  assert_int_equal(ns, nc);
  assert_true(rel_diff("split LeNet-5 vs /cpu:0, 25 steps", sp, cp, ns) < 1e-4);
  free(sp);
  free(cp);
}

/* --- (e) examples/s, GPU against CPU ------------------------------------------------------ */

static double throughput(const char *placement, const char *layers, int batch, int steps) {
  char job[1024];
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; };\n"
           "model = { layers = %s; };\n"
           "train = { batch_size = %d; max_steps = %d; log_interval_s = 5.0; };\n"
           "device = { placement = \"%s\"; };\n",
           layers, batch, steps, placement);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, job), 0);
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  int rc = ts_proc_wait(&w, 180);
  if (rc != 0) ts_proc_dump(&w);
  assert_int_equal(rc, 0);
  double eps = ts_done_field(&w, "examples_per_sec=");
  assert_int_equal(ts_cluster_stop(&c), 0);
  return eps;
}

static void test_throughput(void **state) {
  (void)state;
  static const struct {
    const char *layers;
    int batch, steps;
  } cases[] = {
      {"[784, 128, 10]", 64, 300},
      {"[784, 1024, 1024, 10]", 512, 100},
      {"[784, 4096, 4096, 10]", 1024, 30},
  };
  fprintf(stderr, "\nexamples/s, 1 worker, 2 shards on loopback (async; network included)\n");
  fprintf(stderr, "| %-24s | %6s | %12s | %12s | %8s |\n", "model", "batch", "GPU ex/s", "CPU ex/s",
          "speed-up");
  fprintf(stderr,
          "|--------------------------|--------|--------------|--------------|----------|\n");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double g = throughput("/gpu:0", cases[i].layers, cases[i].batch, cases[i].steps);
    double cpu = throughput("/cpu:0", cases[i].layers, cases[i].batch, cases[i].steps / 3 + 1);
    fprintf(stderr, "| %-24s | %6d | %12.0f | %12.0f | %7.1fx |\n", cases[i].layers, cases[i].batch,
            g, cpu, cpu > 0 ? g / cpu : 0.0);
  }
}

int main(void) {
  char why[256] = "";
  gpu_count = ts_gpu_count(why, sizeof why);
  if (gpu_count == 0) {
    printf("SKIP: no GPU: %s\n", why);
    return 77;
  }
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0) {
    fprintf(stderr, "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_gpu_placement),
      cmocka_unit_test(test_model_too_large),
      cmocka_unit_test(test_memory_fraction),
      cmocka_unit_test(test_memory_fraction_growth),
      cmocka_unit_test(test_towers_exactness),
      cmocka_unit_test(test_split_gradients_vs_cpu),
      cmocka_unit_test(test_split_lenet5_training),
      cmocka_unit_test(test_fashion_mnist_gpu),
      cmocka_unit_test(test_throughput),
  };
  return cmocka_run_group_tests_name("training_gpu", tests, NULL, NULL);
}
