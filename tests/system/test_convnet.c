/*
 * Convolutional models on the worker daemon (issue 16), through the real ps-server and
 * ps-worker binaries on loopback:
 *  - deploy/local/lenet5.cfg as it ships (2 shards, 2 CPU workers, sync, Adam on a cosine
 *    decay, batch 32 per worker, 3 epochs of Fashion-MNIST) reaches a test accuracy of at
 *    least 0.90, the target (0.9020 measured with Keras's Glorot fans for the
 *    convolution kernels, proto/ts_init.h; 0.9012 before them with the direct convolution
 *    and fused kernels, 0.9024 before those, the same in every run; neighbouring peak rates
 *    gave 0.8972-0.9001); the time it takes is printed, not asserted;
 *  - sync exactness with a CNN: 2 workers x batch 16 end with the parameters of 1 worker x
 *    batch 32 after 20 steps (two convolutions, strides 1 and 2, both paddings, pooling);
 *  - a bad layer list (a kernel larger than its input, a dense layer on an image, an unknown
 *    layer type) makes the worker exit 78 before it contacts a shard, with one line naming
 *    the job file's line, the layer and the shape that does not fit.
 */
#include <math.h>
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
#include "model_pull.h"
#include "ts_backend.h"
#include "ts_kernels.h"
#include "ts_model.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static int need_data(void **state) {
  (void)state;
  if (access(DATA "t10k-images-idx3-ubyte.gz", R_OK) != 0) {
    fprintf(stderr, "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
    return -1;
  }
  return 0;
}

/* deploy/local/lenet5.cfg from its job group on (the harness writes its own cluster group,
 * with free ports). ts_malloc'd by ts_read_file; the caller frees it. */
static char *lenet5_job(void) {
  char *text = ts_read_file(TS_SOURCE_ROOT "/deploy/local/lenet5.cfg");
  assert_non_null(text);
  char *job = strstr(text, "\njob = {");
  assert_non_null(job);
  memmove(text, job + 1, strlen(job + 1) + 1);
  return text;
}

static void test_lenet5_sync(void **state) {
  (void)state;
  char *job = lenet5_job();
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, job), 0);
  free(job);
  double t0 = ts_now_s();
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  for (int t = 0; t < 2; t++) {
    int rc = ts_proc_wait(&w[t], 560);
    double acc = ts_done_field(&w[t], "test_accuracy=");
    fprintf(stderr, "lenet5 worker %d: exit %d, test accuracy %.4f after %.1f s\n", t, rc, acc,
            ts_now_s() - t0);
    if (rc != 0 || acc < 0.90) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
    assert_true(acc >= 0.90); /* measured 0.9020 (0.9012 with the fans before Keras's) */
    assert_true(ts_file_has(w[t].err, "model [layers] declared on 2 shard(s): 61706 parameters"));
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync exactness: 2 workers x batch B == 1 worker x batch 2B, with a CNN ------------- */

#define EXACT_JOB                                                                            \
  "job = { mode = \"sync\"; partition_bytes = 4096; };\n"                                    \
  "optimizer = { name = \"sgd\"; learning_rate = 0.05; };\n"                                 \
  "model = { seed = 7; layers = (\n"                                                         \
  "  { type = \"conv2d\"; filters = 4; kernel = 5; padding = \"same\"; activation = \"relu\"; },\n" \
  "  { type = \"max_pool\"; size = 2; },\n"                                                  \
  "  { type = \"conv2d\"; filters = 8; kernel = 3; strides = 2; activation = \"relu\"; },\n"  \
  "  { type = \"flatten\"; },\n"                                                             \
  "  { type = \"dense\"; units = 32; activation = \"tanh\"; },\n"                             \
  "  { type = \"dense\"; units = 10; }); };\n"

/* The parameters the shards of c hold, pulled as the model c's job file describes; *moved
 * gets their relative L2 distance from the initial ones. */
static float *cnn_params(ts_cluster_t *c, size_t *count, double *moved) {
  char err[512] = "";
  ts_config_t cfg;
  assert_int_equal(ts_config_load(&cfg, c->config, NULL, NULL, 0, err, sizeof err), 0);
  ts_layer_spec_t specs[TS_LAYERS_MAX];
  ts_layer_shape_t in = {28, 28, 1};
  assert_int_equal(ts_backend_layers(&cfg, in, specs, err, sizeof err), 0);
  ts_model_t m;
  int rc = ts_model_init_seq(&m, specs, cfg.num_net_layers, in, 1, ts_kernels_cpu(), err, sizeof err);
  if (rc != 0) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  float *p = ts_pull_model_params(c, &m, 7, NULL);
  *count = m.param_count;
  float *init = calloc(m.param_count, sizeof *init);
  assert_non_null(init);
  assert_int_equal(ts_model_init_params(&m, 7), 0);
  assert_int_equal(ts_model_get_params(&m, 0, init, m.param_count), 0);
  *moved = ts_rel_l2(p, init, m.param_count);
  free(init);
  ts_model_destroy(&m);
  ts_config_free(&cfg);
  return p;
}

static float *run_cnn(int workers, int batch, size_t *count, double *moved) {
  char job[2048];
  snprintf(job, sizeof job, "%strain = { batch_size = %d; max_steps = 20; };\n", EXACT_JOB,
           batch);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, workers, job), 0);
  ts_proc_t w[2];
  assert_int_equal(ts_workers_run(&c, workers, NULL, 120, w), 0);
  float *p = cnn_params(&c, count, moved);
  assert_int_equal(ts_cluster_stop(&c), 0);
  return p;
}

static void test_cnn_sync_exactness(void **state) {
  (void)state;
  size_t n2 = 0, n1 = 0;
  double moved2 = 0, moved1 = 0;
  float *two = run_cnn(2, 16, &n2, &moved2);
  float *one = run_cnn(1, 32, &n1, &moved1);
  assert_int_equal(n1, n2);
  double rel = ts_rel_l2(two, one, n1);
  fprintf(stderr,
          "cnn sync exactness: %zu parameters moved %.3g from their initial values, the two "
          "runs differ by %.3g (relative L2)\n",
          n1, moved1, rel);
  assert_true(moved1 > 1e-3); /* 20 steps trained: the comparison is not of two initial states */
  assert_true(rel < 1e-5);
  free(one);
  free(two);
}

typedef struct {
  const char *layers; /* model.layers, one layer a line; its first layer is on line 9 */
  const char *expected;
  bool handshake; /* a good model that differs from the shard's: refused at the handshake */
} bad_model_t;

static void test_bad_model_exits_78(void **state) {
  (void)state;
  /* The shards load a good job; each bad worker reads its own file (same cluster). */
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "train = { max_steps = 1; };"), 0);
  char *cluster = ts_read_file(c.config);
  assert_non_null(cluster);
  char *end = strstr(cluster, "\n};\n"); /* the cluster group: lines 1 to 5 */
  assert_non_null(end);
  end[4] = '\0';
  const bad_model_t cases[] = {
      {"{ type = \"conv2d\"; filters = 6; kernel = 5; activation = \"relu\"; },\n"
       "{ type = \"max_pool\"; size = 4; },\n"
       "{ type = \"conv2d\"; filters = 16; kernel = 7; activation = \"relu\"; },\n"
       "{ type = \"flatten\"; },\n{ type = \"dense\"; units = 10; }",
       "bad.cfg:11: model.layers: layer 3 'conv2' (conv2d): kernel 7x7 does not fit its 6x6x6 "
       "input with padding valid",
       false},
      {"{ type = \"conv2d\"; filters = 6; kernel = 5; },\n{ type = \"dense\"; units = 10; }",
       "bad.cfg:10: model.layers: layer 2 'fc1' (dense): needs a flat input but gets 24x24x6",
       false},
      {"{ type = \"conv2d\"; filters = 6; kernel = 5; },\n{ type = \"conv3d\"; },\n"
       "{ type = \"flatten\"; },\n{ type = \"dense\"; units = 10; }",
       "bad.cfg:10: model.layers: layer 2: unknown type \"conv3d\"", false},
      {"{ type = \"conv2d\"; filters = 4; kernel = 3; strides = 2; },\n{ type = \"flatten\"; },\n"
       "{ type = \"dense\"; units = 10; }",
       "model.layers: this worker has conv1=conv2d(4,3x3,2x2,valid,linear); flatten1=flatten(); "
       "fc1=dense(10,linear), shard 0 has [784, 128, 10]",
       true},
  };
  char path[sizeof c.config];
  snprintf(path, sizeof path, "%s/bad.cfg", c.dir);
  char saved[sizeof c.config];
  memcpy(saved, c.config, sizeof saved);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\nmodel = {\n  layers = (\n%s\n  );\n};\n", cluster, cases[i].layers);
    fclose(f);
    snprintf(c.config, sizeof c.config, "%s", path);
    ts_proc_t w;
    assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
    int rc = ts_proc_wait(&w, 60);
    bool named = ts_file_has(w.err, cases[i].expected);
    fprintf(stderr, "bad model %zu: exit %d, %s\n", i, rc, named ? "named" : "NOT named");
    if (rc != 78 || !named) {
      fprintf(stderr, "expected: %s\n", cases[i].expected);
      ts_proc_dump(&w);
    }
    assert_int_equal(rc, 78);
    assert_true(named);
    /* Found before any shard was contacted, or (a good model) at the handshake. */
    assert_true(ts_file_has(w.err, "connecting to") == cases[i].handshake);
  }
  memcpy(c.config, saved, sizeof saved);
  free(cluster);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_model_exits_78),
      cmocka_unit_test(test_cnn_sync_exactness),
      cmocka_unit_test(test_lenet5_sync),
  };
  return cmocka_run_group_tests(tests, need_data, NULL);
}
