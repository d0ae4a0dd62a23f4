/*
 * The wait queue: pulls that cannot be answered yet (a sync long poll for the next
 * version, an ssp clock bound, an update pending on a partition) wait here, and are
 * answered when the store moves (ts_waitq_serve after every change) or time out.
 */
#include "ts_server_int.h"

#include <stdio.h>

#include "ts_alloc.h"
#include "ts_err.h"

void ts_waitq_park(ts_session_t *s, Tessera__Pull *m, uint64_t start_ns) {
  ts_server_t *srv = s->srv;
  ts_pull_wait_t *w = ts_malloc(sizeof *w);
  if (!w) {
    ts_session_reply_error(s, TS_MSG_PULL, m->request_id, TS_ENOMEM,
                           "out of memory for a waiting pull");
    ts_msg_free(&m->base);
    return;
  }
  uint64_t timeout = m->timeout_ms ? m->timeout_ms : (uint64_t)(srv->cfg->sync_timeout_s * 3000.0);
  if (timeout < 1000) timeout = 1000;
  w->sess = s;
  w->msg = m;
  w->deadline_ms = ts_server_now_ms(srv) + timeout;
  w->start_ns = start_ns;
  w->next = srv->waiting;
  srv->waiting = w;
}

void ts_waitq_serve(ts_server_t *srv) {
  uint64_t now = ts_server_now_ms(srv);
  ts_pull_wait_t **pp = &srv->waiting;
  while (*pp) {
    ts_pull_wait_t *w = *pp;
    if (ts_pull_ready(srv, w->msg)) {
      *pp = w->next;
      ts_pull_send(w->sess, w->msg, w->start_ns);
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else if (now >= w->deadline_ms) {
      *pp = w->next;
      char detail[256];
      snprintf(
          detail, sizeof detail,
          "pull waited too long: wanted version %llu (clock %llu), shard %u is at version %llu",
          (unsigned long long)w->msg->min_version, (unsigned long long)w->msg->clock, srv->shard,
          (unsigned long long)ts_store_min_version(&srv->store));
      ts_session_reply_error(w->sess, TS_MSG_PULL, w->msg->request_id, TS_ETIMEDOUT, detail);
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else {
      pp = &w->next;
    }
  }
}

void ts_waitq_drop_session(ts_server_t *srv, ts_session_t *s) {
  ts_pull_wait_t **pp = &srv->waiting;
  while (*pp) {
    ts_pull_wait_t *w = *pp;
    if (w->sess == s) {
      *pp = w->next;
      ts_msg_free(&w->msg->base);
      ts_free(w);
    } else {
      pp = &w->next;
    }
  }
}

void ts_waitq_free(ts_server_t *srv) {
  while (srv->waiting) {
    ts_pull_wait_t *w = srv->waiting;
    srv->waiting = w->next;
    ts_msg_free(&w->msg->base);
    ts_free(w);
  }
}
