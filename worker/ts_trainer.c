/*
 * The training loop (ts_trainer.h): each step loads its slice of the epoch's order into the
 * towers, pulls (or, in sync mode, gets the pull with the previous push), computes and
 * pushes the towers' mean gradient, retrying what the shards answer as transient; progress
 * and every step go to the observer's callbacks. At the end the final parameters are pulled
 * and evaluated on the test set.
 */
#include "ts_trainer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_schedule.h"
#include "ts_init.h"
#include "ts_log.h"

double ts_trainer_clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void) { return ts_trainer_clock_s(CLOCK_MONOTONIC); }

void ts_trainer_count_step(const double marks[4], uint64_t step, float loss, uint64_t batch,
                           uint64_t stale, double phase[3], double *interval_loss,
                           uint64_t *interval_steps, uint64_t *interval_examples,
                           ts_train_result_t *res, ts_step_cb on_step, void *arg) {
  const double step_phase[3] = {marks[1] - marks[0], marks[2] - marks[1], marks[3] - marks[2]};
  for (int i = 0; i < 3; i++) phase[i] += step_phase[i];
  if (on_step) on_step(arg, step, step_phase);
  res->stale += stale;
  res->steps++;
  res->examples += batch;
  *interval_loss += (double)loss;
  (*interval_steps)++;
  *interval_examples += batch;
}

uint64_t ts_trainer_steps_per_epoch(size_t n, int workers, int batch) {
  uint64_t group = (uint64_t)workers * (uint64_t)batch;
  return group ? (uint64_t)n / group : 0;
}

void ts_trainer_epoch_order(uint64_t seed, uint64_t epoch, uint32_t *perm, size_t n) {
  uint64_t key = ts_init_key(seed, "data/shuffle");
  for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(ts_init_uniform(key, epoch * (uint64_t)n + i) * (double)i);
    if (j >= i) j = i - 1;
    uint32_t tmp = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = tmp;
  }
}

bool ts_trainer_transient(int rc) {
  return rc == TS_ECLOSED || rc == TS_EUNAVAIL || rc == TS_ETIMEDOUT || rc == TS_ENOTDECLARED;
}

void ts_trainer_sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Tell the observer what the loop does now (ts_activity_cb). */
static void activity(const ts_trainer_t *t, bool progress, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void activity(const ts_trainer_t *t, bool progress, const char *fmt, ...) {
  if (!t->on_activity) return;
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  t->on_activity(t->progress_arg, progress, what);
}

/* One request of kind over the whole model; errmsg gets its error. */
static int request(const ts_trainer_t *t, ts_client_req_t *q, char *errmsg, size_t errlen) {
  int rc = ts_client_run(t->client, q);
  if (rc < 0) snprintf(errmsg, errlen, "%s", q->errmsg[0] ? q->errmsg : ts_strerror(rc));
  return rc;
}

/* One pull of every tensor: min_version as ts_client_req_t's (TS_CLIENT_VERSION_NEXT: each
 * shard's next version). */
static int pull_once(const ts_trainer_t *t, float *const *dst, uint64_t min_version,
                     uint64_t clock, uint64_t *version, char *errmsg, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = dst;
  q.min_version = min_version;
  q.clock = clock;
  int rc = request(t, &q, errmsg, errlen);
  if (rc == 0 && version) *version = q.version;
  return rc;
}

/* Pull with retries while the shards are unreachable (they reconnect in the background):
 * min_version as pull_once's. */
static int pull_retry(const ts_trainer_t *t, float *const *dst, uint64_t min_version,
                      uint64_t clock, uint64_t *version, char *errmsg, size_t errlen) {
  double start = now_s();
  for (int attempt = 0;; attempt++) {
    int rc = pull_once(t, dst, min_version, clock, version, errmsg, errlen);
    if (rc == 0 || !ts_trainer_transient(rc) || *t->stop) return rc;
    if (now_s() - start > TS_TRAINER_RETRY_GRACE_S) return rc;
    if (attempt == 0) ts_log_warn("pull failed, retrying: %s", errmsg);
    activity(t, false, "pull retrying since %.1f s: %s", now_s() - start, errmsg);
    ts_trainer_sleep_s(0.2);
  }
}

/* A step's pull: sync mode pulls each shard's next version; the other modes take what is
 * there. */
static int pull(const ts_trainer_t *t, float *const *dst, uint64_t clock, uint64_t *version,
                char *errmsg, size_t errlen) {
  bool sync = t->cfg->mode == TS_MODE_SYNC;
  return pull_retry(t, dst, sync ? TS_CLIENT_VERSION_NEXT : 0, clock, version, errmsg, errlen);
}

/* Push with retries while the shards are unreachable. attempt0 > 0: a first attempt
 * already failed and was reported (push_pull below), and push_id is the id it was sent
 * with. Every retry repeats the first attempt's push id, so a shard that applied it before
 * the failure answers duplicate instead of applying it again (client.h, retry_of). Sync
 * mode tags each shard's push with the version last pulled from it. *stale gets the
 * partitions dropped as stale. */
static int push(const ts_trainer_t *t, const float *const *grad, uint64_t step, uint64_t *stale,
                int attempt0, uint64_t push_id, char *errmsg, size_t errlen) {
  double start = now_s();
  bool sync = t->cfg->mode == TS_MODE_SYNC;
  for (int attempt = attempt0;; attempt++) {
    ts_client_req_t q;
    ts_client_req_init(&q, TS_CLIENT_PUSH);
    q.grad = grad;
    q.step = sync ? TS_CLIENT_STEP_PULLED : step;
    q.retry_of = push_id;
    int rc = request(t, &q, errmsg, errlen);
    if (q.push_id) push_id = q.push_id;
    *stale = q.stale;
    if (attempt > 0 && q.duplicate)
      ts_log_info("push retried: %llu partition(s) had it already and did not apply it again",
                  (unsigned long long)q.duplicate);
    if (rc == 0 || !ts_trainer_transient(rc) || *t->stop) return rc;
    if (now_s() - start > TS_TRAINER_RETRY_GRACE_S) return rc;
    if (attempt == 0) ts_log_warn("push failed, retrying: %s", errmsg);
    activity(t, false, "push retrying since %.1f s: %s", now_s() - start, errmsg);
    ts_trainer_sleep_s(0.2);
  }
}

/* Push step `step`'s gradient and pull the parameters of the next step in one round trip
 * (sync: the next version, as pull() waits for; ssp: with the next step's clock). Returns
 * what push() would: 0, or the push's error after push()'s retries when it failed
 * transiently. *pulled says whether dst holds the next step's parameters; when the pull
 * part failed, or the push did, it does not, and the next step pulls as usual (with
 * pull()'s retries). The client leaves each shard's last pulled version as it was when
 * the request fails, so a retried push is tagged, and that pull waits, as they would have
 * been without the pipelining. */
static int push_pull(const ts_trainer_t *t, const float *const *grad, uint64_t step,
                     float *const *dst, uint64_t *version, uint64_t *stale, bool *pulled,
                     char *errmsg, size_t errlen) {
  bool sync = t->cfg->mode == TS_MODE_SYNC;
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH_PULL);
  q.grad = grad;
  q.dst = dst;
  q.step = sync ? TS_CLIENT_STEP_PULLED : step;
  q.min_version = sync ? TS_CLIENT_VERSION_NEXT : 0;
  q.clock = step + 1;
  int rc = request(t, &q, errmsg, errlen);
  *stale = q.stale;
  *pulled = rc == 0;
  if (rc == 0) {
    *version = q.version;
    return 0;
  }
  if (q.push_rc == 0) {
    ts_log_warn("pull failed, pulling again for the next step: %s", errmsg);
    activity(t, false, "pull failed, pulling again: %s", errmsg);
    return 0;
  }
  rc = q.push_rc;
  if (!ts_trainer_transient(rc) || *t->stop) return rc;
  ts_log_warn("push failed, retrying: %s", errmsg);
  activity(t, false, "push retrying: %s", errmsg);
  ts_trainer_sleep_s(0.2);
  return push(t, grad, step, stale, 1, q.push_id, errmsg, errlen);
}

/* Sync mode, after a push_pull some of whose gradients were stale: this worker is a step
 * behind the others on some shard. Each shard's part of the pull was answered as soon as
 * that shard had the version after the one last pulled from it, so a shard it lags on
 * answered at once, perhaps seconds before the last shard did; meanwhile that shard's
 * barrier (which has the other workers' gradients and waits for this one's) may close at
 * job.sync_timeout_s, and the next push would be stale again. With two shards and two
 * workers lagging on different shards that repeats forever, every step waiting
 * sync_timeout_s (each shard waits for the worker the other shard holds back). Taking each
 * shard's current parameters once the slowest shard has answered tags the next push with
 * the barrier now open, which the other workers' gradients are in. */
static int refresh_lagging(const ts_trainer_t *t, float *const *dst, uint64_t clock,
                           uint64_t *version, char *errmsg, size_t errlen) {
  return pull_retry(t, dst, 0, clock, version, errmsg, errlen);
}

/* How often a finished worker asks shard 0 whether every worker has finished. */
#define JOB_END_POLL_S 0.25

/* Wait until every worker has finished; when shard 0 chooses this worker, evaluate the
 * parameters pulled then and report them (ts_trainer_run's header). Best effort: returns
 * nothing, logs what went wrong. */
static void final_report(const ts_trainer_t *t, ts_towers_t *tw, float *const *dst,
                         ts_train_result_t *res) {
  char err[256];
  ts_client_job_end_t je;
  double fail_since = -1.0;
  bool said = false;
  for (;;) {
    if (*t->stop) return;
    int rc = ts_client_job_end(t->client, &je, err, sizeof err);
    if (rc == 0) {
      fail_since = -1.0;
      if (je.workers_joined > res->workers) res->workers = je.workers_joined;
      res->num_workers = je.num_workers;
      if (je.report_final) break;
      if (je.workers_finished >= je.num_workers) return; /* another worker reports */
      if (!said)
        ts_log_info("waiting for %u other worker(s) to finish before the final evaluation",
                    je.num_workers - je.workers_finished);
      said = true;
    } else if (!ts_trainer_transient(rc)) {
      ts_log_warn("no final accuracy: %s", err);
      return;
    } else if (fail_since < 0) {
      fail_since = now_s();
    } else if (now_s() - fail_since > TS_TRAINER_RETRY_GRACE_S) {
      ts_log_warn("no final accuracy: %s", err);
      return;
    }
    if (rc == 0)
      activity(t, true, "finished; waiting for %u other worker(s) to finish (shard 0 counts them)",
               je.num_workers - je.workers_finished);
    else
      activity(t, false, "finished; asking shard 0 whether every worker finished: %s", err);
    ts_trainer_sleep_s(JOB_END_POLL_S);
  }
  activity(t, true, "pulling the job's final parameters");
  int rc = pull_retry(t, dst, 0, res->steps, NULL, err, sizeof err);
  if (rc == 0) rc = ts_towers_pulled(tw, err, sizeof err);
  if (rc == 0) activity(t, true, "evaluating the job's final parameters");
  float acc = 0.0f, tloss = 0.0f;
  ts_model_t *m = &tw->models[0];
  if (rc == 0) {
    rc = ts_model_evaluate(m, t->test->x, t->test->labels, t->test->n, &acc, &tloss);
    if (rc < 0) snprintf(err, sizeof err, "evaluation: %s", ts_strerror(rc));
  }
  if (rc < 0) {
    ts_log_warn("no final accuracy: pulling and evaluating the final parameters: %s", err);
    return;
  }
  res->has_final = true;
  res->final_test_accuracy = (double)acc;
  ts_client_set_final_accuracy(t->client, res->final_test_accuracy);
  if (ts_client_heartbeat(t->client, err, sizeof err) < 0)
    ts_log_warn("sending the final accuracy to the shards: %s (the next heartbeats carry it)",
                err);
  ts_log_notice("every worker finished: the final parameters' test accuracy is %.6f "
                "(test loss %.4f), evaluated by this worker; %u of %u workers took part",
                res->final_test_accuracy, (double)tloss, res->workers, res->num_workers);
}

int ts_trainer_run(const ts_trainer_t *t, ts_train_result_t *res, char *errmsg, size_t errlen) {
  const ts_config_t *cfg = t->cfg;
  memset(res, 0, sizeof *res);
  ts_towers_t own;
  ts_towers_t *tw = t->towers;
  if (!tw) {
    int wrc = ts_towers_wrap(&own, t->model, errmsg, errlen);
    if (wrc < 0) return wrc;
    tw = &own;
  }
  ts_model_t *m = &tw->models[0];
  const size_t n = t->train->n;
  const size_t dim = t->train->rows * t->train->cols;
  const int B = cfg->batch_size, W = t->num_workers;
  const uint64_t per_epoch = ts_trainer_steps_per_epoch(n, W, B);
  if (per_epoch == 0) {
    if (tw == &own) ts_towers_destroy(&own);
    snprintf(errmsg, errlen,
             "train.batch_size %d x %d workers = %llu examples per step, more than the %zu "
             "training examples",
             B, W, (unsigned long long)B * (unsigned long long)W, n);
    return TS_ECONFIG;
  }
  if (B % (int)tw->n != 0) {
    snprintf(errmsg, errlen, "train.batch_size %d cannot be split evenly over %zu towers", B,
             tw->n);
    if (tw == &own) ts_towers_destroy(&own);
    return TS_ECONFIG;
  }
  uint64_t total = per_epoch * (uint64_t)cfg->epochs;
  if (cfg->max_steps > 0 && (uint64_t)cfg->max_steps < total) total = (uint64_t)cfg->max_steps;

  int rc = TS_ENOMEM;
  uint32_t *perm = ts_malloc(n * sizeof *perm);
  /* The batch in the back end's transfer memory (pinned for a GPU), so its copies to the
   * towers run asynchronously while the pull waits on the network. */
  void *bxp = NULL, *byp = NULL;
  ts_towers_host_alloc(tw, (size_t)B * dim * sizeof(float), &bxp);
  ts_towers_host_alloc(tw, (size_t)B * sizeof(int32_t), &byp);
  float *bx = bxp;
  int32_t *by = byp;
  /* Pulls land in, and pushes leave from, the towers' staging: for the CPU back end the
   * parameters and gradients themselves (no copy). */
  float *const *dst = ts_towers_pull_targets(tw);
  const float *const *grad = ts_towers_push_sources(tw);
  if (!perm || !bx || !by) {
    snprintf(errmsg, errlen, "out of memory for the training buffers");
    goto out;
  }

  ts_log_info("training: %s mode, %d worker(s) x batch %d, %llu steps per epoch, %llu steps "
              "in all (%d epoch(s)%s)",
              ts_mode_name(cfg->mode), W, B, (unsigned long long)per_epoch,
              (unsigned long long)total, cfg->epochs, cfg->max_steps > 0 ? ", capped by max_steps" : "");

  /* The rate the shards applied at a step: the schedule at the job's update count, which
   * in sync mode is the global step and in async and ssp the pulled version (every push
   * is an update). */
  ts_schedule_t sched;
  ts_schedule_from_config(&sched, cfg);
  const bool sync = cfg->mode == TS_MODE_SYNC;
  const double t0 = now_s();
  res->started_at = ts_trainer_clock_s(CLOCK_REALTIME);
  double last_progress = 0.0; /* of the epoch, as last reported */
  bool reported = false;      /* a progress report went to the client */
  double last_log = t0, interval_loss = 0.0;
  uint64_t interval_steps = 0, interval_examples = 0, interval_correct = 0;
  double phase[3] = {0, 0, 0}; /* pull, compute, push seconds in the interval */
  uint64_t epoch_loaded = UINT64_MAX;
  uint64_t version = 0;       /* the lowest version the last pull returned */
  bool pulled = false;
  bool lagging = false; /* sync: the last push was stale somewhere (refresh_lagging) */
  uint64_t k0 = 0;
  if (cfg->mode == TS_MODE_SYNC) {
    /* A worker that (re)joins a running job starts at the job's step, so its data and its
     * remaining steps line up with the others'. */
    rc = pull(t, dst, 0, &version, errmsg, errlen);
    if (rc < 0 && *t->stop) {
      res->stopped = 1;
      rc = 0;
      goto out;
    }
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "first pull");
      goto out;
    }
    pulled = true;
    k0 = version < total ? version : total;
    res->job_step = version;
    res->total_steps = total;
    res->nothing_to_train = total > 0 && version >= total;
    if (k0 > 0 && !res->nothing_to_train)
      ts_log_notice("joining the job at step %llu", (unsigned long long)k0);
  }
  rc = 0;
  for (uint64_t k = k0; k < total && !*t->stop; k++) {
    uint64_t epoch = k / per_epoch, in_epoch = k % per_epoch;
    if (epoch != epoch_loaded) {
      ts_trainer_epoch_order((uint64_t)cfg->seed, epoch, perm, n);
      epoch_loaded = epoch;
    }
    size_t base = (size_t)(in_epoch * (uint64_t)W * (uint64_t)B + (uint64_t)t->task * (uint64_t)B);
    for (int i = 0; i < B; i++) {
      uint32_t e = perm[base + (size_t)i];
      memcpy(bx + (size_t)i * dim, t->train->x + (size_t)e * dim, dim * sizeof *bx);
      by[i] = t->train->labels[e];
    }

    double ts0 = now_s();
    rc = ts_towers_load(tw, bx, by, (size_t)B, dim, errmsg, errlen);
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "step %llu", (unsigned long long)k);
      goto out;
    }
    if (!pulled) activity(t, true, "step %llu: pulling the parameters", (unsigned long long)k + 1);
    rc = pulled ? 0 : pull(t, dst, k, &version, errmsg, errlen);
    if (rc == 0 && !pulled && lagging) rc = refresh_lagging(t, dst, k, &version, errmsg, errlen);
    pulled = lagging = false;
    if (rc < 0) {
      if (*t->stop) break;
      ts_errmsg_wrapf(errmsg, errlen, "pull at step %llu", (unsigned long long)k);
      goto out;
    }
    if (cfg->mode != TS_MODE_SYNC && cfg->max_steps > 0 && version >= (uint64_t)cfg->max_steps) {
      /* train.max_steps is the global step (TensorFlow's global_step): async and ssp, every
       * push is one, and the pull's version counts them all. dst holds the parameters
       * after the last of them. */
      ts_log_info("the job reached its global step %llu (train.max_steps %lld) after %llu "
                  "step(s) of this worker",
                  (unsigned long long)version, (long long)cfg->max_steps,
                  (unsigned long long)res->steps);
      pulled = true;
      break;
    }
    if (cfg->mode == TS_MODE_SYNC && version > k) {
      /* The job went on without this worker (its connection was lost, or it was stopped,
       * for longer than the barriers waited): go on from the job's step, as a worker that
       * rejoins does, so the job still ends after `total` steps and this worker does not
       * train the steps it missed alone after the others are done. */
      ts_log_notice("step %llu: the job is at step %llu; %llu step(s) went on without this "
                    "worker: going on from there",
                    (unsigned long long)k, (unsigned long long)version,
                    (unsigned long long)(version - k));
      k = version - 1; /* the loop's k++ makes it version; dst holds that version */
      pulled = true;
      continue;
    }
    rc = ts_towers_pulled(tw, errmsg, errlen);
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "step %llu", (unsigned long long)k);
      goto out;
    }
    double ts1 = now_s();
    /* Dropout: a mask of its own for this step, worker and tower (a retried step redraws the
     * same one). */
    ts_towers_set_dropout(tw, (uint64_t)cfg->seed, k, (uint64_t)t->task);
    activity(t, true, "step %llu: computing the gradients", (unsigned long long)k + 1);
    float loss = 0.0f;
    rc = ts_towers_step(tw, &loss, errmsg, errlen);
    double ts2 = now_s();
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "forward/backward at step %llu", (unsigned long long)k);
      goto out;
    }
    if (!isfinite(loss)) {
      snprintf(errmsg, errlen,
               "the loss became %f at step %llu: training diverged (lower optimizer.learning_rate)",
               (double)loss, (unsigned long long)k);
      rc = TS_ENONFINITE;
      goto out;
    }
    uint64_t stale = 0;
    const uint64_t step_version = version; /* of the parameters this step computed on */
    activity(t, true, "step %llu: pushing the gradients%s", (unsigned long long)k + 1,
             k + 1 < total ? " and pulling the next step's parameters" : "");
    /* The next step's pull travels with this push, one round trip instead of two; not
     * after the last step, whose final pull follows leaving the barriers (below), nor when
     * told to stop. */
    if (k + 1 < total && !*t->stop)
      rc = push_pull(t, grad, k, dst, &version, &stale, &pulled, errmsg, errlen);
    else
      rc = push(t, grad, k, &stale, 0, 0, errmsg, errlen);
    lagging = cfg->mode == TS_MODE_SYNC && stale > 0;
    if (rc == 0 && pulled && lagging) {
      rc = refresh_lagging(t, dst, k + 1, &version, errmsg, errlen);
      lagging = false;
      if (rc < 0) {
        if (*t->stop) break;
        ts_errmsg_wrapf(errmsg, errlen, "pull after step %llu", (unsigned long long)k);
        goto out;
      }
    }
    if (rc == TS_EFUTURE) {
      /* A shard restarted behind the others (restored from a checkpoint): this step's
       * gradient is lost there; the next pull takes its current version. */
      ts_log_warn("step %llu: %s; continuing", (unsigned long long)k, errmsg);
      rc = 0;
    }
    if (rc < 0) {
      if (*t->stop) break;
      ts_errmsg_wrapf(errmsg, errlen, "push at step %llu", (unsigned long long)k);
      goto out;
    }
    const double marks[4] = {ts0, ts1, ts2, now_s()};
    ts_trainer_count_step(marks, k + 1, loss, (uint64_t)B, stale, phase, &interval_loss,
                          &interval_steps, &interval_examples, res, t->on_step, t->progress_arg);
    interval_correct += (uint64_t)tw->correct;

    double now = now_s();
    double progress = (double)(in_epoch + 1) / (double)per_epoch;
    res->last_step = k + 1;
    /* The job's step after this push: in async and ssp the version the fused pull after
     * it saw (others' pushes too), or the step's own version and this push. */
    const uint64_t global_step = sync ? k + 1 : pulled ? version : step_version + 1;
    const double lr = (double)ts_schedule_rate(&sched, sync ? k + 1 : step_version + 1);
    if (t->on_live) {
      ts_progress_t lp = {.step = k + 1, .total_steps = total, .epoch = epoch,
                          .epoch_progress = progress, .loss = (double)loss,
                          .learning_rate = lr, .seconds = now - t0, .first_step = k0};
      t->on_live(t->progress_arg, &lp);
    }
    /* A line every log_interval_s, and at each tenth of an epoch when 0.1 s has passed,
     * so that even an epoch of a second shows several (and no more than ten a second). */
    bool tenth = (in_epoch + 1) * 10 / per_epoch != in_epoch * 10 / per_epoch;
    /* Async and ssp: this push made the job's global step train.max_steps, so the next
     * pull ends the run: the interval is reported now, or never. */
    bool job_end = !sync && cfg->max_steps > 0 && global_step >= (uint64_t)cfg->max_steps;
    if (now - last_log >= cfg->log_interval_s || k + 1 == total || job_end ||
        (tenth && now - last_log >= 0.1)) {
      double eps = (double)interval_examples / (now - last_log > 1e-9 ? now - last_log : 1e-9);
      res->loss = interval_loss / (double)interval_steps;
      ts_client_set_progress(t->client, k + 1, res->loss, eps, progress, false);
      last_progress = progress;
      reported = true;
      ts_log_info("step %llu/%llu  epoch %llu %3.0f%%  loss %.4f  %.0f examples/s",
                  (unsigned long long)(k + 1), (unsigned long long)total,
                  (unsigned long long)epoch + 1, progress * 100.0, res->loss, eps);
      if (t->on_progress) {
        ts_progress_t pg = {.step = k + 1, .global_step = global_step,
                            .total_steps = total, .epoch = epoch,
                            .epoch_progress = progress, .loss = res->loss,
                            .examples_per_sec = eps, .learning_rate = lr,
                            .train_accuracy = (double)interval_correct / (double)interval_examples,
                            .seconds = now - t0, .phase_s = {phase[0], phase[1], phase[2]}};
        t->on_progress(t->progress_arg, &pg);
      }
      phase[0] = phase[1] = phase[2] = 0;
      last_log = now;
      interval_loss = 0.0;
      interval_steps = 0;
      interval_examples = 0;
      interval_correct = 0;
    }
  }
  res->seconds = now_s() - t0;
  res->finished_at = res->started_at + res->seconds;
  res->examples_per_sec = res->seconds > 0 ? (double)res->examples / res->seconds : 0.0;
  if (*t->stop) {
    res->stopped = 1;
    ts_log_notice("stopped by a signal after %llu step(s)", (unsigned long long)res->steps);
    /* Leaving on purpose: the client tells the shards as it closes (a "stopped" worker in
     * psctl, out of the barriers at once, rather than "dead" after missed heartbeats). */
    if (reported)
      ts_client_set_progress(t->client, res->steps, res->loss, res->examples_per_sec,
                             last_progress, true);
    else
      ts_client_set_done(t->client, true); /* no loss yet: psctl shows '-', not 0 */
    rc = 0;
    goto out;
  }

  /* Leave the barriers, then take the final parameters: in sync mode those of the step
   * every worker's last push closed. */
  ts_client_set_progress(t->client, res->steps, res->loss, res->examples_per_sec, 1.0, true);
  /* A worker that (re)joined a sync job already at its last step made no step: its first
   * pull holds the final parameters, and waiting for the version after it would wait for a
   * step nobody makes. */
  activity(t, true, "pulling the final parameters");
  rc = pulled ? 0 : pull(t, dst, res->steps, &version, errmsg, errlen);
  if (rc < 0 && cfg->mode == TS_MODE_SYNC && rc == TS_ETIMEDOUT) {
    /* A barrier that can never close (its workers gone) must not keep the result back. */
    ts_log_warn("final sync pull timed out (%s); evaluating the latest parameters", errmsg);
    rc = pull_once(t, dst, 0, res->steps, NULL, errmsg, errlen);
  }
  if (rc == 0) rc = ts_towers_pulled(tw, errmsg, errlen);
  if (rc < 0 && *t->stop) {
    res->stopped = 1;
    rc = 0;
    goto out;
  }
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "final pull");
    goto out;
  }
  char hb_err[256];
  ts_client_heartbeat(t->client, hb_err, sizeof hb_err);
  activity(t, true, "evaluating on the test set");
  float acc = 0.0f, tloss = 0.0f;
  rc = ts_model_evaluate(m, t->test->x, t->test->labels, t->test->n, &acc, &tloss);
  if (rc < 0) {
    const char *detail = m->kernels->last_error(m->kernels);
    snprintf(errmsg, errlen, "evaluation: %s%s%s", ts_strerror(rc), detail[0] ? ": " : "",
             detail);
    goto out;
  }
  res->test_accuracy = (double)acc;
  res->test_loss = (double)tloss;
  if (t->on_progress) {
    /* At the step of the parameters evaluated, as every other scalar: the job's step (in
     * sync mode a worker that joined late made fewer; in async and ssp the updates the
     * final parameters had). */
    if (res->last_step == 0) res->last_step = sync ? k0 : res->steps;
    res->global_step = sync ? res->last_step : version;
    ts_progress_t pg = {.step = res->last_step, .global_step = res->global_step,
                        .total_steps = total,
                        .epoch = per_epoch ? (res->steps ? (res->steps - 1) / per_epoch : 0) : 0,
                        .epoch_progress = 1.0, .loss = res->loss,
                        .examples_per_sec = res->examples_per_sec,
                        .learning_rate = (double)ts_schedule_rate(&sched, sync ? res->last_step : version),
                        .seconds = res->seconds,
                        .final = true, .test_accuracy = res->test_accuracy,
                        .test_loss = res->test_loss};
    t->on_progress(t->progress_arg, &pg);
  }
  ts_log_info("finished: %llu steps in %.1f s, test accuracy %.4f, test loss %.4f",
              (unsigned long long)res->steps, res->seconds, res->test_accuracy, res->test_loss);
  final_report(t, tw, dst, res);
out:
  ts_free(perm);
  ts_towers_host_free(tw, bx);
  ts_towers_host_free(tw, by);
  if (tw == &own) ts_towers_destroy(&own);
  return rc;
}
