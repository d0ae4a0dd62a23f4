/*
 * Embedding tables in checkpoint files (docs/operations.md, "Checkpoints"): a model with
 * tables is written in format 2, whose CheckpointMeta lists the TableDecls and, per table,
 * a CheckpointTable (dim, state buffers, row count, version, counters); after the dense
 * parts' floats come each table's rows in order, a record each:
 *
 *   key u64 | updates u64 | last_step u64 | dim float32 value | state_buffers x dim float32
 *
 * (little-endian, as every host the shard builds for is), covered by the file's hash like
 * the rest. A model without tables is written in format 1, byte for byte as before.
 *
 * Incremental checkpoints (checkpoint.full_every): an increment (CheckpointMeta.
 * base_sequence, the full checkpoint it completes) holds per table the keys erased since
 * that full one (CheckpointTable.tombstones, u64 each, before the rows) and only the rows
 * made, updated or pulled at a new version since; increments are cumulative, so a restore
 * reads the full file and the newest increment on it, every row bit for bit.
 *
 * The snapshot copies every live row on the loop, as the dense snapshot copies every
 * partition: it costs the rows' floats plus 24 bytes a row, less than the table holds (its
 * 32 bytes of metadata a row and its index are not copied), so at most
 * server.max_table_bytes. The sync accumulator of an open step is not saved (as a dense
 * partition's is not): after a restore the step starts empty. Neither is the admission
 * sketch (keys sighted but not admitted start counting again).
 *
 * Glossary:
 *   record   one row in a file, as above
 *   merge    re-sharding: rows of several old shards' files go into one store, each kept
 *            only where ts_key_shard gives it this shard
 */
#ifndef TS_CKPT_TABLES_H
#define TS_CKPT_TABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tessera.pb-c.h"
#include "ts_store.h"

#define TS_CKPT_TABLES_FORMAT 2 /* CheckpointMeta.format of a model with tables */

/* The tables' part of a snapshot: what goes into the meta (pointing into the store's
 * declarations: pack the meta before the store changes) and the records. */
typedef struct {
  Tessera__TableDecl **decls;
  Tessera__CheckpointTable *ct;
  Tessera__CheckpointTable **ctp;
  size_t n;
  uint8_t *records; /* every table's records, in table order; the snapshot takes it */
  size_t records_len;
} ts_ckpt_tables_t;

/* Copy the store's tables (loop thread): every row, or (incremental) the rows changed
 * since the last full checkpoint and the keys erased since. Returns 0, TS_ENONFINITE (a row
 * holds NaN or Inf: errmsg names the table and key) or TS_ENOMEM. Nothing to do (out
 * zeroed) for a model without tables. */
int ts_ckpt_tables_snapshot(const ts_store_t *s, bool incremental, ts_ckpt_tables_t *out,
                            char *errmsg, size_t errlen);
/* Incremental checkpoints (ts_store_table.h): whether the next must be full (erased keys
 * were not all kept); a full snapshot was taken; and it was written or not. */
bool ts_ckpt_tables_need_full(const ts_store_t *s);
void ts_ckpt_tables_full_taken(ts_store_t *s);
void ts_ckpt_tables_full_done(ts_store_t *s, bool written);
/* Point m's table fields at t's and set its format (2) when there are tables. */
void ts_ckpt_tables_fill(const ts_ckpt_tables_t *t, Tessera__CheckpointMeta *m);
/* Free t (its records too, unless taken: set records to NULL first). */
void ts_ckpt_tables_free(ts_ckpt_tables_t *t);

/* The lowest table version (*any false when the model has no tables). */
uint64_t ts_ckpt_tables_min_version(const ts_store_t *s, bool *any);
/* A number that moves whenever the tables change (rows made, pushes applied, steps
 * closed): what the scheduler compares to skip checkpoints of an unchanged store. */
uint64_t ts_ckpt_tables_changes(const ts_store_t *s);

/* Bytes of the table section m's header announces, at most room (the file's bytes after
 * the dense data): false when the header is inconsistent (tables and sections not paired,
 * a width that is not the declaration's or not 1..4096, over two state buffers, a format
 * 1 file with tables) or the section would exceed room. */
bool ts_ckpt_tables_section_bytes(const Tessera__CheckpointMeta *m, uint64_t room, uint64_t *bytes);

/* Whether a and b declare the same tables (every setting). */
bool ts_ckpt_tables_same(const Tessera__CheckpointMeta *a, const Tessera__CheckpointMeta *b);

/* Read the table section of a verified file (f positioned after the dense data) into the
 * store s, declared from a file of the same model (its tables made, empty): every record
 * must be a key of file_shard of file_num_shards (else the file is corrupt); merge false:
 * every row is restored, with the table's version and counters; merge true (re-sharding):
 * only the rows ts_key_shard gives this store's shard, the version the highest of the
 * files', counters left. Rows written with another optimizer's state keep their values
 * (state starts fresh, updates 0; *state_dropped set). Returns 0, or TS_EDATA /
 * TS_ETOOBIG / TS_ENOMEM with why. */
int ts_ckpt_tables_read(ts_store_t *s, FILE *f, const Tessera__CheckpointMeta *m, bool merge,
                        bool *state_dropped, char *why, size_t whylen);

#endif
