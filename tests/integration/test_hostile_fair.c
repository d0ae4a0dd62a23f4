/*
 * Fairness of what peers hold, when the pool or the shard itself is under strain
 * (docs/architecture.md, "What one peer may hold"): tricklers each just above the push
 * floor holding the whole staging pool, a trickler hiding behind a shard whose loop lags,
 * and an honest slow reader of a large pull that must not be cut. Each runs with a
 * well-behaved client beside it, whose results must stay exact and who must never wait more
 * than 2 s; the shard's RSS may grow by 64 MiB at most. Limits are set short so each test
 * takes a few seconds; nothing here asserts on speed beyond those generous bounds.
 */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "bigtensor.h"
#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define HELD_MAX_S 2.0          /* the good client is never held longer */
#define RSS_MAX_KIB (64 * 1024) /* nor does the shard grow more */

typedef struct {
  ts_cluster_t c;
  ts_big_t big;
  ts_client_t *good;
  long rss0;
  float value; /* what every parameter holds now (the good client's pushes) */
} fixture_t;

/* A shard of an async job (learning rate 1: a push of -1 adds exactly 1) holding one tensor
 * of `parts` partitions of part_floats each, and the good client (task 0). */
static void start(fixture_t *f, size_t parts, size_t part_floats, const char *server_cfg) {
  memset(f, 0, sizeof *f);
  ts_big_init(&f->big, parts, part_floats);
  ts_big_start_async(&f->c, &f->big, 3, server_cfg);
  f->good = ts_big_worker(&f->c, &f->big, 0, "good", 10, 0);
  f->rss0 = ts_proc_rss_kib(f->c.pid[0]);
  assert_true(f->rss0 > 0);
}

static void stop(fixture_t *f) {
  ts_client_close(f->good);
  assert_int_equal(ts_cluster_stop(&f->c), 0);
}

/* The good client pushes -1 everywhere and pulls: every value must be one more than
 * before, and neither request may take longer than HELD_MAX_S. */
static void good_step(fixture_t *f) {
  ts_big_step(&f->big, f->good, &f->value, HELD_MAX_S);
  long rss = ts_proc_rss_kib(f->c.pid[0]);
  if (rss - f->rss0 > RSS_MAX_KIB) fail_msg("shard RSS grew from %ld to %ld KiB", f->rss0, rss);
}

static void assert_logged(fixture_t *f, const char *needle) {
  assert_true(ts_cluster_log_has(&f->c, 0, needle));
}

/* A raw worker connection that has sent the meta of a push of partitions [0, n) of
 * part_floats each; its payload is the caller's to send. */
static int push_started(fixture_t *f, int task, size_t n, size_t part_floats) {
  int fd = ts_raw_worker(f->c.port[0], task, "raw");
  assert_true(fd >= 0);
  ts_raw_send_parts(fd, TS_MSG_PUSH, 100, n, part_floats);
  return fd;
}

/* Send zeros (a gradient that changes nothing) to each of n fds: `chunk` bytes each every
 * every_ms, until `total` bytes each or stop. */
typedef struct {
  int fd[32];
  int n;
  size_t chunk, total;
  int every_ms;
  atomic_bool stop;
} sender_t;

static void *send_slowly(void *arg) {
  sender_t *t = arg;
  static const char zeros[65536];
  size_t sent[32] = {0};
  while (!atomic_load(&t->stop)) {
    bool left = false;
    for (int i = 0; i < t->n; i++) {
      if (t->fd[i] < 0 || sent[i] >= t->total) continue;
      size_t c = t->total - sent[i] < t->chunk ? t->total - sent[i] : t->chunk;
      ssize_t w = send(t->fd[i], zeros, c, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) sent[i] += (size_t)w;
      left |= sent[i] < t->total;
    }
    if (!left) break;
    ts_sleep_ms(t->every_ms);
  }
  return NULL;
}

/* --- tricklers just above the floor, holding the whole pool ------------------------- */

#define POOL 16 /* staging buffers of a small model: 16 of 1 MiB */

static void test_contended_tricklers_lose_the_pool(void **state) {
  (void)state;
  fixture_t f;
  /* 128 partitions of 8 KiB: a push of all of them is one 1 MiB piece, a whole buffer. */
  start(&f, 128, 2048, "push_min_bytes_per_s = 16384; push_rate_window_s = 0.5;");
  good_step(&f); /* the pool exists */
  /* Static: a thread left running by a failed assertion must not write into a dead frame. */
  static sender_t t;
  memset(&t, 0, sizeof t);
  t.n = POOL;
  t.chunk = 8192; /* 160 KiB/s each: well above push_min_bytes_per_s, a piece in 6 s */
  t.every_ms = 50;
  t.total = 1 << 20;
  for (int i = 0; i < POOL; i++) t.fd[i] = push_started(&f, 1, 128, 2048);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, send_slowly, &t), 0);
  assert_true(ts_metric_wait(f.c.http_port[0], "tessera_ps_staging_buffers_in_use", POOL,
                             INFINITY) >= POOL);
  ts_sleep_ms(700); /* each has held its buffer longer than the judging span */
  /* The good push waits for a buffer: the tricklers, slower than the contended floor, go. */
  good_step(&f);
  good_step(&f);
  for (int i = 0; i < POOL; i++) assert_true(ts_raw_closed_by_peer(t.fd[i], 5000));
  atomic_store(&t.stop, true);
  pthread_join(th, NULL);
  for (int i = 0; i < POOL; i++) close(t.fd[i]);
  assert_true(
      ts_metric_wait(f.c.http_port[0],
                     "tessera_ps_limit_drops_total{limit=\"push_contended_min_bytes_per_s\"}", 1,
                     INFINITY) >= 1);
  assert_logged(&f, "slower than server.push_contended_min_bytes_per_s");
  good_step(&f);
  stop(&f);
}

/* --- a lagging shard: no escape for a trickler, no drop of an honest peer -------------- */

static void test_lagging_tick_judges_over_running_time(void **state) {
  (void)state;
  fixture_t f;
  /* frame_grace_s: the frame rate floor would drop the trickler too; this is the push's. */
  start(&f, 128, 2048,
        "push_min_bytes_per_s = 65536; push_rate_window_s = 1.0; frame_grace_s = 60.0;");
  good_step(&f);
  static sender_t trickler, honest; /* static: see test_contended_tricklers_lose_the_pool */
  memset(&trickler, 0, sizeof trickler);
  memset(&honest, 0, sizeof honest);
  trickler.n = honest.n = 1;
  trickler.fd[0] = push_started(&f, 1, 1, 2048);
  trickler.chunk = 1; /* 4 bytes a second */
  trickler.every_ms = 250;
  trickler.total = 2048 * sizeof(float);
  honest.fd[0] = push_started(&f, 2, 128, 2048);
  honest.chunk = 32768; /* 256 KiB/s: a 1 MiB push over four of the cycles below */
  honest.every_ms = 125;
  honest.total = 1 << 20;
  pthread_t th[2];
  assert_int_equal(pthread_create(&th[0], NULL, send_slowly, &trickler), 0);
  assert_int_equal(pthread_create(&th[1], NULL, send_slowly, &honest), 0);
  ts_sleep_ms(300); /* the shard's tick has run: the first lag below is a lag */
  /* The shard is descheduled for 1.2 s at a time and runs 0.3 s in between: each stretch
   * is shorter than the rate window, so a window restarted after every lag never ends. */
  bool dropped = false;
  for (int k = 0; k < 12 && !dropped; k++) {
    ts_cluster_signal(&f.c, 0, SIGSTOP);
    ts_sleep_ms(1200);
    ts_cluster_signal(&f.c, 0, SIGCONT);
    ts_sleep_ms(150);
    good_step(&f);
    ts_sleep_ms(150);
    struct pollfd pfd = {.fd = trickler.fd[0], .events = POLLIN};
    dropped = poll(&pfd, 1, 0) > 0 && ts_raw_closed_by_peer(trickler.fd[0], 100);
  }
  /* The honest push arrived whole and was answered. */
  uint8_t meta[4096];
  uint32_t len;
  int reply = ts_raw_read_frame(honest.fd[0], meta, &len);
  atomic_store(&trickler.stop, true);
  atomic_store(&honest.stop, true);
  pthread_join(th[0], NULL);
  pthread_join(th[1], NULL);
  if (!dropped || reply != TS_MSG_PUSH_REPLY) {
    char *log = ts_cluster_log(&f.c, 0);
    fprintf(stderr, "%s\n", log ? log : "");
    free(log);
  }
  if (!dropped) fail_msg("the trickler outlived 12 lags of the shard");
  assert_int_equal(reply, TS_MSG_PUSH_REPLY);
  close(trickler.fd[0]);
  close(honest.fd[0]);
  assert_true(ts_metric_wait(f.c.http_port[0],
                             "tessera_ps_limit_drops_total{limit=\"push_min_bytes_per_s\"}", 1,
                             INFINITY) >= 1);
  assert_logged(&f, "slower than server.push_min_bytes_per_s");
  /* The lags are in the loop-lag histogram and the log. */
  char body[1 << 17];
  assert_true(ts_http_get(f.c.http_port[0], "/metrics", body, sizeof body, NULL, 0) == 200);
  double late = ts_metric_value(body, "tessera_ps_loop_lag_seconds_count") -
                ts_metric_value(body, "tessera_ps_loop_lag_seconds_bucket{le=\"1\"}");
  if (!(late >= 1)) {
    char *log = ts_cluster_log(&f.c, 0);
    fprintf(stderr, "%s\n", log ? log : "");
    free(log);
    const char *h = strstr(body, "tessera_ps_loop_lag_seconds");
    fail_msg("no tick was seen more than 1 s late: %.1500s", h ? h : "(no loop-lag histogram)");
  }
  assert_int_equal(ts_promtool_check(body), 0);
  assert_logged(&f, "tick ran");
  good_step(&f);
  stop(&f);
}

/* A worker heartbeating every 0.2 s (a 1 s timeout) while the shard is descheduled for
 * 1.5 s at a time: its heartbeats wait in the socket, and the shard must not take it for
 * dead on the tick that runs late, before it has read them. */
static void test_lagging_tick_marks_no_worker_dead(void **state) {
  (void)state;
  fixture_t f;
  memset(&f, 0, sizeof f);
  assert_int_equal(ts_cluster_start(&f.c, 1, 1,
                                    "job = { mode = \"async\"; heartbeat_timeout_s = 1.0; "
                                    "heartbeat_interval_s = 0.2; partition_bytes = 8192; };"),
                   0);
  ts_big_init(&f.big, 4, 2048);
  ts_client_t *w = ts_big_worker(&f.c, &f.big, 0, "beating", 10, 0.2);
  ts_sleep_ms(500);
  for (int k = 0; k < 3; k++) {
    ts_cluster_signal(&f.c, 0, SIGSTOP);
    ts_sleep_ms(1500);
    ts_cluster_signal(&f.c, 0, SIGCONT);
    ts_sleep_ms(500);
  }
  char *log = ts_cluster_log(&f.c, 0);
  assert_non_null(log);
  bool dead = strstr(log, "marked dead") != NULL, lagged = strstr(log, "tick ran") != NULL;
  if (dead || !lagged) fprintf(stderr, "%s\n", log);
  free(log);
  assert_false(dead);
  assert_true(lagged);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&f.c), 0);
}

/* --- an honest slow reader of a large pull ------------------------------------------- */

typedef struct {
  int fd;
  atomic_ulong got, total; /* payload bytes read, of total (0 until the header is in) */
  atomic_bool done, closed;
} reader_t;

/* Reads the reply at about 20 MiB/s: 64 MiB in some 3 s. */
static void *read_reply(void *arg) {
  reader_t *r = arg;
  uint8_t h[TS_FRAME_HEADER_SIZE];
  ts_frame_header_t hdr;
  if (ts_raw_read_full(r->fd, h, sizeof h, 5000) < 0 ||
      ts_frame_decode_header(h, sizeof h, UINT64_MAX, &hdr, NULL) < 0) {
    atomic_store(&r->closed, true);
    return NULL;
  }
  static char buf[65536];
  uint64_t left = hdr.meta_len + hdr.data_len;
  atomic_store(&r->total, left);
  while (left > 0) {
    size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
    if (ts_raw_read_full(r->fd, buf, n, 5000) < 0) {
      atomic_store(&r->closed, true);
      return NULL;
    }
    left -= n;
    atomic_fetch_add(&r->got, n);
    ts_sleep_ms(3);
  }
  atomic_store(&r->done, true);
  return NULL;
}

static void test_slow_honest_pull_is_not_cut(void **state) {
  (void)state;
  fixture_t f;
  /* 16 partitions of 4 MiB; the reply takes ~3 s to read, longer than the hold timeout. */
  start(&f, 16, 1048576, "pull_hold_timeout_s = 2.0;");
  static reader_t r; /* static: see test_contended_tricklers_lose_the_pool */
  memset(&r, 0, sizeof r);
  r.fd = ts_raw_worker(f.c.port[0], 1, "reader");
  assert_true(r.fd >= 0);
  int small = 65536;
  setsockopt(r.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ts_raw_send_parts(r.fd, TS_MSG_PULL, 5, 16, 1048576);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, read_reply, &r), 0);
  /* Once 60% of the reply is read (about the hold timeout after it was queued), the good
   * client pushes: its update waits for the rest the shard has not yet handed to the socket
   * buffers (which hold ~8 MiB), some 17 MiB or 0.9 s, well below the timeout. */
  double t0 = ts_now_s();
  while (!atomic_load(&r.closed) && ts_now_s() - t0 < 30.0 &&
         (atomic_load(&r.total) == 0 || atomic_load(&r.got) < atomic_load(&r.total) / 5 * 3))
    ts_sleep_ms(10);
  fprintf(stderr, "reader at %lu of %lu bytes after %.1f s\n", atomic_load(&r.got),
          atomic_load(&r.total), ts_now_s() - t0);
  good_step(&f);
  pthread_join(th, NULL);
  assert_false(atomic_load(&r.closed));
  assert_true(atomic_load(&r.done));
  close(r.fd);
  char body[1 << 17];
  assert_true(ts_http_get(f.c.http_port[0], "/metrics", body, sizeof body, NULL, 0) == 200);
  assert_true(
      ts_metric_value(body, "tessera_ps_limit_drops_total{limit=\"pull_hold_timeout_s\"}") == 0);
  good_step(&f);
  stop(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contended_tricklers_lose_the_pool),
      cmocka_unit_test(test_lagging_tick_judges_over_running_time),
      cmocka_unit_test(test_lagging_tick_marks_no_worker_dead),
      cmocka_unit_test(test_slow_honest_pull_is_not_cut),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("hostile_fair", tests, NULL, NULL));
}
