/*
 * Reply budgets that match the promise (docs/security.md, docs/architecture.md "What one
 * peer may hold"): 24 connections pipelining Status requests without reading their
 * replies, with the shard's default limits, while a well-behaved client pushes and pulls
 * beside them. Its results must stay exact and it must never wait more than 2 s; the
 * shard's RSS may grow by 64 MiB at most (it grew by 164 MiB in a minute, and on, when all
 * replies shared one 256 MiB budget and status had no share of its own); the flooders are
 * closed with a log line and a counter. And log lines caused by one peer are rate-limited,
 * with a "suppressed N" line.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "bigtensor.h"
#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define HELD_MAX_S 2.0          /* the good client is never held longer */
#define RSS_MAX_KIB (64 * 1024) /* nor does the shard grow more */
#define FLOODERS 24

typedef struct {
  ts_cluster_t c;
  ts_big_t big;
  ts_client_t *good;
  long rss0, rss_max;
  float value;
} fixture_t;

static void start(fixture_t *f, const char *server_cfg) {
  memset(f, 0, sizeof *f);
  ts_big_init(&f->big, 4, 2048);
  ts_big_start_async(&f->c, &f->big, 2, server_cfg);
  f->good = ts_big_worker(&f->c, &f->big, 0, "good", 10, 0);
  f->rss0 = f->rss_max = ts_proc_rss_kib(f->c.pid[0]);
  assert_true(f->rss0 > 0);
}

static void stop(fixture_t *f) {
  fprintf(stderr, "shard RSS: %ld KiB after setup, at most %ld KiB during the attack (+%ld)\n",
          f->rss0, f->rss_max, f->rss_max - f->rss0);
  ts_client_close(f->good);
  assert_int_equal(ts_cluster_stop(&f->c), 0);
}

static void good_step(fixture_t *f) {
  ts_big_step(&f->big, f->good, &f->value, HELD_MAX_S);
  long rss = ts_proc_rss_kib(f->c.pid[0]);
  if (rss > f->rss_max) f->rss_max = rss;
  if (rss - f->rss0 > RSS_MAX_KIB) fail_msg("shard RSS grew from %ld to %ld KiB", f->rss0, rss);
}

/* An admin connection (no tokens: loopback) whose receive buffer is 4 KiB (the kernel
 * doubles it), so the shard's replies wait in the shard, not in socket buffers. */
static int admin_conn(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(s >= 0);
  int rcvbuf = 4096;
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf); /* before connect: the window */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
  uint8_t meta[4096];
  uint32_t len;
  assert_int_equal(ts_raw_read_frame(s, meta, &len), TS_MSG_HELLO);
  Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
  hs.request_id = 1;
  hs.protocol = TS_PROTOCOL_VERSION;
  hs.role = TESSERA__ROLE__ROLE_ADMIN;
  hs.task = -1;
  hs.identity = "status flooder";
  ts_raw_send_msg(s, TS_MSG_HANDSHAKE, &hs.base, 0);
  assert_int_equal(ts_raw_read_frame(s, meta, &len), TS_MSG_HANDSHAKE_REPLY);
  return s;
}

typedef struct {
  int fd[FLOODERS];
  size_t off[FLOODERS];
  uint8_t *frames;
  size_t len;
  atomic_bool stop;
} flood_t;

/* Writes Status requests to every flooder's socket as fast as they are taken; reads none. */
static void *flood(void *arg) {
  flood_t *fl = arg;
  while (!atomic_load(&fl->stop)) {
    struct pollfd p[FLOODERS];
    for (int i = 0; i < FLOODERS; i++) p[i] = (struct pollfd){.fd = fl->fd[i], .events = POLLOUT};
    poll(p, FLOODERS, 10);
    for (int i = 0; i < FLOODERS; i++) {
      if (fl->fd[i] < 0 || !(p[i].revents & POLLOUT)) continue;
      ssize_t w = send(fl->fd[i], fl->frames + fl->off[i], fl->len - fl->off[i],
                       MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) fl->off[i] = (fl->off[i] + (size_t)w) % fl->len;
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fl->fd[i] = -fl->fd[i] - 2;
    }
  }
  return NULL;
}

static double metric(fixture_t *f, const char *series) {
  static char body[1 << 18];
  if (ts_http_get(f->c.http_port[0], "/metrics", body, sizeof body, NULL, 0) != 200) return -1;
  return ts_metric_value(body, series);
}

static void test_status_flood_within_default_budgets(void **state) {
  (void)state;
  fixture_t f;
  start(&f, "");
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 9;
  uint8_t one[64];
  size_t n = ts_msg_encode(TS_MSG_STATUS, &st.base, 0, one);
  static flood_t fl; /* static: a thread reads it until joined */
  memset(&fl, 0, sizeof fl);
  fl.len = n * 4096;
  fl.frames = malloc(fl.len);
  for (size_t i = 0; i < 4096; i++) memcpy(fl.frames + i * n, one, n);
  for (int i = 0; i < FLOODERS; i++) fl.fd[i] = admin_conn(f.c.port[0]);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, flood, &fl), 0);
  /* The good client steps beside the flood until every flooder is closed, for up to 60 s
   * (the pace of a loaded machine). */
  double t0 = ts_now_s(), drops = 0;
  while (ts_now_s() - t0 < 60.0) {
    good_step(&f);
    drops = metric(&f, "tessera_ps_limit_drops_total{limit=\"max_status_reply_bytes\"}");
    if (drops >= FLOODERS) break;
  }
  double mem = metric(&f, "tessera_ps_reply_queue_memory_bytes");
  fprintf(stderr, "after %.1f s: %g flooders dropped, %g bytes of replies queued, shard RSS "
          "+%ld KiB at most\n", ts_now_s() - t0, drops, mem, f.rss_max - f.rss0);
  atomic_store(&fl.stop, true);
  pthread_join(th, NULL);
  assert_true(drops >= FLOODERS);
  assert_true(ts_cluster_log_has(&f.c, 0, "it asks for status faster than it reads"));
  /* A client that reads its replies still gets its status. */
  ts_client_shard_status_t *sst = NULL;
  char e[512];
  if (ts_client_status(f.good, 0, &sst, e, sizeof e) < 0) fail_msg("status: %s", e);
  ts_client_status_free(sst);
  for (int i = 0; i < FLOODERS; i++) close(fl.fd[i] >= 0 ? fl.fd[i] : -fl.fd[i] - 2);
  free(fl.frames);
  good_step(&f);
  stop(&f);
}

/* A peer repeating a refused request (a pull of a partition that does not exist) 2000
 * times: its replies all come, but the log holds a burst of its lines and then a count of
 * those suppressed, not 2000 lines. */
static void test_log_lines_of_one_peer_are_limited(void **state) {
  (void)state;
  fixture_t f;
  start(&f, "");
  int fd = ts_raw_worker(f.c.port[0], 1, "noisy");
  assert_true(fd >= 0);
  enum { N = 2000 };
  Tessera__PartSlice sl = TESSERA__PART_SLICE__INIT, *slp = &sl;
  sl.tensor = 0;
  sl.part = 999;
  sl.count = 2048;
  for (uint64_t id = 1; id <= N; id++) {
    Tessera__Pull p = TESSERA__PULL__INIT;
    p.request_id = id;
    p.parts = &slp;
    p.n_parts = 1;
    ts_raw_send_msg(fd, TS_MSG_PULL, &p.base, 0);
    char detail[256];
    assert_true(ts_raw_expect_error(fd, detail, sizeof detail) < 0);
    if (id % 500 == 0) good_step(&f);
  }
  close(fd);
  good_step(&f);
  /* The close writes the count of the lines suppressed since the last one written, once
   * the shard has seen it. */
  char *log = NULL;
  for (double t0 = ts_now_s(); ts_now_s() - t0 < 10.0; ts_sleep_ms(50)) {
    free(log);
    log = ts_cluster_log(&f.c, 0);
    if (log && strstr(log, "log lines about this peer")) break;
  }
  assert_non_null(log);
  if (!strstr(log, "log lines about this peer")) fail_msg("no suppressed line in:\n%s", log);
  size_t lines = 0;
  for (const char *p = log; (p = strstr(p, "refused: ")); p++) lines++;
  fprintf(stderr, "%d refused requests, %zu log lines of them\n", N, lines);
  free(log);
  assert_true(lines >= 20 && lines < 200);
  stop(&f);
}

int main(void) {
  ts_asan_small_quarantine();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_flood_within_default_budgets),
      cmocka_unit_test(test_log_lines_of_one_peer_are_limited),
  };
  return cmocka_run_group_tests_name("hostile_status", tests, NULL, NULL);
}
