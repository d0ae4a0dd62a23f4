/* The shards' admin HTTP endpoint (/metrics, /livez, /readyz, /status), promtool, systemd
 * notifications and `psctl health` against real ps-server processes. */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "ts_build_config.h"
#include "calls.h"
#include "ts_prom.h"

static char body[1 << 20], ctype[256], out[1 << 16], err[1 << 16];

static const uint64_t shape[] = {300, 40};
static const ts_client_tensor_t model[] = {
    {.name = "w", .shape = shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM}};

/* Waits (up to 10 s) until the snapshot shard i's admin endpoint publishes holds the
 * heartbeat sent last (its loss of 0.5): it is published every 250 ms from the shard's
 * tick, which a loaded machine may run late. */
static void wait_heartbeat_published(const ts_cluster_t *c, int i) {
  double loss = -1;
  for (int n = 0; n < 200 && loss != 0.5; n++) {
    if (n) usleep(50000);
    if (ts_http_get(c->http_port[i], "/status", body, sizeof body, NULL, 0) != 200) continue;
    cJSON *j = cJSON_Parse(body);
    cJSON *wk = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "workers"), 0) : NULL;
    cJSON *l = wk ? cJSON_GetObjectItem(wk, "loss") : NULL;
    loss = l ? l->valuedouble : -1;
    cJSON_Delete(j);
  }
  if (loss != 0.5) fprintf(stderr, "shard %d: the heartbeat's loss is not published (%g)\n", i, loss);
}

static void test_endpoints(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, "job = { mode = \"sync\"; partition_bytes = 8192; };"), 0);
  /* The endpoint answers as soon as the shard listens; give the first publish a tick. */
  int st = -1;
  for (int i = 0; i < 100 && st != 200; i++) {
    st = ts_http_get(c.http_port[0], "/readyz", body, sizeof body, NULL, 0);
    if (st != 200) usleep(20000);
  }
  assert_int_equal(st, 200);
  assert_int_equal(ts_http_get(c.http_port[0], "/livez", body, sizeof body, NULL, 0), 200);
  assert_int_equal(ts_http_get(c.http_port[0], "/nope", body, sizeof body, NULL, 0), 404);

  assert_int_equal(ts_http_get(c.http_port[0], "/metrics", body, sizeof body, ctype, sizeof ctype), 200);
  assert_string_equal(ctype, TS_PROM_CONTENT_TYPE);
  assert_true(strlen(body) > 0 && body[strlen(body) - 1] == '\n');
  assert_non_null(strstr(body, "# TYPE tessera_ps_push_requests_total counter"));
  assert_true(ts_metric_value(body, "tessera_build_info{version=\"" TS_VERSION "\",role=\"ps\",cuda=\"yes\"}") == 1 ||
              ts_metric_value(body, "tessera_build_info{version=\"" TS_VERSION "\",role=\"ps\",cuda=\"no\"}") == 1);
  assert_true(ts_metric_value(body, "tessera_ps_push_requests_total{result=\"ok\"}") == 0);
  assert_true(ts_metric_value(body, "tessera_ps_checkpoints_total{result=\"ok\"}") == 0);
  assert_true(ts_metric_value(body, "tessera_ps_checkpoint_last_success_timestamp_seconds") == -1);
  assert_int_equal(ts_promtool_check(body), 0);

  /* A worker trains a few steps and sends one NaN gradient: the counters move. */
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c.addrs, .num_shards = 2, .task = 0, .connect_timeout_s = 5,
                        .request_timeout_s = 10, .require_all = true};
  ts_client_t *cl = NULL;
  char e[512];
  assert_int_equal(ts_client_open(&cl, &o, e, sizeof e), 0);
  assert_int_equal(ts_client_declare(cl, model, 1, 1, e, sizeof e), 0);
  static float w[300 * 40], g[300 * 40];
  float *dst[] = {w};
  const float *grad[] = {g};
  for (size_t i = 0; i < 300 * 40; i++) g[i] = 0.01f;
  uint64_t version = 0;
  for (int step = 0; step < 5; step++) {
    assert_int_equal(tc_pull(cl, dst, (uint64_t)step, 0, &version, e, sizeof e), 0);
    assert_int_equal(tc_push(cl, grad, version, NULL, e, sizeof e), 0);
  }
  /* As a worker does: the next step's pull first (a sync push tagged with a version its
   * partition has not reached yet is refused as from the future, not checked for NaN). */
  assert_int_equal(tc_pull(cl, dst, 5, 0, &version, e, sizeof e), 0);
  g[7] = 0.0f / 0.0f;
  assert_true(tc_push(cl, grad, version, NULL, e, sizeof e) < 0);
  char nan_err[512];
  snprintf(nan_err, sizeof nan_err, "%s", e);
  ts_client_set_progress(cl, 5, 0.5, 100.0, 0.1, false);
  assert_int_equal(ts_client_heartbeat(cl, e, sizeof e), 0);
  for (int s = 0; s < 2; s++) wait_heartbeat_published(&c, s);

  double pushes = 0, pulls = 0, refused = 0, bytes_in = 0;
  for (int s = 0; s < 2; s++) {
    assert_int_equal(ts_http_get(c.http_port[s], "/metrics", body, sizeof body, NULL, 0), 200);
    assert_int_equal(ts_promtool_check(body), 0);
    pushes += ts_metric_value(body, "tessera_ps_push_requests_total{result=\"ok\"}");
    pulls += ts_metric_value(body, "tessera_ps_pull_requests_total{result=\"ok\"}");
    refused += ts_metric_value(body, "tessera_ps_refused_requests_total{request=\"push\",reason=\"nonfinite\"}");
    bytes_in += ts_metric_value(body, "tessera_ps_received_bytes_total");
    assert_true(ts_metric_value(body, "tessera_ps_step") >= 5); /* 6 where the NaN push was not refused */
    assert_true(ts_metric_value(body, "tessera_ps_live_workers") == 1);
    assert_true(ts_metric_value(body, "tessera_ps_request_duration_seconds_count{request=\"push\"}") >= 5);
    assert_true(ts_metric_value(body, "tessera_ps_barrier_wait_seconds_count") >= 5);
    /* One staging buffer at least was needed for the pushes (1 MiB: the smallest size). */
    assert_true(ts_metric_value(body, "tessera_ps_staging_bytes") >= 1048576);
    assert_true(ts_metric_value(body, "tessera_ps_push_waits_total{reason=\"pull_reply\"}") >= 0);
    assert_true(ts_metric_value(body, "tessera_ps_push_waits_total{reason=\"staging\"}") == 0);
  }
  assert_true(pushes == 10 || pushes == 11); /* + the NaN push on the shard without element 7 */
  assert_true(pulls == 12); /* 6 pulls (the last before the NaN push) on each shard */
  if (refused < 1) fprintf(stderr, "the NaN push failed with: %s\n%s", nan_err, body);
  assert_true(refused >= 1); /* the shard holding element 7 refused it */
  assert_true(bytes_in > 300.0 * 40 * 4 * 5);

  /* /status is psctl's JSON as the shard sees it. */
  assert_int_equal(ts_http_get(c.http_port[1], "/status", body, sizeof body, ctype, sizeof ctype), 200);
  assert_string_equal(ctype, "application/json");
  cJSON *j = cJSON_Parse(body);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "sync");
  assert_true(cJSON_GetObjectItem(j, "step")->valueint >= 5);
  cJSON *shards = cJSON_GetObjectItem(j, "shards");
  assert_int_equal(cJSON_GetArraySize(shards), 1);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, 0), "index")->valueint, 1);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, 0), "address")->valuestring, c.addr[1]);
  cJSON *wk = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "workers"), 0);
  /* The step of the worker's last push this shard accepted (6 where the NaN push was not
   * refused); the heartbeat's step 5 never lowers it. */
  int wstep = cJSON_GetObjectItem(wk, "step")->valueint;
  assert_true(wstep == 5 || wstep == 6);
  assert_true(cJSON_GetObjectItem(wk, "loss")->valuedouble == 0.5);
  cJSON_Delete(j);

  /* The same keys as psctl's JSON, shard for shard. */
  const char *argv[] = {ts_psctl_path, "-c", c.config, "-o", "json", "status", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  cJSON *pj = cJSON_Parse(out);
  assert_non_null(pj);
  j = cJSON_Parse(body);
  cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(pj, "shards"), 1);
  cJSON *b = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "shards"), 0);
  for (cJSON *k = a->child; k; k = k->next) assert_non_null(cJSON_GetObjectItem(b, k->string));
  for (cJSON *k = cJSON_GetArrayItem(cJSON_GetObjectItem(pj, "workers"), 0)->child; k; k = k->next)
    assert_non_null(cJSON_GetObjectItem(wk = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "workers"), 0), k->string));
  cJSON_Delete(pj);
  cJSON_Delete(j);

  ts_client_close(cl);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A taken admin port stops the shard at start, naming the key and the address. */
static void test_admin_port_taken(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, NULL), 0);
  char port[16], set[96];
  snprintf(port, sizeof port, "%d", ts_free_port());
  snprintf(set, sizeof set, "cluster.ps=[\"127.0.0.1:%s\"]", port);
  /* ps_http of the running shard is taken. */
  const char *argv[] = {ts_ps_server_path, "-c", c.config, "--shard", "0", "--set", set, NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "cluster.ps_http[0]"));
  assert_non_null(strstr(err, "Address already in use"));
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* psctl health: 0 and "healthy" with every shard up; 1 and the reason when one is down;
 * --shard N judges shard N alone (a container's healthcheck). */
static void test_psctl_health(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1, NULL), 0);
  const char *argv[] = {ts_psctl_path, "-c", c.config, "health", NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "psctl health: %s%s", out, err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "healthy: 2 of 2 shard(s) up"));
  assert_null(strstr(out, "\033[")); /* not a terminal: no colour */
  ts_cluster_signal(&c, 1, SIGKILL);
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(out, "unhealthy: 1 of 2 shard(s) up"));
  assert_non_null(strstr(err, "shard 1"));
  assert_non_null(strstr(err, c.addr[1]));
  assert_non_null(strstr(err, "refused"));
  const char *a0[] = {ts_psctl_path, "-c", c.config, "--shard", "0", "health", NULL};
  assert_int_equal(ts_run_capture(a0, out, sizeof out, err, sizeof err), 0);
  const char *a1[] = {ts_psctl_path, "-c", c.config, "--shard", "1", "health", NULL};
  assert_int_equal(ts_run_capture(a1, out, sizeof out, err, sizeof err), 1);
  const char *a9[] = {ts_psctl_path, "-c", c.config, "--shard", "9", "health", NULL};
  assert_int_equal(ts_run_capture(a9, out, sizeof out, err, sizeof err), 2);
  const char *aj[] = {ts_psctl_path, "-c", c.config, "-o", "json", "health", NULL};
  assert_int_equal(ts_run_capture(aj, out, sizeof out, err, sizeof err), 1);
  cJSON *j = cJSON_Parse(out);
  assert_non_null(j);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "healthy")));
  cJSON_Delete(j);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* Under a Type=notify unit: READY=1 once listening, STATUS= lines, WATCHDOG=1 every
 * WATCHDOG_USEC/2, STOPPING=1 on SIGTERM. */
static void test_notify(void **state) {
  (void)state;
#if !TS_HAVE_SYSTEMD
  TS_SKIP("built without libsystemd (-Dsystemd): no sd_notify to test");
#endif
  char sock[108];
  snprintf(sock, sizeof sock, "/tmp/tessera-notify-%d", (int)getpid());
  unlink(sock);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

  setenv("NOTIFY_SOCKET", sock, 1);
  setenv("WATCHDOG_USEC", "300000", 1);
  ts_cluster_t c;
  int rc = ts_cluster_start(&c, 1, 1, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  assert_int_equal(rc, 0);
  bool ready = false, status = false;
  int watchdogs = 0;
  char msg[1024];
  for (int i = 0; i < 50 && !(ready && status && watchdogs >= 3); i++) {
    ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
    if (n <= 0) continue;
    msg[n] = 0;
    ready |= strstr(msg, "READY=1") != NULL;
    status |= strstr(msg, "STATUS=") != NULL;
    watchdogs += strstr(msg, "WATCHDOG=1") != NULL;
  }
  assert_true(ready);
  assert_true(status);
  assert_true(watchdogs >= 3);
  ts_cluster_signal(&c, 0, SIGTERM);
  bool stopping = false;
  for (int i = 0; i < 20 && !stopping; i++) {
    ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
    if (n <= 0) continue;
    msg[n] = 0;
    stopping |= strstr(msg, "STOPPING=1") != NULL;
  }
  assert_true(stopping);
  close(fd);
  unlink(sock);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_endpoints),
      cmocka_unit_test(test_admin_port_taken),
      cmocka_unit_test(test_psctl_health),
      cmocka_unit_test(test_notify),
  };
  return ts_skip_exit(cmocka_run_group_tests_name("admin", tests, NULL, NULL));
}
