/*
 * The layer description (worker/ts_layers.h) and the network that runs it (worker/ts_seq.h)
 * on the CPU kernels:
 *   - a bad description is refused with the layer's index, name and type and the shape that
 *     does not fit; LeNet-5's shapes, names and parameter count are Keras's;
 *   - the loss gradient with respect to EVERY parameter of small CNNs (conv with both
 *     paddings and strides 1 and 2, odd sizes, max pooling, flatten, dropout with its mask
 *     fixed by the seed, dense layers, tanh and relu) against central finite differences of
 *     the float32 loss;
 *   - dropout's mask: reproducible, of the right rate and scale, off in evaluation;
 *   - a dense-only network computes exactly what the MLP of worker/ts_model.h computes.
 *
 * Finite differences in float32: the loss (about 1) carries a rounding noise of about 1e-7,
 * so a central difference with step h = 1e-3 is good to about 1e-4 absolute, and the
 * truncation error h^2 f''' / 6 is smaller still for these smooth-almost-everywhere networks.
 * Each element must agree within 1e-2 relative plus 2e-4 absolute: a misplaced index or a
 * missing term is off by far more (tens of percent), and per-kernel precision is checked
 * tightly, in double precision, by tests/unit/test_conv.c. Everything is seeded and
 * OPENBLAS_NUM_THREADS is irrelevant at these sizes (one thread's blocking), so the test is
 * deterministic; the step is small enough that on these seeds no difference crosses a ReLU
 * or a pooling tie.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <libconfig.h>

#include "rng_fixture.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_kernels.h"
#include "ts_model.h"
#include "ts_seq.h"

static const ts_kernels_t *K;

static uint64_t rng_state = 0x2545f4914f6cdd1du;

static double urand(void) { return rng_uniform(&rng_state); } /* in [0, 1) */

static float *rand_floats(size_t n, double lo, double hi) {
  float *p = ts_malloc(n * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
  return p;
}

static ts_layer_spec_t conv(size_t filters, size_t k, size_t stride, ts_padding_t pad,
                            ts_layer_act_t act) {
  return (ts_layer_spec_t){.type = TS_LAYER_CONV2D,
                           .filters = filters,
                           .win_h = k,
                           .win_w = k,
                           .stride_h = stride,
                           .stride_w = stride,
                           .padding = pad,
                           .activation = act};
}

static ts_layer_spec_t pool(size_t size, ts_padding_t pad) {
  return (ts_layer_spec_t){.type = TS_LAYER_MAX_POOL, .win_h = size, .win_w = size, .padding = pad};
}

static ts_layer_spec_t dense(size_t units, ts_layer_act_t act) {
  return (ts_layer_spec_t){.type = TS_LAYER_DENSE, .units = units, .activation = act};
}

static const ts_layer_spec_t FLATTEN = {.type = TS_LAYER_FLATTEN};

/* --- the description -------------------------------------------------------------------- */

static void test_lenet5_shapes(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {
      conv(6, 5, 1, TS_PAD_SAME, TS_LAYER_RELU),
      pool(2, 0),
      conv(16, 5, 1, TS_PAD_VALID, TS_LAYER_RELU),
      pool(2, 0),
      FLATTEN,
      dense(120, TS_LAYER_RELU),
      dense(84, TS_LAYER_RELU),
      dense(10, TS_LAYER_LINEAR),
  };
  ts_layers_t l;
  char err[256] = "";
  assert_int_equal(ts_layers_check(s, 8, (ts_layer_shape_t){28, 28, 1}, &l, NULL, err, sizeof err),
                   0);
  static const size_t want[][3] = {{28, 28, 6}, {14, 14, 6}, {10, 10, 16}, {5, 5, 16},
                                   {1, 1, 400}, {1, 1, 120}, {1, 1, 84},   {1, 1, 10}};
  static const char *names[] = {"conv1",    "pool1", "conv2", "pool2",
                                "flatten1", "fc1",   "fc2",   "fc3"};
  for (size_t i = 0; i < 8; i++) {
    assert_string_equal(l.layers[i].spec.name, names[i]);
    assert_int_equal(l.layers[i].out.h, want[i][0]);
    assert_int_equal(l.layers[i].out.w, want[i][1]);
    assert_int_equal(l.layers[i].out.c, want[i][2]);
  }
  assert_int_equal(l.layers[1].spec.stride_h, 2); /* max_pool strides default to its size */
  assert_int_equal(l.num_tensors, 10);
  assert_string_equal(l.tensors[0].name, "conv1/kernel");
  assert_int_equal(l.tensors[0].rank, 4);
  assert_int_equal(l.tensors[0].shape[0], 5);
  assert_int_equal(l.tensors[0].shape[2], 1);
  assert_int_equal(l.tensors[0].shape[3], 6);
  assert_string_equal(l.tensors[3].name, "conv2/bias");
  assert_string_equal(l.tensors[4].name, "fc1/kernel");
  assert_int_equal(l.tensors[4].shape[0], 400);
  /* Keras's model.count_params() for this model */
  assert_int_equal(l.param_count, 156 + 2416 + 48120 + 10164 + 850);
  assert_int_equal(l.classes, 10);
  assert_int_equal(l.max_elems, 28 * 28 * 6);
  ts_layers_free(&l);
}

static void expect_error(const ts_layer_spec_t *s, size_t n, ts_layer_shape_t in,
                         const char *want) {
  ts_layers_t l;
  char err[256] = "";
  size_t bad = 1000;
  assert_int_equal(ts_layers_check(s, n, in, &l, &bad, err, sizeof err), TS_EINVAL);
  if (!strstr(err, want)) fail_msg("error '%s' does not contain '%s'", err, want);
  assert_null(l.layers);
  /* the layer at fault is the one the message names ("layer 3 ..."), else none (n) */
  unsigned named = 0;
  if (sscanf(want, "layer %u", &named) == 1)
    assert_int_equal(bad, named - 1);
  else
    assert_int_equal(bad, n);
}

/* A job file's list, through the parser and the check: the error names the file and line
 * of the layer at fault. */
static void test_config_to_check(void **state) {
  (void)state;
  const char *text =
      "model = {\n"
      "  layers = (\n"
      "    { type = \"conv2d\"; filters = 6; kernel = 5; activation = \"relu\"; },\n"
      "    { type = \"max_pool\"; size = [8, 8]; },\n"
      "    { type = \"conv2d\"; filters = 16; kernel = 5; padding = \"valid\"; },\n"
      "    { type = \"flatten\"; },\n"
      "    { type = \"dense\"; units = 10; }\n"
      "  );\n"
      "};\n";
  config_t c;
  config_init(&c);
  assert_int_equal(config_read_string(&c, text), CONFIG_TRUE);
  ts_config_layer_t cl[8];
  ts_layer_spec_t specs[8];
  size_t n = 0, bad = 0;
  char err[256] = "";
  assert_int_equal(ts_config_layers_parse(config_lookup(&c, "model.layers"), "lenet.cfg", cl, 8, &n,
                                          err, sizeof err),
                   0);
  config_destroy(&c);
  assert_int_equal(n, 5);
  assert_int_equal(ts_layers_from_config(cl, n, specs, err, sizeof err), 0);
  assert_int_equal(specs[1].win_h, 8);
  assert_int_equal(specs[0].padding, 0); /* omitted: valid by default */
  ts_layers_t l;
  assert_int_equal(
      ts_layers_check(specs, n, (ts_layer_shape_t){28, 28, 1}, &l, &bad, err, sizeof err),
      TS_EINVAL);
  assert_int_equal(bad, 2);
  char full[600];
  snprintf(full, sizeof full, "%s: %s", cl[bad].where, err);
  assert_string_equal(full,
                      "lenet.cfg:5: layer 3 'conv2' (conv2d): kernel 5x5 does not fit its "
                      "3x3x6 input with padding valid (use padding same, or a smaller "
                      "kernel)");
  /* a string the parser would refuse, in a list built by hand */
  strcpy(cl[0].padding, "full");
  assert_int_equal(ts_layers_from_config(cl, n, specs, err, sizeof err), TS_EINVAL);
  assert_string_equal(err, "lenet.cfg:3: layer 1: padding");
}

static void test_bad_descriptions(void **state) {
  (void)state;
  ts_layer_shape_t mnist = {28, 28, 1};
  ts_layer_spec_t s[6];
  /* a kernel larger than its input */
  s[0] = conv(6, 5, 1, TS_PAD_VALID, TS_LAYER_RELU);
  s[1] = pool(8, TS_PAD_VALID);
  s[2] = conv(8, 5, 1, TS_PAD_VALID, TS_LAYER_RELU);
  s[3] = FLATTEN;
  s[4] = dense(10, TS_LAYER_LINEAR);
  expect_error(s, 5, mnist,
               "layer 3 'conv2' (conv2d): kernel 5x5 does not fit its 3x3x6 input with padding "
               "valid");
  /* a dense layer on an image */
  s[2] = dense(10, TS_LAYER_LINEAR);
  expect_error(s, 3, mnist, "layer 3 'fc1' (dense): needs a flat input but gets 3x3x6");
  /* an unknown layer type */
  s[2] = (ts_layer_spec_t){.type = (ts_layer_type_t)42};
  expect_error(s, 3, mnist, "layer 3: unknown layer type 42");
  /* the model must end in linear logits */
  s[2] = FLATTEN;
  s[3] = dense(10, TS_LAYER_RELU);
  expect_error(s, 4, mnist, "layer 4 'fc1' (dense): the last layer gives the logits");
  s[3] = (ts_layer_spec_t){.type = TS_LAYER_DROPOUT, .rate = 0.5};
  expect_error(s, 4, mnist, "layer 4 'dropout1' (dropout): the last layer gives the logits");
  /* a convolution after flatten, a rate of 1, an activation on a pooling layer, a name twice */
  s[3] = conv(3, 1, 1, TS_PAD_VALID, TS_LAYER_RELU);
  expect_error(s, 4, mnist, "layer 4 'conv2' (conv2d): needs an image input but gets a flat");
  s[3] = (ts_layer_spec_t){.type = TS_LAYER_DROPOUT, .rate = 1.0};
  expect_error(s, 4, mnist, "layer 4 'dropout1' (dropout): rate = 1 outside [0, 1)");
  s[1].activation = TS_LAYER_RELU;
  expect_error(s, 2, mnist, "layer 2 'pool1' (max_pool): has no activation (it is relu)");
  s[1] = pool(2, 0);
  strcpy(s[1].name, "conv1");
  expect_error(s, 2, mnist, "layer 2 'conv1' (max_pool): layer 1 has the same name");
  s[1] = dense(0, TS_LAYER_LINEAR);
  s[0] = FLATTEN;
  expect_error(s, 2, mnist, "layer 2 'fc1' (dense): units = 0 outside");
  s[0] = conv(0, 3, 1, TS_PAD_SAME, TS_LAYER_LINEAR);
  expect_error(s, 1, mnist, "layer 1 'conv1' (conv2d): filters = 0 outside");
  s[0] = FLATTEN;
  memset(s[0].name, 'x', sizeof s[0].name);
  expect_error(s, 1, mnist, "layer 1: a name of 48 characters or more");
  strcpy(s[0].name, "a/b");
  expect_error(s, 1, mnist, "layer 1 'a/b' (flatten): a name may not contain");
  s[0] = conv(0, 3, 1, TS_PAD_SAME, TS_LAYER_LINEAR);
  expect_error(s, 0, mnist, "model: 0 layers");
  expect_error(s, 1, (ts_layer_shape_t){0, 28, 1}, "model: input 0x28x1");
  /* a back end without the kernels a layer needs */
  ts_kernels_t no_conv = *K;
  no_conv.conv2d_fwd = NULL;
  ts_layer_spec_t ok[] = {conv(2, 3, 1, TS_PAD_SAME, TS_LAYER_RELU), FLATTEN,
                          dense(3, TS_LAYER_LINEAR)};
  ts_seq_t net;
  char err[256] = "";
  assert_int_equal(
      ts_seq_init(&net, ok, 3, (ts_layer_shape_t){5, 5, 1}, 4, &no_conv, err, sizeof err),
      TS_EINVAL);
  assert_non_null(strstr(err, "no conv2d kernel for layer 1 'conv1' (conv2d)"));
  assert_null(net.params);
}

/* --- gradients ---------------------------------------------------------------------------- */

/* Every parameter's gradient against central differences of the float32 loss. A max-pool
 * window whose two largest inputs lie within the step h of each other switches its argmax
 * inside [p - h, p + h], and a ReLU input that close to 0 changes sides: the loss has a kink
 * there and the central difference averages two slopes, so it lies half their difference
 * away from the gradient. Such a point is recognised by its one-sided differences disagreeing
 * by more than the tolerance (not twice it: the float loss's rounding over h moves each
 * one-sided difference by ~1e-4, so a kink whose half-jump is near the tolerance would be
 * taken for a wrong gradient or not by the rounding of the forward pass), and then the
 * gradient must equal the one-sided difference of the side the kink is not on (to within that
 * rounding); at most a twentieth of the parameters may be such points. */
static void check_net_gradient(const ts_layer_spec_t *s, size_t n, ts_layer_shape_t in,
                               size_t batch, bool training) {
  ts_seq_t net;
  char err[256] = "";
  int rc = ts_seq_init(&net, s, n, in, batch, K, err, sizeof err);
  if (rc != 0) fail_msg("ts_seq_init: %s", err);
  /* A generic point, not the initial one: weights in [-0.5, 0.5) and biases away from zero.
   * (Glorot's limits for the small kernels here are 0.2 to 0.4, which puts many ReLU
   * inputs and max-pool pairs within the step h of a kink, where a central difference
   * averages two slopes.) */
  for (size_t t = 0; t < net.desc.num_tensors; t++) {
    double span = net.desc.tensors[t].init == TS_INIT_ZEROS ? 0.2 : 1.0;
    for (size_t j = 0; j < net.desc.tensors[t].count; j++)
      net.params[net.desc.tensors[t].offset + j] = (float)(span * (urand() - 0.5));
  }
  ts_seq_set_training(&net, training, 5, 3);
  size_t elems = ts_layers_elems(in);
  float *x = rand_floats(batch * elems, -1.0, 1.0);
  int32_t labels[16];
  for (size_t i = 0; i < batch; i++) labels[i] = (int32_t)(i % net.desc.classes);
  float loss = 0.0f;
  assert_int_equal(ts_seq_forward_backward(&net, x, labels, batch, &loss), 0);
  assert_true(isfinite(loss) && loss > 0.0f);
  size_t P = net.desc.param_count;
  float *g = ts_malloc(P * sizeof *g);
  assert_non_null(g);
  memcpy(g, net.grads, P * sizeof *g);
  const float h = 1e-3f;
  float at = 0.0f;
  assert_int_equal(ts_seq_loss(&net, x, labels, batch, &at), 0);
  double worst = 0.0;
  size_t kinks = 0;
  for (size_t t = 0; t < net.desc.num_tensors; t++) {
    const ts_layer_tensor_t *tn = &net.desc.tensors[t];
    for (size_t j = 0; j < tn->count; j++) {
      float *p = &net.params[tn->offset + j], keep = *p;
      float up = 0.0f, down = 0.0f;
      *p = keep + h;
      assert_int_equal(ts_seq_loss(&net, x, labels, batch, &up), 0);
      *p = keep - h;
      assert_int_equal(ts_seq_loss(&net, x, labels, batch, &down), 0);
      *p = keep;
      double fd = ((double)up - (double)down) / (2.0 * (double)h), an = g[tn->offset + j];
      double diff = fabs(fd - an), lim = 2e-4 + 1e-2 * fmax(fabs(fd), fabs(an));
      if (!(diff <= lim)) {
        double right = ((double)up - (double)at) / (double)h;
        double left = ((double)at - (double)down) / (double)h;
        double side = 3e-4 + 2e-2 * fmax(fabs(right), fabs(left));
        bool kink =
            fabs(right - left) > lim && (fabs(an - right) <= side || fabs(an - left) <= side);
        if (!kink)
          fail_msg("%s[%zu]: backprop %.7g, finite difference %.7g (|diff| %.3g > %.3g; one-sided "
                   "%.7g and %.7g)",
                   tn->name, j, an, fd, diff, lim, left, right);
        kinks++;
        continue;
      }
      if (diff / lim > worst) worst = diff / lim;
    }
  }
  print_message("  %zu parameters, loss %.5f, worst |diff| / limit %.3f, %zu at a kink\n", P,
                (double)loss, worst, kinks);
  assert_true(kinks <= P / 20);
  ts_free(g);
  ts_free(x);
  ts_seq_destroy(&net);
}

/* conv same stride 1 on an odd 9x7 input with 2 channels, pooling with same padding on an
 * odd size, conv valid stride 2 with a non-square kernel, dropout, two dense layers. */
static void test_gradient_small_cnn_tanh(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {
      conv(3, 3, 1, TS_PAD_SAME, TS_LAYER_TANH),
      pool(2, TS_PAD_SAME),
      {.type = TS_LAYER_CONV2D,
       .filters = 4,
       .win_h = 3,
       .win_w = 2,
       .stride_h = 2,
       .stride_w = 2,
       .padding = TS_PAD_VALID,
       .activation = TS_LAYER_TANH},
      FLATTEN,
      {.type = TS_LAYER_DROPOUT, .rate = 0.3},
      dense(6, TS_LAYER_TANH),
      dense(3, TS_LAYER_LINEAR),
  };
  check_net_gradient(s, 7, (ts_layer_shape_t){9, 7, 2}, 3, true);
}

/* ReLU, conv same with stride 2, valid pooling with overlapping 3x3 windows at stride 2,
 * a conv valid at stride 1 after it, no dropout. */
static void test_gradient_small_cnn_relu(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {
      conv(4, 3, 2, TS_PAD_SAME, TS_LAYER_RELU),
      {.type = TS_LAYER_MAX_POOL,
       .win_h = 3,
       .win_w = 3,
       .stride_h = 1,
       .stride_w = 1,
       .padding = TS_PAD_VALID},
      conv(3, 2, 1, TS_PAD_VALID, TS_LAYER_RELU),
      FLATTEN,
      dense(4, TS_LAYER_RELU),
      dense(3, TS_LAYER_LINEAR),
  };
  check_net_gradient(s, 6, (ts_layer_shape_t){11, 9, 3}, 4, false);
}

/* A dropout layer right after the input and a dense-only network (no image layers). */
static void test_gradient_dense_dropout(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {
      FLATTEN,
      {.type = TS_LAYER_DROPOUT, .rate = 0.5},
      dense(7, TS_LAYER_TANH),
      {.type = TS_LAYER_DROPOUT, .rate = 0.25},
      dense(4, TS_LAYER_LINEAR),
  };
  check_net_gradient(s, 5, (ts_layer_shape_t){3, 2, 2}, 5, true);
}

/* --- dropout ------------------------------------------------------------------------------ */

static void test_dropout_mask(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {{.type = TS_LAYER_DROPOUT, .rate = 0.25}, dense(3, TS_LAYER_LINEAR)};
  ts_seq_t net;
  size_t B = 50, D = 200;
  assert_int_equal(ts_seq_init(&net, s, 2, (ts_layer_shape_t){1, 1, D}, B, K, NULL, 0), 0);
  assert_int_equal(ts_seq_init_params(&net, 1), 0);
  float *x = rand_floats(B * D, -1.0, 1.0);
  int32_t labels[50] = {0};
  float off = 0, on1 = 0, on2 = 0, other = 0, eval = 0;
  assert_int_equal(ts_seq_loss(&net, x, labels, B, &off), 0);
  ts_seq_set_training(&net, true, 9, 1);
  assert_int_equal(ts_seq_loss(&net, x, labels, B, &on1), 0);
  /* the mask: zeros or 1 / (1 - rate), about a quarter of them zeros */
  size_t zeros = 0;
  for (size_t i = 0; i < B * D; i++) {
    float m = net.mask[0][i];
    assert_true(m == 0.0f || m == (float)(1.0 / 0.75));
    zeros += m == 0.0f;
  }
  double frac = (double)zeros / (double)(B * D); /* 10000 draws: sd 0.0043 */
  if (fabs(frac - 0.25) > 0.02) fail_msg("dropped fraction %.4f, want 0.25", frac);
  assert_int_equal(ts_seq_loss(&net, x, labels, B, &on2), 0);
  assert_true(on1 == on2); /* same seed and stream: same mask */
  ts_seq_set_training(&net, true, 9, 2);
  assert_int_equal(ts_seq_loss(&net, x, labels, B, &other), 0);
  assert_true(other != on1);
  assert_true(on1 != off);
  /* evaluation switches dropout off and leaves training mode as it was */
  assert_int_equal(ts_seq_evaluate(&net, x, labels, B, NULL, &eval), 0);
  assert_true(fabsf(eval - off) <= 1e-6f * fabsf(off));
  assert_true(net.training);
  ts_free(x);
  ts_seq_destroy(&net);
}

/* --- the MLP as layers --------------------------------------------------------------------- */

static void test_dense_net_equals_mlp(void **state) {
  (void)state;
  const int widths[] = {20, 16, 12, 5};
  ts_model_t mlp;
  assert_int_equal(ts_model_init(&mlp, widths, 4, TS_ACT_TANH, 8, K, NULL, 0), 0);
  assert_int_equal(ts_model_init_params(&mlp, 3), 0);
  ts_layer_spec_t s[] = {dense(16, TS_LAYER_TANH), dense(12, TS_LAYER_TANH),
                         dense(5, TS_LAYER_LINEAR)};
  ts_seq_t net;
  assert_int_equal(ts_seq_init(&net, s, 3, (ts_layer_shape_t){1, 1, 20}, 8, K, NULL, 0), 0);
  /* the same layout: kernel [in, out] then bias, layer after layer */
  assert_int_equal(net.desc.param_count, mlp.param_count);
  for (size_t t = 0; t < net.desc.num_tensors; t++) {
    assert_int_equal(net.desc.tensors[t].offset, mlp.tensors[t].offset);
    assert_int_equal(net.desc.tensors[t].count, mlp.tensors[t].count);
  }
  memcpy(net.params, mlp.params, mlp.param_count * sizeof(float));
  float *x = rand_floats(8 * 20, 0.0, 1.0);
  int32_t labels[8] = {0, 1, 2, 3, 4, 0, 1, 2};
  float l1 = 0, l2 = 0, a1 = 0, a2 = 0;
  assert_int_equal(ts_model_forward_backward(&mlp, x, labels, 8, &l1), 0);
  assert_int_equal(ts_seq_forward_backward(&net, x, labels, 8, &l2), 0);
  assert_true(l1 == l2);
  assert_memory_equal(mlp.grads, net.grads, mlp.param_count * sizeof(float));
  assert_int_equal(ts_model_evaluate(&mlp, x, labels, 8, &a1, &l1), 0);
  assert_int_equal(ts_seq_evaluate(&net, x, labels, 8, &a2, &l2), 0);
  assert_true(a1 == a2 && l1 == l2);
  /* bad input is refused, not computed */
  labels[3] = 5;
  assert_int_equal(ts_seq_forward_backward(&net, x, labels, 8, &l2), TS_EINVAL);
  assert_int_equal(ts_seq_forward_backward(&net, x, labels, 9, &l2), TS_EINVAL);
  ts_free(x);
  ts_seq_destroy(&net);
  ts_model_destroy(&mlp);
}

/* A back end without the fused bias + ReLU kernels (the CUDA back end) runs the separate
 * kernels: the same loss and gradients, and the same outputs of ts_seq_evaluate. */
static void test_fused_equals_unfused(void **state) {
  (void)state;
  ts_kernels_t plain = *K;
  plain.bias_relu = NULL;
  plain.relu_bwd_bias_grad = NULL;
  ts_layer_spec_t s[] = {conv(3, 3, 1, TS_PAD_SAME, TS_LAYER_RELU),
                         pool(2, 0),
                         conv(4, 3, 1, TS_PAD_VALID, TS_LAYER_RELU),
                         FLATTEN,
                         dense(6, TS_LAYER_RELU),
                         dense(3, TS_LAYER_LINEAR)};
  ts_seq_t a, b;
  ts_layer_shape_t in = {8, 9, 1};
  assert_int_equal(ts_seq_init(&a, s, 6, in, 5, K, NULL, 0), 0);
  assert_int_equal(ts_seq_init(&b, s, 6, in, 5, &plain, NULL, 0), 0);
  assert_int_equal(ts_seq_init_params(&a, 11), 0);
  assert_int_equal(ts_seq_init_params(&b, 11), 0);
  assert_null(a.z[0]); /* fused: the product goes straight into a[0] */
  assert_non_null(b.z[0]);
  float *x = rand_floats(5 * 72, -1.0, 1.0);
  int32_t labels[5] = {0, 1, 2, 0, 1};
  float la = 0, lb = 0, acc_a = 0, acc_b = 0;
  assert_int_equal(ts_seq_forward_backward(&a, x, labels, 5, &la), 0);
  assert_int_equal(ts_seq_forward_backward(&b, x, labels, 5, &lb), 0);
  assert_true(la == lb);
  for (size_t i = 0; i < a.desc.param_count; i++)
    if (fabsf(a.grads[i] - b.grads[i]) > 1e-6f + 1e-5f * fabsf(b.grads[i]))
      fail_msg("gradient %zu: fused %.9g, separate %.9g", i, (double)a.grads[i],
               (double)b.grads[i]);
  assert_int_equal(ts_seq_evaluate(&a, x, labels, 5, &acc_a, &la), 0);
  assert_int_equal(ts_seq_evaluate(&b, x, labels, 5, &acc_b, &lb), 0);
  assert_true(acc_a == acc_b && la == lb);
  ts_free(x);
  ts_seq_destroy(&a);
  ts_seq_destroy(&b);
}

/* Every allocation of init failing in turn: an error, nothing leaked (ASan's leak check). */
static void test_alloc_failures(void **state) {
  (void)state;
  ts_layer_spec_t s[] = {conv(2, 3, 1, TS_PAD_SAME, TS_LAYER_RELU),
                         pool(2, 0),
                         FLATTEN,
                         {.type = TS_LAYER_DROPOUT, .rate = 0.5},
                         dense(3, TS_LAYER_LINEAR)};
  for (long fail = 1;; fail++) {
    ts_seq_t net;
    char err[256] = "";
    ts_alloc_fail_after(fail);
    int rc = ts_seq_init(&net, s, 5, (ts_layer_shape_t){6, 6, 1}, 4, K, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      assert_true(fail > 10);
      ts_seq_destroy(&net);
      break;
    }
    assert_int_equal(rc, TS_ENOMEM);
    assert_true(err[0] != '\0');
    assert_null(net.params);
  }
}

int main(void) {
  K = ts_kernels_cpu();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lenet5_shapes),
      cmocka_unit_test(test_bad_descriptions),
      cmocka_unit_test(test_config_to_check),
      cmocka_unit_test(test_gradient_small_cnn_tanh),
      cmocka_unit_test(test_gradient_small_cnn_relu),
      cmocka_unit_test(test_gradient_dense_dropout),
      cmocka_unit_test(test_dropout_mask),
      cmocka_unit_test(test_dense_net_equals_mlp),
      cmocka_unit_test(test_fused_equals_unfused),
      cmocka_unit_test(test_alloc_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
