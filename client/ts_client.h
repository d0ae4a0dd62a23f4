/*
 * Client library: a worker's (or psctl's) connections to every shard of a job.
 *
 * The client runs its own thread with its own libuv loop (CONTRIBUTING.md); the calls below
 * are blocking and thread-safe: each hands a request to that thread (a locked queue plus
 * uv_async_send) and waits for it. One call fans out to every shard concurrently: a pull
 * asks each shard for its partitions of every tensor at once, and the replies are read
 * straight into the caller's tensors; a push writes every gradient partition from the
 * caller's memory with scatter/gather writes.
 *
 * A lost connection is re-established in the background with exponential backoff
 * (100 ms doubling to 5 s); after a reconnect the client handshakes again and re-declares
 * the model, so a restarted shard is usable without the caller noticing. Requests that were
 * in flight on a lost connection fail with TS_ECLOSED; the caller decides whether to retry
 * (pulls are always safe to retry; a sync push is recognised as a duplicate).
 *
 * Heartbeats carry the progress set with ts_client_set_progress to every shard every
 * heartbeat_interval_s, from the client thread, so a worker busy computing stays alive.
 *
 * Latency: with busy_poll_us > 0 the client thread keeps polling its sockets (net/
 * ts_poll.h) for busy_poll_us after each frame it reads and each call handed to it, and a
 * calling thread polls for its answer for up to busy_poll_us before it sleeps; both yield
 * the CPU on every turn, and neither polls longer, so a long wait (a sync barrier) sleeps.
 * A push directly followed by a pull costs one round trip with ts_client_push_pull (or, in
 * sync mode, ts_client_push_pull_next).
 */
#ifndef TS_CLIENT_H
#define TS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera.pb-c.h"
#include "ts_init.h"
#include "ts_plan.h"

typedef struct ts_client ts_client_t;

typedef struct {
  const char *const *addrs;      /* "host:port" of each shard, in shard order */
  size_t num_shards;
  bool admin;                    /* admin role (psctl) instead of worker */
  int task;                      /* worker index (ignored for admin) */
  const char *identity;          /* free text for the servers' logs */
  const char *token;             /* shared secret for the handshake MAC; NULL = none */
  double connect_timeout_s;      /* ts_client_open waits this long for the shards (default 5) */
  double request_timeout_s;      /* default deadline of a call (default 60) */
  double heartbeat_interval_s;   /* 0 = no heartbeats */
  double heartbeat_timeout_s;    /* with heartbeats: a shard silent this long is presumed dead
                                    and its connection re-established (default 5); bytes of a
                                    large frame moving either way count as not silent */
  bool require_all;              /* open fails unless every shard answered */
  uint32_t busy_poll_us;         /* poll this long for an answer before sleeping (job.busy_poll_us);
                                    0 = always sleep */
} ts_client_opts_t;

typedef struct {
  const char *name;
  const uint64_t *shape;
  size_t rank;
  ts_init_kind_t init;
} ts_client_tensor_t;

typedef struct {
  uint64_t applied, accumulated, stale, duplicate;  /* partitions, over all shards */
  /* Each part's own outcome (0 or a negative error) of a ts_client_push_pull or
   * ts_client_push_pull_next, which returns only one error: a caller that must know
   * whether the push went through (to retry it or not) looks here. 0 after other calls. */
  int push_rc, pull_rc;
} ts_client_push_result_t;

/* Start the client thread and connect to every shard. Waits up to connect_timeout_s for
 * the shards to answer the handshake. With require_all, fails (TS_EUNAVAIL, errmsg naming
 * each unreachable shard and why) unless all did; otherwise succeeds with whatever answered
 * and keeps trying the rest in the background. Also fails for bad addresses (TS_EINVAL)
 * or a refused handshake (TS_EAUTH, TS_EVERSION ...). */
int ts_client_open(ts_client_t **out, const ts_client_opts_t *opts, char *errmsg, size_t errlen);

/* Make every call in progress, and every later one, fail at once with TS_ESHUTDOWN
 * ("interrupted"): for a signal handler (async-signal-safe), so a worker told to stop does
 * not sit out a pull that waits for an unreachable shard. */
void ts_client_interrupt(ts_client_t *c);

/* Close every connection, stop the thread and free the client. */
void ts_client_close(ts_client_t *c);

uint32_t ts_client_num_shards(const ts_client_t *c);

/* Whether shard i currently has a ready connection; when not, *why (optional) gets the last
 * error seen ("connection refused"). */
bool ts_client_shard_up(ts_client_t *c, uint32_t shard, char *why, size_t whylen);

/* The job's settings as the shards announced them in the handshake. */
uint64_t ts_client_partition_bytes(const ts_client_t *c);
uint32_t ts_client_job_workers(const ts_client_t *c);
Tessera__Mode ts_client_job_mode(const ts_client_t *c);

/* Declare the model (the same tensor list, in the same order, on every worker) and compute
 * the partition plan. The tensor list is copied. Returns 0, or the first shard's error
 * (TS_ESHAPE for a mismatching redeclaration, with the server's detail in errmsg). */
int ts_client_declare(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n, uint64_t seed,
                      char *errmsg, size_t errlen);

/* The plan computed by ts_client_declare (NULL before). */
const ts_plan_t *ts_client_plan(const ts_client_t *c);

/* Pull every partition of every tensor into dst[t] (a buffer of tensor t's element count).
 * min_version: wait until every partition is at least that version (sync long poll);
 * clock: the caller's clock for the ssp bound. *version (optional) gets the lowest version
 * pulled. The buffers must not be touched until the call returns. Returns 0 or an error,
 * after which the buffers' content is unspecified. */
int ts_client_pull(ts_client_t *c, float *const *dst, uint64_t min_version, uint64_t clock,
                   uint64_t *version, char *errmsg, size_t errlen);

/* Push gradients grad[t] for every tensor, tagged with step (the version pulled, in sync
 * mode; the worker's clock otherwise). *result (optional) sums the shards' answers. */
int ts_client_push(ts_client_t *c, const float *const *grad, uint64_t step,
                   ts_client_push_result_t *result, char *errmsg, size_t errlen);

/* Pull the partitions that moved on: from each shard, wait for the version after the one
 * last pulled from it (sync mode's next step), or take whatever it has when nothing was
 * pulled from it yet or it restarted since (restored from a checkpoint, it may be behind
 * the others). *version (optional) gets the lowest version pulled. */
int ts_client_pull_next(ts_client_t *c, float *const *dst, uint64_t clock, uint64_t *version,
                        char *errmsg, size_t errlen);

/* Push gradients tagged, per shard, with the version last pulled from that shard (sync
 * mode: each shard's barrier counts them for the step they were computed at). */
int ts_client_push_pulled(ts_client_t *c, const float *const *grad,
                          ts_client_push_result_t *result, char *errmsg, size_t errlen);

/* Push gradients grad[t] tagged with step, then pull every partition into dst[t] with the
 * ssp clock `clock` (async and ssp modes: ts_client_push followed by ts_client_pull with
 * min_version 0), in one round trip: each shard is sent its push and its pull back to
 * back, without waiting for the push's reply, and handles them in order, so the pull sees
 * the push applied. grad and dst must not overlap (ts_client_push_pull fails with
 * TS_EINVAL when they do): the pull's replies are read straight into dst while the push's
 * payload may still be being written from grad. Neither may be touched until the call
 * returns.
 *
 * Returns 0 when both parts succeeded on every shard. Otherwise an error: the push part's
 * when it failed anywhere (errmsg from that failure), else the pull part's; dst's content
 * is then unspecified, result->push_rc and result->pull_rc (optional result) tell each
 * part's outcome, and the shards' last pulled versions are left as they were, so the
 * push_pulled / pull_next that a caller retries with are tagged and wait as the first
 * attempt's were. *version (optional) gets the lowest version pulled, on success. */
int ts_client_push_pull(ts_client_t *c, const float *const *grad, uint64_t step,
                        float *const *dst, uint64_t clock, uint64_t *version,
                        ts_client_push_result_t *result, char *errmsg, size_t errlen);

/* The sync mode counterpart: ts_client_push_pulled followed by ts_client_pull_next, in one
 * round trip. Each shard's push is tagged with the version last pulled from it, and its
 * pull waits (long poll) for the version after that one, exactly as pull_next does; the
 * contract on buffers, errors and versions is ts_client_push_pull's. */
int ts_client_push_pull_next(ts_client_t *c, const float *const *grad, float *const *dst,
                             uint64_t clock, uint64_t *version, ts_client_push_result_t *result,
                             char *errmsg, size_t errlen);

/* How many times a shard was seen to restart (a new incarnation in its Hello). */
uint64_t ts_client_restarts(ts_client_t *c);

/* Push only the listed partitions' gradients (plan indices), for tests and partial
 * updates; payload for plan part k comes from grad[part.tensor] + part.offset. */
int ts_client_push_parts(ts_client_t *c, const float *const *grad, const size_t *parts, size_t n,
                         uint64_t step, ts_client_push_result_t *result, char *errmsg,
                         size_t errlen);

/* Progress carried by the next heartbeats. done = the worker leaves the job's barriers. */
void ts_client_set_progress(ts_client_t *c, uint64_t step, double loss, double examples_per_sec,
                            double epoch_progress, bool done);

/* Send a heartbeat to every shard now and wait for the replies. */
int ts_client_heartbeat(ts_client_t *c, char *errmsg, size_t errlen);

/* Ask shard i for its status. *out is freed with ts_client_free_status. Fails with
 * TS_EUNAVAIL at once when the shard has no ready connection. */
int ts_client_status(ts_client_t *c, uint32_t shard, Tessera__ShardStatus **out, char *errmsg,
                     size_t errlen);
void ts_client_free_status(Tessera__ShardStatus *st);

/* Admin: ask shard i to write a checkpoint now; path (may be NULL) gets the file, *step the
 * step it holds. Needs an admin client. */
int ts_client_checkpoint(ts_client_t *c, uint32_t shard, char *path, size_t pathlen,
                         uint64_t *step, char *errmsg, size_t errlen);

/* Admin: ask shard i to stop (after a final checkpoint when `checkpoint` and the job keeps
 * checkpoints); path gets the final checkpoint ("" when none). */
int ts_client_shutdown(ts_client_t *c, uint32_t shard, bool checkpoint, char *path,
                       size_t pathlen, char *errmsg, size_t errlen);

/* Set the deadline of later calls (seconds). */
void ts_client_set_timeout(ts_client_t *c, double seconds);

#endif
