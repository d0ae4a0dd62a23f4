/*
 * The layer list of a job file's model (issue 16), read from libconfig. Not yet reached from
 * ts_config_load: a later change lets model.layers be either the MLP's widths or this list.
 *
 *   model = {
 *     layers = (
 *       { type = "conv2d"; filters = 6; kernel = 5; padding = "same"; activation = "relu"; },
 *       { type = "max_pool"; size = 2; },
 *       { type = "conv2d"; filters = 16; kernel = [5, 5]; activation = "relu"; },
 *       { type = "max_pool"; size = 2; strides = 2; },
 *       { type = "flatten"; },
 *       { type = "dense"; units = 120; activation = "relu"; },
 *       { type = "dropout"; rate = 0.5; },
 *       { type = "dense"; units = 10; name = "logits"; }
 *     );
 *   };
 *
 * Keys per type (any other key is an error naming the keys the type takes):
 *   conv2d    filters (required), kernel (required), strides, padding, activation, name
 *   max_pool  size (required), strides, padding, name
 *   flatten   name
 *   dense     units (required), activation, name
 *   dropout   rate (required), name
 *   embedding table, dim, field (all required): the rows of field (a Criteo categorical
 *             field 1..26, or a list of them, each its own vector) from the shards' table
 *             `table` of width dim; embedding layers come first, the rest is the network
 *             on their concatenation and the dense features (docs/embeddings.md)
 *   dot       (no keys) after the embedding layers: DLRM's dot interactions, every pair of
 *             field vectors' dot product joins the network's input
 * kernel, size and strides are an integer or a list [h, w], as Keras's kernel_size; padding is
 * "valid" (the default) or "same"; activation "linear" (the default), "relu" or "tanh".
 * Omitted values are left 0 / "" here, and the model (worker/ts_layers.h) gives Keras's
 * defaults. This module checks the syntax and each value's own bounds; whether the shapes
 * fit is the model's check, which prefixes its error with the layer's `where`.
 */
#ifndef TS_CONFIG_LAYERS_H
#define TS_CONFIG_LAYERS_H

#include <stddef.h>

struct config_setting_t;

#define TS_CONFIG_LAYERS_MAX 64
#define TS_CONFIG_LAYER_NAME_MAX 48
#define TS_CONFIG_EMB_FIELDS_MAX 26 /* Criteo's categorical fields */

typedef struct {
  char type[16]; /* "conv2d", "max_pool", "flatten", "dense", "dropout", "embedding", "dot" */
  char name[TS_CONFIG_LAYER_NAME_MAX]; /* "" when not given */
  int filters, units;                  /* 0 when not given */
  int kernel[2];                       /* conv2d kernel or max_pool size, [h, w]; 0 if not given */
  int strides[2];                      /* [h, w]; 0 when not given */
  char padding[8];                     /* "", "valid", "same" */
  char activation[8];                  /* "", "linear", "relu", "tanh" */
  double rate;                         /* dropout; 0 when not given */
  char table[TS_CONFIG_LAYER_NAME_MAX]; /* embedding: the shards' table */
  int dim;                             /* embedding: row width; 0 when not given */
  int fields[TS_CONFIG_EMB_FIELDS_MAX]; /* embedding: 1-based categorical fields */
  size_t num_fields;
  char where[256];                     /* "job.cfg:12": the layer's group */
} ts_config_layer_t;

/* Read the list `list` (libconfig's ( {...}, {...} )) into out[0..max); *n = the layers read.
 * path names the file when libconfig does not know it. Returns 0, or TS_ECONFIG with errmsg
 * "FILE:LINE: model.layers: layer I (TYPE): WHAT" (not a list, more than max layers, a layer
 * that is not a group, an unknown or missing type, an unknown key for the type, a missing
 * required key, a value of the wrong type or outside its bounds). */
int ts_config_layers_parse(const struct config_setting_t *list, const char *path,
                           ts_config_layer_t *out, size_t max, size_t *n, char *errmsg,
                           size_t errlen);

#endif
