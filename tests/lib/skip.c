#include "skip.h"

#include <stdarg.h>
#include <stdio.h>

static int skipped;

void ts_skip_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("SKIP: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  skipped++;
}

int ts_skip_exit(int failed) {
  if (failed != 0) return failed;
  if (skipped == 0) return 0;
  fprintf(stderr, "SKIP: %d check(s) did not run (see above): exit 77, a skipped test\n", skipped);
  return 77;
}
