#include "ts_admin.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_http.h"
#include "ts_log.h"
#include "ts_status.h"
#include "ts_status_json.h"

struct ts_admin {
  const ts_config_t *cfg;
  uint32_t shard;
  ts_http_t *http;

  pthread_mutex_t mu; /* guards everything below */
  bool published;
  double published_at;  /* CLOCK_MONOTONIC seconds */
  ts_metrics_t metrics;
  uint8_t *status_pb;
  size_t status_len, status_cap;
  bool ready;
  char why[128];
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A copy of the snapshot, taken under the lock, rendered without it. */
typedef struct {
  bool published, ready;
  double age_s;
  ts_metrics_t metrics;
  Tessera__ShardStatus *st;
  char why[128];
} snapshot_t;

static void take(ts_admin_t *a, snapshot_t *s, bool want_status) {
  memset(s, 0, sizeof *s);
  uint8_t *pb = NULL;
  size_t len = 0;
  pthread_mutex_lock(&a->mu);
  s->published = a->published;
  s->ready = a->ready;
  s->age_s = mono_s() - a->published_at;
  memcpy(s->why, a->why, sizeof s->why);
  if (want_status) {
    s->metrics = a->metrics;
    if (a->status_len && (pb = ts_malloc(a->status_len)) != NULL) {
      memcpy(pb, a->status_pb, a->status_len);
      len = a->status_len;
    }
  }
  pthread_mutex_unlock(&a->mu);
  if (pb) {
    s->st = tessera__shard_status__unpack(&ts_protobuf_allocator, len, pb);
    ts_free(pb);
  }
}

static void drop(snapshot_t *s) {
  if (s->st) tessera__shard_status__free_unpacked(s->st, &ts_protobuf_allocator);
}

static void reply_buf(ts_http_reply_t *r, int status, const char *type, ts_buf_t *b) {
  if (b->failed) {
    ts_buf_free(b);
    ts_http_reply_text(r, 500, NULL, "out of memory\n");
    return;
  }
  r->status = status;
  r->content_type = type;
  r->body = b->data;
  r->len = b->len;
}

static void on_request(void *arg, const char *path, ts_http_reply_t *r) {
  ts_admin_t *a = arg;
  snapshot_t s;
  char text[256];
  if (strcmp(path, "/livez") == 0) {
    take(a, &s, false);
    if (s.published && s.age_s > TS_ADMIN_STALL_S) {
      snprintf(text, sizeof text, "event loop stalled: no tick for %.1f s\n", s.age_s);
      ts_http_reply_text(r, 503, NULL, text);
    } else {
      ts_http_reply_text(r, 200, NULL, "ok\n");
    }
    return;
  }
  if (strcmp(path, "/readyz") == 0) {
    take(a, &s, false);
    if (!s.published)
      ts_http_reply_text(r, 503, NULL, "starting\n");
    else if (s.age_s > TS_ADMIN_STALL_S)
      ts_http_reply_text(r, 503, NULL, "event loop stalled\n");
    else if (!s.ready) {
      snprintf(text, sizeof text, "not ready: %s\n", s.why[0] ? s.why : "starting");
      ts_http_reply_text(r, 503, NULL, text);
    } else {
      ts_http_reply_text(r, 200, NULL, "ok\n");
    }
    return;
  }
  if (strcmp(path, "/metrics") == 0 || strcmp(path, "/status") == 0) {
    take(a, &s, true);
    if (!s.published) {
      ts_http_reply_text(r, 503, NULL, "starting\n");
      drop(&s);
      return;
    }
    if (strcmp(path, "/metrics") == 0) {
      ts_buf_t b = {0};
      ts_metrics_render(&b, &s.metrics, s.st);
      ts_http_render_metrics(a->http, "tessera_ps_admin", &b);
      reply_buf(r, 200, TS_PROM_CONTENT_TYPE, &b);
    } else {
      ts_client_shard_status_t *pub = NULL;
      if (s.st && ts_status_from_pb(s.st, &pub) < 0) {
        ts_http_reply_text(r, 500, NULL, "out of memory\n");
        drop(&s);
        return;
      }
      ts_status_shard_t sh = {.index = a->shard, .address = a->cfg->ps[a->shard], .st = pub,
                              .error = pub ? NULL : "no status published"};
      ts_status_view_t v = {.shards = &sh, .num_shards = 1, .num_workers = a->cfg->num_workers,
                            .configured_mode = ts_mode_name(a->cfg->mode)};
      cJSON *j = ts_status_json_job(&v, true);
      ts_free(pub);
      char *txt = j ? cJSON_Print(j) : NULL;
      cJSON_Delete(j);
      if (txt) {
        ts_buf_t b = {0};
        ts_buf_printf(&b, "%s\n", txt);
        cJSON_free(txt);
        reply_buf(r, 200, "application/json", &b);
      } else {
        ts_http_reply_text(r, 500, NULL, "out of memory\n");
      }
    }
    drop(&s);
    return;
  }
  if (strcmp(path, "/") == 0) {
    ts_http_reply_text(r, 200, NULL,
                       "Tessera parameter-server shard: /metrics /livez /readyz /status\n");
    return;
  }
  ts_http_reply_text(r, 404, NULL, "not found: try /metrics, /livez, /readyz or /status\n");
}

int ts_admin_start(ts_admin_t **out, const ts_config_t *cfg, uint32_t shard, char *errmsg,
                   size_t errlen) {
  *out = NULL;
  ts_admin_t *a = ts_calloc(1, sizeof *a);
  if (!a) return TS_ENOMEM;
  a->cfg = cfg;
  a->shard = shard;
  pthread_mutex_init(&a->mu, NULL);
  ts_http_limits_t lim = {.max_connections = (unsigned)cfg->http_max_connections,
                          .max_connections_per_ip = (unsigned)cfg->http_max_connections_per_ip,
                          .request_timeout_s = cfg->http_request_timeout_s};
  int rc = ts_http_start(&a->http, cfg->ps_http[shard], &lim, on_request, a, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "cluster.ps_http[%u]", shard);
    pthread_mutex_destroy(&a->mu);
    ts_free(a);
    return rc;
  }
  ts_log_info("admin endpoint on http://%s (/metrics /livez /readyz /status)", cfg->ps_http[shard]);
  *out = a;
  return 0;
}

void ts_admin_publish(ts_admin_t *a, const ts_metrics_t *m, const uint8_t *status_pb, size_t len,
                      bool ready, const char *why) {
  pthread_mutex_lock(&a->mu);
  a->metrics = *m;
  if (len > a->status_cap) {
    uint8_t *p = ts_realloc(a->status_pb, len);
    if (p) {
      a->status_pb = p;
      a->status_cap = len;
    }
  }
  if (len <= a->status_cap) {
    if (len) memcpy(a->status_pb, status_pb, len);
    a->status_len = len;
  }
  a->ready = ready;
  snprintf(a->why, sizeof a->why, "%s", why ? why : "");
  a->published = true;
  a->published_at = mono_s();
  pthread_mutex_unlock(&a->mu);
}

void ts_admin_stop(ts_admin_t *a) {
  if (!a) return;
  ts_http_stop(a->http);
  pthread_mutex_destroy(&a->mu);
  ts_free(a->status_pb);
  ts_free(a);
}
