/* Text and codes from peers (docs/security.md, "What a peer can print"): a fake shard
 * (tests/lib/fake_shard.c) answers with error code -3 and details, names and devices full
 * of ESC, BEL, CR/LF, C1 and non-UTF-8 bytes; the C library returns only its own codes
 * (the unknown one as TS_CLIENT_EPROTO, naming -3) and only clean text, and psctl prints no
 * control byte of the peer's on stdout or stderr. And a real shard stores a worker's device
 * and identity clean, so psctl status and workers show them escaped. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "rawconn.h"
#include "tessera/client.h"
#include "ts_err.h"

typedef struct {
  pid_t pid;
  int port;
  char addr[32];
  const char *addrs[1];
  char dir[64];
  char config[128];
} fake_t;

static void fake_start(fake_t *fp, bool handshake_error) {
  fake_t f = {0};
  f.pid = ts_fake_shard_start(handshake_error ? "--handshake-error" : NULL, &f.port);
  assert_true(f.pid > 0);
  snprintf(f.addr, sizeof f.addr, "127.0.0.1:%d", f.port);
  snprintf(f.dir, sizeof f.dir, "/tmp/ts-peertext-XXXXXX");
  assert_non_null(mkdtemp(f.dir));
  snprintf(f.config, sizeof f.config, "%s/job.cfg", f.dir);
  FILE *cf = fopen(f.config, "w");
  assert_non_null(cf);
  fprintf(cf, "cluster = { ps = [\"%s\"]; workers = [\"127.0.0.1:1\"]; };\n", f.addr);
  fclose(cf);
  *fp = f;
  fp->addrs[0] = fp->addr; /* into *fp, not the copy */
}

static void fake_stop(fake_t *f) {
  ts_fake_shard_stop(f->pid);
  unlink(f->config);
  rmdir(f->dir);
}

/* The offset of the first byte below 0x20 (other than those in `allowed`) or DEL or an
 * 8-bit CSI in s, or -1. */
static long first_control(const char *s, const char *allowed) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if ((*p < 0x20 && !strchr(allowed, *p)) || *p == 0x7f || (p[0] == 0xc2 && p[1] == 0x9b) ||
        *p == 0x9b)
      return (long)(p - (const unsigned char *)s);
  }
  return -1;
}

#define assert_clean(s, allowed)                                                         \
  do {                                                                                   \
    long at_ = first_control((s), (allowed));                                            \
    if (at_ >= 0) fail_msg("control byte 0x%02x at %ld in: %s", (unsigned char)(s)[at_], \
                           at_, (s));                                                    \
  } while (0)

/* The library's codes: its own table, or a local errno (a failed connect). Never -3. */
static void assert_known_code(int rc) {
  assert_true(rc < 0);
  assert_int_not_equal(rc, -3);
  assert_true(ts_err_is_ts(rc) || rc == -ECONNREFUSED || rc == -ECONNRESET);
}

static ts_client_t *open_client(const fake_t *f, bool admin, int *rc, char *e, size_t en) {
  ts_client_t *cl = NULL;
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = f->addrs;
  o.num_shards = 1;
  o.task = admin ? -1 : 0;
  o.admin = admin;
  o.connect_timeout_s = 5;
  o.request_timeout_s = 5;
  o.require_all = true;
  *rc = ts_client_open(&cl, &o, e, en);
  return cl;
}

/* The C library against the fake shard: status strings clean, every refusal EPROTO with
 * the peer's number in clean text. */
static void test_library(void **state) {
  (void)state;
  fake_t f;
  fake_start(&f, false);
  char e[1024];
  int rc;
  ts_client_t *admin = open_client(&f, true, &rc, e, sizeof e);
  if (rc < 0) fail_msg("open: %s", e);
  ts_client_shard_status_t *st = NULL;
  assert_int_equal(ts_client_status(admin, 0, &st, e, sizeof e), 0);
  assert_int_equal(st->num_workers_seen, 1);
  assert_clean(st->workers[0].device, "");
  assert_clean(st->workers[0].identity, "");
  assert_clean(st->last_checkpoint, "");
  assert_int_equal(st->num_tables, 1);
  assert_clean(st->tables[0].name, "");
  assert_non_null(strstr(st->workers[0].device, "/gpu:0\\x1b]0;pwned\\x07"));
  ts_client_status_free(st);
  char path[256] = "";
  rc = ts_client_checkpoint(admin, 0, path, sizeof path, NULL, e, sizeof e);
  assert_int_equal(rc, TS_CLIENT_EPROTO);
  assert_clean(e, "");
  assert_non_null(strstr(e, "error code -3"));
  rc = ts_client_shutdown(admin, 0, false, path, sizeof path, e, sizeof e);
  assert_int_equal(rc, TS_CLIENT_EPROTO);
  assert_clean(e, "");
  ts_client_close(admin);

  ts_client_t *w = open_client(&f, false, &rc, e, sizeof e);
  if (rc < 0) fail_msg("open: %s", e);
  rc = ts_client_heartbeat(w, e, sizeof e);
  if (rc != TS_CLIENT_EPROTO) fail_msg("heartbeat: %d: %s", rc, e);
  assert_clean(e, "");
  ts_client_close(w);
  fake_stop(&f);
}

/* A handshake answered with the unknown code: the open fails with a code of the library's
 * and says why in clean text. */
static void test_library_handshake(void **state) {
  (void)state;
  fake_t f;
  fake_start(&f, true);
  char e[1024];
  int rc;
  ts_client_t *cl = open_client(&f, true, &rc, e, sizeof e);
  assert_null(cl);
  assert_known_code(rc);
  assert_clean(e, "");
  if (!strstr(e, "error code -3")) fail_msg("open: %d: %s", rc, e);
  fake_stop(&f);
}

static char out[65536], err[65536];

static int psctl(const char *config, const char *a1, const char *a2, const char *a3) {
  const char *argv[] = {ts_psctl_path, "-c", config, "--timeout", "5", a1, a2, a3, NULL};
  return ts_run_capture(argv, out, sizeof out, err, sizeof err);
}

/* psctl against the fake shard: tables and JSON without a control byte of the peer's (a
 * table has newlines, JSON its indentation's tabs too), refusals exit 1. */
static void test_psctl(void **state) {
  (void)state;
  fake_t f;
  fake_start(&f, false);
  static const char *const verbs[] = {"status", "workers", "tables", "shards"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    int rc = psctl(f.config, verbs[i], NULL, NULL);
    if (rc != 0) fail_msg("psctl %s: %d: %s", verbs[i], rc, err);
    assert_clean(out, "\n");
    assert_clean(err, "\n");
    rc = psctl(f.config, verbs[i], "-o", "json");
    assert_int_equal(rc, 0);
    assert_clean(out, "\n\t");
    assert_clean(err, "\n");
  }
  assert_int_equal(psctl(f.config, "workers", NULL, NULL), 0);
  assert_non_null(strstr(out, "/gpu:0\\x1b]0;pwned\\x07\\x1b[2J"));
  assert_int_equal(psctl(f.config, "checkpoint", NULL, NULL), 1);
  assert_clean(out, "\n");
  assert_clean(err, "\n");
  assert_non_null(strstr(err, "error code -3"));
  fake_stop(&f);

  fake_start(&f, true);
  int rc = psctl(f.config, "status", NULL, NULL);
  assert_int_not_equal(rc, 0);
  assert_clean(out, "\n");
  assert_clean(err, "\n");
  fake_stop(&f);
}

/* A worker whose device and identity carry escapes: a real shard stores them clean, and
 * psctl status and workers print them escaped. */
static void test_worker_device(void **state) {
  (void)state;
  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 1, 1, "job = { mode = \"async\"; };"), 0);
  int fd = ts_raw_worker(c.port[0], 0, "evil\x1b]0;id\x07");
  assert_true(fd >= 0);
  Tessera__Heartbeat hb = TESSERA__HEARTBEAT__INIT;
  hb.request_id = 2;
  hb.task = 0;
  hb.device = "/gpu:0\x1b]0;pwned\x07\x1b[2J\r\n\xc2\x9b" "1m";
  ts_raw_send_msg(fd, TS_MSG_HEARTBEAT, &hb.base, 0);
  uint8_t meta[4096];
  uint32_t len;
  assert_int_equal(ts_raw_read_frame(fd, meta, &len), TS_MSG_HEARTBEAT_REPLY);
  const char *argv[] = {ts_psctl_path, "-c", c.config, "status", NULL};
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  assert_clean(out, "\n");
  assert_non_null(strstr(out, "/gpu:0\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x0a\\xc2\\x9b1m"));
  argv[3] = "workers";
  assert_int_equal(ts_run_capture(argv, out, sizeof out, err, sizeof err), 0);
  assert_clean(out, "\n");
  assert_non_null(strstr(out, "/gpu:0\\x1b]0;pwned"));
  /* The shard's own /status holds the clean form too. */
  char body[65536];
  assert_int_equal(ts_http_get(c.http_port[0], "/status", body, sizeof body, NULL, 0), 200);
  assert_clean(body, "\n\t");
  assert_null(strstr(body, "\\u001b"));
  close(fd);
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_library), cmocka_unit_test(test_library_handshake),
      cmocka_unit_test(test_psctl), cmocka_unit_test(test_worker_device)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
