/*
 * The wait queue: pulls that cannot be answered yet (a sync long poll for the next
 * version, an ssp clock bound, an update pending on a partition) wait here, and are
 * answered when the store moves (ts_waitq_serve after every change) or time out.
 *
 * What a peer can make it hold is bounded (docs/architecture.md, "What one peer may
 * hold"): server.max_parked_pulls per connection, each for at most server.max_pull_wait_s,
 * and each as a compact copy of its partition list (ts_pull_req_t), never the decoded
 * protobuf.
 */
#include "ts_server_int.h"

#include <stdio.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

static void unpark(ts_server_t *srv, ts_pull_req_t *q) {
  ts_require(q->sess->parked > 0 && srv->num_parked > 0);
  q->sess->parked--;
  srv->num_parked--;
  ts_pull_req_free(srv, q);
}

void ts_waitq_park(ts_session_t *s, ts_pull_req_t *q, uint64_t timeout_ms) {
  ts_server_t *srv = s->srv;
  const ts_config_t *cfg = srv->cfg;
  if (s->parked >= (uint32_t)cfg->max_parked_pulls) {
    char detail[200];
    ts_errmsg_printf(detail, sizeof detail,
             "%u pulls of this connection already wait for a version "
             "(server.max_parked_pulls)",
             s->parked);
    ts_session_log(s, TS_LOG_WARN,
                   "%s: pull %llu refused: %u parked pulls is the limit (server.max_parked_pulls)",
                   s->conn.peer, (unsigned long long)q->request_id, s->parked);
    srv->metrics.limit_refusals[TS_METRICS_LIMIT_PARKED_PULLS]++;
    ts_session_reply_error(s, q->sparse ? TS_MSG_SPARSE_PULL : TS_MSG_PULL, q->request_id,
                           TS_EBUSY, detail);
    ts_pull_req_free(srv, q);
    return;
  }
  uint64_t timeout = timeout_ms ? timeout_ms : (uint64_t)(cfg->sync_timeout_s * 3000.0);
  uint64_t most = (uint64_t)(cfg->max_pull_wait_s * 1000.0);
  if (timeout > most) timeout = most; /* documented: the shard's limit wins */
  if (timeout < 1000) timeout = 1000;
  q->sess = s;
  q->deadline_ms = ts_server_now_ms(srv) + timeout;
  q->next = srv->waiting;
  srv->waiting = q;
  s->parked++;
  srv->num_parked++;
}

void ts_waitq_serve(ts_server_t *srv) {
  uint64_t now = ts_server_now_ms(srv);
  ts_pull_req_t **pp = &srv->waiting;
  while (*pp) {
    ts_pull_req_t *q = *pp;
    if (ts_pull_ready(srv, q)) {
      *pp = q->next;
      ts_pull_send(q->sess, q);
      unpark(srv, q);
    } else if (now >= q->deadline_ms) {
      *pp = q->next;
      char detail[256];
      snprintf(
          detail, sizeof detail,
          "pull waited too long: wanted version %llu (clock %llu), shard %u is at version %llu",
          (unsigned long long)q->min_version, (unsigned long long)q->clock, srv->shard,
          (unsigned long long)ts_store_min_version(&srv->store));
      ts_session_reply_error(q->sess, q->sparse ? TS_MSG_SPARSE_PULL : TS_MSG_PULL,
                             q->request_id, TS_ETIMEDOUT, detail);
      unpark(srv, q);
    } else {
      pp = &q->next;
    }
  }
}

void ts_waitq_drop_session(ts_server_t *srv, ts_session_t *s) {
  ts_pull_req_t **pp = &srv->waiting;
  while (*pp && s->parked > 0) {
    ts_pull_req_t *q = *pp;
    if (q->sess == s) {
      *pp = q->next;
      unpark(srv, q);
    } else {
      pp = &q->next;
    }
  }
}

/* The sessions are gone by now (every handle has closed): free without touching them. */
void ts_waitq_free(ts_server_t *srv) {
  while (srv->waiting) {
    ts_pull_req_t *q = srv->waiting;
    srv->waiting = q->next;
    ts_pull_req_free(srv, q);
  }
  srv->num_parked = 0;
}
