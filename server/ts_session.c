/*
 * Sessions: accept, the Hello and the handshake (authentication), frame dispatch, the
 * small requests (heartbeat; declares are ts_declare.c's), the admin check, and the close of
 * a connection, which lets go of everything the session held (parked pulls, a push, its
 * worker's place in the barrier).
 */
#include "ts_server_int.h"

#include <sodium.h>
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_config_job.h"
#include "ts_err.h"
#include "ts_identity.h"
#include "ts_log.h"
#include "ts_text.h"

/* --- replies ----------------------------------------------------------------------- */

/* A reply that cannot be queued (out of memory, the connection already closing) would leave
 * the peer waiting for it until its request times out: close instead, so it fails now and
 * reconnects. */
void ts_session_reply_failed(ts_session_t *s, uint16_t type, int rc) {
  if (s->conn.closing) return;
  ts_log_warn("%s: cannot send a %s reply (%s): closing the connection", s->conn.peer,
              ts_frame_type_name(type), ts_strerror(rc));
  ts_conn_close(&s->conn, rc);
}

int ts_session_reply(ts_session_t *s, uint16_t type, const ProtobufCMessage *msg) {
  int rc = ts_conn_send(&s->conn, type, msg, NULL, 0, NULL, NULL);
  if (rc < 0) ts_session_reply_failed(s, type, rc);
  ts_replyq_enforce(s->srv);
  return rc;
}

#define LOG_BURST 20.0
#define LOG_PER_S 2.0

static void log_suppressed(ts_session_t *s) {
  if (!s->log_suppressed) return;
  ts_log_notice("%s: suppressed %llu log lines about this peer (%g at once, then %g a second)",
                s->conn.peer, (unsigned long long)s->log_suppressed, LOG_BURST, LOG_PER_S);
  s->log_suppressed = 0;
}

bool ts_session_log_allowed(ts_session_t *s) {
  uint64_t now = ts_server_now_ms(s->srv);
  if (!s->log_refill_ms) s->log_tokens = LOG_BURST;
  else s->log_tokens += (double)(now - s->log_refill_ms) / 1000.0 * LOG_PER_S;
  if (s->log_tokens > LOG_BURST) s->log_tokens = LOG_BURST;
  s->log_refill_ms = now ? now : 1;
  if (s->log_tokens < 1.0) {
    s->log_suppressed++;
    return false;
  }
  s->log_tokens -= 1.0;
  log_suppressed(s);
  return true;
}

void ts_session_reply_error(ts_session_t *s, uint16_t req_type, uint64_t request_id, int code,
                            const char *detail) {
  s->srv->errors++;
  ts_metrics_refused(&s->srv->metrics, ts_metrics_req_of(req_type), code);
  ts_session_log(s, TS_LOG_INFO, "%s: request %llu refused: %s: %s", s->conn.peer,
                 (unsigned long long)request_id, ts_err_name(code), detail);
  int rc = ts_conn_send_error(&s->conn, request_id, code, detail);
  if (rc < 0) ts_session_reply_failed(s, TS_MSG_ERROR, rc);
  ts_replyq_enforce(s->srv);
}

bool ts_session_admin_allowed(ts_session_t *s, uint16_t type, uint64_t request_id,
                              const char *what) {
  ts_server_t *srv = s->srv;
  char err[200];
  if (s->role != TESSERA__ROLE__ROLE_ADMIN) {
    ts_errmsg_printf(err, sizeof err, "%s needs the admin role (psctl)", what);
    ts_session_reply_error(s, type, request_id, TS_EPERM, err);
    return false;
  }
  if (s->read_only && srv->admin_token) {
    ts_errmsg_printf(err, sizeof err,
             "%s needs the admin token (auth.admin_token_file): this client authenticated "
             "with the worker token, which may only read status",
             what);
    ts_session_reply_error(s, type, request_id, TS_EPERM, err);
    return false;
  }
  if (srv->token && !srv->admin_token) {
    ts_errmsg_printf(err, sizeof err,
             "%s needs an admin token: set auth.admin_token_file (the worker token is not enough)",
             what);
    ts_session_reply_error(s, type, request_id, TS_EPERM, err);
    return false;
  }
  return true;
}

/* Counted as a rejected frame when the connection closes (on_session_close). */
static void protocol_error(ts_session_t *s, uint64_t request_id, int code, const char *detail) {
  ts_log_warn("%s: protocol violation, closing connection: %s", s->conn.peer, detail);
  ts_conn_fail(&s->conn, request_id, code, detail);
}

/* --- requests ---------------------------------------------------------------------- */

/* Every handler below takes the decoded message and frees it before it returns. */

static void handle_heartbeat(ts_session_t *s, Tessera__Heartbeat *m) {
  ts_server_t *srv = s->srv;
  /* Only the connection that holds the task speaks for it (ts_identity.h). */
  bool holder = ts_identity_holds(s);
  if (holder) {
    ts_worker_info_t *w = &srv->workers[s->task];
    /* An older client has no `reported` field: a step or a loss is its report. */
    if (m->reported || m->step > 0 || m->loss != 0.0) {
      if (!w->step_known || m->step > w->step) w->step = m->step;
      w->loss = m->loss;
      w->examples_per_sec = m->examples_per_sec;
      w->progress = m->epoch_progress;
      w->reported = w->step_known = true;
    }
    /* Stored clean: psctl, /status and logs print it (base/ts_text.h). */
    if (m->device && *m->device) ts_text_clean(m->device, w->device, sizeof w->device);
    /* A CTR model's AUC: kept only when it is one (in [0, 1]; NaN refused). */
    if (m->has_auc && m->auc >= 0.0 && m->auc <= 1.0) {
      w->has_auc = true;
      w->auc = m->auc;
    }
    if (m->has_test_auc && m->test_auc >= 0.0 && m->test_auc <= 1.0 && m->test_logloss >= 0.0 &&
        m->test_logloss <= DBL_MAX) {
      w->has_test_auc = true;
      w->test_auc = m->test_auc;
      w->test_logloss = m->test_logloss;
    }
    if (m->done && ts_barrier_done(&srv->barrier, s->task)) {
      ts_log_info("worker %d finished at step %llu", s->task, (unsigned long long)m->step);
      ts_sync_check_barriers(srv, false);
      ts_waitq_serve(srv);
    }
  }
  Tessera__HeartbeatReply r = TESSERA__HEARTBEAT_REPLY__INIT;
  r.request_id = m->request_id;
  r.step = ts_store_min_version(&srv->store);
  uint64_t now = ts_server_now_ms(srv);
  r.workers_finished = ts_barrier_count_finished(&srv->barrier, now, srv->job_since_ms);
  if (holder && m->has_final_test_accuracy)
    ts_identity_final_accuracy(s, m->final_test_accuracy, r.workers_finished);
  r.num_workers = srv->num_workers;
  r.workers_joined = ts_barrier_count_joined(&srv->barrier, srv->job_since_ms);
  /* Shard 0 chooses who evaluates the final parameters: the first done worker to ask
   * (job_end: not a periodic heartbeat, nor a stopped worker's goodbye) once every worker
   * has finished, which is the last to finish unless the count was completed by one going
   * silent or stopping. One choice per shard process, so one report per job. */
  if (srv->shard == 0 && holder && m->done && m->job_end && srv->final_reporter < 0 &&
      r.workers_finished == r.num_workers && ts_barrier_worker(&srv->barrier, s->task)) {
    srv->final_reporter = s->task;
    ts_log_info("every worker finished: worker %d evaluates the final parameters", s->task);
  }
  r.report_final = srv->shard == 0 && holder && m->done && srv->final_reporter == s->task;
  ts_session_reply(s, TS_MSG_HEARTBEAT_REPLY, &r.base);
  ts_msg_free(&m->base);
}

/* --- before authentication --------------------------------------------------------- */

/* An unauthenticated peer may hold little: a slot of its own quota, for a few seconds, and
 * a frame meta of server.max_handshake_bytes (no payload). */
static void preauth_push(ts_server_t *srv, ts_session_t *s) {
  s->preauth = true;
  s->pa_next = NULL;
  s->pa_prev = srv->preauth_tail;
  if (srv->preauth_tail)
    srv->preauth_tail->pa_next = s;
  else
    srv->preauth_head = s;
  srv->preauth_tail = s;
  srv->num_preauth++;
}

static void preauth_remove(ts_server_t *srv, ts_session_t *s) {
  if (!s->preauth) return;
  s->preauth = false;
  if (s->pa_prev)
    s->pa_prev->pa_next = s->pa_next;
  else
    srv->preauth_head = s->pa_next;
  if (s->pa_next)
    s->pa_next->pa_prev = s->pa_prev;
  else
    srv->preauth_tail = s->pa_prev;
  s->pa_prev = s->pa_next = NULL;
  srv->num_preauth--;
}

/* Close an unauthenticated session for a limit: it leaves the FIFO at once (its slot is
 * free now), is told why in an Error frame, and is counted. One closing already is only
 * taken off the FIFO. */
static void preauth_drop(ts_server_t *srv, ts_session_t *s, ts_metrics_drop_t why, int code,
                         const char *detail) {
  preauth_remove(srv, s);
  if (s->conn.closing || s->conn.close_after_write) return;
  srv->metrics.dropped[why]++;
  ts_log_warn("%s: closing connection: %s", s->conn.peer, detail);
  ts_conn_fail(&s->conn, 0, code, detail);
}

void ts_session_preauth_expire(ts_server_t *srv, uint64_t now_ms) {
  uint64_t limit = (uint64_t)(srv->cfg->handshake_timeout_s * 1000.0);
  char why[160];
  while (srv->preauth_head && now_ms - srv->preauth_head->accepted_ms >= limit) {
    ts_errmsg_printf(why, sizeof why, "no handshake within %.2f s (server.handshake_timeout_s)",
             srv->cfg->handshake_timeout_s);
    preauth_drop(srv, srv->preauth_head, TS_METRICS_DROP_HANDSHAKE_TIMEOUT, TS_ETIMEDOUT, why);
  }
}

/* The handshake succeeded: the session leaves the pre-authentication quota for
 * server.max_connections, and may send frames of any size. False (and the session is
 * closing) when that limit is reached. */
static bool authenticate(ts_server_t *srv, ts_session_t *s, uint64_t request_id) {
  preauth_remove(srv, s);
  if (srv->num_authed >= (size_t)srv->cfg->max_connections) {
    char why[160];
    ts_errmsg_printf(why, sizeof why,
             "too many connections: %d authenticated is the limit (server.max_connections)",
             srv->cfg->max_connections);
    srv->metrics.dropped[TS_METRICS_DROP_MAX_CONNECTIONS]++;
    ts_log_warn("%s: refused: %s", s->conn.peer, why);
    ts_conn_fail(&s->conn, request_id, TS_EBUSY, why);
    return false;
  }
  s->counted = true;
  srv->num_authed++;
  s->conn.max_meta = TS_FRAME_MAX_META;
  s->conn.max_data = (uint64_t)srv->cfg->max_message_bytes;
  return true;
}

/* The key a handshake's mac was made with, or NULL when it matches none: for an admin
 * client the admin token (or, read-only, the worker token); for a worker the shared token
 * or its task's key (*proven). Without a token every handshake passes with no key. */
static const char *check_mac(ts_server_t *srv, const Tessera__Handshake *m, const uint8_t *nonce,
                             bool *proven, bool *read_only, bool *ok) {
  const ProtobufCBinaryData *mac = &m->mac;
  *proven = *read_only = false;
  *ok = true;
  if (!srv->token) return NULL;
  if (m->role == TESSERA__ROLE__ROLE_ADMIN) {
    if (srv->admin_token &&
        ts_auth_verify(srv->admin_token, nonce, TS_AUTH_NONCE_LEN, mac->data, mac->len) == 0)
      return srv->admin_token;
    *read_only = true;
  }
  if (ts_auth_verify(srv->token, nonce, TS_AUTH_NONCE_LEN, mac->data, mac->len) == 0)
    return srv->token;
  if (m->role == TESSERA__ROLE__ROLE_WORKER &&
      ts_auth_verify_task(srv->token, m->task, nonce, TS_AUTH_NONCE_LEN, mac->data, mac->len) ==
          0) {
    *proven = true;
    return srv->token; /* the proof is made with the task key: see reply_proof */
  }
  *ok = false;
  return NULL;
}

/* HandshakeReply.proof: the shard's MAC over both nonces with the key the client used. */
static void reply_proof(const ts_session_t *s, const Tessera__Handshake *m, const char *key,
                        bool proven, uint8_t out[TS_AUTH_MAC_LEN], ProtobufCBinaryData *proof) {
  if (!key || m->client_nonce.len != TS_AUTH_NONCE_LEN) return;
  if (proven) {
    char tkey[TS_AUTH_TASK_KEY_LEN + 1];
    ts_auth_task_key(key, m->task, tkey);
    ts_auth_proof(tkey, s->nonce, m->client_nonce.data, out);
    sodium_memzero(tkey, sizeof tkey);
  } else {
    ts_auth_proof(key, s->nonce, m->client_nonce.data, out);
  }
  proof->data = out;
  proof->len = TS_AUTH_MAC_LEN;
}

/* A worker whose job file differs from this shard's in a setting the job shares (mode,
 * workers, optimizer, model: config/ts_config_job.h) is refused before it joins, naming the
 * key and both values to it and in this shard's log, and counted (request="handshake",
 * reason="config"). A worker that sends no settings (an older one, or a program that does
 * not ask for the check) is not checked. Called after the MAC check, so only a peer holding
 * the token learns the shard's values. */
static bool job_matches(ts_session_t *s, const Tessera__Handshake *m) {
  ts_server_t *srv = s->srv;
  char mine[TS_CONFIG_JOB_VALUE_LEN], detail[1024];
  for (size_t i = 0; i < m->n_job; i++) {
    const Tessera__JobSetting *j = m->job[i];
    if (!j || !j->key || ts_config_job_compare(srv->cfg, j->key, j->value, mine, sizeof mine))
      continue;
    ts_metrics_refused(&srv->metrics, TS_METRICS_REQ_HANDSHAKE, TS_ECONFIG);
    ts_log_warn("%s: worker %d (%.127s) refused: %.127s: the worker has %.300s, this shard "
                "has %.300s",
                s->conn.peer, m->task, m->identity ? m->identity : "", j->key,
                j->value ? j->value : "", mine);
    ts_errmsg_printf(detail, sizeof detail, "%.127s: this worker has %.300s, shard %u has %.300s", j->key,
             j->value ? j->value : "", srv->shard, mine);
    ts_conn_fail(&s->conn, m->request_id, TS_ECONFIG, detail);
    return false;
  }
  return true;
}

static void handle_handshake(ts_session_t *s, Tessera__Handshake *m) {
  ts_server_t *srv = s->srv;
  char err[256];
  if (m->protocol != TS_PROTOCOL_VERSION) {
    ts_errmsg_printf(err, sizeof err, "client speaks protocol %u, this server %d", m->protocol,
             TS_PROTOCOL_VERSION);
    protocol_error(s, m->request_id, TS_EVERSION, err);
    goto out;
  }
  if (m->role != TESSERA__ROLE__ROLE_WORKER && m->role != TESSERA__ROLE__ROLE_ADMIN) {
    protocol_error(s, m->request_id, TS_EPROTO, "handshake names no valid role");
    goto out;
  }
  if (m->role == TESSERA__ROLE__ROLE_WORKER &&
      (m->task < 0 || (uint32_t)m->task >= srv->num_workers)) {
    ts_errmsg_printf(err, sizeof err, "worker task %d is outside the job's %u workers (cluster.workers)",
             m->task, srv->num_workers);
    protocol_error(s, m->request_id, TS_EINVAL, err);
    goto out;
  }
  bool proven, read_only, mac_ok;
  const char *key = check_mac(srv, m, s->nonce, &proven, &read_only, &mac_ok);
  if (!mac_ok) {
    srv->auth_failures++;
    srv->metrics.auth_failures++;
    ts_errmsg_printf(err, sizeof err, "authentication failed for %s role from %s",
             m->role == TESSERA__ROLE__ROLE_ADMIN ? "admin" : "worker", s->conn.peer);
    protocol_error(s, m->request_id, TS_EAUTH, err);
    goto out;
  }
  if (m->role == TESSERA__ROLE__ROLE_WORKER && !job_matches(s, m)) goto out;
  if (!authenticate(srv, s, m->request_id)) goto out;
  if (m->role == TESSERA__ROLE__ROLE_WORKER &&
      !ts_identity_claim(s, m->request_id, m->task, proven))
    goto out;
  s->handshaken = true;
  s->read_only = m->role == TESSERA__ROLE__ROLE_ADMIN && read_only;
  s->role = m->role;
  s->task = m->role == TESSERA__ROLE__ROLE_WORKER ? m->task : -1;
  if (s->role == TESSERA__ROLE__ROLE_WORKER) {
    ts_worker_info_t *w = &srv->workers[s->task];
    bool first = ts_barrier_join(&srv->barrier, s->task, ts_server_now_ms(srv));
    ts_text_clean(m->identity, w->identity, sizeof w->identity);
    ts_sync_worker_seen(srv, s->task);
    ts_log_info("worker %d %s from %s (%s)%s", s->task, first ? "joined" : "reconnected",
                s->conn.peer, w->identity, proven ? ", proved by its task key" : "");
  } else {
    ts_log_debug("admin client from %s%s", s->conn.peer, s->read_only ? " (read-only)" : "");
  }
  Tessera__HandshakeReply r = TESSERA__HANDSHAKE_REPLY__INIT;
  uint8_t proof[TS_AUTH_MAC_LEN];
  reply_proof(s, m, key, proven, proof, &r.proof);
  r.task_proven = proven;
  r.read_only = s->read_only;
  r.request_id = m->request_id;
  r.shard = srv->shard;
  r.num_shards = (uint32_t)srv->cfg->num_ps;
  r.mode = ts_store_wire_mode(srv->store.mode);
  r.partition_bytes = (uint64_t)srv->cfg->partition_bytes;
  r.num_workers = srv->num_workers;
  ts_session_reply(s, TS_MSG_HANDSHAKE_REPLY, &r.base);
out:
  ts_msg_free(&m->base);
}

ts_session_t *ts_session_find(ts_server_t *srv, uint64_t id) {
  for (ts_session_t *s = srv->sessions; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

/* --- frames ------------------------------------------------------------------------ */

static int on_meta(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                   const uv_buf_t **iov, unsigned *niov) {
  ts_session_t *s = c->data;
  if (!s->handshaken) return 0;
  if (h->type == TS_MSG_PUSH) return ts_push_rx_meta(s, h, (const Tessera__Push *)msg, iov, niov);
  if (h->type == TS_MSG_SPARSE_PUSH)
    return ts_sparse_push_meta(s, h, (const Tessera__SparsePush *)msg, iov, niov);
  if (h->type == TS_MSG_SPARSE_PULL)
    return ts_sparse_pull_meta(s, h, (const Tessera__SparsePull *)msg, iov, niov);
  return 0;
}

static void on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                     bool discarded) {
  ts_session_t *s = c->data;
  ts_server_t *srv = s->srv;
  srv->activity++;
  s->frame_ns = uv_hrtime();
  if (!s->handshaken) {
    if (h->type != TS_MSG_HANDSHAKE) {
      protocol_error(s, 0, TS_EPROTO, "the first frame must be a handshake");
      ts_msg_free(msg);
      return;
    }
    handle_handshake(s, (Tessera__Handshake *)msg);
    return;
  }
  ts_sync_worker_seen(srv, s->task);
  switch (h->type) {
    case TS_MSG_DECLARE:
      ts_declare_handle(s, (Tessera__Declare *)msg);
      return;
    case TS_MSG_PULL:
      ts_pull_handle(s, (Tessera__Pull *)msg);
      return;
    case TS_MSG_PUSH:
      ts_push_rx_handle(s, (Tessera__Push *)msg, discarded);
      return;
    case TS_MSG_SPARSE_PULL:
      ts_sparse_pull_handle(s, (Tessera__SparsePull *)msg, discarded);
      return;
    case TS_MSG_SPARSE_PUSH:
      ts_sparse_push_handle(s, (Tessera__SparsePush *)msg, discarded);
      return;
    case TS_MSG_TABLE_KEYS:
      ts_table_keys_handle(s, (Tessera__TableKeys *)msg);
      return;
    case TS_MSG_HEARTBEAT:
      handle_heartbeat(s, (Tessera__Heartbeat *)msg);
      return;
    case TS_MSG_STATUS:
      ts_shard_status_handle(s, (Tessera__Status *)msg);
      return;
    case TS_MSG_CHECKPOINT:
      ts_ckpt_sched_checkpoint(s, (Tessera__Checkpoint *)msg);
      return;
    case TS_MSG_SHUTDOWN:
      ts_ckpt_sched_shutdown(s, (Tessera__Shutdown *)msg);
      return;
    case TS_MSG_MODEL_RESET:
      ts_declare_reset(s, (Tessera__ModelReset *)msg);
      return;
    default: {
      char err[128];
      ts_errmsg_printf(err, sizeof err, "a client may not send %s frames", ts_frame_type_name(h->type));
      protocol_error(s, 0, TS_EPROTO, err);
      ts_msg_free(msg);
      return;
    }
  }
}

static bool is_protocol_violation(int err) {
  return err == TS_EPROTO || err == TS_ETOOBIG || err == TS_EVERSION || err == TS_ESIZE ||
         err == TS_EAUTH || err == TS_EINVAL;
}

static void on_session_close(ts_conn_t *c, int err) {
  ts_session_t *s = c->data;
  ts_server_t *srv = s->srv;
  log_suppressed(s);
  if (is_protocol_violation(err)) {
    srv->rejected_frames++;
    ts_metrics_rejected(&srv->metrics, err);
  }
  ts_waitq_drop_session(srv, s);
  ts_identity_release(s);
  preauth_remove(srv, s);
  if (s->counted) srv->num_authed--;
  if (s->prev)
    s->prev->next = s->next;
  else
    srv->sessions = s->next;
  if (s->next) s->next->prev = s->prev;
  srv->num_sessions--;
  srv->metrics.bytes_in_closed += c->bytes_in;
  srv->metrics.bytes_out_closed += c->bytes_out;
  if (s->handshaken && s->role == TESSERA__ROLE__ROLE_WORKER) {
    if (ts_barrier_leave(&srv->barrier, s->task) && !srv->stopping) {
      if (!srv->barrier.w[s->task].done)
        ts_log_warn("worker %d disconnected (%s)", s->task,
                    err == TS_ECLOSED ? "connection closed" : ts_strerror(err));
      ts_sync_check_barriers(srv, false);
      ts_waitq_serve(srv);
    }
  } else if (err != TS_ECLOSED && err != 0) {
    ts_log_debug("%s: connection closed: %s", c->peer, ts_strerror(err));
  }
  ts_sparse_push_abort(s); /* before ts_push_rx_close clears the rx */
  ts_sparse_push_close(s);
  ts_push_rx_close(s);
  ts_sparse_pull_close(s);
  ts_pull_close(s);
  ts_free(s);
  ts_server_stop_tick_when_idle(srv);
}

/* --- connections ------------------------------------------------------------------- */

static const ts_conn_cbs_t session_cbs = {
    .on_meta = on_meta,
    .on_frame = on_frame,
    .on_close = on_session_close,
    .on_piece = ts_push_rx_on_piece,
};

void ts_session_accept(uv_stream_t *listener, int status) {
  ts_server_t *srv = listener->data;
  if (status < 0) {
    ts_log_warn("accept failed: %s", uv_strerror(status));
    return;
  }
  ts_session_t *s = ts_calloc(1, sizeof *s);
  if (!s) {
    ts_log_err("out of memory for a new connection");
    return;
  }
  s->srv = srv;
  s->task = -1;
  s->holder_of = -1;
  s->id = ++srv->next_session_id;
  if (ts_conn_init(srv->loop, &s->conn, &session_cbs, 0, s) < 0) {
    ts_free(s);
    return;
  }
  s->conn.max_write_mem = (uint64_t)srv->cfg->max_reply_bytes_per_connection;
  s->conn.write_mem_total = &srv->reply_mem;
  s->next = srv->sessions;
  if (s->next) s->next->prev = s;
  srv->sessions = s;
  srv->num_sessions++;
  if (uv_accept(listener, (uv_stream_t *)&s->conn.handle) < 0 ||
      (srv->tls && ts_conn_use_tls(&s->conn, srv->tls, NULL) < 0) || ts_conn_start(&s->conn) < 0) {
    ts_conn_close(&s->conn, TS_ECLOSED);
    return;
  }
  /* Until it authenticates: the handshake frame only (a small meta, no payload), within
   * the handshake deadline, in the pre-authentication quota. A full quota closes its
   * oldest: a real client handshakes within a round trip, so the oldest is the likeliest
   * to be an idle attacker, while refusing the newest would let idle sockets keep clients
   * out for as long as they are renewed. */
  s->conn.max_meta = (uint32_t)srv->cfg->max_handshake_bytes;
  s->conn.max_data = 0;
  s->accepted_ms = ts_server_now_ms(srv);
  preauth_push(srv, s);
  while (srv->num_preauth > (size_t)srv->cfg->max_preauth_connections) {
    char why[160];
    ts_errmsg_printf(why, sizeof why,
             "%d connections waiting for their handshake is the limit "
             "(server.max_preauth_connections); the oldest is closed",
             srv->cfg->max_preauth_connections);
    preauth_drop(srv, srv->preauth_head, TS_METRICS_DROP_PREAUTH_QUOTA, TS_EBUSY, why);
  }
  randombytes_buf(s->nonce, TS_AUTH_NONCE_LEN);
  char id[96];
  snprintf(id, sizeof id, "ps-server/%s shard %u", TS_VERSION, srv->shard);
  Tessera__Hello hello = TESSERA__HELLO__INIT;
  hello.protocol = TS_PROTOCOL_VERSION;
  hello.shard = srv->shard;
  hello.num_shards = (uint32_t)srv->cfg->num_ps;
  hello.nonce.data = s->nonce;
  hello.nonce.len = TS_AUTH_NONCE_LEN;
  hello.server_id = id;
  hello.incarnation = srv->incarnation;
  hello.features = TS_FEATURE_SPARSE_PUSH_PULL | TS_FEATURE_SPARSE_PUSH_PIECES;
  hello.max_reply_rows = ts_rows_reply_max(srv);
  ts_session_reply(s, TS_MSG_HELLO, &hello.base);
}
