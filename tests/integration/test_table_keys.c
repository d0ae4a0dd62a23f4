/*
 * Listing a table's keys (TableKeys; ts_client_table_keys, ts_client_table_keys_all) on
 * two real shards:
 *
 *   - the keys a worker made rows for are listed exactly, each once, by an admin client
 *     and by a worker (read-only: the worker token suffices);
 *   - pages of 7 keys: every shard's keys, each on its own shard, each once;
 *   - a table growing 20-fold between two pages (its index re-hashed several times): every
 *     key present for the whole walk still listed exactly once, no restart signalled;
 *   - rows evicted between two pages (max_rows): the reply's `erased` moves on, the signal
 *     ts_client_table_keys_all restarts a shard's walk on;
 *   - a listing of more than a page a shard while another worker keeps evicting rows
 *     (max_rows): ts_client_table_keys_all returns sorted, distinct keys that were all
 *     made at some time, within its restart bound (how often it restarted is printed: it
 *     depends on the timing);
 *   - hostile requests on a raw worker connection (max_keys 0 and 2^64 - 1, an unknown
 *     table, a cursor far past the end): typed errors, the connection kept and answered
 *     rightly afterwards, and the well-behaved client beside it still lists the same keys.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_key.h"

#define NKEYS 1500
#define GROW 20000
#define SMALL_ROWS 100

static const char job[] = "job = { mode = \"async\"; };\n";

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_opts_t o;
  tc_opts_role(&o, c->addrs, (size_t)c->num_shards, admin);
  o.request_timeout_s = 30;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  return cl;
}

/* Make rows for keys[0..n) of table t (a pull admits at once). */
static void touch(ts_client_t *w, uint32_t t, uint32_t dim, const int64_t *keys, size_t n) {
  float *rows = malloc(n * dim * sizeof *rows);
  assert_non_null(rows);
  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.table = t;
  req.keys = keys;
  req.num_keys = n;
  req.rows_dst = rows;
  int rc = ts_client_run(w, &req);
  if (rc != 0) fail_msg("pull: %s", req.errmsg);
  free(rows);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The key of index i: spread, negative ones included. */
static int64_t key_of(size_t i) {
  return (int64_t)i * 7919 - 3000;
}

/* Whether sorted a[0..n) holds k. */
static bool has(const int64_t *a, size_t n, int64_t k) {
  return bsearch(&k, a, n, sizeof *a, cmp_i64) != NULL;
}

/* Walk shard s of table t in pages of `page` keys; returns the keys (sorted), *n. */
static int64_t *walk(ts_client_t *cl, uint32_t t, uint32_t s, size_t page, size_t *n,
                     size_t *pages) {
  size_t cap = 1024, len = 0;
  int64_t *all = malloc(cap * sizeof *all);
  uint64_t cursor = 0;
  char e[256];
  *pages = 0;
  for (;;) {
    if (cap - len < page) {
      cap = cap * 2 + page;
      all = realloc(all, cap * sizeof *all);
      assert_non_null(all);
    }
    ts_client_keys_page_t p;
    int rc = ts_client_table_keys(cl, t, s, cursor, all + len, page, &p, e, sizeof e);
    if (rc != 0) fail_msg("table keys: %s", e);
    assert_true(p.num_keys <= page);
    for (size_t i = 0; i < p.num_keys; i++)
      assert_int_equal(ts_key_shard((uint64_t)all[len + i], 2), s);
    len += p.num_keys;
    (*pages)++;
    cursor = p.next_cursor;
    if (p.done) break;
  }
  qsort(all, len, sizeof *all, cmp_i64);
  for (size_t i = 1; i < len; i++) assert_true(all[i] != all[i - 1]);
  *n = len;
  return all;
}

static void test_list_page_grow(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, job), 0);
  char e[512];
  ts_client_t *w = open_client(&c, false);
  ts_client_table_t tb[2] = {
      {.name = "emb", .dim = 4, .optimizer = TS_CLIENT_ROWOPT_SGD},
      {.name = "small", .dim = 2, .optimizer = TS_CLIENT_ROWOPT_SGD, .max_rows = SMALL_ROWS},
  };
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.seed = 5;
  d.tables = tb;
  d.num_tables = 2;
  if (ts_client_declare_ex(w, NULL, 0, &d, e, sizeof e) < 0) fail_msg("declare: %s", e);

  static int64_t keys[NKEYS];
  for (size_t i = 0; i < NKEYS; i++) keys[i] = key_of(i);
  touch(w, 0, 4, keys, NKEYS);
  qsort(keys, NKEYS, sizeof *keys, cmp_i64);

  /* all of them, exactly, for an admin client and for a worker */
  ts_client_t *admin = open_client(&c, true);
  assert_int_equal(ts_client_attach(admin, 0, e, sizeof e), 0);
  ts_client_t *who[2] = {admin, w};
  for (int k = 0; k < 2; k++) {
    int64_t *got = NULL;
    size_t n = 0;
    uint32_t restarts = 9;
    if (ts_client_table_keys_all(who[k], 0, &got, &n, &restarts, e, sizeof e) != 0)
      fail_msg("keys_all: %s", e);
    assert_int_equal(n, NKEYS);
    assert_memory_equal(got, keys, sizeof keys);
    assert_int_equal(restarts, 0);
    ts_client_keys_free(got);
  }
  int64_t *none = (int64_t *)1;
  size_t nn = 7;
  assert_int_equal(ts_client_table_keys_all(admin, 1, &none, &nn, NULL, e, sizeof e), 0);
  assert_null(none);
  assert_int_equal(nn, 0);

  /* pages of 7: each shard's keys, each once */
  size_t total = 0;
  for (uint32_t s = 0; s < 2; s++) {
    size_t n, pages;
    int64_t *got = walk(admin, 0, s, 7, &n, &pages);
    assert_true(pages >= n / 7);
    for (size_t i = 0; i < n; i++) assert_true(has(keys, NKEYS, got[i]));
    total += n;
    free(got);
  }
  assert_int_equal(total, NKEYS);

  /* the table grows 20-fold between two pages of shard 0 */
  static int64_t first[5], rest[NKEYS + GROW];
  ts_client_keys_page_t p;
  assert_int_equal(ts_client_table_keys(admin, 0, 0, 0, first, 5, &p, e, sizeof e), 0);
  assert_int_equal(p.num_keys, 5);
  assert_false(p.done);
  uint64_t erased0 = p.erased, cursor = p.next_cursor;
  static int64_t grow[GROW];
  for (size_t i = 0; i < GROW; i++) grow[i] = key_of(NKEYS + i);
  touch(w, 0, 4, grow, GROW);
  size_t len = 0;
  for (;;) {
    assert_int_equal(ts_client_table_keys(admin, 0, 0, cursor, rest + len, 4096, &p, e, sizeof e),
                     0);
    assert_int_equal(p.erased, erased0); /* nothing erased: no restart needed */
    len += p.num_keys;
    cursor = p.next_cursor;
    if (p.done) break;
  }
  memcpy(rest + len, first, sizeof first);
  len += 5;
  qsort(rest, len, sizeof *rest, cmp_i64);
  for (size_t i = 1; i < len; i++) assert_true(rest[i] != rest[i - 1]);
  size_t on0 = 0;
  for (size_t i = 0; i < NKEYS; i++)
    if (ts_key_shard((uint64_t)keys[i], 2) == 0) {
      assert_true(has(rest, len, keys[i]));
      on0++;
    }
  assert_true(len > on0 + GROW / 4); /* the new rows after the cursor were listed too */

  /* rows evicted between two pages: `erased` moves on */
  static int64_t small[4 * SMALL_ROWS];
  for (size_t i = 0; i < 4 * SMALL_ROWS; i++) small[i] = key_of(i) + 1;
  touch(w, 1, 2, small, SMALL_ROWS);
  int64_t pg[8];
  assert_int_equal(ts_client_table_keys(admin, 1, 0, 0, pg, 5, &p, e, sizeof e), 0);
  erased0 = p.erased;
  touch(w, 1, 2, small + SMALL_ROWS, 3 * SMALL_ROWS);
  assert_int_equal(ts_client_table_keys(admin, 1, 0, p.next_cursor, pg, 5, &p, e, sizeof e), 0);
  assert_true(p.erased > erased0);
  assert_true(p.rows <= SMALL_ROWS);
  int64_t *got = NULL;
  size_t n = 0;
  assert_int_equal(ts_client_table_keys_all(admin, 1, &got, &n, NULL, e, sizeof e), 0);
  assert_true(n > 0 && n <= 2 * SMALL_ROWS);
  for (size_t i = 0; i < n; i++) {
    bool found = false;
    for (size_t j = 0; j < 4 * SMALL_ROWS && !found; j++) found = small[j] == got[i];
    assert_true(found);
  }
  ts_client_keys_free(got);

  /* the library's own checks */
  assert_int_equal(ts_client_table_keys(admin, 0, 0, 0, pg, 0, &p, e, sizeof e), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_table_keys(admin, 0, 2, 0, pg, 5, &p, e, sizeof e), TS_CLIENT_EINVAL);
  assert_int_equal(ts_client_table_keys(admin, 7, 0, 0, pg, 5, &p, e, sizeof e),
                   TS_CLIENT_ENOTABLE);

  /* hostile requests on a raw worker connection */
  int fd = tt_worker(&c, 0, 1);
  struct {
    uint32_t table;
    uint64_t cursor, max;
    int code;
  } bad[] = {
      {0, 0, 0, TS_EINVAL},
      {0, 0, UINT64_MAX, TS_EINVAL},
      {0, 0, (UINT64_C(1) << 20) + 1, TS_EINVAL},
      {99, 0, 5, TS_ENOTABLE},
      {0, UINT64_C(1) << 40, 5, TS_EINVAL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    Tessera__TableKeys m = TESSERA__TABLE_KEYS__INIT;
    m.request_id = 100 + i;
    m.table = bad[i].table;
    m.cursor = bad[i].cursor;
    m.max_keys = bad[i].max;
    ts_raw_send_msg(fd, TS_MSG_TABLE_KEYS, &m.base, 0);
    tt_frame_t f;
    assert_int_equal(tt_read_frame(fd, &f), TS_MSG_ERROR);
    char detail[256];
    assert_int_equal(tt_error_of(&f, detail, sizeof detail), bad[i].code);
    free(f.data);
  }
  /* the same connection, asked rightly, gets all of shard 0's keys in one page */
  uint64_t data_len;
  Tessera__TableKeysReply *r = tt_keys_page(fd, UINT64_C(1) << 20, &data_len);
  assert_true(r->done);
  assert_int_equal(r->num_keys, len);
  assert_int_equal(data_len, len * 8);
  tessera__table_keys_reply__free_unpacked(r, NULL);
  close(fd);

  /* the well-behaved worker beside it lists the same keys as before the growth, and more */
  assert_int_equal(ts_client_table_keys_all(w, 0, &got, &n, NULL, e, sizeof e), 0);
  assert_int_equal(n, NKEYS + GROW);
  for (size_t i = 0; i < NKEYS; i++) assert_true(has(got, n, keys[i]));
  ts_client_keys_free(got);

  ts_client_close(w);
  ts_client_close(admin);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

#define CHURN_ROWS 70000 /* max_rows a shard: a listing needs two pages of 65,536 */
#define CHURN_FILL (2 * CHURN_ROWS + 20000)
#define CHURN_BATCH 256

typedef struct {
  ts_client_t *w;
  atomic_bool stop;
  int64_t next; /* keys made: [0, next) of churn_key */
  int rc;
} churn_t;

static int64_t churn_key(int64_t i) {
  return i * 104729 + 17;
}

static void *churn(void *p) {
  churn_t *ch = p;
  int64_t keys[CHURN_BATCH];
  while (!atomic_load(&ch->stop) && ch->rc == 0) {
    for (int i = 0; i < CHURN_BATCH; i++) keys[i] = churn_key(ch->next + i);
    float rows[CHURN_BATCH * 2];
    ts_client_req_t req;
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
    req.table = 0;
    req.keys = keys;
    req.num_keys = CHURN_BATCH;
    req.rows_dst = rows;
    ch->rc = ts_client_run(ch->w, &req);
    ch->next += CHURN_BATCH;
  }
  return NULL;
}

static void test_list_while_evicting(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, job), 0);
  char e[512];
  ts_client_t *w = open_client(&c, false);
  ts_client_table_t tb = {
      .name = "churn", .dim = 2, .optimizer = TS_CLIENT_ROWOPT_SGD, .max_rows = CHURN_ROWS};
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.tables = &tb;
  d.num_tables = 1;
  if (ts_client_declare_ex(w, NULL, 0, &d, e, sizeof e) < 0) fail_msg("declare: %s", e);
  int64_t *fill = malloc(CHURN_FILL * sizeof *fill);
  assert_non_null(fill);
  for (int64_t i = 0; i < CHURN_FILL; i++) fill[i] = churn_key(i);
  touch(w, 0, 2, fill, CHURN_FILL);
  free(fill);
  ts_client_t *admin = open_client(&c, true);
  assert_int_equal(ts_client_attach(admin, 0, e, sizeof e), 0);
  churn_t ch = {.w = w, .next = CHURN_FILL};
  atomic_init(&ch.stop, false);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, churn, &ch), 0);
  int64_t *got = NULL;
  size_t n = 0;
  uint32_t restarts = 0;
  int rc = ts_client_table_keys_all(admin, 0, &got, &n, &restarts, e, sizeof e);
  atomic_store(&ch.stop, true);
  pthread_join(th, NULL);
  if (rc != 0) fail_msg("keys_all: %s", e);
  assert_int_equal(ch.rc, 0);
  printf("listed %zu keys of 2 shards while %lld more were made, %u restart(s)\n", n,
         (long long)(ch.next - CHURN_FILL), restarts);
  assert_true(restarts <= 2 * 3);
  assert_true(n > CHURN_ROWS && n <= 2 * CHURN_ROWS + (size_t)(ch.next - CHURN_FILL));
  for (size_t i = 0; i < n; i++) {
    if (i) assert_true(got[i] > got[i - 1]);
    int64_t k = got[i] - 17;
    assert_true(k >= 0 && k % 104729 == 0 && k / 104729 < ch.next);
  }
  ts_client_keys_free(got);
  ts_client_close(w);
  ts_client_close(admin);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_page_grow),
      cmocka_unit_test(test_list_while_evicting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
