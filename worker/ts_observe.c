#include "ts_observe.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_err.h"
#include "ts_events.h"
#include "ts_http.h"
#include "ts_log.h"
#include "ts_notify.h"
#include "ts_progress_line.h"
#include "ts_prom.h"
#include "ts_status_json.h"

static const char *const phase_names[3] = {"pull", "compute", "push"};

/* What the HTTP thread may see; guarded by ts_observe.mu. */
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
  ts_prom_hist_t phase[3];
} snapshot_t;

struct ts_observe {
  const ts_config_t *cfg;
  int task;
  ts_http_t *http;
  ts_events_t *events;
  bool events_failed;
  ts_progress_line_t *line; /* on a terminal: the live progress line (training thread's) */
  bool notify;
  uint64_t watchdog_ms;
  double next_watchdog;  /* CLOCK_MONOTONIC seconds */

  pthread_mutex_t mu;
  snapshot_t snap;
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

static void take(ts_observe_t *o, snapshot_t *s) {
  pthread_mutex_lock(&o->mu);
  *s = o->snap;
  pthread_mutex_unlock(&o->mu);
}

static void render_metrics(const ts_observe_t *o, const snapshot_t *s, ts_buf_t *b) {
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
  GAUGE("tessera_worker_learning_rate", "The optimizer's learning rate.", s->learning_rate);
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

static char *status_json(const ts_observe_t *o, const snapshot_t *s) {
  ts_status_worker_t w = {.task = o->task, .seen = true, .alive = s->ready && !s->done,
                          .done = s->done, .step = s->step, .loss = s->loss,
                          .examples_per_sec = s->examples_per_sec, .last_seen_s = 0,
                          .epoch_progress = s->epoch_progress, .step_known = true,
                          .reported = s->have_progress, .device = s->device};
  cJSON *j = ts_status_json_worker(&w);
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
  if (s->ready && !s->trained) {
    cJSON_AddNumberToObject(j, "loop_progress_age_s", mono_s() - s->progress_at);
    cJSON_AddStringToObject(j, "loop_doing", s->doing);
  } else {
    cJSON_AddNullToObject(j, "loop_progress_age_s");
    cJSON_AddNullToObject(j, "loop_doing");
  }
  char *txt = cJSON_Print(j);
  cJSON_Delete(j);
  return txt;
}

/* /livez: 503 when the training loop, between ts_observe_ready and the end of the run,
 * has not advanced for the threshold (ts_observe.h). */
static void livez(const ts_observe_t *o, const snapshot_t *s, ts_http_reply_t *r) {
  double age = mono_s() - s->progress_at, limit = ts_config_stall_timeout_s(o->cfg);
  if (!s->ready || s->trained || age <= limit) {
    ts_http_reply_text(r, 200, NULL, "ok\n");
    return;
  }
  char text[1024];
  snprintf(text, sizeof text,
           "training loop stuck: no progress for %.1f s (train.stall_timeout_s %g): %s%s%s\n",
           age, limit, s->doing, s->retry[0] ? "; since then: " : "", s->retry);
  ts_http_reply_text(r, 503, NULL, text);
}

static void on_request(void *arg, const char *path, ts_http_reply_t *r) {
  ts_observe_t *o = arg;
  snapshot_t s;
  take(o, &s);
  if (strcmp(path, "/livez") == 0) {
    livez(o, &s, r);
  } else if (strcmp(path, "/readyz") == 0) {
    if (s.ready && !s.done)
      ts_http_reply_text(r, 200, NULL, "ok\n");
    else
      ts_http_reply_text(r, 503, NULL, s.done ? "not ready: done\n" : "not ready: joining the job\n");
  } else if (strcmp(path, "/metrics") == 0) {
    ts_buf_t b = {0};
    render_metrics(o, &s, &b);
    ts_http_render_metrics(o->http, "tessera_worker_admin", &b);
    if (b.failed) {
      ts_buf_free(&b);
      ts_http_reply_text(r, 500, NULL, "out of memory\n");
      return;
    }
    r->status = 200;
    r->content_type = TS_PROM_CONTENT_TYPE;
    r->body = b.data;
    r->len = b.len;
  } else if (strcmp(path, "/status") == 0) {
    char *txt = status_json(o, &s);
    if (!txt) {
      ts_http_reply_text(r, 500, NULL, "out of memory\n");
      return;
    }
    size_t n = strlen(txt);
    r->body = ts_malloc(n + 2);
    if (r->body) {
      memcpy(r->body, txt, n);
      r->body[n] = '\n';
      r->body[n + 1] = 0;
      r->len = n + 1;
    }
    cJSON_free(txt);
    r->status = r->body ? 200 : 500;
    r->content_type = "application/json";
  } else if (strcmp(path, "/") == 0) {
    ts_http_reply_text(r, 200, NULL, "Tessera worker: /metrics /livez /readyz /status\n");
  } else {
    ts_http_reply_text(r, 404, NULL, "not found: try /metrics, /livez, /readyz or /status\n");
  }
}

int ts_observe_start(ts_observe_t **out, const ts_config_t *cfg, int task, char *errmsg,
                     size_t errlen) {
  *out = NULL;
  ts_observe_t *o = ts_calloc(1, sizeof *o);
  if (!o) return TS_ENOMEM;
  o->cfg = cfg;
  o->task = task;
  pthread_mutex_init(&o->mu, NULL);
  for (int i = 0; i < 3; i++)
    ts_prom_hist_init(&o->snap.phase[i], ts_prom_duration_bounds, ts_prom_num_duration_bounds);
  o->snap.learning_rate = cfg->learning_rate;
  o->notify = ts_notify_available() && getenv("NOTIFY_SOCKET") != NULL;
  o->watchdog_ms = ts_notify_watchdog_interval_ms();
  int rc = 0;
  if (cfg->logdir && *cfg->logdir) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/worker-%d", cfg->logdir, task);
    rc = ts_events_open(&o->events, dir, errmsg, errlen);
    if (rc < 0) {
      ts_errmsg_wrapf(errmsg, errlen, "train.logdir");
      rc = TS_ECONFIG;
      goto fail;
    }
    ts_log_info("TensorBoard event file: %s", ts_events_path(o->events));
  }
  ts_http_limits_t lim = {.max_connections = (unsigned)cfg->http_max_connections,
                          .max_connections_per_ip = (unsigned)cfg->http_max_connections_per_ip,
                          .request_timeout_s = cfg->http_request_timeout_s};
  rc = ts_http_start(&o->http, cfg->workers[task], &lim, on_request, o, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "cluster.workers[%d]", task);
    goto fail;
  }
  ts_log_info("admin endpoint on http://%s (/metrics /livez /readyz /status)", cfg->workers[task]);
  o->line = ts_progress_line_new(task, cfg->batch_size);
  *out = o;
  return 0;
fail:
  ts_observe_stop(o);
  return rc;
}

void ts_observe_ready(ts_observe_t *o, uint64_t total_steps) {
  pthread_mutex_lock(&o->mu);
  o->snap.ready = true;
  o->snap.total_steps = total_steps;
  o->snap.progress_at = mono_s();
  snprintf(o->snap.doing, sizeof o->snap.doing, "starting to train");
  pthread_mutex_unlock(&o->mu);
  ts_notify_printf("READY=1\nSTATUS=worker %d training", o->task);
  o->next_watchdog = mono_s();
}

void ts_observe_set_device(ts_observe_t *o, const char *device) {
  pthread_mutex_lock(&o->mu);
  snprintf(o->snap.device, sizeof o->snap.device, "%s", device);
  pthread_mutex_unlock(&o->mu);
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
  pthread_mutex_lock(&o->mu);
  o->snap.step = step;
  o->snap.examples += (uint64_t)o->cfg->batch_size;
  for (int i = 0; i < 3; i++) ts_prom_hist_observe(&o->snap.phase[i], phase_s[i]);
  pthread_mutex_unlock(&o->mu);
  pet_watchdog(o);
}

static void write_events(ts_observe_t *o, int64_t step, const char *const *tags, const float *v,
                         size_t n) {
  if (!o->events || o->events_failed) return;
  int rc = ts_events_write_scalars(o->events, step, wall_s(), tags, v, n);
  if (rc < 0) {
    /* Training matters more than its curves: say so once and go on without them. */
    ts_log_err("cannot write to the event file %s: %s; no more TensorBoard events",
               ts_events_path(o->events), ts_strerror(rc));
    o->events_failed = true;
  }
}

void ts_observe_progress(void *arg, const ts_progress_t *p) {
  ts_observe_t *o = arg;
  pthread_mutex_lock(&o->mu);
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
  pthread_mutex_unlock(&o->mu);
  if (!p->final) {
    static const char *const tags[] = {"loss", "examples/sec", "learning_rate"};
    const float v[] = {(float)p->loss, (float)p->examples_per_sec, (float)p->learning_rate};
    write_events(o, (int64_t)p->step, tags, v, 3);
  } else {
    static const char *const tags[] = {"accuracy", "test_loss"};
    const float v[] = {(float)p->test_accuracy, (float)p->test_loss};
    write_events(o, (int64_t)p->step, tags, v, 2);
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
  pthread_mutex_lock(&o->mu);
  if (progress) {
    o->snap.progress_at = mono_s();
    snprintf(o->snap.doing, sizeof o->snap.doing, "%s", what);
    o->snap.retry[0] = 0;
  } else {
    snprintf(o->snap.retry, sizeof o->snap.retry, "%s", what);
  }
  pthread_mutex_unlock(&o->mu);
}

void ts_observe_live(void *arg, const ts_progress_t *p) {
  ts_observe_t *o = arg;
  ts_progress_line_step(o->line, p);
}

void ts_observe_trained(ts_observe_t *o) {
  ts_progress_line_free(o->line);
  o->line = NULL;
  pthread_mutex_lock(&o->mu);
  o->snap.trained = true;
  pthread_mutex_unlock(&o->mu);
}

void ts_observe_final_accuracy(ts_observe_t *o, uint64_t step, double accuracy) {
  pthread_mutex_lock(&o->mu);
  o->snap.have_final = true;
  o->snap.final_test_accuracy = accuracy;
  pthread_mutex_unlock(&o->mu);
  static const char *const tags[] = {"final_test_accuracy"};
  const float v[] = {(float)accuracy};
  write_events(o, (int64_t)step, tags, v, 1);
}

void ts_observe_stop(ts_observe_t *o) {
  if (!o) return;
  ts_http_stop(o->http);
  ts_progress_line_free(o->line);
  ts_events_close(o->events);
  pthread_mutex_destroy(&o->mu);
  ts_free(o);
}
