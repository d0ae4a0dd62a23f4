/* Operations on the client thread (ts_client_int.h): an op split into one wire request per
 * shard (and, for a push+pull, two back to back), their encoding and sending, their
 * completion, the op's result and its hand-back to the caller (a waiter or a callback),
 * deadlines and aborts. The thread's loop, which hands ops in and calls these, is
 * ts_client_thread.c. */
#include "ts_client_int.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"

static uint64_t loop_now(ts_client_t *c) { return uv_now(&c->loop); }
static void send_req(ts_cl_wreq_t *r);

void ts_cl_free_wreq(ts_cl_wreq_t *r) {
  ts_free(r->parts);
  ts_free(r->iov);
  ts_free(r);
}

static void list_remove(ts_cl_wreq_t **head, ts_cl_wreq_t *r) {
  for (ts_cl_wreq_t **pp = head; *pp; pp = &(*pp)->next) {
    if (*pp == r) {
      *pp = r->next;
      r->next = NULL;
      return;
    }
  }
}

static void op_unlink_req(ts_cl_op_t *op, ts_cl_wreq_t *r) {
  for (ts_cl_wreq_t **pp = &op->reqs; *pp; pp = &(*pp)->op_next) {
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
static void op_fail(ts_cl_op_t *op, uint16_t type, int rc, const char *msg) {
  bool push_part = op->kind == OP_PUSH_PULL && (type == TS_MSG_PUSH || type == TS_MSG_SPARSE_PUSH);
  if (op->kind == OP_PUSH_PULL) {
    int *part = push_part ? &op->push_rc : &op->pull_rc;
    if (*part == 0) *part = rc;
  }
  if (op->rc != 0 && (op->rc_from_push || !push_part)) return;
  op->rc = rc;
  op->rc_from_push = push_part;
  snprintf(op->err, sizeof op->err, "%s", msg);
}

/* The remembered failed push of id, or NULL. */
static ts_cl_failed_push_t *failed_push(ts_client_t *c, uint64_t id) {
  for (unsigned i = 0; i < TS_CL_FAILED_PUSHES; i++)
    if (c->failed[i].push_id == id) return &c->failed[i];
  return NULL;
}

/* A push with an id is done: when its push failed somewhere, remember which shards had
 * answered it (a retry is then sent to the others only); when it succeeded, forget it. The
 * op's acks move into the entry. */
static void remember_acks(ts_client_t *c, ts_cl_op_t *op) {
  if (!op->push_id || !op->acked) return;
  int push_rc = op->kind == OP_PUSH_PULL ? op->push_rc : op->rc;
  if (op->kind == OP_PUSH_PULL && op->rc < 0 && op->push_rc == 0 && op->pull_rc == 0)
    push_rc = op->rc;
  ts_cl_failed_push_t *f = failed_push(c, op->push_id);
  if (push_rc == 0) {
    if (f) {
      ts_free(f->acked);
      *f = (ts_cl_failed_push_t){.push_id = 0};
    }
    return;
  }
  if (!f) {
    f = &c->failed[c->failed_next];
    c->failed_next = (c->failed_next + 1) % TS_CL_FAILED_PUSHES;
  }
  ts_free(f->acked);
  *f = (ts_cl_failed_push_t){.push_id = op->push_id,
                             .acked = op->acked,
                             .sparse = op->sp != NULL,
                             .table = op->sp ? op->sp->table : 0,
                             .nkeys = op->sp ? op->sp->nkeys : 0};
  op->acked = NULL;
}

/* Whether op repeats the failed push f: the same kind and, for a table, the same table
 * and key count (a retry must send the same keys and gradients). */
static bool repeats(const ts_cl_op_t *op, const ts_cl_failed_push_t *f) {
  if (f->sparse != (op->sp != NULL)) return false;
  return !op->sp || (f->table == op->sp->table && f->nkeys == op->sp->nkeys);
}

void ts_cl_free_failed_pushes(ts_client_t *c) {
  for (unsigned i = 0; i < TS_CL_FAILED_PUSHES; i++) {
    ts_free(c->failed[i].acked);
    c->failed[i] = (ts_cl_failed_push_t){.push_id = 0};
  }
}

/* Hand op back to its caller. Nothing may touch op after the store of done: the caller may
 * have seen it while polling and returned. */
static void publish_op(ts_client_t *c, ts_cl_op_t *op) {
  if (op->stage && op->rc == 0 && !op->sp) {
    /* The push_pull succeeded: what its pull took is now what was last pulled. */
    for (uint32_t s = 0; s < c->n; s++) {
      ts_cl_shard_t *sh = &c->shards[s];
      if (op->stage[s].set && op->stage[s].incarnation == sh->incarnation) {
        sh->pulled_version = op->stage[s].version;
        sh->have_version = true;
      }
    }
  }
  if (!op->req) {
    uv_mutex_lock(&c->mu);
    atomic_store_explicit(&op->done, true, memory_order_release);
    uv_cond_broadcast(&c->cv);
    uv_mutex_unlock(&c->mu);
    return;
  }
  /* A caller's request: its results, then the op is gone. */
  ts_client_req_t *q = op->req;
  q->rc = op->rc;
  q->push_rc = op->push_rc;
  q->pull_rc = op->pull_rc;
  if (op->kind == OP_PUSH_PULL && op->rc < 0 && op->push_rc == 0 && op->pull_rc == 0)
    q->push_rc = q->pull_rc = op->rc; /* refused before a part started (closed, interrupted) */
  q->applied = op->applied;
  q->accumulated = op->accumulated;
  q->stale = op->stale;
  q->duplicate = op->duplicate;
  q->version = op->rc == 0 && op->version_min != UINT64_MAX ? op->version_min : 0;
  q->push_id = op->push_id;
  if (op->sp) ts_cl_sparse_publish(c, op, q);
  remember_acks(c, op);
  if (op->rc < 0)
    snprintf(q->errmsg, sizeof q->errmsg, "%s", op->err[0] ? op->err : ts_strerror(op->rc));
  else
    q->errmsg[0] = 0;
  ts_client_done_fn cb = op->cb;
  void *arg = op->cb_arg;
  ts_cl_free_op(op);
  if (cb) {
    /* Nobody waits for it (ts_client_wait refuses a request with a callback): the callback
     * is its completion, and the request is the caller's from its first line on. */
    __atomic_store_n(&q->priv_state, TS_CL_REQ_DONE, __ATOMIC_RELEASE);
    cb(q, arg);
    return;
  }
  uv_mutex_lock(&c->mu);
  __atomic_store_n(&q->priv_state, TS_CL_REQ_DONE, __ATOMIC_RELEASE);
  uv_cond_broadcast(&c->cv);
  uv_mutex_unlock(&c->mu);
}

static void finish_op(ts_client_t *c, ts_cl_op_t *op) {
  bool found = false;
  for (ts_cl_op_t **pp = &c->inflight; *pp; pp = &(*pp)->next) {
    if (*pp == op) {
      *pp = op->next;
      found = true;
      break;
    }
  }
  ts_require(found); /* an op finishes once, from in flight */
  /* Requests still out belong to nobody now: their replies are read and dropped. */
  while (op->reqs) {
    ts_cl_wreq_t *r = op->reqs;
    op->reqs = r->op_next;
    r->op = NULL;
    bool queued = false;
    for (ts_cl_wreq_t *q = r->sh->queued; q; q = q->next) queued |= q == r;
    if (queued) {
      list_remove(&r->sh->queued, r);
      ts_cl_free_wreq(r);
    }
  }
  publish_op(c, op);
}

static bool on_list(const ts_cl_wreq_t *head, const ts_cl_wreq_t *r) {
  for (; head; head = head->next)
    if (head == r) return true;
  return false;
}

/* The caller owns its buffers again once op is published, but a request that ends early
 * may still have the connection using them: a push's payload not yet all handed to the
 * kernel (ts_conn_send writes straight from the caller's memory), or a pull reply being
 * read into the caller's dst. Such a connection is closed now: uv_close stops every read
 * into, and write from, that memory before this loop turn ends. The shard is reconnected in
 * the background; requests in flight on it fail with ECLOSED. (Any bytes still queued count
 * as the push's: closing one connection too many only costs a reconnect.) */
static void release_caller_memory(ts_cl_op_t *op, const char *msg) {
  for (ts_cl_wreq_t *r = op->reqs; r; r = r->op_next) {
    ts_cl_shard_t *sh = r->sh;
    if (!sh->link || !on_list(sh->pending, r)) continue;
    ts_conn_t *conn = &sh->link->conn;
    if (conn->closing) continue;
    /* A table's request sends its keys or records, and reads its rows, from the op's own
     * buffers, which are freed with it. */
    bool sends = r->type == TS_MSG_PUSH || r->type == TS_MSG_SPARSE_PUSH ||
                 r->type == TS_MSG_SPARSE_PULL;
    bool writing = sends && ts_conn_write_queue(conn) > 0;
    bool reading = conn->state == TS_CONN_READ_DATA &&
                   ((r->type == TS_MSG_PULL && r->iov && conn->dst == r->iov) ||
                    (r->type == TS_MSG_SPARSE_PULL && conn->dst == &r->rx));
    if (!writing && !reading) continue;
    snprintf(conn->errmsg, sizeof conn->errmsg, "%.150s; closed: the request's %s",
             msg, writing ? "push was still being sent" : "pull reply was still arriving");
    ts_conn_close(conn, TS_ETIMEDOUT);
  }
}

/* End op before every request is answered (deadline, interrupt, close): each part still
 * out fails with rc, and msg says why. */
static void abort_op(ts_client_t *c, ts_cl_op_t *op, int rc, const char *msg) {
  release_caller_memory(op, msg);
  if (!op->reqs) {
    op_fail(op, TS_MSG_PUSH, rc, msg);
    op_fail(op, TS_MSG_PULL, rc, msg);
  }
  for (ts_cl_wreq_t *r = op->reqs; r; r = r->op_next) op_fail(op, r->type, rc, msg);
  finish_op(c, op);
}

/* A request is answered (rc 0) or failed. */
void ts_cl_complete_req(ts_cl_wreq_t *r, int rc, const char *detail) {
  ts_cl_op_t *op = r->op;
  if (op) {
    op_unlink_req(op, r);
    if (rc < 0 && (op->rc == 0 || op->kind == OP_PUSH_PULL)) {
      char msg[sizeof op->err];
      snprintf(msg, sizeof msg, "shard %u (%s): %s", r->sh->index, r->sh->addr,
               detail ? detail : ts_strerror(rc));
      op_fail(op, r->type, rc, msg);
    }
    ts_require(op->remaining > 0); /* each wire request completes its op once */
    if (--op->remaining == 0) finish_op(r->sh->cl, op);
  }
  ts_cl_free_wreq(r);
}

/* Whether a frame of type `reply` answers r. A reply that comes before r's own frame was
 * out of the caller's memory (the shard did not read the request) answers nothing: its
 * link is closed (EPROTO), which fails r once libuv has let go of that memory. */
static bool answers(const ts_cl_wreq_t *r, uint16_t reply) {
  if (reply == 0) return true;
  if (reply != TS_MSG_ERROR && (uint32_t)r->type + 1 != reply) return false;
  ts_cl_link_t *l = r->sh->link;
  if (l && ts_conn_released(&l->conn) < r->sent_end) {
    ts_log_warn("shard %u (%s) answered request %llu before it was sent whole: closing its "
                "connection",
                r->sh->index, r->sh->addr, (unsigned long long)r->id);
    ts_conn_close(&l->conn, TS_EPROTO);
    return false;
  }
  return true;
}

ts_cl_wreq_t *ts_cl_take_pending(ts_cl_shard_t *sh, uint64_t id, uint16_t reply) {
  for (ts_cl_wreq_t **pp = &sh->pending; *pp; pp = &(*pp)->next) {
    if ((*pp)->id == id) {
      if (!answers(*pp, reply)) return NULL;
      ts_cl_wreq_t *r = *pp;
      *pp = r->next;
      r->next = NULL;
      return r;
    }
  }
  return NULL;
}

ts_cl_wreq_t *ts_cl_find_pending(ts_cl_shard_t *sh, uint64_t id, uint16_t reply) {
  for (ts_cl_wreq_t *r = sh->pending; r; r = r->next)
    if (r->id == id) return answers(r, reply) ? r : NULL;
  return NULL;
}

/* --- sending ------------------------------------------------------------------------ */

void ts_cl_flush_queued(ts_cl_shard_t *sh) {
  ts_cl_wreq_t *q = sh->queued;
  sh->queued = NULL;
  /* Keep the order in which they were queued (the list is LIFO). */
  ts_cl_wreq_t *rev = NULL;
  while (q) {
    ts_cl_wreq_t *next = q->next;
    q->next = rev;
    rev = q;
    q = next;
  }
  while (rev) {
    ts_cl_wreq_t *next = rev->next;
    rev->next = NULL;
    send_req(rev);
    rev = next;
  }
}

static void fail_send(ts_cl_wreq_t *r, int rc) {
  ts_cl_complete_req(r, rc, "could not send the request");
}

static void send_req(ts_cl_wreq_t *r) {
  ts_cl_shard_t *sh = r->sh;
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
      if (r->op && r->op->min_version == TS_CLIENT_VERSION_NEXT)
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
      m.step = r->op ? (r->op->step == TS_CLIENT_STEP_PULLED ? sh->pulled_version : r->op->step) : 0;
      m.push_id = r->op ? r->op->push_id : 0;
      m.client_incarnation = m.push_id ? c->incarnation : 0;
      m.kind = r->op ? (Tessera__PushKind)r->op->push_kind : TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT;
      rc = ts_conn_send(conn, TS_MSG_PUSH, &m.base, r->iov, (unsigned)r->n, NULL, NULL);
      break;
    }
    case TS_MSG_SPARSE_PULL:
    case TS_MSG_SPARSE_PUSH:
      rc = ts_cl_sparse_send(c, r, conn);
      break;
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
      m.reported = c->p_reported;
      char device[sizeof c->p_device];
      memcpy(device, c->p_device, sizeof device);
      m.has_final_test_accuracy = c->p_has_final;
      m.final_test_accuracy = c->p_final;
      m.has_auc = c->p_has_auc;
      m.auc = c->p_auc;
      m.has_test_auc = c->p_has_test_auc;
      m.test_auc = c->p_test_auc;
      m.test_logloss = c->p_test_logloss;
      uv_mutex_unlock(&c->mu);
      m.device = device;
      m.job_end = r->op && r->op->ask_end;
      rc = ts_conn_send(conn, TS_MSG_HEARTBEAT, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_STATUS: {
      Tessera__Status m = TESSERA__STATUS__INIT;
      m.request_id = r->id;
      m.with_model = r->op && r->op->with_model;
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
    case TS_MSG_TABLE_KEYS: {
      Tessera__TableKeys m = TESSERA__TABLE_KEYS__INIT;
      m.request_id = r->id;
      if (!r->op) {
        rc = TS_EINTERNAL;
        break;
      }
      m.table = r->op->keys_table;
      m.cursor = r->op->keys_cursor;
      m.max_keys = r->op->keys_max;
      rc = ts_conn_send(conn, TS_MSG_TABLE_KEYS, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    case TS_MSG_MODEL_RESET: {
      Tessera__ModelReset m = TESSERA__MODEL_RESET__INIT;
      m.request_id = r->id;
      m.force = r->op ? r->op->force : false;
      rc = ts_conn_send(conn, TS_MSG_MODEL_RESET, &m.base, NULL, 0, NULL, NULL);
      break;
    }
    default:
      rc = TS_EINTERNAL;
  }
  if (rc == 0) r->sent_end = conn->bytes_out;
out:
  ts_free(slices);
  ts_free(sp);
  if (rc < 0) {
    list_remove(&sh->pending, r);
    fail_send(r, rc);
  }
}

/* Queue or send a request to shard sh for op (op may be NULL for internal requests). */
int ts_cl_submit_wire(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, uint16_t type, size_t *parts,
                      size_t n) {
  ts_cl_wreq_t *r = ts_calloc(1, sizeof *r);
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
      ts_cl_free_wreq(r);
      return TS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
      const ts_part_t *p = &c->plan.parts[parts[i]];
      char *base = type == TS_MSG_PULL ? (char *)(op->dst[p->tensor] + p->offset)
                                       : (char *)(uintptr_t)(op->grad[p->tensor] + p->offset);
      r->iov[i] = uv_buf_init(base, (unsigned)(p->count * sizeof(float)));
    }
  }
  return ts_cl_enqueue_wire(c, sh, op, r);
}

int ts_cl_enqueue_wire(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, ts_cl_wreq_t *r) {
  (void)c;
  ts_require(r->op == op && r->sh == sh);
  if (op) {
    r->op_next = op->reqs;
    op->reqs = r;
    op->remaining++;
  }
  if (sh->state == SH_READY || (r->type == TS_MSG_DECLARE && op == NULL)) {
    send_req(r);
  } else if (op && op->wait_ready) {
    r->next = sh->queued;
    sh->queued = r;
  } else {
    char why[300];
    snprintf(why, sizeof why, "not connected: %s", sh->why[0] ? sh->why : "connecting");
    ts_cl_complete_req(r, TS_EUNAVAIL, why);
  }
  return 0;
}

static size_t *copy_parts(const size_t *src, size_t n) {
  size_t *p = ts_malloc((n ? n : 1) * sizeof *p);
  if (p && n) memcpy(p, src, n * sizeof *p);
  return p;
}

/* The plan indices of op's partitions held by shard s (a new array), in op's order. */
static size_t *shard_subset(ts_client_t *c, const ts_cl_op_t *op, uint32_t s, size_t *n) {
  if (!op->parts) {
    *n = c->shard_nparts[s];
    return copy_parts(c->shard_parts[s], c->shard_nparts[s]);
  }
  size_t k = 0;
  size_t *mine = ts_malloc((op->nparts ? op->nparts : 1) * sizeof *mine);
  if (!mine) return NULL;
  for (size_t i = 0; i < op->nparts; i++)
    if (c->plan.parts[op->parts[i]].shard == s) mine[k++] = op->parts[i];
  *n = k;
  return mine;
}

void ts_cl_start_op(ts_client_t *c, ts_cl_op_t *op) {
  /* A new push's id, given here in the order the shards see the pushes. */
  bool retry = op->retry = op->push_id != 0;
  if ((op->kind == OP_PUSH || op->kind == OP_PUSH_PULL) && op->req && !op->push_id)
    op->push_id = atomic_fetch_add(&c->last_push_id, 1) + 1;
  /* Which shards answer the push; a retry starts from what the failed attempts had (those
   * shards are not sent it again: they would only answer duplicate). Without the memory,
   * every shard is sent it, which is as correct. */
  if (op->push_id && (op->acked = ts_calloc(c->n, 1)) != NULL && retry) {
    ts_cl_failed_push_t *f = failed_push(c, op->push_id);
    if (f && repeats(op, f)) memcpy(op->acked, f->acked, c->n);
  }
  op->deadline_ms = loop_now(c) + (uint64_t)(op->timeout_s * 1000.0);
  op->version_min = UINT64_MAX;
  op->next = c->inflight;
  c->inflight = op;
  op->remaining = 1; /* held until every request is submitted */
  int rc = 0;
  for (uint32_t s = 0; s < c->n && rc == 0; s++) {
    ts_cl_shard_t *sh = &c->shards[s];
    switch (op->kind) {
      case OP_DECLARE:
        rc = ts_cl_submit_wire(c, sh, op, TS_MSG_DECLARE, NULL, 0);
        break;
      case OP_PULL:
      case OP_PUSH:
      case OP_PUSH_PULL: {
        if (op->sp) {
          rc = ts_cl_sparse_start(c, sh, op);
          break;
        }
        size_t k = 0;
        size_t *mine = shard_subset(c, op, s, &k);
        if (!mine) {
          rc = TS_ENOMEM;
        } else if (k == 0 && (op->kind != OP_PUSH || op->parts)) {
          /* Nothing of it here; a whole-model push still tells every shard. */
          ts_free(mine);
        } else if (op->kind == OP_PUSH && op->acked && op->acked[s]) {
          ts_free(mine); /* a retry: this shard answered an earlier attempt */
        } else if (op->kind == OP_PUSH_PULL && op->acked && op->acked[s]) {
          rc = ts_cl_submit_wire(c, sh, op, TS_MSG_PULL, mine, k); /* the pull only */
        } else if (op->kind == OP_PUSH_PULL) {
          /* Back to back on one connection: the shard handles a connection's frames in
           * order, so the pull sees the push applied (or, in sync mode, waits for the
           * version the push takes part in). */
          size_t *again = copy_parts(mine, k);
          rc = ts_cl_submit_wire(c, sh, op, TS_MSG_PUSH, mine, k);
          if (rc == 0 && again)
            rc = ts_cl_submit_wire(c, sh, op, TS_MSG_PULL, again, k);
          else if (!again)
            rc = TS_ENOMEM;
          else
            ts_free(again);
        } else {
          rc = ts_cl_submit_wire(c, sh, op, op->kind == OP_PULL ? TS_MSG_PULL : TS_MSG_PUSH, mine,
                                 k);
        }
        break;
      }
      case OP_HEARTBEAT:
        /* To the ready shards only: one reconnecting does not make the call fail. */
        if (sh->state == SH_READY) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_HEARTBEAT, NULL, 0);
        break;
      case OP_STATUS:
        if (s == op->shard) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_STATUS, NULL, 0);
        break;
      case OP_CHECKPOINT:
        if (s == op->shard) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_CHECKPOINT, NULL, 0);
        break;
      case OP_SHUTDOWN:
        if (s == op->shard) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_SHUTDOWN, NULL, 0);
        break;
      case OP_MODEL_RESET:
        if (s == op->shard) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_MODEL_RESET, NULL, 0);
        break;
      case OP_TABLE_KEYS:
        if (s == op->shard) rc = ts_cl_submit_wire(c, sh, op, TS_MSG_TABLE_KEYS, NULL, 0);
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

void ts_cl_free_op(ts_cl_op_t *op) {
  if (!op) return;
  ts_free(op->parts);
  ts_free(op->stage);
  ts_free(op->acked);
  ts_cl_sparse_free(op->sp);
  ts_free(op);
}

void ts_cl_expire_ops(ts_client_t *c, uint64_t now) {
  ts_cl_op_t *op = c->inflight;
  while (op) {
    ts_cl_op_t *next = op->next;
    if (now >= op->deadline_ms) {
      /* Each shard with its address, and why it is not connected when it is not (a request
       * waits for a shard that is reconnecting). */
      char msg[sizeof op->err];
      size_t len = (size_t)snprintf(msg, sizeof msg, "no answer within %.1f s from shard(s) ",
                                    op->timeout_s);
      const char *sep = "";
      for (ts_cl_wreq_t *r = op->reqs; r && len < sizeof msg - 8; r = r->op_next) {
        const ts_cl_shard_t *sh = r->sh;
        bool up = sh->state == SH_READY;
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%u (%s%s%s)", sep, sh->index,
                                sh->addr, up ? "" : ", not connected: ", up ? "" : ts_cl_why(sh));
        sep = ", ";
      }
      abort_op(c, op, TS_ETIMEDOUT, msg);
    }
    op = next;
  }
}

void ts_cl_abort_ops(ts_client_t *c, int rc, const char *msg) {
  while (c->inflight) abort_op(c, c->inflight, rc, msg);
}

void ts_cl_refuse_op(ts_client_t *c, ts_cl_op_t *op, int rc, const char *msg) {
  op_fail(op, TS_MSG_PUSH, rc, msg);
  op_fail(op, TS_MSG_PULL, rc, msg);
  publish_op(c, op);
}
