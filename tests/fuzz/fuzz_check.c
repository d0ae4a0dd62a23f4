#include <stdio.h>
#include <stdlib.h>

#include "fuzz_target.h"

void fuzz_check(int ok, const char *target, const char *what) {
  if (ok) return;
  fprintf(stderr, "%s: invariant violated: %s\n", target, what);
  abort();
}
