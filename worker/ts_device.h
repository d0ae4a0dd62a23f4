/*
 * Devices and placement (docs/architecture.md), named like TensorFlow's.
 *
 * A device spec is "/cpu:0", "/gpu:N", "/device:GPU:N", or the long form
 * "/job:worker/replica:0/task:T/device:GPU:N" (any of the /job, /replica, /task parts may be
 * left out; the type is case-insensitive). An empty spec is no device at all: TensorFlow's
 * own choice. /gpu:N is the N-th GPU that CUDA_VISIBLE_DEVICES leaves visible.
 *
 * Placement puts each op on its explicit device (a device.rules match, else the scope
 * device.placement) when that device exists and its back end has a kernel for the op.
 * Otherwise, with allow_soft_placement, that op alone falls back (a missing /gpu:N to /gpu:0
 * when some GPU is visible and has the op's kernel, else to /cpu:0) and says why; without
 * it, placement fails with TensorFlow's message. An op with no explicit device goes where
 * TensorFlow's placer puts it: /gpu:0 when a GPU is visible and has its kernel, else /cpu:0.
 */
#ifndef TS_DEVICE_H
#define TS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { TS_DEVICE_CPU = 0, TS_DEVICE_GPU = 1 } ts_device_type_t;

typedef struct {
  ts_device_type_t type;
  int index;
  bool unspecified; /* the empty spec: no device asked for */
  bool has_job, has_replica, has_task;
  char job[32];
  int replica, task;
} ts_device_spec_t;

/* Parse a device spec ("" gives unspecified = true). Returns 0, or TS_EINVAL with the reason in errmsg
 * ("malformed device name '/gpu:x': the device index must be a number"). */
int ts_device_parse(const char *s, ts_device_spec_t *out, char *errmsg, size_t errlen);

/* "/device:GPU:0" (the short canonical form TensorFlow's messages use). */
void ts_device_short_name(ts_device_type_t type, int index, char *buf, size_t n);

/* "/job:worker/replica:0/task:T/device:GPU:N". */
void ts_device_long_name(ts_device_type_t type, int index, int task, char *buf, size_t n);

typedef struct {
  const char *name;   /* "fc1/matmul" */
  const char *type;   /* "MatMul" */
  bool gpu_kernel;    /* the GPU back end has a kernel for it */
  /* Its own explicit device (a device.rules match), or NULL: the scope's (want's), or for
   * an op outside the scope (outside_scope: the input pipeline's), no device at all. */
  const ts_device_spec_t *want;
  bool outside_scope;
} ts_placement_op_t;

typedef struct {
  ts_device_type_t type;
  int index;
  bool soft;          /* moved by soft placement */
  char asked[48];     /* its explicit device, "/device:GPU:0"; "" when none */
  char reason[200];   /* why, when soft */
} ts_placement_t;

/* The devices of worker `task` with gpu_count GPUs, as TensorFlow lists them after
 * "available devices: ": "/job:worker/replica:0/task:0/device:CPU:0,
 * /job:worker/replica:0/task:0/device:GPU:0, ..." (cut short to fit n). */
void ts_device_available(int gpu_count, int task, char *buf, size_t n);

/* Place ops[0..n) in the scope `want` (device.placement; unspecified for none) on a machine
 * with gpu_count visible GPUs, for worker `task`.
 * out gets one placement per op. Returns 0, or TS_EDEVICE when an op cannot be placed and
 * soft placement is off; errmsg then holds TensorFlow's message, word for word: "Cannot
 * assign a device for operation fc1/matmul: Could not satisfy explicit device specification
 * '/device:GPU:0' because no devices matching that specification are registered in this
 * process; available devices: /job:worker/replica:0/task:0/device:CPU:0" when there is no
 * such GPU, or "... because no supported kernel for GPU devices is available" when the GPU
 * exists but the op has no kernel for it. gpu_why (may be NULL) says why there are no GPUs
 * (the driver's or the build's reason), for the soft-placement log and the caller's. */
int ts_device_place(const ts_device_spec_t *want, int gpu_count, const char *gpu_why, int task,
                    const ts_placement_op_t *ops, size_t n, bool allow_soft, ts_placement_t *out,
                    char *errmsg, size_t errlen);

#endif
