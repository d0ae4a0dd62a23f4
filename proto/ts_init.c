#include "ts_init.h"

#include <math.h>

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t ts_init_key(uint64_t seed, const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return splitmix64(h ^ splitmix64(seed));
}

double ts_init_uniform(uint64_t key, uint64_t counter) {
  uint64_t r = splitmix64(key ^ splitmix64(counter));
  return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

void ts_init_fans(const uint64_t *shape, size_t rank, double *fan_in, double *fan_out) {
  if (rank < 2) {
    *fan_in = *fan_out = rank == 1 ? (double)shape[0] : 1.0;
    return;
  }
  /* The leading dimensions are a kernel's window (none for a dense kernel): each input and
   * each output unit is connected through all of it. */
  double receptive = 1.0;
  for (size_t k = 0; k + 2 < rank; k++) receptive *= (double)shape[k];
  *fan_in = (double)shape[rank - 2] * receptive;
  *fan_out = (double)shape[rank - 1] * receptive;
}

double ts_init_glorot_limit(const uint64_t *shape, size_t rank) {
  double fan_in, fan_out;
  ts_init_fans(shape, rank, &fan_in, &fan_out);
  return sqrt(6.0 / (fan_in + fan_out));
}

void ts_init_fill(float *dst, ts_init_kind_t kind, uint64_t seed, const char *name,
                  const uint64_t *shape, size_t rank, uint64_t offset, uint64_t count) {
  if (kind == TS_INIT_ZEROS || kind == TS_INIT_ONES) {
    float v = kind == TS_INIT_ONES ? 1.0f : 0.0f;
    for (uint64_t i = 0; i < count; i++) dst[i] = v;
    return;
  }
  double limit = ts_init_glorot_limit(shape, rank);
  uint64_t key = ts_init_key(seed, name);
  for (uint64_t i = 0; i < count; i++)
    dst[i] = (float)((2.0 * ts_init_uniform(key, offset + i) - 1.0) * limit);
}
