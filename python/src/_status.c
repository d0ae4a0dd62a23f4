/*
 * A shard's status (ts_client_shard_status_t) as the dict tessera's ShardStatus is made
 * from (tessera/_results.py): what a worker or shard has not reported is None, as psctl's
 * JSON null.
 */
#include "_client_int.h"

PyObject *status_dict(const ts_client_shard_status_t *s) {
  PyObject *workers = PyList_New(0);
  if (!workers) return NULL;
  for (size_t i = 0; i < s->num_workers_seen; i++) {
    const ts_client_worker_status_t *w = &s->workers[i];
    PyObject *d = Py_BuildValue(
        "{s:i,s:K,s:d,s:d,s:d,s:O,s:O,s:d,s:s,s:K,s:K}", "task", (int)w->task, "step",
        (unsigned long long)w->step, "loss", w->loss, "examples_per_sec", w->examples_per_sec,
        "last_seen_s", w->last_seen_s, "alive", w->alive ? Py_True : Py_False, "done",
        w->done ? Py_True : Py_False, "epoch_progress", w->epoch_progress, "identity",
        w->identity ? w->identity : "", "clock", (unsigned long long)w->clock, "stale_dropped",
        (unsigned long long)w->stale_dropped);
    /* What the worker has not reported is None (psctl's JSON null). */
    PyObject *dev = w->device && w->device[0] ? PyUnicode_FromString(w->device) : Py_NewRef(Py_None);
    PyObject *state = PyUnicode_FromString(w->done ? "stopped" : w->alive ? "alive" : "dead");
    PyObject *auc = w->has_auc ? PyFloat_FromDouble(w->auc) : Py_NewRef(Py_None);
    PyObject *tauc = w->has_test_auc ? PyFloat_FromDouble(w->test_auc) : Py_NewRef(Py_None);
    PyObject *tloss = w->has_test_auc ? PyFloat_FromDouble(w->test_logloss) : Py_NewRef(Py_None);
    if (d && (!auc || !tauc || !tloss || PyDict_SetItemString(d, "auc", auc) < 0 ||
              PyDict_SetItemString(d, "test_auc", tauc) < 0 ||
              PyDict_SetItemString(d, "test_logloss", tloss) < 0))
      Py_CLEAR(d);
    Py_XDECREF(auc);
    Py_XDECREF(tauc);
    Py_XDECREF(tloss);
    if (d && (!dev || !state || PyDict_SetItemString(d, "device", dev) < 0 ||
              PyDict_SetItemString(d, "state", state) < 0 ||
              PyDict_SetItemString(d, "reported", w->reported ? Py_True : Py_False) < 0 ||
              PyDict_SetItemString(d, "step_known", w->step_known ? Py_True : Py_False) < 0))
      Py_CLEAR(d);
    Py_XDECREF(dev);
    Py_XDECREF(state);
    if (!d || PyList_Append(workers, d) < 0) {
      Py_XDECREF(d);
      Py_DECREF(workers);
      return NULL;
    }
    Py_DECREF(d);
  }
  PyObject *waiting = PyList_New((Py_ssize_t)s->num_barrier_waiting_for);
  if (!waiting) {
    Py_DECREF(workers);
    return NULL;
  }
  for (size_t i = 0; i < s->num_barrier_waiting_for; i++)
    PyList_SET_ITEM(waiting, (Py_ssize_t)i, PyLong_FromLong(s->barrier_waiting_for[i]));
  PyObject *d = Py_BuildValue(
      "{s:I,s:I,s:s,s:K,s:I,s:K,s:K,s:I,s:N,s:K,s:K,s:K,s:K,s:K,s:d,s:I,s:N,s:K,s:K,s:K,s:K,"
      "s:s,s:d,s:K,s:K,s:I,s:s,s:s,s:I}",
      "shard", s->shard, "num_shards", s->num_shards, "mode", ts_client_mode_name(s->mode),
      "step", (unsigned long long)s->step, "partitions", s->partitions, "bytes",
      (unsigned long long)s->bytes, "version", (unsigned long long)s->version, "tensors",
      s->tensors, "workers", workers, "pushes", (unsigned long long)s->pushes, "pulls",
      (unsigned long long)s->pulls, "stale_dropped", (unsigned long long)s->stale_dropped,
      "rejected_frames", (unsigned long long)s->rejected_frames, "errors",
      (unsigned long long)s->errors, "uptime_s", s->uptime_s, "num_workers", s->num_workers,
      "barrier_waiting_for", waiting, "connections", (unsigned long long)s->connections,
      "auth_failures", (unsigned long long)s->auth_failures, "nonfinite_refused",
      (unsigned long long)s->nonfinite_refused, "incarnation",
      (unsigned long long)s->incarnation, "last_checkpoint",
      s->last_checkpoint ? s->last_checkpoint : "", "last_checkpoint_age_s",
      s->last_checkpoint_age_s, "checkpoints_written", (unsigned long long)s->checkpoints_written,
      "restored_step", (unsigned long long)s->restored_step, "checkpoint_failures",
      s->checkpoint_failures, "checkpoint_error", s->checkpoint_error ? s->checkpoint_error : "",
      "job_id", s->job_id ? s->job_id : "", "workers_joined", s->workers_joined);
  PyObject *fin = s->has_final_test_accuracy ? PyFloat_FromDouble(s->final_test_accuracy)
                                             : Py_NewRef(Py_None);
  PyObject *who = s->has_final_test_accuracy ? PyLong_FromLong(s->final_reporter)
                                             : Py_NewRef(Py_None);
  if (d && (!fin || !who || PyDict_SetItemString(d, "final_test_accuracy", fin) < 0 ||
            PyDict_SetItemString(d, "final_reporter", who) < 0))
    Py_CLEAR(d);
  Py_XDECREF(fin);
  Py_XDECREF(who);
  PyObject *tables = d ? tables_list(s) : NULL;
  if (d && (!tables || PyDict_SetItemString(d, "tables", tables) < 0)) Py_CLEAR(d);
  Py_XDECREF(tables);
  return d;
}
