/*
 * The loader's setters: the one place a value meets the key table's bounds, whatever its
 * source (the file, --set, TF_CONFIG or the table's own defaults), so the same value is
 * refused with the same words from anywhere. A setter checks a whole value before it
 * replaces the old one, so a refused value leaves the field as it was and ts_config_free
 * always finds something it owns.
 */
#include <libconfig.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_config_int.h"
#include "ts_err.h"

/* ---- Errors ----------------------------------------------------------------------------- */

int ts_config_fail(ts_config_loader_t *ld, const char *name, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (name)
    ts_errmsg_printf(ld->errmsg, ld->errlen, "%s: %s: %s", ld->where, name, msg);
  else
    ts_errmsg_printf(ld->errmsg, ld->errlen, "%s: %s", ld->where, msg);
  return TS_ECONFIG;
}

int ts_config_oom(ts_config_loader_t *ld, const char *name) {
  ts_errmsg_printf(ld->errmsg, ld->errlen, "%s: %s: out of memory", ld->where, name);
  return TS_ENOMEM;
}

void ts_config_note_origin(ts_config_loader_t *ld, const ts_config_def_t *d) {
  snprintf(ld->origin[d - ts_config_defs], TS_CONFIG_WHERE_LEN, "%s", ld->where);
}

int ts_config_fail_unknown(ts_config_loader_t *ld, const char *name) {
  char hint[TS_CONFIG_KEY_LEN];
  ts_config_suggest(name, hint, sizeof hint);
  if (hint[0]) return ts_config_fail(ld, name, "unknown key (did you mean %s?)", hint);
  return ts_config_fail(ld, name, "unknown key (see docs/configuration.md)");
}

/* ---- Typed setters: the table's bounds are checked here, whatever the source ------------- */

static void describe_choices(const ts_config_def_t *d, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; d->choices[i] && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s\"%s\"", i ? ", " : "", d->choices[i]);
}

static int check_int(ts_config_loader_t *ld, const ts_config_def_t *d, const char *name,
                     int64_t v) {
  char range[96];
  ts_config_describe_int_bounds(d, range, sizeof range);
  if (v < d->imin || v > d->imax)
    return ts_config_fail(ld, name, "must be an integer in %s, not %lld", range, (long long)v);
  if (d->multiple && v % d->multiple != 0)
    return ts_config_fail(ld, name, "must be a multiple of %lld, not %lld", (long long)d->multiple,
                          (long long)v);
  return 0;
}

static int set_int(ts_config_loader_t *ld, const ts_config_def_t *d, int64_t v) {
  int rc = check_int(ld, d, d->name, v);
  if (rc < 0) return rc;
  if (d->type == TS_CT_INT)
    *(int *)ts_config_field(ld->cfg, d->offset) = (int)v;
  else
    *(int64_t *)ts_config_field(ld->cfg, d->offset) = v;
  return 0;
}

static int set_float(ts_config_loader_t *ld, const ts_config_def_t *d, double v) {
  bool low = (d->flags & TS_CF_OPEN_MIN) ? v <= d->fmin : v < d->fmin;
  bool high = (d->flags & TS_CF_OPEN_MAX) ? v >= d->fmax : v > d->fmax;
  if (!isfinite(v) || low || high) {
    char range[96];
    ts_config_describe_float_bounds(d, range, sizeof range);
    return ts_config_fail(ld, d->name, "must be a number in %s, not %g", range, v);
  }
  *(double *)ts_config_field(ld->cfg, d->offset) = v;
  return 0;
}

static int set_bool(ts_config_loader_t *ld, const ts_config_def_t *d, bool v) {
  *(bool *)ts_config_field(ld->cfg, d->offset) = v;
  return 0;
}

/* Checks one string against choices, length and the syntax check. */
static int check_string(ts_config_loader_t *ld, const ts_config_def_t *d, const char *name,
                        const char *s) {
  size_t len = strlen(s);
  if (d->choices) {
    for (size_t i = 0; d->choices[i]; i++)
      if (strcmp(d->choices[i], s) == 0) return (int)i;
    char list[256];
    describe_choices(d, list, sizeof list);
    return ts_config_fail(ld, name, "must be one of %s, not \"%.64s\"", list, s);
  }
  if (len < d->min_len || len > d->max_len) {
    if (d->min_len == 0)
      return ts_config_fail(ld, name, "must be at most %zu bytes long, not %zu", d->max_len, len);
    return ts_config_fail(ld, name, "must be %zu to %zu bytes long, not %zu", d->min_len,
                          d->max_len, len);
  }
  if (d->check) {
    char why[192];
    if (!d->check(s, why, sizeof why)) return ts_config_fail(ld, name, "%s", why);
  }
  return 0;
}

int ts_config_set_string(ts_config_loader_t *ld, const ts_config_def_t *d, const char *s) {
  int rc = check_string(ld, d, d->name, s);
  if (rc < 0) return rc;
  if (d->type == TS_CT_ENUM) {
    *(int *)ts_config_field(ld->cfg, d->offset) = d->choice_values[rc];
    return 0;
  }
  char *copy = ts_strdup(s);
  if (!copy) return ts_config_oom(ld, d->name);
  char **slot = (char **)ts_config_field(ld->cfg, d->offset);
  ts_free(*slot);
  *slot = copy;
  return 0;
}

int ts_config_check_count(ts_config_loader_t *ld, const ts_config_def_t *d, size_t n) {
  if (n >= d->min_len && n <= d->max_len) return 0;
  return ts_config_fail(ld, d->name, "must have %zu to %zu entries, not %zu", d->min_len,
                        d->max_len, n);
}

void ts_config_free_strings(char **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++) ts_free(v[i]);
  ts_free(v);
}

/* Replaces the list only once every entry is checked and copied, so a failure leaves the
 * old value in place. */
int ts_config_set_strings(ts_config_loader_t *ld, const ts_config_def_t *d,
                          const char *const *items, size_t n) {
  int rc = ts_config_check_count(ld, d, n);
  if (rc < 0) return rc;
  for (size_t i = 0; i < n; i++) {
    char name[TS_CONFIG_KEY_LEN + 16];
    snprintf(name, sizeof name, "%s[%zu]", d->name, i);
    rc = check_string(ld, d, name, items[i]);
    if (rc < 0) return rc;
  }
  char **copy = ts_calloc(n ? n : 1, sizeof *copy);
  if (!copy) return ts_config_oom(ld, d->name);
  for (size_t i = 0; i < n; i++) {
    copy[i] = ts_strdup(items[i]);
    if (!copy[i]) {
      ts_config_free_strings(copy, i);
      return ts_config_oom(ld, d->name);
    }
  }
  char ***slot = (char ***)ts_config_field(ld->cfg, d->offset);
  size_t *count = ts_config_count(ld->cfg, d);
  ts_config_free_strings(*slot, *count);
  *slot = copy;
  *count = n;
  return 0;
}

static int set_ints(ts_config_loader_t *ld, const ts_config_def_t *d, const int64_t *v, size_t n) {
  int rc = ts_config_check_count(ld, d, n);
  if (rc < 0) return rc;
  ts_require(d->max_len <= TS_CONFIG_MAX_LAYERS);
  for (size_t i = 0; i < n; i++) {
    char name[TS_CONFIG_KEY_LEN + 16];
    snprintf(name, sizeof name, "%s[%zu]", d->name, i);
    rc = check_int(ld, d, name, v[i]);
    if (rc < 0) return rc;
  }
  int *dst = (int *)ts_config_field(ld->cfg, d->offset);
  for (size_t i = 0; i < n; i++) dst[i] = (int)v[i];
  *ts_config_count(ld->cfg, d) = n;
  return 0;
}

/* ---- From libconfig settings ------------------------------------------------------------ */

static const char *type_name(const config_setting_t *s) {
  switch (config_setting_type(s)) {
    case CONFIG_TYPE_GROUP:
      return "a group";
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:
      return "an integer";
    case CONFIG_TYPE_FLOAT:
      return "a float";
    case CONFIG_TYPE_STRING:
      return "a string";
    case CONFIG_TYPE_BOOL:
      return "a boolean";
    case CONFIG_TYPE_ARRAY:
      return "an array";
    case CONFIG_TYPE_LIST:
      return "a list";
    default:
      return "nothing";
  }
}

static bool is_int(const config_setting_t *s) {
  int t = config_setting_type(s);
  return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
}

static int wrong_type(ts_config_loader_t *ld, const char *name, const char *want,
                      const config_setting_t *s) {
  switch (config_setting_type(s)) {
    case CONFIG_TYPE_STRING:
      return ts_config_fail(ld, name, "must be %s, not a string (\"%.64s\")", want,
                            config_setting_get_string(s));
    case CONFIG_TYPE_FLOAT:
      return ts_config_fail(ld, name, "must be %s, not a float (%g)", want,
                            config_setting_get_float(s));
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:
      return ts_config_fail(ld, name, "must be %s, not an integer (%lld)", want,
                            (long long)config_setting_get_int64(s));
    default:
      return ts_config_fail(ld, name, "must be %s, not %s", want, type_name(s));
  }
}

/* A list whose first element is a group: model.layers written as layers, not widths. */
static bool is_layer_list(const config_setting_t *s) {
  if (!config_setting_is_list(s) || config_setting_length(s) == 0) return false;
  return config_setting_is_group(config_setting_get_elem(s, 0)) != 0;
}

/* model.layers as a layer list (config/ts_config_layers.h) into cfg->net_layers; the widths
 * are cleared, so the rest of the loader and the worker see one form. */
static int set_layer_list(ts_config_loader_t *ld, const config_setting_t *s) {
  ts_config_t *cfg = ld->cfg;
  ts_config_layer_t *tmp = ts_calloc(TS_CONFIG_LAYERS_MAX, sizeof *tmp);
  if (!tmp) return ts_config_oom(ld, "model.layers");
  /* ld->where is "FILE:LINE" of the key; each layer's own line follows the file name. */
  char file[TS_CONFIG_WHERE_LEN];
  snprintf(file, sizeof file, "%s", ld->where);
  char *colon = strrchr(file, ':');
  if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) *colon = '\0';
  size_t n = 0;
  int rc = ts_config_layers_parse(s, file, tmp, TS_CONFIG_LAYERS_MAX, &n, ld->errmsg, ld->errlen);
  if (rc < 0) {
    ts_free(tmp);
    return rc;
  }
  ts_free(cfg->net_layers); /* ownership: the config owns the list, ts_config_free frees it */
  cfg->net_layers = tmp;
  cfg->num_net_layers = n;
  cfg->num_layers = 0;
  return 0;
}

int ts_config_apply_setting(ts_config_loader_t *ld, const ts_config_def_t *d,
                            const config_setting_t *s) {
  int rc = 0;
  switch (d->type) {
    case TS_CT_BOOL:
      if (config_setting_type(s) != CONFIG_TYPE_BOOL)
        return wrong_type(ld, d->name, "true or false", s);
      rc = set_bool(ld, d, config_setting_get_bool(s) != 0);
      break;
    case TS_CT_INT:
    case TS_CT_INT64:
      if (!is_int(s)) return wrong_type(ld, d->name, "an integer", s);
      rc = set_int(ld, d, config_setting_get_int64(s));
      break;
    case TS_CT_FLOAT:
      /* libconfig tells 1 from 1.0; a float key takes both. */
      if (is_int(s))
        rc = set_float(ld, d, (double)config_setting_get_int64(s));
      else if (config_setting_type(s) == CONFIG_TYPE_FLOAT)
        rc = set_float(ld, d, config_setting_get_float(s));
      else
        return wrong_type(ld, d->name, "a number", s);
      break;
    case TS_CT_STRING:
    case TS_CT_ENUM:
      if (config_setting_type(s) != CONFIG_TYPE_STRING)
        return wrong_type(ld, d->name, "a string", s);
      rc = ts_config_set_string(ld, d, config_setting_get_string(s));
      break;
    case TS_CT_STRINGS:
    case TS_CT_INTS:
    case TS_CT_LAYERS: {
      if (d->type == TS_CT_LAYERS && is_layer_list(s)) {
        rc = set_layer_list(ld, s);
        break;
      }
      bool strings = d->type == TS_CT_STRINGS;
      const char *want = strings                   ? "an array of strings"
                         : d->type == TS_CT_LAYERS ? "an array of integers or a list of layers"
                                                   : "an array of integers";
      if (!config_setting_is_array(s) && !config_setting_is_list(s))
        return wrong_type(ld, d->name, want, s);
      size_t n = (size_t)config_setting_length(s);
      rc = ts_config_check_count(ld, d, n); /* before allocating anything sized by the file */
      if (rc < 0) return rc;
      void *tmp = ts_calloc(n ? n : 1, strings ? sizeof(const char *) : sizeof(int64_t));
      if (!tmp) return ts_config_oom(ld, d->name);
      for (size_t i = 0; i < n && rc == 0; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        char name[TS_CONFIG_KEY_LEN + 16];
        snprintf(name, sizeof name, "%s[%zu]", d->name, i);
        if (strings && config_setting_type(e) == CONFIG_TYPE_STRING)
          ((const char **)tmp)[i] = config_setting_get_string(e);
        else if (!strings && is_int(e))
          ((int64_t *)tmp)[i] = config_setting_get_int64(e);
        else
          rc = wrong_type(ld, name, strings ? "a string" : "an integer", e);
      }
      if (rc == 0)
        rc = strings ? ts_config_set_strings(ld, d, (const char *const *)tmp, n)
                     : set_ints(ld, d, (const int64_t *)tmp, n);
      if (rc == 0 && d->type == TS_CT_LAYERS) ld->cfg->num_net_layers = 0;
      ts_free(tmp);
      break;
    }
  }
  if (rc == 0) ts_config_note_origin(ld, d);
  return rc;
}
