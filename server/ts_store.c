#include "ts_store.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

void ts_store_init(ts_store_t *s, const ts_config_t *cfg, uint32_t shard) {
  memset(s, 0, sizeof *s);
  s->shard = shard;
  s->num_shards = (uint32_t)cfg->num_ps;
  s->num_workers = (uint32_t)cfg->num_workers;
  s->mode = cfg->mode;
  s->partition_bytes = (uint64_t)cfg->partition_bytes;
  ts_optim_from_config(&s->optim, cfg);
}

static void free_parts(ts_store_t *s) {
  for (size_t i = 0; i < s->num_parts; i++) {
    ts_spart_t *p = &s->parts[i];
    ts_free(p->w);
    ts_free(p->s0);
    ts_free(p->s1);
    ts_free(p->accum);
    ts_free(p->contributed);
  }
  ts_free(s->parts);
  s->parts = NULL;
  s->num_parts = 0;
  ts_free(s->local);
  s->local = NULL;
  for (uint32_t t = 0; t < s->num_tensors; t++) ts_free(s->tensors[t].name);
  ts_free(s->tensors);
  s->tensors = NULL;
  s->num_tensors = 0;
  ts_plan_free(&s->plan);
  s->declared = false;
  s->bytes = s->state_bytes = 0;
}

void ts_store_free(ts_store_t *s) { free_parts(s); }

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

static int same_model(const ts_store_t *s, const Tessera__Declare *d, char *errmsg, size_t errlen) {
  if (d->seed != s->seed) {
    snprintf(errmsg, errlen, "model already declared with seed %llu, not %llu",
             (unsigned long long)s->seed, (unsigned long long)d->seed);
    return TS_ESHAPE;
  }
  for (size_t i = 0; i < d->n_tensors; i++) {
    const Tessera__TensorDecl *t = d->tensors[i];
    const ts_tensor_t *have = NULL;
    for (uint32_t k = 0; k < s->num_tensors; k++)
      if (strcmp(s->tensors[k].name, t->name) == 0) have = &s->tensors[k];
    if (!have) {
      snprintf(errmsg, errlen, "tensor '%s' is not part of the declared model (%u tensors)",
               t->name, s->num_tensors);
      return TS_ESHAPE;
    }
    bool same = have->rank == t->n_shape;
    for (size_t k = 0; same && k < t->n_shape; k++) same = have->shape[k] == t->shape[k];
    if (same && have->init != (ts_init_kind_t)t->init) {
      snprintf(errmsg, errlen, "tensor '%s' is already declared with initializer %s, not %s",
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
      snprintf(errmsg, errlen,
               "tensor '%s' is already declared with shape [%s], not [%s]%s", t->name, a, b,
               have->init != (ts_init_kind_t)t->init ? " (and another initializer)" : "");
      return TS_ESHAPE;
    }
    if (&s->tensors[i] != have) {
      snprintf(errmsg, errlen, "tensor '%s' is declared at position %zu, not %zu", t->name,
               (size_t)(have - s->tensors), i);
      return TS_ESHAPE;
    }
  }
  if (d->n_tensors != s->num_tensors) {
    /* Every listed tensor matched its position, so the first unlisted one is missing. */
    snprintf(errmsg, errlen,
             "model already declared with %u tensors, not %zu (tensor '%s' is missing)",
             s->num_tensors, d->n_tensors, s->tensors[d->n_tensors].name);
    return TS_ESHAPE;
  }
  return 0;
}

int ts_store_declare(ts_store_t *s, const Tessera__Declare *d, bool *created, char *errmsg,
                     size_t errlen) {
  *created = false;
  if (s->declared) return same_model(s, d, errmsg, errlen);

  int rc = TS_ENOMEM;
  uint64_t *elems = ts_calloc(d->n_tensors, sizeof *elems);
  s->tensors = ts_calloc(d->n_tensors, sizeof *s->tensors);
  if (!elems || !s->tensors) goto fail;
  s->num_tensors = (uint32_t)d->n_tensors;
  for (size_t i = 0; i < d->n_tensors; i++) {
    const Tessera__TensorDecl *t = d->tensors[i];
    for (size_t k = 0; k < i; k++) {
      if (strcmp(d->tensors[k]->name, t->name) == 0) {
        snprintf(errmsg, errlen, "tensor '%s' is declared twice", t->name);
        rc = TS_ESHAPE;
        goto fail;
      }
    }
    ts_tensor_t *dst = &s->tensors[i];
    dst->name = ts_strdup(t->name);
    if (!dst->name) goto fail;
    dst->rank = t->n_shape;
    dst->elems = 1;
    for (size_t k = 0; k < t->n_shape; k++) {
      dst->shape[k] = t->shape[k];
      dst->elems *= t->shape[k];
    }
    dst->init = (ts_init_kind_t)t->init;
    elems[i] = dst->elems;
  }
  rc = ts_plan_build(elems, s->num_tensors, s->num_shards, s->partition_bytes, &s->plan);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot plan partitions: %s", ts_strerror(rc));
    goto fail;
  }
  rc = TS_ENOMEM;
  s->local = ts_malloc(s->plan.num_parts * sizeof *s->local);
  s->parts = ts_calloc(s->plan.shard_parts[s->shard] ? s->plan.shard_parts[s->shard] : 1,
                       sizeof *s->parts);
  if (!s->local || !s->parts) goto fail;
  int nstate = ts_optim_state_buffers(&s->optim);
  for (size_t i = 0; i < s->plan.num_parts; i++) {
    const ts_part_t *pp = &s->plan.parts[i];
    if (pp->shard != s->shard) {
      s->local[i] = -1;
      continue;
    }
    s->local[i] = (int32_t)s->num_parts;
    ts_spart_t *p = &s->parts[s->num_parts++];
    size_t bytes = pp->count * sizeof(float);
    p->plan = pp;
    p->w = ts_aligned_alloc(bytes);
    if (!p->w) goto fail;
    const ts_tensor_t *t = &s->tensors[pp->tensor];
    ts_init_fill(p->w, t->init, d->seed, t->name, t->shape, t->rank, pp->offset, pp->count);
    s->bytes += bytes;
    if (nstate >= 1 && !(p->s0 = ts_aligned_alloc(bytes))) goto fail;
    if (nstate >= 2 && !(p->s1 = ts_aligned_alloc(bytes))) goto fail;
    if (p->s0) memset(p->s0, 0, bytes);
    if (p->s1) memset(p->s1, 0, bytes);
    s->state_bytes += (size_t)nstate * bytes;
    if (s->mode == TS_MODE_SYNC) {
      if (!(p->accum = ts_aligned_alloc(bytes))) goto fail;
      if (!(p->contributed = ts_calloc(s->num_workers ? s->num_workers : 1, 1))) goto fail;
      s->state_bytes += bytes;
    }
  }
  s->seed = d->seed;
  s->declared = true;
  *created = true;
  ts_free(elems);
  return 0;

fail:
  if (rc == TS_ENOMEM) snprintf(errmsg, errlen, "out of memory while creating the model's partitions");
  ts_free(elems);
  free_parts(s);
  return rc;
}

ts_spart_t *ts_store_find(ts_store_t *s, uint32_t tensor, uint32_t part) {
  if (!s->declared) return NULL;
  const ts_part_t *pp = ts_plan_part(&s->plan, tensor, part);
  if (!pp) return NULL;
  int32_t li = s->local[pp - s->plan.parts];
  return li < 0 ? NULL : &s->parts[li];
}

int ts_store_check_slices(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n,
                          char *errmsg, size_t errlen) {
  if (!s->declared) {
    snprintf(errmsg, errlen, "no model is declared on shard %u yet", s->shard);
    return TS_ENOTDECLARED;
  }
  for (size_t i = 0; i < n; i++) {
    const Tessera__PartSlice *sl = slices[i];
    if (sl->tensor >= s->num_tensors) {
      snprintf(errmsg, errlen, "unknown tensor index %u (the model has %u tensors)", sl->tensor,
               s->num_tensors);
      return TS_ENOTENSOR;
    }
    ts_spart_t *p = ts_store_find(s, sl->tensor, sl->part);
    if (!p) {
      snprintf(errmsg, errlen, "tensor '%s' partition %u is not held by shard %u",
               s->tensors[sl->tensor].name, sl->part, s->shard);
      return TS_ENOTENSOR;
    }
    if (sl->count != p->plan->count) {
      snprintf(errmsg, errlen, "tensor '%s' partition %u has %llu values, not %llu",
               s->tensors[sl->tensor].name, sl->part, (unsigned long long)p->plan->count,
               (unsigned long long)sl->count);
      return TS_ESHAPE;
    }
  }
  return 0;
}

uint64_t ts_store_min_version(const ts_store_t *s) {
  if (s->num_parts == 0) return 0;
  uint64_t v = s->parts[0].version;
  for (size_t i = 1; i < s->num_parts; i++)
    if (s->parts[i].version < v) v = s->parts[i].version;
  return v;
}

static void apply(ts_store_t *s, ts_spart_t *p, const float *g, float scale) {
  p->updates++;
  ts_optim_apply(&s->optim, p->w, g, scale, p->plan->count, p->s0, p->s1, p->updates);
  p->version++;
  s->applied++;
}

bool ts_store_async_push(ts_store_t *s, ts_spart_t *p, const float *g) {
  if (p->writers > 0) return false;
  apply(s, p, g, 1.0f);
  return true;
}

Tessera__PushResult ts_store_sync_push(ts_store_t *s, ts_spart_t *p, const float *g, int task,
                                       uint64_t step, uint64_t now_ms, uint32_t need) {
  /* A barrier that is complete but not yet applied belongs to the old version. */
  uint64_t open_version = p->version + (p->apply_pending ? 1 : 0);
  if (step < open_version) {
    s->stale_dropped++;
    return TESSERA__PUSH_RESULT__PUSH_STALE;
  }
  if (task >= 0 && (uint32_t)task < s->num_workers && p->contributed[task])
    return TESSERA__PUSH_RESULT__PUSH_DUPLICATE;
  size_t n = p->plan->count;
  if (p->accum_n + p->skip_n == 0) {
    if (need <= 1 && p->writers == 0 && !p->apply_pending) {
      /* The barrier closes with this gradient alone: the average is g itself. */
      apply(s, p, g, 1.0f);
      return TESSERA__PUSH_RESULT__PUSH_APPLIED;
    }
    p->opened_ms = now_ms;
  }
  if (p->accum_n == 0) {
    memcpy(p->accum, g, n * sizeof(float));
  } else {
    for (size_t i = 0; i < n; i++) p->accum[i] += g[i];
  }
  p->accum_n++;
  if (task >= 0 && (uint32_t)task < s->num_workers) p->contributed[task] = 1;
  return TESSERA__PUSH_RESULT__PUSH_ACCUMULATED;
}

bool ts_store_sync_skip(ts_store_t *s, ts_spart_t *p, int task, uint64_t step, uint64_t now_ms) {
  if (p->apply_pending || step != p->version || task < 0 || (uint32_t)task >= s->num_workers ||
      p->contributed[task])
    return false;
  if (p->accum_n + p->skip_n == 0) p->opened_ms = now_ms;
  p->contributed[task] = 1;
  p->skip_n++;
  return true;
}

uint32_t ts_store_sync_count(const ts_spart_t *p) { return p->accum_n + p->skip_n; }

static void sync_apply(ts_store_t *s, ts_spart_t *p) {
  if (p->accum_n > 0) {
    apply(s, p, p->accum, 1.0f / (float)p->accum_n);
  } else {
    p->version++; /* every gradient of this step was refused: the step is skipped */
  }
  p->accum_n = 0;
  p->skip_n = 0;
  p->apply_pending = false;
  memset(p->contributed, 0, s->num_workers ? s->num_workers : 1);
}

bool ts_store_sync_complete(ts_store_t *s, ts_spart_t *p) {
  if (p->accum_n + p->skip_n == 0 || p->apply_pending) return false;
  if (p->writers > 0) {
    p->apply_pending = true;
    return false;
  }
  sync_apply(s, p);
  return true;
}

bool ts_store_writer_done(ts_store_t *s, ts_spart_t *p) {
  if (p->writers > 0) p->writers--;
  if (p->writers > 0) return false;
  if (p->apply_pending) {
    sync_apply(s, p);
    return true;
  }
  return false;
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
