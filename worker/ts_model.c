/*
 * The MLP: a list of ops interpreted over the kernels table.
 *
 * Buffers: for layer K (1..L, L = n - 1) z[K] holds x W + b and, for hidden layers, a[K]
 * holds the activation; a[0] is the input x. The backward pass keeps dz in g0 and da in g1:
 * dW and db of layer K read dz (g0), da = dz W^T goes to g1, and the activation gradient
 * writes dz of layer K-1 back into g0, which is free by then. So two scratch buffers serve
 * any depth.
 */
#include "ts_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_pool.h" /* ts_pool_format_bytes */

bool ts_model_parse_activation(const char *s, ts_activation_t *out) {
  if (!s || !out) return false;
  if (strcmp(s, "relu") == 0) {
    *out = TS_ACT_RELU;
    return true;
  }
  if (strcmp(s, "tanh") == 0) {
    *out = TS_ACT_TANH;
    return true;
  }
  return false;
}

const char *ts_model_activation_name(ts_activation_t act) {
  switch (act) {
    case TS_ACT_RELU:
      return "relu";
    case TS_ACT_TANH:
      return "tanh";
  }
  return "unknown";
}

static size_t num_layers(const ts_model_t *m) {
  return m->num_widths - 1;
}

static size_t width(const ts_model_t *m, size_t i) {
  return (size_t)m->widths[i];
}

static const float *layer_input(const ts_model_t *m, size_t layer) {
  return layer == 1 ? m->x : m->a[layer - 1];
}

static const float *weights(const ts_model_t *m, size_t layer) {
  return m->params + m->tensors[2 * (layer - 1)].offset;
}

static const float *biases(const ts_model_t *m, size_t layer) {
  return m->params + m->tensors[2 * (layer - 1) + 1].offset;
}

/* --- building the tensor and op lists ---------------------------------------------------- */

static void add_tensor(ts_model_t *m, size_t layer, bool is_weights, size_t *offset) {
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

static void add_op(ts_model_t *m, ts_op_kind_t kind, ts_op_phase_t phase, size_t layer,
                   const char *type, const char *name_fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void add_op(ts_model_t *m, ts_op_kind_t kind, ts_op_phase_t phase, size_t layer,
                   const char *type, const char *name_fmt, ...) {
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
static void build_ops(ts_model_t *m) {
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
  ts_model_t m;
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
static void alloc_error(const ts_model_t *m, const int *widths, size_t n, size_t batch_capacity,
                        int rc, char *errmsg, size_t errlen) {
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

int ts_model_init(ts_model_t *model, const int *widths, size_t n, ts_activation_t activation,
                  size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!model) return TS_EINVAL;
  memset(model, 0, sizeof *model);
  int rc = TS_EINVAL;
  if (!widths || !kernels) {
    ts_errmsg_printf(errmsg, errlen, "model: no layers or no kernels");
    return TS_EINVAL;
  }
  rc = check_shape(widths, n, activation, errmsg, errlen);
  if (rc < 0) return rc;
  if (batch_capacity < 1 || batch_capacity > TS_MODEL_MAX_WIDTH) {
    ts_errmsg_printf(errmsg, errlen, "model: batch capacity %zu outside 1..%d", batch_capacity,
                     TS_MODEL_MAX_WIDTH);
    return TS_EINVAL;
  }

  model->num_widths = n;
  memcpy(model->widths, widths, n * sizeof widths[0]);
  model->activation = activation;
  model->batch_capacity = batch_capacity;
  model->kernels = kernels;
  size_t L = n - 1;
  const ts_kernels_t *k = kernels;

  /* Tensors and ops are host metadata. ops: per layer matmul, bias_add, activation (3L - 1),
   * the loss, its gradient, per layer dW and db, per hidden layer dX and the activation
   * gradient (4L - 2), and argmax. */
  model->tensors = ts_calloc(2 * L, sizeof *model->tensors);
  model->ops = ts_calloc(7 * L, sizeof *model->ops);
  model->z = ts_calloc(L + 1, sizeof *model->z);
  model->a = ts_calloc(L + 1, sizeof *model->a);
  if (!model->tensors || !model->ops || !model->z || !model->a) {
    rc = TS_ENOMEM;
    goto fail_nomem;
  }
  size_t offset = 0;
  for (size_t layer = 1; layer <= L; layer++) {
    add_tensor(model, layer, true, &offset);
    add_tensor(model, layer, false, &offset);
  }
  model->param_count = offset;
  build_ops(model);
  ts_require(model->num_ops <= 7 * L);

  if (!k->alloc || !k->free_buf || !k->copy_to_device || !k->copy_to_host) {
    ts_errmsg_printf(errmsg, errlen, "kernels '%s': no memory functions", k->name);
    rc = TS_EINVAL;
    goto fail_msg;
  }
  for (size_t i = 0; i < model->num_ops; i++) {
    if (!ts_model_op_has_kernel(k, model->ops[i].kind)) {
      ts_errmsg_printf(errmsg, errlen, "kernels '%s': no kernel for op %s (%s)", k->name,
                       model->ops[i].name, model->ops[i].type);
      rc = TS_EINVAL;
      goto fail_msg;
    }
  }

  size_t max_width = 0;
  for (size_t i = 1; i < n; i++)
    if (width(model, i) > max_width) max_width = width(model, i);
  size_t B = batch_capacity;
  TS_CHECK(alloc_floats(k, model->param_count, &model->params));
  TS_CHECK(alloc_floats(k, model->param_count, &model->grads));
  TS_CHECK(alloc_floats(k, B * width(model, 0), &model->x));
  {
    void *p = NULL;
    TS_CHECK(k->alloc(k, B * sizeof(int32_t), &p));
    model->labels = p;
  }
  for (size_t layer = 1; layer <= L; layer++) {
    TS_CHECK(alloc_floats(k, B * width(model, layer), &model->z[layer]));
    if (layer < L) TS_CHECK(alloc_floats(k, B * width(model, layer), &model->a[layer]));
  }
  TS_CHECK(alloc_floats(k, B * width(model, L), &model->probs));
  TS_CHECK(alloc_floats(k, B * max_width, &model->g0));
  TS_CHECK(alloc_floats(k, B * max_width, &model->g1));
  return 0;

fail_nomem:
  ts_errmsg_printf(errmsg, errlen, "model: out of memory");
  goto fail_msg;
fail: /* a device buffer could not be allocated */
  alloc_error(model, widths, n, batch_capacity, rc, errmsg, errlen);
fail_msg:
  ts_model_destroy(model);
  return rc;
}

void ts_model_destroy(ts_model_t *model) {
  if (!model) return;
  if (model->net) {
    ts_seq_destroy(model->net);
    ts_free(model->net);
    ts_free(model->tensors);
    memset(model, 0, sizeof *model);
    return;
  }
  const ts_kernels_t *k = model->kernels;
  if (k && k->free_buf) {
    size_t L = model->num_widths ? model->num_widths - 1 : 0;
    k->free_buf(k, model->params);
    k->free_buf(k, model->grads);
    k->free_buf(k, model->x);
    k->free_buf(k, model->labels);
    for (size_t layer = 1; layer <= L; layer++) {
      if (model->z) k->free_buf(k, model->z[layer]);
      if (model->a) k->free_buf(k, model->a[layer]);
    }
    k->free_buf(k, model->probs);
    k->free_buf(k, model->g0);
    k->free_buf(k, model->g1);
  }
  ts_free(model->tensors);
  ts_free(model->ops);
  ts_free(model->z);
  ts_free(model->a);
  memset(model, 0, sizeof *model);
}

/* --- parameters ---------------------------------------------------------------------------- */

int ts_model_init_params(ts_model_t *model, uint64_t seed) {
  if (model && model->net) return ts_seq_init_params(model->net, seed);
  if (!model || !model->params) return TS_EINVAL;
  /* Initialise on the host, tensor by tensor, and copy each to the device: the largest
   * tensor bounds the staging buffer. */
  size_t largest = 0;
  for (size_t t = 0; t < model->num_tensors; t++)
    largest = model->tensors[t].count > largest ? model->tensors[t].count : largest;
  float *host = ts_malloc(largest * sizeof(float));
  if (!host) return TS_ENOMEM;
  int rc = 0;
  for (size_t t = 0; t < model->num_tensors && rc == 0; t++) {
    const ts_model_tensor_t *tn = &model->tensors[t];
    ts_init_fill(host, tn->init, seed, tn->name, tn->shape, tn->rank, 0, tn->count);
    rc = ts_model_set_params(model, tn->offset, host, tn->count);
  }
  ts_free(host);
  return rc;
}

static bool range_ok(const ts_model_t *m, size_t offset, const void *p, size_t count) {
  return m && m->params && (p || count == 0) && offset <= m->param_count &&
         count <= m->param_count - offset;
}

int ts_model_set_params(ts_model_t *model, size_t offset, const float *src, size_t count) {
  if (model && model->net) return ts_seq_set_params(model->net, offset, src, count);
  if (!range_ok(model, offset, src, count)) return TS_EINVAL;
  if (count == 0) return 0;
  const ts_kernels_t *k = model->kernels;
  return k->copy_to_device(k, model->params + offset, src, count * sizeof(float));
}

int ts_model_get_params(const ts_model_t *model, size_t offset, float *dst, size_t count) {
  if (model && model->net) return ts_seq_get_params(model->net, offset, dst, count);
  if (!range_ok(model, offset, dst, count)) return TS_EINVAL;
  if (count == 0) return 0;
  const ts_kernels_t *k = model->kernels;
  return k->copy_to_host(k, dst, model->params + offset, count * sizeof(float));
}

int ts_model_get_grads(const ts_model_t *model, size_t offset, float *dst, size_t count) {
  if (model && model->net) return ts_seq_get_grads(model->net, offset, dst, count);
  if (!range_ok(model, offset, dst, count)) return TS_EINVAL;
  if (count == 0) return 0;
  const ts_kernels_t *k = model->kernels;
  return k->copy_to_host(k, dst, model->grads + offset, count * sizeof(float));
}

long ts_model_find_tensor(const ts_model_t *model, const char *name) {
  if (!model || !name) return -1;
  for (size_t t = 0; t < model->num_tensors; t++)
    if (strcmp(model->tensors[t].name, name) == 0) return (long)t;
  return -1;
}

/* --- execution ----------------------------------------------------------------------------- */

typedef struct {
  size_t batch;
  float loss;
  size_t correct;
} run_state_t;

static int run_op(ts_model_t *m, const ts_model_op_t *op, run_state_t *st) {
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
static int load_batch(ts_model_t *m, const float *x, const int32_t *labels, size_t batch) {
  const ts_kernels_t *k = m->kernels;
  size_t classes = width(m, num_layers(m));
  for (size_t i = 0; i < batch; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= classes) return TS_EINVAL;
  int rc = k->copy_to_device(k, m->x, x, batch * width(m, 0) * sizeof(float));
  if (rc < 0) return rc;
  return k->copy_to_device(k, m->labels, labels, batch * sizeof(int32_t));
}

static int run_phases(ts_model_t *m, bool backward, bool eval, run_state_t *st) {
  for (size_t i = 0; i < m->num_ops; i++) {
    const ts_model_op_t *op = &m->ops[i];
    if (op->phase == TS_OP_PHASE_BACKWARD && !backward) continue;
    if (op->phase == TS_OP_PHASE_EVAL && !eval) continue;
    int rc = run_op(m, op, st);
    if (rc < 0) return rc;
  }
  return 0;
}

int ts_model_load_batch(ts_model_t *model, const float *x, const int32_t *labels, size_t batch) {
  if (model && model->net) return ts_seq_load_batch(model->net, x, labels, batch);
  if (!model || !model->params || !x || !labels || batch < 1 || batch > model->batch_capacity)
    return TS_EINVAL;
  return load_batch(model, x, labels, batch);
}

int ts_model_compute(ts_model_t *model, size_t batch, float *loss) {
  if (model && model->net) return ts_seq_compute(model->net, batch, loss);
  if (!model || !model->params || batch < 1 || batch > model->batch_capacity) return TS_EINVAL;
  run_state_t st = {.batch = batch};
  int rc = run_phases(model, true, false, &st);
  if (rc < 0) return rc;
  if (loss) *loss = st.loss;
  return 0;
}

int ts_model_forward_backward(ts_model_t *model, const float *x, const int32_t *labels,
                              size_t batch, float *loss) {
  int rc = ts_model_load_batch(model, x, labels, batch);
  if (rc < 0) return rc;
  return ts_model_compute(model, batch, loss);
}

int ts_model_evaluate(ts_model_t *model, const float *x, const int32_t *labels, size_t n,
                      float *accuracy, float *loss) {
  if (model && model->net) return ts_seq_evaluate(model->net, x, labels, n, accuracy, loss);
  if (!model || !model->params || !x || !labels || n < 1) return TS_EINVAL;
  size_t in = width(model, 0), correct = 0;
  double loss_sum = 0.0;
  for (size_t start = 0; start < n; start += model->batch_capacity) {
    size_t b = n - start < model->batch_capacity ? n - start : model->batch_capacity;
    int rc = load_batch(model, x + start * in, labels + start, b);
    if (rc < 0) return rc;
    run_state_t st = {.batch = b};
    rc = run_phases(model, false, true, &st);
    if (rc < 0) return rc;
    correct += st.correct;
    loss_sum += (double)st.loss * (double)b;
  }
  if (accuracy) *accuracy = (float)((double)correct / (double)n);
  if (loss) *loss = (float)(loss_sum / (double)n);
  return 0;
}

/* --- a network of layers ------------------------------------------------------------------- */

int ts_model_init_net(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                      ts_layer_shape_t input, size_t batch_capacity, const ts_kernels_t *kernels,
                      char *errmsg, size_t errlen) {
  return ts_model_init_net_split(model, specs, n, input, batch_capacity, kernels, NULL, errmsg,
                                 errlen);
}

int ts_model_init_net_split(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                            ts_layer_shape_t input, size_t batch_capacity,
                            const ts_kernels_t *kernels, const ts_kernels_t *const *layer_kernels,
                            char *errmsg, size_t errlen) {
  if (!model) return TS_EINVAL;
  memset(model, 0, sizeof *model);
  ts_seq_t *net = ts_calloc(1, sizeof *net);
  if (!net) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  int rc =
      layer_kernels
          ? ts_seq_init_split(net, specs, n, input, batch_capacity, layer_kernels, errmsg, errlen)
          : ts_seq_init(net, specs, n, input, batch_capacity, kernels, errmsg, errlen);
  if (rc < 0) {
    ts_free(net);
    return rc;
  }
  const ts_layers_t *d = &net->desc;
  model->tensors = ts_calloc(d->num_tensors ? d->num_tensors : 1, sizeof *model->tensors);
  if (!model->tensors) {
    ts_seq_destroy(net);
    ts_free(net);
    if (errmsg && errlen) snprintf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  for (size_t t = 0; t < d->num_tensors; t++) {
    const ts_layer_tensor_t *src = &d->tensors[t];
    ts_model_tensor_t *dst = &model->tensors[t];
    snprintf(dst->name, sizeof dst->name, "%s", src->name);
    memcpy(dst->shape, src->shape, sizeof dst->shape);
    dst->rank = src->rank;
    dst->count = src->count;
    dst->offset = src->offset;
    dst->init = src->init;
  }
  model->net = net; /* ownership: the model's, freed by ts_model_destroy */
  model->num_tensors = d->num_tensors;
  model->param_count = d->param_count;
  model->params = net->params;
  model->grads = net->grads;
  model->kernels = kernels ? kernels : net->kernels;
  model->batch_capacity = batch_capacity;
  return 0;
}

bool ts_model_is_split(const ts_model_t *model) {
  return model && model->net && model->net->num_segments > 1;
}

int ts_model_synchronize(const ts_model_t *model) {
  if (model && model->net) return ts_seq_synchronize(model->net);
  const ts_kernels_t *k = model ? model->kernels : NULL;
  return k && k->synchronize ? k->synchronize(k) : 0;
}

void ts_model_set_dropout(ts_model_t *model, uint64_t seed, uint64_t stream) {
  if (model && model->net) ts_seq_set_training(model->net, true, seed, stream);
}
