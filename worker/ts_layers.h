/*
 * A sequential model described layer by layer (issue 16): what each layer is, the defaults
 * Keras gives it, its name, the shape it takes and gives, and its parameters, all checked
 * before anything is allocated. worker/ts_seq.h runs such a description on a back end.
 *
 * Glossary.
 *   shape      an activation of one example, h x w x c (NHWC without the batch). The input
 *              of a model of 28x28 grey images is 28x28x1; a flat vector of n is 1x1xn.
 *   layer      conv2d (filters, kernel, strides, padding, activation), max_pool (size,
 *              strides, padding), flatten, dense (units, activation), dropout (rate). The
 *              last layer must be a dense layer with no activation: its outputs are the
 *              logits of softmax cross-entropy, and its units the number of classes.
 *   name       as Keras names them, numbered per type from 1 in model order: conv1, conv2,
 *              pool1, flatten1, fc1, dropout1; or the spec's own name.
 *   tensors    per conv2d "NAME/kernel" [kh, kw, in_c, filters] (HWIO, Glorot uniform) and
 *              "NAME/bias" [filters] (zeros); per dense "NAME/kernel" [in, units] and
 *              "NAME/bias" [units]; in layer order. This list is what a worker declares.
 *
 * Errors name the layer by its 1-based index, name and type, and say which shape does not
 * fit ("layer 3 'conv2' (conv2d): kernel 5x5 does not fit its 4x4x6 input with padding
 * valid"); the caller adds the file and line of the description.
 */
#ifndef TS_LAYERS_H
#define TS_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config_layers.h"
#include "ts_conv.h"
#include "ts_init.h"

#define TS_LAYERS_MAX 64
#define TS_LAYERS_NAME_MAX 48         /* a layer's name; its tensors add "/kernel" */
#define TS_LAYERS_MAX_UNITS (1 << 20) /* a dense layer's width, as ts_model's */

typedef enum {
  TS_LAYER_CONV2D = 1,
  TS_LAYER_MAX_POOL,
  TS_LAYER_FLATTEN,
  TS_LAYER_DENSE,
  TS_LAYER_DROPOUT,
} ts_layer_type_t;

typedef enum { TS_LAYER_LINEAR = 0, TS_LAYER_RELU, TS_LAYER_TANH } ts_layer_act_t;

/* One layer as written. Zeros mean "the default": stride 1 for conv2d and the window for
 * max_pool (Keras's pool_size default for strides), padding valid, activation linear, and the
 * numbered name. */
typedef struct {
  ts_layer_type_t type;
  char name[TS_LAYERS_NAME_MAX];
  size_t filters;            /* conv2d */
  size_t units;              /* dense */
  size_t win_h, win_w;       /* conv2d kernel, max_pool size */
  size_t stride_h, stride_w; /* conv2d, max_pool */
  ts_padding_t padding;      /* conv2d, max_pool */
  ts_layer_act_t activation; /* conv2d, dense */
  double rate;               /* dropout: the fraction of units dropped, in [0, 1) */
} ts_layer_spec_t;

typedef struct {
  size_t h, w, c;
} ts_layer_shape_t;

typedef struct {
  char name[TS_LAYERS_NAME_MAX + 8]; /* "conv1/kernel" */
  uint64_t shape[4];
  size_t rank;   /* 4 for a conv2d kernel, 2 for a dense kernel, 1 for a bias */
  size_t count;  /* elements */
  size_t offset; /* elements from the start of the flat parameter buffer */
  ts_init_kind_t init;
} ts_layer_tensor_t;

/* A checked layer: the spec with its defaults and name filled in, its shapes, and for
 * conv2d and max_pool the window geometry for a batch of 1 (set .batch for another). */
typedef struct {
  ts_layer_spec_t spec;
  ts_layer_shape_t in, out;
  ts_conv2d_t geom;
  long kernel, bias; /* indices in the tensor list, -1 for layers without parameters */
} ts_layer_t;

typedef struct {
  ts_layer_shape_t input;
  ts_layer_t *layers; /* num_layers */
  size_t num_layers;
  ts_layer_tensor_t *tensors;
  size_t num_tensors;
  size_t param_count; /* elements of all tensors */
  size_t classes;     /* units of the last layer */
  size_t max_elems;   /* largest activation of one example: the input or any layer's output */
} ts_layers_t;

/* Check specs[0..n) on an input of one example's shape and fill *out (the caller owns the
 * struct; ts_layers_free frees what it points to). *bad (bad may be NULL) = the 0-based index
 * of the layer at fault, or n when the fault is no one layer's (none, or the layer count or
 * the input), so a caller can name the file and line of that layer. Returns 0, TS_EINVAL with
 * errmsg (no layers or too many, an unknown type or padding, a size out of bounds, a window that
 * does not fit, a dense layer on an input that is not flat, a conv2d or max_pool on a flat input,
 * a model that does not end in a linear dense layer, a duplicate name), or TS_ENOMEM. On
 * failure *out is zeroed. */
int ts_layers_check(const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                    ts_layers_t *out, size_t *bad, char *errmsg, size_t errlen);

/* The layers a job file describes (config/ts_config_layers.h) as specs: the strings become
 * enums, omitted values stay 0 (the defaults of ts_layers_check). out has n entries. Returns
 * 0, or TS_EINVAL with errmsg "WHERE: layer I: ..." for a value the parser would have refused
 * (a caller that built the list by hand). */
int ts_layers_from_config(const ts_config_layer_t *layers, size_t n, ts_layer_spec_t *out,
                          char *errmsg, size_t errlen);

void ts_layers_free(ts_layers_t *l);

/* Elements of a shape (h * w * c). */
size_t ts_layers_elems(ts_layer_shape_t s);

/* "conv2d", "max_pool", "flatten", "dense", "dropout" and back (parse: -1 when unknown);
 * "linear", "relu", "tanh" and back. */
const char *ts_layers_type_name(ts_layer_type_t t);
int ts_layers_parse_type(const char *s, ts_layer_type_t *out);
const char *ts_layers_act_name(ts_layer_act_t a);
int ts_layers_parse_act(const char *s, ts_layer_act_t *out);

#endif
