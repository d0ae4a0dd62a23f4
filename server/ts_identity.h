/*
 * Who may speak for a worker task (docs/security.md, "Who speaks for a task"): one
 * connection holds each task on a shard; a second one is refused while the first is alive,
 * unless it proves the task with the task's key and the holder did not. Goodbyes, the
 * job-end question and the final accuracy count only from the holder; the final accuracy
 * only from the reporter, once.
 *
 * Used from the server's loop thread only.
 */
#ifndef TS_IDENTITY_H
#define TS_IDENTITY_H

#include <stdbool.h>
#include <stdint.h>

#include "ts_server_int.h"

/* s handshook as worker `task` (proven: with the task's key). True when it may go on: it
 * holds the task (a holder that is silent, or a claim replaced by a proof, is closed), or,
 * on a shard without a token, it is a second connection let in without a voice (logged
 * once per holder with both peers). False when it is refused (a shard with a token, the
 * holder alive): it was told why (EBUSY), and the refusal logged once per holder with both
 * peers. */
bool ts_identity_claim(ts_session_t *s, uint64_t request_id, int task, bool proven);

/* s is closing: the task it held has no holder. */
void ts_identity_release(ts_session_t *s);

/* True when s holds its task: the one connection that speaks for it. A connection let in
 * beside a holder takes the task over once the holder is closed or silent. */
bool ts_identity_holds(ts_session_t *s);

/* The job's final test accuracy acc, reported by s's task in a heartbeat: kept when it is an
 * accuracy, from the holder of the task shard 0 chose (on other shards: of a finished task
 * once every worker finished), and none was kept yet. A refusal is logged once per shard
 * process. */
void ts_identity_final_accuracy(ts_session_t *s, double acc, uint32_t finished);

#endif
