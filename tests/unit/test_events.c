/* TensorBoard event files (worker/ts_events.h): written, read back, and damaged. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_events.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/tessera-events-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_round_trip(void **state) {
  (void)state;
  char sub[128], e[512];
  snprintf(sub, sizeof sub, "%s/a/b/worker-0", dir); /* parents are created */
  ts_events_t *ev = NULL;
  assert_int_equal(ts_events_open(&ev, sub, e, sizeof e), 0);
  assert_non_null(strstr(ts_events_path(ev), "/events.out.tfevents."));
  static const char *const tags[] = {"loss", "examples/sec", "zero"};
  const float v1[] = {2.5f, 1000.0f, 0.0f};
  assert_int_equal(ts_events_write_scalars(ev, 10, 1.7e9, tags, v1, 3), 0);
  const float v2[] = {0.125f};
  assert_int_equal(ts_events_write_scalars(ev, 20, 1.7e9 + 1, tags, v2, 1), 0);
  char path[512];
  snprintf(path, sizeof path, "%s", ts_events_path(ev));
  ts_events_close(ev);

  ts_events_record_t *r = NULL;
  size_t n = 0;
  assert_int_equal(ts_events_read(path, &r, &n, e, sizeof e), 0);
  assert_int_equal(n, 5);
  assert_string_equal(r[0].version, "brain.Event:2");
  assert_string_equal(r[1].tag, "loss");
  assert_true(r[1].value == 2.5f && r[1].step == 10 && r[1].wall_time == 1.7e9);
  assert_string_equal(r[2].tag, "examples/sec");
  assert_true(r[2].value == 1000.0f);
  assert_string_equal(r[3].tag, "zero"); /* a zero value is written (oneof), not dropped */
  assert_true(r[3].value == 0.0f);
  assert_true(r[4].step == 20 && r[4].value == 0.125f);
  ts_free(r);

  /* One flipped byte anywhere is found by a CRC; a truncated record is reported. */
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  for (long off = 0; off < size; off += 7) {
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x20, f);
    fflush(f);
    assert_int_equal(ts_events_read(path, &r, &n, e, sizeof e), TS_EDATA);
    assert_null(r);
    fseek(f, off, SEEK_SET);
    fputc(c, f);
    fflush(f);
  }
  fclose(f);
  assert_int_equal(truncate(path, size - 3), 0);
  assert_int_equal(ts_events_read(path, &r, &n, e, sizeof e), TS_EDATA);
  assert_non_null(strstr(e, "truncated"));
}

static void test_errors(void **state) {
  (void)state;
  char e[512];
  ts_events_t *ev = NULL;
  assert_true(ts_events_open(&ev, "/proc/no/such/dir", e, sizeof e) < 0);
  assert_null(ev);
  assert_non_null(strstr(e, "/proc/no"));
  ts_events_record_t *r = NULL;
  size_t n = 0;
  assert_true(ts_events_read("/nonexistent/events", &r, &n, e, sizeof e) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests_name("events", tests, setup, teardown);
}
