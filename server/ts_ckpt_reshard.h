/*
 * Re-sharding at restore: a shard that has no checkpoint of its own layout takes its
 * partitions out of a complete set of files written by another shard count or partition
 * size (ts_ckpt_reshard.c says how a set is chosen and checked).
 *
 * Glossary:
 *   layout   (num_shards, partition_bytes) of the job that wrote a file (ts_ckpt_file.h)
 *   set      one file of every shard of a layout, all at the same step
 */
#ifndef TS_CKPT_RESHARD_H
#define TS_CKPT_RESHARD_H

#include <stdbool.h>
#include <stddef.h>

#include "ts_store.h"

/* Re-shard: into the undeclared store s, restore the newest complete set of another layout
 * found in dirs (ndirs of them) whose newest file was written after newer_than (seconds
 * since the epoch; negative: any), taking the parts of the tensors this shard holds under
 * its own plan: parameters, optimizer state, versions and update counts; a set another
 * job wrote (ts_ckpt_other_job) only when adopt. desc gets a
 * one-line description of what was restored. Returns 1 when restored; 0 when the
 * directories hold no file of another layout, or newer_than >= 0 and no newer set could be
 * used; TS_EDATA when newer_than < 0 and files of another layout exist but no set of them
 * can be used (no complete set: errmsg lists the steps of the shards found; complete sets
 * that failed to load: each was logged, errmsg says why the last failed; s stays
 * undeclared); TS_ENOMEM. */
int ts_ckpt_reshard(ts_store_t *s, char *const *dirs, size_t ndirs, double newer_than, bool adopt,
                    char *desc, size_t desclen, char *errmsg, size_t errlen);

/* Whether dirs hold a complete set of another layout (headers only, nothing verified):
 * 1 with *wall the time its newest file was written, else 0. */
int ts_ckpt_reshard_newest_set(const ts_store_t *s, char *const *dirs, size_t ndirs, double *wall);

#endif
