/* The CTR model (ts_ctr.h): embedding slots over the Criteo fields, a dense network on their
 * concatenation. */
#include "ts_ctr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_kernels.h"
#include "ts_key.h"
#include "ts_layers.h"

int64_t ts_ctr_key(int field, uint64_t value, bool missing) {
  /* The field in the top byte before mixing: the same value of two fields is two keys. */
  uint64_t tag = ((uint64_t)(field + 1) << 56) ^ (missing ? 0x00ffffffffffffffull : 0);
  return (int64_t)ts_key_hash(ts_key_hash(value) ^ tag);
}

static int find_table(const ts_ctr_t *m, const char *name) {
  for (size_t t = 0; t < m->num_tables; t++)
    if (strcmp(m->tables[t].name, name) == 0) return (int)t;
  return -1;
}

int ts_ctr_init(ts_ctr_t *m, const ts_config_layer_t *layers, size_t n, size_t batch_capacity,
                char *errmsg, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->batch_capacity = batch_capacity;
  m->input_elems = TS_CTR_DENSE_INPUTS;
  bool seen[TS_CONFIG_EMB_FIELDS_MAX] = {false};
  size_t first_net = 0;
  while (first_net < n && strcmp(layers[first_net].type, "embedding") == 0) {
    const ts_config_layer_t *l = &layers[first_net++];
    int t = find_table(m, l->table);
    if (t < 0) {
      t = (int)m->num_tables++;
      snprintf(m->tables[t].name, sizeof m->tables[t].name, "%s", l->table);
      m->tables[t].dim = (uint32_t)l->dim;
    } else if (m->tables[t].dim != (uint32_t)l->dim) {
      ts_errmsg_printf(errmsg, errlen,
                       "%s: model.layers: table \"%s\" has dim %u here and %d "
                       "elsewhere: one table, one row width",
                       l->where, l->table, m->tables[t].dim, l->dim);
      return TS_ECONFIG;
    }
    for (size_t i = 0; i < l->num_fields; i++) {
      int f = l->fields[i] - 1;
      if (seen[f]) {
        ts_errmsg_printf(errmsg, errlen, "%s: model.layers: field %d is looked up twice", l->where,
                         f + 1);
        return TS_ECONFIG;
      }
      seen[f] = true;
      ts_ctr_slot_t *s = &m->slots[m->num_slots++];
      *s = (ts_ctr_slot_t){.field = f,
                           .table = (size_t)t,
                           .slot = m->tables[t].num_slots++,
                           .offset = m->input_elems};
      m->input_elems += (size_t)l->dim;
    }
  }
  if (first_net < n && strcmp(layers[first_net].type, "dot") == 0) {
    for (size_t s = 1; s < m->num_slots; s++)
      if (m->tables[m->slots[s].table].dim != m->tables[m->slots[0].table].dim) {
        ts_errmsg_printf(errmsg, errlen,
                         "%s: model.layers: a dot layer needs every field "
                         "vector of one width (%u and %u here)",
                         layers[first_net].where, m->tables[m->slots[0].table].dim,
                         m->tables[m->slots[s].table].dim);
        return TS_ECONFIG;
      }
    m->dot = true;
    m->dot_offset = m->input_elems;
    m->num_pairs = m->num_slots * (m->num_slots - 1) / 2;
    m->input_elems += m->num_pairs;
    first_net++;
  }
  if (m->num_slots == 0 || first_net == n) {
    ts_errmsg_printf(errmsg, errlen,
                     "%s: model.layers: data.format \"criteo\" needs embedding "
                     "layers first, then dense layers ending in 2 logits",
                     n ? layers[0].where : "model.layers");
    return TS_ECONFIG;
  }
  for (size_t i = first_net; i < n; i++)
    if (strcmp(layers[i].type, "embedding") == 0 || strcmp(layers[i].type, "dot") == 0) {
      ts_errmsg_printf(errmsg, errlen,
                       "%s: model.layers: embedding layers come first, then "
                       "at most one dot layer, then the others",
                       layers[i].where);
      return TS_ECONFIG;
    }
  ts_layer_spec_t specs[TS_LAYERS_MAX];
  size_t nn = n - first_net;
  int rc = ts_layers_from_config(layers + first_net, nn, specs, errmsg, errlen);
  if (rc < 0) return TS_ECONFIG;
  if (specs[nn - 1].units != 2) {
    ts_errmsg_printf(errmsg, errlen,
                     "%s: model.layers: the last layer must have 2 units (the "
                     "logits of no click and click), not %zu",
                     layers[n - 1].where, specs[nn - 1].units);
    return TS_ECONFIG;
  }
  ts_layer_shape_t input = {1, 1, m->input_elems};
  char why[512];
  rc = ts_seq_init(&m->net, specs, nn, input, batch_capacity, ts_kernels_cpu(), why, sizeof why);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "model.layers: %s", why);
    return rc == TS_EINVAL ? TS_ECONFIG : rc;
  }
  m->net.want_input_grad = true;
  size_t B = batch_capacity;
  m->x = ts_malloc(B * m->input_elems * sizeof(float));
  m->dx = ts_malloc(B * m->input_elems * sizeof(float));
  m->probs = ts_malloc(B * 2 * sizeof(float));
  m->labels = ts_malloc(B * sizeof(int32_t));
  bool ok = m->x && m->dx && m->probs && m->labels;
  for (size_t t = 0; ok && t < m->num_tables; t++) {
    ts_ctr_table_t *tb = &m->tables[t];
    size_t keys = B * tb->num_slots;
    tb->keys = ts_malloc(keys * sizeof(int64_t));
    tb->rows = ts_malloc(keys * tb->dim * sizeof(float));
    tb->row_grads = ts_malloc(keys * tb->dim * sizeof(float));
    ok = tb->keys && tb->rows && tb->row_grads;
  }
  if (!ok) {
    ts_ctr_destroy(m);
    ts_errmsg_printf(errmsg, errlen, "out of memory for the CTR model's batch buffers");
    return TS_ENOMEM;
  }
  return 0;
}

void ts_ctr_destroy(ts_ctr_t *m) {
  if (!m) return;
  ts_seq_destroy(&m->net);
  for (size_t t = 0; t < m->num_tables; t++) {
    ts_free(m->tables[t].keys);
    ts_free(m->tables[t].rows);
    ts_free(m->tables[t].row_grads);
  }
  ts_free(m->x);
  ts_free(m->dx);
  ts_free(m->probs);
  ts_free(m->labels);
  memset(m, 0, sizeof *m);
}

void ts_ctr_keys(ts_ctr_t *m, const ts_criteo_row_t *rows, size_t batch) {
  for (size_t b = 0; b < batch; b++) {
    const ts_criteo_row_t *r = &rows[b];
    m->labels[b] = r->label;
    float *x = m->x + b * m->input_elems;
    memcpy(x, r->dense, sizeof r->dense);
    for (int j = 0; j < TS_CRITEO_INTS; j++) x[TS_CRITEO_INTS + j] = r->int_missing[j] ? 1.0f : 0.0f;
    for (size_t s = 0; s < m->num_slots; s++) {
      const ts_ctr_slot_t *sl = &m->slots[s];
      ts_ctr_table_t *tb = &m->tables[sl->table];
      tb->keys[b * tb->num_slots + sl->slot] =
          ts_ctr_key(sl->field, r->cat[sl->field], r->cat_missing[sl->field]);
    }
  }
}

/* Slot s's vector of example b in x, and its gradient row. */
static const float *vec(const ts_ctr_t *m, size_t b, size_t s) {
  return m->x + b * m->input_elems + m->slots[s].offset;
}

static float *vec_grad(ts_ctr_t *m, size_t b, size_t s) {
  const ts_ctr_slot_t *sl = &m->slots[s];
  ts_ctr_table_t *tb = &m->tables[sl->table];
  return tb->row_grads + (b * tb->num_slots + sl->slot) * tb->dim;
}

/* x's pair part: v_i . v_j for every pair i < j, in order. */
static void dots(ts_ctr_t *m, size_t batch) {
  size_t dim = m->tables[m->slots[0].table].dim;
  for (size_t b = 0; b < batch; b++) {
    float *out = m->x + b * m->input_elems + m->dot_offset;
    for (size_t i = 0; i < m->num_slots; i++)
      for (size_t j = i + 1; j < m->num_slots; j++) {
        const float *u = vec(m, b, i), *v = vec(m, b, j);
        float d = 0.0f;
        for (size_t e = 0; e < dim; e++) d += u[e] * v[e];
        *out++ = d;
      }
  }
}

/* d v_i += g_ij v_j and d v_j += g_ij v_i for every pair's gradient g_ij in dx. */
static void dots_backward(ts_ctr_t *m, size_t batch) {
  size_t dim = m->tables[m->slots[0].table].dim;
  for (size_t b = 0; b < batch; b++) {
    const float *g = m->dx + b * m->input_elems + m->dot_offset;
    for (size_t i = 0; i < m->num_slots; i++)
      for (size_t j = i + 1; j < m->num_slots; j++) {
        float gij = *g++;
        const float *u = vec(m, b, i), *v = vec(m, b, j);
        float *du = vec_grad(m, b, i), *dv = vec_grad(m, b, j);
        for (size_t e = 0; e < dim; e++) {
          du[e] += gij * v[e];
          dv[e] += gij * u[e];
        }
      }
  }
}

int ts_ctr_step(ts_ctr_t *m, size_t batch, bool train, float *loss, float *p) {
  if (batch < 1 || batch > m->batch_capacity) return TS_EINVAL;
  /* Gather: each slot's row into its place in x. */
  for (size_t b = 0; b < batch; b++)
    for (size_t s = 0; s < m->num_slots; s++) {
      const ts_ctr_slot_t *sl = &m->slots[s];
      const ts_ctr_table_t *tb = &m->tables[sl->table];
      memcpy(m->x + b * m->input_elems + sl->offset,
             tb->rows + (b * tb->num_slots + sl->slot) * tb->dim, tb->dim * sizeof(float));
    }
  if (m->dot) dots(m, batch);
  float l = 0.0f;
  int rc = train ? ts_seq_forward_backward(&m->net, m->x, m->labels, batch, &l)
                 : ts_seq_loss(&m->net, m->x, m->labels, batch, &l);
  if (rc == 0) rc = ts_seq_probs(&m->net, m->probs, batch);
  if (rc < 0) return rc;
  if (loss) *loss = l;
  if (p)
    for (size_t b = 0; b < batch; b++) p[b] = m->probs[2 * b + 1];
  if (!train) return 0;
  /* Scatter: the input gradient's slot columns are the listed keys' row gradients. */
  rc = ts_seq_input_grad(&m->net, m->dx, batch);
  if (rc < 0) return rc;
  for (size_t b = 0; b < batch; b++)
    for (size_t s = 0; s < m->num_slots; s++) {
      const ts_ctr_slot_t *sl = &m->slots[s];
      ts_ctr_table_t *tb = &m->tables[sl->table];
      memcpy(tb->row_grads + (b * tb->num_slots + sl->slot) * tb->dim,
             m->dx + b * m->input_elems + sl->offset, tb->dim * sizeof(float));
    }
  if (m->dot) dots_backward(m, batch);
  return 0;
}

void ts_ctr_auc_add(uint64_t *pos, uint64_t *neg, const float *p, const int32_t *labels, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double v = isfinite(p[i]) ? (double)p[i] : 0.0;
    uint32_t bin = v <= 0 ? 0 : (uint32_t)(v * TS_CTR_AUC_BINS);
    if (bin >= TS_CTR_AUC_BINS) bin = TS_CTR_AUC_BINS - 1;
    (labels[i] ? pos : neg)[bin]++;
  }
}

double ts_ctr_auc(const uint64_t *pos, const uint64_t *neg) {
  double p = 0, n = 0, wins = 0, below = 0;
  for (uint32_t b = 0; b < TS_CTR_AUC_BINS; b++) {
    wins += (double)pos[b] * (below + 0.5 * (double)neg[b]);
    below += (double)neg[b];
    p += (double)pos[b];
    n += (double)neg[b];
  }
  return p > 0 && n > 0 ? wins / (p * n) : 0.5;
}
