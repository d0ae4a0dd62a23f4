/*
 * Embedding tables in checkpoints (docs/operations.md, "Checkpoints"), on real ps-server
 * shards in raw frames (tabraw.h). Every comparison is of every key's row, bit for bit,
 * with a shard that never restarted doing the same requests:
 *   restart   async, an Adam and an Adagrad table: a checkpoint, SIGTERM and a restart
 *             give back every row, the tables' versions and counters; a push after it
 *             gives what the reference gets (Adam's t and moments came through); SIGKILL
 *             after a second checkpoint restores that one, not the pushes after it; a
 *             truncated newest file is rejected and the one before it restored
 *   reshard   sync, one worker, 2 shards checkpointed and restored by 3, those by 1: every
 *             row where ts_key_shard puts it under the new count, the tables' versions (a
 *             push for the next step is accepted) and the optimizer state (the rows after
 *             it match the reference)
 *   incremental  periodic increments on one full checkpoint (checkpoint.full_every): rows
 *             changed and rows expired since (tombstones) come back after SIGKILL
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "tabraw.h"
#include "ts_key.h"

#define NKEYS 600
#define NT 2

static Tessera__TableDecl tables[NT];
static const uint32_t dims[NT] = {8, 4};
static uint64_t keys[NKEYS];

static void setup_model(void) {
  tables[0] = tt_table_decl("adam", dims[0], TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM, 0.01);
  tables[1] = tt_table_decl("adagrad", dims[1], TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD, 0.25);
  /* Spread keys: a hash-like walk, so every shard count gets a share of them. */
  for (size_t i = 0; i < NKEYS; i++) keys[i] = (i + 1) * 0x9E3779B97F4A7C15ULL;
  /* ascending, as requests need them */
  for (size_t i = 1; i < NKEYS; i++)
    for (size_t j = i; j > 0 && keys[j - 1] > keys[j]; j--) {
      uint64_t t = keys[j];
      keys[j] = keys[j - 1];
      keys[j - 1] = t;
    }
}

static float grad(uint64_t key, size_t j, int round) {
  return (float)((int)((key % 1009 + j * 3 + (uint64_t)round * 5) % 17) - 8) / 64.0f;
}

/* The keys of shard i of n (all when n is 0), and their count. */
static size_t keys_of(uint32_t i, uint32_t n, uint64_t *out) {
  size_t m = 0;
  for (size_t k = 0; k < NKEYS; k++)
    if (n == 0 || ts_key_shard(keys[k], n) == i) out[m++] = keys[k];
  return m;
}

static void run(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  assert_int_equal(system(cmd), 0);
}

/* fds[i]: a worker on shard i of c, the model declared. */
static void connect_all(ts_cluster_t *c, int *fds) {
  char detail[512];
  for (int i = 0; i < c->num_shards; i++) {
    fds[i] = tt_worker(c, i, 0);
    int rc = tt_declare(fds[i], tables, NT, detail, sizeof detail);
    if (rc) fprintf(stderr, "declare on shard %d: %s\n", i, detail);
    assert_int_equal(rc, 0);
  }
}

static void close_all(ts_cluster_t *c, int *fds) {
  for (int i = 0; i < c->num_shards; i++) close(fds[i]);
}

/* Every key's row of every table, from the shard ts_key_shard gives it, into rows (table t
 * at rows[t]: NKEYS x dims[t]); pulls wait for min_version and check the version is it. */
static void pull_all(ts_cluster_t *c, const int *fds, uint64_t min_version, bool check_version,
                     float *rows[NT]) {
  static uint64_t ks[NKEYS];
  static float buf[NKEYS * 8];
  char detail[512];
  for (int t = 0; t < NT; t++)
    for (int i = 0; i < c->num_shards; i++) {
      size_t n = keys_of((uint32_t)i, (uint32_t)c->num_shards, ks);
      uint64_t version = 0;
      tt_send_pull(fds[i], 9, (uint32_t)t, ks, n, min_version);
      assert_int_equal(tt_read_pull(fds[i], buf, n, dims[t], &version, detail, sizeof detail), 0);
      if (check_version) assert_int_equal(version, min_version);
      for (size_t k = 0, j = 0; k < NKEYS && j < n; k++)
        if (keys[k] == ks[j]) memcpy(rows[t] + k * dims[t], buf + j++ * dims[t], dims[t] * 4);
    }
}

typedef struct {
  float *rows[NT];
} state_t;

static void state_init(state_t *s) {
  for (int t = 0; t < NT; t++) assert_non_null(s->rows[t] = calloc(NKEYS * dims[t], 4));
}

static void state_free(state_t *s) {
  for (int t = 0; t < NT; t++) free(s->rows[t]);
}

static void expect_same(const state_t *a, const state_t *b, const char *what) {
  for (int t = 0; t < NT; t++)
    if (memcmp(a->rows[t], b->rows[t], NKEYS * dims[t] * 4) != 0) {
      for (size_t k = 0; k < NKEYS * dims[t]; k++)
        if (a->rows[t][k] != b->rows[t][k]) {
          fprintf(stderr, "%s: table '%s' key %llu element %zu: %.9g, not %.9g\n", what,
                  tables[t].name, (unsigned long long)keys[k / dims[t]], k % dims[t],
                  (double)a->rows[t][k], (double)b->rows[t][k]);
          break;
        }
      fail();
    }
}

/* One round: every shard of c gets, per table, the gradients of its keys but every third
 * (step `step`; sync: every shard, even with no keys, so every barrier closes). */
static void push_round(ts_cluster_t *c, const int *fds, int round, uint64_t step) {
  static uint64_t ks[NKEYS], sel[NKEYS];
  static float g[NKEYS * 8];
  char detail[512];
  for (int t = 0; t < NT; t++)
    for (int i = 0; i < c->num_shards; i++) {
      size_t n = keys_of((uint32_t)i, (uint32_t)c->num_shards, ks), m = 0;
      for (size_t k = 0; k < n; k++) {
        if ((ks[k] + (uint64_t)round) % 3 == 0) continue;
        for (size_t j = 0; j < dims[t]; j++) g[m * dims[t] + j] = grad(ks[k], j, round);
        sel[m++] = ks[k];
      }
      tt_push_reply_t r;
      int rc = tt_push(fds[i], (uint32_t)t, dims[t], step, sel, g, m, &r, detail, sizeof detail);
      if (rc) fprintf(stderr, "push round %d shard %d table %d: %s\n", round, i, t, detail);
      assert_int_equal(rc, 0);
      assert_true(r.result == TESSERA__PUSH_RESULT__PUSH_APPLIED ||
                  r.result == TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
      assert_int_equal(r.rows, m);
    }
}

/* Checkpoint every shard (path[i] gets shard i's file); busy ones (a periodic checkpoint
 * being written) are asked again. */
static void checkpoint_all(ts_cluster_t *c, char path[][600]) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, (size_t)c->num_shards);
  o.admin = true;
  o.task = -1;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *adm = NULL;
  assert_int_equal(tc_open(&adm, &o, NULL, 0, 0), 0);
  for (int i = 0; i < c->num_shards; i++) {
    char err[512];
    uint64_t step;
    int rc;
    for (int tries = 0;
         (rc = ts_client_checkpoint(adm, (uint32_t)i, path[i], 600, &step, err, sizeof err)) < 0 &&
         strstr(err, "a checkpoint is being written") && tries < 100;
         tries++)
      ts_sleep_ms(20);
    if (rc < 0) fprintf(stderr, "checkpoint of shard %d: %s\n", i, err);
    assert_int_equal(rc, 0);
  }
  ts_client_close(adm);
}

/* What status says of shard 0's tables: rows, version, created, pushed per table. */
static void table_facts(int fd, uint64_t out[NT][4]) {
  Tessera__ShardStatus *st = tt_status(fd);
  assert_int_equal(st->n_tables, NT);
  for (int t = 0; t < NT; t++) {
    out[t][0] = st->tables[t]->rows;
    out[t][1] = st->tables[t]->version;
    out[t][2] = st->tables[t]->created;
    out[t][3] = st->tables[t]->pushed_rows;
  }
  tessera__shard_status__free_unpacked(st, NULL);
}

/* --- restart ----------------------------------------------------------------------- */

static void test_restart(void **state) {
  (void)state;
  setup_model();
  char dir[] = "/tmp/tessera-ckpt-tables-XXXXXX", cfg[600], path[1][600], first[600];
  assert_non_null(mkdtemp(dir));
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"async\"; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 2; };",
           dir);
  double t0 = ts_now_s();
  ts_cluster_t a, ref;
  assert_int_equal(ts_cluster_start(&a, 1, 1, cfg), 0);
  assert_int_equal(ts_cluster_start(&ref, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fa[1], fr[1];
  connect_all(&a, fa);
  connect_all(&ref, fr);
  state_t sa, sr, at3;
  state_init(&sa);
  state_init(&sr);
  state_init(&at3);
  pull_all(&a, fa, 0, false, sa.rows); /* makes every row */
  pull_all(&ref, fr, 0, false, sr.rows);
  for (int r = 0; r < 3; r++) {
    push_round(&a, fa, r, 0);
    push_round(&ref, fr, r, 0);
  }
  checkpoint_all(&a, path);
  uint64_t before[NT][4], after[NT][4];
  table_facts(fa[0], before);
  assert_int_equal(before[0][0], NKEYS);
  assert_int_equal(before[0][1], 3);

  /* SIGTERM and a restart: every row, version and counter back. */
  close(fa[0]);
  ts_cluster_signal(&a, 0, SIGTERM);
  assert_int_equal(ts_cluster_start_shard(&a, 0), 0);
  assert_true(ts_cluster_log_has(&a, 0, "restored checkpoint"));
  connect_all(&a, fa);
  table_facts(fa[0], after);
  assert_memory_equal(before, after, sizeof before);
  pull_all(&a, fa, 0, false, sa.rows);
  pull_all(&ref, fr, 0, false, sr.rows);
  expect_same(&sa, &sr, "after SIGTERM and a restart");

  /* A push after the restore: Adam's t and moments, Adagrad's sums came through. */
  push_round(&a, fa, 3, 0);
  push_round(&ref, fr, 3, 0);
  pull_all(&a, fa, 0, false, sa.rows);
  pull_all(&ref, fr, 0, false, at3.rows);
  expect_same(&sa, &at3, "a push after the restore");
  checkpoint_all(&a, path);
  snprintf(first, sizeof first, "%s", path[0]);

  /* A second checkpoint, a push after it, SIGKILL: the second checkpoint is restored. */
  push_round(&a, fa, 4, 0);
  push_round(&ref, fr, 4, 0);
  checkpoint_all(&a, path);
  assert_string_not_equal(first, path[0]);
  push_round(&a, fa, 5, 0);
  close(fa[0]);
  ts_cluster_signal(&a, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&a, 0), 0);
  connect_all(&a, fa);
  pull_all(&a, fa, 0, false, sa.rows);
  pull_all(&ref, fr, 0, false, sr.rows);
  expect_same(&sa, &sr, "after SIGKILL");
  table_facts(fa[0], after);
  assert_int_equal(after[0][1], 5);

  /* The newest file truncated inside its table rows: rejected, the one before restored. */
  struct stat st;
  assert_int_equal(stat(path[0], &st), 0);
  assert_int_equal(truncate(path[0], st.st_size - 100), 0);
  close(fa[0]);
  ts_cluster_signal(&a, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&a, 0), 0);
  assert_true(ts_cluster_log_has(&a, 0, "checkpoint rejected, trying an older one"));
  connect_all(&a, fa);
  pull_all(&a, fa, 0, false, sa.rows);
  expect_same(&sa, &at3, "the checkpoint before a truncated one");
  table_facts(fa[0], after);
  assert_int_equal(after[0][1], 4);

  close_all(&a, fa);
  close_all(&ref, fr);
  assert_int_equal(ts_cluster_stop(&a), 0);
  assert_int_equal(ts_cluster_stop(&ref), 0);
  state_free(&sa);
  state_free(&sr);
  state_free(&at3);
  run("rm -rf '%s'", dir);
  fprintf(stderr, "restart: %d rows in %d tables, %.1f s\n", NKEYS * NT, NT, ts_now_s() - t0);
}

/* --- re-sharding ------------------------------------------------------------------- */

static const char *sync_job(char *buf, size_t n, const char *dir) {
  snprintf(buf, n,
           "job = { mode = \"sync\"; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 3600; keep = 3; };",
           dir);
  return buf;
}

static void test_reshard(void **state) {
  (void)state;
  setup_model();
  char dir[] = "/tmp/tessera-ckpt-tables-XXXXXX", cfg[600], path[3][600];
  assert_non_null(mkdtemp(dir));
  double t0 = ts_now_s();
  ts_cluster_t c, ref;
  assert_int_equal(ts_cluster_start(&ref, 1, 1, "job = { mode = \"sync\"; };"), 0);
  assert_int_equal(ts_cluster_start(&c, 2, 1, sync_job(cfg, sizeof cfg, dir)), 0);
  int fc[3], fr[1];
  connect_all(&c, fc);
  connect_all(&ref, fr);
  state_t sc, sr;
  state_init(&sc);
  state_init(&sr);
  pull_all(&c, fc, 0, true, sc.rows);
  pull_all(&ref, fr, 0, true, sr.rows);
  for (int r = 0; r < 3; r++) {
    push_round(&c, fc, r, (uint64_t)r);
    push_round(&ref, fr, r, (uint64_t)r);
  }
  pull_all(&c, fc, 3, true, sc.rows);
  pull_all(&ref, fr, 3, true, sr.rows);
  expect_same(&sc, &sr, "2 shards");
  checkpoint_all(&c, path);
  close_all(&c, fc);
  assert_int_equal(ts_cluster_stop(&c), 0);

  /* 2 -> 3: each new shard keeps the rows of its keys out of both files. */
  static const int counts[] = {3, 1};
  for (int step = 3, k = 0; k < 2; k++, step++) {
    int n = counts[k];
    assert_int_equal(ts_cluster_start(&c, n, 1, sync_job(cfg, sizeof cfg, dir)), 0);
    for (int i = 0; i < n; i++) assert_true(ts_cluster_log_has(&c, i, "re-sharded from"));
    connect_all(&c, fc);
    memset(sc.rows[0], 0, NKEYS * dims[0] * 4);
    pull_all(&c, fc, (uint64_t)step, true, sc.rows);
    char what[64];
    snprintf(what, sizeof what, "re-sharded into %d", n);
    expect_same(&sc, &sr, what);
    /* The next step is accepted (the versions came through) and gives the reference's rows
     * (so did the optimizer state). */
    push_round(&c, fc, step, (uint64_t)step);
    push_round(&ref, fr, step, (uint64_t)step);
    pull_all(&c, fc, (uint64_t)step + 1, true, sc.rows);
    pull_all(&ref, fr, (uint64_t)step + 1, true, sr.rows);
    snprintf(what, sizeof what, "a step after re-sharding into %d", n);
    expect_same(&sc, &sr, what);
    checkpoint_all(&c, path);
    close_all(&c, fc);
    assert_int_equal(ts_cluster_stop(&c), 0);
  }
  close_all(&ref, fr);
  assert_int_equal(ts_cluster_stop(&ref), 0);
  state_free(&sc);
  state_free(&sr);
  run("rm -rf '%s'", dir);
  fprintf(stderr, "reshard 2 -> 3 -> 1: %d rows in %d tables, %.1f s\n", NKEYS * NT, NT,
          ts_now_s() - t0);
}

/* --- incremental checkpoints ------------------------------------------------------ */

/* Occurrences of needle in shard i's log. */
static int log_count(const ts_cluster_t *c, int i, const char *needle) {
  char *log = ts_cluster_log(c, i);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p++) n++;
  free(log);
  return n;
}

/* Wait (at most 5 s) until shard i's log holds more than n lines with needle. */
static void wait_log(const ts_cluster_t *c, int i, const char *needle, int n) {
  double t0 = ts_now_s();
  while (log_count(c, i, needle) <= n && ts_now_s() - t0 < 5) ts_sleep_ms(20);
  assert_true(log_count(c, i, needle) > n);
}

#define NTTL 200

/* Periodic checkpoints every 0.1 s, the first full, the rest increments on it: a table
 * whose untouched rows expire (steps_to_live) needs the increment's tombstones, the others
 * its changed rows; SIGKILL, and the restart restores the full file and the newest
 * increment, every row as the reference has it. */
static void test_incremental(void **state) {
  (void)state;
  setup_model();
  char dir[] = "/tmp/tessera-ckpt-tables-XXXXXX", cfg[600];
  assert_non_null(mkdtemp(dir));
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"async\"; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 0.1; keep = 2; full_every = 1000; };",
           dir);
  double t0 = ts_now_s();
  Tessera__TableDecl all[NT + 1];
  memcpy(all, tables, sizeof tables);
  all[NT] = tt_table_decl("ttl", 4, TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD, 0.5);
  all[NT].steps_to_live = 2;
  ts_cluster_t a, ref;
  assert_int_equal(ts_cluster_start(&a, 1, 1, cfg), 0);
  assert_int_equal(ts_cluster_start(&ref, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fds[2];
  char detail[512];
  ts_cluster_t *cs[2] = {&a, &ref};
  for (int k = 0; k < 2; k++) {
    fds[k] = tt_worker(cs[k], 0, 0);
    assert_int_equal(tt_declare(fds[k], all, NT + 1, detail, sizeof detail), 0);
  }
  uint64_t ttl_keys[NTTL];
  float g[NTTL * 4], rows[2][NTTL * 4];
  for (size_t i = 0; i < NTTL; i++) ttl_keys[i] = 1000 + i;
  for (size_t i = 0; i < NTTL * 4; i++) g[i] = (float)(1 + i % 3);
  state_t sa, sr;
  state_init(&sa);
  state_init(&sr);
  /* The full checkpoint: rows of every table made. */
  for (int k = 0; k < 2; k++) {
    pull_all(cs[k], &fds[k], 0, false, k ? sr.rows : sa.rows);
    assert_int_equal(tt_pull(fds[k], NT, ttl_keys, NTTL, 4, rows[k], NULL, detail, sizeof detail),
                     0);
  }
  char path[1][600];
  checkpoint_all(&a, path); /* full: the base of the periodic ones after it */
  const char *base = strrchr(path[0], '-') + 1;
  while (*base == '0') base++;
  char on_base[64];
  snprintf(on_base, sizeof on_base, "(an increment on sequence %.*s)", (int)strcspn(base, "."),
           base);
  /* Increments: half the ttl rows pushed four times, the other half expire (tombstones);
   * some rows of the other tables pushed. */
  for (int r = 0; r < 4; r++)
    for (int k = 0; k < 2; k++)
      assert_int_equal(
          tt_push(fds[k], NT, 4, 0, ttl_keys, g, NTTL / 2, NULL, detail, sizeof detail), 0);
  ts_sleep_ms(300); /* a sweep or more of both shards */
  int written = log_count(&a, 0, ", an increment)");
  for (int k = 0; k < 2; k++) push_round(cs[k], &fds[k], 0, 0);
  /* Three timer ticks: one (at least) took every push (a tick during a write is skipped,
   * the next takes what changed). */
  ts_sleep_ms(400);
  wait_log(&a, 0, ", an increment)", written);
  for (int k = 0; k < 2; k++) {
    Tessera__ShardStatus *st = tt_status(fds[k]);
    assert_int_equal(st->tables[NT]->rows, NTTL / 2);
    tessera__shard_status__free_unpacked(st, NULL);
  }
  close(fds[0]);
  ts_cluster_signal(&a, 0, SIGKILL);
  assert_int_equal(ts_cluster_start_shard(&a, 0), 0);
  assert_true(ts_cluster_log_has(&a, 0, on_base));
  fds[0] = tt_worker(&a, 0, 0);
  assert_int_equal(tt_declare(fds[0], all, NT + 1, detail, sizeof detail), 0);
  /* The expired rows stayed expired: the tombstones were applied. */
  Tessera__ShardStatus *st = tt_status(fds[0]);
  assert_int_equal(st->tables[NT]->rows, NTTL / 2);
  tessera__shard_status__free_unpacked(st, NULL);
  for (int k = 0; k < 2; k++) {
    pull_all(cs[k], &fds[k], 0, false, k ? sr.rows : sa.rows);
    assert_int_equal(tt_pull(fds[k], NT, ttl_keys, NTTL, 4, rows[k], NULL, detail, sizeof detail),
                     0);
  }
  expect_same(&sa, &sr, "full + increment");
  assert_memory_equal(rows[0], rows[1], sizeof rows[0]);
  for (int k = 0; k < 2; k++) close(fds[k]);
  assert_int_equal(ts_cluster_stop(&a), 0);
  assert_int_equal(ts_cluster_stop(&ref), 0);
  state_free(&sa);
  state_free(&sr);
  run("rm -rf '%s'", dir);
  fprintf(stderr, "incremental: %d + %d rows, %.1f s\n", NKEYS * NT, NTTL, ts_now_s() - t0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restart),
      cmocka_unit_test(test_reshard),
      cmocka_unit_test(test_incremental),
  };
  return cmocka_run_group_tests_name("ckpt_tables", tests, NULL, NULL);
}
