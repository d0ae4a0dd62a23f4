/*
 * The model: one interface over the worker's model engines (docs/architecture.md). The
 * towers, the trainer and the declaration to the shards see only this; which engine runs
 * the model is chosen once, by the init function that builds it.
 *
 * Glossary.
 *   engine     what computes: the MLP of model.layers widths (ts_model_init: a list of ops,
 *              worker/ts_model_mlp.c) or a sequential network of a layer list
 *              (ts_model_init_seq: worker/ts_seq.h, through worker/ts_model_seq.c). An engine
 *              fills the public fields below and the function table of ts_model_int.h.
 *   tensor     a parameter as the worker declares it: a name, a shape, an initialiser. The
 *              MLP's are "fcK/weights" of shape [width[K-1], width[K]] (Glorot uniform) and
 *              "fcK/biases" of shape [width[K]] (zeros), fc1 first; a network's are its
 *              layers' (worker/ts_layers.h).
 *   params     the flat layout: every tensor, tensor after tensor in list order (tensor t at
 *              element tensors[t].offset, tensors[t].count elements), so a pull or a push of
 *              a tensor or partition is one contiguous range. grads has the same layout.
 *   op         one step of the MLP's computation, named like TensorFlow's ("fc1/matmul", type
 *              "MatMul"), on which device placement works and logs one line.
 *
 * The MLP's forward pass of layer K is z = a W + b, then a' = activation(z) for hidden
 * layers; the last layer's z are the logits of softmax cross-entropy. Loss and gradients are
 * means over the batch, for every engine.
 *
 * Ownership: the caller owns the ts_model_t struct; an init function fills it and allocates
 * everything it points to (the engine's state, the tensor and op lists, the device buffers),
 * ts_model_destroy frees all of that. A struct copy shares them (ts_towers_wrap borrows one
 * this way): destroy only one copy, once. The kernels tables must outlive the model. Host
 * pointers passed in (x, labels) are read during the call only, unless a call says
 * otherwise. Not thread-safe: one model per thread (one per tower).
 */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config.h" /* ts_activation_t */
#include "ts_init.h"
#include "ts_kernels.h"
#include "ts_layers.h"

#define TS_MODEL_MAX_LAYERS TS_CONFIG_MAX_LAYERS /* widths, input and output included */
#define TS_MODEL_NAME_MAX 64
#define TS_MODEL_MAX_WIDTH (1 << 20) /* one layer's width; keeps every size far from overflow */

/* A tensor of the model, for every engine: worker/ts_layers.h's description of a parameter
 * (its name, shape, rank, count, offset in the flat layout and init kind). An MLP's weights
 * are [in, out] (rank 2) and its biases [out] (rank 1). */
typedef ts_layer_tensor_t ts_model_tensor_t;

typedef enum {
  /* forward */
  TS_OP_MATMUL = 1,   /* z = a W            (MatMul) */
  TS_OP_BIAS_ADD,     /* z += b             (BiasAdd) */
  TS_OP_RELU,         /* a = relu(z)        (Relu) */
  TS_OP_TANH,         /* a = tanh(z)        (Tanh) */
  TS_OP_SOFTMAX_XENT, /* loss, probs        (SoftmaxCrossEntropyWithLogits) */
  TS_OP_ARGMAX,       /* correct count      (ArgMax), evaluation only */
  /* backward */
  TS_OP_XENT_GRAD,     /* dz = (p - y) / B   (SoftmaxCrossEntropyWithLogitsGrad) */
  TS_OP_MATMUL_GRAD_W, /* dW = a^T dz        (MatMul) */
  TS_OP_MATMUL_GRAD_X, /* da = dz W^T        (MatMul) */
  TS_OP_BIAS_ADD_GRAD, /* db = colsum(dz)    (BiasAddGrad) */
  TS_OP_RELU_GRAD,     /* dz = da * (a > 0)  (ReluGrad) */
  TS_OP_TANH_GRAD,     /* dz = da (1 - a^2)  (TanhGrad) */
} ts_op_kind_t;

typedef enum {
  TS_OP_PHASE_FORWARD = 1, /* run by forward_backward and evaluate */
  TS_OP_PHASE_BACKWARD,    /* run by forward_backward only */
  TS_OP_PHASE_EVAL,        /* run by evaluate only */
} ts_op_phase_t;

typedef struct {
  char name[TS_MODEL_NAME_MAX]; /* "fc1/matmul", "gradients/fc1/matmul_grad/MatMul" */
  const char *type;             /* TensorFlow's op type: "MatMul", "BiasAdd", ... (static) */
  ts_op_kind_t kind;
  ts_op_phase_t phase;
  size_t layer; /* 1-based fc layer; 0 for the loss and metric ops */
} ts_model_op_t;

/* The engine's function table (worker/ts_model_int.h: only the model's own files see it). */
typedef struct ts_model_engine ts_model_engine_t;

typedef struct {
  /* Public, read-only after init: what every engine fills in. */
  size_t batch_capacity;       /* largest batch a call may pass */
  const ts_kernels_t *kernels; /* the table the model reports as its own (the tower's) */
  ts_model_tensor_t *tensors;  /* num_tensors, in declaration (and layout) order */
  size_t num_tensors;
  size_t param_count;       /* elements of the flat layout (params and grads) */
  float *params;            /* device buffer, param_count floats; NULL when split over tables */
  float *grads;             /* device buffer, param_count floats; NULL when split over tables */
  const ts_model_op_t *ops; /* the MLP's ops: forward in order, then backward, then
                             * evaluation; NULL (and num_ops 0) for a network of layers */
  size_t num_ops;

  /* Private: the engine chosen at init and its state (both NULL in a zeroed struct). */
  const ts_model_engine_t *engine;
  void *impl;
} ts_model_t;

/* "relu" / "tanh" <-> ts_activation_t. parse returns false for an unknown name. */
bool ts_model_parse_activation(const char *s, ts_activation_t *out);
const char *ts_model_activation_name(ts_activation_t act);

/* --- building: one init per engine ----------------------------------------------------- */

/* The MLP engine: widths[0..n) (2 <= n <= TS_MODEL_MAX_LAYERS, each in
 * 1..TS_MODEL_MAX_WIDTH), the hidden activation, the largest batch (>= 1) and the back end.
 * Parameters are allocated but NOT initialised: call ts_model_init_params, or fill params
 * from a pull. On failure nothing is left allocated, *model is zeroed and errmsg (errlen
 * bytes, may be NULL) says why. Returns 0, TS_EINVAL (a bad width, count, activation or
 * batch; a back end without a kernel one of the ops needs), TS_ENOMEM, or an error of
 * kernels->alloc. */
int ts_model_init(ts_model_t *model, const int *widths, size_t n, ts_activation_t activation,
                  size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen);

/* The sequential-network engine: a network of layers (worker/ts_layers.h) instead of
 * widths, on an input of one example's shape. Errors as ts_seq_init (TS_EINVAL names the
 * layer). */
int ts_model_init_seq(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                      ts_layer_shape_t input, size_t batch_capacity, const ts_kernels_t *kernels,
                      char *errmsg, size_t errlen);

/* ts_model_init_seq with layer i on layer_kernels[i] (ts_seq_init_split): a model split over
 * devices. kernels (may be NULL: the first layer's) is the table the model reports as its
 * own (the tower's). params and grads are NULL when the layers are on more than one table:
 * the copies below (ts_model_set_params ...) reach every segment's slice of the layout. */
int ts_model_init_seq_split(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                            ts_layer_shape_t input, size_t batch_capacity,
                            const ts_kernels_t *kernels, const ts_kernels_t *const *layer_kernels,
                            char *errmsg, size_t errlen);

/* Free everything the init allocated and zero *model. Safe on a zeroed struct. */
void ts_model_destroy(ts_model_t *model);

/* --- the MLP's op list, before any model is built ---------------------------------------- */

/* The op list an MLP of these widths and activation has (the ops of ts_model_t, in the same
 * order), without allocating anything on a device: device placement runs on it before the
 * back end is chosen. *ops is ts_malloc'd (the caller ts_frees it). Returns 0, TS_EINVAL
 * (bad widths or activation, as ts_model_init) or TS_ENOMEM. */
int ts_model_ops(const int *widths, size_t n, ts_activation_t activation, ts_model_op_t **ops,
                 size_t *num_ops);

/* Whether back end k has the kernel op kind needs (the "no supported kernel" test of device
 * placement; ts_model_init refuses a back end that lacks one). */
bool ts_model_op_has_kernel(const ts_kernels_t *k, ts_op_kind_t kind);

/* Device memory ts_model_init allocates for these widths and batch capacity, in bytes, each
 * buffer counted whole (a back end may round each up a little). For out-of-memory messages
 * and capacity planning; 0 for invalid widths. */
size_t ts_model_device_bytes(const int *widths, size_t n, size_t batch_capacity);

/* --- any engine ---------------------------------------------------------------------------- */

/* What the engine is called in the worker's log: "mlp" or "layers" ("" for a zeroed model). */
const char *ts_model_engine_name(const ts_model_t *model);

/* Whether the model's layers run on more than one kernels table. */
bool ts_model_is_split(const ts_model_t *model);

/* Wait for the queued work of every table the model runs on. Returns 0 or the first
 * table's error; 0 for a zeroed model. */
int ts_model_synchronize(const ts_model_t *model);

/* Training-mode dropout for the next steps: the mask's seed and stream (ts_seq_set_training).
 * A no-op for an engine without dropout (the MLP). */
void ts_model_set_dropout(ts_model_t *model, uint64_t seed, uint64_t stream);

/* Initialise every parameter as the parameter servers do (ts_init_fill with seed and the
 * tensor's name, shape and init kind), so a local run starts where a cluster run starts.
 * Returns 0, TS_EINVAL (a zeroed model), TS_ENOMEM or a copy error. */
int ts_model_init_params(ts_model_t *model, uint64_t seed);

/* Copy count elements at element offset of the flat layout between host memory and params /
 * grads, whatever devices hold them (bounds are checked: TS_EINVAL when offset + count >
 * param_count, or for NULL memory with a count). For the worker's pull and push. */
int ts_model_set_params(ts_model_t *model, size_t offset, const float *src, size_t count);
int ts_model_get_params(const ts_model_t *model, size_t offset, float *dst, size_t count);
int ts_model_get_grads(const ts_model_t *model, size_t offset, float *dst, size_t count);

/* The index of the tensor called name, or -1. */
long ts_model_find_tensor(const ts_model_t *model, const char *name);

/* One training step's computation on a batch of host data: x is batch examples of the
 * input (the MLP: widths[0] floats each, row-major; a network: its input shape, NHWC),
 * labels batch int32 values in [0, classes). Overwrites grads with the gradient of the mean
 * loss and stores the mean loss in *loss (may be NULL). 1 <= batch <= batch_capacity.
 * Returns 0, TS_EINVAL (batch, NULL data, a label out of range: the message names none, the
 * caller knows its data) or a kernel's error. params are not changed: the optimizer lives on
 * the parameter server (or in the caller). */
int ts_model_forward_backward(ts_model_t *model, const float *x, const int32_t *labels,
                              size_t batch, float *loss);

/* ts_model_forward_backward in two halves, so a worker can start the batch's transfer to the
 * device before it waits for the network: load_batch checks the labels (TS_EINVAL) and
 * enqueues the copies of x and labels (read until the back end's next waiting call when they
 * are in k->host_alloc memory, during the call otherwise); compute then runs forward and
 * backward on the loaded batch of the same size. Errors as ts_model_forward_backward. */
int ts_model_load_batch(ts_model_t *model, const float *x, const int32_t *labels, size_t batch);
int ts_model_compute(ts_model_t *model, size_t batch, float *loss);

/* How many examples of the last ts_model_compute's batch the model classified right (the
 * argmax of their logits, before the update, was their label): a training accuracy. 0 with
 * *correct = 0 before any compute. */
int ts_model_last_correct(const ts_model_t *model, size_t *correct);

/* Evaluate on n host examples (any n >= 1) in chunks of batch_capacity, dropout off:
 * *accuracy = the fraction whose argmax equals the label, *loss = mean softmax
 * cross-entropy. Either output may be NULL. Labels must be in range as above. Does not touch
 * grads. */
int ts_model_evaluate(ts_model_t *model, const float *x, const int32_t *labels, size_t n,
                      float *accuracy, float *loss);

#endif
