/* tessera._client: the embedding tables' part of the binding (_client_int.h): the tables
 * of a declare, and a shard's tables in its status. */
#include "_client_int.h"

/* The tables of a declare: each a tuple (name, dim, init, init_param, optimizer,
 * learning_rate, beta1, beta2, epsilon, initial_accumulator, l1, l2, beta, admit_count,
 * admit_probability, steps_to_live, max_rows), as tessera.Table.wire() makes it. Returns 0,
 * or -1 with an exception set. */
int parse_tables(PyObject *tables, job_t *j) {
  if (tables == Py_None) return 0;
  PyObject *seq = PySequence_Fast(tables, "tables must be a sequence of tuples");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  j->tables = calloc((size_t)n + 1, sizeof *j->tables);
  j->table_names = calloc((size_t)n + 1, sizeof *j->table_names);
  if (!j->tables || !j->table_names) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  j->ntables = (size_t)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *name;
    ts_client_table_t *t = &j->tables[i];
    unsigned int dim, admit_count;
    int init, opt;
    unsigned long long steps_to_live, max_rows;
    PyObject *tup = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(tup) ||
        !PyArg_ParseTuple(tup, "UIididdddddddIdKK", &name, &dim, &init, &t->init_param, &opt,
                          &t->learning_rate, &t->beta1, &t->beta2, &t->epsilon,
                          &t->initial_accumulator, &t->l1, &t->l2, &t->beta, &admit_count,
                          &t->admit_probability, &steps_to_live, &max_rows)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "each table must be a tuple");
      Py_DECREF(seq);
      return -1;
    }
    if (!(j->table_names[i] = dup_utf8(name))) {
      Py_DECREF(seq);
      return -1;
    }
    t->name = j->table_names[i];
    t->dim = dim;
    t->init = (ts_client_row_init_t)init;
    t->optimizer = (ts_client_rowopt_t)opt;
    t->admit_count = admit_count;
    t->steps_to_live = steps_to_live;
    t->max_rows = max_rows;
  }
  Py_DECREF(seq);
  return 0;
}

/* The shard's tables as a list of dicts (name, dim, rows, bytes, version, created,
 * evicted, filtered, pulled_rows, pushed_rows, hot_keys, hot_share). */
PyObject *tables_list(const ts_client_shard_status_t *s) {
  PyObject *l = PyList_New(0);
  for (size_t i = 0; l && i < s->num_tables; i++) {
    const ts_client_table_status_t *t = &s->tables[i];
    PyObject *hot = PyList_New((Py_ssize_t)t->num_hot_keys);
    for (uint32_t k = 0; hot && k < t->num_hot_keys; k++)
      PyList_SET_ITEM(hot, (Py_ssize_t)k, PyLong_FromLongLong((long long)t->hot_keys[k]));
    PyObject *d = hot ? Py_BuildValue("{s:s,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N,s:d}",
                                      "name", t->name, "dim", t->dim, "rows",
                                      (unsigned long long)t->rows, "bytes",
                                      (unsigned long long)t->bytes, "version",
                                      (unsigned long long)t->version, "created",
                                      (unsigned long long)t->created, "evicted",
                                      (unsigned long long)t->evicted, "filtered",
                                      (unsigned long long)t->filtered, "pulled_rows",
                                      (unsigned long long)t->pulled_rows, "pushed_rows",
                                      (unsigned long long)t->pushed_rows, "hot_keys", hot,
                                      "hot_share", t->hot_share)
                      : NULL;
    if (!d || PyList_Append(l, d) < 0) Py_CLEAR(l);
    Py_XDECREF(d);
  }
  return l;
}

static PyObject *keys_result(const job_t *j) {
  return PyBytes_FromStringAndSize(j->keys ? (const char *)j->keys : "",
                                   (Py_ssize_t)(j->nkeys * sizeof(int64_t)));
}

PyObject *Client_table_keys(ClientObject *self, PyObject *args) {
  unsigned int table;
  job_t *j;
  if (!PyArg_ParseTuple(args, "I", &table) || !(j = client_job(self, JOB_TABLE_KEYS)))
    return NULL;
  j->table = table;
  return client_run(self, j, keys_result);
}
