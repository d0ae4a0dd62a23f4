/*
 * A table's push+pull in one frame (SparsePush.pull_request_id, async mode) against real
 * ps-server shards:
 *
 *   - against a twin shard sent the same pushes and pulls apart: every reply's rows bit for
 *     bit, and every table counter, with a pull's admission (a key admitted at its second
 *     sighting gets the initialiser's row until then, its gradients dropped); the version of
 *     a push of one staging piece the pull's, of two the one before the push;
 *   - what refuses it: a sync job, the pull's id equal to the push's, more than 32 MiB of
 *     rows, a NaN gradient in a later piece: the push and the pull each answered with the
 *     error; a retried push (DUPLICATE) has its pull answered EBUSY;
 *   - no room for its rows (other push+pulls being read hold the shard's budget for them):
 *     the push is applied alone and its pull answered EBUSY, on which the client library
 *     sends the pull on its own, so a well-behaved worker's request still succeeds, exact;
 *   - a push in pieces (SparsePush.piece): a retry after a lost piece applies only that one;
 *     a piece index out of range, a piece but the first without a push id or in a sync
 *     job, refused.
 */
#include <math.h>
#include <poll.h>
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
#include "ts_init.h"
#include "ts_key.h"

#define DIM 8
#define N 50
#define PULL_ID 31
#define HOGS 4

/* Gradient element j of record i: dyadic, so SGD at learning rate 1 is exact. */
static float grad_of(size_t i, size_t j) { return 0.125f * (float)((i + j) % 4 + 1); }

/* Push+pull keys[0..n) of table (width dim) in one frame: 0 with the push's reply and the
 * rows, or the push's error code (the pull's must be the same, under the pull's id). */
static int push_pull(int fd, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                     const float *grads, tt_push_reply_t *pr, float *rows, uint64_t *version,
                     char *detail, size_t dn) {
  char pull_detail[512];
  tt_send_push_pull(fd, table, dim, 0, 0, PULL_ID, keys, grads, n);
  int push = tt_read_push(fd, pr, detail, dn);
  int pull = tt_read_pull_of(fd, PULL_ID, rows, n, dim, version, pull_detail, sizeof pull_detail);
  if (push != pull) fprintf(stderr, "push %d (%s), its pull %d (%s)\n", push, detail, pull, pull_detail);
  assert_int_equal(pull, push);
  return push;
}

/* The same with the push and the pull in frames of their own (what the library sends in
 * sync mode, or to a shard without the feature). */
static void push_then_pull(int fd, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                           const float *grads, tt_push_reply_t *pr, float *rows, uint64_t *version) {
  char detail[512];
  tt_send_push(fd, table, dim, 0, 0, keys, grads, n);
  assert_int_equal(tt_read_push(fd, pr, detail, sizeof detail), 0);
  assert_int_equal(tt_pull(fd, table, keys, n, dim, rows, version, detail, sizeof detail), 0);
}

#define MANY 30000 /* 1.2 MB of records at width 8: two staging pieces */

/* Two shards alike, one sent push+pulls in one frame, the other pushes and pulls apart:
 * every reply and every table counter the same. */
static void test_rows_as_a_pull_reads_them(void **state) {
  (void)state;
  ts_cluster_t c[2];
  int fd[2];
  Tessera__TableDecl t[3] = {tt_table_decl("emb", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM, 0.01),
                             tt_table_decl("adm", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0),
                             tt_table_decl("wide", 4096, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0)};
  t[1].admit_count = 2;
  char detail[512];
  for (int i = 0; i < 2; i++) {
    assert_int_equal(ts_cluster_start(&c[i], 1, 1, "job = { mode = \"async\"; };"), 0);
    fd[i] = tt_worker(&c[i], 0, 0);
    assert_int_equal(tt_declare(fd[i], t, 3, detail, sizeof detail), 0);
  }
  static uint64_t keys[MANY];
  static float grads[MANY * DIM], rows[2][MANY * DIM];
  tt_shard_keys(keys, MANY, 0, 1, 1000);
  for (size_t i = 0; i < MANY; i++)
    for (size_t j = 0; j < DIM; j++) grads[i * DIM + j] = grad_of(i, j);
  /* Adam, a push of one piece then of two, then the admission table: its keys admitted at
   * their second sighting (the pull part sights; the push part never does). */
  const struct {
    uint32_t table;
    size_t n;
  } steps[] = {{0, N}, {0, MANY}, {0, N}, {0, MANY}, {1, N}, {1, N}, {1, N}};
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    size_t n = steps[s].n;
    tt_push_reply_t pr[2];
    uint64_t v[2];
    assert_int_equal(push_pull(fd[0], steps[s].table, DIM, keys, n, grads, &pr[0], rows[0], &v[0],
                               detail, sizeof detail),
                     0);
    push_then_pull(fd[1], steps[s].table, DIM, keys, n, grads, &pr[1], rows[1], &v[1]);
    assert_int_equal(pr[0].result, pr[1].result);
    assert_int_equal(pr[0].rows, pr[1].rows);
    assert_int_equal(pr[0].filtered, pr[1].filtered);
    assert_memory_equal(rows[0], rows[1], n * DIM * sizeof(float));
    /* One piece: the version after the push, as the pull read it; two: the one before. */
    assert_int_equal(v[0], n == N ? v[1] : v[1] - 1);
  }
  /* The admission steps: filtered, filtered and made, then applied. */
  float init[DIM];
  ts_key_row_init(init, DIM, TS_KEY_INIT_UNIFORM, 0.05, ts_init_key(TT_SEED, "adm"), keys[7]);
  for (size_t j = 0; j < DIM; j++) assert_true(rows[0][7 * DIM + j] == init[j] - grads[7 * DIM + j]);
  Tessera__ShardStatus *st[2] = {tt_status(fd[0]), tt_status(fd[1])};
  for (size_t i = 0; i < 2; i++) {
    const Tessera__TableStatus *x = st[0]->tables[i], *y = st[1]->tables[i];
    assert_int_equal(x->rows, y->rows);
    assert_int_equal(x->created, y->created);
    assert_int_equal(x->filtered, y->filtered);
    assert_int_equal(x->pulled_rows, y->pulled_rows);
    assert_int_equal(x->pushed_rows, y->pushed_rows);
    assert_int_equal(x->version, y->version);
  }
  assert_int_equal(st[0]->tables[1]->rows, N);
  assert_int_equal(st[0]->tables[1]->filtered, 2 * N);
  assert_int_equal(st[0]->errors, 0);
  for (int i = 0; i < 2; i++) tessera__shard_status__free_unpacked(st[i], NULL);

  /* Rows over what one may ask for (2049 x 4096 floats > 32 MiB): both refused. */
  {
    const size_t n = 2049;
    uint64_t *wk = malloc(n * sizeof *wk);
    float *wg = calloc(n * 4096, sizeof *wg), *wr = malloc(sizeof(float) * 4096);
    tt_shard_keys(wk, n, 0, 1, 1);
    assert_int_equal(push_pull(fd[0], 2, 4096, wk, n, wg, NULL, wr, NULL, detail, sizeof detail),
                     TS_ETOOBIG);
    assert_non_null(strstr(detail, "a push+pull in one frame may ask for"));
    free(wk);
    free(wg);
    free(wr);
  }
  /* A NaN in the second piece: the push refused from there on, its pull with it. */
  grads[(MANY - 1) * DIM] = NAN;
  assert_int_equal(push_pull(fd[0], 0, DIM, keys, MANY, grads, NULL, rows[0], NULL, detail,
                             sizeof detail),
                   TS_ENONFINITE);
  grads[(MANY - 1) * DIM] = 0;
  /* A retried push (its id applied already): DUPLICATE, and its pull EBUSY (pull alone). */
  for (int again = 0; again < 2; again++) {
    tt_push_reply_t pr;
    tt_send_push_pull(fd[0], 0, DIM, 0, 4242, PULL_ID, keys, grads, N);
    assert_int_equal(tt_read_push(fd[0], &pr, detail, sizeof detail), 0);
    assert_int_equal(pr.result, again ? TESSERA__PUSH_RESULT__PUSH_DUPLICATE
                                      : TESSERA__PUSH_RESULT__PUSH_APPLIED);
    assert_int_equal(tt_read_pull_of(fd[0], PULL_ID, rows[0], N, DIM, NULL, detail, sizeof detail),
                     again ? TS_EBUSY : 0);
  }
  /* The pull's id the push's own. */
  tt_send_push_pull(fd[0], 0, DIM, 0, 0, TT_PUSH_ID, keys, grads, N);
  assert_int_equal(tt_read_push(fd[0], NULL, detail, sizeof detail), TS_EINVAL);
  assert_int_equal(tt_read_pull_of(fd[0], TT_PUSH_ID, rows[0], N, DIM, NULL, detail, sizeof detail),
                   TS_EINVAL);
  /* The connection is still good. */
  assert_int_equal(tt_pull(fd[0], 0, keys, N, DIM, rows[0], NULL, detail, sizeof detail), 0);
  for (int i = 0; i < 2; i++) {
    close(fd[i]);
    assert_int_equal(ts_cluster_stop(&c[i]), 0);
  }
}

/* One shard of a job in `mode` holding table "emb" (width DIM, SGD at rate 1, rows made
 * by init), and a raw worker connection to it that has declared it. */
static int one_table_shard(ts_cluster_t *c, const char *mode, Tessera__RowInit init) {
  char job[64];
  snprintf(job, sizeof job, "job = { mode = \"%s\"; };", mode);
  assert_int_equal(ts_cluster_start(c, 1, 1, job), 0);
  int fd = tt_worker(c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  t.init = init;
  char detail[512];
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  return fd;
}

/* In sync mode the pull must wait for the step: a push+pull in one frame is refused. */
static void test_sync_mode_refuses_it(void **state) {
  (void)state;
  ts_cluster_t c;
  int fd = one_table_shard(&c, "sync", TESSERA__ROW_INIT__ROW_INIT_UNIFORM);
  char detail[512];
  uint64_t keys[N];
  tt_shard_keys(keys, N, 0, 1, 1000);
  static float grads[N * DIM], rows[N * DIM];
  assert_int_equal(push_pull(fd, 0, DIM, keys, N, grads, NULL, rows, NULL, detail, sizeof detail),
                   TS_EINVAL);
  /* A push in pieces likewise: the step's barrier counts one push a worker. */
  tt_send_push_piece(fd, 0, DIM, 0, 9, 0, 1, keys, grads, N);
  assert_int_equal(tt_read_push(fd, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "async mode"));
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A push in pieces (SparsePush.piece), each applied once: a retry after piece 1 was lost
 * sends both again, and only piece 1 is applied; a piece index past the last refused. */
static void test_push_in_pieces(void **state) {
  (void)state;
  ts_cluster_t c;
  int fd = one_table_shard(&c, "async", TESSERA__ROW_INIT__ROW_INIT_ZEROS);
  char detail[512];
  uint64_t keys[2 * N];
  tt_shard_keys(keys, 2 * N, 0, 1, 1000);
  static float grads[2 * N * DIM], rows[2 * N * DIM];
  for (size_t i = 0; i < 2 * N; i++)
    for (size_t j = 0; j < DIM; j++) grads[i * DIM + j] = grad_of(i, j);
  const uint64_t id = 5;
  tt_push_reply_t pr;
  /* Piece 0 applied; piece 1 "lost". */
  tt_send_push_piece(fd, 0, DIM, 0, id, 0, 0, keys, grads, N);
  assert_int_equal(tt_read_push(fd, &pr, detail, sizeof detail), 0);
  assert_int_equal(pr.result, TESSERA__PUSH_RESULT__PUSH_APPLIED);
  /* The retry: piece 0 a duplicate, piece 1 applied, then piece 1 a duplicate too. */
  const struct {
    uint32_t piece;
    int result;
  } retry[] = {{0, TESSERA__PUSH_RESULT__PUSH_DUPLICATE},
               {1, TESSERA__PUSH_RESULT__PUSH_APPLIED},
               {1, TESSERA__PUSH_RESULT__PUSH_DUPLICATE}};
  for (size_t k = 0; k < 3; k++) {
    size_t at = retry[k].piece * N;
    tt_send_push_piece(fd, 0, DIM, 0, id, 0, retry[k].piece, keys + at, grads + at * DIM, N);
    assert_int_equal(tt_read_push(fd, &pr, detail, sizeof detail), 0);
    assert_int_equal(pr.result, retry[k].result);
  }
  /* Every row moved by its gradient once. */
  assert_int_equal(tt_pull(fd, 0, keys, 2 * N, DIM, rows, NULL, detail, sizeof detail), 0);
  for (size_t i = 0; i < 2 * N * DIM; i++) assert_true(rows[i] == -grads[i]);
  /* Another push id: its piece 3 applied (pieces need not come in order). */
  tt_send_push_piece(fd, 0, DIM, 0, id + 1, 0, 3, keys, grads, N);
  assert_int_equal(tt_read_push(fd, &pr, detail, sizeof detail), 0);
  assert_int_equal(pr.result, TESSERA__PUSH_RESULT__PUSH_APPLIED);
  tt_send_push_piece(fd, 0, DIM, 0, id + 2, 0, TS_MSG_MAX_PUSH_PIECES, keys, grads, N);
  assert_int_equal(tt_read_push(fd, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "frames at most"));
  tt_send_push_piece(fd, 0, DIM, 0, 0, 0, 1, keys, grads, N); /* no push id */
  assert_int_equal(tt_read_push(fd, NULL, detail, sizeof detail), TS_EINVAL);
  assert_non_null(strstr(detail, "needs its push_id"));
  /* The table's version and the shard's pushes count the pushes whose first piece was
   * applied. */
  Tessera__ShardStatus *st = tt_status(fd);
  assert_int_equal(st->tables[0]->version, 1);
  assert_int_equal(st->pushes, 1);
  tessera__shard_status__free_unpacked(st, NULL);
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* The errors shard 0 has answered (ShardStatus.errors). */
static uint64_t shard_errors(int fd) {
  Tessera__ShardStatus *st = tt_status(fd);
  uint64_t n = st->errors;
  tessera__shard_status__free_unpacked(st, NULL);
  return n;
}

/* No room for the rows: the library's request still succeeds, its pull sent on its own. */
static void test_no_room_falls_back_to_a_pull(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, HOGS + 2, "job = { mode = \"async\"; };"), 0);
  ts_client_opts_t o;
  tc_opts(&o, c.addrs, 1);
  o.identity = "test_push_pull_frame";
  o.request_timeout_s = 20;
  o.require_all = true;
  ts_client_t *cl = NULL;
  char err[256];
  /* tabraw's declare: the same tables, the first initialised to zeros. */
  ts_client_table_t tables[2] = {
      {.name = "emb", .dim = DIM, .init = TS_CLIENT_ROW_ZEROS, .optimizer = TS_CLIENT_ROWOPT_SGD,
       .learning_rate = 1.0},
      {.name = "big", .dim = 16, .init = TS_CLIENT_ROW_UNIFORM, .init_param = 0.05,
       .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = 1.0}};
  assert_int_equal(tc_open_tables(&cl, &o, tables, 2, TT_SEED), 0);
  Tessera__TableDecl t[2] = {tt_table_decl("emb", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0),
                             tt_table_decl("big", 16, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0)};
  t[0].init = TESSERA__ROW_INIT__ROW_INIT_ZEROS;
  t[0].init_param = 0;
  /* Four peers each start a push+pull of 2^19 rows of 64 bytes (32 MiB of rows, the most
   * one may ask for; the budget for them all is 128 MiB) and send none of its records. */
  int hog[HOGS];
  for (int i = 0; i < HOGS; i++) {
    hog[i] = tt_worker(&c, 0, 1 + i);
    assert_int_equal(tt_declare(hog[i], t, 2, err, sizeof err), 0);
    Tessera__SparsePush p = TESSERA__SPARSE_PUSH__INIT;
    p.request_id = 40 + (uint64_t)i;
    p.pull_request_id = 50 + (uint64_t)i;
    p.table = 1;
    p.num_keys = UINT64_C(1) << 19;
    p.dim = 16;
    ts_raw_send_msg(hog[i], TS_MSG_SPARSE_PUSH, &p.base, p.num_keys * (8 + 16 * 4));
  }
  ts_sleep_ms(300);
  /* A raw push+pull now: the push applied, the pull answered EBUSY; once the peers are
   * gone, in one frame again (their rows given back). */
  int raw = tt_worker(&c, 0, HOGS + 1);
  assert_int_equal(tt_declare(raw, t, 2, err, sizeof err), 0);
  uint64_t rk[4];
  tt_shard_keys(rk, 4, 0, 1, 1u << 20);
  float rg[4 * 16] = {0}, rr[4 * 16];
  tt_send_push_pull(raw, 1, 16, 0, 0, PULL_ID, rk, rg, 4);
  assert_int_equal(tt_read_push(raw, NULL, err, sizeof err), 0);
  assert_int_equal(tt_read_pull_of(raw, PULL_ID, rr, 4, 16, NULL, err, sizeof err), TS_EBUSY);
  /* The worker's push+pull: its keys' rows move by minus their gradients' sums. */
  int64_t keys[6] = {5, 9, 5, -1, 5, 9};
  float grad[6 * DIM], rows[6 * DIM];
  for (size_t i = 0; i < 6; i++)
    for (size_t j = 0; j < DIM; j++) grad[i * DIM + j] = grad_of(i, j);
  for (int round = 0; round < 2; round++) {
    uint64_t errors = shard_errors(raw);
    ts_client_req_t req;
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH_PULL);
    req.keys = keys;
    req.num_keys = 6;
    req.rows_grad = grad;
    req.rows_dst = rows;
    req.min_version = TS_CLIENT_VERSION_NEXT;
    int rc = ts_client_run(cl, &req);
    if (rc) fprintf(stderr, "push+pull: %s\n", req.errmsg);
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < 6; i++) {
      for (size_t j = 0; j < DIM; j++) {
        float sum = 0;
        for (size_t k = 0; k < 6; k++)
          if (keys[k] == keys[i]) sum += grad[k * DIM + j];
        assert_true(rows[i * DIM + j] == -(float)(round + 1) * sum);
      }
    }
    /* The shard answered one error in round 0 (the EBUSY that sent the library's pull on
     * its own), none in round 1 (one frame). */
    assert_int_equal(shard_errors(raw), errors + (round == 0));
    if (round == 0) {
      /* The peers' pushes were still being read (no reply, not closed): the budget was
       * theirs. */
      for (int i = 0; i < HOGS; i++) {
        struct pollfd p = {.fd = hog[i], .events = POLLIN};
        assert_int_equal(poll(&p, 1, 0), 0);
        close(hog[i]);
      }
      /* Their rows are given back as the shard sees them go. */
      int pull = TS_EBUSY;
      for (int tries = 0; pull == TS_EBUSY && tries < 100; tries++) {
        if (tries) ts_sleep_ms(50);
        tt_send_push_pull(raw, 1, 16, 0, 0, PULL_ID, rk, rg, 4);
        assert_int_equal(tt_read_push(raw, NULL, err, sizeof err), 0);
        pull = tt_read_pull_of(raw, PULL_ID, rr, 4, 16, NULL, err, sizeof err);
      }
      assert_int_equal(pull, 0);
    }
  }
  close(raw);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows_as_a_pull_reads_them),
      cmocka_unit_test(test_sync_mode_refuses_it),
      cmocka_unit_test(test_no_room_falls_back_to_a_pull),
      cmocka_unit_test(test_push_in_pieces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
