/*
 * The CTR model of ps-worker (docs/embeddings.md): embedding layers over the Criteo
 * categorical fields, their vectors concatenated with the 13 dense features (log(1 + x))
 * and 13 missing-value indicators (1 where the integer was empty: a missing value is not
 * a 0, whose log is also 0) and fed to a network of dense layers (Wide & Deep's deep part), two logits (click or
 * not) under softmax cross-entropy, which for two classes is the log loss of a logistic
 * output.
 *
 * The embedding engine holds no rows: its tables live on the shards. For a batch it makes
 * each table's key list (ts_ctr_keys: one key per example and field, in example order; the
 * client library pulls each distinct key once and gives every listed key its row), takes
 * the rows the caller pulled into them (rows), runs the network on [dense | rows] and gives
 * back each listed key's gradient (row_grads: the network's input gradient, which the
 * client library sums per key before the push). The network is worker/ts_seq.h's, on the
 * CPU back end, its parameters the flat layout pulled and pushed as the other models'.
 *
 * With a "dot" layer after the embedding layers (DLRM's interaction; every field vector of
 * one width), the dot product of every pair of field vectors joins the input too, after the
 * vectors; its gradient flows back into both vectors of each pair. The dense features join
 * by concatenation (no bottom MLP).
 *
 * Keys: a categorical field's hex value and its field number go through a 64-bit mixer
 * (ts_ctr_key), so fields may share one table (their keys do not collide) or have one
 * each; a missing value is a key of its own per field.
 *
 * Ownership: ts_ctr_init fills the caller's struct and allocates what it points to;
 * ts_ctr_destroy frees it. Not thread-safe.
 */
#ifndef TS_CTR_H
#define TS_CTR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config.h"
#include "ts_criteo.h"
#include "ts_seq.h"

/* The network's first inputs: the 13 integer features, then their missing indicators. */
#define TS_CTR_DENSE_INPUTS (2 * TS_CRITEO_INTS)

#define TS_CTR_AUC_BINS (1u << 16)

typedef struct {
  char name[TS_CONFIG_LAYER_NAME_MAX];
  uint32_t dim;
  size_t num_slots; /* fields looked up in it */
  int64_t *keys;    /* batch_capacity x num_slots, example-major */
  float *rows;      /* the pulled rows, keys' order: batch_capacity x num_slots x dim */
  float *row_grads; /* the rows' gradients, same layout */
} ts_ctr_table_t;

typedef struct {
  int field;     /* 0-based categorical field */
  size_t table;  /* index in tables */
  size_t slot;   /* its place among its table's fields */
  size_t offset; /* its vector's first element in the network's input */
} ts_ctr_slot_t;

typedef struct {
  ts_ctr_table_t tables[TS_CONFIG_EMB_FIELDS_MAX];
  size_t num_tables;
  ts_ctr_slot_t slots[TS_CONFIG_EMB_FIELDS_MAX];
  size_t num_slots;
  size_t input_elems; /* TS_CTR_DENSE_INPUTS + the slots' dims (+ the pairs' dots) */
  bool dot;           /* DLRM's dot interactions: a "dot" layer after the embeddings */
  size_t dot_offset;  /* the first pair's dot in the input; pairs (i < j) in order */
  size_t num_pairs;
  size_t batch_capacity;
  ts_seq_t net; /* the dense layers */
  float *x;     /* batch_capacity x input_elems */
  float *dx;    /* its gradient */
  float *probs; /* batch_capacity x 2 */
  int32_t *labels;
} ts_ctr_t;

/* Build the model of a layer list: embedding layers first (at least one; each field at
 * most once), optionally a dot layer, then dense and dropout layers ending in 2 logits. Parameters
 * are allocated, not initialised. Returns 0, or TS_ECONFIG with errmsg naming the layer's
 * file:line, or TS_ENOMEM. */
int ts_ctr_init(ts_ctr_t *m, const ts_config_layer_t *layers, size_t n, size_t batch_capacity,
                char *errmsg, size_t errlen);
void ts_ctr_destroy(ts_ctr_t *m);

/* The key of a categorical value of field f (0-based); missing values have their own key. */
int64_t ts_ctr_key(int field, uint64_t value, bool missing);

/* Fill every table's keys, the dense part of x and the labels from rows[0..batch). */
void ts_ctr_keys(ts_ctr_t *m, const ts_criteo_row_t *rows, size_t batch);

/* With the tables' rows pulled: forward and backward (train) or forward only; *loss the
 * batch's mean log loss, probs the click probabilities (p[i] for example i, may be NULL).
 * Training fills the network's grads and every table's row_grads. Returns 0 or an error. */
int ts_ctr_step(ts_ctr_t *m, size_t batch, bool train, float *loss, float *p);

/* AUC from binned scores: pos and neg count TS_CTR_AUC_BINS bins of [0, 1]; ties within a
 * bin count half. 0.5 when a class is absent. */
void ts_ctr_auc_add(uint64_t *pos, uint64_t *neg, const float *p, const int32_t *labels, size_t n);
double ts_ctr_auc(const uint64_t *pos, const uint64_t *neg);

#endif
