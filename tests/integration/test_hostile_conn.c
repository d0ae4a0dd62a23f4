/*
 * Connection-level denial of service against one token-protected shard, each attack with a
 * well-behaved authenticated client beside it: the client connects and gets exact results
 * within 2 s, the shard's memory stays bounded, and the attacker's connections are closed
 * with a log line and a counter in /metrics.
 *
 *   idle sockets     hundreds of connections that never handshake (pre-auth quota,
 *                    handshake deadline)
 *   huge meta        connections announcing a 1 MiB meta before the handshake, then
 *                    trickling (small pre-auth frames)
 *   slow frame       an authenticated peer trickling a frame (per-frame rate floor)
 *   slowloris        the admin HTTP endpoint held by clients sending a byte a second
 *                    (whole-request deadline, per-address and total slots)
 *
 * The shard runs with short limits (1 s deadlines) so that each attack takes seconds.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_auth.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define TOKEN "correct horse battery staple"
#define PREAUTH_QUOTA 64
#define IDLE_SOCKETS 320
#define META_SOCKETS 200
#define SLOWLORIS 40
#define GOOD_BOUND_S 2.0 /* the longest a good client may be held */

static const uint64_t w_shape[] = {64, 32};
static const uint64_t b_shape[] = {32};
static const ts_client_tensor_t model[] = {
    {.name = "fc1/weights", .shape = w_shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
    {.name = "fc1/biases", .shape = b_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
};
#define NW (64 * 32)
#define NB 32

typedef struct {
  ts_cluster_t c;
  char dir[64], token_path[128];
  ts_client_t *good;
  float *expect[2]; /* the parameters the shard must hold */
  float *got[2];
  float *grad[2];
} fixture_t;

static ts_client_t *open_good_as(fixture_t *f, int task, const char *identity) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t),
                        .identity = identity,
                        .addrs = f->c.addrs,
                        .num_shards = 1,
                        .task = task,
                        .token = TOKEN,
                        .connect_timeout_s = 5,
                        .request_timeout_s = 5,
                        .require_all = true};
  ts_client_t *cl = NULL;
  char err[512];
  if (ts_client_open(&cl, &o, err, sizeof err) < 0) {
    fprintf(stderr, "open: %s\n", err);
    return NULL;
  }
  return cl;
}

static ts_client_t *open_good(fixture_t *f, int task) {
  return open_good_as(f, task, NULL);
}

/* One push and one pull by cl: exact results (learning rate 1 and a gradient of 0.25 make
 * every update exact in float32), within GOOD_BOUND_S. */
static void good_round(fixture_t *f, ts_client_t *cl) {
  char err[512];
  double t0 = ts_now_s();
  int rc = tc_push(cl, (const float *const *)f->grad, TS_CLIENT_STEP_PULLED, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push: %s\n", err);
  assert_int_equal(rc, 0);
  for (size_t i = 0; i < NW; i++) f->expect[0][i] -= 0.25f;
  for (size_t i = 0; i < NB; i++) f->expect[1][i] -= 0.25f;
  rc = tc_pull(cl, f->got, 0, 0, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "pull: %s\n", err);
  assert_int_equal(rc, 0);
  double took = ts_now_s() - t0;
  if (took > GOOD_BOUND_S) fail_msg("the good client was held %.2f s", took);
  assert_memory_equal(f->expect[0], f->got[0], NW * sizeof(float));
  assert_memory_equal(f->expect[1], f->got[1], NB * sizeof(float));
}

static void assert_logged(fixture_t *f, const char *needle) {
  assert_true(ts_cluster_log_has(&f->c, 0, needle));
}

/* The sum of two samples of the shard's /metrics now (-1 when unreadable). */
static double metrics_sum(fixture_t *f, const char *a, const char *b) {
  static char body[1 << 18];
  if (ts_http_get(f->c.http_port[0], "/metrics", body, sizeof body, NULL, 0) != 200) return -1;
  double va = ts_metric_value(body, a), vb = ts_metric_value(body, b);
  return (va > 0 ? va : 0) + (vb > 0 ? vb : 0);
}

/* A sample of the shard's /metrics once it shows at least `want` (5 s at most). */
static double metric_at_least(fixture_t *f, const char *series, double want) {
  return ts_metric_wait(f->c.http_port[0], series, want, INFINITY);
}

/* Connected and authenticated as worker `task` by hand (Hello, MAC of its nonce). */
static int raw_authed_worker(int port, int task) {
  int code;
  char detail[256];
  return ts_raw_worker_key(port, task, TOKEN, "trickler", &code, detail, sizeof detail);
}

/* True when the peer has closed fd (reading whatever it sent first), without waiting. */
static bool peer_closed_now(int fd) {
  char buf[4096];
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return false;
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (r < 0) return false;
  }
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/tessera-conn-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  snprintf(f->token_path, sizeof f->token_path, "%s/token", f->dir);
  FILE *t = fopen(f->token_path, "w");
  if (!t) return -1;
  fputs(TOKEN "\n", t);
  fclose(t);
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "auth = { token_file = \"%s\"; };\n"
           "job = { mode = \"async\"; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 1.0; };\n"
           "server = { max_connections = 256; max_preauth_connections = %d;\n"
           "           handshake_timeout_s = 1.0;\n"
           "           frame_grace_s = 1.0; min_recv_bytes_per_s = 1024; };\n"
           "http = { request_timeout_s = 2.0; max_connections_per_ip = 32; };\n",
           f->token_path, PREAUTH_QUOTA);
  if (ts_cluster_start(&f->c, 1, 2, cfg) < 0) return -1;
  if (!(f->good = open_good(f, 0))) return -1;
  char err[512];
  if (ts_client_declare(f->good, model, 2, 7, err, sizeof err) < 0) return -1;
  size_t n[2] = {NW, NB};
  for (int i = 0; i < 2; i++) {
    f->expect[i] = calloc(n[i], sizeof(float));
    f->got[i] = calloc(n[i], sizeof(float));
    f->grad[i] = calloc(n[i], sizeof(float));
    for (size_t j = 0; j < n[i]; j++) f->grad[i][j] = 0.25f;
  }
  if (tc_pull(f->good, f->expect, 0, 0, NULL, err, sizeof err) < 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  ts_client_close(f->good);
  int bad = ts_cluster_stop(&f->c);
  for (int i = 0; i < 2; i++) {
    free(f->expect[i]);
    free(f->got[i]);
    free(f->grad[i]);
  }
  remove(f->token_path);
  rmdir(f->dir);
  free(f);
  return bad == 0 ? 0 : -1;
}

/* (a) Hundreds of sockets that never handshake, more than server.max_connections (256
 * here): they take only the pre-auth quota (its oldest closed as new ones come), a new
 * authenticated client gets in at once, psctl calls the shard healthy, and each attacker
 * is closed by its handshake deadline at the latest. */
static void test_idle_sockets(void **state) {
  fixture_t *f = *state;
  pid_t pid = f->c.pid[0];
  long before = ts_proc_rss_kib(pid);
  static int fds[IDLE_SOCKETS];
  for (int i = 0; i < IDLE_SOCKETS; i++) {
    fds[i] = ts_raw_connect(f->c.port[0]);
    assert_true(fds[i] >= 0);
  }
  double t0 = ts_now_s();
  ts_client_t *late = open_good(f, 1);
  assert_non_null(late);
  char e[512];
  assert_int_equal(ts_client_declare(late, model, 2, 7, e, sizeof e), 0);
  good_round(f, late);
  double took = ts_now_s() - t0;
  if (took > GOOD_BOUND_S) fail_msg("a new client took %.2f s to connect and be served", took);
  good_round(f, f->good);
  const char *argv[] = {ts_psctl_path, "-c", f->c.config, "health", NULL};
  char out[4096], err[4096];
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "psctl health: %s%s\n", out, err);
  assert_int_equal(rc, 0);
  char body[256];
  assert_int_equal(ts_http_get(f->c.http_port[0], "/readyz", body, sizeof body, NULL, 0), 200);
  /* Every attacker is closed: the quota's oldest at once, the rest at their deadline. */
  for (int i = 0; i < IDLE_SOCKETS; i++) {
    if (!ts_raw_closed_by_peer(fds[i], 5000)) fail_msg("idle socket %d is still open", i);
    close(fds[i]);
  }
  ts_client_close(late);
  assert_true(metric_at_least(f, "tessera_ps_connections_dropped_total{reason=\"preauth_quota\"}",
                              IDLE_SOCKETS - PREAUTH_QUOTA) >= IDLE_SOCKETS - PREAUTH_QUOTA);
  assert_true(metric_at_least(
                  f, "tessera_ps_connections_dropped_total{reason=\"handshake_timeout\"}", 1) >= 1);
  assert_logged(f, "(server.max_preauth_connections); the oldest is closed");
  assert_logged(f, "no handshake within 1.00 s (server.handshake_timeout_s)");
  long after = ts_proc_rss_kib(pid);
  assert_true(after - before < 64 * 1024);
  good_round(f, f->good);
}

/* (b) Connections announcing a 1 MiB meta before any handshake, sending nearly all of it,
 * then trickling: refused at the header, nothing allocated for them. */
static void test_huge_meta_before_handshake(void **state) {
  fixture_t *f = *state;
  pid_t pid = f->c.pid[0];
  static const char toobig[] = "tessera_ps_rejected_frames_total{reason=\"toobig\"}";
  static const char quota[] = "tessera_ps_connections_dropped_total{reason=\"preauth_quota\"}";
  double dropped_before = metrics_sum(f, toobig, quota);
  assert_true(dropped_before >= 0);
  long before = ts_proc_rss_kib(pid);
  static int fds[META_SOCKETS];
  uint8_t h[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(h, TS_MSG_HANDSHAKE, TS_FRAME_MAX_META, 0);
  /* The whole meta but its last 16 bytes (the trickle below sends 5 of them): a shard that
   * buffered it would hold it all. */
  size_t body = TS_FRAME_MAX_META - 16;
  uint8_t *junk = malloc(body);
  assert_non_null(junk);
  memset(junk, 0x5a, body);
  for (int i = 0; i < META_SOCKETS; i++) {
    fds[i] = ts_raw_connect(f->c.port[0]);
    assert_true(fds[i] >= 0);
    ts_raw_send_all(fds[i], h, sizeof h);
    ts_raw_send_all(fds[i], junk, body); /* stops when the shard closes */
  }
  free(junk);
  for (int round = 0; round < 5; round++) {
    for (int i = 0; i < META_SOCKETS; i++) send(fds[i], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    good_round(f, f->good);
    ts_sleep_ms(200);
  }
  long after = ts_proc_rss_kib(pid);
  if (after - before >= 64 * 1024) fail_msg("RSS grew by %ld KiB", after - before);
  for (int i = 0; i < META_SOCKETS; i++) {
    if (!ts_raw_closed_by_peer(fds[i], 5000)) fail_msg("socket %d is still open", i);
    close(fds[i]);
  }
  assert_logged(f, "larger than the 4096 accepted now (before the handshake)");
  /* Each was refused at its header, or closed as the oldest of a full pre-auth quota
   * before the shard read it. */
  double dropped = 0;
  for (int i = 0;
       i < 50 && (dropped = metrics_sum(f, toobig, quota) - dropped_before) < META_SOCKETS; i++)
    ts_sleep_ms(100);
  if (dropped < META_SOCKETS) fail_msg("%g of %d counted", dropped, META_SOCKETS);
  good_round(f, f->good);
}

/* (c) An authenticated peer trickling a frame at 1 byte per 200 ms is closed once the
 * frame is past its grace period and under the rate floor. */
static void test_slow_frame(void **state) {
  fixture_t *f = *state;
  int fd = raw_authed_worker(f->c.port[0], 1);
  assert_true(fd >= 0);
  uint8_t h[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(h, TS_MSG_STATUS, 1000, 0);
  ts_raw_send_all(fd, h, sizeof h);
  bool closed = false;
  double t0 = ts_now_s();
  while (!closed && ts_now_s() - t0 < 10.0) {
    send(fd, "x", 1, MSG_NOSIGNAL);
    good_round(f, f->good);
    ts_sleep_ms(200);
    closed = peer_closed_now(fd);
  }
  close(fd);
  if (!closed) fail_msg("the trickling peer was not closed in 10 s");
  assert_logged(f, "below server.min_recv_bytes_per_s = 1024: closing");
  assert_true(
      metric_at_least(f, "tessera_ps_connections_dropped_total{reason=\"slow_frame\"}", 1) >= 1);
  good_round(f, f->good);
}

/* (d) Slowloris on the admin endpoint: 40 connections sending a byte a second (reopened
 * when closed) never keep /livez from answering within 2 s. */
static void test_admin_slowloris(void **state) {
  fixture_t *f = *state;
  static const char req[] = "GET /livez HTTP/1.1\r\nHost: shard\r\nX-Slow: ";
  int port = f->c.http_port[0];
  int fds[SLOWLORIS];
  size_t sent[SLOWLORIS];
  for (int i = 0; i < SLOWLORIS; i++) {
    fds[i] = ts_raw_connect(port);
    assert_true(fds[i] >= 0);
    sent[i] = 0;
  }
  double t0 = ts_now_s(), next_byte = t0;
  int probes = 0, reopened = 0;
  /* 6 s of attack, and at least 8 probes however long a loaded machine makes each (a
   * count of probes inside a fixed 6 s window is a speed), within 60 s. */
  while ((ts_now_s() - t0 < 6.0 || probes < 8) && ts_now_s() - t0 < 60.0) {
    if (ts_now_s() >= next_byte) {
      for (int i = 0; i < SLOWLORIS; i++) {
        char b = sent[i] < sizeof req - 1 ? req[sent[i]] : 'a';
        if (peer_closed_now(fds[i]) || send(fds[i], &b, 1, MSG_NOSIGNAL) != 1) {
          close(fds[i]);
          fds[i] = ts_raw_connect(port);
          assert_true(fds[i] >= 0);
          sent[i] = 0;
          reopened++;
          continue;
        }
        sent[i]++;
      }
      next_byte += 1.0;
    }
    char body[256];
    double p0 = ts_now_s();
    int status = ts_http_get(port, "/livez", body, sizeof body, NULL, 0);
    double took = ts_now_s() - p0;
    if (status != 200) fail_msg("/livez answered %d during the attack", status);
    if (took > 2.0) fail_msg("/livez took %.2f s during the attack", took);
    probes++;
    ts_sleep_ms(250);
  }
  for (int i = 0; i < SLOWLORIS; i++) close(fds[i]);
  assert_true(probes > 5);
  assert_true(reopened > 0);
  assert_true(
      metric_at_least(f, "tessera_ps_admin_connections_closed_total{reason=\"deadline\"}", 1) >= 1);
  assert_true(
      metric_at_least(f, "tessera_ps_admin_connections_closed_total{reason=\"per_ip\"}", 1) >= 1);
  assert_logged(f, "no complete request within 2.0 s (http.request_timeout_s)");
  good_round(f, f->good);
}

/* A client whose identity is longer than a handshake may be before authentication still
 * gets in: the client library cuts it (the shard keeps 127 bytes of it anyway). */
static void test_long_identity(void **state) {
  fixture_t *f = *state;
  static char ident[10000];
  memset(ident, 'w', sizeof ident - 1);
  ts_client_t *cl = open_good_as(f, 1, ident);
  assert_non_null(cl);
  char e[512];
  assert_int_equal(ts_client_declare(cl, model, 2, 7, e, sizeof e), 0);
  good_round(f, cl);
  ts_client_close(cl);
}

int main(void) {
  /* Hundreds of sockets in this process and as many in the shard (which inherits it). */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (sodium_init() < 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idle_sockets),  cmocka_unit_test(test_huge_meta_before_handshake),
      cmocka_unit_test(test_slow_frame),    cmocka_unit_test(test_admin_slowloris),
      cmocka_unit_test(test_long_identity),
  };
  return cmocka_run_group_tests_name("hostile_conn", tests, setup, teardown);
}
