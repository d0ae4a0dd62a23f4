/*
 * Admission and eviction (ts_admit.h): the count-min sketch of keys not admitted yet, the
 * probability test, the steps-to-live sweep and the sampled LRU victim.
 */
#include "ts_admit.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_key.h"

int ts_admit_sketch_init(ts_admit_sketch_t *s, size_t width, uint64_t seed) {
  size_t w = 1024;
  while (w < width) w *= 2;
  s->counts = ts_calloc(TS_ADMIT_SKETCH_DEPTH * w, sizeof *s->counts);
  s->width = s->counts ? w : 0;
  s->seed = seed;
  return s->counts ? 0 : TS_ENOMEM;
}

void ts_admit_sketch_free(ts_admit_sketch_t *s) {
  ts_free(s->counts);
  memset(s, 0, sizeof *s);
}

uint32_t ts_admit_sketch_add(ts_admit_sketch_t *s, uint64_t key) {
  uint32_t least = UINT16_MAX;
  uint64_t h = ts_key_hash(key ^ s->seed);
  for (size_t d = 0; d < TS_ADMIT_SKETCH_DEPTH; d++) {
    /* Four independent indexes from two hashes (Kirsch and Mitzenmacher). */
    uint64_t g = ts_key_hash(h + d * 0x9e3779b97f4a7c15ULL);
    uint16_t *c = &s->counts[d * s->width + (g & (s->width - 1))];
    if (*c < UINT16_MAX) (*c)++;
    if (*c < least) least = *c;
  }
  return least;
}

bool ts_admit_key(const ts_admit_policy_t *p, ts_admit_sketch_t *s, uint64_t key) {
  if (p->admit_probability < 1.0) {
    /* The top 53 bits of a hash of (seed, key) as a uniform number in [0, 1). */
    double u = (double)(ts_key_hash(key ^ ts_key_hash(p->seed)) >> 11) * 0x1p-53;
    if (u >= p->admit_probability) return false;
  }
  if (p->admit_count <= 1 || !s) return true;
  return ts_admit_sketch_add(s, key) >= p->admit_count;
}

size_t ts_admit_expire(const ts_admit_policy_t *p, ts_table_t *t, uint64_t now, uint32_t *cursor,
                       size_t budget, uint64_t *evicted) {
  if (p->steps_to_live == 0 || t->next_row == 0) return 0;
  size_t gone = 0;
  for (size_t n = 0; n < budget && n < t->next_row; n++) {
    if (*cursor >= t->next_row) *cursor = 0;
    uint32_t id = (*cursor)++;
    ts_table_meta_t *m = ts_table_meta(t, id);
    if (!ts_table_live(m) || now <= m->last_step || now - m->last_step <= p->steps_to_live)
      continue;
    uint64_t key = m->key;
    ts_table_erase(t, key);
    if (evicted) evicted[gone] = key;
    gone++;
  }
  return gone;
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Add row id (key, last_step) to the pool, kept oldest first, when it is among the pool's
 * oldest and not there yet. */
static void pool_add(ts_admit_pool_t *pool, uint32_t id, uint64_t key, uint64_t last_step) {
  uint32_t n = pool->n;
  if (n == TS_ADMIT_POOL && last_step >= pool->c[n - 1].last_step) return;
  for (uint32_t i = 0; i < n; i++)
    if (pool->c[i].id == id) return;
  if (n == TS_ADMIT_POOL) n--; /* the youngest gives way */
  uint32_t at = n;
  while (at > 0 && pool->c[at - 1].last_step > last_step) {
    pool->c[at] = pool->c[at - 1];
    at--;
  }
  pool->c[at] = (ts_admit_cand_t){.key = key, .last_step = last_step, .id = id};
  pool->n = n + 1;
}

/* Draw n row ids of t and start loading their metadata. */
static void draw_ids(uint32_t *ids, uint32_t n, const ts_table_t *t, uint64_t *rng) {
  for (uint32_t i = 0; i < n; i++) {
    ids[i] = (uint32_t)(xorshift(rng) % t->next_row);
    __builtin_prefetch(ts_table_meta(t, ids[i]), 0, 1);
  }
}

/* Draw up to `round` row ids, their metadata prefetched before any is read (in a table of
 * gigabytes each is a cache miss, and read one after the other, a branch on each, they
 * cost a memory latency apiece), and put the live ones to the pool. Returns the lowest
 * last_step of the live ones drawn (UINT64_MAX: none). */
static uint64_t pool_sample(ts_admit_pool_t *pool, const ts_table_t *t, uint64_t *rng,
                            uint32_t round) {
  uint32_t ids[TS_ADMIT_POOL], n = 0;
  uint64_t oldest = UINT64_MAX;
  if (round > TS_ADMIT_POOL) round = TS_ADMIT_POOL;
  /* The draws made ahead (still in the table: it may have been emptied since) first. */
  for (uint32_t i = 0; i < pool->nahead && n < round; i++)
    if (pool->ahead[i] < t->next_row) ids[n++] = pool->ahead[i];
  pool->nahead = 0;
  draw_ids(ids + n, round - n, t, rng);
  for (uint32_t i = 0; i < round; i++) {
    const ts_table_meta_t *m = ts_table_meta(t, ids[i]);
    if (!ts_table_live(m)) continue;
    pool_add(pool, ids[i], m->key, m->last_step);
    if (m->last_step < oldest) oldest = m->last_step;
  }
  return oldest;
}

/* The pool's oldest candidate that is still what it was when sampled (the same key, live,
 * untouched since), taken out of the pool; TS_TABLE_NONE when none is. */
static uint32_t pool_take(ts_admit_pool_t *pool, const ts_table_t *t) {
  while (pool->n > 0) {
    ts_admit_cand_t c = pool->c[0];
    memmove(&pool->c[0], &pool->c[1], --pool->n * sizeof c);
    if (c.id >= t->next_row) continue; /* the table was emptied since */
    const ts_table_meta_t *m = ts_table_meta(t, c.id);
    if (ts_table_live(m) && m->key == c.key && m->last_step == c.last_step) return c.id;
  }
  return TS_TABLE_NONE;
}

/* Whether row id may go by the hand's rule: live, used no more recently than the bar, and
 * not at step `now` (a row made or touched by the request being served). */
static bool hand_may_take(const ts_admit_pool_t *pool, const ts_table_t *t, uint32_t id,
                          uint64_t now) {
  const ts_table_meta_t *m = ts_table_meta(t, id);
  return ts_table_live(m) && m->last_step <= pool->bar && m->last_step < now;
}

/* The hand's next row that may go, looking at TS_ADMIT_HAND_SCAN row slots at most from
 * where it is (it wraps at the table's end); TS_TABLE_NONE when none does. The hand moves
 * past the row it returns. Its reads are in row order, so the metadata a few lines ahead
 * is prefetched as it goes. */
static uint32_t hand_find(ts_admit_pool_t *pool, const ts_table_t *t, uint64_t now) {
  for (uint32_t n = 0; n < TS_ADMIT_HAND_SCAN; n++) {
    if (pool->hand >= t->next_row) pool->hand = 0;
    uint32_t id = pool->hand++;
    if (id + 8 < t->next_row) __builtin_prefetch(ts_table_meta(t, id + 8), 0, 1);
    if (hand_may_take(pool, t, id, now)) return id;
  }
  return TS_TABLE_NONE;
}

/* The next eviction chosen and its reads started now. By the hand while it has a bar and
 * has taken fewer than TS_ADMIT_HAND_RUN rows since the samples set it: its next victim's
 * index slot, which the erase probes, and row, which the new row will overwrite. Else (no
 * such row within the hand's stretch, or the bar due again) by the samples: their draws,
 * and the pool's oldest candidate (the likely victim): its metadata, which pool_take
 * checks, and its index slot. */
static void prepare_next(ts_admit_pool_t *pool, const ts_table_t *t, uint64_t *rng, uint32_t want,
                         uint64_t now) {
  if (t->next_row == 0) return;
  if (pool->have_bar && pool->run < TS_ADMIT_HAND_RUN &&
      (pool->next = hand_find(pool, t, now)) != TS_TABLE_NONE) {
    ts_table_prefetch_slot(t, ts_key_hash(ts_table_meta(t, pool->next)->key));
    __builtin_prefetch(ts_table_row(t, pool->next), 1, 1);
    return;
  }
  pool->sample_next = true;
  draw_ids(pool->ahead, want, t, rng);
  pool->nahead = want;
  if (pool->n > 0 && pool->c[0].id < t->next_row) {
    __builtin_prefetch(ts_table_meta(t, pool->c[0].id), 0, 1);
    ts_table_prefetch_slot(t, ts_key_hash(pool->c[0].key));
  }
}

/* A victim chosen by the samples: the oldest valid candidate after fresh samples, and *bar
 * the oldest of the last fresh samples (UINT64_MAX: none of them live); where most ids are
 * free (after a mass eviction) the draws run out and a walk from a random id takes the next
 * live row, so this always finds one when the table has a row. */
static uint32_t sampled_victim(ts_admit_pool_t *pool, const ts_table_t *t, uint64_t *rng,
                               uint32_t want, uint64_t *bar) {
  uint32_t victim = TS_TABLE_NONE;
  for (uint32_t tries = 0; victim == TS_TABLE_NONE && tries < 8; tries++) {
    *bar = pool_sample(pool, t, rng, want);
    victim = pool_take(pool, t);
  }
  if (victim == TS_TABLE_NONE) {
    uint32_t cursor = (uint32_t)(xorshift(rng) % t->next_row);
    if ((victim = ts_table_next(t, &cursor)) == TS_TABLE_NONE) {
      cursor = 0;
      victim = ts_table_next(t, &cursor);
    }
  }
  return victim;
}

bool ts_admit_evict_lru(const ts_admit_policy_t *p, ts_table_t *t, ts_admit_pool_t *pool,
                        uint64_t *rng, uint64_t now, uint64_t *key) {
  if (t->size == 0) return false;
  uint32_t want = p->sample ? p->sample : 5, victim = TS_TABLE_NONE;
  if (want > TS_ADMIT_POOL) want = TS_ADMIT_POOL;
  /* The hand's choice made by the eviction before, if it still may go (not used or
   * erased since), else the hand's next; the samples' when the eviction before found
   * the hand's turn over, or the hand finds none. */
  if (pool->have_bar && !pool->sample_next) {
    if (pool->next < t->next_row && hand_may_take(pool, t, pool->next, now))
      victim = pool->next;
    else
      victim = hand_find(pool, t, now);
  }
  pool->next = TS_TABLE_NONE;
  pool->sample_next = false;
  if (victim != TS_TABLE_NONE) {
    pool->run++;
  } else {
    uint64_t bar;
    victim = sampled_victim(pool, t, rng, want, &bar);
    ts_require(victim != TS_TABLE_NONE); /* size > 0: a live row exists */
    /* The bar: as old as the oldest of want fresh samples, which is what the samples
     * without their pool would take (mean rank 1/(want + 1)); the pool's own victim is
     * older still, and a bar that tight would leave the hand almost nothing to take. */
    if (bar != UINT64_MAX) {
      pool->bar = bar;
      pool->have_bar = true;
      pool->run = 0;
    }
  }
  /* Its row is where the insert that wanted room puts the new one (the free list is last
   * in, first out): loading it overlaps the erase's index miss. */
  __builtin_prefetch(ts_table_row(t, victim), 1, 1);
  *key = ts_table_meta(t, victim)->key;
  ts_table_erase(t, *key);
  prepare_next(pool, t, rng, want, now);
  return true;
}
