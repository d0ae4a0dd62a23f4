/*
 * Embedding tables on real ps-server shards (docs/architecture.md, "Tables"), spoken to in
 * raw frames: a Declare of tables only; SparsePull makes rows equal to ts_key_row_init's;
 * async SparsePush changes rows exactly as ts_rowopt_apply on a local copy (SGD, Adagrad,
 * Adam, FTRL; bit-exact); sync with two workers sums a step's rows and divides by two, and
 * a parked pull for the next version is answered when the step closes; stale, duplicate
 * and future pushes; the refusals (ENOTABLE, ESHAPE, EINVAL for unsorted, repeated and
 * other shards' keys, ENONFINITE, ETOOBIG) with the connection kept, and 10^8 keys
 * refused by the codec without the shard allocating; admission by count; max_rows and
 * server.max_table_bytes holding while ten times as many keys stream through; and a job
 * with the momentum optimizer refusing a table without a row optimizer. (Tables in
 * checkpoints: test_ckpt_tables.c; the raw frames are tabraw.h's.)
 */
#include <math.h>
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

#include "harness.h"
#include "rawconn.h"
#include "tabraw.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_init.h"
#include "ts_key.h"
#include "ts_msg.h"
#include "ts_rowopt.h"

#define SEED TT_SEED


/* A gradient value that tests every bit: dyadic, varied by key and element. */
static float grad(uint64_t key, size_t j, int round) {
  return (float)((int)((key * 7 + j * 3 + (uint64_t)round * 5) % 17) - 8) / 64.0f;
}

/* The row optimizer the shard makes of decl t (lr given, the rest the kind's defaults). */
static ts_rowopt_t ref_opt(const Tessera__TableDecl *t) {
  ts_rowopt_t o;
  ts_rowopt_kind_t k = t->optimizer == TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD ? TS_ROWOPT_ADAGRAD
                       : t->optimizer == TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM  ? TS_ROWOPT_ADAM
                       : t->optimizer == TESSERA__ROW_OPTIMIZER__ROW_OPT_FTRL  ? TS_ROWOPT_FTRL
                                                                               : TS_ROWOPT_SGD;
  ts_rowopt_defaults(&o, k, (float)t->learning_rate);
  o.l1 = (float)t->l1;
  o.l2 = (float)t->l2;
  o.beta = (float)t->beta;
  return o;
}

static void ref_init(const Tessera__TableDecl *t, uint64_t key, float *w) {
  ts_key_row_init(w, t->dim, (ts_key_init_t)t->init, t->init_param, ts_init_key(SEED, t->name),
                  key);
}

/* --- async ------------------------------------------------------------------------- */

#define NK 5

static void test_async_rows(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"async\"; };"), 0);
  int fd = tt_worker(&c, 0, 0);
  Tessera__TableDecl t[5] = {
      tt_table_decl("sgd", 8, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5),
      tt_table_decl("adagrad", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD, 0.25),
      tt_table_decl("adam", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM, 0.01),
      tt_table_decl("ftrl", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_FTRL, 0.1),
      tt_table_decl("wide", 64, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.1),
  };
  t[3].l1 = 0.001;
  t[3].l2 = 0.01;
  t[3].beta = 0.5;
  char detail[512];
  assert_int_equal(tt_declare(fd, t, 5, detail, sizeof detail), 0);
  /* A second declare of the same tables is fine; another width is not. */
  assert_int_equal(tt_declare(fd, t, 5, detail, sizeof detail), 0);
  t[0].dim = 16;
  assert_int_equal(tt_declare(fd, t, 5, detail, sizeof detail), TS_ESHAPE);
  assert_non_null(strstr(detail, "width 8, not 16"));
  t[0].dim = 8;
  Tessera__TableDecl twice[2] = {t[0], t[0]};
  int fd1 = tt_worker(&c, 1, 0);
  assert_int_equal(tt_declare(fd1, twice, 2, detail, sizeof detail), TS_ESHAPE);
  assert_non_null(strstr(detail, "declared twice"));
  close(fd1);

  uint64_t keys[NK];
  tt_shard_keys(keys, NK, 0, 2, 1);
  for (int ti = 0; ti < 4; ti++) {
    uint32_t dim = t[ti].dim;
    float rows[NK * 8], want[NK * 8], state0[NK * 8], state1[NK * 8];
    uint64_t version = 99;
    assert_int_equal(tt_pull(fd, (uint32_t)ti, keys, NK, dim, rows, &version, detail, sizeof detail), 0);
    assert_int_equal(version, 0);
    ts_rowopt_t o = ref_opt(&t[ti]);
    int ns = ts_rowopt_state_buffers(&o);
    for (size_t i = 0; i < NK; i++) {
      ref_init(&t[ti], keys[i], want + i * dim);
      ts_rowopt_init_state(&o, ns >= 1 ? state0 + i * dim : NULL, ns >= 2 ? state1 + i * dim : NULL,
                           dim);
    }
    assert_memory_equal(rows, want, NK * dim * 4);
    for (int round = 0; round < 3; round++) {
      float g[NK * 8];
      for (size_t i = 0; i < NK; i++)
        for (size_t j = 0; j < dim; j++) g[i * dim + j] = grad(keys[i], j, round);
      tt_push_reply_t r;
      assert_int_equal(tt_push(fd, (uint32_t)ti, dim, 0, keys, g, NK, &r, detail, sizeof detail), 0);
      assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_APPLIED);
      assert_int_equal(r.rows, NK);
      for (size_t i = 0; i < NK; i++)
        ts_rowopt_apply(&o, want + i * dim, g + i * dim, 1.0f, dim, ns >= 1 ? state0 + i * dim : NULL,
                        ns >= 2 ? state1 + i * dim : NULL, (uint64_t)round + 1);
    }
    assert_int_equal(tt_pull(fd, (uint32_t)ti, keys, NK, dim, rows, &version, detail, sizeof detail), 0);
    assert_int_equal(version, 3);
    if (memcmp(rows, want, NK * dim * 4) != 0)
      fail_msg("table '%s': rows differ from ts_rowopt_apply's (%g vs %g)", t[ti].name, (double)rows[0],
               (double)want[0]);
  }
  Tessera__ShardStatus *st = tt_status(fd);
  assert_int_equal(st->n_tables, 5);
  assert_string_equal(st->tables[0]->name, "sgd");
  assert_int_equal(st->tables[0]->dim, 8);
  assert_int_equal(st->tables[0]->rows, NK);
  assert_int_equal(st->tables[0]->created, NK);
  assert_int_equal(st->tables[0]->version, 3);
  assert_int_equal(st->tables[0]->pulled_rows, 2 * NK);
  assert_int_equal(st->tables[0]->pushed_rows, 3 * NK);
  assert_true(st->tables[0]->bytes > 0);
  tessera__shard_status__free_unpacked(st, NULL);

  /* A retried push (the same push id and client) is not applied twice. */
  float g1[NK * 8], tmp[NK * 8];
  for (size_t i = 0; i < NK * 8; i++) g1[i] = 0.125f;
  tt_push_reply_t r1;
  uint64_t v = 0;
  for (int k = 0; k < 2; k++) {
    tt_send_push(fd, 0, 8, 0, 5, keys, g1, NK);
    assert_int_equal(tt_read_push(fd, &r1, detail, sizeof detail), 0);
    assert_int_equal(r1.result, k == 0 ? TESSERA__PUSH_RESULT__PUSH_APPLIED
                                       : TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  }
  assert_int_equal(tt_pull(fd, 0, keys, NK, 8, tmp, &v, detail, sizeof detail), 0);
  assert_int_equal(v, 4);

  /* Refusals, each leaving the connection open and the rows as they were. */
  float rows[NK * 8], before[NK * 8], g[NK * 8] = {0};
  assert_int_equal(tt_pull(fd, 0, keys, NK, 8, before, NULL, detail, sizeof detail), 0);
  assert_int_equal(tt_pull(fd, 9, keys, NK, 8, rows, NULL, detail, sizeof detail), TS_ENOTABLE);
  assert_int_equal(tt_push(fd, 9, 8, 0, keys, g, NK, NULL, detail, sizeof detail), TS_ENOTABLE);
  assert_int_equal(tt_push(fd, 0, 4, 0, keys, g, NK, NULL, detail, sizeof detail), TS_ESHAPE);
  uint64_t unsorted[NK];
  memcpy(unsorted, keys, sizeof keys);
  unsorted[3] = keys[1];
  assert_int_equal(tt_pull(fd, 0, unsorted, NK, 8, rows, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "keys not strictly ascending at index 3"));
  uint64_t dup[NK];
  memcpy(dup, keys, sizeof keys);
  dup[2] = dup[1];
  assert_int_equal(tt_pull(fd, 0, dup, NK, 8, rows, NULL, detail, sizeof detail), TS_EINVAL);
  for (size_t i = 0; i < NK * 8; i++) g[i] = 1.0f;
  assert_int_equal(tt_push(fd, 0, 8, 0, unsorted, g, NK, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "no row changed"));
  uint64_t other[NK];
  memcpy(other, keys, sizeof keys);
  tt_shard_keys(&other[NK - 1], 1, 1, 2, keys[NK - 1] + 1); /* the last one on shard 1 */
  assert_int_equal(tt_pull(fd, 0, other, NK, 8, rows, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "belongs to shard 1"));
  assert_int_equal(tt_push(fd, 0, 8, 0, other, g, NK, NULL, detail, sizeof detail), TS_EINVAL);
  g[3 * 8 + 2] = NAN;
  assert_int_equal(tt_push(fd, 0, 8, 0, keys, g, NK, NULL, detail, sizeof detail), TS_ENONFINITE);
  assert_int_equal(tt_pull(fd, 0, keys, NK, 8, rows, NULL, detail, sizeof detail), 0);
  assert_memory_equal(rows, before, sizeof before);

  /* A push of several staging pieces (1 MiB each): all applied; then one with a NaN in its
   * last record: the pieces before it stay applied and the error says how many records. */
  size_t nbig = 10000;
  uint64_t *bk = malloc(nbig * 8);
  float *bg = malloc(nbig * 64 * 4), *brows = malloc(nbig * 64 * 4);
  tt_shard_keys(bk, nbig, 0, 2, 1);
  for (size_t i = 0; i < nbig * 64; i++) bg[i] = 0.25f;
  tt_push_reply_t rb;
  assert_int_equal(tt_push(fd, 4, 64, 0, bk, bg, nbig, &rb, detail, sizeof detail), 0);
  assert_int_equal(rb.rows, nbig);
  bg[(nbig - 1) * 64] = NAN;
  assert_int_equal(tt_push(fd, 4, 64, 0, bk, bg, nbig, &rb, detail, sizeof detail), TS_ENONFINITE);
  assert_non_null(strstr(detail, "records were applied before it"));
  assert_int_equal(tt_pull(fd, 4, bk, nbig, 64, brows, &v, detail, sizeof detail), 0);
  float w0[64], wl[64];
  ref_init(&t[4], bk[0], w0);
  ref_init(&t[4], bk[nbig - 1], wl);
  for (size_t j = 0; j < 64; j++) {
    assert_true(brows[j] == (w0[j] - 0.025f) - 0.025f);       /* both pushes */
    assert_true(brows[(nbig - 1) * 64 + j] == wl[j] - 0.025f); /* the first only */
  }
  free(bk);
  free(bg);
  free(brows);

  /* /metrics has a series per table. */
  assert_true(ts_metric_wait(c.http_port[0], "tessera_ps_table_rows{table=\"sgd\"}", NK, NK) ==
              NK);
  assert_true(ts_metric_wait(c.http_port[0], "tessera_ps_table_rows_created_total{table=\"wide\"}",
                             (double)nbig, (double)nbig) == (double)nbig);

  /* A reply over 64 MiB: refused, its keys read and dropped, the connection kept. */
  size_t big = 300000;
  uint64_t *many = calloc(big, 8);
  assert_int_equal(tt_pull(fd, 4, many, big, 64, NULL, NULL, detail, sizeof detail), TS_ETOOBIG);
  assert_non_null(strstr(detail, "pull fewer keys"));
  free(many);
  assert_int_equal(tt_pull(fd, 0, keys, NK, 8, rows, NULL, detail, sizeof detail), 0);

  /* 10^8 keys announced: the codec refuses the frame (the connection closes) before the
   * shard allocates anything for it; a well-behaved worker is served on. */
  long rss = ts_proc_rss_kib(c.pid[0]);
  int bad = tt_worker(&c, 0, 0);
  Tessera__SparsePull p = TESSERA__SPARSE_PULL__INIT;
  p.request_id = 3;
  p.num_keys = 100000000;
  ts_raw_send_msg(bad, TS_MSG_SPARSE_PULL, &p.base, p.num_keys * 8);
  int code = ts_raw_expect_error(bad, detail, sizeof detail);
  assert_true(code == TS_ETOOBIG || code == TS_ESIZE);
  assert_true(ts_raw_closed_by_peer(bad, 5000));
  close(bad);
  assert_true(ts_proc_rss_kib(c.pid[0]) - rss < 16 * 1024);
  assert_int_equal(tt_pull(fd, 0, keys, NK, 8, rows, NULL, detail, sizeof detail), 0);
  assert_memory_equal(rows, before, sizeof before);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync -------------------------------------------------------------------------- */

static void test_sync_two_workers(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, "job = { mode = \"sync\"; };"), 0);
  int a = tt_worker(&c, 0, 0), b = tt_worker(&c, 0, 1), waiter = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5);
  char detail[512];
  assert_int_equal(tt_declare(a, &t, 1, detail, sizeof detail), 0);
  assert_int_equal(tt_declare(b, &t, 1, detail, sizeof detail), 0);
  uint64_t keys[3] = {1, 2, 3};
  float w[12], rows[12];
  assert_int_equal(tt_pull(a, 0, keys, 3, 4, w, NULL, detail, sizeof detail), 0);
  /* A long poll for version 1: parked until the step closes. */
  tt_send_pull(waiter, 21, 0, keys, 3, 1);
  float ga[8], gb[8];
  for (size_t j = 0; j < 8; j++) {
    ga[j] = grad(j, j, 1);
    gb[j] = grad(j, j, 2);
  }
  tt_push_reply_t r;
  assert_int_equal(tt_push(a, 0, 4, 0, (uint64_t[]){1, 2}, ga, 2, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(r.rows, 2);
  assert_int_equal(tt_push(a, 0, 4, 0, (uint64_t[]){1, 2}, ga, 2, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  assert_int_equal(tt_push(a, 0, 4, 5, (uint64_t[]){1}, ga, 1, &r, detail, sizeof detail), TS_EFUTURE);
  assert_int_equal(tt_push(b, 0, 4, 0, (uint64_t[]){2, 3}, gb, 2, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  /* The reference: each key's summed gradient, halved, applied once. */
  ts_rowopt_t o = ref_opt(&t);
  float sum[12] = {0};
  for (size_t j = 0; j < 4; j++) {
    sum[0 + j] = ga[j];
    sum[4 + j] = ga[4 + j] + gb[j];
    sum[8 + j] = gb[4 + j];
  }
  for (size_t i = 0; i < 3; i++) ts_rowopt_apply(&o, w + i * 4, sum + i * 4, 0.5f, 4, NULL, NULL, 1);
  uint64_t version = 0;
  assert_int_equal(tt_read_pull(waiter, rows, 3, 4, &version, detail, sizeof detail), 0);
  assert_int_equal(version, 1);
  assert_memory_equal(rows, w, sizeof w);
  assert_int_equal(tt_push(a, 0, 4, 0, (uint64_t[]){1}, ga, 1, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_STALE);
  /* Step 1: an empty push counts for the barrier. */
  assert_int_equal(tt_push(a, 0, 4, 1, NULL, NULL, 0, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(tt_push(b, 0, 4, 1, (uint64_t[]){3}, gb, 1, &r, detail, sizeof detail), 0);
  ts_rowopt_apply(&o, w + 8, gb, 0.5f, 4, NULL, NULL, 2);
  tt_send_pull(waiter, 22, 0, keys, 3, 2);
  assert_int_equal(tt_read_pull(waiter, rows, 3, 4, &version, detail, sizeof detail), 0);
  assert_int_equal(version, 2);
  assert_memory_equal(rows, w, sizeof w);
  close(a);
  close(b);
  close(waiter);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- admission, eviction, the budget ----------------------------------------------- */

static uint32_t table_rows(int fd, size_t i, uint64_t *evicted, uint64_t *bytes) {
  Tessera__ShardStatus *st = tt_status(fd);
  assert_true(st->n_tables > i);
  uint32_t rows = (uint32_t)st->tables[i]->rows;
  if (evicted) *evicted = st->tables[i]->evicted;
  if (bytes) {
    *bytes = 0;
    for (size_t k = 0; k < st->n_tables; k++) *bytes += st->tables[k]->bytes;
  }
  tessera__shard_status__free_unpacked(st, NULL);
  return rows;
}

static void test_admission_and_eviction(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"async\"; };\n"
                                    "server = { max_table_bytes = 2097152; };"),
                   0);
  int fd = tt_worker(&c, 0, 0);
  Tessera__TableDecl t[3] = {
      tt_table_decl("admit", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5),
      tt_table_decl("lru", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5),
      tt_table_decl("budget", 8, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5),
  };
  t[0].admit_count = 3;
  t[1].max_rows = 100;
  char detail[512];
  assert_int_equal(tt_declare(fd, t, 3, detail, sizeof detail), 0);
  uint64_t key = 7;
  float g[4] = {1, 1, 1, 1}, row[4], init[4];
  ref_init(&t[0], key, init);
  tt_push_reply_t r;
  assert_int_equal(tt_push(fd, 0, 4, 0, &key, g, 1, &r, detail, sizeof detail), 0);
  assert_int_equal(r.filtered, 1);
  for (int k = 1; k <= 3; k++) {
    assert_int_equal(tt_pull(fd, 0, &key, 1, 4, row, NULL, detail, sizeof detail), 0);
    assert_memory_equal(row, init, sizeof init);
    assert_int_equal(table_rows(fd, 0, NULL, NULL), k < 3 ? 0 : 1);
  }
  assert_int_equal(tt_push(fd, 0, 4, 0, &key, g, 1, &r, detail, sizeof detail), 0);
  assert_int_equal(r.rows, 1);
  assert_int_equal(r.filtered, 0);

  /* max_rows 100 while 1000 keys stream through. */
  uint64_t keys[1000];
  float rows[1000 * 8];
  for (size_t i = 0; i < 1000; i++) keys[i] = i + 1;
  for (size_t off = 0; off < 1000; off += 100) {
    assert_int_equal(tt_pull(fd, 1, keys + off, 100, 4, rows, NULL, detail, sizeof detail), 0);
    assert_true(table_rows(fd, 1, NULL, NULL) <= 100);
  }
  uint64_t evicted, bytes;
  assert_int_equal(table_rows(fd, 1, &evicted, &bytes), 100);
  assert_true(evicted >= 900);

  /* server.max_table_bytes (2 MiB, all tables) while 30000 keys stream through. */
  for (uint64_t base = 0; base < 30000; base += 1000) {
    for (size_t i = 0; i < 1000; i++) keys[i] = base + i + 1;
    assert_int_equal(tt_pull(fd, 2, keys, 1000, 8, rows, NULL, detail, sizeof detail), 0);
    float want[8];
    ref_init(&t[2], keys[999], want);
    assert_memory_equal(rows + 999 * 8, want, sizeof want);
  }
  uint32_t n = table_rows(fd, 2, &evicted, &bytes);
  assert_true(n > 0);
  assert_true(evicted > 0);
  assert_true(bytes <= 2097152);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- jobs that refuse tables ------------------------------------------------------- */

static void test_refused_jobs(void **state) {
  (void)state;
  char detail[512];
  ts_cluster_t c;
  Tessera__TableDecl t = tt_table_decl("emb", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5);
  assert_int_equal(
      ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };\noptimizer = { name = \"momentum\"; };"),
      0);
  int fd = tt_worker(&c, 0, 0);
  t.optimizer = TESSERA__ROW_OPTIMIZER__ROW_OPT_DEFAULT;
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), TS_ECONFIG);
  assert_non_null(strstr(detail, "table 'emb'"));
  assert_non_null(strstr(detail, "name a row optimizer"));
  t.optimizer = TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD;
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_rows),
      cmocka_unit_test(test_sync_two_workers),
      cmocka_unit_test(test_admission_and_eviction),
      cmocka_unit_test(test_refused_jobs),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
