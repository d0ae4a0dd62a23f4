/*
 * The sequential-network engine (ts_model.h): a model of a layer list run by ts_seq
 * (worker/ts_seq.h), one segment or several. This file only adapts: the engine's state is
 * the network itself, its tensor list is the model's, and each function of the engine's
 * table is the network's own.
 *
 * Ownership: the network (ts_seq_t) is ts_calloc'd by the init; seq_destroy frees what it
 * holds (ts_seq_destroy) and then the struct.
 */
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_model.h"
#include "ts_model_int.h"
#include "ts_seq.h"

static void seq_destroy(void *impl) {
  ts_seq_destroy(impl);
  ts_free(impl);
}

static int seq_set_params(void *impl, size_t offset, const float *src, size_t count) {
  return ts_seq_set_params(impl, offset, src, count);
}

static int seq_get_params(const void *impl, size_t offset, float *dst, size_t count) {
  return ts_seq_get_params(impl, offset, dst, count);
}

static int seq_get_grads(const void *impl, size_t offset, float *dst, size_t count) {
  return ts_seq_get_grads(impl, offset, dst, count);
}

static int seq_load_batch(void *impl, const float *x, const int32_t *labels, size_t batch) {
  return ts_seq_load_batch(impl, x, labels, batch);
}

static int seq_compute(void *impl, size_t batch, float *loss) {
  return ts_seq_compute(impl, batch, loss);
}

static int seq_last_correct(const void *impl, size_t *correct) {
  *correct = ((const ts_seq_t *)impl)->last_correct;
  return 0;
}

static int seq_evaluate(void *impl, const float *x, const int32_t *labels, size_t n,
                        float *accuracy, float *loss) {
  return ts_seq_evaluate(impl, x, labels, n, accuracy, loss);
}

static int seq_synchronize(const void *impl) {
  return ts_seq_synchronize(impl);
}

static void seq_set_training(void *impl, bool on, uint64_t seed, uint64_t stream) {
  ts_seq_set_training(impl, on, seed, stream);
}

static bool seq_is_split(const void *impl) {
  return ((const ts_seq_t *)impl)->num_segments > 1;
}

static const ts_model_engine_t seq_engine = {
    .name = "layers",
    .set_params = seq_set_params,
    .get_params = seq_get_params,
    .get_grads = seq_get_grads,
    .load_batch = seq_load_batch,
    .compute = seq_compute,
    .last_correct = seq_last_correct,
    .evaluate = seq_evaluate,
    .synchronize = seq_synchronize,
    .set_training = seq_set_training,
    .is_split = seq_is_split,
    .destroy = seq_destroy,
};

int ts_model_init_seq(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                      ts_layer_shape_t input, size_t batch_capacity, const ts_kernels_t *kernels,
                      char *errmsg, size_t errlen) {
  return ts_model_init_seq_split(model, specs, n, input, batch_capacity, kernels, NULL, errmsg,
                                 errlen);
}

int ts_model_init_seq_split(ts_model_t *model, const ts_layer_spec_t *specs, size_t n,
                            ts_layer_shape_t input, size_t batch_capacity,
                            const ts_kernels_t *kernels, const ts_kernels_t *const *layer_kernels,
                            char *errmsg, size_t errlen) {
  if (!model) return TS_EINVAL;
  memset(model, 0, sizeof *model);
  ts_seq_t *seq = ts_calloc(1, sizeof *seq);
  if (!seq) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "model: out of memory");
    return TS_ENOMEM;
  }
  int rc =
      layer_kernels
          ? ts_seq_init_split(seq, specs, n, input, batch_capacity, layer_kernels, errmsg, errlen)
          : ts_seq_init(seq, specs, n, input, batch_capacity, kernels, errmsg, errlen);
  if (rc < 0) {
    ts_free(seq);
    return rc;
  }
  /* seq is the model's now */
  ts_model_adopt(model, &seq_engine, seq, kernels ? kernels : seq->kernels, batch_capacity);
  model->tensors = seq->desc.tensors;
  model->num_tensors = seq->desc.num_tensors;
  model->param_count = seq->desc.param_count;
  model->params = seq->params;
  model->grads = seq->grads;
  return 0;
}
