/*
 * Who may define the model, and at what cost (docs/security.md, "Who defines the model"):
 * a tiny Declare asking for hundreds of MiB is refused before anything is allocated
 * (server.max_model_bytes); a large legitimate one is built off the loop, so other
 * connections are served meanwhile, and declares that arrive during the build wait for it
 * or are refused; the model of a running job is replaced only by psctl model reset, with
 * the admin token, and only with --force while workers are connected.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

static const uint64_t w_shape[] = {64, 32};
static const uint64_t b_shape[] = {32};
static const ts_client_tensor_t model[] = {
    {.name = "fc1/weights", .shape = w_shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
    {.name = "fc1/biases", .shape = b_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
};
#define NW (64 * 32)
#define NB 32
#define HELD_MAX_S 2.0 /* the longest a good client may be held by an attack */

static ts_client_t *open_client(const ts_cluster_t *c, bool admin, int task, const char *token) {
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = c->addrs;
  o.num_shards = (size_t)c->num_shards;
  o.admin = admin;
  o.task = task;
  o.token = token;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 10;
  o.require_all = true;
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  return cl;
}

/* A Declare of one tensor `name` of `elems` float32 values, sent raw: about 20 bytes of
 * meta. */
static void send_declare(int fd, uint64_t request_id, const char *name, uint64_t elems,
                         uint64_t seed) {
  uint64_t shape[1] = {elems};
  Tessera__TensorDecl t = TESSERA__TENSOR_DECL__INIT;
  t.name = (char *)name;
  t.n_shape = 1;
  t.shape = shape;
  t.init = TESSERA__INIT__INIT_GLOROT_UNIFORM;
  Tessera__TensorDecl *tp[1] = {&t};
  Tessera__Declare d = TESSERA__DECLARE__INIT;
  d.request_id = request_id;
  d.n_tensors = 1;
  d.tensors = tp;
  d.seed = seed;
  ts_raw_send_msg(fd, TS_MSG_DECLARE, &d.base, 0);
}

/* The next frame on fd: a DeclareReply (returns 1, *created set) or an Error (returns its
 * code, detail set); anything else fails the test. */
static int read_declare_answer(int fd, bool *created, char *detail, size_t n) {
  uint8_t meta[4096];
  uint32_t len = 0;
  int type = ts_raw_read_frame(fd, meta, &len);
  if (type == TS_MSG_DECLARE_REPLY) {
    Tessera__DeclareReply *r = tessera__declare_reply__unpack(NULL, len, meta);
    assert_non_null(r);
    *created = r->created;
    tessera__declare_reply__free_unpacked(r, NULL);
    return 1;
  }
  assert_int_equal(type, TS_MSG_ERROR);
  Tessera__Error *e = tessera__error__unpack(NULL, len, meta);
  assert_non_null(e);
  int code = e->code;
  snprintf(detail, n, "%s", e->detail);
  tessera__error__free_unpacked(e, NULL);
  return code;
}

/* Wait (up to 5 s) until shard 0's /metrics shows series at `want`; returns the last value. */
static double wait_metric(const ts_cluster_t *c, const char *series, double want) {
  return ts_metric_wait(c->http_port[0], series, want, want);
}

static void assert_logged(const ts_cluster_t *c, const char *needle) {
  assert_true(ts_cluster_log_has(c, 0, needle));
}

/* Pull the whole small model into w, b within HELD_MAX_S. */
static void timed_pull(ts_client_t *cl, float *w, float *b) {
  float *dst[2] = {w, b};
  char err[512];
  double t0 = ts_now_s();
  int rc = tc_pull(cl, dst, 0, 0, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "pull: %s\n", err);
  assert_int_equal(rc, 0);
  assert_true(ts_now_s() - t0 < HELD_MAX_S);
}

/* A 20-byte Declare asking for 256 MiB of parameters on a shard whose budget is 64 MiB:
 * refused before anything is allocated, counted and logged, again and again; a good
 * client then defines its model and trains on it exactly. */
static void test_oversized_declare_refused(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2,
                                    "job = { mode = \"async\"; };\n"
                                    "optimizer = { name = \"adam\"; };\n"
                                    "server = { max_model_bytes = 67108864; };"),
                   0);
  ts_client_t *good = open_client(&c, false, 0, NULL);
  long rss0 = ts_proc_rss_kib(c.pid[0]);

  int fd = ts_raw_worker(c.port[0], 1, "squatter");
  assert_true(fd >= 0);
  enum { ATTEMPTS = 20 };
  for (int i = 0; i < ATTEMPTS; i++) {
    char detail[512];
    bool created = false;
    send_declare(fd, 100 + (uint64_t)i, "x", (uint64_t)1 << 26, 1);
    int code = read_declare_answer(fd, &created, detail, sizeof detail);
    assert_int_equal(code, TS_ETOOBIG);
    assert_non_null(strstr(detail, "server.max_model_bytes"));
  }
  long rss1 = ts_proc_rss_kib(c.pid[0]);
  fprintf(stderr, "RSS %ld -> %ld KiB after %d refused declares of 256 MiB (x3 with Adam)\n", rss0,
          rss1, ATTEMPTS);
  assert_true(rss1 - rss0 <= 64 * 1024);
  assert_logged(&c, "refused: ETOOBIG: the model needs");
  assert_logged(&c, "more than server.max_model_bytes = 64.0 MiB");
  assert_int_equal(
      wait_metric(&c, "tessera_ps_refused_requests_total{request=\"declare\",reason=\"toobig\"}",
                  ATTEMPTS),
      ATTEMPTS);
  assert_int_equal(wait_metric(&c, "tessera_ps_model_bytes_limit", 67108864), 67108864);
  assert_int_equal(wait_metric(&c, "tessera_ps_model_bytes", 0), 0);

  /* The squatter's connection stays usable; the good client defines the model. */
  char err[512];
  double t0 = ts_now_s();
  assert_int_equal(ts_client_declare(good, model, 2, 7, err, sizeof err), 0);
  assert_true(ts_now_s() - t0 < HELD_MAX_S);
  float *w = calloc(NW, sizeof(float)), *b = calloc(NB, sizeof(float));
  float *w2 = calloc(NW, sizeof(float)), *b2 = calloc(NB, sizeof(float));
  float *gw = calloc(NW, sizeof(float)), *gb = calloc(NB, sizeof(float));
  timed_pull(good, w, b);
  /* Adam's first step moves every parameter by -lr * sign(g) (up to epsilon): push a
   * gradient of zeros, which must change nothing at all. */
  const float *grad[2] = {gw, gb};
  tc_result_t res;
  t0 = ts_now_s();
  assert_int_equal(tc_push(good, grad, TS_CLIENT_STEP_PULLED, &res, err, sizeof err), 0);
  assert_true(ts_now_s() - t0 < HELD_MAX_S);
  timed_pull(good, w2, b2);
  assert_memory_equal(w, w2, NW * sizeof(float));
  assert_memory_equal(b, b2, NB * sizeof(float));
  /* Now the model is there, the squatter's declare is a mismatch, as before. */
  char detail[512];
  bool created = false;
  send_declare(fd, 200, "x", (uint64_t)1 << 26, 1);
  assert_int_equal(read_declare_answer(fd, &created, detail, sizeof detail), TS_ESHAPE);
  close(fd);
  double bytes = wait_metric(&c, "tessera_ps_model_bytes", (NW + NB) * 4.0 * 3);
  assert_int_equal(bytes, (NW + NB) * 4 * 3); /* parameters and Adam's two moments */

  free(w), free(b), free(w2), free(b2), free(gw), free(gb);
  ts_client_close(good);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A legitimate 256 MiB model is built in the thread pool: another connection's requests
 * are answered while it is built, a Declare of the same model waits for it, another model
 * is refused at once. */
static void test_large_declare_off_the_loop(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 4, "job = { mode = \"async\"; };"), 0);
  ts_client_t *adm = open_client(&c, true, -1, NULL);
  int a = ts_raw_worker(c.port[0], 0, "big");
  int same = ts_raw_worker(c.port[0], 1, "same");
  int other = ts_raw_worker(c.port[0], 2, "other");
  assert_true(a >= 0 && same >= 0 && other >= 0);

  const uint64_t elems = (uint64_t)1 << 26; /* 256 MiB of float32 */
  send_declare(a, 1, "big", elems, 3);
  usleep(20 * 1000);
  /* Another connection, served while the model is built. */
  char err[512];
  double t0 = ts_now_s();
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(adm, 0, &st, err, sizeof err), 0);
  double status_s = ts_now_s() - t0;
  ts_client_status_free(st);
  struct pollfd p = {.fd = a, .events = POLLIN};
  bool declare_answered = poll(&p, 1, 0) > 0;
  send_declare(same, 2, "big", elems, 3);
  send_declare(other, 3, "big", elems + 1, 3);
  char detail[512];
  bool created = false;
  t0 = ts_now_s();
  int code = read_declare_answer(other, &created, detail, sizeof detail);
  double other_s = ts_now_s() - t0;
  assert_int_equal(code, TS_ESHAPE);
  bool big_answered_before_other = poll(&p, 1, 0) > 0;

  assert_int_equal(read_declare_answer(a, &created, detail, sizeof detail), 1);
  assert_true(created);
  assert_int_equal(read_declare_answer(same, &created, detail, sizeof detail), 1);
  assert_false(created);
  fprintf(stderr,
          "status answered in %.0f ms (declare answered by then: %s); a mismatching "
          "declare refused in %.0f ms (the big one answered by then: %s)\n",
          status_s * 1e3, declare_answered ? "yes" : "no", other_s * 1e3,
          big_answered_before_other ? "yes" : "no");
  assert_true(status_s < HELD_MAX_S);
  assert_true(other_s < HELD_MAX_S);
  /* How long the build took, from the shard's log: when it took longer than the status
   * round trip by a wide margin, the status must have been answered first. */
  char *log = ts_cluster_log(&c, 0);
  assert_non_null(log);
  const char *built = strstr(log, "built in ");
  assert_non_null(built);
  double build_ms = atof(built + strlen("built in "));
  free(log);
  fprintf(stderr, "the model was built in %.0f ms\n", build_ms);
  if (build_ms > 500 && status_s < 0.1) assert_false(declare_answered);
  assert_int_equal(wait_metric(&c, "tessera_ps_model_bytes", (double)(elems * 4)),
                   (double)(elems * 4));

  close(a);
  close(same);
  close(other);
  ts_client_close(adm);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

/* A shard stopped while it builds a model exits cleanly (no leak, no use after free: the
 * sanitizer build checks the log). */
static void test_stop_while_building(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  int a = ts_raw_worker(c.port[0], 0, "big");
  assert_true(a >= 0);
  send_declare(a, 1, "big", (uint64_t)1 << 26, 3);
  usleep(20 * 1000);
  assert_int_equal(ts_cluster_stop(&c), 0);
  close(a);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int psctl(const ts_cluster_t *c, const char *extra_set, bool force, char *out, size_t n,
                 char *err, size_t en) {
  const char *argv[12];
  int k = 0;
  argv[k++] = ts_psctl_path;
  argv[k++] = "-c";
  argv[k++] = c->config;
  if (extra_set) {
    argv[k++] = "--set";
    argv[k++] = extra_set;
  }
  argv[k++] = "model";
  argv[k++] = "reset";
  if (force) argv[k++] = "--force";
  argv[k] = NULL;
  int rc = ts_run_capture(argv, out, n, err, en);
  fprintf(stderr, "psctl model reset%s -> %d: %s%s", force ? " --force" : "", rc, out, err);
  return rc;
}

/* psctl model reset: needs the admin token, refuses while workers are connected unless
 * --force; after it the next declare defines the model anew. */
static void test_model_reset(void **state) {
  (void)state;
  static const char worker_token[] = "correct horse battery staple, worker";
  static const char admin_token[] = "correct horse battery staple, admin!";
  char dir[] = "/tmp/tessera-reset-XXXXXX", wpath[300], apath[300], cfgtext[1200];
  assert_non_null(mkdtemp(dir));
  snprintf(wpath, sizeof wpath, "%s/token", dir);
  snprintf(apath, sizeof apath, "%s/admin-token", dir);
  write_file(wpath, worker_token);
  write_file(apath, admin_token);
  snprintf(cfgtext, sizeof cfgtext,
           "job = { mode = \"async\"; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 0.5; };\n"
           "auth = { token_file = \"%s\"; admin_token_file = \"%s\"; };",
           wpath, apath);
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 2, cfgtext), 0);
  ts_client_t *good = open_client(&c, false, 0, worker_token);
  char err[512], out[4096], perr[4096];
  assert_int_equal(ts_client_declare(good, model, 2, 7, err, sizeof err), 0);
  float *w0 = calloc(NW, sizeof(float)), *b0 = calloc(NB, sizeof(float));
  float *w = calloc(NW, sizeof(float)), *b = calloc(NB, sizeof(float));
  float *gw = calloc(NW, sizeof(float)), *gb = calloc(NB, sizeof(float));
  for (int i = 0; i < NW; i++) gw[i] = 1.0f;
  for (int i = 0; i < NB; i++) gb[i] = 1.0f;
  timed_pull(good, w0, b0);
  const float *grad[2] = {gw, gb};
  tc_result_t res;
  assert_int_equal(tc_push(good, grad, TS_CLIENT_STEP_PULLED, &res, err, sizeof err), 0);
  timed_pull(good, w, b);
  for (int i = 0; i < NW; i++) assert_true(w[i] == w0[i] - 0.5f);

  /* Usage: model takes reset; --force belongs to it alone. */
  const char *bare[] = {ts_psctl_path, "-c", c.config, "model", NULL};
  assert_int_equal(ts_run_capture(bare, out, sizeof out, perr, sizeof perr), 2);
  const char *forced[] = {ts_psctl_path, "-c", c.config, "--force", "status", NULL};
  assert_int_equal(ts_run_capture(forced, out, sizeof out, perr, sizeof perr), 2);
  /* With the worker token only: psctl may read, the reset is refused by name. */
  assert_int_equal(
      psctl(&c, "auth.admin_token_file=\"\"", true, out, sizeof out, perr, sizeof perr), 1);
  assert_non_null(strstr(perr, "needs the admin token"));
  /* With it, but a worker is connected and no --force. */
  assert_int_equal(psctl(&c, NULL, false, out, sizeof out, perr, sizeof perr), 1);
  assert_non_null(strstr(perr, "--force"));
  timed_pull(good, w, b); /* nothing changed */
  for (int i = 0; i < NW; i++) assert_true(w[i] == w0[i] - 0.5f);
  /* --force: the worker's connection is closed, its client reconnects and declares the
   * same model again, which starts afresh from its seed. */
  assert_int_equal(psctl(&c, NULL, true, out, sizeof out, perr, sizeof perr), 0);
  assert_non_null(strstr(out, "model dropped"));
  assert_logged(&c, "model reset: dropped 2 tensors");
  int rc = -1;
  double t0 = ts_now_s();
  float *dst[2] = {w, b};
  while (rc < 0 && ts_now_s() - t0 < 10) {
    rc = tc_pull(good, dst, 0, 0, NULL, err, sizeof err);
    if (rc < 0) usleep(50 * 1000);
  }
  assert_int_equal(rc, 0);
  assert_memory_equal(w, w0, NW * sizeof(float));
  assert_memory_equal(b, b0, NB * sizeof(float));

  /* No worker left: no --force needed, and the next declare defines another model. */
  ts_client_close(good);
  usleep(100 * 1000);
  assert_int_equal(psctl(&c, NULL, false, out, sizeof out, perr, sizeof perr), 0);
  assert_non_null(strstr(out, "model dropped"));
  static const uint64_t v_shape[] = {10};
  static const ts_client_tensor_t model2[] = {
      {.name = "v", .shape = v_shape, .rank = 1, .init = TS_CLIENT_INIT_ONES}};
  ts_client_t *next = open_client(&c, false, 1, worker_token);
  assert_int_equal(ts_client_declare(next, model2, 1, 9, err, sizeof err), 0);
  float v[10];
  float *vd[1] = {v};
  assert_int_equal(tc_pull(next, vd, 0, 0, NULL, err, sizeof err), 0);
  for (int i = 0; i < 10; i++) assert_true(v[i] == 1.0f);
  assert_int_equal(wait_metric(&c, "tessera_ps_model_resets_total", 2), 2);
  assert_int_equal(wait_metric(&c, "tessera_ps_model_bytes", 40), 40);
  /* With nothing declared, a reset is a no-op that says so. */
  ts_client_close(next);
  usleep(100 * 1000);
  assert_int_equal(psctl(&c, NULL, false, out, sizeof out, perr, sizeof perr), 0);
  assert_int_equal(psctl(&c, NULL, false, out, sizeof out, perr, sizeof perr), 0);
  assert_non_null(strstr(out, "no model declared"));

  free(w0), free(b0), free(w), free(b), free(gw), free(gb);
  assert_int_equal(ts_cluster_stop(&c), 0);
  remove(wpath);
  remove(apath);
  rmdir(dir);
}

/* The staging buffers pushes are read into are sized by the model's largest partition. A
 * model reset followed by a model with larger partitions (here a 1000-value model, whose
 * buffers are the 1 MiB minimum, then a tensor of one 4 MiB partition) must get buffers
 * that hold them: the pushes are applied exactly and the shard stays up. */
static void test_reset_to_larger_partitions(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1,
                                    "job = { mode = \"async\"; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 0.5; };"),
                   0);
  char err[512];
  static const uint64_t small_shape[] = {1000};
  static const ts_client_tensor_t small[] = {
      {.name = "small", .shape = small_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS}};
  ts_client_t *w = open_client(&c, false, 0, NULL);
  assert_int_equal(ts_client_declare(w, small, 1, 3, err, sizeof err), 0);
  float g1[1000];
  for (int i = 0; i < 1000; i++) g1[i] = 1.0f;
  const float *gp1[1] = {g1};
  assert_int_equal(tc_push(w, gp1, 0, NULL, err, sizeof err), 0);
  ts_client_close(w);

  ts_client_t *adm = open_client(&c, true, -1, NULL);
  bool dropped = false;
  int rc = ts_client_model_reset(adm, 0, true, &dropped, NULL, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "model reset: %s\n", err);
  assert_int_equal(rc, 0);
  assert_true(dropped);
  ts_client_close(adm);

  enum { BIG = 1 << 20 }; /* 4 MiB: one partition of job.partition_bytes' default */
  static const uint64_t big_shape[] = {BIG};
  static const ts_client_tensor_t big[] = {
      {.name = "big", .shape = big_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS}};
  w = open_client(&c, false, 0, NULL);
  assert_int_equal(ts_client_declare(w, big, 1, 5, err, sizeof err), 0);
  float *g = malloc(BIG * sizeof *g), *got = malloc(BIG * sizeof *got);
  assert_non_null(g);
  assert_non_null(got);
  for (int i = 0; i < BIG; i++) g[i] = (float)(i % 13);
  const float *gp[1] = {g};
  for (int k = 0; k < 3; k++) {
    rc = tc_push(w, gp, 0, NULL, err, sizeof err);
    if (rc < 0) fprintf(stderr, "push: %s\n", err);
    assert_int_equal(rc, 0);
  }
  float *dst[1] = {got};
  assert_int_equal(tc_pull(w, dst, 0, 0, NULL, err, sizeof err), 0);
  for (int i = 0; i < BIG; i++)
    if (got[i] != -1.5f * (float)(i % 13)) fail_msg("big[%d] = %g", i, (double)got[i]);
  free(g);
  free(got);
  ts_client_close(w);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oversized_declare_refused),
      cmocka_unit_test(test_large_declare_off_the_loop),
      cmocka_unit_test(test_stop_while_building),
      cmocka_unit_test(test_model_reset),
      cmocka_unit_test(test_reset_to_larger_partitions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
