#include "ts_cpu_share.h"

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int ts_cpu_share_cpus(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

/* The host part of "host:port" or "[v6]:port" into buf; loopback addresses all read as
 * "loopback" (127.0.0.1 and localhost are one host). */
static void host_of(const char *addr, char *buf, size_t n) {
  const char *end = addr[0] == '[' ? strchr(addr, ']') : strrchr(addr, ':');
  size_t len = end ? (size_t)(end - addr) + (addr[0] == '[') : strlen(addr);
  snprintf(buf, n, "%.*s", (int)len, addr);
  if (strncmp(buf, "127.", 4) == 0 || strcmp(buf, "localhost") == 0 || strcmp(buf, "[::1]") == 0)
    snprintf(buf, n, "loopback");
}

int ts_cpu_share_threads(const ts_config_t *cfg, int task, int cpus, char *why, size_t whylen) {
  if (cfg->intra_op_threads > 0) {
    snprintf(why, whylen, "device.intra_op_parallelism_threads = %d", cfg->intra_op_threads);
    return cfg->intra_op_threads;
  }
  int sharing = 1;
  char mine[300] = "", other[300];
  bool known = task >= 0 && (size_t)task < cfg->num_workers && cfg->workers[task][0];
  if (known) {
    host_of(cfg->workers[task], mine, sizeof mine);
    sharing = 0;
    for (size_t t = 0; t < cfg->num_workers; t++) {
      host_of(cfg->workers[t], other, sizeof other);
      if (strcmp(mine, other) == 0) sharing++;
    }
  }
  int threads = cpus / (sharing > 0 ? sharing : 1);
  if (threads < 1) threads = 1;
  if (sharing > 1)
    snprintf(why, whylen, "%d CPU(s) shared by the %d workers on %s", cpus, sharing,
             strcmp(mine, "loopback") == 0 ? "this host (loopback)" : mine);
  else
    snprintf(why, whylen, "%d CPU(s), no other worker of the job on this host", cpus);
  return threads;
}
