/*
 * Checks that skip (CONTRIBUTING.md, "A check that needs something optional"): a check
 * that needs something this machine may lack (a tool such as promtool, a data set, a build
 * feature) never passes without it. It says on stderr why it did not run ("SKIP: ...") and
 * is counted, and the test program's main returns ts_skip_exit(failed): meson then shows
 * the test as SKIP, not OK, while a failed case still fails it.
 *
 *   TS_SKIP("no Fashion-MNIST (apt-get install dataset-fashion-mnist)");  ends a cmocka case
 *   ts_skip_note("...");        notes a check left out and lets the case go on
 *   return ts_skip_exit(cmocka_run_group_tests(tests, NULL, NULL));
 *
 * Threads: a test's main thread only.
 */
#ifndef TS_TEST_SKIP_H
#define TS_TEST_SKIP_H

/* Print "SKIP: <why>" on stderr and count a check that did not run. */
void ts_skip_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ts_skip_note, then end the current cmocka test case as skipped (cmocka's skip()). Use it
 * where cmocka.h is included. */
#define TS_SKIP(...)           \
  do {                         \
    ts_skip_note(__VA_ARGS__); \
    skip();                    \
  } while (0)

/* What a test program returns, given cmocka's count of failed tests: that count when it is
 * not 0; else 77 (meson's "skipped") when any check did not run, saying how many; else 0. */
int ts_skip_exit(int failed);

#endif
