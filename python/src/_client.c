/*
 * tessera._client: the CPython binding of libtessera-client (include/tessera/client.h).
 *
 * The Python layer (tessera/client.py) is the documented API; this module is its engine:
 *
 *  - Client: one ts_client_t. Blocking library calls that have no asynchronous form (open,
 *    declare, status, heartbeat, checkpoint, shutdown) run on a short-lived helper thread
 *    while the calling thread waits for it in slices of at most 100 ms with the GIL released,
 *    checking for signals (PyErr_CheckSignals) between slices with the GIL held. On Ctrl-C
 *    the call raises KeyboardInterrupt at once and the helper is left to finish alone: it
 *    owns copies of everything it reads, and frees what it produced (an opened client is
 *    closed). A client whose declare was abandoned so refuses requests until it is done.
 *
 *  - Request: one ts_client_req_t, embedded in the Python object, submitted with a
 *    completion callback. The callback (client thread) touches no Python object: under the
 *    request's mutex it marks the request done and signals its condition variable. wait()
 *    waits on it in slices of at most 50 ms, and sees Ctrl-C on any thread (_sigint.h);
 *    an interrupted wait interrupts the client, so nothing writes into its arrays after
 *    the exception (_request.c, request_abandon). Buffers: the request holds a Py_buffer
 *    of every array it reads or writes (so the arrays stay alive and numpy refuses to resize them)
 *    and the client holds a strong reference to every request in flight (so its memory,
 *    where the client thread writes the results, stays alive), both until the request is
 *    done and a Python thread noticed it ("reaped": wait(), done, or any later call on the
 *    client). A request whose wait timed out thus keeps running, and keeps its buffers,
 *    until the library completes it.
 *
 *  - Logs: the library's log callback runs on the client thread; it only appends the line
 *    to a bounded queue (mutex, no GIL). Python threads hand the queued lines to the log
 *    function given to Client (tessera's logging.Logger) whenever they are in the module:
 *    every call, and every wait slice. No GIL is ever taken on a thread Python did not
 *    start, so nothing here can deadlock at interpreter shutdown.
 *
 * Process-wide: a C-level SIGINT handler installed over Python's (which it calls first),
 * and its helper thread (_sigint.h); no logging configuration.
 */
#include "_client_int.h"

/* --- Client ------------------------------------------------------------------------------ */

int check_open(ClientObject *self) {
  if (!self->sh || !self->sh->c || self->closed) {
    raise_code(TS_CLIENT_ESHUTDOWN, "the client is closed");
    return -1;
  }
  client_reap(self);
  logq_drain(self->sh->logq, self->logfn);
  return 0;
}

int check_no_declare(ClientObject *self) {
  if (atomic_load(&self->sh->declaring)) {
    raise_code(TS_CLIENT_EBUSY,
               "a declare interrupted earlier is still running; retry once it finished");
    return -1;
  }
  return 0;
}

char *dup_utf8(PyObject *o) {
  const char *s = PyUnicode_AsUTF8(o);
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) PyErr_NoMemory();
  return d;
}

/* j's job settings (opts.job) from a sequence of (key, value) strings, as load_config's
 * "job_settings" gives them: the shards compare each with their own job file. */
static int job_settings(job_t *j, PyObject *job_o) {
  PyObject *seq = PySequence_Fast(job_o, "job must be a sequence of (key, value) strings");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  j->job_kv = calloc((size_t)n + 1, sizeof *j->job_kv);
  j->job_str = calloc(2 * (size_t)n + 1, sizeof *j->job_str);
  if (!j->job_kv || !j->job_str) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *kv = PySequence_Fast_GET_ITEM(seq, i);
    PyObject *k = PyTuple_Check(kv) && PyTuple_GET_SIZE(kv) == 2 ? PyTuple_GET_ITEM(kv, 0) : NULL;
    PyObject *v = k ? PyTuple_GET_ITEM(kv, 1) : NULL;
    if (!k || !PyUnicode_Check(k) || !PyUnicode_Check(v)) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_TypeError, "job must be a sequence of (key, value) strings");
      return -1;
    }
    j->njob = (size_t)i + 1; /* job_free frees what is there */
    if (!(j->job_str[2 * i] = dup_utf8(k)) || !(j->job_str[2 * i + 1] = dup_utf8(v))) {
      Py_DECREF(seq);
      return -1;
    }
    j->job_kv[i] = (ts_client_job_setting_t){j->job_str[2 * i], j->job_str[2 * i + 1]};
  }
  Py_DECREF(seq);
  return 0;
}

static int Client_init(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"addrs", "task", "admin", "token_file", "identity",
                           "connect_timeout", "request_timeout", "heartbeat_interval",
                           "heartbeat_timeout", "require_all", "busy_poll_us", "log",
                           "log_level", "job", "tls", NULL};
  PyObject *addrs, *logfn = Py_None, *token_file = Py_None, *identity = Py_None;
  PyObject *job_o = Py_None, *tls_o = Py_None;
  int task = 0, admin = 0, require_all = 1, log_level = TS_CLIENT_LOG_INFO;
  double connect_timeout = 5.0, request_timeout = 60.0, hb_interval = 0.0, hb_timeout = 5.0;
  unsigned int busy = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ipOOddddpIOiOO", kwlist, &addrs, &task, &admin,
                                   &token_file, &identity, &connect_timeout, &request_timeout,
                                   &hb_interval, &hb_timeout, &require_all, &busy, &logfn,
                                   &log_level, &job_o, &tls_o))
    return -1;
  if (self->sh) {
    PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
    return -1;
  }
  PyObject *seq = PySequence_Fast(addrs, "addrs must be a sequence of \"host:port\" strings");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n == 0) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "no shard addresses");
    return -1;
  }
  job_t *j = job_new(JOB_OPEN, NULL);
  if (!j) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  j->addrs = calloc((size_t)n, sizeof *j->addrs);
  j->logq = logq_new();
  if (!j->addrs || !j->logq) goto nomem;
  j->naddrs = (size_t)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyUnicode_Check(o)) {
      PyErr_SetString(PyExc_TypeError, "addrs must be strings \"host:port\"");
      goto fail;
    }
    if (!(j->addrs[i] = dup_utf8(o))) goto fail;
  }
  if (identity != Py_None && !(j->identity = dup_utf8(identity))) goto fail;
  if (job_o != Py_None && job_settings(j, job_o) < 0) goto fail;
  if (tls_o != Py_None) {
    /* (CA file, certificate file, key file): auth.tls */
    if (!PyTuple_Check(tls_o) || PyTuple_GET_SIZE(tls_o) != 3) {
      PyErr_SetString(PyExc_TypeError, "tls must be (ca_file, cert_file, key_file)");
      goto fail;
    }
    for (int i = 0; i < 3; i++) {
      PyObject *b = PyUnicode_EncodeFSDefault(PyTuple_GET_ITEM(tls_o, i));
      if (!b) goto fail;
      j->tls[i] = strdup(PyBytes_AS_STRING(b));
      Py_DECREF(b);
      if (!j->tls[i]) goto nomem;
    }
  }
  if (token_file != Py_None) {
    PyObject *b = PyUnicode_EncodeFSDefault(token_file);
    if (!b) goto fail;
    j->token = ts_client_token_read(PyBytes_AS_STRING(b), j->errmsg, sizeof j->errmsg);
    Py_DECREF(b);
    if (!j->token) {
      raise_code(TS_CLIENT_ECONFIG, j->errmsg);
      goto fail;
    }
  }
  ts_client_opts_init(&j->opts);
  j->opts.addrs = (const char *const *)j->addrs;
  j->opts.num_shards = j->naddrs;
  j->opts.admin = admin;
  j->opts.task = task;
  j->opts.identity = j->identity;
  j->opts.token = j->token;
  j->opts.tls_ca_file = j->tls[0];
  j->opts.tls_cert_file = j->tls[1];
  j->opts.tls_key_file = j->tls[2];
  j->opts.connect_timeout_s = connect_timeout;
  j->opts.request_timeout_s = request_timeout;
  j->opts.heartbeat_interval_s = hb_interval;
  j->opts.heartbeat_timeout_s = hb_timeout;
  j->opts.require_all = require_all;
  j->opts.busy_poll_us = busy;
  j->opts.log = logq_push;
  j->opts.log_arg = j->logq;
  j->opts.log_level = log_level;
  j->opts.job = j->job_kv;
  j->opts.num_job = j->njob;
  Py_DECREF(seq);
  seq = NULL;
  logq_t *q = j->logq;
  if (job_run(j, NULL, NULL) < 0) return -1; /* (abandoned: frees q, closes the client) */
  logq_drain(q, logfn);
  if (j->rc < 0) {
    raise_code(j->rc, j->errmsg);
    job_free(j);
    return -1;
  }
  self->sh = calloc(1, sizeof *self->sh);
  if (!self->sh) goto nomem;
  self->sh->c = j->opened;
  self->sh->logq = j->logq;
  j->opened = NULL;
  j->logq = NULL;
  job_free(j);
  self->busy_poll_us = busy;
  Py_INCREF(logfn);
  self->logfn = logfn;
  self->inflight = PyList_New(0);
  if (!self->inflight) return -1;
  return 0;
nomem:
  PyErr_NoMemory();
fail:
  Py_XDECREF(seq);
  job_free(j);
  return -1;
}

/* Close: fails every request in flight (their callbacks run before ts_client_close
 * returns), then reaps them. Waits for abandoned helper jobs first: they use the client. */
/* Close the client. drain: hand the log lines queued meanwhile to the Python log function;
 * not from tp_dealloc, which the garbage collector may run while the objects that function
 * reaches (the logging module's) are being torn down: calling it there crashed (a SIGINT'd
 * worker with a stopped shard, test_interrupt "stopped"). Undrained lines are freed. */
static void client_close_ex(ClientObject *self, bool drain) {
  if (!self->sh || self->closed) return;
  self->closed = true;
  shared_t *sh = self->sh;
  Py_BEGIN_ALLOW_THREADS
  ts_client_interrupt(sh->c); /* an abandoned declare returns at once */
  while (atomic_load(&sh->bg) > 0) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  ts_client_close(sh->c);
  Py_END_ALLOW_THREADS
  sh->c = NULL;
  client_reap(self);
  if (drain) logq_drain(sh->logq, self->logfn);
}

static void client_close(ClientObject *self) { client_close_ex(self, true); }

PyObject *Client_close(ClientObject *self, PyObject *Py_UNUSED(a)) {
  client_close(self);
  Py_RETURN_NONE;
}

static void Client_dealloc(ClientObject *self) {
  PyObject_GC_UnTrack(self);
  client_close_ex(self, false);
  if (self->sh) {
    logq_free(self->sh->logq);
    free(self->sh);
    self->sh = NULL;
  }
  Py_CLEAR(self->logfn);
  Py_CLEAR(self->inflight);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Client_traverse(ClientObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->logfn);
  /* inflight is deliberately not visited: a request in flight must never be collected. */
  return 0;
}

static int Client_clear(ClientObject *self) {
  Py_CLEAR(self->logfn);
  return 0;
}

PyObject *Client_interrupt(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (self->sh && self->sh->c && !self->closed) ts_client_interrupt(self->sh->c);
  Py_RETURN_NONE;
}

PyObject *Client_drain_logs(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (self->sh) {
    client_reap(self);
    logq_drain(self->sh->logq, self->logfn);
  }
  Py_RETURN_NONE;
}

/* --- the blocking calls: each a job on a helper thread (_jobs.c) ------------------------ */

/* A job of kind on this client, once check_open passed; NULL with an exception set. */
job_t *client_job(ClientObject *self, job_kind_t kind) {
  if (check_open(self) < 0) return NULL;
  job_t *j = job_new(kind, self->sh);
  if (!j) PyErr_NoMemory();
  return j;
}

/* Run j and make the call's return value: the library's error raised, or result(j) (None
 * without result). Frees j (job_run does when the wait is abandoned). */
PyObject *client_run(ClientObject *self, job_t *j, PyObject *(*result)(const job_t *)) {
  if (job_run(j, self->sh->logq, self->logfn) < 0) return NULL;
  PyObject *r = j->rc < 0 ? raise_code(j->rc, j->errmsg) : result ? result(j) : Py_NewRef(Py_None);
  job_free(j);
  return r;
}

static PyObject *declare_result(const job_t *j) { return PyBool_FromLong(j->awaiting); }

/* declare([(name, shape, init[, kind]), ...], seed[, values_follow[, tables]]) ->
 * awaiting_values */
static PyObject *Client_declare(ClientObject *self, PyObject *args) {
  PyObject *list, *tables = Py_None;
  unsigned long long seed;
  int values_follow = 0;
  if (!PyArg_ParseTuple(args, "OK|pO", &list, &seed, &values_follow, &tables)) return NULL;
  if (check_open(self) < 0 || check_no_declare(self) < 0) return NULL;
  if (PyList_GET_SIZE(self->inflight) > 0) {
    return raise_code(TS_CLIENT_EBUSY, "declare with requests in flight: wait for them first");
  }
  PyObject *seq = PySequence_Fast(list, "tensors must be a sequence of (name, shape, init)");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  job_t *j = job_new(JOB_DECLARE, self->sh);
  if (!j) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  j->seed = seed;
  j->values_follow = values_follow;
  j->tensors = calloc((size_t)n + 1, sizeof *j->tensors);
  j->names = calloc((size_t)n + 1, sizeof *j->names);
  j->shapes = calloc((size_t)n + 1, sizeof *j->shapes);
  j->kinds = calloc((size_t)n + 1, sizeof *j->kinds);
  if (!j->tensors || !j->names || !j->shapes || !j->kinds) {
    PyErr_NoMemory();
    goto fail;
  }
  j->ntensors = (size_t)n;
  if (parse_tables(tables, j) < 0) goto fail;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *name, *shape;
    int init, kind = TS_CLIENT_TRAINABLE;
    PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "UOi|i", &name, &shape, &init, &kind)) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "each tensor must be a tuple (name, shape, init[, kind])");
      goto fail;
    }
    j->kinds[i] = kind == TS_CLIENT_STATE ? TS_CLIENT_STATE : TS_CLIENT_TRAINABLE;
    if (!(j->names[i] = dup_utf8(name))) goto fail;
    PyObject *sh = PySequence_Fast(shape, "a shape must be a sequence of ints");
    if (!sh) goto fail;
    Py_ssize_t r = PySequence_Fast_GET_SIZE(sh);
    j->shapes[i] = calloc((size_t)r + 1, sizeof(uint64_t));
    if (!j->shapes[i]) {
      Py_DECREF(sh);
      PyErr_NoMemory();
      goto fail;
    }
    for (Py_ssize_t k = 0; k < r; k++) {
      unsigned long long d = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sh, k));
      if (PyErr_Occurred()) {
        Py_DECREF(sh);
        goto fail;
      }
      j->shapes[i][k] = d;
    }
    Py_DECREF(sh);
    j->tensors[i].name = j->names[i];
    j->tensors[i].shape = j->shapes[i];
    j->tensors[i].rank = (size_t)r;
    j->tensors[i].init = (ts_client_init_t)init;
  }
  Py_DECREF(seq);
  return client_run(self, j, declare_result);
fail:
  Py_DECREF(seq);
  job_free(j);
  return NULL;
}

static PyObject *status_result(const job_t *j) { return status_dict(j->status); }
static PyObject *checkpoint_result(const job_t *j) {
  return Py_BuildValue("(sK)", j->path, (unsigned long long)j->step);
}
static PyObject *path_result(const job_t *j) { return PyUnicode_FromString(j->path); }

static PyObject *Client_status(ClientObject *self, PyObject *args) {
  unsigned int shard;
  job_t *j;
  if (!PyArg_ParseTuple(args, "I", &shard) || !(j = client_job(self, JOB_STATUS))) return NULL;
  j->shard = shard;
  return client_run(self, j, status_result);
}

PyObject *Client_heartbeat(ClientObject *self, PyObject *Py_UNUSED(a)) {
  job_t *j = client_job(self, JOB_HEARTBEAT);
  return j ? client_run(self, j, NULL) : NULL;
}

static PyObject *Client_checkpoint(ClientObject *self, PyObject *args) {
  unsigned int shard;
  job_t *j;
  if (!PyArg_ParseTuple(args, "I", &shard) || !(j = client_job(self, JOB_CHECKPOINT)))
    return NULL;
  j->shard = shard;
  return client_run(self, j, checkpoint_result);
}

static PyObject *Client_shutdown(ClientObject *self, PyObject *args) {
  unsigned int shard;
  int checkpoint = 1;
  job_t *j;
  if (!PyArg_ParseTuple(args, "I|p", &shard, &checkpoint) ||
      !(j = client_job(self, JOB_SHUTDOWN)))
    return NULL;
  j->shard = shard;
  j->checkpoint = checkpoint;
  return client_run(self, j, path_result);
}

static PyObject *Client_set_timeout(ClientObject *self, PyObject *args) {
  double s;
  if (!PyArg_ParseTuple(args, "d", &s)) return NULL;
  if (check_open(self) < 0) return NULL;
  if (!(s > 0)) {
    PyErr_SetString(PyExc_ValueError, "timeout must be > 0");
    return NULL;
  }
  ts_client_set_timeout(self->sh->c, s);
  Py_RETURN_NONE;
}

static PyObject *Client_set_progress(ClientObject *self, PyObject *args) {
  unsigned long long step;
  double loss, eps, progress;
  int done;
  if (!PyArg_ParseTuple(args, "Kdddp", &step, &loss, &eps, &progress, &done)) return NULL;
  if (check_open(self) < 0) return NULL;
  ts_client_set_progress(self->sh->c, step, loss, eps, progress, done);
  Py_RETURN_NONE;
}

static PyObject *Client_shard_up(ClientObject *self, PyObject *args) {
  unsigned int shard;
  if (!PyArg_ParseTuple(args, "I", &shard)) return NULL;
  if (check_open(self) < 0) return NULL;
  char why[256] = "";
  bool up = ts_client_shard_up(self->sh->c, shard, why, sizeof why);
  return Py_BuildValue("(Os)", up ? Py_True : Py_False, why);
}

PyObject *Client_info(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (check_open(self) < 0) return NULL;
  ts_client_t *c = self->sh->c;
  return Py_BuildValue("{s:I,s:s,s:I,s:K,s:K,s:n,s:n}", "num_shards", ts_client_num_shards(c),
                       "mode", ts_client_mode_name(ts_client_job_mode(c)), "job_workers",
                       ts_client_job_workers(c), "partition_bytes",
                       (unsigned long long)ts_client_partition_bytes(c), "restarts",
                       (unsigned long long)ts_client_restarts(c), "num_tensors",
                       (Py_ssize_t)ts_client_num_tensors(c), "num_parts",
                       (Py_ssize_t)ts_client_num_parts(c));
}

PyObject *Client_parts(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (check_open(self) < 0) return NULL;
  size_t n = ts_client_num_parts(self->sh->c);
  PyObject *l = PyList_New((Py_ssize_t)n);
  if (!l) return NULL;
  for (size_t k = 0; k < n; k++) {
    ts_client_part_t p;
    ts_client_part(self->sh->c, k, &p);
    PyObject *t = Py_BuildValue("(IIIKK)", p.tensor, p.part, p.shard,
                                (unsigned long long)p.offset, (unsigned long long)p.count);
    if (!t) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)k, t);
  }
  return l;
}

PyObject *Client_inflight(ClientObject *self, PyObject *Py_UNUSED(a)) {
  if (!self->inflight) return PyLong_FromLong(0);
  client_reap(self);
  return PyLong_FromSsize_t(PyList_GET_SIZE(self->inflight));
}

static PyMethodDef Client_methods[] = {
    {"close", (PyCFunction)Client_close, METH_NOARGS, "Close the client."},
    {"interrupt", (PyCFunction)Client_interrupt, METH_NOARGS,
     "Fail every request in flight and every later one (irreversible)."},
    {"declare", (PyCFunction)Client_declare, METH_VARARGS, "declare([(name, shape, init)], seed)"},
    {"submit_rows", (PyCFunction)Client_submit_rows, METH_VARARGS,
     "submit_rows(kind, table, keys, grads, dst, step, min_version, clock, timeout[, flags]) -> Request"},
    {"submit", (PyCFunction)Client_submit, METH_VARARGS,
     "submit(kind, tensors, grads, dsts, step, min_version, clock, timeout) -> Request"},
    {"status", (PyCFunction)Client_status, METH_VARARGS, "status(shard) -> dict"},
    {"heartbeat", (PyCFunction)Client_heartbeat, METH_NOARGS, "Heartbeat every shard now."},
    {"table_keys", (PyCFunction)Client_table_keys, METH_VARARGS,
     "table_keys(table) -> bytes of int64 keys, ascending"},
    {"checkpoint", (PyCFunction)Client_checkpoint, METH_VARARGS, "checkpoint(shard) -> (path, step)"},
    {"shutdown", (PyCFunction)Client_shutdown, METH_VARARGS, "shutdown(shard, checkpoint) -> path"},
    {"set_timeout", (PyCFunction)Client_set_timeout, METH_VARARGS, "set_timeout(seconds)"},
    {"set_progress", (PyCFunction)Client_set_progress, METH_VARARGS,
     "set_progress(step, loss, examples_per_sec, epoch_progress, done)"},
    {"shard_up", (PyCFunction)Client_shard_up, METH_VARARGS, "shard_up(i) -> (bool, why)"},
    {"info", (PyCFunction)Client_info, METH_NOARGS, "The job and plan as a dict."},
    {"parts", (PyCFunction)Client_parts, METH_NOARGS,
     "The plan: [(tensor, part, shard, offset, count)]."},
    {"inflight", (PyCFunction)Client_inflight, METH_NOARGS, "Requests not yet reaped."},
    {"drain_logs", (PyCFunction)Client_drain_logs, METH_NOARGS, "Emit the queued log lines."},
    {NULL, NULL, 0, NULL}};

PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tessera._client.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Connections to every shard of a job (see tessera.Client).",
    .tp_traverse = (traverseproc)Client_traverse,
    .tp_clear = (inquiry)Client_clear,
    .tp_methods = Client_methods,
    .tp_init = (initproc)Client_init,
    .tp_new = PyType_GenericNew,
};

/* --- module functions -------------------------------------------------------------------- */

static PyObject *str_list(char **v, size_t n) {
  PyObject *l = PyList_New((Py_ssize_t)n);
  if (!l) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *s = PyUnicode_FromString(v[i] ? v[i] : "");
    if (!s) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, s);
  }
  return l;
}

/* A key's value as Python sees it: bool, int, float, str, or a list of str or int. */
static PyObject *config_value(const ts_config_value_t *v) {
  switch (v->kind) {
    case TS_CONFIG_VALUE_BOOL:
      return PyBool_FromLong(v->b);
    case TS_CONFIG_VALUE_INT:
      return PyLong_FromLongLong((long long)v->i);
    case TS_CONFIG_VALUE_FLOAT:
      return PyFloat_FromDouble(v->f);
    case TS_CONFIG_VALUE_STRING:
      return PyUnicode_FromString(v->s);
    case TS_CONFIG_VALUE_STRINGS:
      return str_list((char **)v->strs, v->n);
    case TS_CONFIG_VALUE_INTS: {
      PyObject *l = PyList_New((Py_ssize_t)v->n);
      for (size_t i = 0; l && i < v->n; i++) {
        PyObject *x = PyLong_FromLong(v->ints[i]);
        if (!x) Py_CLEAR(l);
        else PyList_SET_ITEM(l, (Py_ssize_t)i, x);
      }
      return l;
    }
  }
  PyErr_SetString(PyExc_SystemError, "a configuration key of an unknown kind");
  return NULL;
}

static const char *role_name(ts_task_role_t r) {
  return r == TS_ROLE_PS ? "ps" : r == TS_ROLE_WORKER ? "worker" : "";
}

/* load_config(path or None, tf_config or None, overrides) -> dict: the job as ps-server
 * and ps-worker see it (config/ts_config.c: defaults, file, TF_CONFIG, --set overrides). */
static PyObject *mod_load_config(PyObject *Py_UNUSED(m), PyObject *args) {
  PyObject *path_o, *tf_o, *over_o;
  if (!PyArg_ParseTuple(args, "OOO", &path_o, &tf_o, &over_o)) return NULL;
  PyObject *path_b = NULL, *over = NULL;
  const char **ov = NULL;
  const char *tf = NULL;
  if (path_o != Py_None && !(path_b = PyUnicode_EncodeFSDefault(path_o))) return NULL;
  if (tf_o != Py_None && !(tf = PyUnicode_AsUTF8(tf_o))) goto fail;
  if (!(over = PySequence_Fast(over_o, "overrides must be a sequence of \"KEY=VALUE\""))) goto fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(over);
  ov = calloc((size_t)n + 1, sizeof *ov);
  if (!ov) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (!(ov[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(over, i)))) goto fail;
  ts_config_t cfg;
  char err[1024] = "";
  int rc;
  const char *path = path_b ? PyBytes_AS_STRING(path_b) : NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = ts_config_load(&cfg, path, tf, ov, (size_t)n, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    raise_code(rc, err);
    goto fail;
  }
  /* Every key of the table under its field name (tessera/_job_keys.py is generated from the
   * same table), then this process's identity and where the job came from. */
  PyObject *d = PyDict_New();
  for (size_t i = 0; d && i < ts_config_num_keys(); i++) {
    ts_config_value_t v;
    ts_config_value(&cfg, i, &v);
    PyObject *o = config_value(&v);
    if (!o || PyDict_SetItemString(d, v.field, o) < 0) Py_CLEAR(d);
    Py_XDECREF(o);
  }
  if (d) {
    PyObject *extra = Py_BuildValue("{s:s,s:i,s:s}", "task_role", role_name(cfg.task_role),
                                    "task_index", cfg.task_index, "source",
                                    cfg.source ? cfg.source : "");
    if (!extra || PyDict_Update(d, extra) < 0) Py_CLEAR(d);
    Py_XDECREF(extra);
  }
  if (d) {
    ts_config_job_setting_t js[TS_CONFIG_JOB_MAX];
    size_t nj = ts_config_job_settings(&cfg, js);
    PyObject *l = PyList_New((Py_ssize_t)nj);
    for (size_t i = 0; l && i < nj; i++) {
      PyObject *t = Py_BuildValue("(ss)", js[i].key, js[i].value);
      if (!t) Py_CLEAR(l);
      else PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    if (!l || PyDict_SetItemString(d, "job_settings", l) < 0) Py_CLEAR(d);
    Py_XDECREF(l);
  }
  ts_config_free(&cfg);
  free(ov);
  Py_XDECREF(over);
  Py_XDECREF(path_b);
  return d;
fail:
  free(ov);
  Py_XDECREF(over);
  Py_XDECREF(path_b);
  return NULL;
}

static PyObject *mod_strerror(PyObject *Py_UNUSED(m), PyObject *args) {
  int code;
  if (!PyArg_ParseTuple(args, "i", &code)) return NULL;
  return PyUnicode_FromString(ts_client_strerror(code));
}

static PyObject *mod_set_error_factory(PyObject *Py_UNUSED(m), PyObject *fn) {
  Py_INCREF(fn);
  Py_XSETREF(error_factory, fn);
  Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"load_config", mod_load_config, METH_VARARGS,
     "load_config(path, tf_config, overrides) -> dict (config/ts_config.c's rules)"},
    {"strerror", mod_strerror, METH_VARARGS, "strerror(code) -> str"},
    {"set_error_factory", mod_set_error_factory, METH_O,
     "set_error_factory(fn): fn(code, message) -> exception, raised for library errors"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "tessera._client",
                                    "CPython binding of libtessera-client (see tessera).", -1,
                                    mod_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__client(void);
PyMODINIT_FUNC PyInit__client(void) {
  if (PyType_Ready(&ClientType) < 0 || PyType_Ready(&RequestType) < 0) return NULL;
  PyObject *m = PyModule_Create(&moddef);
  if (!m) return NULL;
  Py_INCREF(&ClientType);
  Py_INCREF(&RequestType);
  if (PyModule_AddObject(m, "Client", (PyObject *)&ClientType) < 0 ||
      PyModule_AddObject(m, "Request", (PyObject *)&RequestType) < 0 ||
      PyModule_AddStringConstant(m, "version", tessera_version()) < 0)
    goto fail;
  static const struct {
    const char *name;
    long long value;
  } consts[] = {
#define C(x) {#x, x}
      C(TS_CLIENT_PULL), C(TS_CLIENT_PUSH), C(TS_CLIENT_PUSH_PULL), C(TS_CLIENT_ASSIGN),
      C(TS_CLIENT_ASSIGN_INITIAL), C(TS_CLIENT_TRAINABLE), C(TS_CLIENT_STATE),
      C(TS_CLIENT_INIT_ZEROS), C(TS_CLIENT_INIT_GLOROT_UNIFORM), C(TS_CLIENT_INIT_ONES),
      C(TS_CLIENT_LOG_ERR), C(TS_CLIENT_LOG_WARN), C(TS_CLIENT_LOG_NOTICE), C(TS_CLIENT_LOG_INFO),
      C(TS_CLIENT_LOG_DEBUG),
      C(TS_CLIENT_EINCOMPLETE), C(TS_CLIENT_EPROTO), C(TS_CLIENT_EVERSION), C(TS_CLIENT_ETOOBIG),
      C(TS_CLIENT_ESIZE), C(TS_CLIENT_ENOTENSOR), C(TS_CLIENT_ESHAPE), C(TS_CLIENT_ESTALE),
      C(TS_CLIENT_EFUTURE), C(TS_CLIENT_ENONFINITE), C(TS_CLIENT_EAUTH), C(TS_CLIENT_EPERM),
      C(TS_CLIENT_ECONFIG), C(TS_CLIENT_EINVAL), C(TS_CLIENT_ENOMEM), C(TS_CLIENT_ETIMEDOUT),
      C(TS_CLIENT_EUNAVAIL), C(TS_CLIENT_ECLOSED), C(TS_CLIENT_ESHUTDOWN),
      C(TS_CLIENT_EINTERNAL), C(TS_CLIENT_EDATA), C(TS_CLIENT_EDEVICE),
      C(TS_CLIENT_ENOTDECLARED), C(TS_CLIENT_EROLE), C(TS_CLIENT_EBUSY), C(TS_CLIENT_ENOTREADY),
      C(TS_CLIENT_ENOTABLE), C(TS_CLIENT_SPARSE_PULL), C(TS_CLIENT_SPARSE_PUSH),
      C(TS_CLIENT_SPARSE_PUSH_PULL), C(TS_CLIENT_ROW_ZEROS), C(TS_CLIENT_ROW_UNIFORM),
      C(TS_CLIENT_ROW_NORMAL), C(TS_CLIENT_ROW_TRUNCATED_NORMAL), C(TS_CLIENT_ROWOPT_DEFAULT),
      C(TS_CLIENT_ROWOPT_SGD), C(TS_CLIENT_ROWOPT_ADAGRAD), C(TS_CLIENT_ROWOPT_ADAM),
      C(TS_CLIENT_ROWOPT_FTRL), C(TS_CLIENT_ROWS_READ_ONLY),
#undef C
  };
  for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
    if (PyModule_AddIntConstant(m, consts[i].name + strlen("TS_CLIENT_"), (long)consts[i].value) < 0)
      goto fail;
  if (PyModule_AddObject(m, "STEP_PULLED", PyLong_FromUnsignedLongLong(TS_CLIENT_STEP_PULLED)) < 0 ||
      PyModule_AddObject(m, "VERSION_NEXT", PyLong_FromUnsignedLongLong(TS_CLIENT_VERSION_NEXT)) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
