/*
 * The model: the argument contract, the tensor and op lists the worker declares and logs,
 * whole-model gradients against central finite differences (logistic regression, 2- and
 * 3-layer MLPs, relu and tanh), chunked evaluation, and allocation failures.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rng_fixture.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_model.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static double urand(void) { return rng_uniform(&rng_state); } /* in [0, 1) */

static float frand(float lo, float hi) {
  return lo + (hi - lo) * (float)urand();
}

static void test_invalid_arguments(void **state) {
  (void)state;
  const ts_kernels_t *k = ts_kernels_cpu();
  ts_model_t m;
  char err[256] = "";
  int one[1] = {5}, zero_w[3] = {5, 0, 3}, ok[2] = {4, 3};
  assert_int_equal(ts_model_init(&m, one, 1, TS_ACT_RELU, 8, k, err, sizeof err), TS_EINVAL);
  assert_non_null(strstr(err, "model.layers"));
  assert_int_equal(ts_model_init(&m, zero_w, 3, TS_ACT_RELU, 8, k, err, sizeof err), TS_EINVAL);
  assert_non_null(strstr(err, "model.layers[1] = 0"));
  assert_int_equal(ts_model_init(&m, ok, 2, (ts_activation_t)7, 8, k, err, sizeof err), TS_EINVAL);
  assert_non_null(strstr(err, "activation"));
  assert_int_equal(ts_model_init(&m, ok, 2, TS_ACT_RELU, 0, k, err, sizeof err), TS_EINVAL);
  assert_int_equal(ts_model_init(&m, ok, 2, TS_ACT_RELU, 8, NULL, err, sizeof err), TS_EINVAL);
  assert_int_equal(ts_model_init(&m, ok, 2, TS_ACT_RELU, 8, k, NULL, 0), 0);

  float x[2 * 4] = {0};
  int32_t lab[2] = {0, 3}; /* 3 is outside [0, 3) */
  float loss = 0.0f, acc = 0.0f;
  assert_int_equal(ts_model_init_params(&m, 1), 0);
  assert_int_equal(ts_model_forward_backward(&m, x, lab, 2, &loss), TS_EINVAL);
  lab[1] = 2;
  assert_int_equal(ts_model_forward_backward(&m, x, lab, 0, &loss), TS_EINVAL);
  assert_int_equal(ts_model_forward_backward(&m, x, lab, 9, &loss), TS_EINVAL);
  assert_int_equal(ts_model_forward_backward(&m, NULL, lab, 2, &loss), TS_EINVAL);
  assert_int_equal(ts_model_forward_backward(&m, x, lab, 2, &loss), 0);
  /* all-zero input and zero biases: uniform softmax, loss = log 3 */
  assert_true(fabs((double)loss - log(3.0)) < 1e-6);
  assert_int_equal(ts_model_evaluate(&m, x, lab, 0, &acc, &loss), TS_EINVAL);
  float p[4];
  assert_int_equal(ts_model_get_params(&m, m.param_count - 3, p, 4), TS_EINVAL);
  assert_int_equal(ts_model_set_params(&m, m.param_count + 1, p, 0), TS_EINVAL);
  assert_int_equal(ts_model_get_grads(&m, m.param_count - 4, p, 4), 0);
  assert_string_equal(ts_model_engine_name(&m), "mlp");
  assert_false(ts_model_is_split(&m));
  ts_model_set_dropout(&m, 1, 2); /* the MLP has no dropout: nothing to do */
  ts_model_destroy(&m);
  ts_model_destroy(&m); /* safe on a zeroed struct */
  /* A zeroed model has no engine: every call is refused, none reaches an engine. */
  assert_string_equal(ts_model_engine_name(&m), "");
  assert_false(ts_model_is_split(&m));
  assert_int_equal(ts_model_synchronize(&m), 0);
  assert_int_equal(ts_model_init_params(&m, 1), TS_EINVAL);
  assert_int_equal(ts_model_set_params(&m, 0, p, 0), TS_EINVAL);
  assert_int_equal(ts_model_get_params(&m, 0, p, 1), TS_EINVAL);
  assert_int_equal(ts_model_load_batch(&m, x, lab, 1), TS_EINVAL);
  assert_int_equal(ts_model_compute(&m, 1, &loss), TS_EINVAL);
  assert_int_equal(ts_model_evaluate(&m, x, lab, 1, &acc, &loss), TS_EINVAL);
  assert_int_equal(ts_model_find_tensor(&m, "fc1/weights"), -1);

  ts_activation_t act;
  assert_true(ts_model_parse_activation("tanh", &act));
  assert_int_equal(act, TS_ACT_TANH);
  assert_true(ts_model_parse_activation("relu", &act));
  assert_int_equal(act, TS_ACT_RELU);
  assert_false(ts_model_parse_activation("sigmoid", &act));
  assert_string_equal(ts_model_activation_name(TS_ACT_TANH), "tanh");
}

static void test_tensors_and_ops(void **state) {
  (void)state;
  ts_model_t m;
  int widths[3] = {784, 256, 10};
  assert_int_equal(ts_model_init(&m, widths, 3, TS_ACT_RELU, 64, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(m.num_tensors, 4);
  const char *names[4] = {"fc1/weights", "fc1/biases", "fc2/weights", "fc2/biases"};
  size_t counts[4] = {784 * 256, 256, 256 * 10, 10}, offset = 0;
  for (size_t t = 0; t < 4; t++) {
    const ts_model_tensor_t *tn = &m.tensors[t];
    assert_string_equal(tn->name, names[t]);
    assert_int_equal(tn->count, counts[t]);
    assert_int_equal(tn->offset, offset);
    assert_int_equal(tn->rank, t % 2 == 0 ? 2 : 1);
    assert_int_equal(tn->init, t % 2 == 0 ? TS_INIT_GLOROT_UNIFORM : TS_INIT_ZEROS);
    assert_int_equal(ts_model_find_tensor(&m, names[t]), (long)t);
    offset += counts[t];
  }
  assert_int_equal(m.tensors[0].shape[0], 784);
  assert_int_equal(m.tensors[0].shape[1], 256);
  assert_int_equal(m.tensors[3].shape[0], 10);
  assert_int_equal(m.param_count, offset);
  assert_int_equal(ts_model_find_tensor(&m, "fc3/weights"), -1);

  /* One op per placement line, TensorFlow's names and types. */
  static const char *want[][2] = {
      {"fc1/matmul", "MatMul"},
      {"fc1/bias_add", "BiasAdd"},
      {"fc1/relu", "Relu"},
      {"fc2/matmul", "MatMul"},
      {"fc2/bias_add", "BiasAdd"},
      {"loss/softmax_xent", "SoftmaxCrossEntropyWithLogits"},
      {"gradients/loss/softmax_xent_grad", "SoftmaxCrossEntropyWithLogitsGrad"},
      {"gradients/fc2/matmul_grad/MatMul_1", "MatMul"},
      {"gradients/fc2/bias_add_grad/BiasAddGrad", "BiasAddGrad"},
      {"gradients/fc2/matmul_grad/MatMul", "MatMul"},
      {"gradients/fc1/relu_grad/ReluGrad", "ReluGrad"},
      {"gradients/fc1/matmul_grad/MatMul_1", "MatMul"},
      {"gradients/fc1/bias_add_grad/BiasAddGrad", "BiasAddGrad"},
      {"accuracy/argmax", "ArgMax"},
  };
  assert_int_equal(m.num_ops, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < m.num_ops; i++) {
    assert_string_equal(m.ops[i].name, want[i][0]);
    assert_string_equal(m.ops[i].type, want[i][1]);
  }
  assert_int_equal(m.ops[0].phase, TS_OP_PHASE_FORWARD);
  assert_int_equal(m.ops[6].phase, TS_OP_PHASE_BACKWARD);
  assert_int_equal(m.ops[13].phase, TS_OP_PHASE_EVAL);
  ts_model_destroy(&m);

  /* logistic regression: no activation op at all; tanh names */
  int lr[2] = {784, 10};
  assert_int_equal(ts_model_init(&m, lr, 2, TS_ACT_TANH, 8, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(m.num_tensors, 2);
  assert_int_equal(m.num_ops, 7);
  for (size_t i = 0; i < m.num_ops; i++) {
    assert_null(strstr(m.ops[i].type, "Tanh"));
    assert_null(strstr(m.ops[i].type, "Relu"));
  }
  ts_model_destroy(&m);
  int deep[4] = {8, 6, 5, 3};
  assert_int_equal(ts_model_init(&m, deep, 4, TS_ACT_TANH, 8, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(m.num_ops, 21);
  assert_string_equal(m.ops[2].name, "fc1/tanh");
  assert_string_equal(m.ops[2].type, "Tanh");
  ts_model_destroy(&m);
}

/* Initial parameters equal what the parameter servers would create from (seed, name). */
static void test_init_params_match_ts_init(void **state) {
  (void)state;
  ts_model_t m;
  int widths[3] = {7, 5, 3};
  assert_int_equal(ts_model_init(&m, widths, 3, TS_ACT_RELU, 4, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(ts_model_init_params(&m, 42), 0);
  for (size_t t = 0; t < m.num_tensors; t++) {
    const ts_model_tensor_t *tn = &m.tensors[t];
    float want[35], got[35];
    ts_init_fill(want, tn->init, 42, tn->name, tn->shape, tn->rank, 0, tn->count);
    assert_int_equal(ts_model_get_params(&m, tn->offset, got, tn->count), 0);
    assert_memory_equal(want, got, tn->count * sizeof(float));
  }
  ts_model_destroy(&m);
}

/* --- whole-model finite differences ------------------------------------------------------- */

static float loss_at(ts_model_t *m, const float *x, const int32_t *lab, size_t batch) {
  float loss = NAN;
  assert_int_equal(ts_model_forward_backward(m, x, lab, batch, &loss), 0);
  return loss;
}

static void check_model_gradients(const int *widths, size_t n, ts_activation_t act) {
  const size_t batch = 3;
  ts_model_t m;
  char err[256] = "";
  assert_int_equal(ts_model_init(&m, widths, n, act, batch, ts_kernels_cpu(), err, sizeof err), 0);
  /* Well-conditioned values: weights and biases of order 0.5, inputs in [-1, 1]. */
  size_t P = m.param_count, in = (size_t)widths[0], classes = (size_t)widths[n - 1];
  float *params = ts_malloc(P * sizeof *params), *grads = ts_malloc(P * sizeof *grads);
  float *x = ts_malloc(batch * in * sizeof *x);
  int32_t lab[3];
  assert_non_null(params);
  assert_non_null(grads);
  assert_non_null(x);
  for (size_t i = 0; i < P; i++) params[i] = frand(-0.8f, 0.8f);
  for (size_t i = 0; i < batch * in; i++) x[i] = frand(-1.0f, 1.0f);
  for (size_t i = 0; i < batch; i++) lab[i] = (int32_t)((i * 2 + 1) % classes);
  assert_int_equal(ts_model_set_params(&m, 0, params, P), 0);
  (void)loss_at(&m, x, lab, batch);
  assert_int_equal(ts_model_get_grads(&m, 0, grads, P), 0);

  const float eps = 1e-2f;
  size_t checked = 0;
  for (size_t i = 0; i < P; i++) {
    float keep = params[i];
    float v = keep + eps;
    assert_int_equal(ts_model_set_params(&m, i, &v, 1), 0);
    double up = (double)loss_at(&m, x, lab, batch);
    v = keep - eps;
    assert_int_equal(ts_model_set_params(&m, i, &v, 1), 0);
    double down = (double)loss_at(&m, x, lab, batch);
    assert_int_equal(ts_model_set_params(&m, i, &keep, 1), 0);
    double numeric = (up - down) / (2.0 * (double)eps);
    /* For relu, a step that moves a pre-activation across 0 makes the difference one-sided;
     * halving the step must then agree with the full one, else the point is skipped. */
    if (act == TS_ACT_RELU && n > 2) {
      float h = eps / 2.0f;
      v = keep + h;
      assert_int_equal(ts_model_set_params(&m, i, &v, 1), 0);
      double up2 = (double)loss_at(&m, x, lab, batch);
      v = keep - h;
      assert_int_equal(ts_model_set_params(&m, i, &v, 1), 0);
      double down2 = (double)loss_at(&m, x, lab, batch);
      assert_int_equal(ts_model_set_params(&m, i, &keep, 1), 0);
      double numeric2 = (up2 - down2) / (2.0 * (double)h);
      if (fabs(numeric2 - numeric) > 1e-2 * fabs(numeric) + 1e-3) continue;
    }
    double a = (double)grads[i], diff = fabs(a - numeric);
    double lim = 1e-2 * fmax(fabs(a), fabs(numeric)) + 1e-3;
    if (diff > lim) {
      long t = 0;
      for (size_t j = 0; j < m.num_tensors; j++)
        if (i >= m.tensors[j].offset) t = (long)j;
      fail_msg("layers n=%zu %s: %s[%zu]: analytic %.6g, numeric %.6g (|diff| %.3g > %.3g)", n,
               ts_model_activation_name(act), m.tensors[t].name, i - m.tensors[t].offset, a,
               numeric, diff, lim);
    }
    checked++;
  }
  /* the kink guard must leave almost everything checked */
  assert_true(checked * 10 >= P * 9);
  ts_free(params);
  ts_free(grads);
  ts_free(x);
  ts_model_destroy(&m);
}

static void test_fd_logistic_regression(void **state) {
  (void)state;
  int w[2] = {6, 4};
  check_model_gradients(w, 2, TS_ACT_RELU);
}

static void test_fd_two_layer_relu(void **state) {
  (void)state;
  int w[3] = {5, 4, 3};
  check_model_gradients(w, 3, TS_ACT_RELU);
}

static void test_fd_two_layer_tanh(void **state) {
  (void)state;
  int w[3] = {5, 4, 3};
  check_model_gradients(w, 3, TS_ACT_TANH);
}

static void test_fd_three_layer_relu(void **state) {
  (void)state;
  int w[4] = {5, 6, 4, 3};
  check_model_gradients(w, 4, TS_ACT_RELU);
}

static void test_fd_three_layer_tanh(void **state) {
  (void)state;
  int w[4] = {5, 6, 4, 3};
  check_model_gradients(w, 4, TS_ACT_TANH);
}

/* --- evaluation ------------------------------------------------------------------------- */

static void test_evaluate_chunks(void **state) {
  (void)state;
  int w[3] = {6, 5, 4};
  const size_t n = 23;
  float x[23 * 6];
  int32_t lab[23];
  for (size_t i = 0; i < n * 6; i++) x[i] = frand(-1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) lab[i] = (int32_t)(i % 4);
  ts_model_t small, big;
  assert_int_equal(ts_model_init(&small, w, 3, TS_ACT_TANH, 5, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(ts_model_init(&big, w, 3, TS_ACT_TANH, 64, ts_kernels_cpu(), NULL, 0), 0);
  assert_int_equal(ts_model_init_params(&small, 7), 0);
  assert_int_equal(ts_model_init_params(&big, 7), 0);
  float acc_s, loss_s, acc_b, loss_b, loss_fb;
  assert_int_equal(ts_model_evaluate(&small, x, lab, n, &acc_s, &loss_s), 0);
  assert_int_equal(ts_model_evaluate(&big, x, lab, n, &acc_b, &loss_b), 0);
  assert_true(acc_s == acc_b);
  assert_true(fabsf(loss_s - loss_b) < 1e-5f);
  /* the same loss as a training pass over the whole batch */
  assert_int_equal(ts_model_forward_backward(&big, x, lab, n, &loss_fb), 0);
  assert_true(fabsf(loss_fb - loss_b) < 1e-5f);
  /* accuracy against a count made here from the logits' argmax */
  assert_true(acc_b >= 0.0f && acc_b <= 1.0f);
  assert_int_equal(ts_model_evaluate(&big, x, lab, n, NULL, NULL), 0);
  ts_model_destroy(&small);
  ts_model_destroy(&big);

  /* a model that always predicts class 2: accuracy is the share of label 2 */
  int lrw[2] = {6, 4};
  ts_model_t lr;
  assert_int_equal(ts_model_init(&lr, lrw, 2, TS_ACT_RELU, 4, ts_kernels_cpu(), NULL, 0), 0);
  float params[6 * 4 + 4] = {0};
  params[6 * 4 + 2] = 1.0f; /* fc1/biases[2] */
  assert_int_equal(ts_model_set_params(&lr, 0, params, lr.param_count), 0);
  float acc;
  assert_int_equal(ts_model_evaluate(&lr, x, lab, n, &acc, NULL), 0);
  assert_true(fabsf(acc - 6.0f / 23.0f) < 1e-6f);
  ts_model_destroy(&lr);
}

/* Every allocation failure during init is reported and leaks nothing (the sanitizer build
 * checks the leaks). */
static void test_alloc_failures(void **state) {
  (void)state;
  int w[4] = {5, 6, 4, 3};
  for (long fail = 1; fail < 64; fail++) {
    ts_model_t m;
    char err[256] = "";
    ts_alloc_fail_after(fail);
    int rc = ts_model_init(&m, w, 4, TS_ACT_RELU, 8, ts_kernels_cpu(), err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      ts_model_destroy(&m);
      return; /* past the last allocation */
    }
    assert_int_equal(rc, TS_ENOMEM);
    assert_non_null(strstr(err, "model"));
  }
  fail_msg("ts_model_init still failing after 63 allocations");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invalid_arguments),
      cmocka_unit_test(test_tensors_and_ops),
      cmocka_unit_test(test_init_params_match_ts_init),
      cmocka_unit_test(test_fd_logistic_regression),
      cmocka_unit_test(test_fd_two_layer_relu),
      cmocka_unit_test(test_fd_two_layer_tanh),
      cmocka_unit_test(test_fd_three_layer_relu),
      cmocka_unit_test(test_fd_three_layer_tanh),
      cmocka_unit_test(test_evaluate_chunks),
      cmocka_unit_test(test_alloc_failures),
  };
  return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
