/*
 * Inside the configuration loader (config/ts_config.h): the key table and what its files
 * share. Nothing outside config/ includes this header.
 *
 *   ts_config.c      the key table ts_config_defs (every key's type, bounds, default and
 *                    meaning), its syntax checks, lookups by name, and the enum names.
 *   ts_config_ref.c  the reference writer: docs/configuration.md, generated from the table.
 *
 * The table is constant and the lookups keep no state, so every function here may be called
 * from any thread.
 */
#ifndef TS_CONFIG_INT_H
#define TS_CONFIG_INT_H

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

/* Writes "[imin, imax]" (integers) or "[fmin, fmax]" with "(" or ")" for an open end (floats)
 * into buf[n]: the same words in error messages and in the reference. */
void ts_config_describe_int_bounds(const ts_config_def_t *d, char *buf, size_t n);
void ts_config_describe_float_bounds(const ts_config_def_t *d, char *buf, size_t n);

#endif
