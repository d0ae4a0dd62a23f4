/*
 * Towers and back-end selection without a GPU: micro-batch slicing, the towers' data path on
 * the CPU back end (two towers with batch 2b give the gradient of one tower with batch 2b),
 * and the placement plan for GPU counts the machine does not have (ts_backend_plan is pure:
 * /gpu:3 on a one-GPU machine soft-places onto /gpu:0, or fails with TensorFlow's message).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rng_fixture.h"
#include "ts_alloc.h"
#include "ts_backend.h"
#include "ts_cpu_share.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_kernels.h"
#include "ts_model.h"
#include "ts_towers.h"

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

static void test_split(void **state) {
  (void)state;
  size_t off = 99, cnt = 99;
  assert_int_equal(ts_towers_split(64, 1, 0, &off, &cnt), 0);
  assert_int_equal(off, 0);
  assert_int_equal(cnt, 64);
  for (size_t t = 0; t < 4; t++) {
    assert_int_equal(ts_towers_split(64, 4, t, &off, &cnt), 0);
    assert_int_equal(off, 16 * t);
    assert_int_equal(cnt, 16);
  }
  assert_int_equal(ts_towers_split(64, 3, 0, &off, &cnt), TS_EINVAL); /* uneven */
  assert_int_equal(ts_towers_split(64, 0, 0, &off, &cnt), TS_EINVAL);
  assert_int_equal(ts_towers_split(64, 4, 4, &off, &cnt), TS_EINVAL);
  assert_int_equal(ts_towers_split(0, 4, 0, &off, &cnt), TS_EINVAL);
  assert_int_equal(ts_towers_split(2, 4, 0, &off, &cnt), TS_EINVAL); /* fewer than towers */
  assert_int_equal(ts_towers_split(8, 8, 7, NULL, NULL), 0);
}

static uint64_t rng = 0x243f6a8885a308d3ULL;
static float frand(void) { return (float)rng_uniform(&rng) * 2.0f - 1.0f; } /* in [-1, 1) */

/* T towers on the CPU over one batch, against one model on the same batch. */
static void check_towers_equal_one(size_t towers, ts_activation_t act) {
  int widths[] = {12, 9, 7, 5};
  const size_t nw = 4, batch = 24, dim = 12;
  const ts_kernels_t *cpu = ts_kernels_cpu();
  const ts_kernels_t *tables[4] = {cpu, cpu, cpu, cpu};
  char err[512] = "";
  ts_towers_t tw;
  assert_int_equal(
      ts_towers_init(&tw, tables, towers, widths, nw, act, batch, NULL, err, sizeof err), 0);
  assert_true(tw.zero_copy);
  assert_int_equal(tw.reduce, towers == 1 ? TS_TOWERS_REDUCE_NONE : TS_TOWERS_REDUCE_HOST);
  ts_model_t one;
  assert_int_equal(ts_model_init(&one, widths, nw, act, batch, cpu, err, sizeof err), 0);
  assert_int_equal(ts_model_init_params(&one, 5), 0);

  float x[24 * 12];
  int32_t y[24];
  for (size_t i = 0; i < batch * dim; i++) x[i] = frand();
  for (size_t i = 0; i < batch; i++) y[i] = (int32_t)(i % 5);

  /* A "pull": the parameters land in the pull targets, tensor by tensor. */
  float *const *dst = ts_towers_pull_targets(&tw);
  for (size_t t = 0; t < one.num_tensors; t++)
    memcpy(dst[t], one.params + one.tensors[t].offset, one.tensors[t].count * sizeof(float));
  assert_int_equal(ts_towers_load(&tw, x, y, batch, dim, err, sizeof err), 0);
  assert_int_equal(ts_towers_pulled(&tw, err, sizeof err), 0);
  float loss_t = 0.0f, loss_1 = 0.0f;
  assert_int_equal(ts_towers_step(&tw, &loss_t, err, sizeof err), 0);
  assert_int_equal(ts_model_forward_backward(&one, x, y, batch, &loss_1), 0);

  assert_true(fabsf(loss_t - loss_1) <= 1e-6f * fabsf(loss_1));
  const float *const *src = ts_towers_push_sources(&tw);
  double diff = 0, norm = 0;
  for (size_t t = 0; t < one.num_tensors; t++)
    for (size_t i = 0; i < one.tensors[t].count; i++) {
      double a = src[t][i], b = one.grads[one.tensors[t].offset + i];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
  double rel = sqrt(diff / norm);
  if (!(rel < 1e-6)) fail_msg("%zu towers vs one: relative gradient difference %g", towers, rel);
  /* Uneven batches are refused with a message. */
  assert_int_equal(ts_towers_load(&tw, x, y, towers == 1 ? 0 : towers + 1, dim, err, sizeof err),
                   TS_EINVAL);
  ts_model_destroy(&one);
  ts_towers_destroy(&tw);
  ts_towers_destroy(&tw); /* zeroed: safe */
}

static void test_cpu_towers_match_one_tower(void **state) {
  (void)state;
  check_towers_equal_one(1, TS_ACT_RELU);
  check_towers_equal_one(2, TS_ACT_RELU);
  check_towers_equal_one(3, TS_ACT_TANH);
  check_towers_equal_one(4, TS_ACT_RELU);
}

static int released;
static void count_release(const ts_kernels_t *k) {
  (void)k;
  released++;
}

static void test_towers_init_failures(void **state) {
  (void)state;
  const ts_kernels_t *cpu = ts_kernels_cpu();
  const ts_kernels_t *tables[2] = {cpu, cpu};
  int widths[] = {4, 3};
  int bad[] = {4, 0};
  char err[256] = "";
  ts_towers_t tw;
  released = 0;
  assert_int_equal(
      ts_towers_init(&tw, tables, 0, widths, 2, TS_ACT_RELU, 8, count_release, err, sizeof err),
      TS_EINVAL);
  assert_int_equal(
      ts_towers_init(&tw, tables, 2, bad, 2, TS_ACT_RELU, 8, count_release, err, sizeof err),
      TS_EINVAL);
  assert_contains(err, "tower 0 (cpu, /cpu:0)");
  assert_contains(err, "model.layers[1] = 0");
  assert_int_equal(released, 2); /* released on failure too */
  /* Allocation failures at every point leave nothing behind (ASan checks the leaks). */
  for (long n = 1; n < 40; n++) {
    released = 0;
    ts_alloc_fail_after(n);
    int rc =
        ts_towers_init(&tw, tables, 2, widths, 2, TS_ACT_RELU, 8, count_release, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      ts_towers_destroy(&tw);
      assert_int_equal(released, 2);
      break;
    }
    assert_int_equal(rc, TS_ENOMEM);
    assert_int_equal(released, 2);
  }
}

/* --- the placement plan ------------------------------------------------------------------ */

static void config(ts_config_t *cfg, const char *placement, bool soft, int towers, int batch) {
  assert_int_equal(ts_config_defaults(cfg), 0);
  ts_free(cfg->placement);
  cfg->placement = ts_strdup(placement);
  cfg->allow_soft_placement = soft;
  cfg->towers = towers;
  cfg->batch_size = batch;
}

static void test_plan_cpu(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  config(&cfg, "/cpu:0", true, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_int_equal(p.towers, 1);
  assert_int_equal(p.micro_batch, 64);
  assert_false(p.soft);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* Virtual towers on the CPU. */
  config(&cfg, "/cpu:0", true, 2, 64);
  assert_int_equal(ts_backend_plan(&cfg, 0, NULL, 0, NULL, &p, err, sizeof err), 0);
  assert_int_equal(p.towers, 2);
  assert_int_equal(p.micro_batch, 32);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
}

static void test_plan_gpu_towers(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  /* One tower per visible GPU, starting at the placed one. */
  config(&cfg, "/gpu:1", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 4, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_GPU);
  assert_int_equal(p.towers, 4);
  assert_int_equal(p.micro_batch, 16);
  int want[] = {1, 2, 3, 0};
  for (int t = 0; t < 4; t++) assert_int_equal(p.tower_device[t], want[t]);
  /* The input pipeline decodes on the host: mixed placement. */
  assert_int_equal(p.num_input_ops, 1);
  assert_string_equal(p.ops[0].name, "input/decode");
  assert_int_equal(p.placements[0].type, TS_DEVICE_CPU);
  assert_false(p.placements[0].soft);
  for (size_t i = p.num_input_ops; i < p.num_ops; i++) {
    assert_int_equal(p.placements[i].type, TS_DEVICE_GPU);
    assert_int_equal(p.placements[i].index, 1);
  }
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* Two virtual towers on one GPU. */
  config(&cfg, "/job:worker/replica:0/task:0/device:GPU:0", false, 2, 64);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.towers, 2);
  assert_int_equal(p.tower_device[0], 0);
  assert_int_equal(p.tower_device[1], 0);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* A batch that does not split. */
  config(&cfg, "/gpu:0", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 3, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err, "train.batch_size = 64 cannot be split evenly over 3 towers");
  ts_config_free(&cfg);
}

/* The acceptance case: /gpu:3 with one visible GPU. */
static void test_plan_missing_gpu(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  config(&cfg, "/gpu:3", true, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_GPU);
  assert_int_equal(p.towers, 1);
  assert_int_equal(p.tower_device[0], 0);
  assert_true(p.soft);
  assert_string_equal(p.soft_spec, "/device:GPU:3");
  assert_contains(p.soft_reason, "only 1 GPU(s) are visible");
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);

  config(&cfg, "/gpu:3", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err,
                  "Cannot assign a device for operation fc1/matmul: Could not satisfy "
                  "explicit device specification '/device:GPU:3' because no devices "
                  "matching that specification are registered in this process");
  ts_config_free(&cfg);

  /* No GPU at all: the whole model on /cpu:0, or TensorFlow's message. */
  config(&cfg, "/gpu:0", true, 0, 64);
  assert_int_equal(
      ts_backend_plan(&cfg, 0, "no CUDA driver", 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_int_equal(p.towers, 1);
  assert_contains(p.soft_reason, "no CUDA driver");
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  config(&cfg, "/gpu:0", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 0, NULL, 3, NULL, &p, err, sizeof err), TS_ECONFIG);
  assert_contains(err, "because no devices matching that specification are registered in this "
                       "process; available devices: /job:worker/replica:0/task:3/device:CPU:0");
  ts_config_free(&cfg);
  config(&cfg, "/gpu:x", true, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, NULL, &p, err, sizeof err), TS_ECONFIG);
  assert_contains(err, "device.placement");
  ts_config_free(&cfg);
}

/* An op without a GPU kernel: the model runs on one device, so everything moves to the CPU
 * under soft placement, and the reason names the op. */
static void test_plan_op_without_gpu_kernel(void **state) {
  (void)state;
  ts_kernels_t partial = *ts_kernels_cpu();
  partial.argmax_correct = NULL;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  config(&cfg, "/gpu:0", true, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, &partial, &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_int_equal(p.towers, 1);
  assert_true(p.soft);
  assert_contains(p.soft_reason, "op accuracy/argmax (ArgMax) has no GPU kernel");
  for (size_t i = 0; i < p.num_ops; i++) assert_int_equal(p.placements[i].type, TS_DEVICE_CPU);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  config(&cfg, "/gpu:0", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, &partial, &p, err, sizeof err), TS_ECONFIG);
  assert_contains(err, "Cannot assign a device for operation accuracy/argmax");
  assert_contains(err, "no supported kernel for GPU devices is available");
  ts_config_free(&cfg);
}

static void rules(ts_config_t *cfg, const char *const *r, size_t n) {
  for (size_t i = 0; i < cfg->num_placement_rules; i++) ts_free(cfg->placement_rules[i]);
  ts_free(cfg->placement_rules); /* the defaults' (empty) list */
  cfg->placement_rules = ts_calloc(n, sizeof *cfg->placement_rules);
  assert_non_null(cfg->placement_rules);
  for (size_t i = 0; i < n; i++) cfg->placement_rules[i] = ts_strdup(r[i]);
  cfg->num_placement_rules = n;
}

/* device.placement unset: TensorFlow's default, a GPU when one is visible, else the CPU,
 * silently. */
static void test_plan_default_placement(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  config(&cfg, "", false, 0, 64);
  assert_int_equal(ts_backend_plan(&cfg, 0, "no CUDA driver", 0, NULL, &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_false(p.soft);
  ts_backend_plan_free(&p);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_GPU);
  assert_int_equal(p.towers, 2);
  assert_int_equal(p.tower_device[0], 0);
  assert_false(p.soft);
  assert_int_equal(p.placements[0].type, TS_DEVICE_CPU); /* input/decode */
  assert_int_equal(p.placements[1].type, TS_DEVICE_GPU);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
}

/* device.rules: per-layer and per-op devices, first match wins, on names and layers. */
static void test_plan_rules(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  /* Every layer on the CPU by rule, in a GPU scope: the whole model on the CPU, explicitly. */
  const char *cpu_all[] = {"fc*=/cpu:0", "accuracy=/cpu:0", "loss/*=/cpu:0", "gradients/*=/cpu:0"};
  config(&cfg, "/gpu:0", false, 0, 64);
  rules(&cfg, cpu_all, 4);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_false(p.soft);
  for (size_t i = 0; i < p.num_ops; i++) assert_int_equal(p.placements[i].type, TS_DEVICE_CPU);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* A rule splitting the layers over two devices: refused without soft placement, naming
   * both ops; with it, the model goes to the CPU and each moved op says why. */
  const char *split[] = {"fc2=/cpu:0"};
  config(&cfg, "/gpu:0", false, 0, 64);
  rules(&cfg, split, 1);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err, "fc1/matmul is placed on /device:GPU:0 explicitly, but fc2/matmul is "
                       "placed on /device:CPU:0 and the model's layers run on one device");
  cfg.allow_soft_placement = true;
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_int_equal(p.type, TS_DEVICE_CPU);
  assert_true(p.soft);
  assert_true(p.placements[1].soft);
  assert_string_equal(p.placements[1].asked, "/device:GPU:0");
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* Two GPUs for one model: refused. A rule matching nothing is reported. */
  const char *two[] = {"fc2/*=/gpu:1", "conv9=/cpu:0"};
  config(&cfg, "/gpu:0", true, 0, 64);
  rules(&cfg, two, 2);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err, "on /device:GPU:0 and fc2/matmul on /device:GPU:1");
  cfg.placement_rules[0][0] = 'x'; /* now matches nothing either */
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_string_equal(p.unused_rules, "\"xc2/*=/gpu:1\", \"conv9=/cpu:0\"");
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* The decode sent to a GPU: TensorFlow's "no supported kernel"; malformed rule devices. */
  const char *decode[] = {"input/*=/gpu:0"};
  config(&cfg, "", false, 0, 64);
  rules(&cfg, decode, 1);
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err, "Cannot assign a device for operation input/decode: Could not satisfy "
                       "explicit device specification '/device:GPU:0' because no supported "
                       "kernel for GPU devices is available");
  ts_free(cfg.placement_rules[0]);
  cfg.placement_rules[0] = ts_strdup("fc1=/gpu:x");
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err, "device.rules[0] \"fc1=/gpu:x\": malformed device name '/gpu:x'");
  ts_config_free(&cfg);
}

/* LeNet-5 as a layer list in the job file's form. */
static void lenet5(ts_config_t *cfg) {
  static const struct {
    const char *type;
    int filters, units, k;
    const char *padding, *act;
  } L[] = {{"conv2d", 6, 0, 5, "same", "relu"},   {"max_pool", 0, 0, 2, "", ""},
           {"conv2d", 16, 0, 5, "valid", "relu"}, {"max_pool", 0, 0, 2, "", ""},
           {"flatten", 0, 0, 0, "", ""},          {"dense", 0, 120, 0, "", "relu"},
           {"dense", 0, 84, 0, "", "relu"},       {"dense", 0, 10, 0, "", ""}};
  ts_free(cfg->net_layers);
  cfg->net_layers = ts_calloc(TS_CONFIG_LAYERS_MAX, sizeof *cfg->net_layers);
  assert_non_null(cfg->net_layers);
  for (size_t i = 0; i < 8; i++) {
    ts_config_layer_t *l = &cfg->net_layers[i];
    snprintf(l->type, sizeof l->type, "%s", L[i].type);
    l->filters = L[i].filters;
    l->units = L[i].units;
    l->kernel[0] = l->kernel[1] = L[i].k;
    snprintf(l->padding, sizeof l->padding, "%s", L[i].padding);
    snprintf(l->activation, sizeof l->activation, "%s", L[i].act);
    snprintf(l->where, sizeof l->where, "job.cfg:%zu", 10 + i);
  }
  cfg->num_net_layers = 8;
  cfg->num_layers = 0;
}

/* The device of the model op called name. */
static const ts_placement_t *placed(const ts_backend_plan_t *p, const char *name) {
  for (size_t i = 0; i < p->num_ops; i++)
    if (strcmp(p->ops[i].name, name) == 0) return &p->placements[i];
  fail_msg("no op %s", name);
  return NULL;
}

/* A network's layers placed on a GPU and on /cpu:0 explicitly: a split plan (TensorFlow's
 * `with tf.device()` scopes), each tower split alike; what is moved or impossible is not. */
static void test_plan_split(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[512] = "";
  /* Convolutions on /gpu:0, dense layers on /cpu:0, the rest by TensorFlow's default. */
  const char *convs_gpu[] = {"conv*=/gpu:0", "fc*=/cpu:0"};
  config(&cfg, "", false, 0, 64);
  lenet5(&cfg);
  rules(&cfg, convs_gpu, 2);
  const ts_kernels_t *cuda = ts_kernels_cuda_ops();
  const ts_kernels_t *tables[] = {ts_kernels_cpu(),
                                  cuda && ts_kernels_cuda_have_cudnn() ? cuda : NULL};
  for (size_t t = 0; t < 2 && tables[t]; t++) {
    assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, tables[t], &p, err, sizeof err), 0);
    assert_true(p.split);
    assert_int_equal(p.type, TS_DEVICE_GPU);
    assert_int_equal(p.towers, 1);
    assert_false(p.soft);
    assert_int_equal(placed(&p, "input/decode")->type, TS_DEVICE_CPU);
    assert_int_equal(placed(&p, "conv1/Conv2D")->type, TS_DEVICE_GPU);
    assert_int_equal(placed(&p, "pool1/MaxPool")->type, TS_DEVICE_GPU);
    assert_int_equal(placed(&p, "conv2/Conv2D")->type, TS_DEVICE_GPU);
    assert_int_equal(placed(&p, "flatten1/Reshape")->type, TS_DEVICE_GPU);
    assert_int_equal(placed(&p, "fc1/MatMul")->type, TS_DEVICE_CPU);
    assert_int_equal(placed(&p, "fc3/MatMul")->type, TS_DEVICE_CPU);
    assert_string_equal(placed(&p, "fc3/MatMul")->asked, "/device:CPU:0");
    ts_backend_plan_free(&p);
  }
  ts_config_free(&cfg);
  /* The scope /cpu:0, convolutions on /gpu:1: two GPUs give two towers, each split alike, the
   * first on /gpu:1. */
  const char *convs_gpu1[] = {"conv*=/gpu:1"};
  config(&cfg, "/cpu:0", false, 0, 64);
  lenet5(&cfg);
  rules(&cfg, convs_gpu1, 1);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  assert_true(p.split);
  assert_int_equal(p.towers, 2);
  assert_int_equal(p.tower_device[0], 1);
  assert_int_equal(p.tower_device[1], 0);
  assert_int_equal(p.micro_batch, 32);
  assert_int_equal(placed(&p, "conv2/Conv2D")->index, 1);
  assert_int_equal(placed(&p, "pool1/MaxPool")->type, TS_DEVICE_CPU);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
  /* Convolutions without a GPU kernel (no cuDNN) moved by soft placement: only they move, as
   * in TensorFlow, so the model alternates CPU, GPU, CPU, GPU (pooling has its kernel); the
   * same under the default placement, without soft placement; with /gpu:0 explicit and no
   * soft placement, TensorFlow's message. */
  ts_kernels_t no_conv = *ts_kernels_cpu();
  no_conv.conv2d_fwd = NULL;
  for (int dflt = 0; dflt < 2; dflt++) {
    config(&cfg, dflt ? "" : "/gpu:0", !dflt, 0, 64);
    lenet5(&cfg);
    assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, &no_conv, &p, err, sizeof err), 0);
    assert_true(p.split);
    assert_int_equal(p.type, TS_DEVICE_GPU);
    assert_int_equal(p.soft, !dflt);
    assert_int_equal(placed(&p, "conv1/Conv2D")->type, TS_DEVICE_CPU);
    assert_int_equal(placed(&p, "conv1/Conv2D")->soft, !dflt);
    assert_int_equal(placed(&p, "pool1/MaxPool")->type, TS_DEVICE_GPU);
    assert_int_equal(placed(&p, "conv2/Conv2D")->type, TS_DEVICE_CPU);
    assert_int_equal(placed(&p, "fc1/MatMul")->type, TS_DEVICE_GPU);
    assert_false(placed(&p, "fc1/MatMul")->soft);
    ts_backend_plan_free(&p);
    ts_config_free(&cfg);
  }
  config(&cfg, "/gpu:0", true, 0, 64);
  lenet5(&cfg);
  cfg.allow_soft_placement = false;
  assert_int_equal(ts_backend_plan(&cfg, 1, NULL, 0, &no_conv, &p, err, sizeof err), TS_ECONFIG);
  assert_contains(err, "Cannot assign a device for operation conv1/Conv2D");
  ts_config_free(&cfg);
  /* Two GPUs in one model: refused, naming both ops. */
  const char *two[] = {"fc*=/gpu:1"};
  config(&cfg, "/gpu:0", false, 0, 64);
  lenet5(&cfg);
  rules(&cfg, two, 1);
  assert_int_equal(ts_backend_plan(&cfg, 2, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err),
                   TS_ECONFIG);
  assert_contains(err,
                  "conv1/Conv2D is placed on /device:GPU:0 and fc1/MatMul on "
                  "/device:GPU:1: one model's layers run on one GPU, or on one GPU and "
                  "/device:CPU:0");
  ts_config_free(&cfg);
}

/* device.intra_op_parallelism_threads = 0: the CPUs shared by the job's workers on this
 * worker's host. */
static void test_cpu_share(void **state) {
  (void)state;
  ts_config_t cfg;
  char why[160];
  config(&cfg, "", false, 0, 64);
  const char *four[] = {"127.0.0.1:9200", "localhost:9201", "10.0.0.2:9200", "10.0.0.3:9200"};
  for (size_t i = 0; i < cfg.num_workers; i++) ts_free(cfg.workers[i]);
  ts_free(cfg.workers);
  cfg.workers = ts_calloc(4, sizeof *cfg.workers);
  assert_non_null(cfg.workers);
  for (size_t i = 0; i < 4; i++) cfg.workers[i] = ts_strdup(four[i]);
  cfg.num_workers = 4;
  /* Tasks 0 and 1 share loopback: 2 CPUs give one thread each. */
  assert_int_equal(ts_cpu_share_threads(&cfg, 0, 2, why, sizeof why), 1);
  assert_contains(why, "2 CPU(s) shared by the 2 workers on this host");
  assert_int_equal(ts_cpu_share_threads(&cfg, 1, 8, why, sizeof why), 4);
  /* Task 2 is alone on its host; never fewer than one thread. */
  assert_int_equal(ts_cpu_share_threads(&cfg, 2, 8, why, sizeof why), 8);
  assert_contains(why, "no other worker");
  assert_int_equal(ts_cpu_share_threads(&cfg, 0, 1, why, sizeof why), 1);
  /* Set explicitly: kept. */
  cfg.intra_op_threads = 3;
  assert_int_equal(ts_cpu_share_threads(&cfg, 0, 2, why, sizeof why), 3);
  assert_string_equal(why, "device.intra_op_parallelism_threads = 3");
  assert_true(ts_cpu_share_cpus() >= 1);
  ts_config_free(&cfg);
}

/* ts_model_ops lists exactly the ops a built model has. */
static void test_model_ops_match(void **state) {
  (void)state;
  int widths[] = {6, 5, 4, 3};
  ts_model_op_t *ops = NULL;
  size_t n = 0;
  assert_int_equal(ts_model_ops(widths, 4, TS_ACT_TANH, &ops, &n), 0);
  ts_model_t m;
  char err[256];
  assert_int_equal(ts_model_init(&m, widths, 4, TS_ACT_TANH, 2, ts_kernels_cpu(), err, sizeof err),
                   0);
  assert_int_equal(n, m.num_ops);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(ops[i].name, m.ops[i].name);
    assert_int_equal(ops[i].kind, m.ops[i].kind);
  }
  size_t bytes = ts_model_device_bytes(widths, 4, 2);
  assert_true(bytes >= 2 * m.param_count * sizeof(float));
  assert_int_equal(ts_model_device_bytes(widths, 1, 2), 0);
  ts_model_destroy(&m);
  ts_free(ops);
  int bad[] = {6, 0};
  assert_int_equal(ts_model_ops(bad, 2, TS_ACT_RELU, &ops, &n), TS_EINVAL);
}

/* device.rules at their limit (64), none matching: the report names whole rules and says
 * how many more did not fit, never a rule cut in the middle. */
static void test_plan_unused_rules_long(void **state) {
  (void)state;
  ts_config_t cfg;
  ts_backend_plan_t p;
  char err[1024];
  char text[64][48];
  const char *r[64];
  for (int i = 0; i < 64; i++) {
    snprintf(text[i], sizeof text[i], "no_such_layer_number_%02d=/cpu:0", i);
    r[i] = text[i];
  }
  config(&cfg, "", false, 0, 64);
  rules(&cfg, r, 64);
  assert_int_equal(ts_backend_plan(&cfg, 0, NULL, 0, ts_kernels_cpu(), &p, err, sizeof err), 0);
  const char *u = p.unused_rules;
  assert_true(strncmp(u, "\"no_such_layer_number_00=/cpu:0\", ", 34) == 0);
  /* Every quoted rule is whole, and the rest are counted. */
  size_t whole = 0;
  for (const char *q = strchr(u, '"'); q; q = strchr(q + 1, '"')) {
    const char *end = strchr(q + 1, '"');
    assert_non_null(end);
    assert_int_equal(end - q - 1, (long)strlen(text[0]));
    whole++;
    q = end;
  }
  assert_true(whole > 0 && whole < 64);
  char more[32];
  snprintf(more, sizeof more, "and %zu more", 64 - whole);
  assert_contains(u, more);
  ts_backend_plan_free(&p);
  ts_config_free(&cfg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_cpu_towers_match_one_tower),
      cmocka_unit_test(test_towers_init_failures),
      cmocka_unit_test(test_plan_cpu),
      cmocka_unit_test(test_plan_gpu_towers),
      cmocka_unit_test(test_plan_missing_gpu),
      cmocka_unit_test(test_plan_op_without_gpu_kernel),
      cmocka_unit_test(test_plan_default_placement),
      cmocka_unit_test(test_plan_rules),
      cmocka_unit_test(test_plan_split),
      cmocka_unit_test(test_plan_unused_rules_long),
      cmocka_unit_test(test_cpu_share),
      cmocka_unit_test(test_model_ops_match),
  };
  return cmocka_run_group_tests_name("towers", tests, NULL, NULL);
}
