/*
 * Budgets of the replies queued to peers, in memory (docs/architecture.md, "What one peer
 * may hold"). ts_conn counts what each connection's queued writes take (write requests,
 * encoded frames, allocator overhead, and the bookkeeping of pull replies charged by
 * ts_pull.c) and stops reading a connection over server.max_reply_bytes_per_connection
 * until half of it is written; this module closes the connections that keep the shard
 * holding too much anyway:
 *   - a connection that stays over half its budget for server.reply_full_timeout_s: it
 *     reads, but asks faster than it reads, so it would sit at its cap for ever;
 *   - while the total over all connections is over server.max_reply_bytes, the connection
 *     with the most queued (the oldest of equals) first.
 */
#include "ts_server_int.h"

#include "ts_err.h"
#include "ts_log.h"

/* Memory a session's queued replies still take: a closing one gives it back when libuv
 * reports its cancelled writes, on the next turn of the loop. */
static uint64_t pending_release(const ts_server_t *srv) {
  uint64_t n = 0;
  for (const ts_session_t *s = srv->sessions; s; s = s->next)
    if (s->conn.closing) n += s->conn.write_mem;
  return n;
}

void ts_replyq_enforce(ts_server_t *srv) {
  uint64_t limit = (uint64_t)srv->cfg->max_reply_bytes;
  if (srv->reply_mem <= limit) return;
  uint64_t held = srv->reply_mem - pending_release(srv);
  while (held > limit) {
    ts_session_t *worst = NULL;
    for (ts_session_t *s = srv->sessions; s; s = s->next) {
      if (s->conn.closing) continue;
      if (!worst || s->conn.write_mem > worst->conn.write_mem ||
          (s->conn.write_mem == worst->conn.write_mem && s->id < worst->id))
        worst = s;
    }
    if (!worst || worst->conn.write_mem == 0) return;
    ts_log_warn("%s: replies queued to all connections take %llu bytes, over "
                "server.max_reply_bytes (%llu); closing this one, which holds the most "
                "(%llu bytes)",
                worst->conn.peer, (unsigned long long)held, (unsigned long long)limit,
                (unsigned long long)worst->conn.write_mem);
    srv->metrics.limit_drops[TS_METRICS_LIMIT_REPLY_TOTAL]++;
    held -= worst->conn.write_mem;
    ts_conn_close(&worst->conn, TS_EBUSY);
  }
}

void ts_replyq_tick(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms) {
  uint64_t limit_ms = (uint64_t)(srv->cfg->reply_full_timeout_s * 1000.0);
  for (ts_session_t *s = srv->sessions; s; s = s->next) {
    if (s->conn.closing) continue;
    if (s->conn.write_mem <= s->conn.max_write_mem / 2) {
      s->reply_full_ms = 0;
      continue;
    }
    if (!s->reply_full_ms) {
      s->reply_full_ms = now_ms ? now_ms : 1;
      continue;
    }
    /* The loop did not run for late_ms (this tick is that late: the shard was busy, e.g.
     * making the rows of a large pull): nothing was written meanwhile, so that time is not
     * the peer's. Taken out of its time over half rather than restarting it, so a shard
     * that lags every second still closes a peer that does not read. */
    s->reply_full_ms = s->reply_full_ms + late_ms < now_ms ? s->reply_full_ms + late_ms : now_ms;
    if (now_ms - s->reply_full_ms <= limit_ms) continue;
    ts_log_warn("%s: its queued replies (%llu bytes) stayed over half of "
                "server.max_reply_bytes_per_connection for %.1f s: it asks faster than it "
                "reads (server.reply_full_timeout_s); closing",
                s->conn.peer, (unsigned long long)s->conn.write_mem,
                (double)(now_ms - s->reply_full_ms) / 1000.0);
    srv->metrics.limit_drops[TS_METRICS_LIMIT_REPLY_FULL]++;
    ts_conn_close(&s->conn, TS_EBUSY);
  }
  ts_replyq_enforce(srv);
}
