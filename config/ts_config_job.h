/*
 * The settings that make a job: every process of a job must agree on them, so a worker sends
 * its own values in its handshake and a shard refuses a worker whose value of one differs
 * from its own (docs/architecture.md, "A worker joining its job").
 *
 * Glossary. A *job setting* is a key as a job file spells it ("job.mode") and its value as
 * text, spelt the same way by every process ("\"sync\"", "0.1", "[784, 128, 10]"; for
 * cluster.workers the number of workers, "2 workers"), so comparing two is comparing two
 * strings. A setting that only one mode or optimizer uses (job.staleness: ssp;
 * optimizer.momentum: momentum) is sent only when that mode or optimizer is the worker's:
 * the mode or optimizer name, sent first, differs before it.
 */
#ifndef TS_CONFIG_JOB_H
#define TS_CONFIG_JOB_H

#include <stddef.h>

#include "ts_config.h"

/* The most settings ts_config_job_settings fills, and the room for one value (model.layers
 * at its largest: 64 widths of up to 7 digits). */
#define TS_CONFIG_JOB_MAX 24
#define TS_CONFIG_JOB_VALUE_LEN 640

typedef struct {
  const char *key;                     /* static storage */
  char value[TS_CONFIG_JOB_VALUE_LEN]; /* NUL-terminated */
} ts_config_job_setting_t;

/* Fills out[0..TS_CONFIG_JOB_MAX) with cfg's job settings, in a fixed order (job.mode first)
 * and returns how many. Never fails. */
size_t ts_config_job_settings(const ts_config_t *cfg, ts_config_job_setting_t *out);

/* Compares a peer's setting (key and value text, as ts_config_job_settings makes them) with
 * cfg's own. Returns 1 when they are equal, or when key is not a job setting this version
 * knows (a newer peer's: nothing to compare it with), 0 when they differ; then mine holds
 * cfg's value (mine[minelen], minelen > 0). */
int ts_config_job_compare(const ts_config_t *cfg, const char *key, const char *value, char *mine,
                          size_t minelen);

#endif
