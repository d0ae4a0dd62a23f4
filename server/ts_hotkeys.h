/*
 * The hottest keys of a table (psctl tables' HOT column): which keys the pulls of a shard
 * ask for most, and what share of the pulled keys they are, in bounded memory whatever the
 * number of distinct keys.
 *
 * Space-Saving (Metwally, Agrawal, El Abbadi 2005) over a sample of the stream: one key in
 * `every` on average is fed, the gaps drawn at random (uniform in 0 .. 2 every - 2: not a
 * hash, so a single hot key is sampled at its true rate; not a fixed stride, so a stream
 * with a period cannot hide a key from it),
 * into TS_HOTKEYS_SLOTS counters. A key already counted adds 1; a new key takes the
 * smallest counter's place and inherits its count plus 1 (so a count overestimates by at
 * most that inherited error, and any key with more than total / TS_HOTKEYS_SLOTS sightings
 * is in the summary). Keys are ranked by what they surely had (count - error), so a tail
 * key that just inherited a large count does not pass for a hot one. ts_hotkeys_decay
 * halves every count, so the summary follows the recent traffic (the shard decays it every
 * few seconds). 128 counters find the 8 hottest keys of a Zipf(1.0) stream over 100,000
 * ids (tests/unit/test_hotkeys.c); a scan of them costs 128 comparisons per sampled key.
 *
 * Pure and bounded: TS_HOTKEYS_SLOTS entries and no allocation. Not thread-safe.
 */
#ifndef TS_HOTKEYS_H
#define TS_HOTKEYS_H

#include <stddef.h>
#include <stdint.h>

#define TS_HOTKEYS_SLOTS 128

typedef struct {
  uint64_t key;
  uint64_t count; /* sampled sightings, error included */
  uint64_t error; /* the most count may overestimate by */
} ts_hotkey_t;

typedef struct {
  ts_hotkey_t slot[TS_HOTKEYS_SLOTS];
  uint32_t used;
  uint32_t every; /* feed one key in this many (>= 1) */
  uint32_t skip;  /* keys to pass before the next one fed */
  uint64_t rng;   /* xorshift64 state of the gaps */
  uint64_t total; /* sampled sightings */
} ts_hotkeys_t;

/* An empty summary sampling one key in `every` (0 is taken as 1). */
void ts_hotkeys_init(ts_hotkeys_t *h, uint32_t every);

/* A pull asked for key (sampled: most calls return at once). */
void ts_hotkeys_see(ts_hotkeys_t *h, uint64_t key);

/* Halve every count and the total (keys whose count drops to 0 leave). */
void ts_hotkeys_decay(ts_hotkeys_t *h);

/* The n hottest keys into out[0..), hottest (largest count - error) first; returns how
 * many (<= n, <= used). */
size_t ts_hotkeys_top(const ts_hotkeys_t *h, ts_hotkey_t *out, size_t n);

/* The share of the sampled sightings that were of the n hottest keys, their guaranteed
 * counts (count - error) over the total: a lower bound, 0 when nothing was seen. */
double ts_hotkeys_share(const ts_hotkeys_t *h, size_t n);

#endif
