/*
 * Hostile peers against a shard's embedding tables, while a well-behaved worker trains:
 *
 *   - a SparsePush of 10^6 records of one key (not strictly ascending): EINVAL, nothing
 *     applied, the connection kept;
 *   - a SparsePull announcing 10^8 keys: refused by the codec before anything is allocated
 *     (the connection closes);
 *   - unknown tables and a width mismatch: ENOTABLE, ESHAPE;
 *   - unsorted keys and another shard's keys: EINVAL;
 *   - a key flood: 1.5 million distinct keys pulled into a table of their own, 6 x what
 *     server.max_table_bytes holds.
 *
 * Meanwhile the worker (the client library, its own table) takes 30 push+pull steps: each
 * within 2 s, and its rows at the end exactly what replaying its SGD steps in float gives.
 * The shards' tables stay within server.max_table_bytes and their RSS within the budget
 * and a fixed allowance.
 */
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
#include "rawconn.h"
#include "tabraw.h"
#include "tessera/client.h"
#include "ts_err.h"
#include "ts_frame.h"

#define DIM 8
#define GOOD_KEYS 1000
#define STEPS 30
#define BUDGET (8u << 20) /* server.max_table_bytes */
#define FLOOD_KEYS 1500000
#define FLOOD_BATCH 65536

typedef struct {
  ts_cluster_t *c;
  int rc;
  double worst_s;     /* the slowest step */
  int steps_done;
  bool exact;
} good_t;

/* The worker's gradient of step s for element j of its key i: dyadic. */
static float grad_of(int s, int i, int j) { return 0.125f * (float)((s + i + j) % 4 + 1); }

static void *good_worker(void *p) {
  good_t *g = p;
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = g->c->addrs;
  o.num_shards = (size_t)g->c->num_shards;
  o.identity = "test_tables_hostile good worker";
  o.request_timeout_s = 20;
  o.require_all = true;
  ts_client_t *cl = NULL;
  /* The same tables, in the same order, as the hostile peers declare (tabraw's). */
  ts_client_table_t tables[2] = {
      {.name = "good", .dim = DIM, .init = TS_CLIENT_ROW_UNIFORM, .init_param = 0.05,
       .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = 1.0},
      {.name = "flood", .dim = DIM, .init = TS_CLIENT_ROW_UNIFORM, .init_param = 0.05,
       .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = 1.0}};
  if ((g->rc = tc_open_tables(&cl, &o, tables, 2, TT_SEED)) != 0) { /* it said why */
    if (cl) ts_client_close(cl);
    return NULL;
  }
  int64_t keys[GOOD_KEYS];
  for (int i = 0; i < GOOD_KEYS; i++) keys[i] = (int64_t)i * 104729 - 50000;
  static float rows[GOOD_KEYS * DIM], want[GOOD_KEYS * DIM], grad[GOOD_KEYS * DIM];
  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.keys = keys;
  req.num_keys = GOOD_KEYS;
  req.rows_dst = want; /* the rows' first values: the replay starts there */
  if ((g->rc = ts_client_run(cl, &req)) != 0) {
    fprintf(stderr, "good worker: first pull: %s\n", req.errmsg);
    ts_client_close(cl);
    return NULL;
  }
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < GOOD_KEYS; i++)
      for (int j = 0; j < DIM; j++) {
        grad[i * DIM + j] = grad_of(s, i, j);
        want[i * DIM + j] -= grad[i * DIM + j]; /* SGD, learning rate 1, in float */
      }
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH_PULL);
    req.keys = keys;
    req.num_keys = GOOD_KEYS;
    req.rows_grad = grad;
    req.rows_dst = rows;
    double t0 = ts_now_s();
    if ((g->rc = ts_client_run(cl, &req)) != 0) {
      fprintf(stderr, "good worker: step %d: %s\n", s, req.errmsg);
      break;
    }
    double dt = ts_now_s() - t0;
    if (dt > g->worst_s) g->worst_s = dt;
    g->steps_done++;
    ts_sleep_ms(20); /* a worker computes between its steps: the attacks land in between */
  }
  g->exact = g->rc == 0 && memcmp(rows, want, sizeof rows) == 0;
  ts_client_close(cl);
  return NULL;
}

/* A raw worker connection to shard i that has declared the job's tables. */
static int attacker(ts_cluster_t *c, int shard) {
  int fd = tt_worker(c, shard, 1);
  Tessera__TableDecl t[2] = {tt_table_decl("good", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0),
                             tt_table_decl("flood", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0)};
  char detail[256];
  assert_int_equal(tt_declare(fd, t, 2, detail, sizeof detail), 0);
  return fd;
}

static long shard_rss_kib(const ts_cluster_t *c) {
  long most = 0;
  for (int i = 0; i < c->num_shards; i++) {
    long r = ts_proc_rss_kib(c->pid[i]);
    if (r > most) most = r;
  }
  return most;
}

static void test_attacks_while_a_worker_trains(void **state) {
  (void)state;
  ts_cluster_t c;
  char cfg[256];
  snprintf(cfg, sizeof cfg, "job = { mode = \"async\"; };\nserver = { max_table_bytes = %u; };",
           BUDGET);
  assert_int_equal(ts_cluster_start(&c, 2, 2, cfg), 0);
  long rss0 = shard_rss_kib(&c);
  good_t g = {.c = &c};
  pthread_t th;
  pthread_create(&th, NULL, good_worker, &g);
  ts_sleep_ms(300); /* its tables declared and its rows made */
  char detail[256];
  int fd = attacker(&c, 0);

  /* 10^6 records of one key: not strictly ascending. */
  {
    const size_t n = 1000000;
    uint64_t k;
    tt_shard_keys(&k, 1, 0, 2, 7);
    uint64_t *keys = malloc(n * sizeof *keys);
    float *grads = calloc(n * DIM, sizeof *grads);
    for (size_t i = 0; i < n; i++) keys[i] = k;
    tt_send_push(fd, 1, DIM, 0, 0, keys, grads, n);
    assert_int_equal(tt_read_push(fd, NULL, detail, sizeof detail), TS_EINVAL);
    free(keys);
    free(grads);
  }
  /* Unknown table, wrong width, unsorted keys, another shard's key: typed errors, the
   * connection kept for the next. */
  {
    uint64_t keys[2];
    tt_shard_keys(keys, 2, 0, 2, 100);
    float rows[2 * DIM], grads[2 * (DIM + 1)] = {0}; /* room for the wrong width too */
    assert_int_equal(tt_pull(fd, 9, keys, 2, DIM, rows, NULL, detail, sizeof detail), TS_ENOTABLE);
    assert_int_equal(tt_push(fd, 0, DIM + 1, 0, keys, grads, 2, NULL, detail, sizeof detail),
                     TS_ESHAPE);
    uint64_t unsorted[2] = {keys[1], keys[0]};
    assert_int_equal(tt_pull(fd, 0, unsorted, 2, DIM, rows, NULL, detail, sizeof detail), TS_EINVAL);
    uint64_t other;
    tt_shard_keys(&other, 1, 1, 2, 100);
    assert_int_equal(tt_pull(fd, 0, &other, 1, DIM, rows, NULL, detail, sizeof detail), TS_EINVAL);
  }
  /* The key flood: distinct keys pulled into the flood table, batch after batch. */
  {
    uint64_t *keys = malloc(FLOOD_BATCH * sizeof *keys);
    float *rows = malloc((size_t)FLOOD_BATCH * DIM * sizeof *rows);
    uint64_t from = 1u << 30;
    for (size_t done = 0; done < FLOOD_KEYS; done += FLOOD_BATCH) {
      tt_shard_keys(keys, FLOOD_BATCH, 0, 2, from);
      from = keys[FLOOD_BATCH - 1] + 1;
      assert_int_equal(tt_pull(fd, 1, keys, FLOOD_BATCH, DIM, rows, NULL, detail, sizeof detail), 0);
    }
    free(keys);
    free(rows);
  }
  Tessera__ShardStatus *st = tt_status(fd);
  uint64_t bytes = 0, evicted = 0;
  for (size_t i = 0; i < st->n_tables; i++) {
    bytes += st->tables[i]->bytes;
    evicted += st->tables[i]->evicted;
  }
  tessera__shard_status__free_unpacked(st, NULL);
  fprintf(stderr, "flood: tables hold %llu bytes (budget %u), %llu rows evicted\n",
          (unsigned long long)bytes, BUDGET, (unsigned long long)evicted);
  assert_true(bytes <= BUDGET);
  assert_true(evicted > FLOOD_KEYS / 2);
  /* 10^8 keys announced: the codec refuses the frame, the connection closes. */
  {
    Tessera__SparsePull p = TESSERA__SPARSE_PULL__INIT;
    p.request_id = 99;
    p.num_keys = 100000000;
    ts_raw_send_msg(fd, TS_MSG_SPARSE_PULL, &p.base, p.num_keys * 8);
    assert_true(ts_raw_closed_by_peer(fd, 5000));
  }
  close(fd);
  pthread_join(th, NULL);
  long rss = shard_rss_kib(&c);
  fprintf(stderr, "good worker: %d steps, the slowest %.3f s, rows %s; shard RSS %ld -> %ld KiB\n",
          g.steps_done, g.worst_s, g.exact ? "exact" : "WRONG", rss0, rss);
  assert_int_equal(g.rc, 0);
  assert_int_equal(g.steps_done, STEPS);
  assert_true(g.worst_s < 2.0);
  assert_true(g.exact);
  /* The budget, the staging pool and the pull replies' buffers (64 MiB of keys at most,
   * 16 MiB replies here), with room for the allocator. */
  assert_true(rss - rss0 < (long)(BUDGET / 1024) + 96 * 1024);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attacks_while_a_worker_trains),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
