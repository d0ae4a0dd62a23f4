/*
 * The model's lifecycle on a shard: who may define it, how much memory that may take, and
 * how it is built without holding up the loop.
 *
 * A Declare is checked against server.max_model_bytes before anything is allocated
 * (ts_store_prepare). Its partitions are then allocated and initialised in libuv's thread
 * pool on a model that is not yet the store's (ts_store_build), and installed on the loop
 * when done: a large model does not stop the shard serving its other connections. Declares
 * that arrive meanwhile are matched against the model being built: the same model waits
 * for it, another is refused as it would be once the model is there (TS_ESHAPE).
 *
 * The first Declare on a fresh shard defines the model, and it is replaced only by an admin
 * (psctl model reset), never by a later Declare (docs/security.md).
 */
#include "ts_server_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* A reset waits at most this long for pull replies being written from the partitions. */
#define RESET_WAIT_MS 5000
#define RESET_POLL_MS 10

typedef struct waiter {
  struct waiter *next;
  uint64_t session_id, request_id;
  bool first; /* its Declare started the build: its reply says created */
} waiter_t;

struct ts_declare_build {
  uv_work_t req;
  ts_server_t *srv;
  ts_store_model_t m;
  /* The Declares answered when the build is done, the first included: at most one per
   * connection (a second one is refused), so the list is bounded by server.max_connections. */
  waiter_t *waiters;
  int task;
  char peer[64];
  int rc;
  char err[256];
  uint64_t start_ns;
};

static void publish_bytes(ts_server_t *srv) {
  srv->metrics.model_bytes = srv->store.declared ? srv->store.bytes + srv->store.state_bytes : 0;
}

static void reply_declared(ts_session_t *s, uint64_t request_id, bool created) {
  ts_server_t *srv = s->srv;
  Tessera__DeclareReply r = TESSERA__DECLARE_REPLY__INIT;
  r.request_id = request_id;
  r.created = created;
  r.partitions = (uint32_t)srv->store.num_parts;
  r.bytes = srv->store.bytes;
  r.version = ts_store_min_version(&srv->store);
  r.awaiting_values = srv->store.awaiting > 0;
  ts_session_reply(s, TS_MSG_DECLARE_REPLY, &r.base);
}

static void free_build(ts_declare_build_t *b) {
  while (b->waiters) {
    waiter_t *w = b->waiters;
    b->waiters = w->next;
    ts_free(w);
  }
  ts_store_model_free(&b->m);
  ts_free(b);
}

static int add_waiter(ts_declare_build_t *b, ts_session_t *s, uint64_t request_id, bool first) {
  waiter_t *w = ts_calloc(1, sizeof *w);
  if (!w) return TS_ENOMEM;
  w->session_id = s->id;
  w->request_id = request_id;
  w->first = first;
  w->next = b->waiters;
  b->waiters = w;
  return 0;
}

static void build_work(uv_work_t *req) {
  ts_declare_build_t *b = req->data;
  b->rc = ts_store_build(&b->m, b->err, sizeof b->err);
}

static void build_done(uv_work_t *req, int status) {
  ts_declare_build_t *b = req->data;
  ts_server_t *srv = b->srv;
  ts_require(srv->model.build == b);
  srv->model.build = NULL;
  if (status < 0 && b->rc == 0) {
    b->rc = status;
    ts_errmsg_printf(b->err, sizeof b->err, "building the model was cancelled: %s", uv_strerror(status));
  }
  if (srv->stopping) {
    free_build(b);
    return;
  }
  double ms = (double)(uv_hrtime() - b->start_ns) / 1e6;
  if (b->rc == 0) {
    ts_store_install(&srv->store, &b->m);
    publish_bytes(srv);
    ts_log_info(
        "model declared by task %d (%s): %u tensors, %zu partitions here (%.1f MiB, "
        "%.1f MiB with optimizer state), built in %.0f ms",
        b->task, b->peer, srv->store.num_tensors, srv->store.num_parts,
        (double)srv->store.bytes / (1024.0 * 1024.0),
        (double)(srv->store.bytes + srv->store.state_bytes) / (1024.0 * 1024.0), ms);
  } else {
    ts_log_err("declare by task %d (%s) failed: %s", b->task, b->peer, b->err);
  }
  for (waiter_t *w = b->waiters; w; w = w->next) {
    ts_session_t *s = ts_session_find(srv, w->session_id);
    if (!s || s->conn.closing) continue;
    if (b->rc == 0)
      reply_declared(s, w->request_id, w->first);
    else
      ts_session_reply_error(s, TS_MSG_DECLARE, w->request_id,
                             ts_err_is_ts(b->rc) ? b->rc : TS_EINTERNAL, b->err);
  }
  free_build(b);
}

/* No model and none being built: check d, then build it in the thread pool. */
static void start_build(ts_session_t *s, Tessera__Declare *d) {
  ts_server_t *srv = s->srv;
  char err[256];
  ts_declare_build_t *b = ts_calloc(1, sizeof *b);
  if (!b) {
    ts_session_reply_error(s, TS_MSG_DECLARE, d->request_id, TS_ENOMEM, "out of memory");
    return;
  }
  int rc = ts_store_prepare(&srv->store, d, &b->m, err, sizeof err);
  if (rc < 0) {
    /* One log line (peer, request, code and the detail naming server.max_model_bytes) and
     * one count (request="declare", reason="toobig"), from ts_session_reply_error. */
    ts_session_reply_error(s, TS_MSG_DECLARE, d->request_id, rc, err);
    free_build(b);
    return;
  }
  b->req.data = b;
  b->srv = srv;
  b->task = s->task;
  snprintf(b->peer, sizeof b->peer, "%s", s->conn.peer);
  b->start_ns = uv_hrtime();
  if ((rc = add_waiter(b, s, d->request_id, true)) < 0 ||
      (rc = uv_queue_work(srv->loop, &b->req, build_work, build_done)) < 0) {
    ts_errmsg_printf(err, sizeof err, "cannot start building the model: %s", ts_strerror(rc));
    ts_session_reply_error(s, TS_MSG_DECLARE, d->request_id, ts_err_is_ts(rc) ? rc : TS_EINTERNAL,
                           err);
    free_build(b);
    return;
  }
  srv->model.build = b;
  ts_log_debug("%s: building the model of task %d: %.1f MiB here", s->conn.peer, s->task,
               (double)b->m.need_bytes / (1024.0 * 1024.0));
}

void ts_declare_handle(ts_session_t *s, Tessera__Declare *m) {
  ts_server_t *srv = s->srv;
  char err[256];
  ts_declare_build_t *b = srv->model.build;
  if (s->role != TESSERA__ROLE__ROLE_WORKER) {
    ts_session_reply_error(s, TS_MSG_DECLARE, m->request_id, TS_EROLE,
                           "only workers declare tensors");
  } else if (srv->model.reset_pending) {
    ts_session_reply_error(s, TS_MSG_DECLARE, m->request_id, TS_EBUSY,
                           "the model is being reset (psctl model reset); declare again");
  } else if (srv->store.declared) {
    int rc = ts_store_same_model(&srv->store, NULL, m, err, sizeof err);
    if (rc < 0)
      ts_session_reply_error(s, TS_MSG_DECLARE, m->request_id, rc, err);
    else
      reply_declared(s, m->request_id, false);
  } else if (b) {
    int rc = ts_store_same_model(&srv->store, &b->m, m, err, sizeof err);
    bool waiting = false;
    for (waiter_t *w = b->waiters; w && rc == 0; w = w->next) waiting |= w->session_id == s->id;
    if (rc == 0 && waiting) {
      rc = TS_EBUSY;
      ts_errmsg_printf(err, sizeof err, "this connection's declare of the model is still being built");
    }
    if (rc == 0) rc = add_waiter(b, s, m->request_id, false);
    if (rc < 0)
      ts_session_reply_error(s, TS_MSG_DECLARE, m->request_id, rc,
                             rc == TS_ENOMEM ? "out of memory" : err);
  } else {
    start_build(s, m);
  }
  ts_msg_free(&m->base);
}

/* --- reset ------------------------------------------------------------------------- */

static bool is_worker(const ts_session_t *s) {
  return s->handshaken && s->role == TESSERA__ROLE__ROLE_WORKER;
}

/* Nothing points into the partitions: no worker connection is left (they push and hold
 * parked pulls), no pull reply is being written from them, no push waits on them. */
static bool partitions_free(ts_server_t *srv) {
  for (ts_session_t *s = srv->sessions; s; s = s->next)
    if (is_worker(s) || s->rx.active) return false;
  if (srv->held || srv->waiting) return false;
  return !ts_store_in_use(&srv->store);
}

static void on_reset_timer_closed(uv_handle_t *h) {
  ts_server_t *srv = h->data;
  srv->open_handles--;
  ts_free(h);
}

static void finish_reset(ts_server_t *srv, int rc, const char *why) {
  ts_declare_state_t *ms = &srv->model;
  ms->reset_pending = false;
  if (ms->reset_timer) {
    uv_close((uv_handle_t *)ms->reset_timer, on_reset_timer_closed);
    ms->reset_timer = NULL;
  }
  ts_session_t *s = ts_session_find(srv, ms->reset_session);
  if (rc < 0) {
    ts_log_warn("model reset abandoned: %s", why);
    if (s) ts_session_reply_error(s, TS_MSG_MODEL_RESET, ms->reset_request, rc, why);
    return;
  }
  Tessera__ModelResetReply r = TESSERA__MODEL_RESET_REPLY__INIT;
  r.request_id = ms->reset_request;
  r.dropped = srv->store.declared;
  r.tensors = srv->store.num_tensors;
  r.bytes = srv->store.bytes + srv->store.state_bytes;
  r.workers_closed = ms->reset_closed;
  if (srv->store.declared) {
    ts_log_notice(
        "model reset: dropped %u tensors, %.1f MiB of parameters and optimizer state "
        "at step %llu; the next declare defines the model",
        r.tensors, (double)r.bytes / (1024.0 * 1024.0),
        (unsigned long long)ts_store_min_version(&srv->store));
    ts_store_reset(&srv->store);
    ts_pushid_reset(&srv->pushids); /* the next model's partitions are others */
    /* The staging buffers were sized for this model's largest partition and the next
     * model's may be larger: the pool is set up again on its first push. No push holds or
     * waits for a buffer now (partitions_free: no worker connection is left). */
    ts_require(srv->stage.in_use == 0 && !srv->stage.head);
    ts_stage_free(&srv->stage);
    srv->ckpt_applied = 0; /* the new model's first update is worth a checkpoint */
    srv->ckpt_base = 0;    /* and is a full one */
    srv->ckpt_saved_step = 0;
    srv->ckpt_since_full = 0;
    /* The end of the job was the old model's: the next model's training chooses its own
     * reporting worker, and has no final accuracy until that one sends it. */
    srv->final_reporter = -1;
    srv->has_final_acc = false;
    srv->final_acc = 0.0;
    srv->final_refused_warned = false;
    srv->job_since_ms = ts_server_now_ms(srv);
    srv->start_passed = false; /* the next model's step 1 waits for its workers again */
    srv->start_wait_ms = 0;
    ts_barrier_forget_done(&srv->barrier);
    /* To clients the shard is now a new one, as after a restart without a checkpoint: what
     * they pulled before says nothing about the versions of the next model. */
    randombytes_buf(&srv->incarnation, sizeof srv->incarnation);
    srv->metrics.model_resets++;
    publish_bytes(srv);
  } else {
    ts_log_notice("model reset: no model was declared; nothing to drop");
  }
  if (s) ts_session_reply(s, TS_MSG_MODEL_RESET_REPLY, &r.base);
}

static void try_reset(ts_server_t *srv) {
  if (srv->stopping) {
    finish_reset(srv, TS_ESHUTDOWN, "the shard is shutting down");
  } else if (partitions_free(srv)) {
    finish_reset(srv, 0, NULL);
  } else if (ts_server_now_ms(srv) >= srv->model.reset_deadline_ms) {
    finish_reset(srv, TS_EBUSY,
                 "pull replies or pushes still use the partitions after 5 s; try again");
  }
}

static void on_reset_timer(uv_timer_t *t) {
  try_reset(t->data);
}

void ts_declare_reset(ts_session_t *s, Tessera__ModelReset *m) {
  ts_server_t *srv = s->srv;
  ts_declare_state_t *ms = &srv->model;
  char err[256];
  if (!ts_session_admin_allowed(s, TS_MSG_MODEL_RESET, m->request_id, "model reset")) goto out;
  if (ms->build || ms->reset_pending) {
    ts_session_reply_error(s, TS_MSG_MODEL_RESET, m->request_id, TS_EBUSY,
                           ms->build ? "a declared model is being built; try again when it is"
                                     : "a model reset is already under way");
    goto out;
  }
  uint32_t workers = 0;
  for (ts_session_t *w = srv->sessions; w; w = w->next) workers += is_worker(w) && !w->conn.closing;
  if (workers > 0 && !m->force) {
    ts_errmsg_printf(err, sizeof err,
             "%u worker connection(s) are open: stop the workers first, or pass --force to "
             "close them (their clients reconnect and declare again)",
             workers);
    ts_session_reply_error(s, TS_MSG_MODEL_RESET, m->request_id, TS_EBUSY, err);
    goto out;
  }
  ts_log_notice("model reset requested by %s%s", s->conn.peer,
                workers ? " (--force: closing the worker connections)" : "");
  ms->reset_pending = true;
  ms->reset_session = s->id;
  ms->reset_request = m->request_id;
  ms->reset_closed = workers;
  ms->reset_deadline_ms = ts_server_now_ms(srv) + RESET_WAIT_MS;
  for (ts_session_t *w = srv->sessions; w; w = w->next) {
    if (!is_worker(w) || w->conn.closing) continue;
    ts_log_info("%s: closing worker %d's connection for the model reset", w->conn.peer, w->task);
    ts_conn_close(&w->conn, TS_ESHUTDOWN);
  }
  if (partitions_free(srv)) {
    finish_reset(srv, 0, NULL);
    goto out;
  }
  ms->reset_timer = ts_calloc(1, sizeof *ms->reset_timer);
  if (!ms->reset_timer) {
    finish_reset(srv, TS_ENOMEM, "out of memory");
    goto out;
  }
  uv_timer_init(srv->loop, ms->reset_timer);
  ms->reset_timer->data = srv;
  srv->open_handles++;
  uv_timer_start(ms->reset_timer, on_reset_timer, RESET_POLL_MS, RESET_POLL_MS);
out:
  ts_msg_free(&m->base);
}
