/*
 * What the benchmarks that start shards take from the job file's defaults (config/ts_config.h).
 */
#ifndef BENCH_CONFIG_H
#define BENCH_CONFIG_H

#include "ts_config.h"

/* job.busy_poll_us's configuration default, or -1 when out of memory. */
static inline long bench_default_busy_poll_us(void) {
  ts_config_t defaults;
  if (ts_config_defaults(&defaults) < 0) return -1;
  long us = defaults.busy_poll_us;
  ts_config_free(&defaults);
  return us;
}

#endif
