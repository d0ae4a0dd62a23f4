#include "ts_admin.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

#define ROUTES "/metrics /livez /readyz /status"

struct ts_admin {
  const ts_admin_role_t *role;
  void *ctx;
  ts_http_t *http;

  pthread_mutex_t mu; /* guards everything below */
  bool published, ready;
  double published_at; /* CLOCK_MONOTONIC seconds */
  char why[128];
  char note[256]; /* a ready daemon's warning (ts_admin_note) */
  void *snap; /* role->snap_size bytes */
  uint8_t *blob;
  size_t blob_len, blob_cap;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What one request renders from: the state always, the role's snapshot (a copy in
 * view.snap and view.blob, freed by drop) when the page has a callback to read it. */
typedef struct {
  bool published, ready, oom;
  char why[128], note[256];
  ts_admin_view_t view;
} take_t;

static void take(ts_admin_t *a, take_t *t, bool want_role) {
  memset(t, 0, sizeof *t);
  t->view.ctx = a->ctx;
  void *snap = NULL;
  uint8_t *blob = NULL;
  if (want_role && !(snap = ts_malloc(a->role->snap_size))) t->oom = true;
  pthread_mutex_lock(&a->mu);
  t->published = a->published;
  t->ready = a->ready;
  t->view.age_s = mono_s() - a->published_at;
  memcpy(t->why, a->why, sizeof t->why);
  memcpy(t->note, a->note, sizeof t->note);
  if (snap) {
    memcpy(snap, a->snap, a->role->snap_size);
    if (a->blob_len && (blob = ts_malloc(a->blob_len)) != NULL) {
      memcpy(blob, a->blob, a->blob_len);
      t->view.blob_len = a->blob_len;
    } else if (a->blob_len) {
      t->oom = true;
    }
  }
  pthread_mutex_unlock(&a->mu);
  t->view.snap = snap;
  t->view.blob = blob;
}

static void drop(take_t *t) {
  ts_free((void *)t->view.snap);
  ts_free((void *)t->view.blob);
}

static bool stalled(const ts_admin_t *a, const take_t *t) {
  return t->published && a->role->stall_s > 0 && t->view.age_s > a->role->stall_s;
}

/* Hand b to the reply (ts_http frees it), or answer 500 when it could not be made. */
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

static void page_livez(ts_admin_t *a, const take_t *t, ts_http_reply_t *r) {
  if (stalled(a, t)) {
    char text[128];
    snprintf(text, sizeof text, "event loop stalled: no tick for %.1f s\n", t->view.age_s);
    ts_http_reply_text(r, 503, NULL, text);
    return;
  }
  ts_buf_t b = {0};
  int status = t->published && a->role->livez ? a->role->livez(&t->view, &b) : 0;
  if (status == 0) {
    ts_buf_free(&b);
    ts_http_reply_text(r, 200, NULL, "ok\n");
    return;
  }
  reply_buf(r, status, NULL, &b);
}

static void page_readyz(ts_admin_t *a, const take_t *t, ts_http_reply_t *r) {
  if (!t->published)
    ts_http_reply_text(r, 503, NULL, "starting\n");
  else if (stalled(a, t))
    ts_http_reply_text(r, 503, NULL, "event loop stalled\n");
  else if (!t->ready) {
    char text[160];
    snprintf(text, sizeof text, "not ready: %s\n", t->why[0] ? t->why : "starting");
    ts_http_reply_text(r, 503, NULL, text);
  } else if (t->note[0]) {
    char text[300];
    snprintf(text, sizeof text, "ok\n%s\n", t->note);
    ts_http_reply_text(r, 200, NULL, text);
  } else {
    ts_http_reply_text(r, 200, NULL, "ok\n");
  }
}

static void page_metrics(ts_admin_t *a, const take_t *t, ts_http_reply_t *r) {
  ts_buf_t b = {0};
  a->role->metrics(&t->view, &b);
  ts_http_render_metrics(a->http, a->role->metrics_prefix, &b);
  reply_buf(r, 200, TS_PROM_CONTENT_TYPE, &b);
}

static void page_status(ts_admin_t *a, const take_t *t, ts_http_reply_t *r) {
  cJSON *j = a->role->status(&t->view);
  char *txt = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  if (!txt) {
    ts_http_reply_text(r, 500, NULL, "out of memory\n");
    return;
  }
  ts_buf_t b = {0};
  ts_buf_printf(&b, "%s\n", txt);
  cJSON_free(txt);
  reply_buf(r, 200, "application/json", &b);
}

/* The route table. A page that renders the role's snapshot waits for the first publish. */
static const struct {
  const char *path;
  void (*render)(ts_admin_t *a, const take_t *t, ts_http_reply_t *r);
  bool role_page;
} routes[] = {
    {"/livez", page_livez, false},
    {"/readyz", page_readyz, false},
    {"/metrics", page_metrics, true},
    {"/status", page_status, true},
};

static void on_request(void *arg, const char *path, ts_http_reply_t *r) {
  ts_admin_t *a = arg;
  if (strcmp(path, "/") == 0) {
    char text[256];
    snprintf(text, sizeof text, "%s: " ROUTES "\n", a->role->title);
    ts_http_reply_text(r, 200, NULL, text);
    return;
  }
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    if (strcmp(path, routes[i].path) != 0) continue;
    bool want_role = routes[i].role_page || (routes[i].render == page_livez && a->role->livez);
    take_t t;
    take(a, &t, want_role);
    if (routes[i].role_page && !t.published)
      ts_http_reply_text(r, 503, NULL, "starting\n");
    else if (t.oom)
      ts_http_reply_text(r, 500, NULL, "out of memory\n");
    else
      routes[i].render(a, &t, r);
    drop(&t);
    return;
  }
  ts_http_reply_text(r, 404, NULL, "not found: try /metrics, /livez, /readyz or /status\n");
}

int ts_admin_new(ts_admin_t **out, const ts_admin_role_t *role, const void *ctx, size_t ctx_size) {
  *out = NULL;
  ts_admin_t *a = ts_calloc(1, sizeof *a);
  if (!a) return TS_ENOMEM;
  pthread_mutex_init(&a->mu, NULL);
  a->role = role;
  a->snap = ts_calloc(1, role->snap_size);
  a->ctx = ctx_size ? ts_malloc(ctx_size) : NULL;
  if (!a->snap || (ctx_size && !a->ctx)) {
    ts_admin_stop(a);
    return TS_ENOMEM;
  }
  if (ctx_size) memcpy(a->ctx, ctx, ctx_size);
  *out = a;
  return 0;
}

int ts_admin_listen(ts_admin_t *a, const char *addr, const ts_http_limits_t *limits, char *errmsg,
                    size_t errlen) {
  int rc = ts_http_start(&a->http, addr, limits, on_request, a, errmsg, errlen);
  if (rc < 0) return rc;
  ts_log_info("admin endpoint on %s://%s (" ROUTES ")",
              limits && limits->tls_cert_file ? "https" : "http", addr);
  return 0;
}

void ts_admin_publish(ts_admin_t *a, const void *snap, const uint8_t *blob, size_t blob_len,
                      bool ready, const char *why) {
  pthread_mutex_lock(&a->mu);
  memcpy(a->snap, snap, a->role->snap_size);
  if (blob_len > a->blob_cap) {
    uint8_t *p = ts_realloc(a->blob, blob_len);
    if (p) {
      a->blob = p;
      a->blob_cap = blob_len;
    }
  }
  if (blob_len <= a->blob_cap) {
    if (blob_len) memcpy(a->blob, blob, blob_len);
    a->blob_len = blob_len;
  }
  a->ready = ready;
  snprintf(a->why, sizeof a->why, "%s", why ? why : "");
  a->published = true;
  a->published_at = mono_s();
  pthread_mutex_unlock(&a->mu);
}

void ts_admin_note(ts_admin_t *a, const char *note) {
  pthread_mutex_lock(&a->mu);
  snprintf(a->note, sizeof a->note, "%s", note ? note : "");
  pthread_mutex_unlock(&a->mu);
}

void ts_admin_stop(ts_admin_t *a) {
  if (!a) return;
  ts_http_stop(a->http);
  pthread_mutex_destroy(&a->mu);
  ts_free(a->blob);
  ts_free(a->snap);
  ts_free(a->ctx);
  ts_free(a);
}
