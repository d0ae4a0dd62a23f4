/*
 * Large pushes against a real ps-server: a push is read, checked and applied one piece (a
 * few partitions, one staging buffer) at a time. Exact results with concurrent pushers and
 * pullers (pushes wait for pull replies being written from their partitions), a NaN that
 * refuses only its own piece, sync barriers (one gradient applied straight from the staging
 * buffer; several through the accumulator), a peer that stops reading its replies dropped
 * so the pushes it holds up go on, and the shard's memory bounded by its parameters rather
 * than by the size of the pushes.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "bigtensor.h"
#include "harness.h"
#include "rawconn.h"
#include "calls.h"
#include "ts_err.h"
#include "ts_frame.h"

#define PARTS 10
#define PART_FLOATS (1u << 20) /* 4 MiB partitions */
#define N ((size_t)PARTS * PART_FLOATS)

static ts_big_t big; /* set up in main */

static const char *const job_async = "job = { mode = \"async\"; partition_bytes = 4194304; };\n"
                                     "optimizer = { name = \"sgd\"; learning_rate = 1.0; };";

static ts_client_t *worker(ts_cluster_t *c, int task) {
  return ts_big_worker(c, &big, task, "push-stream", 30, 0.5);
}

static float *filled(float v) { return ts_big_filled(&big, v); }

static void expect_parts(ts_client_t *cl, const float *want) { ts_big_expect_parts(&big, cl, want); }

static void expect_all(ts_client_t *cl, float v) {
  float want[PARTS];
  for (int p = 0; p < PARTS; p++) want[p] = v;
  expect_parts(cl, want);
}

/* --- concurrent pushers and a puller: exact sum, bounded memory ------------------------- */

#define ROUNDS 4
#define PUSHERS 3

typedef struct {
  ts_cluster_t *c;
  int task;
  int failures;
  volatile int *stop;
} arg_t;

static void *pusher(void *p) {
  arg_t *a = p;
  ts_client_t *cl = worker(a->c, a->task);
  float *g = filled((float)(a->task + 1));
  char err[512];
  for (int r = 0; r < ROUNDS; r++) {
    if (tc_push(cl, (const float *const *)&g, (uint64_t)r, NULL, err, sizeof err) < 0) {
      fprintf(stderr, "push: %s\n", err);
      a->failures++;
    }
  }
  free(g);
  ts_client_close(cl);
  return NULL;
}

static void *puller(void *p) {
  arg_t *a = p;
  ts_client_t *cl = worker(a->c, a->task);
  float *w = filled(0.0f);
  char err[512];
  while (!*a->stop) {
    if (tc_pull(cl, &w, 0, 0, NULL, err, sizeof err) < 0) {
      fprintf(stderr, "pull: %s\n", err);
      a->failures++;
      break;
    }
    /* A reply never carries a half-applied update: each partition is a whole number of
     * gradients summed, so every value of it is the same. */
    if (!ts_big_parts_uniform(&big, w)) a->failures++;
  }
  free(w);
  ts_client_close(cl);
  return NULL;
}

/* Whether the kernel gives a madvise(MADV_HUGEPAGE) region huge pages at its first touch:
 * transparent huge pages on ("always" or "madvise") and faults allowed to compact for them. */
static bool thp_on_advice(void) {
  char en[128] = "", df[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f) {
    if (!fgets(en, sizeof en, f)) en[0] = '\0';
    fclose(f);
  }
  f = fopen("/sys/kernel/mm/transparent_hugepage/defrag", "r");
  if (f) {
    if (!fgets(df, sizeof df, f)) df[0] = '\0';
    fclose(f);
  }
  bool on = strstr(en, "[always]") || strstr(en, "[madvise]");
  bool compacts =
      strstr(df, "[always]") || strstr(df, "[madvise]") || strstr(df, "[defer+madvise]");
  return on && compacts;
}

/* The shard's anonymous memory on transparent huge pages, KiB (-1: unreadable). */
static long anon_huge_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

static void test_concurrent_exact(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, PUSHERS + 1, job_async), 0);
  volatile int stop = 0;
  arg_t args[PUSHERS + 1];
  pthread_t th[PUSHERS + 1];
  for (int t = 0; t <= PUSHERS; t++) {
    args[t] = (arg_t){.c = &c, .task = t, .stop = &stop};
    pthread_create(&th[t], NULL, t < PUSHERS ? pusher : puller, &args[t]);
  }
  for (int t = 0; t < PUSHERS; t++) pthread_join(th[t], NULL);
  stop = 1;
  pthread_join(th[PUSHERS], NULL);
  for (int t = 0; t <= PUSHERS; t++) assert_int_equal(args[t].failures, 0);

  ts_client_t *cl = worker(&c, 0);
  expect_all(cl, -(float)(ROUNDS * (1 + 2 + 3)));
  ts_client_close(cl);

  /* Parameters 40 MiB, SGD (no state): the target is 1.15 x 40 + 32 = 78 MiB, whatever the
   * 16 x 40 MiB pushed through it. (Not under AddressSanitizer, whose shadow memory and
   * quarantine are not the shard's.) */
  long rss = ts_proc_rss_kib(c.pid[0]);
#if !defined(__SANITIZE_ADDRESS__)
  fprintf(stderr, "shard VmRSS after 12 x 40 MiB pushes and concurrent pulls: %ld KiB\n", rss);
  assert_true(rss > 0 && rss < 78 * 1024);
  /* Parameters and staging buffers (4 MiB each) are advised as huge pages (ts_huge_alloc):
   * where the kernel honours that, most of the 40 MiB is on them. */
  long huge = anon_huge_kib(c.pid[0]);
  fprintf(stderr, "shard AnonHugePages: %ld KiB\n", huge);
  if (thp_on_advice() && huge >= 0) assert_true(huge >= 20 * 1024);
#else
  (void)rss;
  (void)anon_huge_kib;
  (void)thp_on_advice;
#endif
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- a NaN refuses its own piece only ----------------------------------------------- */

static void test_nan_refuses_its_piece(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job_async), 0);
  ts_client_t *cl = worker(&c, 0);
  float *g = filled(1.0f);
  g[7 * PART_FLOATS + 300000] = NAN; /* in the fifth 256 KiB chunk of partition 7 */
  char err[512] = "";
  int rc = tc_push(cl, (const float *const *)&g, 0, NULL, err, sizeof err);
  assert_int_equal(rc, TS_ENONFINITE);
  if (!strstr(err, "'big' part 7 contains NaN or Inf") || !strstr(err, "1 of 10 partitions")) {
    fprintf(stderr, "unexpected detail: %s\n", err);
    fail();
  }
  float want[PARTS];
  for (int p = 0; p < PARTS; p++) want[p] = p == 7 ? 0.0f : -1.0f;
  expect_parts(cl, want);
  free(g);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync: one gradient applied straight away, two through the accumulator ----------- */

typedef struct {
  ts_cluster_t *c;
  int task, failures;
} sync_arg_t;

static void *sync_worker(void *p) {
  sync_arg_t *a = p;
  ts_client_t *cl = worker(a->c, a->task);
  float *g = filled((float)(a->task + 1));
  float *w = filled(0.0f);
  char err[512];
  uint64_t v = 0;
  /* Pull first, as a worker does: push_pulled tags the gradient with the version pulled. */
  if (tc_pull(cl, &w, TS_CLIENT_VERSION_NEXT, 0, &v, err, sizeof err) < 0) a->failures++;
  for (int r = 0; r < 3; r++) {
    if (tc_push(cl, (const float *const *)&g, TS_CLIENT_STEP_PULLED, NULL, err, sizeof err) < 0 ||
        tc_pull(cl, &w, TS_CLIENT_VERSION_NEXT, 0, &v, err, sizeof err) < 0) {
      fprintf(stderr, "task %d round %d: %s\n", a->task, r, err);
      a->failures++;
    }
  }
  free(g);
  free(w);
  ts_client_close(cl);
  return NULL;
}

static void run_sync(int workers, float want) {
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, workers,
                                    "job = { mode = \"sync\"; partition_bytes = 4194304; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  sync_arg_t a[2];
  pthread_t th[2];
  for (int t = 0; t < workers; t++) {
    a[t] = (sync_arg_t){.c = &c, .task = t};
    pthread_create(&th[t], NULL, sync_worker, &a[t]);
  }
  for (int t = 0; t < workers; t++) {
    pthread_join(th[t], NULL);
    assert_int_equal(a[t].failures, 0);
  }
  ts_client_t *cl = worker(&c, 0);
  expect_all(cl, want);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_sync_one_worker(void **state) {
  (void)state;
  run_sync(1, -3.0f); /* three steps of gradient 1 */
}

static void test_sync_two_workers(void **state) {
  (void)state;
  run_sync(2, -4.5f); /* three steps of the mean of 1 and 2 */
}

/* --- a peer that stops reading is dropped; the pushes it held up go on ----------------- */

static void test_stalled_reader(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2,
                                    "job = { mode = \"async\"; partition_bytes = 4194304; "
                                    "heartbeat_timeout_s = 1.0; heartbeat_interval_s = 0.2; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  ts_client_t *cl = worker(&c, 0);
  int fd = ts_raw_worker(c.port[0], 1, "stops-reading");
  assert_true(fd >= 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  /* Pull all 40 MiB and never read the reply: its partitions stay being written. */
  ts_raw_send_parts(fd, TS_MSG_PULL, 7, PARTS, PART_FLOATS);
  usleep(200 * 1000);

  float *g = filled(1.0f);
  char err[512];
  int rc = tc_push(cl, (const float *const *)&g, 0, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push: %s\n", err);
  assert_int_equal(rc, 0);
  expect_all(cl, -1.0f);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(log);
  if (!strstr(log, "has not read its replies")) {
    fprintf(stderr, "log lacks the stalled reader:\n%s\n", log);
    fail();
  }
  free(log);
  free(g);
  close(fd);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  ts_big_init(&big, PARTS, PART_FLOATS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_exact),
      cmocka_unit_test(test_nan_refuses_its_piece),
      cmocka_unit_test(test_sync_one_worker),
      cmocka_unit_test(test_sync_two_workers),
      cmocka_unit_test(test_stalled_reader),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
