/*
 * psctl against a real training job (ps-server and ps-worker processes on Fashion-MNIST):
 * in sync mode every live worker's step stays within one of the job's step in
 * `psctl -o json status`, sampled while the job trains; the DEVICE each worker really uses
 * (a worker placed on /gpu:0 with soft placement, on a machine where no GPU is visible,
 * shows /cpu:0 in psctl workers, table and JSON, and in its own /status); a worker killed
 * with SIGKILL is dead, one that finished is stopped, and so is one stopped with SIGTERM
 * (as systemctl stop does), at once rather than after its missed heartbeats.
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define DATA "/usr/share/datasets/fashion-mnist/"

static char out[1 << 16], err[1 << 16], body[1 << 16];

static cJSON *psctl_json(const ts_cluster_t *c, const char *cmd) {
  const char *argv[] = {ts_psctl_path, "-c", c->config, "-o", "json", cmd, NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "psctl -o json %s: exit %d: %s\n", cmd, rc, err);
  return rc == 0 ? cJSON_Parse(out) : NULL;
}

static const char *state_of(cJSON *workers, int task) {
  cJSON *s = cJSON_GetObjectItem(cJSON_GetArrayItem(workers, task), "state");
  return cJSON_IsString(s) ? s->valuestring : "";
}

static bool running(ts_proc_t *p) {
  if (p->pid <= 0) return false;
  int st;
  pid_t r = waitpid(p->pid, &st, WNOHANG);
  if (r == 0) return true;
  if (r == p->pid) {
    p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    p->pid = 0;
  }
  return false;
}

/* The device column of task t in `psctl workers` (the last word of its line). */
static void table_device(const char *text, int t, char *dev, size_t n) {
  char want[16];
  snprintf(want, sizeof want, "\n%-5d ", t);
  const char *p = strstr(text, want);
  dev[0] = 0;
  if (!p) return;
  size_t len = strcspn(p + 1, "\n");
  const char *end = p + 1 + len, *w = end;
  while (w > p + 1 && w[-1] != ' ') w--;
  snprintf(dev, n, "%.*s", (int)(end - w), w);
}

static void test_sync_steps_states_devices(void **state) {
  (void)state;
  if (access(DATA "train-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 2,
                                    "job = { mode = \"sync\"; partition_bytes = 65536; "
                                    "heartbeat_timeout_s = 3.0; };\n"
                                    "model = { layers = [784, 64, 10]; };\n"
                                    "device = { placement = \"/gpu:0\"; allow_soft_placement = true; };"),
                   0);
  /* No GPU visible, whatever this machine has: /gpu:0 is soft-placed on /cpu:0. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const char *extra[] = {"--set", "train.epochs=20", "--set", "train.max_steps=6000", NULL};
  ts_proc_t w[2];
  for (int t = 0; t < 2; t++) assert_int_equal(ts_worker_start(&c, t, extra, &w[t]), 0);

  /* Sample the job while both workers train: each live worker's step is within one of the
   * job's step (they are never shown lagging behind it). */
  int samples = 0, moving = 0, bad = 0;
  bool devices_seen = false;
  double deadline = ts_now_s() + 120;
  while (ts_now_s() < deadline && running(&w[0]) && running(&w[1]) && (moving < 40 || !devices_seen)) {
    cJSON *j = psctl_json(&c, "status");
    assert_non_null(j);
    samples++;
    double job = cJSON_GetObjectItem(j, "step")->valuedouble;
    cJSON *ws = cJSON_GetObjectItem(j, "workers");
    int live = 0;
    for (int t = 0; t < 2; t++) {
      cJSON *x = cJSON_GetArrayItem(ws, t);
      cJSON *step = cJSON_GetObjectItem(x, "step");
      assert_non_null(step); /* present, null until reported */
      if (strcmp(state_of(ws, t), "alive") != 0 || !cJSON_IsNumber(step)) continue;
      live++;
      double d = step->valuedouble - job;
      if (d < -1 || d > 1) {
        bad++;
        fprintf(stderr, "sample %d: job step %.0f, worker %d step %.0f\n", samples, job, t,
                step->valuedouble);
      }
      cJSON *dev = cJSON_GetObjectItem(x, "device");
      if (cJSON_IsString(dev)) assert_string_equal(dev->valuestring, "/cpu:0");
    }
    if (live == 2 && job > 0) moving++;
    cJSON_Delete(j);
    if (moving >= 5 && !devices_seen) {
      /* The device column once both have reported it (with their first heartbeat), and
       * the worker's own /status. */
      const char *argv[] = {ts_psctl_path, "-c", c.config, "workers", NULL};
      assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
      assert_non_null(strstr(out, "DEVICE"));
      char dev[2][64];
      for (int t = 0; t < 2; t++) table_device(out, t, dev[t], sizeof dev[t]);
      if (strcmp(dev[0], "-") != 0 && strcmp(dev[1], "-") != 0) {
        for (int t = 0; t < 2; t++) {
          assert_string_equal(dev[t], "/cpu:0");
          assert_int_equal(ts_http_get(c.worker_port[t], "/status", body, sizeof body, NULL, 0), 200);
          cJSON *s = cJSON_Parse(body);
          assert_non_null(s);
          assert_string_equal(cJSON_GetObjectItem(s, "device")->valuestring, "/cpu:0");
          cJSON_Delete(s);
        }
        devices_seen = true;
      }
    }
    ts_sleep_ms(20);
  }
  fprintf(stderr, "%d samples, %d with both workers training\n", samples, moving);
  assert_int_equal(bad, 0);
  assert_true(devices_seen);
  assert_true(moving >= 5);

  /* SIGKILL worker 1: dead (its connections are gone; no goodbye). Worker 0 goes on alone
   * and finishes: stopped. */
  assert_true(running(&w[1]));
  kill(w[1].pid, SIGKILL);
  assert_int_equal(ts_proc_wait(&w[1], 10), 128 + SIGKILL);
  const char *s0 = "", *s1 = "";
  cJSON *j = NULL;
  for (int i = 0; i < 100 && strcmp(s1, "dead") != 0; i++) {
    cJSON_Delete(j);
    j = psctl_json(&c, "workers");
    assert_non_null(j);
    s0 = state_of(j, 0);
    s1 = state_of(j, 1);
    ts_sleep_ms(50);
  }
  assert_string_equal(s1, "dead");
  cJSON_Delete(j);
  int rc = ts_proc_wait(&w[0], 300);
  if (rc != 0) ts_proc_dump(&w[0]);
  assert_int_equal(rc, 0);
  j = psctl_json(&c, "workers");
  assert_non_null(j);
  s0 = state_of(j, 0);
  s1 = state_of(j, 1);
  assert_string_equal(s0, "stopped");
  assert_string_equal(s1, "dead");
  cJSON *w0 = cJSON_GetArrayItem(j, 0);
  assert_true(cJSON_IsNumber(cJSON_GetObjectItem(w0, "loss")));
  assert_string_equal(cJSON_GetObjectItem(w0, "device")->valuestring, "/cpu:0");
  cJSON_Delete(j);
  const char *argv[] = {ts_psctl_path, "-c", c.config, "workers", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, " stopped "));
  assert_non_null(strstr(out, " dead "));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* SIGTERM: the worker leaves on purpose and says so as its client closes. */
static void test_sigterm_is_stopped(void **state) {
  (void)state;
  if (access(DATA "train-images-idx3-ubyte.gz", R_OK) != 0)
    TS_SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  ts_cluster_t c;
  /* Heartbeats missed only after 30 s: "stopped" can only come from the goodbye. */
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; heartbeat_timeout_s = 30.0; };\n"
                                    "model = { layers = [784, 32, 10]; };\n"
                                    "train = { epochs = 50; log_interval_s = 0.2; };"),
                   0);
  ts_proc_t w;
  assert_int_equal(ts_worker_start(&c, 0, NULL, &w), 0);
  cJSON *j = NULL;
  const char *s = "";
  for (int i = 0; i < 600 && strcmp(s, "alive") != 0; i++) {
    ts_sleep_ms(50);
    cJSON_Delete(j);
    j = psctl_json(&c, "workers");
    s = j ? state_of(j, 0) : "";
  }
  assert_string_equal(s, "alive");
  cJSON_Delete(j);
  j = NULL;
  kill(w.pid, SIGTERM);
  assert_int_equal(ts_proc_wait(&w, 10), 0);
  s = "";
  for (int i = 0; i < 40 && strcmp(s, "stopped") != 0; i++) {
    cJSON_Delete(j);
    j = psctl_json(&c, "workers");
    s = j ? state_of(j, 0) : "";
    if (strcmp(s, "stopped") != 0) ts_sleep_ms(50);
  }
  if (strcmp(s, "stopped") != 0) ts_proc_dump(&w);
  assert_string_equal(s, "stopped");
  cJSON_Delete(j);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_is_stopped),
      cmocka_unit_test(test_sync_steps_states_devices),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("psctl_job", tests, NULL, NULL));
}
