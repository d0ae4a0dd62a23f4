/*
 * The store's embedding tables (docs/architecture.md, "Tables"): the second kind of unit of
 * the shard store, beside dense partitions. A table is declared with the model
 * (Declare.tables) and holds, on this shard, the rows of the keys ts_key_shard gives it:
 * made on first touch (admitted by server/ts_admit.h's rules), updated row by row with a
 * lazy optimizer (server/ts_rowopt.h), evicted by steps to live, by max_rows and by the
 * shard's byte budget (server.max_table_bytes, over all tables), least recently used first.
 *
 * Push receive, pull replies, the barrier glue and status call these functions and never
 * look inside a table (ts_stable_t is opaque outside ts_store_table.c).
 *
 * Glossary:
 *   version   the table's version on this shard: sync, its closed steps; async and ssp,
 *             the pushes applied
 *   record    one row of a SparsePush payload: the key (8 bytes, little-endian) then dim
 *             float32 (ts_msg_sparse_record_bytes)
 *   accumulator  sync: the step's summed gradients, a second row table of dim floats per key
 *
 * No I/O; used from the server's loop thread only, as the rest of the store.
 */
#ifndef TS_STORE_TABLE_H
#define TS_STORE_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera.pb-c.h"
#include "ts_optim.h"
#include "ts_table.h"

typedef struct ts_stable ts_stable_t;

/* The hottest keys status shows of a table. */
#define TS_STABLE_HOT_KEYS 8

/* What status shows of a table (TableStatus). */
typedef struct {
  const char *name;
  uint32_t dim;
  uint64_t rows, bytes, version;
  uint64_t created, evicted, filtered, pulled_rows, pushed_rows;
  uint64_t hot[TS_STABLE_HOT_KEYS]; /* the keys pulled most of late, hottest first */
  uint32_t num_hot;
  double hot_share; /* their share of the pulled keys (a lower bound, ts_hotkeys.h) */
} ts_stable_info_t;

/* The tables of a Declare, made (and checked) for a store of the given job: mode sync (an
 * accumulator each), the job's optimizer (its kind, learning rate and Adam settings) for
 * ROW_OPT_DEFAULT, the model's seed (d->seed). Names listed twice: TS_ESHAPE; ROW_OPT_DEFAULT with the
 * momentum optimizer: TS_ECONFIG naming the table. Allocates the admission sketches only
 * (rows come later). Returns 0 with *out (n tables; NULL when none) or a code with errmsg. */
int ts_stables_make(const Tessera__Declare *d, bool sync, const ts_optim_t *job,
                    uint32_t num_workers, ts_stable_t **out, char *errmsg, size_t errlen);
void ts_stables_free(ts_stable_t *t, uint32_t n);

/* 0 when d lists the same tables with the same settings as t[0..n), else TS_ESHAPE with
 * the first difference in errmsg. */
int ts_stables_same(const ts_stable_t *t, uint32_t n, const Tessera__Declare *d, char *errmsg,
                    size_t errlen);

/* Table i of t. */
ts_stable_t *ts_stables_at(ts_stable_t *t, uint32_t i);

uint32_t ts_stable_dim(const ts_stable_t *t);
uint64_t ts_stable_version(const ts_stable_t *t);
const char *ts_stable_name(const ts_stable_t *t);
void ts_stable_info(const ts_stable_t *t, ts_stable_info_t *info);
/* Bytes the table holds now: rows, state, index, sketch and accumulator. */
uint64_t ts_stable_bytes(const ts_stable_t *t);

/* Keys of a request: strictly ascending (after *prev when have_prev) and every one on
 * `shard` of num_shards. Returns 0 or TS_EINVAL with errmsg naming the index (base + i).
 * Keys are read from unaligned memory: key i at (const char *)keys + i * stride. */
int ts_stable_check_keys(const void *keys, size_t stride, size_t n, uint64_t *prev, bool *have_prev,
                         uint32_t shard, uint32_t num_shards, uint64_t base, char *errmsg,
                         size_t errlen);

/* The shared budget of all tables (server.max_table_bytes) and the bytes they hold. */
typedef struct {
  uint64_t max_bytes;
  uint64_t bytes;
  /* Sync mode: of bytes, the steps' gradient sums (the tables' accumulators), and the room
   * rows leave them (TS_STABLE_ACCUM_SHARE of max_bytes): a table's slabs never shrink, so
   * rows that took the whole budget would leave a step no room for its gradients. */
  uint64_t accum_bytes;
  uint64_t accum_room;
  uint64_t rng; /* the LRU sample's random state */
  bool track;   /* incremental checkpoints: mark changed rows, keep erased keys */
} ts_stable_budget_t;

/* Sync mode: the share of server.max_table_bytes that rows leave for a step's gradient sums
 * (1 / TS_STABLE_ACCUM_SHARE); the sums may take any room left besides. */
#define TS_STABLE_ACCUM_SHARE 8

/* Answer a read-only pull (SparsePull.read_only): as ts_stable_pull, but a key with no row
 * gets the initialiser's row and nothing changes: no row made, no sighting, no recency. */
void ts_stable_peek(ts_stable_t *t, const uint64_t *keys, size_t n, float *out);

/* Answer a pull: out[i * dim ..] = key i's row (keys[0..n) checked). A key with no row
 * counts a sighting and is made when admitted (and the budget allows), else gets the
 * initialiser's row without being stored. */
void ts_stable_pull(ts_stable_t *t, ts_stable_budget_t *b, const uint64_t *keys, size_t n,
                    float *out);

/* Async/ssp: apply n records (checked) now, each row with its own update count; a key with
 * no row is made when admissible without a sighting, else its gradient is dropped. Adds to
 * *rows (updated) and *filtered. The caller calls ts_stable_bump once per push. */
void ts_stable_apply(ts_stable_t *t, ts_stable_budget_t *b, const float *records, size_t n,
                     uint64_t *rows, uint64_t *filtered);

/* Async: ts_stable_apply, then each key's row as ts_stable_pull would read it right after
 * (a push+pull in one frame): out[i * dim ..] = record i's row, read while the update has
 * it in cache, with the pull's admission, sighting and recency for a key left without a
 * row. One lookup a key where the two calls make two. */
void ts_stable_apply_pull(ts_stable_t *t, ts_stable_budget_t *b, const float *records, size_t n,
                          uint64_t *rows, uint64_t *filtered, float *out);
/* One push applied: the version moves on. */
void ts_stable_bump(ts_stable_t *t);

/* Sync: the step's barrier. step_state: TESSERA__PUSH_RESULT__PUSH_ACCUMULATED when task
 * may push for `step` now, ..._STALE (step < version), ..._DUPLICATE (task pushed for it
 * already); a step ahead of the version returns TS_EFUTURE (the caller refuses the push). */
int ts_stable_sync_state(const ts_stable_t *t, int task, uint64_t step);
/* Sync: sum n records (checked) of worker `task`'s push into the step's accumulator (keys
 * not admissible are dropped: *filtered); the task is in part until ts_stable_contribute. */
void ts_stable_accumulate(ts_stable_t *t, ts_stable_budget_t *b, int task, const float *records,
                          size_t n, uint64_t *rows, uint64_t *filtered);
/* Sync: task's push for the open step is in (its records, maybe none, were accumulated). */
void ts_stable_contribute(ts_stable_t *t, int task, uint64_t now_ms);
/* Sync: the open step's count, its contributors (num_workers bytes) and when it opened. */
uint32_t ts_stable_sync_count(const ts_stable_t *t);
/* Sync: the tasks of the open step whose push is in part only (accumulated, not complete). */
uint32_t ts_stable_sync_partial(const ts_stable_t *t);
const uint8_t *ts_stable_contributed(const ts_stable_t *t);
uint64_t ts_stable_opened_ms(const ts_stable_t *t);
/* Sync: close the open step: every accumulated row applied once with 1 / (count + the tasks
 * in part: each of their records is one key's whole gradient, so they count as pushes of
 * the keys that came), the version moves to step + 1. */
void ts_stable_sync_complete(ts_stable_t *t, ts_stable_budget_t *b);

/* Checkpoints (server/ts_ckpt_tables.c). The table as declared, its rows (read only: a
 * snapshot walks them with ts_table_next, each row stride floats: value then state) and
 * its optimizer's state buffers per row. */
const Tessera__TableDecl *ts_stable_decl(const ts_stable_t *t);
const ts_table_t *ts_stable_rows(const ts_stable_t *t);
int ts_stable_nstate(const ts_stable_t *t);
/* Restore one row of a checkpoint into a table of a store being restored: floats are its
 * value and file_nstate state buffers (dim floats each), updates and last_step its
 * metadata. State of another optimizer (file_nstate differs) is dropped: the row gets the
 * optimizer's initial state and updates 0. Returns 0, TS_EDATA (the key has a row
 * already), TS_ETOOBIG (over max_rows or server.max_table_bytes: nothing is evicted at a
 * restore) or TS_ENOMEM, with errmsg. */
int ts_stable_restore_row(ts_stable_t *t, ts_stable_budget_t *b, uint64_t key, uint64_t updates,
                          uint64_t last_step, const float *floats, int file_nstate, bool replace,
                          char *errmsg, size_t errlen);
/* An increment's tombstone: key's row goes (if there is one). */
void ts_stable_forget(ts_stable_t *t, uint64_t key);

/* Incremental checkpoints (ts_store_init sets b->track when checkpoint.full_every > 1): a
 * row made, updated or pulled at a new version (its last_step moved) carries
 * TS_STABLE_DIRTY in its meta's count (unused otherwise) until a full checkpoint is taken,
 * TS_STABLE_PENDING while that one is written; a key erased (evicted, expired) is kept as a
 * tombstone until a full checkpoint that follows it is written. At most
 * TS_STABLE_MAX_TOMBSTONES a table: past them the next checkpoint must be full
 * (ts_stable_tombstones_lost). */
#define TS_STABLE_DIRTY (1u << 31)
#define TS_STABLE_PENDING (1u << 30)
#define TS_STABLE_MAX_TOMBSTONES (1u << 20)
static inline bool ts_stable_row_changed(const ts_table_meta_t *m) {
  return (m->count & (TS_STABLE_DIRTY | TS_STABLE_PENDING)) != 0;
}
/* The keys erased since the last full checkpoint written, oldest first. */
const uint64_t *ts_stable_tombstones(const ts_stable_t *t, size_t *n);
bool ts_stable_tombstones_lost(const ts_stable_t *t);
/* A full checkpoint was taken (marks become pending) and later written or not: written,
 * its pending marks and tombstones go; failed, they count again. */
void ts_stable_full_taken(ts_stable_t *t);
void ts_stable_full_done(ts_stable_t *t, bool written);
/* Restore the table's version and counters (info's name, dim, rows and bytes are ignored). */
void ts_stable_restore_counters(ts_stable_t *t, const ts_stable_info_t *info);

/* Evict the rows untouched for steps_to_live versions, looking at no more than budget row
 * slots (a sweep resumed from a cursor). Returns rows evicted. */
size_t ts_stable_expire(ts_stable_t *t, ts_stable_budget_t *b, size_t budget);

/* Halve the counts of the table's hottest keys (the shard does it every few seconds, so
 * they follow the recent pulls). */
void ts_stable_decay_hot(ts_stable_t *t);

#endif
