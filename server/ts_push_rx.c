/*
 * The push receive (docs/architecture.md, "Pushes"): a push's partitions are grouped into
 * pieces of at most one staging buffer; each piece is read into a buffer from the shared
 * pool, checked chunk by chunk as it lands and applied, and the buffer is reused for the
 * next piece. Concurrent pushes take turns on the pool piece by piece, and an async
 * update that would land on a partition being written to a puller waits (is "held").
 *
 * Turns are fair (docs/architecture.md, "What one peer may hold"): the pool hands buffers
 * out in arrival order, a push gives its buffer up after each piece when others wait, and
 * a push that holds a buffer while its bytes arrive slower than server.push_min_bytes_per_s
 * loses its connection, so a peer sending a byte a second cannot keep the pool from
 * everybody else; and while pushes wait for a buffer, a holder slower than
 * server.push_contended_min_bytes_per_s loses it too, so tricklers each just above the
 * floor cannot hold the whole pool.
 */
#include "ts_server_int.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* Staging buffers hold the largest partition of the shard, and at least this much, so the
 * push of a small model stays a single piece (checked and applied as a whole). */
#define STAGE_MIN_BYTES (1u << 20)
/* Memory the staging pool may take (more only when two buffers need more). */
#define STAGE_BUDGET_BYTES (16u << 20)
/* A piece is read in chunks of this many floats (256 KiB), each checked as it lands. */
#define CHUNK_FLOATS ((size_t)65536)

int ts_push_rx_stage_ready(ts_server_t *srv) {
  if (srv->stage.buf_bytes) return 0;
  size_t largest = STAGE_MIN_BYTES;
  uint64_t bytes = ts_store_max_part_count(&srv->store) * sizeof(float);
  if (bytes > largest) largest = (size_t)bytes;
  return ts_stage_init(&srv->stage, largest, STAGE_BUDGET_BYTES);
}

/* The push gets staging buffer buf: its rate is measured from now (ts_push_rx_drop_slow). */
static void rx_point(ts_session_t *s, float *buf) {
  ts_push_rx_t *rx = &s->rx;
  rx->buf = buf;
  rx->rate_ms = ts_server_now_ms(s->srv);
  rx->rate_bytes = s->conn.bytes_in;
  for (size_t k = 0; k < rx->nchunks; k++) rx->iov[k].base = (char *)(buf + rx->chunk_off[k]);
}

/* Give the session's staging buffer back; the next session queued for one gets it and
 * reads on. */
void ts_push_rx_give_back(ts_server_t *srv, ts_push_rx_t *rx) {
  if (rx->wait.queued) ts_stage_cancel(&srv->stage, &rx->wait);
  if (!rx->buf) return;
  float *buf = rx->buf;
  rx->buf = NULL;
  ts_stage_waiter_t *w = ts_stage_release(&srv->stage, buf);
  if (w) {
    ts_session_t *next = (ts_session_t *)(void *)((char *)w - offsetof(ts_session_t, rx.wait));
    rx_point(next, w->buf);
    ts_conn_resume(&next->conn);
  }
}

/* Grow *arr (of *cap entries of size each) to hold n. */
static int grow(void *arr, size_t *cap, size_t n, size_t each) {
  if (n <= *cap) return 0;
  size_t c = *cap ? *cap : 8;
  while (c < n) c *= 2;
  void *p = ts_realloc(*(void **)arr, c * each);
  if (!p) return TS_ENOMEM;
  *(void **)arr = p;
  *cap = c;
  return 0;
}

/* Room for a push of n slices cut into at most nchunks chunks. */
int ts_push_rx_reserve(ts_push_rx_t *rx, size_t n, size_t nchunks) {
  if (nchunks == 0) nchunks = 1;
  if (grow(&rx->first, &rx->cap, n + 1, sizeof *rx->first) < 0 ||
      grow(&rx->results, &rx->results_cap, n ? n : 1, sizeof *rx->results) < 0 ||
      grow(&rx->iov, &rx->chunk_cap, nchunks, sizeof *rx->iov) < 0 ||
      grow(&rx->chunk_off, &rx->off_cap, nchunks, sizeof *rx->chunk_off) < 0 ||
      grow(&rx->chunk_piece, &rx->piece_cap, nchunks, sizeof *rx->chunk_piece) < 0)
    return TS_ENOMEM;
  return 0;
}

static void rx_free(ts_push_rx_t *rx) {
  ts_free(rx->first);
  ts_free(rx->results);
  ts_free(rx->iov);
  ts_free(rx->chunk_off);
  ts_free(rx->chunk_piece);
  memset(rx, 0, sizeof *rx);
}

static int push_refuse(ts_push_rx_t *rx, int code, const char *msg) {
  rx->active = false;
  rx->refuse_code = code;
  if (msg) ts_errmsg_printf(rx->refuse_msg, sizeof rx->refuse_msg, "%s", msg);
  return 0; /* no destination: the payload is read and dropped, then ts_push_rx_handle replies */
}

/* A push's meta has arrived. Everything that can refuse the whole push is checked here,
 * before any of its payload is read: role, partitions and sizes, and in sync mode that no
 * partition is behind the step (versions only grow, so this stays true while the payload
 * arrives). Then the payload is cut into pieces of at most one staging buffer. */
int ts_push_rx_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__Push *m,
                    const uv_buf_t **iov, unsigned *niov) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  rx->start_ns = uv_hrtime();
  rx->active = false;
  rx->refuse_code = 0;
  rx->refuse_msg[0] = '\0';
  if (s->role != TESSERA__ROLE__ROLE_WORKER)
    return push_refuse(rx, TS_EROLE, "only workers push gradients");
  int rc = ts_store_check_slices(st, m->parts, m->n_parts, rx->refuse_msg, sizeof rx->refuse_msg);
  if (rc < 0) return push_refuse(rx, rc, NULL);
  if (m->kind != TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT &&
      m->kind != TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN &&
      m->kind != TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN_INITIAL)
    return push_refuse(rx, TS_EINVAL, "unknown push kind");
  bool assign = m->kind != TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT;
  /* A gradient needs values to apply to; an assign is how they come. */
  if (!assign && (rc = ts_store_check_ready(st, m->parts, m->n_parts, rx->refuse_msg,
                                            sizeof rx->refuse_msg)) < 0)
    return push_refuse(rx, rc, NULL);
  if (st->mode == TS_MODE_SYNC && !assign &&
      (rc = ts_store_check_step(st, m->parts, m->n_parts, m->step, rx->refuse_msg,
                                sizeof rx->refuse_msg)) < 0)
    return push_refuse(rx, rc, NULL);
  if (ts_push_rx_stage_ready(srv) < 0 ||
      ts_push_rx_reserve(rx, m->n_parts, h->data_len / (CHUNK_FLOATS * sizeof(float)) + m->n_parts) < 0)
    return push_refuse(rx, TS_ENOMEM, "out of memory for the push payload");

  /* Pieces: runs of whole partitions that fit one buffer (each partition does), read in
   * chunks so each chunk is checked while it is still in the cache. */
  size_t cap = srv->stage.buf_bytes / sizeof(float), used = 0, np = 0, nc = 0;
  for (size_t i = 0; i <= m->n_parts; i++) {
    uint64_t count = i < m->n_parts ? m->parts[i]->count : 0;
    if (i == m->n_parts || i == 0 || used + count > cap) {
      for (size_t off = 0; np && off < used; off += CHUNK_FLOATS) {
        size_t len = used - off < CHUNK_FLOATS ? used - off : CHUNK_FLOATS;
        /* rx_reserve counted a chunk per CHUNK_FLOATS of payload plus one per partition,
         * and ts_msg_decode checked that the slices add up to the payload. */
        ts_require(nc < rx->chunk_cap);
        rx->iov[nc] = uv_buf_init(NULL, (unsigned)(len * sizeof(float)));
        rx->chunk_off[nc] = off;
        rx->chunk_piece[nc++] = np - 1;
      }
      if (i == m->n_parts) break;
      rx->first[np++] = i;
      used = 0;
    }
    used += count;
  }
  rx->first[np] = m->n_parts;
  rx->npieces = h->data_len ? np : 0;
  rx->nchunks = h->data_len ? nc : 0;
  rx->piece = rx->next = rx->next_off = 0;
  rx->piece_bad = false;
  rx->stale = rx->refused = rx->applied_slices = rx->duplicates = 0;
  rx->refused_detail[0] = '\0';
  memset(rx->results, 0, m->n_parts * sizeof *rx->results);
  rx->m = m;
  rx->sparse = false;
  rx->active = true;
  if (rx->nchunks == 0) return 0;
  rc = ts_push_rx_acquire(s, iov, niov);
  if (rc < 0) return push_refuse(rx, TS_ENOMEM, "out of memory for the push payload");
  return rc;
}

int ts_push_rx_acquire(ts_session_t *s, const uv_buf_t **iov, unsigned *niov) {
  ts_server_t *srv = s->srv;
  ts_push_rx_t *rx = &s->rx;
  float *buf;
  int rc = ts_stage_acquire(&srv->stage, &rx->wait, &buf);
  if (rc < 0) return rc;
  *iov = rx->iov;
  *niov = (unsigned)rx->nchunks;
  if (rc == 1) { /* ts_push_rx_give_back points the pieces and resumes */
    srv->metrics.push_waits_staging++;
    return TS_CONN_HOLD;
  }
  rx_point(s, buf);
  return 0;
}

/* A pull reply is being written from p: keep the piece from slice i (its values at g) and
 * wait for it (ts_push_rx_wake_held goes on from there). */
static int hold_on(ts_session_t *s, ts_spart_t *p, size_t i, const float *g) {
  ts_push_rx_t *rx = &s->rx;
  rx->next = i;
  rx->next_off = (size_t)(g - rx->buf);
  rx->held_on = p;
  ts_store_hold(p);
  s->srv->metrics.push_waits_reply++;
  rx->held_next = s->srv->held;
  s->srv->held = s;
  return TS_CONN_HOLD;
}

/* Apply the piece in the staging buffer, from slice rx->next on; fresh: the piece has just
 * landed (its chunks were checked as they came: rx->piece_bad). A piece with a non-finite
 * value is refused whole. Returns TS_CONN_HOLD when an async update has to wait for a pull
 * reply being written from its partition (ts_push_rx_wake_held goes on from there). */
static int push_piece(ts_session_t *s, bool fresh) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  const Tessera__Push *m = rx->m;
  size_t a = rx->first[rx->piece], b = rx->first[rx->piece + 1];
  bool assign = m->kind != TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT;
  bool sync = st->mode == TS_MODE_SYNC && !assign;
  uint64_t now = ts_server_now_ms(srv);
  if (fresh && rx->piece_bad) {
    /* Name the first bad partition (the error path only: a second pass is fine). */
    const float *g = rx->buf;
    for (size_t i = a; i < b; i++) {
      uint64_t count = m->parts[i]->count;
      if (!ts_optim_all_finite(g, count)) {
        if (!rx->refused_detail[0])
          ts_errmsg_printf(rx->refused_detail, sizeof rx->refused_detail,
                   "%s of '%s' part %u contains NaN or Inf", assign ? "value" : "gradient",
                   st->tensors[m->parts[i]->tensor].name, m->parts[i]->part);
        rx->refused += b - a;
        /* In sync mode the worker was heard from for this step: its barrier does not wait. */
        for (size_t k = a; sync && k < b; k++)
          ts_store_sync_skip(st, ts_store_find(st, m->parts[k]->tensor, m->parts[k]->part), s->task,
                             m->step, now);
        break;
      }
      g += count;
    }
    rx->next = b;
    return 0;
  }
  const float *g = rx->buf + rx->next_off;
  /* A push with an id: the windows of its client (looked up again for each piece, since
   * another session's lookup may take the slot meanwhile). */
  ts_pushid_window_t *wins = NULL;
  if (m->push_id) {
    bool evicted;
    wins = ts_pushid_lookup(&srv->pushids, s->task, m->client_incarnation,
                            ts_store_pushid_units(st),
                            &evicted);
    if (evicted)
      ts_log_info("%s: task %d has more than server.push_dedup_clients (%d) clients: the least "
                  "recently used one's push ids are forgotten",
                  s->conn.peer, s->task, srv->cfg->push_dedup_clients);
  }
  for (size_t i = rx->next; i < b; i++) {
    ts_spart_t *p = ts_store_find(st, m->parts[i]->tensor, m->parts[i]->part);
    ts_require(p != NULL); /* ts_push_rx_meta checked the slices */
    Tessera__PushResult r = TESSERA__PUSH_RESULT__PUSH_APPLIED;
    ts_pushid_window_t *w = wins ? &wins[ts_store_part_index(st, p)] : NULL;
    if (w && ts_pushid_seen(w, m->push_id)) {
      /* A retry of a push this partition already has: not applied twice. */
      r = TESSERA__PUSH_RESULT__PUSH_DUPLICATE;
      rx->duplicates++;
    } else if (assign) {
      if (!ts_store_assign(st, p, g, m->kind == TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN_INITIAL, &r))
        return hold_on(s, p, i, g);
      if (r == TESSERA__PUSH_RESULT__PUSH_STALE) rx->stale++;
    } else if (sync) {
      r = ts_store_sync_push(st, p, g, s->task, m->step, now,
                             ts_barrier_required(&srv->barrier, ts_store_contributed(p)));
      if (r == TESSERA__PUSH_RESULT__PUSH_STALE) rx->stale++;
      if (r == TESSERA__PUSH_RESULT__PUSH_APPLIED) /* a barrier that this gradient closed */
        ts_prom_hist_observe(&srv->metrics.barrier_wait, 0.0);
    } else if (!ts_store_async_push(st, p, g)) {
      return hold_on(s, p, i, g);
    }
    if (w &&
        (r == TESSERA__PUSH_RESULT__PUSH_APPLIED || r == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED))
      ts_pushid_record(w, m->push_id);
    rx->results[i] = r;
    if ((unsigned)r < 4) srv->metrics.push_parts[r]++;
    rx->applied_slices++;
    g += ts_store_part_count(p);
  }
  rx->next = b;
  return 0;
}

/* A piece has been applied and more of the push follow. When other connections wait for a
 * staging buffer, hand ours to the first of them and queue for the next one: concurrent
 * pushes then take turns piece by piece, and a waiting worker is not kept from reading (its
 * heartbeats included) for the whole of a large push. Returns 0 (go on reading into
 * rx->buf), TS_CONN_HOLD (queued) or a negative code. */
int ts_push_rx_take_turns(ts_session_t *s) {
  ts_server_t *srv = s->srv;
  ts_push_rx_t *rx = &s->rx;
  if (rx->piece + 1 >= rx->npieces || !srv->stage.head) return 0;
  ts_push_rx_give_back(srv, rx);
  float *buf;
  int rc = ts_stage_acquire(&srv->stage, &rx->wait, &buf);
  if (rc < 0) return rc;
  if (rc == 1) {
    srv->metrics.push_waits_staging++;
    return TS_CONN_HOLD; /* ts_push_rx_give_back points the rest of the push and resumes */
  }
  rx_point(s, buf);
  return 0;
}

/* Chunk i of the payload has landed: check it now, while it is in the cache; apply its
 * piece once the piece's last chunk is in. */
int ts_push_rx_on_piece(ts_conn_t *c, unsigned i) {
  ts_session_t *s = c->data;
  ts_push_rx_t *rx = &s->rx;
  s->srv->activity++;
  if (!rx->active || i >= rx->nchunks) return 0;
  if (rx->sparse) return ts_sparse_push_on_piece(s, i);
  size_t piece = rx->chunk_piece[i];
  if (rx->chunk_off[i] == 0) {
    rx->piece = piece;
    rx->next = rx->first[piece];
    rx->next_off = 0;
    rx->piece_bad = false;
  }
  if (!rx->piece_bad)
    rx->piece_bad =
        !ts_optim_all_finite(rx->buf + rx->chunk_off[i], rx->iov[i].len / sizeof(float));
  if (i + 1 < rx->nchunks && rx->chunk_piece[i + 1] == piece) return 0;
  int rc = push_piece(s, true);
  return rc == 0 ? ts_push_rx_take_turns(s) : rc;
}

/* Pull replies finished writing from some partitions: go on with the pushes that waited.
 * A partition keeps counting a held push until that push has been applied, so pulls served
 * meanwhile (a resumed push can complete its frame and serve parked pulls) never overtake a
 * held update. */
void ts_push_rx_wake_held(ts_server_t *srv) {
  ts_session_t *ready = NULL, **tail = &ready;
  for (ts_session_t **pp = &srv->held; *pp;) {
    ts_session_t *s = *pp;
    if (ts_store_busy(s->rx.held_on)) {
      pp = &s->rx.held_next;
      continue;
    }
    *pp = s->rx.held_next;
    s->rx.held_next = NULL;
    *tail = s;
    tail = &s->rx.held_next;
  }
  while (ready) {
    ts_session_t *s = ready;
    ready = s->rx.held_next;
    s->rx.held_next = NULL;
    ts_spart_t *was = s->rx.held_on;
    s->rx.held_on = NULL;
    int rc = 0;
    if (!s->conn.closing && s->rx.active) rc = push_piece(s, false); /* may hold again */
    ts_store_unhold(was);
    if (rc == 0 && !s->conn.closing && s->rx.active) rc = ts_push_rx_take_turns(s);
    if (rc < 0)
      ts_conn_close(&s->conn, rc);
    else if (rc == 0 && !s->conn.closing && s->rx.active)
      ts_conn_resume(&s->conn);
  }
}

static void unhold(ts_server_t *srv, ts_session_t *s) {
  if (!s->rx.held_on) return;
  for (ts_session_t **pp = &srv->held; *pp; pp = &(*pp)->rx.held_next) {
    if (*pp == s) {
      *pp = s->rx.held_next;
      break;
    }
  }
  ts_store_unhold(s->rx.held_on);
  s->rx.held_on = NULL;
  s->rx.held_next = NULL;
}

/* The whole push has been read (and its pieces applied as they landed): reply. m is the
 * meta ts_push_rx_meta saw, now handed over by ts_conn: freed here, on every path. */
void ts_push_rx_handle(ts_session_t *s, Tessera__Push *m, bool discarded) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  bool active = rx->active && !discarded;
  rx->active = false;
  rx->m = NULL;
  ts_push_rx_give_back(srv, rx);
  if (!active) {
    ts_session_reply_error(
        s, TS_MSG_PUSH, m->request_id, rx->refuse_code ? rx->refuse_code : TS_ENOMEM,
        rx->refuse_msg[0] ? rx->refuse_msg : "out of memory for the push payload");
    goto out;
  }
  if (rx->refused) {
    char detail[512];
    srv->nonfinite++;
    if (rx->applied_slices == 0)
      ts_errmsg_printf(detail, sizeof detail, "%s; the push was refused and no parameter changed",
               rx->refused_detail);
    else
      ts_errmsg_printf(detail, sizeof detail,
               "%s; %llu of %zu partitions were refused, the others %s (a push is checked one "
               "piece of up to %zu bytes at a time)",
               rx->refused_detail, (unsigned long long)rx->refused, m->n_parts,
               st->mode == TS_MODE_SYNC ? "counted for the step" : "applied", srv->stage.buf_bytes);
    ts_session_reply_error(s, TS_MSG_PUSH, m->request_id, TS_ENONFINITE, detail);
  }
  if (rx->duplicates) {
    srv->metrics.push_duplicates++;
    ts_session_log(s, TS_LOG_INFO,
                   "%s: task %d's push %llu (client %016llx) was already applied to %llu of its "
                   "%zu partitions: not applied again (a retry)",
                   s->conn.peer, s->task, (unsigned long long)m->push_id,
                   (unsigned long long)m->client_incarnation, (unsigned long long)rx->duplicates,
                   m->n_parts);
  }
  bool assign = m->kind != TESSERA__PUSH_KIND__PUSH_KIND_GRADIENT;
  if (assign) {
    uint64_t set = 0;
    for (size_t i = 0; i < m->n_parts; i++) set += rx->results[i] == TESSERA__PUSH_RESULT__PUSH_APPLIED;
    if (m->kind == TESSERA__PUSH_KIND__PUSH_KIND_ASSIGN_INITIAL)
      ts_log_info("%s: task %d set the initial values of %llu partition(s)%s", s->conn.peer,
                  s->task, (unsigned long long)set,
                  set && st->awaiting == 0 ? ": the model is ready" : "");
    else
      ts_log_notice("%s: task %d assigned new values to %llu partition(s) at version %llu%s",
                    s->conn.peer, s->task, (unsigned long long)set,
                    (unsigned long long)ts_store_min_version(st),
                    rx->stale ? " (others refused: their sync step is open)" : "");
  } else if (rx->stale) {
    ts_log_debug("task %d: %llu stale gradient partition(s) for step %llu dropped", s->task,
                 (unsigned long long)rx->stale, (unsigned long long)m->step);
    if (s->task >= 0 && (uint32_t)s->task < srv->num_workers)
      srv->workers[s->task].stale_dropped += rx->stale;
  }
  if (!assign && (rx->applied_slices > 0 || m->n_parts == 0)) {
    srv->pushes++;
    ts_barrier_pushed(&srv->barrier, s->task, m->step);
    if (s->task >= 0 && (uint32_t)s->task < srv->num_workers) {
      /* The worker finished step m->step: status shows it now, not at its next heartbeat. */
      srv->workers[s->task].step = m->step + 1;
      srv->workers[s->task].step_known = true;
    }
  }
  if (!rx->refused) {
    Tessera__PushReply r = TESSERA__PUSH_REPLY__INIT;
    r.request_id = m->request_id;
    r.n_results = m->n_parts;
    r.results = rx->results;
    r.stale_dropped = rx->stale;
    /* From the push's meta to its reply: the pieces were applied (the optimizer work)
     * while the payload arrived, so that is all in. */
    if (ts_session_reply(s, TS_MSG_PUSH_REPLY, &r.base) == 0)
      ts_prom_hist_observe(&srv->metrics.push_duration,
                           (double)(uv_hrtime() - rx->start_ns) * 1e-9);
  }
  if (st->mode == TS_MODE_SYNC) ts_sync_check_barriers(srv, false);
  ts_waitq_serve(srv);
out:
  ts_msg_free(&m->base);
}

void ts_push_rx_close(ts_session_t *s) {
  ts_server_t *srv = s->srv;
  if (s->rx.held_on) {
    unhold(srv, s);
    ts_waitq_serve(srv); /* pulls that waited behind its push go on */
  }
  s->rx.active = false;
  ts_push_rx_give_back(srv, &s->rx);
  rx_free(&s->rx);
}

/* Pushes waiting for a staging buffer (the pool is exhausted). */
static size_t stage_waiters(const ts_stage_t *st) {
  size_t n = 0;
  for (const ts_stage_waiter_t *w = st->head; w; w = w->next) n++;
  return n;
}

/* A holder of a staging buffer is judged by the floor of server.push_min_bytes_per_s over
 * each server.push_rate_window_s. While other pushes wait for a buffer, the pool is the
 * scarce thing and the fair share is higher: a holder must fill its buffer at
 * server.push_contended_min_bytes_per_s, judged after min(1 s, the window), or it is
 * dropped and its buffer goes to the first push in line. Without that, tricklers each just
 * above the floor would hold every buffer for a whole piece and keep good pushes waiting
 * for as long (the pool is small by design: a few buffers for every connection). */
#define CONTENDED_SPAN_MS 1000

void ts_push_rx_drop_slow(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms) {
  const ts_config_t *cfg = srv->cfg;
  uint64_t floor_rate = cfg->push_min_bytes_per_s > 0 ? (uint64_t)cfg->push_min_bytes_per_s : 0;
  uint64_t window_ms = (uint64_t)(cfg->push_rate_window_s * 1000.0);
  size_t waiting = srv->stage.head ? stage_waiters(&srv->stage) : 0;
  bool contended = waiting > 0 && (uint64_t)cfg->push_contended_min_bytes_per_s > floor_rate;
  if (floor_rate == 0 && !contended) return;
  for (ts_session_t *s = srv->sessions; s; s = s->next) {
    ts_push_rx_t *rx = &s->rx;
    if (!rx->buf || s->conn.closing) continue;
    if (!s->conn.reading) {
      /* Held back by the shard (a pull reply being written, its own replies unread): the
       * time is not the peer's. The write stall and reply budgets see to the latter. */
      rx->rate_ms = now_ms;
      rx->rate_bytes = s->conn.bytes_in;
      continue;
    }
    /* The loop did not run for late_ms (this tick is that late): nothing was read, so that
     * time is not the peer's. It is taken out of the window rather than restarting it, so
     * a shard that lags every second still judges a trickler over the time it did read;
     * the bytes the peer sent meanwhile are read after this tick and count in the window. */
    rx->rate_ms = rx->rate_ms + late_ms < now_ms ? rx->rate_ms + late_ms : now_ms;
    uint64_t span = now_ms - rx->rate_ms;
    uint64_t got = s->conn.bytes_in - rx->rate_bytes;
    uint64_t contended_span = window_ms < CONTENDED_SPAN_MS ? window_ms : CONTENDED_SPAN_MS;
    if (contended && span >= contended_span &&
        (double)got < (double)cfg->push_contended_min_bytes_per_s * (double)span / 1000.0) {
      ts_log_warn("%s: its push holds a staging buffer while %zu push(es) wait for one, but "
                  "sent %llu bytes in %.1f s, slower than "
                  "server.push_contended_min_bytes_per_s (%lld): closing",
                  s->conn.peer, waiting, (unsigned long long)got, (double)span / 1000.0,
                  (long long)cfg->push_contended_min_bytes_per_s);
      srv->metrics.limit_drops[TS_METRICS_LIMIT_PUSH_CONTENDED]++;
      ts_conn_close(&s->conn, TS_ETIMEDOUT); /* its buffer goes to the first in line */
      continue;
    }
    if (floor_rate == 0 || span < window_ms) continue;
    if ((double)got >= (double)floor_rate * (double)span / 1000.0) {
      rx->rate_ms = now_ms;
      rx->rate_bytes = s->conn.bytes_in;
      continue;
    }
    ts_log_warn("%s: its push holds a staging buffer but sent %llu bytes in %.1f s, slower "
                "than server.push_min_bytes_per_s (%lld): closing",
                s->conn.peer, (unsigned long long)got, (double)span / 1000.0,
                (long long)cfg->push_min_bytes_per_s);
    srv->metrics.limit_drops[TS_METRICS_LIMIT_PUSH_RATE]++;
    ts_conn_close(&s->conn, TS_ETIMEDOUT);
  }
}
