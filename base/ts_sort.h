/*
 * A stable sort of 64-bit keys that keeps each key's index: what a table request does with
 * its caller's keys (client/ts_client_sparse.c) before it drops the duplicates.
 */
#ifndef TS_SORT_H
#define TS_SORT_H

#include <stddef.h>
#include <stdint.h>

/* Most keys ts_sort_keys takes (their indices are 32 bits). */
#define TS_SORT_MAX_KEYS (UINT64_C(1) << 31)

/* Bytes of the scratch memory ts_sort_keys needs for n keys (8-byte aligned). */
size_t ts_sort_scratch_bytes(size_t n);

/* keys[0..n) in ascending order as unsigned 64-bit values into skey[0..n), and into
 * sidx[0..n) each one's index in keys; equal keys keep their order (ascending index).
 * scratch: ts_sort_scratch_bytes(n) bytes. n <= TS_SORT_MAX_KEYS.
 *
 * Small lists go to qsort; larger ones to an LSD radix sort over only the bits in which the
 * keys differ, in digits of up to 11 bits (ids below 2^20: two passes, where a byte-wise sort
 * makes three), on the key's varying bits and the index packed into one 64-bit word where
 * they fit, as (key, index) pairs a byte a pass where they do not. */
void ts_sort_keys(const uint64_t *keys, size_t n, void *scratch, uint64_t *skey, uint32_t *sidx);

#endif
