/*
 * Partition plan (docs/architecture.md): a pure function of the tensor list, the shard count and
 * partition_bytes, computed alike by every server and client.
 *
 * Each tensor is cut into ceil(bytes / partition_bytes) partitions of near-equal size (they
 * differ by at most one element). Partitions are then placed largest first, each on the
 * shard holding the fewest bytes so far (ties: the lower shard index; equal sizes: the lower
 * tensor, then partition, index), so no shard holds a whole large tensor while another
 * idles.
 */
#ifndef TS_PLAN_H
#define TS_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t tensor;  /* index in the declared list */
  uint32_t part;    /* index within the tensor */
  uint64_t offset;  /* first element within the tensor */
  uint64_t count;   /* elements */
  uint32_t shard;
} ts_part_t;

typedef struct {
  uint32_t num_tensors;
  uint32_t num_shards;
  size_t num_parts;
  ts_part_t *parts;            /* num_parts entries, ordered by (tensor, part) */
  size_t *tensor_first;        /* index in parts of each tensor's partition 0 */
  uint32_t *tensor_parts;      /* partitions per tensor */
  uint64_t *shard_bytes;       /* parameter bytes per shard */
  uint32_t *shard_parts;       /* partitions per shard */
} ts_plan_t;

/* Build the plan for num_tensors tensors of tensor_elems[i] float32 elements each.
 * partition_bytes must be at least 4, every tensor must have at least one element, the
 * model's total bytes must fit in 64 bits and a tensor may have at most UINT32_MAX partitions.
 * Returns 0, TS_EINVAL or TS_ENOMEM; on success free with ts_plan_free. On failure *out is
 * left empty (safe to pass to ts_plan_free). */
int ts_plan_build(const uint64_t *tensor_elems, uint32_t num_tensors, uint32_t num_shards,
                  uint64_t partition_bytes, ts_plan_t *out);

void ts_plan_free(ts_plan_t *plan);

/* The partition (tensor, part), or NULL when out of range. */
const ts_part_t *ts_plan_part(const ts_plan_t *plan, uint32_t tensor, uint32_t part);

#endif
