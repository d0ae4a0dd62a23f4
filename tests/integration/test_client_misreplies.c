/*
 * A shard that answers wrongly (tests/lib/fake_shard.c --misbehave), against the client
 * library's table requests:
 *
 *   - a SparsePull answered with a SparsePushReply of its id (a reply of another type):
 *     the pull does not succeed with rows never written, it fails by its deadline;
 *   - a SparsePush of 200,000 keys answered as soon as its meta is in, before the shard
 *     read its 52 MiB of records: the client closes that connection (EPROTO) rather than
 *     finish the request while its memory is still being sent, and the push fails. Under
 *     the ASan build this is where a use of the freed records would show.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "tessera/client.h"

#define DIM 64

static ts_client_t *open_fake(const char *addr) {
  const char *addrs[1] = {addr};
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = addrs;
  o.num_shards = 1;
  o.task = 0;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 2;
  o.require_all = true;
  ts_client_t *cl = NULL;
  char e[256];
  assert_int_equal(ts_client_open(&cl, &o, e, sizeof e), 0);
  const ts_client_table_t t = {.name = "emb", .dim = DIM, .optimizer = TS_CLIENT_ROWOPT_SGD};
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.tables = &t;
  d.num_tables = 1;
  assert_int_equal(ts_client_declare_ex(cl, NULL, 0, &d, e, sizeof e), 0);
  return cl;
}

static void test_wrong_and_early_replies(void **state) {
  (void)state;
  int port = 0;
  pid_t pid = ts_fake_shard_start("--misbehave", &port);
  assert_true(pid > 0);
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ts_client_t *cl = open_fake(addr);
  const size_t n = 200000;
  int64_t *keys = malloc(n * sizeof *keys);
  float *rows = malloc(n * DIM * sizeof *rows), *grad = calloc(n * DIM, sizeof *grad);
  assert_non_null(keys);
  assert_non_null(rows);
  assert_non_null(grad);
  for (size_t i = 0; i < n; i++) keys[i] = (int64_t)i;

  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
  req.keys = keys;
  req.num_keys = 1000;
  req.rows_dst = rows;
  int rc = ts_client_run(cl, &req);
  fprintf(stderr, "pull answered as a push: %d (%s)\n", rc, req.errmsg);
  assert_int_equal(rc, TS_CLIENT_ETIMEDOUT);

  ts_client_req_init(&req, TS_CLIENT_SPARSE_PUSH);
  req.keys = keys;
  req.num_keys = n;
  req.rows_grad = grad;
  req.step = 0;
  rc = ts_client_run(cl, &req);
  fprintf(stderr, "push answered before it was read: %d (%s)\n", rc, req.errmsg);
  assert_true(rc < 0);
  ts_client_close(cl);
  free(keys);
  free(rows);
  free(grad);
  ts_fake_shard_stop(pid);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrong_and_early_replies),
  };
  return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
