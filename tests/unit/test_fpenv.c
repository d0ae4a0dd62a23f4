/* base/ts_fpenv.c: after ts_fpenv_flush_denormals a result below FLT_MIN is 0 and a
 * subnormal input reads as 0, in the calling thread and in a thread it creates afterwards;
 * normal numbers are untouched. */
#include <float.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "ts_fpenv.h"

/* volatile: computed at run time, under the thread's environment, not folded by the
 * compiler. */
static volatile float tiny = 1e-30f, small = 1e-10f, subnormal = 1e-40f, one = 1.0f,
                      min_normal = FLT_MIN;

static void check_flushing(void) {
  assert_true(ts_fpenv_flushing_denormals());
  assert_true(tiny * small == 0.0f);    /* 1e-40 is subnormal: flushed */
  assert_true(subnormal * one == 0.0f); /* a subnormal input reads as 0 */
  assert_true(tiny * one == tiny);      /* normal numbers as before */
  assert_true(small * small > 0.0f);
  assert_true(min_normal * one == FLT_MIN); /* the smallest normal float stays */
}

static void *in_thread(void *arg) {
  (void)arg;
  check_flushing();
  return NULL;
}

static void test_default_keeps_subnormals(void **state) {
  (void)state;
  /* A fresh process (cmocka runs the tests in order: this one first) has IEEE's gradual
   * underflow. */
  assert_false(ts_fpenv_flushing_denormals());
  assert_true(tiny * small > 0.0f);
  assert_true(subnormal * one > 0.0f);
}

static void test_flush(void **state) {
  (void)state;
  if (!ts_fpenv_flush_denormals()) skip();
  check_flushing();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, in_thread, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_keeps_subnormals),
      cmocka_unit_test(test_flush),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
