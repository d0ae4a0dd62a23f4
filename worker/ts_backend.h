/*
 * Back-end selection for a worker (docs/architecture.md): where the model's ops run, on how many
 * towers, and the towers themselves.
 *
 * Placement keeps TensorFlow's semantics (worker/ts_device.h): each op goes to its explicit
 * device (the first device.rules glob matching its name or layer, else device.placement)
 * when that device exists and the CUDA back end has a kernel for the op; otherwise
 * allow_soft_placement moves that op (a missing /gpu:N to /gpu:0 when a GPU is visible and
 * has its kernel, else to /cpu:0) and the worker logs one line per moved op, or the worker
 * stops with TensorFlow's message. An op with no explicit device (device.placement empty, or
 * the input pipeline's ops, which are outside its scope) goes where TensorFlow's placer puts
 * it: /gpu:0 when one is visible and has its kernel, else /cpu:0. The input pipeline's ops
 * have CPU kernels only, so with a GPU the placement is mixed: decoding on the host, the
 * batch copied to the GPU, the model there.
 *
 * A model over two devices. When a network's layers (model.layers as a layer list) land on
 * a GPU and on /cpu:0 (put there by a device.rules glob or the device.placement scope, as
 * `with tf.device()` scopes in TensorFlow, moved by soft placement, or placed there by
 * default for want of a GPU kernel: TensorFlow places each op on its own), the plan is SPLIT
 * (plan->split): each layer runs where it was placed, in segments of consecutive layers on
 * one device (at most TS_SEQ_SEGMENTS_MAX), with the activations copied device -> host ->
 * device at each boundary and their gradients back (worker/ts_seq.h). An MLP given as
 * widths, or a network with more segments, runs on one back end (the towers'): all on
 * /cpu:0 if nothing explicit holds a layer on the GPU, the plan refused otherwise. Layers on
 * two different GPUs in one model are refused.
 *
 * Towers (worker/ts_towers.h): device.towers of them, 0 meaning one per visible GPU when the
 * model runs on a GPU and 1 on the CPU. Tower t runs on GPU (N + t) mod G for the placed
 * /gpu:N (in a split model, the GPU its layers were placed on) and G visible GPUs, so more
 * towers than GPUs share them round-robin; CPU towers all use the CPU back end. A split
 * model's towers are split alike: tower t's GPU layers on its GPU, its /cpu:0 layers on the
 * CPU back end, every tower with its own buffers on both.
 */
#ifndef TS_BACKEND_H
#define TS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "ts_config.h"
#include "ts_device.h"
#include "ts_kernels.h"
#include "ts_layers.h"
#include "ts_model.h"
#include "ts_seq.h"
#include "ts_towers.h"

typedef struct {
  ts_device_type_t type;           /* where the model runs */
  size_t towers;                   /* 1..TS_TOWERS_MAX */
  int tower_device[TS_TOWERS_MAX]; /* GPU of each tower (0 for the CPU) */
  size_t micro_batch;              /* train.batch_size / towers */
  ts_model_op_t *ops;              /* the input pipeline's ops, then the model's (ts_model_ops) */
  ts_placement_t *placements;      /* one per op: where it runs */
  size_t num_ops;
  size_t num_input_ops;            /* ops[0..num_input_ops): the input pipeline's, run once */
  bool split; /* a network's layers on a GPU (type) and on /cpu:0: placements[num_input_ops
               * + i] is layer i's device (worker/ts_seq.h segments) */
  bool soft;             /* soft placement moved an op */
  char soft_spec[48];    /* what the first moved op asked for, "/device:GPU:3", when soft */
  char soft_reason[256]; /* why, when soft */
  char unused_rules[512]; /* device.rules that matched no op, quoted, "" when none */
} ts_backend_plan_t;

/* Plan placement and towers for worker `task`'s job on a machine with gpu_count visible GPUs (gpu_why
 * says why there are none; may be NULL), where gpu_ops (may be NULL: no GPU kernels) is a
 * table whose non-NULL kernels are the ops a GPU can run (ts_kernels_cuda_ops()). A pure
 * function: no device is touched and nothing is logged. Returns 0, or TS_ECONFIG with errmsg
 * (a malformed device.placement, TensorFlow's message when placement cannot be satisfied
 * without soft placement, a batch that does not split over the towers), or TS_ENOMEM. The
 * plan is freed with ts_backend_plan_free. */
int ts_backend_plan(const ts_config_t *cfg, int gpu_count, const char *gpu_why, int task,
                    const ts_kernels_t *gpu_ops, ts_backend_plan_t *plan, char *errmsg,
                    size_t errlen);

void ts_backend_plan_free(ts_backend_plan_t *plan);

/* input: one example's shape, for a network of layers (ignored for an MLP).
 * Discover the GPUs (logging how CUDA_VISIBLE_DEVICES maps them when it is set, and which
 * physical GPU, name and PCI bus id each /gpu:N is: worker/ts_gpu_visible.h), plan
 * (logging soft placement and, with device.log_device_placement, one line per op), create
 * the back ends (logging each GPU's memory plan and TensorFlow's "Created device" line) and build the towers with a batch capacity of at least `capacity` examples
 * per tower. Returns 0, TS_ECONFIG (exit 78: placement or configuration), or TS_ENOMEM /
 * TS_EDEVICE (exit 1: the devices failed, e.g. the model does not fit under
 * device.memory_fraction; errmsg names the limit and the need). */
int ts_backend_setup(const ts_config_t *cfg, int task, ts_layer_shape_t input, size_t capacity,
                     ts_towers_t *towers, char *errmsg, size_t errlen);

/* A layer list model.layers (cfg->num_net_layers > 0) as specs[0..num_net_layers), checked on
 * an input of one example's shape (the images', 28x28x1): returns 0, TS_ECONFIG with errmsg
 * "FILE:LINE: model.layers: layer I 'NAME' (TYPE): WHAT (input HxWxC)" naming the layer
 * at fault and its line in the job file, or TS_ENOMEM. specs has TS_LAYERS_MAX entries. */
int ts_backend_layers(const ts_config_t *cfg, ts_layer_shape_t input, ts_layer_spec_t *specs,
                      char *errmsg, size_t errlen);

/* The devices the towers run on, in the short form: "/cpu:0", "/gpu:0", or
 * "/gpu:0,/gpu:1" for towers on two GPUs (each GPU once), then ",/cpu:0" when the model is
 * split (some of its layers on the CPU). What the worker reports as its
 * device (psctl workers, its /status). */
void ts_backend_device_name(const ts_towers_t *towers, char *buf, size_t n);

/* Log each GPU pool's use (held, peak in use, limit) once per GPU; nothing for the CPU. */
void ts_backend_log_memory(const ts_towers_t *towers);

#endif
