#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_plan (tests/fuzz/corpus/plan/): u8 shards, u64
partition_bytes, u64 element counts, little-endian. Each file's name starts with "plan-", so
that no two files of the repository share a name. Run from the repository root."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/plan"
os.makedirs(out, exist_ok=True)
M = 2**64 - 1
cases = {
    "01-mlp-2-shards": (2, 4 << 20, [784 * 256, 256, 2560, 10]),
    "02-near-equal": (1, 12, [10]),
    "03-many-small": (5, 64, [7, 16, 16, 1, 33, 100]),
    "04-exact": (2, 16, [12, 4]),
    "05-min-partition": (3, 4, [9, 1]),
    "06-zero-shards": (0, 64, [10]),
    "07-zero-tensor": (2, 64, [10, 0]),
    "08-tiny-partition": (2, 3, [10]),
    "09-largest-model": (3, 1 << 62, [M // 4]),
    "10-overflow-sum": (2, 1 << 62, [1 << 61, 1 << 61]),
    "11-overflow-one": (2, 8, [M]),
    "12-too-many-parts": (2, 4, [(1 << 32) + 1]),
}
for name, (shards, pb, elems) in cases.items():
    with open(os.path.join(out, "plan-" + name), "wb") as f:
        f.write(struct.pack("<BQ", shards, pb) + b"".join(struct.pack("<Q", e) for e in elems))
