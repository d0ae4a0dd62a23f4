/*
 * Threads waiting in ts_client_wait take a share of the client thread's work.
 *
 * A table pull's reply lands in the request's own buffer, in the order of its distinct keys,
 * and its rows must then go to the caller's places (a key the caller listed twice, its row
 * twice): at 65,536 keys and more that is a fifth to a third of the client thread's time
 * (bench/RESULTS.md 17.12). The caller's thread meanwhile only waits. So while a thread waits
 * in ts_client_wait on this client, the client thread leaves each reply's rows to it (a
 * task in c->help) and goes on reading the next reply and sending the next piece.
 *
 * Any waiting thread takes any task of its client: ps-worker waits for its dense request
 * while its table requests' rows land. With no thread waiting, the client thread puts the
 * rows in place itself as they land, as before (a request with a callback has no waiter).
 * Before a request is published the client thread puts in place what no waiter took and
 * waits for what a waiter is putting in place (ts_cl_help_settle): the request is done only
 * once its rows are, and its memory is freed only when no other thread uses it.
 *
 * Locking: c->help, c->helpers and each request's help_queued and help_busy are under c->mu;
 * a waiter puts rows in place without it. c->n_help is stored under c->mu and read without
 * it by a waiter polling (ts_cl_wait_flag), which then takes a task under c->mu.
 */
#include "ts_client_int.h"

bool ts_cl_help_post(ts_client_t *c, ts_cl_sparse_t *sp, size_t off, size_t n) {
  if (n == 0) return true;
  uv_mutex_lock(&c->mu);
  unsigned k = atomic_load_explicit(&c->n_help, memory_order_relaxed);
  bool posted = c->helpers > 0 && k < TS_CL_HELP_MAX;
  if (posted) {
    c->help[k] = (ts_cl_help_t){sp, off, n};
    sp->help_queued++;
    atomic_store_explicit(&c->n_help, k + 1, memory_order_release);
    uv_cond_broadcast(&c->cv);
  }
  uv_mutex_unlock(&c->mu);
  return posted;
}

/* Under c->mu: take task i out of c->help (the order of the others kept). */
static ts_cl_help_t take(ts_client_t *c, unsigned i) {
  unsigned k = atomic_load_explicit(&c->n_help, memory_order_relaxed);
  ts_cl_help_t t = c->help[i];
  for (unsigned j = i + 1; j < k; j++) c->help[j - 1] = c->help[j];
  atomic_store_explicit(&c->n_help, k - 1, memory_order_release);
  t.sp->help_queued--;
  return t;
}

void ts_cl_help_settle(ts_client_t *c, ts_cl_sparse_t *sp, bool run) {
  uv_mutex_lock(&c->mu);
  while (sp->help_queued > 0) {
    ts_cl_help_t t = {0};
    for (unsigned i = 0; i < atomic_load_explicit(&c->n_help, memory_order_relaxed); i++) {
      if (c->help[i].sp == sp) {
        t = take(c, i);
        break;
      }
    }
    if (!t.sp) break; /* cannot happen: help_queued counts sp's tasks in c->help */
    if (run) {
      uv_mutex_unlock(&c->mu);
      ts_cl_sparse_scatter(sp, t.off, t.n);
      uv_mutex_lock(&c->mu);
    }
  }
  while (sp->help_busy > 0) uv_cond_wait(&c->cv, &c->mu);
  uv_mutex_unlock(&c->mu);
}

/* A waiting thread: put one task's rows in place. */
static void help_once(ts_client_t *c) {
  uv_mutex_lock(&c->mu);
  if (atomic_load_explicit(&c->n_help, memory_order_relaxed) == 0) {
    uv_mutex_unlock(&c->mu);
    return;
  }
  ts_cl_help_t t = take(c, 0);
  t.sp->help_busy++;
  uv_mutex_unlock(&c->mu);
  ts_cl_sparse_scatter(t.sp, t.off, t.n);
  uv_mutex_lock(&c->mu);
  /* The client thread may wait for it (ts_cl_help_settle) on the one condition variable. */
  if (--t.sp->help_busy == 0) uv_cond_broadcast(&c->cv);
  uv_mutex_unlock(&c->mu);
}

typedef struct {
  ts_client_t *c;
  bool (*done)(void *);
  void *arg;
} waiter_t;

static bool done_or_work(void *arg) {
  waiter_t *w = arg;
  return w->done(w->arg) || atomic_load_explicit(&w->c->n_help, memory_order_acquire) > 0;
}

void ts_cl_wait_helping(ts_client_t *c, bool (*done)(void *), void *arg) {
  waiter_t w = {c, done, arg};
  uv_mutex_lock(&c->mu);
  c->helpers++;
  uv_mutex_unlock(&c->mu);
  for (;;) {
    ts_cl_wait_flag(c, done_or_work, &w);
    if (done(arg)) break;
    help_once(c);
  }
  uv_mutex_lock(&c->mu);
  c->helpers--;
  uv_mutex_unlock(&c->mu);
}
