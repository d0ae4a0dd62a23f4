/*
 * The sync barrier applied to the store: the pure rules (ts_barrier.h) decide when a step of
 * a partition closes, this closes it (ts_store_sync_complete) and answers the pulls that
 * waited for it. Called after every push and goodbye (ts_push_rx.c, ts_session.c) and,
 * with timeouts, by the lifecycle's tick (ts_server.c); liveness is heard here too.
 */
#include "ts_server_int.h"

#include <stdio.h>

#include "ts_log.h"

/* The tables' steps: the same rules, a barrier per table. */
static bool check_tables(ts_server_t *srv, uint64_t now, bool timeouts) {
  ts_store_t *st = &srv->store;
  bool moved = false;
  for (uint32_t i = 0; i < st->num_tables; i++) {
    ts_stable_t *t = ts_store_table(st, i);
    uint32_t have = ts_stable_sync_count(t);
    if (have == 0) continue;
    const uint8_t *contributed = ts_stable_contributed(t);
    uint64_t opened = ts_stable_opened_ms(t);
    ts_barrier_verdict_t v =
        ts_barrier_check(&srv->barrier, contributed, have, opened, now, timeouts);
    if (v == TS_BARRIER_WAIT) continue;
    if (v == TS_BARRIER_TIMEOUT)
      ts_log_warn("sync barrier of table '%s' version %llu proceeds after %.1f s with %u of %u "
                  "gradients",
                  ts_stable_name(t), (unsigned long long)ts_stable_version(t),
                  srv->cfg->sync_timeout_s, have, ts_barrier_required(&srv->barrier, contributed));
    ts_prom_hist_observe(&srv->metrics.barrier_wait, (double)(now - opened) / 1000.0);
    ts_stable_sync_complete(t, &st->table_budget);
    moved = true;
  }
  return moved;
}

void ts_sync_check_barriers(ts_server_t *srv, bool timeouts) {
  if (srv->store.mode != TS_MODE_SYNC || !srv->store.declared) return;
  uint64_t now = ts_server_now_ms(srv);
  bool moved = false;
  for (size_t i = 0; i < srv->store.num_parts; i++) {
    ts_spart_t *p = ts_store_part_at(&srv->store, i);
    uint32_t have = ts_store_sync_count(p);
    if (have == 0 || ts_store_sync_pending(p)) continue;
    const uint8_t *contributed = ts_store_contributed(p);
    uint64_t opened = ts_store_opened_ms(p);
    ts_barrier_verdict_t v =
        ts_barrier_check(&srv->barrier, contributed, have, opened, now, timeouts);
    if (v == TS_BARRIER_WAIT) continue;
    if (v == TS_BARRIER_TIMEOUT) {
      uint32_t need = ts_barrier_required(&srv->barrier, contributed);
      ts_store_record_t r;
      ts_store_record(&srv->store, p, &r);
      char missing[256] = "";
      size_t len = 0;
      for (uint32_t t = 0; t < srv->num_workers && len < sizeof missing - 8; t++)
        if (!contributed[t])
          len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%u", len ? "," : "", t);
      ts_log_warn(
          "sync barrier of '%s' part %u version %llu proceeds after %.1f s with %u of %u "
          "gradients; missing tasks [%s]",
          srv->store.tensors[r.tensor].name, r.part, (unsigned long long)r.version,
          srv->cfg->sync_timeout_s, have, need, missing);
    }
    ts_prom_hist_observe(&srv->metrics.barrier_wait, (double)(now - opened) / 1000.0);
    moved |= ts_store_sync_complete(&srv->store, p);
  }
  moved |= check_tables(srv, now, timeouts);
  if (moved) ts_waitq_serve(srv);
}

void ts_sync_worker_seen(ts_server_t *srv, int task) {
  if (ts_barrier_heard(&srv->barrier, task, ts_server_now_ms(srv)))
    ts_log_notice("worker %d is alive again", task);
}
