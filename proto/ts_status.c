#include "ts_status.h"

#include <float.h>

#include <stdalign.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_text.h"

ts_client_mode_t ts_status_mode(Tessera__Mode mode) {
  switch (mode) {
    case TESSERA__MODE__MODE_ASYNC:
      return TS_CLIENT_MODE_ASYNC;
    case TESSERA__MODE__MODE_SYNC:
      return TS_CLIENT_MODE_SYNC;
    case TESSERA__MODE__MODE_SSP:
      return TS_CLIENT_MODE_SSP;
    default:
      return TS_CLIENT_MODE_UNSPECIFIED;
  }
}

void ts_status_checkpoint_note(char *buf, size_t n, uint32_t failures, const char *error) {
  snprintf(buf, n, "last checkpoint: failed %u\u00d7 (%s)", failures,
           error && *error ? error : "no reason given");
}

static size_t align_up(size_t n) {
  const size_t a = alignof(max_align_t);
  return (n + a - 1) / a * a;
}

/* Room for s cleaned, with its NUL. */
static size_t text_size(const char *s) { return ts_text_escape(s, NULL, 0, false) + 1; }

/* Copy s cleaned to *str (text_size(s) bytes there) and move *str past it: a shard's
 * strings (a worker's device, a table's name) reach terminals and exceptions. */
static const char *put_text(char **str, const char *s) {
  const char *at = *str;
  size_t n = text_size(s);
  ts_text_escape(s, *str, n, false);
  *str += n;
  return at;
}

/* The block: the struct, the workers, the tables, the barrier list, then the strings. */
int ts_status_from_pb(const Tessera__ShardStatus *pb, ts_client_shard_status_t **out) {
  *out = NULL;
  size_t nw = pb->n_workers, nb = pb->n_barrier_waiting_for, nt = pb->n_tables;
  const char *ckpt = pb->last_checkpoint ? pb->last_checkpoint : "";
  const char *ckerr = pb->checkpoint_error ? pb->checkpoint_error : "";
  const char *job = pb->job_id ? pb->job_id : "";
  size_t off_w = align_up(sizeof(ts_client_shard_status_t));
  size_t off_t = align_up(off_w + nw * sizeof(ts_client_worker_status_t));
  size_t off_b = align_up(off_t + nt * sizeof(ts_client_table_status_t));
  size_t off_s = off_b + nb * sizeof(int32_t);
  size_t total = off_s + text_size(ckpt) + text_size(ckerr) + text_size(job);
  for (size_t i = 0; i < nt; i++) total += text_size(pb->tables[i]->name);
  for (size_t i = 0; i < nw; i++)
    total += text_size(pb->workers[i]->identity) + text_size(pb->workers[i]->device);
  char *block = ts_calloc(1, total);
  if (!block) return TS_ENOMEM;
  ts_client_shard_status_t *st = (ts_client_shard_status_t *)(void *)block;
  ts_client_worker_status_t *w = (ts_client_worker_status_t *)(void *)(block + off_w);
  ts_client_table_status_t *tb = (ts_client_table_status_t *)(void *)(block + off_t);
  int32_t *barrier = (int32_t *)(void *)(block + off_b);
  char *str = block + off_s;
  *st = (ts_client_shard_status_t){
      .shard = pb->shard, .num_shards = pb->num_shards, .mode = ts_status_mode(pb->mode),
      .step = pb->step, .partitions = pb->partitions, .bytes = pb->bytes,
      .version = pb->version, .tensors = pb->tensors, .workers = w, .num_workers_seen = nw,
      .pushes = pb->pushes, .pulls = pb->pulls, .stale_dropped = pb->stale_dropped,
      .rejected_frames = pb->rejected_frames, .errors = pb->errors, .uptime_s = pb->uptime_s,
      .num_workers = pb->num_workers, .barrier_waiting_for = barrier,
      .num_barrier_waiting_for = nb, .connections = pb->connections,
      .auth_failures = pb->auth_failures, .nonfinite_refused = pb->nonfinite_refused,
      .incarnation = pb->incarnation, .last_checkpoint_age_s = pb->last_checkpoint_age_s,
      .checkpoints_written = pb->checkpoints_written, .restored_step = pb->restored_step,
      .has_final_test_accuracy = pb->has_final_test_accuracy,
      .final_test_accuracy = pb->final_test_accuracy, .final_reporter = pb->final_reporter,
      .tables = tb, .num_tables = nt};
  for (size_t i = 0; i < nb; i++) barrier[i] = pb->barrier_waiting_for[i];
  st->last_checkpoint = put_text(&str, ckpt);
  st->checkpoint_error = put_text(&str, ckerr);
  st->checkpoint_failures = pb->checkpoint_failures;
  st->job_id = put_text(&str, job);
  st->workers_joined = pb->workers_joined;
  for (size_t i = 0; i < nw; i++) {
    const Tessera__WorkerStatus *ws = pb->workers[i];
    w[i] = (ts_client_worker_status_t){
        .task = ws->task, .step = ws->step, .loss = ws->loss,
        .examples_per_sec = ws->examples_per_sec, .last_seen_s = ws->last_seen_s,
        .alive = ws->alive, .done = ws->done, .epoch_progress = ws->epoch_progress,
        .identity = put_text(&str, ws->identity), .clock = ws->clock,
        .stale_dropped = ws->stale_dropped,
        .reported = ws->reported, .step_known = ws->step_known};
    w[i].device = put_text(&str, ws->device);
    /* A shard's AUC is shown as it sent it only when it is one. */
    w[i].has_auc = ws->has_auc && ws->auc >= 0.0 && ws->auc <= 1.0;
    w[i].auc = w[i].has_auc ? ws->auc : 0.0;
    w[i].has_test_auc = ws->has_test_auc && ws->test_auc >= 0.0 && ws->test_auc <= 1.0 &&
                        ws->test_logloss >= 0.0 && ws->test_logloss <= DBL_MAX;
    w[i].test_auc = w[i].has_test_auc ? ws->test_auc : 0.0;
    w[i].test_logloss = w[i].has_test_auc ? ws->test_logloss : 0.0;
  }
  for (size_t i = 0; i < nt; i++) {
    const Tessera__TableStatus *ts = pb->tables[i];
    tb[i] = (ts_client_table_status_t){
        .name = put_text(&str, ts->name), .dim = ts->dim, .rows = ts->rows, .bytes = ts->bytes,
        .version = ts->version, .created = ts->created, .evicted = ts->evicted,
        .filtered = ts->filtered, .pulled_rows = ts->pulled_rows,
        .pushed_rows = ts->pushed_rows, .hot_share = ts->hot_share};
    for (size_t k = 0; k < ts->n_hot_keys && k < 8; k++) tb[i].hot_keys[k] = ts->hot_keys[k];
    tb[i].num_hot_keys = ts->n_hot_keys < 8 ? (uint32_t)ts->n_hot_keys : 8;
  }
  *out = st;
  return 0;
}
