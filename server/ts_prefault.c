/*
 * A buffer filled by a thread of its own (ts_prefault.h). The caller and the thread share
 * the struct under its mutex; whichever of them is last (the thread done, or the caller
 * having taken or dropped it) frees it. The thread is detached: nobody joins it.
 */
#include "ts_prefault.h"

#include <pthread.h>
#include <string.h>

#include "ts_alloc.h"

struct ts_prefault {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void *buf;
  size_t n;
  int fill;
  bool done;    /* the thread filled buf */
  bool taken;   /* the caller took buf or gave it up, and will not touch p again */
  bool dropped; /* given up: buf is freed by whichever is last */
};

static void destroy(ts_prefault_t *p) {
  if (p->dropped) ts_huge_free(p->buf, p->n);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  ts_free(p);
}

static void *fill_main(void *arg) {
  ts_prefault_t *p = arg;
  memset(p->buf, p->fill, p->n);
  pthread_mutex_lock(&p->mu);
  p->done = true;
  bool last = p->taken;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (last) destroy(p);
  return NULL;
}

ts_prefault_t *ts_prefault_start(size_t n, int fill) {
  ts_prefault_t *p = ts_calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  p->fill = fill;
  p->buf = ts_huge_alloc(n);
  if (!p->buf) {
    ts_free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  pthread_attr_t attr;
  pthread_t th;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)64 << 10);
    rc = pthread_create(&th, &attr, fill_main, p);
    pthread_attr_destroy(&attr);
  }
  if (rc != 0) {
    p->dropped = true;
    destroy(p);
    return NULL;
  }
  return p;
}

void *ts_prefault_take(ts_prefault_t *p) {
  /* The wait is the rest of a fill already under way: less than the whole of it, which
   * the caller would spend itself otherwise. */
  pthread_mutex_lock(&p->mu);
  while (!p->done) pthread_cond_wait(&p->cv, &p->mu);
  p->taken = true;
  pthread_mutex_unlock(&p->mu);
  void *buf = p->buf;
  destroy(p); /* the thread is past its last use of p: done is set under the mutex */
  return buf;
}

void ts_prefault_drop(ts_prefault_t *p) {
  pthread_mutex_lock(&p->mu);
  p->taken = p->dropped = true;
  bool last = p->done;
  pthread_mutex_unlock(&p->mu);
  if (last) destroy(p);
}

size_t ts_prefault_bytes(const ts_prefault_t *p) { return p->n; }
