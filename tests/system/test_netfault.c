/*
 * Faults on the network (issue "Hardening", item 5): two shards and two workers, each in a
 * network namespace of its own, joined by tests/system/netemu's switch. A job runs once
 * undisturbed and once with every packet delayed 10 ms ± 3 ms, 1% of them lost, worker 1
 * cut off for 5 s and then shard 1 cut off for 5 s, in sync and in async mode. The
 * disturbed job must finish with a test accuracy within 0.01 of the undisturbed one, no
 * sync barrier may wait much past job.sync_timeout_s (the shards' barrier-wait histogram),
 * and the logs must say what happened: the shards name the worker that went silent and
 * the one that came back, the workers name the shard they lost.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "netemu.h"
#include "ts_idx.h"
#include "ts_kernels.h"
#include "ts_model.h"

#define DATA "/usr/share/datasets/fashion-mnist/"
#define SHARDS 2
#define WORKERS 2
#define CTL 4 /* the node this test talks to the shards from */
#define PS_PORT 7100
#define HTTP_PORT 9100
#define CUT_S 5.0
#define SYNC_TIMEOUT_S 2.0
#define TOKEN "netfault-token-0123456789abcdef"
/* Adam's learning rates. Async's final parameters move by about the rate at every step, in
 * an order the network decides, so at a constant rate its final accuracy varies from run to
 * run: at 0.001 for 8 epochs, twelve undisturbed runs ended between 0.820 and 0.855, and a
 * clean-clone CI run failed with a disturbed run 0.012 below the lower of two undisturbed
 * ones. Async therefore lowers the rate on a cosine to 0 over the job's updates (each
 * partition takes ASYNC_UPDATES: both workers' pushes of every epoch), so the last steps
 * settle the parameters: six undisturbed runs then ended within 0.0014 of each other.
 * TS_NETFAULT_ONLY=sync|async runs one mode. */
#define SYNC_LR "0.002"
#define ASYNC_LR "0.001"
#define ASYNC_EPOCHS 8
#define BATCH 512
#define TRAIN_IMAGES 60000
#define ASYNC_UPDATES (ASYNC_EPOCHS * (TRAIN_IMAGES / (WORKERS * BATCH)) * WORKERS)

static ts_netemu_t *g_net;
static ts_dataset_t g_test; /* Fashion-MNIST's test set */
static const int g_widths[] = {784, 64, 10};

static int count_of(const char *path, const char *needle) {
  char *s = ts_read_file(path);
  int n = 0;
  for (const char *p = s ? strstr(s, needle) : NULL; p; p = strstr(p + 1, needle)) n++;
  free(s);
  return n;
}

static void dump(const char *path) {
  char *s = ts_read_file(path);
  fprintf(stderr, "--- %s:\n%s\n", path, s ? s : "(none)");
  free(s);
}

/* Open a TCP connection to addr:port from the calling thread's namespace; -1 on failure. */
static int tcp_connect(const char *addr, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  struct timeval tv = {5, 0};
  if (fd < 0) return -1;
  inet_pton(AF_INET, addr, &a.sin_addr);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* GET http://addr:port/path; the body (malloc'd, caller frees) or NULL. */
static char *http_get(const char *addr, int port, const char *path) {
  int fd = tcp_connect(addr, port);
  if (fd < 0) return NULL;
  char req[256];
  int len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                     path, addr);
  size_t cap = 1 << 20, got = 0;
  char *buf = write(fd, req, (size_t)len) == len ? malloc(cap) : NULL;
  ssize_t r;
  while (buf && got + 1 < cap && (r = read(fd, buf + got, cap - 1 - got)) > 0) got += (size_t)r;
  close(fd);
  if (!buf) return NULL;
  buf[got] = 0;
  char *body = strstr(buf, "\r\n\r\n");
  char *out = body ? strdup(body + 4) : NULL;
  free(buf);
  return out;
}

typedef struct {
  char dir[256], cfg[300], log[SHARDS][320];
  pid_t shard[SHARDS];
  ts_proc_t w[WORKERS];
  char metrics[SHARDS][1 << 14]; /* the barrier-wait histogram lines of each shard */
} job_t;

static int write_job(job_t *j, const char *mode, int epochs) {
  snprintf(j->dir, sizeof j->dir, "/tmp/tessera-netfault-XXXXXX");
  if (!mkdtemp(j->dir)) return -1;
  char token[300];
  snprintf(token, sizeof token, "%s/token", j->dir);
  FILE *f = fopen(token, "w");
  if (!f) return -1;
  fputs(TOKEN "\n", f);
  fclose(f);
  char decay[96];
  snprintf(decay, sizeof decay, "decay = \"cosine\"; decay_steps = %d;", ASYNC_UPDATES);
  snprintf(j->cfg, sizeof j->cfg, "%s/job.cfg", j->dir);
  f = fopen(j->cfg, "w");
  if (!f) return -1;
  const char *a[] = {ts_netemu_addr(g_net, 0), ts_netemu_addr(g_net, 1), ts_netemu_addr(g_net, 2),
                     ts_netemu_addr(g_net, 3)};
  fprintf(f,
          "cluster = { ps = [\"%s:%d\", \"%s:%d\"]; ps_http = [\"%s:%d\", \"%s:%d\"];\n"
          "  workers = [\"%s:%d\", \"%s:%d\"]; };\n"
          "auth = { token_file = \"%s\"; };\n"
          "job = { mode = \"%s\"; sync_timeout_s = %.1f; heartbeat_timeout_s = 2.0; "
          "heartbeat_interval_s = 0.25; };\n"
          "optimizer = { name = \"adam\"; learning_rate = %s; %s };\n"
          "model = { layers = [784, 64, 10]; };\n"
          "train = { batch_size = %d; epochs = %d; log_interval_s = 0.5; };\n",
          a[0], PS_PORT, a[1], PS_PORT, a[0], HTTP_PORT, a[1], HTTP_PORT, a[2], HTTP_PORT + 100,
          a[3], HTTP_PORT + 100, token, mode, SYNC_TIMEOUT_S,
          mode[0] == 'a' ? ASYNC_LR : SYNC_LR, mode[0] == 'a' ? decay : "", BATCH, epochs);
  fclose(f);
  return 0;
}

static void stop_shards(job_t *j) {
  for (int i = 0; i < SHARDS; i++)
    if (j->shard[i] > 0) kill(j->shard[i], SIGTERM);
  for (int i = 0; i < SHARDS; i++) {
    if (j->shard[i] <= 0) continue;
    int st = 0;
    for (int t = 0; t < 1000 && waitpid(j->shard[i], &st, WNOHANG) == 0; t++) ts_sleep_ms(10);
    if (kill(j->shard[i], 0) == 0) {
      kill(j->shard[i], SIGKILL);
      waitpid(j->shard[i], &st, 0);
    }
    j->shard[i] = 0;
  }
}

static int start_shards(job_t *j) {
  for (int i = 0; i < SHARDS; i++) {
    char idx[8];
    snprintf(idx, sizeof idx, "%d", i);
    snprintf(j->log[i], sizeof j->log[i], "%s/ps-%d.log", j->dir, i);
    const char *argv[] = {ts_ps_server_path, "-c", j->cfg, "--shard", idx, NULL};
    j->shard[i] = ts_netemu_spawn(g_net, i, argv, NULL, j->log[i]);
    if (j->shard[i] < 0) return -1;
  }
  for (int i = 0; i < SHARDS; i++) {
    int fd = -1;
    for (double t0 = ts_now_s(); fd < 0 && ts_now_s() - t0 < 20; ts_sleep_ms(50))
      fd = tcp_connect(ts_netemu_addr(g_net, i), PS_PORT);
    if (fd < 0) {
      dump(j->log[i]);
      return -1;
    }
    close(fd);
  }
  return 0;
}

static void start_workers(job_t *j) {
  for (int t = 0; t < WORKERS; t++) {
    ts_proc_t *p = &j->w[t];
    memset(p, 0, sizeof *p);
    snprintf(p->out, sizeof p->out, "%s/worker-%d.out", j->dir, t);
    snprintf(p->err, sizeof p->err, "%s/worker-%d.log", j->dir, t);
    char task[8];
    snprintf(task, sizeof task, "%d", t);
    const char *argv[] = {ts_ps_worker_path, "-c", j->cfg, "--task", task, NULL};
    p->pid = ts_netemu_spawn(g_net, SHARDS + t, argv, p->out, p->err);
    assert_true(p->pid > 0);
  }
}

static void say(double t0, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[%5.1f s] ", ts_now_s() - t0);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* Cut node off for CUT_S seconds. (A loaded machine may make it longer: said, not failed.) */
static void cut_off(double t0, int node, const char *what) {
  say(t0, "%s cut off for %.0f s", what, CUT_S);
  double c0 = ts_now_s();
  ts_netemu_cut(g_net, node, true);
  ts_sleep_ms((int)(CUT_S * 1000));
  ts_netemu_cut(g_net, node, false);
  say(t0, "%s joined again after %.1f s", what, ts_now_s() - c0);
}

/* The disturbances, in order, while the workers train. */
static void disturb(job_t *j, double t0) {
  for (int t = 0; t < WORKERS; t++)
    for (double w0 = ts_now_s(); ts_now_s() - w0 < 60 && count_of(j->w[t].err, "training:") == 0;)
      ts_sleep_ms(50);
  ts_sleep_ms(1000);
  cut_off(t0, SHARDS + 1, "worker 1");
  ts_sleep_ms(2000);
  cut_off(t0, 1, "shard 1");
}

/* The test accuracy of the parameters the shards hold at the end: in async mode the worker
 * that finishes first evaluates while the other still pushes, so its done: line is a
 * moment of the job, not its result. (As task 0, once the workers are done: declaring
 * takes a worker's role.) */
static double final_accuracy(void) {
  ts_model_t m;
  char err[512];
  assert_int_equal(ts_model_init(&m, g_widths, 3, TS_ACT_RELU, 1000, ts_kernels_cpu(), err, sizeof err), 0);
  ts_client_tensor_t decl[8];
  for (size_t i = 0; i < m.num_tensors; i++)
    decl[i] = (ts_client_tensor_t){m.tensors[i].name, m.tensors[i].shape, m.tensors[i].rank,
                                   (ts_client_init_t)m.tensors[i].init};
  char a0[32], a1[32];
  snprintf(a0, sizeof a0, "%s:%d", ts_netemu_addr(g_net, 0), PS_PORT);
  snprintf(a1, sizeof a1, "%s:%d", ts_netemu_addr(g_net, 1), PS_PORT);
  const char *addrs[] = {a0, a1};
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = addrs,
                        .num_shards = SHARDS, .task = 0, .identity = "netfault final accuracy", .token = TOKEN,
                        .connect_timeout_s = 10, .request_timeout_s = 10, .require_all = true};
  ts_client_t *cl = NULL;
  int rc = ts_client_open(&cl, &o, err, sizeof err);
  if (rc != 0) fprintf(stderr, "final_accuracy: %s\n", err);
  assert_int_equal(rc, 0);
  assert_int_equal(ts_client_declare(cl, decl, m.num_tensors, 42, err, sizeof err), 0);
  float *p = calloc(m.param_count, sizeof *p);
  assert_non_null(p);
  float *dst[8];
  for (size_t i = 0; i < m.num_tensors; i++) dst[i] = p + m.tensors[i].offset;
  assert_int_equal(tc_pull(cl, dst, 0, 0, NULL, err, sizeof err), 0);
  ts_client_close(cl);
  assert_int_equal(ts_model_set_params(&m, 0, p, m.param_count), 0);
  float acc = 0;
  assert_int_equal(ts_model_evaluate(&m, g_test.x, g_test.labels, g_test.n, &acc, NULL), 0);
  free(p);
  ts_model_destroy(&m);
  return acc;
}

/* Run the job; returns the lower of the workers' test accuracies. Leaves j->dir with the
 * logs (the caller removes it). */
static double run_job(job_t *j, const char *mode, int epochs, bool disturbed) {
  memset(j, 0, sizeof *j);
  assert_int_equal(write_job(j, mode, epochs), 0);
  ts_netemu_set(g_net, 0, 0, 0);
  assert_int_equal(start_shards(j), 0);
  double t0 = ts_now_s();
  if (disturbed) {
    ts_netemu_set(g_net, 10.0, 3.0, 0.01);
    say(t0, "%s job: every packet delayed 10 ms +- 3 ms, 1%% lost", mode);
  }
  start_workers(j);
  if (disturbed) disturb(j, t0);
  double acc = 1.0;
  for (int t = 0; t < WORKERS; t++) {
    int rc = ts_proc_wait(&j->w[t], 150);
    if (rc != 0) {
      dump(j->w[t].err);
      for (int i = 0; i < SHARDS; i++) dump(j->log[i]);
    }
    assert_int_equal(rc, 0);
    char *out = ts_read_file(j->w[t].out);
    const char *a = out ? strstr(out, "test_accuracy=") : NULL;
    assert_non_null(a);
    double v = atof(a + strlen("test_accuracy="));
    free(out);
    if (v < acc) acc = v;
  }
  ts_netemu_set(g_net, 0, 0, 0);
  double fin = final_accuracy();
  say(t0, "%s job %s: done; the workers' accuracy %.4f at the least, the final parameters' %.4f",
      mode, disturbed ? "disturbed" : "undisturbed", acc, fin);
  acc = fin;
  for (int i = 0; i < SHARDS; i++) {
    char *m = http_get(ts_netemu_addr(g_net, i), HTTP_PORT, "/metrics");
    assert_non_null(m);
    size_t len = 0;
    for (const char *l = m; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
      if (strncmp(l, "tessera_ps_barrier_wait_seconds", 31) == 0 && len + 200 < sizeof j->metrics[i])
        len += (size_t)snprintf(j->metrics[i] + len, sizeof j->metrics[i] - len, "%.*s\n",
                                (int)strcspn(l, "\n"), l);
    free(m);
  }
  stop_shards(j);
  /* In a sanitizer build, a report in any log fails the test (as the harness does). */
  const char *logs[] = {j->log[0], j->log[1], j->w[0].err, j->w[1].err};
  for (size_t i = 0; i < sizeof logs / sizeof *logs; i++) {
    bool clean = count_of(logs[i], "Sanitizer") + count_of(logs[i], "runtime error:") == 0;
    if (!clean) dump(logs[i]);
    assert_true(clean);
  }
  return acc;
}

static void remove_dir(job_t *j) {
  if (getenv("TS_KEEP_TEST_DIRS")) return;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", j->dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", j->dir);
}

/* Whether shard i's log says worker t came back: alive again (heard from), or connected
 * again from the worker's own address (final_accuracy's client connects as task 0 too). */
static bool came_back(job_t *j, int i, int t) {
  char again[64];
  snprintf(again, sizeof again, "worker %d reconnected from %s:", t, ts_netemu_addr(g_net, SHARDS + t));
  char alive[64];
  snprintf(alive, sizeof alive, "worker %d is alive again", t);
  return count_of(j->log[i], again) + count_of(j->log[i], alive) > 0;
}

/* Whether shard i's log says worker t went: silent, or its connection closed. */
static bool went(job_t *j, int i, int t) {
  char silent[64], closed[64];
  snprintf(silent, sizeof silent, "worker %d missed heartbeats", t);
  snprintf(closed, sizeof closed, "worker %d disconnected", t);
  return count_of(j->log[i], silent) + count_of(j->log[i], closed) > 0;
}

/* The log lines that say what happened, for the disturbed job j. */
static void check_logs(job_t *j, bool sync) {
  bool ok = true;
  /* Both shards saw worker 1 go and come back; shard 1 lost worker 0 too while it was cut
   * off. */
  for (int i = 0; i < SHARDS; i++) ok &= went(j, i, 1) && came_back(j, i, 1);
  ok &= went(j, 1, 0) && came_back(j, 1, 0);
  /* Each worker names the shard it lost, and a worker whose request failed with it says
   * what it does about it. Not every worker has one: a sync worker can be waiting on
   * shard 0's barrier (for the other worker, itself held up by shard 1) when the cut is
   * noticed, its requests to shard 1 answered, and its next one waits for the reconnection
   * instead of failing. At least one worker's does fail. */
  int retried = 0;
  for (int t = 0; t < WORKERS; t++) {
    ok &= count_of(j->w[t].err, "lost connection to shard 1") > 0;
    retried += count_of(j->w[t].err, "retrying") + count_of(j->w[t].err, "pulling again") > 0;
  }
  ok &= retried > 0;
  /* A sync job went on without worker 1 while it was cut off: it goes on from the job's
   * step when it is back, and says so (it does not train the steps it missed alone). */
  if (sync) ok &= count_of(j->w[1].err, "went on without this worker") > 0;
  if (!ok) {
    for (int i = 0; i < SHARDS; i++) dump(j->log[i]);
    for (int t = 0; t < WORKERS; t++) dump(j->w[t].err);
  }
  assert_true(ok);
}

/* How late shard i's own tick ran, in seconds, by its "worker T missed heartbeats for X s"
 * lines (job.heartbeat_timeout_s is 2.0: X - 2.0 is the tick's lateness). */
static double tick_lateness(job_t *j, int i) {
  char *log = ts_read_file(j->log[i]);
  double late = 0;
  const char *key = "missed heartbeats for ";
  for (const char *p = log ? strstr(log, key) : NULL; p; p = strstr(p + 1, key)) {
    double x = atof(p + strlen(key)) - 2.0;
    if (x > late) late = x;
  }
  free(log);
  return late;
}

/* No sync barrier waited past job.sync_timeout_s: every observation of the shards'
 * barrier-wait histogram is in the first bucket at or above the timeout plus 0.5 s (the
 * shard's tick on a loaded machine), or plus how late the shard's tick (by its own log) or
 * this process (the switch) ran when that was more. */
static void check_barrier_waits(job_t *j, double stall_s) {
  static const char *const buckets[] = {"2.5", "5", "10", "30", "60"};
  for (int i = 0; i < SHARDS; i++) {
    double late = tick_lateness(j, i);
    if (stall_s > late) late = stall_s;
    double slack = late > 0.25 ? late + 0.25 : 0.5;
    const char *le = "+Inf";
    for (size_t k = 0; k < sizeof buckets / sizeof *buckets; k++) {
      if (atof(buckets[k]) >= SYNC_TIMEOUT_S + slack) {
        le = buckets[k];
        break;
      }
    }
    char series[128];
    snprintf(series, sizeof series, "tessera_ps_barrier_wait_seconds_bucket{le=\"%s\"}", le);
    double in = ts_metric_value(j->metrics[i], series);
    double all = ts_metric_value(j->metrics[i], "tessera_ps_barrier_wait_seconds_count");
    fprintf(stderr, "shard %d: %.0f barriers closed, %.0f of them within %s s (late by %.1f s)\n",
            i, all, in, le, late);
    if (!(all > 0 && in == all)) fprintf(stderr, "%s", j->metrics[i]);
    assert_true(all > 0);
    assert_true(in == all);
  }
}

static void run_mode(const char *mode, int epochs) {
  bool sync = strcmp(mode, "sync") == 0;
  job_t *base = calloc(1, sizeof *base), *hit = calloc(1, sizeof *hit);
  assert_non_null(base);
  assert_non_null(hit);
  /* Sync training is deterministic up to the barriers that time out: one undisturbed run is
   * the reference. Async is not: which worker's update lands first changes the result, and
   * undisturbed runs differed by up to 0.016 here, so the reference is the range of two
   * undisturbed runs. */
  double lo = run_job(base, mode, epochs, false), hi = lo;
  remove_dir(base);
  if (!sync) {
    double again = run_job(base, mode, epochs, false);
    remove_dir(base);
    if (again < lo) lo = again;
    if (again > hi) hi = again;
  }
  ts_netemu_stats_t s0 = ts_netemu_stats(g_net);
  double a1 = run_job(hit, mode, epochs, true);
  ts_netemu_stats_t s1 = ts_netemu_stats(g_net);
  fprintf(stderr,
          "%s: accuracy %.4f..%.4f undisturbed, %.4f disturbed; the switch lost %llu packets "
          "at random and %llu to the cuts, forwarded %llu; longest machine stall %.1f s\n",
          mode, lo, hi, a1, (unsigned long long)(s1.lost - s0.lost),
          (unsigned long long)(s1.cut - s0.cut), (unsigned long long)(s1.forwarded - s0.forwarded),
          (double)s1.max_stall_ns * 1e-9);
  assert_true(s1.lost > s0.lost);
  assert_true(s1.cut > s0.cut);
  check_logs(hit, sync);
  if (sync) check_barrier_waits(hit, (double)s1.max_stall_ns * 1e-9);
  assert_true(a1 >= lo - 0.01);
  assert_true(a1 <= hi + 0.01);
  remove_dir(hit);
  free(base);
  free(hit);
}

static void test_sync_faults(void **state) {
  (void)state;
  if (getenv("TS_NETFAULT_ONLY") && strcmp(getenv("TS_NETFAULT_ONLY"), "sync") != 0) skip();
  run_mode("sync", 6);
}

static void test_async_faults(void **state) {
  (void)state;
  if (getenv("TS_NETFAULT_ONLY") && strcmp(getenv("TS_NETFAULT_ONLY"), "async") != 0) skip();
  run_mode("async", ASYNC_EPOCHS);
}

static int setup(void **state) {
  (void)state;
  char why[256];
  if (ts_idx_load_pair(DATA "t10k-images-idx3-ubyte.gz", DATA "t10k-labels-idx1-ubyte.gz",
                       &g_test, why, sizeof why) != 0) {
    fprintf(stderr, "netfault: Fashion-MNIST is not installed (apt-get install "
                    "dataset-fashion-mnist): %s\n", why);
    return 0;
  }
  int rc = ts_netemu_start(&g_net, SHARDS + WORKERS + 1, why, sizeof why);
  if (rc != 0) {
    fprintf(stderr, "netfault: %s%s\n", rc == 77 ? "skipped: " : "", why);
    ts_netemu_stop(g_net);
    g_net = NULL;
    return rc == 77 ? 0 : -1;
  }
  if (ts_netemu_enter(g_net, CTL) != 0) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ts_netemu_stop(g_net);
  g_net = NULL;
  ts_dataset_free(&g_test);
  return 0;
}

static void run_or_skip(void (*fn)(void **), void **state) {
  if (!g_net) TS_SKIP("no network namespaces or no Fashion-MNIST here (see above)");
  fn(state);
}

static void test_sync(void **state) { run_or_skip(test_sync_faults, state); }
static void test_async(void **state) { run_or_skip(test_async_faults, state); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sync),
      cmocka_unit_test(test_async),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("netfault", tests, setup, teardown));
}
