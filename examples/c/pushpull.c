/*
 * pushpull: the smallest complete program on libtessera-client.
 *
 * Opens a client to the shards named on the command line, declares a two-tensor model
 * (w: 4x3, b: 3, both starting at zero), pushes one gradient per tensor as two requests in
 * flight together (as backpropagation produces them, last layer first), waits for both,
 * pulls the parameters back and prints them. Exits 0 on success, 1 on any error.
 *
 * Build it against an installed libtessera-client:
 *
 *   cc pushpull.c $(pkg-config --cflags --libs tessera-client) -o pushpull
 *   ./pushpull 127.0.0.1:7100 127.0.0.1:7101
 *
 * With the shards' optimizer `sgd` and learning_rate 1 (in async mode), a job that starts
 * fresh prints w = -1 everywhere and b = -0.5 everywhere: parameters = 0 - 1 * gradient.
 */
#include <stdio.h>
#include <stdlib.h>
#include <tessera/client.h>

static void log_line(void *arg, int level, const char *msg) {
  (void)arg;
  fprintf(stderr, "pushpull: client [%d]: %s\n", level, msg);
}

static int fail(const char *what, int rc, const char *errmsg) {
  fprintf(stderr, "pushpull: %s: %s (%s)\n", what, errmsg && errmsg[0] ? errmsg : "",
          ts_client_strerror(rc));
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s HOST:PORT [HOST:PORT...]   (the job's shards, in order)\n", argv[0]);
    return 1;
  }
  char err[512] = "";
  ts_client_opts_t opts;
  ts_client_opts_init(&opts);
  opts.addrs = (const char *const *)(argv + 1);
  opts.num_shards = (size_t)(argc - 1);
  opts.identity = "examples/c/pushpull";
  opts.require_all = true;
  opts.request_timeout_s = 30;
  opts.log = log_line;
  opts.log_level = TS_CLIENT_LOG_WARN;
  ts_client_t *c = NULL;
  int rc = ts_client_open(&c, &opts, err, sizeof err);
  if (rc < 0) return fail("open", rc, err);

  static const uint64_t w_shape[] = {4, 3}, b_shape[] = {3};
  const ts_client_tensor_t model[] = {
      {.name = "example/w", .shape = w_shape, .rank = 2, .init = TS_CLIENT_INIT_ZEROS},
      {.name = "example/b", .shape = b_shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS},
  };
  rc = ts_client_declare(c, model, 2, 42, err, sizeof err);
  if (rc < 0) {
    ts_client_close(c);
    return fail("declare", rc, err);
  }
  printf("libtessera-client %s: %u shard(s), mode %s, %zu tensor(s) in %zu partition(s)\n",
         tessera_version(), ts_client_num_shards(c), ts_client_mode_name(ts_client_job_mode(c)),
         ts_client_num_tensors(c), ts_client_num_parts(c));

  float w[12], b[3], gw[12], gb[3];
  for (int i = 0; i < 12; i++) gw[i] = 1.0f;
  for (int i = 0; i < 3; i++) gb[i] = 0.5f;
  const float *grad[] = {gw, gb};
  float *dst[] = {w, b};

  /* One push per tensor, both in flight at once: each shard applies them in order. */
  static const uint32_t last_layer[] = {1}, first_layer[] = {0};
  ts_client_req_t push_b, push_w;
  ts_client_req_init(&push_b, TS_CLIENT_PUSH);
  push_b.grad = grad;
  push_b.tensors = last_layer;
  push_b.num_tensors = 1;
  push_b.step = 0;
  push_w = push_b;
  push_w.tensors = first_layer;
  rc = ts_client_submit(c, &push_b, NULL, NULL);
  if (rc < 0) {
    ts_client_close(c);
    return fail("push b", rc, push_b.errmsg);
  }
  rc = ts_client_submit(c, &push_w, NULL, NULL);
  int rc_b = ts_client_wait(c, &push_b);
  int rc_w = rc < 0 ? rc : ts_client_wait(c, &push_w);
  if (rc_b < 0 || rc_w < 0) {
    ts_client_close(c);
    return rc_b < 0 ? fail("push b", rc_b, push_b.errmsg) : fail("push w", rc_w, push_w.errmsg);
  }
  printf("pushed: %llu partition(s) applied, %llu accumulated, %llu stale\n",
         (unsigned long long)(push_b.applied + push_w.applied),
         (unsigned long long)(push_b.accumulated + push_w.accumulated),
         (unsigned long long)(push_b.stale + push_w.stale));

  ts_client_req_t pull;
  ts_client_req_init(&pull, TS_CLIENT_PULL);
  pull.dst = dst;
  rc = ts_client_run(c, &pull);
  if (rc < 0) {
    ts_client_close(c);
    return fail("pull", rc, pull.errmsg);
  }
  printf("pulled version %llu\n", (unsigned long long)pull.version);
  printf("w:");
  for (int i = 0; i < 12; i++) printf(" %g", (double)w[i]);
  printf("\nb:");
  for (int i = 0; i < 3; i++) printf(" %g", (double)b[i]);
  printf("\n");
  ts_client_close(c);
  return 0;
}
