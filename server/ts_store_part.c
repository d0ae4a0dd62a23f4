/*
 * The store's partitions at run time (ts_store.h): finding and checking the partitions a
 * request names, applying what a push carries (values, gradients async, gradients into a
 * sync barrier), the writers that keep updates off a partition while a pull reply is sent
 * from its memory, and what checkpoints and status read. Declaring and dropping the model
 * is ts_store.c's.
 */
#include "ts_store.h"

#include <stdio.h>
#include <string.h>

#include "ts_err.h"
#include "ts_store_int.h"

ts_spart_t *ts_store_find(ts_store_t *s, uint32_t tensor, uint32_t part) {
  if (!s->declared) return NULL;
  const ts_part_t *pp = ts_plan_part(&s->plan, tensor, part);
  if (!pp) return NULL;
  int32_t li = s->local[pp - s->plan.parts];
  return li < 0 ? NULL : &s->parts[li];
}

int ts_store_check_slices(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n, char *errmsg,
                          size_t errlen) {
  if (!s->declared) {
    ts_errmsg_printf(errmsg, errlen, "no model is declared on shard %u yet", s->shard);
    return TS_ENOTDECLARED;
  }
  for (size_t i = 0; i < n; i++) {
    const Tessera__PartSlice *sl = slices[i];
    if (sl->tensor >= s->num_tensors) {
      ts_errmsg_printf(errmsg, errlen, "unknown tensor index %u (the model has %u tensors)", sl->tensor,
               s->num_tensors);
      return TS_ENOTENSOR;
    }
    ts_spart_t *p = ts_store_find(s, sl->tensor, sl->part);
    if (!p) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' partition %u is not held by shard %u",
               s->tensors[sl->tensor].name, sl->part, s->shard);
      return TS_ENOTENSOR;
    }
    if (sl->count != p->plan->count) {
      ts_errmsg_printf(errmsg, errlen, "tensor '%s' partition %u has %llu values, not %llu",
               s->tensors[sl->tensor].name, sl->part, (unsigned long long)p->plan->count,
               (unsigned long long)sl->count);
      return TS_ESHAPE;
    }
  }
  return 0;
}

int ts_store_check_ready(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n, char *errmsg,
                         size_t errlen) {
  if (s->awaiting == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    ts_spart_t *p = ts_store_find(s, slices[i]->tensor, slices[i]->part);
    if (p && p->unset) {
      ts_errmsg_printf(errmsg, errlen,
               "tensor '%s' partition %u has no values yet: the model's initial values come "
               "from the job's first worker (task 0), which has not sent them",
               s->tensors[slices[i]->tensor].name, slices[i]->part);
      return TS_ENOTREADY;
    }
  }
  return 0;
}

bool ts_store_assign(ts_store_t *s, ts_spart_t *p, const float *v, bool initial,
                     Tessera__PushResult *result) {
  if (p->writers > 0) return false;
  if (initial && !p->unset) {
    *result = TESSERA__PUSH_RESULT__PUSH_DUPLICATE;
    return true;
  }
  if (s->mode == TS_MODE_SYNC && (p->accum_n + p->skip_n > 0 || p->apply_pending)) {
    *result = TESSERA__PUSH_RESULT__PUSH_STALE;
    return true;
  }
  memcpy(p->w, v, p->plan->count * sizeof(float));
  s->applied++; /* a change a checkpoint should hold */
  if (p->unset) {
    ts_require(s->awaiting > 0);
    p->unset = false;
    s->awaiting--;
  }
  *result = TESSERA__PUSH_RESULT__PUSH_APPLIED;
  return true;
}

uint64_t ts_store_min_version(const ts_store_t *s) {
  if (s->num_parts == 0) return 0;
  uint64_t v = s->parts[0].version;
  for (size_t i = 1; i < s->num_parts; i++)
    if (s->parts[i].version < v) v = s->parts[i].version;
  return v;
}

/* A state tensor's update: the pushed values are its workers' own (BatchNormalization's
 * moving statistics after their step). Sync: g is the sum of the step's values, scale
 * 1/count: the mean replaces the values. Async and ssp: each worker's value moves the
 * shard's by 1/num_workers of the difference, so the shard follows the workers' mean. */
static void apply_state(const ts_store_t *s, ts_spart_t *p, const float *g, float scale) {
  size_t n = p->plan->count;
  if (s->mode == TS_MODE_SYNC) {
    for (size_t i = 0; i < n; i++) p->w[i] = g[i] * scale;
  } else {
    float k = 1.0f / (float)(s->num_workers ? s->num_workers : 1);
    for (size_t i = 0; i < n; i++) p->w[i] += (g[i] - p->w[i]) * k;
  }
}

static void apply(ts_store_t *s, ts_spart_t *p, const float *g, float scale) {
  /* No reply is being sent from p's memory, and p has values to update. */
  ts_require(p->writers == 0 && !p->unset);
  p->updates++;
  if (s->tensors[p->plan->tensor].state)
    apply_state(s, p, g, scale);
  else
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

uint32_t ts_store_sync_count(const ts_spart_t *p) {
  return p->accum_n + p->skip_n;
}

static void sync_apply(ts_store_t *s, ts_spart_t *p) {
  ts_require(p->writers == 0 && p->accum_n + p->skip_n > 0); /* a closed, counted step */
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

/* --- what the server's modules read and hold -------------------------------------- */

ts_spart_t *ts_store_part_at(const ts_store_t *s, size_t i) {
  ts_require(i < s->num_parts);
  return &s->parts[i];
}

size_t ts_store_part_index(const ts_store_t *s, const ts_spart_t *p) {
  ts_require(p >= s->parts && p < s->parts + s->num_parts);
  return (size_t)(p - s->parts);
}

void ts_store_record(const ts_store_t *s, const ts_spart_t *p, ts_store_record_t *r) {
  (void)s;
  r->tensor = p->plan->tensor;
  r->part = p->plan->part;
  r->offset = p->plan->offset;
  r->count = p->plan->count;
  r->version = p->version;
  r->updates = p->updates;
  r->bufs[0] = p->w;
  r->bufs[1] = p->s0;
  r->bufs[2] = p->s1;
  r->nstate = ts_optim_state_buffers(&s->optim);
}

void ts_store_restored(ts_spart_t *p, uint64_t version, uint64_t updates) {
  p->version = version;
  p->updates = updates;
}

uint64_t ts_store_max_part_count(const ts_store_t *s) {
  uint64_t most = 0;
  for (size_t i = 0; i < s->num_parts; i++)
    if (s->parts[i].plan->count > most) most = s->parts[i].plan->count;
  return most;
}

uint64_t ts_store_part_count(const ts_spart_t *p) {
  return p->plan->count;
}

uint64_t ts_store_part_version(const ts_spart_t *p) {
  return p->version;
}

int ts_store_check_step(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n, uint64_t step,
                        char *errmsg, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    const ts_spart_t *p = ts_store_find(s, slices[i]->tensor, slices[i]->part);
    ts_require(p != NULL); /* the caller checked the slices */
    if (step > p->version) {
      ts_errmsg_printf(errmsg, errlen, "push for step %llu but '%s' part %u is at version %llu: pull first",
               (unsigned long long)step, s->tensors[p->plan->tensor].name, p->plan->part,
               (unsigned long long)p->version);
      return TS_EFUTURE;
    }
  }
  return 0;
}

bool ts_store_pull_ready(const ts_spart_t *p, uint64_t min_version) {
  return !ts_store_update_waiting(p) && p->version >= min_version;
}

const float *ts_store_read_begin(ts_spart_t *p) {
  p->writers++;
  return p->w;
}

bool ts_store_update_waiting(const ts_spart_t *p) {
  return p->held_pushes > 0 || p->apply_pending;
}

bool ts_store_busy(const ts_spart_t *p) {
  return p->writers > 0;
}

void ts_store_hold(ts_spart_t *p) {
  p->held_pushes++;
}

void ts_store_unhold(ts_spart_t *p) {
  ts_require(p->held_pushes > 0);
  p->held_pushes--;
}

bool ts_store_held_free(const ts_spart_t *p) {
  return p->writers == 0 && p->held_pushes > 0;
}

bool ts_store_in_use(const ts_store_t *s) {
  for (size_t i = 0; i < s->num_parts; i++)
    if (s->parts[i].writers > 0 || s->parts[i].held_pushes > 0) return true;
  return false;
}

const uint8_t *ts_store_contributed(const ts_spart_t *p) {
  return p->contributed;
}

uint64_t ts_store_opened_ms(const ts_spart_t *p) {
  return p->opened_ms;
}

bool ts_store_sync_pending(const ts_spart_t *p) {
  return p->apply_pending;
}

ts_spart_t *ts_store_oldest_part(ts_store_t *s) {
  if (s->num_parts == 0) return NULL;
  ts_spart_t *p = &s->parts[0];
  for (size_t i = 1; i < s->num_parts; i++)
    if (s->parts[i].version < p->version) p = &s->parts[i];
  return p;
}
