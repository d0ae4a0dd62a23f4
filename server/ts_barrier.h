/*
 * The rules of who a shard waits for: worker membership and liveness, the sync barrier
 * (replicas_to_aggregate, backup workers, sync_timeout_s) and the ssp clock bound.
 *
 * This module is pure: no libuv, no sockets, no logging. The time is an argument in
 * milliseconds (the server passes uv_now), so every rule is testable without a network or
 * sleeping (tests/unit/test_barrier.c). The per-partition barrier state (which tasks pushed
 * for the open version, how many gradients it has, when it opened) lives in the shard
 * store (ts_store.h); this module decides from it.
 *
 * Glossary:
 *   seen     the worker handshook at least once
 *   live     seen, connected, heard from within heartbeat_timeout and not done; only live
 *            workers can be waited for
 *   dead     missed heartbeats for heartbeat_timeout while still connected; any frame from
 *            it makes it live again
 *   done     told us (Heartbeat.done) it finished; a new handshake clears it
 *   clock    ssp: one more than the last step the worker pushed for
 *
 * Used from the server's loop thread only.
 */
#ifndef TS_BARRIER_H
#define TS_BARRIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  bool seen;
  bool dead;
  bool done;
  int conns;             /* open connections with its handshake */
  uint64_t last_seen_ms; /* when the last frame from it arrived */
  uint64_t clock;
} ts_barrier_worker_t;

typedef struct {
  uint32_t num_workers;
  uint32_t replicas;        /* gradients that close a sync barrier (0: every worker) */
  uint64_t sync_timeout_ms; /* an open barrier closes with what it has after this long */
  uint64_t heartbeat_ms;    /* a silent worker is dead after this long */
  uint64_t staleness;       /* ssp: how many clocks a pull may run ahead of the slowest */
  ts_barrier_worker_t *w;   /* num_workers entries */
} ts_barrier_t;

/* Set up *b for num_workers workers, none seen. Returns 0 or TS_ENOMEM (then *b holds
 * nothing to free; ts_barrier_free is still safe). */
int ts_barrier_init(ts_barrier_t *b, uint32_t num_workers, uint32_t replicas,
                    uint64_t sync_timeout_ms, uint64_t heartbeat_ms, uint64_t staleness);
void ts_barrier_free(ts_barrier_t *b);

/* The worker of `task`, or NULL when task is not one of the job's (an admin session's -1). */
ts_barrier_worker_t *ts_barrier_worker(ts_barrier_t *b, int task);

/* True when task can be waited for now (see "live" above). False for an unknown task. */
bool ts_barrier_live(const ts_barrier_t *b, int task);

/* A connection of `task` finished its handshake: the worker is seen, connected and no
 * longer done (a dead one stays dead until ts_barrier_heard, which the caller calls next
 * for every frame, so that the revival is reported in one place). Returns true the first
 * time the task joins (false for a reconnection or an unknown task). */
bool ts_barrier_join(ts_barrier_t *b, int task, uint64_t now_ms);

/* A connection of `task` closed. Returns true when that was its last one: from now on it
 * is not live, so no barrier waits for it (ts_barrier_required). */
bool ts_barrier_leave(ts_barrier_t *b, int task);

/* A frame of `task` arrived at now_ms. Returns true when the worker was dead and is alive
 * again (the caller logs it). */
bool ts_barrier_heard(ts_barrier_t *b, int task, uint64_t now_ms);

/* `task` said it finished. Returns true when it was not done before (the caller re-checks
 * the open barriers: one may have been waiting for it). */
bool ts_barrier_done(ts_barrier_t *b, int task);

/* A model reset: every worker's done was the old model's (a worker heard from in the same
 * millisecond as the reset would otherwise still count as finished for the new one). */
void ts_barrier_forget_done(ts_barrier_t *b);

/* The end of the job: `task` has finished when it is done, or when it has been silent for
 * longer than heartbeat_ms at now_ms: not live (dead, or every connection closed) and
 * last heard from that long ago, or never seen and the shard up (since_ms) that long. A
 * worker not heard from since since_ms (the shard's start, or a model reset: what it did
 * was the old model's, done included) counts as never seen. A worker that comes back is
 * not finished any more. False for an unknown task. */
bool ts_barrier_finished(const ts_barrier_t *b, int task, uint64_t now_ms, uint64_t since_ms);

/* How many of the job's workers have joined (handshook) and been heard from since since_ms
 * (the shard's start or a model reset): the workers taking part in the job. */
uint32_t ts_barrier_count_joined(const ts_barrier_t *b, uint64_t since_ms);

/* How many of the job's workers have finished (ts_barrier_finished). */
uint32_t ts_barrier_count_finished(const ts_barrier_t *b, uint64_t now_ms, uint64_t since_ms);

/* Mark dead the live workers not heard from for longer than heartbeat_ms at now_ms, at
 * most max of them (call again while it returns max): their tasks go to dead[0..n);
 * returns n. */
uint32_t ts_barrier_expire(ts_barrier_t *b, uint64_t now_ms, uint32_t *dead, uint32_t max);

/* A push of `task` for `step` was counted: its ssp clock becomes step + 1 (never lower). */
void ts_barrier_pushed(ts_barrier_t *b, int task, uint64_t step);

/* Sync: how many gradients close a barrier now, given contributed[num_workers] (1 for the
 * tasks that pushed, or were refused, for it). replicas (or every worker), lowered by the
 * workers that were seen and are no longer live and did not push for this barrier, never
 * below one. A worker that left after giving this barrier its gradient still counts for
 * it: otherwise a worker finishing its last step would close that step before its peers'
 * gradients arrive. A live worker that is merely slow or stopped never raises the number:
 * with replicas < workers, the others close the barrier without it (backup workers). */
uint32_t ts_barrier_required(const ts_barrier_t *b, const uint8_t *contributed);

typedef enum {
  TS_BARRIER_WAIT = 0,    /* not enough gradients yet */
  TS_BARRIER_CLOSE = 1,   /* enough gradients */
  TS_BARRIER_TIMEOUT = 2, /* too few, but open for sync_timeout_ms: close with what it has */
} ts_barrier_verdict_t;

/* Sync: whether a barrier with `have` gradients (at least one), opened at opened_ms,
 * closes at now_ms. Timeouts only count when `timeouts` (the periodic check): a push or a
 * departure re-checks counts only, so a barrier never closes early on a push. */
ts_barrier_verdict_t ts_barrier_check(const ts_barrier_t *b, const uint8_t *contributed,
                                      uint32_t have, uint64_t opened_ms, uint64_t now_ms,
                                      bool timeouts);

/* Sync: the tasks that have not pushed for a barrier and are neither done nor dead (those
 * not seen yet included), into out[0..n) (num_workers entries); returns n. What
 * `psctl status` shows as "waiting for". */
uint32_t ts_barrier_waiting_for(const ts_barrier_t *b, const uint8_t *contributed, int32_t *out);

/* Ssp: true when a pull at `clock` may be answered: no live worker is more than staleness
 * clocks behind it. Dead, done and departed workers do not hold anyone back. */
bool ts_barrier_ssp_ready(const ts_barrier_t *b, uint64_t clock);

#endif
