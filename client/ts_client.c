/* The public API of include/tessera/client.h, except requests (ts_client_req.c): opening
 * and closing a client, the job and plan queries, declare, heartbeats, status and admin. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_auth.h"
#include "ts_client_int.h"
#include "ts_tls.h"
#include "ts_err.h"
#include "ts_init.h"
#include "ts_log.h"
#include "ts_msg.h"
#include "ts_status.h"

/* The longest identity sent in a handshake, in bytes. */
#define TS_CLIENT_IDENTITY_MAX 127

/* The public codes are the wire's (base/ts_err.h). */
#define SAME_CODE(name, value, msg) _Static_assert((int)TS_CLIENT_##name == (int)TS_##name, #name);
TS_ERR_MAP(SAME_CODE)
#undef SAME_CODE
_Static_assert((int)TS_CLIENT_INIT_GLOROT_UNIFORM == (int)TS_INIT_GLOROT_UNIFORM, "init kinds");
_Static_assert((int)TS_CLIENT_MODE_SYNC == (int)TESSERA__MODE__MODE_SYNC, "modes");

#define STR2(x) #x
#define STR(x) STR2(x)

const char *tessera_version(void) {
  return STR(TESSERA_VERSION_MAJOR) "." STR(TESSERA_VERSION_MINOR) "." STR(TESSERA_VERSION_PATCH);
}

const char *ts_client_strerror(int err) { return ts_strerror(err); }

const char *ts_client_mode_name(ts_client_mode_t mode) {
  return ts_msg_mode_name((Tessera__Mode)mode);
}


char *ts_client_token_read(const char *path, char *errmsg, size_t errlen) {
  if (!path) {
    ts_errmsg_printf(errmsg, errlen, "no token file named");
    return NULL;
  }
  char none[1]; /* errmsg may be NULL; ts_auth_read_token always writes its reason */
  return ts_auth_read_token(path, errmsg ? errmsg : none, errmsg ? errlen : sizeof none);
}

void ts_client_token_free(char *token) { ts_auth_free_token(token); }

_Static_assert(TS_CLIENT_TASK_KEY_LEN == TS_AUTH_TASK_KEY_LEN, "the task key's length");

int ts_client_task_key(const char *token, int task, char *out, size_t n) {
  if (!token || task < 0 || !out || n < TS_AUTH_TASK_KEY_LEN + 1) return TS_EINVAL;
  ts_auth_task_key(token, task, out);
  return 0;
}

void ts_client_opts_init(ts_client_opts_t *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = (uint32_t)sizeof *o;
  o->connect_timeout_s = 5.0;
  o->request_timeout_s = 60.0;
  o->heartbeat_timeout_s = 5.0;
  o->log_level = TS_CLIENT_LOG_INFO;
}

/* A malformed address fails ts_client_open at once. A numeric one is the shard's address
 * for good; a name is only checked here and resolved on the client thread before each
 * connection (ts_cl_start_connect): one that does not resolve yet is waited for, as a
 * refused connection is (on Kubernetes a worker often starts before its shards' names
 * exist). */
static int resolve(ts_cl_shard_t *sh, char *errmsg, size_t errlen) {
  char host[256];
  if (ts_addr_split(sh->addr, host, sizeof host, NULL) < 0) {
    ts_errmsg_printf(errmsg, errlen, "shard %u: '%s' is not host:port", sh->index, sh->addr);
    return TS_EINVAL;
  }
  snprintf(sh->host, sizeof sh->host, "%s", host);
  struct addrinfo *ai = NULL;
  char why[300];
  struct addrinfo hints = {.ai_flags = AI_NUMERICHOST};
  if (getaddrinfo(host, NULL, &hints, &ai) != 0) {
    sh->by_name = true;
    return 0;
  }
  freeaddrinfo(ai);
  if (ts_addr_resolve(sh->addr, false, &ai, why, sizeof why) < 0) {
    ts_errmsg_printf(errmsg, errlen, "shard %u: %s", sh->index, why);
    return TS_EINVAL;
  }
  memcpy(&sh->sa, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  return 0;
}

void ts_cl_free_model(ts_client_t *c) {
  for (size_t i = 0; c->decl_t && i < c->decl.n_tensors; i++) {
    ts_free(c->decl_t[i].name);
    ts_free(c->decl_t[i].shape);
  }
  ts_free(c->decl_t);
  ts_free(c->decl_p);
  c->decl_t = NULL;
  c->decl_p = NULL;
  c->decl.n_tensors = 0;
  for (size_t i = 0; c->decl_tb && i < c->decl.n_tables; i++) ts_free(c->decl_tb[i].name);
  ts_free(c->decl_tb);
  ts_free(c->decl_tp);
  ts_free(c->table_pulled);
  c->decl_tb = NULL;
  c->decl_tp = NULL;
  c->table_pulled = NULL;
  c->decl.n_tables = 0;
  c->decl.tables = NULL;
  for (uint32_t s = 0; c->shard_parts && s < c->n; s++) ts_free(c->shard_parts[s]);
  ts_free(c->shard_parts);
  ts_free(c->shard_nparts);
  c->shard_parts = NULL;
  c->shard_nparts = NULL;
  ts_plan_free(&c->plan);
}

static void free_job(ts_client_t *c) {
  for (size_t i = 0; c->job_s && i < c->n_job; i++) {
    ts_free(c->job_s[i].key);
    ts_free(c->job_s[i].value);
  }
  ts_free(c->job_s);
  ts_free(c->job_p);
  c->job_s = NULL;
  c->job_p = NULL;
  c->n_job = 0;
}

/* Copies the caller's job settings into the Handshake's form (opts->job). */
static int take_job(ts_client_t *c, const ts_client_opts_t *o, char *errmsg, size_t errlen) {
  if (!o->job || o->num_job == 0 || o->admin) return 0;
  if (o->num_job > 256) {
    ts_errmsg_printf(errmsg, errlen, "%zu job settings: at most 256", o->num_job);
    return TS_EINVAL;
  }
  c->job_s = ts_calloc(o->num_job, sizeof *c->job_s);
  c->job_p = ts_calloc(o->num_job, sizeof *c->job_p);
  if (!c->job_s || !c->job_p) goto oom;
  for (size_t i = 0; i < o->num_job; i++) {
    if (!o->job[i].key || !o->job[i].value) {
      ts_errmsg_printf(errmsg, errlen, "job setting %zu has no key or value", i);
      return TS_EINVAL;
    }
    tessera__job_setting__init(&c->job_s[i]);
    c->job_p[i] = &c->job_s[i];
    c->n_job = i + 1;
    c->job_s[i].key = ts_strdup(o->job[i].key);
    c->job_s[i].value = ts_strdup(o->job[i].value);
    if (!c->job_s[i].key || !c->job_s[i].value) goto oom;
  }
  return 0;
oom:
  ts_errmsg_printf(errmsg, errlen, "out of memory");
  return TS_ENOMEM;
}

static void free_client(ts_client_t *c) {
  free_job(c);
  ts_cl_free_model(c);
  ts_cl_free_failed_pushes(c);
  ts_cl_sparse_cache_free(c);
  ts_free(c->shards);
  ts_free(c->identity);
  ts_auth_free_token(c->token);
  ts_tls_ctx_free(c->tls);
  ts_free(c);
}

/* The caller's options over the defaults: a shorter struct (an older header) keeps the
 * defaults of the fields it does not have. */
static int take_opts(ts_client_opts_t *dst, const ts_client_opts_t *src, char *errmsg,
                     size_t errlen) {
  ts_client_opts_init(dst);
  if (!src || src->struct_size < offsetof(ts_client_opts_t, log) ||
      src->struct_size > sizeof *dst) {
    ts_errmsg_printf(errmsg, errlen, "options not set up with ts_client_opts_init");
    return TS_EINVAL;
  }
  memcpy(dst, src, src->struct_size);
  dst->struct_size = (uint32_t)sizeof *dst;
  if (dst->log_level <= 0) dst->log_level = TS_CLIENT_LOG_INFO;
  if (dst->num_shards == 0 || !dst->addrs) {
    ts_errmsg_printf(errmsg, errlen, "no shards to connect to");
    return TS_EINVAL;
  }
  for (size_t s = 0; s < dst->num_shards; s++) {
    if (!dst->addrs[s]) {
      ts_errmsg_printf(errmsg, errlen, "shard %zu has no address", s);
      return TS_EINVAL;
    }
  }
  return 0;
}

/* Wait until every shard is ready, or (without require_all) has at least been tried. */
static int wait_connected(ts_client_t *c, char *errmsg, size_t errlen) {
  const ts_client_opts_t *opts = &c->opts;
  double timeout = opts->connect_timeout_s > 0 ? opts->connect_timeout_s : 5.0;
  uint64_t deadline = uv_hrtime() + (uint64_t)(timeout * 1e9);
  int rc = 0;
  uv_mutex_lock(&c->mu);
  for (;;) {
    bool all_ready = (uint32_t)c->ready == c->n, settled = true;
    int fatal = 0;
    bool job_refused = false;
    for (uint32_t s = 0; s < c->n; s++) {
      ts_cl_shard_t *sh = &c->shards[s];
      /* A shard whose handshake is under way is about to be ready: its handshake reply
       * marks it tried a moment before it turns ready, and without this an open could
       * return in between and report a healthy shard as down. */
      bool midway = sh->state == SH_HELLO || sh->state == SH_HANDSHAKE ||
                    sh->state == SH_DECLARING;
      if (sh->state != SH_READY && (!sh->tried || midway)) settled = false;
      if (sh->state != SH_READY && sh->fatal) fatal = sh->fatal;
      if (sh->state != SH_READY && sh->job_refused) job_refused = true;
    }
    if (job_refused) {
      /* This worker is not of the shard's job: waiting longer will not change it. */
      for (uint32_t s = 0; s < c->n; s++) {
        ts_cl_shard_t *sh = &c->shards[s];
        if (sh->state != SH_READY && sh->job_refused) {
          ts_errmsg_printf(errmsg, errlen, "shard %u (%s) refused this worker: %s", s, sh->addr, sh->why);
          break;
        }
      }
      uv_mutex_unlock(&c->mu);
      return TS_ECONFIG;
    }
    if (all_ready || (!opts->require_all && settled)) break;
    if (fatal && opts->require_all) {
      rc = fatal;
      break;
    }
    if (opts->cancel && *opts->cancel) {
      ts_errmsg_printf(errmsg, errlen, "interrupted while waiting for the shards");
      uv_mutex_unlock(&c->mu);
      return TS_ESHUTDOWN;
    }
    uint64_t now = uv_hrtime();
    if (now >= deadline) {
      rc = opts->require_all ? TS_EUNAVAIL : 0;
      break;
    }
    /* A signal handler cannot wake a condition variable: with a cancel flag, look at it
     * every 50 ms. */
    uint64_t wait = deadline - now;
    if (opts->cancel && wait > 50000000u) wait = 50000000u;
    uv_cond_timedwait(&c->cv, &c->mu, wait);
  }
  if (rc < 0 && errmsg && errlen) {
    size_t len = (size_t)snprintf(errmsg, errlen, "cannot reach every shard:");
    for (uint32_t s = 0; s < c->n && len < errlen; s++) {
      ts_cl_shard_t *sh = &c->shards[s];
      if (sh->state == SH_READY) continue;
      len += (size_t)snprintf(errmsg + len, errlen - len, " shard %u (%s): %s;", s, sh->addr,
                              ts_cl_why(sh));
    }
    if (len > 0 && len < errlen && errmsg[len - 1] == ';') errmsg[len - 1] = 0;
  }
  uv_mutex_unlock(&c->mu);
  return rc;
}

int ts_client_open(ts_client_t **out, const ts_client_opts_t *opts, char *errmsg, size_t errlen) {
  if (!out) return TS_EINVAL;
  *out = NULL;
  ts_client_opts_t o;
  int rc = take_opts(&o, opts, errmsg, errlen);
  if (rc < 0) return rc;
  if (sodium_init() < 0) {
    ts_errmsg_printf(errmsg, errlen, "libsodium failed to initialise");
    return TS_EINTERNAL;
  }
  ts_client_t *c = ts_calloc(1, sizeof *c);
  if (!c) return TS_ENOMEM;
  /* Random, so a restarted worker's push ids (from 1 again) are not its former self's. */
  while (c->incarnation == 0) randombytes_buf(&c->incarnation, sizeof c->incarnation);
  c->opts = o;
  c->opts.addrs = NULL; /* the caller's: shards keep their own copies */
  c->n = (uint32_t)o.num_shards;
  c->timeout_s = o.request_timeout_s > 0 ? o.request_timeout_s : 60.0;
  if (c->timeout_s > TS_CL_MAX_TIMEOUT_S) c->timeout_s = TS_CL_MAX_TIMEOUT_S;
  c->identity = ts_strdup(o.identity ? o.identity : "");
  /* Shards keep 127 bytes of it, and refuse a handshake over server.max_handshake_bytes
   * (256 at the least): cut it at a character boundary below that. */
  if (c->identity && strlen(c->identity) > TS_CLIENT_IDENTITY_MAX) {
    size_t n = TS_CLIENT_IDENTITY_MAX;
    while (n > 0 && ((unsigned char)c->identity[n] & 0xc0) == 0x80) n--;
    c->identity[n] = 0;
  }
  c->token = o.token ? ts_strdup(o.token) : NULL;
  c->opts.identity = c->identity;
  c->opts.token = NULL;
  c->opts.job = NULL; /* the caller's: the handshake sends c->job_p */
  c->opening = true;
  c->opts.tls_ca_file = c->opts.tls_cert_file = c->opts.tls_key_file = NULL; /* loaded here */
  if (o.tls_ca_file) {
    ts_tls_files_t files = {o.tls_ca_file, o.tls_cert_file, o.tls_key_file};
    if ((rc = ts_tls_ctx_new(&c->tls, &files, false, errmsg, errlen)) < 0) {
      free_client(c);
      return rc;
    }
  }
  rc = take_job(c, &o, errmsg, errlen);
  if (rc < 0) {
    free_client(c);
    return rc;
  }
  c->shards = ts_calloc(c->n, sizeof *c->shards);
  if (!c->identity || !c->shards || (o.token && !c->token)) {
    free_client(c);
    ts_errmsg_printf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  for (uint32_t s = 0; s < c->n; s++) {
    ts_cl_shard_t *sh = &c->shards[s];
    sh->cl = c;
    sh->index = s;
    snprintf(sh->addr, sizeof sh->addr, "%s", o.addrs[s]);
    rc = resolve(sh, errmsg, errlen);
    if (rc < 0) {
      free_client(c);
      return rc;
    }
  }
  uv_loop_init(&c->loop);
  uv_mutex_init(&c->mu);
  uv_cond_init(&c->cv);
  uv_async_init(&c->loop, &c->wake, ts_cl_on_wake);
  c->wake.data = c;
  uv_timer_init(&c->loop, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, ts_cl_on_tick, TS_CL_TICK_MS, TS_CL_TICK_MS);
  uv_timer_init(&c->loop, &c->hb);
  c->hb.data = c;
  if (o.heartbeat_interval_s > 0) {
    uint64_t ms = (uint64_t)(o.heartbeat_interval_s * 1000.0);
    uv_timer_start(&c->hb, ts_cl_on_heartbeat, ms, ms);
  }
  for (uint32_t s = 0; s < c->n; s++) {
    uv_timer_init(&c->loop, &c->shards[s].retry);
    c->shards[s].retry.data = &c->shards[s];
  }
  if (uv_thread_create(&c->thread, ts_cl_thread_main, c) != 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot start the client thread");
    uv_close((uv_handle_t *)&c->wake, NULL);
    uv_close((uv_handle_t *)&c->tick, NULL);
    uv_close((uv_handle_t *)&c->hb, NULL);
    for (uint32_t s = 0; s < c->n; s++) uv_close((uv_handle_t *)&c->shards[s].retry, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    uv_mutex_destroy(&c->mu);
    uv_cond_destroy(&c->cv);
    free_client(c);
    return TS_EINTERNAL;
  }
  rc = wait_connected(c, errmsg, errlen);
  uv_mutex_lock(&c->mu);
  c->opening = false;
  uv_mutex_unlock(&c->mu);
  if (rc < 0) {
    ts_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

void ts_client_interrupt(ts_client_t *c) {
  if (!c) return;
  c->interrupted = 1;
  uv_async_send(&c->wake); /* async-signal-safe */
}

void ts_client_close(ts_client_t *c) {
  if (!c) return;
  if (ts_cl_on_client_thread(c)) {
    /* Joining itself would hang: refuse, and say so. */
    if (c->opts.log)
      c->opts.log(c->opts.log_arg, TS_CLIENT_LOG_ERR,
                  "ts_client_close called on the client thread: ignored");
    return;
  }
  uv_mutex_lock(&c->mu);
  c->stop = true;
  uv_mutex_unlock(&c->mu);
  uv_async_send(&c->wake);
  uv_thread_join(&c->thread);
  int rc = uv_loop_close(&c->loop);
  if (rc != 0 && c->opts.log) {
    char msg[160];
    snprintf(msg, sizeof msg, "client loop closed with handles open: %s", uv_strerror(rc));
    c->opts.log(c->opts.log_arg, TS_CLIENT_LOG_WARN, msg);
  }
  uv_mutex_destroy(&c->mu);
  uv_cond_destroy(&c->cv);
  free_client(c);
}

void ts_client_set_timeout(ts_client_t *c, double seconds) {
  if (c && seconds > 0)
    c->timeout_s = seconds < TS_CL_MAX_TIMEOUT_S ? seconds : TS_CL_MAX_TIMEOUT_S;
}

uint32_t ts_client_num_shards(const ts_client_t *c) { return c ? c->n : 0; }

bool ts_client_shard_up(ts_client_t *c, uint32_t shard, char *why, size_t whylen) {
  if (!c || shard >= c->n) {
    ts_errmsg_printf(why, whylen, "no such shard");
    return false;
  }
  uv_mutex_lock(&c->mu);
  bool up = c->shards[shard].state == SH_READY;
  if (!up) ts_errmsg_printf(why, whylen, "%s", ts_cl_why(&c->shards[shard]));
  uv_mutex_unlock(&c->mu);
  return up;
}

int ts_client_shard_error(ts_client_t *c, uint32_t shard) {
  if (!c || shard >= c->n) return 0;
  uv_mutex_lock(&c->mu);
  int code = c->shards[shard].state == SH_READY ? 0 : c->shards[shard].fatal;
  uv_mutex_unlock(&c->mu);
  return code;
}

uint64_t ts_client_partition_bytes(ts_client_t *c) {
  if (!c) return 0;
  uv_mutex_lock(&c->mu);
  uint64_t v = c->partition_bytes;
  uv_mutex_unlock(&c->mu);
  return v;
}

uint32_t ts_client_job_workers(ts_client_t *c) {
  if (!c) return 0;
  uv_mutex_lock(&c->mu);
  uint32_t v = c->job_workers;
  uv_mutex_unlock(&c->mu);
  return v;
}

ts_client_mode_t ts_client_job_mode(ts_client_t *c) {
  if (!c) return TS_CLIENT_MODE_UNSPECIFIED;
  uv_mutex_lock(&c->mu);
  Tessera__Mode m = c->mode;
  uv_mutex_unlock(&c->mu);
  return ts_status_mode(m);
}

uint64_t ts_client_restarts(ts_client_t *c) {
  if (!c) return 0;
  uv_mutex_lock(&c->mu);
  uint64_t n = c->restarts;
  uv_mutex_unlock(&c->mu);
  return n;
}

size_t ts_client_num_tensors(const ts_client_t *c) {
  return c && c->plan.parts ? c->plan.num_tensors : 0;
}

size_t ts_client_num_parts(const ts_client_t *c) {
  return c && c->plan.parts ? c->plan.num_parts : 0;
}

uint64_t ts_client_tensor_elems(const ts_client_t *c, size_t t) {
  if (!c || !c->plan.parts || t >= c->plan.num_tensors || c->plan.tensor_parts[t] == 0) return 0;
  const ts_part_t *last = &c->plan.parts[c->plan.tensor_first[t] + c->plan.tensor_parts[t] - 1];
  return last->offset + last->count;
}

int ts_client_part(const ts_client_t *c, size_t k, ts_client_part_t *out) {
  if (!c || !out || !c->plan.parts || k >= c->plan.num_parts) return TS_EINVAL;
  const ts_part_t *p = &c->plan.parts[k];
  *out = (ts_client_part_t){.tensor = p->tensor, .part = p->part, .shard = p->shard,
                            .offset = p->offset, .count = p->count};
  return 0;
}

void ts_client_declare_opts_init(ts_client_declare_opts_t *opts) {
  memset(opts, 0, sizeof *opts);
  opts->struct_size = sizeof *opts;
}

int ts_client_declare(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n, uint64_t seed,
                      char *errmsg, size_t errlen) {
  ts_client_declare_opts_t o;
  ts_client_declare_opts_init(&o);
  o.seed = seed;
  return ts_client_declare_ex(c, tensors, n, &o, errmsg, errlen);
}

/* The declare options' size before tables (a caller built against that header). */
#define DECLARE_OPTS_V1_SIZE offsetof(ts_client_declare_opts_t, tables)

/* The Declare's tables from the caller's list. Returns 0, TS_EINVAL (errmsg says which)
 * or TS_ENOMEM. */
static int take_tables(ts_client_t *c, const ts_client_table_t *tables, size_t n, char *errmsg,
                       size_t errlen) {
  if (n == 0) return 0;
  if (!tables) {
    ts_errmsg_printf(errmsg, errlen, "num_tables is %zu but tables is NULL", n);
    return TS_EINVAL;
  }
  c->decl_tb = ts_calloc(n, sizeof *c->decl_tb);
  c->decl_tp = ts_calloc(n, sizeof *c->decl_tp);
  c->table_pulled = ts_calloc((size_t)c->n * n, sizeof *c->table_pulled);
  if (!c->decl_tb || !c->decl_tp || !c->table_pulled) return TS_ENOMEM;
  c->decl.n_tables = n;
  c->decl.tables = c->decl_tp;
  for (size_t i = 0; i < n; i++) {
    const ts_client_table_t *t = &tables[i];
    Tessera__TableDecl *d = &c->decl_tb[i];
    tessera__table_decl__init(d);
    c->decl_tp[i] = d;
    if (!t->name || !t->name[0] || t->dim == 0 || t->dim > TS_MSG_MAX_DIM) {
      ts_errmsg_printf(errmsg, errlen, "table %zu has no name or a width (dim %u) out of 1 to %d",
                       i, t->dim, TS_MSG_MAX_DIM);
      return TS_EINVAL;
    }
    if (!(d->name = ts_strdup(t->name))) return TS_ENOMEM;
    d->dim = t->dim;
    d->init = (Tessera__RowInit)t->init;
    d->init_param = t->init_param;
    d->optimizer = (Tessera__RowOptimizer)t->optimizer;
    d->learning_rate = t->learning_rate;
    d->beta1 = t->beta1;
    d->beta2 = t->beta2;
    d->epsilon = t->epsilon;
    d->initial_accumulator = t->initial_accumulator;
    d->l1 = t->l1;
    d->l2 = t->l2;
    d->beta = t->beta;
    d->admit_count = t->admit_count;
    d->admit_probability = t->admit_probability;
    d->steps_to_live = t->steps_to_live;
    d->max_rows = t->max_rows;
  }
  return 0;
}

size_t ts_client_num_tables(const ts_client_t *c) { return c ? c->decl.n_tables : 0; }

uint32_t ts_client_table_dim(const ts_client_t *c, size_t t) {
  return c && t < c->decl.n_tables ? c->decl.tables[t]->dim : 0;
}

int ts_client_declare_ex(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n,
                         ts_client_declare_opts_t *opts, char *errmsg, size_t errlen) {
  if (!opts || (opts->struct_size != sizeof *opts && opts->struct_size != DECLARE_OPTS_V1_SIZE)) {
    ts_errmsg_printf(errmsg, errlen, "declare options missing or of another library version");
    return TS_EINVAL;
  }
  uint64_t seed = opts->seed;
  opts->awaiting_values = false;
  if (!c || (!tensors && n)) {
    ts_errmsg_printf(errmsg, errlen, "no client or no tensor list");
    return TS_EINVAL;
  }
  if (ts_cl_on_client_thread(c)) {
    ts_errmsg_printf(errmsg, errlen, "a blocking call cannot be made on the client thread");
    return TS_EINVAL;
  }
  bool with_tables = opts->struct_size == sizeof *opts;
  int rc = ts_cl_set_model(c, tensors, n, opts->kinds, with_tables ? opts->tables : NULL,
                           with_tables ? opts->num_tables : 0, seed, opts->values_follow, errmsg,
                           errlen);
  if (rc < 0) return rc;
  ts_cl_op_t op = {.kind = OP_DECLARE, .wait_ready = true};
  rc = ts_cl_run_op(c, &op, errmsg, errlen);
  opts->awaiting_values = rc == 0 && op.awaiting;
  uv_mutex_lock(&c->mu);
  if (rc == 0)
    c->declared = true; /* from now on a reconnect re-declares */
  else
    ts_cl_free_model(c); /* refused: no plan, so requests fail with ENOTDECLARED */
  uv_mutex_unlock(&c->mu);
  return rc;
}

int ts_cl_set_model(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n,
                    const ts_client_kind_t *kinds, const ts_client_table_t *tables,
                    size_t num_tables, uint64_t seed, bool values_follow, char *errmsg,
                    size_t errlen) {
  if (n == 0 && num_tables == 0) {
    ts_errmsg_printf(errmsg, errlen, "a model needs at least one tensor or table");
    return TS_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    if (!tensors[i].name || (tensors[i].rank && !tensors[i].shape)) {
      ts_errmsg_printf(errmsg, errlen, "tensor %zu has no name or no shape", i);
      return TS_EINVAL;
    }
  }
  uint64_t pbytes = ts_client_partition_bytes(c);
  if (pbytes == 0) {
    ts_errmsg_printf(errmsg, errlen, "no shard has answered yet, so the partition size is unknown");
    return TS_EUNAVAIL;
  }
  /* No re-declare on reconnect while the model changes: the client thread reads `declared`
   * and encodes the model under the mutex (ts_client_link.c), so it never sees it freed. */
  uv_mutex_lock(&c->mu);
  c->declared = false;
  ts_cl_free_model(c);
  uv_mutex_unlock(&c->mu);
  int rc = TS_ENOMEM;
  uint64_t *elems = ts_calloc(n ? n : 1, sizeof *elems);
  c->decl_t = ts_calloc(n ? n : 1, sizeof *c->decl_t);
  c->decl_p = ts_calloc(n ? n : 1, sizeof *c->decl_p);
  if (!elems || !c->decl_t || !c->decl_p) goto fail;
  tessera__declare__init(&c->decl);
  rc = take_tables(c, tables, num_tables, errmsg, errlen);
  if (rc < 0) goto fail;
  rc = TS_ENOMEM;
  c->decl.seed = seed;
  c->decl.values_follow = values_follow;
  c->decl.n_tensors = n;
  c->decl.tensors = c->decl_p;
  for (size_t i = 0; i < n; i++) {
    Tessera__TensorDecl *t = &c->decl_t[i];
    tessera__tensor_decl__init(t);
    c->decl_p[i] = t;
    t->name = ts_strdup(tensors[i].name);
    t->shape = ts_calloc(tensors[i].rank ? tensors[i].rank : 1, sizeof *t->shape);
    if (!t->name || !t->shape) goto fail;
    t->n_shape = tensors[i].rank;
    elems[i] = 1;
    for (size_t k = 0; k < tensors[i].rank; k++) {
      t->shape[k] = tensors[i].shape[k];
      elems[i] *= tensors[i].shape[k];
    }
    t->init = (Tessera__Init)tensors[i].init;
    t->kind = kinds && kinds[i] == TS_CLIENT_STATE ? TESSERA__TENSOR_KIND__TENSOR_STATE
                                                               : TESSERA__TENSOR_KIND__TENSOR_TRAINABLE;
  }
  /* A model of tables alone has no partitions: an empty plan. */
  rc = n ? ts_plan_build(elems, (uint32_t)n, c->n, pbytes, &c->plan) : 0;
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot plan the model's partitions: %s", ts_strerror(rc));
    goto fail;
  }
  rc = TS_ENOMEM;
  c->shard_parts = ts_calloc(c->n, sizeof *c->shard_parts);
  c->shard_nparts = ts_calloc(c->n, sizeof *c->shard_nparts);
  if (!c->shard_parts || !c->shard_nparts) goto fail;
  for (uint32_t s = 0; s < c->n; s++) {
    uint32_t k = c->plan.shard_parts ? c->plan.shard_parts[s] : 0;
    c->shard_parts[s] = ts_malloc((k ? k : 1) * sizeof(size_t));
    if (!c->shard_parts[s]) goto fail;
  }
  for (size_t k = 0; k < c->plan.num_parts; k++) {
    uint32_t s = c->plan.parts[k].shard;
    c->shard_parts[s][c->shard_nparts[s]++] = k;
  }
  ts_free(elems);
  return 0;
fail:
  if (rc == TS_ENOMEM) ts_errmsg_printf(errmsg, errlen, "out of memory");
  ts_free(elems);
  ts_cl_free_model(c);
  return rc;
}

static int check_shard(ts_client_t *c, uint32_t shard, char *errmsg, size_t errlen) {
  if (!c) return TS_EINVAL;
  if (shard >= c->n) {
    ts_errmsg_printf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  return 0;
}

int ts_client_status(ts_client_t *c, uint32_t shard, ts_client_shard_status_t **out,
                     char *errmsg, size_t errlen) {
  if (!out) return TS_EINVAL;
  *out = NULL;
  int rc = check_shard(c, shard, errmsg, errlen);
  if (rc < 0) return rc;
  ts_cl_op_t op = {.kind = OP_STATUS, .wait_ready = false, .shard = shard};
  rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc == 0 && !op.status) {
    ts_errmsg_printf(errmsg, errlen, "shard %u sent no status", shard);
    rc = TS_EINTERNAL;
  }
  if (rc == 0) {
    rc = ts_status_from_pb(op.status, out);
    if (rc < 0) ts_errmsg_printf(errmsg, errlen, "out of memory");
  }
  if (op.status) ts_msg_free(&op.status->base);
  return rc;
}

void ts_client_status_free(ts_client_shard_status_t *st) { ts_free(st); }

int ts_client_checkpoint(ts_client_t *c, uint32_t shard, char *path, size_t pathlen,
                         uint64_t *step, char *errmsg, size_t errlen) {
  int rc = check_shard(c, shard, errmsg, errlen);
  if (rc < 0) return rc;
  ts_cl_op_t op = {.kind = OP_CHECKPOINT, .wait_ready = false, .shard = shard,
                   .timeout_s = c->timeout_s > 120.0 ? c->timeout_s : 120.0};
  rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc == 0) {
    ts_errmsg_printf(path, pathlen, "%s", op.path);
    if (step) *step = op.ckpt_step;
  }
  return rc;
}

int ts_client_model_reset(ts_client_t *c, uint32_t shard, bool force, bool *dropped,
                          uint64_t *bytes, uint32_t *workers_closed, char *errmsg, size_t errlen) {
  int rc = check_shard(c, shard, errmsg, errlen);
  if (rc < 0) return rc;
  /* The shard may wait up to 5 s for pull replies to finish before it drops the model. */
  ts_cl_op_t op = {.kind = OP_MODEL_RESET, .wait_ready = false, .shard = shard, .force = force,
                   .timeout_s = c->timeout_s > 30.0 ? c->timeout_s : 30.0};
  rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc == 0) {
    if (dropped) *dropped = op.dropped;
    if (bytes) *bytes = op.reset_bytes;
    if (workers_closed) *workers_closed = op.workers_closed;
  }
  return rc;
}

int ts_client_shutdown(ts_client_t *c, uint32_t shard, bool checkpoint, char *path,
                       size_t pathlen, char *errmsg, size_t errlen) {
  int rc = check_shard(c, shard, errmsg, errlen);
  if (rc < 0) return rc;
  ts_cl_op_t op = {.kind = OP_SHUTDOWN, .wait_ready = false, .shard = shard,
                   .checkpoint = checkpoint,
                   .timeout_s = c->timeout_s > 120.0 ? c->timeout_s : 120.0};
  rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc == 0) ts_errmsg_printf(path, pathlen, "%s", op.path);
  return rc;
}
