/* A shard's connection on the client thread (ts_client_int.h): connect with backoff, Hello
 * and handshake, re-declaring the model to a restarted shard, liveness (handshake and
 * heartbeat timeouts, progress inside large frames), and decoding every reply into the
 * wire request waiting for it. */
#include "ts_client_int.h"
#include "ts_tls.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_auth.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"
#include "ts_text.h"

static uint64_t loop_now(ts_client_t *c) { return uv_now(&c->loop); }


/* A shard's state, `why`, `tried` and `fatal` are written on the client thread and read by
 * callers (ts_client_open, ts_client_shard_up) under the mutex: every write takes it. */
void ts_cl_set_state(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_sh_state_t st) {
  uv_mutex_lock(&c->mu);
  if (sh->state == SH_READY && st != SH_READY) c->ready--;
  if (sh->state != SH_READY && st == SH_READY) c->ready++;
  sh->state = st;
  ts_require(c->ready >= 0); /* READY counted in and out once per shard */
  uv_cond_broadcast(&c->cv);
  uv_mutex_unlock(&c->mu);
}

/* Record why the shard is not ready: prefix (may be "") followed by detail. */
static void set_fatal(ts_cl_shard_t *sh, int code) {
  uv_mutex_lock(&sh->cl->mu);
  sh->fatal = code;
  uv_cond_broadcast(&sh->cl->cv);
  uv_mutex_unlock(&sh->cl->mu);
}

void ts_cl_note_why(ts_cl_shard_t *sh, const char *prefix, const char *detail) {
  char why[sizeof sh->why];
  snprintf(why, sizeof why, "%s%.200s", prefix, detail);
  uv_mutex_lock(&sh->cl->mu);
  ts_text_clean(why, sh->why, sizeof sh->why);
  sh->tried = true;
  uv_cond_broadcast(&sh->cl->cv);
  uv_mutex_unlock(&sh->cl->mu);
}

const char *ts_cl_why(const ts_cl_shard_t *sh) {
  if (sh->why[0]) return sh->why;
  switch (sh->state) {
    case SH_DOWN: return "reconnecting";
    case SH_CONNECTING: return "connecting";
    case SH_HELLO: return "connected, no hello from it yet";
    case SH_HANDSHAKE: return "connected, in its handshake";
    case SH_DECLARING: return "connected, declaring the model";
    case SH_READY: break;
  }
  return "no answer";
}

static void clear_why(ts_cl_shard_t *sh) {
  uv_mutex_lock(&sh->cl->mu);
  sh->why[0] = 0;
  uv_mutex_unlock(&sh->cl->mu);
}

/* --- connection lifecycle ----------------------------------------------------------- */

static void on_retry(uv_timer_t *t) {
  ts_cl_shard_t *sh = t->data;
  ts_cl_start_connect(sh);
}

static void schedule_retry(ts_cl_shard_t *sh) {
  ts_client_t *c = sh->cl;
  uv_mutex_lock(&c->mu);
  bool stop = c->stop;
  uv_mutex_unlock(&c->mu);
  if (stop) return;
  if (sh->backoff_ms == 0) sh->backoff_ms = TS_CL_BACKOFF_MIN_MS;
  uv_timer_start(&sh->retry, on_retry, sh->backoff_ms, 0);
  sh->backoff_ms *= 2;
  if (sh->backoff_ms > TS_CL_BACKOFF_MAX_MS) sh->backoff_ms = TS_CL_BACKOFF_MAX_MS;
}

static void on_link_close(ts_conn_t *conn, int err) {
  ts_cl_link_t *l = conn->data;
  ts_cl_shard_t *sh = l->sh;
  if (sh && sh->link == l) {
    sh->link = NULL;
    bool was_ready = sh->state == SH_READY;
    ts_cl_set_state(sh->cl, sh, SH_DOWN);
    if (!sh->why[0] || was_ready) {
      ts_cl_note_why(sh, "connection lost: ",
               conn->errmsg[0] ? conn->errmsg : (err == TS_ECLOSED ? "closed by the server" : ts_strerror(err)));
    }
    if (was_ready) ts_log_warn("lost connection to shard %u (%s): %s", sh->index, sh->addr, sh->why);
    /* TLS refused (a certificate either side does not accept): retrying will not help. */
    if (err == TS_EAUTH) set_fatal(sh, TS_EAUTH);
    while (sh->pending) {
      ts_cl_wreq_t *r = sh->pending;
      sh->pending = r->next;
      ts_cl_complete_req(r, TS_ECLOSED, sh->why);
    }
    schedule_retry(sh);
  }
  ts_free(l);
}

static void on_connect(uv_connect_t *creq, int status) {
  ts_cl_link_t *l = creq->data;
  if (!l->sh) return;
  if (status < 0) {
    ts_cl_note_why(l->sh, "", uv_strerror(status));
    ts_conn_close(&l->conn, status);
    return;
  }
  if (ts_conn_start(&l->conn) < 0) {
    ts_conn_close(&l->conn, TS_ECLOSED);
    return;
  }
  ts_cl_set_state(l->sh->cl, l->sh, SH_HELLO);
  l->sh->state_ms = loop_now(l->sh->cl);
}

static void connect_to(ts_cl_shard_t *sh) {
  ts_client_t *c = sh->cl;
  ts_cl_link_t *l = ts_calloc(1, sizeof *l);
  if (!l || ts_conn_init(&c->loop, &l->conn, &ts_cl_link_cbs, TS_CL_MAX_DATA, l) < 0) {
    ts_free(l);
    ts_cl_note_why(sh, "", "out of memory");
    schedule_retry(sh);
    return;
  }
  if (c->tls && ts_conn_use_tls(&l->conn, c->tls, sh->host) < 0) {
    ts_cl_note_why(sh, "", "out of memory");
    ts_conn_close(&l->conn, TS_ENOMEM);
    schedule_retry(sh);
    return;
  }
  l->sh = sh;
  l->creq.data = l;
  sh->link = l;
  ts_cl_set_state(sh->cl, sh, SH_CONNECTING);
  sh->state_ms = loop_now(c);
  clear_why(sh);
  int rc = uv_tcp_connect(&l->creq, &l->conn.handle, (const struct sockaddr *)&sh->sa, on_connect);
  if (rc < 0) {
    ts_cl_note_why(sh, "", uv_strerror(rc));
    ts_conn_close(&l->conn, rc);
  }
}

/* A name that does not resolve (yet) is retried like a refused connection, with its reason
 * ("cannot resolve 'ps-0.ps': Name or service not known") in the waiting notices. */
static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai) {
  ts_cl_shard_t *sh = req->data;
  ts_client_t *c = sh->cl;
  sh->resolving = false;
  uv_mutex_lock(&c->mu);
  bool stop = c->stop;
  uv_mutex_unlock(&c->mu);
  if (stop || status == UV_ECANCELED) {
    uv_freeaddrinfo(ai);
    return;
  }
  if (status < 0 || !ai) {
    char host[256] = "";
    (void)ts_addr_split(sh->addr, host, sizeof host, NULL);
    char why[320];
    snprintf(why, sizeof why, "cannot resolve '%s': %s", host, uv_strerror(status));
    uv_freeaddrinfo(ai);
    ts_cl_note_why(sh, "", why);
    schedule_retry(sh);
    return;
  }
  memcpy(&sh->sa, ai->ai_addr, ai->ai_addrlen);
  uv_freeaddrinfo(ai);
  connect_to(sh);
}

void ts_cl_start_connect(ts_cl_shard_t *sh) {
  if (!sh->by_name) {
    connect_to(sh);
    return;
  }
  char host[256], port[8];
  int p = 0;
  if (ts_addr_split(sh->addr, host, sizeof host, &p) < 0) return; /* checked at open */
  snprintf(port, sizeof port, "%d", p);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV};
  sh->gai.data = sh;
  int rc = uv_getaddrinfo(&sh->cl->loop, &sh->gai, on_resolved, host, port, &hints);
  if (rc < 0) {
    ts_cl_note_why(sh, "cannot resolve: ", uv_strerror(rc));
    schedule_retry(sh);
    return;
  }
  sh->resolving = true;
}

/* --- receiving ---------------------------------------------------------------------- */

static int on_meta(ts_conn_t *conn, const ts_frame_header_t *h, ProtobufCMessage *msg,
                   const uv_buf_t **iov, unsigned *niov) {
  ts_cl_link_t *l = conn->data;
  if (h->type == TS_MSG_SPARSE_PULL_REPLY && l->sh) {
    int rc = ts_cl_sparse_reply_meta(l->sh, (const Tessera__SparsePullReply *)msg, iov, niov);
    if (rc < 0) {
      snprintf(conn->errmsg, sizeof conn->errmsg, "table pull reply does not match the request");
      ts_log_err("shard %u (%s): %s", l->sh->index, l->sh->addr, conn->errmsg);
    }
    return rc;
  }
  if (h->type == TS_MSG_TABLE_KEYS_REPLY && l->sh) {
    const Tessera__TableKeysReply *m = (const Tessera__TableKeysReply *)msg;
    ts_cl_wreq_t *r = ts_cl_find_pending(l->sh, m->request_id, h->type);
    if (!r || !r->op) return 0; /* nobody waits for it: read and drop */
    if (r->type != TS_MSG_TABLE_KEYS || m->table != r->op->keys_table ||
        m->num_keys > r->op->keys_max) {
      snprintf(conn->errmsg, sizeof conn->errmsg, "table keys reply does not match the request");
      ts_log_err("shard %u (%s): %s", l->sh->index, l->sh->addr, conn->errmsg);
      return TS_EPROTO;
    }
    if (m->num_keys) {
      r->rx = uv_buf_init((char *)r->op->keys_out, (unsigned)(m->num_keys * sizeof(uint64_t)));
      *iov = &r->rx;
      *niov = 1;
    }
    return 0;
  }
  if (h->type != TS_MSG_PULL_REPLY || !l->sh) return 0;
  const Tessera__PullReply *m = (const Tessera__PullReply *)msg;
  ts_cl_wreq_t *r = ts_cl_find_pending(l->sh, m->request_id, h->type);
  if (!r || !r->op) return 0; /* nobody waits for it: read and drop */
  const ts_plan_t *plan = &l->sh->cl->plan;
  if (m->n_parts != r->n) goto mismatch;
  for (size_t i = 0; i < r->n; i++) {
    const ts_part_t *p = &plan->parts[r->parts[i]];
    if (m->parts[i]->tensor != p->tensor || m->parts[i]->part != p->part ||
        m->parts[i]->count != p->count)
      goto mismatch;
  }
  *iov = r->iov;
  *niov = (unsigned)r->n;
  return 0;
mismatch:
  snprintf(conn->errmsg, sizeof conn->errmsg, "pull reply does not match the request");
  ts_log_err("shard %u (%s): %s", l->sh->index, l->sh->addr, conn->errmsg);
  return TS_EPROTO;
}

static void handle_hello(ts_cl_shard_t *sh, const Tessera__Hello *m) {
  ts_client_t *c = sh->cl;
  ts_conn_t *conn = &sh->link->conn;
  if (m->protocol != TS_PROTOCOL_VERSION || m->nonce.len != TS_AUTH_NONCE_LEN) {
    ts_cl_note_why(sh, "", "the server speaks another protocol version");
    set_fatal(sh, TS_EVERSION);
    ts_conn_close(conn, TS_EVERSION);
    return;
  }
  if (m->shard != sh->index) {
    char why[128];
    snprintf(why, sizeof why, "the server there is shard %u, not %u", m->shard, sh->index);
    ts_cl_note_why(sh, "", why);
    set_fatal(sh, TS_ECONFIG);
    ts_conn_close(conn, TS_ECONFIG);
    return;
  }
  if (sh->incarnation && m->incarnation != sh->incarnation) {
    /* A new process: what was pulled from the old one says nothing about this one. */
    sh->have_version = false;
    uv_mutex_lock(&c->mu);
    c->restarts++;
    uv_mutex_unlock(&c->mu);
    ts_log_warn("shard %u (%s) restarted", sh->index, sh->addr);
  }
  sh->incarnation = m->incarnation;
  sh->features = m->features;
  sh->max_reply_rows = m->max_reply_rows;
  Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
  uint8_t mac[TS_AUTH_MAC_LEN];
  sh->hs_id = ++c->next_id;
  hs.request_id = sh->hs_id;
  hs.protocol = TS_PROTOCOL_VERSION;
  hs.role = c->opts.admin ? TESSERA__ROLE__ROLE_ADMIN : TESSERA__ROLE__ROLE_WORKER;
  hs.task = c->opts.admin ? -1 : c->opts.task;
  hs.identity = c->identity;
  if (!c->opts.admin) {
    hs.n_job = c->n_job;
    hs.job = c->job_p;
  }
  if (c->token) {
    ts_auth_mac(c->token, m->nonce.data, m->nonce.len, mac);
    hs.mac.data = mac;
    hs.mac.len = sizeof mac;
    /* The shard proves it knows the key too (handle_handshake_reply). */
    memcpy(sh->hs_nonce[0], m->nonce.data, TS_AUTH_NONCE_LEN);
    randombytes_buf(sh->hs_nonce[1], TS_AUTH_NONCE_LEN);
    hs.client_nonce.data = sh->hs_nonce[1];
    hs.client_nonce.len = TS_AUTH_NONCE_LEN;
  }
  ts_cl_set_state(sh->cl, sh, SH_HANDSHAKE);
  sh->state_ms = loop_now(c);
  if (ts_conn_send(conn, TS_MSG_HANDSHAKE, &hs.base, NULL, 0, NULL, NULL) < 0)
    ts_conn_close(conn, TS_ECLOSED);
}

static void became_ready(ts_cl_shard_t *sh) {
  sh->backoff_ms = 0;
  sh->rx_ms = loop_now(sh->cl);
  clear_why(sh);
  ts_cl_set_state(sh->cl, sh, SH_READY);
  ts_cl_flush_queued(sh);
}

/* Mutual authentication: with a key, the reply must carry the shard's proof of it
 * (net/ts_auth.h). Anything else answering on the shard's address is refused for good. */
static bool shard_proved(ts_cl_shard_t *sh, const Tessera__HandshakeReply *m) {
  ts_client_t *c = sh->cl;
  if (!c->token ||
      ts_auth_verify_proof(c->token, sh->hs_nonce[0], sh->hs_nonce[1], m->proof.data,
                           m->proof.len) == 0)
    return true;
  char why[400];
  snprintf(why, sizeof why,
           "authentication failed: %.80s %s it knows the token (not a shard of this job, one "
           "without auth.token_file, or older than this client)",
           sh->addr, m->proof.len ? "sent a wrong proof that" : "did not prove");
  ts_log_err("shard %u: %s", sh->index, why);
  ts_cl_note_why(sh, "", why);
  set_fatal(sh, TS_EAUTH);
  ts_conn_close(&sh->link->conn, TS_EAUTH);
  return false;
}

static void handle_handshake_reply(ts_cl_shard_t *sh, const Tessera__HandshakeReply *m) {
  ts_client_t *c = sh->cl;
  if (!shard_proved(sh, m)) return;
  uv_mutex_lock(&c->mu);
  c->partition_bytes = m->partition_bytes;
  c->job_workers = m->num_workers;
  c->mode = m->mode;
  sh->tried = true;
  bool declared = c->declared;
  uv_mutex_unlock(&c->mu);
  if (declared) {
    /* A restarted shard has no model: declare it again before anything else. The model is
     * encoded (send_req) under the mutex, so a ts_client_declare replacing it meanwhile
     * waits, or has cleared `declared` first and nothing is sent. */
    ts_cl_set_state(c, sh, SH_DECLARING);
    uv_mutex_lock(&c->mu);
    int rc = c->declared ? ts_cl_submit_wire(c, sh, NULL, TS_MSG_DECLARE, NULL, 0) : 0;
    bool still = c->declared;
    uv_mutex_unlock(&c->mu);
    if (rc < 0) ts_conn_close(&sh->link->conn, TS_ENOMEM);
    if (rc < 0 || still) return;
  }
  became_ready(sh);
}

/* A shard's Error as this library may pass it on (*view, its detail in buf): a code that is
 * not one of Tessera's (a shard sends no other) becomes TS_EPROTO with the number in the
 * text, and the detail is cleaned (base/ts_text.h), so that neither an unknown code nor a
 * control byte from a peer reaches a caller, a terminal or an exception. */
static const Tessera__Error *peer_error(const Tessera__Error *e, Tessera__Error *view,
                                        char *buf, size_t n) {
  *view = *e;
  char raw[1024];
  if (ts_err_is_ts(e->code))
    snprintf(raw, sizeof raw, "%s", e->detail ? e->detail : "");
  else
    snprintf(raw, sizeof raw, "the shard answered with error code %d, which is not one of "
             "Tessera's: %s", (int)e->code, e->detail ? e->detail : "");
  view->code = ts_err_is_ts(e->code) ? e->code : TS_EPROTO;
  ts_text_clean(raw, buf, n);
  view->detail = buf;
  view->name = (char *)ts_err_name(view->code);
  return view;
}

static void on_frame(ts_conn_t *conn, const ts_frame_header_t *h, ProtobufCMessage *msg,
                     bool discarded) {
  ts_cl_link_t *l = conn->data;
  ts_cl_shard_t *sh = l->sh;
  if (!sh || sh->link != l) {
    ts_msg_free(msg);
    return;
  }
  sh->rx_ms = loop_now(sh->cl);
  sh->cl->activity++;
  switch (h->type) {
    case TS_MSG_HELLO:
      if (sh->state == SH_HELLO) handle_hello(sh, (const Tessera__Hello *)msg);
      break;
    case TS_MSG_HANDSHAKE_REPLY:
      if (sh->state == SH_HANDSHAKE) handle_handshake_reply(sh, (const Tessera__HandshakeReply *)msg);
      break;
    case TS_MSG_ERROR: {
      Tessera__Error view;
      char detail[512];
      const Tessera__Error *e =
          peer_error((const Tessera__Error *)msg, &view, detail, sizeof detail);
      if (e->request_id == sh->hs_id || sh->state < SH_DECLARING) {
        /* The reason first: ts_client_open, woken by any shard, reports a refused shard's
         * why the moment it sees job_refused. `opening` is read before set_fatal wakes it:
         * while it waits, it says why itself. */
        ts_cl_note_why(sh, "", e->detail);
        uv_mutex_lock(&sh->cl->mu);
        bool opening = sh->cl->opening;
        if (e->code == TS_ECONFIG) sh->job_refused = true;
        uv_mutex_unlock(&sh->cl->mu);
        if (e->code == TS_EAUTH || e->code == TS_EVERSION || e->code == TS_EINVAL ||
            e->code == TS_ECONFIG)
          set_fatal(sh, e->code);
        /* A shard restarted with another job file: once, not at every retry. */
        if (e->code == TS_ECONFIG && !opening && !sh->job_refused_logged) {
          sh->job_refused_logged = true;
          ts_log_err("shard %u (%s) refused this worker: %s", sh->index, sh->addr, e->detail);
        }
        break; /* the server closes the connection */
      }
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, e->request_id, TS_MSG_ERROR);
      if (r && r->internal && r->type == TS_MSG_DECLARE) {
        ts_log_err("shard %u (%s) refused the model: %s", sh->index, sh->addr, e->detail);
        ts_cl_note_why(sh, "model refused: ", e->detail);
        ts_cl_complete_req(r, e->code, e->detail);
        ts_conn_close(conn, e->code);
      } else if (r && r->rides && e->code == TS_EBUSY && ts_cl_sparse_pull_again(sh, r) == 0) {
        /* The push went alone (no room for its rows, or a duplicate): its pull is out on its
         * own. A refused push refuses its pull with its own error, never EBUSY. */
      } else if (r) {
        ts_cl_complete_req(r, e->code, e->detail);
      } else if (e->request_id == 0) {
        ts_log_warn("shard %u (%s): %s", sh->index, sh->addr, e->detail);
      }
      break;
    }
    case TS_MSG_DECLARE_REPLY: {
      const Tessera__DeclareReply *m = (const Tessera__DeclareReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op && m->awaiting_values) r->op->awaiting = true;
      bool internal = r->internal;
      ts_cl_complete_req(r, 0, NULL);
      if (internal && sh->state == SH_DECLARING) became_ready(sh);
      break;
    }
    case TS_MSG_PULL_REPLY: {
      const Tessera__PullReply *m = (const Tessera__PullReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (!discarded && m->n_parts > 0) {
        uint64_t v = UINT64_MAX;
        for (size_t i = 0; i < m->n_parts; i++)
          if (m->parts[i]->version < v) v = m->parts[i]->version;
        if (!r->staged) {
          sh->pulled_version = v;
          sh->have_version = true;
        } else if (r->op) {
          r->op->stage[sh->index] = (ts_cl_staged_t){.version = v, .incarnation = sh->incarnation,
                                               .set = true};
        }
        if (r->op && v < r->op->version_min) r->op->version_min = v;
      }
      if (r->op && !discarded) {
        ts_cl_complete_req(r, 0, NULL);
      } else {
        ts_cl_complete_req(r, TS_ENOMEM, "pull reply dropped");
      }
      break;
    }
    case TS_MSG_PUSH_REPLY: {
      const Tessera__PushReply *m = (const Tessera__PushReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op) {
        if (r->op->acked) r->op->acked[sh->index] = 1;
        for (size_t i = 0; i < m->n_results; i++) {
          switch (m->results[i]) {
            case TESSERA__PUSH_RESULT__PUSH_APPLIED:
              r->op->applied++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_ACCUMULATED:
              r->op->accumulated++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_STALE:
              r->op->stale++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_DUPLICATE:
              r->op->duplicate++;
              break;
            default:
              break;
          }
        }
      }
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_SPARSE_PULL_REPLY:
    case TS_MSG_SPARSE_PUSH_REPLY:
      ts_cl_sparse_on_reply(sh, h->type, msg, discarded);
      break;
    case TS_MSG_CHECKPOINT_REPLY: {
      const Tessera__CheckpointReply *m = (const Tessera__CheckpointReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op) {
        ts_text_clean(m->path, r->op->path, sizeof r->op->path);
        r->op->ckpt_step = m->step;
      }
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_SHUTDOWN_REPLY: {
      const Tessera__ShutdownReply *m = (const Tessera__ShutdownReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op) ts_text_clean(m->checkpoint_path, r->op->path, sizeof r->op->path);
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_MODEL_RESET_REPLY: {
      const Tessera__ModelResetReply *m = (const Tessera__ModelResetReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op) {
        r->op->dropped = m->dropped;
        r->op->reset_bytes = m->bytes;
        r->op->workers_closed = m->workers_closed;
      }
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_TABLE_KEYS_REPLY: {
      const Tessera__TableKeysReply *m = (const Tessera__TableKeysReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op && discarded && m->num_keys) {
        ts_cl_complete_req(r, TS_EPROTO, "the keys of a table keys reply were lost");
        break;
      }
      if (r->op) {
        r->op->keys_n = m->num_keys;
        r->op->keys_next = m->next_cursor;
        r->op->keys_done = m->done;
        r->op->keys_erased = m->erased;
        r->op->keys_rows = m->rows;
        r->op->keys_got = true;
      }
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_HEARTBEAT_REPLY: {
      const Tessera__HeartbeatReply *m = (const Tessera__HeartbeatReply *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (r && r->op && sh->index == 0) {
        r->op->hb0 = true;
        r->op->job_end = (ts_client_job_end_t){.workers_finished = m->workers_finished,
                                               .num_workers = m->num_workers,
                                               .report_final = m->report_final,
                                               .workers_joined = m->workers_joined};
      }
      if (r) ts_cl_complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_STATUS_REPLY: {
      Tessera__ShardStatus *m = (Tessera__ShardStatus *)msg;
      ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, h->type);
      if (!r) break;
      if (r->op && !r->op->status) {
        r->op->status = m;
        msg = NULL; /* now the op's */
      }
      ts_cl_complete_req(r, 0, NULL);
      break;
    }
    default:
      ts_log_warn("shard %u (%s) sent an unexpected %s frame", sh->index, sh->addr,
                  ts_frame_type_name(h->type));
      break;
  }
  ts_msg_free(msg);
}

const ts_conn_cbs_t ts_cl_link_cbs = {
    .on_meta = on_meta,
    .on_frame = on_frame,
    .on_close = on_link_close,
};


/* Connections that never finish their handshake, or go silent while heartbeats are on,
 * are closed and tried again: the shard may be stopped (SIGSTOP) or its host gone. */
void ts_cl_log_waiting(ts_client_t *c, uint64_t now) {
  double interval = c->opts.wait_log_interval_s == 0 ? 5.0 : c->opts.wait_log_interval_s;
  if (interval < 0) return;
  uv_mutex_lock(&c->mu);
  bool opening = c->opening;
  uv_mutex_unlock(&c->mu);
  if (!opening) return;
  if (c->open_ms == 0) c->open_ms = c->wait_log_ms = now;
  if ((double)(now - c->wait_log_ms) < interval * 1000.0) return;
  c->wait_log_ms = now;
  for (uint32_t i = 0; i < c->n; i++) {
    ts_cl_shard_t *sh = &c->shards[i];
    char why[sizeof sh->why];
    uv_mutex_lock(&c->mu);
    bool ready = sh->state == SH_READY;
    snprintf(why, sizeof why, "%s", sh->why[0] ? sh->why : "no answer yet");
    uv_mutex_unlock(&c->mu);
    if (!ready)
      ts_log_notice("waiting for shard %u (%s) for %.0f s: %s", sh->index, sh->addr,
                    (double)(now - c->open_ms) / 1000.0, why);
  }
}

/* A handshake is a round trip or two: a connection not through it within this long (a
 * stopped shard, a host that drops packets) is closed and tried again, however long
 * ts_client_open may wait for the shards overall. */
#define TS_CL_HANDSHAKE_MAX_S 10.0

void ts_cl_check_links(ts_client_t *c, uint64_t now) {
  double hs_s = c->opts.connect_timeout_s > 0 ? c->opts.connect_timeout_s : 5.0;
  if (hs_s > TS_CL_HANDSHAKE_MAX_S) hs_s = TS_CL_HANDSHAKE_MAX_S;
  uint64_t hs_limit = (uint64_t)(hs_s * 1000.0);
  double hb_timeout = c->opts.heartbeat_timeout_s > 0 ? c->opts.heartbeat_timeout_s : 5.0;
  uint64_t rx_limit = (uint64_t)(hb_timeout * 1000.0);
  for (uint32_t i = 0; i < c->n; i++) {
    ts_cl_shard_t *sh = &c->shards[i];
    if (!sh->link) continue;
    char why[128];
    /* A heartbeat's reply queues behind a large frame on the same connection (a 400 MiB
     * pull takes seconds on a loaded machine): bytes arriving, or our queued bytes being
     * taken by the peer, show it alive as well as a frame does. A stopped peer does
     * neither. */
    uint64_t in = sh->link->conn.bytes_in;
    size_t wq = ts_conn_write_queue(&sh->link->conn);
    if (in != sh->seen_in || wq < sh->seen_wq) sh->rx_ms = now;
    sh->seen_in = in;
    sh->seen_wq = wq;
    if (sh->state != SH_READY && sh->state != SH_DOWN && now - sh->state_ms > hs_limit) {
      snprintf(why, sizeof why, "no handshake within %.1f s", (double)hs_limit / 1000.0);
    } else if (sh->state == SH_READY && c->opts.heartbeat_interval_s > 0 && now - sh->rx_ms > rx_limit) {
      snprintf(why, sizeof why, "no answer for %.1f s (heartbeat timeout)", (double)(now - sh->rx_ms) / 1000.0);
    } else {
      continue;
    }
    ts_cl_note_why(sh, "", why);
    snprintf(sh->link->conn.errmsg, sizeof sh->link->conn.errmsg, "%s", why);
    ts_conn_close(&sh->link->conn, TS_ETIMEDOUT);
  }
}
