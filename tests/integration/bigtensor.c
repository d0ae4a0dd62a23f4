#include "bigtensor.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

void ts_big_init(ts_big_t *b, size_t parts, size_t part_floats) {
  b->parts = parts;
  b->part_floats = part_floats;
  b->n = parts * part_floats;
  b->shape[0] = parts;
  b->shape[1] = part_floats;
  b->model = (ts_client_tensor_t){.name = "big", .shape = b->shape, .rank = 2,
                                  .init = TS_CLIENT_INIT_ZEROS};
}

ts_client_t *ts_big_worker(ts_cluster_t *c, const ts_big_t *b, int task, const char *identity,
                           double request_timeout_s, double heartbeat_interval_s) {
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = c->addrs,
                        .num_shards = (size_t)c->num_shards,
                        .task = task,
                        .identity = identity,
                        .connect_timeout_s = 5,
                        .request_timeout_s = request_timeout_s,
                        .heartbeat_interval_s = heartbeat_interval_s,
                        .heartbeat_timeout_s = heartbeat_interval_s > 0 ? 10 : 0,
                        .require_all = true};
  ts_client_t *cl = NULL;
  char err[512];
  int rc = ts_client_open(&cl, &o, err, sizeof err);
  if (rc == 0) rc = ts_client_declare(cl, &b->model, 1, 1, err, sizeof err);
  if (rc < 0) fprintf(stderr, "worker %d: %s\n", task, err);
  assert_int_equal(rc, 0);
  return cl;
}

void ts_big_start_async(ts_cluster_t *c, const ts_big_t *b, int num_workers,
                        const char *server_cfg) {
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "job = { mode = \"async\"; partition_bytes = %zu; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 1.0; };\n"
           "server = { %s };",
           b->part_floats * sizeof(float), server_cfg);
  assert_int_equal(ts_cluster_start(c, 1, num_workers, cfg), 0);
}

float *ts_big_filled(const ts_big_t *b, float v) {
  float *g = malloc(b->n * sizeof *g);
  assert_non_null(g);
  for (size_t i = 0; i < b->n; i++) g[i] = v;
  return g;
}

void ts_big_expect_parts(const ts_big_t *b, ts_client_t *cl, const float *want) {
  float *w = ts_big_filled(b, NAN);
  char err[512];
  int rc = tc_pull(cl, &w, 0, 0, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "pull: %s\n", err);
  assert_int_equal(rc, 0);
  for (size_t i = 0; i < b->n; i++) {
    size_t p = i / b->part_floats;
    if (w[i] != want[p]) {
      fprintf(stderr, "value %zu (partition %zu) is %g, want %g\n", i, p, (double)w[i],
              (double)want[p]);
      fail();
    }
  }
  free(w);
}

void ts_big_step(const ts_big_t *b, ts_client_t *cl, float *value, double held_max_s) {
  float *g = ts_big_filled(b, -1.0f);
  char err[512];
  double t0 = ts_now_s();
  int rc = tc_push(cl, (const float *const *)&g, 0, NULL, err, sizeof err);
  double took = ts_now_s() - t0;
  if (rc < 0) fprintf(stderr, "good push: %s\n", err);
  assert_int_equal(rc, 0);
  if (took > held_max_s) fail_msg("the good push took %.2f s (at most %.2f s)", took, held_max_s);
  free(g);
  *value += 1.0f;
  float *want = malloc(b->parts * sizeof *want);
  assert_non_null(want);
  for (size_t i = 0; i < b->parts; i++) want[i] = *value;
  t0 = ts_now_s();
  ts_big_expect_parts(b, cl, want);
  took = ts_now_s() - t0;
  if (took > held_max_s) fail_msg("the good pull took %.2f s (at most %.2f s)", took, held_max_s);
  free(want);
}

bool ts_big_parts_uniform(const ts_big_t *b, const float *w) {
  for (size_t p = 0; p < b->parts; p++) {
    const float *v = w + p * b->part_floats;
    for (size_t i = 1; i < b->part_floats; i++)
      if (v[i] != v[0]) return false;
  }
  return true;
}
