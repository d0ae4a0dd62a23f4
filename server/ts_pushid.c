/* Applied push ids per worker task, client and partition (ts_pushid.h). */
#include "ts_pushid.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

#define WINDOW 64u

int ts_pushid_init(ts_pushid_t *t, uint32_t num_workers, uint32_t per_worker) {
  memset(t, 0, sizeof *t);
  t->num_workers = num_workers;
  t->per_worker = per_worker;
  size_t n = (size_t)num_workers * per_worker;
  if (n == 0) return 0;
  t->slots = ts_calloc(n, sizeof *t->slots);
  if (!t->slots) return TS_ENOMEM;
  t->bytes = n * sizeof *t->slots;
  return 0;
}

static void forget(ts_pushid_t *t, ts_pushid_slot_t *s) {
  if (s->wins) t->bytes -= t->num_parts * sizeof *s->wins;
  ts_free(s->wins);
  s->wins = NULL;
  s->used = false;
  s->client = 0;
  s->last_use = 0;
  memset(&s->part, 0, sizeof s->part);
}

void ts_pushid_reset(ts_pushid_t *t) {
  size_t n = (size_t)t->num_workers * t->per_worker;
  for (size_t i = 0; i < n; i++) forget(t, &t->slots[i]);
}

void ts_pushid_free(ts_pushid_t *t) {
  ts_pushid_reset(t);
  ts_free(t->slots);
  memset(t, 0, sizeof *t);
}

static ts_pushid_slot_t *slot_lookup(ts_pushid_t *t, int task, uint64_t client, size_t num_parts,
                                     bool *evicted) {
  if (evicted) *evicted = false;
  if (!t->slots || task < 0 || (uint32_t)task >= t->num_workers || num_parts == 0) return NULL;
  if (num_parts != t->num_parts) {
    ts_pushid_reset(t);
    t->num_parts = num_parts;
  }
  ts_pushid_slot_t *row = &t->slots[(size_t)task * t->per_worker], *s = NULL;
  for (uint32_t i = 0; i < t->per_worker && !s; i++)
    if (row[i].used && row[i].client == client) s = &row[i];
  for (uint32_t i = 0; i < t->per_worker && !s; i++)
    if (!row[i].used) s = &row[i];
  if (!s) {
    s = &row[0];
    for (uint32_t i = 1; i < t->per_worker; i++)
      if (row[i].last_use < s->last_use) s = &row[i];
    forget(t, s);
    t->evictions++;
    if (evicted) *evicted = true;
  }
  if (!s->wins) {
    s->wins = ts_calloc(num_parts, sizeof *s->wins);
    if (!s->wins) {
      s->used = false;
      return NULL;
    }
    t->bytes += num_parts * sizeof *s->wins;
    s->used = true;
    s->client = client;
  }
  s->last_use = ++t->clock;
  return s;
}

ts_pushid_window_t *ts_pushid_lookup(ts_pushid_t *t, int task, uint64_t client, size_t num_parts,
                                     bool *evicted) {
  ts_pushid_slot_t *s = slot_lookup(t, task, client, num_parts, evicted);
  return s ? s->wins : NULL;
}

ts_pushid_part_t *ts_pushid_lookup_part(ts_pushid_t *t, int task, uint64_t client,
                                        size_t num_parts) {
  ts_pushid_slot_t *s = slot_lookup(t, task, client, num_parts, NULL);
  return s ? &s->part : NULL;
}

bool ts_pushid_seen(const ts_pushid_window_t *w, uint64_t id) {
  if (id == 0 || w->top == 0 || id > w->top) return false;
  if (id == w->top) return true;
  uint64_t back = w->top - id; /* 1.. */
  if (back > WINDOW) return true;
  return (w->bits >> (back - 1)) & 1u;
}

void ts_pushid_record(ts_pushid_window_t *w, uint64_t id) {
  if (id == 0) return;
  if (id > w->top) {
    uint64_t shift = id - w->top;
    if (w->top == 0)
      w->bits = 0;
    else if (shift > WINDOW)
      w->bits = 0;
    else if (shift == WINDOW)
      w->bits = UINT64_C(1) << (WINDOW - 1); /* only the old top stays in the window */
    else
      w->bits = (w->bits << shift) | (UINT64_C(1) << (shift - 1));
    w->top = id;
    return;
  }
  uint64_t back = w->top - id;
  if (back >= 1 && back <= WINDOW) w->bits |= UINT64_C(1) << (back - 1);
}
