/*
 * Inside the configuration loader (config/ts_config.h): the key table and what the files of
 * config/ share. Nothing outside config/ includes this header.
 *
 *   ts_config.c        the key table ts_config_defs (every key's type, bounds, default and
 *                      meaning), its syntax checks, lookups by name, and the enum names.
 *   ts_config_load.c   the loader and the public API: defaults, the file, --set, the rules
 *                      across keys, ts_config_free.
 *   ts_config_set.c    the setters, where every value meets the table's bounds, and the
 *                      loader's error helpers.
 *   ts_config_parse.c  libconfig text to a setting tree, with the 64-bit integer fix.
 *   ts_tfconfig.c      TF_CONFIG (cJSON), applied through the setters.
 *   ts_config_ref.c    the reference writer: docs/configuration.md, generated from the table.
 *
 * The table is constant and the lookups keep no state, so they may be called from any
 * thread. A ts_config_loader_t belongs to the one call that made it.
 */
#ifndef TS_CONFIG_INT_H
#define TS_CONFIG_INT_H

#include <libconfig.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config.h"

/* ---- The key table ---------------------------------------------------------------------- */

typedef enum {
  TS_CT_BOOL,    /* bool */
  TS_CT_INT,     /* int, bounds imin..imax */
  TS_CT_INT64,   /* int64_t, bounds imin..imax */
  TS_CT_FLOAT,   /* double, bounds fmin..fmax (open ends by flag); ints accepted */
  TS_CT_STRING,  /* char *, length min_len..max_len, optional choices and check */
  TS_CT_ENUM,    /* an int-sized enum: one of choices, stored as choice_values[i] */
  TS_CT_STRINGS, /* char ** plus a size_t count at count_offset */
  TS_CT_INTS,    /* int[max_len] inline plus a size_t count at count_offset */
  TS_CT_LAYERS,  /* model.layers: TS_CT_INTS, or a list of layer groups into net_layers */
} ts_config_type_t;

#define TS_CF_OPEN_MIN 0x1u /* float: the minimum itself is not allowed */
#define TS_CF_OPEN_MAX 0x2u /* float: the maximum itself is not allowed */

/* A syntax check for one string value; fills why (one phrase) and returns false when bad. */
typedef bool (*ts_config_check_fn)(const char *value, char *why, size_t whylen);

/* One key. Every pointer refers to static storage. */
typedef struct {
  const char *name; /* dotted key, "section.key" */
  ts_config_type_t type;
  size_t offset;              /* target field in ts_config_t */
  const char *member;         /* its name ("batch_size"): Python's Job calls the key so */
  size_t count_offset;        /* TS_CT_STRINGS, TS_CT_INTS: the size_t element count */
  int64_t imin, imax;         /* TS_CT_INT, TS_CT_INT64, TS_CT_INTS (each element) */
  int64_t multiple;           /* integers: the value must be a multiple of this (0 = any) */
  double fmin, fmax;          /* TS_CT_FLOAT */
  unsigned flags;             /* TS_CF_* */
  size_t min_len, max_len;    /* TS_CT_STRING: bytes; TS_CT_STRINGS, TS_CT_INTS: entries */
  const char *const *choices; /* TS_CT_STRING, TS_CT_ENUM: allowed values, NULL-terminated */
  const int *choice_values;   /* TS_CT_ENUM: what is stored for choices[i] */
  ts_config_check_fn check;   /* TS_CT_STRING, TS_CT_STRINGS: per-value syntax */
  const char *check_doc;      /* what check accepts, for the reference */
  const char *def;            /* the default, in libconfig syntax */
  const char *doc;            /* meaning, and the reason for the limits */
} ts_config_def_t;

/* Every key of a job file, ts_config_ndefs of them, grouped by section in the order
 * docs/configuration.md lists them. An index into it identifies a key. */
extern const ts_config_def_t ts_config_defs[];
extern const size_t ts_config_ndefs;

/* The key called name ("job.mode"), or NULL when there is none. */
const ts_config_def_t *ts_config_find_def(const char *name);
/* The key called name, which must exist (a typo in the code is fatal, not an error). */
const ts_config_def_t *ts_config_def_named(const char *name);
/* True when name is a section ("job"): some key starts with "name.". */
bool ts_config_is_section(const char *name);
/* Fills out[outlen] (outlen > 0) with the key or section most like an unknown name ("jbo" ->
 * "job", "job.batch_size" -> "train.batch_size"), or with "" when none is close. */
void ts_config_suggest(const char *name, char *out, size_t outlen);

/* The field at offset in *cfg, and the element count of a TS_CT_STRINGS or TS_CT_INTS key. */
static inline void *ts_config_field(ts_config_t *cfg, size_t offset) {
  return (char *)cfg + offset;
}
static inline size_t *ts_config_count(ts_config_t *cfg, const ts_config_def_t *d) {
  return (size_t *)ts_config_field(cfg, d->count_offset);
}

/* Writes "[imin, imax]" (integers) or "[fmin, fmax]" with "(" or ")" for an open end (floats)
 * into buf[n]: the same words in error messages and in the reference. */
void ts_config_describe_int_bounds(const ts_config_def_t *d, char *buf, size_t n);
void ts_config_describe_float_bounds(const ts_config_def_t *d, char *buf, size_t n);

/* ---- The loader ------------------------------------------------------------------------- */

#define TS_CONFIG_WHERE_LEN 160 /* a source: "job.cfg:12", "--set KEY=VALUE", "TF_CONFIG" */
#define TS_CONFIG_KEY_LEN 128   /* a dotted key name */

/* One ts_config_load (or ts_config_defaults) in progress. It belongs to that call and lives
 * only as long as it; allocate sizeof(ts_config_loader_t) + ts_config_ndefs *
 * TS_CONFIG_WHERE_LEN bytes for the origins. */
typedef struct {
  ts_config_t *cfg; /* the configuration being filled (the caller's) */
  char *errmsg;     /* the caller's buffer for the one error line, errlen bytes */
  size_t errlen;
  char where[TS_CONFIG_WHERE_LEN]; /* the source of what is applied now */
  char task_origin[TS_CONFIG_WHERE_LEN];
  char origin[][TS_CONFIG_WHERE_LEN]; /* where each key was last set, by table index */
} ts_config_loader_t;

/* Writes "<where>: <name>: <message>" (or "<where>: <message>" when name is NULL) to
 * ld->errmsg and returns TS_ECONFIG. */
int ts_config_fail(ts_config_loader_t *ld, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes "<where>: <name>: out of memory" and returns TS_ENOMEM. */
int ts_config_oom(ts_config_loader_t *ld, const char *name);
/* Fails with "unknown key", naming the closest key when one is close. */
int ts_config_fail_unknown(ts_config_loader_t *ld, const char *name);
/* Records ld->where as where d was last set, for cross-key errors. */
void ts_config_note_origin(ts_config_loader_t *ld, const ts_config_def_t *d);

/* Setters: each checks the value against d's bounds, then stores it in ld->cfg; on error the
 * field keeps its old value. The value is copied; the caller keeps what it passed. They do
 * not note the origin (the caller does, once a whole value is in). Return 0, TS_ECONFIG or
 * TS_ENOMEM, with ld->errmsg filled. */
int ts_config_set_string(ts_config_loader_t *ld, const ts_config_def_t *d, const char *s);
int ts_config_set_strings(ts_config_loader_t *ld, const ts_config_def_t *d,
                          const char *const *items, size_t n);
/* Fails unless n is within d's min_len..max_len entries (before anything sized by n is
 * allocated). */
int ts_config_check_count(ts_config_loader_t *ld, const ts_config_def_t *d, size_t n);
/* Applies one parsed libconfig setting to d, converting and checking its type, and notes the
 * origin on success. */
int ts_config_apply_setting(ts_config_loader_t *ld, const ts_config_def_t *d,
                            const config_setting_t *s);
/* Frees v[0..n) and v; v may be NULL. */
void ts_config_free_strings(char **v, size_t n);

/* Parses libconfig text into c (initialised by the caller, who destroys it), widening integer
 * literals beyond 32 bits first (see ts_config.h). include_dir (may be NULL) is where
 * @include looks. Errors read "label:line: message", or just the message when label is NULL
 * (a --set value has one line). Returns 0, TS_ECONFIG or TS_ENOMEM. */
int ts_config_parse_text(ts_config_loader_t *ld, config_t *c, const char *text, const char *label,
                         const char *include_dir);

/* ---- TF_CONFIG -------------------------------------------------------------------------- */

/* Applies the TF_CONFIG value tf (ts_config.h describes it) to ld->cfg: cluster.ps and
 * cluster.workers through the table's checks, and the task's role and index (noting
 * ld->task_origin; the index is checked against the lists later, with the cross-key rules).
 * An empty or blank tf does nothing. Returns 0, TS_ECONFIG or TS_ENOMEM. */
int ts_tfconfig_apply(ts_config_loader_t *ld, const char *tf);

#endif
