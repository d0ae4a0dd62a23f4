#include "ts_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ts_admin.h"
#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_auth.h"
#include "ts_barrier.h"
#include "ts_build_config.h"
#include "ts_checkpoint.h"
#include "ts_conn.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_metrics.h"
#include "ts_notify.h"
#include "ts_stage.h"

#define NONCE_LEN TS_AUTH_NONCE_LEN
#define TICK_MS 100

typedef struct ts_session ts_session_t;

typedef struct pull_wait {
  struct pull_wait *next;
  ts_session_t *sess;
  Tessera__Pull *msg;
  uint64_t deadline_ms;
  uint64_t start_ns;    /* when the request arrived, for the latency histogram */
} pull_wait_t;

/* What a worker last told us, for status; its liveness is srv->barrier's. */
typedef struct {
  uint64_t step;
  double loss, examples_per_sec, progress;
  uint64_t stale_dropped;
  char identity[128];
} worker_info_t;

/* A push is received piece by piece (docs/architecture.md, "Pushes"): its
 * partitions are grouped into pieces of at most one staging buffer, each piece is read into
 * the buffer, checked and applied, and the buffer is reused for the next piece. */
typedef struct {
  bool active;                  /* between push_meta and handle_push */
  const Tessera__Push *m;       /* its meta (the connection's until on_frame) */
  ts_stage_waiter_t wait;       /* queued for a staging buffer */
  float *buf;                   /* the staging buffer, while active */
  size_t *first;                /* piece k holds slices [first[k], first[k + 1]) */
  size_t cap;                   /* entries of first */
  size_t npieces;
  uv_buf_t *iov;                /* the payload in chunks (a piece is one or more) */
  size_t *chunk_off;            /* chunk k lands at buf + chunk_off[k] (floats) */
  size_t *chunk_piece;          /* and belongs to that piece */
  size_t chunk_cap, off_cap, piece_cap, nchunks;
  bool piece_bad;               /* a chunk of the piece being read holds NaN or Inf */
  size_t piece;                 /* the piece being applied */
  size_t next;                  /* next slice of it to apply (a piece is checked whole first) */
  size_t next_off;              /* its offset in buf, in floats */
  ts_spart_t *held_on;          /* async: partition whose pull replies it waits for */
  ts_session_t *held_next;      /* srv->held list */
  Tessera__PushResult *results; /* one per slice */
  size_t results_cap;
  uint64_t stale, refused, applied_slices;
  char refused_detail[256];     /* the first refused piece */
  int refuse_code;              /* refused whole at the meta (payload discarded) */
  char refuse_msg[256];
} push_rx_t;

struct ts_session {
  ts_conn_t conn;
  ts_server_t *srv;
  uint64_t id;          /* unique per server: replies after background work find it by id */
  ts_session_t *prev, *next;
  bool handshaken;
  Tessera__Role role;
  int task;
  uint8_t nonce[NONCE_LEN];
  int pending_writes;   /* pull replies in flight (they hold partition writers) */
  push_rx_t rx;         /* the push being received */
};

struct ts_server {
  uv_loop_t *loop;
  const ts_config_t *cfg;
  uint32_t shard;
  uv_tcp_t listener;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint;
  int open_handles;
  bool stopping;

  ts_store_t store;
  ts_stage_t stage;          /* staging buffers for push payloads (ts_stage.h) */
  ts_session_t *held;        /* sessions whose push waits for pull replies to be written */
  ts_session_t *sessions;
  size_t num_sessions;
  pull_wait_t *waiting;
  worker_info_t *workers;
  uint32_t num_workers;
  ts_barrier_t barrier;      /* membership, liveness and the rules of who is waited for */

  char *token, *admin_token;
  uint64_t started_ms;

  uint64_t pushes, pulls, rejected_frames, errors, nonfinite, auth_failures;
  uint64_t activity, activity_seen; /* frames and push chunks read, for busy-polling */
  char address[128];
  uint64_t incarnation;
  uint64_t next_session_id;

  /* checkpoints */
  uv_timer_t ckpt_timer;
  bool ckpt_busy;            /* a snapshot is being written */
  bool stop_after_ckpt;      /* a shutdown waits for it */
  uint64_t ckpt_seq;         /* sequence of the newest checkpoint on disk */
  uint64_t ckpt_applied;     /* store.applied when the last one was taken */
  char last_ckpt[600];
  uint64_t last_ckpt_ms;     /* loop time of the last checkpoint written or restored */
  bool have_ckpt;
  uint64_t ckpts_written, ckpt_failures, restored_step;
  bool served_pull;          /* the first pull was answered (logged once, with the delay) */

  /* Admin endpoint, metrics and systemd notification (ts_admin.h, ts_metrics.h). */
  ts_metrics_t metrics;
  ts_metrics_req_t cur_req;   /* kind of the request being handled, for refusal counts */
  uint64_t cur_start_ns;      /* when it arrived */
  ts_admin_t *admin;          /* NULL without cluster.ps_http */
  bool notify;                /* under systemd with a notify socket */
  uint64_t next_publish_ms, next_status_ms, watchdog_ms, next_watchdog_ms;
  char notify_status[160];
};

static const ts_conn_cbs_t session_cbs;

static uint64_t now_ms(ts_server_t *srv) { return uv_now(srv->loop); }

/* --- replies ------------------------------------------------------------------------ */

static void reply_error(ts_session_t *s, uint64_t request_id, int code, const char *detail) {
  s->srv->errors++;
  ts_metrics_refused(&s->srv->metrics, s->srv->cur_req, code);
  ts_log_info("%s: request %llu refused: %s: %s", s->conn.peer, (unsigned long long)request_id,
              ts_err_name(code), detail);
  ts_conn_send_error(&s->conn, request_id, code, detail);
}

/* Counted as a rejected frame when the connection closes (on_session_close). */
static void protocol_error(ts_session_t *s, uint64_t request_id, int code, const char *detail) {
  ts_log_warn("%s: protocol violation, closing connection: %s", s->conn.peer, detail);
  ts_conn_fail(&s->conn, request_id, code, detail);
}

/* --- workers and barriers ----------------------------------------------------------- */

static void serve_waiting(ts_server_t *srv);

static void check_barriers(ts_server_t *srv, bool timeouts) {
  if (srv->store.mode != TS_MODE_SYNC || !srv->store.declared) return;
  uint64_t now = now_ms(srv);
  bool moved = false;
  for (size_t i = 0; i < srv->store.num_parts; i++) {
    ts_spart_t *p = &srv->store.parts[i];
    uint32_t have = ts_store_sync_count(p);
    if (have == 0 || p->apply_pending) continue;
    ts_barrier_verdict_t v =
        ts_barrier_check(&srv->barrier, p->contributed, have, p->opened_ms, now, timeouts);
    if (v == TS_BARRIER_WAIT) continue;
    if (v == TS_BARRIER_TIMEOUT) {
      uint32_t need = ts_barrier_required(&srv->barrier, p->contributed);
      char missing[256] = "";
      size_t len = 0;
      for (uint32_t t = 0; t < srv->num_workers && len < sizeof missing - 8; t++)
        if (!p->contributed[t])
          len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%u", len ? "," : "", t);
      ts_log_warn("sync barrier of '%s' part %u version %llu proceeds after %.1f s with %u of %u "
                  "gradients; missing tasks [%s]",
                  srv->store.tensors[p->plan->tensor].name, p->plan->part,
                  (unsigned long long)p->version, srv->cfg->sync_timeout_s, have, need,
                  missing);
    }
    ts_prom_hist_observe(&srv->metrics.barrier_wait, (double)(now - p->opened_ms) / 1000.0);
    moved |= ts_store_sync_complete(&srv->store, p);
  }
  if (moved) serve_waiting(srv);
}

static void worker_seen(ts_server_t *srv, int task) {
  if (ts_barrier_heard(&srv->barrier, task, now_ms(srv)))
    ts_log_notice("worker %d is alive again", task);
}

/* --- pulls -------------------------------------------------------------------------- */

typedef struct {
  ts_server_t *srv;
  ts_session_t *sess;
  size_t n;
  ts_spart_t *parts[];
} pull_write_t;

static void wake_held(ts_server_t *srv);

/* Partitions [first, first + n) of a pull reply are out (or cancelled): updates waiting for
 * them may run now, while the rest of the reply is still being written. */
static void on_pull_written(ts_conn_t *c, void *arg, unsigned first, unsigned n, bool last,
                            int err) {
  (void)c;
  (void)err;
  pull_write_t *pw = arg;
  ts_server_t *srv = pw->srv;
  bool moved = false, freed = false;
  for (size_t i = first; i < (size_t)first + n && i < pw->n; i++) {
    moved |= ts_store_writer_done(&srv->store, pw->parts[i]);
    freed |= pw->parts[i]->writers == 0 && pw->parts[i]->held_pushes > 0;
  }
  if (last) {
    pw->sess->pending_writes--;
    ts_free(pw);
  }
  if (freed) wake_held(srv);
  if (moved || freed) serve_waiting(srv);
}

/* 1 when the pull can be answered now, 0 when it must wait. */
static int pull_ready(ts_server_t *srv, const Tessera__Pull *m) {
  ts_store_t *st = &srv->store;
  for (size_t i = 0; i < m->n_parts; i++) {
    ts_spart_t *p = ts_store_find(st, m->parts[i]->tensor, m->parts[i]->part);
    if (p->apply_pending || p->held_pushes > 0) return 0;
    if (p->version < m->min_version) return 0;
  }
  if (st->mode == TS_MODE_SSP && !ts_barrier_ssp_ready(&srv->barrier, m->clock)) return 0;
  return 1;
}

static void send_pull(ts_session_t *s, const Tessera__Pull *m) {
  ts_server_t *srv = s->srv;
  size_t n = m->n_parts;
  pull_write_t *pw = ts_malloc(sizeof *pw + n * sizeof(ts_spart_t *));
  Tessera__PartSlice *slices = ts_calloc(n ? n : 1, sizeof *slices);
  Tessera__PartSlice **ptrs = ts_calloc(n ? n : 1, sizeof *ptrs);
  uv_buf_t *bufs = ts_calloc(n ? n : 1, sizeof *bufs);
  if (!pw || !slices || !ptrs || !bufs) {
    reply_error(s, m->request_id, TS_ENOMEM, "out of memory for a pull reply");
    goto done;
  }
  pw->srv = srv;
  pw->sess = s;
  pw->n = n;
  for (size_t i = 0; i < n; i++) {
    ts_spart_t *p = ts_store_find(&srv->store, m->parts[i]->tensor, m->parts[i]->part);
    tessera__part_slice__init(&slices[i]);
    slices[i].tensor = m->parts[i]->tensor;
    slices[i].part = m->parts[i]->part;
    slices[i].count = p->plan->count;
    slices[i].version = p->version;
    ptrs[i] = &slices[i];
    bufs[i] = uv_buf_init((char *)p->w, (unsigned)(p->plan->count * sizeof(float)));
    pw->parts[i] = p;
  }
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.request_id = m->request_id;
  r.n_parts = n;
  r.parts = ptrs;
  /* Partitions are written straight from parameter memory: mark them as being read so no
   * update lands while the reply is on its way. */
  for (size_t i = 0; i < n; i++) pw->parts[i]->writers++;
  s->pending_writes++;
  int rc = ts_conn_send_parts(&s->conn, TS_MSG_PULL_REPLY, &r.base, bufs, (unsigned)n,
                              on_pull_written, pw);
  if (rc < 0) {
    for (size_t i = 0; i < n; i++) ts_store_writer_done(&srv->store, pw->parts[i]);
    s->pending_writes--;
    ts_free(pw);
  } else {
    srv->pulls++;
    if (!srv->served_pull) {
      srv->served_pull = true;
      ts_log_info("first pull served %llu ms after start%s",
                  (unsigned long long)(now_ms(srv) - srv->started_ms),
                  srv->restored_step ? " (restored from a checkpoint)" : "");
    }
  }
  pw = NULL;
done:
  ts_free(pw);
  ts_free(slices);
  ts_free(ptrs);
  ts_free(bufs);
}

static void park_pull(ts_session_t *s, Tessera__Pull *m) {
  ts_server_t *srv = s->srv;
  pull_wait_t *w = ts_malloc(sizeof *w);
  if (!w) {
    reply_error(s, m->request_id, TS_ENOMEM, "out of memory for a waiting pull");
    ts_msg_free(&m->base);
    return;
  }
  uint64_t timeout = m->timeout_ms ? m->timeout_ms : (uint64_t)(srv->cfg->sync_timeout_s * 3000.0);
  if (timeout < 1000) timeout = 1000;
  w->sess = s;
  w->msg = m;
  w->deadline_ms = now_ms(srv) + timeout;
  w->start_ns = srv->cur_start_ns;
  w->next = srv->waiting;
  srv->waiting = w;
}

/* Answer every parked pull that can be answered; time out those past their deadline. */
static void serve_waiting(ts_server_t *srv) {
  uint64_t now = now_ms(srv);
  pull_wait_t **pp = &srv->waiting;
  while (*pp) {
    pull_wait_t *w = *pp;
    if (pull_ready(srv, w->msg)) {
      *pp = w->next;
      send_pull(w->sess, w->msg);
      ts_prom_hist_observe(&srv->metrics.pull_duration, (double)(uv_hrtime() - w->start_ns) * 1e-9);
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else if (now >= w->deadline_ms) {
      *pp = w->next;
      char detail[256];
      snprintf(detail, sizeof detail,
               "pull waited too long: wanted version %llu (clock %llu), shard %u is at version %llu",
               (unsigned long long)w->msg->min_version, (unsigned long long)w->msg->clock,
               srv->shard, (unsigned long long)ts_store_min_version(&srv->store));
      srv->cur_req = TS_METRICS_REQ_PULL;
      reply_error(w->sess, w->msg->request_id, TS_ETIMEDOUT, detail);
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else {
      pp = &w->next;
    }
  }
}

static void drop_waiting_of(ts_server_t *srv, ts_session_t *s) {
  pull_wait_t **pp = &srv->waiting;
  while (*pp) {
    pull_wait_t *w = *pp;
    if (w->sess == s) {
      *pp = w->next;
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else {
      pp = &w->next;
    }
  }
}

static void handle_pull(ts_session_t *s, Tessera__Pull *m) {
  char err[256];
  int rc = ts_store_check_slices(&s->srv->store, m->parts, m->n_parts, err, sizeof err);
  if (rc < 0) {
    reply_error(s, m->request_id, rc, err);
    ts_msg_free(&m->base);
    return;
  }
  if (pull_ready(s->srv, m)) {
    send_pull(s, m);
    ts_prom_hist_observe(&s->srv->metrics.pull_duration,
                         (double)(uv_hrtime() - s->srv->cur_start_ns) * 1e-9);
    ts_msg_free(&m->base);
  } else {
    park_pull(s, m);
  }
}

/* --- pushes ------------------------------------------------------------------------- */

/* Staging buffers hold the largest partition of the shard, and at least this much, so the
 * push of a small model stays a single piece (checked and applied as a whole). */
#define STAGE_MIN_BYTES (1u << 20)
/* Memory the staging pool may take (more only when two buffers need more). */
#define STAGE_BUDGET_BYTES (16u << 20)
/* A piece is read in chunks of this many floats (256 KiB), each checked as it lands. */
#define CHUNK_FLOATS ((size_t)65536)

static int stage_ready(ts_server_t *srv) {
  if (srv->stage.buf_bytes) return 0;
  size_t largest = STAGE_MIN_BYTES;
  for (size_t i = 0; i < srv->store.num_parts; i++) {
    size_t bytes = srv->store.parts[i].plan->count * sizeof(float);
    if (bytes > largest) largest = bytes;
  }
  return ts_stage_init(&srv->stage, largest, STAGE_BUDGET_BYTES);
}

static void rx_point(push_rx_t *rx, float *buf) {
  rx->buf = buf;
  for (size_t k = 0; k < rx->nchunks; k++) rx->iov[k].base = (char *)(buf + rx->chunk_off[k]);
}

/* Give the session's staging buffer back; the next session queued for one gets it and
 * reads on. */
static void stage_give_back(ts_server_t *srv, push_rx_t *rx) {
  if (rx->wait.queued) ts_stage_cancel(&srv->stage, &rx->wait);
  if (!rx->buf) return;
  float *buf = rx->buf;
  rx->buf = NULL;
  ts_stage_waiter_t *w = ts_stage_release(&srv->stage, buf);
  if (w) {
    ts_session_t *next = (ts_session_t *)(void *)((char *)w - offsetof(ts_session_t, rx.wait));
    rx_point(&next->rx, w->buf);
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
static int rx_reserve(push_rx_t *rx, size_t n, size_t nchunks) {
  if (nchunks == 0) nchunks = 1;
  if (grow(&rx->first, &rx->cap, n + 1, sizeof *rx->first) < 0 ||
      grow(&rx->results, &rx->results_cap, n ? n : 1, sizeof *rx->results) < 0 ||
      grow(&rx->iov, &rx->chunk_cap, nchunks, sizeof *rx->iov) < 0 ||
      grow(&rx->chunk_off, &rx->off_cap, nchunks, sizeof *rx->chunk_off) < 0 ||
      grow(&rx->chunk_piece, &rx->piece_cap, nchunks, sizeof *rx->chunk_piece) < 0)
    return TS_ENOMEM;
  return 0;
}

static void rx_free(push_rx_t *rx) {
  ts_free(rx->first);
  ts_free(rx->results);
  ts_free(rx->iov);
  ts_free(rx->chunk_off);
  ts_free(rx->chunk_piece);
  memset(rx, 0, sizeof *rx);
}

static int push_refuse(push_rx_t *rx, int code, const char *msg) {
  rx->active = false;
  rx->refuse_code = code;
  if (msg) snprintf(rx->refuse_msg, sizeof rx->refuse_msg, "%s", msg);
  return 0; /* no destination: the payload is read and dropped, then handle_push replies */
}

/* A push's meta has arrived. Everything that can refuse the whole push is checked here,
 * before any of its payload is read: role, partitions and sizes, and in sync mode that no
 * partition is behind the step (versions only grow, so this stays true while the payload
 * arrives). Then the payload is cut into pieces of at most one staging buffer. */
static int push_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__Push *m,
                     const uv_buf_t **iov, unsigned *niov) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  push_rx_t *rx = &s->rx;
  rx->active = false;
  rx->refuse_code = 0;
  rx->refuse_msg[0] = '\0';
  if (s->role != TESSERA__ROLE__ROLE_WORKER)
    return push_refuse(rx, TS_EROLE, "only workers push gradients");
  int rc = ts_store_check_slices(st, m->parts, m->n_parts, rx->refuse_msg, sizeof rx->refuse_msg);
  if (rc < 0) return push_refuse(rx, rc, NULL);
  if (st->mode == TS_MODE_SYNC) {
    for (size_t i = 0; i < m->n_parts; i++) {
      ts_spart_t *p = ts_store_find(st, m->parts[i]->tensor, m->parts[i]->part);
      if (m->step > p->version) {
        snprintf(rx->refuse_msg, sizeof rx->refuse_msg,
                 "push for step %llu but '%s' part %u is at version %llu: pull first",
                 (unsigned long long)m->step, st->tensors[p->plan->tensor].name, p->plan->part,
                 (unsigned long long)p->version);
        return push_refuse(rx, TS_EFUTURE, NULL);
      }
    }
  }
  if (stage_ready(srv) < 0 ||
      rx_reserve(rx, m->n_parts, h->data_len / (CHUNK_FLOATS * sizeof(float)) + m->n_parts) < 0)
    return push_refuse(rx, TS_ENOMEM, "out of memory for the push payload");

  /* Pieces: runs of whole partitions that fit one buffer (each partition does), read in
   * chunks so each chunk is checked while it is still in the cache. */
  size_t cap = srv->stage.buf_bytes / sizeof(float), used = 0, np = 0, nc = 0;
  for (size_t i = 0; i <= m->n_parts; i++) {
    uint64_t count = i < m->n_parts ? m->parts[i]->count : 0;
    if (i == m->n_parts || i == 0 || used + count > cap) {
      for (size_t off = 0; np && off < used; off += CHUNK_FLOATS) {
        size_t len = used - off < CHUNK_FLOATS ? used - off : CHUNK_FLOATS;
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
  rx->stale = rx->refused = rx->applied_slices = 0;
  rx->refused_detail[0] = '\0';
  memset(rx->results, 0, m->n_parts * sizeof *rx->results);
  rx->m = m;
  rx->active = true;
  if (rx->nchunks == 0) return 0;

  float *buf;
  rc = ts_stage_acquire(&srv->stage, &rx->wait, &buf);
  if (rc < 0) return push_refuse(rx, TS_ENOMEM, "out of memory for the push payload");
  *iov = rx->iov;
  *niov = (unsigned)rx->nchunks;
  if (rc == 1) { /* stage_give_back points the pieces and resumes */
    srv->metrics.push_waits_staging++;
    return TS_CONN_HOLD;
  }
  rx_point(rx, buf);
  return 0;
}

/* Apply the piece in the staging buffer, from slice rx->next on; fresh: the piece has just
 * landed (its chunks were checked as they came: rx->piece_bad). A piece with a non-finite
 * value is refused whole. Returns TS_CONN_HOLD when an async update has to wait for a pull
 * reply being written from its partition (wake_held goes on from there). */
static int push_piece(ts_session_t *s, bool fresh) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  push_rx_t *rx = &s->rx;
  const Tessera__Push *m = rx->m;
  size_t a = rx->first[rx->piece], b = rx->first[rx->piece + 1];
  bool sync = st->mode == TS_MODE_SYNC;
  uint64_t now = now_ms(srv);
  if (fresh && rx->piece_bad) {
    /* Name the first bad partition (the error path only: a second pass is fine). */
    const float *g = rx->buf;
    for (size_t i = a; i < b; i++) {
      uint64_t count = m->parts[i]->count;
      if (!ts_optim_all_finite(g, count)) {
        if (!rx->refused_detail[0])
          snprintf(rx->refused_detail, sizeof rx->refused_detail,
                   "gradient of '%s' part %u contains NaN or Inf", st->tensors[m->parts[i]->tensor].name,
                   m->parts[i]->part);
        rx->refused += b - a;
        /* In sync mode the worker was heard from for this step: its barrier does not wait. */
        for (size_t k = a; sync && k < b; k++)
          ts_store_sync_skip(st, ts_store_find(st, m->parts[k]->tensor, m->parts[k]->part),
                             s->task, m->step, now);
        break;
      }
      g += count;
    }
    rx->next = b;
    return 0;
  }
  const float *g = rx->buf + rx->next_off;
  for (size_t i = rx->next; i < b; i++) {
    ts_spart_t *p = ts_store_find(st, m->parts[i]->tensor, m->parts[i]->part);
    Tessera__PushResult r = TESSERA__PUSH_RESULT__PUSH_APPLIED;
    if (sync) {
      r = ts_store_sync_push(st, p, g, s->task, m->step, now,
                             ts_barrier_required(&srv->barrier, p->contributed));
      if (r == TESSERA__PUSH_RESULT__PUSH_STALE) rx->stale++;
      if (r == TESSERA__PUSH_RESULT__PUSH_APPLIED) /* a barrier that this gradient closed */
        ts_prom_hist_observe(&srv->metrics.barrier_wait, 0.0);
    } else if (!ts_store_async_push(st, p, g)) {
      /* A pull reply is being written from p: keep the piece and wait for it. */
      rx->next = i;
      rx->next_off = (size_t)(g - rx->buf);
      rx->held_on = p;
      p->held_pushes++;
      srv->metrics.push_waits_reply++;
      rx->held_next = srv->held;
      srv->held = s;
      return TS_CONN_HOLD;
    }
    rx->results[i] = r;
    if ((unsigned)r < 4) srv->metrics.push_parts[r]++;
    rx->applied_slices++;
    g += p->plan->count;
  }
  rx->next = b;
  return 0;
}

/* Chunk i of the payload has landed: check it now, while it is in the cache; apply its
 * piece once the piece's last chunk is in. */
/* A piece has been applied and more of the push follow. When other connections wait for a
 * staging buffer, hand ours to the first of them and queue for the next one: concurrent
 * pushes then take turns piece by piece, and a waiting worker is not kept from reading (its
 * heartbeats included) for the whole of a large push. Returns 0 (go on reading into
 * rx->buf), TS_CONN_HOLD (queued) or a negative code. */
static int take_turns(ts_session_t *s) {
  ts_server_t *srv = s->srv;
  push_rx_t *rx = &s->rx;
  if (rx->piece + 1 >= rx->npieces || !srv->stage.head) return 0;
  stage_give_back(srv, rx);
  float *buf;
  int rc = ts_stage_acquire(&srv->stage, &rx->wait, &buf);
  if (rc < 0) return rc;
  if (rc == 1) {
    srv->metrics.push_waits_staging++;
    return TS_CONN_HOLD; /* stage_give_back points the rest of the push and resumes */
  }
  rx_point(rx, buf);
  return 0;
}

static int on_piece(ts_conn_t *c, unsigned i) {
  ts_session_t *s = c->data;
  push_rx_t *rx = &s->rx;
  s->srv->activity++;
  if (!rx->active || i >= rx->nchunks) return 0;
  size_t piece = rx->chunk_piece[i];
  if (rx->chunk_off[i] == 0) {
    rx->piece = piece;
    rx->next = rx->first[piece];
    rx->next_off = 0;
    rx->piece_bad = false;
  }
  if (!rx->piece_bad)
    rx->piece_bad = !ts_optim_all_finite(rx->buf + rx->chunk_off[i], rx->iov[i].len / sizeof(float));
  if (i + 1 < rx->nchunks && rx->chunk_piece[i + 1] == piece) return 0;
  int rc = push_piece(s, true);
  return rc == 0 ? take_turns(s) : rc;
}

/* Pull replies finished writing from some partitions: go on with the pushes that waited.
 * A partition keeps counting a held push until that push has been applied, so pulls served
 * meanwhile (a resumed push can complete its frame and serve parked pulls) never overtake a
 * held update. */
static void wake_held(ts_server_t *srv) {
  ts_session_t *ready = NULL, **tail = &ready;
  for (ts_session_t **pp = &srv->held; *pp;) {
    ts_session_t *s = *pp;
    if (s->rx.held_on->writers > 0) {
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
    was->held_pushes--;
    if (rc == 0 && !s->conn.closing && s->rx.active) rc = take_turns(s);
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
  s->rx.held_on->held_pushes--;
  s->rx.held_on = NULL;
  s->rx.held_next = NULL;
}

/* The whole push has been read (and its pieces applied as they landed): reply. */
static void handle_push(ts_session_t *s, Tessera__Push *m, bool discarded) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  push_rx_t *rx = &s->rx;
  bool active = rx->active && !discarded;
  rx->active = false;
  rx->m = NULL;
  stage_give_back(srv, rx);
  if (!active) {
    reply_error(s, m->request_id, rx->refuse_code ? rx->refuse_code : TS_ENOMEM,
                rx->refuse_msg[0] ? rx->refuse_msg : "out of memory for the push payload");
    goto out;
  }
  if (rx->refused) {
    char detail[512];
    srv->nonfinite++;
    if (rx->applied_slices == 0)
      snprintf(detail, sizeof detail, "%s; the push was refused and no parameter changed",
               rx->refused_detail);
    else
      snprintf(detail, sizeof detail,
               "%s; %llu of %zu partitions were refused, the others %s (a push is checked one "
               "piece of up to %zu bytes at a time)",
               rx->refused_detail, (unsigned long long)rx->refused, m->n_parts,
               st->mode == TS_MODE_SYNC ? "counted for the step" : "applied",
               srv->stage.buf_bytes);
    reply_error(s, m->request_id, TS_ENONFINITE, detail);
  }
  if (rx->stale) {
    ts_log_debug("task %d: %llu stale gradient partition(s) for step %llu dropped", s->task,
                 (unsigned long long)rx->stale, (unsigned long long)m->step);
    if (s->task >= 0 && (uint32_t)s->task < srv->num_workers)
      srv->workers[s->task].stale_dropped += rx->stale;
  }
  if (rx->applied_slices > 0 || m->n_parts == 0) {
    srv->pushes++;
    ts_barrier_pushed(&srv->barrier, s->task, m->step);
  }
  if (!rx->refused) {
    Tessera__PushReply r = TESSERA__PUSH_REPLY__INIT;
    r.request_id = m->request_id;
    r.n_results = m->n_parts;
    r.results = rx->results;
    r.stale_dropped = rx->stale;
    ts_conn_send(&s->conn, TS_MSG_PUSH_REPLY, &r.base, NULL, 0, NULL, NULL);
    ts_prom_hist_observe(&srv->metrics.push_duration,
                         (double)(uv_hrtime() - srv->cur_start_ns) * 1e-9);
  }
  if (st->mode == TS_MODE_SYNC) check_barriers(srv, false);
  serve_waiting(srv);
out:
  ts_msg_free(&m->base);
}

/* --- other requests ----------------------------------------------------------------- */

static void handle_declare(ts_session_t *s, Tessera__Declare *m) {
  ts_server_t *srv = s->srv;
  char err[256];
  bool created = false;
  if (s->role != TESSERA__ROLE__ROLE_WORKER) {
    reply_error(s, m->request_id, TS_EROLE, "only workers declare tensors");
    ts_msg_free(&m->base);
    return;
  }
  int rc = ts_store_declare(&srv->store, m, &created, err, sizeof err);
  if (rc < 0) {
    reply_error(s, m->request_id, rc, err);
    ts_msg_free(&m->base);
    return;
  }
  if (created)
    ts_log_info("model declared by task %d: %u tensors, %zu partitions here (%.1f MiB)", s->task,
                srv->store.num_tensors, srv->store.num_parts,
                (double)srv->store.bytes / (1024.0 * 1024.0));
  Tessera__DeclareReply r = TESSERA__DECLARE_REPLY__INIT;
  r.request_id = m->request_id;
  r.created = created;
  r.partitions = (uint32_t)srv->store.num_parts;
  r.bytes = srv->store.bytes;
  r.version = ts_store_min_version(&srv->store);
  ts_conn_send(&s->conn, TS_MSG_DECLARE_REPLY, &r.base, NULL, 0, NULL, NULL);
  ts_msg_free(&m->base);
}

static void handle_heartbeat(ts_session_t *s, Tessera__Heartbeat *m) {
  ts_server_t *srv = s->srv;
  if (s->role == TESSERA__ROLE__ROLE_WORKER && s->task >= 0 && (uint32_t)s->task < srv->num_workers) {
    worker_info_t *w = &srv->workers[s->task];
    w->step = m->step;
    w->loss = m->loss;
    w->examples_per_sec = m->examples_per_sec;
    w->progress = m->epoch_progress;
    if (m->done && ts_barrier_done(&srv->barrier, s->task)) {
      ts_log_info("worker %d finished at step %llu", s->task, (unsigned long long)m->step);
      check_barriers(srv, false);
      serve_waiting(srv);
    }
  }
  Tessera__HeartbeatReply r = TESSERA__HEARTBEAT_REPLY__INIT;
  r.request_id = m->request_id;
  r.step = ts_store_min_version(&srv->store);
  ts_conn_send(&s->conn, TS_MSG_HEARTBEAT_REPLY, &r.base, NULL, 0, NULL, NULL);
  ts_msg_free(&m->base);
}

/* A ShardStatus and the arrays it points into; built for STATUS requests and for the admin
 * endpoint's snapshot. */
typedef struct {
  Tessera__ShardStatus r;
  Tessera__WorkerStatus *ws;
  Tessera__WorkerStatus **wp;
  int32_t *waiting;
} status_msg_t;

static void status_release(status_msg_t *sm) {
  ts_free(sm->ws);
  ts_free(sm->wp);
  ts_free(sm->waiting);
}

/* Fill *sm with the shard's state now. Returns 0 or TS_ENOMEM; release it in both cases. */
static int status_build(ts_server_t *srv, status_msg_t *sm) {
  uint64_t now = now_ms(srv);
  uint32_t nw = srv->num_workers;
  memset(sm, 0, sizeof *sm);
  Tessera__WorkerStatus *ws = sm->ws = ts_calloc(nw ? nw : 1, sizeof *ws);
  Tessera__WorkerStatus **wp = sm->wp = ts_calloc(nw ? nw : 1, sizeof *wp);
  int32_t *waiting = sm->waiting = ts_calloc(nw ? nw : 1, sizeof *waiting);
  if (!ws || !wp || !waiting) return TS_ENOMEM;
  size_t n = 0, nwait = 0;
  for (uint32_t t = 0; t < nw; t++) {
    const worker_info_t *w = &srv->workers[t];
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
    wp[n] = &ws[n];
    n++;
  }
  /* The open barrier waits for the live workers that have not pushed for it yet. */
  if (srv->store.mode == TS_MODE_SYNC && srv->store.num_parts > 0) {
    const ts_spart_t *p = &srv->store.parts[0];
    for (size_t i = 1; i < srv->store.num_parts; i++)
      if (srv->store.parts[i].version < p->version) p = &srv->store.parts[i];
    if (ts_store_sync_count(p) > 0) nwait = ts_barrier_waiting_for(&srv->barrier, p->contributed, waiting);
  }
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
  return 0;
}

static void handle_status(ts_session_t *s, Tessera__Status *m) {
  status_msg_t sm;
  if (status_build(s->srv, &sm) < 0) {
    reply_error(s, m->request_id, TS_ENOMEM, "out of memory");
  } else {
    sm.r.request_id = m->request_id;
    ts_conn_send(&s->conn, TS_MSG_STATUS_REPLY, &sm.r.base, NULL, 0, NULL, NULL);
  }
  status_release(&sm);
  ts_msg_free(&m->base);
}

static int check_mac(const char *token, const uint8_t *nonce, const ProtobufCBinaryData *mac) {
  if (!token) return 0;
  return ts_auth_verify(token, nonce, NONCE_LEN, mac->data, mac->len);
}

static void handle_handshake(ts_session_t *s, Tessera__Handshake *m) {
  ts_server_t *srv = s->srv;
  char err[256];
  if (m->protocol != TS_PROTOCOL_VERSION) {
    snprintf(err, sizeof err, "client speaks protocol %u, this server %d", m->protocol,
             TS_PROTOCOL_VERSION);
    protocol_error(s, m->request_id, TS_EVERSION, err);
    goto out;
  }
  if (m->role != TESSERA__ROLE__ROLE_WORKER && m->role != TESSERA__ROLE__ROLE_ADMIN) {
    protocol_error(s, m->request_id, TS_EPROTO, "handshake names no valid role");
    goto out;
  }
  if (m->role == TESSERA__ROLE__ROLE_WORKER && (m->task < 0 || (uint32_t)m->task >= srv->num_workers)) {
    snprintf(err, sizeof err, "worker task %d is outside the job's %u workers (cluster.workers)",
             m->task, srv->num_workers);
    protocol_error(s, m->request_id, TS_EINVAL, err);
    goto out;
  }
  const char *token = m->role == TESSERA__ROLE__ROLE_ADMIN && srv->admin_token ? srv->admin_token
                                                                               : srv->token;
  if (check_mac(token, s->nonce, &m->mac) < 0) {
    srv->auth_failures++;
    srv->metrics.auth_failures++;
    snprintf(err, sizeof err, "authentication failed for %s role from %s",
             m->role == TESSERA__ROLE__ROLE_ADMIN ? "admin" : "worker", s->conn.peer);
    protocol_error(s, m->request_id, TS_EAUTH, err);
    goto out;
  }
  s->handshaken = true;
  s->role = m->role;
  s->task = m->role == TESSERA__ROLE__ROLE_WORKER ? m->task : -1;
  if (s->role == TESSERA__ROLE__ROLE_WORKER) {
    worker_info_t *w = &srv->workers[s->task];
    bool first = ts_barrier_join(&srv->barrier, s->task, now_ms(srv));
    snprintf(w->identity, sizeof w->identity, "%s", m->identity ? m->identity : "");
    worker_seen(srv, s->task);
    ts_log_info("worker %d %s from %s (%s)", s->task, first ? "joined" : "reconnected",
                s->conn.peer, w->identity);
  } else {
    ts_log_debug("admin client from %s", s->conn.peer);
  }
  Tessera__HandshakeReply r = TESSERA__HANDSHAKE_REPLY__INIT;
  r.request_id = m->request_id;
  r.shard = srv->shard;
  r.num_shards = (uint32_t)srv->cfg->num_ps;
  r.mode = ts_store_wire_mode(srv->store.mode);
  r.partition_bytes = (uint64_t)srv->cfg->partition_bytes;
  r.num_workers = srv->num_workers;
  ts_conn_send(&s->conn, TS_MSG_HANDSHAKE_REPLY, &r.base, NULL, 0, NULL, NULL);
out:
  ts_msg_free(&m->base);
}

/* --- checkpoints ---------------------------------------------------------------------- */

typedef enum { CKPT_TIMER, CKPT_ADMIN, CKPT_SHUTDOWN, CKPT_SIGNAL } ckpt_kind_t;

typedef struct {
  uv_work_t req;
  ts_server_t *srv;
  ts_ckpt_snapshot_t *snap;
  ckpt_kind_t kind;
  uint64_t session_id, request_id;
  int rc;
  char path[600];
  char err[512];
  uint64_t bytes;
  double seconds;
} ckpt_job_t;

static ts_session_t *find_session(ts_server_t *srv, uint64_t id) {
  for (ts_session_t *s = srv->sessions; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

static void ckpt_work(uv_work_t *req) {
  ckpt_job_t *j = req->data;
  const ts_config_t *cfg = j->srv->cfg;
  uint64_t t0 = uv_hrtime();
  j->rc = ts_checkpoint_write(j->snap, cfg->checkpoint_dir, cfg->checkpoint_keep, j->path,
                              sizeof j->path, &j->bytes, j->err, sizeof j->err);
  j->seconds = (double)(uv_hrtime() - t0) / 1e9;
}

static void ckpt_done(uv_work_t *req, int status) {
  ckpt_job_t *j = req->data;
  ts_server_t *srv = j->srv;
  srv->ckpt_busy = false;
  if (status < 0 && j->rc == 0) {
    j->rc = status;
    snprintf(j->err, sizeof j->err, "checkpoint cancelled: %s", uv_strerror(status));
  }
  uint64_t step = ts_checkpoint_snapshot_step(j->snap);
  if (j->rc == 0) {
    srv->ckpts_written++;
    srv->metrics.checkpoints_ok++;
    ts_prom_hist_observe(&srv->metrics.checkpoint_duration, j->seconds);
    srv->metrics.checkpoint_last_success_unix = (double)time(NULL);
    srv->have_ckpt = true;
    srv->last_ckpt_ms = now_ms(srv);
    snprintf(srv->last_ckpt, sizeof srv->last_ckpt, "%s", j->path);
    ts_log_info("checkpoint written: %s (step %llu, %.1f MiB, %.0f ms)", j->path,
                (unsigned long long)step, (double)j->bytes / (1024.0 * 1024.0), j->seconds * 1000.0);
  } else {
    srv->ckpt_failures++;
    srv->metrics.checkpoints_failed++;
    ts_log_err("checkpoint failed: %s", j->err);
  }
  ts_session_t *s = j->session_id ? find_session(srv, j->session_id) : NULL;
  if (s && j->kind == CKPT_ADMIN) {
    if (j->rc == 0) {
      Tessera__CheckpointReply r = TESSERA__CHECKPOINT_REPLY__INIT;
      r.request_id = j->request_id;
      r.path = j->path;
      r.step = step;
      r.bytes = j->bytes;
      r.seconds = j->seconds;
      ts_conn_send(&s->conn, TS_MSG_CHECKPOINT_REPLY, &r.base, NULL, 0, NULL, NULL);
    } else {
      reply_error(s, j->request_id, j->rc < 0 && ts_err_is_ts(j->rc) ? j->rc : TS_EINTERNAL, j->err);
    }
  }
  if (s && j->kind == CKPT_SHUTDOWN) {
    Tessera__ShutdownReply r = TESSERA__SHUTDOWN_REPLY__INIT;
    r.request_id = j->request_id;
    r.checkpoint_path = j->rc == 0 ? j->path : (char *)"";
    ts_conn_send(&s->conn, TS_MSG_SHUTDOWN_REPLY, &r.base, NULL, 0, NULL, NULL);
  }
  ts_checkpoint_snapshot_free(j->snap);
  bool stop = j->kind == CKPT_SHUTDOWN || j->kind == CKPT_SIGNAL || srv->stop_after_ckpt;
  ts_free(j);
  if (stop) ts_server_stop(srv);
}

/* Take a snapshot now and write it in the thread pool. Returns 0 when started, else an
 * error (no directory, nothing declared, NaN parameters, busy) with errmsg. */
static int start_checkpoint(ts_server_t *srv, ckpt_kind_t kind, uint64_t session_id,
                            uint64_t request_id, char *errmsg, size_t errlen) {
  if (!srv->cfg->checkpoint_dir || !*srv->cfg->checkpoint_dir) {
    snprintf(errmsg, errlen, "checkpoint.dir is not set: this job keeps no checkpoints");
    return TS_ECONFIG;
  }
  if (srv->ckpt_busy) {
    snprintf(errmsg, errlen, "a checkpoint is being written; try again when it is done");
    return TS_EBUSY;
  }
  ts_ckpt_snapshot_t *snap = NULL;
  int rc = ts_checkpoint_snapshot(&srv->store, srv->ckpt_seq + 1, &snap, errmsg, errlen);
  if (rc < 0) return rc;
  ckpt_job_t *j = ts_calloc(1, sizeof *j);
  if (!j) {
    ts_checkpoint_snapshot_free(snap);
    snprintf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  j->req.data = j;
  j->srv = srv;
  j->snap = snap;
  j->kind = kind;
  j->session_id = session_id;
  j->request_id = request_id;
  rc = uv_queue_work(srv->loop, &j->req, ckpt_work, ckpt_done);
  if (rc < 0) {
    ts_checkpoint_snapshot_free(snap);
    ts_free(j);
    snprintf(errmsg, errlen, "cannot start the checkpoint: %s", uv_strerror(rc));
    return rc;
  }
  srv->ckpt_seq++;
  srv->ckpt_applied = srv->store.applied;
  srv->ckpt_busy = true;
  return 0;
}

static void on_ckpt_timer(uv_timer_t *t) {
  ts_server_t *srv = t->data;
  /* Only when something changed since the last one. */
  if (!srv->store.declared || srv->ckpt_busy || srv->store.applied == srv->ckpt_applied) return;
  char err[512];
  int rc = start_checkpoint(srv, CKPT_TIMER, 0, 0, err, sizeof err);
  if (rc < 0) {
    srv->ckpt_failures++;
    ts_log_err("periodic checkpoint skipped: %s", err);
  }
}

/* Admin requests that change the shard need the admin role, and when authentication is on,
 * an admin token. */
static bool admin_allowed(ts_session_t *s, uint64_t request_id, const char *what) {
  ts_server_t *srv = s->srv;
  char err[200];
  if (s->role != TESSERA__ROLE__ROLE_ADMIN) {
    snprintf(err, sizeof err, "%s needs the admin role (psctl)", what);
    reply_error(s, request_id, TS_EPERM, err);
    return false;
  }
  if (srv->token && !srv->admin_token) {
    snprintf(err, sizeof err,
             "%s needs an admin token: set auth.admin_token_file (the worker token is not enough)",
             what);
    reply_error(s, request_id, TS_EPERM, err);
    return false;
  }
  return true;
}

static void handle_checkpoint(ts_session_t *s, Tessera__Checkpoint *m) {
  char err[512];
  if (admin_allowed(s, m->request_id, "checkpoint")) {
    int rc = start_checkpoint(s->srv, CKPT_ADMIN, s->id, m->request_id, err, sizeof err);
    if (rc < 0) reply_error(s, m->request_id, ts_err_is_ts(rc) ? rc : TS_EINTERNAL, err);
  }
  ts_msg_free(&m->base);
}

static void handle_shutdown(ts_session_t *s, Tessera__Shutdown *m) {
  ts_server_t *srv = s->srv;
  char err[512];
  if (!admin_allowed(s, m->request_id, "shutdown")) goto out;
  ts_log_notice("shutdown requested by %s", s->conn.peer);
  if (m->checkpoint && srv->cfg->checkpoint_dir && *srv->cfg->checkpoint_dir && srv->store.declared) {
    if (srv->ckpt_busy) {
      srv->stop_after_ckpt = true;
    } else if (start_checkpoint(srv, CKPT_SHUTDOWN, s->id, m->request_id, err, sizeof err) == 0) {
      goto out; /* the reply and the stop follow the checkpoint */
    } else {
      ts_log_err("final checkpoint failed, stopping anyway: %s", err);
    }
  }
  Tessera__ShutdownReply r = TESSERA__SHUTDOWN_REPLY__INIT;
  r.request_id = m->request_id;
  r.checkpoint_path = (char *)"";
  ts_conn_send(&s->conn, TS_MSG_SHUTDOWN_REPLY, &r.base, NULL, 0, NULL, NULL);
  if (!srv->stop_after_ckpt) ts_server_stop(srv);
out:
  ts_msg_free(&m->base);
}

/* --- connection callbacks ----------------------------------------------------------- */

static int on_meta(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                   const uv_buf_t **iov, unsigned *niov) {
  ts_session_t *s = c->data;
  if (h->type == TS_MSG_PUSH && s->handshaken)
    return push_meta(s, h, (const Tessera__Push *)msg, iov, niov);
  return 0;
}

static void on_frame(ts_conn_t *c, const ts_frame_header_t *h, ProtobufCMessage *msg,
                     bool discarded) {
  ts_session_t *s = c->data;
  ts_server_t *srv = s->srv;
  srv->activity++;
  srv->cur_req = ts_metrics_req_of(h->type);
  srv->cur_start_ns = uv_hrtime();
  if (!s->handshaken) {
    if (h->type != TS_MSG_HANDSHAKE) {
      protocol_error(s, 0, TS_EPROTO, "the first frame must be a handshake");
      ts_msg_free(msg);
      return;
    }
    handle_handshake(s, (Tessera__Handshake *)msg);
    return;
  }
  worker_seen(srv, s->task);
  switch (h->type) {
    case TS_MSG_DECLARE:
      handle_declare(s, (Tessera__Declare *)msg);
      return;
    case TS_MSG_PULL:
      handle_pull(s, (Tessera__Pull *)msg);
      return;
    case TS_MSG_PUSH:
      handle_push(s, (Tessera__Push *)msg, discarded);
      return;
    case TS_MSG_HEARTBEAT:
      handle_heartbeat(s, (Tessera__Heartbeat *)msg);
      return;
    case TS_MSG_STATUS:
      handle_status(s, (Tessera__Status *)msg);
      return;
    case TS_MSG_CHECKPOINT:
      handle_checkpoint(s, (Tessera__Checkpoint *)msg);
      return;
    case TS_MSG_SHUTDOWN:
      handle_shutdown(s, (Tessera__Shutdown *)msg);
      return;
    default: {
      char err[128];
      snprintf(err, sizeof err, "a client may not send %s frames", ts_frame_type_name(h->type));
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

static void stop_tick_when_idle(ts_server_t *srv);

static void on_session_close(ts_conn_t *c, int err) {
  ts_session_t *s = c->data;
  ts_server_t *srv = s->srv;
  if (is_protocol_violation(err)) {
    srv->rejected_frames++;
    ts_metrics_rejected(&srv->metrics, err);
  }
  drop_waiting_of(srv, s);
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
      check_barriers(srv, false);
      serve_waiting(srv);
    }
  } else if (err != TS_ECLOSED && err != 0) {
    ts_log_debug("%s: connection closed: %s", c->peer, ts_strerror(err));
  }
  if (s->rx.held_on) {
    unhold(srv, s);
    serve_waiting(srv); /* pulls that waited behind its push go on */
  }
  s->rx.active = false;
  stage_give_back(srv, &s->rx);
  rx_free(&s->rx);
  ts_free(s);
  stop_tick_when_idle(srv);
}

static const ts_conn_cbs_t session_cbs = {
    .on_meta = on_meta,
    .on_frame = on_frame,
    .on_close = on_session_close,
    .on_piece = on_piece,
};

static void on_connection(uv_stream_t *listener, int status) {
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
  s->id = ++srv->next_session_id;
  uint64_t max_data = (uint64_t)srv->cfg->max_message_bytes;
  if (ts_conn_init(srv->loop, &s->conn, &session_cbs, max_data, s) < 0) {
    ts_free(s);
    return;
  }
  s->next = srv->sessions;
  if (s->next) s->next->prev = s;
  srv->sessions = s;
  srv->num_sessions++;
  if (uv_accept(listener, (uv_stream_t *)&s->conn.handle) < 0 || ts_conn_start(&s->conn) < 0) {
    ts_conn_close(&s->conn, TS_ECLOSED);
    return;
  }
  if (srv->num_sessions > (size_t)srv->cfg->max_connections) {
    ts_log_warn("%s: refused: %zu connections is the limit (server.max_connections)", s->conn.peer,
                (size_t)srv->cfg->max_connections);
    ts_conn_fail(&s->conn, 0, TS_EBUSY, "too many connections");
    return;
  }
  randombytes_buf(s->nonce, NONCE_LEN);
  char id[96];
  snprintf(id, sizeof id, "ps-server/%s shard %u", TS_VERSION, srv->shard);
  Tessera__Hello hello = TESSERA__HELLO__INIT;
  hello.protocol = TS_PROTOCOL_VERSION;
  hello.shard = srv->shard;
  hello.num_shards = (uint32_t)srv->cfg->num_ps;
  hello.nonce.data = s->nonce;
  hello.nonce.len = NONCE_LEN;
  hello.server_id = id;
  hello.incarnation = srv->incarnation;
  ts_conn_send(&s->conn, TS_MSG_HELLO, &hello.base, NULL, 0, NULL, NULL);
}

/* --- timers, signals, lifecycle ---------------------------------------------------- */

/* --- admin endpoint and systemd ------------------------------------------------------ */

#define PUBLISH_MS 250       /* how fresh /metrics and /status are */
#define NOTIFY_STATUS_MS 1000 /* at most one STATUS= line to systemd a second */

/* On the loop, from the tick (and at start and stop): publish the snapshot the admin
 * endpoint renders, tell systemd how the shard is doing and pet its watchdog. The
 * watchdog is only petted here, so a stuck loop gets the shard restarted. */
static void admin_tick(ts_server_t *srv) {
  uint64_t now = now_ms(srv);
  bool publish = srv->admin && (now >= srv->next_publish_ms || srv->stopping);
  bool status = srv->notify && now >= srv->next_status_ms;
  if (publish || status) {
    status_msg_t sm;
    if (status_build(srv, &sm) == 0) {
      if (publish) {
        ts_metrics_t *m = &srv->metrics;
        m->bytes_in = m->bytes_in_closed;
        m->bytes_out = m->bytes_out_closed;
        m->staging_bytes = ts_stage_bytes(&srv->stage);
        for (ts_session_t *x = srv->sessions; x; x = x->next) {
          m->bytes_in += x->conn.bytes_in;
          m->bytes_out += x->conn.bytes_out;
        }
        size_t len = protobuf_c_message_get_packed_size(&sm.r.base);
        uint8_t *pb = ts_malloc(len ? len : 1);
        if (pb) {
          protobuf_c_message_pack(&sm.r.base, pb);
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
        snprintf(line, sizeof line, "shard %u/%zu %s: step %llu, %u/%u workers live, %zu connections",
                 srv->shard, srv->cfg->num_ps, srv->stopping ? "stopping" : "serving",
                 (unsigned long long)sm.r.step, live, srv->num_workers, srv->num_sessions);
        if (strcmp(line, srv->notify_status) != 0) {
          ts_notify_printf("STATUS=%s", line);
          memcpy(srv->notify_status, line, sizeof line);
        }
        srv->next_status_ms = now + NOTIFY_STATUS_MS;
      }
    }
    status_release(&sm);
  }
  if (srv->watchdog_ms && now >= srv->next_watchdog_ms && !srv->stopping) {
    ts_notify("WATCHDOG=1");
    srv->next_watchdog_ms = now + srv->watchdog_ms;
  }
}

/* A stopping shard drops a peer that does not read its last replies after this long at
 * most: the connection would otherwise keep the shard from ever exiting. */
#define STOP_STALL_MS 1000

/* Close the peers that hold others up: one that has not read its replies for limit_ms (its
 * pull replies never finish, so pushes to their partitions wait; and it holds our memory),
 * and one that stopped sending half way through a push for as long while holding a
 * staging buffer (the pushes queued for a buffer would wait for it forever). */
static void drop_stalled_peers(ts_server_t *srv, uint64_t now, uint64_t limit_ms) {
  for (ts_session_t *s = srv->sessions; s; s = s->next) {
    if (s->conn.closing) continue;
    uint64_t stall = ts_conn_write_stall_ms(&s->conn, now);
    if (stall > limit_ms) {
      ts_log_warn("%s: has not read its replies for %.1f s (%zu bytes waiting): closing",
                  s->conn.peer, (double)stall / 1000.0, ts_conn_write_queue(&s->conn));
      ts_conn_close(&s->conn, TS_ETIMEDOUT);
      continue;
    }
    stall = s->rx.buf ? ts_conn_read_stall_ms(&s->conn, now) : 0;
    if (stall > limit_ms) {
      ts_log_warn("%s: sent nothing for %.1f s in the middle of a push, holding a staging "
                  "buffer: closing", s->conn.peer, (double)stall / 1000.0);
      ts_conn_close(&s->conn, TS_ETIMEDOUT);
    }
  }
}

static void on_tick(uv_timer_t *t) {
  ts_server_t *srv = t->data;
  uint64_t now = now_ms(srv);
  uint64_t hb = (uint64_t)(srv->cfg->heartbeat_timeout_s * 1000.0);
  if (srv->stopping) {
    drop_stalled_peers(srv, now, hb / 2 < STOP_STALL_MS ? hb / 2 : STOP_STALL_MS);
    return;
  }
  uint32_t dead[64];
  uint32_t ndead;
  /* Dead workers are reported 64 at a time; the rest on the next tick. */
  while ((ndead = ts_barrier_expire(&srv->barrier, now, dead, 64)) > 0) {
    for (uint32_t i = 0; i < ndead; i++)
      ts_log_warn("worker %u missed heartbeats for %.1f s: marked dead", dead[i],
                  (double)(now - srv->barrier.w[dead[i]].last_seen_ms) / 1000.0);
    if (ndead < 64) break;
  }
  /* Half the heartbeat timeout, so the pushers a stalled peer holds up, who cannot be read
   * meanwhile, are not themselves taken for dead by their clients. */
  drop_stalled_peers(srv, now, hb / 2);
  check_barriers(srv, true);
  serve_waiting(srv);
  admin_tick(srv);
}

static void on_handle_closed(uv_handle_t *h) {
  ts_server_t *srv = h->data;
  srv->open_handles--;
}

/* A stopping shard keeps its tick until the last connection is gone: the tick drops the
 * peers that would never let their connection finish closing (drop_stalled_peers). */
static void stop_tick_when_idle(ts_server_t *srv) {
  if (srv->stopping && srv->num_sessions == 0 && !uv_is_closing((uv_handle_t *)&srv->tick))
    uv_close((uv_handle_t *)&srv->tick, on_handle_closed);
}

void ts_server_stop(ts_server_t *srv) {
  if (srv->stopping) return;
  srv->stopping = true;
  ts_notify("STOPPING=1");
  admin_tick(srv);
  ts_log_info("shutting down: closing %zu connection(s)", srv->num_sessions);
  uv_close((uv_handle_t *)&srv->listener, on_handle_closed);
  uv_close((uv_handle_t *)&srv->sigterm, on_handle_closed);
  uv_close((uv_handle_t *)&srv->sigint, on_handle_closed);
  uv_close((uv_handle_t *)&srv->ckpt_timer, on_handle_closed);
  for (ts_session_t *s = srv->sessions; s; s = s->next) ts_conn_close_graceful(&s->conn, TS_ESHUTDOWN);
  stop_tick_when_idle(srv);
}

static void on_signal(uv_signal_t *h, int signum) {
  ts_server_t *srv = h->data;
  ts_log_notice("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  if (srv->stop_after_ckpt || srv->stopping) {
    ts_server_stop(srv); /* a second signal: stop now */
    return;
  }
  if (srv->cfg->checkpoint_dir && *srv->cfg->checkpoint_dir && srv->store.declared &&
      srv->store.applied != srv->ckpt_applied) {
    char err[512];
    if (srv->ckpt_busy) {
      srv->stop_after_ckpt = true;
      return;
    }
    if (start_checkpoint(srv, CKPT_SIGNAL, 0, 0, err, sizeof err) == 0) {
      srv->stop_after_ckpt = true;
      ts_log_info("writing a final checkpoint before stopping");
      return;
    }
    ts_log_err("final checkpoint failed, stopping anyway: %s", err);
  }
  ts_server_stop(srv);
}

static bool is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
  return false;
}

int ts_server_start(ts_server_t **out, uv_loop_t *loop, const ts_server_opts_t *opts,
                    char *errmsg, size_t errlen) {
  *out = NULL;
  const ts_config_t *cfg = opts->cfg;
  if (opts->shard >= cfg->num_ps) {
    snprintf(errmsg, errlen, "shard %u does not exist: cluster.ps lists %zu shard(s)", opts->shard,
             cfg->num_ps);
    return TS_ECONFIG;
  }
  if (sodium_init() < 0) {
    snprintf(errmsg, errlen, "libsodium failed to initialise");
    return TS_EINTERNAL;
  }
  ts_server_t *srv = ts_calloc(1, sizeof *srv);
  if (!srv) return TS_ENOMEM;
  int rc = 0;
  srv->loop = loop;
  uv_update_time(loop);
  srv->started_ms = uv_now(loop);
  srv->cfg = cfg;
  srv->shard = opts->shard;
  srv->num_workers = (uint32_t)cfg->num_workers;
  srv->workers = ts_calloc(srv->num_workers ? srv->num_workers : 1, sizeof *srv->workers);
  if (!srv->workers ||
      ts_barrier_init(&srv->barrier, srv->num_workers,
                      cfg->replicas_to_aggregate > 0 ? (uint32_t)cfg->replicas_to_aggregate : 0,
                      (uint64_t)(cfg->sync_timeout_s * 1000.0),
                      (uint64_t)(cfg->heartbeat_timeout_s * 1000.0),
                      cfg->staleness > 0 ? (uint64_t)cfg->staleness : 0) < 0) {
    rc = TS_ENOMEM;
    goto fail;
  }
  ts_store_init(&srv->store, cfg, opts->shard);
  snprintf(srv->address, sizeof srv->address, "%s", cfg->ps[opts->shard]);

  if (cfg->token_file && *cfg->token_file &&
      !(srv->token = ts_auth_read_token(cfg->token_file, errmsg, errlen))) {
    rc = TS_ECONFIG;
    goto fail;
  }
  if (cfg->admin_token_file && *cfg->admin_token_file &&
      !(srv->admin_token = ts_auth_read_token(cfg->admin_token_file, errmsg, errlen))) {
    rc = TS_ECONFIG;
    goto fail;
  }

  struct addrinfo *ai = NULL;
  char why[300];
  if (ts_addr_resolve(srv->address, false, &ai, why, sizeof why) < 0) {
    snprintf(errmsg, errlen, "cluster.ps[%u]: %s", opts->shard, why);
    rc = TS_ECONFIG;
    goto fail;
  }
  if (!is_loopback(ai->ai_addr) && !srv->token && !opts->insecure) {
    snprintf(errmsg, errlen,
             "refusing to listen on %s without authentication: set auth.token_file, or start "
             "with --insecure on a trusted network",
             srv->address);
    freeaddrinfo(ai);
    rc = TS_ECONFIG;
    goto fail;
  }
  if (!is_loopback(ai->ai_addr) && !srv->token)
    ts_log_warn("listening on %s WITHOUT authentication (--insecure)", srv->address);

  /* The admin endpoint runs on its own thread and needs nothing from the loop: start it
   * first, so a taken admin port fails the start before anything is on the loop. */
  ts_metrics_init(&srv->metrics);
  if (cfg->num_ps_http > opts->shard &&
      (rc = ts_admin_start(&srv->admin, cfg, opts->shard, errmsg, errlen)) < 0) {
    freeaddrinfo(ai);
    goto fail;
  }

  /* Restore before listening: a client that can connect finds the restored model. */
  randombytes_buf(&srv->incarnation, sizeof srv->incarnation);
  if (cfg->checkpoint_dir && *cfg->checkpoint_dir) {
    uint64_t t0 = uv_hrtime(), seq = 0;
    char path[600], err[1024];
    int r = ts_checkpoint_restore(&srv->store, cfg->checkpoint_dir, path, sizeof path, &seq, err,
                                  sizeof err);
    if (r < 0) {
      ts_log_err("%s", err);
    } else if (r == 1) {
      srv->restored_step = ts_store_min_version(&srv->store);
      srv->have_ckpt = true;
      srv->last_ckpt_ms = uv_now(loop);
      srv->ckpt_applied = srv->store.applied;
      snprintf(srv->last_ckpt, sizeof srv->last_ckpt, "%s", path);
      ts_log_notice("restored checkpoint %s: %zu partition(s) at step %llu in %.0f ms", path,
                    srv->store.num_parts, (unsigned long long)srv->restored_step,
                    (double)(uv_hrtime() - t0) / 1e6);
    } else {
      ts_log_info("no checkpoint in %s: starting fresh", cfg->checkpoint_dir);
    }
    uint64_t last = ts_checkpoint_last_sequence(cfg->checkpoint_dir, srv->shard);
    srv->ckpt_seq = last > seq ? last : seq;
  }
  uv_tcp_init(loop, &srv->listener);
  srv->listener.data = srv;
  srv->open_handles++;
  rc = uv_tcp_bind(&srv->listener, ai->ai_addr, 0);
  freeaddrinfo(ai);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, 512, on_connection);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot listen on %s: %s", srv->address, uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->listener, on_handle_closed);
    uv_run(loop, UV_RUN_NOWAIT);
    goto fail;
  }
  uv_timer_init(loop, &srv->ckpt_timer);
  srv->ckpt_timer.data = srv;
  srv->open_handles++;
  if (cfg->checkpoint_dir && *cfg->checkpoint_dir && cfg->checkpoint_interval_s > 0) {
    uint64_t ms = (uint64_t)(cfg->checkpoint_interval_s * 1000.0);
    uv_timer_start(&srv->ckpt_timer, on_ckpt_timer, ms, ms);
  }
  uv_timer_init(loop, &srv->tick);
  srv->tick.data = srv;
  srv->open_handles++;
  uv_timer_start(&srv->tick, on_tick, TICK_MS, TICK_MS);
  uv_signal_init(loop, &srv->sigterm);
  srv->sigterm.data = srv;
  srv->open_handles++;
  uv_signal_start(&srv->sigterm, on_signal, SIGTERM);
  uv_signal_init(loop, &srv->sigint);
  srv->sigint.data = srv;
  srv->open_handles++;
  uv_signal_start(&srv->sigint, on_signal, SIGINT);
  signal(SIGPIPE, SIG_IGN);

  srv->notify = ts_notify_available() && getenv("NOTIFY_SOCKET") != NULL;
  srv->watchdog_ms = ts_notify_watchdog_interval_ms();
  admin_tick(srv);
  ts_log_info("shard %u of %zu listening on %s (mode %s, %zu worker(s), optimizer %s, lr %g)",
              srv->shard, cfg->num_ps, srv->address, ts_mode_name(cfg->mode), cfg->num_workers,
              ts_optimizer_name(cfg->optimizer), cfg->learning_rate);
  *out = srv;
  return 0;

fail:
  ts_server_free(srv);
  return rc;
}

bool ts_server_poll_active(void *arg) {
  ts_server_t *srv = arg;
  bool active = srv->activity != srv->activity_seen;
  srv->activity_seen = srv->activity;
  return active;
}

void ts_server_free(ts_server_t *srv) {
  if (!srv) return;
  ts_admin_stop(srv->admin);
  while (srv->waiting) {
    pull_wait_t *w = srv->waiting;
    srv->waiting = w->next;
    ts_msg_free(&w->msg->base);
    ts_free(w);
  }
  ts_store_free(&srv->store);
  ts_stage_free(&srv->stage);
  ts_free(srv->workers);
  ts_barrier_free(&srv->barrier);
  ts_auth_free_token(srv->token);
  ts_auth_free_token(srv->admin_token);
  ts_free(srv);
}
