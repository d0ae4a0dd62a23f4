/*
 * Admission and eviction of a table's rows (docs/architecture.md, "Tables"): which keys
 * become rows, and which rows go, as Monolith's and DeepRec's tables decide it.
 *
 * Admission. A key is admitted when it has been seen admit_count times (a count kept in a
 * fixed-size count-min sketch, so the keys that never make it cost no memory per key and a
 * flood of one-off keys cannot grow the shard), or, with admit_probability < 1, when a hash
 * of (seed, key) falls under it (the same keys on every shard and run). Until then a lookup
 * reads the initialiser's row and the key's gradients are dropped (the caller's part).
 *
 * Eviction. By steps to live: a row untouched for steps_to_live global steps goes (a walk
 * of bounded length per call, resumed from a cursor, so a large table is swept a piece per
 * tick). By capacity: a table at max_rows makes room for a new row by evicting the least
 * recently used of the oldest rows its random samples found (Redis's approximated LRU with
 * its eviction pool: the rows it takes are among the oldest without any per-access list
 * to keep, and each eviction reads only a few rows). Those few rows are random, so in a
 * table of gigabytes each is a cache and TLB miss; a hand sweeping the rows in order (as
 * a CLOCK does) takes most victims instead: the next row it passes that was last used no
 * later than the oldest of the samples' last fresh draws (the bar: as old as the row the
 * samples would take without their pool), and not in the request being served. It reads
 * the rows in order, a cache line for two. The samples choose again, and set a new bar,
 * after the hand took TS_ADMIT_HAND_RUN rows (so one lucky or unlucky sample does not set
 * the rule for long) or where the hand finds no row within TS_ADMIT_HAND_SCAN slots (rows
 * in use, as the hot rows a stream made first).
 *
 * Pure over a ts_table_t and the sketch: no I/O, the step is an argument.
 */
#ifndef TS_ADMIT_H
#define TS_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_table.h"

#define TS_ADMIT_SKETCH_DEPTH 4

typedef struct {
  uint32_t admit_count;     /* sightings before a key becomes a row (<= 1: at once) */
  double admit_probability; /* 1: every key (after admit_count) */
  uint64_t steps_to_live;   /* 0: rows never expire */
  uint32_t sample;          /* rows sampled per LRU eviction (default 5) */
  uint64_t seed;
} ts_admit_policy_t;

/* A count-min sketch of the sightings of keys that are not rows yet: depth x width 16-bit
 * saturating counters; an estimate never undercounts. */
typedef struct {
  uint16_t *counts; /* TS_ADMIT_SKETCH_DEPTH * width */
  size_t width;     /* a power of two */
  uint64_t seed;
} ts_admit_sketch_t;

/* A sketch of depth x width counters (width rounded up to a power of two, at least 1024).
 * Returns 0 or TS_ENOMEM. */
int ts_admit_sketch_init(ts_admit_sketch_t *s, size_t width, uint64_t seed);
void ts_admit_sketch_free(ts_admit_sketch_t *s);

/* Count a sighting of key and return its estimated count, this one included. */
uint32_t ts_admit_sketch_add(ts_admit_sketch_t *s, uint64_t key);

/* Whether key, seen (once more) now, becomes a row: the probability test, then the count
 * (the sketch counts this sighting; NULL with admit_count <= 1). */
bool ts_admit_key(const ts_admit_policy_t *p, ts_admit_sketch_t *s, uint64_t key);

/* Evict the rows untouched for more than steps_to_live steps at global step `now`, looking
 * at no more than `budget` row slots from *cursor on (0 starts a sweep; it wraps). Returns
 * how many rows went; their keys are written to evicted[0..] when it is not NULL (room for
 * budget keys). */
size_t ts_admit_expire(const ts_admit_policy_t *p, ts_table_t *t, uint64_t now, uint32_t *cursor,
                       size_t budget, uint64_t *evicted);

/* The oldest rows seen by a table's LRU samples (Redis's eviction pool): a candidate stays
 * until it is evicted, touched again, or pushed out by older ones, so each eviction picks
 * from far more than its own fresh samples. Zeroed: empty. */
#define TS_ADMIT_POOL 16
typedef struct {
  uint64_t key, last_step; /* as sampled */
  uint32_t id;
} ts_admit_cand_t;
typedef struct {
  ts_admit_cand_t c[TS_ADMIT_POOL]; /* oldest first */
  uint32_t n;
  /* The next eviction's draws, made (and their metadata prefetched) at the end of the one
   * before, so their loads overlap the work between two evictions. */
  uint32_t ahead[TS_ADMIT_POOL];
  uint32_t nahead;
  /* The hand: the next row id it looks at; the row it chose for the next eviction (a
   * hint, checked against the rule again then); sample_next: the next eviction is the
   * samples'; the bar: the lowest last_step of the samples' last fresh draws (have_bar
   * false: none yet); run: the rows the hand took since. */
  uint32_t hand, next, run;
  bool have_bar, sample_next;
  uint64_t bar;
} ts_admit_pool_t;

/* Make room in a full table at step `now` (a row last used at it is not the hand's to
 * take). By the hand: its next live row within TS_ADMIT_HAND_SCAN slots last used no
 * later than the bar, while it has taken fewer than TS_ADMIT_HAND_RUN rows since the bar
 * was set. Else by the samples: p->sample row ids (at most TS_ADMIT_POOL) drawn with the
 * random state *rng (xorshift64, any non-zero start) into t's pool (zeroed at first), the
 * least recently used (lowest last_step) candidate of the pool that is still as sampled
 * evicted, and the lowest last_step of those draws made the bar. Returns true with *key
 * the key evicted, or false when the table is empty. Before returning it chooses how the
 * next eviction goes and prefetches what that one will read (the hand's victim's index
 * slot and row; or the samples' metadata and the pool's oldest candidate's metadata and
 * index slot): in a table of gigabytes each is a cache miss that would otherwise stall
 * the eviction. */
#define TS_ADMIT_HAND_SCAN 32
#define TS_ADMIT_HAND_RUN 256
bool ts_admit_evict_lru(const ts_admit_policy_t *p, ts_table_t *t, ts_admit_pool_t *pool,
                        uint64_t *rng, uint64_t now, uint64_t *key);

#endif
