#include "ts_stage.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

int ts_stage_init(ts_stage_t *st, size_t buf_bytes, size_t budget_bytes) {
  memset(st, 0, sizeof *st);
  size_t cap = buf_bytes ? budget_bytes / buf_bytes : 0;
  if (cap < 2) cap = 2;
  if (cap > 64) cap = 64;
  st->free = ts_calloc(cap, sizeof *st->free);
  if (!st->free) return TS_ENOMEM;
  st->buf_bytes = buf_bytes;
  st->cap = (unsigned)cap;
  return 0;
}

void ts_stage_free(ts_stage_t *st) {
  for (unsigned i = 0; i < st->nfree; i++) ts_huge_free(st->free[i], st->buf_bytes);
  ts_free(st->free);
  memset(st, 0, sizeof *st);
}

int ts_stage_acquire(ts_stage_t *st, ts_stage_waiter_t *w, float **out) {
  *out = NULL;
  /* Waiters go first: a newcomer never overtakes a queued session. */
  if (!st->head) {
    if (st->nfree > 0) {
      *out = st->free[--st->nfree];
      st->in_use++;
      return 0;
    }
    if (st->count < st->cap) {
      float *b = ts_huge_alloc(st->buf_bytes);
      if (b) {
        st->count++;
        st->in_use++;
        *out = b;
        return 0;
      }
      if (st->in_use == 0) return TS_ENOMEM; /* nobody would ever release one */
    }
  }
  w->next = NULL;
  w->buf = NULL;
  w->queued = 1;
  if (st->tail)
    st->tail->next = w;
  else
    st->head = w;
  st->tail = w;
  return 1;
}

ts_stage_waiter_t *ts_stage_release(ts_stage_t *st, float *buf) {
  if (!buf) return NULL;
  ts_stage_waiter_t *w = st->head;
  if (w) {
    st->head = w->next;
    if (!st->head) st->tail = NULL;
    w->next = NULL;
    w->queued = 0;
    w->buf = buf;
    return w;
  }
  st->in_use--;
  st->free[st->nfree++] = buf;
  return NULL;
}

void ts_stage_cancel(ts_stage_t *st, ts_stage_waiter_t *w) {
  if (!w->queued) return;
  ts_stage_waiter_t **pp = &st->head, *prev = NULL;
  while (*pp && *pp != w) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (*pp) {
    *pp = w->next;
    if (st->tail == w) st->tail = prev;
  }
  w->next = NULL;
  w->queued = 0;
}

size_t ts_stage_bytes(const ts_stage_t *st) { return (size_t)st->count * st->buf_bytes; }
