/*
 * Task ownership and the reports only the task's holder may make (ts_identity.h).
 */
#include "ts_identity.h"

#include <stdio.h>

#include "ts_err.h"
#include "ts_log.h"

/* Alive: open, and a frame from it within job.heartbeat_timeout_s (its heartbeats keep it
 * so while its worker computes). */
static bool holder_alive(const ts_session_t *h) {
  if (h->conn.closing || h->conn.close_after_write) return false;
  uint64_t silent_ns = uv_hrtime() - h->frame_ns;
  return (double)silent_ns / 1e9 <= h->srv->cfg->heartbeat_timeout_s;
}

/* Without a token a task is anyone's claim (the shard listens on loopback only): a second
 * connection beside a live holder is let in without a voice, said once; a silent holder
 * only loses its voice, it is not closed. */
static void claim_without_token(ts_session_t *s, ts_worker_info_t *w, int task) {
  ts_session_t *h = w->holder;
  if (h && h != s && holder_alive(h)) {
    if (!h->dup_warned)
      ts_log_warn("%s: a second connection as worker %d while the one from %s is alive: it "
                  "may push and pull, but the first speaks for the task (goodbye, final "
                  "accuracy); with auth.token_file set it would be refused",
                  s->conn.peer, task, h->conn.peer);
    h->dup_warned = true;
    return;
  }
  if (h) h->holder_of = -1;
  w->holder = s;
  s->holder_of = task;
}

bool ts_identity_claim(ts_session_t *s, uint64_t request_id, int task, bool proven) {
  ts_server_t *srv = s->srv;
  ts_worker_info_t *w = &srv->workers[task];
  s->task_proven = proven;
  if (!srv->token) {
    claim_without_token(s, w, task);
    return true;
  }
  ts_session_t *h = w->holder;
  if (h && h != s) {
    bool alive = holder_alive(h);
    /* A key beats a claim; between equals the live one stays. */
    if (alive && !(proven && !h->task_proven)) {
      char why[300];
      ts_errmsg_printf(why, sizeof why,
                       "worker task %d is held by a live connection from %s; a second "
                       "connection for a task is refused while the first is alive",
                       task, h->conn.peer);
      if (!h->dup_warned)
        ts_log_warn("%s: worker %d refused: the task is held by the live connection from %s "
                    "(further attempts while it holds the task are not logged)",
                    s->conn.peer, task, h->conn.peer);
      h->dup_warned = true;
      ts_metrics_refused(&srv->metrics, TS_METRICS_REQ_HANDSHAKE, TS_EBUSY);
      ts_conn_fail(&s->conn, request_id, TS_EBUSY, why);
      return false;
    }
    ts_log_warn("worker %d: the connection from %s replaces the one from %s (%s)", task,
                s->conn.peer, h->conn.peer,
                alive ? "it proved the task with the task key; the holder only claimed it"
                      : "the holder was silent for longer than job.heartbeat_timeout_s");
    h->holder_of = -1;
    ts_conn_close(&h->conn, TS_ECLOSED);
  }
  w->holder = s;
  s->holder_of = task;
  return true;
}

void ts_identity_release(ts_session_t *s) {
  if (s->holder_of < 0) return;
  ts_worker_info_t *w = &s->srv->workers[s->holder_of];
  if (w->holder == s) w->holder = NULL;
  s->holder_of = -1;
}

bool ts_identity_holds(ts_session_t *s) {
  if (!s->handshaken || s->role != TESSERA__ROLE__ROLE_WORKER || s->task < 0) return false;
  ts_worker_info_t *w = &s->srv->workers[s->task];
  if (w->holder == s) return true;
  if (w->holder && holder_alive(w->holder)) return false;
  /* A second connection let in without a token speaks once the first is gone or silent. */
  if (w->holder) w->holder->holder_of = -1;
  w->holder = s;
  s->holder_of = s->task;
  return true;
}

void ts_identity_final_accuracy(ts_session_t *s, double acc, uint32_t finished) {
  ts_server_t *srv = s->srv;
  int task = s->task;
  const char *why = NULL;
  if (!(acc >= 0.0 && acc <= 1.0)) /* NaN included */
    why = "not an accuracy in [0, 1]";
  else if (srv->has_final_acc && srv->final_acc == acc && srv->final_reporter == task)
    return; /* sent again with a heartbeat */
  else if (srv->has_final_acc)
    why = "the job's final accuracy is set already";
  else if (!ts_identity_holds(s))
    why = "not from the connection that holds the task";
  else if (srv->shard == 0 && task != srv->final_reporter)
    why = "not from the worker chosen to evaluate the final parameters";
  else if (srv->shard != 0 && (finished < srv->num_workers || !srv->barrier.w[task].done))
    why = "the job has not ended";
  if (why) {
    if (!srv->final_refused_warned)
      ts_log_warn("worker %d's final test accuracy %g refused: %s (worker %d reports; further "
                  "refusals are not logged)",
                  task, acc, why, srv->final_reporter);
    srv->final_refused_warned = true;
    return;
  }
  srv->has_final_acc = true;
  srv->final_acc = acc;
  srv->final_reporter = task;
  ts_log_notice("the job's final test accuracy: %.6f (evaluated by worker %d)", acc, task);
}
