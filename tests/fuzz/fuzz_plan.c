/*
 * Fuzz target: the partition plan over arbitrary tensor lists. Input: u8 shard count,
 * u64 partition_bytes, then u64 element counts (little-endian), at most 64 tensors. Valid
 * lists must give a plan that covers each tensor exactly, respects partition_bytes, balances
 * shards to within one partition and is the same when built twice; invalid ones TS_EINVAL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_target.h"
#include "ts_err.h"
#include "ts_plan.h"

/* Plans larger than this are valid but too slow to check on every input. */
#define FUZZ_MAX_PARTS 100000

static void check(int ok, const char *what) {
  if (ok) return;
  fprintf(stderr, "fuzz_plan: invariant violated: %s\n", what);
  abort();
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void check_plan(const ts_plan_t *p, const uint64_t *elems, uint32_t nt, uint32_t ns,
                       uint64_t pb) {
  uint64_t max_elems = pb / 4, largest = 0;
  size_t k = 0;
  for (uint32_t t = 0; t < nt; t++) {
    check(p->tensor_first[t] == k, "tensor_first");
    uint64_t offset = 0;
    for (uint32_t i = 0; i < p->tensor_parts[t]; i++, k++) {
      const ts_part_t *q = &p->parts[k];
      check(k < p->num_parts, "partition index in range");
      check(ts_plan_part(p, t, i) == q, "ts_plan_part");
      check(q->tensor == t && q->part == i, "partition order");
      check(q->offset == offset, "no gap, no overlap");
      check(q->count > 0 && q->count <= max_elems, "partition size");
      check(q->shard < ns, "shard in range");
      offset += q->count;
      if (q->count * 4 > largest) largest = q->count * 4;
    }
    check(offset == elems[t], "partitions cover the tensor");
  }
  check(k == p->num_parts, "num_parts");
  uint64_t smin = UINT64_MAX, smax = 0;
  for (uint32_t s = 0; s < ns; s++) {
    if (p->shard_bytes[s] < smin) smin = p->shard_bytes[s];
    if (p->shard_bytes[s] > smax) smax = p->shard_bytes[s];
  }
  check(smax - smin <= largest, "shards balanced to within one partition");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 9) return 0;
  uint32_t ns = data[0] % 17; /* 0 is invalid on purpose */
  uint64_t pb = rd64(data + 1);
  uint64_t elems[64];
  uint32_t nt = 0;
  for (size_t off = 9; off + 8 <= size && nt < 64; off += 8) elems[nt++] = rd64(data + off);

  /* What the header promises, computed independently. */
  int valid = nt > 0 && ns > 0 && pb >= 4;
  uint64_t bytes = 0, parts = 0;
  for (uint32_t t = 0; valid && t < nt; t++) {
    uint64_t n = elems[t] / (pb / 4) + (elems[t] % (pb / 4) != 0);
    if (elems[t] == 0 || elems[t] > (UINT64_MAX - bytes) / 4 || n > UINT32_MAX) valid = 0;
    else bytes += elems[t] * 4;
    parts += n;
  }
  if (valid && parts > FUZZ_MAX_PARTS) return 0;

  ts_plan_t a, b;
  int rc = ts_plan_build(elems, nt, ns, pb, &a);
  if (!valid) {
    check(rc == TS_EINVAL, "invalid input gives TS_EINVAL");
    check(a.parts == NULL && a.num_parts == 0, "failed build leaves an empty plan");
    return 0;
  }
  check(rc == 0, "valid input builds");
  check_plan(&a, elems, nt, ns, pb);
  check(ts_plan_build(elems, nt, ns, pb, &b) == 0, "second build");
  check(a.num_parts == b.num_parts, "deterministic part count");
  for (size_t i = 0; i < a.num_parts; i++)
    check(memcmp(&a.parts[i], &b.parts[i], sizeof a.parts[i]) == 0, "deterministic plan");
  ts_plan_free(&a);
  ts_plan_free(&b);
  return 0;
}
