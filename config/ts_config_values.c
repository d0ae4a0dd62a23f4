/*
 * Key values read generically (ts_config_value): what the table says of a key (its field's
 * offset and type) is enough to read it from any ts_config_t, so the bindings that show a
 * job's settings need no list of keys of their own.
 */
#include <string.h>

#include "ts_config.h"
#include "ts_config_int.h"
#include "ts_err.h"

size_t ts_config_num_keys(void) { return ts_config_ndefs; }

void ts_config_value(const ts_config_t *cfg, size_t i, ts_config_value_t *out) {
  ts_require(i < ts_config_ndefs);
  const ts_config_def_t *d = &ts_config_defs[i];
  ts_require(d->member != NULL); /* every entry names its field (the table's macros do) */
  ts_config_t *c = (ts_config_t *)cfg; /* read only: the accessors are shared with the loader */
  const void *f = ts_config_field(c, d->offset);
  memset(out, 0, sizeof *out);
  out->key = d->name;
  out->field = d->member;
  out->doc = d->doc;
  switch (d->type) {
    case TS_CT_BOOL:
      out->kind = TS_CONFIG_VALUE_BOOL;
      out->b = *(const bool *)f;
      break;
    case TS_CT_INT:
      out->kind = TS_CONFIG_VALUE_INT;
      out->i = *(const int *)f;
      break;
    case TS_CT_INT64:
      out->kind = TS_CONFIG_VALUE_INT;
      out->i = *(const int64_t *)f;
      break;
    case TS_CT_FLOAT:
      out->kind = TS_CONFIG_VALUE_FLOAT;
      out->f = *(const double *)f;
      break;
    case TS_CT_STRING:
      out->kind = TS_CONFIG_VALUE_STRING;
      out->s = *(char *const *)f ? *(char *const *)f : "";
      break;
    case TS_CT_ENUM:
      out->kind = TS_CONFIG_VALUE_STRING;
      out->s = "unknown";
      for (size_t k = 0; d->choices[k]; k++)
        if (d->choice_values[k] == *(const int *)f) out->s = d->choices[k];
      break;
    case TS_CT_STRINGS:
      out->kind = TS_CONFIG_VALUE_STRINGS;
      out->strs = *(char **const *)f;
      out->n = *ts_config_count(c, d);
      break;
    case TS_CT_INTS:
    case TS_CT_LAYERS:
      out->kind = TS_CONFIG_VALUE_INTS;
      out->ints = f;
      out->n = *ts_config_count(c, d);
      break;
  }
}
