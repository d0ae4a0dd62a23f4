/*
 * Pull replies: written straight from parameter memory, partition by partition. A
 * partition being written has a writer, and no update lands on it until the writer is
 * done (ts_store.h), so a reply never carries a half-applied update without a copy.
 *
 * What a peer can do with that (docs/architecture.md, "What one peer may hold"): a pull
 * names each partition at most once (a pull that repeats one is refused, so a small
 * request cannot ask for a reply thousands of times the shard's size), and a reader too
 * slow to take its reply loses its connection once an update of one of the partitions has
 * waited server.pull_hold_timeout_s for it. A deadline rather than a copy into the reply:
 * a copy would double the memory of every pull in flight (a worker's pull is the whole
 * shard's share of the model) and cost a memcpy of it on the loop for every reader (256 MiB
 * took 160-640 ms on the 2-core CI machine), to protect against the rare slow one; the
 * deadline costs the readers that keep up nothing.
 */
#include "ts_server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* A pull reply on its way: the partitions it is written from, each holding a writer until
 * ts_conn reports its buffer out (or cancelled). Freed with the last report. */
struct ts_pull_write {
  ts_pull_write_t *prev, *next; /* in sess->writes, oldest first */
  ts_session_t *sess;
  /* Loop time the tick first saw it keep an update of its unwritten partitions waiting (0:
   * it keeps none waiting); server.pull_hold_timeout_s counts from there. */
  uint64_t blocked_ms;
  size_t n;
  size_t done; /* parts[0, done) are out */
  size_t charged;
  ts_spart_t *parts[];
};

static void unlink_write(ts_pull_write_t *pw) {
  ts_session_t *s = pw->sess;
  if (pw->prev)
    pw->prev->next = pw->next;
  else
    s->writes = pw->next;
  if (pw->next) pw->next->prev = pw->prev;
  /* Its bookkeeping counted as reply memory while queued (server.max_reply_bytes). */
  ts_conn_charge(&s->conn, -(int64_t)pw->charged);
  s->srv->pull_writes--;
}

/* Partitions [first, first + n) of a pull reply are out (or cancelled): updates waiting for
 * them may run now, while the rest of the reply is still being written. */
static void on_pull_written(ts_conn_t *c, void *arg, unsigned first, unsigned n, bool last,
                            int err) {
  (void)c;
  (void)err;
  ts_pull_write_t *pw = arg;
  ts_server_t *srv = pw->sess->srv;
  bool moved = false, freed = false;
  /* ts_conn reports each of the n buffers we gave it exactly once, in order (ts_conn.h). */
  ts_require((size_t)first + n <= pw->n);
  for (size_t i = first; i < (size_t)first + n; i++) {
    moved |= ts_store_writer_done(&srv->store, pw->parts[i]);
    freed |= ts_store_held_free(pw->parts[i]);
  }
  pw->done = (size_t)first + n;
  if (last) {
    unlink_write(pw);
    ts_free(pw);
  }
  if (freed) ts_push_rx_wake_held(srv);
  if (moved || freed) ts_waitq_serve(srv);
}

bool ts_pull_ready(ts_server_t *srv, const ts_pull_req_t *q) {
  if (q->sparse) return ts_sparse_pull_ready(srv, q);
  ts_store_t *st = &srv->store;
  for (size_t i = 0; i < q->n; i++) {
    /* ts_pull_handle checked the slices, and partitions never go once declared. */
    ts_spart_t *p = ts_store_find(st, q->slices[i].tensor, q->slices[i].part);
    ts_require(p != NULL);
    if (!ts_store_pull_ready(p, q->min_version)) return false;
  }
  if (st->mode == TS_MODE_SSP && !ts_barrier_ssp_ready(&srv->barrier, q->clock)) return false;
  return true;
}

void ts_pull_send(ts_session_t *s, const ts_pull_req_t *q) {
  if (q->sparse) {
    ts_sparse_pull_send(s, q);
    return;
  }
  ts_server_t *srv = s->srv;
  size_t n = q->n;
  size_t pw_bytes = sizeof(ts_pull_write_t) + n * sizeof(ts_spart_t *);
  ts_pull_write_t *pw = ts_malloc(pw_bytes);
  Tessera__PartSlice *slices = ts_calloc(n ? n : 1, sizeof *slices);
  Tessera__PartSlice **ptrs = ts_calloc(n ? n : 1, sizeof *ptrs);
  uv_buf_t *bufs = ts_calloc(n ? n : 1, sizeof *bufs);
  if (!pw || !slices || !ptrs || !bufs) {
    ts_session_reply_error(s, TS_MSG_PULL, q->request_id, TS_ENOMEM,
                           "out of memory for a pull reply");
    goto done;
  }
  memset(pw, 0, sizeof *pw);
  pw->sess = s;
  pw->n = n;
  for (size_t i = 0; i < n; i++) {
    ts_spart_t *p = ts_store_find(&srv->store, q->slices[i].tensor, q->slices[i].part);
    ts_require(p != NULL);
    tessera__part_slice__init(&slices[i]);
    slices[i].tensor = q->slices[i].tensor;
    slices[i].part = q->slices[i].part;
    slices[i].count = ts_store_part_count(p);
    slices[i].version = ts_store_part_version(p);
    ptrs[i] = &slices[i];
    pw->parts[i] = p;
  }
  Tessera__PullReply r = TESSERA__PULL_REPLY__INIT;
  r.request_id = q->request_id;
  r.n_parts = n;
  r.parts = ptrs;
  /* Partitions are written straight from parameter memory, each with a writer so no update
   * lands while the reply is on its way. */
  for (size_t i = 0; i < n; i++)
    bufs[i] = uv_buf_init((char *)ts_store_read_begin(pw->parts[i]),
                          (unsigned)(slices[i].count * sizeof(float)));
  int rc = ts_conn_send_parts(&s->conn, TS_MSG_PULL_REPLY, &r.base, bufs, (unsigned)n,
                              on_pull_written, pw);
  if (rc < 0) {
    for (size_t i = 0; i < n; i++) ts_store_writer_done(&srv->store, pw->parts[i]);
    ts_free(pw);
    ts_session_reply_failed(s, TS_MSG_PULL_REPLY, rc);
  } else {
    /* Newest last: the tick looks at the oldest first. */
    ts_pull_write_t **tail = &s->writes, *prev = NULL;
    while (*tail) {
      prev = *tail;
      tail = &(*tail)->next;
    }
    pw->prev = prev;
    *tail = pw;
    srv->pull_writes++;
    pw->charged = ts_alloc_cost(pw_bytes);
    ts_conn_charge(&s->conn, (int64_t)pw->charged);
    ts_replyq_enforce(srv);
    srv->pulls++;
    ts_prom_hist_observe(&srv->metrics.pull_duration,
                         (double)(uv_hrtime() - q->start_ns) * 1e-9);
    if (!srv->served_pull) {
      srv->served_pull = true;
      ts_log_info("first pull served %llu ms after start%s",
                  (unsigned long long)(ts_server_now_ms(srv) - srv->started_ms),
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

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The compact copy of m's partition list (NULL when out of memory). */
static ts_pull_req_t *compact(const Tessera__Pull *m, uint64_t start_ns) {
  ts_pull_req_t *q = ts_malloc(sizeof *q + m->n_parts * sizeof q->slices[0]);
  if (!q) return NULL;
  memset(q, 0, sizeof *q);
  q->request_id = m->request_id;
  q->min_version = m->min_version;
  q->clock = m->clock;
  q->start_ns = start_ns;
  q->n = m->n_parts;
  for (size_t i = 0; i < m->n_parts; i++) {
    q->slices[i].tensor = m->parts[i]->tensor;
    q->slices[i].part = m->parts[i]->part;
  }
  return q;
}

/* A pull names each partition at most once. Returns 0, TS_EINVAL with err naming the first
 * repeated one, or TS_ENOMEM. */
static int check_repeats(const ts_store_t *st, const ts_pull_req_t *q, char *err, size_t n) {
  if (q->n < 2) return 0;
  uint64_t *keys = ts_malloc(q->n * sizeof *keys);
  if (!keys) {
    ts_errmsg_printf(err, n, "out of memory for a pull request");
    return TS_ENOMEM;
  }
  for (size_t i = 0; i < q->n; i++)
    keys[i] = (uint64_t)q->slices[i].tensor << 32 | q->slices[i].part;
  qsort(keys, q->n, sizeof *keys, cmp_u64);
  int rc = 0;
  for (size_t i = 1; i < q->n; i++) {
    if (keys[i] != keys[i - 1]) continue;
    uint32_t t = (uint32_t)(keys[i] >> 32), part = (uint32_t)keys[i];
    ts_errmsg_printf(err, n, "pull lists '%s' part %u more than once: each partition may be asked for once",
             st->tensors[t].name, part);
    rc = TS_EINVAL;
    break;
  }
  ts_free(keys);
  return rc;
}

void ts_pull_handle(ts_session_t *s, Tessera__Pull *m) {
  ts_server_t *srv = s->srv;
  char err[256];
  uint64_t request_id = m->request_id, timeout_ms = m->timeout_ms;
  int rc = ts_store_check_slices(&srv->store, m->parts, m->n_parts, err, sizeof err);
  if (rc == 0) rc = ts_store_check_ready(&srv->store, m->parts, m->n_parts, err, sizeof err);
  ts_pull_req_t *q = NULL;
  if (rc == 0) {
    q = compact(m, s->frame_ns);
    if (!q) {
      rc = TS_ENOMEM;
      ts_errmsg_printf(err, sizeof err, "out of memory for a pull request");
    }
  }
  /* From here only the compact copy: the protobuf (and any unknown fields) goes now. */
  ts_msg_free(&m->base);
  if (rc == 0) {
    rc = check_repeats(&srv->store, q, err, sizeof err);
    if (rc == TS_EINVAL) {
      ts_session_log(s, TS_LOG_WARN, "%s: pull %llu refused: %s", s->conn.peer,
                     (unsigned long long)request_id, err);
      srv->metrics.limit_refusals[TS_METRICS_LIMIT_PULL_REPEATS]++;
    }
  }
  if (rc < 0) {
    ts_free(q);
    ts_session_reply_error(s, TS_MSG_PULL, request_id, rc, err);
    return;
  }
  if (ts_pull_ready(srv, q)) {
    ts_pull_send(s, q);
    ts_free(q);
  } else {
    ts_waitq_park(s, q, timeout_ms); /* the queue owns q from here */
  }
}

/* Does the unwritten rest of pw keep an update waiting? */
static bool holds_update(const ts_pull_write_t *pw) {
  for (size_t i = pw->done; i < pw->n; i++)
    if (ts_store_update_waiting(pw->parts[i])) return true;
  return false;
}

/* server.pull_hold_timeout_s bounds how long a reply keeps an update waiting, not how long
 * the reply takes: it counts from the first tick that sees the reply hold an update back
 * (a push held on one of its unwritten partitions, or a sync step waiting to be applied),
 * and starts again once nothing waits. A reply queued behind others, or a large reply
 * over a slow link that no update is waiting for, is not cut; a reader too slow to let a
 * waiting update in within the timeout is. Time the loop itself did not run (late_ms) is
 * not the reader's. */
void ts_pull_drop_slow_readers(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms) {
  uint64_t limit = (uint64_t)(srv->cfg->pull_hold_timeout_s * 1000.0);
  for (ts_session_t *s = srv->sessions; s; s = s->next) {
    if (s->conn.closing) continue;
    for (ts_pull_write_t *pw = s->writes; pw; pw = pw->next) {
      if (!holds_update(pw)) {
        pw->blocked_ms = 0;
        continue;
      }
      if (!pw->blocked_ms) {
        pw->blocked_ms = now_ms;
        continue;
      }
      pw->blocked_ms = pw->blocked_ms + late_ms < now_ms ? pw->blocked_ms + late_ms : now_ms;
      if (now_ms - pw->blocked_ms <= limit) continue;
      ts_log_warn("%s: a pull reply still being written has kept an update waiting for %.1f s "
                  "(server.pull_hold_timeout_s): closing",
                  s->conn.peer, (double)(now_ms - pw->blocked_ms) / 1000.0);
      srv->metrics.limit_drops[TS_METRICS_LIMIT_PULL_HOLD]++;
      ts_conn_close(&s->conn, TS_ETIMEDOUT);
      break;
    }
  }
}

void ts_pull_close(ts_session_t *s) {
  /* libuv reports every write of a closing stream (cancelled) before its close callback,
   * and the last report of a reply unlinks it. */
  ts_require(s->writes == NULL);
}
