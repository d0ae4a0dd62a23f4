/*
 * The job's status as JSON: one schema for `psctl status --output json` and a shard's
 * /status page (docs/configuration.md), built from the shards' status in the client
 * library's plain-C form (ts_client_shard_status_t; a shard converts its own ShardStatus
 * with proto/ts_status.h, as the client library does).
 *
 * Glossary: a *view* is what one observer knows: for psctl, every shard of the job (those
 * that did not answer have st == NULL and a reason); for a shard's /status, that shard
 * alone. Workers are merged over the shards of the view: the freshest sighting gives loss
 * and speed, the largest step wins.
 *
 * The JSON object (stable; fields are only ever added):
 *   {"mode", "step", "healthy", "shards": [{"index", "address", "up", "partitions",
 *    "bytes", "version", "step", "pushes", "pulls", "stale_dropped", "rejected_frames",
 *    "errors", "connections", "uptime_s", "barrier_waiting_for"} | {"index", "address",
 *    "up": false, "partitions": 0, "bytes": 0, "version": 0, "error"}],
 *    "workers": [{"task", "step", "loss", "examples_per_sec", "last_seen_s" (null when
 *    never seen), "alive", "done", "epoch_progress"}],
 *    "final_test_accuracy" (null until the job's reporting worker sent it)}
 */
#ifndef TS_STATUS_JSON_H
#define TS_STATUS_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/client.h"

typedef struct {
  size_t index;                  /* shard index in cluster.ps */
  const char *address;
  const ts_client_shard_status_t *st; /* NULL: the shard did not answer */
  const char *error;              /* why it did not answer (may be NULL) */
} ts_status_shard_t;

typedef struct {
  const ts_status_shard_t *shards;
  size_t num_shards;
  size_t num_workers;            /* the job's workers (cluster.workers) */
  const char *configured_mode;   /* its name ("sync"), shown when no shard answered */
} ts_status_view_t;

/* One worker as the view sees it. */
typedef struct {
  int task;
  bool seen, alive, done;
  uint64_t step;
  double loss, examples_per_sec, last_seen_s, epoch_progress;
} ts_status_worker_t;

/* Merge the workers over the view's shards into w[0..v->num_workers) (caller's array). */
void ts_status_merge_workers(const ts_status_view_t *v, ts_status_worker_t *w);

/* The job's step: in sync mode the lowest shard step (shards move together), otherwise
 * the largest (each shard counts the pushes it applied). *mode gets the shards' mode, or
 * TS_CLIENT_MODE_UNSPECIFIED when none answered. */
uint64_t ts_status_job_step(const ts_status_view_t *v, ts_client_mode_t *mode);

/* The job's final test accuracy when a shard of the view has it (the reporting worker
 * sends it to every shard): true with *acc and *task (may be NULL). */
bool ts_status_final_accuracy(const ts_status_view_t *v, double *acc, int *task);

/* Shards of the view that answered. */
size_t ts_status_shards_up(const ts_status_view_t *v);

/* The JSON pieces; each returns a new cJSON tree (NULL when out of memory) the caller
 * deletes with cJSON_Delete. */
cJSON *ts_status_json_shard(const ts_status_shard_t *s);
cJSON *ts_status_json_worker(const ts_status_worker_t *w);

/* The whole object above; with_workers = false leaves out "workers" (psctl health). */
cJSON *ts_status_json_job(const ts_status_view_t *v, bool with_workers);

#endif
