/*
 * A table's requests at the edges of what a shard serves, on real shards:
 *
 *   - a pull whose reply is larger than server.max_reply_bytes lets replies hold: ETOOBIG at
 *     its meta (a raw connection), the connection kept and answered rightly afterwards;
 *     the client library cuts a pull of 300,000 rows of width 64 (73 MiB) into replies the
 *     shards serve, with a small server.max_reply_bytes too (Hello.max_reply_rows), and
 *     every row comes back in its place;
 *   - an async push refused whole (a NaN) does not count as the worker's push: the shard's
 *     push count and the worker's step stay;
 *   - a worker task parking table pulls that never come due holds its own share of keys
 *     (two of the largest pulls): its next are refused (EBUSY), another task's served;
 *   - a table whose rows have all expired (steps_to_live) lists no keys and says so (done),
 *     so ts_client_table_keys_all returns.
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

#include "calls.h"
#include "harness.h"
#include "tabraw.h"
#include "tessera/client.h"
#include "ts_err.h"

#define DIM 64
#define SEED 7

static ts_client_t *open_table(ts_cluster_t *c, const ts_client_table_t *table) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.identity = "test_tables_limits";
  o.request_timeout_s = 30;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open_tables(&cl, &o, table, 1, SEED), 0);
  return cl;
}

static int pull(ts_client_t *cl, const int64_t *keys, size_t n, float *dst) {
  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.keys = keys;
  req.num_keys = n;
  req.rows_dst = dst;
  int rc = ts_client_run(cl, &req);
  if (rc != 0) fprintf(stderr, "sparse pull: %s\n", req.errmsg);
  return rc;
}

/* A pull of n keys (the last n / 2 repeating the first ones, in another order): every row
 * of a repeated key equal to its first's, and the rows of a second pull the same. */
static void big_pull(ts_cluster_t *c, size_t n) {
  const ts_client_table_t table = {.name = "emb", .dim = DIM, .init = TS_CLIENT_ROW_UNIFORM,
                                   .init_param = 0.05, .optimizer = TS_CLIENT_ROWOPT_SGD};
  ts_client_t *cl = open_table(c, &table);
  int64_t *keys = malloc(n * sizeof *keys);
  float *a = malloc(n * DIM * sizeof *a), *b = malloc(n * DIM * sizeof *b);
  assert_non_null(keys);
  assert_non_null(a);
  assert_non_null(b);
  size_t half = n / 2;
  for (size_t i = 0; i < half; i++) keys[i] = (int64_t)(i * 7919 + 3);
  for (size_t i = half; i < n; i++) keys[i] = keys[n - 1 - i];
  assert_int_equal(pull(cl, keys, n, a), 0);
  assert_int_equal(pull(cl, keys, n, b), 0);
  assert_memory_equal(a, b, n * DIM * sizeof *a);
  size_t wrong = 0, zero = 0;
  for (size_t i = half; i < n; i++)
    wrong += memcmp(a + i * DIM, a + (n - 1 - i) * DIM, DIM * sizeof *a) != 0;
  for (size_t i = 0; i < n * DIM; i++) zero += a[i] == 0.0f;
  assert_int_equal(wrong, 0);
  assert_true(zero < n * DIM / 1000); /* uniform(0.05) rows, not an unfilled buffer */
  free(keys);
  free(a);
  free(b);
  ts_client_close(cl);
}

static void test_pull_past_the_reply_budget(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fd = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  char detail[256];
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  /* 262,144 rows of width 64: a 64 MiB reply, within the codec's limit, not the budget's */
  const size_t n = 262144;
  uint64_t *keys = malloc(n * sizeof *keys);
  float *rows = malloc(n * DIM * sizeof *rows);
  assert_non_null(keys);
  assert_non_null(rows);
  tt_shard_keys(keys, n, 0, 1, 1);
  assert_int_equal(tt_pull(fd, 0, keys, n, DIM, rows, NULL, detail, sizeof detail), TS_ETOOBIG);
  fprintf(stderr, "64 MiB pull: %s\n", detail);
  assert_non_null(strstr(detail, "server.max_reply_bytes"));
  assert_int_equal(tt_pull(fd, 0, keys, 1000, DIM, rows, NULL, detail, sizeof detail), 0);
  free(keys);
  free(rows);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* The client library: its pulls cut to what the shards serve. */
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  big_pull(&c, 300000);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* A shard that lets replies hold 4 MiB: the client cuts its pulls to fit. */
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; };\n"
                                    "server = { max_reply_bytes = 4194304; };"),
                   0);
  big_pull(&c, 100000);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static Tessera__TableStatus *table0(Tessera__ShardStatus *st) {
  assert_true(st->n_tables >= 1);
  return st->tables[0];
}

static void test_refused_push_not_counted(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fd = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  char detail[256];
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  uint64_t keys[2];
  tt_shard_keys(keys, 2, 0, 1, 1);
  float g[8] = {1, 1, 1, 1, 1, NAN, 1, 1};
  Tessera__ShardStatus *st = tt_status(fd);
  uint64_t pushes = st->pushes, version = table0(st)->version;
  tessera__shard_status__free_unpacked(st, NULL);
  assert_int_equal(tt_push(fd, 0, 4, 0, keys, g, 2, NULL, detail, sizeof detail), TS_ENONFINITE);
  st = tt_status(fd);
  assert_int_equal(st->pushes, pushes);
  assert_int_equal(table0(st)->version, version);
  tessera__shard_status__free_unpacked(st, NULL);
  g[5] = 1;
  assert_int_equal(tt_push(fd, 0, 4, 0, keys, g, 2, NULL, detail, sizeof detail), 0);
  st = tt_status(fd);
  assert_int_equal(st->pushes, pushes + 1);
  assert_int_equal(table0(st)->version, version + 1);
  tessera__shard_status__free_unpacked(st, NULL);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A worker task parking pulls that never come due holds its own share of keys only: past
 * two of the largest its pulls are refused (EBUSY), and another task's pulls go on. */
static void test_parked_pulls_hold_their_task_share(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, "job = { mode = \"async\"; };"), 0);
  int bad = tt_worker(&c, 0, 1), good = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  char detail[256];
  assert_int_equal(tt_declare(good, &t, 1, detail, sizeof detail), 0);
  const size_t n = (size_t)1 << 20; /* 8 MiB of keys a pull */
  uint64_t *keys = malloc(n * sizeof *keys);
  float *rows = malloc(1000 * 4 * sizeof *rows);
  assert_non_null(keys);
  assert_non_null(rows);
  tt_shard_keys(keys, n, 0, 1, 1);
  for (uint64_t id = 1; id <= 8; id++) tt_send_pull(bad, id, 0, keys, n, UINT64_MAX);
  for (uint64_t id = 3; id <= 8; id++) {
    assert_int_equal(tt_read_pull_of(bad, id, NULL, n, 4, NULL, detail, sizeof detail), TS_EBUSY);
    if (id == 3) fprintf(stderr, "task 1's third parked pull: %s\n", detail);
  }
  assert_non_null(strstr(detail, "task 1"));
  /* task 0's pulls are served meanwhile */
  assert_int_equal(tt_pull(good, 0, keys, 1000, 4, rows, NULL, detail, sizeof detail), 0);
  close(bad);
  close(good);
  free(keys);
  free(rows);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_keys_of_a_table_all_expired(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fd = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  t.steps_to_live = 1;
  char detail[256];
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  uint64_t keys[100];
  float rows[100 * 4];
  tt_shard_keys(keys, 100, 0, 1, 1);
  assert_int_equal(tt_pull(fd, 0, keys, 100, 4, rows, NULL, detail, sizeof detail), 0);
  /* Pushes of no keys move the table's steps: its rows go untouched past their time. */
  for (int i = 0; i < 3; i++)
    assert_int_equal(tt_push(fd, 0, 4, 0, keys, rows, 0, NULL, detail, sizeof detail), 0);
  uint64_t held = 1;
  for (int i = 0; i < 500 && held; i++) {
    Tessera__ShardStatus *st = tt_status(fd);
    held = table0(st)->rows;
    tessera__shard_status__free_unpacked(st, NULL);
    if (held) ts_sleep_ms(10);
  }
  assert_int_equal(held, 0);
  uint64_t data_len;
  Tessera__TableKeysReply *r = tt_keys_page(fd, 1000, &data_len);
  assert_true(r->done);
  assert_int_equal(r->num_keys, 0);
  assert_int_equal(data_len, 0);
  tessera__table_keys_reply__free_unpacked(r, NULL);
  close(fd);
  /* The library's whole listing returns: nothing. */
  ts_client_opts_t o;
  tc_opts_role(&o, c.addrs, 1, true);
  o.request_timeout_s = 10;
  ts_client_t *admin = NULL;
  char e[256];
  assert_int_equal(tc_open(&admin, &o, NULL, 0, 0), 0);
  assert_int_equal(ts_client_attach(admin, 0, e, sizeof e), 0);
  int64_t *got = (int64_t *)1;
  size_t n = 1;
  assert_int_equal(ts_client_table_keys_all(admin, 0, &got, &n, NULL, e, sizeof e), 0);
  assert_int_equal(n, 0);
  ts_client_keys_free(got);
  ts_client_close(admin);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pull_past_the_reply_budget),
      cmocka_unit_test(test_refused_push_not_counted),
      cmocka_unit_test(test_parked_pulls_hold_their_task_share),
      cmocka_unit_test(test_keys_of_a_table_all_expired),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
