/*
 * Checkpoints of a shard (docs/operations.md): its partitions, optimizer state and versions,
 * written atomically (temporary file, fsync, rename, fsync of the directory) with a BLAKE2b
 * hash, the last checkpoint.keep of them kept; on start the newest valid one is restored.
 *
 * File names: DIR/shard-<N>-<sequence, 20 digits>.ckpt, so names sort by age. The format is
 * in proto/tessera.proto (CheckpointMeta). Writing happens in two halves so the network loop
 * never waits on the disk: ts_checkpoint_snapshot copies the state (loop thread, a memcpy),
 * ts_checkpoint_write puts a snapshot on disk (any thread).
 */
#ifndef TS_CHECKPOINT_H
#define TS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "ts_store.h"

typedef struct ts_ckpt_snapshot ts_ckpt_snapshot_t;

/* Copy the store's state. Returns 0, TS_ENOTDECLARED (nothing to save), TS_ENONFINITE (a
 * parameter or state value is NaN or Inf: such a state is never checkpointed; errmsg names
 * the tensor) or TS_ENOMEM. */
int ts_checkpoint_snapshot(const ts_store_t *s, uint64_t sequence, ts_ckpt_snapshot_t **out,
                           char *errmsg, size_t errlen);

/* Write a snapshot into dir (created if missing) and delete this shard's checkpoints beyond
 * the newest `keep`. path (may be NULL) gets the file written, *bytes its size. Returns 0 or
 * a negative errno / TS_E* with errmsg. Thread-safe for distinct snapshots. */
int ts_checkpoint_write(const ts_ckpt_snapshot_t *snap, const char *dir, int keep, char *path,
                        size_t pathlen, uint64_t *bytes, char *errmsg, size_t errlen);

uint64_t ts_checkpoint_snapshot_step(const ts_ckpt_snapshot_t *snap);
void ts_checkpoint_snapshot_free(ts_ckpt_snapshot_t *snap);

/* Restore the newest valid checkpoint of `shard` from dir into an undeclared store. Invalid
 * ones (truncated, hash mismatch, another shard count or partition size) are logged with the
 * reason and skipped. Returns 1 when one was restored (path, *sequence set), 0 when there
 * is none, or a negative error for an unreadable directory. */
int ts_checkpoint_restore(ts_store_t *s, const char *dir, char *path, size_t pathlen,
                          uint64_t *sequence, char *errmsg, size_t errlen);

/* The highest sequence number among shard's checkpoints in dir (0 when none). */
uint64_t ts_checkpoint_last_sequence(const char *dir, uint32_t shard);

#endif
