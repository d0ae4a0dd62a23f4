/*
 * A network split over devices (worker/ts_seq.h segments; TensorFlow's `with tf.device()`
 * scopes over one model), without a GPU: the CPU back end twice, as two tables A and B that
 * each keep a registry of the buffers they allocated. Every kernel that the tests route
 * through a table checks that the device pointers it gets are that table's own, so a layer
 * that reads another segment's buffer, or a copy that skips the staging, fails the test; the
 * boundary copies go through the tables' copy_to_host / copy_to_device, which count them.
 *
 * Checked, for an MLP-shaped network (dense layers) and a LeNet-like CNN (convolutions,
 * pooling, flatten, dropout in training), over several cuts (two and three segments, a
 * boundary at a flatten, at a pooling layer, one between dense layers): the loss and EVERY
 * gradient equal the unsplit network's on one table bit for bit (the same CPU kernels in the
 * same order), and evaluation (accuracy and loss) too; the flat layout's copies across
 * segments; towers whose model is split (two towers, each with its CPU layers on the CPU back
 * end) against one unsplit tower.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rng_fixture.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_kernels.h"
#include "ts_model.h"
#include "ts_seq.h"
#include "ts_towers.h"

/* --- two tables over the CPU back end, each checking its buffers ------------------------- */

#define REG_MAX 512

typedef struct {
  const char *name;
  uintptr_t base[REG_MAX];
  size_t size[REG_MAX];
  size_t n;
  size_t to_host, to_device; /* copies counted */
} reg_t;

static reg_t reg_a = {.name = "A"}, reg_b = {.name = "B"};
static ts_kernels_t table_a, table_b;
static const ts_kernels_t *CPU;

static reg_t *reg(const ts_kernels_t *k) {
  return k->ctx;
}

static void owned(const ts_kernels_t *k, const void *p, const char *what) {
  const reg_t *r = reg(k);
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < r->n; i++)
    if (a >= r->base[i] && (a < r->base[i] + r->size[i] || a == r->base[i])) return;
  fail_msg("table %s: %s %p is not a buffer of this table", r->name, what, p);
}

static int w_alloc(const ts_kernels_t *k, size_t bytes, void **out) {
  reg_t *r = reg(k);
  assert_true(r->n < REG_MAX);
  int rc = CPU->alloc(CPU, bytes, out);
  if (rc == 0) {
    r->base[r->n] = (uintptr_t)*out;
    r->size[r->n++] = bytes;
  }
  return rc;
}

static void w_free(const ts_kernels_t *k, void *p) {
  if (!p) return;
  reg_t *r = reg(k);
  for (size_t i = 0; i < r->n; i++)
    if (r->base[i] == (uintptr_t)p) {
      r->base[i] = r->base[r->n - 1];
      r->size[i] = r->size[--r->n];
      CPU->free_buf(CPU, p);
      return;
    }
  fail_msg("table %s: freeing %p, not its buffer", r->name, p);
}

static int w_to_device(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  owned(k, dst, "copy_to_device destination");
  reg(k)->to_device++;
  return CPU->copy_to_device(CPU, dst, src, bytes);
}

static int w_to_host(const ts_kernels_t *k, void *dst, const void *src, size_t bytes) {
  owned(k, src, "copy_to_host source");
  reg(k)->to_host++;
  return CPU->copy_to_host(CPU, dst, src, bytes);
}

static int w_gemm(const ts_kernels_t *k, bool ta, bool tb, size_t m, size_t n, size_t kk,
                  float alpha, const float *a, size_t lda, const float *b, size_t ldb, float beta,
                  float *c, size_t ldc) {
  owned(k, a, "gemm A");
  owned(k, b, "gemm B");
  owned(k, c, "gemm C");
  return CPU->gemm(CPU, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int w_bias_add(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias,
                      float *y) {
  owned(k, bias, "bias_add bias");
  owned(k, y, "bias_add y");
  return CPU->bias_add(CPU, rows, cols, bias, y);
}

static int w_bias_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *dy,
                       float *db) {
  owned(k, dy, "bias_grad dy");
  owned(k, db, "bias_grad db");
  return CPU->bias_grad(CPU, rows, cols, dy, db);
}

static int w_conv_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *w,
                      float *y, void *ws, size_t wsb) {
  owned(k, x, "conv2d x");
  owned(k, w, "conv2d w");
  owned(k, y, "conv2d y");
  owned(k, ws, "conv2d workspace");
  return CPU->conv2d_fwd(CPU, g, x, w, y, ws, wsb);
}

static int w_conv_bwd_data(const ts_kernels_t *k, const ts_conv2d_t *g, const float *w,
                           const float *dy, float *dx, void *ws, size_t wsb) {
  owned(k, w, "conv2d_bwd_data w");
  owned(k, dy, "conv2d_bwd_data dy");
  owned(k, dx, "conv2d_bwd_data dx");
  return CPU->conv2d_bwd_data(CPU, g, w, dy, dx, ws, wsb);
}

static int w_conv_bwd_filter(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x,
                             const float *dy, float *dw, void *ws, size_t wsb) {
  owned(k, x, "conv2d_bwd_filter x");
  owned(k, dy, "conv2d_bwd_filter dy");
  owned(k, dw, "conv2d_bwd_filter dw");
  return CPU->conv2d_bwd_filter(CPU, g, x, dy, dw, ws, wsb);
}

static int w_pool_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, float *y,
                      int32_t *am) {
  owned(k, x, "maxpool x");
  owned(k, y, "maxpool y");
  owned(k, am, "maxpool argmax");
  return CPU->maxpool_fwd(CPU, g, x, y, am);
}

static int w_pool_bwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *y,
                      const float *dy, const int32_t *am, float *dx) {
  owned(k, x, "maxpool_bwd x");
  owned(k, dy, "maxpool_bwd dy");
  owned(k, dx, "maxpool_bwd dx");
  return CPU->maxpool_bwd(CPU, g, x, y, dy, am, dx);
}

static int w_relu_fwd(const ts_kernels_t *k, size_t n, const float *x, float *y) {
  owned(k, x, "relu x");
  owned(k, y, "relu y");
  return CPU->relu_fwd(CPU, n, x, y);
}

static int w_relu_bwd(const ts_kernels_t *k, size_t n, const float *y, const float *dy, float *dx) {
  owned(k, y, "relu_bwd y");
  owned(k, dy, "relu_bwd dy");
  owned(k, dx, "relu_bwd dx");
  return CPU->relu_bwd(CPU, n, y, dy, dx);
}

static int w_mul(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y) {
  owned(k, a, "mul a");
  owned(k, b, "mul b");
  owned(k, y, "mul y");
  return CPU->mul(CPU, n, a, b, y);
}

static int w_xent(const ts_kernels_t *k, size_t rows, size_t cols, const float *logits,
                  const int32_t *labels, float *probs, float *loss) {
  owned(k, logits, "softmax_xent logits");
  owned(k, labels, "softmax_xent labels");
  owned(k, probs, "softmax_xent probs");
  return CPU->softmax_xent(CPU, rows, cols, logits, labels, probs, loss);
}

static void make_table(ts_kernels_t *t, reg_t *r) {
  *t = *CPU;
  t->name = r->name;
  t->ctx = r;
  t->alloc = w_alloc;
  t->free_buf = w_free;
  t->copy_to_device = w_to_device;
  t->copy_to_host = w_to_host;
  t->gemm = w_gemm;
  t->bias_add = w_bias_add;
  t->bias_grad = w_bias_grad;
  t->conv2d_fwd = w_conv_fwd;
  t->conv2d_bwd_data = w_conv_bwd_data;
  t->conv2d_bwd_filter = w_conv_bwd_filter;
  t->maxpool_fwd = w_pool_fwd;
  t->maxpool_bwd = w_pool_bwd;
  t->relu_fwd = w_relu_fwd;
  t->relu_bwd = w_relu_bwd;
  t->mul = w_mul;
  t->softmax_xent = w_xent;
}

/* --- networks ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static float *rand_floats(size_t n, double lo, double hi) {
  float *p = ts_malloc(n * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * rng_uniform(&rng_state));
  return p;
}

static ts_layer_spec_t conv(size_t filters, size_t k, ts_padding_t pad) {
  return (ts_layer_spec_t){.type = TS_LAYER_CONV2D,
                           .filters = filters,
                           .win_h = k,
                           .win_w = k,
                           .padding = pad,
                           .activation = TS_LAYER_RELU};
}

static ts_layer_spec_t pool2(void) {
  return (ts_layer_spec_t){.type = TS_LAYER_MAX_POOL, .win_h = 2, .win_w = 2};
}

static ts_layer_spec_t dense(size_t units, ts_layer_act_t act) {
  return (ts_layer_spec_t){.type = TS_LAYER_DENSE, .units = units, .activation = act};
}

#define BATCH 6

/* The unsplit network on A and the network with layer i on tables cut[i] ('A' or 'B'), from
 * the same parameters and batch: loss, every gradient, evaluation, all equal bit for bit; the
 * boundaries copied through the tables' copy functions. */
static void check_split(const ts_layer_spec_t *s, size_t n, ts_layer_shape_t in, const char *cut,
                        bool dropout) {
  const ts_kernels_t *one[16], *lk[16];
  size_t boundaries = 0;
  for (size_t i = 0; i < n; i++) {
    one[i] = &table_a;
    lk[i] = cut[i] == 'B' ? &table_b : &table_a;
    if (i > 0 && cut[i] != cut[i - 1]) boundaries++;
  }
  char err[256] = "";
  ts_seq_t ref, split;
  assert_int_equal(ts_seq_init_split(&ref, s, n, in, BATCH, one, err, sizeof err), 0);
  assert_int_equal(ts_seq_init_split(&split, s, n, in, BATCH, lk, err, sizeof err), 0);
  assert_int_equal(ref.num_segments, 1);
  assert_int_equal(split.num_segments, boundaries + 1);
  assert_null(split.params);
  assert_int_equal(ts_seq_init_params(&ref, 11), 0);
  assert_int_equal(ts_seq_init_params(&split, 11), 0);
  size_t P = ref.desc.param_count, dim = ts_layers_elems(in);
  float *p1 = ts_malloc(P * sizeof *p1), *p2 = ts_malloc(P * sizeof *p2);
  float *g1 = ts_malloc(P * sizeof *g1), *g2 = ts_malloc(P * sizeof *g2);
  assert_non_null(p1);
  assert_non_null(p2);
  assert_non_null(g1);
  assert_non_null(g2);
  /* The same initial parameters through the flat layout; then bias terms made non-zero. */
  assert_int_equal(ts_seq_get_params(&ref, 0, p1, P), 0);
  assert_int_equal(ts_seq_get_params(&split, 0, p2, P), 0);
  assert_memory_equal(p1, p2, P * sizeof *p1);
  for (size_t i = 0; i < P; i++) p1[i] += 0.01f * ((float)(i % 7) - 3.0f);
  assert_int_equal(ts_seq_set_params(&ref, 0, p1, P), 0);
  assert_int_equal(ts_seq_set_params(&split, 0, p1, P), 0);

  float *x = rand_floats(BATCH * dim, 0.0, 1.0);
  int32_t y[BATCH];
  for (size_t i = 0; i < BATCH; i++) y[i] = (int32_t)(i % ref.desc.classes);
  ts_seq_set_training(&ref, dropout, 5, 9);
  ts_seq_set_training(&split, dropout, 5, 9);
  size_t out_before = reg_a.to_host + reg_b.to_host;
  float l1 = -1, l2 = -2;
  assert_int_equal(ts_seq_forward_backward(&ref, x, y, BATCH, &l1), 0);
  size_t out_ref = reg_a.to_host + reg_b.to_host - out_before;
  assert_int_equal(ts_seq_forward_backward(&split, x, y, BATCH, &l2), 0);
  size_t out_split = reg_a.to_host + reg_b.to_host - out_before - out_ref;
  /* One copy to the host per boundary forward, and one back for each that the backward pass
   * crosses (all of them here: the first layer has parameters). */
  assert_int_equal(out_ref, 0);
  assert_int_equal(out_split, 2 * boundaries);
  if (!(l1 == l2)) fail_msg("cut %s: loss %.9g unsplit, %.9g split", cut, (double)l1, (double)l2);
  assert_int_equal(ts_seq_get_grads(&ref, 0, g1, P), 0);
  assert_int_equal(ts_seq_get_grads(&split, 0, g2, P), 0);
  for (size_t t = 0; t < ref.desc.num_tensors; t++) {
    const ts_layer_tensor_t *tn = &ref.desc.tensors[t];
    if (memcmp(g1 + tn->offset, g2 + tn->offset, tn->count * sizeof(float)) != 0)
      fail_msg("cut %s: gradient of %s differs", cut, tn->name);
  }
  /* Evaluation: dropout off, in chunks of the batch capacity. */
  float a1 = -1, a2 = -2, e1 = -1, e2 = -2;
  float *xe = rand_floats(3 * BATCH * dim, 0.0, 1.0);
  int32_t ye[3 * BATCH];
  for (size_t i = 0; i < 3 * BATCH; i++) ye[i] = (int32_t)((i * 7) % ref.desc.classes);
  assert_int_equal(ts_seq_evaluate(&ref, xe, ye, 3 * BATCH - 1, &a1, &e1), 0);
  assert_int_equal(ts_seq_evaluate(&split, xe, ye, 3 * BATCH - 1, &a2, &e2), 0);
  assert_true(a1 == a2);
  assert_true(e1 == e2);
  /* The flat layout read back across the segments, also from a range that straddles them. */
  assert_int_equal(ts_seq_get_params(&split, 0, p2, P), 0);
  assert_memory_equal(p1, p2, P * sizeof *p1);
  if (P > 4) {
    memset(p2, 0, P * sizeof *p2);
    assert_int_equal(ts_seq_get_params(&split, 1, p2 + 1, P - 2), 0);
    assert_memory_equal(p1 + 1, p2 + 1, (P - 2) * sizeof *p1);
  }
  assert_int_equal(ts_seq_get_params(&split, 1, p2, P), TS_EINVAL);
  assert_int_equal(ts_seq_set_params(&split, P + 1, p1, 0), TS_EINVAL);
  ts_free(xe);
  ts_free(x);
  ts_free(p1);
  ts_free(p2);
  ts_free(g1);
  ts_free(g2);
  ts_seq_destroy(&ref);
  ts_seq_destroy(&split);
  /* Every buffer freed by the table that allocated it. */
  assert_int_equal(reg_a.n, 0);
  assert_int_equal(reg_b.n, 0);
}

static void test_mlp_split(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {dense(16, TS_LAYER_RELU), dense(12, TS_LAYER_TANH),
                         dense(5, TS_LAYER_LINEAR)};
  ts_layer_shape_t in = {1, 1, 20};
  check_split(s, 3, in, "ABB", false);
  check_split(s, 3, in, "AAB", false);
  check_split(s, 3, in, "BAB", false); /* three segments, the last on the first's table */
  check_split(s, 3, in, "BBA", false);
}

/* LeNet-like: conv relu, pool, conv relu (same), pool, flatten, dense relu, dropout, dense. */
static void test_lenet_split(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {conv(4, 3, TS_PAD_VALID),
                         pool2(),
                         conv(6, 3, TS_PAD_SAME),
                         pool2(),
                         {.type = TS_LAYER_FLATTEN},
                         dense(16, TS_LAYER_RELU),
                         {.type = TS_LAYER_DROPOUT, .rate = 0.25},
                         dense(5, TS_LAYER_LINEAR)};
  ts_layer_shape_t in = {14, 14, 1};
  check_split(s, 8, in, "AAAABBBB", true);  /* convs on one device, flatten and dense on another */
  check_split(s, 8, in, "AAAAABBB", true);  /* the boundary after the flatten */
  check_split(s, 8, in, "ABBBBBBB", false); /* after the first convolution */
  check_split(s, 8, in, "AABBBBAA", true);  /* three segments; dropout crossed in the middle */
  check_split(s, 8, in, "AAAAAABB", true);  /* into a dropout layer */
}

/* Refused: a NULL table, more segments than TS_SEQ_SEGMENTS_MAX. */
static void test_split_errors(void **state) {
  (void)state;
  ts_layer_spec_t s[12];
  const ts_kernels_t *lk[12];
  for (size_t i = 0; i < 12; i++) {
    s[i] = dense(4, i == 11 ? TS_LAYER_LINEAR : TS_LAYER_RELU);
    lk[i] = i % 2 ? &table_b : &table_a;
  }
  char err[256] = "";
  ts_seq_t net;
  ts_layer_shape_t in = {1, 1, 4};
  assert_int_equal(ts_seq_init_split(&net, s, 12, in, 4, lk, err, sizeof err), TS_EINVAL);
  assert_non_null(strstr(err, "starts a segment past the 8 a model may have"));
  lk[3] = NULL;
  assert_int_equal(ts_seq_init_split(&net, s, 12, in, 4, lk, err, sizeof err), TS_EINVAL);
  assert_non_null(strstr(err, "no kernels for layer 4 'fc4'"));
  assert_int_equal(reg_a.n + reg_b.n, 0);
  /* Every allocation failing in turn: an error, nothing left on either table. */
  for (size_t i = 0; i < 12; i++) lk[i] = i < 6 ? &table_a : &table_b;
  for (long fail = 1;; fail++) {
    ts_alloc_fail_after(fail);
    int rc = ts_seq_init_split(&net, s, 12, in, 4, lk, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      ts_seq_destroy(&net);
      break;
    }
    assert_int_equal(rc, TS_ENOMEM);
    assert_int_equal(reg_a.n + reg_b.n, 0);
  }
}

/* Two towers whose model is split (each tower's table B, the flagged layers on the CPU back
 * end), against one unsplit model on the whole batch. */
static void test_split_towers(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {conv(3, 3, TS_PAD_SAME),
                         pool2(),
                         {.type = TS_LAYER_FLATTEN},
                         dense(8, TS_LAYER_RELU),
                         dense(4, TS_LAYER_LINEAR)};
  const bool on_cpu[] = {false, false, true, true, true};
  ts_layer_shape_t in = {8, 8, 1};
  const size_t batch = 8, dim = 64;
  const ts_kernels_t *tables[2] = {&table_b, &table_b};
  char err[256] = "";
  ts_towers_t tw;
  assert_int_equal(
      ts_towers_init_seq_split(&tw, tables, 2, s, 5, in, on_cpu, batch / 2, NULL, err, sizeof err),
      0);
  assert_false(tw.zero_copy);
  assert_int_equal(tw.reduce, TS_TOWERS_REDUCE_PINNED);
  assert_true(ts_model_is_split(&tw.models[1]));
  /* White-box: a layer list's engine state is its network (worker/ts_model_seq.c). */
  assert_ptr_equal(((const ts_seq_t *)tw.models[1].impl)->seg[1].kernels, CPU);
  ts_model_t one;
  assert_int_equal(ts_model_init_seq(&one, s, 5, in, batch, CPU, err, sizeof err), 0);
  assert_string_equal(ts_model_engine_name(&one), "layers");
  assert_false(ts_model_is_split(&one));
  assert_int_equal(ts_model_init_params(&one, 2), 0);
  float *x = rand_floats(batch * dim, -1.0, 1.0);
  int32_t y[8];
  for (size_t i = 0; i < batch; i++) y[i] = (int32_t)(i % 4);
  float *const *dst = ts_towers_pull_targets(&tw);
  for (size_t t = 0; t < one.num_tensors; t++)
    memcpy(dst[t], one.params + one.tensors[t].offset, one.tensors[t].count * sizeof(float));
  assert_int_equal(ts_towers_load(&tw, x, y, batch, dim, err, sizeof err), 0);
  assert_int_equal(ts_towers_pulled(&tw, err, sizeof err), 0);
  float lt = 0, l1 = 0;
  assert_int_equal(ts_towers_step(&tw, &lt, err, sizeof err), 0);
  assert_int_equal(ts_model_forward_backward(&one, x, y, batch, &l1), 0);
  assert_true(fabsf(lt - l1) <= 1e-6f * fabsf(l1));
  const float *const *src = ts_towers_push_sources(&tw);
  for (size_t t = 0; t < one.num_tensors; t++)
    for (size_t i = 0; i < one.tensors[t].count; i++) {
      double a = src[t][i], b = one.grads[one.tensors[t].offset + i];
      if (fabs(a - b) > 1e-6 * (1.0 + fabs(b)))
        fail_msg("%s[%zu]: towers %.9g, one model %.9g", one.tensors[t].name, i, a, b);
    }
  ts_free(x);
  ts_model_destroy(&one);
  ts_towers_destroy(&tw);
  assert_int_equal(reg_b.n, 0);
}

int main(void) {
  CPU = ts_kernels_cpu();
  make_table(&table_a, &reg_a);
  make_table(&table_b, &reg_b);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_split),
      cmocka_unit_test(test_lenet_split),
      cmocka_unit_test(test_split_errors),
      cmocka_unit_test(test_split_towers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
