/*
 * The model's facade (ts_model.h): the checks every engine shares, then one call through
 * the engine's table (ts_model_int.h). What is the same for every engine is done here once:
 * initialising the tensors from the seed, finding a tensor, a training step as load + compute.
 */
#include "ts_model.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_model_int.h"

bool ts_model_parse_activation(const char *s, ts_activation_t *out) {
  if (!s || !out) return false;
  if (strcmp(s, "relu") == 0) {
    *out = TS_ACT_RELU;
    return true;
  }
  if (strcmp(s, "tanh") == 0) {
    *out = TS_ACT_TANH;
    return true;
  }
  return false;
}

const char *ts_model_activation_name(ts_activation_t act) {
  switch (act) {
    case TS_ACT_RELU:
      return "relu";
    case TS_ACT_TANH:
      return "tanh";
  }
  return "unknown";
}

static bool built(const ts_model_t *m) {
  return m && m->engine;
}

/* [offset, offset + count) lies in the flat layout, and memory is there for a count. */
static bool range_ok(const ts_model_t *m, size_t offset, const void *p, size_t count) {
  return built(m) && (p || count == 0) && offset <= m->param_count &&
         count <= m->param_count - offset;
}

static bool batch_ok(const ts_model_t *m, size_t batch) {
  return built(m) && batch >= 1 && batch <= m->batch_capacity;
}

void ts_model_adopt(ts_model_t *model, const ts_model_engine_t *engine, void *impl,
                    const ts_kernels_t *kernels, size_t batch_capacity) {
  ts_require(model && engine && impl);
  model->engine = engine;
  model->impl = impl;
  model->kernels = kernels;
  model->batch_capacity = batch_capacity;
}

void ts_model_destroy(ts_model_t *model) {
  if (!model) return;
  if (model->engine) model->engine->destroy(model->impl);
  memset(model, 0, sizeof *model);
}

const char *ts_model_engine_name(const ts_model_t *model) {
  return built(model) ? model->engine->name : "";
}

bool ts_model_is_split(const ts_model_t *model) {
  return built(model) && model->engine->is_split && model->engine->is_split(model->impl);
}

int ts_model_synchronize(const ts_model_t *model) {
  return built(model) ? model->engine->synchronize(model->impl) : 0;
}

void ts_model_set_dropout(ts_model_t *model, uint64_t seed, uint64_t stream) {
  if (built(model) && model->engine->set_training)
    model->engine->set_training(model->impl, true, seed, stream);
}

/* --- parameters ---------------------------------------------------------------------------- */

int ts_model_set_params(ts_model_t *model, size_t offset, const float *src, size_t count) {
  if (!range_ok(model, offset, src, count)) return TS_EINVAL;
  return count ? model->engine->set_params(model->impl, offset, src, count) : 0;
}

int ts_model_get_params(const ts_model_t *model, size_t offset, float *dst, size_t count) {
  if (!range_ok(model, offset, dst, count)) return TS_EINVAL;
  return count ? model->engine->get_params(model->impl, offset, dst, count) : 0;
}

int ts_model_get_grads(const ts_model_t *model, size_t offset, float *dst, size_t count) {
  if (!range_ok(model, offset, dst, count)) return TS_EINVAL;
  return count ? model->engine->get_grads(model->impl, offset, dst, count) : 0;
}

int ts_model_init_params(ts_model_t *model, uint64_t seed) {
  if (!built(model)) return TS_EINVAL;
  /* Initialise on the host, tensor by tensor, and copy each to the device: the largest
   * tensor bounds the staging buffer. */
  size_t largest = 1;
  for (size_t t = 0; t < model->num_tensors; t++)
    if (model->tensors[t].count > largest) largest = model->tensors[t].count;
  float *host = ts_malloc(largest * sizeof(float));
  if (!host) return TS_ENOMEM;
  int rc = 0;
  for (size_t t = 0; t < model->num_tensors && rc == 0; t++) {
    const ts_model_tensor_t *tn = &model->tensors[t];
    ts_init_fill(host, tn->init, seed, tn->name, tn->shape, tn->rank, 0, tn->count);
    rc = ts_model_set_params(model, tn->offset, host, tn->count);
    /* The staging buffer is refilled for the next tensor: a back end that copies
     * asynchronously must be done with it first. */
    if (rc == 0) rc = ts_model_synchronize(model);
  }
  ts_free(host);
  return rc;
}

long ts_model_find_tensor(const ts_model_t *model, const char *name) {
  if (!model || !name) return -1;
  for (size_t t = 0; t < model->num_tensors; t++)
    if (strcmp(model->tensors[t].name, name) == 0) return (long)t;
  return -1;
}

/* --- computing ----------------------------------------------------------------------------- */

int ts_model_load_batch(ts_model_t *model, const float *x, const int32_t *labels, size_t batch) {
  if (!batch_ok(model, batch) || !x || !labels) return TS_EINVAL;
  return model->engine->load_batch(model->impl, x, labels, batch);
}

int ts_model_compute(ts_model_t *model, size_t batch, float *loss) {
  if (!batch_ok(model, batch)) return TS_EINVAL;
  return model->engine->compute(model->impl, batch, loss);
}

int ts_model_last_correct(const ts_model_t *model, size_t *correct) {
  if (!built(model) || !correct) return TS_EINVAL;
  return model->engine->last_correct(model->impl, correct);
}

int ts_model_forward_backward(ts_model_t *model, const float *x, const int32_t *labels,
                              size_t batch, float *loss) {
  int rc = ts_model_load_batch(model, x, labels, batch);
  if (rc < 0) return rc;
  return ts_model_compute(model, batch, loss);
}

int ts_model_evaluate(ts_model_t *model, const float *x, const int32_t *labels, size_t n,
                      float *accuracy, float *loss) {
  if (!built(model) || !x || !labels || n < 1) return TS_EINVAL;
  return model->engine->evaluate(model->impl, x, labels, n, accuracy, loss);
}
