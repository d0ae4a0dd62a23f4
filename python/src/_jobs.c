/* tessera._client: errors, clocks, the log queue and the helper-thread jobs of the blocking
 * calls (_client_int.h). */
#include "_client_int.h"

/* --- errors ----------------------------------------------------------------------------- */

PyObject *error_factory; /* tessera._errors.from_code(code, message) -> exception */

/* Raise the exception of code with message (the library's errmsg, or its strerror). */
PyObject *raise_code(int code, const char *msg) {
  if (!msg || !*msg) msg = ts_client_strerror(code);
  if (error_factory) {
    PyObject *exc = PyObject_CallFunction(error_factory, "is", code, msg);
    if (!exc) return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
  }
  PyErr_Format(PyExc_RuntimeError, "tessera error %d: %s", code, msg);
  return NULL;
}

double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deadline_in(struct timespec *ts, double s) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  long ns = ts->tv_nsec + (long)(s * 1e9);
  ts->tv_sec += ns / 1000000000L;
  ts->tv_nsec = ns % 1000000000L;
}

void cond_init_mono(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

bool cond_wait_while(pthread_mutex_t *mu, pthread_cond_t *cv, bool (*pending)(const void *),
                     const void *arg, double s) {
  struct timespec dl;
  deadline_in(&dl, s);
  pthread_mutex_lock(mu);
  while (pending(arg) && pthread_cond_timedwait(cv, mu, &dl) != ETIMEDOUT) {
  }
  bool over = !pending(arg);
  pthread_mutex_unlock(mu);
  return over;
}

/* --- the log queue ------------------------------------------------------------------------ */


logq_t *logq_new(void) {
  logq_t *q = calloc(1, sizeof *q);
  if (q) pthread_mutex_init(&q->mu, NULL);
  return q;
}

void logq_free(logq_t *q) {
  if (!q) return;
  pthread_mutex_destroy(&q->mu);
  free(q);
}

/* The library's log callback: client thread (or ts_client_close). No Python here. */
void logq_push(void *arg, int level, const char *msg) {
  logq_t *q = arg;
  pthread_mutex_lock(&q->mu);
  if (q->n == LOGQ_MAX) { /* full: drop the oldest */
    q->head = (q->head + 1) % LOGQ_MAX;
    q->n--;
    q->dropped++;
  }
  size_t i = (q->head + q->n) % LOGQ_MAX;
  q->line[i].level = level;
  snprintf(q->line[i].msg, LOGQ_LINE, "%s", msg);
  q->n++;
  pthread_mutex_unlock(&q->mu);
}

/* Hand the queued lines to fn(level, msg) (None: drop them). GIL held. Never fails: an
 * exception of fn is reported as unraisable. */
void logq_drain(logq_t *q, PyObject *fn) {
  if (!q) return;
  PyObject *saved_type, *saved_value, *saved_tb;
  PyErr_Fetch(&saved_type, &saved_value, &saved_tb);
  for (;;) {
    int level;
    char msg[LOGQ_LINE + 64];
    uint64_t dropped;
    pthread_mutex_lock(&q->mu);
    dropped = q->dropped;
    q->dropped = 0;
    bool have = q->n > 0;
    if (have) {
      level = q->line[q->head].level;
      memcpy(msg, q->line[q->head].msg, LOGQ_LINE);
      q->head = (q->head + 1) % LOGQ_MAX;
      q->n--;
    }
    pthread_mutex_unlock(&q->mu);
    if (dropped && fn && fn != Py_None) {
      char d[96];
      snprintf(d, sizeof d, "%llu log line(s) dropped (queue full)", (unsigned long long)dropped);
      PyObject *r = PyObject_CallFunction(fn, "is", TS_CLIENT_LOG_WARN, d);
      if (!r) PyErr_WriteUnraisable(fn);
      Py_XDECREF(r);
    }
    if (!have) break;
    if (fn && fn != Py_None) {
      PyObject *r = PyObject_CallFunction(fn, "is", level, msg);
      if (!r) PyErr_WriteUnraisable(fn);
      Py_XDECREF(r);
    }
  }
  PyErr_Restore(saved_type, saved_value, saved_tb);
}

/* --- helper-thread jobs for the blocking calls ------------------------------------------- */




void job_free(job_t *j) {
  if (!j) return;
  if (j->opened) ts_client_close(j->opened); /* an open nobody waited for */
  if (j->kind == JOB_OPEN && j->logq) logq_free(j->logq);
  for (size_t i = 0; i < j->naddrs; i++) free(j->addrs[i]);
  free(j->addrs);
  free(j->identity);
  for (size_t i = 0; j->job_str && i < 2 * j->njob; i++) free(j->job_str[i]);
  free(j->job_str);
  free(j->job_kv);
  ts_client_token_free(j->token);
  for (int i = 0; i < 3; i++) free(j->tls[i]);
  for (size_t i = 0; i < j->ntensors; i++) {
    free(j->names ? j->names[i] : NULL);
    free(j->shapes ? j->shapes[i] : NULL);
  }
  free(j->names);
  free(j->shapes);
  ts_client_keys_free(j->keys);
  free(j->tensors);
  free(j->kinds);
  for (size_t i = 0; j->table_names && i < j->ntables; i++) free(j->table_names[i]);
  free(j->table_names);
  free(j->tables);
  if (j->status) ts_client_status_free(j->status);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

job_t *job_new(job_kind_t kind, shared_t *sh) {
  job_t *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  pthread_mutex_init(&j->mu, NULL);
  cond_init_mono(&j->cv);
  j->kind = kind;
  j->sh = sh;
  return j;
}

static bool job_pending(const void *arg) { return !((const job_t *)arg)->done; }

static void *job_main(void *arg) {
  job_t *j = arg;
  ts_client_t *c = j->sh ? j->sh->c : NULL;
  switch (j->kind) {
  case JOB_OPEN:
    j->rc = ts_client_open(&j->opened, &j->opts, j->errmsg, sizeof j->errmsg);
    break;
  case JOB_DECLARE:
  {
    ts_client_declare_opts_t o;
    ts_client_declare_opts_init(&o);
    o.seed = j->seed;
    o.values_follow = j->values_follow;
    o.kinds = j->kinds;
    o.tables = j->tables;
    o.num_tables = j->ntables;
    j->rc = ts_client_declare_ex(c, j->tensors, j->ntensors, &o, j->errmsg, sizeof j->errmsg);
    j->awaiting = o.awaiting_values;
  }
    break;
  case JOB_STATUS:
    j->rc = ts_client_status(c, j->shard, &j->status, j->errmsg, sizeof j->errmsg);
    break;
  case JOB_HEARTBEAT:
    j->rc = ts_client_heartbeat(c, j->errmsg, sizeof j->errmsg);
    break;
  case JOB_CHECKPOINT:
    j->rc = ts_client_checkpoint(c, j->shard, j->path, sizeof j->path, &j->step, j->errmsg,
                                 sizeof j->errmsg);
    break;
  case JOB_TABLE_KEYS:
    j->rc = ts_client_table_keys_all(c, j->table, &j->keys, &j->nkeys, NULL, j->errmsg,
                                     sizeof j->errmsg);
    break;
  case JOB_SHUTDOWN:
    j->rc = ts_client_shutdown(c, j->shard, j->checkpoint, j->path, sizeof j->path, j->errmsg,
                               sizeof j->errmsg);
    break;
  }
  shared_t *sh = j->sh;
  bool declare = j->kind == JOB_DECLARE;
  pthread_mutex_lock(&j->mu);
  j->done = true;
  bool abandoned = j->abandoned;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (abandoned) {
    if (declare && sh) atomic_store(&sh->declaring, 0);
    job_free(j);
  }
  /* Last: once bg drops, the Client may free sh. */
  if (sh) atomic_fetch_sub(&sh->bg, 1);
  return NULL;
}

/* Run j on a helper thread and wait for it, interruptibly. Returns 0 when it finished (its
 * result in j; the caller frees j), or -1 with a Python exception set: then j was
 * abandoned (frees itself), or never started (freed here). GIL held on entry and exit. */
int job_run(job_t *j, logq_t *logq, PyObject *logfn) {
  pthread_t th;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (j->sh) atomic_fetch_add(&j->sh->bg, 1);
  int e = pthread_create(&th, &a, job_main, j);
  pthread_attr_destroy(&a);
  if (e != 0) {
    if (j->sh) atomic_fetch_sub(&j->sh->bg, 1);
    job_free(j);
    errno = e;
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  for (;;) {
    bool done;
    Py_BEGIN_ALLOW_THREADS
    done = cond_wait_while(&j->mu, &j->cv, job_pending, j, SLICE_S);
    Py_END_ALLOW_THREADS
    logq_drain(logq, logfn);
    if (done) return 0;
    if (PyErr_CheckSignals() < 0) {
      pthread_mutex_lock(&j->mu);
      done = j->done;
      if (!done) {
        j->abandoned = true;
        if (j->kind == JOB_DECLARE && j->sh) atomic_store(&j->sh->declaring, 1);
      }
      pthread_mutex_unlock(&j->mu);
      if (done) job_free(j);
      return -1;
    }
  }
}

