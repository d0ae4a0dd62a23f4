/*
 * What a worker tells the shards besides its requests (include/tessera/client.h,
 * "heartbeats and progress"): its progress, device, AUC and final accuracy, kept under the
 * client's mutex for the next heartbeats (ts_client_ops.c sends them), and the heartbeats
 * asked for now (ts_client_heartbeat, ts_client_job_end).
 */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "ts_client_int.h"
#include "ts_err.h"

void ts_client_set_progress(ts_client_t *c, uint64_t step, double loss, double examples_per_sec,
                            double epoch_progress, bool done) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->p_step = step;
  c->p_loss = loss;
  c->p_eps = examples_per_sec;
  c->p_prog = epoch_progress;
  c->p_done = done;
  c->p_reported = true;
  uv_mutex_unlock(&c->mu);
}

void ts_client_set_done(ts_client_t *c, bool done) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->p_done = done;
  uv_mutex_unlock(&c->mu);
}

void ts_client_set_device(ts_client_t *c, const char *device) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  snprintf(c->p_device, sizeof c->p_device, "%s", device ? device : "");
  uv_mutex_unlock(&c->mu);
}

int ts_client_heartbeat(ts_client_t *c, char *errmsg, size_t errlen) {
  if (!c) {
    ts_errmsg_printf(errmsg, errlen, "no client");
    return TS_EINVAL;
  }
  ts_cl_op_t op = {.kind = OP_HEARTBEAT, .wait_ready = false};
  return ts_cl_run_op(c, &op, errmsg, errlen);
}

int ts_client_job_end(ts_client_t *c, ts_client_job_end_t *out, char *errmsg, size_t errlen) {
  if (!c || !out) {
    ts_errmsg_printf(errmsg, errlen, "no client or no result");
    return TS_EINVAL;
  }
  memset(out, 0, sizeof *out);
  ts_cl_op_t op = {.kind = OP_HEARTBEAT, .wait_ready = false, .ask_end = true};
  int rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc < 0) return rc;
  if (!op.hb0) {
    ts_errmsg_printf(errmsg, errlen, "shard 0 is not connected");
    return TS_EUNAVAIL;
  }
  *out = op.job_end;
  return 0;
}

static bool is_auc(double v) { return v >= 0.0 && v <= 1.0; } /* false for NaN */

void ts_client_set_auc(ts_client_t *c, double auc) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->p_has_auc = is_auc(auc);
  c->p_auc = c->p_has_auc ? auc : 0.0;
  uv_mutex_unlock(&c->mu);
}

void ts_client_set_test_auc(ts_client_t *c, double auc, double logloss) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->p_has_test_auc = is_auc(auc) && logloss >= 0.0 && logloss <= DBL_MAX;
  c->p_test_auc = c->p_has_test_auc ? auc : 0.0;
  c->p_test_logloss = c->p_has_test_auc ? logloss : 0.0;
  uv_mutex_unlock(&c->mu);
}

void ts_client_set_final_accuracy(ts_client_t *c, double accuracy) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  c->p_has_final = true;
  c->p_final = accuracy;
  uv_mutex_unlock(&c->mu);
}
