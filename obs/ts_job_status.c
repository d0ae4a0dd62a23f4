#include "ts_job_status.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_msg.h"

void ts_job_status_merge_workers(const ts_job_status_view_t *v, ts_job_status_worker_t *w) {
  size_t nw = v->num_workers;
  memset(w, 0, nw * sizeof *w);
  for (size_t t = 0; t < nw; t++) w[t].task = (int)t;
  for (size_t s = 0; s < v->num_shards; s++) {
    const ts_client_shard_status_t *st = v->shards[s].st;
    if (!st) continue;
    bool sync = st->mode == TS_CLIENT_MODE_SYNC;
    for (size_t i = 0; i < st->num_workers_seen; i++) {
      const ts_client_worker_status_t *ws = &st->workers[i];
      if (ws->task < 0 || (size_t)ws->task >= nw) continue;
      ts_job_status_worker_t *x = &w[ws->task];
      if (ws->reported && (!x->reported || ws->last_seen_s <= x->last_seen_s)) {
        x->loss = ws->loss;
        x->examples_per_sec = ws->examples_per_sec;
        x->epoch_progress = ws->epoch_progress;
        x->reported = true;
      }
      /* Every shard gets the same heartbeats: the freshest shard's AUC. */
      if (ws->has_auc && (!x->has_auc || ws->last_seen_s <= x->last_seen_s)) {
        x->has_auc = true;
        x->auc = ws->auc;
      }
      if (ws->has_test_auc && !x->has_test_auc) {
        x->has_test_auc = true;
        x->test_auc = ws->test_auc;
        x->test_logloss = ws->test_logloss;
      }
      if (!x->seen || ws->last_seen_s < x->last_seen_s) x->last_seen_s = ws->last_seen_s;
      /* A shard without partitions gets no pushes: its step of the worker lags (sync). */
      if (ws->step_known && (!sync || st->partitions > 0)) {
        if (!x->step_known || (sync ? ws->step < x->step : ws->step > x->step)) x->step = ws->step;
        x->step_known = true;
      }
      if (ws->device && *ws->device && !x->device) x->device = ws->device;
      x->alive |= ws->alive;
      x->done |= ws->done;
      x->seen = true;
    }
  }
}

const char *ts_job_status_worker_state(const ts_job_status_worker_t *w) {
  if (!w->seen) return "not joined";
  if (w->done) return "stopped";
  return w->alive ? "alive" : "dead";
}

uint64_t ts_job_status_job_step(const ts_job_status_view_t *v, ts_client_mode_t *mode) {
  uint64_t step = 0;
  bool first = true;
  *mode = TS_CLIENT_MODE_UNSPECIFIED;
  for (size_t s = 0; s < v->num_shards; s++) {
    const ts_client_shard_status_t *st = v->shards[s].st;
    if (!st) continue;
    *mode = st->mode;
    /* A sync shard without partitions has no version of its own (0): it does not hold the
     * job's step back. */
    if (st->mode == TS_CLIENT_MODE_SYNC && st->partitions == 0) continue;
    if (st->mode == TS_CLIENT_MODE_SYNC)
      step = first || st->step < step ? st->step : step;
    else
      step = st->step > step ? st->step : step;
    first = false;
  }
  return step;
}

size_t ts_job_status_shards_up(const ts_job_status_view_t *v) {
  size_t up = 0;
  for (size_t s = 0; s < v->num_shards; s++) up += v->shards[s].st != NULL;
  return up;
}

const char *ts_job_status_job_id(const ts_job_status_view_t *v) {
  for (size_t s = 0; s < v->num_shards; s++) {
    const ts_client_shard_status_t *st = v->shards[s].st;
    if (st && st->job_id && *st->job_id) return st->job_id;
  }
  return NULL;
}

uint32_t ts_job_status_workers_joined(const ts_job_status_view_t *v) {
  uint32_t n = 0;
  for (size_t s = 0; s < v->num_shards; s++) {
    const ts_client_shard_status_t *st = v->shards[s].st;
    if (st && st->workers_joined > n) n = st->workers_joined;
  }
  return n;
}

size_t ts_job_status_ckpt_failing(const ts_job_status_view_t *v) {
  size_t n = 0;
  for (size_t s = 0; s < v->num_shards; s++)
    n += v->shards[s].st && v->shards[s].st->checkpoint_failures > 0;
  return n;
}

bool ts_job_status_final_accuracy(const ts_job_status_view_t *v, double *acc, int *task) {
  for (size_t s = 0; s < v->num_shards; s++) {
    const ts_client_shard_status_t *st = v->shards[s].st;
    if (!st || !st->has_final_test_accuracy) continue;
    *acc = st->final_test_accuracy;
    if (task) *task = st->final_reporter;
    return true;
  }
  return false;
}

cJSON *ts_job_status_json_table(const ts_client_table_status_t *t) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "name", t->name ? t->name : "");
  cJSON_AddNumberToObject(o, "dim", t->dim);
  cJSON_AddNumberToObject(o, "rows", (double)t->rows);
  cJSON_AddNumberToObject(o, "bytes", (double)t->bytes);
  cJSON_AddNumberToObject(o, "version", (double)t->version);
  cJSON_AddNumberToObject(o, "created", (double)t->created);
  cJSON_AddNumberToObject(o, "evicted", (double)t->evicted);
  cJSON_AddNumberToObject(o, "filtered", (double)t->filtered);
  cJSON_AddNumberToObject(o, "pulled_rows", (double)t->pulled_rows);
  cJSON_AddNumberToObject(o, "pushed_rows", (double)t->pushed_rows);
  cJSON_AddNumberToObject(o, "hot_share", t->hot_share);
  cJSON *hot = cJSON_AddArrayToObject(o, "hot_keys");
  for (uint32_t k = 0; hot && k < t->num_hot_keys; k++) {
    char key[24]; /* as text: a 64-bit id does not fit a JSON number exactly */
    snprintf(key, sizeof key, "%lld", (long long)t->hot_keys[k]);
    cJSON_AddItemToArray(hot, cJSON_CreateString(key));
  }
  return o;
}

static void add_number_or_null(cJSON *o, const char *key, bool known, double value) {
  if (known)
    cJSON_AddNumberToObject(o, key, value);
  else
    cJSON_AddNullToObject(o, key);
}

cJSON *ts_job_status_json_shard(const ts_job_status_shard_t *sh) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  const ts_client_shard_status_t *st = sh->st;
  cJSON_AddNumberToObject(o, "index", (double)sh->index);
  cJSON_AddStringToObject(o, "address", sh->address ? sh->address : "");
  cJSON_AddBoolToObject(o, "up", st != NULL);
  if (st) {
    cJSON_AddNumberToObject(o, "partitions", st->partitions);
    cJSON_AddNumberToObject(o, "bytes", (double)st->bytes);
    cJSON_AddNumberToObject(o, "version", (double)st->version);
    cJSON_AddNumberToObject(o, "step", (double)st->step);
    cJSON_AddNumberToObject(o, "pushes", (double)st->pushes);
    cJSON_AddNumberToObject(o, "pulls", (double)st->pulls);
    cJSON_AddNumberToObject(o, "stale_dropped", (double)st->stale_dropped);
    cJSON_AddNumberToObject(o, "rejected_frames", (double)st->rejected_frames);
    cJSON_AddNumberToObject(o, "errors", (double)st->errors);
    cJSON_AddNumberToObject(o, "connections", (double)st->connections);
    cJSON_AddNumberToObject(o, "uptime_s", st->uptime_s);
    /* The newest checkpoint and, while checkpoints fail, how often and why. */
    cJSON *ck = cJSON_AddObjectToObject(o, "checkpoint");
    if (ck) {
      cJSON_AddStringToObject(ck, "last", st->last_checkpoint ? st->last_checkpoint : "");
      add_number_or_null(ck, "age_s", st->last_checkpoint_age_s >= 0, st->last_checkpoint_age_s);
      cJSON_AddNumberToObject(ck, "failures", st->checkpoint_failures);
      cJSON_AddStringToObject(ck, "error", st->checkpoint_error ? st->checkpoint_error : "");
    }
    cJSON *wait = cJSON_AddArrayToObject(o, "barrier_waiting_for");
    for (size_t i = 0; wait && i < st->num_barrier_waiting_for; i++)
      cJSON_AddItemToArray(wait, cJSON_CreateNumber(st->barrier_waiting_for[i]));
    cJSON *tables = cJSON_AddArrayToObject(o, "tables");
    for (size_t i = 0; tables && i < st->num_tables; i++)
      cJSON_AddItemToArray(tables, ts_job_status_json_table(&st->tables[i]));
  } else {
    cJSON_AddNumberToObject(o, "partitions", 0);
    cJSON_AddNumberToObject(o, "bytes", 0);
    cJSON_AddNumberToObject(o, "version", 0);
    cJSON_AddStringToObject(o, "error", sh->error ? sh->error : "no answer");
  }
  return o;
}

cJSON *ts_job_status_json_worker(const ts_job_status_worker_t *w) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "task", w->task);
  add_number_or_null(o, "step", w->step_known, (double)w->step);
  add_number_or_null(o, "loss", w->reported, w->loss);
  add_number_or_null(o, "examples_per_sec", w->reported, w->examples_per_sec);
  add_number_or_null(o, "last_seen_s", w->seen, w->last_seen_s);
  cJSON_AddBoolToObject(o, "alive", w->alive);
  cJSON_AddBoolToObject(o, "done", w->done);
  add_number_or_null(o, "epoch_progress", w->reported, w->epoch_progress);
  cJSON_AddStringToObject(o, "state", ts_job_status_worker_state(w));
  if (w->device && *w->device)
    cJSON_AddStringToObject(o, "device", w->device);
  else
    cJSON_AddNullToObject(o, "device");
  add_number_or_null(o, "auc", w->has_auc, w->auc);
  add_number_or_null(o, "test_auc", w->has_test_auc, w->test_auc);
  add_number_or_null(o, "test_logloss", w->has_test_auc, w->test_logloss);
  return o;
}

cJSON *ts_job_status_json_job(const ts_job_status_view_t *v, bool with_workers) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  ts_client_mode_t mode;
  uint64_t step = ts_job_status_job_step(v, &mode);
  size_t up = ts_job_status_shards_up(v);
  cJSON_AddStringToObject(root, "mode",
                          up                   ? ts_msg_mode_name((Tessera__Mode)mode)
                          : v->configured_mode ? v->configured_mode
                                               : "unknown");
  cJSON_AddNumberToObject(root, "step", (double)step);
  cJSON_AddBoolToObject(root, "healthy", up == v->num_shards && !ts_job_status_ckpt_failing(v));
  const char *id = ts_job_status_job_id(v);
  if (id)
    cJSON_AddStringToObject(root, "job_id", id);
  else
    cJSON_AddNullToObject(root, "job_id");
  cJSON_AddNumberToObject(root, "num_workers", (double)v->num_workers);
  cJSON_AddNumberToObject(root, "workers_joined", ts_job_status_workers_joined(v));
  cJSON *shards = cJSON_AddArrayToObject(root, "shards");
  for (size_t s = 0; shards && s < v->num_shards; s++)
    cJSON_AddItemToArray(shards, ts_job_status_json_shard(&v->shards[s]));
  if (with_workers) {
    cJSON *workers = cJSON_AddArrayToObject(root, "workers");
    ts_job_status_worker_t *w = ts_calloc(v->num_workers ? v->num_workers : 1, sizeof *w);
    if (!w || !workers) {
      ts_free(w);
      cJSON_Delete(root);
      return NULL;
    }
    ts_job_status_merge_workers(v, w);
    for (size_t i = 0; i < v->num_workers; i++)
      cJSON_AddItemToArray(workers, ts_job_status_json_worker(&w[i]));
    ts_free(w);
  }
  double acc;
  if (ts_job_status_final_accuracy(v, &acc, NULL))
    cJSON_AddNumberToObject(root, "final_test_accuracy", acc);
  else
    cJSON_AddNullToObject(root, "final_test_accuracy");
  return root;
}
