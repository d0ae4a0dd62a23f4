/*
 * The checkpoint file format (docs/operations.md): a file is
 *
 *   "TSCKPT01" | u32 meta_len (LE) | CheckpointMeta (proto/tessera.proto) | float32 data |
 * table records (format 2) | BLAKE2b-256 (keyed when signed: ts_ckpt_file_set_key)
 *
 * the data being every listed part's values and then its optimizer state buffers, in the
 * order the meta lists them; the table records each table's rows (ts_ckpt_tables.h), in
 * the order the meta lists the tables; the hash covers everything before it. Format 1 (no
 * tables) and 2 are both read. Names are
 * DIR/shard-<N>-<sequence, 20 digits>.ckpt, so they sort by age within a shard.
 *
 * Glossary:
 *   layout   (num_shards, partition_bytes) of the job that wrote a file: with the tensor
 *            list it fixes the plan (proto/ts_plan.h), hence which partitions a file holds
 *   snapshot a file's contents in memory, taken from a store on the loop (ts_ckpt.h) and
 *            written here from any thread
 *
 * This module knows bytes and files only, never a store: ts_ckpt.c converts, and the
 * re-sharding reader (ts_ckpt_reshard.c) reads files of other layouts through it.
 */
#ifndef TS_CKPT_FILE_H
#define TS_CKPT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tessera.pb-c.h"

#define TS_CKPT_FILE_FORMAT 1 /* CheckpointMeta.format */

/* A checkpoint in memory: the packed meta and the data, both owned (ts_ckpt_snapshot_free). */
typedef struct ts_ckpt_snapshot {
  uint32_t shard, num_shards;
  uint64_t partition_bytes;
  uint64_t step, sequence;
  uint64_t base_sequence; /* an increment's full checkpoint; 0: full */
  uint8_t *meta;          /* packed CheckpointMeta */
  size_t meta_len;
  float *data; /* every part's values and state, in file order */
  size_t data_count;
  uint8_t *records; /* every table's row records, in file order (NULL when none) */
  size_t records_len;
} ts_ckpt_snapshot_t;

/* Checkpoint signing (checkpoint.sign): from now on, files are written and verified with
 * a BLAKE2b keyed by ts_ckpt_file_key(token) instead of the plain hash; NULL goes back to
 * the plain hash. Process-wide: call before the first write or read. */
void ts_ckpt_file_set_key(const char *token);
/* The 32-byte key a token gives (for tests that forge signed files). */
void ts_ckpt_file_key(const char *token, uint8_t key[32]);

/* Write a snapshot into dir (created if missing): a temporary file, fsync, rename, fsync of
 * the directory; only then delete this shard's checkpoints of its own layout beyond the
 * newest `keep` (files of another layout stay: they may be a set to re-shard from; so do
 * the full checkpoints the kept increments are on). path
 * (may be NULL) gets the file written, *bytes its size. Returns 0 or a negative errno /
 * TS_E* with errmsg (a failed fsync of the directory too: then nothing is deleted).
 * Thread-safe for distinct snapshots. */
int ts_ckpt_file_write(const ts_ckpt_snapshot_t *snap, const char *dir, int keep, char *path,
                       size_t pathlen, uint64_t *bytes, char *errmsg, size_t errlen);

/* The checkpoint file names in dir, sorted oldest first within a shard: those of `shard`,
 * or of every shard when shard < 0 (then *shards, when not NULL, gets each name's shard
 * index; freed with ts_free). Returns the count (0 for a missing directory) or a negative
 * errno; *names is freed with ts_ckpt_file_free_names. */
int ts_ckpt_file_list(const char *dir, int shard, char ***names, uint32_t **shards);
void ts_ckpt_file_free_names(char **names, int n);

/* Read only the header of a checkpoint file (magic, length, CheckpointMeta), without the
 * hash check: enough to learn its layout, step and model, never enough to trust its data.
 * Returns 0 with *meta (free with ts_msg_free), or TS_EDATA / a negative errno with errmsg. */
int ts_ckpt_file_read_meta(const char *path, Tessera__CheckpointMeta **meta, char *errmsg,
                           size_t errlen);

/* Open path and check magic, sizes (the table section's too) and the BLAKE2b hash of the
 * whole file. Returns 0 with the decoded meta (free with ts_msg_free) and the file (fclose)
 * positioned at the first partition's data, or TS_EDATA / TS_ENOMEM / a negative errno with errmsg naming path. */
int ts_ckpt_file_open(const char *path, FILE **fp, Tessera__CheckpointMeta **meta, char *errmsg,
                      size_t errlen);

/* The index of the first NaN or Inf among v[0..n), or n when every value is finite:
 * snapshots never hold one, so a file that does is refused by name when it is read. */
size_t ts_ckpt_first_nonfinite(const float *v, size_t n);

/* Whether a file's layout is (num_shards, partition_bytes). */
bool ts_ckpt_file_same_layout(const Tessera__CheckpointMeta *m, uint32_t num_shards,
                              uint64_t partition_bytes);

/* Whether dir takes a checkpoint of shard: dir is made if missing, then a small test file
 * is written, fsynced and removed. Returns 0, or a negative errno with errmsg saying what
 * failed (not a directory, not writable, no space). */
int ts_ckpt_file_probe(const char *dir, uint32_t shard, char *errmsg, size_t errlen);

/* Delete shard's temporary files in dir: checkpoint writes a crash interrupted (each is
 * logged). Returns how many were removed. Call before the shard writes again. */
int ts_ckpt_file_clean_tmp(const char *dir, uint32_t shard);

/* The highest sequence number among shard's checkpoints in dir (0 when none). */
uint64_t ts_ckpt_file_last_sequence(const char *dir, uint32_t shard);

#endif
