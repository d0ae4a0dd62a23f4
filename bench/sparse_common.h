/*
 * Shared by bench/sparsebench.c (Tessera) and bench/peers/pslite/pslite_sparse.cc (ps-lite),
 * so both draw the very same batches and measure memcpy the same way: header-only, C and C++.
 *
 *   sb_zipf_batches   the precomputed key batches of a worker: nb batches of b ids, each a
 *                     Zipf(s) rank over [0, vocab) from a xorshift64 stream seeded by
 *                     (seed, worker); rank r is id r (rank 0 the hottest id)
 *   sb_mix64          a bijection of uint64 (splitmix64's finalizer): ps-lite's worker maps
 *                     ids through it onto its key space, which ps-lite splits into one range
 *                     per server, as a user spreads embedding ids over ps-lite servers
 *   sb_memcpy_gbps    memcpy bandwidth of this machine: copies of a buffer (256 MiB by
 *                     default) for about `seconds`, GB/s (1e9 B) of bytes copied (read and
 *                     written once each: a copy of N bytes counts N)
 */
#ifndef TS_BENCH_SPARSE_COMMON_H
#define TS_BENCH_SPARSE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_stats.h"

static inline double sb_now_s(void) { return bench_now_s(); }

static inline uint64_t sb_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static inline double sb_uniform01(uint64_t *rng) {
  *rng ^= *rng << 13;
  *rng ^= *rng >> 7;
  *rng ^= *rng << 17;
  return (double)(*rng >> 11) * (1.0 / 9007199254740992.0);
}

/* A Zipf(s) rank in [0, n) by inverting the continuous approximation of its CDF (as
 * bench/table_rows.c). */
static inline uint64_t sb_zipf(uint64_t *rng, uint64_t n, double s) {
  double u = sb_uniform01(rng);
  if (fabs(s - 1.0) < 1e-9) return (uint64_t)(exp(u * log((double)n + 1.0)) - 1.0) % n;
  double a = 1.0 - s, hn = (pow((double)n + 1.0, a) - 1.0) / a;
  return (uint64_t)(pow(u * hn * a + 1.0, 1.0 / a) - 1.0) % n;
}

/* nb x b ids for worker w (malloc'd, caller frees), or NULL. */
static inline int64_t *sb_zipf_batches(uint64_t seed, int w, size_t nb, size_t b,
                                       uint64_t vocab, double s) {
  int64_t *k = (int64_t *)malloc(nb * b * sizeof *k);
  if (!k) return NULL;
  uint64_t rng = sb_mix64(seed * 0x9E3779B97F4A7C15ULL + (uint64_t)w + 1) | 1;
  for (size_t i = 0; i < nb * b; i++) k[i] = (int64_t)sb_zipf(&rng, vocab, s);
  return k;
}

static inline double sb_memcpy_gbps(size_t bytes, double seconds) {
  char *a = (char *)malloc(bytes), *b = (char *)malloc(bytes);
  if (!a || !b) {
    free(a);
    free(b);
    return NAN;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  memcpy(b, a, bytes); /* warm */
  double t0 = sb_now_s(), t = t0;
  long n = 0;
  while (n < 2 || t - t0 < seconds) {
    memcpy(n % 2 ? a : b, n % 2 ? b : a, bytes);
    n++;
    t = sb_now_s();
  }
  volatile char sink = a[bytes / 2] + b[bytes / 3];
  (void)sink;
  free(a);
  free(b);
  return (double)n * (double)bytes / (t - t0) / 1e9;
}

#endif
