/*
 * A shard's rows of one embedding table (ts_table.h): the open-addressing index with
 * backward-shift deletion, and the slabs rows live in, never moved.
 */
#include "ts_table.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_key.h"

#define MIN_CAP 16
/* Rows a table may hold: its index (twice the rows at most) stays within 2^32 slots, so a
 * slot's 32-bit tag holds its home. */
#define MAX_ROWS (UINT64_C(1) << 31)
#define EMPTY UINT64_MAX
#define SLOT_ID(e) ((uint32_t)(e))
#define SLOT_TAG(e) ((uint32_t)((e) >> 32))

int ts_table_init(ts_table_t *t, uint32_t dim, uint32_t nstate, uint64_t max_rows) {
  memset(t, 0, sizeof *t);
  if (dim == 0 || nstate > 2) return TS_EINVAL;
  t->dim = dim;
  t->nstate = nstate;
  t->stride = (size_t)dim * (1 + nstate);
  t->free_head = TS_TABLE_NONE;
  t->max_rows = max_rows == 0 || max_rows >= MAX_ROWS ? MAX_ROWS : max_rows;
  return 0;
}

static size_t slab_bytes(const ts_table_t *t) {
  return (size_t)TS_TABLE_SLAB_ROWS * t->stride * sizeof(float);
}

#define META_BYTES ((size_t)TS_TABLE_SLAB_ROWS * sizeof(ts_table_meta_t))

/* Memory in transparent huge pages. A large table's lookups land anywhere in gigabytes of
 * rows, metadata and index: on 4 KiB pages nearly every one misses the TLB as well as the
 * cache. So once a table holds a group's worth of slabs, its slabs (and, apart, their
 * metadata) are allocated in groups of at least 2 MiB (ts_huge_alloc), a slab id s >= group
 * at the group's start taking the whole group; the first group's slabs are allocated one by
 * one, so a small table does not hold 2 MiB. */
#define HUGE_BYTES ((size_t)2 << 20)

static size_t group_of(size_t bytes) {
  return bytes >= HUGE_BYTES ? 1 : (HUGE_BYTES + bytes - 1) / bytes;
}

/* What allocating slab s's memory takes, for a kind of `bytes` a slab: its own, a whole
 * group's, or nothing (it is in a group allocated before). */
static size_t alloc_for(size_t s, size_t bytes) {
  size_t g = group_of(bytes);
  if (s < g) return bytes;
  return s % g == 0 ? g * bytes : 0;
}

/* The bytes allocated for the first n slabs of a kind of `bytes` a slab. */
static uint64_t held_for(size_t n, size_t bytes) {
  size_t g = group_of(bytes);
  if (n <= g) return (uint64_t)n * bytes;
  return (uint64_t)((n + g - 1) / g) * g * bytes;
}

static void free_slabs(ts_table_t *t) {
  for (size_t s = 0; s < t->nslabs; s++) {
    size_t sb = alloc_for(s, slab_bytes(t)), mb = alloc_for(s, META_BYTES);
    if (sb) ts_huge_free(t->slabs[s], sb);
    if (mb) ts_huge_free(t->metas[s], mb);
  }
}

void ts_table_free(ts_table_t *t) {
  /* A next index still being filled outlives the budget's count by the rest of its fill. */
  ts_table_drop_next(t);
  free_slabs(t);
  ts_free(t->slabs);
  ts_free(t->metas);
  ts_huge_free(t->slots, t->cap * sizeof *t->slots);
  uint32_t dim = t->dim, nstate = t->nstate;
  uint64_t max_rows = t->max_rows, erased = t->erased + t->size;
  memset(t, 0, sizeof *t); /* empty, with its shape: usable again */
  t->erased = erased;       /* its rows count as lost: a key listing restarts */
  t->dim = dim;
  t->nstate = nstate;
  t->stride = (size_t)dim * (1 + nstate);
  t->free_head = TS_TABLE_NONE;
  t->max_rows = max_rows;
}

static uint32_t tag_of(uint64_t key) { return (uint32_t)ts_key_hash(key); }

/* The slot of key (its entry, or the empty slot where a probe for it ends). */
static size_t probe(const ts_table_t *t, uint64_t key) {
  uint32_t tag = tag_of(key);
  size_t mask = t->cap - 1;
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    uint64_t e = t->slots[i];
    if (e == EMPTY) return i;
    if (SLOT_TAG(e) == tag && ts_table_meta(t, SLOT_ID(e))->key == key) return i;
  }
}

uint32_t ts_table_find(const ts_table_t *t, uint64_t key) {
  if (t->cap == 0) return TS_TABLE_NONE;
  uint64_t e = t->slots[probe(t, key)];
  return e == EMPTY ? TS_TABLE_NONE : SLOT_ID(e);
}

/* Twice the capacity (at least MIN_CAP), every entry placed again by its tag; rows stay.
 * The new index is the one made ahead when there is one (all EMPTY already). */
static int grow_index(ts_table_t *t) {
  size_t cap = t->cap ? t->cap * 2 : MIN_CAP;
  uint64_t *slots = NULL;
  if (t->next_index) {
    ts_require(ts_prefault_bytes(t->next_index) == cap * sizeof *slots);
    slots = ts_prefault_take(t->next_index);
    t->next_index = NULL;
  } else {
    slots = ts_huge_alloc(cap * sizeof *slots);
    if (!slots) return TS_ENOMEM;
    memset(slots, 0xff, cap * sizeof *slots);
  }
  for (size_t i = 0; i < t->cap; i++) {
    uint64_t e = t->slots[i];
    if (e == EMPTY) continue;
    size_t j = SLOT_TAG(e) & (cap - 1);
    while (slots[j] != EMPTY) j = (j + 1) & (cap - 1);
    slots[j] = e;
  }
  ts_huge_free(t->slots, t->cap * sizeof *t->slots);
  t->slots = slots;
  t->cap = cap;
  return 0;
}

/* A row slot for a new row: a freed one, or the next of the last slab (a new slab when it
 * is full). */
static uint32_t take_row(ts_table_t *t, int *err) {
  if (t->free_head != TS_TABLE_NONE) {
    uint32_t id = t->free_head;
    t->free_head = ts_table_meta(t, id)->next_free;
    return id;
  }
  uint32_t id = t->next_row;
  size_t s = id >> TS_TABLE_SLAB_SHIFT;
  if (s == t->nslabs) {
    if (t->nslabs == t->slabs_cap) {
      size_t cap = t->slabs_cap ? t->slabs_cap * 2 : 8;
      float **slabs = ts_realloc(t->slabs, cap * sizeof *slabs);
      if (slabs) t->slabs = slabs;
      ts_table_meta_t **metas = ts_realloc(t->metas, cap * sizeof *metas);
      if (metas) t->metas = metas;
      if (!slabs || !metas) {
        *err = TS_ENOMEM;
        return TS_TABLE_NONE;
      }
      t->slabs_cap = cap;
    }
    size_t sb = alloc_for(s, slab_bytes(t)), mb = alloc_for(s, META_BYTES);
    float *slab = sb ? ts_huge_alloc(sb) : t->slabs[s - 1] + TS_TABLE_SLAB_ROWS * t->stride;
    ts_table_meta_t *meta = mb ? ts_huge_alloc(mb) : t->metas[s - 1] + TS_TABLE_SLAB_ROWS;
    if (!slab || !meta) {
      if (slab && sb) ts_huge_free(slab, sb);
      if (meta && mb) ts_huge_free(meta, mb);
      *err = TS_ENOMEM;
      return TS_TABLE_NONE;
    }
    if (mb && mb < HUGE_BYTES) memset(meta, 0, mb); /* not a fresh mapping: not zeroed */
    t->slabs[t->nslabs] = slab;
    t->metas[t->nslabs] = meta;
    t->nslabs++;
  }
  t->next_row++;
  return id;
}

uint32_t ts_table_insert(ts_table_t *t, uint64_t key, bool *created, int *err) {
  *created = false;
  *err = 0;
  uint32_t have = ts_table_find(t, key);
  if (have != TS_TABLE_NONE) return have;
  if (t->size >= t->max_rows) {
    *err = TS_ETOOBIG;
    return TS_TABLE_NONE;
  }
  if ((t->size + 1) * 2 > t->cap && (*err = grow_index(t)) < 0) return TS_TABLE_NONE;
  uint32_t id = take_row(t, err);
  if (id == TS_TABLE_NONE) return id;
  size_t i = tag_of(key) & (t->cap - 1);
  while (t->slots[i] != EMPTY) i = (i + 1) & (t->cap - 1);
  t->slots[i] = (uint64_t)tag_of(key) << 32 | id;
  t->size++;
  memset(ts_table_row(t, id), 0, t->stride * sizeof(float));
  *ts_table_meta(t, id) = (ts_table_meta_t){.key = key, .next_free = TS_TABLE_LIVE};
  *created = true;
  return id;
}

bool ts_table_erase(ts_table_t *t, uint64_t key) {
  if (t->cap == 0) return false;
  size_t mask = t->cap - 1, i = probe(t, key);
  if (t->slots[i] == EMPTY) return false;
  uint32_t id = SLOT_ID(t->slots[i]);
  ts_table_meta_t *m = ts_table_meta(t, id);
  ts_require(ts_table_live(m) && m->key == key);
  m->next_free = t->free_head;
  t->free_head = id;
  t->erased++;
  t->size--;
  /* Backward shift: move up every later entry of the run whose home is not between the
   * hole and it, so no probe ever meets a hole before its key. */
  for (size_t j = (i + 1) & mask; t->slots[j] != EMPTY; j = (j + 1) & mask) {
    size_t k = SLOT_TAG(t->slots[j]) & mask;
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    t->slots[i] = t->slots[j];
    i = j;
  }
  t->slots[i] = EMPTY;
  return true;
}

uint32_t ts_table_next(const ts_table_t *t, uint32_t *cursor) {
  while (*cursor < t->next_row) {
    uint32_t id = (*cursor)++;
    if (ts_table_live(ts_table_meta(t, id))) return id;
  }
  return TS_TABLE_NONE;
}

size_t ts_table_keys(const ts_table_t *t, uint64_t *cursor, uint64_t *out, size_t max,
                     uint64_t max_slots) {
  size_t n = 0;
  uint64_t id = *cursor;
  for (; id < t->next_row && n < max && max_slots; id++, max_slots--) {
    const ts_table_meta_t *m = ts_table_meta(t, (uint32_t)id);
    if (ts_table_live(m)) out[n++] = m->key;
  }
  *cursor = id;
  return n;
}

uint64_t ts_table_prepare_cost(const ts_table_t *t) {
  if (t->next_index || t->cap < TS_TABLE_PREPARE_MIN || t->size * 8 < t->cap * 3 ||
      t->max_rows * 2 <= t->cap)
    return 0;
  return (uint64_t)t->cap * 2 * sizeof(uint64_t);
}

uint64_t ts_table_prepare_room(const ts_table_t *t) {
  uint64_t cost = ts_table_prepare_cost(t);
  if (!cost) return 0;
  uint64_t to_grow = t->cap / 2 > t->size ? t->cap / 2 - t->size : 0;
  /* and a whole slab and metadata group past them: what the last of those rows may take */
  return cost + to_grow * (t->stride * sizeof(float) + sizeof(ts_table_meta_t)) +
         group_of(slab_bytes(t)) * slab_bytes(t) + group_of(META_BYTES) * META_BYTES;
}

uint64_t ts_table_drop_next(ts_table_t *t) {
  if (!t->next_index) return 0;
  uint64_t n = ts_prefault_bytes(t->next_index);
  ts_prefault_drop(t->next_index);
  t->next_index = NULL;
  return n;
}

void ts_table_prepare_grow(ts_table_t *t) {
  uint64_t cost = ts_table_prepare_cost(t);
  if (cost) t->next_index = ts_prefault_start(cost, 0xff);
}

uint64_t ts_table_bytes(const ts_table_t *t) {
  return held_for(t->nslabs, slab_bytes(t)) + held_for(t->nslabs, META_BYTES) +
         (uint64_t)t->cap * sizeof(uint64_t) +
         (t->next_index ? ts_prefault_bytes(t->next_index) : 0) +
         (uint64_t)t->slabs_cap * (sizeof(float *) + sizeof(ts_table_meta_t *));
}

uint64_t ts_table_insert_cost(const ts_table_t *t) {
  uint64_t c = 0;
  if ((t->size + 1) * 2 > t->cap && !t->next_index)
    c += (uint64_t)(t->cap ? t->cap * 2 : MIN_CAP) * sizeof(uint64_t);
  if (t->free_head == TS_TABLE_NONE && (size_t)(t->next_row >> TS_TABLE_SLAB_SHIFT) == t->nslabs) {
    c += alloc_for(t->nslabs, slab_bytes(t)) + alloc_for(t->nslabs, META_BYTES);
    if (t->nslabs == t->slabs_cap)
      c += (uint64_t)(t->slabs_cap ? t->slabs_cap : 8) * (sizeof(float *) + sizeof(ts_table_meta_t *));
  }
  return c;
}

uint64_t ts_table_row_bytes(uint32_t dim, uint32_t nstate) {
  /* The row, its meta, and its index entries at the lowest load factor (1/4, just after
   * the index doubled). */
  return (uint64_t)dim * (1 + nstate) * sizeof(float) + sizeof(ts_table_meta_t) +
         4 * sizeof(uint64_t);
}
