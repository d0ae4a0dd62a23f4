/*
 * The live progress line of ps-worker (worker/ts_progress_line.h) on a pseudo-terminal, fed
 * steps with made-up times, so the rate it prints is arithmetic, not a measurement: a
 * worker that joins a running job at step 40 and makes 20 steps a second shows 20 steps'
 * worth of examples a second, not the 60 steps of the job over its own second (issue 30,
 * "the live line shows ~7 x the real rate after joining a running job").
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pty.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts_progress_line.h"

/* Steps first+1..last, dt seconds apart, batch 32, drawn on a pseudo-terminal; the
 * examples/s of the last drawing. */
static double last_rate(uint64_t first, uint64_t last, double dt) {
  int master, slave;
  assert_int_equal(openpty(&master, &slave, NULL, NULL, NULL), 0);
  int saved = dup(STDERR_FILENO);
  assert_true(saved >= 0);
  dup2(slave, STDERR_FILENO);
  ts_progress_line_t *pl = ts_progress_line_new(0, 32);
  assert_non_null(pl);
  for (uint64_t s = first + 1; s <= last; s++) {
    ts_progress_t p = {.step = s,
                       .first_step = first,
                       .total_steps = last,
                       .epoch_progress = 0.5,
                       .loss = 1.0,
                       .seconds = (double)(s - first) * dt};
    ts_progress_line_step(pl, &p);
  }
  ts_progress_line_free(pl);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(slave);
  fcntl(master, F_SETFL, O_NONBLOCK);
  static char buf[1 << 16];
  size_t len = 0;
  ssize_t n;
  while (len < sizeof buf - 1 && (n = read(master, buf + len, sizeof buf - 1 - len)) > 0)
    len += (size_t)n;
  close(master);
  buf[len] = 0;
  /* the last drawing's "N examples/s" */
  const char *at = NULL;
  for (const char *p = buf; (p = strstr(p, " examples/s")) != NULL; p++) at = p;
  assert_non_null(at);
  while (at > buf && at[-1] != ' ') at--;
  return atof(at);
}

static void test_rate_after_joining(void **state) {
  (void)state;
  /* 20 steps a second x 32 = 640 examples/s, joined at step 40 (counted from step 0 the
   * job's 60 steps over the worker's 1 s would show 1920) */
  double rate = last_rate(40, 60, 0.05);
  if (rate < 639.5 || rate > 640.5) fail_msg("joined at step 40: %.1f examples/s, not 640", rate);
  /* from the start, and past the first 2 s window: the window's rate, the same */
  rate = last_rate(0, 100, 0.05);
  if (rate < 639.5 || rate > 640.5) fail_msg("from step 0: %.1f examples/s, not 640", rate);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_rate_after_joining)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
