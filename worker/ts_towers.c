/*
 * Towers. The per-step order, chosen so that transfers overlap the network where the order
 * allows: the trainer loads the batch (copies queued on each tower's stream) BEFORE it pulls,
 * so the input transfer runs while the worker waits for the shards; the pulled parameters
 * follow on the same streams; compute waits on nothing but its stream. Pinned staging keeps
 * every copy asynchronous and at full PCIe speed.
 */
#include "ts_towers.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_init.h"
#include "ts_log.h"

int ts_towers_split(size_t batch, size_t towers, size_t t, size_t *offset, size_t *count) {
  if (towers == 0 || t >= towers || batch == 0 || batch % towers != 0) return TS_EINVAL;
  size_t micro = batch / towers;
  if (offset) *offset = t * micro;
  if (count) *count = micro;
  return 0;
}

const char *ts_towers_reduce_name(ts_towers_reduce_t r) {
  switch (r) {
    case TS_TOWERS_REDUCE_NONE:
      return "none";
    case TS_TOWERS_REDUCE_HOST:
      return "host";
    case TS_TOWERS_REDUCE_DEVICE:
      return "device";
    case TS_TOWERS_REDUCE_NCCL:
      return "nccl";
    case TS_TOWERS_REDUCE_PINNED:
      return "pinned";
  }
  return "unknown";
}

/* "tower 1 (cuda /gpu:0)" */
static void tower_name(const ts_towers_t *tw, size_t t, char *buf, size_t n) {
  const ts_kernels_t *k = tw->kernels[t];
  snprintf(buf, n, "tower %zu (%s, /%s:%d)", t, k->name,
           strcmp(k->device_type, "GPU") == 0 ? "gpu" : "cpu", k->device_index);
}

/* Kernel failure: the code's text, and the back end's detail when it has one. */
static void kernel_error(const ts_towers_t *tw, size_t t, const char *what, int rc, char *errmsg,
                         size_t errlen) {
  char name[96];
  tower_name(tw, t, name, sizeof name);
  const ts_kernels_t *k = tw->kernels[t];
  const char *detail = k->last_error ? k->last_error(k) : "";
  ts_errmsg_printf(errmsg, errlen, "%s: %s: %s%s%s", name, what, ts_strerror(rc),
                   detail[0] ? ": " : "", detail);
}

static bool same_gpu(const ts_kernels_t *a, const ts_kernels_t *b) {
  return !a->device_is_host && !b->device_is_host && strcmp(a->name, b->name) == 0 &&
         a->device_index == b->device_index;
}

/* Per-tensor pointers into base (params layout of models[0]). */
static int make_tensor_views(ts_towers_t *tw, float *pull_base, const float *push_base) {
  const ts_model_t *m = &tw->models[0];
  tw->pull_dst = ts_calloc(m->num_tensors, sizeof *tw->pull_dst);
  tw->push_src = ts_calloc(m->num_tensors, sizeof *tw->push_src);
  if (!tw->pull_dst || !tw->push_src) return TS_ENOMEM;
  for (size_t i = 0; i < m->num_tensors; i++) {
    tw->pull_dst[i] = pull_base + m->tensors[i].offset;
    tw->push_src[i] = push_base + m->tensors[i].offset;
  }
  return 0;
}

static int alloc_common(ts_towers_t *tw, size_t n) {
  tw->models = ts_calloc(n, sizeof *tw->models);
  tw->kernels = ts_calloc(n, sizeof *tw->kernels);
  tw->tower_loss = ts_calloc(n, sizeof *tw->tower_loss);
  tw->tower_correct = ts_calloc(n, sizeof *tw->tower_correct);
  tw->tower_rc = ts_calloc(n, sizeof *tw->tower_rc);
  return tw->models && tw->kernels && tw->tower_loss && tw->tower_correct && tw->tower_rc
             ? 0
             : TS_ENOMEM;
}

int ts_towers_wrap(ts_towers_t *tw, ts_model_t *model, char *errmsg, size_t errlen) {
  if (!tw) return TS_EINVAL;
  memset(tw, 0, sizeof *tw);
  if (!model || !model->kernels || !model->engine) {
    ts_errmsg_printf(errmsg, errlen, "towers: no model");
    return TS_EINVAL;
  }
  if (alloc_common(tw, 1) < 0) goto nomem;
  tw->n = 1;
  tw->borrowed_model = true;
  tw->models[0] = *model; /* a shallow copy: the buffers stay the caller's */
  tw->kernels[0] = model->kernels;
  tw->zero_copy = model->kernels->device_is_host && !ts_model_is_split(model);
  if (!tw->zero_copy) {
    void *p = NULL;
    tw->stage_grads = ts_calloc(1, sizeof *tw->stage_grads);
    if (!tw->stage_grads) goto nomem;
    if (model->kernels->host_alloc(model->kernels, model->param_count * sizeof(float), &p) < 0)
      goto nomem;
    tw->stage_params = p;
    if (model->kernels->host_alloc(model->kernels, model->param_count * sizeof(float), &p) < 0)
      goto nomem;
    tw->stage_grads[0] = p;
  }
  if (make_tensor_views(tw, tw->zero_copy ? model->params : tw->stage_params,
                        tw->zero_copy ? model->grads : tw->stage_grads[0]) < 0)
    goto nomem;
  return 0;
nomem:
  ts_towers_destroy(tw);
  ts_errmsg_printf(errmsg, errlen, "towers: out of host memory");
  return TS_ENOMEM;
}

/* Pinned host buffers: the pull lands in stage_params; gradients are pushed from
 * stage_grads[0] (and, averaged through pinned memory, each tower's lands in its own). */
static int alloc_staging(ts_towers_t *tw, size_t bytes, char *errmsg, size_t errlen) {
  tw->stage_grads = ts_calloc(tw->n, sizeof *tw->stage_grads);
  if (!tw->stage_grads) {
    ts_errmsg_printf(errmsg, errlen, "towers: out of host memory");
    return TS_ENOMEM;
  }
  void *p = NULL;
  size_t t = 0, n = tw->reduce == TS_TOWERS_REDUCE_PINNED ? tw->n : 1;
  int rc = tw->kernels[0]->host_alloc(tw->kernels[0], bytes, &p);
  if (rc == 0) tw->stage_params = p;
  while (rc == 0 && t < n) {
    rc = tw->kernels[t]->host_alloc(tw->kernels[t], bytes, &p);
    if (rc == 0) tw->stage_grads[t++] = p;
  }
  if (rc == 0) return 0;
  const ts_kernels_t *k = tw->kernels[t < n ? t : 0]; /* the one that failed */
  const char *detail = k->last_error(k);
  char need[32];
  ts_errmsg_printf(errmsg, errlen, "towers: pinned host memory for staging (%s): %s%s%s",
                   ts_pool_format_bytes(bytes, need, sizeof need), ts_strerror(rc),
                   detail[0] ? ": " : "", detail);
  return rc;
}

/* What each tower's model is built from: an MLP's widths, or a network of layers. */
typedef struct {
  const int *widths;
  size_t nw;
  ts_activation_t activation;
  const ts_layer_spec_t *specs; /* non-NULL: a network */
  size_t nspecs;
  ts_layer_shape_t input;
  const bool *cpu_layers; /* non-NULL: per layer, whether it runs on the CPU back end */
} model_src_t;

static int init_model(ts_model_t *m, const model_src_t *src, size_t capacity, const ts_kernels_t *k,
                      char *errmsg, size_t errlen) {
  if (src->specs && src->cpu_layers) {
    const ts_kernels_t *lk[TS_LAYERS_MAX];
    size_t n = src->nspecs < TS_LAYERS_MAX ? src->nspecs : TS_LAYERS_MAX;
    for (size_t i = 0; i < n; i++) lk[i] = src->cpu_layers[i] ? ts_kernels_cpu() : k;
    if (src->nspecs > TS_LAYERS_MAX) {
      ts_errmsg_printf(errmsg, errlen, "model: %zu layers, at most %d", src->nspecs, TS_LAYERS_MAX);
      return TS_EINVAL;
    }
    return ts_model_init_seq_split(m, src->specs, src->nspecs, src->input, capacity, k, lk, errmsg,
                                   errlen);
  }
  if (src->specs)
    return ts_model_init_seq(m, src->specs, src->nspecs, src->input, capacity, k, errmsg, errlen);
  return ts_model_init(m, src->widths, src->nw, src->activation, capacity, k, errmsg, errlen);
}

static int init_towers(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n,
                       const model_src_t *src, size_t capacity, ts_towers_release_cb release,
                       char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!tw) return TS_EINVAL;
  memset(tw, 0, sizeof *tw);
  if (!kernels || n < 1 || n > TS_TOWERS_MAX) {
    ts_errmsg_printf(errmsg, errlen, "towers: %zu towers, need 1 to %d", n, TS_TOWERS_MAX);
    if (release && kernels)
      for (size_t t = 0; t < n; t++) release(kernels[t]);
    return TS_EINVAL;
  }
  int rc = TS_ENOMEM;
  tw->release = release;
  if (alloc_common(tw, n) < 0) {
    if (release)
      for (size_t t = 0; t < n; t++) release(kernels[t]);
    tw->release = NULL;
    goto nomem;
  }
  tw->n = n;
  tw->zero_copy = true;
  for (size_t t = 0; t < n; t++) {
    tw->kernels[t] = kernels[t];
    if (!kernels[t]->device_is_host) tw->zero_copy = false;
  }
  for (size_t t = 0; t < n; t++) {
    rc = init_model(&tw->models[t], src, capacity, kernels[t], errmsg, errlen);
    if (rc < 0) {
      char name[96];
      tower_name(tw, t, name, sizeof name);
      ts_errmsg_wrapf(errmsg, errlen, "%s", name);
      goto fail;
    }
  }
  const ts_model_t *m0 = &tw->models[0];
  size_t bytes = m0->param_count * sizeof(float);
  bool split = ts_model_is_split(m0);
  if (split) tw->zero_copy = false; /* the flat layout is in pieces on several devices */

  /* How the towers' gradients meet. */
  if (n == 1) {
    tw->reduce = TS_TOWERS_REDUCE_NONE;
  } else if (split) {
    tw->reduce = TS_TOWERS_REDUCE_PINNED;
    ts_log_info(
        "towers: averaging gradients through pinned host memory (each tower's model is "
        "split over devices)");
  } else if (tw->zero_copy) {
    tw->reduce = TS_TOWERS_REDUCE_HOST;
  } else {
    bool one_gpu = true, distinct = true;
    for (size_t t = 1; t < n; t++) {
      if (!same_gpu(kernels[0], kernels[t])) one_gpu = false;
      for (size_t u = 0; u < t; u++)
        if (same_gpu(kernels[u], kernels[t])) distinct = false;
    }
    if (one_gpu) {
      tw->reduce = TS_TOWERS_REDUCE_DEVICE;
    } else {
      char why[256] = "";
      if (distinct && ts_kernels_cuda_nccl_create((ts_kernels_t *const *)kernels, n, &tw->nccl, why,
                                                  sizeof why) == 0) {
        tw->reduce = TS_TOWERS_REDUCE_NCCL;
      } else {
        tw->reduce = TS_TOWERS_REDUCE_PINNED;
        ts_log_info("towers: averaging gradients through pinned host memory (%s)",
                    distinct ? why : "some towers share a GPU");
      }
    }
  }

  /* Staging. */
  if (!tw->zero_copy) {
    rc = alloc_staging(tw, bytes, errmsg, errlen);
    if (rc < 0) goto fail;
  }
  if (make_tensor_views(tw, tw->zero_copy ? tw->models[0].params : tw->stage_params,
                        tw->zero_copy ? tw->models[0].grads : tw->stage_grads[0]) < 0)
    goto nomem;
  return 0;

nomem:
  rc = TS_ENOMEM;
  ts_errmsg_printf(errmsg, errlen, "towers: out of host memory");
fail:
  ts_towers_destroy(tw);
  return rc;
}

int ts_towers_init(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n, const int *widths,
                   size_t nw, ts_activation_t activation, size_t capacity,
                   ts_towers_release_cb release, char *errmsg, size_t errlen) {
  model_src_t src = {.widths = widths, .nw = nw, .activation = activation};
  return init_towers(tw, kernels, n, &src, capacity, release, errmsg, errlen);
}

int ts_towers_init_seq(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n,
                       const ts_layer_spec_t *specs, size_t nspecs, ts_layer_shape_t input,
                       size_t capacity, ts_towers_release_cb release, char *errmsg, size_t errlen) {
  return ts_towers_init_seq_split(tw, kernels, n, specs, nspecs, input, NULL, capacity, release,
                                  errmsg, errlen);
}

int ts_towers_init_seq_split(ts_towers_t *tw, const ts_kernels_t *const *kernels, size_t n,
                             const ts_layer_spec_t *specs, size_t nspecs, ts_layer_shape_t input,
                             const bool *cpu_layers, size_t capacity, ts_towers_release_cb release,
                             char *errmsg, size_t errlen) {
  model_src_t src = {.specs = specs, .nspecs = nspecs, .input = input, .cpu_layers = cpu_layers};
  return init_towers(tw, kernels, n, &src, capacity, release, errmsg, errlen);
}

void ts_towers_set_dropout(ts_towers_t *tw, uint64_t seed, uint64_t step, uint64_t worker) {
  for (size_t t = 0; t < tw->n; t++) {
    /* One stream per (step, worker, tower), mixed so no two of them share a mask. */
    uint64_t stream = ts_init_key(step, "dropout/stream") ^ (worker * 0x9E3779B97F4A7C15ull) ^
                      ((uint64_t)t * 0xC2B2AE3D27D4EB4Full);
    ts_model_set_dropout(&tw->models[t], seed, stream);
  }
}

/* Wait for every tower's queued work, so no copy still reads a buffer about to be freed. */
static void sync_all(const ts_towers_t *tw) {
  for (size_t t = 0; tw->kernels && t < tw->n; t++)
    if (tw->kernels[t]) tw->kernels[t]->synchronize(tw->kernels[t]);
  for (size_t t = 0; tw->models && t < tw->n; t++) ts_model_synchronize(&tw->models[t]);
}

void ts_towers_destroy(ts_towers_t *tw) {
  if (!tw) return;
  sync_all(tw);
  ts_kernels_cuda_nccl_destroy(tw->nccl);
  if (tw->stage_grads && tw->kernels) {
    for (size_t t = 0; t < tw->n; t++)
      if (tw->stage_grads[t]) tw->kernels[t]->host_free(tw->kernels[t], tw->stage_grads[t]);
  }
  if (tw->stage_params && tw->kernels) tw->kernels[0]->host_free(tw->kernels[0], tw->stage_params);
  if (tw->models && !tw->borrowed_model)
    for (size_t t = 0; t < tw->n; t++) ts_model_destroy(&tw->models[t]);
  if (tw->release && tw->kernels)
    for (size_t t = 0; t < tw->n; t++)
      if (tw->kernels[t]) tw->release(tw->kernels[t]);
  ts_free(tw->stage_grads);
  ts_free(tw->models);
  ts_free(tw->kernels);
  ts_free(tw->pull_dst);
  ts_free(tw->push_src);
  ts_free(tw->tower_loss);
  ts_free(tw->tower_correct);
  ts_free(tw->tower_rc);
  memset(tw, 0, sizeof *tw);
}

float *const *ts_towers_pull_targets(const ts_towers_t *tw) {
  return tw->pull_dst;
}

const float *const *ts_towers_push_sources(const ts_towers_t *tw) {
  return tw->push_src;
}

int ts_towers_host_alloc(const ts_towers_t *tw, size_t bytes, void **out) {
  return tw->kernels[0]->host_alloc(tw->kernels[0], bytes, out);
}

void ts_towers_host_free(const ts_towers_t *tw, void *p) {
  const ts_kernels_t *k0 = tw->kernels ? tw->kernels[0] : NULL;
  if (!p || !k0) return;
  sync_all(tw); /* a batch copy from p may still be queued */
  k0->host_free(k0, p);
}

int ts_towers_load(ts_towers_t *tw, const float *x, const int32_t *labels, size_t batch, size_t dim,
                   char *errmsg, size_t errlen) {
  size_t off = 0, micro = 0;
  if (ts_towers_split(batch, tw->n, 0, &off, &micro) < 0) {
    ts_errmsg_printf(errmsg, errlen,
                     "a batch of %zu examples cannot be split evenly over %zu towers", batch,
                     tw->n);
    return TS_EINVAL;
  }
  for (size_t t = 0; t < tw->n; t++) {
    ts_towers_split(batch, tw->n, t, &off, &micro);
    int rc = ts_model_load_batch(&tw->models[t], x + off * dim, labels + off, micro);
    if (rc < 0) {
      kernel_error(tw, t, "loading the batch", rc, errmsg, errlen);
      return rc;
    }
  }
  tw->micro = micro;
  return 0;
}

int ts_towers_pulled(ts_towers_t *tw, char *errmsg, size_t errlen) {
  const ts_model_t *m0 = &tw->models[0];
  size_t count = m0->param_count;
  for (size_t t = 0; t < tw->n; t++) {
    const ts_kernels_t *k = tw->kernels[t];
    ts_model_t *m = &tw->models[t];
    int rc = 0;
    if (tw->zero_copy) {
      if (t > 0) rc = k->copy(k, m->params, m0->params, count * sizeof(float));
    } else {
      rc = ts_model_set_params(m, 0, tw->stage_params, count);
    }
    if (rc < 0) {
      kernel_error(tw, t, "copying the pulled parameters", rc, errmsg, errlen);
      return rc;
    }
  }
  return 0;
}

typedef struct {
  ts_towers_t *tw;
  size_t t;
} tower_job_t;

/* One tower's step: compute, then wait for its stream so its gradient is complete. */
static void run_tower(ts_towers_t *tw, size_t t) {
  ts_model_t *m = &tw->models[t];
  float loss = 0.0f;
  int rc = ts_model_compute(m, tw->micro, &loss);
  if (rc == 0) rc = ts_model_synchronize(m);
  if (rc == 0) rc = ts_model_last_correct(m, &tw->tower_correct[t]);
  tw->tower_loss[t] = loss;
  tw->tower_rc[t] = rc;
}

static void *tower_thread(void *arg) {
  tower_job_t *j = arg;
  run_tower(j->tw, j->t);
  return NULL;
}

/* Mean of every tower's gradient into the push sources. */
static int average(ts_towers_t *tw, char *errmsg, size_t errlen) {
  const ts_kernels_t *k0 = tw->kernels[0];
  const ts_kernels_t *cpu = ts_kernels_cpu();
  size_t count = tw->models[0].param_count;
  float *g0 = tw->models[0].grads;
  float inv = 1.0f / (float)tw->n;
  int rc = 0;
  switch (tw->reduce) {
    case TS_TOWERS_REDUCE_NONE:
      break;
    case TS_TOWERS_REDUCE_HOST:
    case TS_TOWERS_REDUCE_DEVICE:
      for (size_t t = 1; t < tw->n && rc == 0; t++)
        rc = k0->axpy(k0, count, 1.0f, tw->models[t].grads, g0);
      if (rc == 0) rc = k0->scale(k0, count, inv, g0);
      if (rc < 0) {
        kernel_error(tw, 0, "averaging the towers' gradients", rc, errmsg, errlen);
        return rc;
      }
      break;
    case TS_TOWERS_REDUCE_NCCL: {
      float *bufs[TS_TOWERS_MAX];
      for (size_t t = 0; t < tw->n; t++) bufs[t] = tw->models[t].grads;
      rc = ts_kernels_cuda_nccl_mean(tw->nccl, bufs, count, errmsg, errlen);
      if (rc < 0) return rc;
      break;
    }
    case TS_TOWERS_REDUCE_PINNED:
      for (size_t t = 0; t < tw->n; t++) {
        rc = ts_model_get_grads(&tw->models[t], 0, tw->stage_grads[t], count);
        if (rc < 0) {
          kernel_error(tw, t, "copying the gradients to the host", rc, errmsg, errlen);
          return rc;
        }
      }
      for (size_t t = 1; t < tw->n; t++)
        cpu->axpy(cpu, count, 1.0f, tw->stage_grads[t], tw->stage_grads[0]);
      cpu->scale(cpu, count, inv, tw->stage_grads[0]);
      return 0; /* already in the push source */
  }
  if (!tw->zero_copy) {
    rc = ts_model_get_grads(&tw->models[0], 0, tw->stage_grads[0], count);
    if (rc < 0) {
      kernel_error(tw, 0, "copying the gradients to the host", rc, errmsg, errlen);
      return rc;
    }
  }
  return 0;
}

int ts_towers_step(ts_towers_t *tw, float *loss, char *errmsg, size_t errlen) {
  if (tw->micro == 0) {
    ts_errmsg_printf(errmsg, errlen, "towers: no batch loaded");
    return TS_EINVAL;
  }
  pthread_t th[TS_TOWERS_MAX];
  tower_job_t jobs[TS_TOWERS_MAX];
  bool started[TS_TOWERS_MAX] = {false};
  bool threads = !tw->zero_copy && tw->n > 1;
  for (size_t t = 1; t < tw->n && threads; t++) {
    jobs[t] = (tower_job_t){tw, t};
    started[t] = pthread_create(&th[t], NULL, tower_thread, &jobs[t]) == 0;
  }
  for (size_t t = 0; t < tw->n; t++) {
    if (t == 0 || !started[t]) run_tower(tw, t); /* in place when no thread could start */
  }
  for (size_t t = 1; t < tw->n; t++)
    if (started[t]) pthread_join(th[t], NULL);
  double sum = 0.0;
  tw->correct = 0;
  for (size_t t = 0; t < tw->n; t++) {
    if (tw->tower_rc[t] < 0) {
      kernel_error(tw, t, "forward/backward", tw->tower_rc[t], errmsg, errlen);
      return tw->tower_rc[t];
    }
    sum += (double)tw->tower_loss[t];
    tw->correct += tw->tower_correct[t];
  }
  if (loss) *loss = (float)(sum / (double)tw->n);
  return average(tw, errmsg, errlen);
}
