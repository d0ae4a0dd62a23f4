/*
 * Stable key sort (ts_sort.h). A request's keys are usually ids far below 2^64 (a
 * vocabulary's, a hashed feature's modulo its table) and their bits above the largest id
 * never vary, so the sort first finds the bits in which the keys differ (an OR and an AND of
 * all of them) and sorts on those alone. With the index's bits they usually fit one 64-bit
 * word: (varying bits << index bits | index), sorted in LSD passes of up to 11 bits over
 * the varying part, the last pass writing each key and index back out in place. Keys that do
 * not fit (64-bit hashes in large requests) move as (key, index) pairs, a byte a pass. Every
 * pass is a stable counting sort, so equal keys keep the index order they came in.
 */
#include "ts_sort.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Below this many keys qsort is as fast as a radix sort's fixed costs (its histograms). */
#define SMALL 512
/* Widest digit: 2,048 counters (8 KiB) stay in the first-level cache beside the data. */
#define DIGIT_MAX 11
/* The most passes: 64 varying bits in digits of 11. */
#define PASSES_MAX ((64 + DIGIT_MAX - 1) / DIGIT_MAX)

typedef struct {
  uint64_t key;
  uint32_t idx;
} pair_t;

static int cmp_pair(const void *a, const void *b) {
  const pair_t *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

size_t ts_sort_scratch_bytes(size_t n) {
  /* two arrays of pairs (two packed arrays need half), then the counters */
  return 2 * sizeof(pair_t) * (n ? n : 1) +
         sizeof(uint32_t) * PASSES_MAX * ((size_t)1 << DIGIT_MAX);
}

static unsigned bits_of(uint64_t v) {
  return v ? 64u - (unsigned)__builtin_clzll(v) : 0;
}

/* The passes' counters into starting offsets; false for a pass whose digit every key shares
 * (nothing moves). */
static void offsets(uint32_t *cnt, unsigned passes, size_t digits, size_t n, bool *moves) {
  for (unsigned p = 0; p < passes; p++) {
    uint32_t *c = cnt + p * digits, off = 0;
    moves[p] = true;
    for (size_t d = 0; d < digits; d++) {
      uint32_t k = c[d];
      if (k == n) moves[p] = false;
      c[d] = off;
      off += k;
    }
  }
}

/* The keys' varying bits (width of them from bit lo) and the index in one word each. */
static void sort_packed(const uint64_t *keys, size_t n, uint64_t *a, uint64_t *b, uint32_t *cnt,
                        uint64_t base, unsigned lo, unsigned width, unsigned passes, unsigned digit,
                        unsigned ibits, uint64_t *skey, uint32_t *sidx) {
  size_t digits = (size_t)1 << digit;
  uint64_t dmask = digits - 1, vmask = (UINT64_C(1) << width) - 1;
  uint64_t imask = (UINT64_C(1) << ibits) - 1;
  memset(cnt, 0, sizeof *cnt * passes * digits);
  for (size_t i = 0; i < n; i++) {
    uint64_t v = (keys[i] >> lo) & vmask;
    a[i] = v << ibits | i;
    for (unsigned p = 0; p < passes; p++) cnt[p * digits + ((v >> (p * digit)) & dmask)]++;
  }
  bool moves[PASSES_MAX];
  offsets(cnt, passes, digits, n, moves);
  uint64_t *src = a, *dst = b;
  for (unsigned p = 0; p + 1 < passes; p++) {
    if (!moves[p]) continue;
    uint32_t *c = cnt + p * digits;
    unsigned shift = ibits + p * digit;
    for (size_t i = 0; i < n; i++) dst[c[(src[i] >> shift) & dmask]++] = src[i];
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  /* The last pass puts each key and index where it goes (the highest digit always varies). */
  uint32_t *c = cnt + (size_t)(passes - 1) * digits;
  unsigned shift = ibits + (passes - 1) * digit;
  for (size_t i = 0; i < n; i++) {
    uint64_t w = src[i];
    uint32_t at = c[(w >> shift) & dmask]++;
    skey[at] = base | ((w >> ibits) & vmask) << lo;
    sidx[at] = (uint32_t)(w & imask);
  }
}

/* (key, index) pairs, in byte-wide digits: with all 64 bits varying (hashes), 11-bit digits
 * over twice as many destinations were slower at 65,536 keys than 8 passes of 8 bits. The
 * passes alternate between a and b; the last one writes the keys and indices out. */
static void sort_wide(const uint64_t *keys, size_t n, pair_t *a, pair_t *b, uint32_t *cnt,
                      unsigned lo, unsigned width, uint64_t *skey, uint32_t *sidx) {
  const unsigned digit = 8, passes = (width + digit - 1) / digit;
  const size_t digits = (size_t)1 << digit;
  const uint64_t dmask = digits - 1;
  memset(cnt, 0, sizeof *cnt * passes * digits);
  for (size_t i = 0; i < n; i++) {
    a[i] = (pair_t){keys[i], (uint32_t)i};
    for (unsigned p = 0; p < passes; p++)
      cnt[p * digits + ((keys[i] >> (lo + p * digit)) & dmask)]++;
  }
  bool moves[64 / 8];
  offsets(cnt, passes, digits, n, moves);
  pair_t *src = a, *dst = b;
  for (unsigned p = 0; p + 1 < passes; p++) {
    if (!moves[p]) continue;
    uint32_t *c = cnt + p * digits;
    unsigned shift = lo + p * digit;
    for (size_t i = 0; i < n; i++) dst[c[(src[i].key >> shift) & dmask]++] = src[i];
    pair_t *t = src;
    src = dst;
    dst = t;
  }
  uint32_t *c = cnt + (size_t)(passes - 1) * digits; /* the highest digit varies */
  unsigned shift = lo + (passes - 1) * digit;
  for (size_t i = 0; i < n; i++) {
    uint32_t at = c[(src[i].key >> shift) & dmask]++;
    skey[at] = src[i].key;
    sidx[at] = src[i].idx;
  }
}

void ts_sort_keys(const uint64_t *keys, size_t n, void *scratch, uint64_t *skey, uint32_t *sidx) {
  if (n < SMALL) {
    pair_t *pairs = scratch;
    for (size_t i = 0; i < n; i++) pairs[i] = (pair_t){keys[i], (uint32_t)i};
    qsort(pairs, n, sizeof *pairs, cmp_pair);
    for (size_t i = 0; i < n; i++) {
      skey[i] = pairs[i].key;
      sidx[i] = pairs[i].idx;
    }
    return;
  }
  uint64_t any = 0, all = ~UINT64_C(0);
  for (size_t i = 0; i < n; i++) {
    any |= keys[i];
    all &= keys[i];
  }
  uint64_t vary = any ^ all;
  if (!vary) { /* one key, n times */
    for (size_t i = 0; i < n; i++) {
      skey[i] = keys[i];
      sidx[i] = (uint32_t)i;
    }
    return;
  }
  unsigned lo = (unsigned)__builtin_ctzll(vary), width = bits_of(vary) - lo;
  unsigned ibits = bits_of(n - 1);
  uint32_t *cnt = (uint32_t *)(void *)((char *)scratch + 2 * sizeof(pair_t) * n);
  if (width + ibits <= 64) { /* width < 64: n > 1 */
    unsigned passes = (width + DIGIT_MAX - 1) / DIGIT_MAX, digit = (width + passes - 1) / passes;
    uint64_t *a = scratch, base = all & ~(((UINT64_C(1) << width) - 1) << lo);
    sort_packed(keys, n, a, a + n, cnt, base, lo, width, passes, digit, ibits, skey, sidx);
  } else {
    pair_t *pairs = scratch;
    sort_wide(keys, n, pairs, pairs + n, cnt, lo, width, skey, sidx);
  }
}
