/*
 * The job's status as JSON: one schema for `psctl status --output json` and a shard's
 * /status page (docs/configuration.md), built from the shards' status in the client
 * library's plain-C form (ts_client_shard_status_t; a shard converts its own ShardStatus
 * with proto/ts_status.h, as the client library does).
 *
 * Glossary: a *view* is what one observer knows: for psctl, every shard of the job (those
 * that did not answer have st == NULL and a reason); for a shard's /status, that shard
 * alone. Workers are merged over the shards of the view: the freshest sighting that
 * carries a progress report gives loss and speed; the step is, in sync mode, the lowest over
 * the shards holding partitions (each shard's snapshot is taken at its own moment, and the
 * job's step is their lowest version too, so a worker keeping up is never shown more than
 * one step behind the job), else the largest.
 *
 * A worker's state: "alive" (live: connected and heard from), "stopped" (it said it
 * finished), "dead" (it vanished or missed its heartbeats), "not joined" (never seen).
 *
 * The JSON object (stable; fields are only ever added):
 *   {"mode", "step", "healthy", "job_id", "num_workers" (cluster.workers), "workers_joined"
 *    (those that took part), "shards": [{"index", "address", "up", "partitions",
 *    "bytes", "version", "step", "pushes", "pulls", "stale_dropped", "rejected_frames",
 *    "errors", "connections", "uptime_s", "barrier_waiting_for", "tables": [{"name",
 *    "dim", "rows", "bytes", "version", "created", "evicted", "filtered", "pulled_rows",
 *    "pushed_rows", "hot_share", "hot_keys" (ids as strings)}]} | {"index", "address",
 *    "up": false, "partitions": 0, "bytes": 0, "version": 0, "error"}],
 *    "workers": [{"task", "step", "loss", "examples_per_sec", "last_seen_s", "alive",
 *    "done", "epoch_progress", "state", "device"}],
 *    "final_test_accuracy" (null until the job's reporting worker sent it)}
 *   A worker's value not reported yet is null, the key still present: last_seen_s when never
 *   seen; step before its first report or accepted push; loss, examples_per_sec and
 *   epoch_progress before its first progress report; device before it reports one.
 */
#ifndef TS_JOB_STATUS_H
#define TS_JOB_STATUS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/client.h"

typedef struct {
  size_t index; /* shard index in cluster.ps */
  const char *address;
  const ts_client_shard_status_t *st; /* NULL: the shard did not answer */
  const char *error;                  /* why it did not answer (may be NULL) */
} ts_job_status_shard_t;

typedef struct {
  const ts_job_status_shard_t *shards;
  size_t num_shards;
  size_t num_workers;          /* the job's workers (cluster.workers) */
  const char *configured_mode; /* its name ("sync"), shown when no shard answered */
} ts_job_status_view_t;

/* One worker as the view sees it. */
typedef struct {
  int task;
  bool seen, alive, done;
  bool step_known; /* step was reported (else it is shown as null / "-") */
  bool reported;   /* loss, examples_per_sec, epoch_progress were reported */
  uint64_t step;
  double loss, examples_per_sec, last_seen_s, epoch_progress;
  const char *device; /* the device it trains on; NULL or "" until reported */
  bool has_auc, has_test_auc; /* a CTR model's AUC (progressive) and test AUC, log loss */
  double auc, test_auc, test_logloss;
} ts_job_status_worker_t;

/* "alive", "stopped", "dead" or "not joined" (see above). */
const char *ts_job_status_worker_state(const ts_job_status_worker_t *w);

/* Merge the workers over the view's shards into w[0..v->num_workers) (caller's array). */
void ts_job_status_merge_workers(const ts_job_status_view_t *v, ts_job_status_worker_t *w);

/* The job's step: in sync mode the lowest shard step (shards move together), otherwise
 * the largest (each shard counts the pushes it applied). *mode gets the shards' mode, or
 * TS_CLIENT_MODE_UNSPECIFIED when none answered. */
uint64_t ts_job_status_job_step(const ts_job_status_view_t *v, ts_client_mode_t *mode);

/* The job's final test accuracy when a shard of the view has it (the reporting worker
 * sends it to every shard): true with *acc and *task (may be NULL). */
bool ts_job_status_final_accuracy(const ts_job_status_view_t *v, double *acc, int *task);

/* Shards of the view that answered. */
/* The job's identity (ts_client_shard_status_t.job_id) as the first shard up with a model
 * says it; NULL before a model is declared. */
const char *ts_job_status_job_id(const ts_job_status_view_t *v);

/* Workers that took part in the job: the most any shard of the view saw join
 * (ts_client_shard_status_t.workers_joined). */
uint32_t ts_job_status_workers_joined(const ts_job_status_view_t *v);

/* Shards up whose checkpoints fail (the last attempt, and any before it since one was
 * written): the job is not healthy while any does, as nothing new survives a restart. */
size_t ts_job_status_ckpt_failing(const ts_job_status_view_t *v);
size_t ts_job_status_shards_up(const ts_job_status_view_t *v);

/* The JSON pieces; each returns a new cJSON tree (NULL when out of memory) the caller
 * deletes with cJSON_Delete. */
cJSON *ts_job_status_json_shard(const ts_job_status_shard_t *s);
cJSON *ts_job_status_json_table(const ts_client_table_status_t *t);
cJSON *ts_job_status_json_worker(const ts_job_status_worker_t *w);

/* The whole object above; with_workers = false leaves out "workers" (psctl health). */
cJSON *ts_job_status_json_job(const ts_job_status_view_t *v, bool with_workers);

#endif
