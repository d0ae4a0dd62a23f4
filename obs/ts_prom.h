/*
 * Prometheus text exposition (format 0.0.4), written into a growable buffer.
 *
 * Glossary: a *family* is one metric name with its `# HELP` and `# TYPE` lines; a *sample*
 * is one `name{labels} value` line. Names follow Prometheus' conventions: one application
 * prefix (`tessera_`), base units (`_seconds`, `_bytes`), counters end in `_total`.
 *
 * Nothing here locks or allocates behind the caller's back except the buffer it is given:
 * histograms are plain structs the owning thread updates, and rendering reads a copy of them
 * (the daemons render on their HTTP thread from a snapshot, CONTRIBUTING.md).
 */
#ifndef TS_PROM_H
#define TS_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The exact Content-Type of the text format; Prometheus 3 refuses a scrape without it. */
#define TS_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A growable NUL-terminated text buffer. `failed` is set once an allocation fails; later
 * appends do nothing, so a caller checks once at the end. Free with ts_buf_free. */
typedef struct {
  char *data;
  size_t len, cap;
  bool failed;
} ts_buf_t;

void ts_buf_printf(ts_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ts_buf_append(ts_buf_t *b, const char *s, size_t n);
void ts_buf_free(ts_buf_t *b);

#define TS_PROM_MAX_BUCKETS 16

/* A histogram with fixed upper bounds (ascending, without +Inf, at most
 * TS_PROM_MAX_BUCKETS). counts[i] counts observations <= bounds[i] only (not cumulative);
 * rendering accumulates. Zero-initialise, then set bounds/num_bounds (or use
 * ts_prom_hist_init). */
typedef struct {
  const double *bounds;
  size_t num_bounds;
  uint64_t counts[TS_PROM_MAX_BUCKETS + 1]; /* last: above every bound */
  uint64_t count;
  double sum;
} ts_prom_hist_t;

/* Bounds for request and step durations: 100 us to 60 s, roughly x2.5 apart. */
extern const double ts_prom_duration_bounds[];
extern const size_t ts_prom_num_duration_bounds;

void ts_prom_hist_init(ts_prom_hist_t *h, const double *bounds, size_t n);
void ts_prom_hist_observe(ts_prom_hist_t *h, double value);

/* `# HELP name help` and `# TYPE name type` (type: counter, gauge, histogram, untyped).
 * help is escaped as the format requires. */
void ts_prom_family(ts_buf_t *b, const char *name, const char *type, const char *help);

/* One sample. labels is NULL or the text between the braces, already escaped
 * (`op="push"`); use ts_prom_label_escape for values from outside. Integers print exactly
 * up to 2^53; NaN and infinities print as NaN, +Inf, -Inf. */
void ts_prom_sample(ts_buf_t *b, const char *name, const char *labels, double value);

/* The _bucket (with le, cumulative, ending in +Inf), _sum and _count samples of h. labels
 * as above; le is added after them. Does not write the family lines. */
void ts_prom_hist_samples(ts_buf_t *b, const char *name, const char *labels,
                          const ts_prom_hist_t *h);

/* Escape a label value (backslash, double quote, newline) into out (size n, truncating).
 * Returns out. */
char *ts_prom_label_escape(const char *value, char *out, size_t n);

/* The standard process_* families of the calling process (start time, CPU seconds,
 * resident memory, open file descriptors, thread count) read from /proc/self; families
 * whose source cannot be read are left out. */
void ts_prom_process(ts_buf_t *b);

#endif
