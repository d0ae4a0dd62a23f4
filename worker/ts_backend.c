#include "ts_backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_gpu_visible.h"
#include "ts_kernels_cuda.h"
#include "ts_log.h"

void ts_backend_plan_free(ts_backend_plan_t *p) {
  if (!p) return;
  ts_free(p->ops);
  ts_free(p->placements);
  memset(p, 0, sizeof *p);
}

int ts_backend_layers(const ts_config_t *cfg, ts_layer_shape_t input, ts_layer_spec_t *specs,
                      char *errmsg, size_t errlen) {
  size_t n = cfg->num_net_layers;
  int rc = ts_layers_from_config(cfg->net_layers, n, specs, errmsg, errlen);
  if (rc < 0) return TS_ECONFIG;
  ts_layers_t desc;
  size_t bad = n;
  char why[512];
  rc = ts_layers_check(specs, n, input, &desc, &bad, why, sizeof why);
  if (rc == TS_ENOMEM) {
    ts_errmsg_printf(errmsg, errlen, "model.layers: out of memory");
    return rc;
  }
  if (rc < 0) {
    /* The layer at fault's file:line, or the last layer's for a fault of the whole list (it
     * is the one a model that does not end in logits gets wrong). */
    const char *where = n ? cfg->net_layers[bad < n ? bad : n - 1].where : "model.layers";
    ts_errmsg_printf(errmsg, errlen, "%s: model.layers: %s (input %zux%zux%zu)", where, why,
                     input.h, input.w, input.c);
    return TS_ECONFIG;
  }
  ts_layers_free(&desc);
  return 0;
}

/* A network's ops for placement: one per layer, named as its layer and typed as
 * TensorFlow's op ("conv1/Conv2D"), and whether gpu_ops has the layer's kernels. */
static int net_ops(const ts_config_t *cfg, const ts_kernels_t *gpu_ops, ts_backend_plan_t *p,
                   ts_placement_op_t **out) {
  static const char *const prefixes[] = {"", "conv", "pool", "flatten", "fc", "dropout"};
  static const char *const types[] = {"", "Conv2D", "MaxPool", "Reshape", "MatMul", "Dropout"};
  size_t n = cfg->num_net_layers, counts[6] = {0};
  ts_layer_spec_t *specs = ts_calloc(n ? n : 1, sizeof *specs);
  p->ops = ts_calloc(n ? n : 1, sizeof *p->ops);
  *out = ts_calloc(n ? n : 1, sizeof **out);
  char why[256];
  bool no_cudnn_logged = false;
  int rc = specs && p->ops && *out ? 0 : TS_ENOMEM;
  if (rc == 0 && ts_layers_from_config(cfg->net_layers, n, specs, why, sizeof why) < 0)
    rc = TS_EINVAL;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    size_t t = (size_t)specs[i].type < 6 ? (size_t)specs[i].type : 0;
    counts[t]++;
    ts_model_op_t *op = &p->ops[i];
    if (specs[i].name[0])
      snprintf(op->name, sizeof op->name, "%s/%s", specs[i].name, types[t]);
    else
      snprintf(op->name, sizeof op->name, "%s%zu/%s", prefixes[t], counts[t], types[t]);
    op->type = types[t];
    op->phase = TS_OP_PHASE_FORWARD;
    op->layer = i + 1;
    (*out)[i].name = op->name;
    (*out)[i].type = op->type;
    (*out)[i].gpu_kernel = gpu_ops && !ts_net_layer_kernel_missing(gpu_ops, &specs[i]);
    if (gpu_ops && !(*out)[i].gpu_kernel && !no_cudnn_logged && !ts_kernels_cuda_have_cudnn() &&
        (specs[i].type == TS_LAYER_CONV2D || specs[i].type == TS_LAYER_MAX_POOL)) {
      no_cudnn_logged = true;
      ts_log_info(
          "%s: this build's CUDA back end has no cuDNN, so convolution and max pooling "
          "have no GPU kernel (rebuild with cuDNN: meson -Dcudnn=enabled)",
          op->name);
    }
  }
  p->num_ops = n;
  ts_free(specs);
  return rc;
}

int ts_backend_plan(const ts_config_t *cfg, int gpu_count, const char *gpu_why, int task,
                    const ts_kernels_t *gpu_ops, ts_backend_plan_t *p, char *errmsg,
                    size_t errlen) {
  memset(p, 0, sizeof *p);
  ts_device_spec_t want;
  int rc = ts_device_parse(cfg->placement, &want, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "device.placement");
    return TS_ECONFIG;
  }
  ts_placement_op_t *ops = NULL;
  if (cfg->num_net_layers > 0) {
    rc = net_ops(cfg, gpu_ops, p, &ops);
  } else {
    rc = ts_model_ops(cfg->layers, cfg->num_layers, cfg->activation, &p->ops, &p->num_ops);
    if (rc == 0) ops = ts_calloc(p->num_ops, sizeof *ops);
  }
  if (rc < 0) {
    ts_free(ops);
    ts_backend_plan_free(p);
    ts_errmsg_printf(errmsg, errlen, "model: %s", ts_strerror(rc));
    return rc == TS_EINVAL ? TS_ECONFIG : rc;
  }
  p->placements = ts_calloc(p->num_ops ? p->num_ops : 1, sizeof *p->placements);
  if (!ops || !p->placements) {
    ts_free(ops);
    ts_backend_plan_free(p);
    ts_errmsg_printf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  for (size_t i = 0; cfg->num_net_layers == 0 && i < p->num_ops; i++) {
    ops[i].name = p->ops[i].name;
    ops[i].type = p->ops[i].type;
    ops[i].gpu_kernel = gpu_ops && ts_model_op_has_kernel(gpu_ops, p->ops[i].kind);
  }
  rc = ts_device_place(&want, gpu_count, gpu_why, task, ops, p->num_ops, cfg->allow_soft_placement,
                       p->placements, errmsg, errlen);
  if (rc < 0) {
    ts_free(ops);
    ts_backend_plan_free(p);
    return TS_ECONFIG;
  }
  ts_device_short_name(want.type, want.index, p->soft_spec, sizeof p->soft_spec);

  /* One back end for the model: a GPU only when every op landed on that GPU. */
  size_t on_cpu = 0;
  const char *cpu_op = NULL;
  for (size_t i = 0; i < p->num_ops; i++) {
    if (p->placements[i].type == TS_DEVICE_CPU) {
      on_cpu++;
      if (!cpu_op) cpu_op = ops[i].type;
    }
    if (p->placements[i].soft && !p->soft) {
      p->soft = true;
      snprintf(p->soft_reason, sizeof p->soft_reason, "%s", p->placements[i].reason);
    }
  }
  if (on_cpu > 0 && on_cpu < p->num_ops) {
    for (size_t i = 0; i < p->num_ops; i++) {
      if (p->placements[i].type == TS_DEVICE_GPU) {
        p->placements[i].type = TS_DEVICE_CPU;
        p->placements[i].index = 0;
        p->placements[i].soft = true;
        snprintf(p->placements[i].reason, sizeof p->placements[i].reason,
                 "op %s has no GPU kernel and the model runs on one device", cpu_op);
      }
    }
    p->soft = true;
    snprintf(p->soft_reason, sizeof p->soft_reason,
             "op %s has no GPU kernel, and the model runs on one device", cpu_op);
  }
  ts_free(ops);
  p->type = p->num_ops && p->placements[0].type == TS_DEVICE_GPU ? TS_DEVICE_GPU : TS_DEVICE_CPU;
  int first = p->type == TS_DEVICE_GPU ? p->placements[0].index : 0;

  p->towers = cfg->towers > 0            ? (size_t)cfg->towers
              : p->type == TS_DEVICE_GPU ? (size_t)gpu_count
                                         : 1;
  if (p->towers < 1) p->towers = 1;
  if (p->towers > TS_TOWERS_MAX) p->towers = TS_TOWERS_MAX; /* more visible GPUs than that */
  for (size_t t = 0; t < p->towers; t++)
    p->tower_device[t] =
        p->type == TS_DEVICE_GPU ? (int)(((size_t)first + t) % (size_t)gpu_count) : 0;
  if (ts_towers_split((size_t)cfg->batch_size, p->towers, 0, NULL, &p->micro_batch) < 0) {
    ts_errmsg_printf(errmsg, errlen,
                     "train.batch_size = %d cannot be split evenly over %zu towers (device.towers "
                     "= %d%s): use a multiple of %zu",
                     cfg->batch_size, p->towers, cfg->towers,
                     cfg->towers == 0 ? ", one per visible GPU" : "", p->towers);
    ts_backend_plan_free(p);
    return TS_ECONFIG;
  }
  return 0;
}

static void release_cuda(const ts_kernels_t *k) {
  /* The towers hold tables as const; this is the one place that gives one back. */
  ts_kernels_cuda_destroy((ts_kernels_t *)(uintptr_t)k);
}

/* Which physical GPU each /gpu:N is, by the mapping of CUDA_VISIBLE_DEVICES. */
static void log_gpus(const ts_gpu_visible_t *visible, int gpu_count) {
  for (int g = 0; g < gpu_count; g++) {
    ts_gpu_info_t info;
    if (ts_gpu_info(g, &info) < 0) continue;
    char phys[96], uuid[48] = "";
    bool by_index = ts_gpu_visible_physical(visible, g, &info, phys, sizeof phys) >= 0;
    if (by_index && info.uuid[0]) snprintf(uuid, sizeof uuid, ", GPU-%s", info.uuid);
    ts_log_info("/gpu:%d is %s%s: %s (PCI %s%s, %.1f GiB, compute capability %d.%d)", g,
                by_index ? "physical GPU " : "", phys, info.name, info.pci_bus_id, uuid,
                (double)info.total_bytes / (1024.0 * 1024.0 * 1024.0), info.major, info.minor);
  }
}

/* TensorFlow's device-creation line for a GPU whose pool was just made. */
static void log_created(const ts_gpu_visible_t *visible, int device, int task,
                        const ts_gpu_memory_plan_t *mp) {
  ts_gpu_info_t info;
  if (ts_gpu_info(device, &info) < 0) return;
  char line[512];
  ts_log_info("%s",
              ts_gpu_visible_created_line(visible, &info, task, mp->usable, line, sizeof line));
}

static void log_placement(const ts_config_t *cfg, int task, const ts_backend_plan_t *p) {
  if (p->soft) {
    char dev[96];
    ts_device_long_name(p->type, p->type == TS_DEVICE_GPU ? p->tower_device[0] : 0, task, dev,
                        sizeof dev);
    ts_log_warn("allow_soft_placement: '%s' is not available: %s; placing the model's ops on %s",
                p->soft_spec, p->soft_reason, dev);
  }
  if (!cfg->log_device_placement) return;
  /* Every op of every tower, as TensorFlow's multi-tower models name them ("tower_1/..."):
   * a tower's ops run on its own device (its GPU; the CPU for ops soft placement moved). */
  for (size_t t = 0; t < p->towers; t++) {
    char prefix[32] = "";
    if (p->towers > 1) snprintf(prefix, sizeof prefix, "tower_%zu/", t);
    for (size_t i = 0; i < p->num_ops; i++) {
      const ts_placement_t *pl = &p->placements[i];
      int index = pl->type == TS_DEVICE_GPU ? p->tower_device[t] : 0;
      char dev[96];
      ts_device_long_name(pl->type, index, task, dev, sizeof dev);
      fprintf(stderr, "%s%s: (%s): %s\n", prefix, p->ops[i].name, p->ops[i].type, dev);
    }
  }
}

int ts_backend_setup(const ts_config_t *cfg, int task, ts_layer_shape_t input, size_t capacity,
                     ts_towers_t *towers, char *errmsg, size_t errlen) {
  memset(towers, 0, sizeof *towers);
  char gpu_why[256] = "";
  int gpu_count = ts_gpu_count(gpu_why, sizeof gpu_why);
  /* The runtime read CUDA_VISIBLE_DEVICES when it started; read it again to name the
   * physical GPUs, and log how it was read. */
  ts_gpu_visible_t visible;
  ts_gpu_visible_parse(getenv(TS_GPU_VISIBLE_ENV), &visible);
  ts_gpu_visible_apply(&visible, gpu_count);
  if (visible.set) {
    char line[1024];
    ts_log_info("%s", ts_gpu_visible_describe(&visible, line, sizeof line));
  }
  if (gpu_count == 0 && ts_kernels_cuda_built())
    ts_gpu_visible_hides_all(&visible, gpu_why, sizeof gpu_why);
  log_gpus(&visible, gpu_count);
  ts_backend_plan_t plan;
  int rc =
      ts_backend_plan(cfg, gpu_count, gpu_why, task, ts_kernels_cuda_ops(), &plan, errmsg, errlen);
  if (rc < 0) {
    /* Beside TensorFlow's sentence, the cause it cannot know: the driver's (or the build's). */
    if (gpu_count == 0 && gpu_why[0]) ts_log_err("no GPU in this process: %s", gpu_why);
    return rc;
  }
  log_placement(cfg, task, &plan);

  size_t n = plan.towers;
  size_t cap = plan.micro_batch > capacity ? plan.micro_batch : capacity;
  const ts_kernels_t *tables[TS_TOWERS_MAX];
  ts_towers_release_cb release = NULL;
  if (plan.type == TS_DEVICE_CPU) {
    int threads = ts_kernels_cpu_set_threads(cfg->intra_op_threads);
    ts_log_info("CPU ops use %d thread(s) each (device.intra_op_parallelism_threads = %d%s)",
                threads, cfg->intra_op_threads, cfg->intra_op_threads ? "" : ": OpenBLAS's choice");
    for (size_t t = 0; t < n; t++) tables[t] = ts_kernels_cpu();
  } else {
    ts_kernels_cuda_opts_t opts = {
        .memory = {.allow_growth = cfg->allow_growth, .memory_fraction = cfg->memory_fraction},
        .allow_tf32 = cfg->allow_tf32};
    for (size_t t = 0; t < n; t++) {
      ts_kernels_t *k = NULL;
      rc = ts_kernels_cuda_create(plan.tower_device[t], &opts, &k, errmsg, errlen);
      if (rc < 0) {
        ts_errmsg_wrapf(errmsg, errlen, "tower %zu on /gpu:%d", t, plan.tower_device[t]);
        for (size_t u = 0; u < t; u++) release_cuda(tables[u]);
        ts_backend_plan_free(&plan);
        return rc == TS_EINVAL ? TS_ECONFIG : rc;
      }
      tables[t] = k;
      bool first_on_gpu = true;
      for (size_t u = 0; u < t; u++)
        if (plan.tower_device[u] == plan.tower_device[t]) first_on_gpu = false;
      ts_gpu_memory_plan_t mp;
      if (first_on_gpu && ts_kernels_cuda_memory(k, NULL, &mp) == 0) {
        ts_log_info("/gpu:%d memory: %s", plan.tower_device[t], mp.summary);
        log_created(&visible, plan.tower_device[t], task, &mp);
      }
    }
    release = release_cuda;
  }
  if (cfg->num_net_layers > 0) {
    ts_layer_spec_t specs[TS_LAYERS_MAX];
    rc = ts_backend_layers(cfg, input, specs, errmsg, errlen);
    if (rc == 0)
      rc = ts_towers_init_net(towers, tables, n, specs, cfg->num_net_layers, input, cap, release,
                              errmsg, errlen);
    else if (release)
      for (size_t t = 0; t < n; t++) release(tables[t]);
  } else {
    rc = ts_towers_init(towers, tables, n, cfg->layers, cfg->num_layers, cfg->activation, cap,
                        release, errmsg, errlen);
  }
  if (rc < 0) {
    ts_backend_plan_free(&plan);
    return rc == TS_EINVAL ? TS_ECONFIG : rc;
  }
  char devs[256] = "";
  size_t len = 0;
  for (size_t t = 0; t < n && len < sizeof devs; t++)
    len += (size_t)snprintf(devs + len, sizeof devs - len, "%s/%s:%d", t ? ", " : "",
                            plan.type == TS_DEVICE_GPU ? "gpu" : "cpu", plan.tower_device[t]);
  ts_log_info("towers: %zu (%s), micro-batch %zu of train.batch_size %d, gradients averaged: %s", n,
              devs, plan.micro_batch, cfg->batch_size, ts_towers_reduce_name(towers->reduce));
  ts_backend_plan_free(&plan);
  return 0;
}

void ts_backend_device_name(const ts_towers_t *towers, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (size_t t = 0; t < towers->n && len < n; t++) {
    const ts_kernels_t *k = towers->kernels[t];
    bool seen = false;
    for (size_t u = 0; u < t; u++)
      seen |= towers->kernels[u]->device_is_host == k->device_is_host &&
              towers->kernels[u]->device_index == k->device_index;
    if (seen) continue;
    len += (size_t)snprintf(buf + len, n - len, "%s/%s:%d", len ? "," : "",
                            k->device_is_host ? "cpu" : "gpu", k->device_is_host ? 0 : k->device_index);
  }
}

void ts_backend_log_memory(const ts_towers_t *towers) {
  for (size_t t = 0; t < towers->n; t++) {
    const ts_kernels_t *k = towers->kernels[t];
    if (k->device_is_host) continue;
    bool seen = false;
    for (size_t u = 0; u < t; u++)
      if (towers->kernels[u]->device_index == k->device_index) seen = true;
    ts_pool_stats_t st;
    ts_gpu_memory_plan_t mp;
    if (seen || ts_kernels_cuda_memory(k, &st, &mp) < 0) continue;
    char held[32], peak[32], lim[32];
    ts_pool_format_bytes(st.held, held, sizeof held);
    ts_pool_format_bytes(st.peak, peak, sizeof peak);
    ts_log_info(
        "/gpu:%d memory: pool held %s (%zu bytes) in %zu chunk(s), peak in use %s, "
        "limit %s",
        k->device_index, held, st.held, st.chunks, peak,
        mp.limit ? ts_pool_format_bytes(mp.limit, lim, sizeof lim) : "none (allow_growth)");
  }
}
