/*
 * What the two halves of checkpoint restoring share (nobody else includes this):
 * ts_checkpoint.c writes files and restores a shard's own layout; ts_ckpt_reshard.c restores
 * a complete set of files written by another shard count or partition size.
 *
 * Glossary:
 *   layout   (num_shards, partition_bytes) of the job that wrote a file: with the tensor
 *            list it fixes the plan (proto/ts_plan.h), hence which partitions a file holds
 *   set      one file of every shard of a layout, all at the same step (ts_ckpt_reshard.c)
 */
#ifndef TS_CHECKPOINT_INT_H
#define TS_CHECKPOINT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tessera.pb-c.h"
#include "ts_store.h"

/* The checkpoint file names in dir, sorted oldest first within a shard: those of `shard`,
 * or of every shard when shard < 0 (then *shards, when not NULL, gets each name's shard
 * index; freed with ts_free). Returns the count (0 for a missing directory) or a negative
 * errno; *names is freed with ts_ckpt_free_names. */
int ts_ckpt_list(const char *dir, int shard, char ***names, uint32_t **shards);
void ts_ckpt_free_names(char **names, int n);

/* Read only the header of a checkpoint file (magic, length, CheckpointMeta), without the
 * hash check: enough to learn its layout, step and model, never enough to trust its data.
 * Returns 0 with *meta (free with ts_msg_free), or TS_EDATA / a negative errno with errmsg. */
int ts_ckpt_read_meta(const char *path, Tessera__CheckpointMeta **meta, char *errmsg,
                      size_t errlen);

/* Open path and check magic, sizes and the BLAKE2b hash of the whole file. Returns 0 with
 * the decoded meta (free with ts_msg_free) and the file (fclose) positioned at the first
 * partition's data, or TS_EDATA / TS_ENOMEM / a negative errno with errmsg naming path. */
int ts_ckpt_open_checked(const char *path, FILE **fp, Tessera__CheckpointMeta **meta, char *errmsg,
                         size_t errlen);

/* Whether a file's layout is the store's: the same shard count and partition size. */
bool ts_ckpt_same_layout(const ts_store_t *s, const Tessera__CheckpointMeta *m);

/* Re-shard: into the undeclared store s, restore the newest complete set of another layout
 * found in dirs (ndirs of them) whose newest file was written after newer_than (seconds
 * since the epoch; negative: any), taking the parts of the tensors this shard holds under
 * its own plan: parameters, optimizer state, versions and update counts. desc gets a
 * one-line description of what was restored. Returns 1 when restored; 0 when the
 * directories hold no file of another layout, or newer_than >= 0 and no newer set could be
 * used; TS_EDATA when newer_than < 0 and files of another layout exist but no set of them
 * can be used (no complete set: errmsg lists the steps of the shards found; complete sets
 * that failed to load: each was logged, errmsg says why the last failed; s stays
 * undeclared); TS_ENOMEM. */
int ts_ckpt_reshard(ts_store_t *s, char *const *dirs, size_t ndirs, double newer_than, char *desc,
                    size_t desclen, char *errmsg, size_t errlen);

/* Whether dirs hold a complete set of another layout (headers only, nothing verified):
 * 1 with *wall the time its newest file was written, else 0. */
int ts_ckpt_newest_set(const ts_store_t *s, char *const *dirs, size_t ndirs, double *wall);

#endif
