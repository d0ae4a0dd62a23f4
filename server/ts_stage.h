/*
 * Staging buffers for push payloads: a shard's bounded pool.
 *
 * A push is read one piece at a time (whole partitions, at most one buffer's worth) into a
 * staging buffer, checked and applied, and the buffer is reused for the next piece; so a
 * shard needs a few buffers whatever the size of the pushes and the number of workers,
 * instead of one as large as the largest push per connection. When every buffer is in use,
 * a session queues (ts_stage_acquire returns 1) and gets the next buffer released, in
 * arrival order. No I/O: the server stops and resumes reading around it.
 *
 * Glossary:
 *   buffer  buf_bytes of float-aligned memory, allocated on first need and kept
 *   waiter  a session's queue entry (embedded in the session)
 */
#ifndef TS_STAGE_H
#define TS_STAGE_H

#include <stddef.h>

typedef struct ts_stage_waiter {
  struct ts_stage_waiter *next;
  float *buf;                 /* the buffer handed over by ts_stage_release */
  int queued;
} ts_stage_waiter_t;

typedef struct {
  size_t buf_bytes;           /* size of each buffer (0: not set up yet) */
  unsigned cap;               /* most buffers that exist at once */
  unsigned count;             /* buffers allocated */
  unsigned in_use;
  float **free;               /* cap entries, nfree used */
  unsigned nfree;
  ts_stage_waiter_t *head, *tail;
} ts_stage_t;

/* Buffers of buf_bytes, as many as fit in budget_bytes, and never fewer than 2 (so one push
 * being applied never keeps the next from being read). Returns 0 or TS_ENOMEM. */
int ts_stage_init(ts_stage_t *st, size_t buf_bytes, size_t budget_bytes);
void ts_stage_free(ts_stage_t *st);

/* 0 and *out = a buffer; 1 when all are in use (w is queued: ts_stage_release hands it one
 * later); TS_ENOMEM when none exists and none can be allocated. */
int ts_stage_acquire(ts_stage_t *st, ts_stage_waiter_t *w, float **out);

/* Give buf back. Returns the waiter it was handed to (w->buf = buf), or NULL. */
ts_stage_waiter_t *ts_stage_release(ts_stage_t *st, float *buf);

/* Take w out of the queue, if it is there. */
void ts_stage_cancel(ts_stage_t *st, ts_stage_waiter_t *w);

/* Bytes of buffers allocated. */
size_t ts_stage_bytes(const ts_stage_t *st);

#endif
