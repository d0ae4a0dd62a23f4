/*
 * psctl tables: the job's embedding tables as the shards hold them, one block per table
 * (its totals, then a line per shard), or the same as JSON.
 */
#ifndef PSCTL_TABLES_H
#define PSCTL_TABLES_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "ts_job_status.h"

/* The JSON array: [{"name", "dim", "rows", "bytes", "created", "evicted", "filtered",
 * "shards": [{"index", "rows", "bytes", "version", "created", "evicted", "filtered",
 * "pulled_rows", "pushed_rows"}]}], the tables in declared order (NULL: out of memory). */
cJSON *psctl_tables_json(const ts_job_status_shard_t *shards, size_t n);

/* The table form on f; says so when no shard that answered holds a table. */
void psctl_tables_print(FILE *f, const ts_job_status_shard_t *shards, size_t n);

#endif
