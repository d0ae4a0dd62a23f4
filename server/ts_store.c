/*
 * The store's model (ts_store.h): declaring in three steps (prepare and budget on the loop,
 * build anywhere, install on the loop), comparing a later Declare with the model held,
 * the memory a model costs, and dropping it. What requests do to the partitions once they
 * exist is ts_store_part.c's.
 */
#include "ts_store.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"
#include "ts_store_int.h"

void ts_store_init(ts_store_t *s, const ts_config_t *cfg, uint32_t shard) {
  memset(s, 0, sizeof *s);
  s->shard = shard;
  s->num_shards = (uint32_t)cfg->num_ps;
  s->num_workers = (uint32_t)cfg->num_workers;
  s->mode = cfg->mode;
  if (cfg->job_name) snprintf(s->job_name, sizeof s->job_name, "%s", cfg->job_name);
  s->partition_bytes = (uint64_t)cfg->partition_bytes;
  s->max_model_bytes = cfg->max_model_bytes > 0 ? (uint64_t)cfg->max_model_bytes : UINT64_MAX;
  s->table_budget.max_bytes =
      cfg->max_table_bytes > 0 ? (uint64_t)cfg->max_table_bytes : UINT64_MAX;
  s->table_budget.rng = 0x9e3779b97f4a7c15ULL ^ shard;
  s->table_budget.accum_room = cfg->mode == TS_MODE_SYNC && cfg->max_table_bytes > 0
                                   ? (uint64_t)cfg->max_table_bytes / TS_STABLE_ACCUM_SHARE
                                   : 0;
  s->table_budget.track =
      cfg->checkpoint_dir && cfg->checkpoint_dir[0] && cfg->checkpoint_full_every > 1;
  ts_optim_from_config(&s->optim, cfg);
}

void ts_store_model_free(ts_store_model_t *m) {
  for (size_t i = 0; i < m->num_parts; i++) {
    ts_spart_t *p = &m->parts[i];
    size_t bytes = p->plan ? p->plan->count * sizeof(float) : 0; /* no plan: no buffers */
    ts_huge_free(p->w, bytes);
    ts_huge_free(p->s0, bytes);
    ts_huge_free(p->s1, bytes);
    ts_huge_free(p->accum, bytes);
    ts_free(p->contributed);
  }
  ts_free(m->parts);
  ts_free(m->local);
  for (uint32_t t = 0; t < m->num_tensors; t++) ts_free(m->tensors[t].name);
  ts_free(m->tensors);
  ts_plan_free(&m->plan);
  ts_stables_free(m->tables, m->num_tables);
  memset(m, 0, sizeof *m);
}

/* The store's model fields as a model, to free them the one way. */
static void free_parts(ts_store_t *s) {
  ts_store_model_t m = {.tensors = s->tensors,
                        .num_tensors = s->num_tensors,
                        .plan = s->plan,
                        .parts = s->parts,
                        .num_parts = s->num_parts,
                        .local = s->local,
                        .tables = s->tables,
                        .num_tables = s->num_tables};
  ts_store_model_free(&m);
  s->tables = NULL;
  s->num_tables = 0;
  s->table_budget.bytes = s->table_budget.accum_bytes = 0;
  s->tensors = NULL;
  s->num_tensors = 0;
  memset(&s->plan, 0, sizeof s->plan);
  s->parts = NULL;
  s->num_parts = 0;
  s->local = NULL;
  s->declared = false;
  s->bytes = s->state_bytes = 0;
  s->awaiting = 0;
}

void ts_store_free(ts_store_t *s) { free_parts(s); }

void ts_store_reset(ts_store_t *s) {
  free_parts(s);
  s->seed = 0;
  s->applied = 0;
  s->stale_dropped = 0;
}

static const char *init_name(ts_init_kind_t k) {
  switch (k) {
    case TS_INIT_ZEROS:
      return "zeros";
    case TS_INIT_GLOROT_UNIFORM:
      return "glorot_uniform";
    case TS_INIT_ONES:
      return "ones";
  }
  return "unknown";
}

static int same_model(uint64_t seed, const ts_tensor_t *tensors, uint32_t num_tensors,
                      const Tessera__Declare *d, char *errmsg, size_t errlen) {
  if (d->seed != seed) {
    ts_errmsg_printf(errmsg, errlen, "model already declared with seed %llu, not %llu",
             (unsigned long long)seed, (unsigned long long)d->seed);
    return TS_ESHAPE;
  }
  for (size_t i = 0; i < d->n_tensors; i++) {
    const Tessera__TensorDecl *t = d->tensors[i];
    const ts_tensor_t *have = NULL;
    for (uint32_t k = 0; k < num_tensors; k++)
      if (strcmp(tensors[k].name, t->name) == 0) have = &tensors[k];
    if (!have) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' is not part of the declared model (%u tensors)",
               t->name, num_tensors);
      return TS_ESHAPE;
    }
    bool same = have->rank == t->n_shape;
    for (size_t k = 0; same && k < t->n_shape; k++) same = have->shape[k] == t->shape[k];
    if (same && have->state != (t->kind == TESSERA__TENSOR_KIND__TENSOR_STATE)) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' is already declared as a %s tensor, not a %s one",
               t->name, have->state ? "state" : "trainable", have->state ? "trainable" : "state");
      return TS_ESHAPE;
    }
    if (same && have->init != (ts_init_kind_t)t->init) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' is already declared with initializer %s, not %s",
               t->name, init_name(have->init), init_name((ts_init_kind_t)t->init));
      return TS_ESHAPE;
    }
    if (!same) {
      char a[128] = "", b[128] = "";
      size_t la = 0, lb = 0;
      for (size_t k = 0; k < have->rank; k++)
        la += (size_t)snprintf(a + la, sizeof a - la, "%s%llu", k ? "," : "",
                               (unsigned long long)have->shape[k]);
      for (size_t k = 0; k < t->n_shape; k++)
        lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%llu", k ? "," : "",
                               (unsigned long long)t->shape[k]);
      ts_errmsg_printf(errmsg, errlen,
               "tensor '%s' is already declared with shape [%s], not [%s]%s", t->name, a, b,
               have->init != (ts_init_kind_t)t->init ? " (and another initializer)" : "");
      return TS_ESHAPE;
    }
    if (&tensors[i] != have) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' is declared at position %zu, not %zu", t->name,
               (size_t)(have - tensors), i);
      return TS_ESHAPE;
    }
  }
  if (d->n_tensors != num_tensors) {
    /* Every listed tensor matched its position, so the first unlisted one is missing. */
    ts_errmsg_printf(errmsg, errlen,
             "model already declared with %u tensors, not %zu (tensor '%s' is missing)",
             num_tensors, d->n_tensors, tensors[d->n_tensors].name);
    return TS_ESHAPE;
  }
  return 0;
}

int ts_store_same_model(const ts_store_t *s, const ts_store_model_t *m,
                        const Tessera__Declare *d, char *errmsg, size_t errlen) {
  int rc = m ? same_model(m->seed, m->tensors, m->num_tensors, d, errmsg, errlen)
             : same_model(s->seed, s->tensors, s->num_tensors, d, errmsg, errlen);
  if (rc < 0) return rc;
  return m ? ts_stables_same(m->tables, m->num_tables, d, errmsg, errlen)
           : ts_stables_same(s->tables, s->num_tables, d, errmsg, errlen);
}

/* a + b and a * b, stuck at UINT64_MAX instead of wrapping. */
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t sat_mul(uint64_t a, uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

uint64_t ts_store_model_bytes(uint64_t param_bytes, size_t parts, size_t total_parts,
                              uint32_t num_tensors, int nstate, bool sync, uint32_t num_workers) {
  uint64_t copies = 1 + (uint64_t)(nstate > 0 ? nstate : 0) + (sync ? 1 : 0);
  uint64_t per_part = sizeof(ts_spart_t) + (sync ? (num_workers ? num_workers : 1) : 0);
  uint64_t per_tensor = sizeof(ts_tensor_t) + TS_MSG_MAX_NAME + 1 + 8 + 4; /* + plan index */
  uint64_t n = sat_mul(param_bytes, copies);
  n = sat_add(n, sat_mul(parts, per_part));
  n = sat_add(n, sat_mul(total_parts, sizeof(ts_part_t) + sizeof(ts_part_t *) + sizeof(int32_t)));
  return sat_add(n, sat_mul(num_tensors, per_tensor));
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int ts_store_prepare(const ts_store_t *s, const Tessera__Declare *d, ts_store_model_t *m,
                     char *errmsg, size_t errlen) {
  memset(m, 0, sizeof *m);
  int nstate = ts_optim_state_buffers(&s->optim);
  bool sync = s->mode == TS_MODE_SYNC;
  /* A Declare frame lists at most TS_MSG_MAX_TENSORS (its codec checks); a checkpoint file
   * is held to the same, which also bounds the pairwise name check below. */
  if (d->n_tensors > TS_MSG_MAX_TENSORS) {
    ts_errmsg_printf(errmsg, errlen, "the model lists %zu tensors: at most %d", d->n_tensors,
             TS_MSG_MAX_TENSORS);
    return TS_EINVAL;
  }
  /* Before anything is allocated: the whole model's parameters, spread as evenly as the
   * shards could, and its partition table. A model that cannot fit that way cannot fit any
   * way, and the plan below is then bounded by the budget too. */
  uint64_t total = 0, max_elems = s->partition_bytes / 4, total_parts = 0;
  for (size_t i = 0; i < d->n_tensors; i++) {
    const Tessera__TensorDecl *t = d->tensors[i];
    /* A Declare frame's rank is checked by its codec; a checkpoint file's is not (its hash
     * is not keyed), and ts_tensor_t keeps 8 dimensions. */
    if (t->n_shape > sizeof m->tensors->shape / sizeof m->tensors->shape[0]) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' has rank %zu: at most %zu dimensions", t->name,
               t->n_shape, sizeof m->tensors->shape / sizeof m->tensors->shape[0]);
      return TS_EINVAL;
    }
    uint64_t e = 1;
    for (size_t k = 0; k < t->n_shape; k++) e = sat_mul(e, t->shape[k]);
    total = sat_add(total, sat_mul(e, 4));
    total_parts = sat_add(total_parts, e / max_elems + (e % max_elems ? 1 : 0));
  }
  uint32_t shards = s->num_shards ? s->num_shards : 1;
  uint64_t share = total / shards + (total % shards ? 1 : 0);
  uint64_t need = ts_store_model_bytes(share, 0, total_parts, (uint32_t)d->n_tensors, nstate,
                                       sync, s->num_workers);
  if (total == UINT64_MAX || need > s->max_model_bytes) {
    ts_errmsg_printf(errmsg, errlen,
             "the model needs %.1f MiB per shard on average over %u shard(s) (%.1f MiB of "
             "parameters in all, x%d with optimizer state%s), more than "
             "server.max_model_bytes = %.1f MiB",
             mib(need), shards, mib(total), 1 + nstate + (sync ? 1 : 0),
             sync ? " and sync accumulators" : "", mib(s->max_model_bytes));
    return TS_ETOOBIG;
  }

  int rc = TS_ENOMEM;
  uint64_t *elems = ts_calloc(d->n_tensors ? d->n_tensors : 1, sizeof *elems);
  m->tensors = ts_calloc(d->n_tensors ? d->n_tensors : 1, sizeof *m->tensors);
  if (!elems || !m->tensors) goto fail;
  m->num_tensors = (uint32_t)d->n_tensors;
  for (size_t i = 0; i < d->n_tensors; i++) {
    const Tessera__TensorDecl *t = d->tensors[i];
    for (size_t k = 0; k < i; k++) {
      if (strcmp(d->tensors[k]->name, t->name) == 0) {
        ts_errmsg_printf(errmsg, errlen, "tensor '%s' is declared twice", t->name);
        rc = TS_ESHAPE;
        goto fail;
      }
    }
    ts_tensor_t *dst = &m->tensors[i];
    dst->name = ts_strdup(t->name);
    if (!dst->name) goto fail;
    dst->rank = t->n_shape;
    dst->elems = 1;
    for (size_t k = 0; k < t->n_shape; k++) {
      dst->shape[k] = t->shape[k];
      dst->elems *= t->shape[k];
    }
    dst->init = (ts_init_kind_t)t->init;
    dst->state = t->kind == TESSERA__TENSOR_KIND__TENSOR_STATE;
    elems[i] = dst->elems;
  }
  if (d->n_tensors == 0 && d->n_tables == 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot plan partitions: the model has no tensors and no tables");
    rc = TS_EINVAL;
    goto fail;
  }
  if (d->n_tensors == 0) { /* tables only (the codec allows no tensors then) */
    m->parts = ts_calloc(1, sizeof *m->parts);
    if (!m->parts) goto fail;
    m->need_bytes = 0;
    goto tables;
  }
  rc = ts_plan_build(elems, m->num_tensors, s->num_shards, s->partition_bytes, &m->plan);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot plan partitions: %s", ts_strerror(rc));
    goto fail;
  }
  /* The exact figure: this shard's own share of the plan. */
  size_t mine = m->plan.shard_parts[s->shard];
  m->need_bytes = ts_store_model_bytes(m->plan.shard_bytes[s->shard], mine, m->plan.num_parts,
                                       m->num_tensors, nstate, sync, s->num_workers);
  if (m->need_bytes > s->max_model_bytes) {
    ts_errmsg_printf(errmsg, errlen,
             "the model needs %.1f MiB on shard %u (%.1f MiB of parameters, x%d with optimizer "
             "state%s), more than server.max_model_bytes = %.1f MiB",
             mib(m->need_bytes), s->shard, mib(m->plan.shard_bytes[s->shard]),
             1 + nstate + (sync ? 1 : 0), sync ? " and sync accumulators" : "",
             mib(s->max_model_bytes));
    rc = TS_ETOOBIG;
    goto fail;
  }
  rc = TS_ENOMEM;
  m->local = ts_malloc(m->plan.num_parts * sizeof *m->local);
  m->parts = ts_calloc(mine ? mine : 1, sizeof *m->parts);
  if (!m->local || !m->parts) goto fail;
  for (size_t i = 0; i < m->plan.num_parts; i++) {
    const ts_part_t *pp = &m->plan.parts[i];
    if (pp->shard != s->shard) {
      m->local[i] = -1;
      continue;
    }
    m->local[i] = (int32_t)m->num_parts;
    m->parts[m->num_parts++].plan = pp;
  }
tables:
  rc = ts_stables_make(d, sync, &s->optim, s->num_workers, &m->tables, errmsg, errlen);
  if (rc < 0) {
    ts_free(elems);
    ts_store_model_free(m);
    return rc;
  }
  m->num_tables = (uint32_t)d->n_tables;
  m->seed = d->seed;
  m->values_follow = d->values_follow;
  m->num_workers = s->num_workers;
  m->mode = s->mode;
  m->nstate = nstate;
  ts_free(elems);
  return 0;

fail:
  if (rc == TS_ENOMEM) ts_errmsg_printf(errmsg, errlen, "out of memory while planning the model");
  ts_free(elems);
  ts_store_model_free(m);
  return rc;
}

int ts_store_build(ts_store_model_t *m, char *errmsg, size_t errlen) {
  for (size_t i = 0; i < m->num_parts; i++) {
    ts_spart_t *p = &m->parts[i];
    const ts_part_t *pp = p->plan;
    size_t bytes = pp->count * sizeof(float);
    if (!(p->w = ts_huge_alloc(bytes))) goto nomem;
    const ts_tensor_t *t = &m->tensors[pp->tensor];
    if (m->values_follow) {
      memset(p->w, 0, bytes); /* until the chief's values come (ts_store_assign) */
      p->unset = true;
    } else {
      ts_init_fill(p->w, t->init, m->seed, t->name, t->shape, t->rank, pp->offset, pp->count);
    }
    m->bytes += bytes;
    if (m->nstate >= 1 && !(p->s0 = ts_huge_alloc(bytes))) goto nomem;
    if (m->nstate >= 2 && !(p->s1 = ts_huge_alloc(bytes))) goto nomem;
    if (p->s0) memset(p->s0, 0, bytes);
    if (p->s1) memset(p->s1, 0, bytes);
    m->state_bytes += (size_t)m->nstate * bytes;
    if (m->mode == TS_MODE_SYNC) {
      if (!(p->accum = ts_huge_alloc(bytes))) goto nomem;
      if (!(p->contributed = ts_calloc(m->num_workers ? m->num_workers : 1, 1))) goto nomem;
      m->state_bytes += bytes;
    }
  }
  return 0;
nomem:
  ts_errmsg_printf(errmsg, errlen, "out of memory while creating the model's partitions (%.1f MiB)",
           mib(m->need_bytes));
  return TS_ENOMEM;
}

void ts_store_install(ts_store_t *s, ts_store_model_t *m) {
  ts_require(!s->declared);
  s->seed = m->seed;
  s->tensors = m->tensors;
  s->num_tensors = m->num_tensors;
  s->plan = m->plan;
  s->parts = m->parts;
  s->num_parts = m->num_parts;
  s->local = m->local;
  s->bytes = m->bytes;
  s->state_bytes = m->state_bytes;
  s->awaiting = 0;
  for (size_t i = 0; i < s->num_parts; i++) s->awaiting += s->parts[i].unset;
  s->tables = m->tables;
  s->num_tables = m->num_tables;
  s->table_budget.bytes = s->table_budget.accum_bytes = 0; /* no step open yet */
  for (uint32_t i = 0; i < s->num_tables; i++)
    s->table_budget.bytes += ts_stable_bytes(ts_stables_at(s->tables, i));
  s->declared = true;
  memset(m, 0, sizeof *m);
}

int ts_store_declare(ts_store_t *s, const Tessera__Declare *d, bool *created, char *errmsg,
                     size_t errlen) {
  *created = false;
  if (s->declared) return ts_store_same_model(s, NULL, d, errmsg, errlen);
  ts_store_model_t m;
  int rc = ts_store_prepare(s, d, &m, errmsg, errlen);
  if (rc < 0) return rc;
  rc = ts_store_build(&m, errmsg, errlen);
  if (rc < 0) {
    ts_store_model_free(&m);
    return rc;
  }
  ts_store_install(s, &m);
  *created = true;
  return 0;
}

ts_stable_t *ts_store_table(ts_store_t *s, uint32_t i) {
  return s->declared && i < s->num_tables ? ts_stables_at(s->tables, i) : NULL;
}

size_t ts_store_pushid_units(const ts_store_t *s) {
  return s->num_parts + (size_t)s->num_tables * TS_MSG_MAX_PUSH_PIECES;
}

size_t ts_store_pushid_unit(const ts_store_t *s, uint32_t table, uint32_t piece) {
  return s->num_parts + (size_t)table * TS_MSG_MAX_PUSH_PIECES + piece;
}

Tessera__Mode ts_store_wire_mode(ts_mode_t mode) {
  switch (mode) {
    case TS_MODE_ASYNC:
      return TESSERA__MODE__MODE_ASYNC;
    case TS_MODE_SYNC:
      return TESSERA__MODE__MODE_SYNC;
    case TS_MODE_SSP:
      return TESSERA__MODE__MODE_SSP;
    default:
      return TESSERA__MODE__MODE_UNSPECIFIED;
  }
}
