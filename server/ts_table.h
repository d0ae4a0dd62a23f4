/*
 * The rows of one embedding table on one shard (docs/architecture.md, "Tables"): a hash
 * table from 64-bit keys to rows of width dim, each row its value, its optimizer state and
 * the little metadata admission and eviction read.
 *
 * Layout. Rows live in slabs of TS_TABLE_SLAB_ROWS rows allocated as the table grows and
 * never moved; past its first 2 MiB a table's slabs, their metadata and its index are on
 * transparent huge pages (slabs in groups of at least 2 MiB, ts_huge_alloc), so a lookup
 * in a table of gigabytes does not also miss the TLB. A row's memory stays
 * where it is until the row is erased, so a pull reply can be written straight from it.
 * An erased row's slot goes on a free list and is reused. The index is open addressing
 * with linear probing at a load factor of at most 1/2, deletion by backward shift (no
 * tombstones, so probes stay short however many keys come and go); growing it rehashes
 * the index only, never the rows; a large table's next index is made ahead, off the loop
 * thread (ts_table_prepare_grow), so growing it only moves the entries. An index slot is 8 bytes: the low 32 bits of the key's
 * hash (its tag, which also gives its home slot) and the row id; the key itself is only
 * in the row's metadata, read when a tag matches (a false match is 1 in 2^32). So a row
 * costs its floats, 32 bytes of metadata and 16 to 32 bytes of index.
 *
 * Glossary:
 *   row id   a row's place, stable while it exists: slab id >> TS_TABLE_SLAB_SHIFT,
 *            row id & (TS_TABLE_SLAB_ROWS - 1) inside the slab
 *   stride   floats per row: dim for the value, then nstate * dim of optimizer state
 *
 * Not thread-safe: used from the shard's loop thread only, as the dense store is.
 */
#ifndef TS_TABLE_H
#define TS_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_prefault.h"

#define TS_TABLE_SLAB_SHIFT 12
#define TS_TABLE_SLAB_ROWS (1u << TS_TABLE_SLAB_SHIFT)
#define TS_TABLE_NONE UINT32_MAX /* no row */

/* A row in the table (next_free of a live row); a row on the free list has the next erased
 * row there, or TS_TABLE_NONE. */
#define TS_TABLE_LIVE (UINT32_MAX - 1)

/* What admission and eviction know of a row: 32 bytes. */
typedef struct {
  uint64_t key;
  uint64_t last_step; /* the global step that last touched it */
  uint64_t updates;   /* optimizer updates (adam's t) */
  uint32_t count;     /* sightings (admission by count) */
  uint32_t next_free; /* TS_TABLE_LIVE, or on the free list: the next erased row */
} ts_table_meta_t;

/* Whether a row slot holds a row (else it is on the free list). */
static inline bool ts_table_live(const ts_table_meta_t *m) { return m->next_free == TS_TABLE_LIVE; }

typedef struct {
  uint32_t dim, nstate;
  size_t stride; /* floats per row */
  /* index: cap slots (a power of two, at most 2^32), each (tag << 32 | row id); all ones
   * is an empty slot */
  uint64_t *slots;
  size_t cap;
  size_t size;              /* live rows */
  ts_prefault_t *next_index; /* the index of 2 cap slots being made, or NULL */
  /* rows */
  float **slabs;
  ts_table_meta_t **metas;
  size_t nslabs, slabs_cap;
  uint32_t next_row;  /* rows ever handed out (the free list aside) */
  uint32_t free_head; /* erased rows, linked through next_free (TS_TABLE_NONE: none) */
  uint64_t max_rows;  /* rows the table may hold */
  uint64_t erased;    /* rows ever erased (a key listing's restart rule, TableKeys) */
} ts_table_t;

/* An empty table of rows of dim floats and nstate state buffers, holding at most max_rows
 * rows (0: up to 2^31). Returns 0 or TS_EINVAL (dim 0, nstate over 2). Allocates nothing
 * until the first insert. */
int ts_table_init(ts_table_t *t, uint32_t dim, uint32_t nstate, uint64_t max_rows);
void ts_table_free(ts_table_t *t);

/* The row id of key, or TS_TABLE_NONE. */
uint32_t ts_table_find(const ts_table_t *t, uint64_t key);

/* The row of key, made if missing (*created true; its floats zeroed and its meta {key, 0}):
 * returns the row id, or TS_TABLE_NONE when it would exceed max_rows (*err TS_ETOOBIG) or
 * memory ran out (*err TS_ENOMEM); the table is unchanged then. */
uint32_t ts_table_insert(ts_table_t *t, uint64_t key, bool *created, int *err);

/* Remove key's row: returns true when there was one. Its memory is reused by a later insert. */
bool ts_table_erase(ts_table_t *t, uint64_t key);

/* Row id's floats (stride of them: value, then state) and meta; id must be live. */
static inline float *ts_table_row(const ts_table_t *t, uint32_t id) {
  return t->slabs[id >> TS_TABLE_SLAB_SHIFT] + (size_t)(id & (TS_TABLE_SLAB_ROWS - 1)) * t->stride;
}
static inline ts_table_meta_t *ts_table_meta(const ts_table_t *t, uint32_t id) {
  return &t->metas[id >> TS_TABLE_SLAB_SHIFT][id & (TS_TABLE_SLAB_ROWS - 1)];
}

/* Prefetches for a loop over many keys, whose lookups are cache misses otherwise (a table
 * of millions of rows): ts_table_prefetch_slot starts loading key's home index slot, and
 * ts_table_prefetch_row, called later for the same key (the slot loaded by then), its row's
 * metadata and floats when the home slot holds a row with key's tag. Hints only: they
 * change nothing and are always safe. The slot into every cache level (locality 3,
 * prefetcht0): with locality 1 (prefetcht2) an AMD EPYC VM still missed on nearly every
 * slot, and the shards spent half again the CPU per row; the row and its metadata stay at
 * locality 1, which measured as well or better there (bench/RESULTS.md 17.10). */
static inline void ts_table_prefetch_slot(const ts_table_t *t, uint64_t hash) {
  if (t->cap) __builtin_prefetch(&t->slots[(uint32_t)hash & (t->cap - 1)], 0, 3);
}
static inline void ts_table_prefetch_row(const ts_table_t *t, uint64_t hash) {
  if (!t->cap) return;
  uint64_t e = t->slots[(uint32_t)hash & (t->cap - 1)];
  if (e == UINT64_MAX || (uint32_t)(e >> 32) != (uint32_t)hash) return;
  uint32_t id = (uint32_t)e;
  __builtin_prefetch(ts_table_meta(t, id), 1, 1);
  __builtin_prefetch(ts_table_row(t, id), 1, 1);
}

/* Iterate the live rows: *cursor starts at 0; returns the next live row id, or
 * TS_TABLE_NONE at the end. Inserting or erasing during a walk may skip or repeat rows. */
uint32_t ts_table_next(const ts_table_t *t, uint32_t *cursor);

/* A page of a key listing (TableKeys): the keys of the live rows from row slot *cursor on,
 * at most max of them into out, looking at no more than max_slots row slots (so a table
 * of mostly erased rows cannot make one page long). Returns the keys written; *cursor
 * moves past the last slot looked at, t->next_row once the walk is through. Rows never
 * move while they live, so a key present for a whole walk is listed exactly once. */
size_t ts_table_keys(const ts_table_t *t, uint64_t *cursor, uint64_t *out, size_t max,
                     uint64_t max_slots);

/* A table's next index is made ahead once its index has TS_TABLE_PREPARE_MIN slots (8 MiB):
 * filling a fresh gigabyte takes seconds on some hosts (ts_prefault.h), a few MiB do not. */
#define TS_TABLE_PREPARE_MIN ((size_t)1 << 20)

/* Bytes that making the next index ahead would allocate now: nonzero once the table holds
 * 3/8 of its index's slots (the index doubles at 1/2) when it may grow that far (max_rows)
 * and the index is that large, and nothing is under way. */
uint64_t ts_table_prepare_cost(const ts_table_t *t);

/* What the budget must have room for to make the next index ahead without holding fewer
 * rows than it would without: ts_table_prepare_cost, plus the rows still to come before
 * the grow (their floats and metadata). 0 when the cost is. */
uint64_t ts_table_prepare_room(const ts_table_t *t);

/* Start making the next index (ts_table_prepare_cost bytes) on a thread of its own; the
 * insert that grows the index takes it, waiting for the rest of its fill if needed. Does
 * nothing when the cost is 0; when no memory or thread is to be had the grow allocates as
 * it would without. */
void ts_table_prepare_grow(ts_table_t *t);

/* Give up the next index being made (its memory is freed now, or by its thread once
 * filled): for a budget that needs the room. Returns the bytes it was counted for (0: none). */
uint64_t ts_table_drop_next(ts_table_t *t);

/* Bytes the table holds (slabs, their metadata, the index, a next index being made): for
 * budgets and status. */
uint64_t ts_table_bytes(const ts_table_t *t);

/* Bytes the next ts_table_insert of a new key would allocate (a new slab and its metadata,
 * a larger index counted whole unless it was made ahead, the slab list grown): 0 when a free row and index room are
 * there. For a budget that must hold before anything is allocated. */
uint64_t ts_table_insert_cost(const ts_table_t *t);

/* What a table of rows of (dim, nstate) costs per row at most, index included: for the
 * budget (server.max_table_bytes) before anything is allocated. */
uint64_t ts_table_row_bytes(uint32_t dim, uint32_t nstate);

#endif
