/*
 * When checkpoints are written (the format is ts_ckpt_file.h): periodically while the
 * store changes, on an admin's request (psctl checkpoint), before a requested shutdown and
 * on SIGTERM/SIGINT. A snapshot is taken on the loop and written in the thread pool; one
 * at a time.
 */
#include "ts_server_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_ckpt_tables.h"
#include "ts_err.h"
#include "ts_log.h"

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
  bool full_tables;     /* a full snapshot of tables whose changes are tracked */
  uint64_t changes;     /* ts_ckpt_changes when taken: saved once written */
  uint64_t incarnation; /* the server's when taken (a model reset changes it) */
} ckpt_job_t;

/* Attempts at the final checkpoint of a stop (SIGTERM, psctl shutdown) before the shard
 * stops without it, saying what is lost. */
#define FINAL_TRIES 3

/* A checkpoint was tried and failed, before its write (start_checkpoint) or in it
 * (ckpt_done): one count in /metrics, whoever asked for it, and the reason kept for
 * psctl status/health and /readyz until one is written. */
static void count_failure(ts_server_t *srv, int rc, const char *err) {
  srv->metrics.checkpoints_failed++;
  srv->ckpt_failures++;
  /* An errno says it shortest ("No space left on device"); else the message itself. */
  if (rc < 0 && !ts_err_is_ts(rc))
    snprintf(srv->ckpt_error, sizeof srv->ckpt_error, "%s", strerror(-rc));
  else
    snprintf(srv->ckpt_error, sizeof srv->ckpt_error, "%.199s", err);
  ts_shard_status_publish(srv);
}

/* Whether the store holds updates no checkpoint written holds. */
static bool unsaved(const ts_server_t *srv) {
  return srv->store.declared && !srv->store.awaiting &&
         ts_ckpt_changes(&srv->store) != srv->ckpt_applied;
}

static bool final_checkpoint(ts_server_t *srv);

static void ckpt_work(uv_work_t *req) {
  ckpt_job_t *j = req->data;
  const ts_config_t *cfg = j->srv->cfg;
  uint64_t t0 = uv_hrtime();
  j->rc = ts_ckpt_file_write(j->snap, cfg->checkpoint_dir, cfg->checkpoint_keep, j->path,
                             sizeof j->path, &j->bytes, j->err, sizeof j->err);
  j->seconds = (double)(uv_hrtime() - t0) / 1e9;
}

static void ckpt_done(uv_work_t *req, int status) {
  ckpt_job_t *j = req->data;
  ts_server_t *srv = j->srv;
  ts_require(srv->ckpt_busy); /* one checkpoint at a time: start_checkpoint_job */
  srv->ckpt_busy = false;
  if (status < 0 && j->rc == 0) {
    j->rc = status;
    ts_errmsg_printf(j->err, sizeof j->err, "checkpoint cancelled: %s", uv_strerror(status));
  }
  uint64_t step = j->snap->step;
  if (j->incarnation == srv->incarnation && srv->store.declared) {
    /* Incremental checkpoints: a full one written is the next increments' base. */
    if (j->full_tables) ts_ckpt_tables_full_done(&srv->store, j->rc == 0);
    if (j->rc == 0 && j->full_tables) {
      srv->ckpt_base = j->snap->sequence;
      srv->ckpt_since_full = 0;
    } else if (j->rc == 0 && j->snap->base_sequence) {
      srv->ckpt_since_full++;
    }
  }
  if (j->rc == 0 && j->incarnation == srv->incarnation) {
    /* Saved only now that it is on disk: a failed write leaves the changes to the next. */
    srv->ckpt_applied = j->changes;
    srv->ckpt_saved_step = step;
  }
  if (j->rc == 0) {
    if (srv->ckpt_failures)
      ts_log_notice("checkpoint written after %u failed attempt(s)", srv->ckpt_failures);
    srv->ckpt_failures = 0;
    srv->ckpt_error[0] = '\0';
    srv->ckpts_written++;
    srv->metrics.checkpoints_ok++;
    ts_prom_hist_observe(&srv->metrics.checkpoint_duration, j->seconds);
    srv->metrics.checkpoint_last_success_unix = (double)time(NULL);
    srv->have_ckpt = true;
    srv->last_ckpt_ms = ts_server_now_ms(srv);
    snprintf(srv->last_ckpt, sizeof srv->last_ckpt, "%s", j->path);
    ts_log_info("checkpoint written: %s (step %llu, %.1f MiB, %.0f ms%s)", j->path,
                (unsigned long long)step, (double)j->bytes / (1024.0 * 1024.0), j->seconds * 1000.0,
                j->snap->base_sequence ? ", an increment" : "");
  } else {
    count_failure(srv, j->rc, j->err);
    ts_log_err("checkpoint failed (%u in a row): %s", srv->ckpt_failures, j->err);
  }
  ts_session_t *s = j->session_id ? ts_session_find(srv, j->session_id) : NULL;
  if (s && j->kind == CKPT_ADMIN) {
    if (j->rc == 0) {
      Tessera__CheckpointReply r = TESSERA__CHECKPOINT_REPLY__INIT;
      r.request_id = j->request_id;
      r.path = j->path;
      r.step = step;
      r.bytes = j->bytes;
      r.seconds = j->seconds;
      ts_session_reply(s, TS_MSG_CHECKPOINT_REPLY, &r.base);
    } else {
      ts_session_reply_error(s, TS_MSG_CHECKPOINT, j->request_id,
                             j->rc < 0 && ts_err_is_ts(j->rc) ? j->rc : TS_EINTERNAL, j->err);
    }
  }
  if (s && j->kind == CKPT_SHUTDOWN) {
    Tessera__ShutdownReply r = TESSERA__SHUTDOWN_REPLY__INIT;
    r.request_id = j->request_id;
    r.checkpoint_path = j->rc == 0 ? j->path : (char *)"";
    ts_session_reply(s, TS_MSG_SHUTDOWN_REPLY, &r.base);
  }
  ts_ckpt_snapshot_free(j->snap);
  bool stop = j->kind == CKPT_SHUTDOWN || j->kind == CKPT_SIGNAL || srv->stop_after_ckpt;
  /* A stop waits for a checkpoint of the newest state: one that failed is tried again, and
   * a periodic or requested one that was being written when the stop came is followed by
   * a final one when updates arrived since its snapshot. */
  bool again = j->rc != 0 || j->kind == CKPT_TIMER || j->kind == CKPT_ADMIN;
  ts_free(j);
  if (stop && !(again && final_checkpoint(srv))) ts_server_stop(srv);
}

/* The snapshot and its write, queued; see start_checkpoint. */
static int start_checkpoint_job(ts_server_t *srv, ckpt_kind_t kind, uint64_t session_id,
                                uint64_t request_id, char *errmsg, size_t errlen) {
  if (!srv->cfg->checkpoint_dir || !*srv->cfg->checkpoint_dir) {
    ts_errmsg_printf(errmsg, errlen, "checkpoint.dir is not set: this job keeps no checkpoints");
    return TS_ECONFIG;
  }
  if (srv->ckpt_busy) {
    ts_errmsg_printf(errmsg, errlen, "a checkpoint is being written; try again when it is done");
    return TS_EBUSY;
  }
  /* Periodic ones are increments on the last full one written, but every full_every-th
   * (and the first after a start or a new model); the rest are full (a set to re-shard). */
  const ts_config_t *cfg = srv->cfg;
  bool incremental = kind == CKPT_TIMER && srv->store.num_tables > 0 && srv->ckpt_base &&
                     srv->store.table_budget.track &&
                     srv->ckpt_since_full + 1 < (uint32_t)cfg->checkpoint_full_every &&
                     !ts_ckpt_tables_need_full(&srv->store);
  ts_ckpt_snapshot_t *snap = NULL;
  int rc = ts_ckpt_snapshot(&srv->store, srv->ckpt_seq + 1, incremental ? srv->ckpt_base : 0, &snap,
                            errmsg, errlen);
  if (rc < 0) return rc;
  ckpt_job_t *j = ts_calloc(1, sizeof *j);
  if (!j) {
    ts_ckpt_snapshot_free(snap);
    ts_errmsg_printf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  j->req.data = j;
  j->srv = srv;
  j->snap = snap;
  j->kind = kind;
  j->session_id = session_id;
  j->request_id = request_id;
  j->incarnation = srv->incarnation;
  j->full_tables = !incremental && srv->store.num_tables > 0 && srv->store.table_budget.track;
  rc = uv_queue_work(srv->loop, &j->req, ckpt_work, ckpt_done);
  if (rc < 0) {
    ts_ckpt_snapshot_free(snap);
    ts_free(j);
    ts_errmsg_printf(errmsg, errlen, "cannot start the checkpoint: %s", uv_strerror(rc));
    return rc;
  }
  if (j->full_tables) ts_ckpt_tables_full_taken(&srv->store);
  srv->ckpt_seq++;
  j->changes = ts_ckpt_changes(&srv->store);
  srv->ckpt_busy = true;
  return 0;
}

/* Take a snapshot now and write it in the thread pool. Returns 0 when started, else an
 * error with errmsg: TS_ECONFIG (no checkpoint.dir) and TS_EBUSY (one is being written)
 * refuse before trying; the rest (nothing declared, NaN parameters, no memory) are failed
 * checkpoints and counted as such. */
static int start_checkpoint(ts_server_t *srv, ckpt_kind_t kind, uint64_t session_id,
                            uint64_t request_id, char *errmsg, size_t errlen) {
  int rc = start_checkpoint_job(srv, kind, session_id, request_id, errmsg, errlen);
  if (rc < 0 && rc != TS_ECONFIG && rc != TS_EBUSY) count_failure(srv, rc, errmsg);
  return rc;
}

static void on_ckpt_timer(uv_timer_t *t) {
  ts_server_t *srv = t->data;
  /* Only when something changed since the last one written (a failed one is retried). */
  if (srv->ckpt_busy || !unsaved(srv)) return;
  char err[512];
  int rc = start_checkpoint(srv, CKPT_TIMER, 0, 0, err, sizeof err);
  if (rc < 0) ts_log_err("periodic checkpoint skipped: %s", err);
}

void ts_ckpt_sched_checkpoint(ts_session_t *s, Tessera__Checkpoint *m) {
  char err[512];
  if (ts_session_admin_allowed(s, TS_MSG_CHECKPOINT, m->request_id, "checkpoint")) {
    int rc = start_checkpoint(s->srv, CKPT_ADMIN, s->id, m->request_id, err, sizeof err);
    if (rc < 0)
      ts_session_reply_error(s, TS_MSG_CHECKPOINT, m->request_id,
                             ts_err_is_ts(rc) ? rc : TS_EINTERNAL, err);
  }
  ts_msg_free(&m->base);
}

void ts_ckpt_sched_shutdown(ts_session_t *s, Tessera__Shutdown *m) {
  ts_server_t *srv = s->srv;
  char err[512];
  if (!ts_session_admin_allowed(s, TS_MSG_SHUTDOWN, m->request_id, "shutdown")) goto out;
  ts_log_notice("shutdown requested by %s", s->conn.peer);
  if (m->checkpoint && srv->cfg->checkpoint_dir && *srv->cfg->checkpoint_dir &&
      srv->store.declared) {
    if (srv->ckpt_busy) {
      srv->stop_after_ckpt = true;
    } else if (start_checkpoint(srv, CKPT_SHUTDOWN, s->id, m->request_id, err, sizeof err) == 0) {
      srv->ckpt_final_tries = 1;
      goto out; /* the reply and the stop follow the checkpoint */
    } else {
      ts_log_err("final checkpoint failed: %s", err);
      srv->ckpt_final_tries = 1;
    }
  }
  Tessera__ShutdownReply r = TESSERA__SHUTDOWN_REPLY__INIT;
  r.request_id = m->request_id;
  r.checkpoint_path = (char *)"";
  ts_session_reply(s, TS_MSG_SHUTDOWN_REPLY, &r.base);
  if (!srv->stop_after_ckpt && !(m->checkpoint && final_checkpoint(srv))) ts_server_stop(srv);
out:
  ts_msg_free(&m->base);
}

/* Say what a stop without a checkpoint of the newest state loses. */
static void log_lost(ts_server_t *srv) {
  char held[700] = "no checkpoint was written or restored";
  if (srv->have_ckpt)
    snprintf(held, sizeof held, "the newest checkpoint, %s, holds step %llu", srv->last_ckpt,
             (unsigned long long)srv->ckpt_saved_step);
  ts_log_crit("stopping WITHOUT a checkpoint of steps %llu -> %llu: they are lost (%s; the last "
              "attempt failed: %s)",
              (unsigned long long)srv->ckpt_saved_step,
              (unsigned long long)ts_ckpt_step(&srv->store), held,
              srv->ckpt_error[0] ? srv->ckpt_error : "unknown");
}

/* The final checkpoint of a stop, while what the store holds is not saved and
 * FINAL_TRIES attempts are not used up: true when one was started (the stop follows it),
 * false to stop now (after saying what is lost, if anything). */
static bool final_checkpoint(ts_server_t *srv) {
  char err[512];
  while (srv->cfg->checkpoint_dir && *srv->cfg->checkpoint_dir && unsaved(srv) &&
         srv->ckpt_final_tries < FINAL_TRIES) {
    srv->ckpt_final_tries++;
    if (start_checkpoint(srv, CKPT_SIGNAL, 0, 0, err, sizeof err) == 0) {
      srv->stop_after_ckpt = true;
      ts_log_info("writing a final checkpoint before stopping (attempt %d of %d)",
                  srv->ckpt_final_tries, FINAL_TRIES);
      return true;
    }
    ts_log_err("final checkpoint failed: %s", err);
  }
  if (srv->cfg->checkpoint_dir && *srv->cfg->checkpoint_dir && unsaved(srv)) log_lost(srv);
  return false;
}

bool ts_ckpt_sched_final(ts_server_t *srv) {
  if (!srv->cfg->checkpoint_dir || !*srv->cfg->checkpoint_dir || !unsaved(srv)) return false;
  if (srv->ckpt_busy) {
    srv->stop_after_ckpt = true;
    return true;
  }
  return final_checkpoint(srv);
}

int ts_ckpt_sched_restore(ts_server_t *srv, bool fresh, bool adopt, char *errmsg,
                          size_t errlen) {
  const ts_config_t *cfg = srv->cfg;
  if (!cfg->checkpoint_dir || !*cfg->checkpoint_dir) return 0;
  /* A directory that takes no file would fail every checkpoint, silently until the first:
   * refused now, as a bad key is. */
  if (ts_ckpt_file_probe(cfg->checkpoint_dir, srv->shard, errmsg, errlen) < 0) return TS_ECONFIG;
  ts_ckpt_file_clean_tmp(cfg->checkpoint_dir, srv->shard);
  uint64_t t0 = uv_hrtime(), seq = 0;
  char path[600], err[1536];
  int r = 0;
  if (fresh)
    ts_log_notice("--fresh: not restoring %s; starting with no model (the files there stay, "
                  "and the next checkpoint written is newer than all of them)",
                  cfg->checkpoint_dir);
  else
    r = ts_ckpt_restore(&srv->store, cfg->checkpoint_dir, cfg->checkpoint_restore_from,
                        cfg->num_checkpoint_restore_from, adopt, path, sizeof path, &seq, err,
                        sizeof err);
  if (r == TS_EDATA || r == TS_ENOMEM) {
    /* Old checkpoints exist but none can be used: starting fresh would quietly throw the
     * training away, so the operator decides (docs/operations.md). */
    ts_errmsg_printf(errmsg, errlen, "%s", err);
    return TS_ECONFIG;
  }
  if (r < 0) {
    ts_log_err("%s", err);
  } else if (r >= 1) {
    srv->restored_step = ts_ckpt_step(&srv->store);
    srv->ckpt_saved_step = srv->restored_step;
    srv->have_ckpt = true;
    srv->last_ckpt_ms = ts_server_now_ms(srv);
    srv->ckpt_applied = ts_ckpt_changes(&srv->store);
    srv->metrics.model_bytes = srv->store.bytes + srv->store.state_bytes;
    snprintf(srv->last_ckpt, sizeof srv->last_ckpt, "%s", path);
    ts_log_notice("restored checkpoint %s%s: %zu partition(s), %u table(s) at step %llu in %.0f ms",
                  r == 2 ? "set " : "", path, srv->store.num_parts, srv->store.num_tables,
                  (unsigned long long)srv->restored_step, (double)(uv_hrtime() - t0) / 1e6);
  } else if (!fresh) {
    ts_log_info("no checkpoint in %s: starting fresh", cfg->checkpoint_dir);
  }
  uint64_t last = ts_ckpt_file_last_sequence(cfg->checkpoint_dir, srv->shard);
  srv->ckpt_seq = last > seq ? last : seq;
  return 0;
}

void ts_ckpt_sched_start(ts_server_t *srv) {
  const ts_config_t *cfg = srv->cfg;
  uv_timer_init(srv->loop, &srv->ckpt_timer);
  srv->ckpt_timer.data = srv;
  if (cfg->checkpoint_dir && *cfg->checkpoint_dir && cfg->checkpoint_interval_s > 0) {
    uint64_t ms = (uint64_t)(cfg->checkpoint_interval_s * 1000.0);
    uv_timer_start(&srv->ckpt_timer, on_ckpt_timer, ms, ms);
  }
}
