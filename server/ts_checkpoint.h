/*
 * Checkpoints of a shard (docs/operations.md): its partitions, optimizer state and versions,
 * written atomically (temporary file, fsync, rename, fsync of the directory) with a BLAKE2b
 * hash, the last checkpoint.keep of them kept; on start the newest valid one is restored,
 * or, when the shard count or partition size changed, re-sharded from a complete set of
 * the old layout's files (ts_ckpt_reshard.c).
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

/* Write a snapshot into dir (created if missing): a temporary file, fsync, rename, fsync of
 * the directory; only then delete this shard's checkpoints of its own layout beyond the
 * newest `keep` (files of another layout stay: they may be a set to re-shard from). path
 * (may be NULL) gets the file written, *bytes its size. Returns 0 or a negative errno /
 * TS_E* with errmsg (a failed fsync of the directory too: then nothing is deleted).
 * Thread-safe for distinct snapshots. */
int ts_checkpoint_write(const ts_ckpt_snapshot_t *snap, const char *dir, int keep, char *path,
                        size_t pathlen, uint64_t *bytes, char *errmsg, size_t errlen);

uint64_t ts_checkpoint_snapshot_step(const ts_ckpt_snapshot_t *snap);
void ts_checkpoint_snapshot_free(ts_ckpt_snapshot_t *snap);

/* Restore into an undeclared store, at start (docs/operations.md, "Changing the number of
 * shards"):
 *  1. the newest valid checkpoint of this shard in its own layout (the same shard count and
 *     partition size) in dir; invalid ones (truncated, hash mismatch, unreadable) are logged
 *     with the reason and an older one is tried. Returns 1 (path, *sequence set), unless a
 *     complete set of another layout (below) was written after it, as when the shard count
 *     changed and then changed back: the newest state wins, and that set is restored.
 *  2. when there is none: re-sharding. The files of another layout found in dir and in the
 *     nfrom directories `from` (checkpoint.restore_from) must hold one complete set, a file
 *     of every old shard at one step; the newest such set is taken and this shard copies the
 *     partitions it holds under its own plan out of it. Returns 2 (path gets a description).
 *     Files of another layout but no usable set: TS_EDATA, errmsg lists what was found.
 * Returns 0 when there is nothing to restore, or a negative error for an unreadable
 * directory. The store stays undeclared unless something was restored. */
int ts_checkpoint_restore(ts_store_t *s, const char *dir, char *const *from, size_t nfrom,
                          char *path, size_t pathlen, uint64_t *sequence, char *errmsg,
                          size_t errlen);

/* Delete shard's temporary files in dir: checkpoint writes a crash interrupted (each is
 * logged). Returns how many were removed. Call before the shard writes again. */
int ts_checkpoint_clean_tmp(const char *dir, uint32_t shard);

/* The highest sequence number among shard's checkpoints in dir (0 when none). */
uint64_t ts_checkpoint_last_sequence(const char *dir, uint32_t shard);

#endif
