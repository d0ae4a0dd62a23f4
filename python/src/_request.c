/* tessera._client: the Request type (_client_int.h). */
#include "_client_int.h"

#include "_sigint.h"

/* How long an abandoned wait waits for the interrupted client to fail its request (it
 * does so on its next loop turn: microseconds) before it gives up and leaves the request
 * referenced until it ends. */
#define ABANDON_WAIT_S 5.0

/* --- Request ------------------------------------------------------------------------------ */

static void on_done(ts_client_req_t *req, void *arg) {
  RequestObject *r = arg;
  (void)req;
  pthread_mutex_lock(&r->mu);
  r->state = 2;
  atomic_store(&r->done_hint, 1);
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* The message of a request refused or failed because a wait on its client was abandoned. */
static const char *interrupted_msg(ClientObject *c, int rc, const char *msg) {
  if (rc == TS_CLIENT_ESHUTDOWN && c && c->sigint_interrupted)
    return "interrupted: a wait on this client was stopped (Ctrl-C, or an exception of a "
           "signal handler), and every request in flight on it was failed so that none "
           "reads or writes its arrays any more; the client takes no more requests: close "
           "it and open a new Client";
  return msg;
}

/* With r->mu held: submitted, and its callback has not run yet. */
static bool request_inflight(const void *arg) { return ((const RequestObject *)arg)->state == 1; }

static void request_release_buffers(RequestObject *r) {
  for (size_t i = 0; i < r->nviews; i++) PyBuffer_Release(&r->views[i]);
  r->nviews = 0;
}

/* If r's callback ran: release its buffers and drop it from its client's inflight list.
 * Returns whether r is done. GIL held. */
static bool request_reap(RequestObject *r) {
  pthread_mutex_lock(&r->mu);
  int st = r->state;
  if (st == 2) r->state = 3;
  pthread_mutex_unlock(&r->mu);
  if (st != 2) return st == 3;
  request_release_buffers(r);
  ClientObject *c = r->client;
  if (c && c->inflight) {
    Py_ssize_t n = PyList_GET_SIZE(c->inflight);
    for (Py_ssize_t i = 0; i < n; i++) {
      if (PyList_GET_ITEM(c->inflight, i) == (PyObject *)r) {
        PySequence_DelItem(c->inflight, i); /* may drop the last reference to r: done last */
        break;
      }
    }
  }
  return true;
}

void client_reap(ClientObject *self) {
  if (!self->inflight) return;
  PyObject *l = PyList_GetSlice(self->inflight, 0, PyList_GET_SIZE(self->inflight));
  if (!l) {
    PyErr_Clear();
    return;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(l); i++)
    if (atomic_load(&((RequestObject *)PyList_GET_ITEM(l, i))->done_hint))
      request_reap((RequestObject *)PyList_GET_ITEM(l, i));
  Py_DECREF(l);
}

static void Request_dealloc(RequestObject *self) {
  /* Never in flight here: the client's inflight list holds a reference until reaped. */
  request_release_buffers(self);
  free(self->views);
  free(self->grad);
  free(self->dst);
  free(self->tensors);
  pthread_mutex_destroy(&self->mu);
  pthread_cond_destroy(&self->cv);
  Py_CLEAR(self->client);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Get a float32 C-contiguous buffer of exactly elems floats from o. */
static int get_floats(PyObject *o, bool writable, uint64_t elems, const char *what,
                      const char *role, Py_buffer *v) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(o, v, flags) < 0) {
    PyObject *t, *val, *tb;
    PyErr_Fetch(&t, &val, &tb);
    PyObject *s = val ? PyObject_Str(val) : NULL;
    PyErr_Format(PyExc_ValueError, "%s %s: need a %sC-contiguous float32 array (%s)", role, what,
                 writable ? "writable " : "", s ? PyUnicode_AsUTF8(s) : "no buffer");
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return -1;
  }
  const char *f = v->format ? v->format : "B";
  bool f32 = v->itemsize == 4 && (!strcmp(f, "f") || !strcmp(f, "=f") || !strcmp(f, "@f") ||
#if PY_LITTLE_ENDIAN
                                  !strcmp(f, "<f")
#else
                                  !strcmp(f, ">f")
#endif
                                  );
  if (!f32) {
    PyErr_Format(PyExc_ValueError, "%s %s: need float32 elements, not format '%s'", role, what, f);
    PyBuffer_Release(v);
    return -1;
  }
  if ((uint64_t)v->len != elems * 4u) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s %s: holds %lld float32 elements, %llu needed",
             role, what, (long long)(v->len / 4), (unsigned long long)elems);
    PyBuffer_Release(v);
    raise_code(TS_CLIENT_ESHAPE, msg);
    return -1;
  }
  return 0;
}

/* Submit r (its request filled in but for these) on self. Returns 0, or -1 with the
 * library's error raised. */
static int request_submit(ClientObject *self, RequestObject *r, uint64_t step,
                          uint64_t min_version, uint64_t clock, double timeout) {
  r->req.step = step;
  r->req.min_version = min_version;
  r->req.clock = clock;
  r->req.timeout_s = timeout;
  /* In the list before submit: the callback may run before submit returns. */
  if (PyList_Append(self->inflight, (PyObject *)r) < 0) return -1;
  r->state = 1;
  int rc = ts_client_submit(self->sh->c, &r->req, on_done, r);
  if (rc < 0) {
    r->state = 0;
    PySequence_DelItem(self->inflight, PyList_GET_SIZE(self->inflight) - 1);
    raise_code(rc, interrupted_msg(self, rc, r->req.errmsg));
    return -1;
  }
  return 0;
}

/* submit(kind, tensors, grads, dsts, step, min_version, clock, timeout) -> Request
 * tensors: sequence of declared tensor indices; grads / dsts: None or sequences of arrays
 * aligned with tensors. */
PyObject *Client_submit(ClientObject *self, PyObject *args) {
  int kind;
  PyObject *tensors, *grads, *dsts;
  unsigned long long step, min_version, clock;
  double timeout;
  if (!PyArg_ParseTuple(args, "iOOOKKKd", &kind, &tensors, &grads, &dsts, &step, &min_version,
                        &clock, &timeout))
    return NULL;
  if (check_open(self) < 0 || check_no_declare(self) < 0) return NULL;
  ts_client_t *c = self->sh->c;
  size_t nt = ts_client_num_tensors(c);
  if (nt == 0) return raise_code(TS_CLIENT_ENOTDECLARED, "no model declared");
  bool push = kind == TS_CLIENT_PUSH || kind == TS_CLIENT_PUSH_PULL || kind == TS_CLIENT_ASSIGN ||
              kind == TS_CLIENT_ASSIGN_INITIAL;
  bool pull = kind == TS_CLIENT_PULL || kind == TS_CLIENT_PUSH_PULL;
  if (!push && !pull) {
    PyErr_SetString(PyExc_ValueError, "bad request kind");
    return NULL;
  }
  PyObject *ts = PySequence_Fast(tensors, "tensors must be a sequence of indices");
  if (!ts) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(ts);
  PyObject *gs = NULL, *ds = NULL;
  RequestObject *r = NULL;
  if (push) {
    gs = PySequence_Fast(grads, "grads must be a sequence of arrays");
    if (!gs) goto fail;
    if (PySequence_Fast_GET_SIZE(gs) != n) {
      PyErr_SetString(PyExc_ValueError, "one gradient per tensor");
      goto fail;
    }
  }
  if (pull) {
    ds = PySequence_Fast(dsts, "into must be a sequence of arrays");
    if (!ds) goto fail;
    if (PySequence_Fast_GET_SIZE(ds) != n) {
      PyErr_SetString(PyExc_ValueError, "one destination per tensor");
      goto fail;
    }
  }
  r = PyObject_New(RequestObject, &RequestType);
  if (!r) goto fail;
  memset((char *)r + offsetof(RequestObject, client), 0,
         sizeof *r - offsetof(RequestObject, client));
  pthread_mutex_init(&r->mu, NULL);
  cond_init_mono(&r->cv);
  Py_INCREF(self);
  r->client = self;
  r->grad = calloc(nt, sizeof *r->grad);
  r->dst = calloc(nt, sizeof *r->dst);
  r->tensors = calloc((size_t)n + 1, sizeof *r->tensors);
  r->views = calloc(2 * (size_t)n + 1, sizeof *r->views);
  if (!r->grad || !r->dst || !r->tensors || !r->views) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long t = PyLong_AsLong(PySequence_Fast_GET_ITEM(ts, i));
    if (t == -1 && PyErr_Occurred()) goto fail;
    if (t < 0 || (size_t)t >= nt) {
      PyErr_Format(PyExc_IndexError, "tensor index %ld out of range (%zu declared)", t, nt);
      goto fail;
    }
    r->tensors[i] = (uint32_t)t;
    uint64_t elems = ts_client_tensor_elems(c, (size_t)t);
    char what[32];
    snprintf(what, sizeof what, "of tensor %ld", t);
    if (push) {
      if (get_floats(PySequence_Fast_GET_ITEM(gs, i), false, elems, what, "gradient",
                     &r->views[r->nviews]) < 0)
        goto fail;
      r->grad[t] = r->views[r->nviews++].buf;
    }
    if (pull) {
      if (get_floats(PySequence_Fast_GET_ITEM(ds, i), true, elems, what, "destination",
                     &r->views[r->nviews]) < 0)
        goto fail;
      r->dst[t] = r->views[r->nviews++].buf;
    }
  }
  r->ntensors = (size_t)n;
  ts_client_req_init(&r->req, (ts_client_req_kind_t)kind);
  r->req.grad = push ? r->grad : NULL;
  r->req.dst = pull ? r->dst : NULL;
  if ((size_t)n < nt) { /* a subset; the whole model otherwise */
    r->req.tensors = r->tensors;
    r->req.num_tensors = (size_t)n;
  }
  if (request_submit(self, r, step, min_version, clock, timeout) < 0) goto fail;
  Py_XDECREF(gs);
  Py_XDECREF(ds);
  Py_DECREF(ts);
  return (PyObject *)r;
fail:
  Py_XDECREF(gs);
  Py_XDECREF(ds);
  Py_DECREF(ts);
  Py_XDECREF(r);
  return NULL;
}

/* A C-contiguous int64 buffer of keys from o. */
static int get_keys(PyObject *o, Py_buffer *v) {
  if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
  const char *f = v->format ? v->format : "B";
  bool i64 = v->itemsize == 8 && (!strcmp(f, "q") || !strcmp(f, "l") || !strcmp(f, "=q") ||
                                  !strcmp(f, "@q") || !strcmp(f, "@l") ||
#if PY_LITTLE_ENDIAN
                                  !strcmp(f, "<q") || !strcmp(f, "<l")
#else
                                  !strcmp(f, ">q") || !strcmp(f, ">l")
#endif
                                  );
  if (!i64) {
    PyErr_Format(PyExc_ValueError, "keys: need a C-contiguous int64 array, not format '%s'", f);
    PyBuffer_Release(v);
    return -1;
  }
  return 0;
}

/* submit_rows(kind, table, keys, grads, dst, step, min_version, clock, timeout[, flags])
 * -> Request: a table's request (TS_CLIENT_SPARSE_*). keys: int64 array; grads (push) /
 * dst (pull): float32 arrays of len(keys) x the table's dim, or None; flags: the request's
 * sparse_flags (TS_CLIENT_ROWS_READ_ONLY). */
PyObject *Client_submit_rows(ClientObject *self, PyObject *args) {
  int kind;
  unsigned int table;
  PyObject *keys, *grads, *dsts;
  unsigned long long step, min_version, clock;
  double timeout;
  unsigned int flags = 0;
  if (!PyArg_ParseTuple(args, "iIOOOKKKd|I", &kind, &table, &keys, &grads, &dsts, &step,
                        &min_version, &clock, &timeout, &flags))
    return NULL;
  if (check_open(self) < 0 || check_no_declare(self) < 0) return NULL;
  ts_client_t *c = self->sh->c;
  if (kind != TS_CLIENT_SPARSE_PULL && kind != TS_CLIENT_SPARSE_PUSH &&
      kind != TS_CLIENT_SPARSE_PUSH_PULL) {
    PyErr_SetString(PyExc_ValueError, "bad request kind");
    return NULL;
  }
  if (table >= ts_client_num_tables(c))
    return raise_code(TS_CLIENT_ENOTABLE, "no table of that index was declared");
  bool push = kind != TS_CLIENT_SPARSE_PULL, pull = kind != TS_CLIENT_SPARSE_PUSH;
  RequestObject *r = PyObject_New(RequestObject, &RequestType);
  if (!r) return NULL;
  memset((char *)r + offsetof(RequestObject, client), 0,
         sizeof *r - offsetof(RequestObject, client));
  pthread_mutex_init(&r->mu, NULL);
  cond_init_mono(&r->cv);
  Py_INCREF(self);
  r->client = self;
  if (!(r->views = calloc(3, sizeof *r->views))) {
    PyErr_NoMemory();
    goto fail;
  }
  if (get_keys(keys, &r->views[0]) < 0) goto fail;
  r->nviews = 1;
  size_t n = (size_t)(r->views[0].len / 8);
  uint64_t elems = (uint64_t)n * ts_client_table_dim(c, table);
  ts_client_req_init(&r->req, (ts_client_req_kind_t)kind);
  if (push) {
    if (get_floats(grads, false, elems, "of the table's rows", "gradient",
                   &r->views[r->nviews]) < 0)
      goto fail;
    r->req.rows_grad = r->views[r->nviews++].buf;
  }
  if (pull) {
    if (get_floats(dsts, true, elems, "of the table's rows", "destination",
                   &r->views[r->nviews]) < 0)
      goto fail;
    r->req.rows_dst = r->views[r->nviews++].buf;
  }
  r->req.table = table;
  r->req.keys = r->views[0].buf;
  r->req.num_keys = n;
  r->req.sparse_flags = flags;
  if (request_submit(self, r, step, min_version, clock, timeout) < 0) goto fail;
  return (PyObject *)r;
fail:
  Py_XDECREF(r);
  return NULL;
}

/* A wait is abandoned (a signal handler raised, or a SIGINT reached a wait on another thread
 * than the main thread): the library would go on writing into the request's destination
 * arrays, or reading its gradients, after the exception reached the caller, and it has no
 * way to cancel one request. So the whole client is interrupted (ts_client_interrupt: every
 * request in flight fails with ESHUTDOWN on the client thread's next turn, which closes a
 * connection still reading into or writing from their memory) and, with the GIL released,
 * this request's completion is awaited: once it ran the library no longer touches its
 * buffers (client.h), and they are released here. The client refuses every later request
 * (Interrupted, saying why). Returns NULL with the exception given on entry. */
static PyObject *request_abandon(RequestObject *self) {
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  ClientObject *c = self->client;
  pthread_mutex_lock(&self->mu);
  bool inflight = self->state == 1;
  pthread_mutex_unlock(&self->mu);
  if (inflight && c && c->sh && c->sh->c && !c->closed) {
    c->sigint_interrupted = true;
    ts_client_interrupt(c->sh->c);
    Py_BEGIN_ALLOW_THREADS
    cond_wait_while(&self->mu, &self->cv, request_inflight, self, ABANDON_WAIT_S);
    Py_END_ALLOW_THREADS
  }
  request_reap(self); /* else it stays referenced until it ends, as any request does */
  if (c && c->sh) logq_drain(c->sh->logq, c->logfn);
  PyErr_Restore(t, v, tb);
  return NULL;
}

/* For a wait on a thread other than the main thread: whether a SIGINT stops it
 * (sigint_pending), with KeyboardInterrupt set (or the error of asking Python). */
static bool sigint_stops(sigint_wait_t *sw) {
  int p = sigint_pending(sw);
  if (p > 0) PyErr_SetNone(PyExc_KeyboardInterrupt);
  return p != 0;
}

/* wait(timeout=-1) -> bool: True once done (the results readable), False when timeout (s,
 * >= 0) passed first. Interruptible from any thread (_sigint.h): on the main thread a
 * signal handler's exception is raised (PyErr_CheckSignals); on another thread a SIGINT
 * the main thread does not handle (it waits in C, e.g. for this thread inside TensorFlow)
 * raises KeyboardInterrupt here. Either way the client is interrupted (request_abandon). */
static PyObject *Request_wait(RequestObject *self, PyObject *args) {
  double timeout = -1;
  if (!PyArg_ParseTuple(args, "|d", &timeout)) return NULL;
  double start = mono_s();
  ClientObject *c = self->client;
  uint32_t busy = c ? c->busy_poll_us : 0;
  bool armed = false, main = true;
  sigint_wait_t sw;
  for (int turn = 0;; turn++) {
    pthread_mutex_lock(&self->mu);
    int st = self->state;
    pthread_mutex_unlock(&self->mu);
    if (st == 0) {
      PyErr_SetString(PyExc_RuntimeError, "request was never submitted");
      return NULL;
    }
    if (st >= 2) {
      request_reap(self);
      if (c && c->sh) logq_drain(c->sh->logq, c->logfn);
      Py_RETURN_TRUE;
    }
    double left = timeout < 0 ? SIGINT_SLICE_S : timeout - (mono_s() - start);
    if (timeout >= 0 && left <= 0) Py_RETURN_FALSE;
    double slice = left < SIGINT_SLICE_S ? left : SIGINT_SLICE_S;
    if (!armed) { /* about to sleep: make sure a SIGINT will be seen */
      sigint_arm();
      main = sigint_is_main_thread();
      sigint_wait_start(&sw);
      armed = true;
      /* On another thread: one that came while this thread computed, unhandled since? */
      if (!main && sigint_stops(&sw)) return request_abandon(self);
    }
    Py_BEGIN_ALLOW_THREADS
    if (turn == 0 && busy > 0) { /* the job's busy_poll_us: spin a little before sleeping */
      double until = mono_s() + busy * 1e-6;
      while (!atomic_load(&self->done_hint) && mono_s() < until) sched_yield();
    }
    cond_wait_while(&self->mu, &self->cv, request_inflight, self, slice);
    Py_END_ALLOW_THREADS
    if (c && c->sh) logq_drain(c->sh->logq, c->logfn);
    if (main) {
      uint64_t g = sigint_generation();
      int rc = PyErr_CheckSignals();
      sigint_handled(g);
      if (rc < 0) return request_abandon(self);
    } else if (sigint_stops(&sw)) {
      return request_abandon(self);
    }
  }
}

PyObject *Request_get_done(RequestObject *self, void *Py_UNUSED(x)) {
  return PyBool_FromLong(request_reap(self));
}

/* The results, once done: a dict (rc, push_rc, pull_rc, applied, accumulated, stale,
 * duplicate, version, errmsg). */
PyObject *Request_result(RequestObject *self, PyObject *Py_UNUSED(a)) {
  if (!request_reap(self)) {
    PyErr_SetString(PyExc_RuntimeError, "request still in flight");
    return NULL;
  }
  ts_client_req_t *q = &self->req;
  return Py_BuildValue("{s:i,s:i,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:s}", "rc", q->rc, "push_rc",
                       q->push_rc, "pull_rc", q->pull_rc, "applied",
                       (unsigned long long)q->applied, "accumulated",
                       (unsigned long long)q->accumulated, "stale", (unsigned long long)q->stale,
                       "duplicate", (unsigned long long)q->duplicate, "version",
                       (unsigned long long)q->version, "rows_filtered",
                       (unsigned long long)q->rows_filtered, "errmsg", q->errmsg);
}

/* Raise the request's error, if it failed; None otherwise. */
PyObject *Request_check(RequestObject *self, PyObject *Py_UNUSED(a)) {
  if (!request_reap(self)) {
    PyErr_SetString(PyExc_RuntimeError, "request still in flight");
    return NULL;
  }
  if (self->req.rc < 0)
    return raise_code(self->req.rc, interrupted_msg(self->client, self->req.rc, self->req.errmsg));
  Py_RETURN_NONE;
}

/* sigint_unhandled() -> bool: whether a SIGINT arrived that the main thread has not handled
 * yet (it has not run Python code since: it waits in C, e.g. in a TensorFlow step). */
static PyObject *Request_sigint_unhandled(PyObject *Py_UNUSED(cls), PyObject *Py_UNUSED(a)) {
  return PyBool_FromLong(sigint_unhandled());
}

static PyMethodDef Request_methods[] = {
    {"wait", (PyCFunction)Request_wait, METH_VARARGS,
     "wait(timeout=-1) -> bool: wait until done (True) or timeout seconds passed (False)."},
    {"result", (PyCFunction)Request_result, METH_NOARGS, "The results of a done request."},
    {"check", (PyCFunction)Request_check, METH_NOARGS, "Raise the error of a failed request."},
    {"sigint_unhandled", (PyCFunction)Request_sigint_unhandled, METH_NOARGS | METH_STATIC,
     "Whether a SIGINT arrived that the main thread has not handled yet."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Request_getset[] = {
    {"done", (getter)Request_get_done, NULL, "Whether the request is done.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tessera._client.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One request in flight (made by Client.submit).",
    .tp_methods = Request_methods,
    .tp_getset = Request_getset,
};

