/*
 * The request API of include/tessera/client.h: several requests in flight on one client
 * (per-tensor pushes as backpropagation produces them, pulls pipelined behind pushes),
 * completion callbacks, and the contract of ts_client_submit / ts_client_wait /
 * ts_client_run on invalid arguments. Real ps-server shards on loopback ports; exact values
 * (sgd with learning_rate 1: parameters = init - the sum of the gradients, all dyadic).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

#define NT 3
static const uint64_t shape0[] = {12, 10}, shape1[] = {10}, shape2[] = {10, 3};
static const ts_client_tensor_t model[NT] = {
    {.name = "fc1/weights", .shape = shape0, .rank = 2, .init = TS_CLIENT_INIT_ZEROS},
    {.name = "fc1/biases", .shape = shape1, .rank = 1, .init = TS_CLIENT_INIT_ONES},
    {.name = "fc2/weights", .shape = shape2, .rank = 2, .init = TS_CLIENT_INIT_ZEROS},
};
static const size_t elems[NT] = {120, 10, 30};
static const float init_value[NT] = {0.0f, 1.0f, 0.0f};

static ts_client_t *open_client(ts_cluster_t *c, bool declare) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.identity = "test_requests";
  o.request_timeout_s = 20;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, declare ? model : NULL, NT, 7), 0);
  return cl;
}

/* Gradient of round r for element k of tensor t: dyadic, distinct per tensor and round. */
static float grad_value(int r, int t, size_t k) {
  return 0.25f * (float)(r + 1) + 0.125f * (float)t + 0.0625f * (float)(k % 4);
}

typedef struct {
  atomic_int done;
  atomic_int failed;
  atomic_int on_client_thread_refused;
  ts_client_t *cl;
} cb_state_t;

static void on_done(ts_client_req_t *req, void *arg) {
  cb_state_t *s = arg;
  if (req->rc != 0) {
    fprintf(stderr, "callback: %s\n", req->errmsg);
    atomic_fetch_add(&s->failed, 1);
  }
  /* Blocking calls are refused on the client thread instead of deadlocking. */
  ts_client_req_t other;
  ts_client_req_init(&other, TS_CLIENT_PULL);
  char err[128];
  if (ts_client_run(s->cl, &other) == TS_CLIENT_EINVAL &&
      ts_client_heartbeat(s->cl, err, sizeof err) == TS_CLIENT_EINVAL)
    atomic_fetch_add(&s->on_client_thread_refused, 1);
  atomic_fetch_add(&s->done, 1);
}

/* Four rounds of per-tensor pushes (12 requests), all in flight at once on one client,
 * half completing through callbacks and half waited for; then a pull. Two shards, several
 * partitions per tensor. */
static void test_per_tensor_pushes_in_flight(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; partition_bytes = 64; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *cl = open_client(&c, true);
  assert_int_equal(ts_client_num_tensors(cl), NT);
  assert_true(ts_client_num_parts(cl) > NT);
  assert_true(tc_shard_parts(cl, 0) > 0 && tc_shard_parts(cl, 1) > 0);
  enum { R = 4 };
  float *g[R][NT];
  static const uint32_t tensor_index[NT] = {0, 1, 2};
  ts_client_req_t req[R][NT];
  cb_state_t cbs = {.cl = cl};
  for (int r = 0; r < R; r++) {
    for (int t = 0; t < NT; t++) {
      g[r][t] = malloc(elems[t] * sizeof(float));
      for (size_t k = 0; k < elems[t]; k++) g[r][t][k] = grad_value(r, t, k);
    }
  }
  /* Backward order: last tensor first. */
  for (int r = 0; r < R; r++) {
    for (int t = NT - 1; t >= 0; t--) {
      ts_client_req_t *q = &req[r][t];
      ts_client_req_init(q, TS_CLIENT_PUSH);
      q->grad = (const float *const *)g[r];
      q->tensors = &tensor_index[t];
      q->num_tensors = 1;
      q->step = (uint64_t)r;
      bool with_cb = (r + t) % 2 == 0;
      assert_int_equal(ts_client_submit(cl, q, with_cb ? on_done : NULL, &cbs), 0);
    }
  }
  for (int r = 0; r < R; r++) {
    for (int t = 0; t < NT; t++) {
      if ((r + t) % 2 == 0) continue;
      int rc = ts_client_wait(cl, &req[r][t]);
      if (rc < 0) fprintf(stderr, "push %d/%d: %s\n", r, t, req[r][t].errmsg);
      assert_int_equal(rc, 0);
      assert_int_equal(req[r][t].applied, tc_tensor_parts(cl, (uint32_t)t));
      assert_int_equal(req[r][t].stale + req[r][t].duplicate + req[r][t].accumulated, 0);
    }
  }
  /* The callbacks ran on the client thread, where blocking calls are refused. */
  for (int i = 0; i < 500 && atomic_load(&cbs.done) < R * NT / 2; i++) usleep(10000);
  assert_int_equal(atomic_load(&cbs.done), R * NT / 2);
  assert_int_equal(atomic_load(&cbs.failed), 0);
  assert_int_equal(atomic_load(&cbs.on_client_thread_refused), R * NT / 2);
  for (int r = 0; r < R; r++)
    for (int t = 0; t < NT; t++)
      if ((r + t) % 2 == 0) assert_int_equal(req[r][t].applied, tc_tensor_parts(cl, (uint32_t)t));

  float *w[NT];
  for (int t = 0; t < NT; t++) w[t] = calloc(elems[t], sizeof(float));
  ts_client_req_t pull;
  ts_client_req_init(&pull, TS_CLIENT_PULL);
  pull.dst = w;
  assert_int_equal(ts_client_run(cl, &pull), 0);
  assert_int_equal(pull.version, R);
  for (int t = 0; t < NT; t++) {
    for (size_t k = 0; k < elems[t]; k++) {
      float want = init_value[t];
      for (int r = 0; r < R; r++) want -= grad_value(r, t, k);
      if (w[t][k] != want) fail_msg("tensor %d element %zu: %g, want %g", t, k, (double)w[t][k], (double)want);
    }
  }
  for (int t = 0; t < NT; t++) free(w[t]);
  for (int r = 0; r < R; r++)
    for (int t = 0; t < NT; t++) free(g[r][t]);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A pull submitted right behind a push of the same tensor, without waiting for the push,
 * sees it applied: each shard handles a connection's frames in order. Also a partition
 * subset and a push+pull of one tensor. */
static void test_pull_pipelined_behind_push(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; partition_bytes = 64; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *cl = open_client(&c, true);
  float *g[NT], *w[NT];
  for (int t = 0; t < NT; t++) {
    g[t] = malloc(elems[t] * sizeof(float));
    w[t] = calloc(elems[t], sizeof(float));
    for (size_t k = 0; k < elems[t]; k++) g[t][k] = 0.5f;
  }
  static const uint32_t first[] = {0};
  for (int round = 1; round <= 3; round++) {
    ts_client_req_t push, pull;
    ts_client_req_init(&push, TS_CLIENT_PUSH);
    push.grad = (const float *const *)g;
    push.tensors = first;
    push.num_tensors = 1;
    ts_client_req_init(&pull, TS_CLIENT_PULL);
    pull.dst = w;
    pull.tensors = first;
    pull.num_tensors = 1;
    assert_int_equal(ts_client_submit(cl, &push, NULL, NULL), 0);
    assert_int_equal(ts_client_submit(cl, &pull, NULL, NULL), 0);
    assert_int_equal(ts_client_wait(cl, &pull), 0);
    assert_int_equal(ts_client_wait(cl, &push), 0);
    assert_int_equal(ts_client_wait(cl, &push), 0); /* done: returns at once, again */
    assert_int_equal(pull.version, (uint64_t)round);
    for (size_t k = 0; k < elems[0]; k++) assert_true(w[0][k] == -0.5f * (float)round);
  }
  /* Only partition 0 of tensor 2 moves. */
  ts_client_part_t p;
  size_t k2 = 0;
  while (ts_client_part(cl, k2, &p) == 0 && p.tensor != 2) k2++;
  assert_int_equal(p.tensor, 2);
  assert_true(p.count < elems[2]);
  tc_result_t res;
  char err[256];
  assert_int_equal(tc_push_parts(cl, (const float *const *)g, &k2, 1, 0, &res, err, sizeof err), 0);
  assert_int_equal(res.applied, 1);
  static const uint32_t third[] = {2};
  ts_client_req_t pp;
  ts_client_req_init(&pp, TS_CLIENT_PUSH_PULL);
  pp.grad = (const float *const *)g;
  pp.dst = w;
  pp.tensors = third;
  pp.num_tensors = 1;
  assert_int_equal(ts_client_run(cl, &pp), 0);
  assert_int_equal(pp.push_rc, 0);
  assert_int_equal(pp.pull_rc, 0);
  assert_int_equal(pp.applied, tc_tensor_parts(cl, 2));
  for (size_t k = 0; k < elems[2]; k++) {
    float want = k >= p.offset && k < p.offset + p.count ? -1.0f : -0.5f;
    if (w[2][k] != want) fail_msg("element %zu: %g, want %g", k, (double)w[2][k], (double)want);
  }
  for (int t = 0; t < NT; t++) {
    free(g[t]);
    free(w[t]);
  }
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void expect_refused(ts_client_t *cl, ts_client_req_t *q, int want, const char *what) {
  int rc = ts_client_submit(cl, q, NULL, NULL);
  if (rc != want) fail_msg("%s: submit returned %d, want %d", what, rc, want);
  assert_int_equal(q->rc, want);
  assert_true(q->errmsg[0] != 0);
  /* Refused: nothing to wait for. */
  assert_int_equal(ts_client_wait(cl, q), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_run(cl, q), want);
}

/* Arguments checked by submit, wait and run (no shard needed for most). */
static void test_invalid_arguments(void **state) {
  (void)state;
  /* Without a client at all. */
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PULL);
  assert_int_equal(ts_client_submit(NULL, NULL, NULL, NULL), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_submit(NULL, &q, NULL, NULL), TS_CLIENT_EINVAL);
  assert_int_equal(q.rc, TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_wait(NULL, &q), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_run(NULL, &q), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_run(NULL, NULL), TS_CLIENT_EINVAL);
  ts_client_t *none = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&none, NULL, err, sizeof err), TS_CLIENT_EINVAL);
  ts_client_opts_t o;
  memset(&o, 0, sizeof o); /* not initialised: struct_size 0 */
  assert_int_equal(ts_client_open(&none, &o, err, sizeof err), TS_CLIENT_EINVAL);
  assert_null(none);
  ts_client_opts_init(&o);
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(ts_client_open(&none, &o, err, sizeof err), TS_CLIENT_EINVAL); /* no shards */
  char version[32];
  snprintf(version, sizeof version, "%d.%d.%d", TESSERA_VERSION_MAJOR, TESSERA_VERSION_MINOR,
           TESSERA_VERSION_PATCH);
  assert_string_equal(tessera_version(), version);
  assert_string_equal(ts_client_strerror(TS_CLIENT_ETIMEDOUT), "timed out");
  assert_string_equal(ts_client_mode_name(TS_CLIENT_MODE_SSP), "ssp");

  /* Sync mode, one worker: a pull of a version nobody makes waits (long poll). */
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"sync\"; partition_bytes = 64; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *cl = open_client(&c, false);
  float *g[NT], *w[NT];
  for (int t = 0; t < NT; t++) {
    g[t] = calloc(elems[t], sizeof(float));
    w[t] = calloc(elems[t], sizeof(float));
  }
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = w;
  expect_refused(cl, &q, TS_CLIENT_ENOTDECLARED, "before declare");
  assert_int_equal(ts_client_num_parts(cl), 0);
  assert_int_equal(ts_client_declare(cl, model, NT, 7, err, sizeof err), 0);

  ts_client_req_t bad;
  ts_client_req_init(&bad, TS_CLIENT_PULL);
  bad.struct_size = 0;
  assert_int_equal(ts_client_submit(cl, &bad, NULL, NULL), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_wait(cl, &bad), TS_CLIENT_EINVAL);

  ts_client_req_init(&q, (ts_client_req_kind_t)9);
  q.dst = w;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "bad kind");
  ts_client_req_init(&q, TS_CLIENT_PULL);
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "pull without dst");
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "push without grad");
  float *holes[NT] = {w[0], NULL, w[2]};
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = holes;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "a tensor without a buffer");
  static const uint32_t t1[] = {1}, t_bad[] = {3}, t_twice[] = {0, 0};
  q.tensors = t1; /* only tensor 1, whose buffer is missing */
  q.num_tensors = 1;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "the covered tensor without a buffer");
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = w;
  q.tensors = t_bad;
  q.num_tensors = 1;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "tensor out of range");
  q.tensors = t_twice;
  q.num_tensors = 2;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "tensor twice");
  size_t part_bad = ts_client_num_parts(cl);
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  q.grad = (const float *const *)g;
  q.parts = &part_bad;
  q.num_parts = 1;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "partition out of range");
  q.tensors = t1;
  q.num_tensors = 1;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "tensors and parts");
  /* push+pull whose gradient and destination overlap */
  ts_client_req_init(&q, TS_CLIENT_PUSH_PULL);
  q.grad = (const float *const *)w;
  q.dst = w;
  expect_refused(cl, &q, TS_CLIENT_EINVAL, "overlap");
  assert_int_equal(q.push_rc, TS_CLIENT_EINVAL);
  assert_int_equal(q.pull_rc, TS_CLIENT_EINVAL);
  assert_non_null(strstr(q.errmsg, "overlap"));

  /* A request in flight: submitting it again is EBUSY and leaves it alone; its own
   * deadline ends it. */
  ts_client_req_t wait_far;
  ts_client_req_init(&wait_far, TS_CLIENT_PULL);
  wait_far.dst = w;
  wait_far.min_version = 1000;
  wait_far.timeout_s = 0.5;
  assert_int_equal(ts_client_submit(cl, &wait_far, NULL, NULL), 0);
  assert_int_equal(ts_client_submit(cl, &wait_far, NULL, NULL), TS_CLIENT_EBUSY);
  assert_int_equal(ts_client_run(cl, &wait_far), TS_CLIENT_EBUSY);
  assert_int_equal(ts_client_wait(cl, &wait_far), TS_CLIENT_ETIMEDOUT);
  assert_non_null(strstr(wait_far.errmsg, "no answer within 0.5 s"));
  assert_non_null(strstr(wait_far.errmsg, c.addr[0])); /* the shard, by address too */
  /* With a callback: not waitable; close fails it and runs the callback first. */
  cb_state_t cbs = {.cl = cl};
  ts_client_req_t with_cb;
  ts_client_req_init(&with_cb, TS_CLIENT_PULL);
  with_cb.dst = w;
  with_cb.min_version = 1000;
  assert_int_equal(ts_client_submit(cl, &with_cb, on_done, &cbs), 0);
  assert_int_equal(ts_client_wait(cl, &with_cb), TS_CLIENT_EINVAL);
  /* Interrupt: what is in flight fails, later submits are refused. */
  ts_client_req_t far2;
  ts_client_req_init(&far2, TS_CLIENT_PULL);
  far2.dst = w;
  far2.min_version = 1000;
  assert_int_equal(ts_client_submit(cl, &far2, NULL, NULL), 0);
  ts_client_interrupt(cl);
  assert_int_equal(ts_client_wait(cl, &far2), TS_CLIENT_ESHUTDOWN);
  ts_client_req_init(&q, TS_CLIENT_PULL);
  q.dst = w;
  expect_refused(cl, &q, TS_CLIENT_ESHUTDOWN, "after interrupt");
  ts_client_close(cl);
  assert_int_equal(atomic_load(&cbs.done), 1);
  assert_int_equal(atomic_load(&cbs.failed), 1); /* ESHUTDOWN */
  assert_int_equal(with_cb.rc, TS_CLIENT_ESHUTDOWN);
  for (int t = 0; t < NT; t++) {
    free(g[t]);
    free(w[t]);
  }
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- a request that ends early gives its memory back ----------------------------------- */

/* A large push to a stopped shard times out with most of its payload still queued; the
 * caller, told it is done, reuses the gradient buffer at once. The shard, resumed, must
 * never see those new values: the client closes the connection before handing the buffer
 * back, so the shard gets half a push and a close (and applies nothing of it). Without
 * that, the rest of the push would go out of the reused buffer and be applied. */
typedef struct {
  atomic_int done;
  float *buf;
  size_t n;
  float refill;
} reuse_t;

static void on_done_reuse(ts_client_req_t *req, void *arg) {
  (void)req;
  reuse_t *u = arg;
  for (size_t i = 0; i < u->n; i++) u->buf[i] = u->refill;
  atomic_store(&u->done, 1);
}

static void test_abandoned_push_releases_buffer(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"async\"; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *cl = open_client(&c, false);
  static const uint64_t big_shape[] = {UINT64_C(16) << 20}; /* 64 MiB of floats */
  const ts_client_tensor_t big = {.name = "big", .shape = big_shape, .rank = 1,
                                  .init = TS_CLIENT_INIT_ONES};
  char err[512];
  assert_int_equal(ts_client_declare(cl, &big, 1, 7, err, sizeof err), 0);
  size_t n = (size_t)big_shape[0];
  float *g = calloc(n, sizeof *g); /* zeros: pushing them changes nothing */
  assert_non_null(g);
  ts_cluster_signal(&c, 0, SIGSTOP);
  reuse_t u = {.buf = g, .n = n, .refill = 1000.0f};
  const float *const grads[1] = {g};
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH);
  q.grad = grads;
  q.timeout_s = 0.3;
  assert_int_equal(ts_client_submit(cl, &q, on_done_reuse, &u), 0);
  while (!atomic_load(&u.done)) usleep(1000);
  assert_int_equal(q.rc, TS_CLIENT_ETIMEDOUT);
  ts_cluster_signal(&c, 0, SIGCONT);
  /* The client reconnects; every parameter is still its initial 1. */
  float *w = malloc(n * sizeof *w);
  assert_non_null(w);
  float *const dst[1] = {w};
  int rc = -1;
  for (int i = 0; i < 100 && rc != 0; i++) {
    rc = tc_pull(cl, dst, 0, 0, NULL, err, sizeof err);
    if (rc != 0) usleep(50 * 1000);
  }
  assert_int_equal(rc, 0);
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) changed += w[i] != 1.0f;
  if (changed) fprintf(stderr, "%zu of %zu parameters changed by a push of zeros\n", changed, n);
  assert_int_equal(changed, 0);
  free(w);
  free(g);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_per_tensor_pushes_in_flight),
      cmocka_unit_test(test_pull_pipelined_behind_push),
      cmocka_unit_test(test_invalid_arguments),
      cmocka_unit_test(test_abandoned_push_releases_buffer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
