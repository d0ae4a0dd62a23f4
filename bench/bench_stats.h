/*
 * What the benchmarks share to report a run: the monotonic clock and quantiles of sorted
 * samples (nearest rank).
 */
#ifndef BENCH_STATS_H
#define BENCH_STATS_H

#include <math.h>
#include <stddef.h>
#include <time.h>

static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* For qsort of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Quantile q of sorted v[0..n) (nearest rank); NAN when n is 0. */
static inline double bench_quantile(const double *v, size_t n, double q) {
  if (n == 0) return NAN;
  size_t k = (size_t)ceil(q * (double)n);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

#endif
