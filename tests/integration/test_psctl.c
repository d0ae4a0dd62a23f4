/* psctl against real shards: JSON status, values not reported yet, worker states and
 * devices, shard down, bad configuration. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "calls.h"

static const uint64_t shape[] = {300, 40};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM}};

static char out[65536], err[65536];

static int psctl(ts_cluster_t *c, const char *a1, const char *a2, const char *a3) {
  const char *argv[] = {ts_psctl_path, "-c", c->config, a1, a2, a3, NULL};
  return ts_run_capture(argv, out, sizeof out, err, sizeof err);
}

static cJSON *worker_json(cJSON *workers, int task) {
  cJSON *w = cJSON_GetArrayItem(workers, task);
  assert_non_null(w);
  assert_int_equal(cJSON_GetObjectItem(w, "task")->valueint, task);
  return w;
}

/* The required keys are there, null when not reported. */
static void assert_null_keys(cJSON *w, const char *const *keys) {
  for (; *keys; keys++) {
    cJSON *k = cJSON_GetObjectItem(w, *keys);
    if (!k || !cJSON_IsNull(k)) fail_msg("worker key '%s' is not null", *keys);
  }
}

/* The table line of task t in psctl workers' output (static buffer). */
static const char *table_line(const char *text, int t) {
  static char line[512];
  char want[16];
  snprintf(want, sizeof want, "\n%-5d ", t);
  const char *p = strstr(text, want);
  if (!p) return "";
  p++;
  size_t n = strcspn(p, "\n");
  if (n >= sizeof line) n = sizeof line - 1;
  memcpy(line, p, n);
  line[n] = 0;
  return line;
}

static void test_status_json(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"sync\"; partition_bytes = 8192; };"), 0);
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c.addrs, .num_shards = 2, .task = 0, .connect_timeout_s = 5,
                        .request_timeout_s = 10, .require_all = true};
  ts_client_t *cl = NULL;
  char e[512];
  assert_int_equal(ts_client_open(&cl, &o, e, sizeof e), 0);
  assert_int_equal(ts_client_declare(cl, model, 1, 1, e, sizeof e), 0);
  ts_client_set_progress(cl, 5, 0.25, 1000.0, 0.5, false);
  assert_int_equal(ts_client_heartbeat(cl, e, sizeof e), 0);

  int rc = psctl(&c, "--output", "json", "status");
  if (rc != 0) fprintf(stderr, "psctl: %s\n", err);
  assert_int_equal(rc, 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "sync");
  assert_non_null(cJSON_GetObjectItem(j, "step"));
  cJSON *shards = cJSON_GetObjectItem(j, "shards");
  assert_int_equal(cJSON_GetArraySize(shards), 2);
  double total_bytes = 0;
  for (int i = 0; i < 2; i++) {
    cJSON *s = cJSON_GetArrayItem(shards, i);
    assert_int_equal(cJSON_GetObjectItem(s, "index")->valueint, i);
    assert_string_equal(cJSON_GetObjectItem(s, "address")->valuestring, c.addr[i]);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(s, "up")));
    assert_true(cJSON_GetObjectItem(s, "partitions")->valueint > 0);
    assert_non_null(cJSON_GetObjectItem(s, "version"));
    total_bytes += cJSON_GetObjectItem(s, "bytes")->valuedouble;
  }
  assert_true(total_bytes == 300.0 * 40 * 4);
  cJSON *workers = cJSON_GetObjectItem(j, "workers");
  assert_int_equal(cJSON_GetArraySize(workers), 1);
  cJSON *w = cJSON_GetArrayItem(workers, 0);
  assert_int_equal(cJSON_GetObjectItem(w, "task")->valueint, 0);
  assert_int_equal(cJSON_GetObjectItem(w, "step")->valueint, 5);
  assert_true(cJSON_GetObjectItem(w, "loss")->valuedouble == 0.25);
  assert_true(cJSON_GetObjectItem(w, "examples_per_sec")->valuedouble == 1000.0);
  assert_true(cJSON_GetObjectItem(w, "last_seen_s")->valuedouble < 5.0);
  cJSON_Delete(j);

  /* Options anywhere on the line, as kubectl's: the same JSON object from every spelling. */
  const char *const forms[][3] = {{"status", "--output", "json"}, {"-o", "json", "status"},
                                  {"status", "-o", "json"}};
  for (size_t f = 0; f < 3; f++) {
    rc = psctl(&c, forms[f][0], forms[f][1], forms[f][2]);
    if (rc != 0) fprintf(stderr, "psctl %s %s %s: %s\n", forms[f][0], forms[f][1], forms[f][2], err);
    assert_int_equal(rc, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "sync");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "shards")), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "workers")), 1);
    cJSON_Delete(j);
  }

  /* The table form names every shard and the worker. */
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_non_null(strstr(out, c.addr[0]));
  assert_non_null(strstr(out, c.addr[1]));
  assert_non_null(strstr(out, "alive"));
  assert_int_equal(psctl(&c, "-o", "json", "workers"), 0);
  assert_int_equal(psctl(&c, "shards", NULL, NULL), 0);

  /* One shard down: psctl says which and exits non-zero; JSON still parses. */
  ts_cluster_signal(&c, 1, SIGKILL);
  rc = psctl(&c, "--output", "json", "status");
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "shard 1"));
  assert_non_null(strstr(err, c.addr[1]));
  j = cJSON_Parse(out);
  assert_non_null(j);
  shards = cJSON_GetObjectItem(j, "shards");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, 0), "up")));
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, 1), "up")));
  cJSON_Delete(j);
  assert_int_equal(psctl(&c, "health", NULL, NULL), 1);

  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

static void test_usage_and_config_errors(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  assert_int_equal(psctl(&c, "frobnicate", NULL, NULL), 2);
  assert_non_null(strstr(err, "unknown command"));
  assert_int_equal(psctl(&c, "--output", "yaml", "status"), 2);
  assert_int_equal(psctl(&c, "--set", "job.mode=\"fast\"", "status"), 78);
  assert_non_null(strstr(err, "job.mode"));
  const char *argv[] = {ts_psctl_path, "-c", "/nonexistent/job.cfg", "status", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 78);
  assert_non_null(strstr(err, "/nonexistent/job.cfg"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* What a worker has not reported is '-' in the table and null in the JSON (its key still
 * there); its state is alive, stopped (it said it finished) or dead (it vanished); the
 * device it reports is shown. Workers here are clients of the library, as ps-worker is. */
static void test_unreported_states_device(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 3,
                                    "job = { mode = \"sync\"; partition_bytes = 8192; "
                                    "replicas_to_aggregate = 2; };"), 0);
  ts_client_t *cl[2] = {NULL, NULL};
  char e[512];
  for (int t = 0; t < 2; t++) {
    ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c.addrs, .num_shards = 1,
                          .task = t, .connect_timeout_s = 5, .request_timeout_s = 10, .require_all = true};
    assert_int_equal(ts_client_open(&cl[t], &o, e, sizeof e), 0);
    assert_int_equal(ts_client_declare(cl[t], model, 1, 1, e, sizeof e), 0);
    assert_int_equal(ts_client_heartbeat(cl[t], e, sizeof e), 0);
  }
  static const char *const unreported[] = {"step", "loss", "examples_per_sec", "epoch_progress",
                                           "device", NULL};
  static const char *const never[] = {"step", "loss", "examples_per_sec", "last_seen_s",
                                      "epoch_progress", "device", NULL};
  assert_int_equal(psctl(&c, "-o", "json", "workers"), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_int_equal(cJSON_GetArraySize(j), 3);
  cJSON *w0 = worker_json(j, 0);
  assert_null_keys(w0, unreported);
  assert_true(cJSON_IsNumber(cJSON_GetObjectItem(w0, "last_seen_s")));
  assert_string_equal(cJSON_GetObjectItem(w0, "state")->valuestring, "alive");
  cJSON *w2 = worker_json(j, 2);
  assert_null_keys(w2, never);
  assert_string_equal(cJSON_GetObjectItem(w2, "state")->valuestring, "not joined");
  cJSON_Delete(j);
  assert_int_equal(psctl(&c, "workers", NULL, NULL), 0);
  const char *l = table_line(out, 0);
  char step[32], loss[32], eps[32], st[32], dev[32];
  /* TASK STEP LOSS EXAMPLES/S LAST SEEN(2 words) EPOCH STATE DEVICE */
  assert_int_equal(sscanf(l, "%*d %31s %31s %31s %*s %*s %*s %31s %31s", step, loss, eps, st, dev), 5);
  assert_string_equal(step, "-");
  assert_string_equal(loss, "-");
  assert_string_equal(eps, "-");
  assert_string_equal(st, "alive");
  assert_string_equal(dev, "-");
  assert_non_null(strstr(out, "STATE"));
  assert_non_null(strstr(out, "DEVICE"));

  /* A push gives the step (no heartbeat needed); the loss is still unreported. */
  static float w[300 * 40], g[300 * 40];
  float *dst[] = {w};
  const float *grad[] = {g};
  uint64_t version = 0;
  /* Sync: the barrier waits for both workers' gradients. */
  for (int t = 0; t < 2; t++) {
    assert_int_equal(tc_pull(cl[t], dst, 0, 0, &version, e, sizeof e), 0);
    assert_int_equal(tc_push(cl[t], grad, version, NULL, e, sizeof e), 0);
  }
  ts_client_set_device(cl[0], "/cpu:0");
  assert_int_equal(ts_client_heartbeat(cl[0], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "-o", "json", "status"), 0);
  j = cJSON_Parse(out);
  assert_non_null(j);
  assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, 1);
  w0 = worker_json(cJSON_GetObjectItem(j, "workers"), 0);
  assert_int_equal(cJSON_GetObjectItem(w0, "step")->valueint, 1);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(w0, "loss")));
  assert_string_equal(cJSON_GetObjectItem(w0, "device")->valuestring, "/cpu:0");
  cJSON_Delete(j);

  /* Worker 0 reports and then says it finished: stopped. Worker 1 vanishes: dead. */
  ts_client_set_progress(cl[0], 1, 0.75, 50.0, 1.0, true);
  assert_int_equal(ts_client_heartbeat(cl[0], e, sizeof e), 0);
  ts_client_close(cl[0]);
  ts_client_close(cl[1]);
  const char *state0 = "", *state1 = "";
  cJSON *jw = NULL;
  for (int i = 0; i < 100; i++) {
    assert_int_equal(psctl(&c, "-o", "json", "workers"), 0);
    cJSON_Delete(jw);
    jw = cJSON_Parse(out);
    assert_non_null(jw);
    state0 = cJSON_GetObjectItem(worker_json(jw, 0), "state")->valuestring;
    state1 = cJSON_GetObjectItem(worker_json(jw, 1), "state")->valuestring;
    if (strcmp(state1, "dead") == 0) break;
    ts_sleep_ms(50);
  }
  assert_string_equal(state0, "stopped");
  assert_string_equal(state1, "dead");
  w0 = worker_json(jw, 0);
  assert_true(cJSON_GetObjectItem(w0, "loss")->valuedouble == 0.75);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(w0, "alive")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(w0, "done")));
  cJSON_Delete(jw);
  assert_int_equal(psctl(&c, "workers", NULL, NULL), 0);
  assert_int_equal(sscanf(table_line(out, 0), "%*d %31s %31s %*s %*s %*s %*s %31s %31s", step, loss, st, dev), 4);
  assert_string_equal(step, "1");
  assert_string_equal(loss, "0.7500");
  assert_string_equal(st, "stopped");
  assert_string_equal(dev, "/cpu:0");
  assert_int_equal(sscanf(table_line(out, 1), "%*d %31s %31s %*s %*s %*s %*s %31s", step, loss, st), 3);
  assert_string_equal(step, "1");
  assert_string_equal(loss, "-");
  assert_string_equal(st, "dead");
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_json),
      cmocka_unit_test(test_usage_and_config_errors),
      cmocka_unit_test(test_unreported_states_device),
  };
  return cmocka_run_group_tests_name("psctl", tests, NULL, NULL);
}
