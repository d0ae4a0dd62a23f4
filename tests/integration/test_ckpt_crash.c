/*
 * Crash consistency of checkpoints: a shard writing periodic checkpoints (every 0.1 s) is
 * killed with SIGKILL at random points of a write, 120 times, and restarted each time. Every
 * restart must restore a state that was written, exactly (SGD with lr 0.5 on integer
 * gradients keeps every value exact, so after k pushes each parameter is -0.5 k g[i]), never
 * older than the one restored before (pruning must not delete the newest durable checkpoint
 * before the next is durable), never garbage, and must leave no temporary file of the
 * interrupted write behind. The model has an embedding table too (NR rows, SGD, zeros
 * at first, every row pushed each cycle right after the dense push): its rows must be
 * exactly those of the table's restored version, every row at the same one, and the
 * table as far behind the dense version as when the shard last started or one more (a
 * checkpoint taken between the two pushes), so a snapshot never tears the table or the
 * table from the partitions.
 *
 * How a kill lands in a write: after a push, the test waits for the temporary file to
 * appear, then kills after a random delay in [0, 1.2 x the write's duration] (measured by
 * the first cycles, which let their writes finish); one cycle in four kills at a random
 * moment after the push instead (the snapshot, the timer, the rename or the pruning).
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

#define N (1 << 20) /* 4 MiB of parameters: a write takes some milliseconds */
#define KILLS 120
#define CALIBRATE 3

static const uint64_t shape[] = {1024, 1024};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_ZEROS}};

static float g[N], w[N];

#define NR 20000 /* table rows */
#define DIM 16
static const ts_client_table_t table = {.name = "emb",
                                        .dim = DIM,
                                        .init = TS_CLIENT_ROW_ZEROS,
                                        .optimizer = TS_CLIENT_ROWOPT_SGD,
                                        .learning_rate = 0.5};
static int64_t rkeys[NR];
static float rg[NR * DIM], rw[NR * DIM];

static void sleep_us(long us) {
  struct timespec t = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

/* Files in dir: temporary ones (".ckpt.tmp") and complete ones (".ckpt"). */
static void count_files(const char *dir, int *tmp, int *done) {
  *tmp = *done = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n > 9 && strcmp(e->d_name + n - 9, ".ckpt.tmp") == 0)
      (*tmp)++;
    else if (n > 5 && strcmp(e->d_name + n - 5, ".ckpt") == 0)
      (*done)++;
  }
  closedir(d);
}

/* Wait until a temporary file exists (true) or timeout_s passes (false). */
static bool wait_tmp(const char *dir, bool present, double timeout_s) {
  double t0 = ts_now_s();
  while (ts_now_s() - t0 < timeout_s) {
    int tmp, done;
    count_files(dir, &tmp, &done);
    if ((tmp > 0) == present) return true;
    sleep_us(100);
  }
  return false;
}

static ts_client_t *open_worker(ts_cluster_t *c) {
  ts_client_opts_t o;
  tc_opts(&o, c->addrs, 1);
  o.task = 0;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.seed = 1;
  d.tables = &table;
  d.num_tables = 1;
  char err[512];
  int rc = ts_client_declare_ex(cl, model, 1, &d, err, sizeof err);
  if (rc < 0) fprintf(stderr, "declare: %s\n", err);
  assert_int_equal(rc, 0);
  return cl;
}

/* The table's request: a push of every row's gradient, or a pull of every row. */
static void table_req(ts_client_t *cl, bool push, uint64_t *version) {
  ts_client_req_t r;
  ts_client_req_init(&r, push ? TS_CLIENT_SPARSE_PUSH : TS_CLIENT_SPARSE_PULL);
  r.table = 0;
  r.keys = rkeys;
  r.num_keys = NR;
  r.rows_grad = rg;
  r.rows_dst = rw;
  int rc = ts_client_run(cl, &r);
  if (rc < 0) fprintf(stderr, "table %s: %s\n", push ? "push" : "pull", r.errmsg);
  assert_int_equal(rc, 0);
  if (version) *version = r.version;
}

/* One cycle's pushes: the dense gradient, then every row's. */
static void push_both(ts_client_t *cl) {
  const float *gp[] = {g};
  char err[512];
  assert_int_equal(tc_push(cl, gp, 0, NULL, err, sizeof err), 0);
  table_req(cl, true, NULL);
}

/* Pull and check w == -0.5 k g exactly for the version k pulled, and the table (*lag:
 * how far it was behind k when the shard started; updated); returns k. */
static uint64_t check_state(ts_client_t *cl, uint64_t *lag) {
  float *dst[] = {w};
  uint64_t k = 0;
  char err[512];
  assert_int_equal(tc_pull(cl, dst, 0, 0, &k, err, sizeof err), 0);
  for (size_t i = 0; i < N; i++) {
    float want = -0.5f * (float)k * g[i];
    if (w[i] != want) {
      fprintf(stderr, "restored version %llu: w[%zu] = %.9g, a written state has %.9g\n",
              (unsigned long long)k, i, (double)w[i], (double)want);
      fail();
    }
  }
  /* The table: at version kt, every row -0.5 kt g, and kt is k - lag or one behind. */
  uint64_t kt = 0;
  table_req(cl, false, &kt);
  if (kt + *lag > k || kt + *lag + 1 < k) {
    fprintf(stderr, "restored dense version %llu with the table at %llu (%llu behind before)\n",
            (unsigned long long)k, (unsigned long long)kt, (unsigned long long)*lag);
    fail();
  }
  *lag = k - kt;
  for (size_t i = 0; i < (size_t)NR * DIM; i++) {
    float want = -0.5f * (float)kt * rg[i];
    if (rw[i] != want) {
      fprintf(stderr, "restored table version %llu: key %lld element %zu = %.9g, not %.9g\n",
              (unsigned long long)kt, (long long)rkeys[i / DIM], i % DIM, (double)rw[i],
              (double)want);
      fail();
    }
  }
  return k;
}

static void test_kill_while_writing(void **state) {
  (void)state;
  for (size_t i = 0; i < N; i++) g[i] = (float)(1 + i % 7);
  for (size_t i = 0; i < NR; i++) rkeys[i] = (int64_t)(i * 7919 + 3);
  for (size_t i = 0; i < (size_t)NR * DIM; i++) rg[i] = (float)(1 + i % 5);
  char dir[] = "/tmp/tessera-ckpt-crash-XXXXXX", job[700];
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job,
           "job = { mode = \"async\"; partition_bytes = 2097152; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "checkpoint = { dir = \"%s\"; interval_s = 0.1; keep = 2; };",
           dir);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  srand((unsigned)time(NULL));
  double write_s = 0, t_start = ts_now_s();
  uint64_t durable = 0, pushed = 0, lag = 0;
  int mid_write = 0, kills = 0;
  ts_client_t *cl = open_worker(&c);
  for (int cycle = 0; kills < KILLS; cycle++) {
    push_both(cl);
    pushed++;
    if (cycle < CALIBRATE) {
      /* Let the write finish, and time it (unless it was too quick to be seen). */
      if (wait_tmp(dir, true, 2.0)) {
        double t0 = ts_now_s();
        assert_true(wait_tmp(dir, false, 5.0));
        if (ts_now_s() - t0 > write_s) write_s = ts_now_s() - t0;
      }
      continue;
    }
    if (rand() % 4 == 0) {
      sleep_us(rand() % 150000); /* anywhere: before, during or after a write */
    } else if (wait_tmp(dir, true, 2.0)) {
      sleep_us((long)((double)rand() / RAND_MAX * 1.2 * write_s * 1e6));
    }
    ts_client_close(cl);
    ts_cluster_signal(&c, 0, SIGKILL);
    kills++;
    int tmp, done;
    count_files(dir, &tmp, &done);
    if (tmp > 0) mid_write++;

    assert_int_equal(ts_cluster_start_shard(&c, 0), 0);
    count_files(dir, &tmp, &done);
    if (tmp != 0 || done < 1)
      fprintf(stderr,
              "kill %d: after the restart %s holds %d temporary and %d complete "
              "checkpoint file(s)\n",
              kills, dir, tmp, done);
    assert_int_equal(tmp, 0); /* the interrupted write's file is gone */
    /* At least one complete checkpoint; more than keep = 2 while kills keep landing between
     * a rename and the pruning after it (checked below once a write completes). */
    assert_true(done >= 1);
    cl = open_worker(&c);
    uint64_t k = check_state(cl, &lag);
    if (k < durable || k > pushed) {
      fprintf(stderr, "kill %d: restored version %llu; written before: %llu, pushed: %llu\n", kills,
              (unsigned long long)k, (unsigned long long)durable, (unsigned long long)pushed);
      fail();
    }
    durable = pushed = k;
  }
  /* One write that completes prunes back to keep = 2. */
  push_both(cl);
  ts_client_close(cl);
  int tmp = 0, done = 0;
  for (int t = 0; t < 500 && (tmp > 0 || done != 2); t++) {
    sleep_us(10000);
    count_files(dir, &tmp, &done);
  }
  assert_int_equal(tmp, 0);
  assert_int_equal(done, 2);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(log);
  bool cleaned = strstr(log, "a checkpoint whose write was interrupted") != NULL;
  free(log);
  fprintf(stderr,
          "%d kills (%d while a temporary file existed; a write takes about %.1f ms), last "
          "restored version %llu (the table's %llu behind it), %.1f s\n",
          kills, mid_write, write_s * 1e3, (unsigned long long)durable, (unsigned long long)lag,
          ts_now_s() - t_start);
  assert_true(mid_write > 0);
  assert_true(cleaned);
  assert_int_equal(ts_cluster_stop(&c), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill_while_writing),
  };
  return cmocka_run_group_tests_name("ckpt_crash", tests, NULL, NULL);
}
