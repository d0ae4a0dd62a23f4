/*
 * SparsePull (docs/architecture.md, "Tables"): a table's rows for a list of keys.
 *
 * The keys are read into the request's own buffer, which is budgeted: a pull of more keys
 * than the shard's reply limit is refused at its meta (ETOOBIG; the codec already refused
 * over 2^20 keys), and the keys a worker task's SparsePulls being read or parked hold stay
 * under SPARSE_KEY_TASK, those of all other connections (admin and read-only clients)
 * together under SPARSE_KEY_OTHERS (a pull past its share is answered EBUSY and its keys
 * are read and dropped). So no peer, parking pulls or sending keys slowly, takes the room
 * of another task's pulls, and the shard holds at most (workers + 1) shares of keys. A
 * connection reads one frame at a time, parks at most server.max_parked_pulls, and a peer
 * that stops sending half way through its keys is closed by the stalled-frame rules
 * (server.frame_grace_s, server.min_recv_bytes_per_s) as for any frame.
 *
 * The reply is built on the loop, synchronously, into a buffer of its own (rows copied out
 * of the table, so no update has to wait for the write), charged to the connection's reply
 * budget (server.max_reply_bytes_per_connection and server.max_reply_bytes) until written.
 * min_version, clock and timeout_ms behave as for a Pull: the request parks in the wait
 * queue until the table's version here is at min_version (and, in ssp, the clock bound is
 * met).
 */
#include "ts_server_int.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* Bytes of keys the SparsePulls of one worker task (being read or parked) may hold: two
 * pulls of the largest size; and those of all connections that are no task's together. */
#define SPARSE_KEY_TASK ((uint64_t)16 << 20)
#define SPARSE_KEY_OTHERS ((uint64_t)64 << 20)

/* What a reply needs of server.max_reply_bytes beside its rows: its frame, write request,
 * allocator overhead and the small replies queued with it. */
#define REPLY_ROOM ((uint64_t)8 << 10)

/* The share of keys a pull of task `task` counts against. */
static uint64_t *key_share(ts_server_t *srv, int task) {
  return task >= 0 ? &srv->workers[task].sparse_key_bytes : &srv->sparse_key_others;
}

void ts_pull_req_free(ts_server_t *srv, ts_pull_req_t *q) {
  if (!q) return;
  if (q->sparse) {
    uint64_t *share = key_share(srv, q->key_task);
    ts_require(*share >= q->key_bytes);
    *share -= q->key_bytes;
  }
  ts_free(q);
}

static int refuse(ts_session_t *s, int code, const char *msg) {
  s->spull_code = code;
  ts_errmsg_printf(s->spull_msg, sizeof s->spull_msg, "%s", msg);
  return 0; /* no destination: the keys are read and dropped, then the error reply */
}

int ts_sparse_pull_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__SparsePull *m,
                        const uv_buf_t **iov, unsigned *niov) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  char err[256];
  (void)h;
  s->spull = NULL;
  s->spull_code = 0;
  if (!st->declared) {
    ts_errmsg_printf(err, sizeof err, "no model is declared on shard %u yet", srv->shard);
    return refuse(s, TS_ENOTDECLARED, err);
  }
  ts_stable_t *t = ts_store_table(st, m->table);
  if (!t) {
    ts_errmsg_printf(err, sizeof err, "table index %u: the model declares %u table(s)", m->table,
                     st->num_tables);
    return refuse(s, TS_ENOTABLE, err);
  }
  uint64_t reply = m->num_keys * ts_stable_dim(t) * sizeof(float); /* num_keys <= 2^20 */
  if (reply > TS_MSG_MAX_SPARSE_REPLY) {
    ts_errmsg_printf(err, sizeof err,
                     "%llu rows of table '%s' (width %u) make a %.1f MiB reply, more than %llu "
                     "MiB: pull fewer keys at once",
                     (unsigned long long)m->num_keys, ts_stable_name(t), ts_stable_dim(t),
                     (double)reply / (1024.0 * 1024.0),
                     (unsigned long long)(TS_MSG_MAX_SPARSE_REPLY >> 20));
    return refuse(s, TS_ETOOBIG, err);
  }
  if (!ts_rows_reply_fits(srv, (size_t)(m->num_keys * ts_stable_dim(t)))) {
    ts_errmsg_printf(err, sizeof err,
                     "%llu rows of table '%s' (width %u) make a %.1f MiB reply, more than this "
                     "shard lets replies hold (server.max_reply_bytes, %.1f MiB): pull fewer "
                     "keys at once",
                     (unsigned long long)m->num_keys, ts_stable_name(t), ts_stable_dim(t),
                     (double)reply / (1024.0 * 1024.0),
                     (double)srv->cfg->max_reply_bytes / (1024.0 * 1024.0));
    return refuse(s, TS_ETOOBIG, err);
  }
  if (s->parked >= (uint32_t)srv->cfg->max_parked_pulls) {
    ts_errmsg_printf(err, sizeof err,
                     "%u pulls of this connection already wait for a version "
                     "(server.max_parked_pulls)",
                     s->parked);
    srv->metrics.limit_refusals[TS_METRICS_LIMIT_PARKED_PULLS]++;
    return refuse(s, TS_EBUSY, err);
  }
  uint64_t key_bytes = m->num_keys * sizeof(uint64_t);
  int task = s->role == TESSERA__ROLE__ROLE_WORKER && s->task >= 0 &&
                     (uint32_t)s->task < srv->num_workers
                 ? s->task
                 : -1;
  uint64_t *share = key_share(srv, task), most = task >= 0 ? SPARSE_KEY_TASK : SPARSE_KEY_OTHERS;
  if (*share + key_bytes > most) {
    char who[32] = "clients that are no task";
    if (task >= 0) snprintf(who, sizeof who, "task %d", task);
    ts_errmsg_printf(err, sizeof err,
                     "the sparse pulls of %s being read or waiting hold %.1f MiB of keys on this "
                     "shard already (%llu MiB at most): try again once they are answered",
                     who, (double)*share / (1024.0 * 1024.0), (unsigned long long)(most >> 20));
    ts_session_log(s, TS_LOG_WARN, "%s: sparse pull %llu refused: %s", s->conn.peer,
                   (unsigned long long)m->request_id, err);
    return refuse(s, TS_EBUSY, err);
  }
  ts_pull_req_t *q = ts_malloc(sizeof *q + key_bytes);
  if (!q) return refuse(s, TS_ENOMEM, "out of memory for the keys of a sparse pull");
  memset(q, 0, sizeof *q);
  q->sparse = true;
  q->request_id = m->request_id;
  q->min_version = m->min_version;
  q->clock = m->clock;
  q->start_ns = uv_hrtime();
  q->table = m->table;
  q->read_only = m->read_only;
  q->keys = (uint64_t *)(void *)(q + 1); /* sizeof *q keeps 8-byte alignment */
  q->nkeys = (size_t)m->num_keys;
  q->key_bytes = key_bytes;
  q->key_task = task;
  *share += key_bytes;
  s->spull = q;
  if (key_bytes) {
    s->spull_iov = uv_buf_init((char *)q->keys, (unsigned)key_bytes);
    *iov = &s->spull_iov;
    *niov = 1;
  }
  return 0;
}

bool ts_sparse_pull_ready(ts_server_t *srv, const ts_pull_req_t *q) {
  ts_stable_t *t = ts_store_table(&srv->store, q->table);
  if (!t) return true; /* answered ENOTABLE */
  if (ts_stable_version(t) < q->min_version) return false;
  if (srv->store.mode == TS_MODE_SSP && !ts_barrier_ssp_ready(&srv->barrier, q->clock))
    return false;
  return true;
}

/* --- reply buffers ------------------------------------------------------------------
 * A worker's replies are of much the same size step after step; a buffer freed and made
 * again comes back as fresh pages (glibc gives large blocks back to the kernel), a page
 * fault and zeroing each, which took 10 % of a shard's time with a push+pull in 4 pieces.
 * So up to TS_REPLY_CACHE_BUFS sent buffers are kept (TS_REPLY_CACHE_BYTES together), and
 * a reply takes the smallest that fits, if at most twice its size (a small reply never
 * holds a large buffer, so right-sized ones are made and kept). A reply is charged to its
 * connection for the rows it carries, not the buffer's room. */

static size_t reply_bytes(size_t nfloats) { return sizeof(ts_rows_reply_t) + nfloats * sizeof(float); }

uint64_t ts_rows_reply_max(const ts_server_t *srv) {
  uint64_t budget = (uint64_t)srv->cfg->max_reply_bytes;
  uint64_t most = budget > REPLY_ROOM ? (budget - REPLY_ROOM) & ~(uint64_t)3 : 0;
  return most < TS_MSG_MAX_SPARSE_REPLY ? most : TS_MSG_MAX_SPARSE_REPLY;
}

bool ts_rows_reply_fits(const ts_server_t *srv, size_t nfloats) {
  return (uint64_t)nfloats * sizeof(float) <= ts_rows_reply_max(srv);
}

ts_rows_reply_t *ts_rows_reply_new(ts_server_t *srv, size_t nfloats) {
  int best = -1;
  for (int i = 0; i < TS_REPLY_CACHE_BUFS; i++) {
    ts_rows_reply_t *c = srv->reply_cache[i];
    if (c && c->cap >= nfloats && c->cap / 2 <= nfloats &&
        (best < 0 || c->cap < srv->reply_cache[best]->cap))
      best = i;
  }
  ts_rows_reply_t *rb;
  if (best >= 0) {
    rb = srv->reply_cache[best];
    srv->reply_cache[best] = NULL;
    srv->reply_cache_bytes -= reply_bytes(rb->cap);
  } else if ((rb = ts_malloc(reply_bytes(nfloats))) != NULL) {
    rb->cap = nfloats;
  } else {
    return NULL;
  }
  rb->charged = ts_alloc_cost(reply_bytes(nfloats));
  return rb;
}

void ts_rows_reply_free(ts_server_t *srv, ts_rows_reply_t *rb) {
  if (!rb) return;
  size_t bytes = reply_bytes(rb->cap);
  /* An empty slot, else the smallest buffer smaller than this one. */
  int slot = -1;
  for (int i = 0; i < TS_REPLY_CACHE_BUFS; i++) {
    ts_rows_reply_t *c = srv->reply_cache[i];
    if (!c) {
      slot = i;
      break;
    }
    if (c->cap < rb->cap && (slot < 0 || c->cap < srv->reply_cache[slot]->cap)) slot = i;
  }
  size_t out = slot >= 0 && srv->reply_cache[slot] ? reply_bytes(srv->reply_cache[slot]->cap) : 0;
  if (slot < 0 || srv->reply_cache_bytes - out + bytes > TS_REPLY_CACHE_BYTES) {
    ts_free(rb);
    return;
  }
  ts_free(srv->reply_cache[slot]);
  srv->reply_cache[slot] = rb;
  srv->reply_cache_bytes = srv->reply_cache_bytes - out + bytes;
}

void ts_rows_reply_cache_free(ts_server_t *srv) {
  for (int i = 0; i < TS_REPLY_CACHE_BUFS; i++) {
    ts_free(srv->reply_cache[i]);
    srv->reply_cache[i] = NULL;
  }
  srv->reply_cache_bytes = 0;
}

static void on_sent(ts_conn_t *c, void *arg, int err) {
  (void)err;
  ts_rows_reply_t *rb = arg;
  ts_conn_charge(c, -(int64_t)rb->charged);
  ts_session_t *s = c->data;
  ts_rows_reply_free(s->srv, rb);
}

void ts_rows_reply_send(ts_session_t *s, ts_rows_reply_t *rb, uint64_t request_id,
                        uint32_t table, uint64_t nkeys, uint32_t dim, uint64_t version,
                        uint64_t start_ns) {
  ts_server_t *srv = s->srv;
  size_t bytes = nkeys * dim * sizeof(float);
  Tessera__SparsePullReply r = TESSERA__SPARSE_PULL_REPLY__INIT;
  r.request_id = request_id;
  r.table = table;
  r.num_keys = nkeys;
  r.dim = dim;
  r.version = version;
  uv_buf_t b = uv_buf_init((char *)rb->rows, (unsigned)bytes);
  ts_conn_charge(&s->conn, (int64_t)rb->charged);
  int rc = ts_conn_send(&s->conn, TS_MSG_SPARSE_PULL_REPLY, &r.base, &b, bytes ? 1 : 0, on_sent, rb);
  if (rc < 0) {
    ts_conn_charge(&s->conn, -(int64_t)rb->charged);
    ts_rows_reply_free(srv, rb);
    ts_session_reply_failed(s, TS_MSG_SPARSE_PULL_REPLY, rc);
    return;
  }
  srv->pulls++;
  ts_prom_hist_observe(&srv->metrics.pull_duration, (double)(uv_hrtime() - start_ns) * 1e-9);
  ts_replyq_enforce(srv);
}

void ts_sparse_pull_send(ts_session_t *s, const ts_pull_req_t *q) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_stable_t *t = ts_store_table(st, q->table);
  if (!t) {
    ts_session_reply_error(s, TS_MSG_SPARSE_PULL, q->request_id, TS_ENOTABLE,
                           "the table is gone (the model was reset)");
    return;
  }
  uint32_t dim = ts_stable_dim(t);
  ts_rows_reply_t *rb = ts_rows_reply_new(srv, q->nkeys * dim);
  if (!rb) {
    ts_session_reply_error(s, TS_MSG_SPARSE_PULL, q->request_id, TS_ENOMEM,
                           "out of memory for a sparse pull reply");
    return;
  }
  if (q->read_only)
    ts_stable_peek(t, q->keys, q->nkeys, rb->rows);
  else
    ts_stable_pull(t, &st->table_budget, q->keys, q->nkeys, rb->rows);
  ts_rows_reply_send(s, rb, q->request_id, q->table, q->nkeys, dim, ts_stable_version(t),
                     q->start_ns);
}

void ts_sparse_pull_handle(ts_session_t *s, Tessera__SparsePull *m, bool discarded) {
  ts_server_t *srv = s->srv;
  char err[256];
  ts_pull_req_t *q = s->spull;
  s->spull = NULL;
  uint64_t request_id = m->request_id, timeout_ms = m->timeout_ms;
  ts_msg_free(&m->base);
  int code = s->spull_code;
  if (code == 0 && (!q || (discarded && q->nkeys))) {
    code = TS_ENOMEM;
    ts_errmsg_printf(s->spull_msg, sizeof s->spull_msg, "the keys of the sparse pull were lost");
  }
  if (code == 0) {
    uint64_t prev = 0;
    bool have = false;
    code = ts_stable_check_keys(q->keys, sizeof(uint64_t), q->nkeys, &prev, &have, srv->shard,
                                srv->store.num_shards, 0, err, sizeof err);
    if (code < 0) ts_errmsg_printf(s->spull_msg, sizeof s->spull_msg, "%s", err);
  }
  if (code < 0) {
    ts_pull_req_free(srv, q);
    ts_session_reply_error(s, TS_MSG_SPARSE_PULL, request_id, code, s->spull_msg);
    return;
  }
  if (ts_sparse_pull_ready(srv, q)) {
    ts_sparse_pull_send(s, q);
    ts_pull_req_free(srv, q);
  } else {
    ts_waitq_park(s, q, timeout_ms); /* the queue owns q from here */
  }
}

void ts_sparse_pull_close(ts_session_t *s) {
  ts_pull_req_free(s->srv, s->spull);
  s->spull = NULL;
}

/* Slots of each table looked at per tick for expired rows. */
#define EXPIRE_PER_TICK 4096
/* Ticks between two halvings of the hottest keys' counts (the tick is 100 ms: 5 s). */
#define HOT_DECAY_TICKS 50

void ts_sparse_tick(ts_server_t *srv) {
  ts_store_t *st = &srv->store;
  if (!st->declared) return;
  bool decay = ++srv->hot_ticks >= HOT_DECAY_TICKS;
  if (decay) srv->hot_ticks = 0;
  for (uint32_t i = 0; i < st->num_tables; i++) {
    ts_stable_t *t = ts_store_table(st, i);
    ts_stable_expire(t, &st->table_budget, EXPIRE_PER_TICK);
    if (decay) ts_stable_decay_hot(t);
  }
}
