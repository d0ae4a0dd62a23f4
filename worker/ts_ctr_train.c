/* The CTR training loop (ts_ctr_train.h). */
#include "ts_ctr_train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

static double now_s(void) {
  return ts_trainer_clock_s(CLOCK_MONOTONIC);
}

int ts_ctr_declare(const ts_ctr_t *m, ts_client_t *client, uint64_t seed, char *errmsg,
                   size_t errlen) {
  const ts_layers_t *d = &m->net.desc;
  ts_client_tensor_t decl[TS_LAYERS_MAX * 2];
  for (size_t i = 0; i < d->num_tensors; i++)
    decl[i] = (ts_client_tensor_t){.name = d->tensors[i].name,
                                   .shape = d->tensors[i].shape,
                                   .rank = d->tensors[i].rank,
                                   .init = (ts_client_init_t)d->tensors[i].init};
  ts_client_table_t tables[TS_CONFIG_EMB_FIELDS_MAX];
  for (size_t t = 0; t < m->num_tables; t++)
    tables[t] = (ts_client_table_t){.name = m->tables[t].name,
                                    .dim = m->tables[t].dim,
                                    .init = TS_CLIENT_ROW_UNIFORM,
                                    .init_param = 0.05};
  ts_client_declare_opts_t o;
  ts_client_declare_opts_init(&o);
  o.seed = seed;
  o.tables = tables;
  o.num_tables = m->num_tables;
  return ts_client_declare_ex(client, decl, d->num_tensors, &o, errmsg, errlen);
}

/* The requests of one step: the dense layers and one per table, in flight together. */
typedef struct {
  ts_client_req_t dense;
  ts_client_req_t table[TS_CONFIG_EMB_FIELDS_MAX];
  float *dst[TS_LAYERS_MAX * 2];
  const float *grad[TS_LAYERS_MAX * 2];
} step_reqs_t;

/* Submit the dense request (when dense) and every table's, then wait for each one sent.
 * Returns 0 or the first error, errmsg naming its request. */
static int run_all(const ts_ctr_trainer_t *t, step_reqs_t *q, bool dense, char *errmsg,
                   size_t errlen) {
  ts_ctr_t *m = t->model;
  size_t n = m->num_tables, sent = 0;
  bool dense_sent = false;
  int first = 0;
  if (dense) {
    first = ts_client_submit(t->client, &q->dense, NULL, NULL);
    dense_sent = first == 0;
  }
  while (first == 0 && sent < n) {
    first = ts_client_submit(t->client, &q->table[sent], NULL, NULL);
    if (first == 0) sent++;
  }
  if (first < 0) {
    const ts_client_req_t *bad = dense && !dense_sent ? &q->dense : &q->table[sent];
    snprintf(errmsg, errlen, "%s: %s", dense && !dense_sent ? "dense layers" : m->tables[sent].name,
             bad->errmsg[0] ? bad->errmsg : ts_strerror(first));
  }
  if (dense_sent) {
    int w = ts_client_wait(t->client, &q->dense);
    if (w < 0 && first == 0) {
      first = w;
      snprintf(errmsg, errlen, "dense layers: %s",
               q->dense.errmsg[0] ? q->dense.errmsg : ts_strerror(w));
    }
  }
  for (size_t i = 0; i < sent; i++) {
    int w = ts_client_wait(t->client, &q->table[i]);
    if (w < 0 && first == 0) {
      first = w;
      snprintf(errmsg, errlen, "table %s: %s", m->tables[i].name,
               q->table[i].errmsg[0] ? q->table[i].errmsg : ts_strerror(w));
    }
  }
  return first;
}

/* Every table's request of kind for the batch's keys: rows into rows (a pull; read_only:
 * making no rows, as evaluation must) or gradients from row_grads (a push). */
static void table_reqs(ts_ctr_t *m, step_reqs_t *q, ts_client_req_kind_t kind, size_t batch,
                       uint64_t step, uint64_t min_version, uint64_t clock, bool read_only) {
  for (size_t i = 0; i < m->num_tables; i++) {
    ts_client_req_t *r = &q->table[i];
    ts_client_req_init(r, kind);
    r->table = (uint32_t)i;
    r->keys = m->tables[i].keys;
    r->num_keys = batch * m->tables[i].num_slots;
    r->rows_dst = kind == TS_CLIENT_SPARSE_PULL ? m->tables[i].rows : NULL;
    r->rows_grad = kind == TS_CLIENT_SPARSE_PUSH ? m->tables[i].row_grads : NULL;
    r->step = step;
    r->min_version = min_version;
    r->clock = clock;
    r->sparse_flags = read_only ? TS_CLIENT_ROWS_READ_ONLY : 0;
  }
}

/* Pull the batch's rows of every table (read_only: evaluation's, making no rows) and
 * (dense) the dense layers. */
/* The dense layers' pull request, into params. */
static void dense_pull_req(const ts_ctr_trainer_t *t, step_reqs_t *q, float *params) {
  const ts_layers_t *d = &t->model->net.desc;
  ts_client_req_init(&q->dense, TS_CLIENT_PULL);
  for (size_t i = 0; i < d->num_tensors; i++) q->dst[i] = params + d->tensors[i].offset;
  q->dense.dst = q->dst;
}

static int pull(const ts_ctr_trainer_t *t, step_reqs_t *q, float *params, size_t batch,
                uint64_t min_version, uint64_t clock, bool dense, bool read_only, char *errmsg,
                size_t errlen) {
  ts_ctr_t *m = t->model;
  const ts_layers_t *d = &m->net.desc;
  dense_pull_req(t, q, params);
  q->dense.min_version = min_version;
  q->dense.clock = clock;
  table_reqs(m, q, TS_CLIENT_SPARSE_PULL, batch, 0, min_version, clock, read_only);
  int rc = run_all(t, q, dense, errmsg, errlen);
  if (rc == 0 && dense) rc = ts_seq_set_params(&m->net, 0, params, d->param_count);
  return rc;
}

/* Push the dense gradients and every table's rows' gradients. ids[0] (dense) and ids[1 +
 * table]: 0 for a first attempt, else the push ids of the attempt it retries (retry_of: a
 * shard that applied it before the failure answers duplicate), and each request's push id
 * on return. */
static int push(const ts_ctr_trainer_t *t, step_reqs_t *q, float *grads, size_t batch,
                uint64_t step, uint64_t *stale, uint64_t *ids, char *errmsg, size_t errlen) {
  ts_ctr_t *m = t->model;
  const ts_layers_t *d = &m->net.desc;
  ts_client_req_init(&q->dense, TS_CLIENT_PUSH);
  for (size_t i = 0; i < d->num_tensors; i++) q->grad[i] = grads + d->tensors[i].offset;
  q->dense.grad = q->grad;
  q->dense.step = step;
  q->dense.retry_of = ids[0];
  table_reqs(m, q, TS_CLIENT_SPARSE_PUSH, batch, step, 0, step, false);
  for (size_t i = 0; i < m->num_tables; i++) q->table[i].retry_of = ids[1 + i];
  int rc = run_all(t, q, true, errmsg, errlen);
  *stale = q->dense.stale;
  for (size_t i = 0; i < m->num_tables; i++) *stale += q->table[i].stale;
  if (q->dense.push_id) ids[0] = q->dense.push_id;
  for (size_t i = 0; i < m->num_tables; i++)
    if (q->table[i].push_id) ids[1 + i] = q->table[i].push_id;
  return rc;
}

/* A step's pull or push, retried while the shards are unreachable (they reconnect in the
 * background), as the dense trainer does (ts_trainer_transient): a push's retries repeat
 * its push ids, so no shard applies it twice. */
static int with_retries(const ts_ctr_trainer_t *t, step_reqs_t *q, float *buf, size_t batch,
                        bool is_push, uint64_t step_or_min, uint64_t clock, uint64_t *stale,
                        char *errmsg, size_t errlen) {
  uint64_t ids[1 + TS_CONFIG_EMB_FIELDS_MAX] = {0};
  double start = now_s();
  for (int attempt = 0;; attempt++) {
    int rc = is_push ? push(t, q, buf, batch, step_or_min, stale, ids, errmsg, errlen)
                     : pull(t, q, buf, batch, step_or_min, clock, true, false, errmsg, errlen);
    if (rc == 0 || !ts_trainer_transient(rc) || *t->stop) return rc;
    if (now_s() - start > TS_TRAINER_RETRY_GRACE_S) return rc;
    if (attempt == 0) ts_log_warn("%s failed, retrying: %s", is_push ? "push" : "pull", errmsg);
    char what[384];
    snprintf(what, sizeof what, "%s retrying since %.1f s: %s", is_push ? "push" : "pull",
             now_s() - start, errmsg);
    if (t->on_activity) t->on_activity(t->progress_arg, false, what);
    ts_trainer_sleep_s(0.2);
  }
}

/* Read worker T's B rows of the next global step (skipping the others'), rewinding at an
 * epoch's end is the caller's. Returns 1, 0 (the file ended early) or an error. */
static int read_batch(const ts_ctr_trainer_t *t, ts_criteo_reader_t *rd, ts_criteo_row_t *rows,
                      ts_criteo_row_t *skip, char *errmsg, size_t errlen) {
  size_t B = (size_t)t->cfg->batch_size, W = (size_t)t->num_workers, T = (size_t)t->task;
  for (size_t i = 0; i < W * B; i++) {
    bool mine = i >= T * B && i < (T + 1) * B;
    int rc = ts_criteo_next(rd, mine ? &rows[i - T * B] : skip, errmsg, errlen);
    if (rc <= 0) return rc;
  }
  return 1;
}

/* Sync: the job's step now, the dense layers' version, so that a worker that (re)joins a
 * running job starts there, its rows and remaining steps lined up with the others' (as the
 * dense trainer does). */
static int job_step(const ts_ctr_trainer_t *t, step_reqs_t *q, float *params, uint64_t *step,
                    char *errmsg, size_t errlen) {
  dense_pull_req(t, q, params);
  int rc = ts_client_run(t->client, &q->dense);
  if (rc < 0) {
    snprintf(errmsg, errlen, "first pull: %s",
             q->dense.errmsg[0] ? q->dense.errmsg : ts_strerror(rc));
    return rc;
  }
  *step = q->dense.version;
  return 0;
}

/* Read past the rows of the job's first `steps` steps of an epoch (every worker's). */
static int skip_steps(const ts_ctr_trainer_t *t, ts_criteo_reader_t *rd, uint64_t steps,
                      ts_criteo_row_t *scratch, char *errmsg, size_t errlen) {
  uint64_t n = steps * (uint64_t)t->cfg->batch_size * (uint64_t)t->num_workers;
  for (uint64_t i = 0; i < n; i++) {
    int rc = ts_criteo_next(rd, scratch, errmsg, errlen);
    if (rc < 0) return rc;
    if (rc == 0) {
      snprintf(errmsg, errlen, "%s: ended within the rows of step %llu", t->cfg->train_path,
               (unsigned long long)steps);
      return TS_EDATA;
    }
  }
  return 0;
}

static void activity(const ts_ctr_trainer_t *t, const char *what) {
  if (t->on_activity) t->on_activity(t->progress_arg, true, what);
}

/* Log loss, AUC and accuracy of the test file, on the parameters pulled now. */
static int evaluate(const ts_ctr_trainer_t *t, step_reqs_t *q, float *params, ts_criteo_row_t *rows,
                    uint64_t *pos, uint64_t *neg, ts_train_result_t *res, char *errmsg,
                    size_t errlen) {
  ts_ctr_t *m = t->model;
  ts_criteo_reader_t *rd = NULL;
  int rc = ts_criteo_open(&rd, t->cfg->test_path, errmsg, errlen);
  if (rc < 0) return rc;
  memset(pos, 0, TS_CTR_AUC_BINS * sizeof *pos);
  memset(neg, 0, TS_CTR_AUC_BINS * sizeof *neg);
  bool sync = t->cfg->mode == TS_MODE_SYNC;
  double loss_sum = 0.0;
  uint64_t n = 0, correct = 0;
  bool first = true;
  float p[65536];
  for (;;) {
    size_t b = 0;
    while (b < m->batch_capacity && (rc = ts_criteo_next(rd, &rows[b], errmsg, errlen)) == 1) b++;
    if (rc < 0 || b == 0) break;
    ts_ctr_keys(m, rows, b);
    /* The first pull waits for the step every worker's last push closed (sync). */
    rc = pull(t, q, params, b, first && sync ? TS_CLIENT_VERSION_NEXT : 0, res->steps, first,
              true, errmsg, errlen);
    first = false;
    float l = 0.0f;
    if (rc == 0) rc = ts_ctr_step(m, b, false, &l, p);
    if (rc < 0) break;
    loss_sum += (double)l * (double)b;
    n += b;
    ts_ctr_auc_add(pos, neg, p, m->labels, b);
    for (size_t i = 0; i < b; i++) correct += (uint64_t)((p[i] >= 0.5f) == (m->labels[i] == 1));
    if (b < m->batch_capacity) break;
  }
  ts_criteo_close(rd);
  if (rc < 0) return rc;
  if (n == 0) {
    snprintf(errmsg, errlen, "%s: no rows to evaluate", t->cfg->test_path);
    return TS_EDATA;
  }
  res->test_loss = loss_sum / (double)n;
  res->test_accuracy = (double)correct / (double)n;
  res->test_auc = ts_ctr_auc(pos, neg);
  res->has_auc = true;
  return 0;
}

int ts_ctr_train(const ts_ctr_trainer_t *t, ts_train_result_t *res, char *errmsg, size_t errlen) {
  const ts_config_t *cfg = t->cfg;
  ts_ctr_t *m = t->model;
  memset(res, 0, sizeof *res);
  const size_t B = (size_t)cfg->batch_size;
  const uint64_t per_epoch = t->train_rows / ((uint64_t)B * (uint64_t)t->num_workers);
  if (per_epoch == 0) {
    snprintf(errmsg, errlen, "train.batch_size %zu x %d workers is more than the %llu rows of %s",
             B, t->num_workers, (unsigned long long)t->train_rows, cfg->train_path);
    return TS_ECONFIG;
  }
  uint64_t total = per_epoch * (uint64_t)cfg->epochs;
  if (cfg->max_steps > 0 && (uint64_t)cfg->max_steps < total) total = (uint64_t)cfg->max_steps;
  const bool sync = cfg->mode == TS_MODE_SYNC;
  size_t pc = m->net.desc.param_count;
  float *params = ts_malloc(pc * sizeof *params), *grads = ts_malloc(pc * sizeof *grads);
  ts_criteo_row_t *rows = ts_malloc((B + 1) * sizeof *rows);
  step_reqs_t *q = ts_calloc(1, sizeof *q);
  uint64_t *pos = ts_calloc(TS_CTR_AUC_BINS, sizeof *pos),
           *neg = ts_calloc(TS_CTR_AUC_BINS, sizeof *neg);
  float *p = ts_malloc(B * sizeof *p);
  ts_criteo_reader_t *rd = NULL;
  int rc = TS_ENOMEM;
  if (!params || !grads || !rows || !q || !pos || !neg || !p) {
    snprintf(errmsg, errlen, "out of memory for the training buffers");
    goto out;
  }
  rc = ts_criteo_open(&rd, cfg->train_path, errmsg, errlen);
  if (rc < 0) goto out;
  ts_log_info(
      "training CTR: %s mode, %d worker(s) x batch %zu, %llu steps per epoch, %llu "
      "steps in all; %zu embedding field(s) in %zu table(s), network input %zu",
      ts_mode_name(cfg->mode), t->num_workers, B, (unsigned long long)per_epoch,
      (unsigned long long)total, m->num_slots, m->num_tables, m->input_elems);
  const double t0 = now_s();
  res->started_at = ts_trainer_clock_s(CLOCK_REALTIME);
  double last_log = t0, interval_loss = 0.0, phase[3] = {0, 0, 0};
  uint64_t interval_steps = 0, interval_examples = 0;
  uint64_t global_step = 0; /* the job's step after the last step (TensorBoard's step) */
  uint64_t k0 = 0;
  if (sync) {
    uint64_t version = 0;
    rc = job_step(t, q, params, &version, errmsg, errlen);
    if (rc < 0 && *t->stop) {
      res->stopped = 1;
      rc = 0;
      goto out;
    }
    if (rc < 0) goto out;
    k0 = version < total ? version : total;
    res->job_step = version;
    res->total_steps = total;
    res->nothing_to_train = total > 0 && version >= total;
    if (res->nothing_to_train) {
      ts_client_set_done(t->client, true);
      goto out;
    }
    if (k0 > 0) {
      ts_log_notice("joining the job at step %llu: epoch %llu from row %llu of %s",
                    (unsigned long long)k0, (unsigned long long)(k0 / per_epoch) + 1,
                    (unsigned long long)((k0 % per_epoch) * B * (uint64_t)t->num_workers) + 1,
                    cfg->train_path);
      rc = skip_steps(t, rd, k0 % per_epoch, &rows[B], errmsg, errlen);
      if (rc < 0) goto out;
    }
  }
  for (uint64_t k = k0; k < total && !*t->stop; k++) {
    uint64_t epoch = k / per_epoch, in_epoch = k % per_epoch;
    if (in_epoch == 0 && k > 0 && (rc = ts_criteo_rewind(rd)) < 0) {
      snprintf(errmsg, errlen, "%s: rewinding for epoch %llu", cfg->train_path,
               (unsigned long long)epoch + 1);
      goto out;
    }
    rc = read_batch(t, rd, rows, &rows[B], errmsg, errlen);
    if (rc == 0) {
      snprintf(errmsg, errlen, "%s: ended before step %llu (it was counted %llu rows)",
               cfg->train_path, (unsigned long long)k, (unsigned long long)t->train_rows);
      rc = TS_EDATA;
    }
    if (rc < 0) goto out;
    ts_ctr_keys(m, rows, B);
    double ts0 = now_s();
    activity(t, "pulling the batch's rows and the dense layers");
    /* Sync: the step after the one last pulled; the first, the job's step (job_step's pull
     * was of that version already). */
    uint64_t min_version = !sync ? 0 : k == k0 ? k0 : TS_CLIENT_VERSION_NEXT;
    rc = with_retries(t, q, params, B, false, min_version, k, NULL, errmsg, errlen);
    if (rc < 0) {
      if (*t->stop) break;
      ts_errmsg_wrapf(errmsg, errlen, "pull at step %llu", (unsigned long long)k);
      goto out;
    }
    /* the job's step after this one: sync, the step; else the pulled version + this push */
    global_step = sync ? k + 1 : q->dense.version + 1;
    double ts1 = now_s();
    float loss = 0.0f;
    rc = ts_ctr_step(m, B, true, &loss, p);
    if (rc == 0 && !isfinite(loss)) {
      snprintf(errmsg, errlen,
               "the loss became %f at step %llu: training diverged (lower "
               "optimizer.learning_rate)",
               (double)loss, (unsigned long long)k);
      rc = TS_ENONFINITE;
    }
    if (rc < 0) goto out;
    ts_ctr_auc_add(pos, neg, p, m->labels, B);
    double ts2 = now_s();
    uint64_t stale = 0;
    activity(t, "pushing the dense gradients and the rows' gradients");
    rc = ts_seq_get_grads(&m->net, 0, grads, m->net.desc.param_count);
    if (rc == 0)
      rc = with_retries(t, q, grads, B, true, sync ? TS_CLIENT_STEP_PULLED : k, k, &stale,
                        errmsg, errlen);
    if (rc == TS_EFUTURE) rc = 0; /* a shard restarted behind: this step is lost there */
    if (rc < 0) {
      if (*t->stop) break;
      ts_errmsg_wrapf(errmsg, errlen, "push at step %llu", (unsigned long long)k);
      goto out;
    }
    const double marks[4] = {ts0, ts1, ts2, now_s()};
    ts_trainer_count_step(marks, k + 1, loss, B, stale, phase, &interval_loss, &interval_steps,
                          &interval_examples, res, t->on_step, t->progress_arg);
    double now = now_s();
    if (now - last_log >= cfg->log_interval_s || k + 1 == total) {
      double eps = (double)interval_examples / (now - last_log > 1e-9 ? now - last_log : 1e-9);
      double progress = (double)(in_epoch + 1) / (double)per_epoch;
      res->loss = interval_loss / (double)interval_steps;
      res->train_auc = ts_ctr_auc(pos, neg);
      ts_client_set_progress(t->client, k + 1, res->loss, eps, progress, false);
      ts_client_set_auc(t->client, res->train_auc); /* psctl workers: AUC */
      ts_log_info("step %llu/%llu  epoch %llu %3.0f%%  logloss %.4f  auc %.4f  %.0f examples/s",
                  (unsigned long long)(k + 1), (unsigned long long)total,
                  (unsigned long long)epoch + 1, progress * 100.0, res->loss, res->train_auc, eps);
      if (t->on_progress) {
        ts_progress_t pg = {.step = k + 1,
                            .global_step = global_step,
                            .total_steps = total,
                            .epoch = epoch,
                            .epoch_progress = progress,
                            .loss = res->loss,
                            .examples_per_sec = eps,
                            .learning_rate = cfg->learning_rate,
                            .seconds = now - t0,
                            .phase_s = {phase[0], phase[1], phase[2]},
                            .auc = res->train_auc};
        t->on_progress(t->progress_arg, &pg);
      }
      memset(pos, 0, TS_CTR_AUC_BINS * sizeof *pos);
      memset(neg, 0, TS_CTR_AUC_BINS * sizeof *neg);
      phase[0] = phase[1] = phase[2] = 0;
      last_log = now;
      interval_loss = 0.0;
      interval_steps = interval_examples = 0;
    }
  }
  res->seconds = now_s() - t0;
  res->finished_at = res->started_at + res->seconds;
  res->examples_per_sec = res->seconds > 0 ? (double)res->examples / res->seconds : 0.0;
  if (*t->stop) {
    res->stopped = 1;
    ts_log_notice("stopped by a signal after %llu step(s)", (unsigned long long)res->steps);
    ts_client_set_done(t->client, true);
    rc = 0;
    goto out;
  }
  ts_client_set_progress(t->client, res->steps, res->loss, res->examples_per_sec, 1.0, true);
  activity(t, "evaluating on the test rows");
  rc = evaluate(t, q, params, rows, pos, neg, res, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "evaluation");
    goto out;
  }
  /* psctl workers: TEST AUC and TEST LOGLOSS, with this heartbeat and the goodbye. */
  ts_client_set_test_auc(t->client, res->test_auc, res->test_loss);
  char hb_err[256];
  if (ts_client_heartbeat(t->client, hb_err, sizeof hb_err) < 0)
    ts_log_debug("heartbeat with the test AUC: %s", hb_err);
  if (t->on_progress) {
    ts_progress_t pg = {.step = res->steps,
                        .global_step = global_step,
                        .total_steps = total,
                        .epoch_progress = 1.0,
                        .loss = res->loss,
                        .examples_per_sec = res->examples_per_sec,
                        .learning_rate = cfg->learning_rate,
                        .seconds = res->seconds,
                        .final = true,
                        .test_accuracy = res->test_accuracy,
                        .test_loss = res->test_loss,
                        .auc = res->test_auc};
    t->on_progress(t->progress_arg, &pg);
  }
  ts_log_info(
      "finished: %llu steps in %.1f s, test logloss %.4f, test auc %.4f, test accuracy "
      "%.4f",
      (unsigned long long)res->steps, res->seconds, res->test_loss, res->test_auc,
      res->test_accuracy);
out:
  ts_criteo_close(rd);
  ts_free(params);
  ts_free(grads);
  ts_free(rows);
  ts_free(q);
  ts_free(pos);
  ts_free(neg);
  ts_free(p);
  return rc;
}
