/*
 * Retried pushes are applied once (docs/architecture.md, "Retried pushes"), through a real
 * ps-server in async mode with SGD at rate 1, so the parameters are exactly minus the sum
 * of the gradients applied:
 *  - the client library: a push re-run with retry_of = its push_id is answered duplicate
 *    and changes nothing; a push_pull retried as a push likewise; a new push is applied;
 *  - on the wire: a push whose connection was closed before its reply came, sent again
 *    with the same (client incarnation, push id) on a new connection, is not applied again;
 *    a push applied to part of its partitions, repeated whole, is applied to the rest only;
 *    another incarnation with the same id, an older id never applied, and pushes without
 *    an id are applied;
 *  - a retry is sent only to the shards that did not answer the failed attempt;
 *  - a peer sending thousands of fresh ids and incarnations: the shard's memory for them
 *    stays at its bound (tessera_ps_push_dedup_bytes, RSS), the evictions are counted and
 *    logged, and a good client of another task still has its retries recognised.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define PARTS 4
#define PART_FLOATS 1024 /* job.partition_bytes = 4096 */
#define N (PARTS * PART_FLOATS)

static const uint64_t shape[] = {N};
static const ts_client_tensor_t model[1] = {
    {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
};

static ts_cluster_t *cur; /* the cluster of the test running, for its log on a failure */

static ts_client_t *open_client(ts_cluster_t *c) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.identity = "test_push_retry";
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, model, 1, 7), 0);
  assert_int_equal(ts_client_num_parts(cl), PARTS);
  return cl;
}

/* Start num_shards shards of an async job of num_workers workers (SGD at learning rate 1:
 * a push of gradient 1 subtracts exactly 1) and open task 0's client on them. */
static ts_client_t *start(ts_cluster_t *c, int num_shards, int num_workers) {
  cur = c;
  assert_int_equal(ts_cluster_start(c, num_shards, num_workers,
                                    "job = { mode = \"async\"; partition_bytes = 4096; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  return open_client(c);
}

/* Every value of w is want (exactly). */
static void expect_all(ts_client_t *cl, float want) {
  static float w[N];
  float *dst[1] = {w};
  char err[256];
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  for (size_t i = 0; i < N; i++)
    if (w[i] != want) fail_msg("w[%zu] = %g, want %g", i, (double)w[i], (double)want);
}

/* Poll until every value of w is want (a push whose reply was never read), at most 5 s. */
static void wait_all(ts_client_t *cl, float want) {
  static float w[N];
  float *dst[1] = {w};
  char err[256];
  for (double t0 = ts_now_s(); ts_now_s() - t0 < 5.0; ts_sleep_ms(20)) {
    assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
    bool all = true;
    for (size_t i = 0; i < N && all; i++) all = w[i] == want;
    if (all) return;
  }
  expect_all(cl, want);
}

static const float *ones(void) {
  static float g[N];
  for (size_t i = 0; i < N; i++) g[i] = 1.0f;
  return g;
}

/* A push of gradient 1 over the whole model through the library. */
static int lib_push(ts_client_t *cl, ts_client_req_kind_t kind, uint64_t retry_of,
                    ts_client_req_t *q) {
  static float w[N];
  static const float *grad[1];
  static float *dst[1] = {w};
  grad[0] = ones();
  ts_client_req_init(q, kind);
  q->grad = grad;
  q->dst = dst;
  q->retry_of = retry_of;
  return ts_client_run(cl, q);
}

static void test_library_retry(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_client_t *cl = start(&c, 1, 2);
  ts_client_req_t q, r;

  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, 0, &q), 0);
  assert_int_equal(q.applied, PARTS);
  assert_true(q.push_id > 0);
  expect_all(cl, -1.0f);
  /* The same push again, as a retry: every partition had it. */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id, &r), 0);
  assert_int_equal(r.push_id, q.push_id);
  assert_int_equal(r.applied, 0);
  assert_int_equal(r.duplicate, PARTS);
  expect_all(cl, -1.0f);
  /* A new push is applied, with a new id. */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, 0, &r), 0);
  assert_true(r.push_id > q.push_id);
  assert_int_equal(r.applied, PARTS);
  expect_all(cl, -2.0f);
  /* A push_pull retried as a push (what ps-worker does when its push part failed). */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH_PULL, 0, &q), 0);
  assert_int_equal(q.applied, PARTS);
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id, &r), 0);
  assert_int_equal(r.duplicate, PARTS);
  expect_all(cl, -3.0f);
  /* An id this client never gave is refused, and nothing is sent. */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id + 100, &r), TS_CLIENT_EINVAL);
  assert_non_null(strstr(r.errmsg, "retry_of"));
  expect_all(cl, -3.0f);

  /* Another client of the same task (a restarted worker) numbers from 1 again: its pushes
   * are its own, not taken for the first one's. */
  ts_client_t *cl2 = open_client(&c);
  assert_int_equal(lib_push(cl2, TS_CLIENT_PUSH, 0, &r), 0);
  assert_int_equal(r.push_id, 1);
  assert_int_equal(r.applied, PARTS);
  expect_all(cl, -4.0f);
  ts_client_close(cl2);

  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Send a push of gradient g over parts [0, n) of w with (incarnation, id). */
static void raw_push(int fd, uint64_t request_id, uint64_t incarnation, uint64_t id, size_t n,
                     float g) {
  Tessera__PartSlice sl[PARTS], *slp[PARTS];
  ts_raw_slices(sl, slp, NULL, n, PART_FLOATS);
  Tessera__Push m = TESSERA__PUSH__INIT;
  m.request_id = request_id;
  m.n_parts = n;
  m.parts = slp;
  m.push_id = id;
  m.client_incarnation = incarnation;
  /* One send of the whole frame: a header sent apart from its payload would wait for
   * the delayed ACK (Nagle) on every push. */
  static uint8_t frame[8192 + N * sizeof(float)];
  size_t len =
      ts_msg_encode(TS_MSG_PUSH, &m.base, (uint64_t)n * PART_FLOATS * sizeof(float), frame);
  assert_true(len > 0 && len <= 8192);
  static float payload[N];
  for (size_t i = 0; i < n * PART_FLOATS; i++) payload[i] = g;
  memcpy(frame + len, payload, n * PART_FLOATS * sizeof(float));
  ts_raw_send_all(fd, frame, len + n * PART_FLOATS * sizeof(float));
}

/* Read a PushReply; its results go to res (n of them). */
static void raw_reply(int fd, Tessera__PushResult *res, size_t n) {
  uint8_t meta[4096];
  uint32_t len = 0;
  int type = ts_raw_read_frame(fd, meta, &len);
  if (type != TS_MSG_PUSH_REPLY) {
    char *log = ts_cluster_log(cur, 0);
    fprintf(stderr, "shard log:\n%s\n", log ? log : "(none)");
    free(log);
    fail_msg("frame type %d, want a PUSH_REPLY", type);
  }
  Tessera__PushReply *r = tessera__push_reply__unpack(NULL, len, meta);
  assert_non_null(r);
  assert_int_equal(r->n_results, n);
  for (size_t i = 0; i < n; i++) res[i] = r->results[i];
  tessera__push_reply__free_unpacked(r, NULL);
}

static void expect_results(int fd, size_t n, Tessera__PushResult want0, size_t k,
                           Tessera__PushResult rest) {
  Tessera__PushResult res[PARTS];
  raw_reply(fd, res, n);
  for (size_t i = 0; i < n; i++) assert_int_equal(res[i], i < k ? want0 : rest);
}

#define APPLIED TESSERA__PUSH_RESULT__PUSH_APPLIED
#define DUPLICATE TESSERA__PUSH_RESULT__PUSH_DUPLICATE

static void test_wire_retry(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_client_t *cl = start(&c, 1, 2);
  const uint64_t X = 0x1234567890abcdefu, Y = 0xfedcba0987654321u;

  /* The push is sent and its connection closed before the reply is read: the shard
   * applies it (its bytes were all in) and cannot answer. */
  int fd = ts_raw_worker(c.port[0], 0, "retry");
  assert_true(fd >= 0);
  raw_push(fd, 2, X, 7, PARTS, 1.0f);
  close(fd);
  wait_all(cl, -1.0f);
  /* The retry, on a new connection: every partition answers duplicate. */
  fd = ts_raw_worker(c.port[0], 0, "retry");
  assert_true(fd >= 0);
  raw_push(fd, 2, X, 7, PARTS, 1.0f);
  expect_results(fd, PARTS, DUPLICATE, PARTS, DUPLICATE);
  expect_all(cl, -1.0f);
  /* The same id from another incarnation (a restarted worker) is another push. */
  raw_push(fd, 3, Y, 7, PARTS, 1.0f);
  expect_results(fd, PARTS, APPLIED, PARTS, APPLIED);
  expect_all(cl, -2.0f);
  /* An older id this client never had applied (a retry that comes after a later push) is
   * applied, once. */
  raw_push(fd, 4, X, 6, PARTS, 1.0f);
  expect_results(fd, PARTS, APPLIED, PARTS, APPLIED);
  raw_push(fd, 5, X, 6, PARTS, 1.0f);
  expect_results(fd, PARTS, DUPLICATE, PARTS, DUPLICATE);
  expect_all(cl, -3.0f);
  /* Applied to half of its partitions (a connection lost half way through a push), then
   * repeated whole: the other half is applied. */
  raw_push(fd, 6, X, 8, PARTS / 2, 1.0f);
  expect_results(fd, PARTS / 2, APPLIED, PARTS / 2, APPLIED);
  raw_push(fd, 7, X, 8, PARTS, 1.0f);
  expect_results(fd, PARTS, DUPLICATE, PARTS / 2, APPLIED);
  expect_all(cl, -4.0f);
  /* Pushes without an id (older clients) are applied every time, as before. */
  raw_push(fd, 8, 0, 0, PARTS, 1.0f);
  expect_results(fd, PARTS, APPLIED, PARTS, APPLIED);
  raw_push(fd, 9, 0, 0, PARTS, 1.0f);
  expect_results(fd, PARTS, APPLIED, PARTS, APPLIED);
  expect_all(cl, -6.0f);
  close(fd);

  /* Counted per push (4 pushes had duplicates), per partition, and logged. */
  assert_true(ts_metric_wait(c.http_port[0], "tessera_ps_push_duplicates_total", 3, 3) == 3);
  assert_true(ts_metric_wait(c.http_port[0],
                             "tessera_ps_pushed_partitions_total{result=\"duplicate\"}", 10,
                             10) == 10);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(log);
  assert_non_null(strstr(log, "was already applied to 4 of its 4 partitions: not applied again"));
  free(log);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_bounded(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_client_t *cl = start(&c, 1, 2);
  ts_client_req_t q, r;
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, 0, &q), 0);
  expect_all(cl, -1.0f);
  long rss0 = ts_proc_rss_kib(c.pid[0]);

  /* Task 1 sends zero gradients (so the values stay exact) under thousands of fresh
   * incarnations, and thousands of ids under one. */
  int fd = ts_raw_worker(c.port[0], 1, "flood");
  assert_true(fd >= 0);
  const int K = 3000;
  for (int k = 1; k <= K; k++) {
    raw_push(fd, (uint64_t)k, 0x9E3779B97F4A7C15u * (uint64_t)k, (uint64_t)k, 1, 0.0f);
    expect_results(fd, 1, APPLIED, 1, APPLIED);
  }
  for (int k = 1; k <= K; k++) {
    raw_push(fd, (uint64_t)(K + k), 42, (uint64_t)k, 1, 0.0f);
    expect_results(fd, 1, APPLIED, 1, APPLIED);
  }
  close(fd);

  /* 2 tasks x server.push_dedup_clients (4) slots, each at most 16 bytes a partition plus
   * its own small header: a few KiB whatever was sent. */
  double bytes =
      ts_metric_wait(c.http_port[0], "tessera_ps_push_dedup_bytes", 1, 2.0 * 4 * (64 + PARTS * 16));
  assert_true(bytes > 0 && bytes <= 2.0 * 4 * (64 + PARTS * 16));
  assert_true(ts_metric_wait(c.http_port[0], "tessera_ps_push_dedup_evictions_total", K - 3,
                             K - 3) == K - 3);
  long rss1 = ts_proc_rss_kib(c.pid[0]);
  if (rss0 > 0 && rss1 > 0) assert_true(rss1 - rss0 < 64 * 1024);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(log);
  assert_non_null(strstr(log, "task 1 has more than server.push_dedup_clients (4) clients"));
  free(log);

  /* Task 0's client was not evicted by task 1's: its retry is still recognised. */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id, &r), 0);
  assert_int_equal(r.duplicate, PARTS);
  expect_all(cl, -1.0f);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Two shards; shard 1 is killed while a push is in flight: shard 0 applies it, the push
 * fails. The retry, once shard 1 is back (fresh, without a checkpoint), goes to shard 1
 * only: shard 0 answered the first attempt. */
static void test_retry_skips_answered_shards(void **state) {
  (void)state;
  ts_cluster_t c;
  ts_client_t *cl = start(&c, 2, 1);
  size_t on0 = tc_shard_parts(cl, 0), on1 = tc_shard_parts(cl, 1);
  assert_true(on0 > 0 && on1 > 0 && on0 + on1 == PARTS);
  ts_cluster_signal(&c, 1, SIGKILL);
  for (double t0 = ts_now_s(); ts_client_shard_up(cl, 1, NULL, 0) && ts_now_s() - t0 < 5;)
    ts_sleep_ms(20);
  assert_false(ts_client_shard_up(cl, 1, NULL, 0));

  static const float *grad[1];
  grad[0] = ones();
  ts_client_req_t q, r;
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  q.grad = grad;
  q.timeout_s = 1.0;
  int rc = ts_client_run(cl, &q);
  assert_true(rc == TS_CLIENT_ETIMEDOUT || rc == TS_CLIENT_EUNAVAIL || rc == TS_CLIENT_ECLOSED);
  assert_true(q.push_id > 0);
  assert_int_equal(q.applied, on0);

  assert_int_equal(ts_cluster_start_shard(&c, 1), 0);
  for (double t0 = ts_now_s(); !ts_client_shard_up(cl, 1, NULL, 0) && ts_now_s() - t0 < 10;)
    ts_sleep_ms(20);
  assert_true(ts_client_shard_up(cl, 1, NULL, 0));
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id, &r), 0);
  assert_int_equal(r.push_id, q.push_id);
  assert_int_equal(r.applied, on1);
  assert_int_equal(r.duplicate, 0);
  expect_all(cl, -1.0f);
  /* Once it succeeded it is forgotten: a further retry goes everywhere, and every shard
   * answers duplicate. */
  assert_int_equal(lib_push(cl, TS_CLIENT_PUSH, q.push_id, &r), 0);
  assert_int_equal(r.duplicate, PARTS);
  expect_all(cl, -1.0f);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library_retry),
      cmocka_unit_test(test_wire_retry),
      cmocka_unit_test(test_bounded),
      cmocka_unit_test(test_retry_skips_answered_shards),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
