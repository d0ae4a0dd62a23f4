/*
 * Who may speak for a worker task, and who is a shard (docs/security.md): each attack with
 * well-behaved clients beside it, which get exact results within 2 s while the attack is
 * refused or logged as stated.
 *
 *   second connection   a token holder handshaking as a task whose connection is alive is
 *                       refused (EBUSY), logged once with both peers: it can neither say
 *                       the task's goodbye nor push in its name
 *   no token            the second connection is let in but has no voice: its goodbye
 *                       and accuracy are ignored, logged once
 *   task keys           a worker with its task key proves the task: it replaces a claim of
 *                       the shared token, and its key proves no other task
 *   final accuracy      a worker's accuracy mid-job, or after the chosen reporter's, is
 *                       refused with one log line however often it is sent
 *   fake shard          a server that does not prove it knows the token (no proof, a
 *                       wrong one) is refused by the C library and by psctl
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "calls.h"
#include "harness.h"
#include "rawconn.h"
#include "ts_auth.h"
#include "ts_err.h"
#include "ts_frame.h"
#include "ts_msg.h"

#define TOKEN "correct horse battery staple"
#define GOOD_BOUND_S 2.0

static const uint64_t w_shape[] = {16, 8};
static const ts_client_tensor_t model[] = {
    {.name = "fc/weights", .shape = w_shape, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
};
#define NW (16 * 8)

typedef struct {
  ts_cluster_t c;
  char dir[64], token_path[128], admin_path[128];
  ts_client_t *good[2];
  bool tokenless;
  float expect[NW], got[NW], grad[NW];
} fixture_t;

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static ts_client_t *open_as(fixture_t *f, int task, const char *key) {
  ts_client_opts_t o;
  tc_opts(&o, f->c.addrs, 1);
  o.task = task;
  o.token = key;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 5;
  o.heartbeat_interval_s = 0.2; /* alive while the test thinks */
  o.require_all = true;
  ts_client_t *cl = NULL;
  if (tc_open(&cl, &o, model, 1, 7) < 0) {
    ts_client_close(cl);
    return NULL;
  }
  return cl;
}

/* A cluster of one shard for two workers (async, SGD with rate 1: every update exact),
 * with both good workers connected. auth: NO_TOKEN, TOKEN_ONLY, or WITH_ADMIN (a token and
 * an admin token, ADMIN_TOKEN in DIR/admin.token). */
typedef enum { NO_TOKEN, TOKEN_ONLY, WITH_ADMIN } auth_t;
#define ADMIN_TOKEN "the admin's own token, not the workers'"

static void start(fixture_t *f, auth_t auth) {
  memset(f, 0, sizeof *f);
  f->tokenless = auth == NO_TOKEN;
  snprintf(f->dir, sizeof f->dir, "/tmp/tessera-ident-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->token_path, sizeof f->token_path, "%s/token", f->dir);
  snprintf(f->admin_path, sizeof f->admin_path, "%s/admin.token", f->dir);
  write_file(f->token_path, TOKEN "\n");
  write_file(f->admin_path, ADMIN_TOKEN "\n");
  char cfg[1024], authcfg[400] = "";
  if (auth == TOKEN_ONLY)
    snprintf(authcfg, sizeof authcfg, "auth = { token_file = \"%s\"; };\n", f->token_path);
  if (auth == WITH_ADMIN)
    snprintf(authcfg, sizeof authcfg,
             "auth = { token_file = \"%s\"; admin_token_file = \"%s\"; };\n", f->token_path,
             f->admin_path);
  snprintf(cfg, sizeof cfg,
           "%s"
           "job = { mode = \"async\"; heartbeat_timeout_s = 5.0; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = 1.0; };\n",
           authcfg);
  assert_int_equal(ts_cluster_start(&f->c, 1, 2, cfg), 0);
  for (int t = 0; t < 2; t++) assert_non_null(f->good[t] = open_as(f, t, f->tokenless ? NULL : TOKEN));
  float *dst[1] = {f->expect};
  char err[512];
  assert_int_equal(tc_pull(f->good[0], dst, 0, 0, NULL, err, sizeof err), 0);
  for (size_t i = 0; i < NW; i++) f->grad[i] = 0.25f;
}

static void stop(fixture_t *f) {
  for (int t = 0; t < 2; t++) ts_client_close(f->good[t]);
  assert_int_equal(ts_cluster_stop(&f->c), 0);
  remove(f->token_path);
  remove(f->admin_path);
  rmdir(f->dir);
}

/* One push by worker t and a pull: every parameter exactly 0.25 lower, the push applied
 * (not taken for a duplicate), within GOOD_BOUND_S. */
static void good_round(fixture_t *f, int t) {
  char err[512];
  const float *g[1] = {f->grad};
  float *dst[1] = {f->got};
  tc_result_t res;
  double t0 = ts_now_s();
  int rc = tc_push(f->good[t], g, TS_CLIENT_STEP_PULLED, &res, err, sizeof err);
  if (rc < 0) fprintf(stderr, "push: %s\n", err);
  assert_int_equal(rc, 0);
  assert_true(res.applied > 0);
  assert_int_equal(res.duplicate, 0);
  for (size_t i = 0; i < NW; i++) f->expect[i] -= 0.25f;
  assert_int_equal(tc_pull(f->good[t], dst, 0, 0, NULL, err, sizeof err), 0);
  double took = ts_now_s() - t0;
  if (took > GOOD_BOUND_S) fail_msg("the good worker %d was held %.2f s", t, took);
  assert_memory_equal(f->expect, f->got, sizeof f->got);
}

/* The shard's RSS may not grow by more than 64 MiB during an attack (issue 29). */
static void assert_rss_within(fixture_t *f, long before_kib) {
  long after = ts_proc_rss_kib(f->c.pid[0]);
  fprintf(stderr, "shard RSS %ld -> %ld KiB\n", before_kib, after);
  if (after - before_kib > 64 * 1024) fail_msg("shard RSS grew from %ld to %ld KiB", before_kib, after);
}

/* How many times needle is in shard 0's log. */
static int log_count(fixture_t *f, const char *needle) {
  char *log = ts_cluster_log(&f->c, 0);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
  free(log);
  return n;
}

static int raw_handshake(int port, int task, const char *key, int *code, char *detail, size_t n) {
  return ts_raw_worker_key(port, task, key, "impostor", code, detail, n);
}

/* A heartbeat by hand (done, job_end, an accuracy when acc >= 0); true when answered. */
static bool raw_heartbeat(int fd, uint64_t id, bool done, bool job_end, double acc) {
  Tessera__Heartbeat m = TESSERA__HEARTBEAT__INIT;
  m.request_id = id;
  m.done = done;
  m.job_end = job_end;
  m.has_final_test_accuracy = acc >= 0;
  m.final_test_accuracy = acc;
  ts_raw_send_msg(fd, TS_MSG_HEARTBEAT, &m.base, 0);
  uint8_t meta[4096];
  uint32_t len;
  return ts_raw_read_frame(fd, meta, &len) == TS_MSG_HEARTBEAT_REPLY;
}

/* Shard 0's status (its workers, the job's final accuracy), asked as an admin; the caller
 * frees it. */
static ts_client_shard_status_t *status(fixture_t *f) {
  ts_client_opts_t o;
  tc_opts(&o, f->c.addrs, 1);
  o.admin = true;
  o.task = -1;
  o.token = f->tokenless ? NULL : TOKEN; /* a client with a token refuses a shard without */
  o.require_all = true;
  ts_client_t *adm = NULL;
  char err[512];
  assert_int_equal(ts_client_open(&adm, &o, err, sizeof err), 0);
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(adm, 0, &st, err, sizeof err), 0);
  ts_client_close(adm);
  return st;
}

static const ts_client_worker_status_t *worker(const ts_client_shard_status_t *st, int t) {
  for (size_t i = 0; i < st->num_workers_seen; i++)
    if (st->workers[i].task == t) return &st->workers[i];
  static const ts_client_worker_status_t none = {.task = -1};
  fail_msg("worker %d is not in the status", t);
  return &none;
}

/* Issue 29, failures 1 and 2: a token holder connects as task 1 while worker 1 is alive,
 * to say its goodbye and push first. Refused at the handshake, every time, logged once
 * with both peers; worker 1's pushes are applied, and it is alive and not done. */
static void test_second_connection_refused(void **state) {
  (void)state;
  fixture_t f;
  start(&f, TOKEN_ONLY);
  good_round(&f, 1);
  long rss = ts_proc_rss_kib(f.c.pid[0]);
  for (int i = 0; i < 20; i++) {
    int code;
    char detail[512];
    int fd = raw_handshake(f.c.port[0], 1, TOKEN, &code, detail, sizeof detail);
    if (fd >= 0) fail_msg("attempt %d: a second connection as task 1 was let in", i);
    assert_int_equal(code, TS_EBUSY);
    assert_non_null(strstr(detail, "held by a live connection from 127.0.0.1:"));
    good_round(&f, i % 2);
  }
  /* One log line for 20 attempts, naming both peers. */
  assert_int_equal(log_count(&f, "worker 1 refused: the task is held by the live connection"), 1);
  char *log = ts_cluster_log(&f.c, 0);
  const char *line = strstr(log, "worker 1 refused");
  assert_non_null(line);
  const char *bol = line;
  while (bol > log && bol[-1] != '\n') bol--;
  assert_non_null(strstr(bol, "127.0.0.1:")); /* the newcomer, before the message */
  free(log);
  ts_client_shard_status_t *st = status(&f);
  assert_true(worker(st, 1)->alive);
  assert_false(worker(st, 1)->done);
  ts_client_status_free(st);
  good_round(&f, 1);
  assert_rss_within(&f, rss);
  stop(&f);
}

/* Without a token the second connection is let in (the shard is on loopback only, a task
 * is anyone's claim), but it has no voice: its goodbye, job end and accuracy are ignored
 * while worker 1's connection lives. Logged once. */
static void test_second_connection_without_token_has_no_voice(void **state) {
  (void)state;
  fixture_t f;
  start(&f, NO_TOKEN);
  int code;
  char detail[512];
  int fd = raw_handshake(f.c.port[0], 1, NULL, &code, detail, sizeof detail);
  assert_true(fd >= 0);
  for (uint64_t i = 1; i <= 20; i++) {
    assert_true(raw_heartbeat(fd, i, true, true, 0.5));
    if (i % 5 == 0) good_round(&f, 1);
  }
  ts_client_shard_status_t *st = status(&f);
  assert_false(worker(st, 1)->done);
  assert_false(st->has_final_test_accuracy);
  ts_client_status_free(st);
  assert_int_equal(log_count(&f, "a second connection as worker 1 while the one from"), 1);
  close(fd);
  good_round(&f, 0);
  stop(&f);
}

/* A task key proves its task: a worker with it replaces a live claim made with the shared
 * token (logged with both peers), after which the claim is refused; the key proves no
 * other task (EAUTH). */
static void test_task_key(void **state) {
  (void)state;
  fixture_t f;
  start(&f, TOKEN_ONLY);
  char key1[TS_CLIENT_TASK_KEY_LEN + 1];
  assert_int_equal(ts_client_task_key(TOKEN, 1, key1, sizeof key1), 0);
  /* psctl token derive prints the same key. */
  char out[256], err[1024];
  const char *argv[] = {ts_psctl_path, "-c", f.c.config, "token", "derive", "--task", "1", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  assert_int_equal(strncmp(out, key1, TS_CLIENT_TASK_KEY_LEN), 0);
  /* Worker 1 (shared token) goes; a key holder comes while worker 1's claim... */
  ts_client_close(f.good[1]);
  int code;
  char detail[512];
  int claim = raw_handshake(f.c.port[0], 1, TOKEN, &code, detail, sizeof detail);
  assert_true(claim >= 0);
  assert_true(raw_heartbeat(claim, 1, false, false, -1));
  /* ... is alive: the key wins. */
  assert_non_null(f.good[1] = open_as(&f, 1, key1));
  assert_true(ts_raw_closed_by_peer(claim, 5000));
  close(claim);
  assert_true(ts_cluster_log_has(&f.c, 0, "it proved the task with the task key"));
  assert_true(ts_cluster_log_has(&f.c, 0, ", proved by its task key"));
  good_round(&f, 1);
  /* The claim again: refused while the key holder lives. */
  assert_true(raw_handshake(f.c.port[0], 1, TOKEN, &code, detail, sizeof detail) < 0);
  assert_int_equal(code, TS_EBUSY);
  /* Task 1's key does not prove task 0. */
  assert_true(raw_handshake(f.c.port[0], 0, key1, &code, detail, sizeof detail) < 0);
  assert_int_equal(code, TS_EAUTH);
  good_round(&f, 0);
  good_round(&f, 1);
  stop(&f);
}

/* Issue 29, failure 3: a worker sends a final accuracy mid-job, 3,000 times: refused, one
 * log line. At the end only the reporter shard 0 chose sets it, once: a second value is
 * refused too. */
static void test_final_accuracy(void **state) {
  (void)state;
  fixture_t f;
  start(&f, TOKEN_ONLY);
  char err[512];
  long rss = ts_proc_rss_kib(f.c.pid[0]);
  ts_client_set_final_accuracy(f.good[0], 0.99);
  for (int i = 0; i < 3000; i++) assert_int_equal(ts_client_heartbeat(f.good[0], err, sizeof err), 0);
  good_round(&f, 1);
  ts_client_shard_status_t *st = status(&f);
  assert_false(st->has_final_test_accuracy);
  ts_client_status_free(st);
  assert_int_equal(log_count(&f, "final test accuracy 0.99 refused"), 1);
  assert_true(ts_cluster_log_has(&f.c, 0, "not from the worker chosen"));
  /* The end: both finish; the one chosen reports 0.75, then tries 0.5. */
  ts_client_set_done(f.good[0], true);
  ts_client_set_done(f.good[1], true);
  ts_client_job_end_t end[2];
  for (int t = 0; t < 2; t++)
    assert_int_equal(ts_client_job_end(f.good[t], &end[t], err, sizeof err), 0);
  assert_true(end[0].report_final != end[1].report_final);
  int r = end[0].report_final ? 0 : 1;
  ts_client_set_final_accuracy(f.good[r], 0.75);
  assert_int_equal(ts_client_heartbeat(f.good[r], err, sizeof err), 0);
  ts_client_set_final_accuracy(f.good[r], 0.5);
  for (int i = 0; i < 100; i++) assert_int_equal(ts_client_heartbeat(f.good[r], err, sizeof err), 0);
  st = status(&f);
  assert_true(st->has_final_test_accuracy);
  assert_true(st->final_test_accuracy == 0.75);
  assert_int_equal(st->final_reporter, r);
  ts_client_status_free(st);
  assert_int_equal(log_count(&f, "the job's final test accuracy: 0.750000"), 1);
  assert_int_equal(log_count(&f, "the job's final test accuracy:"), 1);
  assert_rss_within(&f, rss);
  stop(&f);
}

/* --- a fake shard ------------------------------------------------------------------- */

typedef enum { PROOF_NONE, PROOF_WRONG, PROOF_RIGHT } proof_t;

typedef struct {
  int listener, port;
  proof_t proof;
  int conns; /* connections to serve */
} fake_t;

/* Speaks the wire format as a shard would, up to the handshake reply, whose proof is the
 * fake's setting; then holds the connection until the client closes it. */
static void *fake_shard(void *arg) {
  fake_t *fk = arg;
  for (int i = 0; i < fk->conns; i++) {
    int fd = accept(fk->listener, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t nonce[TS_AUTH_NONCE_LEN], meta[4096], proof[TS_AUTH_MAC_LEN];
    randombytes_buf(nonce, sizeof nonce);
    Tessera__Hello hello = TESSERA__HELLO__INIT;
    hello.protocol = TS_PROTOCOL_VERSION;
    hello.num_shards = 1;
    hello.nonce.data = nonce;
    hello.nonce.len = sizeof nonce;
    hello.server_id = "not a shard";
    hello.incarnation = 1;
    ts_raw_send_msg(fd, TS_MSG_HELLO, &hello.base, 0);
    uint32_t len;
    Tessera__Handshake *hs = NULL;
    if (ts_raw_read_frame(fd, meta, &len) == TS_MSG_HANDSHAKE)
      hs = tessera__handshake__unpack(NULL, len, meta);
    if (hs) {
      Tessera__HandshakeReply r = TESSERA__HANDSHAKE_REPLY__INIT;
      r.request_id = hs->request_id;
      r.num_shards = 1;
      r.mode = TESSERA__MODE__MODE_ASYNC;
      r.partition_bytes = 4096;
      r.num_workers = 1;
      if (fk->proof != PROOF_NONE && hs->client_nonce.len == TS_AUTH_NONCE_LEN) {
        ts_auth_proof(fk->proof == PROOF_RIGHT ? TOKEN : "a guess at the token", nonce,
                      hs->client_nonce.data, proof);
        r.proof.data = proof;
        r.proof.len = sizeof proof;
      }
      ts_raw_send_msg(fd, TS_MSG_HANDSHAKE_REPLY, &r.base, 0);
      tessera__handshake__free_unpacked(hs, NULL);
    }
    ts_raw_closed_by_peer(fd, 10000);
    close(fd);
  }
  return NULL;
}

static void fake_start(fake_t *fk, proof_t proof, int conns, pthread_t *th) {
  fk->proof = proof;
  fk->conns = conns;
  fk->port = ts_free_port();
  fk->listener = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fk->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fk->port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fk->listener, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fk->listener, 8), 0);
  assert_int_equal(pthread_create(th, NULL, fake_shard, fk), 0);
}

static void fake_stop(fake_t *fk, pthread_t th) {
  shutdown(fk->listener, SHUT_RDWR);
  pthread_join(th, NULL);
  close(fk->listener);
}

/* The C library against the fake: with a token, no proof or a wrong one is refused
 * (TS_CLIENT_EAUTH, saying why), the right one accepted; without a token nothing is
 * asked. */
static int open_fake(fake_t *fk, const char *token, char *err, size_t n) {
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", fk->port);
  const char *addrs[1] = {addr};
  ts_client_opts_t o;
  tc_opts(&o, addrs, 1);
  o.task = 0;
  o.token = token;
  o.connect_timeout_s = 3;
  o.request_timeout_s = 3;
  o.require_all = true;
  ts_client_t *cl = NULL;
  int rc = ts_client_open(&cl, &o, err, n);
  ts_client_close(cl);
  return rc;
}

static void test_fake_shard_refused(void **state) {
  (void)state;
  static const struct {
    proof_t proof;
    const char *token;
    int rc;
    const char *says;
  } cases[] = {
      {PROOF_NONE, TOKEN, TS_EAUTH, "did not prove it knows the token"},
      {PROOF_WRONG, TOKEN, TS_EAUTH, "sent a wrong proof that it knows the token"},
      {PROOF_RIGHT, TOKEN, 0, NULL},
      {PROOF_NONE, NULL, 0, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_t fk;
    pthread_t th;
    fake_start(&fk, cases[i].proof, 1, &th);
    char err[512] = "";
    int rc = open_fake(&fk, cases[i].token, err, sizeof err);
    if (rc != cases[i].rc) fail_msg("case %zu: rc %d (%s), not %d", i, rc, err, cases[i].rc);
    if (cases[i].says && !strstr(err, cases[i].says))
      fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].says);
    fake_stop(&fk, th);
  }
}

/* psctl against the fake, with the job's token: exit 77, "authentication failed", the
 * token file named; never "is down". */
static void test_psctl_refuses_fake_shard(void **state) {
  (void)state;
  char dir[] = "/tmp/tessera-ident-XXXXXX", path[300];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/token", dir);
  write_file(path, TOKEN "\n");
  fake_t fk;
  pthread_t th;
  fake_start(&fk, PROOF_NONE, 1, &th);
  char ps[80], tok[340], out[4096], err[4096];
  snprintf(ps, sizeof ps, "cluster.ps=[\"127.0.0.1:%d\"]", fk.port);
  snprintf(tok, sizeof tok, "auth.token_file=\"%s\"", path);
  const char *argv[] = {ts_psctl_path, "--set", ps, "--set", tok, "status", NULL};
  int rc = ts_run_capture(argv, out, sizeof out, err, sizeof err);
  if (rc != 77) fprintf(stderr, "psctl: %d\n%s%s\n", rc, out, err);
  assert_int_equal(rc, 77);
  assert_non_null(strstr(err, "authentication failed"));
  assert_non_null(strstr(err, path));
  assert_null(strstr(err, "is down"));
  fake_stop(&fk, th);
  remove(path);
  rmdir(dir);
}

/* psctl with the worker token (issue 30, item 4): status, health, shards and workers read;
 * checkpoint is refused by name. A wrong token is an authentication failure (exit 77,
 * naming the file to compare), never a shard down. */
static int psctl_with(fixture_t *f, const char *token_file, const char *admin_file,
                      const char *cmd, char *out, size_t n, char *err, size_t en) {
  char tok[340], adm[340];
  snprintf(tok, sizeof tok, "auth.token_file=\"%s\"", token_file);
  snprintf(adm, sizeof adm, "auth.admin_token_file=\"%s\"", admin_file);
  const char *argv[] = {ts_psctl_path, "-c", f->c.config, "--set", tok, "--set", adm, cmd, NULL};
  int rc = ts_run_capture(argv, out, n, err, en);
  fprintf(stderr, "psctl %s -> %d\n", cmd, rc);
  return rc;
}

static void test_psctl_read_only(void **state) {
  (void)state;
  fixture_t f;
  start(&f, WITH_ADMIN);
  char missing[128], wrong[128], out[8192], err[4096];
  snprintf(missing, sizeof missing, "%s/elsewhere.token", f.dir); /* not on this host */
  snprintf(wrong, sizeof wrong, "%s/wrong.token", f.dir);
  write_file(wrong, "not the token of this job\n");
  static const char *const reads[] = {"status", "health", "shards", "workers"};
  for (size_t i = 0; i < 4; i++) {
    int rc = psctl_with(&f, f.token_path, missing, reads[i], out, sizeof out, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s%s\n", out, err);
    assert_int_equal(rc, 0);
  }
  assert_int_equal(psctl_with(&f, f.token_path, "", "checkpoint", out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(err, "needs the admin token (auth.admin_token_file)"));
  assert_int_equal(psctl_with(&f, f.token_path, missing, "checkpoint", out, sizeof out, err, sizeof err), 78);
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(psctl_with(&f, wrong, "", reads[i], out, sizeof out, err, sizeof err), 77);
    assert_non_null(strstr(err, "authentication failed"));
    assert_non_null(strstr(err, "auth.token_file = "));
    assert_non_null(strstr(err, wrong));
    assert_null(strstr(err, "is down"));
  }
  /* With the admin token (readable here): status too. */
  assert_int_equal(psctl_with(&f, f.token_path, f.admin_path, "status", out, sizeof out, err, sizeof err), 0);
  assert_int_equal(psctl_with(&f, f.token_path, f.admin_path, "health", out, sizeof out, err, sizeof err), 0);
  good_round(&f, 0);
  remove(wrong);
  stop(&f);
}

int main(void) {
  if (sodium_init() < 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_connection_refused),
      cmocka_unit_test(test_second_connection_without_token_has_no_voice),
      cmocka_unit_test(test_task_key),
      cmocka_unit_test(test_final_accuracy),
      cmocka_unit_test(test_fake_shard_refused),
      cmocka_unit_test(test_psctl_refuses_fake_shard),
      cmocka_unit_test(test_psctl_read_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
