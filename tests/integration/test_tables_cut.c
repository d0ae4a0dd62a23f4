/*
 * A table's push cut off mid-frame (its connection lost after the shard applied part of
 * it), then sent again with the same push id, as the client library retries: every record
 * applied once.
 *
 *   - async: the records of the staging buffers read before the cut are applied and the
 *     table's version moves; the retry applies the records after the last one applied (its
 *     reply counts only those) and every row is exactly one SGD step;
 *   - sync: the records accumulated for the step stay, and the worker's leaving does not
 *     close the step on them; the retry accumulates the rest and closes the step with the
 *     worker counted once: every row exactly one SGD step.
 *
 * The pushes are raw frames (tabraw.h) from task 0, the retry on a second connection of
 * the same task and client incarnation, as a client library reconnecting.
 */
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
#include "tabraw.h"
#include "ts_err.h"

#define DIM 64
#define N 12000    /* 3.1 MiB of records: several of the shard's 1 MiB staging buffers */
#define SENT 9000  /* records sent before the cut */
#define PUSH_ID 5

/* The gradient of element j of key i: dyadic, so one SGD step at lr 1 is exact. */
static float grad_of(size_t i, size_t j) { return 0.25f * (float)((i + j) % 8 + 1); }

static Tessera__TableStatus *table0(Tessera__ShardStatus *st) {
  assert_true(st->n_tables >= 1);
  return st->tables[0];
}

/* Wait (10 s at most) until table 0 of the shard, asked on fd, has pushed rows (async) or
 * holds more than `bytes` (sync: the step's accumulator); returns its bytes. */
static uint64_t wait_applied(int fd, bool sync, uint64_t bytes) {
  for (int i = 0; i < 1000; i++) {
    Tessera__ShardStatus *st = tt_status(fd);
    Tessera__TableStatus *t = table0(st);
    uint64_t b = t->bytes;
    bool done = sync ? b > bytes : t->pushed_rows > 0;
    tessera__shard_status__free_unpacked(st, NULL);
    if (done) return b;
    ts_sleep_ms(10);
  }
  fail_msg("the shard applied none of the cut-off push");
  return 0;
}

/* Wait until the shard counts `n` connections (the cut one closed). */
static void wait_connections(int fd, uint64_t n) {
  for (int i = 0; i < 1000; i++) {
    Tessera__ShardStatus *st = tt_status(fd);
    uint64_t have = st->connections;
    tessera__shard_status__free_unpacked(st, NULL);
    if (have == n) return;
    ts_sleep_ms(10);
  }
  fail_msg("the shard did not see the cut connection close");
}

static void cut_then_retried(bool sync) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, sync ? "job = { mode = \"sync\"; };"
                                                   : "job = { mode = \"async\"; };"),
                   0);
  int fd = tt_worker(&c, 0, 0), fd2 = tt_worker(&c, 0, 0);
  Tessera__TableDecl t = tt_table_decl("emb", DIM, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 1.0);
  t.init = TESSERA__ROW_INIT__ROW_INIT_ZEROS;
  char detail[256];
  assert_int_equal(tt_declare(fd, &t, 1, detail, sizeof detail), 0);
  uint64_t *keys = malloc(N * sizeof *keys);
  float *grads = malloc((size_t)N * DIM * sizeof *grads), *rows = malloc((size_t)N * DIM * 4);
  assert_non_null(keys);
  assert_non_null(grads);
  assert_non_null(rows);
  tt_shard_keys(keys, N, 0, 1, 1);
  for (size_t i = 0; i < N; i++)
    for (size_t j = 0; j < DIM; j++) grads[i * DIM + j] = grad_of(i, j);

  Tessera__ShardStatus *st = tt_status(fd2);
  uint64_t bytes0 = table0(st)->bytes;
  tessera__shard_status__free_unpacked(st, NULL);
  tt_send_push_cut(fd, 0, DIM, 0, PUSH_ID, keys, grads, N, SENT);
  wait_applied(fd2, sync, bytes0);
  close(fd);
  wait_connections(fd2, 1);
  st = tt_status(fd2);
  fprintf(stderr, "%s: cut after %d of %d records; table version %llu, %llu rows pushed\n",
          sync ? "sync" : "async", SENT, N, (unsigned long long)table0(st)->version,
          (unsigned long long)table0(st)->pushed_rows);
  /* async: rows moved, so the version did; sync: the step waits for the worker's push */
  assert_int_equal(table0(st)->version, sync ? 0 : 1);
  tessera__shard_status__free_unpacked(st, NULL);

  /* The retry: the same push (id, incarnation, records) from the start. */
  tt_send_push_piece(fd2, 0, DIM, 0, PUSH_ID, 0, 0, keys, grads, N);
  tt_push_reply_t r;
  assert_int_equal(tt_read_push(fd2, &r, detail, sizeof detail), 0);
  fprintf(stderr, "retry: result %d, %llu rows %s\n", r.result, (unsigned long long)r.rows,
          sync ? "accumulated" : "applied");
  assert_int_equal(r.result, sync ? TESSERA__PUSH_RESULT__PUSH_ACCUMULATED
                                  : TESSERA__PUSH_RESULT__PUSH_APPLIED);
  assert_true(r.rows > 0 && r.rows < N); /* only the records after the cut's last one */
  uint64_t version = 0;
  assert_int_equal(tt_pull(fd2, 0, keys, N, DIM, rows, &version, detail, sizeof detail), 0);
  assert_int_equal(version, 1);
  size_t wrong = 0;
  for (size_t i = 0; i < N; i++)
    for (size_t j = 0; j < DIM; j++) wrong += rows[i * DIM + j] != -grad_of(i, j);
  assert_int_equal(wrong, 0);

  /* The same push once more: a duplicate, nothing moves. */
  tt_send_push_piece(fd2, 0, DIM, 0, PUSH_ID, 0, 0, keys, grads, N);
  assert_int_equal(tt_read_push(fd2, &r, detail, sizeof detail), 0);
  assert_int_equal(r.result, TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  assert_int_equal(tt_pull(fd2, 0, keys, N, DIM, rows, &version, detail, sizeof detail), 0);
  for (size_t i = 0; i < N; i++)
    for (size_t j = 0; j < DIM; j++) wrong += rows[i * DIM + j] != -grad_of(i, j);
  assert_int_equal(wrong, 0);
  free(keys);
  free(grads);
  free(rows);
  close(fd2);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_async_push_cut_then_retried(void **state) {
  (void)state;
  cut_then_retried(false);
}

static void test_sync_push_cut_then_retried(void **state) {
  (void)state;
  cut_then_retried(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_push_cut_then_retried),
      cmocka_unit_test(test_sync_push_cut_then_retried),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
