/*
 * psctl tables: the job's embedding tables as the shards hold them, one block per table
 * (its totals, then a line per shard), or the same as JSON. With a first sample taken
 * `interval` seconds before (psctl tables --interval S), rates per second too.
 */
#ifndef PSCTL_TABLES_H
#define PSCTL_TABLES_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "ts_job_status.h"

/* The JSON array: [{"name", "dim", "rows", "bytes", "created", "evicted", "filtered",
 * "shards": [{"index", "rows", "bytes", "version", "created", "evicted", "filtered",
 * "pulled_rows", "pushed_rows", "hot_share", "hot_keys"}]}], the tables in declared order,
 * and with a first sample (before: per shard index, NULL entries where a shard did not
 * answer; interval > 0) "created_per_s", "evicted_per_s", "pulled_rows_per_s" in the table
 * and in each shard (NULL: out of memory). */
cJSON *psctl_tables_json(const ts_job_status_shard_t *shards, size_t n,
                         ts_client_shard_status_t *const *before, double interval);

/* The table form on f; says so when no shard that answered holds a table. */
void psctl_tables_print(FILE *f, const ts_job_status_shard_t *shards, size_t n,
                        ts_client_shard_status_t *const *before, double interval);

#endif
