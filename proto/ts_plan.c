#include "ts_plan.h"

#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

void ts_plan_free(ts_plan_t *plan) {
  ts_free(plan->parts);
  ts_free(plan->tensor_first);
  ts_free(plan->tensor_parts);
  ts_free(plan->shard_bytes);
  ts_free(plan->shard_parts);
  memset(plan, 0, sizeof *plan);
}

static int by_size_desc(const void *a, const void *b) {
  const ts_part_t *x = *(const ts_part_t *const *)a;
  const ts_part_t *y = *(const ts_part_t *const *)b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  if (x->part != y->part) return x->part < y->part ? -1 : 1;
  return 0;
}

int ts_plan_build(const uint64_t *tensor_elems, uint32_t num_tensors, uint32_t num_shards,
                  uint64_t partition_bytes, ts_plan_t *out) {
  memset(out, 0, sizeof *out);
  if (num_tensors == 0 || num_shards == 0 || partition_bytes < 4) return TS_EINVAL;
  uint64_t max_elems = partition_bytes / 4;
  size_t total = 0;
  uint64_t model_bytes = 0;
  for (uint32_t t = 0; t < num_tensors; t++) {
    /* The model's byte size must fit in 64 bits: then neither the rounding up below nor a
     * shard's byte tally can wrap. */
    if (tensor_elems[t] == 0 || tensor_elems[t] > (UINT64_MAX - model_bytes) / 4)
      return TS_EINVAL;
    model_bytes += tensor_elems[t] * 4;
    uint64_t n = (tensor_elems[t] + max_elems - 1) / max_elems;
    if (n > UINT32_MAX || total + n < total) return TS_EINVAL;
    total += (size_t)n;
  }

  int rc = TS_ENOMEM;
  ts_part_t **order = NULL;
  out->num_tensors = num_tensors;
  out->num_shards = num_shards;
  out->num_parts = total;
  out->parts = ts_calloc(total, sizeof *out->parts);
  out->tensor_first = ts_calloc(num_tensors, sizeof *out->tensor_first);
  out->tensor_parts = ts_calloc(num_tensors, sizeof *out->tensor_parts);
  out->shard_bytes = ts_calloc(num_shards, sizeof *out->shard_bytes);
  out->shard_parts = ts_calloc(num_shards, sizeof *out->shard_parts);
  order = ts_calloc(total, sizeof *order);
  if (!out->parts || !out->tensor_first || !out->tensor_parts || !out->shard_bytes ||
      !out->shard_parts || !order)
    goto fail;

  size_t k = 0;
  for (uint32_t t = 0; t < num_tensors; t++) {
    uint64_t elems = tensor_elems[t];
    uint64_t n = (elems + max_elems - 1) / max_elems;
    uint64_t base = elems / n, extra = elems % n, offset = 0;
    out->tensor_first[t] = k;
    out->tensor_parts[t] = (uint32_t)n;
    for (uint64_t p = 0; p < n; p++, k++) {
      uint64_t count = base + (p < extra ? 1 : 0);
      out->parts[k] = (ts_part_t){.tensor = t, .part = (uint32_t)p, .offset = offset, .count = count};
      order[k] = &out->parts[k];
      offset += count;
    }
  }

  qsort(order, total, sizeof *order, by_size_desc);
  for (size_t i = 0; i < total; i++) {
    uint32_t best = 0;
    for (uint32_t s = 1; s < num_shards; s++)
      if (out->shard_bytes[s] < out->shard_bytes[best]) best = s;
    order[i]->shard = best;
    out->shard_bytes[best] += order[i]->count * 4;
    out->shard_parts[best]++;
  }
  ts_free(order);
  return 0;

fail:
  ts_free(order);
  ts_plan_free(out);
  return rc;
}

const ts_part_t *ts_plan_part(const ts_plan_t *plan, uint32_t tensor, uint32_t part) {
  if (tensor >= plan->num_tensors || part >= plan->tensor_parts[tensor]) return NULL;
  return &plan->parts[plan->tensor_first[tensor] + part];
}
