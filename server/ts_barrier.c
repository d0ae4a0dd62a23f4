#include "ts_barrier.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

int ts_barrier_init(ts_barrier_t *b, uint32_t num_workers, uint32_t replicas,
                    uint64_t sync_timeout_ms, uint64_t heartbeat_ms, uint64_t staleness) {
  memset(b, 0, sizeof *b);
  /* One entry at least, so a job of no workers still has an array to index by nobody. */
  b->w = ts_calloc(num_workers ? num_workers : 1, sizeof *b->w);
  if (!b->w) return TS_ENOMEM;
  b->num_workers = num_workers;
  b->replicas = replicas;
  b->sync_timeout_ms = sync_timeout_ms;
  b->heartbeat_ms = heartbeat_ms;
  b->staleness = staleness;
  return 0;
}

void ts_barrier_free(ts_barrier_t *b) {
  ts_free(b->w);
  b->w = NULL;
  b->num_workers = 0;
}

ts_barrier_worker_t *ts_barrier_worker(ts_barrier_t *b, int task) {
  if (task < 0 || (uint32_t)task >= b->num_workers) return NULL;
  return &b->w[task];
}

static bool live(const ts_barrier_worker_t *w) {
  return w->seen && w->conns > 0 && !w->dead && !w->done;
}

bool ts_barrier_live(const ts_barrier_t *b, int task) {
  return task >= 0 && (uint32_t)task < b->num_workers && live(&b->w[task]);
}

bool ts_barrier_join(ts_barrier_t *b, int task, uint64_t now_ms) {
  ts_barrier_worker_t *w = ts_barrier_worker(b, task);
  if (!w) return false;
  bool first = !w->seen;
  w->seen = true;
  w->conns++;
  w->done = false;          /* a worker that comes back after finishing trains again */
  w->last_seen_ms = now_ms; /* dead stays for ts_barrier_heard to clear and report */
  return first;
}

bool ts_barrier_leave(ts_barrier_t *b, int task) {
  ts_barrier_worker_t *w = ts_barrier_worker(b, task);
  if (!w || w->conns == 0) return false;
  return --w->conns == 0;
}

bool ts_barrier_heard(ts_barrier_t *b, int task, uint64_t now_ms) {
  ts_barrier_worker_t *w = ts_barrier_worker(b, task);
  if (!w) return false;
  w->last_seen_ms = now_ms;
  if (!w->dead) return false;
  w->dead = false;
  return true;
}

bool ts_barrier_done(ts_barrier_t *b, int task) {
  ts_barrier_worker_t *w = ts_barrier_worker(b, task);
  if (!w || w->done) return false;
  w->done = true;
  return true;
}

void ts_barrier_forget_done(ts_barrier_t *b) {
  for (uint32_t t = 0; t < b->num_workers; t++) b->w[t].done = false;
}

/* later - earlier > span, with no wrap-around should a caller's clock lag. */
static bool older_than(uint64_t later, uint64_t earlier, uint64_t span) {
  return later > earlier && later - earlier > span;
}

bool ts_barrier_finished(const ts_barrier_t *b, int task, uint64_t now_ms, uint64_t since_ms) {
  if (task < 0 || (uint32_t)task >= b->num_workers) return false;
  const ts_barrier_worker_t *w = &b->w[task];
  if (!w->seen || w->last_seen_ms < since_ms) return older_than(now_ms, since_ms, b->heartbeat_ms);
  if (w->done) return true;
  return !live(w) && older_than(now_ms, w->last_seen_ms, b->heartbeat_ms);
}

uint32_t ts_barrier_count_joined(const ts_barrier_t *b, uint64_t since_ms) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < b->num_workers; t++)
    n += b->w[t].seen && b->w[t].last_seen_ms >= since_ms;
  return n;
}

uint32_t ts_barrier_count_finished(const ts_barrier_t *b, uint64_t now_ms, uint64_t since_ms) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < b->num_workers; t++)
    n += ts_barrier_finished(b, (int)t, now_ms, since_ms);
  return n;
}

uint32_t ts_barrier_expire(ts_barrier_t *b, uint64_t now_ms, uint32_t *dead, uint32_t max) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < b->num_workers && n < max; i++) {
    ts_barrier_worker_t *w = &b->w[i];
    /* No wrap-around should a caller's clock lag the last frame's. */
    if (live(w) && now_ms > w->last_seen_ms && now_ms - w->last_seen_ms > b->heartbeat_ms) {
      w->dead = true;
      dead[n++] = i;
    }
  }
  return n;
}

void ts_barrier_pushed(ts_barrier_t *b, int task, uint64_t step) {
  ts_barrier_worker_t *w = ts_barrier_worker(b, task);
  if (w && step + 1 > w->clock) w->clock = step + 1;
}

uint32_t ts_barrier_required(const ts_barrier_t *b, const uint8_t *contributed) {
  uint32_t gone = 0;
  for (uint32_t i = 0; i < b->num_workers; i++) {
    const ts_barrier_worker_t *w = &b->w[i];
    if (w->seen && !live(w) && !contributed[i]) gone++;
  }
  uint32_t need = b->replicas > 0 ? b->replicas : b->num_workers;
  uint32_t possible = b->num_workers - gone;
  if (need > possible) need = possible;
  return need ? need : 1;
}

ts_barrier_verdict_t ts_barrier_check(const ts_barrier_t *b, const uint8_t *contributed,
                                      uint32_t have, uint64_t opened_ms, uint64_t now_ms,
                                      bool timeouts) {
  if (have == 0) return TS_BARRIER_WAIT;
  if (have >= ts_barrier_required(b, contributed)) return TS_BARRIER_CLOSE;
  if (timeouts && now_ms >= opened_ms && now_ms - opened_ms >= b->sync_timeout_ms)
    return TS_BARRIER_TIMEOUT;
  return TS_BARRIER_WAIT;
}

uint32_t ts_barrier_waiting_for(const ts_barrier_t *b, const uint8_t *contributed, int32_t *out) {
  uint32_t n = 0;
  for (uint32_t t = 0; t < b->num_workers; t++)
    if (!contributed[t] && !b->w[t].done && !b->w[t].dead) out[n++] = (int32_t)t;
  return n;
}

bool ts_barrier_ssp_ready(const ts_barrier_t *b, uint64_t clock) {
  if (clock <= b->staleness) return true;
  uint64_t bound = clock - b->staleness;
  for (uint32_t t = 0; t < b->num_workers; t++)
    if (live(&b->w[t]) && b->w[t].clock < bound) return false;
  return true;
}
