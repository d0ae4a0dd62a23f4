/*
 * Pull replies: written straight from parameter memory, partition by partition. A
 * partition being written has a writer, and no update lands on it until the writer is
 * done (ts_store.h), so a reply never carries a half-applied update without a copy.
 */
#include "ts_server_int.h"

#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* A pull reply on its way: the partitions it is written from, each holding a writer until
 * ts_conn reports its buffer out (or cancelled). Freed with the last report. */
typedef struct {
  ts_server_t *srv;
  size_t n;
  ts_spart_t *parts[];
} pull_write_t;

/* Partitions [first, first + n) of a pull reply are out (or cancelled): updates waiting for
 * them may run now, while the rest of the reply is still being written. */
static void on_pull_written(ts_conn_t *c, void *arg, unsigned first, unsigned n, bool last,
                            int err) {
  (void)c;
  (void)err;
  pull_write_t *pw = arg;
  ts_server_t *srv = pw->srv;
  bool moved = false, freed = false;
  /* ts_conn reports each of the n buffers we gave it exactly once (ts_conn.h). */
  ts_require((size_t)first + n <= pw->n);
  for (size_t i = first; i < (size_t)first + n; i++) {
    moved |= ts_store_writer_done(&srv->store, pw->parts[i]);
    freed |= pw->parts[i]->writers == 0 && pw->parts[i]->held_pushes > 0;
  }
  if (last) ts_free(pw);
  if (freed) ts_push_rx_wake_held(srv);
  if (moved || freed) ts_waitq_serve(srv);
}

bool ts_pull_ready(ts_server_t *srv, const Tessera__Pull *m) {
  ts_store_t *st = &srv->store;
  for (size_t i = 0; i < m->n_parts; i++) {
    /* ts_pull_handle checked the slices, and partitions never go once declared. */
    ts_spart_t *p = ts_store_find(st, m->parts[i]->tensor, m->parts[i]->part);
    ts_require(p != NULL);
    if (p->apply_pending || p->held_pushes > 0) return false;
    if (p->version < m->min_version) return false;
  }
  if (st->mode == TS_MODE_SSP && !ts_barrier_ssp_ready(&srv->barrier, m->clock)) return false;
  return true;
}

void ts_pull_send(ts_session_t *s, const Tessera__Pull *m, uint64_t start_ns) {
  ts_server_t *srv = s->srv;
  size_t n = m->n_parts;
  pull_write_t *pw = ts_malloc(sizeof *pw + n * sizeof(ts_spart_t *));
  Tessera__PartSlice *slices = ts_calloc(n ? n : 1, sizeof *slices);
  Tessera__PartSlice **ptrs = ts_calloc(n ? n : 1, sizeof *ptrs);
  uv_buf_t *bufs = ts_calloc(n ? n : 1, sizeof *bufs);
  if (!pw || !slices || !ptrs || !bufs) {
    ts_session_reply_error(s, TS_MSG_PULL, m->request_id, TS_ENOMEM,
                           "out of memory for a pull reply");
    goto done;
  }
  pw->srv = srv;
  pw->n = n;
  for (size_t i = 0; i < n; i++) {
    ts_spart_t *p = ts_store_find(&srv->store, m->parts[i]->tensor, m->parts[i]->part);
    ts_require(p != NULL);
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
  int rc = ts_conn_send_parts(&s->conn, TS_MSG_PULL_REPLY, &r.base, bufs, (unsigned)n,
                              on_pull_written, pw);
  if (rc < 0) {
    for (size_t i = 0; i < n; i++) ts_store_writer_done(&srv->store, pw->parts[i]);
    ts_free(pw);
    ts_session_reply_failed(s, TS_MSG_PULL_REPLY, rc);
  } else {
    srv->pulls++;
    ts_prom_hist_observe(&srv->metrics.pull_duration, (double)(uv_hrtime() - start_ns) * 1e-9);
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

void ts_pull_handle(ts_session_t *s, Tessera__Pull *m) {
  char err[256];
  int rc = ts_store_check_slices(&s->srv->store, m->parts, m->n_parts, err, sizeof err);
  if (rc < 0) {
    ts_session_reply_error(s, TS_MSG_PULL, m->request_id, rc, err);
    ts_msg_free(&m->base);
    return;
  }
  if (ts_pull_ready(s->srv, m)) {
    ts_pull_send(s, m, s->frame_ns);
    ts_msg_free(&m->base);
  } else {
    ts_waitq_park(s, m, s->frame_ns); /* the queue owns m from here */
  }
}
