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
    if (!ts_table_live(m) || now <= m->last_step || now - m->last_step <= p->steps_to_live) continue;
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

bool ts_admit_evict_lru(const ts_admit_policy_t *p, ts_table_t *t, uint64_t *rng, uint64_t *key) {
  if (t->size == 0) return false;
  uint32_t want = p->sample ? p->sample : 16, got = 0, victim = TS_TABLE_NONE;
  uint64_t oldest = UINT64_MAX;
  /* Random row ids; where most ids are free (after a mass eviction) the tries run out and
   * a walk from a random id takes the next live ones, so this always finds a row. */
  for (uint32_t tries = 0; got < want && tries < 8 * want; tries++) {
    uint32_t id = (uint32_t)(xorshift(rng) % t->next_row);
    const ts_table_meta_t *m = ts_table_meta(t, id);
    if (!ts_table_live(m)) continue;
    got++;
    if (m->last_step < oldest) {
      oldest = m->last_step;
      victim = id;
    }
  }
  if (victim == TS_TABLE_NONE) {
    uint32_t cursor = (uint32_t)(xorshift(rng) % t->next_row), id;
    if ((id = ts_table_next(t, &cursor)) == TS_TABLE_NONE) {
      cursor = 0;
      id = ts_table_next(t, &cursor);
    }
    victim = id;
  }
  ts_require(victim != TS_TABLE_NONE); /* size > 0: a live row exists */
  *key = ts_table_meta(t, victim)->key;
  ts_table_erase(t, *key);
  return true;
}
