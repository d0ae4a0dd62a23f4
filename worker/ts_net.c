/*
 * Running a layer list (ts_net.h).
 *
 * Forward: layer i reads out(i - 1) (the input batch for i = 0) and writes z[i] (the conv or
 * dense product plus bias, the pooled maximum, the dropped-out units), then a[i] = act(z[i])
 * when it has a non-linear activation. out(i) is a[i], else z[i]; a flatten layer and a
 * dropout layer outside training have no buffer of their own and give out(i - 1) on. A conv
 * or dense layer with a ReLU on a back end with the fused kernels (bias_relu,
 * relu_bwd_bias_grad) has no z[i]: its product goes into a[i] and bias_relu finishes it in
 * place, and its backward step takes the ReLU and the bias gradient in one pass.
 *
 * Backward: the gradient with respect to the current layer's output is in one of two scratch
 * buffers (cur); each step reads cur and writes the other (activation gradient, input
 * gradient of conv, dense and pooling), then they swap, so two buffers of the largest
 * activation serve any depth. Dropout applies its mask in place; flatten does nothing. The
 * input gradient of the first layer with parameters is not computed (nothing needs it).
 */
#include "ts_net.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_init.h"

static const ts_layer_t *layer(const ts_net_t *n, size_t i) {
  return &n->desc.layers[i];
}

static const float *out_of(const ts_net_t *n, size_t i);

static const float *in_of(const ts_net_t *n, size_t i) {
  return i == 0 ? n->x : out_of(n, i - 1);
}

static bool dropout_active(const ts_net_t *n, size_t i) {
  return n->training && layer(n, i)->spec.rate > 0.0;
}

static const float *out_of(const ts_net_t *n, size_t i) {
  const ts_layer_t *L = layer(n, i);
  if (L->spec.type == TS_LAYER_FLATTEN) return in_of(n, i);
  if (L->spec.type == TS_LAYER_DROPOUT && !dropout_active(n, i)) return in_of(n, i);
  return n->a[i] ? n->a[i] : n->z[i];
}

static float *param(const ts_net_t *n, long t) {
  return n->params + n->desc.tensors[t].offset;
}

static float *grad(const ts_net_t *n, long t) {
  return n->grads + n->desc.tensors[t].offset;
}

/* Layer i's bias and ReLU go through the fused kernels (see above). */
static bool fused_relu(const ts_net_t *n, size_t i) {
  const ts_layer_t *L = layer(n, i);
  return (L->spec.type == TS_LAYER_CONV2D || L->spec.type == TS_LAYER_DENSE) &&
         L->spec.activation == TS_LAYER_RELU && n->kernels->bias_relu &&
         n->kernels->relu_bwd_bias_grad;
}

/* Where layer i's product goes: a[i] when fused, else z[i]. */
static float *product_of(const ts_net_t *n, size_t i) {
  return fused_relu(n, i) ? n->a[i] : n->z[i];
}

static ts_conv2d_t geom(const ts_layer_t *L, size_t batch) {
  ts_conv2d_t g = L->geom;
  g.batch = batch;
  return g;
}

/* --- building ------------------------------------------------------------------------------ */

static int alloc_floats(const ts_kernels_t *k, size_t n, float **out) {
  void *p = NULL;
  int rc = k->alloc(k, n * sizeof(float), &p);
  *out = p;
  return rc;
}

const char *ts_net_layer_kernel_missing(const ts_kernels_t *k, const ts_layer_spec_t *spec) {
  switch (spec->type) {
    case TS_LAYER_CONV2D:
      if (!k->conv2d_workspace || !k->conv2d_fwd || !k->conv2d_bwd_data || !k->conv2d_bwd_filter)
        return "conv2d";
      if (!k->bias_add || !k->bias_grad) return "bias_add";
      break;
    case TS_LAYER_DENSE:
      if (!k->gemm) return "gemm";
      if (!k->bias_add || !k->bias_grad) return "bias_add";
      break;
    case TS_LAYER_MAX_POOL:
      if (!k->maxpool_fwd || !k->maxpool_bwd) return "maxpool";
      break;
    case TS_LAYER_DROPOUT:
      if (!k->mul) return "mul";
      break;
    case TS_LAYER_FLATTEN:
      break;
  }
  if (spec->activation == TS_LAYER_RELU && (!k->relu_fwd || !k->relu_bwd)) return "relu";
  if (spec->activation == TS_LAYER_TANH && (!k->tanh_fwd || !k->tanh_bwd)) return "tanh";
  return NULL;
}

/* The kernels a layer needs, by name for the error. */
static const char *missing_kernel(const ts_kernels_t *k, const ts_layer_t *L) {
  if (!k->alloc || !k->free_buf || !k->copy_to_device || !k->copy_to_host) return "memory";
  if (!k->softmax_xent || !k->softmax_xent_grad || !k->argmax_correct) return "softmax_xent";
  return ts_net_layer_kernel_missing(k, &L->spec);
}

static int alloc_layer(ts_net_t *n, size_t i, size_t *mask_max) {
  const ts_kernels_t *k = n->kernels;
  const ts_layer_t *L = layer(n, i);
  size_t B = n->batch_capacity, out = B * ts_layers_elems(L->out);
  int rc = 0;
  switch (L->spec.type) {
    case TS_LAYER_FLATTEN:
      return 0;
    case TS_LAYER_MAX_POOL: {
      void *p = NULL;
      rc = k->alloc(k, out * sizeof(int32_t), &p);
      n->argmax[i] = p;
      break;
    }
    case TS_LAYER_DROPOUT:
      rc = alloc_floats(k, out, &n->mask[i]);
      if (out > *mask_max) *mask_max = out;
      break;
    case TS_LAYER_CONV2D: {
      ts_conv2d_t g = geom(L, B);
      size_t ws = k->conv2d_workspace(k, &g);
      if (ws == 0) return TS_EINVAL;
      if (ws > n->ws_bytes) n->ws_bytes = ws;
      break;
    }
    case TS_LAYER_DENSE:
      break;
  }
  if (rc == 0 && !fused_relu(n, i)) rc = alloc_floats(k, out, &n->z[i]);
  if (rc == 0 && L->spec.activation != TS_LAYER_LINEAR) rc = alloc_floats(k, out, &n->a[i]);
  return rc;
}

int ts_net_init(ts_net_t *net, const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!net) return TS_EINVAL;
  memset(net, 0, sizeof *net);
  if (!kernels) {
    ts_errmsg_printf(errmsg, errlen, "model: no kernels");
    return TS_EINVAL;
  }
  if (batch_capacity < 1 || batch_capacity > TS_CONV_MAX_BATCH) {
    ts_errmsg_printf(errmsg, errlen, "model: batch capacity %zu outside 1..%d", batch_capacity,
                     TS_CONV_MAX_BATCH);
    return TS_EINVAL;
  }
  int rc = ts_layers_check(specs, n, input, &net->desc, NULL, errmsg, errlen);
  if (rc < 0) return rc;
  net->kernels = kernels;
  net->batch_capacity = batch_capacity;
  const ts_kernels_t *k = kernels;
  size_t L = net->desc.num_layers;
  for (size_t i = 0; i < L; i++) {
    const char *miss = missing_kernel(k, layer(net, i));
    if (miss) {
      ts_errmsg_printf(errmsg, errlen, "kernels '%s': no %s kernel for layer %zu '%s' (%s)",
                       k->name, miss, i + 1, layer(net, i)->spec.name,
                       ts_layers_type_name(layer(net, i)->spec.type));
      ts_layers_free(&net->desc);
      memset(net, 0, sizeof *net);
      return TS_EINVAL;
    }
  }
  net->z = ts_calloc(L, sizeof *net->z);
  net->a = ts_calloc(L, sizeof *net->a);
  net->argmax = ts_calloc(L, sizeof *net->argmax);
  net->mask = ts_calloc(L, sizeof *net->mask);
  if (!net->z || !net->a || !net->argmax || !net->mask) {
    rc = TS_ENOMEM;
    goto fail;
  }
  size_t B = batch_capacity, mask_max = 0;
  TS_CHECK(alloc_floats(k, net->desc.param_count, &net->params));
  TS_CHECK(alloc_floats(k, net->desc.param_count, &net->grads));
  TS_CHECK(alloc_floats(k, B * ts_layers_elems(input), &net->x));
  {
    void *p = NULL;
    TS_CHECK(k->alloc(k, B * sizeof(int32_t), &p));
    net->labels = p;
  }
  for (size_t i = 0; i < L; i++) TS_CHECK(alloc_layer(net, i, &mask_max));
  TS_CHECK(alloc_floats(k, B * net->desc.classes, &net->probs));
  TS_CHECK(alloc_floats(k, B * net->desc.max_elems, &net->g0));
  TS_CHECK(alloc_floats(k, B * net->desc.max_elems, &net->g1));
  if (net->ws_bytes) TS_CHECK(k->alloc(k, net->ws_bytes, &net->ws));
  if (mask_max) {
    void *p = NULL;
    TS_CHECK(k->host_alloc(k, mask_max * sizeof(float), &p));
    net->mask_host = p;
  }
  return 0;

fail:
  ts_errmsg_printf(errmsg, errlen,
                   "model: allocating the buffers of %zu layers (%zu parameters, batch %zu) on "
                   "kernels '%s': %s%s%s",
                   L, net->desc.param_count, batch_capacity, k->name, ts_strerror(rc),
                   k->last_error && k->last_error(k)[0] ? ": " : "",
                   k->last_error ? k->last_error(k) : "");
  ts_net_destroy(net);
  return rc;
}

void ts_net_destroy(ts_net_t *net) {
  if (!net) return;
  const ts_kernels_t *k = net->kernels;
  if (k) {
    for (size_t i = 0; i < net->desc.num_layers; i++) {
      if (net->z) k->free_buf(k, net->z[i]);
      if (net->a) k->free_buf(k, net->a[i]);
      if (net->argmax) k->free_buf(k, net->argmax[i]);
      if (net->mask) k->free_buf(k, net->mask[i]);
    }
    k->free_buf(k, net->params);
    k->free_buf(k, net->grads);
    k->free_buf(k, net->x);
    k->free_buf(k, net->labels);
    k->free_buf(k, net->probs);
    k->free_buf(k, net->g0);
    k->free_buf(k, net->g1);
    k->free_buf(k, net->ws);
    if (net->mask_host) k->host_free(k, net->mask_host);
  }
  ts_free(net->z);
  ts_free(net->a);
  ts_free(net->argmax);
  ts_free(net->mask);
  ts_layers_free(&net->desc);
  memset(net, 0, sizeof *net);
}

int ts_net_init_params(ts_net_t *net, uint64_t seed) {
  if (!net || !net->params) return TS_EINVAL;
  size_t largest = 0;
  for (size_t t = 0; t < net->desc.num_tensors; t++)
    if (net->desc.tensors[t].count > largest) largest = net->desc.tensors[t].count;
  float *host = ts_malloc((largest ? largest : 1) * sizeof(float));
  if (!host) return TS_ENOMEM;
  int rc = 0;
  const ts_kernels_t *k = net->kernels;
  for (size_t t = 0; t < net->desc.num_tensors && rc == 0; t++) {
    const ts_layer_tensor_t *tn = &net->desc.tensors[t];
    ts_init_fill(host, tn->init, seed, tn->name, tn->shape, tn->rank, 0, tn->count);
    rc = k->copy_to_device(k, net->params + tn->offset, host, tn->count * sizeof(float));
  }
  /* The staging buffer is reused per tensor: wait for the copies before freeing it. */
  if (rc == 0 && k->synchronize) rc = k->synchronize(k);
  ts_free(host);
  return rc;
}

void ts_net_set_training(ts_net_t *net, bool on, uint64_t seed, uint64_t stream) {
  if (!net) return;
  net->training = on;
  net->seed = seed;
  net->stream = stream;
}

/* --- forward ------------------------------------------------------------------------------- */

/* Draw layer i's mask for `count` units on the host and copy it to the device. */
static int draw_mask(ts_net_t *n, size_t i, size_t count) {
  const ts_kernels_t *k = n->kernels;
  double rate = layer(n, i)->spec.rate;
  float keep_scale = (float)(1.0 / (1.0 - rate));
  uint64_t key = ts_init_key(n->seed, layer(n, i)->spec.name) ^
                 (n->stream * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
  /* The host buffer is reused by the next layer's mask: a back end that copies
   * asynchronously must finish this copy first. */
  if (k->synchronize) {
    int rc = k->synchronize(k);
    if (rc < 0) return rc;
  }
  for (size_t j = 0; j < count; j++)
    n->mask_host[j] = ts_init_uniform(key, j) >= rate ? keep_scale : 0.0f;
  return k->copy_to_device(k, n->mask[i], n->mask_host, count * sizeof(float));
}

static int activate(const ts_net_t *n, size_t i, size_t count) {
  const ts_kernels_t *k = n->kernels;
  switch (layer(n, i)->spec.activation) {
    case TS_LAYER_RELU:
      return k->relu_fwd(k, count, n->z[i], n->a[i]);
    case TS_LAYER_TANH:
      return k->tanh_fwd(k, count, n->z[i], n->a[i]);
    case TS_LAYER_LINEAR:
      return 0;
  }
  return TS_EINTERNAL;
}

/* The product's bias, and its ReLU when fused; rows x cols of the product. */
static int add_bias(ts_net_t *n, size_t i, size_t rows, size_t cols, float *prod) {
  const ts_kernels_t *k = n->kernels;
  const float *b = param(n, layer(n, i)->bias);
  return fused_relu(n, i) ? k->bias_relu(k, rows, cols, b, prod)
                          : k->bias_add(k, rows, cols, b, prod);
}

static int forward_layer(ts_net_t *n, size_t i, size_t B) {
  const ts_kernels_t *k = n->kernels;
  const ts_layer_t *L = layer(n, i);
  const float *in = in_of(n, i);
  size_t out = B * ts_layers_elems(L->out);
  float *prod = product_of(n, i);
  int rc = 0;
  switch (L->spec.type) {
    case TS_LAYER_CONV2D: {
      ts_conv2d_t g = geom(L, B);
      rc = k->conv2d_fwd(k, &g, in, param(n, L->kernel), prod, n->ws, n->ws_bytes);
      if (rc == 0) rc = add_bias(n, i, out / L->out.c, L->out.c, prod);
      break;
    }
    case TS_LAYER_DENSE: /* z = in W + b: (B x fan_in) (fan_in x units) */
      rc = k->gemm(k, false, false, B, L->out.c, L->in.c, 1.0f, in, L->in.c, param(n, L->kernel),
                   L->out.c, 0.0f, prod, L->out.c);
      if (rc == 0) rc = add_bias(n, i, B, L->out.c, prod);
      break;
    case TS_LAYER_MAX_POOL: {
      ts_conv2d_t g = geom(L, B);
      rc = k->maxpool_fwd(k, &g, in, n->z[i], n->argmax[i]);
      break;
    }
    case TS_LAYER_DROPOUT:
      if (!dropout_active(n, i)) return 0;
      rc = draw_mask(n, i, out);
      if (rc == 0) rc = k->mul(k, out, in, n->mask[i], n->z[i]);
      break;
    case TS_LAYER_FLATTEN:
      return 0;
  }
  if (rc == 0 && !fused_relu(n, i)) rc = activate(n, i, out);
  return rc;
}

/* Labels are checked on the host, so every back end reports a bad one the same way. */
static int load(ts_net_t *n, const float *x, const int32_t *labels, size_t B) {
  const ts_kernels_t *k = n->kernels;
  for (size_t i = 0; i < B; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= n->desc.classes) return TS_EINVAL;
  int rc = k->copy_to_device(k, n->x, x, B * ts_layers_elems(n->desc.input) * sizeof(float));
  if (rc < 0) return rc;
  return k->copy_to_device(k, n->labels, labels, B * sizeof(int32_t));
}

static int forward(ts_net_t *n, size_t B, float *loss) {
  for (size_t i = 0; i < n->desc.num_layers; i++) {
    int rc = forward_layer(n, i, B);
    if (rc < 0) return rc;
  }
  const ts_kernels_t *k = n->kernels;
  return k->softmax_xent(k, B, n->desc.classes, out_of(n, n->desc.num_layers - 1), n->labels,
                         n->probs, loss);
}

/* --- backward ------------------------------------------------------------------------------ */

/* The gradient through layer i's activation: cur holds d out(i); *cur becomes d z[i]. With
 * the fused kernels it also writes the bias gradient (rows x cols is the product). */
static int activation_grad(ts_net_t *n, size_t i, size_t count, float **cur, float **oth) {
  const ts_kernels_t *k = n->kernels;
  const ts_layer_t *L = layer(n, i);
  int rc;
  switch (L->spec.activation) {
    case TS_LAYER_RELU:
      if (fused_relu(n, i)) {
        rc = k->relu_bwd_bias_grad(k, count / L->out.c, L->out.c, n->a[i], *cur, *oth,
                                   grad(n, L->bias));
        break;
      }
      rc = k->relu_bwd(k, count, n->a[i], *cur, *oth);
      break;
    case TS_LAYER_TANH:
      rc = k->tanh_bwd(k, count, n->a[i], *cur, *oth);
      break;
    case TS_LAYER_LINEAR:
    default:
      return 0;
  }
  float *t = *cur;
  *cur = *oth;
  *oth = t;
  return rc;
}

/* Layer i's parameter gradients from d z (cur), and, when need_in, d in(i) into oth. */
static int backward_layer(ts_net_t *n, size_t i, size_t B, bool need_in, float **cur, float **oth) {
  const ts_kernels_t *k = n->kernels;
  const ts_layer_t *L = layer(n, i);
  const float *in = in_of(n, i);
  size_t out = B * ts_layers_elems(L->out);
  int rc = activation_grad(n, i, out, cur, oth);
  if (rc < 0) return rc;
  bool wrote = false;
  switch (L->spec.type) {
    case TS_LAYER_CONV2D: {
      ts_conv2d_t g = geom(L, B);
      rc = k->conv2d_bwd_filter(k, &g, in, *cur, grad(n, L->kernel), n->ws, n->ws_bytes);
      if (rc == 0 && !fused_relu(n, i))
        rc = k->bias_grad(k, out / L->out.c, L->out.c, *cur, grad(n, L->bias));
      if (rc == 0 && need_in)
        rc = k->conv2d_bwd_data(k, &g, param(n, L->kernel), *cur, *oth, n->ws, n->ws_bytes);
      wrote = need_in;
      break;
    }
    case TS_LAYER_DENSE: /* dW = in^T dz, db = colsum dz, d in = dz W^T */
      rc = k->gemm(k, true, false, L->in.c, L->out.c, B, 1.0f, in, L->in.c, *cur, L->out.c, 0.0f,
                   grad(n, L->kernel), L->out.c);
      if (rc == 0 && !fused_relu(n, i)) rc = k->bias_grad(k, B, L->out.c, *cur, grad(n, L->bias));
      if (rc == 0 && need_in)
        rc = k->gemm(k, false, true, B, L->in.c, L->out.c, 1.0f, *cur, L->out.c,
                     param(n, L->kernel), L->out.c, 0.0f, *oth, L->in.c);
      wrote = need_in;
      break;
    case TS_LAYER_MAX_POOL:
      if (need_in) {
        ts_conv2d_t g = geom(L, B);
        rc = k->maxpool_bwd(k, &g, in, n->z[i], *cur, n->argmax[i], *oth);
        wrote = true;
      }
      break;
    case TS_LAYER_DROPOUT:
      if (need_in && dropout_active(n, i)) rc = k->mul(k, out, *cur, n->mask[i], *cur);
      break;
    case TS_LAYER_FLATTEN:
      break;
  }
  if (wrote) {
    float *t = *cur;
    *cur = *oth;
    *oth = t;
  }
  return rc;
}

static int backward(ts_net_t *n, size_t B) {
  const ts_kernels_t *k = n->kernels;
  size_t first_param = n->desc.num_layers;
  for (size_t i = 0; i < n->desc.num_layers && first_param == n->desc.num_layers; i++)
    if (layer(n, i)->kernel >= 0) first_param = i;
  float *cur = n->g0, *oth = n->g1;
  int rc = k->softmax_xent_grad(k, B, n->desc.classes, n->probs, n->labels, cur);
  for (size_t i = n->desc.num_layers; rc == 0 && i-- > first_param;)
    rc = backward_layer(n, i, B, i > first_param, &cur, &oth);
  return rc;
}

/* --- entry points -------------------------------------------------------------------------- */

static bool batch_ok(const ts_net_t *n, const void *x, const void *labels, size_t B) {
  return n && n->params && x && labels && B >= 1 && B <= n->batch_capacity;
}

int ts_net_forward_backward(ts_net_t *net, const float *x, const int32_t *labels, size_t batch,
                            float *loss) {
  if (!batch_ok(net, x, labels, batch)) return TS_EINVAL;
  float l = 0.0f;
  int rc = load(net, x, labels, batch);
  if (rc == 0) rc = forward(net, batch, &l);
  if (rc == 0) rc = backward(net, batch);
  if (rc == 0 && loss) *loss = l;
  return rc;
}

int ts_net_loss(ts_net_t *net, const float *x, const int32_t *labels, size_t batch, float *loss) {
  if (!batch_ok(net, x, labels, batch) || !loss) return TS_EINVAL;
  int rc = load(net, x, labels, batch);
  return rc < 0 ? rc : forward(net, batch, loss);
}

int ts_net_evaluate(ts_net_t *net, const float *x, const int32_t *labels, size_t n, float *accuracy,
                    float *loss) {
  if (!batch_ok(net, x, labels, 1) || n < 1) return TS_EINVAL;
  const ts_kernels_t *k = net->kernels;
  bool training = net->training;
  net->training = false;
  size_t in = ts_layers_elems(net->desc.input), correct = 0;
  double loss_sum = 0.0;
  int rc = 0;
  for (size_t start = 0; start < n && rc == 0; start += net->batch_capacity) {
    size_t b = n - start < net->batch_capacity ? n - start : net->batch_capacity;
    float l = 0.0f;
    size_t c = 0;
    rc = load(net, x + start * in, labels + start, b);
    if (rc == 0) rc = forward(net, b, &l);
    if (rc == 0)
      rc = k->argmax_correct(k, b, net->desc.classes, out_of(net, net->desc.num_layers - 1),
                             net->labels, &c);
    correct += c;
    loss_sum += (double)l * (double)b;
  }
  net->training = training;
  if (rc < 0) return rc;
  if (accuracy) *accuracy = (float)((double)correct / (double)n);
  if (loss) *loss = (float)(loss_sum / (double)n);
  return 0;
}

int ts_net_load_batch(ts_net_t *net, const float *x, const int32_t *labels, size_t batch) {
  if (!batch_ok(net, x, labels, batch)) return TS_EINVAL;
  return load(net, x, labels, batch);
}

int ts_net_compute(ts_net_t *net, size_t batch, float *loss) {
  if (!net || !net->params || batch < 1 || batch > net->batch_capacity) return TS_EINVAL;
  float l = 0.0f;
  int rc = forward(net, batch, &l);
  if (rc == 0) rc = backward(net, batch);
  if (rc == 0 && loss) *loss = l;
  return rc;
}
