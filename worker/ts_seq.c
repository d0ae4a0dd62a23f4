/*
 * The sequential network (ts_seq.h): running a checked layer list over one or several
 * kernels tables.
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
 *
 * Segments (ts_seq.h): every buffer of layer i is on its segment's table (kern(n, i)); the
 * input of a segment's first layer is the segment's x, filled by the crossing from the
 * previous segment; the backward pass crosses back with the input gradient into the previous
 * segment's g0 and carries on there.
 */
#include "ts_seq.h"

#include <stdint.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_init.h"

static const ts_layer_t *layer(const ts_seq_t *n, size_t i) {
  return &n->desc.layers[i];
}

static const ts_seq_segment_t *seg_of(const ts_seq_t *n, size_t i) {
  return &n->seg[n->seg_of[i]];
}

static const ts_kernels_t *kern(const ts_seq_t *n, size_t i) {
  return seg_of(n, i)->kernels;
}

static const ts_seq_segment_t *last_seg(const ts_seq_t *n) {
  return &n->seg[n->num_segments - 1];
}

static const float *out_of(const ts_seq_t *n, size_t i);

static const float *in_of(const ts_seq_t *n, size_t i) {
  const ts_seq_segment_t *s = seg_of(n, i);
  return i == s->first ? s->x : out_of(n, i - 1);
}

static bool dropout_active(const ts_seq_t *n, size_t i) {
  return n->training && layer(n, i)->spec.rate > 0.0;
}

static const float *out_of(const ts_seq_t *n, size_t i) {
  const ts_layer_t *L = layer(n, i);
  if (L->spec.type == TS_LAYER_FLATTEN) return in_of(n, i);
  if (L->spec.type == TS_LAYER_DROPOUT && !dropout_active(n, i)) return in_of(n, i);
  return n->a[i] ? n->a[i] : n->z[i];
}

/* Tensor t of layer i, in its segment's slice. */
static float *param(const ts_seq_t *n, size_t i, long t) {
  const ts_seq_segment_t *s = seg_of(n, i);
  return s->params + (n->desc.tensors[t].offset - s->param_offset);
}

static float *grad(const ts_seq_t *n, size_t i, long t) {
  const ts_seq_segment_t *s = seg_of(n, i);
  return s->grads + (n->desc.tensors[t].offset - s->param_offset);
}

/* Layer i's bias and ReLU go through the fused kernels (see above). */
static bool fused_relu(const ts_seq_t *n, size_t i) {
  const ts_layer_t *L = layer(n, i);
  return (L->spec.type == TS_LAYER_CONV2D || L->spec.type == TS_LAYER_DENSE) &&
         L->spec.activation == TS_LAYER_RELU && kern(n, i)->bias_relu &&
         kern(n, i)->relu_bwd_bias_grad;
}

/* Where layer i's product goes: a[i] when fused, else z[i]. */
static float *product_of(const ts_seq_t *n, size_t i) {
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

const char *ts_seq_layer_kernel_missing(const ts_kernels_t *k, const ts_layer_spec_t *spec) {
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
  return ts_seq_layer_kernel_missing(k, &L->spec);
}

static int alloc_layer(ts_seq_t *n, size_t i, size_t *mask_max) {
  ts_seq_segment_t *s = &n->seg[n->seg_of[i]];
  const ts_kernels_t *k = s->kernels;
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
      if (ws > s->ws_bytes) s->ws_bytes = ws;
      break;
    }
    case TS_LAYER_DENSE:
      break;
  }
  if (rc == 0 && !fused_relu(n, i)) rc = alloc_floats(k, out, &n->z[i]);
  if (rc == 0 && L->spec.activation != TS_LAYER_LINEAR) rc = alloc_floats(k, out, &n->a[i]);
  return rc;
}

/* Cut the layers into segments of one table each, and give each its range of the flat
 * layout (its layers' tensors, contiguous: the tensor list is in layer order). */
static int make_segments(ts_seq_t *seq, const ts_kernels_t *const *lk, char *errmsg,
                         size_t errlen) {
  size_t L = seq->desc.num_layers;
  for (size_t i = 0; i < L; i++) {
    if (!lk[i]) {
      ts_errmsg_printf(errmsg, errlen, "model: no kernels for layer %zu '%s'", i + 1,
                       layer(seq, i)->spec.name);
      return TS_EINVAL;
    }
    if (i == 0 || lk[i] != lk[i - 1]) {
      if (seq->num_segments == TS_SEQ_SEGMENTS_MAX) {
        ts_errmsg_printf(errmsg, errlen,
                         "model: layer %zu '%s' starts a segment past the %d a model may have "
                         "(runs of consecutive layers on one device)",
                         i + 1, layer(seq, i)->spec.name, TS_SEQ_SEGMENTS_MAX);
        return TS_EINVAL;
      }
      ts_seq_segment_t *s = &seq->seg[seq->num_segments++];
      s->kernels = lk[i];
      s->first = i;
      s->param_offset = SIZE_MAX;
    }
    ts_seq_segment_t *s = &seq->seg[seq->num_segments - 1];
    s->end = i + 1;
    seq->seg_of[i] = seq->num_segments - 1;
    const ts_layer_t *Li = layer(seq, i);
    long ts[2] = {Li->kernel, Li->bias};
    for (size_t j = 0; j < 2; j++) {
      if (ts[j] < 0) continue;
      const ts_layer_tensor_t *tn = &seq->desc.tensors[ts[j]];
      if (s->param_offset == SIZE_MAX) s->param_offset = tn->offset;
      s->param_count = tn->offset + tn->count - s->param_offset;
    }
  }
  /* A segment without parameters sits where the next tensor would start. */
  size_t next = seq->desc.param_count;
  for (size_t j = seq->num_segments; j-- > 0;) {
    if (seq->seg[j].param_offset == SIZE_MAX) seq->seg[j].param_offset = next;
    next = seq->seg[j].param_offset;
  }
  return 0;
}

/* The host staging of the boundary into segment j: pinned memory of whichever side is a
 * device (the receiving one first), ordinary memory when both are the host. */
static int alloc_stage(ts_seq_t *seq, size_t j) {
  ts_seq_segment_t *s = &seq->seg[j];
  const ts_kernels_t *prev = seq->seg[j - 1].kernels;
  const ts_kernels_t *k = !s->kernels->device_is_host ? s->kernels
                          : !prev->device_is_host     ? prev
                                                      : s->kernels;
  size_t elems = seq->batch_capacity * ts_layers_elems(layer(seq, s->first)->in);
  void *p = NULL;
  int rc = k->host_alloc(k, elems * sizeof(float), &p);
  s->stage = p;
  s->stage_kernels = rc == 0 ? k : NULL;
  return rc;
}

/* Segment j's own buffers: parameters, gradients, input, scratch, its layers' buffers. */
static int alloc_segment(ts_seq_t *seq, size_t j) {
  ts_seq_segment_t *s = &seq->seg[j];
  const ts_kernels_t *k = s->kernels;
  size_t B = seq->batch_capacity, mask_max = 0, max_elems = 0;
  int rc = 0;
  for (size_t i = s->first; i < s->end; i++) {
    size_t in = ts_layers_elems(layer(seq, i)->in), out = ts_layers_elems(layer(seq, i)->out);
    if (in > max_elems) max_elems = in;
    if (out > max_elems) max_elems = out;
  }
  TS_CHECK(alloc_floats(k, s->param_count, &s->params));
  TS_CHECK(alloc_floats(k, s->param_count, &s->grads));
  TS_CHECK(alloc_floats(k, B * ts_layers_elems(layer(seq, s->first)->in), &s->x));
  for (size_t i = s->first; i < s->end; i++) TS_CHECK(alloc_layer(seq, i, &mask_max));
  TS_CHECK(alloc_floats(k, B * max_elems, &s->g0));
  TS_CHECK(alloc_floats(k, B * max_elems, &s->g1));
  if (s->ws_bytes) TS_CHECK(k->alloc(k, s->ws_bytes, &s->ws));
  if (mask_max) {
    void *p = NULL;
    TS_CHECK(k->host_alloc(k, mask_max * sizeof(float), &p));
    s->mask_host = p;
  }
  if (j > 0) TS_CHECK(alloc_stage(seq, j));
fail:
  return rc;
}

int ts_seq_init_split(ts_seq_t *seq, const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                      size_t batch_capacity, const ts_kernels_t *const *layer_kernels, char *errmsg,
                      size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!seq) return TS_EINVAL;
  memset(seq, 0, sizeof *seq);
  if (!layer_kernels) {
    ts_errmsg_printf(errmsg, errlen, "model: no kernels");
    return TS_EINVAL;
  }
  if (batch_capacity < 1 || batch_capacity > TS_CONV_MAX_BATCH) {
    ts_errmsg_printf(errmsg, errlen, "model: batch capacity %zu outside 1..%d", batch_capacity,
                     TS_CONV_MAX_BATCH);
    return TS_EINVAL;
  }
  int rc = ts_layers_check(specs, n, input, &seq->desc, NULL, errmsg, errlen);
  if (rc < 0) return rc;
  seq->batch_capacity = batch_capacity;
  size_t L = seq->desc.num_layers;
  seq->seg_of = ts_calloc(L, sizeof *seq->seg_of);
  if (!seq->seg_of) {
    ts_layers_free(&seq->desc);
    memset(seq, 0, sizeof *seq);
    ts_errmsg_printf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  rc = make_segments(seq, layer_kernels, errmsg, errlen);
  for (size_t i = 0; rc == 0 && i < L; i++) {
    const ts_kernels_t *k = kern(seq, i);
    const char *miss = missing_kernel(k, layer(seq, i));
    if (miss) {
      ts_errmsg_printf(errmsg, errlen, "kernels '%s': no %s kernel for layer %zu '%s' (%s)",
                       k->name, miss, i + 1, layer(seq, i)->spec.name,
                       ts_layers_type_name(layer(seq, i)->spec.type));
      rc = TS_EINVAL;
    }
  }
  if (rc < 0) {
    ts_free(seq->seg_of);
    ts_layers_free(&seq->desc);
    memset(seq, 0, sizeof *seq);
    return rc;
  }
  seq->kernels = seq->seg[0].kernels;
  size_t j = 0; /* the segment being allocated, for the error */
  seq->z = ts_calloc(L, sizeof *seq->z);
  seq->a = ts_calloc(L, sizeof *seq->a);
  seq->argmax = ts_calloc(L, sizeof *seq->argmax);
  seq->mask = ts_calloc(L, sizeof *seq->mask);
  if (!seq->z || !seq->a || !seq->argmax || !seq->mask) {
    rc = TS_ENOMEM;
    goto fail;
  }
  for (; j < seq->num_segments; j++) TS_CHECK(alloc_segment(seq, j));
  const ts_kernels_t *kl = last_seg(seq)->kernels;
  j = seq->num_segments - 1;
  {
    void *p = NULL;
    TS_CHECK(kl->alloc(kl, batch_capacity * sizeof(int32_t), &p));
    seq->labels = p;
  }
  TS_CHECK(alloc_floats(kl, batch_capacity * seq->desc.classes, &seq->probs));
  if (seq->num_segments == 1) {
    seq->params = seq->seg[0].params;
    seq->grads = seq->seg[0].grads;
  }
  return 0;

fail:;
  const ts_kernels_t *k = seq->seg[j < seq->num_segments ? j : 0].kernels;
  ts_errmsg_printf(errmsg, errlen,
                   "model: allocating the buffers of %zu layers (%zu parameters, batch %zu) on "
                   "kernels '%s': %s%s%s",
                   L, seq->desc.param_count, batch_capacity, k->name, ts_strerror(rc),
                   k->last_error && k->last_error(k)[0] ? ": " : "",
                   k->last_error ? k->last_error(k) : "");
  ts_seq_destroy(seq);
  return rc;
}

int ts_seq_init(ts_seq_t *seq, const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen) {
  if (!kernels)
    return ts_seq_init_split(seq, specs, n, input, batch_capacity, NULL, errmsg, errlen);
  const ts_kernels_t **lk = ts_malloc((n ? n : 1) * sizeof *lk);
  if (!lk) {
    if (seq) memset(seq, 0, sizeof *seq);
    if (errmsg && errlen) ts_errmsg_printf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  for (size_t i = 0; i < (n ? n : 1); i++) lk[i] = kernels;
  int rc = ts_seq_init_split(seq, specs, n, input, batch_capacity, lk, errmsg, errlen);
  ts_free(lk);
  return rc;
}

void ts_seq_destroy(ts_seq_t *seq) {
  if (!seq) return;
  for (size_t i = 0; seq->seg_of && i < seq->desc.num_layers; i++) {
    const ts_kernels_t *k = kern(seq, i);
    if (!k) continue;
    if (seq->z) k->free_buf(k, seq->z[i]);
    if (seq->a) k->free_buf(k, seq->a[i]);
    if (seq->argmax) k->free_buf(k, seq->argmax[i]);
    if (seq->mask) k->free_buf(k, seq->mask[i]);
  }
  for (size_t j = 0; j < seq->num_segments; j++) {
    ts_seq_segment_t *s = &seq->seg[j];
    const ts_kernels_t *k = s->kernels;
    k->free_buf(k, s->params);
    k->free_buf(k, s->grads);
    k->free_buf(k, s->x);
    k->free_buf(k, s->g0);
    k->free_buf(k, s->g1);
    k->free_buf(k, s->ws);
    if (s->mask_host) k->host_free(k, s->mask_host);
    if (s->stage) s->stage_kernels->host_free(s->stage_kernels, s->stage);
  }
  if (seq->num_segments) {
    const ts_kernels_t *kl = last_seg(seq)->kernels;
    kl->free_buf(kl, seq->labels);
    kl->free_buf(kl, seq->probs);
  }
  ts_free(seq->z);
  ts_free(seq->a);
  ts_free(seq->argmax);
  ts_free(seq->mask);
  ts_free(seq->seg_of);
  ts_layers_free(&seq->desc);
  memset(seq, 0, sizeof *seq);
}

/* --- the flat layout ----------------------------------------------------------------------- */

/* Copy [offset, offset + count) of the flat layout between host and the segments' params
 * (or grads) that hold it. */
static int flat_io(const ts_seq_t *seq, bool grads, bool to_device, size_t offset, float *host,
                   size_t count) {
  if (!seq || seq->num_segments == 0 || (!host && count) || offset > seq->desc.param_count ||
      count > seq->desc.param_count - offset)
    return TS_EINVAL;
  for (size_t j = 0; j < seq->num_segments && count; j++) {
    const ts_seq_segment_t *s = &seq->seg[j];
    size_t lo = s->param_offset, hi = lo + s->param_count;
    size_t a = offset > lo ? offset : lo, b = offset + count < hi ? offset + count : hi;
    if (a >= b) continue;
    const ts_kernels_t *k = s->kernels;
    float *dev = (grads ? s->grads : s->params) + (a - lo);
    float *h = host + (a - offset);
    int rc = to_device ? k->copy_to_device(k, dev, h, (b - a) * sizeof(float))
                       : k->copy_to_host(k, h, dev, (b - a) * sizeof(float));
    if (rc < 0) return rc;
  }
  return 0;
}

int ts_seq_set_params(ts_seq_t *seq, size_t offset, const float *src, size_t count) {
  /* flat_io only reads host when copying to the device. */
  return flat_io(seq, false, true, offset, (float *)(uintptr_t)src, count);
}

int ts_seq_get_params(const ts_seq_t *seq, size_t offset, float *dst, size_t count) {
  return flat_io(seq, false, false, offset, dst, count);
}

int ts_seq_get_grads(const ts_seq_t *seq, size_t offset, float *dst, size_t count) {
  return flat_io(seq, true, false, offset, dst, count);
}

int ts_seq_synchronize(const ts_seq_t *seq) {
  int rc = 0;
  for (size_t j = 0; seq && j < seq->num_segments; j++) {
    const ts_kernels_t *k = seq->seg[j].kernels;
    int r = k->synchronize ? k->synchronize(k) : 0;
    if (rc == 0) rc = r;
  }
  return rc;
}

int ts_seq_init_params(ts_seq_t *seq, uint64_t seed) {
  if (!seq || seq->num_segments == 0) return TS_EINVAL;
  size_t largest = 0;
  for (size_t t = 0; t < seq->desc.num_tensors; t++)
    if (seq->desc.tensors[t].count > largest) largest = seq->desc.tensors[t].count;
  float *host = ts_malloc((largest ? largest : 1) * sizeof(float));
  if (!host) return TS_ENOMEM;
  int rc = 0;
  for (size_t t = 0; t < seq->desc.num_tensors && rc == 0; t++) {
    const ts_layer_tensor_t *tn = &seq->desc.tensors[t];
    ts_init_fill(host, tn->init, seed, tn->name, tn->shape, tn->rank, 0, tn->count);
    rc = ts_seq_set_params(seq, tn->offset, host, tn->count);
    /* The staging buffer is reused per tensor: wait for the copies before refilling it. */
    if (rc == 0) rc = ts_seq_synchronize(seq);
  }
  ts_free(host);
  return rc;
}

void ts_seq_set_training(ts_seq_t *seq, bool on, uint64_t seed, uint64_t stream) {
  if (!seq) return;
  seq->training = on;
  seq->seed = seed;
  seq->stream = stream;
}

/* --- forward ------------------------------------------------------------------------------- */

/* Draw layer i's mask for `count` units on the host and copy it to the device. */
static int draw_mask(ts_seq_t *n, size_t i, size_t count) {
  const ts_kernels_t *k = kern(n, i);
  float *host = seg_of(n, i)->mask_host;
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
  for (size_t j = 0; j < count; j++) host[j] = ts_init_uniform(key, j) >= rate ? keep_scale : 0.0f;
  return k->copy_to_device(k, n->mask[i], host, count * sizeof(float));
}

static int activate(const ts_seq_t *n, size_t i, size_t count) {
  const ts_kernels_t *k = kern(n, i);
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
static int add_bias(ts_seq_t *n, size_t i, size_t rows, size_t cols, float *prod) {
  const ts_kernels_t *k = kern(n, i);
  const float *b = param(n, i, layer(n, i)->bias);
  return fused_relu(n, i) ? k->bias_relu(k, rows, cols, b, prod)
                          : k->bias_add(k, rows, cols, b, prod);
}

static int forward_layer(ts_seq_t *n, size_t i, size_t B) {
  const ts_kernels_t *k = kern(n, i);
  const ts_seq_segment_t *s = seg_of(n, i);
  const ts_layer_t *L = layer(n, i);
  const float *in = in_of(n, i);
  size_t out = B * ts_layers_elems(L->out);
  float *prod = product_of(n, i);
  int rc = 0;
  switch (L->spec.type) {
    case TS_LAYER_CONV2D: {
      ts_conv2d_t g = geom(L, B);
      rc = k->conv2d_fwd(k, &g, in, param(n, i, L->kernel), prod, s->ws, s->ws_bytes);
      if (rc == 0) rc = add_bias(n, i, out / L->out.c, L->out.c, prod);
      break;
    }
    case TS_LAYER_DENSE: /* z = in W + b: (B x fan_in) (fan_in x units) */
      rc = k->gemm(k, false, false, B, L->out.c, L->in.c, 1.0f, in, L->in.c, param(n, i, L->kernel),
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
static int load(ts_seq_t *n, const float *x, const int32_t *labels, size_t B) {
  const ts_kernels_t *k = n->seg[0].kernels, *kl = last_seg(n)->kernels;
  for (size_t i = 0; i < B; i++)
    if (labels[i] < 0 || (size_t)labels[i] >= n->desc.classes) return TS_EINVAL;
  int rc = k->copy_to_device(k, n->seg[0].x, x, B * ts_layers_elems(n->desc.input) * sizeof(float));
  if (rc < 0) return rc;
  return kl->copy_to_device(kl, n->labels, labels, B * sizeof(int32_t));
}

/* A boundary crossing: `bytes` from src on table `from` to dst on table `to` through the host
 * staging of segment s. copy_to_host waits for `from`; `to` is waited for before returning,
 * as the staging is refilled by the next crossing. */
static int cross(const ts_seq_segment_t *s, const ts_kernels_t *from, const void *src,
                 const ts_kernels_t *to, void *dst, size_t bytes) {
  int rc = from->copy_to_host(from, s->stage, src, bytes);
  if (rc == 0) rc = to->copy_to_device(to, dst, s->stage, bytes);
  if (rc == 0 && to->synchronize) rc = to->synchronize(to);
  return rc;
}

static int forward(ts_seq_t *n, size_t B, float *loss) {
  for (size_t i = 0; i < n->desc.num_layers; i++) {
    const ts_seq_segment_t *s = seg_of(n, i);
    int rc = 0;
    if (i == s->first && i > 0) /* into this segment: the previous one's output */
      rc = cross(s, kern(n, i - 1), out_of(n, i - 1), s->kernels, s->x,
                 B * ts_layers_elems(layer(n, i)->in) * sizeof(float));
    if (rc == 0) rc = forward_layer(n, i, B);
    if (rc < 0) return rc;
  }
  const ts_kernels_t *k = last_seg(n)->kernels;
  return k->softmax_xent(k, B, n->desc.classes, out_of(n, n->desc.num_layers - 1), n->labels,
                         n->probs, loss);
}

/* --- backward ------------------------------------------------------------------------------ */

/* The gradient through layer i's activation: cur holds d out(i); *cur becomes d z[i]. With
 * the fused kernels it also writes the bias gradient (rows x cols is the product). */
static int activation_grad(ts_seq_t *n, size_t i, size_t count, float **cur, float **oth) {
  const ts_kernels_t *k = kern(n, i);
  const ts_layer_t *L = layer(n, i);
  int rc;
  switch (L->spec.activation) {
    case TS_LAYER_RELU:
      if (fused_relu(n, i)) {
        rc = k->relu_bwd_bias_grad(k, count / L->out.c, L->out.c, n->a[i], *cur, *oth,
                                   grad(n, i, L->bias));
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
static int backward_layer(ts_seq_t *n, size_t i, size_t B, bool need_in, float **cur, float **oth) {
  const ts_kernels_t *k = kern(n, i);
  const ts_seq_segment_t *s = seg_of(n, i);
  const ts_layer_t *L = layer(n, i);
  const float *in = in_of(n, i);
  size_t out = B * ts_layers_elems(L->out);
  int rc = activation_grad(n, i, out, cur, oth);
  if (rc < 0) return rc;
  bool wrote = false;
  switch (L->spec.type) {
    case TS_LAYER_CONV2D: {
      ts_conv2d_t g = geom(L, B);
      rc = k->conv2d_bwd_filter(k, &g, in, *cur, grad(n, i, L->kernel), s->ws, s->ws_bytes);
      if (rc == 0 && !fused_relu(n, i))
        rc = k->bias_grad(k, out / L->out.c, L->out.c, *cur, grad(n, i, L->bias));
      if (rc == 0 && need_in)
        rc = k->conv2d_bwd_data(k, &g, param(n, i, L->kernel), *cur, *oth, s->ws, s->ws_bytes);
      wrote = need_in;
      break;
    }
    case TS_LAYER_DENSE: /* dW = in^T dz, db = colsum dz, d in = dz W^T */
      rc = k->gemm(k, true, false, L->in.c, L->out.c, B, 1.0f, in, L->in.c, *cur, L->out.c, 0.0f,
                   grad(n, i, L->kernel), L->out.c);
      if (rc == 0 && !fused_relu(n, i))
        rc = k->bias_grad(k, B, L->out.c, *cur, grad(n, i, L->bias));
      if (rc == 0 && need_in)
        rc = k->gemm(k, false, true, B, L->in.c, L->out.c, 1.0f, *cur, L->out.c,
                     param(n, i, L->kernel), L->out.c, 0.0f, *oth, L->in.c);
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

static int backward(ts_seq_t *n, size_t B) {
  const ts_seq_segment_t *s = last_seg(n);
  const ts_kernels_t *k = s->kernels;
  size_t first_param = n->desc.num_layers;
  for (size_t i = 0; i < n->desc.num_layers && first_param == n->desc.num_layers; i++)
    if (layer(n, i)->kernel >= 0) first_param = i;
  float *cur = s->g0, *oth = s->g1;
  int rc = k->softmax_xent_grad(k, B, n->desc.classes, n->probs, n->labels, cur);
  /* With want_input_grad the loop goes down to layer 0 and leaves d input in cur. */
  size_t stop = n->want_input_grad ? 0 : first_param;
  for (size_t i = n->desc.num_layers; rc == 0 && i-- > stop;) {
    rc = backward_layer(n, i, B, i > stop || n->want_input_grad, &cur, &oth);
    s = seg_of(n, i);
    if (rc == 0 && i == s->first && i > stop) {
      /* Out of this segment: d in(i) to the previous segment's scratch. */
      const ts_seq_segment_t *prev = seg_of(n, i - 1);
      rc = cross(s, s->kernels, cur, prev->kernels, prev->g0,
                 B * ts_layers_elems(layer(n, i)->in) * sizeof(float));
      cur = prev->g0;
      oth = prev->g1;
    }
  }
  n->input_grad = cur;
  return rc;
}

/* --- entry points -------------------------------------------------------------------------- */

static bool batch_ok(const ts_seq_t *n, const void *x, const void *labels, size_t B) {
  return n && n->num_segments && x && labels && B >= 1 && B <= n->batch_capacity;
}

int ts_seq_forward_backward(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch,
                            float *loss) {
  if (!batch_ok(seq, x, labels, batch)) return TS_EINVAL;
  float l = 0.0f;
  int rc = load(seq, x, labels, batch);
  if (rc == 0) rc = forward(seq, batch, &l);
  if (rc == 0) rc = backward(seq, batch);
  if (rc == 0 && loss) *loss = l;
  return rc;
}

int ts_seq_loss(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch, float *loss) {
  if (!batch_ok(seq, x, labels, batch) || !loss) return TS_EINVAL;
  int rc = load(seq, x, labels, batch);
  return rc < 0 ? rc : forward(seq, batch, loss);
}

int ts_seq_evaluate(ts_seq_t *seq, const float *x, const int32_t *labels, size_t n, float *accuracy,
                    float *loss) {
  if (!batch_ok(seq, x, labels, 1) || n < 1) return TS_EINVAL;
  const ts_kernels_t *k = last_seg(seq)->kernels;
  bool training = seq->training;
  seq->training = false;
  size_t in = ts_layers_elems(seq->desc.input), correct = 0;
  double loss_sum = 0.0;
  int rc = 0;
  for (size_t start = 0; start < n && rc == 0; start += seq->batch_capacity) {
    size_t b = n - start < seq->batch_capacity ? n - start : seq->batch_capacity;
    float l = 0.0f;
    size_t c = 0;
    rc = load(seq, x + start * in, labels + start, b);
    if (rc == 0) rc = forward(seq, b, &l);
    if (rc == 0)
      rc = k->argmax_correct(k, b, seq->desc.classes, out_of(seq, seq->desc.num_layers - 1),
                             seq->labels, &c);
    correct += c;
    loss_sum += (double)l * (double)b;
  }
  seq->training = training;
  if (rc < 0) return rc;
  if (accuracy) *accuracy = (float)((double)correct / (double)n);
  if (loss) *loss = (float)(loss_sum / (double)n);
  return 0;
}

int ts_seq_load_batch(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch) {
  if (!batch_ok(seq, x, labels, batch)) return TS_EINVAL;
  return load(seq, x, labels, batch);
}

int ts_seq_compute(ts_seq_t *seq, size_t batch, float *loss) {
  if (!seq || !seq->num_segments || batch < 1 || batch > seq->batch_capacity) return TS_EINVAL;
  float l = 0.0f;
  int rc = forward(seq, batch, &l);
  /* The training accuracy, from the logits before backward may reuse their buffer. */
  const ts_kernels_t *k = last_seg(seq)->kernels;
  if (rc == 0)
    rc = k->argmax_correct(k, batch, seq->desc.classes, out_of(seq, seq->desc.num_layers - 1),
                           seq->labels, &seq->last_correct);
  if (rc == 0) rc = backward(seq, batch);
  if (rc == 0 && loss) *loss = l;
  return rc;
}

int ts_seq_input_grad(const ts_seq_t *seq, float *dst, size_t batch) {
  if (!seq || !seq->num_segments || !dst || !seq->want_input_grad || !seq->input_grad ||
      batch < 1 || batch > seq->batch_capacity)
    return TS_EINVAL;
  const ts_kernels_t *k = seq->seg[0].kernels;
  return k->copy_to_host(k, dst, seq->input_grad,
                         batch * ts_layers_elems(seq->desc.input) * sizeof(float));
}

int ts_seq_probs(const ts_seq_t *seq, float *dst, size_t batch) {
  if (!seq || !seq->num_segments || !dst || batch < 1 || batch > seq->batch_capacity)
    return TS_EINVAL;
  const ts_kernels_t *k = seq->seg[seq->num_segments - 1].kernels;
  return k->copy_to_host(k, dst, seq->probs, batch * seq->desc.classes * sizeof(float));
}
