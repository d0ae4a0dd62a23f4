/*
 * The worker's observer (ts_observe.h): its role of the admin endpoint (metrics and status
 * rendered from a snapshot published after every change), its TensorBoard event files and
 * its systemd notifications, all fed from the training thread.
 */
#include "ts_observe.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ts_admin.h"
#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_err.h"
#include "ts_events.h"
#include "ts_job_status.h"
#include "ts_log.h"
#include "ts_notify.h"
#include "ts_progress_line.h"
#include "ts_prom.h"

static const char *const phase_names[3] = {"pull", "compute", "push"};

/* What the admin endpoint renders: the training thread keeps it in ts_observe.snap and
 * publishes a copy after every change (ts_admin.h). */
typedef struct {
  bool ready, done, have_test, have_progress, have_final, trained;
  char device[64]; /* the device the model runs on (ts_observe_set_device) */
  double final_test_accuracy;
  double progress_at;        /* CLOCK_MONOTONIC seconds of the loop's last progress */
  char doing[384];           /* what the loop does since then (ts_observe_activity) */
  char retry[384];           /* the last wake-up of a wait that got nowhere ("" when none) */
  uint64_t step, total_steps, epoch, examples;
  double loss, examples_per_sec, learning_rate, epoch_progress;
  double test_accuracy, test_loss;
  bool have_auc, have_test_auc; /* a CTR model's (worker/ts_ctr_train.h) */
  double auc, test_auc;
  ts_prom_hist_t phase[3];
} snapshot_t;

/* The worker's role's ctx (ts_admin.h). */
typedef struct {
  const ts_config_t *cfg;
  int task;
  ts_observe_t *obs; /* for its client (ts_observe_set_client) */
} observe_ctx_t;

struct ts_observe {
  const ts_config_t *cfg;
  int task;
  ts_admin_t *admin;
  char events_dir[4400];  /* logdir/RUN/worker-T ("" without train.logdir) */
  ts_events_t *train_ev, *val_ev; /* its train/ and validation/ files, from ts_observe_ready */
  bool events_failed;
  ts_progress_line_t *line; /* on a terminal: the live progress line (training thread's) */
  bool notify;
  uint64_t watchdog_ms;
  double next_watchdog;  /* CLOCK_MONOTONIC seconds */

  snapshot_t snap; /* the training thread's; published after every change */

  pthread_mutex_t client_mu; /* guards client, which the HTTP thread reads */
  ts_client_t *client;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void publish(ts_observe_t *o) {
  const snapshot_t *s = &o->snap;
  ts_admin_publish(o->admin, s, NULL, 0, s->ready && !s->done,
                   s->done ? "done" : "joining the job");
}

static void render_metrics(const ts_admin_view_t *v, ts_buf_t *b) {
  const observe_ctx_t *o = v->ctx;
  const snapshot_t *s = v->snap;
  char lab[160];
  ts_prom_family(b, "tessera_build_info", "gauge",
                 "Build of this daemon: version, role and whether the CUDA back end is built.");
  snprintf(lab, sizeof lab, "version=\"%s\",role=\"worker\",cuda=\"%s\"", TS_VERSION,
           TS_HAVE_CUDA ? "yes" : "no");
  ts_prom_sample(b, "tessera_build_info", lab, 1);
  ts_prom_family(b, "tessera_worker_info", "gauge", "This worker's task index and the training mode.");
  snprintf(lab, sizeof lab, "task=\"%d\",mode=\"%s\"", o->task, ts_mode_name(o->cfg->mode));
  ts_prom_sample(b, "tessera_worker_info", lab, 1);
#define GAUGE(name, help, v)                       \
  do {                                             \
    ts_prom_family(b, name, "gauge", help);        \
    ts_prom_sample(b, name, NULL, (double)(v));    \
  } while (0)
  GAUGE("tessera_worker_step", "Steps this worker has finished.", s->step);
  GAUGE("tessera_worker_planned_steps", "Steps this worker will make in all (epochs, max_steps).",
        s->total_steps);
  GAUGE("tessera_worker_epoch", "Current epoch, counted from 0.", s->epoch);
  GAUGE("tessera_worker_epoch_progress_ratio", "Progress through the current epoch, 0 to 1.",
        s->epoch_progress);
  GAUGE("tessera_worker_loss", "Mean training loss over the last log interval.", s->loss);
  GAUGE("tessera_worker_examples_per_second", "Training examples per second over the last log interval.",
        s->examples_per_sec);
  GAUGE("tessera_worker_learning_rate",
        "The learning rate the shards applied at the last reported step (optimizer.decay).",
        s->learning_rate);
  GAUGE("tessera_worker_ready", "1 while the worker trains (model declared, not done).",
        s->ready && !s->done);
  if (s->ready && !s->trained)
    GAUGE("tessera_worker_loop_progress_age_seconds",
          "Seconds since the training loop last advanced (/livez, train.stall_timeout_s).",
          mono_s() - s->progress_at);
  if (s->have_test) {
    GAUGE("tessera_worker_test_accuracy_ratio", "Accuracy on the test set after training, 0 to 1.",
          s->test_accuracy);
    GAUGE("tessera_worker_test_loss", "Loss on the test set after training.", s->test_loss);
  }
  if (s->have_auc)
    GAUGE("tessera_worker_auc", "A CTR model's AUC over the last log interval's batches, each "
          "scored before its update (progressive validation), 0 to 1.", s->auc);
  if (s->have_test_auc)
    GAUGE("tessera_worker_test_auc", "A CTR model's AUC on the test rows after training, 0 to 1.",
          s->test_auc);
#undef GAUGE
  ts_prom_family(b, "tessera_worker_examples_total", "counter", "Training examples processed.");
  ts_prom_sample(b, "tessera_worker_examples_total", NULL, (double)s->examples);
  ts_prom_family(b, "tessera_worker_step_duration_seconds", "histogram",
                 "Time of one training step by phase: pull parameters, compute gradients, "
                 "push gradients.");
  for (int i = 0; i < 3; i++) {
    snprintf(lab, sizeof lab, "phase=\"%s\"", phase_names[i]);
    ts_prom_hist_samples(b, "tessera_worker_step_duration_seconds", lab, &s->phase[i]);
  }
  ts_prom_process(b);
}

static cJSON *render_status(const ts_admin_view_t *v) {
  const observe_ctx_t *o = v->ctx;
  const snapshot_t *s = v->snap;
  ts_job_status_worker_t w = {.task = o->task,
                              .seen = true,
                              .alive = s->ready && !s->done,
                              .done = s->done,
                              .step = s->step,
                              .loss = s->loss,
                              .examples_per_sec = s->examples_per_sec,
                              .last_seen_s = 0,
                              .epoch_progress = s->epoch_progress,
                              .step_known = true,
                              .reported = s->have_progress,
                              .device = s->device};
  cJSON *j = ts_job_status_json_worker(&w);
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "role", "worker");
  cJSON_AddStringToObject(j, "address", o->cfg->workers[o->task]);
  cJSON_AddNumberToObject(j, "planned_steps", (double)s->total_steps);
  cJSON_AddNumberToObject(j, "epoch", (double)s->epoch);
  cJSON_AddNumberToObject(j, "learning_rate", s->learning_rate);
  if (s->have_test)
    cJSON_AddNumberToObject(j, "test_accuracy", s->test_accuracy);
  else
    cJSON_AddNullToObject(j, "test_accuracy");
  if (s->have_final)
    cJSON_AddNumberToObject(j, "final_test_accuracy", s->final_test_accuracy);
  if (s->have_auc) cJSON_AddNumberToObject(j, "auc", s->auc);
  if (s->have_test_auc) {
    cJSON_AddNumberToObject(j, "test_auc", s->test_auc);
    cJSON_AddNumberToObject(j, "test_logloss", s->test_loss);
  }
  if (s->ready && !s->trained) {
    cJSON_AddNumberToObject(j, "loop_progress_age_s", mono_s() - s->progress_at);
    cJSON_AddStringToObject(j, "loop_doing", s->doing);
  } else {
    cJSON_AddNullToObject(j, "loop_progress_age_s");
    cJSON_AddNullToObject(j, "loop_doing");
  }
  return j;
}

/* /livez: 503 when the training loop, between ts_observe_ready and the end of the run,
 * has not advanced for the threshold (ts_observe.h). */
static int livez(const ts_admin_view_t *v, ts_buf_t *text) {
  const observe_ctx_t *o = v->ctx;
  const snapshot_t *s = v->snap;
  double age = mono_s() - s->progress_at, limit = ts_config_stall_timeout_s(o->cfg);
  if (!s->ready || s->trained || age <= limit) return 0;
  ts_buf_printf(text,
                "training loop stuck: no progress for %.1f s (train.stall_timeout_s %g): %s%s%s",
                age, limit, s->doing, s->retry[0] ? "; since then: " : "", s->retry);
  pthread_mutex_lock(&o->obs->client_mu);
  const char *sep = "; not connected: ";
  uint32_t n = ts_client_num_shards(o->obs->client);
  for (uint32_t i = 0; i < n; i++) {
    char why[256];
    if (ts_client_shard_up(o->obs->client, i, why, sizeof why)) continue;
    ts_buf_printf(text, "%sshard %u (%s): %s", sep, i, i < o->cfg->num_ps ? o->cfg->ps[i] : "?",
                  why);
    sep = ", ";
  }
  pthread_mutex_unlock(&o->obs->client_mu);
  ts_buf_printf(text, "\n");
  return 503;
}

static const ts_admin_role_t worker_role = {
    .title = "Tessera worker",
    .metrics_prefix = "tessera_worker_admin",
    .snap_size = sizeof(snapshot_t),
    .livez = livez,
    .metrics = render_metrics,
    .status = render_status,
};

int ts_observe_start(ts_observe_t **out, const ts_config_t *cfg, int task, char *errmsg,
                     size_t errlen) {
  *out = NULL;
  ts_observe_t *o = ts_calloc(1, sizeof *o);
  if (!o) return TS_ENOMEM;
  pthread_mutex_init(&o->client_mu, NULL);
  o->cfg = cfg;
  o->task = task;
  for (int i = 0; i < 3; i++)
    ts_prom_hist_init(&o->snap.phase[i], ts_prom_duration_bounds, ts_prom_num_duration_bounds);
  o->snap.learning_rate = cfg->learning_rate;
  o->notify = ts_notify_available() && getenv("NOTIFY_SOCKET") != NULL;
  o->watchdog_ms = ts_notify_watchdog_interval_ms();
  int rc = 0;
  if (cfg->logdir && *cfg->logdir) {
    /* Checked now, written once the worker trains: a start that fails leaves no file. */
    char run[256];
    const char *name = cfg->run_name ? cfg->run_name : "";
    if (strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
      snprintf(errmsg, errlen, "train.run_name: \"%s\" is not one directory name", name);
      rc = TS_ECONFIG;
      goto fail;
    }
    if (!*name) {
      time_t now = time(NULL);
      struct tm tm;
      gmtime_r(&now, &tm);
      strftime(run, sizeof run, "%Y%m%d-%H%M%S", &tm);
      name = run;
    }
    snprintf(o->events_dir, sizeof o->events_dir, "%s/%s/worker-%d", cfg->logdir, name, task);
    rc = ts_events_check_dir(cfg->logdir, errmsg, errlen);
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "train.logdir");
      rc = TS_ECONFIG;
      goto fail;
    }
  }
  observe_ctx_t ctx = {.cfg = cfg, .task = task, .obs = o};
  if ((rc = ts_admin_new(&o->admin, &worker_role, &ctx, sizeof ctx)) < 0) {
    snprintf(errmsg, errlen, "admin endpoint: %s", ts_strerror(rc));
    goto fail;
  }
  publish(o); /* before it listens: no request finds it unpublished */
  ts_http_limits_t lim = {.max_connections = (unsigned)cfg->http_max_connections,
                          .max_connections_per_ip = (unsigned)cfg->http_max_connections_per_ip,
                          .request_timeout_s = cfg->http_request_timeout_s,
                          .tls_cert_file = cfg->tls ? cfg->tls_cert_file : NULL,
                          .tls_key_file = cfg->tls ? cfg->tls_key_file : NULL};
  rc = ts_admin_listen(o->admin, cfg->workers[task], &lim, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "cluster.workers[%d]", task);
    goto fail;
  }
  o->line = ts_progress_line_new(task, cfg->batch_size);
  *out = o;
  return 0;
fail:
  ts_observe_stop(o);
  return rc;
}

/* The event files of this run, Keras's layout: train/ and validation/. A failure is logged
 * and training goes on without them. */
static void open_events(ts_observe_t *o) {
  if (!o->events_dir[0]) return;
  char dir[4450], err[4600];
  snprintf(dir, sizeof dir, "%s/train", o->events_dir);
  int rc = ts_events_open(&o->train_ev, dir, err, sizeof err);
  if (rc == 0) {
    snprintf(dir, sizeof dir, "%s/validation", o->events_dir);
    rc = ts_events_open(&o->val_ev, dir, err, sizeof err);
  }
  if (rc < 0) {
    ts_log_err("train.logdir: %s; no TensorBoard events", err);
    o->events_failed = true;
    return;
  }
  ts_log_info("TensorBoard event files: %s/{train,validation}", o->events_dir);
}

void ts_observe_ready(ts_observe_t *o, uint64_t total_steps) {
  open_events(o);
  o->snap.ready = true;
  o->snap.total_steps = total_steps;
  o->snap.progress_at = mono_s();
  snprintf(o->snap.doing, sizeof o->snap.doing, "starting to train");
  publish(o);
  ts_notify_printf("READY=1\nSTATUS=worker %d training", o->task);
  o->next_watchdog = mono_s();
}

void ts_observe_set_device(ts_observe_t *o, const char *device) {
  snprintf(o->snap.device, sizeof o->snap.device, "%s", device);
  publish(o);
}

static void pet_watchdog(ts_observe_t *o) {
  if (!o->watchdog_ms) return;
  double now = mono_s();
  if (now < o->next_watchdog) return;
  ts_notify("WATCHDOG=1");
  o->next_watchdog = now + (double)o->watchdog_ms / 1000.0;
}

void ts_observe_step(void *arg, uint64_t step, const double phase_s[3]) {
  ts_observe_t *o = arg;
  o->snap.step = step;
  o->snap.examples += (uint64_t)o->cfg->batch_size;
  for (int i = 0; i < 3; i++) ts_prom_hist_observe(&o->snap.phase[i], phase_s[i]);
  publish(o);
  pet_watchdog(o);
}

static void write_events(ts_observe_t *o, ts_events_t *ev, int64_t step,
                         const char *const *tags, const float *v, size_t n) {
  if (!ev || o->events_failed) return;
  int rc = ts_events_write_scalars(ev, step, wall_s(), tags, v, n);
  if (rc < 0) {
    /* Training matters more than its curves: say so once and go on without them. */
    ts_log_err("cannot write to the event file %s: %s; no more TensorBoard events",
               ts_events_path(ev), ts_strerror(rc));
    o->events_failed = true;
  }
}

void ts_observe_progress(void *arg, const ts_progress_t *p) {
  ts_observe_t *o = arg;
  o->snap.step = p->step;
  o->snap.total_steps = p->total_steps;
  o->snap.epoch = p->epoch;
  o->snap.epoch_progress = p->epoch_progress;
  o->snap.learning_rate = p->learning_rate;
  if (!p->final) {
    o->snap.loss = p->loss;
    o->snap.examples_per_sec = p->examples_per_sec;
    o->snap.have_progress = true;
  } else {
    o->snap.done = true;
    o->snap.have_test = true;
    o->snap.test_accuracy = p->test_accuracy;
    o->snap.test_loss = p->test_loss;
  }
  /* A CTR model's AUC: the interval's (progressive validation), or the test rows' at the
   * end; one more scalar beside the loss and the accuracy. */
  bool auc = p->auc > 0;
  if (auc && !p->final) {
    o->snap.have_auc = true;
    o->snap.auc = p->auc;
  } else if (auc) {
    o->snap.have_test_auc = true;
    o->snap.test_auc = p->auc;
  }
  publish(o);
  /* TensorBoard's step: the job's (global) step, as TensorFlow's summaries use. */
  const int64_t at = (int64_t)(p->global_step ? p->global_step : p->step);
  if (!p->final) {
    /* Keras's TensorBoard callback's names, at the step (not the epoch) they were
     * reached; a CTR model's AUC as Keras's AUC metric names it. */
    static const char *const tags[] = {"epoch_loss", "epoch_accuracy", "epoch_learning_rate",
                                       "examples/sec", "epoch_auc"};
    const float v[] = {(float)p->loss, (float)p->train_accuracy, (float)p->learning_rate,
                       (float)p->examples_per_sec, (float)p->auc};
    write_events(o, o->train_ev, at, tags, v, auc ? 5 : 4);
  } else {
    static const char *const tags[] = {"epoch_accuracy", "epoch_loss", "epoch_auc"};
    const float v[] = {(float)p->test_accuracy, (float)p->test_loss, (float)p->auc};
    write_events(o, o->val_ev, at, tags, v, auc ? 3 : 2);
  }
  if (o->notify) {
    if (p->final)
      ts_notify_printf("STATUS=worker %d done: %llu steps, test accuracy %.4f", o->task,
                       (unsigned long long)p->step, p->test_accuracy);
    else
      ts_notify_printf("STATUS=worker %d: step %llu/%llu, loss %.4f, %.0f examples/s", o->task,
                       (unsigned long long)p->step, (unsigned long long)p->total_steps, p->loss,
                       p->examples_per_sec);
  }
  pet_watchdog(o);
}

void ts_observe_activity(void *arg, bool progress, const char *what) {
  ts_observe_t *o = arg;
  if (progress) {
    o->snap.progress_at = mono_s();
    snprintf(o->snap.doing, sizeof o->snap.doing, "%s", what);
    o->snap.retry[0] = 0;
  } else {
    snprintf(o->snap.retry, sizeof o->snap.retry, "%s", what);
  }
  publish(o);
}

void ts_observe_set_client(ts_observe_t *o, ts_client_t *client) {
  if (!o) return;
  pthread_mutex_lock(&o->client_mu);
  o->client = client;
  pthread_mutex_unlock(&o->client_mu);
}

void ts_observe_live(void *arg, const ts_progress_t *p) {
  ts_observe_t *o = arg;
  ts_progress_line_step(o->line, p);
}

void ts_observe_trained(ts_observe_t *o) {
  ts_progress_line_free(o->line);
  o->line = NULL;
  o->snap.trained = true;
  publish(o);
}

void ts_observe_final_accuracy(ts_observe_t *o, uint64_t step, double accuracy) {
  o->snap.have_final = true;
  o->snap.final_test_accuracy = accuracy;
  publish(o);
  static const char *const tags[] = {"final_test_accuracy"};
  const float v[] = {(float)accuracy};
  write_events(o, o->val_ev, (int64_t)step, tags, v, 1);
}

void ts_observe_stop(ts_observe_t *o) {
  if (!o) return;
  ts_admin_stop(o->admin);
  pthread_mutex_destroy(&o->client_mu);
  ts_progress_line_free(o->line);
  ts_events_close(o->train_ev);
  ts_events_close(o->val_ev);
  ts_free(o);
}
