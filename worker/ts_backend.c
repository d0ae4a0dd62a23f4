/*
 * Back-end selection (ts_backend.h): the plan, a pure function of the job file and the GPUs
 * visible (the model's ops, the input pipeline's ops ahead of them, each placed by
 * TensorFlow's rules and device.rules, soft placement, a split over devices, the towers),
 * then the setup that carries it out: the GPUs discovered and logged, the placement and
 * log_device_placement lines printed, the back ends created and the towers built. The MLP's
 * ops come from ts_model_ops; a layer list's are one op per layer, made here (layer_ops).
 */
#include "ts_backend.h"

#include <stdint.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_cpu_share.h"
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
static int layer_ops(const ts_config_t *cfg, const ts_kernels_t *gpu_ops, ts_backend_plan_t *p,
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
    (*out)[i].gpu_kernel = gpu_ops && !ts_seq_layer_kernel_missing(gpu_ops, &specs[i]);
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

/* The input pipeline's ops, ahead of the model's: they run once per step on the worker's
 * host, outside device.placement's scope, and have CPU kernels only (worker/ts_idx.c turns
 * the IDX file's bytes into float32 pixels). */
static const struct {
  const char *name, *type;
} input_ops[] = {{"input/decode", "DecodeRaw"}};
#define NUM_INPUT_OPS (sizeof input_ops / sizeof input_ops[0])

/* Prepend the input ops to the model's p->ops[0..p->num_ops). */
static int add_input_ops(ts_backend_plan_t *p) {
  size_t n = NUM_INPUT_OPS + p->num_ops;
  ts_model_op_t *all = ts_calloc(n, sizeof *all);
  if (!all) return TS_ENOMEM;
  for (size_t i = 0; i < NUM_INPUT_OPS; i++) {
    snprintf(all[i].name, sizeof all[i].name, "%s", input_ops[i].name);
    all[i].type = input_ops[i].type;
    all[i].phase = TS_OP_PHASE_FORWARD;
  }
  if (p->num_ops) memcpy(all + NUM_INPUT_OPS, p->ops, p->num_ops * sizeof *all);
  ts_free(p->ops);
  p->ops = all;
  p->num_ops = n;
  p->num_input_ops = NUM_INPUT_OPS;
  return 0;
}

/* device.rules, parsed: rule r's glob and device. */
typedef struct {
  char pattern[256];
  ts_device_spec_t dev;
  bool used;
} rule_t;

static int parse_rules(const ts_config_t *cfg, rule_t *rules, char *errmsg, size_t errlen) {
  for (size_t r = 0; r < cfg->num_placement_rules; r++) {
    const char *s = cfg->placement_rules[r];
    const char *eq = strchr(s, '=');
    size_t plen = eq ? (size_t)(eq - s) : 0;
    while (plen > 0 && s[plen - 1] == ' ') plen--;
    if (!eq || plen == 0 || plen >= sizeof rules[r].pattern) {
      ts_errmsg_printf(errmsg, errlen, "device.rules[%zu] \"%s\": expected PATTERN=DEVICE", r, s);
      return TS_ECONFIG;
    }
    memcpy(rules[r].pattern, s, plen);
    rules[r].pattern[plen] = '\0';
    const char *dev = eq + 1;
    while (*dev == ' ') dev++;
    int rc = ts_device_parse(dev, &rules[r].dev, errmsg, errlen);
    if (rc == 0 && rules[r].dev.unspecified) rc = TS_EINVAL;
    if (rc < 0) {
      if (rules[r].dev.unspecified) ts_errmsg_printf(errmsg, errlen, "no device after '='");
      ts_errmsg_wrapf(errmsg, errlen, "device.rules[%zu] \"%s\"", r, s);
      return TS_ECONFIG;
    }
  }
  return 0;
}

/* The first rule whose glob matches the op's name ("fc2/matmul") or its layer ("fc2"). */
static rule_t *match_rule(rule_t *rules, size_t n, const char *op) {
  char layer[TS_MODEL_NAME_MAX];
  snprintf(layer, sizeof layer, "%.*s", (int)strcspn(op, "/"), op);
  for (size_t r = 0; r < n; r++)
    if (fnmatch(rules[r].pattern, op, 0) == 0 || fnmatch(rules[r].pattern, layer, 0) == 0)
      return &rules[r];
  return NULL;
}

/* How many runs of consecutive model ops on one device (a split network's segments). */
static size_t device_runs(const ts_backend_plan_t *p) {
  size_t runs = 0;
  for (size_t i = p->num_input_ops; i < p->num_ops; i++)
    if (i == p->num_input_ops || p->placements[i].type != p->placements[i - 1].type) runs++;
  return runs;
}

/* Where the model's layers run when their ops landed on two devices. A network of layers is
 * split, as TensorFlow places each op on its own device: the layers on the GPU run there,
 * the others on the CPU (placed there explicitly by `with tf.device()`-like rules, moved by
 * soft placement, or without a GPU kernel under the default placement), with the copies
 * between them (p->split). An MLP of widths, or a network that would alternate between the
 * devices more than TS_SEQ_SEGMENTS_MAX times, runs on one device (the towers' back end):
 * all on the CPU when nothing explicit keeps an op on its GPU, else refused. Two GPUs in one
 * model are refused. */
static int one_device(const ts_config_t *cfg, ts_backend_plan_t *p, const ts_placement_op_t *ops,
                      char *errmsg, size_t errlen) {
  size_t none = p->num_ops, gi = none, ci = none;
  for (size_t i = p->num_input_ops; i < p->num_ops; i++) {
    const ts_placement_t *pl = &p->placements[i];
    if (pl->type == TS_DEVICE_CPU) {
      if (ci == none) ci = i;
    } else if (gi == none) {
      gi = i;
    } else if (p->placements[gi].index != pl->index) {
      ts_errmsg_printf(errmsg, errlen,
                       "%s is placed on /device:GPU:%d and %s on /device:GPU:%d: one model's "
                       "layers run on one GPU, or on one GPU and /device:CPU:0 "
                       "(device.placement, device.rules)",
                       ops[gi].name, p->placements[gi].index, ops[i].name, pl->index);
      return TS_ECONFIG;
    }
  }
  if (gi == none || ci == none) return 0;
  size_t runs = device_runs(p);
  if (cfg->num_net_layers > 0 && runs <= TS_SEQ_SEGMENTS_MAX) {
    p->split = true;
    return 0;
  }
  const ts_placement_t *cpu = &p->placements[ci];
  /* Which op holds the model on the CPU, and why. */
  char one[80];
  if (cfg->num_net_layers > 0)
    snprintf(one, sizeof one, "the model's layers would change devices %zu times (at most %d)",
             runs - 1, TS_SEQ_SEGMENTS_MAX - 1);
  else
    snprintf(one, sizeof one, "the model's layers run on one device");
  char why[200];
  if (cpu->soft || !cpu->asked[0])
    snprintf(why, sizeof why, "op %s (%s) has no GPU kernel and %s", ops[ci].name, ops[ci].type,
             one);
  else
    snprintf(why, sizeof why, "%s is placed on /device:CPU:0 and %s", ops[ci].name, one);
  for (size_t i = p->num_input_ops; i < p->num_ops; i++) {
    ts_placement_t *pl = &p->placements[i];
    if (pl->type != TS_DEVICE_GPU) continue;
    if (pl->asked[0] && !cfg->allow_soft_placement) {
      ts_errmsg_printf(errmsg, errlen,
                       "%s is placed on %s explicitly, but %s; allow_soft_placement would move "
                       "it to /device:CPU:0 (or place them all on one device)",
                       ops[i].name, pl->asked, why);
      return TS_ECONFIG;
    }
    pl->type = TS_DEVICE_CPU;
    pl->index = 0;
    pl->soft = pl->asked[0] != '\0';
    snprintf(pl->reason, sizeof pl->reason, "%s", why);
  }
  return 0;
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
  rule_t *rules = ts_calloc(cfg->num_placement_rules ? cfg->num_placement_rules : 1, sizeof *rules);
  if (!rules) return TS_ENOMEM;
  rc = parse_rules(cfg, rules, errmsg, errlen);
  if (rc < 0) {
    ts_free(rules);
    return rc;
  }
  ts_placement_op_t *ops = NULL, *layers = NULL;
  if (cfg->num_net_layers > 0) {
    rc = layer_ops(cfg, gpu_ops, p, &layers);
  } else {
    rc = ts_model_ops(cfg->layers, cfg->num_layers, cfg->activation, &p->ops, &p->num_ops);
  }
  if (rc == 0) rc = add_input_ops(p);
  if (rc == 0) {
    ops = ts_calloc(p->num_ops, sizeof *ops);
    p->placements = ts_calloc(p->num_ops, sizeof *p->placements);
    if (!ops || !p->placements) rc = TS_ENOMEM;
  }
  for (size_t i = p->num_input_ops; rc == 0 && i < p->num_ops; i++)
    ops[i].gpu_kernel = layers ? layers[i - p->num_input_ops].gpu_kernel
                               : gpu_ops && ts_model_op_has_kernel(gpu_ops, p->ops[i].kind);
  ts_free(layers);
  if (rc < 0) {
    ts_free(ops);
    ts_free(rules);
    ts_backend_plan_free(p);
    ts_errmsg_printf(errmsg, errlen, "model: %s", ts_strerror(rc));
    return rc == TS_EINVAL ? TS_ECONFIG : rc;
  }
  for (size_t i = 0; i < p->num_ops; i++) {
    ops[i].name = p->ops[i].name;
    ops[i].type = p->ops[i].type;
    ops[i].outside_scope = i < p->num_input_ops;
    rule_t *r = match_rule(rules, cfg->num_placement_rules, p->ops[i].name);
    if (r) {
      ops[i].want = &r->dev;
      r->used = true;
    }
  }
  rc = ts_device_place(&want, gpu_count, gpu_why, task, ops, p->num_ops, cfg->allow_soft_placement,
                       p->placements, errmsg, errlen);
  if (rc == 0) rc = one_device(cfg, p, ops, errmsg, errlen);
  /* Whole rules only: those that do not fit (room kept for the count) are counted. */
  size_t len = 0, more = 0;
  for (size_t r = 0; rc == 0 && r < cfg->num_placement_rules; r++) {
    if (rules[r].used) continue;
    size_t need = (len ? 2 : 0) + strlen(cfg->placement_rules[r]) + 2;
    if (more || len + need + sizeof ", and 64 more" > sizeof p->unused_rules) {
      more++;
      continue;
    }
    len += (size_t)snprintf(p->unused_rules + len, sizeof p->unused_rules - len, "%s\"%s\"",
                            len ? ", " : "", cfg->placement_rules[r]);
  }
  if (more)
    snprintf(p->unused_rules + len, sizeof p->unused_rules - len, "%sand %zu more",
             len ? ", " : "", more);
  ts_free(ops);
  ts_free(rules);
  if (rc < 0) {
    ts_backend_plan_free(p);
    return TS_ECONFIG;
  }
  ts_device_short_name(want.type, want.index, p->soft_spec, sizeof p->soft_spec);
  for (size_t i = 0; i < p->num_ops && !p->soft; i++) {
    if (!p->placements[i].soft) continue;
    p->soft = true;
    snprintf(p->soft_spec, sizeof p->soft_spec, "%s", p->placements[i].asked);
    snprintf(p->soft_reason, sizeof p->soft_reason, "%s", p->placements[i].reason);
  }

  /* The towers' device: the model's first op's, or in a split model its first GPU op's. */
  const ts_placement_t *model0 = NULL;
  for (size_t i = p->num_input_ops; i < p->num_ops && !model0; i++)
    if (!p->split || p->placements[i].type == TS_DEVICE_GPU) model0 = &p->placements[i];
  p->type = model0 && model0->type == TS_DEVICE_GPU ? TS_DEVICE_GPU : TS_DEVICE_CPU;
  int first = p->type == TS_DEVICE_GPU ? model0->index : 0;

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

/* One op's placement line in TensorFlow's format, "fc1/matmul: (MatMul): /job:worker/...". */
static void print_op(const char *prefix, const ts_model_op_t *op, ts_device_type_t type, int index,
                     int task) {
  char dev[96];
  ts_device_long_name(type, index, task, dev, sizeof dev);
  fprintf(stderr, "%s%s: (%s): %s\n", prefix, op->name, op->type, dev);
}

static void log_placement(const ts_config_t *cfg, int task, const ts_backend_plan_t *p) {
  /* One line per op soft placement moved, with what it asked for and why. */
  for (size_t i = 0; i < p->num_ops; i++) {
    const ts_placement_t *pl = &p->placements[i];
    if (!pl->soft && !pl->reason[0]) continue;
    char dev[96];
    int index = pl->type == TS_DEVICE_GPU && i >= p->num_input_ops ? p->tower_device[0] : pl->index;
    ts_device_long_name(pl->type, index, task, dev, sizeof dev);
    if (pl->soft)
      ts_log_warn("allow_soft_placement: op %s (%s) asked for '%s', placed on %s: %s",
                  p->ops[i].name, p->ops[i].type, pl->asked, dev, pl->reason);
    else
      ts_log_info("op %s (%s) placed on %s: %s", p->ops[i].name, p->ops[i].type, dev, pl->reason);
  }
  if (p->unused_rules[0])
    ts_log_warn("device.rules: %s match no op of this model (ops are named like fc1/matmul, "
                "layers like fc1; device.log_device_placement lists them)",
                p->unused_rules);
  if (!cfg->log_device_placement) return;
  /* The input pipeline's ops once (they feed every tower), then every op of every tower, as
   * TensorFlow's multi-tower models name them ("tower_1/..."): a tower's ops run on its own
   * device (its GPU; the CPU for ops placed there). */
  for (size_t i = 0; i < p->num_input_ops; i++)
    print_op("", &p->ops[i], p->placements[i].type, p->placements[i].index, task);
  for (size_t t = 0; t < p->towers; t++) {
    char prefix[32] = "";
    if (p->towers > 1) snprintf(prefix, sizeof prefix, "tower_%zu/", t);
    for (size_t i = p->num_input_ops; i < p->num_ops; i++) {
      const ts_placement_t *pl = &p->placements[i];
      print_op(prefix, &p->ops[i], pl->type, pl->type == TS_DEVICE_GPU ? p->tower_device[t] : 0,
               task);
    }
  }
}

/* A split model's segments, one line: "model split over devices: conv1..pool2 on /gpu:0,
 * flatten1..fc2 on /cpu:0 (...)". */
static void log_split(const ts_backend_plan_t *p) {
  char line[768];
  size_t len = 0, m = p->num_input_ops;
  for (size_t i = m; i < p->num_ops && len < sizeof line; i++) {
    const ts_placement_t *pl = &p->placements[i];
    if (i > m && pl->type == p->placements[i - 1].type) continue;
    size_t end = i + 1;
    while (end < p->num_ops && p->placements[end].type == pl->type) end++;
    len += (size_t)snprintf(line + len, sizeof line - len, "%s%.*s", i > m ? ", " : "",
                            (int)strcspn(p->ops[i].name, "/"), p->ops[i].name);
    if (end - 1 > i && len < sizeof line)
      len += (size_t)snprintf(line + len, sizeof line - len, "..%.*s",
                              (int)strcspn(p->ops[end - 1].name, "/"), p->ops[end - 1].name);
    if (len < sizeof line)
      len += (size_t)snprintf(line + len, sizeof line - len, " on /%s:%d",
                              pl->type == TS_DEVICE_GPU ? "gpu" : "cpu",
                              pl->type == TS_DEVICE_GPU ? p->tower_device[0] : 0);
  }
  ts_log_info(
      "model split over devices: %s (each tower split alike; activations copied "
      "device -> host -> device at each boundary, their gradients back)",
      line);
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
  if (plan.type == TS_DEVICE_CPU || plan.split) {
    /* OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS), when set, is the operator's choice. */
    const char *env = getenv("OPENBLAS_NUM_THREADS") ? "OPENBLAS_NUM_THREADS"
                      : getenv("OMP_NUM_THREADS")    ? "OMP_NUM_THREADS"
                                                     : NULL;
    char why[160];
    int want = ts_cpu_share_threads(cfg, task, ts_cpu_share_cpus(), why, sizeof why);
    if (env && cfg->intra_op_threads == 0) snprintf(why, sizeof why, "%s", env);
    int threads = ts_kernels_cpu_set_threads(env && cfg->intra_op_threads == 0 ? 0 : want);
    ts_log_info("CPU ops use %d thread(s) each (%s)", threads, why);
  }
  if (plan.type == TS_DEVICE_CPU) {
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
    bool on_cpu[TS_LAYERS_MAX] = {false};
    for (size_t i = 0; plan.split && i < cfg->num_net_layers; i++)
      on_cpu[i] = plan.placements[plan.num_input_ops + i].type == TS_DEVICE_CPU;
    if (plan.split) log_split(&plan);
    if (rc == 0)
      rc = ts_towers_init_seq_split(towers, tables, n, specs, cfg->num_net_layers, input,
                                    plan.split ? on_cpu : NULL, cap, release, errmsg, errlen);
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
  /* A split model's layers on the CPU too. */
  if (towers->n && ts_model_is_split(&towers->models[0]) && len < n)
    snprintf(buf + len, n - len, "%s/cpu:0", len ? "," : "");
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
