#include "ts_http.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

/* A scrape is one small request: 32 connections and 10 s per connection are plenty, and
 * bound what a misbehaving client can hold. */
#define HTTP_MAX_CONNECTIONS 32
#define HTTP_TIMEOUT_S 10

struct ts_http {
  struct MHD_Daemon *mhd;
  ts_http_handler_cb handler;
  void *arg;
  char addr[128];
};

void ts_http_reply_text(ts_http_reply_t *reply, int status, const char *content_type,
                        const char *text) {
  reply->status = status;
  reply->content_type = content_type;
  reply->len = strlen(text);
  reply->body = ts_malloc(reply->len + 1);
  if (reply->body)
    memcpy(reply->body, text, reply->len + 1);
  else
    reply->len = 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  const ts_http_t *h = cls;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n > 0 && line[n - 1] == '\n') line[--n] = 0;
  ts_log_warn("admin http %s: %s", h->addr, line);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  (void)version;
  (void)upload_data;
  ts_http_t *h = cls;
  /* The first call per request only announces the headers; answer on the second, after any
   * body (which is ignored) has been read. */
  static int seen;
  if (*con_cls == NULL) {
    *con_cls = &seen;
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  ts_http_reply_t r = {0};
  bool head = strcmp(method, "HEAD") == 0;
  if (strcmp(method, "GET") != 0 && !head) {
    ts_http_reply_text(&r, 405, NULL, "only GET and HEAD are served here\n");
  } else {
    h->handler(h->arg, url, &r);
  }
  struct MHD_Response *resp;
  if (r.body) {
    resp = MHD_create_response_from_buffer(r.len, r.body, MHD_RESPMEM_MUST_COPY);
  } else {
    resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  }
  ts_free(r.body);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          r.content_type ? r.content_type : "text/plain; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (r.status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)(r.status ? r.status : 500), resp);
  MHD_destroy_response(resp);
  return ret;
}

/* Our own listening socket (rather than MHD_OPTION_SOCK_ADDR), so a failed bind reports
 * its errno and the address. */
static int listen_on(const char *addr, char *errmsg, size_t errlen, int *fd_out) {
  struct addrinfo *ai = NULL;
  char why[300];
  if (ts_addr_resolve(addr, true, &ai, why, sizeof why) < 0) {
    snprintf(errmsg, errlen, "admin address: %s", why);
    return TS_ECONFIG;
  }
  int err = EADDRNOTAVAIL;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      freeaddrinfo(ai);
      *fd_out = fd;
      return 0;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(ai);
  snprintf(errmsg, errlen, "cannot listen on admin address %s: %s", addr, strerror(err));
  return -err;
}

int ts_http_start(ts_http_t **out, const char *addr, ts_http_handler_cb handler, void *arg,
                  char *errmsg, size_t errlen) {
  *out = NULL;
  ts_http_t *h = ts_calloc(1, sizeof *h);
  if (!h) return TS_ENOMEM;
  h->handler = handler;
  h->arg = arg;
  snprintf(h->addr, sizeof h->addr, "%s", addr);
  int fd = -1;
  int rc = listen_on(addr, errmsg, errlen, &fd);
  if (rc < 0) {
    ts_free(h);
    return rc;
  }
  h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S,
                            MHD_OPTION_END);
  if (!h->mhd) {
    close(fd);
    ts_free(h);
    snprintf(errmsg, errlen, "admin address %s: libmicrohttpd failed to start", addr);
    return TS_EINTERNAL;
  }
  *out = h;
  return 0;
}

void ts_http_stop(ts_http_t *h) {
  if (!h) return;
  /* Closes the listening socket and joins the thread. */
  MHD_stop_daemon(h->mhd);
  ts_free(h);
}
