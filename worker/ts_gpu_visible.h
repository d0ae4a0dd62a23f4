/*
 * Which physical GPU each /gpu:N is (docs/gpu.md): CUDA_VISIBLE_DEVICES read as the CUDA
 * runtime reads it, and TensorFlow's "Created device" log line. Pure functions: the worker
 * passes the variable's value and what the runtime reported, so all of it is unit-tested on
 * machines without a GPU.
 *
 * The CUDA runtime only enumerates the GPUs the variable leaves visible, so a process cannot
 * ask it which physical GPU its device 0 is; the variable says, and this module reads it the
 * way the runtime does (NVIDIA's CUDA Programming Guide, "CUDA Environment Variables", and the
 * cases it leaves open as PyTorch's torch.cuda._parse_visible_devices records them, written
 * against the driver):
 *   unset              every GPU, in the runtime's order: /gpu:N is physical GPU N.
 *   ""                 no GPU ("If the variable is set to an empty string, no GPU devices are
 *                      visible").
 *   "1,0"              comma-separated entries; /gpu:N is the GPU of the N-th entry.
 *   entries            a decimal index read as strtoul reads it (leading blanks and a '+'
 *                      skipped, anything after the digits ignored: " 1" and "1gpu" are 1), or
 *                      a UUID as nvidia-smi -L prints it, "GPU-8932f937-d72c-4106-c12f-
 *                      20bd9faed9f6", or any prefix of it that is unique on the machine
 *                      ("GPU-8932f937"), or a MIG instance's "MIG-<uuid>". The first entry
 *                      decides: a list that starts with "GPU-" holds only GPU UUIDs, one that
 *                      starts with "MIG-" only MIG UUIDs, any other only indices.
 *   invalid entry      CUDA ignores it and every entry after it: "0,2,-1,1" shows GPUs 0 and 2
 *                      (the guide's own example); "-1", or any invalid first entry, hides
 *                      every GPU. Invalid: no digits, a negative number, an index the machine
 *                      does not have, a UUID of the other kind or matching no GPU.
 *   repeated entry     hides every GPU: "0,0" and "1,0,1" show none (a repeat after an invalid
 *                      entry is never reached: "0,-1,0" shows GPU 0).
 * What this module cannot see without the runtime (an index past the machine's GPUs, a UUID
 * that matches none, a prefix that matches two) is found by ts_gpu_visible_apply from the
 * number of GPUs the runtime reports. Indices are in the runtime's order: CUDA_DEVICE_ORDER=
 * PCI_BUS_ID makes them nvidia-smi's; the default, FASTEST_FIRST, may differ on a machine with
 * unlike GPUs.
 */
#ifndef TS_GPU_VISIBLE_H
#define TS_GPU_VISIBLE_H

#include <stdbool.h>
#include <stddef.h>

#include "ts_gpu.h"

#define TS_GPU_VISIBLE_ENV "CUDA_VISIBLE_DEVICES"
#define TS_GPU_VISIBLE_MAX 64    /* entries kept; the CUDA back end drives at most 64 GPUs */
#define TS_GPU_VISIBLE_ID_MAX 64 /* longest entry kept, NUL included; longer ones are invalid */

typedef struct {
  int index;                        /* the physical index, or -1 for a UUID entry */
  char uuid[TS_GPU_VISIBLE_ID_MAX]; /* a UUID entry as written ("GPU-8932f937"), else "" */
} ts_gpu_visible_entry_t;

typedef struct {
  bool set;       /* the variable is set (possibly empty) */
  size_t n;       /* visible GPUs it leaves: /gpu:0 .. /gpu:n-1 are entries[0..n) */
  size_t listed;  /* entries before the first invalid one (n until ts_gpu_visible_apply) */
  bool repeated;  /* an entry was repeated, which hides every GPU */
  bool truncated; /* more than TS_GPU_VISIBLE_MAX valid entries: the rest are not kept */
  char stop[TS_GPU_VISIBLE_ID_MAX]; /* the first entry CUDA ignores (with all after it), or the
                                       repeated one; "" when none */
  char value[128]; /* the variable's value, for log lines (cut with "..." if longer) */
  ts_gpu_visible_entry_t entries[TS_GPU_VISIBLE_MAX];
} ts_gpu_visible_t;

/* Read CUDA_VISIBLE_DEVICES' value (NULL: unset) into out. Returns the number of GPUs it
 * leaves visible as far as the text tells (out->n; 0 when it hides all, and 0 when it is
 * unset: every GPU, counted by ts_gpu_visible_apply), or TS_EINVAL when out is NULL. Never
 * fails on any value: every text means something to CUDA. */
int ts_gpu_visible_parse(const char *value, ts_gpu_visible_t *out);

/* Reconcile with the runtime, which reported gpu_count visible GPUs (ts_gpu_count). Unset:
 * n = gpu_count, /gpu:N is GPU N. Set, and the runtime sees fewer than it lists: n becomes
 * gpu_count and listed keeps the count written; when gpu_count > 0 the entry at gpu_count is
 * where CUDA stopped (an index or UUID this machine does not have) and stop names it. With
 * gpu_count 0 the runtime may have failed for other reasons (no driver), so nothing is
 * blamed on an entry. */
void ts_gpu_visible_apply(ts_gpu_visible_t *v, int gpu_count);

/* The physical GPU behind /gpu:<ordinal>: returns its index, or -1 when the variable names it
 * by UUID (the runtime does not say which index that GPU has); buf (may be NULL) gets "1", or
 * the UUID: "GPU-" or "MIG-" and info->uuid when the entry is a prefix of it (the full UUID
 * the runtime reports), else the entry as written. info (may be NULL) is that GPU's details.
 * With the variable unset, /gpu:N is GPU N. */
int ts_gpu_visible_physical(const ts_gpu_visible_t *v, int ordinal, const ts_gpu_info_t *info,
                            char *buf, size_t n);

/* One log line for the start of a worker, when the variable is set:
 *   CUDA_VISIBLE_DEVICES="1,0": /gpu:0 is physical GPU 1, /gpu:1 is physical GPU 0
 *   CUDA_VISIBLE_DEVICES="0,1,-1,2": /gpu:0 is physical GPU 0, /gpu:1 is physical GPU 1;
 *     "-1" is not a GPU, so CUDA ignores it and everything after it
 *   CUDA_VISIBLE_DEVICES="-1": no GPU is visible ("-1" is not a GPU)
 *   CUDA_VISIBLE_DEVICES="1": /gpu:0 is physical GPU 1; the CUDA runtime reports no GPU
 * (the last after ts_gpu_visible_apply with 0: what was meant, and that none is there).
 * Returns buf. */
const char *ts_gpu_visible_describe(const ts_gpu_visible_t *v, char *buf, size_t n);

/* When the variable's text hides every GPU (listed == 0), why (for placement messages:
 * "CUDA_VISIBLE_DEVICES="-1" hides every GPU") into buf and true; else false and buf untouched. */
bool ts_gpu_visible_hides_all(const ts_gpu_visible_t *v, char *buf, size_t n);

/* TensorFlow's device-creation line, word for word, for /gpu:<info->index> of worker task
 * `task` whose pool may hold memory_bytes (ts_gpu_memory_plan_t.usable):
 *   Created device /job:worker/replica:0/task:0/device:GPU:0 with 79078 MB memory:  -> device:
 *   1, name: NVIDIA H100 80GB HBM3, pci bus id: 0000:19:00.0, compute capability: 9.0
 * where "device:" is the physical GPU (ts_gpu_visible_physical: an index, or a UUID), MB are
 * 2^20 bytes rounded down and the PCI bus id is lower case, as TensorFlow prints them.
 * Returns buf. */
const char *ts_gpu_visible_created_line(const ts_gpu_visible_t *v, const ts_gpu_info_t *info,
                                        int task, size_t memory_bytes, char *buf, size_t n);

#endif
