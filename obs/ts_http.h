/*
 * The admin HTTP endpoint of a daemon (/metrics, /livez, /readyz, /status), on
 * libmicrohttpd.
 *
 * Threads: libmicrohttpd runs its own thread; the handler is called there, never on the
 * daemon's libuv loop. A handler must therefore only read state that its owner publishes
 * for it under a lock (a snapshot), never the loop's own structures (CONTRIBUTING.md).
 *
 * Only GET and HEAD are served (405 otherwise). Slow or hostile clients cannot take the
 * endpoint (a liveness probe must always get an answer, or Kubernetes restarts a healthy
 * daemon):
 *   - a request has a whole-request deadline (ts_http_limits_t.request_timeout_s) from the
 *     connection's start, or the end of its previous request, to its reply; libmicrohttpd's
 *     own timeout only counts idle time, so a client sending a byte a second (slowloris)
 *     would otherwise hold its slot forever;
 *   - a new connection from an address holding max_connections_per_ip closes that
 *     address's oldest, and one past max_connections closes the oldest of all: the newest
 *     (a probe) always gets in, and one address cannot fill the endpoint.
 * Connections are closed (shutdown(2) of their socket, which libmicrohttpd then sees) when
 * a new one arrives, i.e. exactly when their slot is needed; each closing logs a line and
 * is counted (ts_http_stats).
 */
#ifndef TS_HTTP_H
#define TS_HTTP_H

#include <stddef.h>

#include "ts_prom.h"

typedef struct ts_http ts_http_t;

/* Limits of an endpoint (config keys http.*); a 0 field takes the default in brackets. */
typedef struct {
  unsigned max_connections;        /* [256] open at once */
  unsigned max_connections_per_ip; /* [32] open at once from one client address */
  double request_timeout_s;        /* [5] whole-request deadline */
  /* HTTPS (TLS 1.3) with this PEM certificate (then its chain) and key, as auth.tls's
   * files: both NULL (default) for plain HTTP. Clients are not asked for a certificate:
   * probes (Kubernetes, Prometheus) rarely have one, and the endpoint serves reads only. */
  const char *tls_cert_file, *tls_key_file;
} ts_http_limits_t;

/* Connection figures, for /metrics. */
typedef struct {
  unsigned long long connections; /* open now */
  unsigned long long closed_deadline, closed_per_ip, closed_max; /* closed early, why */
} ts_http_stats_t;

/* What a handler answers. body is allocated with ts_malloc and freed by ts_http after it is
 * sent (it may be NULL for an empty body); content_type is a static string. */
typedef struct {
  int status;               /* 200, 404, 503 ... */
  const char *content_type; /* NULL: text/plain; charset=utf-8 */
  char *body;
  size_t len;
} ts_http_reply_t;

/* Called on the HTTP thread for each GET/HEAD with the path (no query string). Fill *reply.
 * arg is the value given to ts_http_start. */
typedef void (*ts_http_handler_cb)(void *arg, const char *path, ts_http_reply_t *reply);

/* Listen on addr ("host:port", as cluster.ps_http; the host is resolved, the first address
 * that binds wins) and serve with handler from a new thread, within limits (NULL: all
 * defaults; copied, the TLS files read here). Returns 0, TS_ECONFIG for an address that
 * does not parse or resolve or a TLS file that cannot be read, or a negative errno when
 * bind/listen fail, with the reason in errmsg; nothing is left running on error. */
int ts_http_start(ts_http_t **out, const char *addr, const ts_http_limits_t *limits,
                  ts_http_handler_cb handler, void *arg, char *errmsg, size_t errlen);

/* The endpoint's connection figures now. Any thread (a handler included). */
void ts_http_stats(const ts_http_t *h, ts_http_stats_t *out);

/* Render those figures into b as Prometheus families named after prefix
 * ("tessera_ps_admin" gives tessera_ps_admin_connections and
 * tessera_ps_admin_connections_closed_total{reason="deadline|per_ip|max_connections"}).
 * NULL h renders nothing. */
void ts_http_render_metrics(const ts_http_t *h, const char *prefix, ts_buf_t *b);

/* Stop the thread (waits for requests in progress), close the socket and free. NULL is
 * ignored. The handler is not called after this returns. */
void ts_http_stop(ts_http_t *h);

/* Fill reply with a copy of text (status and content type as given). */
void ts_http_reply_text(ts_http_reply_t *reply, int status, const char *content_type,
                        const char *text);

#endif
