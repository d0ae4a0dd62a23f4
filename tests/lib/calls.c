#include "calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_log.h"

static int finish(ts_client_t *c, ts_client_req_t *q, uint64_t *version, tc_result_t *res,
                  char *errmsg, size_t errlen) {
  int rc = ts_client_run(c, q);
  if (rc < 0 && errmsg && errlen) snprintf(errmsg, errlen, "%s", q->errmsg);
  if (rc == 0 && version) *version = q->version;
  if (res)
    *res = (tc_result_t){.applied = q->applied, .accumulated = q->accumulated,
                         .stale = q->stale, .duplicate = q->duplicate, .push_rc = q->push_rc,
                         .pull_rc = q->pull_rc};
  return rc;
}

int tc_pull(ts_client_t *c, float *const *dst, uint64_t min_version, uint64_t clock,
            uint64_t *version, char *errmsg, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = dst;
  q.min_version = min_version;
  q.clock = clock;
  return finish(c, &q, version, NULL, errmsg, errlen);
}

int tc_push(ts_client_t *c, const float *const *grad, uint64_t step, tc_result_t *res,
            char *errmsg, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  q.grad = grad;
  q.step = step;
  return finish(c, &q, NULL, res, errmsg, errlen);
}

int tc_push_parts(ts_client_t *c, const float *const *grad, const size_t *parts, size_t n,
                  uint64_t step, tc_result_t *res, char *errmsg, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  q.grad = grad;
  q.parts = parts;
  q.num_parts = n;
  q.step = step;
  return finish(c, &q, NULL, res, errmsg, errlen);
}

int tc_push_pull(ts_client_t *c, const float *const *grad, uint64_t step, float *const *dst,
                 uint64_t min_version, uint64_t clock, uint64_t *version, tc_result_t *res,
                 char *errmsg, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH_PULL);
  q.grad = grad;
  q.dst = dst;
  q.step = step;
  q.min_version = min_version;
  q.clock = clock;
  return finish(c, &q, version, res, errmsg, errlen);
}

size_t tc_tensor_parts(const ts_client_t *c, uint32_t t) {
  size_t n = 0;
  ts_client_part_t p;
  for (size_t k = 0; k < ts_client_num_parts(c); k++)
    if (ts_client_part(c, k, &p) == 0 && p.tensor == t) n++;
  return n;
}

size_t tc_shard_parts(const ts_client_t *c, uint32_t s) {
  size_t n = 0;
  ts_client_part_t p;
  for (size_t k = 0; k < ts_client_num_parts(c); k++)
    if (ts_client_part(c, k, &p) == 0 && p.shard == s) n++;
  return n;
}

void tc_opts(ts_client_opts_t *o, const char *const *addrs, size_t num_shards) {
  ts_client_opts_init(o);
  o->addrs = addrs;
  o->num_shards = num_shards;
  o->log = ts_log_forward;
  o->log_level = TS_CLIENT_LOG_DEBUG;
}

int tc_open(ts_client_t **cl, const ts_client_opts_t *o, const ts_client_tensor_t *model,
            size_t n, uint64_t seed) {
  char err[512];
  int rc = ts_client_open(cl, o, err, sizeof err);
  if (rc < 0) {
    fprintf(stderr, "open: %s\n", err);
    return rc;
  }
  if (!model) return 0;
  rc = ts_client_declare(*cl, model, n, seed, err, sizeof err);
  if (rc < 0) fprintf(stderr, "declare: %s\n", err);
  return rc;
}

int tc_open_tables(ts_client_t **cl, const ts_client_opts_t *o, const ts_client_table_t *tables,
                   size_t n, uint64_t seed) {
  int rc = tc_open(cl, o, NULL, 0, 0);
  if (rc < 0) return rc;
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.seed = seed;
  d.tables = tables;
  d.num_tables = n;
  char err[512];
  rc = ts_client_declare_ex(*cl, NULL, 0, &d, err, sizeof err);
  if (rc < 0) fprintf(stderr, "declare: %s\n", err);
  return rc;
}

void tc_opts_role(ts_client_opts_t *o, const char *const *addrs, size_t num_shards, bool admin) {
  tc_opts(o, addrs, num_shards);
  o->admin = admin;
  o->task = admin ? -1 : 0;
  o->connect_timeout_s = 5;
  o->request_timeout_s = 10;
  o->require_all = true;
}

ts_client_t *tc_open_role(const char *const *addrs, size_t num_shards, bool admin,
                          const ts_client_tensor_t *model, size_t n, uint64_t seed) {
  ts_client_opts_t o;
  tc_opts_role(&o, addrs, num_shards, admin);
  ts_client_t *cl = NULL;
  if (tc_open(&cl, &o, admin ? NULL : model, n, seed) == 0) return cl;
  ts_client_close(cl);
  return NULL;
}

int tc_checkpoint(const char *const *addrs, size_t num_shards, uint32_t shard, char *path,
                  size_t n) {
  ts_client_opts_t o;
  tc_opts_role(&o, addrs, num_shards, true);
  ts_client_t *a = NULL;
  char err[512];
  uint64_t step = 0;
  int rc = ts_client_open(&a, &o, err, sizeof err);
  if (rc == 0) rc = ts_client_checkpoint(a, shard, path, n, &step, err, sizeof err);
  if (rc < 0) fprintf(stderr, "checkpoint: %s\n", err);
  ts_client_close(a);
  return rc;
}

int tc_push_filled(ts_client_t *c, float v, size_t n, int times) {
  float *g = malloc(n * sizeof *g);
  if (!g) return -1;
  for (size_t i = 0; i < n; i++) g[i] = v;
  char err[512];
  int rc = 0;
  for (int i = 0; i < times && rc == 0; i++) {
    const float *gp[] = {g};
    rc = tc_push(c, gp, 0, NULL, err, sizeof err);
    if (rc < 0) fprintf(stderr, "push: %s\n", err);
  }
  free(g);
  return rc;
}
