/*
 * The MLP engine (ts_model.h): a multi-layer perceptron of model.layers widths as a list of
 * ops, each named and typed as TensorFlow's ("fc1/matmul", "MatMul"), interpreted over the
 * kernels table. Device placement works on the same op list (ts_model_ops) before any
 * device is touched, and device.log_device_placement prints one line per op, so the names,
 * types and order here are what the placement tests check.
 *
 * Buffers: for layer K (1..L, L = n - 1) z[K] holds x W + b and, for hidden layers, a[K]
 * holds the activation; a[0] is the input x. The backward pass keeps dz in g0 and da in g1:
 * dW and db of layer K read dz (g0), da = dz W^T goes to g1, and the activation gradient
 * writes dz of layer K-1 back into g0, which is free by then. So two scratch buffers serve
 * any depth.
 *
 * Ownership: the state (mlp_t) is ts_calloc'd by ts_model_init and owns its tensor and op
 * lists (ts_calloc'd) and its device buffers (kernels->alloc); mlp_destroy frees them all.
 * The model's public fields point into it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_model.h"
#include "ts_model_int.h"
#include "ts_pool.h" /* ts_pool_format_bytes */

typedef struct {
  size_t num_widths; /* n: layers count is n - 1 */
  int widths[TS_MODEL_MAX_LAYERS];
  ts_activation_t activation;
  size_t batch_capacity;
  const ts_kernels_t *kernels;

  ts_model_tensor_t *tensors; /* 2 * (n - 1) tensors, fc1/weights, fc1/biases, fc2/... */
  size_t num_tensors;
  size_t param_count; /* elements of params (and of grads) */
  float *params;      /* device buffer, param_count floats */
  float *grads;       /* device buffer, param_count floats */

  ts_model_op_t *ops; /* forward ops in order, then backward ops, then evaluation ops */
  size_t num_ops;

  /* Device scratch, one per layer output, sized for batch_capacity. */
  float *x;        /* input batch: batch_capacity x widths[0] */
  int32_t *labels; /* batch_capacity labels */
  float **z;       /* z[K], K = 1..L: pre-activations (z[L] are the logits) */
  float **a;       /* a[K], K = 1..L-1: activations of hidden layers */
  float *probs;    /* softmax of the logits */
  float *g0, *g1;  /* gradient scratch, batch_capacity x the widest layer each */
  size_t last_correct; /* of the last compute's batch (the evaluation ops run there too) */
} mlp_t;

static size_t num_layers(const mlp_t *m) {
  return m->num_widths - 1;
}

static size_t width(const mlp_t *m, size_t i) {
  return (size_t)m->widths[i];
}

static const float *layer_input(const mlp_t *m, size_t layer) {
  return layer == 1 ? m->x : m->a[layer - 1];
}

static const float *weights(const mlp_t *m, size_t layer) {
  return m->params + m->tensors[2 * (layer - 1)].offset;
}

static const float *biases(const mlp_t *m, size_t layer) {
  return m->params + m->tensors[2 * (layer - 1) + 1].offset;
}

/* --- building the tensor and op lists ---------------------------------------------------- */

static void add_tensor(mlp_t *m, size_t layer, bool is_weights, size_t *offset) {
  ts_model_tensor_t *t = &m->tensors[m->num_tensors++];
  snprintf(t->name, sizeof t->name, "fc%zu/%s", layer, is_weights ? "weights" : "biases");
  if (is_weights) {
    t->rank = 2;
    t->shape[0] = (uint64_t)width(m, layer - 1);
    t->shape[1] = (uint64_t)width(m, layer);
    t->init = TS_INIT_GLOROT_UNIFORM;
  } else {
    t->rank = 1;
    t->shape[0] = (uint64_t)width(m, layer);
    t->shape[1] = 0;
    t->init = TS_INIT_ZEROS;
  }
  t->count = (size_t)t->shape[0] * (t->rank == 2 ? (size_t)t->shape[1] : 1);
  t->offset = *offset;
  *offset += t->count;
}

static void add_op(mlp_t *m, ts_op_kind_t kind, ts_op_phase_t phase, size_t layer, const char *type,
                   const char *name_fmt, ...) __attribute__((format(printf, 6, 7)));

static void add_op(mlp_t *m, ts_op_kind_t kind, ts_op_phase_t phase, size_t layer, const char *type,
                   const char *name_fmt, ...) {
  ts_model_op_t *op = &m->ops[m->num_ops++];
  op->kind = kind;
  op->phase = phase;
  op->layer = layer;
  op->type = type;
  va_list ap;
  va_start(ap, name_fmt);
  vsnprintf(op->name, sizeof op->name, name_fmt, ap);
  va_end(ap);
}

/* Forward ops in execution order, then backward ops in execution order, then evaluation.
 * Gradient ops are named as TensorFlow names them under "gradients/". */
static void build_ops(mlp_t *m) {
  size_t L = num_layers(m);
  bool tanh = m->activation == TS_ACT_TANH;
  for (size_t k = 1; k <= L; k++) {
    add_op(m, TS_OP_MATMUL, TS_OP_PHASE_FORWARD, k, "MatMul", "fc%zu/matmul", k);
    add_op(m, TS_OP_BIAS_ADD, TS_OP_PHASE_FORWARD, k, "BiasAdd", "fc%zu/bias_add", k);
    if (k < L) {
      if (tanh)
        add_op(m, TS_OP_TANH, TS_OP_PHASE_FORWARD, k, "Tanh", "fc%zu/tanh", k);
      else
        add_op(m, TS_OP_RELU, TS_OP_PHASE_FORWARD, k, "Relu", "fc%zu/relu", k);
    }
  }
  add_op(m, TS_OP_SOFTMAX_XENT, TS_OP_PHASE_FORWARD, 0, "SoftmaxCrossEntropyWithLogits",
         "loss/softmax_xent");
  add_op(m, TS_OP_XENT_GRAD, TS_OP_PHASE_BACKWARD, 0, "SoftmaxCrossEntropyWithLogitsGrad",
         "gradients/loss/softmax_xent_grad");
  for (size_t k = L; k >= 1; k--) {
    add_op(m, TS_OP_MATMUL_GRAD_W, TS_OP_PHASE_BACKWARD, k, "MatMul",
           "gradients/fc%zu/matmul_grad/MatMul_1", k);
    add_op(m, TS_OP_BIAS_ADD_GRAD, TS_OP_PHASE_BACKWARD, k, "BiasAddGrad",
           "gradients/fc%zu/bias_add_grad/BiasAddGrad", k);
    if (k > 1) {
      add_op(m, TS_OP_MATMUL_GRAD_X, TS_OP_PHASE_BACKWARD, k, "MatMul",
             "gradients/fc%zu/matmul_grad/MatMul", k);
      /* the gradient through the activation of layer k-1 */
      if (tanh)
        add_op(m, TS_OP_TANH_GRAD, TS_OP_PHASE_BACKWARD, k - 1, "TanhGrad",
               "gradients/fc%zu/tanh_grad/TanhGrad", k - 1);
      else
        add_op(m, TS_OP_RELU_GRAD, TS_OP_PHASE_BACKWARD, k - 1, "ReluGrad",
               "gradients/fc%zu/relu_grad/ReluGrad", k - 1);
    }
  }
  add_op(m, TS_OP_ARGMAX, TS_OP_PHASE_EVAL, 0, "ArgMax", "accuracy/argmax");
}

bool ts_model_op_has_kernel(const ts_kernels_t *k, ts_op_kind_t kind) {
  if (!k) return false;
  switch (kind) {
    case TS_OP_MATMUL:
    case TS_OP_MATMUL_GRAD_W:
    case TS_OP_MATMUL_GRAD_X:
      return k->gemm != NULL;
    case TS_OP_BIAS_ADD:
      return k->bias_add != NULL;
    case TS_OP_BIAS_ADD_GRAD:
      return k->bias_grad != NULL;
    case TS_OP_RELU:
      return k->relu_fwd != NULL;
    case TS_OP_RELU_GRAD:
      return k->relu_bwd != NULL;
    case TS_OP_TANH:
      return k->tanh_fwd != NULL;
    case TS_OP_TANH_GRAD:
      return k->tanh_bwd != NULL;
    case TS_OP_SOFTMAX_XENT:
      return k->softmax_xent != NULL;
    case TS_OP_XENT_GRAD:
      return k->softmax_xent_grad != NULL;
    case TS_OP_ARGMAX:
      return k->argmax_correct != NULL;
  }
  return false;
}

/* --- init / destroy ------------------------------------------------------------------------ */

static int alloc_floats(const ts_kernels_t *k, size_t count, float **out) {
  void *p = NULL;
  int rc = k->alloc(k, count * sizeof(float), &p);
  *out = p;
  return rc;
}

/* The checks of ts_model_init on widths and activation. */
static int check_shape(const int *widths, size_t n, ts_activation_t activation, char *errmsg,
                       size_t errlen) {
  if (n < 2 || n > TS_MODEL_MAX_LAYERS) {
    ts_errmsg_printf(errmsg, errlen,
                     "model.layers: %zu widths given, need 2 to %d (input, hidden..., output)", n,
                     TS_MODEL_MAX_LAYERS);
    return TS_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    if (widths[i] < 1 || widths[i] > TS_MODEL_MAX_WIDTH) {
      ts_errmsg_printf(errmsg, errlen, "model.layers[%zu] = %d: a width must be 1..%d", i,
                       widths[i], TS_MODEL_MAX_WIDTH);
      return TS_EINVAL;
    }
  }
  if (activation != TS_ACT_RELU && activation != TS_ACT_TANH) {
    ts_errmsg_printf(errmsg, errlen, "model.activation: unknown activation %d", (int)activation);
    return TS_EINVAL;
  }
  return 0;
}

int ts_model_ops(const int *widths, size_t n, ts_activation_t activation, ts_model_op_t **ops,
                 size_t *num_ops) {
  char scratch[8];
  if (!widths || !ops || !num_ops) return TS_EINVAL;
  *ops = NULL;
  *num_ops = 0;
  int rc = check_shape(widths, n, activation, scratch, sizeof scratch);
  if (rc < 0) return rc;
  mlp_t m;
  memset(&m, 0, sizeof m);
  m.num_widths = n;
  memcpy(m.widths, widths, n * sizeof widths[0]);
  m.activation = activation;
  m.ops = ts_calloc(7 * (n - 1), sizeof *m.ops);
  if (!m.ops) return TS_ENOMEM;
  build_ops(&m);
  *ops = m.ops;
  *num_ops = m.num_ops;
  return 0;
}

size_t ts_model_device_bytes(const int *widths, size_t n, size_t batch_capacity) {
  if (!widths || check_shape(widths, n, TS_ACT_RELU, NULL, 0) < 0) return 0;
  /* Widths are at most 2^20 and batches at most 2^20: every product fits 64 bits. */
  size_t params = 0, acts = 0, max_width = 0;
  for (size_t i = 1; i < n; i++) {
    size_t in = (size_t)widths[i - 1], out = (size_t)widths[i];
    params += in * out + out;
    acts += batch_capacity * out * (i < n - 1 ? 2 : 1); /* z, and a for hidden layers */
    if (out > max_width) max_width = out;
  }
  size_t floats = 2 * params                               /* params, grads */
                  + batch_capacity * (size_t)widths[0]     /* x */
                  + acts                                   /* z, a */
                  + batch_capacity * (size_t)widths[n - 1] /* probs */
                  + 2 * batch_capacity * max_width;        /* g0, g1 */
  return floats * sizeof(float) + batch_capacity * sizeof(int32_t);
}

/* Why a device buffer could not be had: the whole need, and the back end's detail (for a
 * GPU: the memory policy's limit and what is in use). */
static void alloc_error(const mlp_t *m, const int *widths, size_t n, size_t batch_capacity, int rc,
                        char *errmsg, size_t errlen) {
  const ts_kernels_t *k = m->kernels;
  char need[32];
  const char *detail = k->last_error ? k->last_error(k) : "";
  ts_pool_format_bytes(ts_model_device_bytes(widths, n, batch_capacity), need, sizeof need);
  ts_errmsg_printf(errmsg, errlen,
                   "model: allocating buffers on kernels '%s' device %d (%zu parameters, batch "
                   "%zu: %s in all): %s%s%s",
                   k->name, k->device_index, m->param_count, batch_capacity, need, ts_strerror(rc),
                   detail[0] ? ": " : "", detail);
}

static void mlp_destroy(void *impl) {
  mlp_t *m = impl;
  if (!m) return;
  const ts_kernels_t *k = m->kernels;
  if (k && k->free_buf) {
    size_t L = m->num_widths ? m->num_widths - 1 : 0;
    k->free_buf(k, m->params);
    k->free_buf(k, m->grads);
    k->free_buf(k, m->x);
    k->free_buf(k, m->labels);
    for (size_t layer = 1; layer <= L; layer++) {
      if (m->z) k->free_buf(k, m->z[layer]);
      if (m->a) k->free_buf(k, m->a[layer]);
    }
    k->free_buf(k, m->probs);
    k->free_buf(k, m->g0);
    k->free_buf(k, m->g1);
  }
  ts_free(m->tensors);
  ts_free(m->ops);
  ts_free(m->z);
  ts_free(m->a);
  ts_free(m);
}

/* Fill *m for checked widths and batch capacity: the tensor and op lists, the kernels check,
 * the device buffers. On failure errmsg says why and the caller frees m (mlp_destroy frees
 * whatever was allocated). */
static int build(mlp_t *m, const int *widths, size_t n, ts_activation_t activation,
                 size_t batch_capacity, const ts_kernels_t *k, char *errmsg, size_t errlen) {
  m->num_widths = n;
  memcpy(m->widths, widths, n * sizeof widths[0]);
  m->activation = activation;
  m->batch_capacity = batch_capacity;
  m->kernels = k;
  size_t L = n - 1;
  int rc = 0;

  /* Tensors and ops are host metadata. ops: per layer matmul, bias_add, activation (3L - 1),
   * the loss, its gradient, per layer dW and db, per hidden layer dX and the activation
   * gradient (4L - 2), and argmax. */
  m->tensors = ts_calloc(2 * L, sizeof *m->tensors);
  m->ops = ts_calloc(7 * L, sizeof *m->ops);
  m->z = ts_calloc(L + 1, sizeof *m->z);
  m->a = ts_calloc(L + 1, sizeof *m->a);
  if (!m->tensors || !m->ops || !m->z || !m->a) {
    ts_errmsg_printf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  size_t offset = 0;
  for (size_t layer = 1; layer <= L; layer++) {
    add_tensor(m, layer, true, &offset);
    add_tensor(m, layer, false, &offset);
  }
  m->param_count = offset;
  build_ops(m);
  ts_require(m->num_ops <= 7 * L);

  if (!k->alloc || !k->free_buf || !k->copy_to_device || !k->copy_to_host) {
    ts_errmsg_printf(errmsg, errlen, "kernels '%s': no memory functions", k->name);
    return TS_EINVAL;
  }
  for (size_t i = 0; i < m->num_ops; i++) {
    if (!ts_model_op_has_kernel(k, m->ops[i].kind)) {
      ts_errmsg_printf(errmsg, errlen, "kernels '%s': no kernel for op %s (%s)", k->name,
                       m->ops[i].name, m->ops[i].type);
      return TS_EINVAL;
    }
  }

  size_t max_width = 0;
  for (size_t i = 1; i < n; i++)
    if (width(m, i) > max_width) max_width = width(m, i);
  size_t B = batch_capacity;
  TS_CHECK(alloc_floats(k, m->param_count, &m->params));
  TS_CHECK(alloc_floats(k, m->param_count, &m->grads));
  TS_CHECK(alloc_floats(k, B * width(m, 0), &m->x));
  {
    void *p = NULL;
    TS_CHECK(k->alloc(k, B * sizeof(int32_t), &p));
    m->labels = p;
  }
  for (size_t layer = 1; layer <= L; layer++) {
    TS_CHECK(alloc_floats(k, B * width(m, layer), &m->z[layer]));
    if (layer < L) TS_CHECK(alloc_floats(k, B * width(m, layer), &m->a[layer]));
  }
  TS_CHECK(alloc_floats(k, B * width(m, L), &m->probs));
  TS_CHECK(alloc_floats(k, B * max_width, &m->g0));
  TS_CHECK(alloc_floats(k, B * max_width, &m->g1));
  return 0;

fail: /* a device buffer could not be allocated */
  alloc_error(m, widths, n, batch_capacity, rc, errmsg, errlen);
  return rc;
}
/* --- execution ----------------------------------------------------------------------------- */

typedef struct {
  size_t batch;
  float loss;
  size_t correct;
} run_state_t;

static int run_op(mlp_t *m, const ts_model_op_t *op, run_state_t *st) {
  const ts_kernels_t *k = m->kernels;
  size_t B = st->batch, L = num_layers(m), K = op->layer;
  switch (op->kind) {
    case TS_OP_MATMUL: /* z[K] = a[K-1] W[K]: (B x in) (in x out) */
      return k->gemm(k, false, false, B, width(m, K), width(m, K - 1), 1.0f, layer_input(m, K),
                     width(m, K - 1), weights(m, K), width(m, K), 0.0f, m->z[K], width(m, K));
    case TS_OP_BIAS_ADD:
      return k->bias_add(k, B, width(m, K), biases(m, K), m->z[K]);
    case TS_OP_RELU:
      return k->relu_fwd(k, B * width(m, K), m->z[K], m->a[K]);
    case TS_OP_TANH:
      return k->tanh_fwd(k, B * width(m, K), m->z[K], m->a[K]);
    case TS_OP_SOFTMAX_XENT:
      return k->softmax_xent(k, B, width(m, L), m->z[L], m->labels, m->probs, &st->loss);
    case TS_OP_ARGMAX:
      return k->argmax_correct(k, B, width(m, L), m->z[L], m->labels, &st->correct);
    case TS_OP_XENT_GRAD: /* dz[L] -> g0 */
      return k->softmax_xent_grad(k, B, width(m, L), m->probs, m->labels, m->g0);
    case TS_OP_MATMUL_GRAD_W: { /* dW = a[K-1]^T dz: (in x B) (B x out) */
      float *dw = m->grads + m->tensors[2 * (K - 1)].offset;
      return k->gemm(k, true, false, width(m, K - 1), width(m, K), B, 1.0f, layer_input(m, K),
                     width(m, K - 1), m->g0, width(m, K), 0.0f, dw, width(m, K));
    }
    case TS_OP_BIAS_ADD_GRAD: {
      float *db = m->grads + m->tensors[2 * (K - 1) + 1].offset;
      return k->bias_grad(k, B, width(m, K), m->g0, db);
    }
    case TS_OP_MATMUL_GRAD_X: /* da[K-1] = dz W^T: (B x out) (out x in) -> g1 */
      return k->gemm(k, false, true, B, width(m, K - 1), width(m, K), 1.0f, m->g0, width(m, K),
                     weights(m, K), width(m, K), 0.0f, m->g1, width(m, K - 1));
    case TS_OP_RELU_GRAD: /* dz[K] = da[K] * (a[K] > 0): g1 -> g0 */
      return k->relu_bwd(k, B * width(m, K), m->a[K], m->g1, m->g0);
    case TS_OP_TANH_GRAD:
      return k->tanh_bwd(k, B * width(m, K), m->a[K], m->g1, m->g0);
  }
  return TS_EINTERNAL;
}

/* Copy one chunk of host data to the device; labels are checked here, on the host, so every
 * back end reports a bad label the same way. */
static int load_batch(mlp_t *m, const float *x, const int32_t *labels, size_t batch) {
  const ts_kernels_t *k = m->kernels;
  size_t classes = width(m, num_layers(m));
  for (size_t i = 0; i < batch; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= classes) return TS_EINVAL;
  int rc = k->copy_to_device(k, m->x, x, batch * width(m, 0) * sizeof(float));
  if (rc < 0) return rc;
  return k->copy_to_device(k, m->labels, labels, batch * sizeof(int32_t));
}

static int run_phases(mlp_t *m, bool backward, bool eval, run_state_t *st) {
  for (size_t i = 0; i < m->num_ops; i++) {
    const ts_model_op_t *op = &m->ops[i];
    if (op->phase == TS_OP_PHASE_BACKWARD && !backward) continue;
    if (op->phase == TS_OP_PHASE_EVAL && !eval) continue;
    int rc = run_op(m, op, st);
    if (rc < 0) return rc;
  }
  return 0;
}

/* --- the engine's table ---------------------------------------------------------------------- */

/* The facade has checked every range, batch and pointer (ts_model_int.h). */

static int mlp_set_params(void *impl, size_t offset, const float *src, size_t count) {
  mlp_t *m = impl;
  const ts_kernels_t *k = m->kernels;
  return k->copy_to_device(k, m->params + offset, src, count * sizeof(float));
}

static int mlp_get_params(const void *impl, size_t offset, float *dst, size_t count) {
  const mlp_t *m = impl;
  const ts_kernels_t *k = m->kernels;
  return k->copy_to_host(k, dst, m->params + offset, count * sizeof(float));
}

static int mlp_get_grads(const void *impl, size_t offset, float *dst, size_t count) {
  const mlp_t *m = impl;
  const ts_kernels_t *k = m->kernels;
  return k->copy_to_host(k, dst, m->grads + offset, count * sizeof(float));
}

static int mlp_load_batch(void *impl, const float *x, const int32_t *labels, size_t batch) {
  return load_batch(impl, x, labels, batch);
}

static int mlp_compute(void *impl, size_t batch, float *loss) {
  mlp_t *m = impl;
  run_state_t st = {.batch = batch};
  /* The evaluation ops too: the argmax reads the logits, which backward leaves alone. */
  int rc = run_phases(m, true, true, &st);
  if (rc < 0) return rc;
  if (loss) *loss = st.loss;
  m->last_correct = st.correct;
  return 0;
}

static int mlp_last_correct(const void *impl, size_t *correct) {
  *correct = ((const mlp_t *)impl)->last_correct;
  return 0;
}

static int mlp_evaluate(void *impl, const float *x, const int32_t *labels, size_t n,
                        float *accuracy, float *loss) {
  mlp_t *m = impl;
  size_t in = width(m, 0), correct = 0;
  double loss_sum = 0.0;
  for (size_t start = 0; start < n; start += m->batch_capacity) {
    size_t b = n - start < m->batch_capacity ? n - start : m->batch_capacity;
    int rc = load_batch(m, x + start * in, labels + start, b);
    if (rc < 0) return rc;
    run_state_t st = {.batch = b};
    rc = run_phases(m, false, true, &st);
    if (rc < 0) return rc;
    correct += st.correct;
    loss_sum += (double)st.loss * (double)b;
  }
  if (accuracy) *accuracy = (float)((double)correct / (double)n);
  if (loss) *loss = (float)(loss_sum / (double)n);
  return 0;
}

static int mlp_synchronize(const void *impl) {
  const ts_kernels_t *k = ((const mlp_t *)impl)->kernels;
  return k->synchronize ? k->synchronize(k) : 0;
}

static const ts_model_engine_t mlp_engine = {
    .name = "mlp",
    .set_params = mlp_set_params,
    .get_params = mlp_get_params,
    .get_grads = mlp_get_grads,
    .load_batch = mlp_load_batch,
    .compute = mlp_compute,
    .last_correct = mlp_last_correct,
    .evaluate = mlp_evaluate,
    .synchronize = mlp_synchronize,
    .destroy = mlp_destroy, /* no dropout, one table: set_training and is_split stay NULL */
};

int ts_model_init(ts_model_t *model, const int *widths, size_t n, ts_activation_t activation,
                  size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!model) return TS_EINVAL;
  memset(model, 0, sizeof *model);
  if (!widths || !kernels) {
    ts_errmsg_printf(errmsg, errlen, "model: no layers or no kernels");
    return TS_EINVAL;
  }
  int rc = check_shape(widths, n, activation, errmsg, errlen);
  if (rc < 0) return rc;
  if (batch_capacity < 1 || batch_capacity > TS_MODEL_MAX_WIDTH) {
    ts_errmsg_printf(errmsg, errlen, "model: batch capacity %zu outside 1..%d", batch_capacity,
                     TS_MODEL_MAX_WIDTH);
    return TS_EINVAL;
  }
  mlp_t *m = ts_calloc(1, sizeof *m);
  if (!m) {
    ts_errmsg_printf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  rc = build(m, widths, n, activation, batch_capacity, kernels, errmsg, errlen);
  if (rc < 0) {
    mlp_destroy(m);
    return rc;
  }
  ts_model_adopt(model, &mlp_engine, m, kernels, batch_capacity); /* m is the model's now */
  model->tensors = m->tensors;
  model->num_tensors = m->num_tensors;
  model->param_count = m->param_count;
  model->params = m->params;
  model->grads = m->grads;
  model->ops = m->ops;
  model->num_ops = m->num_ops;
  return 0;
}
