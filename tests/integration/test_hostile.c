/*
 * Hostile input against a running ps-server: each bad frame gets an error reply or a
 * closed connection and a log line; a well-behaved client is served throughout, the
 * parameters do not change, and memory does not grow by the sizes the frames announce.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "rawconn.h"
#include "calls.h"
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

typedef struct {
  ts_cluster_t c;
  ts_client_t *good;
  float *w, *b;       /* parameters as first pulled */
  float *w2, *b2;
} fixture_t;

/* Connect and handshake as worker 1; returns the socket. */
static int raw_worker(fixture_t *f) {
  int fd = ts_raw_worker(f->c.port[0], 1, "hostile");
  assert_true(fd >= 0);
  return fd;
}

static int raw_connect(int port) {
  int fd = ts_raw_connect(port);
  assert_true(fd >= 0);
  return fd;
}

static void good_client_still_served(fixture_t *f) {
  float *dst[2] = {f->w2, f->b2};
  char err[512];
  int rc = tc_pull(f->good, dst, 0, 0, NULL, err, sizeof err);
  if (rc < 0) fprintf(stderr, "pull: %s\n", err);
  assert_int_equal(rc, 0);
  assert_memory_equal(f->w, f->w2, NW * sizeof(float));
  assert_memory_equal(f->b, f->b2, NB * sizeof(float));
}

static void assert_logged(fixture_t *f, const char *needle) {
  assert_true(ts_cluster_log_has(&f->c, 0, needle));
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  if (ts_cluster_start(&f->c, 1, 2, "job = { mode = \"async\"; };") < 0) return -1;
  ts_client_opts_t o = {.struct_size = sizeof(ts_client_opts_t), .addrs = f->c.addrs, .num_shards = 1, .task = 0, .connect_timeout_s = 5,
                        .request_timeout_s = 10, .require_all = true};
  char err[512];
  if (ts_client_open(&f->good, &o, err, sizeof err) < 0) return -1;
  if (ts_client_declare(f->good, model, 2, 7, err, sizeof err) < 0) return -1;
  f->w = calloc(NW, sizeof(float));
  f->b = calloc(NB, sizeof(float));
  f->w2 = calloc(NW, sizeof(float));
  f->b2 = calloc(NB, sizeof(float));
  float *dst[2] = {f->w, f->b};
  if (tc_pull(f->good, dst, 0, 0, NULL, err, sizeof err) < 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  ts_client_close(f->good);
  int bad = ts_cluster_stop(&f->c);
  free(f->w);
  free(f->b);
  free(f->w2);
  free(f->b2);
  free(f);
  return bad == 0 ? 0 : -1;
}

static void test_random_bytes(void **state) {
  fixture_t *f = *state;
  int fd = raw_connect(f->c.port[0]);
  size_t n = 1 << 20;
  uint8_t *junk = malloc(n);
  srand(12345);
  for (size_t i = 0; i < n; i++) junk[i] = (uint8_t)rand();
  ts_raw_send_all(fd, junk, n);
  free(junk);
  assert_true(ts_raw_closed_by_peer(fd, 5000));
  close(fd);
  assert_logged(f, "bad magic");
  good_client_still_served(f);
}

static void test_wrong_magic(void **state) {
  fixture_t *f = *state;
  int fd = raw_connect(f->c.port[0]);
  uint8_t h[TS_FRAME_HEADER_SIZE];
  ts_frame_encode_header(h, TS_MSG_STATUS, 0, 0);
  memcpy(h, "HTTP", 4);
  ts_raw_send_all(fd, h, sizeof h);
  uint8_t meta[4096];
  uint32_t len;
  int type;
  /* Hello may come first; then the error, then the close. */
  while ((type = ts_raw_read_frame(fd, meta, &len)) == TS_MSG_HELLO) {
  }
  assert_int_equal(type, TS_MSG_ERROR);
  assert_true(ts_raw_closed_by_peer(fd, 5000));
  close(fd);
  good_client_still_served(f);
}

static void test_huge_announced_payload(void **state) {
  fixture_t *f = *state;
  pid_t pid = f->c.pid[0];
  long before = ts_proc_rss_kib(pid);
  int fd = raw_worker(f);
  Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
  Tessera__PartSlice *sp[] = {&s};
  s.tensor = 0;
  s.part = 0;
  s.count = UINT64_C(1) << 30; /* 4 GiB of float32 */
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.request_id = 9;
  p.parts = sp;
  p.n_parts = 1;
  ts_raw_send_msg(fd, TS_MSG_PUSH, &p.base, UINT64_C(4) << 30);
  char detail[512] = "";
  int code = ts_raw_expect_error(fd, detail, sizeof detail);
  assert_int_equal(code, TS_ETOOBIG);
  assert_true(ts_raw_closed_by_peer(fd, 5000));
  close(fd);
  long after = ts_proc_rss_kib(pid);
  assert_true(after - before < 64 * 1024);
  assert_logged(f, "payload larger than this server accepts");
  good_client_still_served(f);
}

static void test_truncated_frame(void **state) {
  fixture_t *f = *state;
  int fd = raw_worker(f);
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 3;
  uint8_t buf[256];
  size_t n = ts_msg_encode(TS_MSG_STATUS, &st.base, 0, buf);
  ts_raw_send_all(fd, buf, n / 2 > TS_FRAME_HEADER_SIZE ? n / 2 : TS_FRAME_HEADER_SIZE - 3);
  close(fd);
  good_client_still_served(f);
}

static void test_push_size_mismatch(void **state) {
  fixture_t *f = *state;
  int fd = raw_worker(f);
  Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
  Tessera__PartSlice *sp[] = {&s};
  s.tensor = 1;
  s.part = 0;
  s.count = NB;
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.request_id = 10;
  p.parts = sp;
  p.n_parts = 1;
  /* The meta describes 32 floats, the header announces 16. */
  ts_raw_send_msg(fd, TS_MSG_PUSH, &p.base, 16 * 4);
  float pay[16] = {1};
  ts_raw_send_all(fd, pay, sizeof pay);
  char detail[512] = "";
  assert_int_equal(ts_raw_expect_error(fd, detail, sizeof detail), TS_ESIZE);
  assert_non_null(strstr(detail, "describes 128 payload bytes but the frame carries 64"));
  assert_true(ts_raw_closed_by_peer(fd, 5000));
  close(fd);
  assert_logged(f, "describes 128 payload bytes");
  good_client_still_served(f);
}

static void test_push_wrong_count(void **state) {
  fixture_t *f = *state;
  int fd = raw_worker(f);
  Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
  Tessera__PartSlice *sp[] = {&s};
  s.tensor = 1;
  s.part = 0;
  s.count = 31; /* the partition has 32 */
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.request_id = 11;
  p.parts = sp;
  p.n_parts = 1;
  ts_raw_send_msg(fd, TS_MSG_PUSH, &p.base, 31 * 4);
  float pay[31];
  for (int i = 0; i < 31; i++) pay[i] = 1000.0f;
  ts_raw_send_all(fd, pay, sizeof pay);
  char detail[512] = "";
  assert_int_equal(ts_raw_expect_error(fd, detail, sizeof detail), TS_ESHAPE);
  assert_non_null(strstr(detail, "has 32 values, not 31"));
  /* A refused request is survived: the same connection still works. */
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 12;
  ts_raw_send_msg(fd, TS_MSG_STATUS, &st.base, 0);
  uint8_t meta[4096];
  uint32_t len;
  assert_int_equal(ts_raw_read_frame(fd, meta, &len), TS_MSG_STATUS_REPLY);
  close(fd);
  good_client_still_served(f);
}

static void test_push_undeclared_tensor(void **state) {
  fixture_t *f = *state;
  int fd = raw_worker(f);
  Tessera__PartSlice s = TESSERA__PART_SLICE__INIT;
  Tessera__PartSlice *sp[] = {&s};
  s.tensor = 5;
  s.part = 0;
  s.count = 8;
  Tessera__Push p = TESSERA__PUSH__INIT;
  p.request_id = 13;
  p.parts = sp;
  p.n_parts = 1;
  ts_raw_send_msg(fd, TS_MSG_PUSH, &p.base, 8 * 4);
  float pay[8] = {0};
  ts_raw_send_all(fd, pay, sizeof pay);
  char detail[512] = "";
  assert_int_equal(ts_raw_expect_error(fd, detail, sizeof detail), TS_ENOTENSOR);
  assert_non_null(strstr(detail, "unknown tensor index 5"));
  close(fd);
  assert_logged(f, "unknown tensor index 5");
  good_client_still_served(f);
}

static void test_nonfinite_gradient(void **state) {
  fixture_t *f = *state;
  float *g[2] = {calloc(NW, sizeof(float)), calloc(NB, sizeof(float))};
  g[1][3] = NAN;
  char err[512];
  int rc = tc_push(f->good, (const float *const *)g, 0, NULL, err, sizeof err);
  assert_int_equal(rc, TS_ENONFINITE);
  free(g[0]);
  free(g[1]);
  good_client_still_served(f);
}

static void test_frame_before_handshake(void **state) {
  fixture_t *f = *state;
  int fd = raw_connect(f->c.port[0]);
  uint8_t meta[4096];
  uint32_t len;
  assert_int_equal(ts_raw_read_frame(fd, meta, &len), TS_MSG_HELLO);
  Tessera__Status st = TESSERA__STATUS__INIT;
  st.request_id = 1;
  ts_raw_send_msg(fd, TS_MSG_STATUS, &st.base, 0);
  char detail[512];
  assert_int_equal(ts_raw_expect_error(fd, detail, sizeof detail), TS_EPROTO);
  assert_true(ts_raw_closed_by_peer(fd, 5000));
  close(fd);
  good_client_still_served(f);
}

/* A worker identity (a string the peer chooses, logged when it joins) with a newline, a
 * journald priority, ESC and invalid UTF-8 forges no log line: it is written escaped. */
static void test_identity_cannot_forge_log_lines(void **state) {
  fixture_t *f = *state;
  int fd = ts_raw_worker(f->c.port[0], 1, "evil\n<2>ps-server[0] crit: forged\x1b[2J\xff");
  assert_true(fd >= 0);
  close(fd);
  good_client_still_served(f);
  /* Stored clean (docs/security.md, "What a peer can print or return"), then escaped as
   * every log line is, backslashes doubled. */
  assert_logged(f, "(evil\\\\x0a<2>ps-server[0] crit: forged\\\\x1b[2J\\\\xff)");
  char *log = ts_cluster_log(&f->c, 0);
  assert_non_null(log);
  for (const char *line = log; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, "<2>", 3) == 0 || strncmp(line, "ps-server[0] crit", 17) == 0) {
      fprintf(stderr, "a forged line:\n%s\n", log);
      fail();
    }
  assert_null(strchr(log, 0x1b));
  free(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_bytes),
      cmocka_unit_test(test_wrong_magic),
      cmocka_unit_test(test_huge_announced_payload),
      cmocka_unit_test(test_truncated_frame),
      cmocka_unit_test(test_push_size_mismatch),
      cmocka_unit_test(test_push_wrong_count),
      cmocka_unit_test(test_push_undeclared_tensor),
      cmocka_unit_test(test_nonfinite_gradient),
      cmocka_unit_test(test_frame_before_handshake),
      cmocka_unit_test(test_identity_cannot_forge_log_lines),
  };
  return cmocka_run_group_tests_name("hostile", tests, setup, teardown);
}
