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
 * Glorot-uniform draws from U(-l, l), l = sqrt(6 / (fan_in + fan_out)), with the fans of
 * ts_init_fans. */
void ts_init_fill(float *dst, ts_init_kind_t kind, uint64_t seed, const char *name,
                  const uint64_t *shape, size_t rank, uint64_t offset, uint64_t count);

/* The fans of a tensor of shape[rank] as Keras computes them (keras.initializers'
 * compute_fans), for TensorFlow's layouts: rank 1, fan_in = fan_out = shape[0]; rank 2 (a
 * dense kernel [in, out]), fan_in = shape[0], fan_out = shape[1]; rank >= 3 (a convolution
 * kernel [spatial..., in, out], HWIO for 2-D as ps-worker's conv2d kernels are), with
 * receptive = the product of the spatial dimensions shape[0..rank-2), fan_in =
 * shape[rank-2] * receptive and fan_out = shape[rank-1] * receptive. Rank 0: 1 and 1. */
void ts_init_fans(const uint64_t *shape, size_t rank, double *fan_in, double *fan_out);

/* Glorot-uniform's limit for shape[rank]: sqrt(6 / (fan_in + fan_out)) of ts_init_fans. */
double ts_init_glorot_limit(const uint64_t *shape, size_t rank);

/* A uniform double in [0, 1) from (key, counter): the generator behind ts_init_fill, also
 * used for reproducible data shuffles. */
double ts_init_uniform(uint64_t key, uint64_t counter);

/* 64-bit FNV-1a of a string mixed with a seed. */
uint64_t ts_init_key(uint64_t seed, const char *name);

#endif
