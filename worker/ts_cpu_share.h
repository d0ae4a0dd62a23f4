/*
 * How many threads one CPU op of a worker may use when device.intra_op_parallelism_threads
 * is 0: the CPUs this process may run on, shared by the workers of the job that run on the
 * same host (cluster.workers entries with this worker's host), so that two workers on a
 * two-core machine do not each start two OpenBLAS threads and fight over the cores.
 */
#ifndef TS_CPU_SHARE_H
#define TS_CPU_SHARE_H

#include <stddef.h>

#include "ts_config.h"

/* The CPUs this process may run on (its affinity mask; sysconf's online count if that
 * cannot be read), at least 1. */
int ts_cpu_share_cpus(void);

/* Threads for worker `task` of cfg with `cpus` CPUs: cfg->intra_op_threads when set, else
 * max(1, cpus / the workers sharing this worker's host). why gets a phrase for the log
 * ("2 CPUs shared by 2 workers on 127.0.0.1"). */
int ts_cpu_share_threads(const ts_config_t *cfg, int task, int cpus, char *why, size_t whylen);

#endif
