/* The client thread (ts_client_int.h): its loop and timers, the hand-over of ops from the
 * callers' threads (a locked queue and uv_async_send) and their waits for the results (a
 * condition variable, after busy_poll_us of polling), and the loop's shutdown. What an op
 * does once handed over is ts_client_ops.c's; this file only starts, expires and aborts
 * ops, so the two are layered, not a circle. */
#include "ts_client_int.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>

#include "ts_err.h"
#include "ts_log.h"
#include "ts_poll.h"

void ts_cl_on_tick(uv_timer_t *t) {
  ts_client_t *c = t->data;
  uint64_t now = uv_now(&c->loop);
  ts_cl_check_links(c, now);
  ts_cl_log_waiting(c, now);
  ts_cl_expire_ops(c, now);
}

void ts_cl_on_heartbeat(uv_timer_t *t) {
  ts_client_t *c = t->data;
  for (uint32_t s = 0; s < c->n; s++)
    if (c->shards[s].state == SH_READY) ts_cl_submit_wire(c, &c->shards[s], NULL, TS_MSG_HEARTBEAT, NULL, 0);
}

static void close_cb_noop(uv_handle_t *h) { (void)h; }

static void shutdown_loop(ts_client_t *c) {
  ts_cl_abort_ops(c, TS_ESHUTDOWN, "client closed");
  /* A client that said it is done (ts_client_set_progress(..., done = true): finished, or a
   * worker stopped by a signal) tells each shard once more as it closes, so the shard shows
   * it stopped rather than dead once its heartbeats stop. Best effort and never waited for:
   * the frame goes out if the socket takes it at once (a small frame on an idle
   * connection), else the close below cancels it. */
  uv_mutex_lock(&c->mu);
  bool done = c->p_done;
  uv_mutex_unlock(&c->mu);
  for (uint32_t s = 0; done && s < c->n; s++)
    if (c->shards[s].state == SH_READY && c->shards[s].link)
      (void)ts_cl_submit_wire(c, &c->shards[s], NULL, TS_MSG_HEARTBEAT, NULL, 0);
  for (uint32_t s = 0; s < c->n; s++) {
    ts_cl_shard_t *sh = &c->shards[s];
    uv_close((uv_handle_t *)&sh->retry, close_cb_noop);
    if (sh->resolving) (void)uv_cancel((uv_req_t *)&sh->gai); /* else its callback sees stop */
    while (sh->queued) {
      ts_cl_wreq_t *r = sh->queued;
      sh->queued = r->next;
      ts_cl_free_wreq(r);
    }
    if (sh->link) {
      ts_cl_link_t *l = sh->link;
      sh->link = NULL;
      l->sh = NULL;
      while (sh->pending) {
        ts_cl_wreq_t *r = sh->pending;
        sh->pending = r->next;
        ts_cl_free_wreq(r);
      }
      ts_conn_close(&l->conn, 0);
    }
  }
  uv_close((uv_handle_t *)&c->tick, close_cb_noop);
  uv_close((uv_handle_t *)&c->hb, close_cb_noop);
  uv_close((uv_handle_t *)&c->wake, close_cb_noop);
}

void ts_cl_on_wake(uv_async_t *a) {
  ts_client_t *c = a->data;
  c->activity++;
  uv_mutex_lock(&c->mu);
  ts_cl_op_t *ops = c->queue_head;
  c->queue_head = c->queue_tail = NULL;
  bool stop = c->stop;
  uv_mutex_unlock(&c->mu);
  if (c->interrupted) ts_cl_abort_ops(c, TS_ESHUTDOWN, "interrupted");
  while (ops) {
    ts_cl_op_t *next = ops->next;
    ops->next = NULL;
    if (stop || c->interrupted)
      ts_cl_refuse_op(c, ops, TS_ESHUTDOWN, c->interrupted ? "interrupted" : "client closed");
    else
      ts_cl_start_op(c, ops);
    ops = next;
  }
  if (stop) shutdown_loop(c);
}

/* ts_poll's activity: a frame read or a call handed over since the last look. An op in
 * flight alone is not activity: a sync pull may wait seconds for the other workers, and on
 * a small machine a thread polling all that time takes CPU from the workers and shards
 * that must answer it (train.sh measured async examples/s lower when it did). */
static bool client_active(void *arg) {
  ts_client_t *c = arg;
  bool active = c->activity != c->activity_seen;
  c->activity_seen = c->activity;
  return active;
}

/* The client thread's own log lines (and ts_conn's, on this thread) go to the user's
 * callback, or nowhere. */
static void log_sink(void *arg, ts_log_level_t level, const char *msg) {
  ts_client_t *c = arg;
  if (c->opts.log) c->opts.log(c->opts.log_arg, (int)level, msg);
}

void ts_cl_thread_main(void *arg) {
  ts_client_t *c = arg;
  /* A write to a socket the peer closed raises SIGPIPE in the writing thread, and only
   * this thread writes to the shards: blocking it here spares the process a handler. */
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, NULL);
  ts_log_set_thread_sink(log_sink, c, (ts_log_level_t)c->opts.log_level);
  for (uint32_t s = 0; s < c->n; s++) ts_cl_start_connect(&c->shards[s]);
  ts_poll_run(&c->loop, c->opts.busy_poll_us, client_active, c);
  ts_log_set_thread_sink(NULL, NULL, TS_LOG_INFO);
}

bool ts_cl_on_client_thread(ts_client_t *c) {
  uv_thread_t self = uv_thread_self();
  return uv_thread_equal(&self, &c->thread) != 0;
}

int ts_cl_enqueue(ts_client_t *c, ts_cl_op_t *op) {
  uv_mutex_lock(&c->mu);
  if (c->stop || c->interrupted) {
    uv_mutex_unlock(&c->mu);
    return TS_ESHUTDOWN;
  }
  op->next = NULL;
  if (c->queue_tail)
    c->queue_tail->next = op;
  else
    c->queue_head = op;
  c->queue_tail = op;
  uv_mutex_unlock(&c->mu);
  uv_async_send(&c->wake);
  return 0;
}

/* Poll for a quick answer before sleeping: a wake-up from the condition variable costs more
 * than a loopback round trip on a virtual machine. Yielding on every turn keeps a poller
 * from holding a CPU that the client thread (or a shard) needs. */
void ts_cl_wait_flag(ts_client_t *c, bool (*done)(void *), void *arg) {
  if (c->opts.busy_poll_us > 0) {
    uint64_t until = uv_hrtime() + (uint64_t)c->opts.busy_poll_us * 1000u;
    while (!done(arg) && uv_hrtime() < until) sched_yield();
  }
  if (!done(arg)) {
    uv_mutex_lock(&c->mu);
    while (!done(arg)) uv_cond_wait(&c->cv, &c->mu);
    uv_mutex_unlock(&c->mu);
  }
}

static bool op_done(void *arg) {
  ts_cl_op_t *op = arg;
  return atomic_load_explicit(&op->done, memory_order_acquire);
}

/* Run an internal op on the client thread and wait for it. */
int ts_cl_run_op(ts_client_t *c, ts_cl_op_t *op, char *errmsg, size_t errlen) {
  if (ts_cl_on_client_thread(c)) {
    if (errmsg) snprintf(errmsg, errlen, "a blocking call cannot be made on the client thread");
    return TS_EINVAL;
  }
  op->timeout_s = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
  if (ts_cl_enqueue(c, op) < 0) {
    if (errmsg) snprintf(errmsg, errlen, "%s", c->interrupted ? "interrupted" : "client closed");
    return TS_ESHUTDOWN;
  }
  ts_cl_wait_flag(c, op_done, op);
  if (op->rc < 0 && errmsg) snprintf(errmsg, errlen, "%s", op->err[0] ? op->err : ts_strerror(op->rc));
  return op->rc;
}
