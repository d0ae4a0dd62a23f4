/*
 * A daemon's admin HTTP endpoint (docs/operations.md): the routes every daemon serves, over
 * ts_http, and the snapshot its owner publishes for them. The shard
 * (server/ts_shard_admin.c) and the worker (worker/ts_observe.c) each give a role: what
 * they publish and how their pages render it.
 *
 *   /         200, one line: the role's title and the routes
 *   /livez    200 "ok" (restart me when not): 503 "event loop stalled: no tick for S s"
 *             when a role that publishes on a timer (stall_s > 0) has not published for
 *             stall_s; else what the role's livez callback says, if it has one
 *   /readyz   200 "ok" (route traffic to me when so), followed by a line of the owner's
 *             note when it set one (ts_admin_note): 503 "starting" before the first
 *             publish, "event loop stalled" past stall_s, "not ready: WHY" while the last
 *             publish said not ready
 *   /metrics  the role's families, then the endpoint's own connection families
 *             (ts_http_render_metrics, named after metrics_prefix); TS_PROM_CONTENT_TYPE
 *   /status   the role's JSON object, printed, with a newline; application/json
 *   else      404 naming the routes
 * Before the first publish /livez answers 200 "ok" and /metrics and /status 503
 * "starting". A page that cannot be rendered for lack of memory answers 500 "out of
 * memory". Every text body ends with a newline.
 *
 * Glossary:
 *   snapshot  what the owner last published: a struct of the role's (role->snap_size
 *             bytes), an optional byte string beside it (the blob: the shard's packed
 *             ShardStatus), and whether the daemon is ready, with why not
 *   view      a private copy of the snapshot that one request renders from
 *   ctx       what a role's pages need besides the snapshot and that never changes while
 *             the endpoint lives (the job's configuration, the shard's index), copied
 *
 * Threads: libmicrohttpd calls the routes on its own thread. The owner publishes from its
 * thread (the shard's loop, the worker's training thread): the snapshot is copied in under
 * a mutex, and each request copies it out under that mutex and renders without it, so a
 * role's callback never reads the owner's live state and never holds the lock.
 */
#ifndef TS_ADMIN_H
#define TS_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ts_http.h"
#include "ts_prom.h"

typedef struct ts_admin ts_admin_t;

/* What a role's callback renders from (HTTP thread; valid during the call only). */
typedef struct {
  const void *ctx;     /* the ctx given to ts_admin_new */
  const void *snap;    /* the struct last published, role->snap_size bytes */
  const uint8_t *blob; /* the byte string published with it; NULL when none */
  size_t blob_len;
  double age_s; /* seconds since that publish */
} ts_admin_view_t;

/* /livez beyond the stall rule: returns 0 when alive (the page answers 200 "ok"), else the
 * HTTP status, with the body (one line ending in '\n') appended to text. */
typedef int (*ts_admin_livez_cb)(const ts_admin_view_t *v, ts_buf_t *text);
/* /metrics: append the role's families to b (the endpoint adds its own after them). */
typedef void (*ts_admin_metrics_cb)(const ts_admin_view_t *v, ts_buf_t *b);
/* /status: the role's JSON object, which the endpoint prints and deletes; NULL when out of
 * memory. */
typedef cJSON *(*ts_admin_status_cb)(const ts_admin_view_t *v);

/* A role: static data, which must outlive every endpoint made with it. */
typedef struct {
  const char *title;          /* "Tessera worker": "/" says "Tessera worker: /metrics ..." */
  const char *metrics_prefix; /* of the endpoint's own families: "tessera_worker_admin" */
  size_t snap_size;           /* bytes of the struct the owner publishes */
  /* > 0: the owner publishes on a timer (the shard: every tick), so a publish older than
   * stall_s seconds means its loop is stuck; 0: publishes come when something changes. */
  double stall_s;
  ts_admin_livez_cb livez;     /* NULL: alive unless stalled */
  ts_admin_metrics_cb metrics; /* required */
  ts_admin_status_cb status;   /* required */
} ts_admin_role_t;

/* Make an endpoint of role that does not listen yet: ctx_size bytes at ctx (may be 0) are
 * copied for the role's callbacks. Nothing is published: the owner may publish before
 * ts_admin_listen, so that no request sees the endpoint unpublished. Returns 0 or
 * TS_ENOMEM. */
int ts_admin_new(ts_admin_t **out, const ts_admin_role_t *role, const void *ctx, size_t ctx_size);

/* Serve on addr ("host:port") within limits (NULL: ts_http's defaults) from ts_http's
 * thread, and log the address. Returns 0, TS_ECONFIG for an address that does not parse or
 * resolve, or a negative errno when bind/listen fail, with the reason in errmsg (the
 * caller adds which key named addr). At most once per endpoint. */
int ts_admin_listen(ts_admin_t *a, const char *addr, const ts_http_limits_t *limits, char *errmsg,
                    size_t errlen);

/* Publish a snapshot (owner's thread): snap (role->snap_size bytes) and blob_len bytes at
 * blob (NULL when 0) are copied; ready says whether /readyz answers 200, why (may be
 * NULL: "starting") what it says when not. When the blob cannot be copied for lack of
 * memory, the previous one is kept. */
void ts_admin_publish(ts_admin_t *a, const void *snap, const uint8_t *blob, size_t blob_len,
                      bool ready, const char *why);

/* A warning that does not make the daemon unready (owner's thread), e.g. "last
 * checkpoint: failed 3x (No space left on device)": /readyz answers "ok" and this line.
 * NULL or "" clears it. */
void ts_admin_note(ts_admin_t *a, const char *note);

/* Stop serving (waiting for requests in progress) and free. NULL is ignored. */
void ts_admin_stop(ts_admin_t *a);

#endif
