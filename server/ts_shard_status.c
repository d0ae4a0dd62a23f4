/*
 * The shard's status: one ShardStatus built from the live state answers STATUS requests
 * (psctl) and feeds the admin endpoint's /status and /metrics and the STATUS= line to
 * systemd, so all of them agree.
 */
#include "ts_server_int.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_err.h"
#include "ts_notify.h"
#include "ts_status.h"

void ts_shard_status_release(ts_shard_status_msg_t *sm) {
  ts_free(sm->ws);
  ts_free(sm->wp);
  ts_free(sm->waiting);
  ts_free(sm->ts);
  ts_free(sm->tp);
  ts_free(sm->hot);
}

/* The tables' part of a ShardStatus (names point into the store). */
static int build_tables(ts_server_t *srv, ts_shard_status_msg_t *sm) {
  ts_store_t *st = &srv->store;
  uint32_t n = st->declared ? st->num_tables : 0;
  if (n == 0) return 0;
  sm->ts = ts_calloc(n, sizeof *sm->ts);
  sm->tp = ts_calloc(n, sizeof *sm->tp);
  sm->hot = ts_calloc((size_t)n * TS_STABLE_HOT_KEYS, sizeof *sm->hot);
  if (!sm->ts || !sm->tp || !sm->hot) return TS_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    ts_stable_info_t info;
    ts_stable_info(ts_store_table(st, i), &info);
    Tessera__TableStatus *t = &sm->ts[i];
    tessera__table_status__init(t);
    t->name = (char *)info.name;
    t->dim = info.dim;
    t->rows = info.rows;
    t->bytes = info.bytes;
    t->version = info.version;
    t->created = info.created;
    t->evicted = info.evicted;
    t->filtered = info.filtered;
    t->pulled_rows = info.pulled_rows;
    t->pushed_rows = info.pushed_rows;
    t->hot_share = info.hot_share;
    t->hot_keys = sm->hot + (size_t)i * TS_STABLE_HOT_KEYS;
    t->n_hot_keys = info.num_hot;
    memcpy(t->hot_keys, info.hot, info.num_hot * sizeof *info.hot);
    sm->tp[i] = t;
  }
  sm->r.n_tables = n;
  sm->r.tables = sm->tp;
  return 0;
}

/* Fill *sm with the shard's state now. Returns 0 or TS_ENOMEM; release it in both cases. */
int ts_shard_status_build(ts_server_t *srv, ts_shard_status_msg_t *sm) {
  uint64_t now = ts_server_now_ms(srv);
  uint32_t nw = srv->num_workers;
  memset(sm, 0, sizeof *sm);
  Tessera__WorkerStatus *ws = sm->ws = ts_calloc(nw ? nw : 1, sizeof *ws);
  Tessera__WorkerStatus **wp = sm->wp = ts_calloc(nw ? nw : 1, sizeof *wp);
  int32_t *waiting = sm->waiting = ts_calloc(nw ? nw : 1, sizeof *waiting);
  if (!ws || !wp || !waiting) return TS_ENOMEM;
  size_t n = 0, nwait = 0;
  for (uint32_t t = 0; t < nw; t++) {
    const ts_worker_info_t *w = &srv->workers[t];
    const ts_barrier_worker_t *bw = &srv->barrier.w[t];
    if (!bw->seen) continue;
    tessera__worker_status__init(&ws[n]);
    ws[n].task = (int32_t)t;
    ws[n].step = w->step;
    ws[n].loss = w->loss;
    ws[n].examples_per_sec = w->examples_per_sec;
    ws[n].last_seen_s = (double)(now - bw->last_seen_ms) / 1000.0;
    ws[n].alive = ts_barrier_live(&srv->barrier, (int)t);
    ws[n].done = bw->done;
    ws[n].identity = (char *)w->identity;
    ws[n].epoch_progress = w->progress;
    ws[n].clock = bw->clock;
    ws[n].stale_dropped = w->stale_dropped;
    ws[n].reported = w->reported;
    ws[n].step_known = w->step_known;
    ws[n].device = (char *)w->device;
    wp[n] = &ws[n];
    n++;
  }
  /* The open barrier waits for the live workers that have not pushed for it yet. */
  const ts_spart_t *oldest =
      srv->store.mode == TS_MODE_SYNC ? ts_store_oldest_part(&srv->store) : NULL;
  if (oldest && ts_store_sync_count(oldest) > 0)
    nwait = ts_barrier_waiting_for(&srv->barrier, ts_store_contributed(oldest), waiting);
  Tessera__ShardStatus *r = &sm->r;
  tessera__shard_status__init(r);
  r->shard = srv->shard;
  r->num_shards = (uint32_t)srv->cfg->num_ps;
  r->mode = ts_store_wire_mode(srv->store.mode);
  r->version = ts_store_min_version(&srv->store);
  r->step = srv->store.mode == TS_MODE_SYNC ? r->version : srv->pushes;
  r->partitions = (uint32_t)srv->store.num_parts;
  r->bytes = srv->store.bytes;
  r->tensors = srv->store.num_tensors;
  r->n_workers = n;
  r->workers = wp;
  r->pushes = srv->pushes;
  r->pulls = srv->pulls;
  r->stale_dropped = srv->store.stale_dropped;
  r->rejected_frames = srv->rejected_frames;
  r->errors = srv->errors;
  r->uptime_s = (double)(now - srv->started_ms) / 1000.0;
  r->num_workers = nw;
  r->n_barrier_waiting_for = nwait;
  r->barrier_waiting_for = waiting;
  r->connections = srv->num_sessions;
  r->auth_failures = srv->auth_failures;
  r->nonfinite_refused = srv->nonfinite;
  r->incarnation = srv->incarnation;
  r->last_checkpoint = srv->last_ckpt;
  r->last_checkpoint_age_s = srv->have_ckpt ? (double)(now - srv->last_ckpt_ms) / 1000.0 : -1.0;
  r->checkpoints_written = srv->ckpts_written;
  r->restored_step = srv->restored_step;
  r->checkpoint_failures = srv->ckpt_failures;
  r->checkpoint_error = srv->ckpt_error;
  r->job_id = sm->job_id;
  if (srv->store.declared) ts_ckpt_job_id(&srv->store, sm->job_id);
  r->has_final_test_accuracy = srv->has_final_acc;
  r->final_test_accuracy = srv->final_acc;
  r->final_reporter = srv->final_reporter;
  return build_tables(srv, sm);
}

void ts_shard_status_handle(ts_session_t *s, Tessera__Status *m) {
  ts_shard_status_msg_t sm;
  if (ts_shard_status_build(s->srv, &sm) < 0) {
    ts_session_reply_error(s, TS_MSG_STATUS, m->request_id, TS_ENOMEM, "out of memory");
  } else {
    sm.r.request_id = m->request_id;
    ts_session_reply(s, TS_MSG_STATUS_REPLY, &sm.r.base);
  }
  ts_shard_status_release(&sm);
  ts_msg_free(&m->base);
}

#define PUBLISH_MS 250        /* how fresh /metrics and /status are */
#define NOTIFY_STATUS_MS 1000 /* at most one STATUS= line to systemd a second */

/* On the loop, from the tick (and at start and stop): publish the snapshot the admin
 * endpoint renders, tell systemd how the shard is doing and pet its watchdog. The
 * watchdog is only petted here, so a stuck loop gets the shard restarted. */
void ts_shard_status_publish(ts_server_t *srv) {
  uint64_t now = ts_server_now_ms(srv);
  bool publish = srv->admin && (now >= srv->next_publish_ms || srv->stopping);
  bool status = srv->notify && now >= srv->next_status_ms;
  if (publish || status) {
    ts_shard_status_msg_t sm;
    if (ts_shard_status_build(srv, &sm) == 0) {
      if (publish) {
        ts_metrics_t *m = &srv->metrics;
        m->bytes_in = m->bytes_in_closed;
        m->bytes_out = m->bytes_out_closed;
        m->staging_bytes = ts_stage_bytes(&srv->stage);
        m->staging_in_use = srv->stage.in_use;
        m->push_dedup_bytes = srv->pushids.bytes;
        m->push_dedup_evictions = srv->pushids.evictions;
        m->reply_memory = srv->reply_mem;
        m->parked_pulls = srv->num_parked;
        m->pull_replies_writing = srv->pull_writes;
        m->preauth_connections = srv->num_preauth;
        for (ts_session_t *x = srv->sessions; x; x = x->next) {
          m->bytes_in += x->conn.bytes_in;
          m->bytes_out += x->conn.bytes_out;
        }
        size_t len = protobuf_c_message_get_packed_size(&sm.r.base);
        uint8_t *pb = ts_malloc(len ? len : 1);
        if (pb) {
          protobuf_c_message_pack(&sm.r.base, pb);
          char note[256] = "";
          if (srv->ckpt_failures)
            ts_status_checkpoint_note(note, sizeof note, srv->ckpt_failures, srv->ckpt_error);
          ts_admin_note(srv->admin, note);
          ts_admin_publish(srv->admin, m, pb, len, !srv->stopping,
                           srv->stopping ? "shutting down" : NULL);
          ts_free(pb);
        }
        srv->next_publish_ms = now + PUBLISH_MS;
      }
      if (status) {
        uint32_t live = 0;
        for (size_t i = 0; i < sm.r.n_workers; i++) live += sm.r.workers[i]->alive;
        char line[160];
        snprintf(line, sizeof line,
                 "shard %u/%zu %s: step %llu, %u/%u workers live, %zu connections", srv->shard,
                 srv->cfg->num_ps, srv->stopping ? "stopping" : "serving",
                 (unsigned long long)sm.r.step, live, srv->num_workers, srv->num_sessions);
        if (strcmp(line, srv->notify_status) != 0) {
          ts_notify_printf("STATUS=%s", line);
          memcpy(srv->notify_status, line, sizeof line);
        }
        srv->next_status_ms = now + NOTIFY_STATUS_MS;
      }
    }
    ts_shard_status_release(&sm);
  }
  if (srv->watchdog_ms && now >= srv->next_watchdog_ms && !srv->stopping) {
    ts_notify("WATCHDOG=1");
    srv->next_watchdog_ms = now + srv->watchdog_ms;
  }
}
