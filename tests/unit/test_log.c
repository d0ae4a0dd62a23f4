/* base/ts_log.c's per-thread sink: the client library's thread sends its lines to its user's
 * callback without touching the process's logging. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ts_log.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_thread_sink)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
