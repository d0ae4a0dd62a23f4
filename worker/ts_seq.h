/*
 * A sequential network (worker/ts_layers.h) run over the kernels interface: forward,
 * backward, the softmax cross-entropy loss and evaluation, for any layer list the
 * description accepts (convolutions, pooling, dense layers, dropout).
 *
 * Layout. Every parameter lives in one flat device buffer, params, tensor after tensor in
 * the order of the description's tensor list (tensor t at params + tensors[t].offset); grads
 * has the same layout. So a pull or a push of a tensor is one contiguous range, as in
 * ts_model.h. Activations are NHWC, one example after another; a flatten layer only
 * reinterprets its input.
 *
 * Dropout. In training (ts_seq_set_training with on = true) a dropout layer of rate r keeps
 * each unit with probability 1 - r and scales it by 1 / (1 - r), as Keras does; elsewhere
 * (evaluation, and training off) it passes its input on. Its mask is drawn on the host from
 * ts_init's counter-based generator: element i of the batch's mask of layer NAME keeps when
 * ts_init_uniform(ts_init_key(seed, NAME) ^ mix(stream), i) >= r. The caller sets seed and
 * stream (the step, and which worker and tower) with ts_seq_set_training, so a run repeats
 * exactly, and every back end applies the same mask (it is copied to the device and applied
 * with k->mul both ways).
 *
 * Segments (TensorFlow's `with tf.device()` scopes over one model). A network built by
 * ts_seq_init_split runs each layer on its own kernels table; consecutive layers on one table
 * form a SEGMENT, which owns everything of its layers on its device: its slice of params and
 * grads (the tensors of its layers, which are contiguous in the flat layout), their
 * activations, its gradient scratch and convolution workspace. At a boundary the forward pass
 * copies the activation device -> host -> device (the first table's copy_to_host into host
 * staging, k->host_alloc of the non-host side, then the second's copy_to_device), and the
 * backward pass copies the gradient with respect to that activation back the other way. The
 * batch is loaded into the first segment, the labels and the loss live on the last. The
 * result is the unsplit network's, up to the order of float operations the back ends choose
 * (the CPU back end twice gives the same bits). The flat layout stays the interface: the
 * ts_seq_set_params / ts_seq_get_params / ts_seq_get_grads copies take ranges of it and reach
 * each segment's slice; params and grads below are the buffers themselves only when there is
 * one segment (NULL in a split network).
 *
 * Ownership: the caller owns the ts_seq_t struct; ts_seq_init fills it and allocates
 * everything it points to, ts_seq_destroy frees that. The kernels tables must outlive the
 * network. Host pointers passed in are read during the call only. Not thread-safe: one
 * network per thread.
 */
#ifndef TS_SEQ_H
#define TS_SEQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_kernels.h"
#include "ts_layers.h"

#define TS_SEQ_SEGMENTS_MAX 8

typedef struct {
  /* Public, read-only after init. */
  const ts_kernels_t *kernels;
  size_t first, end;                /* its layers: [first, end) */
  size_t param_offset, param_count; /* its range of the flat layout */
  float *params, *grads;            /* device, param_count floats each */

  /* Private. */
  float *x;       /* the input of layer first: the batch, or the previous segment's copy */
  float *g0, *g1; /* gradient scratch, batch_capacity x the largest activation each */
  void *ws;       /* convolution workspace of its layers */
  size_t ws_bytes;
  float *mask_host;                  /* host staging of one dropout mask (k->host_alloc) */
  float *stage;                      /* host staging of the boundary into this segment (s > 0) */
  const ts_kernels_t *stage_kernels; /* the table stage came from */
} ts_seq_segment_t;

typedef struct {
  /* Public, read-only after init. */
  ts_layers_t desc; /* the checked description: layers, shapes, tensors */
  size_t batch_capacity;
  const ts_kernels_t *kernels; /* the first segment's table */
  float *params;               /* device, desc.param_count floats; NULL when split */
  float *grads;                /* device, desc.param_count floats; NULL when split */
  ts_seq_segment_t seg[TS_SEQ_SEGMENTS_MAX];
  size_t num_segments;

  /* Private. */
  bool training;
  uint64_t seed, stream;
  size_t *seg_of;   /* per layer: its segment */
  int32_t *labels;  /* batch_capacity, on the last segment */
  float **z;        /* per layer: output before the activation (NULL for flatten, and for a
                     * conv or dense ReLU layer on fused kernels: see ts_seq.c) */
  float **a;        /* per layer: output after a non-linear activation (else NULL) */
  int32_t **argmax; /* per max_pool layer */
  float **mask;     /* per dropout layer: device mask */
  float *probs;     /* softmax of the logits, on the last segment */
  size_t last_correct; /* of the last ts_seq_compute's batch (argmax of the logits = label) */
  float *input_grad; /* after a backward pass with want_input_grad: d input, on the first
                      * segment (one of its scratch buffers) */

  /* Public, set by the caller after init: the backward pass also computes the gradient
   * with respect to the input batch (an embedding's rows feed the network). */
  bool want_input_grad;
} ts_seq_t;

/* Check the description (ts_layers_check) and build the network for batches of up to
 * batch_capacity examples on kernels. Parameters are allocated, not initialised (call
 * ts_seq_init_params or fill params). Training mode starts off. Returns 0, TS_EINVAL with
 * errmsg (the description's error, a batch capacity outside 1..TS_CONV_MAX_BATCH, a back end
 * without a kernel a layer needs), TS_ENOMEM, or the back end's alloc error. On failure
 * nothing is left allocated and *seq is zeroed. */
int ts_seq_init(ts_seq_t *seq, const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen);

/* ts_seq_init with layer i on layer_kernels[i] (n entries, one per spec): consecutive layers
 * on one table make a segment (above), at most TS_SEQ_SEGMENTS_MAX of them. One table for
 * every layer builds what ts_seq_init builds. Errors as ts_seq_init; TS_EINVAL also for too
 * many segments or a NULL table. */
int ts_seq_init_split(ts_seq_t *seq, const ts_layer_spec_t *specs, size_t n, ts_layer_shape_t input,
                      size_t batch_capacity, const ts_kernels_t *const *layer_kernels, char *errmsg,
                      size_t errlen);

/* Free everything ts_seq_init allocated and zero *seq. Safe on a zeroed struct. */
void ts_seq_destroy(ts_seq_t *seq);

/* Copies of count elements at element offset of the flat layout between host memory and the
 * parameters / gradients, whatever segments the range spans (each part through its
 * segment's table). Returns 0, TS_EINVAL (out of range, NULL) or a copy error. */
int ts_seq_set_params(ts_seq_t *seq, size_t offset, const float *src, size_t count);
int ts_seq_get_params(const ts_seq_t *seq, size_t offset, float *dst, size_t count);
int ts_seq_get_grads(const ts_seq_t *seq, size_t offset, float *dst, size_t count);

/* Wait for the queued work of every segment's table. */
int ts_seq_synchronize(const ts_seq_t *seq);

/* Initialise every tensor as the parameter servers do (ts_init_fill with seed, its name,
 * shape and kind). Returns 0, TS_ENOMEM or a copy error. */
int ts_seq_init_params(ts_seq_t *seq, uint64_t seed);

/* Dropout on (training) or off, and the mask's seed and stream (see above). */
void ts_seq_set_training(ts_seq_t *seq, bool on, uint64_t seed, uint64_t stream);

/* Forward and backward on host data: x is batch examples of the input shape (NHWC), labels
 * batch int32 values in [0, classes). Overwrites grads with the gradient of the mean loss,
 * *loss (may be NULL) = the mean loss. 1 <= batch <= batch_capacity. Returns 0, TS_EINVAL (a
 * bad batch, NULL data, a label out of range) or a kernel's error. */
int ts_seq_forward_backward(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch,
                            float *loss);

/* ts_seq_forward_backward in two halves, as ts_model_load_batch / ts_model_compute: load
 * checks the batch and labels (TS_EINVAL) and copies them to the device; compute runs forward
 * and backward on the loaded batch of the same size. */
int ts_seq_load_batch(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch);
int ts_seq_compute(ts_seq_t *seq, size_t batch, float *loss);

/* The kernel of back end k that a layer of this spec lacks ("conv2d", "maxpool", "relu", ...),
 * or NULL when k has all it needs: device placement asks it of a GPU's op table. */
const char *ts_seq_layer_kernel_missing(const ts_kernels_t *k, const ts_layer_spec_t *spec);

/* The forward pass and the loss only (in the current training mode, with the same masks as
 * ts_seq_forward_backward would draw): for gradient checks. */
int ts_seq_loss(ts_seq_t *seq, const float *x, const int32_t *labels, size_t batch, float *loss);

/* Evaluate n >= 1 examples in chunks of batch_capacity, dropout off: *accuracy (the fraction
 * whose argmax is the label) and *loss (mean), either may be NULL. Does not touch grads. */
int ts_seq_evaluate(ts_seq_t *seq, const float *x, const int32_t *labels, size_t n, float *accuracy,
                    float *loss);

/* After ts_seq_forward_backward (or ts_seq_compute) with want_input_grad set: the
 * gradient of the mean loss with respect to the batch's input, batch x the input's elements,
 * into host dst. Returns 0, TS_EINVAL (want_input_grad unset, no backward pass yet, a bad
 * batch) or a copy error. */
int ts_seq_input_grad(const ts_seq_t *seq, float *dst, size_t batch);

/* The softmax of the last forward pass's logits (ts_seq_loss, ts_seq_forward_backward),
 * batch x classes, into host dst. Returns 0, TS_EINVAL or a copy error. */
int ts_seq_probs(const ts_seq_t *seq, float *dst, size_t batch);

#endif
