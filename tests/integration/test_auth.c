/* The handshake MAC: a shared token lets clients in, a wrong or missing one is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "calls.h"
#include "ts_err.h"

static int open_with(ts_cluster_t *c, const char *token, char *err, size_t n) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs, .num_shards = (size_t)c->num_shards, .task = 0,
                        .token = token, .connect_timeout_s = 3, .request_timeout_s = 3,
                        .require_all = true};
  ts_client_t *cl = NULL;
  int rc = ts_client_open(&cl, &o, err, n);
  ts_client_close(cl);
  return rc;
}

static void test_token(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-auth-XXXXXX", path[300], cfgtext[600];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/token", dir);
  FILE *f = fopen(path, "w");
  fputs("correct horse battery staple\n", f);
  fclose(f);
  snprintf(cfgtext, sizeof cfgtext, "auth = { token_file = \"%s\"; };", path);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, cfgtext), 0);
  char err[512];
  assert_int_equal(open_with(&c, "correct horse battery staple", err, sizeof err), 0);
  assert_int_equal(open_with(&c, "wrong horse battery staple!", err, sizeof err), TS_EAUTH);
  assert_non_null(strstr(err, "authentication failed"));
  assert_int_equal(open_with(&c, NULL, err, sizeof err), TS_EAUTH);
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(strstr(log, "authentication failed for worker role"));
  free(log);
  /* Counted, for psctl and /metrics. */
  ts_client_opts_t ao = {.struct_size = sizeof(ts_client_opts_t), .addrs = c.addrs, .num_shards = 1, .admin = true, .task = -1,
                         .token = "correct horse battery staple", .connect_timeout_s = 3,
                         .request_timeout_s = 3, .require_all = true};
  ts_client_t *adm = NULL;
  assert_int_equal(ts_client_open(&adm, &ao, err, sizeof err), 0);
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(adm, 0, &st, err, sizeof err), 0);
  assert_int_equal(st->auth_failures, 2);
  ts_client_status_free(st);
  ts_client_close(adm);
  assert_int_equal(ts_cluster_stop(&c), 0);
  remove(path);
  rmdir(dir);
}

static void test_short_token_refused(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-auth-XXXXXX", path[300], cfgtext[600];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/token", dir);
  FILE *f = fopen(path, "w");
  fputs("short\n", f);
  fclose(f);
  snprintf(cfgtext, sizeof cfgtext, "auth = { token_file = \"%s\"; };", path);
  ts_cluster_t c;
  /* The shard refuses to start: its log says why. */
  assert_int_equal(ts_cluster_start(&c, 1, 1, cfgtext), -1);
  remove(path);
  rmdir(dir);
}

static void test_refuses_open_address_without_token(void **state) {
  (void)state;
  /* Refused before anything is bound: no socket is ever opened on that address. */
  char out[4096], err[4096];
  char port[32];
  snprintf(port, sizeof port, "cluster.ps=[\"0.0.0.0:%d\"]", ts_free_port());
  const char *argv[] = {ts_ps_server_path, "--shard", "0", "--set", port, NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  assert_int_equal(rc, 78);
  assert_non_null(strstr(err, "refusing to listen"));
  assert_non_null(strstr(err, "--insecure"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_token),
      cmocka_unit_test(test_short_token_refused),
      cmocka_unit_test(test_refuses_open_address_without_token),
  };
  return cmocka_run_group_tests_name("auth", tests, NULL, NULL);
}
