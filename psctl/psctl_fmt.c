#include "psctl_fmt.h"

#include <stdio.h>

void psctl_human_bytes(char *buf, size_t n, double b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    u++;
  }
  snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}
