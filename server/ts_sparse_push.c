/*
 * SparsePush receive (docs/architecture.md, "Tables"): a table's row gradients, read as
 * dense pushes are (ts_push_rx.c) through the shard's staging pool, in pieces of whole
 * records of at most one staging buffer, taking turns with other pushes piece by piece and
 * held to the same rate floors (ts_push_rx_drop_slow judges every holder of a buffer).
 *
 * Everything that refuses the whole push is checked at its meta, before any payload is
 * read: role, table (ENOTABLE), width (ESHAPE), in sync mode the step against the table's
 * version (older: STALE; ahead: EFUTURE; the task's second push for the step: DUPLICATE),
 * and a push id the table has applied already (a retry: DUPLICATE). Those answered STALE
 * or DUPLICATE have their payload read and dropped. Each piece is then checked whole
 * (keys strictly ascending across the push and on this shard: EINVAL; gradients finite:
 * ENONFINITE) before any of its records is applied; a refused piece and every piece after
 * it are dropped. A push of one piece (up to a staging buffer, 1 MiB at least) is thus
 * applied whole or not at all; a larger one refused in a later piece keeps its earlier
 * pieces applied (async) or accumulated (sync), as a dense push keeps its good pieces, and
 * the error says how many records went in.
 *
 * A push+pull in one frame (pull_request_id, async mode): each record's row is copied into
 * the pull's reply as it is applied, while the update has it in cache, and the reply is sent
 * after the push's; its rows (TS_MSG_MAX_FUSED_ROWS at most, else ETOOBIG) are held from the
 * meta on, within FUSED_ROWS_BUDGET for all such pushes being read together. Past it the
 * push is applied alone and its pull answered EBUSY, as is the pull of a duplicate push (the
 * client then sends the pull on its own: EBUSY means that and nothing else). A refused push
 * refuses its pull with its own error.
 *
 * A push whose connection is lost after some of its pieces were applied is remembered
 * (ts_sparse_push_abort: its id, piece and last key, ts_pushid_part_t); its retry, the same
 * records, skips those up to that key, so each record goes in once.
 *
 * async/ssp: rows are updated as each piece lands; the version moves once per push. sync:
 * rows are summed into the table's accumulator, and the task counts for the step when the
 * whole push is in (also when a piece was refused: it was heard from, as for dense
 * pushes); the step closes in ts_sync.c.
 */
#include "ts_server_int.h"

#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_optim.h"

/* Rows all push+pulls in one frame being read may hold together (4 of the largest). */
#define FUSED_ROWS_BUDGET (4 * TS_MSG_MAX_FUSED_ROWS)

static int refuse(ts_push_rx_t *rx, int code, const char *msg) {
  rx->active = false;
  rx->refuse_code = code;
  ts_errmsg_printf(rx->refuse_msg, sizeof rx->refuse_msg, "%s", msg);
  return 0; /* no destination: the payload is read and dropped, then the reply */
}

/* The push-id window of table `table` for this push's client, or NULL (no id, detection
 * off). Looked up anew each time: another session's lookup may move the slots. */
static ts_pushid_window_t *pushid_window(ts_session_t *s, const Tessera__SparsePush *m) {
  ts_server_t *srv = s->srv;
  if (!m->push_id) return NULL;
  ts_pushid_window_t *wins = ts_pushid_lookup(&srv->pushids, s->task, m->client_incarnation,
                                              ts_store_pushid_units(&srv->store), NULL);
  return wins ? &wins[ts_store_pushid_unit(&srv->store, m->table, m->piece)] : NULL;
}

/* The record of the push this client had cut off after some records, or NULL. */
static ts_pushid_part_t *pushid_part(ts_session_t *s, uint64_t push_id, uint64_t client) {
  ts_server_t *srv = s->srv;
  if (!push_id) return NULL;
  return ts_pushid_lookup_part(&srv->pushids, s->task, client, ts_store_pushid_units(&srv->store));
}

int ts_sparse_push_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__SparsePush *m,
                        const uv_buf_t **iov, unsigned *niov) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  char err[256];
  (void)h;
  rx->start_ns = uv_hrtime();
  rx->active = false;
  rx->sparse = true;
  rx->m = NULL;
  rx->sm = m;
  rx->refuse_code = 0;
  rx->refuse_msg[0] = rx->refused_detail[0] = '\0';
  rx->sp_rows = rx->sp_filtered = rx->sp_pieces_applied = 0;
  rx->sp_bad_code = 0;
  rx->sp_have_prev = false;
  rx->sp_pull_id = m->pull_request_id;
  rx->sp_push_id = m->push_id;
  rx->sp_client = m->client_incarnation;
  rx->sp_piece = m->piece;
  rx->sp_resumed = rx->sp_skipping = rx->sp_applied_any = false;
  ts_sparse_push_close(s); /* no rows of an earlier push+pull left */
  rx->npieces = rx->nchunks = 0;
  if (s->role != TESSERA__ROLE__ROLE_WORKER)
    return refuse(rx, TS_EROLE, "only workers push gradients");
  if (!st->declared) {
    ts_errmsg_printf(err, sizeof err, "no model is declared on shard %u yet", srv->shard);
    return refuse(rx, TS_ENOTDECLARED, err);
  }
  ts_stable_t *t = ts_store_table(st, m->table);
  if (!t) {
    ts_errmsg_printf(err, sizeof err, "table index %u: the model declares %u table(s)", m->table,
                     st->num_tables);
    return refuse(rx, TS_ENOTABLE, err);
  }
  if (m->dim != ts_stable_dim(t)) {
    ts_errmsg_printf(err, sizeof err, "rows of width %u pushed to table '%s' of width %u", m->dim,
                     ts_stable_name(t), ts_stable_dim(t));
    return refuse(rx, TS_ESHAPE, err);
  }
  if (m->piece >= TS_MSG_MAX_PUSH_PIECES) {
    ts_errmsg_printf(err, sizeof err, "piece %u of a push: a push goes in %u frames at most",
                     m->piece, TS_MSG_MAX_PUSH_PIECES);
    return refuse(rx, TS_EINVAL, err);
  }
  if (m->piece && !m->push_id)
    return refuse(rx, TS_EINVAL,
                  "a push in several frames (piece) needs its push_id: the pieces are one push");
  if (m->piece && st->mode != TS_MODE_ASYNC)
    return refuse(rx, TS_EINVAL,
                  "a push in several frames (piece) is for async mode: each step's barrier "
                  "counts one push a worker");
  uint64_t fused_bytes = m->num_keys * m->dim * sizeof(float); /* num_keys <= 2^20 */
  if (m->pull_request_id) {
    if (st->mode != TS_MODE_ASYNC)
      return refuse(rx, TS_EINVAL,
                    "a push+pull in one frame (pull_request_id) is for async mode: send the "
                    "pull after the push");
    if (m->pull_request_id == m->request_id)
      return refuse(rx, TS_EINVAL, "the pull's request id is the push's");
    if (fused_bytes > TS_MSG_MAX_FUSED_ROWS) {
      ts_errmsg_printf(err, sizeof err,
                       "%llu rows of width %u make %.2f MiB, more than the %llu MiB a push+pull in "
                       "one frame may ask for: pull them on their own",
                       (unsigned long long)m->num_keys, m->dim,
                       (double)fused_bytes / (1024.0 * 1024.0),
                       (unsigned long long)(TS_MSG_MAX_FUSED_ROWS >> 20));
      return refuse(rx, TS_ETOOBIG, err);
    }
  }
  rx->table = m->table;
  rx->rec_floats = 2 + (size_t)m->dim;
  rx->sp_result = TESSERA__PUSH_RESULT__PUSH_APPLIED;
  if (st->mode == TS_MODE_SYNC) {
    int state = ts_stable_sync_state(t, s->task, m->step);
    if (state < 0) {
      ts_errmsg_printf(err, sizeof err,
                       "push for step %llu, but table '%s' is at step %llu on shard %u",
                       (unsigned long long)m->step, ts_stable_name(t),
                       (unsigned long long)ts_stable_version(t), srv->shard);
      return refuse(rx, TS_EFUTURE, err);
    }
    rx->sp_result = (Tessera__PushResult)state;
  }
  ts_pushid_window_t *w = pushid_window(s, m);
  if (w && ts_pushid_seen(w, m->push_id)) rx->sp_result = TESSERA__PUSH_RESULT__PUSH_DUPLICATE;
  if (rx->sp_result == TESSERA__PUSH_RESULT__PUSH_APPLIED ||
      rx->sp_result == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED) {
    ts_pushid_part_t *part = pushid_part(s, m->push_id, m->client_incarnation);
    if (part && part->id == m->push_id &&
        part->unit == ts_store_pushid_unit(st, m->table, m->piece)) {
      /* A retry of a push cut off after its records up to this key: they are in. */
      rx->sp_resumed = rx->sp_skipping = true;
      rx->sp_resume_key = part->key;
    }
  }
  /* Past the budget (or out of memory) the push goes on alone and its pull is answered
   * EBUSY: the client pulls on its own. */
  if (m->pull_request_id && rx->sp_result == TESSERA__PUSH_RESULT__PUSH_APPLIED &&
      !rx->sp_resumed && srv->fused_rows_bytes + fused_bytes <= FUSED_ROWS_BUDGET &&
      ts_rows_reply_fits(srv, (size_t)(m->num_keys * m->dim)) &&
      (rx->sp_reply = ts_rows_reply_new(srv, m->num_keys * m->dim)) != NULL) {
    rx->sp_reply_bytes = fused_bytes;
    srv->fused_rows_bytes += fused_bytes;
  }
  rx->active = true;
  if (rx->sp_result == TESSERA__PUSH_RESULT__PUSH_STALE ||
      rx->sp_result == TESSERA__PUSH_RESULT__PUSH_DUPLICATE || m->num_keys == 0)
    return 0; /* nothing to read into: a payload is dropped */

  /* Pieces of whole records, each one chunk of at most a staging buffer. */
  uint64_t rec_bytes = ts_msg_sparse_record_bytes(m->dim);
  if (ts_push_rx_stage_ready(srv) < 0) return refuse(rx, TS_ENOMEM, "out of memory for the push payload");
  uint64_t per = srv->stage.buf_bytes / rec_bytes;
  ts_require(per > 0); /* buffers are 1 MiB at least, a record 16 KiB at most */
  size_t np = (size_t)((m->num_keys + per - 1) / per);
  if (ts_push_rx_reserve(rx, np, np) < 0)
    return refuse(rx, TS_ENOMEM, "out of memory for the push payload");
  for (size_t k = 0; k < np; k++) {
    uint64_t a = k * per, b = a + per < m->num_keys ? a + per : m->num_keys;
    rx->first[k] = (size_t)a;
    rx->iov[k] = uv_buf_init(NULL, (unsigned)((b - a) * rec_bytes));
    rx->chunk_off[k] = 0;
    rx->chunk_piece[k] = k;
  }
  rx->first[np] = (size_t)m->num_keys;
  rx->npieces = rx->nchunks = np;
  int rc = ts_push_rx_acquire(s, iov, niov);
  if (rc < 0) return refuse(rx, TS_ENOMEM, "out of memory for the push payload");
  return rc;
}

/* Check piece i in the staging buffer whole: keys and gradients. 0 or the refusal. */
static int check_piece(ts_session_t *s, ts_stable_t *t, size_t i) {
  ts_server_t *srv = s->srv;
  ts_push_rx_t *rx = &s->rx;
  size_t a = rx->first[i], n = rx->first[i + 1] - a, dim = rx->rec_floats - 2;
  int rc = ts_stable_check_keys(rx->buf, rx->rec_floats * sizeof(float), n, &rx->sp_prev_key,
                                &rx->sp_have_prev, srv->shard, srv->store.num_shards, a,
                                rx->refused_detail, sizeof rx->refused_detail);
  if (rc < 0) return rc;
  for (size_t k = 0; k < n; k++) {
    const float *rec = rx->buf + k * rx->rec_floats;
    if (ts_optim_all_finite(rec + 2, dim)) continue;
    uint64_t key;
    memcpy(&key, rec, sizeof key);
    ts_errmsg_printf(rx->refused_detail, sizeof rx->refused_detail,
                     "gradient of key %llu (index %zu) of table '%s' contains NaN or Inf",
                     (unsigned long long)key, a + k, ts_stable_name(t));
    return TS_ENONFINITE;
  }
  return 0;
}

/* The piece's records in rx->buf past those a cut-off push applied before its retry (keys up
 * to sp_resume_key: the records ascend); *n is cut to match. */
static const float *skip_applied(ts_push_rx_t *rx, size_t *n) {
  const float *recs = rx->buf;
  while (rx->sp_skipping && *n) {
    uint64_t key;
    memcpy(&key, recs, sizeof key);
    if (key > rx->sp_resume_key) {
      rx->sp_skipping = false;
      break;
    }
    recs += rx->rec_floats;
    (*n)--;
  }
  return recs;
}

int ts_sparse_push_on_piece(ts_session_t *s, unsigned i) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  ts_stable_t *t = ts_store_table(st, rx->table);
  ts_require(t != NULL); /* a model is not dropped while a worker's push is being read */
  rx->piece = i; /* a piece is one chunk (ts_push_rx_take_turns reads it) */
  if (rx->sp_bad_code == 0 && rx->sp_result != TESSERA__PUSH_RESULT__PUSH_STALE) {
    int rc = check_piece(s, t, i);
    if (rc < 0) {
      rx->sp_bad_code = rc;
    } else if (st->mode == TS_MODE_SYNC &&
               ts_stable_sync_state(t, s->task, rx->sm->step) !=
                   TESSERA__PUSH_RESULT__PUSH_ACCUMULATED) {
      /* The step closed while the push was being read (its timeout): too late for it. */
      rx->sp_result = TESSERA__PUSH_RESULT__PUSH_STALE;
    } else {
      size_t n = rx->first[i + 1] - rx->first[i];
      const float *recs = skip_applied(rx, &n);
      if (rx->sp_pieces_applied == 0) {
        rx->sp_version0 = ts_stable_version(t);
        rx->sp_t0 = uv_hrtime();
      }
      if (st->mode == TS_MODE_SYNC) {
        ts_stable_accumulate(t, &st->table_budget, s->task, recs, n, &rx->sp_rows,
                             &rx->sp_filtered);
      } else {
        float *out = rx->sp_reply ? rx->sp_reply->rows + rx->first[i] * (rx->rec_floats - 2) : NULL;
        ts_stable_apply_pull(t, &st->table_budget, recs, n, &rx->sp_rows, &rx->sp_filtered, out);
      }
      if (n) {
        memcpy(&rx->sp_last_key, recs + (n - 1) * rx->rec_floats, sizeof rx->sp_last_key);
        rx->sp_applied_any = true;
      }
      rx->sp_pieces_applied++;
    }
  }
  return ts_push_rx_take_turns(s);
}

/* The push+pull's rows buffer, taken from the push (NULL: none), its budget given back. */
static ts_rows_reply_t *take_reply(ts_session_t *s) {
  ts_push_rx_t *rx = &s->rx;
  ts_rows_reply_t *rb = rx->sp_reply;
  if (!rb) return NULL;
  ts_require(s->srv->fused_rows_bytes >= rx->sp_reply_bytes);
  s->srv->fused_rows_bytes -= rx->sp_reply_bytes;
  rx->sp_reply = NULL;
  rx->sp_reply_bytes = 0;
  return rb;
}

void ts_sparse_push_close(ts_session_t *s) { ts_rows_reply_free(s->srv, take_reply(s)); }

void ts_sparse_push_abort(ts_session_t *s) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  if (!rx->sparse || !rx->active || !rx->sp_applied_any) return;
  ts_stable_t *t = ts_store_table(st, rx->table);
  ts_require(t != NULL);
  bool sync = st->mode == TS_MODE_SYNC;
  if (!sync && rx->sp_piece == 0) ts_stable_bump(t); /* its rows moved (its retry's do not bump) */
  ts_pushid_part_t *part = pushid_part(s, rx->sp_push_id, rx->sp_client);
  if (part) {
    part->id = rx->sp_push_id;
    part->unit = ts_store_pushid_unit(st, rx->table, rx->sp_piece);
    part->key = rx->sp_last_key;
  }
  ts_session_log(s, TS_LOG_INFO,
                 "%s: task %d's sparse push %llu to table '%s' was cut off after its records up "
                 "to key %llu were %s: %s",
                 s->conn.peer, s->task, (unsigned long long)rx->sp_push_id, ts_stable_name(t),
                 (unsigned long long)rx->sp_last_key, sync ? "accumulated" : "applied",
                 part ? "a retry applies the rest only"
                      : "without its push id remembered (none, or server.push_dedup_clients "
                        "0) a retry applies them again");
}

/* The pull of a push+pull in one frame, after its push's reply: its rows (code 0, the push
 * applied whole), or the error `code` saying why. */
static void answer_pull(ts_session_t *s, const Tessera__SparsePush *m, int code, const char *why) {
  ts_push_rx_t *rx = &s->rx;
  if (!rx->sp_pull_id) return;
  char msg[600];
  if (code == 0 && (!rx->sp_reply || rx->sp_pieces_applied != rx->npieces)) {
    /* EBUSY, and only here: the client sends the pull on its own then. */
    if (rx->sp_result == TESSERA__PUSH_RESULT__PUSH_DUPLICATE)
      ts_errmsg_printf(msg, sizeof msg,
                       "the push of this push+pull was a duplicate (a retry), so its rows were "
                       "not read: pull them on their own");
    else if (rx->sp_resumed)
      ts_errmsg_printf(msg, sizeof msg,
                       "the push of this push+pull was the retry of one cut off, applied from "
                       "where that one stopped, so its rows were not all read: pull them on "
                       "their own");
    else
      ts_errmsg_printf(msg, sizeof msg,
                       "no room for the rows of a push+pull (%.1f MiB of them are being read, "
                       "%llu MiB at most): the push was applied, pull the rows on their own",
                       (double)s->srv->fused_rows_bytes / (1024.0 * 1024.0),
                       (unsigned long long)(FUSED_ROWS_BUDGET >> 20));
    ts_sparse_push_close(s);
    ts_session_reply_error(s, TS_MSG_SPARSE_PULL, rx->sp_pull_id, TS_EBUSY, msg);
    return;
  }
  if (code < 0) {
    ts_errmsg_printf(msg, sizeof msg, "the push of this push+pull failed: %s", why);
    ts_sparse_push_close(s);
    ts_session_reply_error(s, TS_MSG_SPARSE_PULL, rx->sp_pull_id, code, msg);
    return;
  }
  ts_rows_reply_t *rb = take_reply(s);
  ts_stable_t *t = ts_store_table(&s->srv->store, m->table);
  ts_require(t != NULL);
  /* One piece: nothing ran between its rows and now, so they are what a pull right behind
   * the push reads, at the version after it. More: other pushes took turns between the
   * pieces, so the rows hold every push done before the first piece (and this one). */
  uint64_t version = rx->npieces > 1 ? rx->sp_version0 : ts_stable_version(t);
  ts_rows_reply_send(s, rb, rx->sp_pull_id, m->table, m->num_keys, m->dim, version,
                     rx->npieces ? rx->sp_t0 : uv_hrtime());
}

/* The worker's progress, as a dense push reports it. */
static void count_push(ts_session_t *s, uint64_t step) {
  ts_server_t *srv = s->srv;
  srv->pushes++;
  ts_barrier_pushed(&srv->barrier, s->task, step);
  if (s->task >= 0 && (uint32_t)s->task < srv->num_workers) {
    srv->workers[s->task].step = step + 1;
    srv->workers[s->task].step_known = true;
  }
}

void ts_sparse_push_handle(ts_session_t *s, Tessera__SparsePush *m, bool discarded) {
  ts_server_t *srv = s->srv;
  ts_store_t *st = &srv->store;
  ts_push_rx_t *rx = &s->rx;
  bool active = rx->active;
  rx->active = false;
  rx->sparse = false;
  rx->sm = NULL;
  ts_push_rx_give_back(srv, rx);
  (void)discarded; /* STALE and DUPLICATE pushes drop their payload on purpose */
  if (!active) {
    int code = rx->refuse_code ? rx->refuse_code : TS_ENOMEM;
    const char *why = rx->refuse_msg[0] ? rx->refuse_msg : "out of memory for the push payload";
    ts_session_reply_error(s, TS_MSG_SPARSE_PUSH, m->request_id, code, why);
    answer_pull(s, m, code, why);
    goto out;
  }
  ts_stable_t *t = ts_store_table(st, m->table);
  ts_require(t != NULL);
  bool sync = st->mode == TS_MODE_SYNC;
  Tessera__PushResult result = rx->sp_result;
  bool applying = result == TESSERA__PUSH_RESULT__PUSH_APPLIED ||
                  result == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED;
  if (applying && sync) {
    /* Heard from for the step (a refused piece included, as a dense push refused for NaN). */
    if (ts_stable_sync_state(t, s->task, m->step) == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED)
      ts_stable_contribute(t, s->task, ts_server_now_ms(srv));
    else
      result = TESSERA__PUSH_RESULT__PUSH_STALE;
  } else if (applying && (rx->sp_pieces_applied > 0 || m->num_keys == 0) && m->piece == 0 &&
             !rx->sp_resumed) {
    ts_stable_bump(t); /* once a push: with its first piece (a cut-off one when it was cut) */
  }
  if (result == TESSERA__PUSH_RESULT__PUSH_STALE) {
    st->stale_dropped++;
    if (s->task >= 0 && (uint32_t)s->task < srv->num_workers) srv->workers[s->task].stale_dropped++;
  } else if (result == TESSERA__PUSH_RESULT__PUSH_DUPLICATE) {
    srv->metrics.push_duplicates++;
    ts_session_log(s, TS_LOG_INFO,
                   "%s: task %d's sparse push %llu to table '%s' for step %llu was a duplicate: "
                   "not applied again",
                   s->conn.peer, s->task, (unsigned long long)m->push_id, ts_stable_name(t),
                   (unsigned long long)m->step);
  }
  if (result == TESSERA__PUSH_RESULT__PUSH_APPLIED || result == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED) {
    ts_pushid_window_t *w = pushid_window(s, m);
    if (w && rx->sp_bad_code == 0) ts_pushid_record(w, m->push_id);
    ts_pushid_part_t *part = pushid_part(s, m->push_id, m->client_incarnation);
    if (part && part->id == m->push_id) memset(part, 0, sizeof *part);
  }
  if ((unsigned)result < 4) srv->metrics.push_parts[result]++;
  /* A push in pieces counts once; async, a push refused before any record went in does
   * not count (its clock does not move); sync, it was heard from for the step. */
  if ((result == TESSERA__PUSH_RESULT__PUSH_APPLIED ||
       result == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED) &&
      m->piece == 0 && (sync || !rx->sp_bad_code || rx->sp_pieces_applied > 0))
    count_push(s, m->step);
  if (rx->sp_bad_code) {
    char detail[512];
    if (rx->sp_bad_code == TS_ENONFINITE) srv->nonfinite++;
    if (rx->sp_pieces_applied == 0)
      ts_errmsg_printf(detail, sizeof detail, "%s; the push was refused and no row changed",
                       rx->refused_detail);
    else
      ts_errmsg_printf(detail, sizeof detail,
                       "%s; the first %llu records were %s before it (a push is checked one "
                       "piece of up to %zu bytes at a time)",
                       rx->refused_detail, (unsigned long long)rx->first[rx->sp_pieces_applied],
                       sync ? "accumulated for the step" : "applied", srv->stage.buf_bytes);
    ts_session_reply_error(s, TS_MSG_SPARSE_PUSH, m->request_id, rx->sp_bad_code, detail);
    answer_pull(s, m, rx->sp_bad_code, detail);
  } else {
    Tessera__SparsePushReply r = TESSERA__SPARSE_PUSH_REPLY__INIT;
    r.request_id = m->request_id;
    r.result = result;
    r.rows = rx->sp_rows;
    r.rows_filtered = rx->sp_filtered;
    if (ts_session_reply(s, TS_MSG_SPARSE_PUSH_REPLY, &r.base) == 0)
      ts_prom_hist_observe(&srv->metrics.push_duration,
                           (double)(uv_hrtime() - rx->start_ns) * 1e-9);
    answer_pull(s, m, 0, NULL);
  }
  if (sync) ts_sync_check_barriers(srv, false);
  ts_waitq_serve(srv);
out:
  ts_msg_free(&m->base);
}
