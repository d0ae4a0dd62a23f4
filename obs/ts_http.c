/*
 * The bounded HTTP server under every admin endpoint (ts_http.h): libmicrohttpd in a
 * thread of its own, GET and HEAD only, and the limits that keep a slow or hostile client
 * from taking it (a whole-request deadline; the oldest connection closed when one address,
 * or all of them, would hold too many), so a liveness probe always gets an answer.
 */
#include "ts_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ts_addr.h"
#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"

#define DEFAULT_MAX_CONNECTIONS 256
#define DEFAULT_PER_IP 32
#define DEFAULT_TIMEOUT_S 5.0
/* libmicrohttpd's own limit sits above ours: the connections we close are only gone once
 * its loop has seen their socket shut, and a burst of accepts comes before that. */
#define MHD_LIMIT_MARGIN 64

/* A connection as we track it (its libmicrohttpd socket context). Only the daemon's one
 * polling thread touches these: the accept policy, the notifications and the handler all
 * run there (MHD_USE_INTERNAL_POLLING_THREAD without a thread pool). libmicrohttpd
 * notifies a close before it closes the socket, so the fd of a tracked connection is
 * always its own. */
typedef struct http_conn {
  struct http_conn *prev, *next; /* ts_http's list, oldest `since` first */
  int fd;
  struct sockaddr_storage addr;
  double since; /* CLOCK_MONOTONIC s: the start, or the end of the previous request */
  bool shut;    /* closed by us, waiting for libmicrohttpd to notice */
} http_conn_t;

struct ts_http {
  struct MHD_Daemon *mhd;
  ts_http_handler_cb handler;
  void *arg;
  char addr[128];
  ts_http_limits_t lim;
  char *tls_cert, *tls_key; /* PEM text for HTTPS (NULL: plain HTTP) */
  http_conn_t *head, *tail; /* polling thread only */
  /* Read by any thread (ts_http_stats), written by the polling thread. */
  unsigned long long open, closed_deadline, closed_per_ip, closed_max;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bump(unsigned long long *v, long long by) {
  __atomic_add_fetch(v, (unsigned long long)by, __ATOMIC_RELAXED);
}

void ts_http_stats(const ts_http_t *h, ts_http_stats_t *out) {
  out->connections = __atomic_load_n(&h->open, __ATOMIC_RELAXED);
  out->closed_deadline = __atomic_load_n(&h->closed_deadline, __ATOMIC_RELAXED);
  out->closed_per_ip = __atomic_load_n(&h->closed_per_ip, __ATOMIC_RELAXED);
  out->closed_max = __atomic_load_n(&h->closed_max, __ATOMIC_RELAXED);
}

void ts_http_render_metrics(const ts_http_t *h, const char *prefix, ts_buf_t *b) {
  if (!h) return;
  ts_http_stats_t st;
  ts_http_stats(h, &st);
  char name[128];
  snprintf(name, sizeof name, "%s_connections", prefix);
  ts_prom_family(b, name, "gauge", "Open connections to this admin endpoint.");
  ts_prom_sample(b, name, NULL, (double)st.connections);
  snprintf(name, sizeof name, "%s_connections_closed_total", prefix);
  ts_prom_family(b, name, "counter",
                 "Admin endpoint connections closed early, by the limit (http.*) that did it.");
  ts_prom_sample(b, name, "reason=\"deadline\"", (double)st.closed_deadline);
  ts_prom_sample(b, name, "reason=\"per_ip\"", (double)st.closed_per_ip);
  ts_prom_sample(b, name, "reason=\"max_connections\"", (double)st.closed_max);
}

static void list_remove(ts_http_t *h, http_conn_t *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    h->head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    h->tail = c->prev;
  c->prev = c->next = NULL;
}

static void list_append(ts_http_t *h, http_conn_t *c) {
  c->prev = h->tail;
  c->next = NULL;
  if (h->tail)
    h->tail->next = c;
  else
    h->head = c;
  h->tail = c;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr *b) {
  if (a->ss_family != b->sa_family) return false;
  if (b->sa_family == AF_INET)
    return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr;
  if (b->sa_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
  return false;
}

static void ip_name(const struct sockaddr *a, char *out, size_t n) {
  snprintf(out, n, "?");
  if (a->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a)->sin_addr, out, (socklen_t)n);
  else if (a->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, out,
              (socklen_t)n);
}

/* Close c: libmicrohttpd sees the shut socket on its next poll and cleans up. */
static void shut(ts_http_t *h, http_conn_t *c, unsigned long long *counter, const char *why) {
  char ip[INET6_ADDRSTRLEN];
  ip_name((const struct sockaddr *)&c->addr, ip, sizeof ip);
  ts_log_warn("admin http %s: closing a connection from %s: %s", h->addr, ip, why);
  shutdown(c->fd, SHUT_RDWR);
  c->shut = true;
  bump(counter, 1);
}

/* The accept policy, called for each new connection before it is set up: make room for
 * it (it is always let in). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  (void)addrlen;
  ts_http_t *h = cls;
  double now = mono_s();
  char why[160];
  unsigned live = 0, from_ip = 0;
  http_conn_t *oldest = NULL, *oldest_ip = NULL;
  for (http_conn_t *c = h->head; c; c = c->next) {
    if (c->shut) continue;
    if (now - c->since > h->lim.request_timeout_s) {
      snprintf(why, sizeof why, "no complete request within %.1f s (http.request_timeout_s)",
               h->lim.request_timeout_s);
      shut(h, c, &h->closed_deadline, why);
      continue;
    }
    live++;
    if (!oldest) oldest = c;
    if (same_ip(&c->addr, addr)) {
      from_ip++;
      if (!oldest_ip) oldest_ip = c;
    }
  }
  if (oldest_ip && from_ip >= h->lim.max_connections_per_ip) {
    snprintf(why, sizeof why,
             "its address holds %u connections, the limit (http.max_connections_per_ip); "
             "the oldest is closed",
             from_ip);
    shut(h, oldest_ip, &h->closed_per_ip, why);
  } else if (oldest && live >= h->lim.max_connections) {
    snprintf(why, sizeof why,
             "%u connections are open, the limit (http.max_connections); the oldest is "
             "closed",
             live);
    shut(h, oldest, &h->closed_max, why);
  }
  return MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  ts_http_t *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    http_conn_t *c = ts_calloc(1, sizeof *c);
    if (!c || !fd) {
      ts_free(c); /* untracked: only libmicrohttpd's own limits apply to it */
      return;
    }
    c->fd = fd->connect_fd;
    if (ad && ad->client_addr) {
      socklen_t len = ad->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                             : sizeof(struct sockaddr_in);
      memcpy(&c->addr, ad->client_addr, len);
    }
    c->since = mono_s();
    list_append(h, c);
    *socket_context = c;
    bump(&h->open, 1);
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    http_conn_t *c = *socket_context;
    if (!c) return;
    list_remove(h, c);
    ts_free(c);
    *socket_context = NULL;
    bump(&h->open, -1);
  }
}

/* A request is answered: the deadline of the next one on this connection starts now. */
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)con_cls;
  (void)toe;
  ts_http_t *h = cls;
  const union MHD_ConnectionInfo *sc = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  http_conn_t *c = sc ? sc->socket_context : NULL;
  if (!c || c->shut) return;
  c->since = mono_s();
  list_remove(h, c);
  list_append(h, c);
}

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

/* A PEM file's text (at most 1 MiB), ts_malloc'd; NULL with errmsg set. */
static char *read_pem(const char *path, char *errmsg, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(errmsg, errlen, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1u << 20;
  char *buf = ts_malloc(cap + 1);
  size_t n = buf ? fread(buf, 1, cap + 1, f) : 0;
  fclose(f);
  if (!buf || n == 0 || n > cap) {
    snprintf(errmsg, errlen, "%s: %s", path, !buf ? "out of memory" : n ? "over 1 MiB" : "empty");
    ts_free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

static void free_http(ts_http_t *h) {
  ts_free(h->tls_cert);
  ts_free(h->tls_key);
  ts_free(h);
}

int ts_http_start(ts_http_t **out, const char *addr, const ts_http_limits_t *limits,
                  ts_http_handler_cb handler, void *arg, char *errmsg, size_t errlen) {
  *out = NULL;
  ts_http_t *h = ts_calloc(1, sizeof *h);
  if (!h) return TS_ENOMEM;
  if (limits) h->lim = *limits;
  bool tls = h->lim.tls_cert_file || h->lim.tls_key_file;
  if (tls && (!h->lim.tls_cert_file || !h->lim.tls_key_file ||
              !(h->tls_cert = read_pem(h->lim.tls_cert_file, errmsg, errlen)) ||
              !(h->tls_key = read_pem(h->lim.tls_key_file, errmsg, errlen)))) {
    if (!h->lim.tls_cert_file || !h->lim.tls_key_file)
      snprintf(errmsg, errlen, "HTTPS needs both a certificate and a key");
    free_http(h);
    return TS_ECONFIG;
  }
  h->lim.tls_cert_file = h->lim.tls_key_file = NULL; /* the caller's: read */
  if (!h->lim.max_connections) h->lim.max_connections = DEFAULT_MAX_CONNECTIONS;
  if (!h->lim.max_connections_per_ip) h->lim.max_connections_per_ip = DEFAULT_PER_IP;
  if (!(h->lim.request_timeout_s > 0)) h->lim.request_timeout_s = DEFAULT_TIMEOUT_S;
  /* libmicrohttpd's idle timeout, in whole seconds, backs ours up while no new connection
   * comes to trigger our check. */
  unsigned idle_s = (unsigned)h->lim.request_timeout_s;
  if ((double)idle_s < h->lim.request_timeout_s) idle_s++;
  h->handler = handler;
  h->arg = arg;
  snprintf(h->addr, sizeof h->addr, "%s", addr);
  int fd = -1;
  int rc = listen_on(addr, errmsg, errlen, &fd);
  if (rc < 0) {
    free_http(h);
    return rc;
  }
  /* TLS 1.3 only, as the shards' own connections. */
  struct MHD_OptionItem tls_opts[] = {
      {MHD_OPTION_HTTPS_MEM_CERT, 0, h->tls_cert},
      {MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls_key},
      {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)"NORMAL:-VERS-ALL:+VERS-TLS1.3"},
      {MHD_OPTION_END, 0, NULL},
  };
  struct MHD_OptionItem no_opts[] = {{MHD_OPTION_END, 0, NULL}};
  /* Published before the thread starts, so a handler may already use *out (ts_http_stats). */
  *out = h;
  h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                                (tls ? MHD_USE_TLS : 0),
                            0, on_accept, h, on_request, h,
                            MHD_OPTION_ARRAY, tls ? tls_opts : no_opts,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(h->lim.max_connections + MHD_LIMIT_MARGIN),
                            MHD_OPTION_CONNECTION_TIMEOUT, idle_s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_END);
  if (!h->mhd) {
    *out = NULL;
    close(fd);
    free_http(h);
    snprintf(errmsg, errlen, "admin address %s: libmicrohttpd failed to start%s", addr,
             tls ? " (HTTPS: is the key the certificate's, both PEM?)" : "");
    return TS_EINTERNAL;
  }
  *out = h;
  return 0;
}

void ts_http_stop(ts_http_t *h) {
  if (!h) return;
  /* Closes the listening socket and joins the thread. */
  MHD_stop_daemon(h->mhd);
  free_http(h);
}
