/*
 * The server's lifecycle: start (tokens, address, admin endpoint, restore, listen, timers,
 * signals), stop, free, and the tick that applies the barrier rules (ts_barrier.h) with the
 * loop's clock: heartbeats, barrier timeouts, peers that stall everybody. The jobs of a
 * running shard are in the modules ts_server_int.h lists.
 */
#include "ts_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_ckpt_file.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_notify.h"
#include "ts_server_int.h"
#include "ts_tls.h"

/* A stopping shard drops a peer that does not read its last replies after this long at
 * most: the connection would otherwise keep the shard from ever exiting. */
#define STOP_STALL_MS 1000

/* A frame past server.frame_grace_s that arrived slower than server.min_recv_bytes_per_s
 * on average (a peer trickling bytes to hold a connection and its buffers: any byte
 * resetting an idle clock would let it live forever): log and count it; true to close. */
static bool too_slow(ts_server_t *srv, ts_session_t *s, uint64_t now) {
  uint64_t floor = (uint64_t)srv->cfg->min_recv_bytes_per_s;
  uint64_t age = ts_conn_frame_age_ms(&s->conn, now);
  if (floor == 0 || age <= (uint64_t)(srv->cfg->frame_grace_s * 1000.0)) return false;
  uint64_t bytes = s->conn.frame_bytes;
  if (bytes >= floor * age / 1000) return false;
  srv->metrics.dropped[TS_METRICS_DROP_SLOW_FRAME]++;
  ts_log_warn(
      "%s: a frame has come in at %.0f bytes/s for %.1f s (%llu bytes), below "
      "server.min_recv_bytes_per_s = %llu: closing",
      s->conn.peer, (double)bytes * 1000.0 / (double)age, (double)age / 1000.0,
      (unsigned long long)bytes, (unsigned long long)floor);
  return true;
}

/* Close the peers that hold others up: one that has not read its replies for limit_ms (its
 * pull replies never finish, so pushes to their partitions wait; and it holds our memory),
 * one that stopped sending half way through a push for as long while holding a staging
 * buffer (the pushes queued for a buffer would wait for it forever), and one trickling a
 * frame (too_slow). */
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
      ts_log_warn(
          "%s: sent nothing for %.1f s in the middle of a push, holding a staging "
          "buffer: closing",
          s->conn.peer, (double)stall / 1000.0);
      ts_conn_close(&s->conn, TS_ETIMEDOUT);
      continue;
    }
    if (too_slow(srv, s, now)) ts_conn_close(&s->conn, TS_ETIMEDOUT);
  }
}

/* A tick more than this late is logged: the shard read and sent nothing for that long. */
#define LAG_WARN_MS 1000

/* How late this tick runs (the loop's lag: time spent in callbacks, or the process not
 * scheduled at all), observed in tessera_ps_loop_lag_seconds and, past LAG_WARN_MS, logged.
 * The repeat timer is re-armed TS_SERVER_TICK_MS after it fires, so the lag is the gap
 * between two ticks less that. */
static uint64_t tick_lag(ts_server_t *srv, uint64_t now) {
  uint64_t gap = now - srv->last_tick_ms;
  uint64_t late = gap > TS_SERVER_TICK_MS ? gap - TS_SERVER_TICK_MS : 0;
  srv->last_tick_ms = now;
  ts_prom_hist_observe(&srv->metrics.loop_lag, (double)late / 1000.0);
  if (late > LAG_WARN_MS)
    ts_log_warn("the shard's tick ran %.1f s late: the event loop did not run (a long "
                "callback, or the process was not scheduled), so nothing was read or sent for "
                "that long; peers are not judged over it",
                (double)late / 1000.0);
  return late;
}

static void on_tick(uv_timer_t *t) {
  ts_server_t *srv = t->data;
  uint64_t now = ts_server_now_ms(srv);
  uint64_t late = tick_lag(srv, now);
  uint64_t hb = (uint64_t)(srv->cfg->heartbeat_timeout_s * 1000.0);
  if (srv->stopping) {
    drop_stalled_peers(srv, now, hb / 2 < STOP_STALL_MS ? hb / 2 : STOP_STALL_MS);
    return;
  }
  /* A tick more than LAG_WARN_MS late judges no peer by how long it has been silent: the
   * frames that waited while the loop did not run (heartbeats, handshakes, the rest of a
   * push) are read after this tick, so every peer would look as silent as the shard itself
   * was. The next tick, 100 ms on, judges them with those frames read. */
  bool judge = late <= LAG_WARN_MS;
  uint32_t dead[64];
  uint32_t ndead;
  /* Dead workers are reported 64 at a time; the rest on the next tick. */
  while (judge && (ndead = ts_barrier_expire(&srv->barrier, now, dead, 64)) > 0) {
    for (uint32_t i = 0; i < ndead; i++)
      ts_log_warn("worker %u missed heartbeats for %.1f s: marked dead", dead[i],
                  (double)(now - srv->barrier.w[dead[i]].last_seen_ms) / 1000.0);
    if (ndead < 64) break;
  }
  /* Half the heartbeat timeout, so the pushers a stalled peer holds up, who cannot be read
   * meanwhile, are not themselves taken for dead by their clients. */
  if (judge) {
    drop_stalled_peers(srv, now, hb / 2);
    ts_session_preauth_expire(srv, now);
  }
  /* What one peer may hold (docs/architecture.md): a staging buffer, a partition, memory. */
  ts_push_rx_drop_slow(srv, now, late);
  ts_pull_drop_slow_readers(srv, now, late);
  ts_replyq_tick(srv, now, late);
  ts_sync_check_barriers(srv, true);
  ts_sparse_tick(srv);
  ts_waitq_serve(srv);
  ts_shard_status_publish(srv);
}

static void on_handle_closed(uv_handle_t *h) {
  ts_server_t *srv = h->data;
  srv->open_handles--;
}

/* A stopping shard keeps its tick until the last connection is gone: the tick drops the
 * peers that would never let their connection finish closing (drop_stalled_peers). */
void ts_server_stop_tick_when_idle(ts_server_t *srv) {
  if (srv->stopping && srv->num_sessions == 0 && !uv_is_closing((uv_handle_t *)&srv->tick))
    uv_close((uv_handle_t *)&srv->tick, on_handle_closed);
}

void ts_server_stop(ts_server_t *srv) {
  if (srv->stopping) return;
  srv->stopping = true;
  ts_notify("STOPPING=1");
  ts_shard_status_publish(srv);
  ts_log_info("shutting down: closing %zu connection(s)", srv->num_sessions);
  uv_close((uv_handle_t *)&srv->listener, on_handle_closed);
  uv_close((uv_handle_t *)&srv->sigterm, on_handle_closed);
  uv_close((uv_handle_t *)&srv->sigint, on_handle_closed);
  uv_close((uv_handle_t *)&srv->ckpt_timer, on_handle_closed);
  for (ts_session_t *s = srv->sessions; s; s = s->next)
    ts_conn_close_graceful(&s->conn, TS_ESHUTDOWN);
  ts_server_stop_tick_when_idle(srv);
}

static void on_signal(uv_signal_t *h, int signum) {
  ts_server_t *srv = h->data;
  ts_log_notice("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  if (srv->stop_after_ckpt || srv->stopping) {
    ts_server_stop(srv); /* a second signal: stop now */
    return;
  }
  if (ts_ckpt_sched_final(srv)) return; /* the stop follows the checkpoint */
  ts_server_stop(srv);
}

static bool is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
  return false;
}

int ts_server_start(ts_server_t **out, uv_loop_t *loop, const ts_server_opts_t *opts, char *errmsg,
                    size_t errlen) {
  *out = NULL;
  const ts_config_t *cfg = opts->cfg;
  if (opts->shard >= cfg->num_ps) {
    ts_errmsg_printf(errmsg, errlen, "shard %u does not exist: cluster.ps lists %zu shard(s)", opts->shard,
             cfg->num_ps);
    return TS_ECONFIG;
  }
  if (sodium_init() < 0) {
    ts_errmsg_printf(errmsg, errlen, "libsodium failed to initialise");
    return TS_EINTERNAL;
  }
  ts_server_t *srv = ts_calloc(1, sizeof *srv);
  if (!srv) return TS_ENOMEM;
  int rc = 0;
  srv->loop = loop;
  uv_update_time(loop);
  srv->started_ms = uv_now(loop);
  srv->final_reporter = -1;
  srv->job_since_ms = srv->started_ms;
  srv->cfg = cfg;
  srv->shard = opts->shard;
  srv->num_workers = (uint32_t)cfg->num_workers;
  srv->workers = ts_calloc(srv->num_workers ? srv->num_workers : 1, sizeof *srv->workers);
  if (!srv->workers ||
      ts_barrier_init(&srv->barrier, srv->num_workers,
                      cfg->replicas_to_aggregate > 0 ? (uint32_t)cfg->replicas_to_aggregate : 0,
                      (uint64_t)(cfg->sync_timeout_s * 1000.0),
                      (uint64_t)(cfg->heartbeat_timeout_s * 1000.0),
                      cfg->staleness > 0 ? (uint64_t)cfg->staleness : 0) < 0 ||
      ts_pushid_init(&srv->pushids, srv->num_workers, (uint32_t)cfg->push_dedup_clients) < 0) {
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
  if (cfg->checkpoint_sign && !srv->admin_token) {
    ts_errmsg_printf(errmsg, errlen,
                     "checkpoint.sign needs auth.admin_token_file: the signing key is derived "
                     "from the admin token");
    rc = TS_ECONFIG;
    goto fail;
  }
  if (cfg->checkpoint_sign) ts_ckpt_file_set_key(srv->admin_token);
  if (cfg->tls) {
    ts_tls_files_t files = {cfg->tls_ca_file, cfg->tls_cert_file, cfg->tls_key_file};
    char why[400];
    if ((rc = ts_tls_ctx_new(&srv->tls, &files, true, why, sizeof why)) < 0) {
      ts_errmsg_printf(errmsg, errlen, "auth.tls: %s", why);
      goto fail;
    }
  }

  struct addrinfo *ai = NULL;
  char why[300];
  if (ts_addr_resolve(srv->address, false, &ai, why, sizeof why) < 0) {
    ts_errmsg_printf(errmsg, errlen, "cluster.ps[%u]: %s", opts->shard, why);
    rc = TS_ECONFIG;
    goto fail;
  }
  if (!is_loopback(ai->ai_addr) && !srv->token && !opts->insecure) {
    ts_errmsg_printf(errmsg, errlen,
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
  srv->metrics.model_bytes_limit = srv->store.max_model_bytes;
  if (cfg->num_ps_http > opts->shard &&
      (rc = ts_shard_admin_start(&srv->admin, cfg, opts->shard, errmsg, errlen)) < 0) {
    freeaddrinfo(ai);
    goto fail;
  }

  /* Restore before listening: a client that can connect finds the restored model. */
  randombytes_buf(&srv->incarnation, sizeof srv->incarnation);
  if ((rc = ts_ckpt_sched_restore(srv, opts->fresh, opts->adopt, errmsg, errlen)) < 0) {
    freeaddrinfo(ai);
    goto fail;
  }
  uv_tcp_init(loop, &srv->listener);
  srv->listener.data = srv;
  srv->open_handles++;
  rc = uv_tcp_bind(&srv->listener, ai->ai_addr, 0);
  freeaddrinfo(ai);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, 512, ts_session_accept);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot listen on %s: %s", srv->address, uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->listener, on_handle_closed);
    uv_run(loop, UV_RUN_NOWAIT);
    goto fail;
  }
  ts_ckpt_sched_start(srv);
  srv->open_handles++;
  uv_timer_init(loop, &srv->tick);
  srv->tick.data = srv;
  srv->open_handles++;
  srv->last_tick_ms = uv_now(loop); /* the first tick's lag counts from here */
  uv_timer_start(&srv->tick, on_tick, TS_SERVER_TICK_MS, TS_SERVER_TICK_MS);
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
  ts_shard_status_publish(srv);
  char decay[96] = "";
  if (cfg->decay != TS_DECAY_NONE)
    snprintf(decay, sizeof decay, ", %s decay over %lld updates", ts_decay_name(cfg->decay),
             (long long)cfg->decay_steps);
  ts_log_info("shard %u of %zu listening on %s (mode %s, %zu worker(s), optimizer %s, lr %g%s)",
              srv->shard, cfg->num_ps, srv->address, ts_mode_name(cfg->mode), cfg->num_workers,
              ts_optimizer_name(cfg->optimizer), cfg->learning_rate, decay);
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
  /* Called after the loop ran out (or a failed start ran it): every handle we opened has
   * closed, or the loop would still hold pointers into srv. */
  ts_require(srv->open_handles == 0);
  ts_admin_stop(srv->admin);
  ts_waitq_free(srv);
  ts_store_free(&srv->store);
  ts_stage_free(&srv->stage);
  ts_free(srv->workers);
  ts_barrier_free(&srv->barrier);
  ts_pushid_free(&srv->pushids);
  ts_rows_reply_cache_free(srv);
  ts_auth_free_token(srv->token);
  ts_auth_free_token(srv->admin_token);
  ts_tls_ctx_free(srv->tls);
  ts_free(srv);
}
