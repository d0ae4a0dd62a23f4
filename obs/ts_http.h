/*
 * The admin HTTP endpoint of a daemon (/metrics, /livez, /readyz, /status), on
 * libmicrohttpd.
 *
 * Threads: libmicrohttpd runs its own thread; the handler is called there, never on the
 * daemon's libuv loop. A handler must therefore only read state that its owner publishes
 * for it under a lock (a snapshot), never the loop's own structures (CONTRIBUTING.md).
 *
 * Only GET and HEAD are served (405 otherwise); the connection count and the time a client
 * may take are bounded, so a slow or hostile scraper cannot hold the daemon.
 */
#ifndef TS_HTTP_H
#define TS_HTTP_H

#include <stddef.h>

typedef struct ts_http ts_http_t;

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
 * that binds wins) and serve with handler from a new thread. Returns 0, TS_ECONFIG for an
 * address that does not parse or resolve, or a negative errno when bind/listen fail, with
 * the reason in errmsg; nothing is left running on error. */
int ts_http_start(ts_http_t **out, const char *addr, ts_http_handler_cb handler, void *arg,
                  char *errmsg, size_t errlen);

/* Stop the thread (waits for requests in progress), close the socket and free. NULL is
 * ignored. The handler is not called after this returns. */
void ts_http_stop(ts_http_t *h);

/* Fill reply with a copy of text (status and content type as given). */
void ts_http_reply_text(ts_http_reply_t *reply, int status, const char *content_type,
                        const char *text);

#endif
