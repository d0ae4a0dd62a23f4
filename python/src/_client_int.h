/*
 * Inside tessera._client (see _client.c for how the module works): the types its three files
 * share and the functions they call on each other.
 *
 *   _client.c   the Client type, the module's functions, PyInit__client
 *   _request.c  the Request type: submit, completion, wait, buffers
 *   _jobs.c     errors, clocks, the log queue, helper-thread jobs for the blocking calls
 *   _sigint.c   SIGINT seen from any thread, for the waits of _request.c (_sigint.h)
 */
#ifndef TESSERA_PY_CLIENT_INT_H
#define TESSERA_PY_CLIENT_INT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tessera/client.h>

#include "ts_config.h"
#include "ts_config_job.h"

/* Py_NewRef is CPython 3.10's; the package supports 3.9 (pyproject.toml requires-python). */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif


#define SLICE_S 0.1 /* job_run's longest wait between two signal checks (requests: _sigint.h) */
#define LOGQ_MAX 512
#define LOGQ_LINE 512

typedef struct {
  pthread_mutex_t mu;
  size_t head, n;
  uint64_t dropped;
  struct {
    int level;
    char msg[LOGQ_LINE];
  } line[LOGQ_MAX];
} logq_t;

typedef enum {
  JOB_OPEN, JOB_DECLARE, JOB_STATUS, JOB_HEARTBEAT, JOB_CHECKPOINT, JOB_SHUTDOWN, JOB_TABLE_KEYS
} job_kind_t;

/* State shared by a Client and its helper threads; freed by the Client once bg is 0. */
typedef struct {
  ts_client_t *c;
  logq_t *logq;
  atomic_int bg;          /* helper jobs still running on this client */
  atomic_int declaring;   /* an abandoned declare is still running */
} shared_t;

typedef struct job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, abandoned;
  job_kind_t kind;
  shared_t *sh;           /* NULL for JOB_OPEN */
  int rc;
  char errmsg[1024];
  /* JOB_OPEN */
  ts_client_opts_t opts;
  char **addrs;
  size_t naddrs;
  char *identity;
  char *token;
  char *tls[3];        /* auth.tls: CA, certificate and key files (NULL: plaintext) */
  ts_client_job_setting_t *job_kv; /* the job settings the handshake sends (opts.job) */
  char **job_str;                  /* their keys and values, 2 per setting */
  size_t njob;
  logq_t *logq;
  ts_client_t *opened;
  /* JOB_DECLARE */
  ts_client_tensor_t *tensors;
  uint64_t **shapes;
  char **names;
  size_t ntensors;
  uint64_t seed;
  ts_client_kind_t *kinds; /* per tensor */
  bool values_follow;
  ts_client_table_t *tables; /* the model's embedding tables (names in table_names) */
  char **table_names;
  size_t ntables;
  bool awaiting;           /* out */
  /* JOB_STATUS, JOB_CHECKPOINT, JOB_SHUTDOWN */
  uint32_t shard;
  bool checkpoint;
  ts_client_shard_status_t *status;
  char path[4096];
  uint64_t step;
  /* JOB_TABLE_KEYS: table index in, every shard's keys out (ts_client_keys_free) */
  uint32_t table;
  int64_t *keys;
  size_t nkeys;
} job_t;

typedef struct {
  PyObject_HEAD
  shared_t *sh;
  PyObject *logfn;     /* callable(level, msg) or None */
  PyObject *inflight;  /* list of Request objects submitted and not yet reaped */
  uint32_t busy_poll_us;
  bool closed;
  bool sigint_interrupted; /* a wait abandoned on a signal interrupted it (_request.c) */
} ClientObject;

typedef struct {
  PyObject_HEAD
  ClientObject *client;
  ts_client_req_t req;
  const float **grad;  /* per declared tensor */
  float **dst;
  uint32_t *tensors;
  size_t ntensors;
  Py_buffer *views;
  size_t nviews;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state; /* under mu: 0 new, 1 in flight, 2 done (callback ran), 3 reaped */
  atomic_int done_hint;
} RequestObject;

/* _jobs.c: errors raised from library codes (error_factory: tessera._errors.from_code),
 * monotonic clocks and condition variables, the bounded log queue, helper-thread jobs. */
extern PyObject *error_factory;
extern PyTypeObject ClientType;
extern PyTypeObject RequestType;

PyObject *raise_code(int code, const char *msg);
double mono_s(void);
void cond_init_mono(pthread_cond_t *cv);
/* Wait on cv (made by cond_init_mono) while pending(arg), read with mu held, is true, for at
 * most s seconds; returns whether it has become false. Takes and releases mu; no GIL. */
bool cond_wait_while(pthread_mutex_t *mu, pthread_cond_t *cv, bool (*pending)(const void *),
                     const void *arg, double s);
logq_t *logq_new(void);
void logq_free(logq_t *q);
void logq_push(void *arg, int level, const char *msg);
void logq_drain(logq_t *q, PyObject *fn);
void job_free(job_t *j);
job_t *job_new(job_kind_t kind, shared_t *sh);
int job_run(job_t *j, logq_t *logq, PyObject *logfn);
/* _request.c: reap the client's finished requests (GIL held); Client.submit. */
void client_reap(ClientObject *self);
PyObject *Client_submit(ClientObject *self, PyObject *args);
PyObject *Client_submit_rows(ClientObject *self, PyObject *args);
/* _client.c: a str as a malloc'd UTF-8 copy (NULL with an exception set). */
char *dup_utf8(PyObject *o);

/* _tables.c: the tables of declare(..., tables) into j (a sequence of tuples), and a
 * shard's tables as a list of dicts (its status). */
int parse_tables(PyObject *tables, job_t *j);
PyObject *tables_list(const ts_client_shard_status_t *s);
/* _tables.c: Client.table_keys(table) -> bytes of the table's keys (int64, ascending). */
PyObject *Client_table_keys(ClientObject *self, PyObject *args);
/* _client.c: a job of kind for this client, and running it (releasing the GIL) to result. */
job_t *client_job(ClientObject *self, job_kind_t kind);
PyObject *client_run(ClientObject *self, job_t *j, PyObject *(*result)(const job_t *));
/* _client.c: raise (and return -1) unless the client is open / has no declare running. */
int check_open(ClientObject *self);
int check_no_declare(ClientObject *self);

/* _status.c: a shard's status as a dict (ShardStatus's fields); NULL with an exception set. */
PyObject *status_dict(const ts_client_shard_status_t *s);

#endif
