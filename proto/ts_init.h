/*
 * Deterministic parameter initialisation (docs/architecture.md).
 *
 * Element i of a tensor depends only on (seed, tensor name, i), through a counter-based
 * generator (SplitMix64 of a hash of seed and name, plus i), so each shard initialises its
 * own partitions without generating anyone else's, and every run with the same seed starts
 * from the same parameters.
 */
#ifndef TS_INIT_H
#define TS_INIT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TS_INIT_ZEROS = 0, TS_INIT_GLOROT_UNIFORM = 1, TS_INIT_ONES = 2 } ts_init_kind_t;

/* Fill dst[0..count) with elements offset..offset+count of the tensor (name, shape[rank]).
 * Glorot-uniform draws from U(-l, l), l = sqrt(6 / (fan_in + fan_out)), with fan_in =
 * shape[0] and fan_out = the product of the other dimensions (fan_in = fan_out = n for a
 * rank-1 tensor). */
void ts_init_fill(float *dst, ts_init_kind_t kind, uint64_t seed, const char *name,
                  const uint64_t *shape, size_t rank, uint64_t offset, uint64_t count);

/* A uniform double in [0, 1) from (key, counter): the generator behind ts_init_fill, also
 * used for reproducible data shuffles. */
double ts_init_uniform(uint64_t key, uint64_t counter);

/* 64-bit FNV-1a of a string mixed with a seed. */
uint64_t ts_init_key(uint64_t seed, const char *name);

#endif
