/* base/ts_log.c's per-thread sink: the client library's thread sends its lines to its user's
 * callback without touching the process's logging; and the status line that log lines
 * erase and draw again. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_log.h"
#include "ts_text.h"

typedef struct {
  int lines;
  ts_log_level_t level;
  char last[256];
} capture_t;

static void sink(void *arg, ts_log_level_t level, const char *msg) {
  capture_t *c = arg;
  c->lines++;
  c->level = level;
  snprintf(c->last, sizeof c->last, "%s", msg);
  /* Logging from inside the sink goes to stderr, not back into the sink. */
  ts_log_warn("(forwarded) %s", msg);
}

static void *other_thread(void *arg) {
  (void)arg;
  ts_log_info("another thread: not captured");
  return NULL;
}

static void test_thread_sink(void **state) {
  (void)state;
  ts_log_init("test_log", TS_LOG_ERR);
  capture_t cap = {0};
  ts_log_set_thread_sink(sink, &cap, TS_LOG_INFO);
  assert_true(ts_log_enabled(TS_LOG_INFO)); /* the sink's level, not the global ERR */
  assert_false(ts_log_enabled(TS_LOG_DEBUG));
  ts_log_warn("shard %d restarted", 3);
  assert_int_equal(cap.lines, 1);
  assert_int_equal(cap.level, TS_LOG_WARN);
  assert_string_equal(cap.last, "shard 3 restarted");
  ts_log_debug("not at this level");
  assert_int_equal(cap.lines, 1);
  pthread_t th;
  pthread_create(&th, NULL, other_thread, NULL);
  pthread_join(th, NULL);
  assert_int_equal(cap.lines, 1);
  ts_log_set_thread_sink(NULL, NULL, TS_LOG_INFO);
  assert_false(ts_log_enabled(TS_LOG_INFO)); /* the global level again */
  ts_log_err("after the sink: stderr");
  assert_int_equal(cap.lines, 1);
}

/* Peer-chosen strings cannot forge a line: control bytes, DEL, backslashes and invalid
 * UTF-8 come out as escapes; valid UTF-8 passes. */
static void test_escape(void **state) {
  (void)state;
  char out[256];
  assert_int_equal(ts_log_escape("plain text", out, sizeof out), 10);
  assert_string_equal(out, "plain text");
  ts_log_escape("w1\n2026-11-30T00:00:00.000Z ps-server[0] crit: forged", out, sizeof out);
  assert_string_equal(out, "w1\\x0a2026-11-30T00:00:00.000Z ps-server[0] crit: forged");
  ts_log_escape("\x1b[31mred\r\t\x7f", out, sizeof out);
  assert_string_equal(out, "\\x1b[31mred\\x0d\\x09\\x7f");
  ts_log_escape("a\\b", out, sizeof out);
  assert_string_equal(out, "a\\\\b");
  /* UTF-8: kept when valid (é, €, 😀); a stray continuation byte, an overlong '/', a
   * surrogate and a cut sequence are escaped byte by byte. */
  ts_log_escape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", out, sizeof out);
  assert_string_equal(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  ts_log_escape("\x80|\xc0\xaf|\xed\xa0\x80|\xe2\x82", out, sizeof out);
  assert_string_equal(out, "\\x80|\\xc0\\xaf|\\xed\\xa0\\x80|\\xe2\\x82");
  /* Truncation keeps whole escapes and always terminates. */
  assert_int_equal(ts_log_escape("\n\n\n", out, 9), 8);
  assert_string_equal(out, "\\x0a\\x0a");
  assert_int_equal(ts_log_escape("abc", out, 1), 0);
  assert_string_equal(out, "");
}

/* base/ts_text.c: peer strings are stored clean. Control bytes, DEL and invalid UTF-8 are
 * escaped, a backslash is kept, so cleaning is idempotent; the length asked for with no
 * buffer is the length written with one large enough. */
static void test_text_clean(void **state) {
  (void)state;
  char out[256], again[256];
  assert_int_equal(ts_text_clean("/gpu:0\x1b[2J\x07", out, sizeof out),
                   strlen("/gpu:0\\x1b[2J\\x07"));
  assert_string_equal(out, "/gpu:0\\x1b[2J\\x07");
  ts_text_clean("a\\b caf\xc3\xa9 \xff\x7f\n", out, sizeof out);
  assert_string_equal(out, "a\\b caf\xc3\xa9 \\xff\\x7f\\x0a");
  ts_text_clean(out, again, sizeof again);
  assert_string_equal(again, out);
  assert_true(ts_text_is_safe(out));
  assert_false(ts_text_is_safe("bell\x07"));
  assert_false(ts_text_is_safe("\xc0\xaf"));
  assert_false(ts_text_is_safe("csi \xc2\x9b" "2J"));
  assert_true(ts_text_is_safe("nbsp \xc2\xa0"));
  assert_true(ts_text_is_safe(NULL));
  assert_int_equal(ts_text_escape("\x1b\x1b", NULL, 0, false), 8);
  assert_int_equal(ts_text_escape("a\\", NULL, 0, true), 3);
  assert_int_equal(ts_text_clean(NULL, out, sizeof out), 0);
  assert_string_equal(out, "");
  char *dup = ts_text_clean_dup("x\x1b");
  assert_non_null(dup);
  assert_string_equal(dup, "x\\x1b");
  ts_free(dup);
}

/* The sink gets the escaped line too. */
static void test_sink_escaped(void **state) {
  (void)state;
  capture_t cap = {0};
  ts_log_set_thread_sink(sink, &cap, TS_LOG_INFO);
  ts_log_warn("identity '%s'", "evil\n<2>forged");
  ts_log_set_thread_sink(NULL, NULL, TS_LOG_INFO);
  assert_string_equal(cap.last, "identity 'evil\\x0a<2>forged'");
}

/* What stderr receives around a status line, read back from a file put in its place. */
static void test_status_line(void **state) {
  (void)state;
  char path[] = "/tmp/ts-test-log-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  dup2(fd, STDERR_FILENO);
  ts_log_init("t", TS_LOG_INFO);
  ts_log_status("step 1");
  ts_log_info("a log line");
  ts_log_status("step 2\nforged");
  ts_log_status(NULL);
  ts_log_info("after");
  dup2(saved, STDERR_FILENO);
  close(saved);
  char buf[1024] = {0};
  assert_true(lseek(fd, 0, SEEK_SET) == 0);
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  unlink(path);
  assert_true(n > 0);
  /* Drawn; erased for the log line, which is followed by the line drawn again; redrawn
   * (escaped: no newline of its own); erased; then a plain log line. */
  const char *p = buf;
  assert_memory_equal(p, "\r\033[Kstep 1\r\033[K", 14);
  p = strstr(p, "t info: a log line\nstep 1\r\033[Kstep 2\\x0aforged\r\033[K");
  assert_non_null(p);
  p = strstr(p, "\r\033[K2");
  assert_non_null(p);
  assert_non_null(strstr(p, "t info: after\n"));
  assert_null(strstr(strstr(buf, "after"), "step"));
}

/* On a terminal narrower than the status line, the line is cut to the width: a line that
 * wraps leaves its first rows behind at every redraw ("\r\033[K" erases only the last). */
static void test_status_line_fits(void **state) {
  (void)state;
  int master, slave;
  struct winsize ws = {.ws_row = 24, .ws_col = 40};
  assert_int_equal(openpty(&master, &slave, NULL, NULL, &ws), 0);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  dup2(slave, STDERR_FILENO);
  char text[200];
  memset(text, 'x', sizeof text - 1);
  text[sizeof text - 1] = 0;
  ts_log_status(text);
  ts_log_status(NULL);
  dup2(saved, STDERR_FILENO);
  close(saved);
  char buf[1024] = {0};
  ssize_t n = read(master, buf, sizeof buf - 1);
  close(slave);
  close(master);
  assert_true(n > 0);
  buf[n] = 0;
  const char *x = strchr(buf, 'x');
  assert_non_null(x);
  size_t run = strspn(x, "x");
  if (run >= 40) fail_msg("a status line of %zu columns on a terminal of 40", run);
  assert_true(run > 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_thread_sink), cmocka_unit_test(test_escape),
                                     cmocka_unit_test(test_text_clean),
                                     cmocka_unit_test(test_sink_escaped),
                                     cmocka_unit_test(test_status_line),
                                     cmocka_unit_test(test_status_line_fits)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
