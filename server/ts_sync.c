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

/* The tasks of cluster.workers that have not joined since the job began, as
 * "task 1 (10.0.0.7:9200), task 3 (...)" into out (cut at n). Returns how many. */
static uint32_t missing_workers(ts_server_t *srv, char *out, size_t n) {
  uint32_t count = 0;
  size_t len = 0;
  out[0] = 0;
  for (uint32_t t = 0; t < srv->num_workers; t++) {
    const ts_barrier_worker_t *w = &srv->barrier.w[t];
    if (w->seen && w->last_seen_ms >= srv->job_since_ms) continue;
    count++;
    const char *addr = t < srv->cfg->num_workers ? srv->cfg->workers[t] : "?";
    if (len + 1 < n)
      len += (size_t)snprintf(out + len, n - len, "%stask %u (%s)", count > 1 ? ", " : "", t, addr);
  }
  return count;
}

#define START_LOG_INTERVAL_MS 5000

/* Step 1 of a sync job waits for every worker of cluster.workers to join (or for
 * job.min_workers of them): until then its barriers do not time out (job.sync_timeout_s),
 * for up to job.start_timeout_s from the first gradient, with a notice every 5 s naming who
 * is missing; then a warning, and step 1 goes on with those that joined. A job past step 1
 * (restored from a checkpoint, or stepped) never waits again; a model reset starts the
 * wait anew. Returns whether this check may time barriers out. */
static bool start_gate(ts_server_t *srv, uint64_t now, bool timeouts) {
  if (srv->start_passed) return timeouts;
  uint32_t joined = ts_barrier_count_joined(&srv->barrier, srv->job_since_ms);
  uint32_t need = srv->num_workers;
  if (srv->cfg->min_workers > 0 && (uint32_t)srv->cfg->min_workers < need)
    need = (uint32_t)srv->cfg->min_workers;
  if (ts_store_min_version(&srv->store) > 0 || joined >= srv->num_workers) {
    srv->start_passed = true;
    return timeouts;
  }
  if (joined >= need) {
    char missing[512];
    uint32_t n = missing_workers(srv, missing, sizeof missing);
    ts_log_notice("sync job: step 1 begins with %u of %u workers (job.min_workers %u); %u "
                  "not joined yet: %s",
                  joined, srv->num_workers, need, n, missing);
    srv->start_passed = true;
    return timeouts;
  }
  bool first = srv->start_wait_ms == 0;
  if (first) srv->start_wait_ms = srv->start_log_ms = now;
  char missing[512];
  uint32_t n = missing_workers(srv, missing, sizeof missing);
  double waited = (double)(now - srv->start_wait_ms) / 1000.0;
  if (waited >= srv->cfg->start_timeout_s) {
    ts_log_warn("sync job: step 1 proceeds with %u of %u workers after %.0f s "
                "(job.start_timeout_s); %u never joined: %s",
                joined, srv->num_workers, waited, n, missing);
    srv->start_passed = true;
    return timeouts;
  }
  if (first || now - srv->start_log_ms >= START_LOG_INTERVAL_MS) {
    srv->start_log_ms = now;
    char goal[64] = "";
    if (need < srv->num_workers)
      snprintf(goal, sizeof goal, " (step 1 begins with %u: job.min_workers)", need);
    ts_log_notice("sync job waiting for its workers before step 1 for %.0f s: %u of %u "
                  "joined%s; missing %s; step 1 proceeds without them after %.0f s "
                  "(job.start_timeout_s)",
                  waited, joined, srv->num_workers, goal, missing, srv->cfg->start_timeout_s);
  }
  return false;
}

void ts_sync_check_barriers(ts_server_t *srv, bool timeouts) {
  if (srv->store.mode != TS_MODE_SYNC || !srv->store.declared) return;
  uint64_t now = ts_server_now_ms(srv);
  bool moved = false, gated = false;
  for (size_t i = 0; i < srv->store.num_parts; i++) {
    ts_spart_t *p = ts_store_part_at(&srv->store, i);
    uint32_t have = ts_store_sync_count(p);
    if (have == 0 || ts_store_sync_pending(p)) continue;
    if (!gated) timeouts = start_gate(srv, now, timeouts);
    gated = true;
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
