#include "ts_client.h"

#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_auth.h"
#include "ts_conn.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"
#include "ts_poll.h"

#define TICK_MS 20
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
/* A reply may carry every partition a shard holds; the largest frame a client accepts. */
#define CLIENT_MAX_DATA (UINT64_C(1) << 40)

typedef enum {
  OP_DECLARE, OP_PULL, OP_PUSH, OP_PUSH_PULL, OP_HEARTBEAT, OP_STATUS, OP_CHECKPOINT, OP_SHUTDOWN
} op_kind_t;

typedef struct req req_t;
typedef struct shard shard_t;

/* What a push_pull's pull part took from one shard, made the shard's pulled_version only
 * when the whole call succeeds (see ts_client_push_pull). */
typedef struct {
  uint64_t version;
  uint64_t incarnation;     /* of the shard that answered */
  bool set;
} staged_t;

typedef struct op {
  struct op *next;
  op_kind_t kind;
  bool wait_ready;
  double timeout_s;
  uint64_t deadline_ms;
  int remaining;
  int rc;
  bool rc_from_push;        /* OP_PUSH_PULL: rc and err are the push part's */
  char err[256];
  /* Set last by the loop thread (release), read by the caller while it polls (acquire) or
   * under mu: once it is true the loop thread no longer touches the op, which lives on
   * the caller's stack. */
  atomic_bool done;
  req_t *reqs;              /* outstanding requests of this op, linked by op_next */
  /* arguments */
  float *const *dst;
  const float *const *grad;
  const size_t *parts;
  size_t nparts;
  uint64_t min_version, clock, step;
  bool per_shard;           /* pull_next / push_pulled: versions from each shard's last pull */
  staged_t *stage;          /* OP_PUSH_PULL: one per shard */
  bool checkpoint;          /* shutdown: final checkpoint */
  uint32_t shard;
  /* results */
  uint64_t version_min;
  ts_client_push_result_t push;
  Tessera__ShardStatus *status;
  char path[600];           /* checkpoint, shutdown */
  uint64_t ckpt_step;
} op_t;

struct req {
  req_t *next;              /* in its shard's queued or pending list */
  req_t *op_next;
  op_t *op;                 /* NULL for internal requests and orphans of a timed-out op */
  shard_t *sh;
  uint64_t id;
  uint16_t type;
  bool internal;
  bool staged;              /* a push_pull's pull: its reply never moves pulled_version itself */
  size_t *parts;            /* plan indices */
  size_t n;
  uv_buf_t *iov;            /* payload: pull destinations or push sources */
};

typedef enum { SH_DOWN, SH_CONNECTING, SH_HELLO, SH_HANDSHAKE, SH_DECLARING, SH_READY } sh_state_t;

typedef struct {
  ts_conn_t conn;
  shard_t *sh;
  uv_connect_t creq;
} link_t;

struct shard {
  ts_client_t *cl;
  uint32_t index;
  char addr[160];
  struct sockaddr_storage sa;
  link_t *link;
  sh_state_t state;
  uv_timer_t retry;
  uint64_t backoff_ms;
  req_t *queued, *pending;
  uint64_t hs_id;
  bool tried;               /* at least one attempt finished (for ts_client_open) */
  uint64_t incarnation;     /* from the shard's Hello; a change means it restarted */
  uint64_t pulled_version;  /* lowest version of the last pull from this shard */
  bool have_version;        /* pulled_version is valid for the shard's current incarnation */
  uint64_t state_ms;        /* loop time of the last state change (handshake timeout) */
  uint64_t rx_ms;           /* loop time of the last sign of life: a frame received, or
                               progress inside a large frame in either direction */
  uint64_t seen_in;         /* conn.bytes_in at the last check_links */
  size_t seen_wq;           /* write queue bytes at the last check_links */
  int fatal;                /* a refusal that retrying will not fix (auth, version) */
  char why[256];
};

struct ts_client {
  ts_client_opts_t opts;
  char *identity, *token;
  uv_thread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  uv_timer_t tick, hb;
  uv_mutex_t mu;
  uv_cond_t cv;
  op_t *queue_head, *queue_tail; /* mu */
  bool stop;                     /* mu */
  volatile sig_atomic_t interrupted; /* set by ts_client_interrupt, from a signal handler */
  op_t *inflight;                /* loop thread */
  uint64_t activity, activity_seen; /* loop thread: frames and hand-overs, for ts_poll */
  shard_t *shards;
  uint32_t n;
  uint64_t next_id;
  int ready;                     /* mu: shards in SH_READY */

  uint64_t partition_bytes;      /* mu */
  uint32_t job_workers;
  Tessera__Mode mode;

  bool declared;                 /* loop thread (set when the first declare succeeds) */
  Tessera__Declare decl;
  Tessera__TensorDecl *decl_t;
  Tessera__TensorDecl **decl_p;
  ts_plan_t plan;
  size_t **shard_parts;
  size_t *shard_nparts;

  uint64_t p_step;               /* mu: progress for heartbeats */
  double p_loss, p_eps, p_prog;
  bool p_done;
  double timeout_s;
  uint64_t restarts;             /* mu */
};

static void start_connect(shard_t *sh);
static void send_req(req_t *r);
static const ts_conn_cbs_t link_cbs;

/* --- small helpers ------------------------------------------------------------------ */

static uint64_t loop_now(ts_client_t *c) { return uv_now(&c->loop); }

/* A shard's state, `why`, `tried` and `fatal` are written on the client thread and read by
 * callers (ts_client_open, ts_client_shard_up) under the mutex: every write takes it. */
static void set_state(ts_client_t *c, shard_t *sh, sh_state_t st) {
  uv_mutex_lock(&c->mu);
  if (sh->state == SH_READY && st != SH_READY) c->ready--;
  if (sh->state != SH_READY && st == SH_READY) c->ready++;
  sh->state = st;
  uv_cond_broadcast(&c->cv);
  uv_mutex_unlock(&c->mu);
}

/* Record why the shard is not ready: prefix (may be "") followed by detail. */
static void set_fatal(shard_t *sh, int code) {
  uv_mutex_lock(&sh->cl->mu);
  sh->fatal = code;
  uv_cond_broadcast(&sh->cl->cv);
  uv_mutex_unlock(&sh->cl->mu);
}

static void note_why(shard_t *sh, const char *prefix, const char *detail) {
  uv_mutex_lock(&sh->cl->mu);
  snprintf(sh->why, sizeof sh->why, "%s%.200s", prefix, detail);
  sh->tried = true;
  uv_cond_broadcast(&sh->cl->cv);
  uv_mutex_unlock(&sh->cl->mu);
}

static void free_req(req_t *r) {
  ts_free(r->parts);
  ts_free(r->iov);
  ts_free(r);
}

static void list_remove(req_t **head, req_t *r) {
  for (req_t **pp = head; *pp; pp = &(*pp)->next) {
    if (*pp == r) {
      *pp = r->next;
      r->next = NULL;
      return;
    }
  }
}

static void op_unlink_req(op_t *op, req_t *r) {
  for (req_t **pp = &op->reqs; *pp; pp = &(*pp)->op_next) {
    if (*pp == r) {
      *pp = r->op_next;
      return;
    }
  }
}

/* Note a failed part of op. The op's error is its first failure, except that a push_pull
 * reports its push part's error over its pull part's: that is the one a caller must act on
 * (retry the push, or not), while the pull's destination is unspecified whenever the call
 * fails. msg is the op's errmsg when this failure becomes the op's error. */
static void op_fail(op_t *op, uint16_t type, int rc, const char *msg) {
  bool push_part = op->kind == OP_PUSH_PULL && type == TS_MSG_PUSH;
  if (op->kind == OP_PUSH_PULL) {
    int *part = push_part ? &op->push.push_rc : &op->push.pull_rc;
    if (*part == 0) *part = rc;
  }
  if (op->rc != 0 && (op->rc_from_push || !push_part)) return;
  op->rc = rc;
  op->rc_from_push = push_part;
  snprintf(op->err, sizeof op->err, "%s", msg);
}

/* Hand op back to its caller. Nothing may touch op after the store of done: the caller may
 * have seen it while polling and returned. */
static void publish_op(ts_client_t *c, op_t *op) {
  if (op->stage && op->rc == 0) {
    /* The push_pull succeeded: what its pull took is now what was last pulled. */
    for (uint32_t s = 0; s < c->n; s++) {
      shard_t *sh = &c->shards[s];
      if (op->stage[s].set && op->stage[s].incarnation == sh->incarnation) {
        sh->pulled_version = op->stage[s].version;
        sh->have_version = true;
      }
    }
  }
  uv_mutex_lock(&c->mu);
  atomic_store_explicit(&op->done, true, memory_order_release);
  uv_cond_broadcast(&c->cv);
  uv_mutex_unlock(&c->mu);
}

static void finish_op(ts_client_t *c, op_t *op) {
  for (op_t **pp = &c->inflight; *pp; pp = &(*pp)->next) {
    if (*pp == op) {
      *pp = op->next;
      break;
    }
  }
  /* Requests still out belong to nobody now: their replies are read and dropped. */
  while (op->reqs) {
    req_t *r = op->reqs;
    op->reqs = r->op_next;
    r->op = NULL;
    bool queued = false;
    for (req_t *q = r->sh->queued; q; q = q->next) queued |= q == r;
    if (queued) {
      list_remove(&r->sh->queued, r);
      free_req(r);
    }
  }
  publish_op(c, op);
}

/* End op before every request is answered (deadline, interrupt, close): each part still
 * out fails with rc, and msg says why. */
static void abort_op(ts_client_t *c, op_t *op, int rc, const char *msg) {
  if (!op->reqs) {
    op_fail(op, TS_MSG_PUSH, rc, msg);
    op_fail(op, TS_MSG_PULL, rc, msg);
  }
  for (req_t *r = op->reqs; r; r = r->op_next) op_fail(op, r->type, rc, msg);
  finish_op(c, op);
}

/* A request is answered (rc 0) or failed. */
static void complete_req(req_t *r, int rc, const char *detail) {
  op_t *op = r->op;
  if (op) {
    op_unlink_req(op, r);
    if (rc < 0 && (op->rc == 0 || op->kind == OP_PUSH_PULL)) {
      char msg[sizeof op->err];
      snprintf(msg, sizeof msg, "shard %u (%s): %s", r->sh->index, r->sh->addr,
               detail ? detail : ts_strerror(rc));
      op_fail(op, r->type, rc, msg);
    }
    if (--op->remaining == 0) finish_op(r->sh->cl, op);
  }
  free_req(r);
}

static req_t *take_pending(shard_t *sh, uint64_t id) {
  for (req_t **pp = &sh->pending; *pp; pp = &(*pp)->next) {
    if ((*pp)->id == id) {
      req_t *r = *pp;
      *pp = r->next;
      r->next = NULL;
      return r;
    }
  }
  return NULL;
}

static req_t *find_pending(shard_t *sh, uint64_t id) {
  for (req_t *r = sh->pending; r; r = r->next)
    if (r->id == id) return r;
  return NULL;
}

/* --- connection lifecycle ----------------------------------------------------------- */

static void on_retry(uv_timer_t *t) {
  shard_t *sh = t->data;
  start_connect(sh);
}

static void schedule_retry(shard_t *sh) {
  ts_client_t *c = sh->cl;
  uv_mutex_lock(&c->mu);
  bool stop = c->stop;
  uv_mutex_unlock(&c->mu);
  if (stop) return;
  if (sh->backoff_ms == 0) sh->backoff_ms = BACKOFF_MIN_MS;
  uv_timer_start(&sh->retry, on_retry, sh->backoff_ms, 0);
  sh->backoff_ms *= 2;
  if (sh->backoff_ms > BACKOFF_MAX_MS) sh->backoff_ms = BACKOFF_MAX_MS;
}

static void on_link_close(ts_conn_t *conn, int err) {
  link_t *l = conn->data;
  shard_t *sh = l->sh;
  if (sh && sh->link == l) {
    sh->link = NULL;
    bool was_ready = sh->state == SH_READY;
    set_state(sh->cl, sh, SH_DOWN);
    if (!sh->why[0] || was_ready) {
      note_why(sh, "connection lost: ",
               conn->errmsg[0] ? conn->errmsg : (err == TS_ECLOSED ? "closed by the server" : ts_strerror(err)));
    }
    if (was_ready) ts_log_warn("lost connection to shard %u (%s): %s", sh->index, sh->addr, sh->why);
    while (sh->pending) {
      req_t *r = sh->pending;
      sh->pending = r->next;
      complete_req(r, TS_ECLOSED, sh->why);
    }
    schedule_retry(sh);
  }
  ts_free(l);
}

static void on_connect(uv_connect_t *creq, int status) {
  link_t *l = creq->data;
  if (!l->sh) return;
  if (status < 0) {
    note_why(l->sh, "", uv_strerror(status));
    ts_conn_close(&l->conn, status);
    return;
  }
  if (ts_conn_start(&l->conn) < 0) {
    ts_conn_close(&l->conn, TS_ECLOSED);
    return;
  }
  set_state(l->sh->cl, l->sh, SH_HELLO);
  l->sh->state_ms = loop_now(l->sh->cl);
}

static void start_connect(shard_t *sh) {
  ts_client_t *c = sh->cl;
  link_t *l = ts_calloc(1, sizeof *l);
  if (!l || ts_conn_init(&c->loop, &l->conn, &link_cbs, CLIENT_MAX_DATA, l) < 0) {
    ts_free(l);
    note_why(sh, "", "out of memory");
    schedule_retry(sh);
    return;
  }
  l->sh = sh;
  l->creq.data = l;
  sh->link = l;
  set_state(sh->cl, sh, SH_CONNECTING);
  sh->state_ms = loop_now(c);
  sh->why[0] = 0;
  int rc = uv_tcp_connect(&l->creq, &l->conn.handle, (const struct sockaddr *)&sh->sa, on_connect);
  if (rc < 0) {
    note_why(sh, "", uv_strerror(rc));
    ts_conn_close(&l->conn, rc);
  }
}

/* --- sending ------------------------------------------------------------------------ */

static void flush_queued(shard_t *sh) {
  req_t *q = sh->queued;
  sh->queued = NULL;
  /* Keep the order in which they were queued (the list is LIFO). */
  req_t *rev = NULL;
  while (q) {
    req_t *next = q->next;
    q->next = rev;
    rev = q;
    q = next;
  }
  while (rev) {
    req_t *next = rev->next;
    rev->next = NULL;
    send_req(rev);
    rev = next;
  }
}

static void fail_send(req_t *r, int rc) {
  complete_req(r, rc, "could not send the request");
}

static void send_req(req_t *r) {
  shard_t *sh = r->sh;
  ts_client_t *c = sh->cl;
  ts_conn_t *conn = &sh->link->conn;
  int rc = 0;
  const ts_plan_t *plan = &c->plan;
  Tessera__PartSlice *slices = NULL;
  Tessera__PartSlice **sp = NULL;
  if (r->n) {
    slices = ts_calloc(r->n, sizeof *slices);
    sp = ts_calloc(r->n, sizeof *sp);
    if (!slices || !sp) {
      rc = TS_ENOMEM;
      goto out;
    }
    for (size_t i = 0; i < r->n; i++) {
      const ts_part_t *p = &plan->parts[r->parts[i]];
      tessera__part_slice__init(&slices[i]);
      slices[i].tensor = p->tensor;
      slices[i].part = p->part;
      slices[i].count = p->count;
      sp[i] = &slices[i];
    }
  }
  r->next = sh->pending;
  sh->pending = r;
  switch (r->type) {
    case TS_MSG_DECLARE: {
      Tessera__Declare d = c->decl;
      d.request_id = r->id;
      rc = ts_conn_send(conn, TS_MSG_DECLARE, &d.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_PULL: {
      Tessera__Pull m = TESSERA__PULL__INIT;
      m.request_id = r->id;
      m.parts = sp;
      m.n_parts = r->n;
      if (r->op && r->op->per_shard)
        m.min_version = sh->have_version ? sh->pulled_version + 1 : 0;
      else
        m.min_version = r->op ? r->op->min_version : 0;
      m.clock = r->op ? r->op->clock : 0;
      double t = r->op ? r->op->timeout_s : c->timeout_s;
      m.timeout_ms = (uint32_t)(t * 1000.0);
      rc = ts_conn_send(conn, TS_MSG_PULL, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_PUSH: {
      Tessera__Push m = TESSERA__PUSH__INIT;
      m.request_id = r->id;
      m.parts = sp;
      m.n_parts = r->n;
      m.step = r->op ? (r->op->per_shard ? sh->pulled_version : r->op->step) : 0;
      rc = ts_conn_send(conn, TS_MSG_PUSH, &m.base, r->iov, (unsigned)r->n, NULL, NULL);
      break;
    }
    case TS_MSG_HEARTBEAT: {
      Tessera__Heartbeat m = TESSERA__HEARTBEAT__INIT;
      m.request_id = r->id;
      m.task = c->opts.task;
      uv_mutex_lock(&c->mu);
      m.step = c->p_step;
      m.loss = c->p_loss;
      m.examples_per_sec = c->p_eps;
      m.epoch_progress = c->p_prog;
      m.done = c->p_done;
      uv_mutex_unlock(&c->mu);
      rc = ts_conn_send(conn, TS_MSG_HEARTBEAT, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_STATUS: {
      Tessera__Status m = TESSERA__STATUS__INIT;
      m.request_id = r->id;
      rc = ts_conn_send(conn, TS_MSG_STATUS, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_CHECKPOINT: {
      Tessera__Checkpoint m = TESSERA__CHECKPOINT__INIT;
      m.request_id = r->id;
      rc = ts_conn_send(conn, TS_MSG_CHECKPOINT, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_SHUTDOWN: {
      Tessera__Shutdown m = TESSERA__SHUTDOWN__INIT;
      m.request_id = r->id;
      m.checkpoint = r->op ? r->op->checkpoint : true;
      rc = ts_conn_send(conn, TS_MSG_SHUTDOWN, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    default:
      rc = TS_EINTERNAL;
  }
out:
  ts_free(slices);
  ts_free(sp);
  if (rc < 0) {
    list_remove(&sh->pending, r);
    fail_send(r, rc);
  }
}

/* Queue or send a request to shard sh for op (op may be NULL for internal requests). */
static int submit(ts_client_t *c, shard_t *sh, op_t *op, uint16_t type, size_t *parts, size_t n) {
  req_t *r = ts_calloc(1, sizeof *r);
  if (!r) {
    ts_free(parts);
    return TS_ENOMEM;
  }
  r->op = op;
  r->sh = sh;
  r->id = ++c->next_id;
  r->type = type;
  r->internal = op == NULL;
  r->staged = op && op->stage && type == TS_MSG_PULL;
  r->parts = parts;
  r->n = n;
  if (n && (type == TS_MSG_PULL || type == TS_MSG_PUSH)) {
    r->iov = ts_calloc(n, sizeof *r->iov);
    if (!r->iov) {
      free_req(r);
      return TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
      const ts_part_t *p = &c->plan.parts[parts[i]];
      char *base = type == TS_MSG_PULL ? (char *)(op->dst[p->tensor] + p->offset)
                                       : (char *)(uintptr_t)(op->grad[p->tensor] + p->offset);
      r->iov[i] = uv_buf_init(base, (unsigned)(p->count * sizeof(float)));
    }
  }
  if (op) {
    r->op_next = op->reqs;
    op->reqs = r;
    op->remaining++;
  }
  if (sh->state == SH_READY || (type == TS_MSG_DECLARE && op == NULL)) {
    send_req(r);
  } else if (op && op->wait_ready) {
    r->next = sh->queued;
    sh->queued = r;
  } else {
    char why[300];
    snprintf(why, sizeof why, "not connected: %s", sh->why[0] ? sh->why : "connecting");
    complete_req(r, TS_EUNAVAIL, why);
  }
  return 0;
}

static size_t *copy_parts(const size_t *src, size_t n) {
  size_t *p = ts_malloc((n ? n : 1) * sizeof *p);
  if (p && n) memcpy(p, src, n * sizeof *p);
  return p;
}

static void start_op(ts_client_t *c, op_t *op) {
  op->deadline_ms = loop_now(c) + (uint64_t)(op->timeout_s * 1000.0);
  op->version_min = UINT64_MAX;
  op->next = c->inflight;
  c->inflight = op;
  op->remaining = 1; /* held until every request is submitted */
  int rc = 0;
  for (uint32_t s = 0; s < c->n && rc == 0; s++) {
    shard_t *sh = &c->shards[s];
    switch (op->kind) {
      case OP_DECLARE:
        rc = submit(c, sh, op, TS_MSG_DECLARE, NULL, 0);
        break;
      case OP_PULL:
        if (c->shard_nparts[s])
          rc = submit(c, sh, op, TS_MSG_PULL, copy_parts(c->shard_parts[s], c->shard_nparts[s]),
                      c->shard_nparts[s]);
        break;
      case OP_PUSH:
        if (op->parts) {
          size_t k = 0;
          size_t *mine = ts_malloc((op->nparts ? op->nparts : 1) * sizeof *mine);
          if (!mine) {
            rc = TS_ENOMEM;
            break;
          }
          for (size_t i = 0; i < op->nparts; i++)
            if (c->plan.parts[op->parts[i]].shard == s) mine[k++] = op->parts[i];
          if (k)
            rc = submit(c, sh, op, TS_MSG_PUSH, mine, k);
          else
            ts_free(mine);
        } else {
          rc = submit(c, sh, op, TS_MSG_PUSH, copy_parts(c->shard_parts[s], c->shard_nparts[s]),
                      c->shard_nparts[s]);
        }
        break;
      case OP_PUSH_PULL:
        /* Back to back on one connection: the shard handles a connection's frames in
         * order, so the pull sees the push applied (or, in sync mode, waits for the
         * version the push takes part in). */
        if (c->shard_nparts[s]) {
          rc = submit(c, sh, op, TS_MSG_PUSH, copy_parts(c->shard_parts[s], c->shard_nparts[s]),
                      c->shard_nparts[s]);
          if (rc == 0)
            rc = submit(c, sh, op, TS_MSG_PULL, copy_parts(c->shard_parts[s], c->shard_nparts[s]),
                        c->shard_nparts[s]);
        }
        break;
      case OP_HEARTBEAT:
        rc = submit(c, sh, op, TS_MSG_HEARTBEAT, NULL, 0);
        break;
      case OP_STATUS:
        if (s == op->shard) rc = submit(c, sh, op, TS_MSG_STATUS, NULL, 0);
        break;
      case OP_CHECKPOINT:
        if (s == op->shard) rc = submit(c, sh, op, TS_MSG_CHECKPOINT, NULL, 0);
        break;
      case OP_SHUTDOWN:
        if (s == op->shard) rc = submit(c, sh, op, TS_MSG_SHUTDOWN, NULL, 0);
        break;
    }
  }
  if (rc < 0) {
    /* A request could not be made: a push_pull's shards may have got neither part, or
     * only the push. */
    op_fail(op, TS_MSG_PUSH, rc, ts_strerror(rc));
    op_fail(op, TS_MSG_PULL, rc, ts_strerror(rc));
  }
  if (--op->remaining == 0) finish_op(c, op);
}

/* --- receiving ---------------------------------------------------------------------- */

static int on_meta(ts_conn_t *conn, const ts_frame_header_t *h, ProtobufCMessage *msg,
                   const uv_buf_t **iov, unsigned *niov) {
  link_t *l = conn->data;
  if (h->type != TS_MSG_PULL_REPLY || !l->sh) return 0;
  const Tessera__PullReply *m = (const Tessera__PullReply *)msg;
  req_t *r = find_pending(l->sh, m->request_id);
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

static void handle_hello(shard_t *sh, const Tessera__Hello *m) {
  ts_client_t *c = sh->cl;
  ts_conn_t *conn = &sh->link->conn;
  if (m->protocol != TS_PROTOCOL_VERSION || m->nonce.len != TS_AUTH_NONCE_LEN) {
    note_why(sh, "", "the server speaks another protocol version");
    set_fatal(sh, TS_EVERSION);
    ts_conn_close(conn, TS_EVERSION);
    return;
  }
  if (m->shard != sh->index) {
    char why[128];
    snprintf(why, sizeof why, "the server there is shard %u, not %u", m->shard, sh->index);
    note_why(sh, "", why);
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
  Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
  uint8_t mac[TS_AUTH_MAC_LEN];
  sh->hs_id = ++c->next_id;
  hs.request_id = sh->hs_id;
  hs.protocol = TS_PROTOCOL_VERSION;
  hs.role = c->opts.admin ? TESSERA__ROLE__ROLE_ADMIN : TESSERA__ROLE__ROLE_WORKER;
  hs.task = c->opts.admin ? -1 : c->opts.task;
  hs.identity = c->identity;
  if (c->token) {
    ts_auth_mac(c->token, m->nonce.data, m->nonce.len, mac);
    hs.mac.data = mac;
    hs.mac.len = sizeof mac;
  }
  set_state(sh->cl, sh, SH_HANDSHAKE);
  sh->state_ms = loop_now(c);
  if (ts_conn_send(conn, TS_MSG_HANDSHAKE, &hs.base, NULL, 0, NULL, NULL) < 0)
    ts_conn_close(conn, TS_ECLOSED);
}

static void became_ready(shard_t *sh) {
  sh->backoff_ms = 0;
  sh->rx_ms = loop_now(sh->cl);
  sh->why[0] = 0;
  set_state(sh->cl, sh, SH_READY);
  flush_queued(sh);
}

static void handle_handshake_reply(shard_t *sh, const Tessera__HandshakeReply *m) {
  ts_client_t *c = sh->cl;
  uv_mutex_lock(&c->mu);
  c->partition_bytes = m->partition_bytes;
  c->job_workers = m->num_workers;
  c->mode = m->mode;
  sh->tried = true;
  bool declared = c->declared;
  uv_mutex_unlock(&c->mu);
  if (declared) {
    /* A restarted shard has no model: declare it again before anything else. */
    set_state(c, sh, SH_DECLARING);
    if (submit(c, sh, NULL, TS_MSG_DECLARE, NULL, 0) < 0) ts_conn_close(&sh->link->conn, TS_ENOMEM);
    return;
  }
  became_ready(sh);
}

static void on_frame(ts_conn_t *conn, const ts_frame_header_t *h, ProtobufCMessage *msg,
                     bool discarded) {
  link_t *l = conn->data;
  shard_t *sh = l->sh;
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
      const Tessera__Error *e = (const Tessera__Error *)msg;
      if (e->request_id == sh->hs_id || sh->state < SH_DECLARING) {
        note_why(sh, "", e->detail);
        if (e->code == TS_EAUTH || e->code == TS_EVERSION || e->code == TS_EINVAL) set_fatal(sh, e->code);
        break; /* the server closes the connection */
      }
      req_t *r = take_pending(sh, e->request_id);
      if (r && r->internal && r->type == TS_MSG_DECLARE) {
        ts_log_err("shard %u (%s) refused the model: %s", sh->index, sh->addr, e->detail);
        note_why(sh, "model refused: ", e->detail);
        complete_req(r, e->code, e->detail);
        ts_conn_close(conn, e->code);
      } else if (r) {
        complete_req(r, e->code, e->detail);
      } else if (e->request_id == 0) {
        ts_log_warn("shard %u (%s): %s", sh->index, sh->addr, e->detail);
      }
      break;
    }
    case TS_MSG_DECLARE_REPLY: {
      req_t *r = take_pending(sh, ((const Tessera__DeclareReply *)msg)->request_id);
      if (!r) break;
      bool internal = r->internal;
      complete_req(r, 0, NULL);
      if (internal && sh->state == SH_DECLARING) became_ready(sh);
      break;
    }
    case TS_MSG_PULL_REPLY: {
      const Tessera__PullReply *m = (const Tessera__PullReply *)msg;
      req_t *r = take_pending(sh, m->request_id);
      if (!r) break;
      if (!discarded && m->n_parts > 0) {
        uint64_t v = UINT64_MAX;
        for (size_t i = 0; i < m->n_parts; i++)
          if (m->parts[i]->version < v) v = m->parts[i]->version;
        if (!r->staged) {
          sh->pulled_version = v;
          sh->have_version = true;
        } else if (r->op) {
          r->op->stage[sh->index] = (staged_t){.version = v, .incarnation = sh->incarnation,
                                               .set = true};
        }
        if (r->op && v < r->op->version_min) r->op->version_min = v;
      }
      if (r->op && !discarded) {
        complete_req(r, 0, NULL);
      } else {
        complete_req(r, TS_ENOMEM, "pull reply dropped");
      }
      break;
    }
    case TS_MSG_PUSH_REPLY: {
      const Tessera__PushReply *m = (const Tessera__PushReply *)msg;
      req_t *r = take_pending(sh, m->request_id);
      if (!r) break;
      if (r->op) {
        for (size_t i = 0; i < m->n_results; i++) {
          switch (m->results[i]) {
            case TESSERA__PUSH_RESULT__PUSH_APPLIED:
              r->op->push.applied++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_ACCUMULATED:
              r->op->push.accumulated++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_STALE:
              r->op->push.stale++;
              break;
            case TESSERA__PUSH_RESULT__PUSH_DUPLICATE:
              r->op->push.duplicate++;
              break;
            default:
              break;
          }
        }
      }
      complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_CHECKPOINT_REPLY: {
      const Tessera__CheckpointReply *m = (const Tessera__CheckpointReply *)msg;
      req_t *r = take_pending(sh, m->request_id);
      if (!r) break;
      if (r->op) {
        snprintf(r->op->path, sizeof r->op->path, "%s", m->path);
        r->op->ckpt_step = m->step;
      }
      complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_SHUTDOWN_REPLY: {
      const Tessera__ShutdownReply *m = (const Tessera__ShutdownReply *)msg;
      req_t *r = take_pending(sh, m->request_id);
      if (!r) break;
      if (r->op) snprintf(r->op->path, sizeof r->op->path, "%s", m->checkpoint_path);
      complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_HEARTBEAT_REPLY: {
      req_t *r = take_pending(sh, ((const Tessera__HeartbeatReply *)msg)->request_id);
      if (r) complete_req(r, 0, NULL);
      break;
    }
    case TS_MSG_STATUS_REPLY: {
      Tessera__ShardStatus *m = (Tessera__ShardStatus *)msg;
      req_t *r = take_pending(sh, m->request_id);
      if (!r) break;
      if (r->op && !r->op->status) {
        r->op->status = m;
        msg = NULL; /* now the op's */
      }
      complete_req(r, 0, NULL);
      break;
    }
    default:
      ts_log_warn("shard %u (%s) sent an unexpected %s frame", sh->index, sh->addr,
                  ts_frame_type_name(h->type));
      break;
  }
  ts_msg_free(msg);
}

static const ts_conn_cbs_t link_cbs = {
    .on_meta = on_meta,
    .on_frame = on_frame,
    .on_close = on_link_close,
};

/* --- the client thread -------------------------------------------------------------- */

/* Connections that never finish their handshake, or go silent while heartbeats are on,
 * are closed and tried again: the shard may be stopped (SIGSTOP) or its host gone. */
static void check_links(ts_client_t *c, uint64_t now) {
  uint64_t hs_limit = (uint64_t)((c->opts.connect_timeout_s > 0 ? c->opts.connect_timeout_s : 5.0) * 1000.0);
  double hb_timeout = c->opts.heartbeat_timeout_s > 0 ? c->opts.heartbeat_timeout_s : 5.0;
  uint64_t rx_limit = (uint64_t)(hb_timeout * 1000.0);
  for (uint32_t i = 0; i < c->n; i++) {
    shard_t *sh = &c->shards[i];
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
    note_why(sh, "", why);
    snprintf(sh->link->conn.errmsg, sizeof sh->link->conn.errmsg, "%s", why);
    ts_conn_close(&sh->link->conn, TS_ETIMEDOUT);
  }
}

static void on_tick(uv_timer_t *t) {
  ts_client_t *c = t->data;
  uint64_t now = loop_now(c);
  check_links(c, now);
  op_t *op = c->inflight;
  while (op) {
    op_t *next = op->next;
    if (now >= op->deadline_ms) {
      char shards[96] = "", msg[sizeof op->err];
      size_t len = 0;
      for (req_t *r = op->reqs; r && len < sizeof shards - 8; r = r->op_next)
        len += (size_t)snprintf(shards + len, sizeof shards - len, "%s%u", len ? "," : "",
                                r->sh->index);
      snprintf(msg, sizeof msg, "no answer within %.1f s from shard(s) %s", op->timeout_s, shards);
      abort_op(c, op, TS_ETIMEDOUT, msg);
    }
    op = next;
  }
}

static void on_heartbeat(uv_timer_t *t) {
  ts_client_t *c = t->data;
  for (uint32_t s = 0; s < c->n; s++)
    if (c->shards[s].state == SH_READY) submit(c, &c->shards[s], NULL, TS_MSG_HEARTBEAT, NULL, 0);
}

static void close_cb_noop(uv_handle_t *h) { (void)h; }

static void shutdown_loop(ts_client_t *c) {
  while (c->inflight) abort_op(c, c->inflight, TS_ESHUTDOWN, "client closed");
  for (uint32_t s = 0; s < c->n; s++) {
    shard_t *sh = &c->shards[s];
    uv_close((uv_handle_t *)&sh->retry, close_cb_noop);
    while (sh->queued) {
      req_t *r = sh->queued;
      sh->queued = r->next;
      free_req(r);
    }
    if (sh->link) {
      link_t *l = sh->link;
      sh->link = NULL;
      l->sh = NULL;
      while (sh->pending) {
        req_t *r = sh->pending;
        sh->pending = r->next;
        free_req(r);
      }
      ts_conn_close(&l->conn, 0);
    }
  }
  uv_close((uv_handle_t *)&c->tick, close_cb_noop);
  uv_close((uv_handle_t *)&c->hb, close_cb_noop);
  uv_close((uv_handle_t *)&c->wake, close_cb_noop);
}

static void on_wake(uv_async_t *a) {
  ts_client_t *c = a->data;
  c->activity++;
  uv_mutex_lock(&c->mu);
  op_t *ops = c->queue_head;
  c->queue_head = c->queue_tail = NULL;
  bool stop = c->stop;
  uv_mutex_unlock(&c->mu);
  if (c->interrupted) {
    while (c->inflight) abort_op(c, c->inflight, TS_ESHUTDOWN, "interrupted");
  }
  while (ops) {
    op_t *next = ops->next;
    ops->next = NULL;
    if (stop || c->interrupted) {
      op_fail(ops, TS_MSG_PUSH, TS_ESHUTDOWN, "");
      op_fail(ops, TS_MSG_PULL, TS_ESHUTDOWN, "");
      publish_op(c, ops);
    } else {
      start_op(c, ops);
    }
    ops = next;
  }
  if (stop) shutdown_loop(c);
}

/* ts_poll's activity: a frame read or a call handed over since the last look. An op in
 * flight alone is not activity: a sync pull may wait seconds for the other workers, and on
 * a small machine a thread polling all that time takes CPU from the workers and shards
 * that must answer it (train.sh measured async examples/s lower when it did). */
static bool client_active(void *arg) {
  ts_client_t *c = arg;
  bool active = c->activity != c->activity_seen;
  c->activity_seen = c->activity;
  return active;
}

static void thread_main(void *arg) {
  ts_client_t *c = arg;
  for (uint32_t s = 0; s < c->n; s++) start_connect(&c->shards[s]);
  ts_poll_run(&c->loop, c->opts.busy_poll_us, client_active, c);
}

/* Run op on the client thread and wait for it. */
static int run_op(ts_client_t *c, op_t *op, char *errmsg, size_t errlen) {
  op->timeout_s = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
  uv_mutex_lock(&c->mu);
  if (c->stop || c->interrupted) {
    uv_mutex_unlock(&c->mu);
    if (errmsg) snprintf(errmsg, errlen, "%s", c->interrupted ? "interrupted" : "client closed");
    return TS_ESHUTDOWN;
  }
  if (c->queue_tail)
    c->queue_tail->next = op;
  else
    c->queue_head = op;
  c->queue_tail = op;
  uv_mutex_unlock(&c->mu);
  uv_async_send(&c->wake);
  /* Poll for a quick answer before sleeping: a wake-up from the condition variable costs
   * more than a loopback round trip on a virtual machine. Yielding on every turn keeps a
   * poller from holding a CPU that the client thread (or a shard) needs. */
  if (c->opts.busy_poll_us > 0) {
    uint64_t until = uv_hrtime() + (uint64_t)c->opts.busy_poll_us * 1000u;
    while (!atomic_load_explicit(&op->done, memory_order_acquire) && uv_hrtime() < until)
      sched_yield();
  }
  if (!atomic_load_explicit(&op->done, memory_order_acquire)) {
    uv_mutex_lock(&c->mu);
    while (!atomic_load_explicit(&op->done, memory_order_acquire)) uv_cond_wait(&c->cv, &c->mu);
    uv_mutex_unlock(&c->mu);
  }
  if (op->rc < 0 && errmsg) snprintf(errmsg, errlen, "%s", op->err[0] ? op->err : ts_strerror(op->rc));
  return op->rc;
}

/* --- public API --------------------------------------------------------------------- */

static int resolve(shard_t *sh, char *errmsg, size_t errlen) {
  struct addrinfo *ai = NULL;
  char why[300];
  if (ts_addr_resolve(sh->addr, false, &ai, why, sizeof why) < 0) {
    snprintf(errmsg, errlen, "shard %u: %s", sh->index, why);
    return TS_EINVAL;
  }
  memcpy(&sh->sa, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  return 0;
}

static void free_model(ts_client_t *c) {
  for (size_t i = 0; c->decl_t && i < c->decl.n_tensors; i++) {
    ts_free(c->decl_t[i].name);
    ts_free(c->decl_t[i].shape);
  }
  ts_free(c->decl_t);
  ts_free(c->decl_p);
  c->decl_t = NULL;
  c->decl_p = NULL;
  c->decl.n_tensors = 0;
  for (uint32_t s = 0; c->shard_parts && s < c->n; s++) ts_free(c->shard_parts[s]);
  ts_free(c->shard_parts);
  ts_free(c->shard_nparts);
  c->shard_parts = NULL;
  c->shard_nparts = NULL;
  ts_plan_free(&c->plan);
}

static void free_client(ts_client_t *c) {
  free_model(c);
  ts_free(c->shards);
  ts_free(c->identity);
  ts_auth_free_token(c->token);
  ts_free(c);
}

int ts_client_open(ts_client_t **out, const ts_client_opts_t *opts, char *errmsg, size_t errlen) {
  *out = NULL;
  if (opts->num_shards == 0) {
    snprintf(errmsg, errlen, "no shards to connect to");
    return TS_EINVAL;
  }
  if (sodium_init() < 0) {
    snprintf(errmsg, errlen, "libsodium failed to initialise");
    return TS_EINTERNAL;
  }
  ts_client_t *c = ts_calloc(1, sizeof *c);
  if (!c) return TS_ENOMEM;
  c->opts = *opts;
  c->n = (uint32_t)opts->num_shards;
  c->timeout_s = opts->request_timeout_s > 0 ? opts->request_timeout_s : 60.0;
  c->identity = ts_strdup(opts->identity ? opts->identity : "");
  c->token = opts->token ? ts_strdup(opts->token) : NULL;
  c->shards = ts_calloc(c->n, sizeof *c->shards);
  if (!c->identity || !c->shards || (opts->token && !c->token)) {
    free_client(c);
    return TS_ENOMEM;
  }
  for (uint32_t s = 0; s < c->n; s++) {
    shard_t *sh = &c->shards[s];
    sh->cl = c;
    sh->index = s;
    snprintf(sh->addr, sizeof sh->addr, "%s", opts->addrs[s]);
    int rc = resolve(sh, errmsg, errlen);
    if (rc < 0) {
      free_client(c);
      return rc;
    }
  }
  uv_loop_init(&c->loop);
  uv_mutex_init(&c->mu);
  uv_cond_init(&c->cv);
  uv_async_init(&c->loop, &c->wake, on_wake);
  c->wake.data = c;
  uv_timer_init(&c->loop, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, on_tick, TICK_MS, TICK_MS);
  uv_timer_init(&c->loop, &c->hb);
  c->hb.data = c;
  if (opts->heartbeat_interval_s > 0) {
    uint64_t ms = (uint64_t)(opts->heartbeat_interval_s * 1000.0);
    uv_timer_start(&c->hb, on_heartbeat, ms, ms);
  }
  for (uint32_t s = 0; s < c->n; s++) {
    uv_timer_init(&c->loop, &c->shards[s].retry);
    c->shards[s].retry.data = &c->shards[s];
  }
  signal(SIGPIPE, SIG_IGN);
  if (uv_thread_create(&c->thread, thread_main, c) != 0) {
    snprintf(errmsg, errlen, "cannot start the client thread");
    uv_close((uv_handle_t *)&c->wake, NULL);
    uv_close((uv_handle_t *)&c->tick, NULL);
    uv_close((uv_handle_t *)&c->hb, NULL);
    for (uint32_t s = 0; s < c->n; s++) uv_close((uv_handle_t *)&c->shards[s].retry, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    uv_mutex_destroy(&c->mu);
    uv_cond_destroy(&c->cv);
    free_client(c);
    return TS_EINTERNAL;
  }

  /* Wait until every shard is ready, or (without require_all) has at least been tried. */
  double timeout = opts->connect_timeout_s > 0 ? opts->connect_timeout_s : 5.0;
  uint64_t deadline = uv_hrtime() + (uint64_t)(timeout * 1e9);
  int rc = 0;
  uv_mutex_lock(&c->mu);
  for (;;) {
    bool all_ready = (uint32_t)c->ready == c->n, settled = true;
    int fatal = 0;
    for (uint32_t s = 0; s < c->n; s++) {
      shard_t *sh = &c->shards[s];
      if (sh->state != SH_READY && !sh->tried) settled = false;
      if (sh->state != SH_READY && sh->fatal) fatal = sh->fatal;
    }
    if (all_ready || (!opts->require_all && settled)) break;
    if (fatal && opts->require_all) {
      rc = fatal;
      break;
    }
    uint64_t now = uv_hrtime();
    if (now >= deadline) {
      rc = opts->require_all ? TS_EUNAVAIL : 0;
      break;
    }
    uv_cond_timedwait(&c->cv, &c->mu, deadline - now);
  }
  if (rc < 0) {
    size_t len = (size_t)snprintf(errmsg, errlen, "cannot reach every shard:");
    for (uint32_t s = 0; s < c->n && len < errlen; s++) {
      shard_t *sh = &c->shards[s];
      if (sh->state == SH_READY) continue;
      len += (size_t)snprintf(errmsg + len, errlen - len, " shard %u (%s): %s;", s, sh->addr,
                              sh->why[0] ? sh->why : "no answer");
    }
    if (len > 0 && len < errlen && errmsg[len - 1] == ';') errmsg[len - 1] = 0;
  }
  uv_mutex_unlock(&c->mu);
  if (rc < 0) {
    ts_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

void ts_client_interrupt(ts_client_t *c) {
  if (!c) return;
  c->interrupted = 1;
  uv_async_send(&c->wake); /* async-signal-safe */
}

void ts_client_close(ts_client_t *c) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->stop = true;
  uv_mutex_unlock(&c->mu);
  uv_async_send(&c->wake);
  uv_thread_join(&c->thread);
  int rc = uv_loop_close(&c->loop);
  if (rc != 0) ts_log_warn("client loop closed with handles open: %s", uv_strerror(rc));
  uv_mutex_destroy(&c->mu);
  uv_cond_destroy(&c->cv);
  free_client(c);
}

uint32_t ts_client_num_shards(const ts_client_t *c) { return c->n; }

bool ts_client_shard_up(ts_client_t *c, uint32_t shard, char *why, size_t whylen) {
  if (shard >= c->n) return false;
  uv_mutex_lock(&c->mu);
  bool up = c->shards[shard].state == SH_READY;
  if (!up && why) snprintf(why, whylen, "%s", c->shards[shard].why[0] ? c->shards[shard].why : "no answer");
  uv_mutex_unlock(&c->mu);
  return up;
}

uint64_t ts_client_partition_bytes(const ts_client_t *c) { return c->partition_bytes; }
uint32_t ts_client_job_workers(const ts_client_t *c) { return c->job_workers; }
Tessera__Mode ts_client_job_mode(const ts_client_t *c) { return c->mode; }
const ts_plan_t *ts_client_plan(const ts_client_t *c) { return c->plan.parts ? &c->plan : NULL; }

void ts_client_set_timeout(ts_client_t *c, double seconds) { c->timeout_s = seconds; }

int ts_client_declare(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n, uint64_t seed,
                      char *errmsg, size_t errlen) {
  if (n == 0) {
    snprintf(errmsg, errlen, "a model needs at least one tensor");
    return TS_EINVAL;
  }
  uv_mutex_lock(&c->mu);
  uint64_t pbytes = c->partition_bytes;
  uv_mutex_unlock(&c->mu);
  if (pbytes == 0) {
    snprintf(errmsg, errlen, "no shard has answered yet, so the partition size is unknown");
    return TS_EUNAVAIL;
  }
  uv_mutex_lock(&c->mu);
  c->declared = false; /* no re-declare on reconnect while the model changes */
  uv_mutex_unlock(&c->mu);
  free_model(c);
  int rc = TS_ENOMEM;
  uint64_t *elems = ts_calloc(n, sizeof *elems);
  c->decl_t = ts_calloc(n, sizeof *c->decl_t);
  c->decl_p = ts_calloc(n, sizeof *c->decl_p);
  if (!elems || !c->decl_t || !c->decl_p) goto fail;
  tessera__declare__init(&c->decl);
  c->decl.seed = seed;
  c->decl.n_tensors = n;
  c->decl.tensors = c->decl_p;
  for (size_t i = 0; i < n; i++) {
    Tessera__TensorDecl *t = &c->decl_t[i];
    tessera__tensor_decl__init(t);
    c->decl_p[i] = t;
    t->name = ts_strdup(tensors[i].name);
    t->shape = ts_calloc(tensors[i].rank ? tensors[i].rank : 1, sizeof *t->shape);
    if (!t->name || !t->shape) goto fail;
    t->n_shape = tensors[i].rank;
    elems[i] = 1;
    for (size_t k = 0; k < tensors[i].rank; k++) {
      t->shape[k] = tensors[i].shape[k];
      elems[i] *= tensors[i].shape[k];
    }
    t->init = (Tessera__Init)tensors[i].init;
  }
  rc = ts_plan_build(elems, (uint32_t)n, c->n, pbytes, &c->plan);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot plan the model's partitions: %s", ts_strerror(rc));
    goto fail;
  }
  rc = TS_ENOMEM;
  c->shard_parts = ts_calloc(c->n, sizeof *c->shard_parts);
  c->shard_nparts = ts_calloc(c->n, sizeof *c->shard_nparts);
  if (!c->shard_parts || !c->shard_nparts) goto fail;
  for (uint32_t s = 0; s < c->n; s++) {
    c->shard_parts[s] = ts_malloc((c->plan.shard_parts[s] ? c->plan.shard_parts[s] : 1) * sizeof(size_t));
    if (!c->shard_parts[s]) goto fail;
  }
  for (size_t k = 0; k < c->plan.num_parts; k++) {
    uint32_t s = c->plan.parts[k].shard;
    c->shard_parts[s][c->shard_nparts[s]++] = k;
  }
  ts_free(elems);
  elems = NULL;
  op_t op = {.kind = OP_DECLARE, .wait_ready = true};
  rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0) {
    /* From now on a reconnect re-declares (the loop thread reads this after the op). */
    uv_mutex_lock(&c->mu);
    c->declared = true;
    uv_mutex_unlock(&c->mu);
  }
  return rc;
fail:
  if (rc == TS_ENOMEM) snprintf(errmsg, errlen, "out of memory");
  ts_free(elems);
  free_model(c);
  return rc;
}

int ts_client_pull(ts_client_t *c, float *const *dst, uint64_t min_version, uint64_t clock,
                   uint64_t *version, char *errmsg, size_t errlen) {
  if (!c->plan.parts) {
    snprintf(errmsg, errlen, "declare the model before pulling");
    return TS_ENOTDECLARED;
  }
  op_t op = {.kind = OP_PULL, .wait_ready = true, .dst = dst, .min_version = min_version,
             .clock = clock};
  int rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0 && version) *version = op.version_min == UINT64_MAX ? 0 : op.version_min;
  return rc;
}

static int push(ts_client_t *c, const float *const *grad, const size_t *parts, size_t n,
                uint64_t step, ts_client_push_result_t *result, char *errmsg, size_t errlen) {
  if (!c->plan.parts) {
    snprintf(errmsg, errlen, "declare the model before pushing");
    return TS_ENOTDECLARED;
  }
  for (size_t i = 0; parts && i < n; i++) {
    if (parts[i] >= c->plan.num_parts) {
      snprintf(errmsg, errlen, "partition %zu does not exist", parts[i]);
      return TS_EINVAL;
    }
  }
  op_t op = {.kind = OP_PUSH, .wait_ready = true, .grad = grad, .step = step, .parts = parts,
             .nparts = n};
  int rc = run_op(c, &op, errmsg, errlen);
  if (result) *result = op.push;
  return rc;
}

int ts_client_push(ts_client_t *c, const float *const *grad, uint64_t step,
                   ts_client_push_result_t *result, char *errmsg, size_t errlen) {
  return push(c, grad, NULL, 0, step, result, errmsg, errlen);
}

int ts_client_push_parts(ts_client_t *c, const float *const *grad, const size_t *parts, size_t n,
                         uint64_t step, ts_client_push_result_t *result, char *errmsg,
                         size_t errlen) {
  return push(c, grad, parts, n, step, result, errmsg, errlen);
}

int ts_client_pull_next(ts_client_t *c, float *const *dst, uint64_t clock, uint64_t *version,
                        char *errmsg, size_t errlen) {
  if (!c->plan.parts) {
    snprintf(errmsg, errlen, "declare the model before pulling");
    return TS_ENOTDECLARED;
  }
  op_t op = {.kind = OP_PULL, .wait_ready = true, .dst = dst, .clock = clock, .per_shard = true};
  int rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0 && version) *version = op.version_min == UINT64_MAX ? 0 : op.version_min;
  return rc;
}

int ts_client_push_pulled(ts_client_t *c, const float *const *grad,
                          ts_client_push_result_t *result, char *errmsg, size_t errlen) {
  if (!c->plan.parts) {
    snprintf(errmsg, errlen, "declare the model before pushing");
    return TS_ENOTDECLARED;
  }
  op_t op = {.kind = OP_PUSH, .wait_ready = true, .grad = grad, .per_shard = true};
  int rc = run_op(c, &op, errmsg, errlen);
  if (result) *result = op.push;
  return rc;
}

/* Whether any tensor's grad range overlaps any tensor's dst range (the plan knows the
 * tensors' sizes). Compared as integers: the buffers are distinct objects. */
static bool buffers_overlap(const ts_plan_t *plan, const float *const *grad, float *const *dst) {
  for (uint32_t t = 0; t < plan->num_tensors; t++) {
    const ts_part_t *lt = &plan->parts[plan->tensor_first[t] + plan->tensor_parts[t] - 1];
    uintptr_t g0 = (uintptr_t)grad[t], g1 = g0 + (lt->offset + lt->count) * sizeof(float);
    for (uint32_t u = 0; u < plan->num_tensors; u++) {
      const ts_part_t *lu = &plan->parts[plan->tensor_first[u] + plan->tensor_parts[u] - 1];
      uintptr_t d0 = (uintptr_t)dst[u], d1 = d0 + (lu->offset + lu->count) * sizeof(float);
      if (g0 < d1 && d0 < g1) return true;
    }
  }
  return false;
}

static int push_pull(ts_client_t *c, op_t *op, uint64_t *version, ts_client_push_result_t *result,
                     char *errmsg, size_t errlen) {
  int rc = 0;
  if (!c->plan.parts) {
    snprintf(errmsg, errlen, "declare the model before pushing");
    rc = TS_ENOTDECLARED;
  } else if (buffers_overlap(&c->plan, op->grad, op->dst)) {
    snprintf(errmsg, errlen, "push_pull: the gradients and the pull's destination overlap");
    rc = TS_EINVAL;
  } else if (!(op->stage = ts_calloc(c->n, sizeof *op->stage))) {
    snprintf(errmsg, errlen, "out of memory");
    rc = TS_ENOMEM;
  }
  if (rc < 0) {
    /* Nothing was sent: neither part happened. */
    if (result) *result = (ts_client_push_result_t){.push_rc = rc, .pull_rc = rc};
    return rc;
  }
  op->kind = OP_PUSH_PULL;
  op->wait_ready = true;
  rc = run_op(c, op, errmsg, errlen);
  ts_free(op->stage);
  if (rc < 0 && op->push.push_rc == 0 && op->push.pull_rc == 0) {
    /* Refused before it reached the client thread (closed, interrupted). */
    op->push.push_rc = op->push.pull_rc = rc;
  }
  if (rc == 0 && version) *version = op->version_min == UINT64_MAX ? 0 : op->version_min;
  if (result) *result = op->push;
  return rc;
}

int ts_client_push_pull(ts_client_t *c, const float *const *grad, uint64_t step,
                        float *const *dst, uint64_t clock, uint64_t *version,
                        ts_client_push_result_t *result, char *errmsg, size_t errlen) {
  op_t op = {.grad = grad, .step = step, .dst = dst, .clock = clock};
  return push_pull(c, &op, version, result, errmsg, errlen);
}

int ts_client_push_pull_next(ts_client_t *c, const float *const *grad, float *const *dst,
                             uint64_t clock, uint64_t *version, ts_client_push_result_t *result,
                             char *errmsg, size_t errlen) {
  op_t op = {.grad = grad, .dst = dst, .clock = clock, .per_shard = true};
  return push_pull(c, &op, version, result, errmsg, errlen);
}

uint64_t ts_client_restarts(ts_client_t *c) {
  uv_mutex_lock(&c->mu);
  uint64_t n = c->restarts;
  uv_mutex_unlock(&c->mu);
  return n;
}

int ts_client_checkpoint(ts_client_t *c, uint32_t shard, char *path, size_t pathlen,
                         uint64_t *step, char *errmsg, size_t errlen) {
  if (shard >= c->n) {
    snprintf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  op_t op = {.kind = OP_CHECKPOINT, .wait_ready = false, .shard = shard,
             .timeout_s = c->timeout_s > 120.0 ? c->timeout_s : 120.0};
  int rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0) {
    if (path) snprintf(path, pathlen, "%s", op.path);
    if (step) *step = op.ckpt_step;
  }
  return rc;
}

int ts_client_shutdown(ts_client_t *c, uint32_t shard, bool checkpoint, char *path,
                       size_t pathlen, char *errmsg, size_t errlen) {
  if (shard >= c->n) {
    snprintf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  op_t op = {.kind = OP_SHUTDOWN, .wait_ready = false, .shard = shard, .checkpoint = checkpoint,
             .timeout_s = c->timeout_s > 120.0 ? c->timeout_s : 120.0};
  int rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0 && path) snprintf(path, pathlen, "%s", op.path);
  return rc;
}

void ts_client_set_progress(ts_client_t *c, uint64_t step, double loss, double examples_per_sec,
                            double epoch_progress, bool done) {
  uv_mutex_lock(&c->mu);
  c->p_step = step;
  c->p_loss = loss;
  c->p_eps = examples_per_sec;
  c->p_prog = epoch_progress;
  c->p_done = done;
  uv_mutex_unlock(&c->mu);
}

int ts_client_heartbeat(ts_client_t *c, char *errmsg, size_t errlen) {
  op_t op = {.kind = OP_HEARTBEAT, .wait_ready = false};
  return run_op(c, &op, errmsg, errlen);
}

int ts_client_status(ts_client_t *c, uint32_t shard, Tessera__ShardStatus **out, char *errmsg,
                     size_t errlen) {
  *out = NULL;
  if (shard >= c->n) {
    snprintf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  op_t op = {.kind = OP_STATUS, .wait_ready = false, .shard = shard};
  int rc = run_op(c, &op, errmsg, errlen);
  if (rc == 0 && !op.status) {
    snprintf(errmsg, errlen, "shard %u sent no status", shard);
    rc = TS_EINTERNAL;
  }
  if (rc == 0)
    *out = op.status;
  else if (op.status)
    ts_msg_free(&op.status->base);
  return rc;
}

void ts_client_free_status(Tessera__ShardStatus *st) {
  if (st) ts_msg_free(&st->base);
}
