/*
 * Towers: the model replicas of one worker, and the data path between the parameter servers
 * and them (docs/architecture.md).
 *
 * Glossary.
 *   tower        one replica of the model (ts_model_t) on one back end: a GPU, or the CPU.
 *                Several towers may share a GPU ("virtual towers", device.towers above the
 *                GPU count): each has its own context and stream there.
 *   micro-batch  a tower's share of the worker's batch. train.batch_size B is the WORKER's
 *                batch; tower t of T takes examples [t B/T, (t+1) B/T) of it, so B must be a
 *                multiple of T.
 *   staging      host memory the pulls land in and the pushes leave from. For the CPU back end
 *                these are the parameters and gradients of tower 0 themselves (zero copy); for
 *                a GPU they are pinned buffers (k->host_alloc) with one asynchronous copy to
 *                each tower after a pull and one copy back before a push.
 *
 * Semantics. Each tower's gradient is the mean over its micro-batch; the worker pushes the
 * mean of the towers' gradients, which (the micro-batches being equal) is the mean over the
 * whole batch. So T towers with batch B compute what one tower with batch B computes, up to
 * float rounding, and the sync exactness contract (W workers with batch B equal one worker
 * with batch W B) holds whatever the tower counts.
 *
 * Averaging, chosen at init (ts_towers_reduce_name):
 *   "none"    one tower.
 *   "host"    CPU towers: summed in host memory with the CPU kernels.
 *   "device"  every tower on one GPU: summed on that GPU by tower 0's kernels.
 *   "nccl"    towers on distinct GPUs, NCCL built in: ncclReduce(ncclAvg) to tower 0's GPU.
 *   "pinned"  otherwise: each tower's gradient copied to pinned host memory, summed there.
 *
 * Split models (TensorFlow's `with tf.device()` over one model, worker/ts_seq.h segments):
 * every tower is split the same way. Tower t's table is its GPU, as without a split, and
 * the layers placed on /cpu:0 run on the CPU back end, with the copies between them inside
 * the tower's step. The flat host layout stays what pulls fill and pushes send: after a pull
 * each segment's slice is copied from the staging to its own device (memcpy for the CPU
 * segment), and before a push each slice is copied back; T > 1 towers average in host
 * memory ("pinned"). So a split model gives every tower the same work, and the micro-batch
 * rule above is unchanged.
 *
 * Threads. A step runs the towers of GPU back ends on one thread each (the caller's thread
 * runs tower 0), so several GPUs compute at once; CPU towers run one after the other (OpenBLAS
 * has threads of its own). Otherwise a ts_towers_t is used by one thread.
 *
 * Ownership. The caller owns the ts_towers_t struct. ts_towers_init takes the kernels tables
 * and, when release is not NULL, calls release on each at ts_towers_destroy (after everything
 * allocated on them is freed); with release NULL they are borrowed and must outlive the
 * towers. Pointers returned by the accessors stay valid until ts_towers_destroy.
 */
#ifndef TS_TOWERS_H
#define TS_TOWERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_kernels.h"
#include "ts_kernels_cuda.h"
#include "ts_model.h"

#define TS_TOWERS_MAX 64

typedef void (*ts_towers_release_cb)(const ts_kernels_t *k);

typedef enum {
  TS_TOWERS_REDUCE_NONE = 0,
  TS_TOWERS_REDUCE_HOST,
  TS_TOWERS_REDUCE_DEVICE,
  TS_TOWERS_REDUCE_NCCL,
  TS_TOWERS_REDUCE_PINNED,
} ts_towers_reduce_t;

typedef struct {
  /* Public, read-only after init. */
  size_t n;                     /* towers, 1..TS_TOWERS_MAX */
  ts_model_t *models;           /* n models; models[0] is the one evaluated and declared */
  const ts_kernels_t **kernels; /* n tables */
  bool zero_copy;               /* every tower's back end is host memory */
  ts_towers_reduce_t reduce;

  /* Private. */
  bool borrowed_model; /* ts_towers_wrap: models[0] belongs to the caller */
  ts_towers_release_cb release;
  ts_kernels_cuda_nccl_t *nccl;
  float *stage_params;    /* pinned, param_count floats; NULL when zero_copy */
  float **stage_grads;    /* n entries; [0] is pushed from; NULL when zero_copy */
  float **pull_dst;       /* per tensor: where a pull lands */
  const float **push_src; /* per tensor: what a push sends */
  float *tower_loss;      /* n */
  size_t *tower_correct;  /* n: examples of its micro-batch classified right */
  size_t correct;         /* the last step's batch classified right (ts_towers_step) */
  int *tower_rc;          /* n */
  size_t micro;           /* micro-batch of the batch loaded last */
} ts_towers_t;

/* Where tower t's micro-batch starts in a batch of `batch` examples split over `towers`, and
 * how many examples it has. A pure function. Returns 0, or TS_EINVAL when towers is 0, t >=
 * towers, or batch is not a positive multiple of towers. */
int ts_towers_split(size_t batch, size_t towers, size_t t, size_t *offset, size_t *count);

/* Build n towers of the model (widths[0..nw), activation, batch capacity per tower) on
 * kernels[0..n) and choose how gradients are averaged. On failure everything is freed (and
 * released), *tw is zeroed and errmsg names the tower and the device. Returns 0, TS_EINVAL,
 * TS_ENOMEM or a back end's error (TS_EDEVICE). */
int ts_towers_init(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n, const int *widths,
                   size_t nw, ts_activation_t activation, size_t capacity,
                   ts_towers_release_cb release, char *errmsg, size_t errlen);

/* ts_towers_init for a network of layers (worker/ts_layers.h) on an input of one example's
 * shape: each tower runs ts_model_init_seq. Errors as ts_towers_init; TS_EINVAL names the
 * layer. */
int ts_towers_init_seq(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n,
                       const ts_layer_spec_t *specs, size_t nspecs, ts_layer_shape_t input,
                       size_t capacity, ts_towers_release_cb release, char *errmsg, size_t errlen);

/* ts_towers_init_seq with a split model (above): layer i runs on the CPU back end
 * (ts_kernels_cpu) when cpu_layers[i], else on the tower's table. cpu_layers NULL is
 * ts_towers_init_seq. Errors as ts_towers_init_seq. */
int ts_towers_init_seq_split(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n,
                             const ts_layer_spec_t *specs, size_t nspecs, ts_layer_shape_t input,
                             const bool *cpu_layers, size_t capacity, ts_towers_release_cb release,
                             char *errmsg, size_t errlen);

/* Dropout masks for the next step: every tower draws its own stream of (step, worker,
 * tower), so the towers and workers of one step never share a mask and a run repeats. A
 * no-op for an MLP. */
void ts_towers_set_dropout(ts_towers_t *tw, uint64_t seed, uint64_t step, uint64_t worker);

/* A one-tower view of a model the caller built and keeps (ts_towers_destroy leaves it). */
int ts_towers_wrap(ts_towers_t *tw, ts_model_t *model, char *errmsg, size_t errlen);

/* Free everything, then release the tables (see Ownership); zero *tw. Safe on a zeroed one. */
void ts_towers_destroy(ts_towers_t *tw);

/* Per tensor of models[0] (num_tensors entries): the host memory a pull writes into and a
 * push reads from. */
float *const *ts_towers_pull_targets(const ts_towers_t *tw);
const float *const *ts_towers_push_sources(const ts_towers_t *tw);

/* Host memory for the worker's batches, from tower 0's back end (pinned for a GPU), freed
 * with ts_towers_host_free (which first waits for the towers' queued copies). Returns 0 or
 * TS_ENOMEM. */
int ts_towers_host_alloc(const ts_towers_t *tw, size_t bytes, void **out);
void ts_towers_host_free(const ts_towers_t *tw, void *p);

/* Split a host batch (x: batch x dim floats, labels: batch) over the towers and start the
 * copies to their devices (see ts_model_load_batch). Returns 0, or TS_EINVAL (batch not a
 * multiple of the towers, above a tower's capacity, a label out of range) or a back end
 * error, with errmsg. */
int ts_towers_load(ts_towers_t *tw, const float *x, const int32_t *labels, size_t batch, size_t dim,
                   char *errmsg, size_t errlen);

/* After a pull has filled the pull targets: start the copies of the parameters to every
 * tower. Returns 0 or a back end error with errmsg. */
int ts_towers_pulled(ts_towers_t *tw, char *errmsg, size_t errlen);

/* Forward and backward on every tower's loaded micro-batch, then the average of the
 * gradients into the push sources. *loss (may be NULL) = the mean loss over the batch.
 * Returns 0, or the first tower's error (errmsg names the tower and carries the back end's
 * last_error). */
int ts_towers_step(ts_towers_t *tw, float *loss, char *errmsg, size_t errlen);

/* "none", "host", "device", "nccl", "pinned". */
const char *ts_towers_reduce_name(ts_towers_reduce_t r);

#endif
