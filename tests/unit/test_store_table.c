/*
 * The store's embedding tables (server/ts_store_table.h) without a network: declaring
 * (names twice, momentum without a row optimizer, a redeclare's differences), key checks,
 * rows made as ts_key_row_init makes them, admission by count, a sync step's sum applied
 * once with 1/count, max_rows, and the byte budget (ts_table_insert_cost) never exceeded,
 * a large table's next index made ahead included.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_err.h"
#include "ts_init.h"
#include "ts_key.h"
#include "ts_rowopt.h"
#include "ts_store_table.h"
#include "ts_table.h"

#define SEED 5

static Tessera__TableDecl decl(const char *name, uint32_t dim) {
  Tessera__TableDecl t = TESSERA__TABLE_DECL__INIT;
  t.name = (char *)name;
  t.dim = dim;
  t.init = TESSERA__ROW_INIT__ROW_INIT_NORMAL;
  t.init_param = 0.1;
  t.optimizer = TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD;
  t.learning_rate = 0.5;
  return t;
}

typedef struct {
  Tessera__Declare d;
  Tessera__TableDecl t[4];
  Tessera__TableDecl *tp[4];
} decl_t;

static void declare_of(decl_t *x, const Tessera__TableDecl *t, size_t n) {
  tessera__declare__init(&x->d);
  x->d.seed = SEED;
  for (size_t i = 0; i < n; i++) {
    x->t[i] = t[i];
    x->tp[i] = &x->t[i];
  }
  x->d.tables = x->tp;
  x->d.n_tables = n;
}

static const ts_optim_t sgd = {.kind = TS_OPT_SGD, .lr = 0.1f};

static void test_declare(void **state) {
  (void)state;
  char err[256];
  ts_stable_t *t = NULL;
  decl_t x;
  Tessera__TableDecl two[2] = {decl("a", 4), decl("a", 4)};
  declare_of(&x, two, 2);
  assert_int_equal(ts_stables_make(&x.d, false, &sgd, 1, &t, err, sizeof err), TS_ESHAPE);
  assert_non_null(strstr(err, "table 'a' is declared twice"));
  assert_null(t);

  const ts_optim_t momentum = {.kind = TS_OPT_MOMENTUM, .lr = 0.1f};
  Tessera__TableDecl d = decl("emb", 4);
  d.optimizer = TESSERA__ROW_OPTIMIZER__ROW_OPT_DEFAULT;
  declare_of(&x, &d, 1);
  assert_int_equal(ts_stables_make(&x.d, false, &momentum, 1, &t, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "table 'emb'"));
  assert_non_null(strstr(err, "name a row optimizer"));
  assert_int_equal(ts_stables_make(&x.d, false, &sgd, 1, &t, err, sizeof err), 0);
  assert_int_equal(ts_stables_same(t, 1, &x.d, err, sizeof err), 0);
  decl_t y;
  Tessera__TableDecl other = d;
  other.dim = 8;
  declare_of(&y, &other, 1);
  assert_int_equal(ts_stables_same(t, 1, &y.d, err, sizeof err), TS_ESHAPE);
  assert_non_null(strstr(err, "width 4, not 8"));
  other = d;
  other.max_rows = 10;
  declare_of(&y, &other, 1);
  assert_int_equal(ts_stables_same(t, 1, &y.d, err, sizeof err), TS_ESHAPE);
  assert_non_null(strstr(err, "eviction"));
  declare_of(&y, &d, 0);
  assert_int_equal(ts_stables_same(t, 1, &y.d, err, sizeof err), TS_ESHAPE);
  ts_stables_free(t, 1);
}

static void test_check_keys(void **state) {
  (void)state;
  char err[256];
  uint64_t keys[4] = {1, 2, 9, 9}, prev = 0;
  bool have = false;
  assert_int_equal(ts_stable_check_keys(keys, 8, 3, &prev, &have, 0, 1, 0, err, sizeof err), 0);
  assert_int_equal(prev, 9);
  /* Across pieces: the next piece's first key must be above the last one. */
  assert_int_equal(ts_stable_check_keys(keys + 3, 8, 1, &prev, &have, 0, 1, 3, err, sizeof err),
                   TS_EINVAL);
  assert_non_null(strstr(err, "keys not strictly ascending at index 3"));
  uint64_t k = 0;
  while (ts_key_shard(k, 2) != 1) k++;
  have = false;
  assert_int_equal(ts_stable_check_keys(&k, 8, 1, &prev, &have, 0, 2, 0, err, sizeof err),
                   TS_EINVAL);
  assert_non_null(strstr(err, "belongs to shard 1"));
}

static ts_stable_t *one_table(const Tessera__TableDecl *d, bool sync, uint32_t workers) {
  decl_t x;
  declare_of(&x, d, 1);
  ts_stable_t *t = NULL;
  char err[256];
  assert_int_equal(ts_stables_make(&x.d, sync, &sgd, workers, &t, err, sizeof err), 0);
  return t;
}

/* Records of keys[0..n) with gradients g (n x dim), as a push carries them. */
static void records(float *out, const uint64_t *keys, const float *g, size_t n, uint32_t dim) {
  for (size_t i = 0; i < n; i++) {
    memcpy(out + i * (2 + dim), &keys[i], 8);
    memcpy(out + i * (2 + dim) + 2, g + i * dim, dim * sizeof(float));
  }
}

static void test_pull_and_admission(void **state) {
  (void)state;
  Tessera__TableDecl d = decl("emb", 4);
  d.admit_count = 2;
  ts_stable_t *t = one_table(&d, false, 1);
  ts_stable_budget_t b = {.max_bytes = UINT64_MAX, .rng = 1};
  b.bytes = ts_stable_bytes(t);
  uint64_t keys[2] = {3, 8};
  float rows[8], want[8];
  for (size_t i = 0; i < 2; i++)
    ts_key_row_init(want + i * 4, 4, TS_KEY_INIT_NORMAL, 0.1, ts_init_key(SEED, "emb"), keys[i]);
  float rec[12], g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  records(rec, keys, g, 2, 4);
  uint64_t n = 0, filtered = 0;
  ts_stable_apply(t, &b, rec, 2, &n, &filtered); /* no sighting yet: dropped */
  assert_int_equal(n, 0);
  assert_int_equal(filtered, 2);
  ts_stable_pull(t, &b, keys, 2, rows);
  assert_memory_equal(rows, want, sizeof want);
  ts_stable_info_t info;
  ts_stable_info(t, &info);
  assert_int_equal(info.rows, 0);
  ts_stable_pull(t, &b, keys, 2, rows); /* the second sighting makes the rows */
  ts_stable_info(t, &info);
  assert_int_equal(info.rows, 2);
  assert_int_equal(info.created, 2);
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  ts_stable_apply(t, &b, rec, 2, &n, &filtered);
  ts_stable_bump(t);
  assert_int_equal(n, 2);
  ts_stable_pull(t, &b, keys, 2, rows);
  for (size_t j = 0; j < 8; j++) assert_true(rows[j] == want[j] - 0.5f * 1.0f);
  assert_int_equal(ts_stable_version(t), 1);
  ts_stables_free(t, 1);
}

static void test_sync_step(void **state) {
  (void)state;
  Tessera__TableDecl d = decl("emb", 2);
  ts_stable_t *t = one_table(&d, true, 2);
  ts_stable_budget_t b = {.max_bytes = UINT64_MAX, .rng = 1};
  uint64_t k = 4;
  float w[2], rows[2];
  ts_stable_pull(t, &b, &k, 1, w);
  assert_int_equal(ts_stable_sync_state(t, 0, 0), TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(ts_stable_sync_state(t, 0, 1), TS_EFUTURE);
  float rec[4], g0[2] = {0.25f, -1}, g1[2] = {0.75f, 3};
  uint64_t n = 0, f = 0;
  records(rec, &k, g0, 1, 2);
  ts_stable_accumulate(t, &b, 0, rec, 1, &n, &f);
  ts_stable_contribute(t, 0, 100);
  assert_int_equal(ts_stable_sync_state(t, 0, 0), TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  records(rec, &k, g1, 1, 2);
  ts_stable_accumulate(t, &b, 1, rec, 1, &n, &f);
  assert_int_equal(ts_stable_sync_partial(t), 1);
  ts_stable_contribute(t, 1, 120);
  assert_int_equal(ts_stable_sync_partial(t), 0);
  assert_int_equal(ts_stable_sync_count(t), 2);
  assert_int_equal(ts_stable_opened_ms(t), 100);
  ts_stable_sync_complete(t, &b);
  assert_int_equal(ts_stable_version(t), 1);
  assert_int_equal(ts_stable_sync_state(t, 0, 0), TESSERA__PUSH_RESULT__PUSH_STALE);
  ts_stable_pull(t, &b, &k, 1, rows);
  assert_true(rows[0] == w[0] - 0.5f * (0.5f * (0.25f + 0.75f)));
  assert_true(rows[1] == w[1] - 0.5f * (0.5f * (-1.0f + 3.0f)));
  ts_stables_free(t, 1);
}

/* A push cut off in part (its worker lost mid-frame) when the step closes: its records are
 * each one key's whole gradient, so it counts as a push of those keys. */
static void test_sync_step_partial(void **state) {
  (void)state;
  Tessera__TableDecl d = decl("emb", 2);
  ts_stable_t *t = one_table(&d, true, 3);
  ts_stable_budget_t b = {.max_bytes = UINT64_MAX, .rng = 1};
  uint64_t k[2] = {4, 9};
  float w[4], rows[4], rec[8], g0[4] = {0.25f, -1, 2, 4}, g1[2] = {0.75f, 3};
  uint64_t n = 0, f = 0;
  ts_stable_pull(t, &b, k, 2, w);
  records(rec, k, g0, 2, 2); /* task 0: both keys, whole */
  ts_stable_accumulate(t, &b, 0, rec, 2, &n, &f);
  ts_stable_contribute(t, 0, 100);
  records(rec, k, g1, 1, 2); /* task 1: key 4 only, then its connection was lost */
  ts_stable_accumulate(t, &b, 1, rec, 1, &n, &f);
  assert_int_equal(ts_stable_sync_count(t), 1);
  assert_int_equal(ts_stable_sync_partial(t), 1);
  assert_int_equal(ts_stable_sync_state(t, 1, 0), TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  ts_stable_sync_complete(t, &b); /* the barrier gave up on task 1 (and task 2) */
  assert_int_equal(ts_stable_sync_partial(t), 0);
  ts_stable_pull(t, &b, k, 2, rows);
  assert_true(rows[0] == w[0] - 0.5f * (0.5f * (0.25f + 0.75f)));
  assert_true(rows[1] == w[1] - 0.5f * (0.5f * (-1.0f + 3.0f)));
  assert_true(rows[2] == w[2] - 0.5f * (0.5f * 2.0f));
  assert_true(rows[3] == w[3] - 0.5f * (0.5f * 4.0f));
  ts_stables_free(t, 1);
}

/* Sync at the byte budget: rows pulled until the budget is full (evicting) leave a step's
 * gradient sums their room, so the step's gradients are all summed, keys summed twice
 * included, and the rows never take the room back. */
static void test_sync_at_budget(void **state) {
  (void)state;
  Tessera__TableDecl d = decl("emb", 4);
  ts_stable_t *t = one_table(&d, true, 1);
  ts_stable_budget_t b = {.max_bytes = 4u << 20, .accum_room = 512u << 10, .rng = 1};
  enum { FLOOD = 200000, STEP = 3000 };
  uint64_t *keys = malloc(FLOOD * sizeof *keys);
  float *rows = malloc((size_t)FLOOD * 4 * sizeof *rows), *rec = malloc(STEP * 6 * sizeof *rec);
  float *g = malloc(STEP * 4 * sizeof *g);
  assert_non_null(keys);
  assert_non_null(rows);
  assert_non_null(rec);
  assert_non_null(g);
  for (size_t i = 0; i < FLOOD; i++) keys[i] = i + 1;
  for (size_t at = 0; at < FLOOD; at += 10000) ts_stable_pull(t, &b, keys + at, 10000, rows);
  ts_stable_info_t info;
  ts_stable_info(t, &info);
  assert_true(info.evicted > 0);
  assert_true(b.bytes + b.accum_room <= b.max_bytes);
  for (int step = 0; step < 3; step++) {
    uint64_t *k = keys + FLOOD - STEP; /* the last rows pulled: they are there */
    for (size_t i = 0; i < STEP * 4; i++) g[i] = 0.5f;
    records(rec, k, g, STEP, 4);
    uint64_t n = 0, f = 0;
    ts_stable_accumulate(t, &b, 0, rec, STEP, &n, &f);
    ts_stable_accumulate(t, &b, 0, rec, STEP, &n, &f); /* each key summed twice */
    assert_int_equal(f, 0);
    assert_int_equal(n, 2 * STEP);
    assert_true(b.bytes <= b.max_bytes);
    ts_stable_contribute(t, 0, 100);
    ts_stable_sync_complete(t, &b);
    assert_int_equal(b.accum_bytes, 0);
    /* more rows pulled between steps take no room from the next step's sums */
    for (size_t i = 0; i < 10000; i++) keys[i] = FLOOD + (size_t)step * 10000 + i + 1;
    ts_stable_pull(t, &b, keys, 10000, rows);
    assert_true(b.bytes + b.accum_room <= b.max_bytes);
  }
  free(keys);
  free(rows);
  free(rec);
  free(g);
  ts_stables_free(t, 1);
}

static void test_capacity_and_budget(void **state) {
  (void)state;
  /* The cost of the first insert is what it allocates. */
  ts_table_t tab;
  assert_int_equal(ts_table_init(&tab, 8, 1, 0), 0);
  uint64_t cost = ts_table_insert_cost(&tab);
  bool created;
  int err;
  assert_true(ts_table_insert(&tab, 1, &created, &err) != TS_TABLE_NONE);
  assert_int_equal(ts_table_bytes(&tab), cost);
  assert_int_equal(ts_table_insert_cost(&tab), 0);
  ts_table_free(&tab);

  Tessera__TableDecl d = decl("lru", 4);
  d.max_rows = 50;
  ts_stable_t *t = one_table(&d, false, 1);
  ts_stable_budget_t b = {.max_bytes = UINT64_MAX, .rng = 1};
  float rows[4 * 10];
  for (uint64_t k = 0; k < 1000; k += 10) {
    uint64_t keys[10];
    for (size_t i = 0; i < 10; i++) keys[i] = k + i;
    ts_stable_pull(t, &b, keys, 10, rows);
    ts_stable_info_t info;
    ts_stable_info(t, &info);
    assert_true(info.rows <= 50);
  }
  ts_stable_info_t info;
  ts_stable_info(t, &info);
  assert_int_equal(info.rows, 50);
  assert_int_equal(info.evicted, 950);
  ts_stables_free(t, 1);

  /* A budget of two slabs and their index: the table stays within it. */
  Tessera__TableDecl e = decl("budget", 16);
  t = one_table(&e, false, 1);
  ts_table_t probe;
  assert_int_equal(ts_table_init(&probe, 16, 0, 0), 0);
  uint64_t slab = ts_table_insert_cost(&probe);
  b = (ts_stable_budget_t){.max_bytes = 2 * slab + (64u << 10), .rng = 1};
  b.bytes = ts_stable_bytes(t);
  float row[16];
  for (uint64_t k = 0; k < 30000; k++) {
    ts_stable_pull(t, &b, &k, 1, row);
    assert_true(b.bytes <= b.max_bytes);
  }
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  ts_stable_info(t, &info);
  assert_true(info.rows >= 2048 && info.rows <= 2 * 4096);
  assert_true(info.evicted > 0);
  ts_stables_free(t, 1);
}

/* Pull keys [from, to) of t in requests of 10,000; the budget holds after each. */
static void pull_range(ts_stable_t *t, ts_stable_budget_t *b, uint64_t from, uint64_t to) {
  static uint64_t keys[10000];
  static float rows[10000];
  for (uint64_t k = from; k < to;) {
    size_t n = to - k < 10000 ? (size_t)(to - k) : 10000;
    for (size_t i = 0; i < n; i++) keys[i] = k + i;
    ts_stable_pull(t, b, keys, n, rows);
    assert_true(b->bytes <= b->max_bytes);
    k += n;
  }
}

/* A large table's next index, made ahead from 3/8 of its index on (ts_table_prepare_grow),
 * is in the budget's count from its start and gives way to rows when the budget is short;
 * a budget that holds the rows and the grow holds them with it too (the index is made
 * ahead only when the rows before the grow fit). */
static void test_index_made_ahead_in_budget(void **state) {
  (void)state;
  const uint64_t rows = 530000; /* index of 2^20 slots, 3/8 = 393,216, then 2^21 */
  Tessera__TableDecl d = decl("ahead", 1);
  ts_stable_t *t = one_table(&d, false, 1);
  ts_stable_budget_t b = {.max_bytes = UINT64_MAX, .rng = 1};
  b.bytes = ts_stable_bytes(t);
  uint64_t base = b.bytes;
  pull_range(t, &b, 0, 390000);
  uint64_t before_next = b.bytes;
  pull_range(t, &b, 390000, 400000); /* past 3/8: the next index is being made */
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  assert_true(b.bytes - before_next >= (uint64_t)16 << 20); /* 2^21 slots of 8 bytes */
  /* The budget taken (by another table, say) down to what is held: the next index gives
   * way to the next row, no row is evicted, and it is made again once there is room. */
  uint64_t with_next = b.bytes;
  b.max_bytes = b.bytes;
  pull_range(t, &b, 400000, 460000); /* past 458,752: a new metadata group of 2 MiB */
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  assert_true(with_next - b.bytes >= (uint64_t)13 << 20); /* 16 MiB, less the new rows */
  ts_stable_info_t held;
  ts_stable_info(t, &held);
  assert_int_equal(held.rows, 460000);
  assert_int_equal(held.evicted, 0);
  uint64_t without = b.bytes;
  b.max_bytes = UINT64_MAX;
  pull_range(t, &b, 460000, 460001);
  assert_true(b.bytes - without >= (uint64_t)16 << 20); /* made again */
  pull_range(t, &b, 460001, rows); /* grown */
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  uint64_t full = b.bytes - base;
  ts_stables_free(t, 1);
  /* The same rows under a budget of what they take and the old index during the grow
   * (which a table grown without the early index needs too): every row is made. */
  t = one_table(&d, false, 1);
  b = (ts_stable_budget_t){.max_bytes = base + full + ((uint64_t)8 << 20), .rng = 1};
  b.bytes = ts_stable_bytes(t);
  pull_range(t, &b, 0, rows);
  ts_stable_info_t info;
  ts_stable_info(t, &info);
  assert_int_equal(info.rows, rows);
  assert_int_equal(info.evicted, 0);
  assert_int_equal(b.bytes, ts_stable_bytes(t));
  ts_stables_free(t, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_declare),
      cmocka_unit_test(test_check_keys),
      cmocka_unit_test(test_pull_and_admission),
      cmocka_unit_test(test_sync_step),
      cmocka_unit_test(test_sync_step_partial),
      cmocka_unit_test(test_sync_at_budget),
      cmocka_unit_test(test_capacity_and_budget),
      cmocka_unit_test(test_index_made_ahead_in_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
