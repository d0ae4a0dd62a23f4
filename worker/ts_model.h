/*
 * The model: a multi-layer perceptron as a list of ops over the kernels interface
 * (docs/architecture.md).
 *
 * Glossary.
 *   layers     widths [in, h1, ..., out]: n widths make n - 1 fully connected layers
 *              fc1..fc{n-1}. [in, out] is logistic regression (no hidden layer).
 *   tensor     a parameter: "fcK/weights" of shape [width[K-1], width[K]] (Glorot uniform)
 *              and "fcK/biases" of shape [width[K]] (zeros), in that order, fc1 first. This
 *              list is what the worker declares to the parameter servers.
 *   op         one step of the computation, named like TensorFlow's ("fc1/matmul", type
 *              "MatMul"), on which device placement works and logs one line.
 *   params     one flat device buffer holding every tensor, tensor after tensor in list
 *              order (tensor t at params + tensors[t].offset, tensors[t].count elements),
 *              so a pull or a push of a tensor or partition is one contiguous range.
 *   grads      a flat device buffer with exactly the layout of params.
 *
 * The forward pass of layer K is z = a W + b, then a' = activation(z) for hidden layers;
 * the last layer's z are the logits of softmax cross-entropy. Loss and gradients are means
 * over the batch.
 *
 * Ownership: the caller owns the ts_model_t struct; ts_model_init fills it and allocates
 * everything it points to, ts_model_destroy frees that. The kernels table must outlive the
 * model. Host pointers passed in (x, labels) are read during the call only. Not
 * thread-safe: one model per thread (one per tower).
 */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config.h" /* ts_activation_t */
#include "ts_init.h"
#include "ts_kernels.h"
#include "ts_seq.h"

#define TS_MODEL_MAX_LAYERS TS_CONFIG_MAX_LAYERS /* widths, input and output included */
#define TS_MODEL_NAME_MAX 64
#define TS_MODEL_MAX_WIDTH (1 << 20) /* one layer's width; keeps every size far from overflow */

typedef struct {
  char name[TS_MODEL_NAME_MAX]; /* "fc1/weights" */
  uint64_t shape[4]; /* [in, out] for weights, [out] for biases; a conv kernel [kh, kw, in, out] */
  size_t rank;       /* 2 or 1; 4 for a convolution's kernel */
  size_t count;      /* elements: the product of the shape */
  size_t offset;     /* elements from the start of params / grads */
  ts_init_kind_t init; /* TS_INIT_GLOROT_UNIFORM for weights, TS_INIT_ZEROS biases */
} ts_model_tensor_t;

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

typedef struct {
  /* Public, read-only after init. */
  size_t num_widths; /* n: layers count is n - 1 */
  int widths[TS_MODEL_MAX_LAYERS];
  ts_activation_t activation;
  size_t batch_capacity; /* largest batch a call may pass */
  const ts_kernels_t *kernels;

  ts_model_tensor_t *tensors; /* 2 * (n - 1) tensors, fc1/weights, fc1/biases, fc2/... */
  size_t num_tensors;
  size_t param_count; /* elements of params (and of grads) */
  float *params;      /* device buffer, param_count floats */
  float *grads;       /* device buffer, param_count floats */

  ts_model_op_t *ops; /* forward ops in order, then backward ops, then evaluation ops */
  size_t num_ops;

  /* A model built by ts_model_init_net runs this network (owned, ts_malloc'd): tensors,
   * params and grads are the net's, widths and ops are empty, and the scratch below unused. */
  ts_seq_t *net;

  /* Private: device scratch, one per layer output, sized for batch_capacity. */
  float *x;        /* input batch: batch_capacity x widths[0] */
  int32_t *labels; /* batch_capacity labels */
  float **z;       /* z[K], K = 1..L: pre-activations (z[L] are the logits) */
  float **a;       /* a[K], K = 1..L-1: activations of hidden layers */
  float *probs;    /* softmax of the logits */
  float *g0, *g1;  /* gradient scratch, batch_capacity x the widest layer each */
} ts_model_t;

/* "relu" / "tanh" <-> ts_activation_t. parse returns false for an unknown name. */
bool ts_model_parse_activation(const char *s, ts_activation_t *out);
const char *ts_model_activation_name(ts_activation_t act);

/* Build the model: widths[0..n) (2 <= n <= TS_MODEL_MAX_LAYERS, each in
 * 1..TS_MODEL_MAX_WIDTH), the hidden activation, the largest batch (>= 1) and the back end.
 * Parameters are allocated but NOT initialised: call ts_model_init_params, or fill params
 * from a pull. On failure nothing is left allocated, *model is zeroed and errmsg (errlen
 * bytes, may be NULL) says why. Returns 0, TS_EINVAL (a bad width, count, activation or
 * batch), TS_ENOMEM, or an error of kernels->alloc. */
int ts_model_init(ts_model_t *model, const int *widths, size_t n, ts_activation_t activation,
                  size_t batch_capacity, const ts_kernels_t *kernels, char *errmsg, size_t errlen);

/* Build the model as a network of layers (worker/ts_layers.h) instead of widths: the same
 * tensors / params / grads interface, so the towers, the trainer and the declaration to the
 * shards need not know which it is. Errors as ts_seq_init (TS_EINVAL names the layer). */
int ts_model_init_net(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                      ts_layer_shape_t input, size_t batch_capacity, const ts_kernels_t *kernels,
                      char *errmsg, size_t errlen);

/* ts_model_init_net with layer i on layer_kernels[i] (ts_seq_init_split): a model split over
 * devices. kernels (may be NULL: the first layer's) is the table the model reports as its
 * own (the tower's). params and grads are NULL when the layers are on more than one table:
 * the copies below (ts_model_set_params ...) reach every segment's slice of the layout. */
int ts_model_init_net_split(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                            ts_layer_shape_t input, size_t batch_capacity,
                            const ts_kernels_t *kernels, const ts_kernels_t *const *layer_kernels,
                            char *errmsg, size_t errlen);

/* Whether the model's layers run on more than one kernels table. */
bool ts_model_is_split(const ts_model_t *model);

/* Wait for the queued work of every table the model runs on. */
int ts_model_synchronize(const ts_model_t *model);

/* Training-mode dropout for the next steps: the mask's seed and stream (ts_seq_set_training).
 * A no-op for an MLP, which has no dropout. */
void ts_model_set_dropout(ts_model_t *model, uint64_t seed, uint64_t stream);

/* The op list a model of these widths and activation has (the ops of ts_model_t, in the
 * same order), without allocating anything on a device: device placement runs on it before
 * the back end is chosen. *ops is ts_malloc'd (the caller ts_frees it). Returns 0, TS_EINVAL
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

/* Free everything ts_model_init allocated and zero *model. Safe on a zeroed struct. */
void ts_model_destroy(ts_model_t *model);

/* Initialise every parameter as the parameter servers do (ts_init_fill with seed and the
 * tensor's name and init kind), so a local run starts where a cluster run starts. Returns 0,
 * TS_ENOMEM or a copy error. */
int ts_model_init_params(ts_model_t *model, uint64_t seed);

/* Copy count elements at element offset between host memory and params / grads (bounds are
 * checked: TS_EINVAL when offset + count > param_count). For the worker's pull and push. */
int ts_model_set_params(ts_model_t *model, size_t offset, const float *src, size_t count);
int ts_model_get_params(const ts_model_t *model, size_t offset, float *dst, size_t count);
int ts_model_get_grads(const ts_model_t *model, size_t offset, float *dst, size_t count);

/* The index of the tensor called name, or -1. */
long ts_model_find_tensor(const ts_model_t *model, const char *name);

/* One training step's computation on a batch of host data: x is batch x widths[0] floats
 * (row-major), labels batch int32 values in [0, widths[n-1]). Overwrites grads with the
 * gradient of the mean loss and stores the mean loss in *loss (may be NULL). 1 <= batch <=
 * batch_capacity. Returns 0, TS_EINVAL (batch, NULL data, a label out of range: the
 * message names none, the caller knows its data) or a kernel's error. params are not
 * changed: the optimizer lives on the parameter server (or in the caller). */
int ts_model_forward_backward(ts_model_t *model, const float *x, const int32_t *labels,
                              size_t batch, float *loss);

/* ts_model_forward_backward in two halves, so a worker can start the batch's transfer to the
 * device before it waits for the network: load_batch checks the labels (TS_EINVAL) and
 * enqueues the copies of x and labels (read until the back end's next waiting call when they
 * are in k->host_alloc memory, during the call otherwise); compute then runs forward and
 * backward on the loaded batch of the same size. Errors as ts_model_forward_backward. */
int ts_model_load_batch(ts_model_t *model, const float *x, const int32_t *labels, size_t batch);
int ts_model_compute(ts_model_t *model, size_t batch, float *loss);

/* Evaluate on n host examples (any n >= 1) in chunks of batch_capacity: *accuracy = the
 * fraction whose argmax equals the label, *loss = mean softmax cross-entropy. Either output
 * may be NULL. Labels must be in range as above. Does not touch grads. */
int ts_model_evaluate(ts_model_t *model, const float *x, const int32_t *labels, size_t n,
                      float *accuracy, float *loss);

#endif
