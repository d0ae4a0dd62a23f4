/*
 * table_rows: what a shard's row table (server/ts_table.h) costs, in one process, no
 * network: rows made per second, lookups per second over Zipf-distributed keys, Adam row
 * updates per second, and the process's RSS per row against the raw value + state bytes.
 *
 *   build/bench/table_rows [--rows N] [--dim D] [--zipf S] [--lookups N]
 *
 * Prints one JSON object. Speed is never asserted by a test (bench/RESULTS.md).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_key.h"
#include "ts_rowopt.h"
#include "ts_table.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double rss_bytes(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  fclose(f);
  return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static double uniform01(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * 0x1p-53;
}

/* A Zipf(s) rank in [0, n) by inverting the continuous approximation of its CDF. */
static uint64_t zipf(uint64_t n, double s) {
  double u = uniform01();
  if (fabs(s - 1.0) < 1e-9) return (uint64_t)(exp(u * log((double)n + 1.0)) - 1.0) % n;
  double a = 1.0 - s, hn = (pow((double)n + 1.0, a) - 1.0) / a;
  return (uint64_t)(pow(u * hn * a + 1.0, 1.0 / a) - 1.0) % n;
}

int main(int argc, char **argv) {
  uint64_t rows = 1000000, lookups = 4000000;
  uint32_t dim = 64;
  double s = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rows")) rows = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--dim")) dim = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--zipf")) s = strtod(argv[i + 1], NULL);
    else if (!strcmp(argv[i], "--lookups")) lookups = strtoull(argv[i + 1], NULL, 10);
    else {
      fprintf(stderr, "usage: table_rows [--rows N] [--dim D] [--zipf S] [--lookups N]\n");
      return 2;
    }
  }
  ts_rowopt_t opt;
  ts_rowopt_defaults(&opt, TS_ROWOPT_ADAM, 0.001f);
  ts_table_t t;
  if (ts_table_init(&t, dim, 2, 0) < 0) return 1;
  uint64_t table_key = 0x5eed;
  double rss0 = rss_bytes(), t0 = now_s();
  for (uint64_t k = 0; k < rows; k++) {
    bool created;
    int err;
    uint32_t id = ts_table_insert(&t, k, &created, &err);
    if (id == TS_TABLE_NONE) {
      fprintf(stderr, "table_rows: insert failed (%d)\n", err);
      return 1;
    }
    ts_key_row_init(ts_table_row(&t, id), dim, TS_KEY_INIT_UNIFORM, 0.05, table_key, k);
  }
  double t1 = now_s(), rss1 = rss_bytes();
  /* Lookups of Zipf-distributed keys, and an Adam update of each row found. */
  float *g = ts_aligned_alloc(dim * sizeof(float));
  for (uint32_t j = 0; j < dim; j++) g[j] = 0.01f;
  uint64_t *keys = malloc(lookups * sizeof *keys);
  for (uint64_t i = 0; i < lookups; i++) keys[i] = zipf(rows, s);
  double t2 = now_s();
  uint64_t found = 0;
  for (uint64_t i = 0; i < lookups; i++) found += ts_table_find(&t, keys[i]) != TS_TABLE_NONE;
  double t3 = now_s();
  for (uint64_t i = 0; i < lookups; i++) {
    uint32_t id = ts_table_find(&t, keys[i]);
    float *r = ts_table_row(&t, id);
    ts_table_meta_t *m = ts_table_meta(&t, id);
    ts_rowopt_apply(&opt, r, g, 1.0f, dim, r + dim, r + 2 * (size_t)dim, ++m->updates);
  }
  double t4 = now_s();
  double raw = (double)dim * 3 * sizeof(float);
  printf("{\"rows\": %llu, \"dim\": %u, \"zipf\": %.2f, \"inserts_per_s\": %.0f, "
         "\"lookups_per_s\": %.0f, \"adam_rows_per_s\": %.0f, \"found\": %llu, "
         "\"table_bytes_per_row\": %.1f, \"rss_bytes_per_row\": %.1f, \"raw_bytes_per_row\": %.0f, "
         "\"rss_ratio\": %.3f}\n",
         (unsigned long long)rows, dim, s, (double)rows / (t1 - t0),
         (double)lookups / (t3 - t2), (double)lookups / (t4 - t3), (unsigned long long)found,
         (double)ts_table_bytes(&t) / (double)rows, (rss1 - rss0) / (double)rows, raw,
         (rss1 - rss0) / (double)rows / raw);
  free(keys);
  ts_free(g);
  ts_table_free(&t);
  return 0;
}
