/* psctl against real shards: JSON status in every spelling of its options, help for every
 * command, the note on the defaults without -c, values not reported yet, worker states and
 * devices, shard down, bad configuration. */
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "calls.h"

static const uint64_t shape[] = {300, 40};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM}};

/* Open and declare a client of task t (worker role) on c's one shard. */
static ts_client_t *worker_client(const ts_cluster_t *c, int t) {
  ts_client_t *cl = NULL;
  char e[512];
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs, .num_shards = 1,
                        .task = t, .connect_timeout_s = 5, .request_timeout_s = 10, .require_all = true};
  if (ts_client_open(&cl, &o, e, sizeof e) < 0) fail_msg("open: %s", e);
  if (ts_client_declare(cl, model, 1, 1, e, sizeof e) < 0) fail_msg("declare: %s", e);
  return cl;
}

static char out[65536], err[65536];

static int psctl(ts_cluster_t *c, const char *a1, const char *a2, const char *a3) {
  const char *argv[] = {ts_psctl_path, "-c", c->config, a1, a2, a3, NULL};
  return ts_run_capture(argv, out, sizeof out, err, sizeof err);
}

/* psctl with exactly these arguments (NULL-terminated). */
static int psctl_args(const char *const *args) {
  return ts_run_psctl(args, out, sizeof out, err, sizeof err);
}

/* Drop what changes between two runs of psctl on an idle job (time, the shards'
 * connection count, which counts psctl itself) from a status object, and print it. */
static char *stable_json(const char *text) {
  cJSON *j = cJSON_Parse(text);
  if (!j) return NULL;
  cJSON *sh;
  cJSON_ArrayForEach(sh, cJSON_GetObjectItem(j, "shards")) {
    cJSON_DeleteItemFromObject(sh, "uptime_s");
    cJSON_DeleteItemFromObject(sh, "connections");
  }
  cJSON *w;
  cJSON_ArrayForEach(w, cJSON_GetObjectItem(j, "workers")) cJSON_DeleteItemFromObject(w, "last_seen_s");
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
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

  /* Options anywhere on the line, as kubectl's, in every spelling: byte for byte the same
   * JSON (once what changes with time is taken out). */
  char cfg_eq[400];
  snprintf(cfg_eq, sizeof cfg_eq, "--config=%s", c.config);
  const char *const forms[][8] = {
      {"-c", c.config, "status", "--output", "json", NULL},
      {"-c", c.config, "-o", "json", "status", NULL},
      {"-c", c.config, "status", "-o", "json", NULL},
      {"status", "-c", c.config, "--output=json", NULL},
      {"-ojson", "status", cfg_eq, NULL},
      {"status", "--output", "json", "--config", c.config, NULL},
      {"status", "--timeout", "5", "--output", "json", "-c", c.config, NULL}};
  char *first = NULL;
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    /* Alive throughout: under a sanitizer on a busy machine the forms take longer than
     * job.heartbeat_timeout_s, and a worker turning dead would change the JSON. */
    assert_int_equal(ts_client_heartbeat(cl, e, sizeof e), 0);
    rc = psctl_args(forms[f]);
    if (rc != 0) fprintf(stderr, "form %zu: %s\n", f, err);
    assert_int_equal(rc, 0);
    assert_string_equal(err, "");
    char *s = stable_json(out);
    assert_non_null(s);
    if (!first)
      first = s;
    else {
      assert_string_equal(s, first);
      cJSON_free(s);
    }
  }
  assert_non_null(strstr(first, "\"workers\""));
  cJSON_free(first);

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

/* --help on every command, psctl help COMMAND alike, every command in psctl --help; an
 * unknown option names itself and points to --help. No shard is needed. */
static void test_help(void **state) {
  (void)state;
  static const char *const cmds[][2] = {{"status", NULL},     {"shards", NULL},
                                        {"workers", NULL},    {"health", NULL},
                                        {"checkpoint", NULL}, {"shutdown", NULL},
                                        {"model", "reset"},   {"completion", NULL},
                                        {"help", NULL}};
  const char *const top[] = {"--help", NULL};
  assert_int_equal(psctl_args(top), 0);
  static char list[sizeof out];
  snprintf(list, sizeof list, "%s", out);
  const char *const h[] = {"-h", NULL};
  assert_int_equal(psctl_args(h), 0);
  assert_string_equal(out, list);
  const char *const hv[] = {"help", NULL};
  assert_int_equal(psctl_args(hv), 0);
  assert_string_equal(out, list);
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char line[64];
    snprintf(line, sizeof line, "\n  %s%s%s ", cmds[i][0], cmds[i][1] ? " " : "",
             cmds[i][1] ? cmds[i][1] : "");
    if (!strstr(list, line)) fail_msg("psctl --help does not list '%s'", line + 3);
    const char *const a[] = {cmds[i][0], cmds[i][1] ? cmds[i][1] : "--help",
                             cmds[i][1] ? "--help" : NULL, NULL};
    if (psctl_args(a) != 0) fail_msg("psctl %s --help: %s", cmds[i][0], err);
    char usage[64];
    snprintf(usage, sizeof usage, "usage: psctl [OPTIONS] %s", cmds[i][0]);
    assert_non_null(strstr(out, usage));
    assert_non_null(strstr(out, "--output"));
    static char own[sizeof out];
    snprintf(own, sizeof own, "%s", out);
    const char *const b[] = {"help", cmds[i][0], cmds[i][1], NULL};
    assert_int_equal(psctl_args(b), 0);
    assert_string_equal(out, own);
    const char *const d[] = {"-h", cmds[i][0], cmds[i][1], NULL}; /* -h before the command */
    assert_int_equal(psctl_args(d), 0);
    assert_string_equal(out, own);
  }
  const char *const unknown[] = {"status", "--frobnicate", NULL};
  assert_int_equal(psctl_args(unknown), 2);
  assert_non_null(strstr(err, "'--frobnicate'"));
  assert_non_null(strstr(err, "psctl --help"));
  assert_null(strstr(err, "Commands:")); /* a hint, not the whole usage */
  const char *const unknown_short[] = {"-x", "status", NULL};
  assert_int_equal(psctl_args(unknown_short), 2);
  assert_non_null(strstr(err, "'-x'"));
  assert_non_null(strstr(err, "psctl --help"));
  const char *const no_value[] = {"status", "-o", NULL};
  assert_int_equal(psctl_args(no_value), 2);
  assert_non_null(strstr(err, "'-o' needs a value"));
  /* A long option that takes no value, given one: named as written, not as its short
   * form or its internal code (getopt's optopt). */
  const char *const force_value[] = {"--force=1", "model", "reset", NULL};
  assert_int_equal(psctl_args(force_value), 2);
  assert_non_null(strstr(err, "option '--force' takes no value"));
  const char *const help_value[] = {"status", "--help=x", NULL};
  assert_int_equal(psctl_args(help_value), 2);
  assert_non_null(strstr(err, "option '--help' takes no value"));
  const char *const unknown_value[] = {"status", "--frobnicate=1", NULL};
  assert_int_equal(psctl_args(unknown_value), 2);
  assert_non_null(strstr(err, "unknown option '--frobnicate=1'"));
  const char *const bad_help[] = {"help", "frobnicate", NULL};
  assert_int_equal(psctl_args(bad_help), 2);
  assert_non_null(strstr(err, "unknown command 'frobnicate'"));
}

/* Without -c and without /etc/tessera/job.cfg psctl says on stderr which shards it asks
 * and that the addresses are the defaults; the exit code still follows the shards. */
static void test_defaults_note(void **state) {
  (void)state;
  if (access("/etc/tessera/job.cfg", F_OK) == 0)
    TS_SKIP("this machine has /etc/tessera/job.cfg, which psctl reads: no defaults to note");
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  char set[96];
  snprintf(set, sizeof set, "cluster.ps=[\"%s\"]", c.addr[0]);
  unsetenv("TF_CONFIG");
  const char *const up[] = {"--set", set, "health", NULL};
  assert_int_equal(psctl_args(up), 0);
  char want[160];
  snprintf(want, sizeof want,
           "psctl: no -c and no /etc/tessera/job.cfg: asking shard 0 at %s (defaults and --set)\n",
           c.addr[0]);
  assert_string_equal(err, want);
  /* The built-in defaults alone: shard 0 at 127.0.0.1:7100 (nobody there, or somebody). */
  const char *const plain[] = {"--timeout", "0.5", "-o", "json", "status", NULL};
  int rc = psctl_args(plain);
  assert_non_null(
      strstr(err, "psctl: no -c and no /etc/tessera/job.cfg: asking shard 0 at 127.0.0.1:7100 (defaults)\n"));
  if (rc == 0 || rc == 1) { /* the JSON on stdout is untouched by the note */
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON_Delete(j);
  }
  /* With -c there is no note. */
  assert_int_equal(psctl(&c, "health", NULL, NULL), 0);
  assert_null(strstr(err, "no -c"));
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
    cl[t] = worker_client(&c, t);
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

/* The job's final accuracy (ts_client_job_end): shard 0 chooses one done worker once every
 * worker has finished, and keeps only that worker's value, and only an accuracy: a value
 * that is not a number in [0, 1], or one from a worker that was not chosen, is refused
 * (psctl status shows none, then the chosen worker's). */
static void test_final_accuracy_checked(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, "job = { mode = \"async\"; };"), 0);
  ts_client_t *cl[2] = {NULL, NULL};
  char e[512];
  for (int t = 0; t < 2; t++) cl[t] = worker_client(&c, t);
  ts_client_job_end_t je;
  ts_client_set_progress(cl[0], 1, 0.5, 10.0, 1.0, true);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 1);
  assert_int_equal(je.num_workers, 2);
  assert_false(je.report_final);

  /* Not a number: refused. */
  ts_client_set_final_accuracy(cl[1], NAN);
  assert_int_equal(ts_client_heartbeat(cl[1], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_null(strstr(out, "final test accuracy"));
  assert_int_equal(psctl(&c, "-o", "json", "status"), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "final_test_accuracy")));
  cJSON_Delete(j);

  /* Worker 1 finishes last and is chosen; worker 0 is not. */
  ts_client_set_progress(cl[1], 1, 0.5, 10.0, 1.0, true);
  assert_int_equal(ts_client_job_end(cl[1], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 2);
  assert_true(je.report_final);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 2);
  assert_false(je.report_final);

  /* From the worker not chosen, or out of [0, 1]: refused, and the choice stays. */
  ts_client_set_final_accuracy(cl[0], 0.25);
  assert_int_equal(ts_client_heartbeat(cl[0], e, sizeof e), 0);
  ts_client_set_final_accuracy(cl[1], 1.5);
  assert_int_equal(ts_client_heartbeat(cl[1], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_null(strstr(out, "final test accuracy"));
  assert_int_equal(ts_client_job_end(cl[1], &je, e, sizeof e), 0);
  assert_true(je.report_final);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_false(je.report_final);

  ts_client_set_final_accuracy(cl[1], 0.875);
  assert_int_equal(ts_client_heartbeat(cl[1], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_non_null(strstr(out, "final test accuracy: 0.8750 (worker 1 evaluated"));
  assert_int_equal(psctl(&c, "-o", "json", "status"), 0);
  j = cJSON_Parse(out);
  assert_non_null(j);
  assert_true(cJSON_GetObjectItem(j, "final_test_accuracy")->valuedouble == 0.875);
  cJSON_Delete(j);
  assert_true(ts_cluster_log_has(&c, 0, "refused"));
  ts_client_close(cl[0]);
  ts_client_close(cl[1]);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A worker that leaves before its first progress report (ps-worker stopped by SIGTERM in
 * its first log interval) is stopped, with '-' (null) for the loss, examples/s and epoch it
 * never reported, not zeros. */
static void test_done_unreported(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  char e[512];
  ts_client_t *cl = worker_client(&c, 0);
  ts_client_set_done(cl, true);
  assert_int_equal(ts_client_heartbeat(cl, e, sizeof e), 0);
  assert_int_equal(psctl(&c, "-o", "json", "workers"), 0);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  cJSON *w0 = worker_json(j, 0);
  static const char *const unreported[] = {"loss", "examples_per_sec", "epoch_progress", NULL};
  assert_null_keys(w0, unreported);
  assert_string_equal(cJSON_GetObjectItem(w0, "state")->valuestring, "stopped");
  cJSON_Delete(j);
  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* psctl model reset replaces the model of a running job: the next model's training has no
 * final accuracy yet, and its reporting worker is chosen anew once its workers finish (the
 * old one is not told to report while the others still train). */
static void test_final_accuracy_after_reset(void **state) {
  (void)state;
  ts_cluster_t c;
  /* A long heartbeat timeout: a worker not joined yet stays unfinished for the test. */
  assert_int_equal(ts_cluster_start(&c, 1, 2,
                                    "job = { mode = \"async\"; heartbeat_timeout_s = 60.0; };"),
                   0);
  char e[512];
  ts_client_job_end_t je;
  ts_client_t *cl[2];
  for (int t = 0; t < 2; t++) cl[t] = worker_client(&c, t);
  for (int t = 0; t < 2; t++) {
    ts_client_set_progress(cl[t], 1, 0.5, 10.0, 1.0, true);
    assert_int_equal(ts_client_job_end(cl[t], &je, e, sizeof e), 0);
  }
  assert_true(je.report_final); /* worker 1, the last */
  ts_client_set_final_accuracy(cl[1], 0.5);
  assert_int_equal(ts_client_heartbeat(cl[1], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_non_null(strstr(out, "final test accuracy: 0.5000 (worker 1"));
  for (int t = 0; t < 2; t++) ts_client_close(cl[t]);

  assert_int_equal(psctl(&c, "model", "reset", NULL), 0);
  cl[1] = worker_client(&c, 1);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_null(strstr(out, "final test accuracy"));
  /* Worker 1 finishes first now, before worker 0 joined the new model's training (its
   * done was the old model's): it waits for worker 0, which is then chosen. */
  ts_client_set_progress(cl[1], 1, 0.5, 10.0, 1.0, true);
  assert_int_equal(ts_client_job_end(cl[1], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 1);
  assert_false(je.report_final);
  cl[0] = worker_client(&c, 0);
  assert_int_equal(ts_client_job_end(cl[1], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 1);
  assert_false(je.report_final);
  ts_client_set_progress(cl[0], 1, 0.5, 10.0, 1.0, true);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 2);
  assert_true(je.report_final);
  ts_client_set_final_accuracy(cl[0], 0.75);
  assert_int_equal(ts_client_heartbeat(cl[0], e, sizeof e), 0);
  assert_int_equal(psctl(&c, "status", NULL, NULL), 0);
  assert_non_null(strstr(out, "final test accuracy: 0.7500 (worker 0"));
  for (int t = 0; t < 2; t++) ts_client_close(cl[t]);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Only a worker asking for the end of the job (ts_client_job_end) is chosen to report: a
 * plain heartbeat with done, such as the goodbye of a worker stopped by SIGTERM while the
 * others had finished, completes the count but is not chosen (it would leave without
 * reporting, and the job without a final accuracy); the next worker to ask is. */
static void test_final_reporter_asks(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, "job = { mode = \"async\"; };"), 0);
  char e[512];
  ts_client_job_end_t je;
  ts_client_t *cl[2];
  for (int t = 0; t < 2; t++) cl[t] = worker_client(&c, t);
  ts_client_set_progress(cl[0], 1, 0.5, 10.0, 1.0, true);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 1);
  ts_client_set_done(cl[1], true);
  assert_int_equal(ts_client_heartbeat(cl[1], e, sizeof e), 0);
  ts_client_close(cl[1]);
  assert_int_equal(ts_client_job_end(cl[0], &je, e, sizeof e), 0);
  assert_int_equal(je.workers_finished, 2);
  assert_true(je.report_final);
  ts_client_close(cl[0]);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_json),
      cmocka_unit_test(test_usage_and_config_errors),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_defaults_note),
      cmocka_unit_test(test_unreported_states_device),
      cmocka_unit_test(test_final_accuracy_checked),
      cmocka_unit_test(test_done_unreported),
      cmocka_unit_test(test_final_accuracy_after_reset),
      cmocka_unit_test(test_final_reporter_asks),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("psctl", tests, NULL, NULL));
}
