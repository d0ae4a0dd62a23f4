/*
 * Failures survived (issue "Reliability and security"): dead and stopped workers in sync
 * mode, a killed worker that does not stop the job's final report, a shard killed and restored from its checkpoint, hostile traffic during training,
 * admin authorization. Real ps-server and ps-worker processes on loopback.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "rawconn.h"
#include "calls.h"
#include "ts_frame.h"
#include "ts_msg.h"

/* psctl status --output json: the job's step and the sum of a shard counter; -1 on error. */
static long long job_field(ts_cluster_t *c, const char *shard_field, long long *sum) {
  char out[65536], err[4096];
  const char *argv[] = {ts_psctl_path, "-c", c->config, "-o", "json", "status", NULL};
  if (ts_run_capture(argv, out, sizeof out, err, sizeof err) != 0) return -1;
  cJSON *j = cJSON_Parse(out);
  if (!j) return -1;
  long long step = (long long)cJSON_GetObjectItem(j, "step")->valuedouble;
  if (sum) {
    *sum = 0;
    cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItem(j, "shards")) {
      cJSON *v = cJSON_GetObjectItem(sh, shard_field);
      if (v) *sum += (long long)v->valuedouble;
    }
  }
  cJSON_Delete(j);
  return step;
}

/* Gradient partitions of `task` the shards dropped as stale. */
static uint64_t task_stale(ts_cluster_t *c, int task) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs, .num_shards = (size_t)c->num_shards, .admin = true,
                        .task = -1, .connect_timeout_s = 5, .request_timeout_s = 5,
                        .require_all = true};
  ts_client_t *cl = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), 0);
  uint64_t n = 0;
  for (int s = 0; s < c->num_shards; s++) {
    ts_client_shard_status_t *st = NULL;
    assert_int_equal(ts_client_status(cl, (uint32_t)s, &st, err, sizeof err), 0);
    for (size_t i = 0; i < st->num_workers_seen; i++)
      if (st->workers[i].task == task) n += st->workers[i].stale_dropped;
    ts_client_status_free(st);
  }
  ts_client_close(cl);
  return n;
}

static void wait_for_step(ts_cluster_t *c, long long step, double timeout) {
  double t0 = ts_now_s();
  while (ts_now_s() - t0 < timeout && job_field(c, "", NULL) < step) ts_sleep_ms(50);
}

/* --- sync, 3 workers: one killed mid-training, the others go on; it rejoins ---------- */

static void test_sync_worker_killed_and_rejoins(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 3,
                                    "job = { mode = \"sync\"; sync_timeout_s = 2.0; "
                                    "heartbeat_timeout_s = 2.0; heartbeat_interval_s = 0.25; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "train = { batch_size = 32; epochs = 10; max_steps = 6000; log_interval_s = 0.5; };"),
                   0);
  /* 6000 steps (an epoch is 625), so that the job is still running when the killed worker
   * is back: two workers make 700 steps a second on a slow host and 5000 on a fast one, and
   * a worker that joins a job at its last step has nothing to train (exit 3,
   * tests/system/test_rerun.c). */
  ts_proc_t w[3];
  for (int t = 0; t < 3; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  wait_for_step(&c, 100, 30);
  kill(w[2].pid, SIGKILL);
  assert_int_equal(ts_proc_wait(&w[2], 10), 128 + SIGKILL);
  long long at_kill = job_field(&c, "", NULL);
  assert_true(at_kill >= 100);
  /* The other two keep making steps within sync_timeout_s + 2 s. */
  double t0 = ts_now_s();
  wait_for_step(&c, at_kill + 20, 4.0);
  long long after = job_field(&c, "", NULL);
  fprintf(stderr, "killed worker 2 at step %lld; %.2f s later the job is at step %lld\n", at_kill,
          ts_now_s() - t0, after);
  assert_true(after >= at_kill + 20);
  /* Restarted, it rejoins at the job's step and finishes with the others. The shards are
   * held (SIGSTOP, well within the workers' heartbeat timeout) while it loads its data, so
   * that a fast host does not finish the job before it is back. */
  for (int s = 0; s < 2; s++) ts_cluster_signal(&c, s, SIGSTOP);
  assert_int_equal(ts_worker_start(&c, 2, NULL, &w[2]), 0);
  bool loaded = ts_proc_wait_log(&w[2], "connecting to 2 shard(s)", 30);
  for (int s = 0; s < 2; s++) ts_cluster_signal(&c, s, SIGCONT);
  assert_true(loaded);
  for (int t = 0; t < 3; t++) {
    int rc = ts_proc_wait(&w[t], 90);
    if (rc != 0) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
  }
  assert_true(ts_file_has(w[2].err, "joining the job at step"));
  assert_true(ts_file_has(w[2].out, "done: task=2"));
  /* One of them, and one only, reported the job's final accuracy. */
  int reports = 0;
  for (int t = 0; t < 3; t++) reports += ts_done_field(&w[t], "final_test_accuracy=") >= 0;
  assert_int_equal(reports, 1);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Async: a worker killed for good counts as finished once it has been silent for
 * job.heartbeat_timeout_s, so the survivor, the last worker, reports the job's final
 * accuracy instead of waiting for it forever. */
static void test_async_worker_killed_final_report(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"async\"; heartbeat_timeout_s = 1.0; "
                                    "heartbeat_interval_s = 0.25; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "train = { max_steps = 3000; log_interval_s = 0.5; };"),
                   0);
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  wait_for_step(&c, 100, 30);
  kill(w[1].pid, SIGKILL);
  assert_int_equal(ts_proc_wait(&w[1], 10), 128 + SIGKILL);
  int rc = ts_proc_wait(&w[0], 90);
  if (rc != 0) ts_proc_dump(&w[0]);
  assert_int_equal(rc, 0);
  double fin = ts_done_field(&w[0], "final_test_accuracy=");
  fprintf(stderr, "worker 1 killed; worker 0 reported final_test_accuracy=%.6f\n", fin);
  assert_true(fin > 0.5 && fin <= 1.0);
  assert_true(ts_file_has(w[0].err, "every worker finished: the final parameters"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- sync, 3 workers, 2 to aggregate: a stopped worker slows nothing ---------------- */

/* An admin client of the cluster's shards. */
static ts_client_t *admin_client(ts_cluster_t *c) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs,
                        .num_shards = (size_t)c->num_shards, .admin = true, .task = -1,
                        .connect_timeout_s = 5, .request_timeout_s = 5, .require_all = true};
  ts_client_t *cl = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&cl, &o, err, sizeof err), 0);
  return cl;
}

/* Each shard's step (sync: its lowest partition version) into step[]. */
static void shard_steps(ts_client_t *cl, int num_shards, uint64_t *step) {
  char err[512];
  for (int s = 0; s < num_shards; s++) {
    ts_client_shard_status_t *st = NULL;
    assert_int_equal(ts_client_status(cl, (uint32_t)s, &st, err, sizeof err), 0);
    step[s] = st->step;
    ts_client_status_free(st);
  }
}

/* Barriers of all shards that waited longer than 5 s (tessera_ps_barrier_wait_seconds:
 * every barrier closed, minus those within the 5 s bucket). */
static double long_barrier_waits(ts_cluster_t *c) {
  double n = 0;
  for (int s = 0; s < c->num_shards; s++) {
    static char body[1 << 17];
    assert_int_equal(ts_http_get(c->http_port[s], "/metrics", body, sizeof body, NULL, 0), 200);
    double all = ts_metric_value(body, "tessera_ps_barrier_wait_seconds_bucket{le=\"+Inf\"}");
    double quick = ts_metric_value(body, "tessera_ps_barrier_wait_seconds_bucket{le=\"5\"}");
    assert_true(all >= 0 && quick >= 0);
    n += all - quick;
  }
  return n;
}

static void test_sync_backup_worker_stopped(void **state) {
  (void)state;
  ts_cluster_t c;
  /* Nothing but the live workers' gradients may close a barrier while worker 2 is stopped:
   * the window watched below (6 s) ends before any rule gives up on a worker (the sync
   * timeout, 30 s; missed heartbeats, 20 s; a peer that reads no replies is dropped after
   * half of that). No max_steps: the job must not run out of steps in the window (with
   * max_steps = 5000 a quiet machine, at 2,000 steps/s, reached it there, and the step
   * of a finished job stands still); the workers get SIGTERM after it. */
  assert_int_equal(ts_cluster_start(&c, 2, 3,
                                    "job = { mode = \"sync\"; replicas_to_aggregate = 2; "
                                    "sync_timeout_s = 30.0; heartbeat_timeout_s = 20.0; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "train = { batch_size = 32; epochs = 1000; "
                                    "log_interval_s = 0.5; };"),
                   0);
  ts_proc_t w[3];
  for (int t = 0; t < 3; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  wait_for_step(&c, 50, 30);
  ts_client_t *cl = admin_client(&c);
  ts_sleep_ms(300); /* /metrics is published every 250 ms */
  double long_before = long_barrier_waits(&c);
  kill(w[2].pid, SIGSTOP);
  /* Every shard's step, about every 50 ms for 6 s. With two of three gradients to
   * aggregate the two live workers close every barrier themselves, so no shard's step
   * stands still for long; a barrier that waited for the stopped worker would hold its
   * shard's step for the rest of the window. 3 s leaves room for a loaded machine (at
   * 1.5 s of a 3 s window, stress-ng beside the suite could deschedule the live workers
   * past it). */
  uint64_t first[TS_CLUSTER_MAX], last[TS_CLUSTER_MAX], step[TS_CLUSTER_MAX];
  double changed[TS_CLUSTER_MAX], longest[TS_CLUSTER_MAX] = {0};
  double t0 = ts_now_s();
  shard_steps(cl, c.num_shards, first);
  for (int s = 0; s < c.num_shards; s++) {
    last[s] = first[s];
    changed[s] = t0;
  }
  while (ts_now_s() - t0 < 6.0) {
    ts_sleep_ms(50);
    shard_steps(cl, c.num_shards, step);
    double t = ts_now_s();
    for (int s = 0; s < c.num_shards; s++) {
      if (step[s] != last[s]) {
        last[s] = step[s];
        changed[s] = t;
      }
      if (t - changed[s] > longest[s]) longest[s] = t - changed[s];
    }
  }
  uint64_t stale_before = task_stale(&c, 2);
  kill(w[2].pid, SIGCONT);
  /* Resumed, worker 2 pushes for steps the others closed without it: dropped as stale. */
  for (int i = 0; i < 100 && task_stale(&c, 2) == stale_before; i++) ts_sleep_ms(50);
  uint64_t stale_after = task_stale(&c, 2);
  ts_sleep_ms(300);
  double long_after = long_barrier_waits(&c);
  for (int s = 0; s < c.num_shards; s++)
    fprintf(stderr,
            "shard %d: step %llu -> %llu while worker 2 was stopped for 6 s; at most %.2f s "
            "without a new step\n",
            s, (unsigned long long)first[s], (unsigned long long)last[s], longest[s]);
  fprintf(stderr,
          "barriers that waited over 5 s: %.0f before, %.0f after; worker 2's stale gradient "
          "partitions: %llu before SIGCONT, %llu after\n",
          long_before, long_after, (unsigned long long)stale_before,
          (unsigned long long)stale_after);
  bool frozen = false;
  for (int s = 0; s < c.num_shards; s++) frozen |= longest[s] >= 3.0;
  if (frozen || long_after != long_before) {
    for (int i = 0; i < c.num_shards; i++) {
      char *log = ts_cluster_log(&c, i);
      fprintf(stderr, "--- shard %d log:\n%s\n", i, log ? log : "(none)");
      free(log);
    }
  }
  for (int s = 0; s < c.num_shards; s++) assert_true(longest[s] < 3.0);
  assert_true(long_after == long_before); /* no barrier waited for the stopped worker */
  assert_true(stale_after > stale_before);
  /* The steps came from the two live workers' barriers alone: nothing gave up on worker 2
   * (missed heartbeats, the sync timeout, a dropped connection), and the job was still
   * training (no worker finished: a job that ran out of steps also stands still). */
  for (int i = 0; i < c.num_shards; i++) {
    char *log = ts_cluster_log(&c, i);
    assert_non_null(log);
    assert_null(strstr(log, "missed heartbeats"));
    assert_null(strstr(log, "proceeds after"));
    assert_null(strstr(log, "worker 2 disconnected"));
    assert_null(strstr(log, "finished at step"));
    free(log);
  }
  ts_client_close(cl);
  for (int t = 0; t < 3; t++) kill(w[t].pid, SIGTERM);
  for (int t = 0; t < 3; t++) {
    int rc = ts_proc_wait(&w[t], 30);
    if (rc != 0) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
  }
  /* The job went on without it: it goes on from the job's step, not its own. */
  if (!ts_file_has(w[2].err, "went on without this worker")) ts_proc_dump(&w[2]);
  assert_true(ts_file_has(w[2].err, "went on without this worker"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- a shard killed during training and restarted from its checkpoint ------------- */

static const char *demo_job =
    "job = { mode = \"sync\"; partition_bytes = 131072; sync_timeout_s = 10.0; };\n"
    "optimizer = { name = \"adam\"; learning_rate = 0.002; };\n"
    "model = { layers = [784, 128, 10]; };\n"
    "train = { batch_size = 64; epochs = 2; log_interval_s = 0.5; };\n";
/* (2 epochs: 936 sync steps; test_shard_killed_and_restored trains 3, 1404, and kills a
 * shard after step 400.) */

/* How many times `what` occurs in shard i's log. */
/* The step of shard i's last "checkpoint written: PATH (step N, ..." line, or -1. */
static long last_checkpoint_step(ts_cluster_t *c, int i) {
  char *log = ts_cluster_log(c, i);
  long step = -1;
  const char *key = "checkpoint written: ";
  for (const char *p = log ? strstr(log, key) : NULL; p; p = strstr(p + 1, key)) {
    const char *q = strstr(p, "(step ");
    const char *eol = strchr(p, '\n');
    if (q && (!eol || q < eol)) step = atol(q + strlen("(step "));
  }
  free(log);
  return step;
}

static double train_two(ts_cluster_t *c, bool kill_shard, double *restart_to_pull_ms) {
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(c, t, NULL, &w[t]), 0);
  if (kill_shard) {
    wait_for_step(c, 400, 60);
    /* Wait for a checkpoint of shard 1 taken at step 400 or later (one every 0.25 s), then
     * kill it, so the steps lost with the kill are a few milliseconds' worth and the
     * accuracy check is fair. Its step, not its line: on a loaded machine a checkpoint
     * begun at step 96 was written only after step 400 (1.2 s), and killing then lost 300
     * steps of shard 1. */
    for (int i = 0; i < 3000 && last_checkpoint_step(c, 1) < 400; i++) ts_sleep_ms(10);
    long at = last_checkpoint_step(c, 1);
    fprintf(stderr, "shard 1 killed after its checkpoint of step %ld\n", at);
    assert_true(at >= 400);
    ts_cluster_signal(c, 1, SIGKILL);
    ts_sleep_ms(500);
    assert_int_equal(ts_cluster_start_shard(c, 1), 0);
  }
  double acc = 1.0;
  for (int t = 0; t < 2; t++) {
    int rc = ts_proc_wait(&w[t], 110);
    if (rc != 0) ts_proc_dump(&w[t]);
    assert_int_equal(rc, 0);
    double a = ts_done_field(&w[t], "test_accuracy=");
    if (a < acc) acc = a;
  }
  if (kill_shard) {
    char *log = ts_cluster_log(c, 1);
    if (!strstr(log, "restored checkpoint")) fprintf(stderr, "shard 1 log:\n%s\n", log);
    assert_non_null(strstr(log, "restored checkpoint"));
    const char *p = strstr(log, "first pull served ");
    /* The restarted process's line is the last one. */
    for (const char *q = p; q; q = strstr(q + 1, "first pull served ")) p = q;
    assert_non_null(p);
    *restart_to_pull_ms = atof(p + strlen("first pull served "));
    free(log);
  }
  return acc;
}

static void test_shard_killed_and_restored(void **state) {
  (void)state;
  char job[2048];
  ts_cluster_t c;
  /* 3 epochs (1404 steps): checkpoints of step 400 or later are written well before the
   * end, even on a loaded machine. */
  char demo3[1024];
  snprintf(demo3, sizeof demo3, "%s", demo_job);
  char *ep = strstr(demo3, "epochs = 2;");
  assert_non_null(ep);
  ep[strlen("epochs = ")] = '3';
  assert_int_equal(ts_cluster_start(&c, 2, 2, demo3), 0);
  double base = train_two(&c, false, NULL);
  assert_int_equal(ts_cluster_stop(&c), 0);

  char dir[] = "/tmp/tessera-ckpt-XXXXXX";
  assert_non_null(mkdtemp(dir));
  snprintf(job, sizeof job, "%scheckpoint = { dir = \"%s\"; interval_s = 0.25; keep = 3; };\n",
           demo3, dir);
  assert_int_equal(ts_cluster_start(&c, 2, 2, job), 0);
  double ms = 0;
  double acc = train_two(&c, true, &ms);
  fprintf(stderr,
          "accuracy %.4f uninterrupted, %.4f with shard 1 killed and restored; restart to first "
          "served pull: %.0f ms\n",
          base, acc, ms);
  assert_true(fabs(acc - base) <= 0.01);
  assert_int_equal(ts_cluster_stop(&c), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* --- hostile traffic while a job trains ------------------------------------------ */

typedef struct {
  int port;
  volatile int stop;
  long sent;
} hostile_arg_t;

static void *hostile(void *p) {
  hostile_arg_t *h = p;
  uint8_t *junk = malloc(1 << 20);
  for (int i = 0; i < (1 << 20); i++) junk[i] = (uint8_t)(i * 7919u >> 3);
  while (!__atomic_load_n(&h->stop, __ATOMIC_SEQ_CST)) {
    /* random bytes */
    int fd = ts_raw_connect(h->port);
    if (fd >= 0) {
      send(fd, junk, 1 << 20, MSG_NOSIGNAL);
      close(fd);
    }
    /* an oversized header */
    fd = ts_raw_connect(h->port);
    if (fd >= 0) {
      uint8_t hdr[TS_FRAME_HEADER_SIZE];
      ts_frame_encode_header(hdr, TS_MSG_PUSH, 16, UINT64_C(8) << 30);
      send(fd, hdr, sizeof hdr, MSG_NOSIGNAL);
      close(fd);
    }
    /* a push flood from an admin session that never reads its replies */
    fd = ts_raw_connect(h->port);
    if (fd >= 0) {
      uint8_t buf[4096];
      recv(fd, buf, sizeof buf, 0); /* Hello */
      Tessera__Handshake hs = TESSERA__HANDSHAKE__INIT;
      hs.request_id = 1;
      hs.protocol = TS_PROTOCOL_VERSION;
      hs.role = TESSERA__ROLE__ROLE_ADMIN;
      hs.task = -1;
      size_t n = ts_msg_encode(TS_MSG_HANDSHAKE, &hs.base, 0, buf);
      send(fd, buf, n, MSG_NOSIGNAL);
      Tessera__PartSlice sl = TESSERA__PART_SLICE__INIT;
      Tessera__PartSlice *slp[] = {&sl};
      sl.count = 1 << 18;
      Tessera__Push push = TESSERA__PUSH__INIT;
      push.parts = slp;
      push.n_parts = 1;
      for (int i = 0; i < 200 && !__atomic_load_n(&h->stop, __ATOMIC_SEQ_CST); i++) {
        push.request_id = (uint64_t)i + 2;
        n = ts_msg_encode(TS_MSG_PUSH, &push.base, (uint64_t)1 << 20, buf);
        if (send(fd, buf, n, MSG_NOSIGNAL) < 0 || send(fd, junk, 1 << 20, MSG_NOSIGNAL) < 0) break;
        h->sent++;
      }
      close(fd);
    }
  }
  free(junk);
  return NULL;
}

/* The sum of every sample of a /metrics family (all its label sets), 0 when absent. */
static double metric_family_sum(const char *text, const char *family) {
  size_t n = strlen(family);
  double sum = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, family, n) != 0 || (l[n] != '{' && l[n] != ' ')) continue;
    const char *v = strchr(l, ' ');
    if (v) sum += strtod(v + 1, NULL);
  }
  return sum;
}

/* What shard 0 refused or dropped of the hostile traffic, by the counter each limit
 * increments: which limit answers first depends on how the machine schedules the
 * attacker and the shard (the junk of a connection reset before the shard reads it
 * counts nowhere; a flood's pushes are refused for the role, or its connection is closed
 * by a reply budget or the frame rate floor first). Waits up to 10 s for the admin
 * endpoint's snapshot (published every 250 ms) to show any. */
static double hostile_refusals(const ts_cluster_t *c) {
  static char body[1 << 18];
  static const char *const families[] = {
      "tessera_ps_rejected_frames_total",      /* protocol violations that closed a connection */
      "tessera_ps_limit_drops_total",          /* reply budgets, staging and hold limits */
      "tessera_ps_connections_dropped_total",  /* handshake deadline, preauth quota, rate floor */
  };
  double total = 0;
  for (double t0 = ts_now_s(); total <= 0 && ts_now_s() - t0 < 10.0; ts_sleep_ms(250)) {
    if (ts_http_get(c->http_port[0], "/metrics", body, sizeof body, NULL, 0) != 200) continue;
    double refused = ts_metric_value(body, "tessera_ps_refused_requests_total{request=\"push\","
                                           "reason=\"role\"}");
    total = refused > 0 ? refused : 0;
    fprintf(stderr, "shard 0: %.0f flood pushes refused for the role", total);
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
      double v = metric_family_sum(body, families[i]);
      fprintf(stderr, ", %s %.0f", families[i], v);
      total += v;
    }
    fprintf(stderr, "\n");
  }
  return total;
}

static void test_hostile_traffic_during_training(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2, demo_job), 0);
  double base = train_two(&c, false, NULL);
  assert_int_equal(ts_cluster_stop(&c), 0);

  assert_int_equal(ts_cluster_start(&c, 2, 2, demo_job), 0);
  hostile_arg_t h = {.port = c.port[0]};
  pthread_t th;
  pthread_create(&th, NULL, hostile, &h);
  long peak = 0;
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, NULL, &w[t]), 0);
  while (w[0].pid > 0 || w[1].pid > 0) {
    long rss = ts_proc_rss_kib(c.pid[0]);
    if (rss > peak) peak = rss;
    for (int t = 0; t < 2; t++) {
      if (w[t].pid > 0) {
        int st;
        if (waitpid(w[t].pid, &st, WNOHANG) == w[t].pid) {
          w[t].pid = 0;
          w[t].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        }
      }
    }
    ts_sleep_ms(20);
  }
  __atomic_store_n(&h.stop, 1, __ATOMIC_SEQ_CST);
  pthread_join(th, NULL);
  double acc = 1.0;
  for (int t = 0; t < 2; t++) {
    if (w[t].status != 0) ts_proc_dump(&w[t]);
    assert_int_equal(w[t].status, 0);
    double a = ts_done_field(&w[t], "test_accuracy=");
    if (a < acc) acc = a;
  }
  double refused = hostile_refusals(&c);
  fprintf(stderr,
          "hostile traffic: %ld flood pushes of 1 MiB, %.0f refusals and drops; accuracy %.4f "
          "(%.4f undisturbed); shard 0 peak RSS %.1f MiB\n",
          h.sent, refused, acc, base, (double)peak / 1024.0);
  if (fabs(acc - base) >= 1e-9) {
    /* Sync training is deterministic: something made a barrier close short. Show why. */
    for (int t = 0; t < 2; t++) ts_proc_dump(&w[t]);
    for (int i = 0; i < 2; i++) {
      char *log = ts_cluster_log(&c, i);
      fprintf(stderr, "--- shard %d log:\n%s\n", i, log ? log : "(none)");
      free(log);
    }
  }
  assert_true(fabs(acc - base) < 1e-9);
  /* Refused or dropped, by whichever limit came first (none of it changed a parameter: the
   * accuracy above is exact). */
  assert_true(refused > 0);
  /* Bound: the shard's parameters are 0.4 MiB; buffers and the process itself stay far
   * below 64 MiB whatever the traffic announces. */
  assert_true(peak < 64 * 1024);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* --- a worker token cannot shut the job down ------------------------------------- */

static void test_admin_needs_admin_token(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-tok-XXXXXX", wt[300], at[300], job[800];
  assert_non_null(mkdtemp(dir));
  snprintf(wt, sizeof wt, "%s/worker.token", dir);
  snprintf(at, sizeof at, "%s/admin.token", dir);
  FILE *f = fopen(wt, "w");
  fputs("worker-token-0123456789abcdef\n", f);
  fclose(f);
  f = fopen(at, "w");
  fputs("admin-token-fedcba9876543210\n", f);
  fclose(f);
  snprintf(job, sizeof job, "auth = { token_file = \"%s\"; admin_token_file = \"%s\"; };", wt, at);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, job), 0);
  char out[8192], err[8192];
  /* psctl with only the worker token: it may read (docs/security.md), not shut down. */
  const char *worker_only[] = {ts_psctl_path, "-c", c.config, "--set", "auth.admin_token_file=\"\"",
                               "shutdown", NULL};
  int rc = ts_run_capture(worker_only, out, sizeof out, err, sizeof err);
  assert_true(rc != 0);
  assert_non_null(strstr(err, "needs the admin token"));
  /* The shard is still up, and logged the refusal. */
  const char *status[] = {ts_psctl_path, "-c", c.config, "-o", "json", "shards", NULL};
  assert_int_equal(ts_run_capture(status, out, sizeof out, err, sizeof err), 0);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(strstr(log, "refused: EPERM: shutdown needs the admin token"));
  free(log);
  /* With the admin token it works. */
  const char *admin[] = {ts_psctl_path, "-c", c.config, "shutdown", NULL};
  rc = ts_run_capture(admin, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "stopped"));
  ts_sleep_ms(300);
  assert_int_equal(ts_cluster_stop(&c), 0);
  remove(wt);
  remove(at);
  rmdir(dir);
}

/* --- the barrier names whom it waits for; uneven workers never hang it ------------- */

static void test_barrier_waits_for_and_uneven_workers(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"sync\"; sync_timeout_s = 30.0; "
                                    "heartbeat_timeout_s = 30.0; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "train = { batch_size = 32; epochs = 5; max_steps = 3000; log_interval_s = 0.5; };"),
                   0);
  ts_proc_t w0, w1;
  /* Worker 0 stops after 2000 steps, worker 1 goes on to 3000: the barrier must not wait
   * for the one that is done. Worker 1 is stopped (below) while worker 0 still trains, so
   * a barrier is open with worker 0's gradient and waits for worker 1's: 2000 steps leave
   * room however far past step 100 the job is when the test looks (at 300, a fast machine
   * sometimes had worker 0 done already, and then no barrier was open to wait). */
  const char *short_run[] = {"--set", "train.max_steps=2000", NULL};
  assert_int_equal(ts_worker_start(&c, 0, short_run, &w0), 0);
  assert_int_equal(ts_worker_start(&c, 1, NULL, &w1), 0);
  wait_for_step(&c, 100, 30);
  /* Stop worker 1 and ask whom the barrier waits for. */
  kill(w1.pid, SIGSTOP);
  ts_sleep_ms(300);
  char out[65536], err[4096];
  const char *argv[] = {ts_psctl_path, "-c", c.config, "-o", "json", "status", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  bool names_1 = false;
  cJSON *sh;
  cJSON_ArrayForEach(sh, cJSON_GetObjectItem(j, "shards")) {
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(sh, "barrier_waiting_for")) names_1 |= t->valueint == 1;
  }
  cJSON_Delete(j);
  if (!names_1) fprintf(stderr, "status:\n%s\n", out);
  assert_true(names_1);
  const char *table[] = {ts_psctl_path, "-c", c.config, "shards", NULL};
  assert_int_equal(ts_run_capture(table, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "barrier waits for task 1"));
  kill(w1.pid, SIGCONT);
  int rc0 = ts_proc_wait(&w0, 60), rc1 = ts_proc_wait(&w1, 120);
  if (rc0 != 0) ts_proc_dump(&w0);
  if (rc1 != 0) ts_proc_dump(&w1);
  assert_int_equal(rc0, 0);
  assert_int_equal(rc1, 0);
  assert_true(ts_file_has(w0.out, "done: task=0 steps=2000"));
  assert_true(ts_file_has(w1.out, "done: task=1 steps=3000"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sync_worker_killed_and_rejoins),
      cmocka_unit_test(test_async_worker_killed_final_report),
      cmocka_unit_test(test_sync_backup_worker_stopped),
      cmocka_unit_test(test_shard_killed_and_restored),
      cmocka_unit_test(test_hostile_traffic_during_training),
      cmocka_unit_test(test_admin_needs_admin_token),
      cmocka_unit_test(test_barrier_waits_for_and_uneven_workers),
  };
  /* TS_TEST_FILTER=test_sync_backup_worker_stopped runs one case (cmocka's own filter). */
  const char *only = getenv("TS_TEST_FILTER");
  if (only && *only) cmocka_set_test_filter(only);
  return cmocka_run_group_tests_name("failures", tests, NULL, NULL);
}
