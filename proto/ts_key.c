/*
 * Table keys (ts_key.h): the shard of a key and a new row's value. The row generator reuses
 * ts_init_uniform's counter-based stream, keyed by the table and the key, so a row can be
 * made on any shard, at any time, alone.
 */
#include "ts_key.h"

#include <math.h>

#include "ts_init.h"

uint64_t ts_key_hash(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ULL;
  key ^= key >> 33;
  return key;
}

uint32_t ts_key_shard(uint64_t key, uint32_t num_shards) {
  return (uint32_t)(((unsigned __int128)ts_key_hash(key) * num_shards) >> 64);
}

/* A standard normal draw from counters c and c + 1 of the stream (Box-Muller). */
static double normal(uint64_t stream, uint64_t c) {
  double u1 = ts_init_uniform(stream, c), u2 = ts_init_uniform(stream, c + 1);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2); /* 1 - u1 is in (0, 1] */
}

/* Draws of a truncated normal's element: redrawn beyond 2 sd, at most this many times (the
 * chance of needing more is 0.0455^64); the last draw is clipped. */
#define TRUNC_TRIES 64

void ts_key_row_init(float *row, size_t dim, ts_key_init_t init, double param, uint64_t table_key,
                     uint64_t key) {
  uint64_t stream = table_key ^ ts_key_hash(key ^ 0x9e3779b97f4a7c15ULL);
  for (size_t j = 0; j < dim; j++) {
    double v = 0.0;
    switch (init) {
      case TS_KEY_INIT_ZEROS:
        break;
      case TS_KEY_INIT_UNIFORM:
        v = (2.0 * ts_init_uniform(stream, j) - 1.0) * param;
        break;
      case TS_KEY_INIT_NORMAL:
        v = normal(stream, 2 * (uint64_t)j) * param;
        break;
      case TS_KEY_INIT_TRUNCATED_NORMAL: {
        /* Element j takes counters [2 * TRUNC_TRIES * j, 2 * TRUNC_TRIES * (j + 1)). */
        uint64_t c = 2 * TRUNC_TRIES * (uint64_t)j;
        double z = normal(stream, c);
        for (int k = 1; k < TRUNC_TRIES && fabs(z) > 2.0; k++)
          z = normal(stream, c + 2 * (uint64_t)k);
        v = (z > 2.0 ? 2.0 : z < -2.0 ? -2.0 : z) * param;
        break;
      }
    }
    row[j] = (float)v;
  }
}
