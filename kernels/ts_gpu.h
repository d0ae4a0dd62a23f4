/*
 * GPU discovery (docs/architecture.md). Plain C: no CUDA types cross this header.
 *
 * GPUs are the devices the CUDA runtime reports, so CUDA_VISIBLE_DEVICES decides what a
 * worker sees and /gpu:N is the N-th visible one. On a machine without a GPU or a driver the
 * runtime answers cudaGetDeviceCount with an error (35, insufficient driver; 100, no
 * device): that is zero GPUs, not a failure. A build without the CUDA back end always
 * reports zero GPUs and says why.
 */
#ifndef TS_GPU_H
#define TS_GPU_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  int index;           /* N of /gpu:N */
  char name[128];      /* "NVIDIA H200" */
  char pci_bus_id[32]; /* "0000:19:00.0" */
  char uuid[40];       /* "8932f937-d72c-4106-c12f-20bd9faed9f6" (cudaDeviceProp.uuid),
                          which nvidia-smi -L shows as GPU-<uuid> (MIG-<uuid> for a MIG
                          instance); "" when unknown */
  size_t total_bytes;  /* device memory */
  int major, minor;    /* compute capability */
} ts_gpu_info_t;

/* The number of visible GPUs (0 or more). When 0, why (may be NULL) gets the reason, such
 * as "no CUDA driver (cudaGetDeviceCount: CUDA driver version is insufficient ...)". */
int ts_gpu_count(char *why, size_t whylen);

/* Details of visible GPU i. Returns 0 or TS_EDEVICE. */
int ts_gpu_info(int i, ts_gpu_info_t *out);

/* Free and total memory of visible GPU i (cudaMemGetInfo). Returns 0 or TS_EDEVICE. */
int ts_gpu_memory(int i, size_t *free_bytes, size_t *total_bytes);

/* --- memory policy (device.allow_growth, device.memory_fraction) ------------------------ */

typedef struct {
  bool allow_growth;      /* take memory as needed */
  double memory_fraction; /* > 0: never hold more than this fraction of the GPU */
} ts_gpu_memory_policy_t;

/* What a policy means for one GPU: the pool of kernels/ts_pool.h takes `reserve` bytes at
 * start, grows on demand when `grow`, and never holds more than `limit` (0 = no limit of its
 * own). usable is what the pool may come to hold: the limit, or with neither a limit nor a
 * reservation the memory free when the plan was made (TensorFlow's "Created device ... with
 * N MB memory"). summary is a log line ("reserving 7.0 GiB (7516192768 bytes) up front:
 * device.memory_fraction = 0.05 of 139.8 GiB"); limit_reason names the keys that limit it,
 * for out-of-memory messages ("device.memory_fraction = 0.05"). */
typedef struct {
  size_t reserve;
  size_t limit;
  bool grow;
  size_t usable;
  char summary[256];
  char limit_reason[96];
} ts_gpu_memory_plan_t;

#define TS_GPU_MEMORY_GRANULE ((size_t)2 << 20) /* reservations are multiples of 2 MiB */

/* The plan for GPU `device` with total and free bytes, a pure function. TensorFlow's
 * GPUOptions, where L = F * total rounded down to 2 MiB (at least 2 MiB):
 *   F > 0, allow_growth     reserve nothing, grow on demand, never beyond L (limit = L):
 *                           TensorFlow's allow_growth under per_process_gpu_memory_fraction.
 *   F > 0, no allow_growth  reserve L up front, never more (limit = reserve): TensorFlow's
 *                           per_process_gpu_memory_fraction.
 *   F = 0, allow_growth     reserve nothing, grow on demand, no limit of our own.
 *   F = 0, no allow_growth  TensorFlow's default: reserve 90% of the free memory up front.
 * Returns 0, TS_EINVAL (F outside [0, 1] or not a number), or TS_ENOMEM when a reservation is
 * more than is free, with errmsg naming the key, the need and what is free. A growing pool is
 * not checked against what is free now: other processes may free memory later, and its
 * cudaMalloc says so when they have not. */
int ts_gpu_memory_plan(int device, size_t total, size_t free_bytes,
                       const ts_gpu_memory_policy_t *policy, ts_gpu_memory_plan_t *out,
                       char *errmsg, size_t errlen);

#endif
