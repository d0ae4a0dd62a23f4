/*
 * Checking a layer description (ts_layers.h): defaults, names, shape inference, tensors.
 * Every rule that refuses a description is here, so that a worker refuses a bad model before
 * it allocates anything or declares anything to a shard.
 */
#include "ts_layers.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

static const char *const type_names[] = {
    [TS_LAYER_CONV2D] = "conv2d", [TS_LAYER_MAX_POOL] = "max_pool", [TS_LAYER_FLATTEN] = "flatten",
    [TS_LAYER_DENSE] = "dense",   [TS_LAYER_DROPOUT] = "dropout",
};
/* The prefix of a default name, numbered per type. */
static const char *const name_prefix[] = {
    [TS_LAYER_CONV2D] = "conv", [TS_LAYER_MAX_POOL] = "pool",   [TS_LAYER_FLATTEN] = "flatten",
    [TS_LAYER_DENSE] = "fc",    [TS_LAYER_DROPOUT] = "dropout",
};
static const char *const act_names[] = {
    [TS_LAYER_LINEAR] = "linear", [TS_LAYER_RELU] = "relu", [TS_LAYER_TANH] = "tanh"};

const char *ts_layers_type_name(ts_layer_type_t t) {
  return t >= TS_LAYER_CONV2D && t <= TS_LAYER_DROPOUT ? type_names[t] : "unknown";
}

/* The index i in [lo, hi] whose names[i] is s, or -1. */
static int name_index(const char *const *names, int lo, int hi, const char *s) {
  for (int i = lo; i <= hi; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

int ts_layers_parse_type(const char *s, ts_layer_type_t *out) {
  if (!s || !out) return -1;
  int t = name_index(type_names, TS_LAYER_CONV2D, TS_LAYER_DROPOUT, s);
  if (t >= 0) *out = (ts_layer_type_t)t;
  return t < 0 ? -1 : 0;
}

const char *ts_layers_act_name(ts_layer_act_t a) {
  return a >= TS_LAYER_LINEAR && a <= TS_LAYER_TANH ? act_names[a] : "unknown";
}

int ts_layers_parse_act(const char *s, ts_layer_act_t *out) {
  if (!s || !out) return -1;
  int a = name_index(act_names, TS_LAYER_LINEAR, TS_LAYER_TANH, s);
  if (a >= 0) *out = (ts_layer_act_t)a;
  return a < 0 ? -1 : 0;
}

size_t ts_layers_elems(ts_layer_shape_t s) {
  return s.h * s.w * s.c;
}

static bool is_flat(ts_layer_shape_t s) {
  return s.h == 1 && s.w == 1;
}

/* "layer 3 'conv2' (conv2d): " before the reason. */
static int layer_error(char *errmsg, size_t errlen, size_t i, const ts_layer_spec_t *s,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int layer_error(char *errmsg, size_t errlen, size_t i, const ts_layer_spec_t *s,
                       const char *fmt, ...) {
  char why[192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  ts_errmsg_printf(errmsg, errlen, "layer %zu '%s' (%s): %s", i + 1, s->name,
                   ts_layers_type_name(s->type), why);
  return TS_EINVAL;
}

static void add_tensor(ts_layers_t *l, const char *layer, const char *what, const uint64_t *shape,
                       size_t rank, ts_init_kind_t init) {
  ts_layer_tensor_t *t = &l->tensors[l->num_tensors++];
  snprintf(t->name, sizeof t->name, "%s/%s", layer, what);
  t->rank = rank;
  t->count = 1;
  for (size_t d = 0; d < rank; d++) {
    t->shape[d] = shape[d];
    t->count *= (size_t)shape[d];
  }
  t->init = init;
  t->offset = l->param_count;
  l->param_count += t->count;
}

/* Fill defaults and the name of spec i; counts[] numbers the layers of each type. */
static int fill_spec(ts_layer_spec_t *s, size_t i, size_t *counts, char *errmsg, size_t errlen) {
  if (s->type < TS_LAYER_CONV2D || s->type > TS_LAYER_DROPOUT) {
    ts_errmsg_printf(errmsg, errlen, "layer %zu: unknown layer type %d", i + 1, (int)s->type);
    return TS_EINVAL;
  }
  counts[s->type]++;
  if (memchr(s->name, 0, sizeof s->name) == NULL) {
    ts_errmsg_printf(errmsg, errlen, "layer %zu: a name of %d characters or more", i + 1,
                     TS_LAYERS_NAME_MAX);
    return TS_EINVAL;
  }
  if (s->name[0] == 0)
    snprintf(s->name, sizeof s->name, "%s%zu", name_prefix[s->type], counts[s->type]);
  if (strchr(s->name, '/')) return layer_error(errmsg, errlen, i, s, "a name may not contain '/'");
  if (s->type == TS_LAYER_CONV2D || s->type == TS_LAYER_MAX_POOL) {
    if (s->stride_h == 0) s->stride_h = s->type == TS_LAYER_CONV2D ? 1 : s->win_h;
    if (s->stride_w == 0) s->stride_w = s->type == TS_LAYER_CONV2D ? 1 : s->win_w;
    if (s->padding == 0) s->padding = TS_PAD_VALID;
    if (s->padding != TS_PAD_VALID && s->padding != TS_PAD_SAME)
      return layer_error(errmsg, errlen, i, s, "unknown padding %d", (int)s->padding);
  }
  if (s->activation < TS_LAYER_LINEAR || s->activation > TS_LAYER_TANH)
    return layer_error(errmsg, errlen, i, s, "unknown activation %d", (int)s->activation);
  return 0;
}

static int window_layer(ts_layer_t *L, size_t i, char *errmsg, size_t errlen) {
  const ts_layer_spec_t *s = &L->spec;
  bool conv = s->type == TS_LAYER_CONV2D;
  const char *what = conv ? "kernel" : "pool size";
  if (is_flat(L->in) && L->in.c > 1 && i > 0)
    return layer_error(errmsg, errlen, i, s, "needs an image input but gets a flat vector of %zu",
                       L->in.c);
  if (conv && (s->filters < 1 || s->filters > TS_CONV_MAX_DIM))
    return layer_error(errmsg, errlen, i, s, "filters = %zu outside 1..%d", s->filters,
                       TS_CONV_MAX_DIM);
  if (s->win_h < 1 || s->win_w < 1 || s->win_h > TS_CONV_MAX_DIM || s->win_w > TS_CONV_MAX_DIM)
    return layer_error(errmsg, errlen, i, s, "%s %zux%zu: each side must be in 1..%d", what,
                       s->win_h, s->win_w, TS_CONV_MAX_DIM);
  if (s->stride_h > TS_CONV_MAX_DIM || s->stride_w > TS_CONV_MAX_DIM)
    return layer_error(errmsg, errlen, i, s, "strides %zux%zu: each must be in 1..%d", s->stride_h,
                       s->stride_w, TS_CONV_MAX_DIM);
  if (s->padding == TS_PAD_VALID && (s->win_h > L->in.h || s->win_w > L->in.w))
    return layer_error(errmsg, errlen, i, s,
                       "%s %zux%zu does not fit its %zux%zux%zu input with padding valid "
                       "(use padding same, or a smaller %s)",
                       what, s->win_h, s->win_w, L->in.h, L->in.w, L->in.c, what);
  if (ts_conv_geometry(&L->geom, 1, L->in.h, L->in.w, L->in.c, s->win_h, s->win_w, s->stride_h,
                       s->stride_w, s->padding, conv ? s->filters : 0) < 0)
    return layer_error(errmsg, errlen, i, s, "%s %zux%zu on a %zux%zux%zu input is too large", what,
                       s->win_h, s->win_w, L->in.h, L->in.w, L->in.c);
  L->out = (ts_layer_shape_t){L->geom.out_h, L->geom.out_w, L->geom.out_c};
  return 0;
}

static int infer(ts_layers_t *l, size_t i, char *errmsg, size_t errlen) {
  ts_layer_t *L = &l->layers[i];
  const ts_layer_spec_t *s = &L->spec;
  L->kernel = L->bias = -1;
  if (s->type != TS_LAYER_CONV2D && s->type != TS_LAYER_DENSE && s->activation != TS_LAYER_LINEAR)
    return layer_error(errmsg, errlen, i, s, "has no activation (it is %s)",
                       ts_layers_act_name(s->activation));
  switch (s->type) {
    case TS_LAYER_CONV2D:
    case TS_LAYER_MAX_POOL: {
      int rc = window_layer(L, i, errmsg, errlen);
      if (rc < 0) return rc;
      if (s->type == TS_LAYER_CONV2D) {
        uint64_t kshape[4] = {s->win_h, s->win_w, L->in.c, s->filters}, bshape[1] = {s->filters};
        L->kernel = (long)l->num_tensors;
        add_tensor(l, s->name, "kernel", kshape, 4, TS_INIT_GLOROT_UNIFORM);
        L->bias = (long)l->num_tensors;
        add_tensor(l, s->name, "bias", bshape, 1, TS_INIT_ZEROS);
      }
      return 0;
    }
    case TS_LAYER_FLATTEN:
      L->out = (ts_layer_shape_t){1, 1, ts_layers_elems(L->in)};
      return 0;
    case TS_LAYER_DENSE: {
      if (!is_flat(L->in))
        return layer_error(
            errmsg, errlen, i, s,
            "needs a flat input but gets %zux%zux%zu (put a flatten layer before it)", L->in.h,
            L->in.w, L->in.c);
      if (s->units < 1 || s->units > TS_LAYERS_MAX_UNITS)
        return layer_error(errmsg, errlen, i, s, "units = %zu outside 1..%d", s->units,
                           TS_LAYERS_MAX_UNITS);
      uint64_t kshape[2] = {L->in.c, s->units}, bshape[1] = {s->units};
      L->kernel = (long)l->num_tensors;
      add_tensor(l, s->name, "kernel", kshape, 2, TS_INIT_GLOROT_UNIFORM);
      L->bias = (long)l->num_tensors;
      add_tensor(l, s->name, "bias", bshape, 1, TS_INIT_ZEROS);
      L->out = (ts_layer_shape_t){1, 1, s->units};
      return 0;
    }
    case TS_LAYER_DROPOUT:
      if (!(s->rate >= 0.0 && s->rate < 1.0))
        return layer_error(errmsg, errlen, i, s, "rate = %g outside [0, 1)", s->rate);
      L->out = L->in;
      return 0;
  }
  return TS_EINTERNAL;
}

int ts_layers_check(const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                    ts_layers_t *out, size_t *bad, char *errmsg, size_t errlen) {
  char scratch[8];
  size_t bad_scratch;
  if (!bad) bad = &bad_scratch;
  *bad = n;
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!out) return TS_EINVAL;
  memset(out, 0, sizeof *out);
  if (!specs || n < 1 || n > TS_LAYERS_MAX) {
    ts_errmsg_printf(errmsg, errlen, "model: %zu layers, outside 1..%d", n, TS_LAYERS_MAX);
    return TS_EINVAL;
  }
  if (input.h < 1 || input.w < 1 || input.c < 1 || input.h > TS_CONV_MAX_DIM ||
      input.w > TS_CONV_MAX_DIM || input.c > TS_CONV_MAX_IMAGE ||
      input.h * input.w > TS_CONV_MAX_IMAGE / input.c) {
    ts_errmsg_printf(errmsg, errlen, "model: input %zux%zux%zu is empty or too large", input.h,
                     input.w, input.c);
    return TS_EINVAL;
  }
  out->input = input;
  out->layers = ts_calloc(n, sizeof *out->layers);
  out->tensors = ts_calloc(2 * n, sizeof *out->tensors);
  if (!out->layers || !out->tensors) {
    ts_layers_free(out);
    ts_errmsg_printf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  out->num_layers = n;
  out->max_elems = ts_layers_elems(input);
  size_t counts[TS_LAYER_DROPOUT + 1] = {0};
  ts_layer_shape_t shape = input;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    ts_layer_t *L = &out->layers[i];
    *bad = i;
    L->spec = specs[i];
    rc = fill_spec(&L->spec, i, counts, errmsg, errlen);
    if (rc < 0) break;
    for (size_t j = 0; j < i && rc == 0; j++)
      if (strcmp(out->layers[j].spec.name, L->spec.name) == 0)
        rc = layer_error(errmsg, errlen, i, &L->spec, "layer %zu has the same name", j + 1);
    if (rc < 0) break;
    L->in = shape;
    rc = infer(out, i, errmsg, errlen);
    shape = L->out;
    if (rc == 0 && ts_layers_elems(shape) > out->max_elems) out->max_elems = ts_layers_elems(shape);
  }
  if (rc == 0) {
    *bad = n - 1;
    const ts_layer_t *last = &out->layers[n - 1];
    if (last->spec.type != TS_LAYER_DENSE || last->spec.activation != TS_LAYER_LINEAR)
      rc = layer_error(errmsg, errlen, n - 1, &last->spec,
                       "the last layer gives the logits: it must be dense with no activation");
    else
      out->classes = last->spec.units;
  }
  if (rc < 0) {
    if (rc == TS_ENOMEM) *bad = n;
    ts_layers_free(out);
  } else {
    *bad = n;
  }
  return rc;
}

void ts_layers_free(ts_layers_t *l) {
  if (!l) return;
  ts_free(l->layers);
  ts_free(l->tensors);
  memset(l, 0, sizeof *l);
}

int ts_layers_from_config(const ts_config_layer_t *layers, size_t n, ts_layer_spec_t *out,
                          char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if ((n && (!layers || !out)) || n > TS_LAYERS_MAX) return TS_EINVAL;
  for (size_t i = 0; i < n; i++) {
    const ts_config_layer_t *c = &layers[i];
    ts_layer_spec_t *s = &out[i];
    memset(s, 0, sizeof *s);
    const char *bad = NULL;
    if (ts_layers_parse_type(c->type, &s->type) < 0) bad = "type";
    if (c->padding[0] && ts_conv_parse_padding(c->padding, &s->padding) < 0) bad = "padding";
    if (c->activation[0] && ts_layers_parse_act(c->activation, &s->activation) < 0)
      bad = "activation";
    if (c->filters < 0 || c->units < 0 || c->kernel[0] < 0 || c->kernel[1] < 0 ||
        c->strides[0] < 0 || c->strides[1] < 0)
      bad = "a negative size";
    if (bad) {
      ts_errmsg_printf(errmsg, errlen, "%s: layer %zu: %s", c->where, i + 1, bad);
      return TS_EINVAL;
    }
    snprintf(s->name, sizeof s->name, "%s", c->name);
    s->filters = (size_t)c->filters;
    s->units = (size_t)c->units;
    s->win_h = (size_t)c->kernel[0];
    s->win_w = (size_t)c->kernel[1];
    s->stride_h = (size_t)c->strides[0];
    s->stride_w = (size_t)c->strides[1];
    s->rate = c->rate;
  }
  return 0;
}
