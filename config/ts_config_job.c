/* The job settings a worker and a shard compare at the handshake (ts_config_job.h). */
#include "ts_config_job.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_config_int.h"

static bool sync_only(const ts_config_t *c) {
  return c->mode == TS_MODE_SYNC;
}
static bool ssp_only(const ts_config_t *c) {
  return c->mode == TS_MODE_SSP;
}
static bool momentum_only(const ts_config_t *c) {
  return c->optimizer == TS_OPT_MOMENTUM;
}
static bool adam_only(const ts_config_t *c) {
  return c->optimizer == TS_OPT_ADAM;
}

static bool decaying(const ts_config_t *c) {
  return c->decay != TS_DECAY_NONE;
}

static bool exponential_only(const ts_config_t *c) {
  return c->decay == TS_DECAY_EXPONENTIAL;
}

static bool cosine_only(const ts_config_t *c) {
  return c->decay == TS_DECAY_COSINE;
}

/* In the order they are sent and compared: a mode or optimizer before what depends on it. */
static const struct {
  const char *key;
  bool (*applies)(const ts_config_t *); /* NULL: always */
} job_keys[] = {
    {"job.mode", NULL},
    /* always sent, "" too: a worker of an unnamed job is refused by a named one's shards */
    {"job.name", NULL},
    {"cluster.workers", NULL},
    {"job.replicas_to_aggregate", sync_only},
    {"job.staleness", ssp_only},
    {"job.partition_bytes", NULL},
    {"optimizer.name", NULL},
    {"optimizer.learning_rate", NULL},
    {"optimizer.momentum", momentum_only},
    {"optimizer.beta1", adam_only},
    {"optimizer.beta2", adam_only},
    {"optimizer.epsilon", adam_only},
    {"optimizer.decay", NULL},
    {"optimizer.decay_steps", decaying},
    {"optimizer.decay_rate", exponential_only},
    {"optimizer.staircase", exponential_only},
    {"optimizer.decay_alpha", cosine_only},
    {"model.layers", NULL},
    {"model.activation", NULL},
    {"model.seed", NULL},
};
#define NUM_JOB_KEYS (sizeof job_keys / sizeof job_keys[0])
_Static_assert(NUM_JOB_KEYS <= TS_CONFIG_JOB_MAX, "TS_CONFIG_JOB_MAX is too small");

/* The shortest text that reads back as exactly d ("0.1", not "0.10000000000000001"). */
static void format_double(double d, char *buf, size_t n) {
  snprintf(buf, n, "%.15g", d);
  if (strtod(buf, NULL) != d) snprintf(buf, n, "%.17g", d);
}

/* A layer list in one canonical line, Keras's defaults filled in as worker/ts_layers.h fills
 * them, so two files that spell the same model differently (strides omitted or given as the
 * default) compare equal: "conv1=conv2d(6,5x5,1x1,same,relu); pool1=max_pool(2x2,2x2,valid);
 * ...". A list longer than n is cut at n - 1 bytes on both sides alike. */
static void format_layers(const ts_config_t *cfg, char *buf, size_t n) {
  static const struct {
    const char *type, *prefix;
  } prefixes[] = {{"conv2d", "conv"},
                  {"max_pool", "pool"},
                  {"flatten", "flatten"},
                  {"dense", "fc"},
                  {"dropout", "dropout"}};
  size_t counts[5] = {0}, len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < cfg->num_net_layers && len + 1 < n; i++) {
    const ts_config_layer_t *L = &cfg->net_layers[i];
    size_t t = 0;
    while (t < 4 && strcmp(prefixes[t].type, L->type) != 0) t++;
    counts[t]++;
    char name[TS_CONFIG_LAYER_NAME_MAX + 16], args[128] = "";
    if (L->name[0])
      snprintf(name, sizeof name, "%s", L->name);
    else
      snprintf(name, sizeof name, "%s%zu", prefixes[t].prefix, counts[t]);
    bool conv = strcmp(L->type, "conv2d") == 0, pool = strcmp(L->type, "max_pool") == 0;
    const char *pad = L->padding[0] ? L->padding : "valid";
    const char *act = L->activation[0] ? L->activation : "linear";
    if (conv || pool) {
      int sh = L->strides[0] ? L->strides[0] : conv ? 1 : L->kernel[0];
      int sw = L->strides[1] ? L->strides[1] : conv ? 1 : L->kernel[1];
      if (conv)
        snprintf(args, sizeof args, "%d,%dx%d,%dx%d,%s,%s", L->filters, L->kernel[0], L->kernel[1],
                 sh, sw, pad, act);
      else
        snprintf(args, sizeof args, "%dx%d,%dx%d,%s", L->kernel[0], L->kernel[1], sh, sw, pad);
    } else if (strcmp(L->type, "dense") == 0) {
      snprintf(args, sizeof args, "%d,%s", L->units, act);
    } else if (strcmp(L->type, "dropout") == 0) {
      format_double(L->rate, args, sizeof args);
    }
    len += (size_t)snprintf(buf + len, n - len, "%s%s=%s(%s)", i ? "; " : "", name, L->type, args);
  }
}

/* d's value in cfg as text, spelt as a job file would set it. */
static void format_value(const ts_config_t *cfg, const ts_config_def_t *d, char *buf, size_t n) {
  ts_config_t *c = (ts_config_t *)cfg; /* ts_config_field takes a mutable config; only read */
  void *f = ts_config_field(c, d->offset);
  switch (d->type) {
    case TS_CT_BOOL:
      snprintf(buf, n, "%s", *(bool *)f ? "true" : "false");
      break;
    case TS_CT_INT:
      snprintf(buf, n, "%d", *(int *)f);
      break;
    case TS_CT_INT64:
      snprintf(buf, n, "%lld", (long long)*(int64_t *)f);
      break;
    case TS_CT_FLOAT:
      format_double(*(double *)f, buf, n);
      break;
    case TS_CT_STRING:
      snprintf(buf, n, "\"%s\"", *(char **)f ? *(char **)f : "");
      break;
    case TS_CT_ENUM: {
      const char *name = "unknown";
      for (size_t i = 0; d->choices[i]; i++)
        if (d->choice_values[i] == *(int *)f) name = d->choices[i];
      snprintf(buf, n, "\"%s\"", name);
      break;
    }
    case TS_CT_STRINGS:
      /* Only cluster.workers is a list among the job settings, and what a job shares is its
       * length: the addresses may be spelt differently on different hosts. */
      snprintf(buf, n, "%zu workers", *ts_config_count(c, d));
      break;
    case TS_CT_LAYERS:
      if (cfg->num_net_layers > 0) {
        format_layers(cfg, buf, n);
        break;
      }
      /* widths */
      __attribute__((fallthrough));
    case TS_CT_INTS: {
      const int *v = f;
      size_t count = *ts_config_count(c, d), len = 0;
      len += (size_t)snprintf(buf, n, "[");
      for (size_t i = 0; i < count && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? ", " : "", v[i]);
      if (len < n) snprintf(buf + len, n - len, "]");
      break;
    }
  }
}

size_t ts_config_job_settings(const ts_config_t *cfg, ts_config_job_setting_t *out) {
  size_t n = 0;
  for (size_t i = 0; i < NUM_JOB_KEYS; i++) {
    if (job_keys[i].applies && !job_keys[i].applies(cfg)) continue;
    out[n].key = job_keys[i].key;
    format_value(cfg, ts_config_def_named(job_keys[i].key), out[n].value, sizeof out[n].value);
    n++;
  }
  return n;
}

int ts_config_job_compare(const ts_config_t *cfg, const char *key, const char *value, char *mine,
                          size_t minelen) {
  bool known = false;
  for (size_t i = 0; i < NUM_JOB_KEYS && !known; i++) known = strcmp(job_keys[i].key, key) == 0;
  if (!known) return 1;
  format_value(cfg, ts_config_def_named(key), mine, minelen);
  return strcmp(mine, value ? value : "") == 0;
}
