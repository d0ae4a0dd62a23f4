/*
 * Reading a model's layer list (ts_config_layers.h). Table-driven like the key table: each
 * type lists its keys, and each key knows how to read itself, so an error can always say
 * which keys a type takes.
 */
#include "ts_config_layers.h"

#include <libconfig.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ts_err.h"

#define MAX_SIDE 65536    /* a kernel, window or stride side (TS_CONV_MAX_DIM) */
#define MAX_COUNT 1048576 /* filters, units (TS_LAYERS_MAX_UNITS) */

typedef enum {
  K_NAME,
  K_FILTERS,
  K_UNITS,
  K_KERNEL,
  K_SIZE,
  K_STRIDES,
  K_PADDING,
  K_ACT,
  K_RATE,
  K_TABLE,
  K_DIM,
  K_FIELD
} layer_key_t;

static const char *const key_names[] = {
    [K_NAME] = "name",       [K_FILTERS] = "filters", [K_UNITS] = "units",
    [K_KERNEL] = "kernel",   [K_SIZE] = "size",       [K_STRIDES] = "strides",
    [K_PADDING] = "padding", [K_ACT] = "activation",  [K_RATE] = "rate",
    [K_TABLE] = "table",     [K_DIM] = "dim",         [K_FIELD] = "field",
};

typedef struct {
  const char *type;
  unsigned keys;     /* bit per layer_key_t it takes ("type" always) */
  unsigned required; /* bit per key it needs */
} layer_kind_t;

#define BIT(k) (1u << (k))
static const layer_kind_t kinds[] = {
    {"conv2d",
     BIT(K_FILTERS) | BIT(K_KERNEL) | BIT(K_STRIDES) | BIT(K_PADDING) | BIT(K_ACT) | BIT(K_NAME),
     BIT(K_FILTERS) | BIT(K_KERNEL)},
    {"max_pool", BIT(K_SIZE) | BIT(K_STRIDES) | BIT(K_PADDING) | BIT(K_NAME), BIT(K_SIZE)},
    {"flatten", BIT(K_NAME), 0},
    {"dense", BIT(K_UNITS) | BIT(K_ACT) | BIT(K_NAME), BIT(K_UNITS)},
    {"dropout", BIT(K_RATE) | BIT(K_NAME), BIT(K_RATE)},
    {"embedding", BIT(K_TABLE) | BIT(K_DIM) | BIT(K_FIELD),
     BIT(K_TABLE) | BIT(K_DIM) | BIT(K_FIELD)},
    {"dot", 0, 0},
};

typedef struct {
  char *errmsg;
  size_t errlen;
  const char *where;
  size_t index; /* 1-based */
  const char *type;
} ctx_t;

static int fail(const ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(const ctx_t *c, const char *fmt, ...) {
  char why[192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (c->type)
    ts_errmsg_printf(c->errmsg, c->errlen, "%s: model.layers: layer %zu (%s): %s", c->where,
                     c->index, c->type, why);
  else
    ts_errmsg_printf(c->errmsg, c->errlen, "%s: model.layers: layer %zu: %s", c->where, c->index,
                     why);
  return TS_ECONFIG;
}

static void list_keys(const layer_kind_t *k, char *buf, size_t len) {
  snprintf(buf, len, "no keys");
  for (size_t i = 0, used = 0; i < sizeof key_names / sizeof key_names[0]; i++)
    if (k->keys & BIT(i)) {
      snprintf(buf + used, len - used, "%s%s", used ? ", " : "", key_names[i]);
      used = strlen(buf);
    }
}

static int read_int(const ctx_t *c, const config_setting_t *s, const char *key, int max, int *out) {
  if (config_setting_type(s) != CONFIG_TYPE_INT && config_setting_type(s) != CONFIG_TYPE_INT64)
    return fail(c, "%s must be an integer", key);
  long long v = config_setting_get_int64(s);
  if (v < 1 || v > max) return fail(c, "%s = %lld outside 1..%d", key, v, max);
  *out = (int)v;
  return 0;
}

/* An integer n (meaning [n, n]) or a list of two integers [h, w]. */
static int read_pair(const ctx_t *c, const config_setting_t *s, const char *key, int out[2]) {
  if (config_setting_is_array(s) || config_setting_is_list(s)) {
    if (config_setting_length(s) != 2)
      return fail(c, "%s must be an integer or a list of two integers [h, w]", key);
    for (unsigned i = 0; i < 2; i++) {
      int rc = read_int(c, config_setting_get_elem(s, i), key, MAX_SIDE, &out[i]);
      if (rc < 0) return rc;
    }
    return 0;
  }
  int rc = read_int(c, s, key, MAX_SIDE, &out[0]);
  out[1] = out[0];
  return rc;
}

static int read_choice(const ctx_t *c, const config_setting_t *s, const char *key,
                       const char *const *choices, char *out, size_t len) {
  const char *v = config_setting_get_string(s);
  if (v)
    for (size_t i = 0; choices[i]; i++)
      if (strcmp(v, choices[i]) == 0) {
        snprintf(out, len, "%s", v);
        return 0;
      }
  char allowed[96] = "";
  for (size_t i = 0; choices[i]; i++) {
    size_t used = strlen(allowed);
    snprintf(allowed + used, sizeof allowed - used, "%s\"%s\"", i ? " or " : "", choices[i]);
  }
  if (!v) return fail(c, "%s must be a string: %s", key, allowed);
  return fail(c, "%s \"%s\" must be %s", key, v, allowed);
}

static int read_key(const ctx_t *c, layer_key_t k, const config_setting_t *s,
                    ts_config_layer_t *l) {
  static const char *const paddings[] = {"valid", "same", NULL};
  static const char *const acts[] = {"linear", "relu", "tanh", NULL};
  switch (k) {
    case K_NAME: {
      const char *v = config_setting_get_string(s);
      if (!v || !v[0]) return fail(c, "name must be a non-empty string");
      if (strlen(v) >= sizeof l->name)
        return fail(c, "name \"%.20s...\" is longer than %d characters", v,
                    TS_CONFIG_LAYER_NAME_MAX - 1);
      if (strchr(v, '/')) return fail(c, "name \"%s\" may not contain '/'", v);
      snprintf(l->name, sizeof l->name, "%s", v);
      return 0;
    }
    case K_FILTERS:
      return read_int(c, s, "filters", MAX_SIDE, &l->filters);
    case K_UNITS:
      return read_int(c, s, "units", MAX_COUNT, &l->units);
    case K_KERNEL:
    case K_SIZE:
      return read_pair(c, s, key_names[k], l->kernel);
    case K_STRIDES:
      return read_pair(c, s, "strides", l->strides);
    case K_PADDING:
      return read_choice(c, s, "padding", paddings, l->padding, sizeof l->padding);
    case K_ACT:
      return read_choice(c, s, "activation", acts, l->activation, sizeof l->activation);
    case K_RATE:
      if (config_setting_type(s) != CONFIG_TYPE_FLOAT && config_setting_type(s) != CONFIG_TYPE_INT)
        return fail(c, "rate must be a number in [0, 1)");
      l->rate = config_setting_type(s) == CONFIG_TYPE_FLOAT ? config_setting_get_float(s)
                                                            : (double)config_setting_get_int(s);
      if (!(l->rate >= 0.0 && l->rate < 1.0))
        return fail(c, "rate = %g outside [0, 1): the fraction of units dropped", l->rate);
      return 0;
    case K_TABLE: {
      const char *v = config_setting_get_string(s);
      if (!v || !v[0]) return fail(c, "table must be a non-empty string");
      if (strlen(v) >= sizeof l->table)
        return fail(c, "table \"%.20s...\" is longer than %d characters", v,
                    TS_CONFIG_LAYER_NAME_MAX - 1);
      snprintf(l->table, sizeof l->table, "%s", v);
      return 0;
    }
    case K_DIM:
      return read_int(c, s, "dim", 4096, &l->dim);
    case K_FIELD: {
      /* One categorical field (1-based) or a list of them, each its own vector. */
      bool list = config_setting_is_array(s) || config_setting_is_list(s);
      int count = list ? config_setting_length(s) : 1;
      if (count < 1 || count > TS_CONFIG_EMB_FIELDS_MAX)
        return fail(c, "field must be a field number or a list of 1..%d of them",
                    TS_CONFIG_EMB_FIELDS_MAX);
      for (int i = 0; i < count; i++) {
        int rc = read_int(c, list ? config_setting_get_elem(s, (unsigned)i) : s, "field",
                          TS_CONFIG_EMB_FIELDS_MAX, &l->fields[i]);
        if (rc < 0) return rc;
      }
      l->num_fields = (size_t)count;
      return 0;
    }
  }
  return TS_EINTERNAL;
}

static int read_layer(ctx_t *c, const config_setting_t *g, ts_config_layer_t *l) {
  if (!config_setting_is_group(g)) return fail(c, "must be a group: { type = \"conv2d\"; ... }");
  const char *type = NULL;
  if (!config_setting_lookup_string(g, "type", &type))
    return fail(c, "no type (a string: conv2d, max_pool, flatten, dense, dropout, embedding "
                   "or dot)");
  const layer_kind_t *kind = NULL;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(type, kinds[i].type) == 0) kind = &kinds[i];
  if (!kind)
    return fail(c, "unknown type \"%s\" (conv2d, max_pool, flatten, dense, dropout, embedding "
                   "or dot)", type);
  c->type = kind->type;
  snprintf(l->type, sizeof l->type, "%s", kind->type);
  unsigned seen = 0;
  char takes[128];
  list_keys(kind, takes, sizeof takes);
  for (int i = 0; i < config_setting_length(g); i++) {
    const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
    const char *key = config_setting_name(s);
    if (strcmp(key, "type") == 0) continue;
    size_t k = 0;
    while (k < sizeof key_names / sizeof key_names[0] && strcmp(key, key_names[k]) != 0) k++;
    if (k == sizeof key_names / sizeof key_names[0] || !(kind->keys & BIT(k)))
      return fail(c, "unknown key '%s': %s takes %s", key, kind->type, takes);
    int rc = read_key(c, (layer_key_t)k, s, l);
    if (rc < 0) return rc;
    seen |= BIT(k);
  }
  for (size_t k = 0; k < sizeof key_names / sizeof key_names[0]; k++)
    if ((kind->required & BIT(k)) && !(seen & BIT(k)))
      return fail(c, "missing '%s' (%s takes %s)", key_names[k], kind->type, takes);
  return 0;
}

int ts_config_layers_parse(const struct config_setting_t *list, const char *path,
                           ts_config_layer_t *out, size_t max, size_t *n, char *errmsg,
                           size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!list || !out || !n) return TS_EINVAL;
  *n = 0;
  const char *file = config_setting_source_file(list) ? config_setting_source_file(list) : path;
  if (!file) file = "(job file)";
  if (!config_setting_is_list(list)) {
    ts_errmsg_printf(errmsg, errlen,
                     "%s:%d: model.layers: must be a list of layers: ( { type = \"dense\"; "
                     "units = 10; } , ... )",
                     file, (int)config_setting_source_line(list));
    return TS_ECONFIG;
  }
  size_t count = (size_t)config_setting_length(list);
  if (count < 1 || count > max) {
    ts_errmsg_printf(errmsg, errlen, "%s:%d: model.layers: %zu layers, outside 1..%zu", file,
                     (int)config_setting_source_line(list), count, max);
    return TS_ECONFIG;
  }
  for (size_t i = 0; i < count; i++) {
    const config_setting_t *g = config_setting_get_elem(list, (unsigned)i);
    ts_config_layer_t *l = &out[i];
    memset(l, 0, sizeof *l);
    snprintf(l->where, sizeof l->where, "%s:%d", file, (int)config_setting_source_line(g));
    ctx_t c = {.errmsg = errmsg, .errlen = errlen, .where = l->where, .index = i + 1};
    int rc = read_layer(&c, g, l);
    if (rc < 0) return rc;
  }
  *n = count;
  return 0;
}
