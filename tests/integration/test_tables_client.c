/*
 * Embedding tables through the client library (include/tessera/client.h, TS_CLIENT_SPARSE_*)
 * against real ps-server shards on loopback ports:
 *
 *   - rows in the caller's key order, duplicates and negative ids included, each equal to
 *     its first value from (seed, table, key) (proto/ts_key.h), on any shard count;
 *   - a push sums a key's duplicate gradients (SGD with learning rate 1 and dyadic values:
 *     exact);
 *   - sync exactness: 2 workers with batch B against 1 worker with batch 2B, Zipf keys with
 *     duplicates, for each row optimizer (SGD, Adagrad, Adam, FTRL), 12 steps: the tables
 *     equal within a relative 1e-6;
 *   - the request's own errors: an unknown table, no buffers, overlapping buffers;
 *   - requests in flight together, waited for out of order, on two threads, beside a request
 *     with a callback: each one's rows in its caller's places.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
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
#include "ts_init.h"
#include "ts_key.h"

#define SEED 11
#define DIM 8
#define VOCAB 500
#define BATCH 48 /* per worker */
#define STEPS 12

static ts_client_t *open_tables(ts_cluster_t *c, const ts_client_table_t *tables, size_t n,
                                int task) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.identity = "test_tables_client";
  o.task = task;
  o.request_timeout_s = 20;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open_tables(&cl, &o, tables, n, SEED), 0);
  assert_int_equal(ts_client_num_tables(cl), n);
  return cl;
}

static int sparse(ts_client_t *cl, ts_client_req_kind_t kind, uint32_t table, const int64_t *keys,
                  size_t n, const float *grad, float *dst, uint64_t retry_of,
                  ts_client_req_t *out) {
  ts_client_req_t req;
  ts_client_req_init(&req, kind);
  req.table = table;
  req.keys = keys;
  req.num_keys = n;
  req.rows_grad = grad;
  req.rows_dst = dst;
  req.step = TS_CLIENT_STEP_PULLED;
  /* A retry's duplicate moves no version: its pull must not wait for the next. */
  req.min_version = kind == TS_CLIENT_SPARSE_PUSH_PULL && !retry_of ? TS_CLIENT_VERSION_NEXT : 0;
  req.retry_of = retry_of;
  int rc = ts_client_run(cl, &req);
  if (rc != 0) fprintf(stderr, "sparse request %d: %s\n", (int)kind, req.errmsg);
  if (out) *out = req;
  return rc;
}

/* psctl tables, as an operator reads it: the table's rows and rows made over the shards
 * (-o json), and its line in the table form. */
static void check_psctl_tables(const ts_cluster_t *c, int rows) {
  static char out[16384], err[4096];
  const char *json[] = {ts_psctl_path, "-c", c->config, "tables", "-o", "json", NULL};
  assert_int_equal(ts_run_capture(json, out, sizeof out, err, sizeof err), 0);
  char want[64];
  snprintf(want, sizeof want, "\"rows\": %d", rows);
  if (!strstr(out, "\"name\": \"emb/users\"") || !strstr(out, want) ||
      !strstr(out, "\"shards\":") || !strstr(out, "\"hot_keys\": [\n") || !strstr(out, "\"42\""))
    fail_msg("psctl tables -o json: %s", out);
  const char *table[] = {ts_psctl_path, "-c", c->config, "tables", NULL};
  assert_int_equal(ts_run_capture(table, out, sizeof out, err, sizeof err), 0);
  if (!strstr(out, "TABLE") || !strstr(out, "emb/users") || !strstr(out, "all") ||
      !strstr(out, "HOT8") || !strstr(out, "%"))
    fail_msg("psctl tables: %s", out);
  /* --interval: two samples, the rates per second. */
  const char *rated[] = {ts_psctl_path, "-c", c->config, "tables", "--interval", "0.2", "-o", "json",
                         NULL};
  assert_int_equal(ts_run_capture(rated, out, sizeof out, err, sizeof err), 0);
  if (!strstr(out, "\"created_per_s\": 0") || !strstr(out, "\"pulled_rows_per_s\""))
    fail_msg("psctl tables --interval 0.2 -o json: %s", out);
}

/* Rows come back in the caller's order, each its first value, on 1 and 3 shards alike. */
static void test_rows_in_caller_order(void **state) {
  (void)state;
  static const int64_t keys[] = {42, -7, 1000000007, 42, 0, -7, INT64_MIN, INT64_MAX, 3, 42};
  const size_t n = sizeof keys / sizeof keys[0];
  const ts_client_table_t table = {.name = "emb/users", .dim = DIM, .init = TS_CLIENT_ROW_UNIFORM,
                                   .init_param = 0.05, .optimizer = TS_CLIENT_ROWOPT_SGD};
  float first[10 * DIM];
  for (int shards = 1; shards <= 3; shards += 2) {
    ts_cluster_t c;
    assert_int_equal(ts_cluster_start(&c, shards, 1, "job = { mode = \"async\"; };"), 0);
    ts_client_t *cl = open_tables(&c, &table, 1, 0);
    float rows[10 * DIM];
    memset(rows, 0xff, sizeof rows);
    assert_int_equal(sparse(cl, TS_CLIENT_SPARSE_PULL, 0, keys, n, NULL, rows, 0, NULL), 0);
    for (size_t i = 0; i < n; i++) {
      float want[DIM];
      ts_key_row_init(want, DIM, TS_KEY_INIT_UNIFORM, 0.05, ts_init_key(SEED, "emb/users"),
                      (uint64_t)keys[i]);
      assert_memory_equal(rows + i * DIM, want, sizeof want);
    }
    if (shards == 1)
      memcpy(first, rows, sizeof first);
    else
      assert_memory_equal(rows, first, sizeof first); /* the same rows on 3 shards */
    if (shards == 3) {
      /* Key 42 in every pull of a stream of others: the hottest key of its shard. */
      for (int64_t i = 0; i < 400; i++) {
        int64_t two[2] = {42, 1000 + i};
        float r2[2 * DIM];
        assert_int_equal(sparse(cl, TS_CLIENT_SPARSE_PULL, 0, two, 2, NULL, r2, 0, NULL), 0);
      }
      check_psctl_tables(&c, 7 + 400); /* each distinct key made once */
    }
    ts_client_close(cl);
    assert_int_equal(ts_cluster_stop(&c), 0);
  }
}

/* A push sums a key's duplicates: SGD with learning rate 1 moves each row by the sum of its
 * gradients (dyadic values: exact). */
static void test_push_sums_duplicates(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"async\"; };"), 0);
  const ts_client_table_t table = {.name = "emb", .dim = DIM, .init = TS_CLIENT_ROW_ZEROS,
                                   .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = 1.0};
  ts_client_t *cl = open_tables(&c, &table, 1, 0);
  static const int64_t keys[] = {5, 9, 5, -1, 5, 9};
  const size_t n = sizeof keys / sizeof keys[0];
  float grad[6 * DIM], rows[6 * DIM];
  for (size_t i = 0; i < n; i++)
    for (int j = 0; j < DIM; j++) grad[i * DIM + j] = 0.25f * (float)(i + 1) + 0.125f * (float)j;
  ts_client_req_t res;
  assert_int_equal(sparse(cl, TS_CLIENT_SPARSE_PUSH_PULL, 0, keys, n, grad, rows, 0, &res), 0);
  assert_int_equal(res.push_rc, 0);
  assert_int_equal(res.rows_filtered, 0);
  for (size_t i = 0; i < n; i++) {
    for (int j = 0; j < DIM; j++) {
      float sum = 0;
      for (size_t k = 0; k < n; k++)
        if (keys[k] == keys[i]) sum += grad[k * DIM + j];
      assert_true(rows[i * DIM + j] == -sum);
    }
  }
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Many keys in one request (the client's radix sort): 60,000 draws of 40,000 ids spread
 * over the whole int64 range, negative ones included, about 10,000 distinct a shard (each
 * shard's push+pull in 4 frames, their rows put in place as each reply lands); each row
 * moves by exactly the sum of its gradients, and a retry of the push (its pieces sent
 * again, apart from their pulls) moves none again. */
static void test_many_keys(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 3, 1, "job = { mode = \"async\"; };"), 0);
  const ts_client_table_t table = {.name = "emb", .dim = 4, .init = TS_CLIENT_ROW_ZEROS,
                                   .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = 1.0};
  ts_client_t *cl = open_tables(&c, &table, 1, 0);
  enum { N = 60000, IDS = 40000 };
  int64_t *keys = malloc(N * sizeof *keys);
  float *grad = malloc(N * 4 * sizeof *grad), *rows = malloc(N * 4 * sizeof *rows);
  double *sum = calloc(IDS * 4, sizeof *sum);
  uint64_t rng = 12345;
  for (int i = 0; i < N; i++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    int id = (int)(rng % IDS);
    keys[i] = (int64_t)((uint64_t)id * 0x9E3779B97F4A7C15ull); /* any 64 bits */
    for (int j = 0; j < 4; j++) {
      grad[i * 4 + j] = 0.125f * (float)((i + j) % 8);
      sum[id * 4 + j] += (double)grad[i * 4 + j];
    }
  }
  ts_client_req_t res;
  assert_int_equal(sparse(cl, TS_CLIENT_SPARSE_PUSH_PULL, 0, keys, N, grad, rows, 0, &res), 0);
  assert_int_equal(res.applied, 3); /* a shard's pieces count once */
  /* The same push retried (retry_of): every piece of it a duplicate, no row moves again. */
  for (int again = 0; again < 2; again++) {
    if (again) {
      ts_client_req_t q;
      memset(rows, 0, N * 4 * sizeof *rows);
      assert_int_equal(
          sparse(cl, TS_CLIENT_SPARSE_PUSH_PULL, 0, keys, N, grad, rows, res.push_id, &q), 0);
      assert_int_equal(q.applied, 0);
      assert_int_equal(q.duplicate, 3);
    }
    rng = 12345;
    for (int i = 0; i < N; i++) {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      int id = (int)(rng % IDS);
      for (int j = 0; j < 4; j++)
        if (rows[i * 4 + j] != (float)-sum[id * 4 + j])
          fail_msg("key %lld element %d: %g, not %g", (long long)keys[i], j,
                   (double)rows[i * 4 + j], -sum[id * 4 + j]);
    }
  }
  free(keys);
  free(grad);
  free(rows);
  free(sum);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A key on the given shard of n (the first non-negative id found there). */
static int64_t key_on(uint32_t shard, uint32_t n) {
  for (int64_t k = 0;; k++)
    if (ts_key_shard((uint64_t)k, n) == shard) return k;
}

/* ssp (staleness 1) with a table alone: worker 1's pushes reach every shard, its keys or
 * not, so a shard that holds none of its rows still knows its clock. Worker 0, two clocks
 * ahead, waits in its pull of a row of that shard until worker 1 catches up. */
static void test_ssp_bound(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, "job = { mode = \"ssp\"; staleness = 1; };"), 0);
  const ts_client_table_t table = {.name = "emb", .dim = 2, .optimizer = TS_CLIENT_ROWOPT_SGD};
  ts_client_t *w0 = open_tables(&c, &table, 1, 0), *w1 = open_tables(&c, &table, 1, 1);
  int64_t k0 = key_on(0, 2), k1 = key_on(1, 2);
  float g[2] = {0, 0}, row[2];
  ts_client_req_t req;
  for (uint64_t clock = 0; clock < 3; clock++) { /* worker 0 at clock 3 */
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH);
    req.keys = &k1;
    req.num_keys = 1;
    req.rows_grad = g;
    req.step = clock;
    assert_int_equal(ts_client_run(w0, &req), 0);
  }
  /* Worker 1 has pushed nothing: worker 0's pull at clock 3 of a shard-1 row waits. */
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.keys = &k1;
  req.num_keys = 1;
  req.rows_dst = row;
  req.clock = 3;
  req.timeout_s = 0.5;
  assert_int_equal(ts_client_run(w0, &req), TS_CLIENT_ETIMEDOUT);
  /* Worker 1 pushes clocks 0 and 1, its keys on shard 0 only: now within 1 of clock 3 on
   * shard 1 too, and the pull goes through. */
  for (uint64_t clock = 0; clock < 2; clock++) {
    ts_client_req_t p;
    ts_client_req_init(&p, TS_CLIENT_SPARSE_PUSH);
    p.keys = &k0;
    p.num_keys = 1;
    p.rows_grad = g;
    p.step = clock;
    assert_int_equal(ts_client_run(w1, &p), 0);
    assert_int_equal(p.applied, 2); /* both shards: one with k0, one with no key */
  }
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.keys = &k1;
  req.num_keys = 1;
  req.rows_dst = row;
  req.clock = 3;
  req.timeout_s = 5;
  assert_int_equal(ts_client_run(w0, &req), 0);
  ts_client_close(w0);
  ts_client_close(w1);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync exactness ----------------------------------------------------------------- */

/* Key i of worker w's batch at step s: Zipf(1.0) over VOCAB ids, from a fixed stream. */
static int64_t zipf_key(uint64_t *rng, const double *cdf) {
  *rng ^= *rng << 13;
  *rng ^= *rng >> 7;
  *rng ^= *rng << 17;
  double u = (double)(*rng >> 11) / 9007199254740992.0;
  size_t lo = 0, hi = VOCAB - 1;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cdf[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (int64_t)lo * 7919 - 100000; /* spread, some negative */
}

/* The global batch of step s: 2 * BATCH keys; worker w takes [w * BATCH, (w + 1) * BATCH). */
static void step_keys(int s, int64_t *keys) {
  static double cdf[VOCAB];
  if (cdf[VOCAB - 1] == 0) {
    double z = 0;
    for (int k = 0; k < VOCAB; k++) z += 1.0 / (k + 1);
    double acc = 0;
    for (int k = 0; k < VOCAB; k++) cdf[k] = (acc += 1.0 / (k + 1) / z);
  }
  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(s + 1) * 0xD1B54A32D192ED03ull;
  for (int i = 0; i < 2 * BATCH; i++) keys[i] = zipf_key(&rng, cdf);
}

/* The gradient of one occurrence of a key: (row - target) / batch, as a mean loss gives. */
static void occurrence_grad(const float *row, int64_t key, float scale, float *g) {
  for (int j = 0; j < DIM; j++) {
    float target = (float)sin((double)key * 0.001 + j);
    g[j] = (row[j] - target) * scale;
  }
}

typedef struct {
  ts_client_t *cl;
  int worker, workers;
  int rc;
} run_arg_t;

/* Train STEPS sync steps: pull this worker's keys (the step's version), push their
 * gradients, as a training loop does. */
static void *run_worker(void *p) {
  run_arg_t *a = p;
  int64_t all[2 * BATCH];
  int n = a->workers == 1 ? 2 * BATCH : BATCH;
  float *rows = malloc((size_t)n * DIM * sizeof(float));
  float *grad = malloc((size_t)n * DIM * sizeof(float));
  for (int s = 0; s < STEPS && a->rc == 0; s++) {
    step_keys(s, all);
    const int64_t *keys = all + (a->workers == 1 ? 0 : a->worker * BATCH);
    ts_client_req_t req;
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
    req.keys = keys;
    req.num_keys = (size_t)n;
    req.rows_dst = rows;
    req.min_version = TS_CLIENT_VERSION_NEXT;
    if ((a->rc = ts_client_run(a->cl, &req)) != 0) {
      fprintf(stderr, "worker %d step %d pull: %s\n", a->worker, s, req.errmsg);
      break;
    }
    /* Each worker's gradient is its batch's mean: 1/BATCH per occurrence; one worker with
     * the global batch gives 1/(2 BATCH), which is what the shards' average of two gives. */
    float scale = a->workers == 1 ? 0.5f / BATCH : 1.0f / BATCH;
    for (int i = 0; i < n; i++) occurrence_grad(rows + i * DIM, keys[i], scale, grad + i * DIM);
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH);
    req.keys = keys;
    req.num_keys = (size_t)n;
    req.rows_grad = grad;
    req.step = TS_CLIENT_STEP_PULLED;
    if ((a->rc = ts_client_run(a->cl, &req)) != 0 || req.stale || req.duplicate) {
      fprintf(stderr, "worker %d step %d push: rc %d stale %llu duplicate %llu %s\n", a->worker, s,
              a->rc, (unsigned long long)req.stale, (unsigned long long)req.duplicate,
              req.errmsg);
      if (a->rc == 0) a->rc = -1;
    }
  }
  free(rows);
  free(grad);
  return NULL;
}

/* Every key any step touched, and its row after training with `workers` workers. */
static void train(const ts_client_table_t *table, int workers, int64_t *vocab, size_t nvocab,
                  float *out) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, workers, "job = { mode = \"sync\"; };"), 0);
  run_arg_t a[2];
  pthread_t th[2];
  for (int w = 0; w < workers; w++) {
    a[w] = (run_arg_t){.cl = open_tables(&c, table, 1, w), .worker = w, .workers = workers};
  }
  for (int w = 0; w < workers; w++) pthread_create(&th[w], NULL, run_worker, &a[w]);
  for (int w = 0; w < workers; w++) pthread_join(th[w], NULL);
  for (int w = 0; w < workers; w++) assert_int_equal(a[w].rc, 0);
  assert_int_equal(sparse(a[0].cl, TS_CLIENT_SPARSE_PULL, 0, vocab, nvocab, NULL, out, 0, NULL), 0);
  for (int w = 0; w < workers; w++) ts_client_close(a[w].cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_sync_exactness(void **state) {
  (void)state;
  /* The keys the steps touch. */
  int64_t all[2 * BATCH];
  int64_t *vocab = malloc((size_t)STEPS * 2 * BATCH * sizeof *vocab);
  size_t nvocab = 0;
  for (int s = 0; s < STEPS; s++) {
    step_keys(s, all);
    for (int i = 0; i < 2 * BATCH; i++) {
      bool seen = false;
      for (size_t k = 0; k < nvocab && !seen; k++) seen = vocab[k] == all[i];
      if (!seen) vocab[nvocab++] = all[i];
    }
  }
  static const struct {
    ts_client_rowopt_t opt;
    double lr;
    const char *name;
  } opts[] = {{TS_CLIENT_ROWOPT_SGD, 0.5, "sgd"},
              {TS_CLIENT_ROWOPT_ADAGRAD, 0.1, "adagrad"},
              {TS_CLIENT_ROWOPT_ADAM, 0.01, "adam"},
              {TS_CLIENT_ROWOPT_FTRL, 0.1, "ftrl"}};
  float *one = malloc(nvocab * DIM * sizeof(float));
  float *two = malloc(nvocab * DIM * sizeof(float));
  for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
    ts_client_table_t table = {.name = "emb/items", .dim = DIM, .init = TS_CLIENT_ROW_NORMAL,
                               .init_param = 0.1, .optimizer = opts[o].opt,
                               .learning_rate = opts[o].lr, .l1 = 0.001, .l2 = 0.001};
    train(&table, 1, vocab, nvocab, one);
    train(&table, 2, vocab, nvocab, two);
    double worst = 0, moved = 0;
    for (size_t k = 0; k < nvocab * DIM; k++) {
      double d = fabs((double)one[k] - (double)two[k]) / fmax(fabs((double)one[k]), 1e-3);
      if (d > worst) worst = d;
      moved = fmax(moved, fabs((double)one[k]));
    }
    fprintf(stderr, "%s: %zu rows, max relative difference 2x%d vs 1x%d: %.3g\n", opts[o].name,
            nvocab, BATCH, 2 * BATCH, worst);
    assert_true(moved > 0);
    assert_true(worst <= 1e-6);
  }
  free(one);
  free(two);
  free(vocab);
}

/* --- requests in flight together, waited for in any order and on several threads --- */

enum { WN = 30000, WDIM = 4 };

typedef struct {
  ts_client_t *cl;
  ts_client_req_t *req;
  int rc;
} waiter_arg_t;

static void *wait_on(void *arg) {
  waiter_arg_t *a = arg;
  a->rc = ts_client_wait(a->cl, a->req);
  return NULL;
}

static void on_done_flag(ts_client_req_t *req, void *arg) {
  (void)req;
  __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

static void table_req(ts_client_req_t *q, ts_client_req_kind_t kind, const int64_t *keys,
                      const float *grad, float *dst) {
  ts_client_req_init(q, kind);
  q->keys = keys;
  q->num_keys = WN;
  q->rows_grad = kind == TS_CLIENT_SPARSE_PULL ? NULL : grad;
  q->rows_dst = dst;
}

static void check_first_rows(const int64_t *keys, const float *rows, const char *which) {
  uint64_t tkey = ts_init_key(SEED, "emb/w");
  for (size_t i = 0; i < WN; i++) {
    float want[WDIM];
    ts_key_row_init(want, WDIM, TS_KEY_INIT_UNIFORM, 0.05, tkey, (uint64_t)keys[i]);
    if (memcmp(rows + i * WDIM, want, sizeof want) != 0)
      fail_msg("%s: the row of key %lld (place %zu) is not its value", which,
               (long long)keys[i], i);
  }
}

/* Rows land while threads wait, as ps-worker waits: for one request while another's rows
 * land, on two threads at once, and a request with a callback beside them. Pushes of zero
 * gradients (SGD) leave every row its first value, so each row is known; 30,000 keys on
 * 2 shards: each push+pull in 4 frames a shard. */
static void test_requests_waited_in_any_order(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"async\"; };"), 0);
  const ts_client_table_t table = {.name = "emb/w", .dim = WDIM, .init = TS_CLIENT_ROW_UNIFORM,
                                   .init_param = 0.05, .optimizer = TS_CLIENT_ROWOPT_SGD};
  ts_client_t *cl = open_tables(&c, &table, 1, 0);
  int64_t *keys = malloc(WN * sizeof *keys), *back = malloc(WN * sizeof *back);
  float *grad = calloc((size_t)WN * WDIM, sizeof *grad);
  float *rows[4];
  for (int i = 0; i < 4; i++) rows[i] = malloc((size_t)WN * WDIM * sizeof(float));
  uint64_t rng = 99;
  for (size_t i = 0; i < WN; i++) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    keys[i] = (int64_t)((rng % 20000) * 0x9E3779B97F4A7C15ull);
  }
  for (size_t i = 0; i < WN; i++) back[i] = keys[WN - 1 - i];
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < 4; i++) memset(rows[i], 0xff, (size_t)WN * WDIM * sizeof(float));
    ts_client_req_t a, b, d, e;
    table_req(&a, TS_CLIENT_SPARSE_PUSH_PULL, keys, grad, rows[0]);
    table_req(&b, TS_CLIENT_SPARSE_PULL, back, NULL, rows[1]);
    table_req(&d, TS_CLIENT_SPARSE_PUSH_PULL, back, grad, rows[2]);
    table_req(&e, TS_CLIENT_SPARSE_PULL, keys, NULL, rows[3]);
    int e_done = 0;
    assert_int_equal(ts_client_submit(cl, &a, NULL, NULL), 0);
    assert_int_equal(ts_client_submit(cl, &b, NULL, NULL), 0);
    assert_int_equal(ts_client_submit(cl, &d, NULL, NULL), 0);
    assert_int_equal(ts_client_submit(cl, &e, on_done_flag, &e_done), 0);
    /* Another thread waits for d while this one waits for b, then a (done by then). */
    waiter_arg_t w = {cl, &d, -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_on, &w), 0);
    assert_int_equal(ts_client_wait(cl, &b), 0);
    assert_int_equal(ts_client_wait(cl, &a), 0);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    for (int i = 0; i < 20000 && !__atomic_load_n(&e_done, __ATOMIC_ACQUIRE); i++)
      usleep(1000);
    assert_true(__atomic_load_n(&e_done, __ATOMIC_ACQUIRE));
    assert_int_equal(e.rc, 0);
    check_first_rows(keys, rows[0], "push+pull waited for second");
    check_first_rows(back, rows[1], "pull waited for first");
    check_first_rows(back, rows[2], "push+pull waited for on another thread");
    check_first_rows(keys, rows[3], "pull with a callback");
  }
  for (int i = 0; i < 4; i++) free(rows[i]);
  free(keys);
  free(back);
  free(grad);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* The request's own mistakes are refused at submit, nothing sent. */
static void test_refused_requests(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"async\"; };"), 0);
  const ts_client_table_t table = {.name = "emb", .dim = 4};
  ts_client_t *cl = open_tables(&c, &table, 1, 0);
  int64_t keys[3] = {1, 2, 3};
  float rows[12], grad[12] = {0};
  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.table = 1;
  req.keys = keys;
  req.num_keys = 3;
  req.rows_dst = rows;
  assert_int_equal(ts_client_run(cl, &req), TS_CLIENT_ENOTABLE);
  req.table = 0;
  req.rows_dst = NULL;
  assert_int_equal(ts_client_run(cl, &req), TS_CLIENT_EINVAL);
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH_PULL);
  req.keys = keys;
  req.num_keys = 3;
  req.rows_grad = grad;
  req.rows_dst = (float *)grad + 4; /* overlaps */
  assert_int_equal(ts_client_run(cl, &req), TS_CLIENT_EINVAL);
  assert_int_equal(req.push_rc, TS_CLIENT_EINVAL);
  /* A caller built before tables (a request of the old size) gets the dense kinds only. */
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.struct_size = (uint32_t)offsetof(ts_client_req_t, table);
  assert_int_equal(ts_client_run(cl, &req), TS_CLIENT_EINVAL);
  /* A caller built before sparse_flags has every table kind. */
  float row[4];
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.struct_size = (uint32_t)offsetof(ts_client_req_t, sparse_flags);
  req.keys = keys;
  req.num_keys = 1;
  req.rows_dst = row;
  assert_int_equal(ts_client_run(cl, &req), 0);
  /* No keys at all is a request that does nothing, successfully. */
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  assert_int_equal(ts_client_run(cl, &req), 0);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows_in_caller_order),
      cmocka_unit_test(test_push_sums_duplicates),
      cmocka_unit_test(test_many_keys),
      cmocka_unit_test(test_ssp_bound),
      cmocka_unit_test(test_sync_exactness),
      cmocka_unit_test(test_refused_requests),
      cmocka_unit_test(test_requests_waited_in_any_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
