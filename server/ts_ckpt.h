/*
 * Checkpoints of a shard's store (docs/operations.md): its partitions, optimizer state and
 * versions, and its embedding tables' rows (ts_ckpt_tables.h). Writing happens in two halves so the network loop never waits on the disk:
 * ts_ckpt_snapshot copies the state (loop thread, a memcpy), ts_ckpt_file_write
 * (ts_ckpt_file.h) puts the snapshot on disk (any thread). When they are written is
 * ts_ckpt_sched.c's business. On start the newest valid checkpoint is restored, or, when
 * the shard count or partition size changed, re-sharded from a complete set of the old
 * layout's files (ts_ckpt_reshard.h).
 */
#ifndef TS_CKPT_H
#define TS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "ts_ckpt_file.h"
#include "ts_store.h"

/* Copy the store's state: whole, or (base_sequence, the sequence of this shard's last full
 * checkpoint written, not 0; a model with tables) an increment on it (ts_ckpt_tables.h).
 * A full snapshot of tables is followed by ts_ckpt_tables_full_taken and, once written or
 * not, ts_ckpt_tables_full_done (the scheduler's). Returns 0, TS_ENOTDECLARED (nothing to save), TS_ENOTREADY
 * (initial values still awaited), TS_ENONFINITE (a parameter or state value is NaN or Inf:
 * such a state is never checkpointed; errmsg names the tensor) or TS_ENOMEM. */
int ts_ckpt_snapshot(const ts_store_t *s, uint64_t sequence, uint64_t base_sequence,
                     ts_ckpt_snapshot_t **out, char *errmsg, size_t errlen);
void ts_ckpt_snapshot_free(ts_ckpt_snapshot_t *snap);

/* The step a checkpoint of s is at: the lowest version of its partitions and, in sync
 * mode, of its tables (0 for a model of tables only in async or ssp mode). */
uint64_t ts_ckpt_step(const ts_store_t *s);
/* A count that moves whenever s changes (updates applied, table rows made or updated):
 * the scheduler skips a checkpoint when it has not moved since the last. */
uint64_t ts_ckpt_changes(const ts_store_t *s);

/* A job's identity: BLAKE2b of its model (tensors: names, shapes, initialisers; tables:
 * names and widths; the seed), the settings a checkpoint cannot be carried across
 * (job.mode, optimizer.name) and job.name when set, as 16 hex digits. Every shard of a job
 * computes the same. The cluster's shape is left out: re-sharding keeps the id. */
#define TS_CKPT_JOB_ID_LEN 16
void ts_ckpt_job_id(const ts_store_t *s, char out[TS_CKPT_JOB_ID_LEN + 1]);
/* Whether checkpoint m was written by another job than the one declared in s (files
 * older than job ids have none: never another job); why then names both ids and --adopt. */
bool ts_ckpt_other_job(const ts_store_t *s, const Tessera__CheckpointMeta *m, char *why,
                       size_t whylen);

/* Restore into an undeclared store, at start (docs/operations.md, "Changing the number of
 * shards"):
 *  1. the newest valid checkpoint of this shard in its own layout (the same shard count and
 *     partition size) in dir; invalid ones (truncated, hash mismatch, unreadable, a NaN or
 *     Inf value, which no snapshot holds) are logged with the reason and an older one is
 *     tried. Returns 1 (path, *sequence set), unless a
 *     complete set of another layout (below) was written after it, as when the shard count
 *     changed and then changed back: the newest state wins, and that set is restored.
 *  2. when there is none: re-sharding. The files of another layout found in dir and in the
 *     nfrom directories `from` (checkpoint.restore_from) must hold one complete set, a file
 *     of every old shard at one step; the newest such set is taken and this shard copies the
 *     partitions it holds under its own plan out of it. Returns 2 (path gets a description).
 *     Files of another layout but no usable set: TS_EDATA, errmsg lists what was found.
 *  A file of another job (its job_id, ts_ckpt_job_id, differs from the one its model has
 *  under this shard's settings) is rejected unless adopt (ps-server --adopt), and so is a
 *  set to re-shard from with such a file.
 *  3. when this shard has files of its own layout and every one was rejected, and no set
 *     of another layout could be restored instead: TS_EDATA, errmsg naming the first few
 *     files and their reasons and counting the rest; never a silent fresh start.
 * Returns 0 when there is nothing to restore, or a negative error for an unreadable
 * directory. The store stays undeclared unless something was restored. */
int ts_ckpt_restore(ts_store_t *s, const char *dir, char *const *from, size_t nfrom, bool adopt,
                    char *path, size_t pathlen, uint64_t *sequence, char *errmsg, size_t errlen);

#endif
