/* Sizes on the bench programs' command lines (psbench, bare_pushpull). */
#ifndef TS_BENCH_SIZE_H
#define TS_BENCH_SIZE_H

#include <stdint.h>
#include <stdlib.h>
#include <strings.h>

/* "40MiB", "4KiB", "1GB", "4096" -> bytes; 0 on error. */
static inline uint64_t bench_parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v <= 0) return 0;
  uint64_t mul = 1;
  if (*end == 0 || strcasecmp(end, "b") == 0) mul = 1;
  else if (strcasecmp(end, "kib") == 0 || strcasecmp(end, "k") == 0) mul = 1ull << 10;
  else if (strcasecmp(end, "mib") == 0 || strcasecmp(end, "m") == 0) mul = 1ull << 20;
  else if (strcasecmp(end, "gib") == 0 || strcasecmp(end, "g") == 0) mul = 1ull << 30;
  else if (strcasecmp(end, "kb") == 0) mul = 1000;
  else if (strcasecmp(end, "mb") == 0) mul = 1000000;
  else if (strcasecmp(end, "gb") == 0) mul = 1000000000;
  else return 0;
  return (uint64_t)(v * (double)mul);
}

#endif
