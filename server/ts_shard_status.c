/*
 * The shard's status: one ShardStatus built from the live state answers STATUS requests
 * (psctl) and feeds the admin endpoint's /status and /metrics and the STATUS= line to
 * systemd, so all of them agree.
 */
#include "ts_server_int.h"

#include <stdint.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_notify.h"
#include "ts_status.h"

void ts_shard_status_release(ts_shard_status_msg_t *sm) {
  ts_free(sm->ws);
  ts_free(sm->wp);
  ts_free(sm->waiting);
  ts_free(sm->ts);
  ts_free(sm->tp);
  ts_free(sm->hot);
  ts_free(sm->md);
  ts_free(sm->mdp);
}

/* Status.with_model: the declared tensors (names and shapes point into the store). */
static int build_model(ts_server_t *srv, ts_shard_status_msg_t *sm) {
  ts_store_t *st = &srv->store;
  uint32_t n = st->declared ? st->num_tensors : 0;
  sm->r.model_seed = st->declared ? st->seed : 0;
  if (n == 0) return 0;
  sm->md = ts_calloc(n, sizeof *sm->md);
  sm->mdp = ts_calloc(n, sizeof *sm->mdp);
  if (!sm->md || !sm->mdp) return TS_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    ts_tensor_t *t = &st->tensors[i];
    Tessera__TensorDecl *d = &sm->md[i];
    tessera__tensor_decl__init(d);
    d->name = t->name;
    d->shape = t->shape;
    d->n_shape = t->rank;
    d->init = (Tessera__Init)t->init;
    d->kind = t->state ? TESSERA__TENSOR_KIND__TENSOR_STATE : TESSERA__TENSOR_KIND__TENSOR_TRAINABLE;
    sm->mdp[i] = d;
  }
  sm->r.n_model = n;
  sm->r.model = sm->mdp;
  return 0;
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
    ws[n].has_auc = w->has_auc;
    ws[n].auc = w->auc;
    ws[n].has_test_auc = w->has_test_auc;
    ws[n].test_auc = w->test_auc;
    ws[n].test_logloss = w->test_logloss;
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
  r->workers_joined = ts_barrier_count_joined(&srv->barrier, srv->job_since_ms);
  if (srv->store.declared) ts_ckpt_job_id(&srv->store, sm->job_id);
  r->has_final_test_accuracy = srv->has_final_acc;
  r->final_test_accuracy = srv->final_acc;
  r->final_reporter = srv->final_reporter;
  return build_tables(srv, sm);
}

/* --- Status replies' own share of the reply memory ---------------------------------- */

/* What one queued Status reply is charged: its frame and the write request around it. */
#define STATUS_OVERHEAD 256

static void status_written(ts_conn_t *c, void *arg, int err) {
  (void)err; /* written or cancelled by a close: either way its memory is free */
  ts_session_t *s = c->data;
  uint64_t bytes = (uint64_t)(uintptr_t)arg;
  s->status_mem -= bytes;
  s->srv->status_reply_mem -= bytes;
}

/* Make room for `need` bytes of Status replies to s. One connection may hold 1/64 of
 * server.max_status_reply_bytes (64 KiB, a hundred replies, by default; 16 KiB at least):
 * no client that reads its replies comes near it, and one that asks without reading is
 * closed after a few hundred, before it has cost the loop much. All together stay under the
 * share by closing the connections that hold the most (a closing one gives its share back
 * when libuv cancels its writes, on the next turn of the loop). False when s was closed. */
static bool status_room(ts_session_t *s, uint64_t need) {
  ts_server_t *srv = s->srv;
  uint64_t limit = (uint64_t)srv->cfg->max_status_reply_bytes;
  uint64_t one = limit / 64 > 16384 ? limit / 64 : 16384;
  if (s->status_mem + need > one) {
    ts_log_warn("%s: its queued Status replies would take %llu bytes, over 1/64 of "
                "server.max_status_reply_bytes (%llu): it asks for status faster than it "
                "reads; closing",
                s->conn.peer, (unsigned long long)(s->status_mem + need),
                (unsigned long long)one);
    srv->metrics.limit_drops[TS_METRICS_LIMIT_STATUS_REPLY]++;
    ts_conn_close(&s->conn, TS_EBUSY);
    return false;
  }
  uint64_t held = srv->status_reply_mem;
  for (const ts_session_t *o = srv->sessions; o; o = o->next)
    if (o->conn.closing) held -= o->status_mem;
  while (held + need > limit) {
    ts_session_t *worst = NULL;
    for (ts_session_t *o = srv->sessions; o; o = o->next)
      if (!o->conn.closing && o->status_mem && (!worst || o->status_mem > worst->status_mem))
        worst = o;
    if (!worst) break; /* one reply larger than the share: sent all the same */
    ts_log_warn("%s: Status replies queued to all connections take %llu bytes, over "
                "server.max_status_reply_bytes (%llu); closing this one, which holds the most "
                "(%llu bytes): it asks for status faster than it reads",
                worst->conn.peer, (unsigned long long)held, (unsigned long long)limit,
                (unsigned long long)worst->status_mem);
    srv->metrics.limit_drops[TS_METRICS_LIMIT_STATUS_REPLY]++;
    held -= worst->status_mem;
    ts_conn_close(&worst->conn, TS_EBUSY);
  }
  return !s->conn.closing;
}

void ts_shard_status_handle(ts_session_t *s, Tessera__Status *m) {
  ts_shard_status_msg_t sm;
  if (ts_shard_status_build(s->srv, &sm) < 0 || (m->with_model && build_model(s->srv, &sm) < 0)) {
    ts_session_reply_error(s, TS_MSG_STATUS, m->request_id, TS_ENOMEM, "out of memory");
  } else {
    sm.r.request_id = m->request_id;
    uint64_t bytes = ts_msg_frame_size(&sm.r.base) + STATUS_OVERHEAD;
    if (status_room(s, bytes)) {
      s->status_mem += bytes;
      s->srv->status_reply_mem += bytes;
      int rc = ts_conn_send(&s->conn, TS_MSG_STATUS_REPLY, &sm.r.base, NULL, 0, status_written,
                            (void *)(uintptr_t)bytes);
      if (rc < 0) {
        s->status_mem -= bytes;
        s->srv->status_reply_mem -= bytes;
        ts_session_reply_failed(s, TS_MSG_STATUS_REPLY, rc);
      }
      ts_replyq_enforce(s->srv);
    }
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
