#include "ts_prom.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ts_alloc.h"

static bool buf_reserve(ts_buf_t *b, size_t extra) {
  if (b->failed) return false;
  if (b->len + extra + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = ts_realloc(b->data, cap);
  if (!p) {
    b->failed = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void ts_buf_append(ts_buf_t *b, const char *s, size_t n) {
  if (!buf_reserve(b, n)) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

void ts_buf_printf(ts_buf_t *b, const char *fmt, ...) {
  if (b->failed) return;
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    ts_buf_append(b, small, (size_t)n);
    return;
  }
  if (!buf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void ts_buf_free(ts_buf_t *b) {
  ts_free(b->data);
  memset(b, 0, sizeof *b);
}

const double ts_prom_duration_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                          0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                          1,      2.5,     10,     60};
const size_t ts_prom_num_duration_bounds =
    sizeof ts_prom_duration_bounds / sizeof ts_prom_duration_bounds[0];

void ts_prom_hist_init(ts_prom_hist_t *h, const double *bounds, size_t n) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->num_bounds = n > TS_PROM_MAX_BUCKETS ? TS_PROM_MAX_BUCKETS : n;
}

void ts_prom_hist_observe(ts_prom_hist_t *h, double v) {
  size_t i = 0;
  while (i < h->num_bounds && v > h->bounds[i]) i++;
  h->counts[i]++;
  h->count++;
  h->sum += v;
}

void ts_prom_family(ts_buf_t *b, const char *name, const char *type, const char *help) {
  ts_buf_printf(b, "# HELP %s ", name);
  for (const char *p = help; *p; p++) {
    if (*p == '\\')
      ts_buf_append(b, "\\\\", 2);
    else if (*p == '\n')
      ts_buf_append(b, "\\n", 2);
    else
      ts_buf_append(b, p, 1);
  }
  ts_buf_printf(b, "\n# TYPE %s %s\n", name, type);
}

static void format_value(char *out, size_t n, double v) {
  if (isnan(v))
    snprintf(out, n, "NaN");
  else if (isinf(v))
    snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 9007199254740992.0)
    snprintf(out, n, "%.0f", v);
  else
    snprintf(out, n, "%.17g", v);
}

void ts_prom_sample(ts_buf_t *b, const char *name, const char *labels, double value) {
  char v[64];
  format_value(v, sizeof v, value);
  if (labels && *labels)
    ts_buf_printf(b, "%s{%s} %s\n", name, labels, v);
  else
    ts_buf_printf(b, "%s %s\n", name, v);
}

void ts_prom_hist_samples(ts_buf_t *b, const char *name, const char *labels,
                          const ts_prom_hist_t *h) {
  const char *sep = labels && *labels ? "," : "";
  const char *lab = labels ? labels : "";
  uint64_t cum = 0;
  char le[64], series[256];
  for (size_t i = 0; i <= h->num_bounds; i++) {
    cum += h->counts[i];
    if (i < h->num_bounds)
      format_value(le, sizeof le, h->bounds[i]);
    else
      snprintf(le, sizeof le, "+Inf");
    snprintf(series, sizeof series, "%s%sle=\"%s\"", lab, sep, le);
    ts_buf_printf(b, "%s_bucket{%s} %llu\n", name, series, (unsigned long long)cum);
  }
  snprintf(series, sizeof series, "%s_sum", name);
  ts_prom_sample(b, series, labels, h->sum);
  snprintf(series, sizeof series, "%s_count", name);
  ts_prom_sample(b, series, labels, (double)h->count);
}

char *ts_prom_label_escape(const char *value, char *out, size_t n) {
  size_t o = 0;
  if (n == 0) return out;
  for (const char *p = value; *p && o + 2 < n; p++) {
    if (*p == '\\' || *p == '"') {
      out[o++] = '\\';
      out[o++] = *p;
    } else if (*p == '\n') {
      out[o++] = '\\';
      out[o++] = 'n';
    } else {
      out[o++] = *p;
    }
  }
  out[o] = 0;
  return out;
}

/* --- process_* from /proc/self ------------------------------------------------------- */

static double boot_time_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  char line[256];
  double bt = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long v;
    if (sscanf(line, "btime %llu", &v) == 1) {
      bt = (double)v;
      break;
    }
  }
  fclose(f);
  return bt;
}

void ts_prom_process(ts_buf_t *b) {
  long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/proc/self/stat", "r");
  if (f) {
    char line[1024];
    size_t got = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[got] = 0;
    /* The command name may hold spaces and parentheses: parse after the last ')'. */
    char *p = strrchr(line, ')');
    unsigned long long utime = 0, stime = 0, start = 0, rss = 0;
    long threads = 0;
    if (p && tck > 0 &&
        sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %ld %*d "
               "%llu %*u %llu",
               &utime, &stime, &threads, &start, &rss) == 5) {
      ts_prom_family(b, "process_cpu_seconds_total", "counter",
                     "Total user and system CPU time spent in seconds.");
      ts_prom_sample(b, "process_cpu_seconds_total", NULL, (double)(utime + stime) / (double)tck);
      double bt = boot_time_s();
      if (bt >= 0) {
        ts_prom_family(b, "process_start_time_seconds", "gauge",
                       "Start time of the process since unix epoch in seconds.");
        ts_prom_sample(b, "process_start_time_seconds", NULL, bt + (double)start / (double)tck);
      }
      ts_prom_family(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
      ts_prom_sample(b, "process_resident_memory_bytes", NULL, (double)rss * (double)page);
      ts_prom_family(b, "process_threads", "gauge", "Number of OS threads in the process.");
      ts_prom_sample(b, "process_threads", NULL, (double)threads);
    }
  }
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (e->d_name[0] != '.') n++;
    closedir(d);
    ts_prom_family(b, "process_open_fds", "gauge", "Number of open file descriptors.");
    ts_prom_sample(b, "process_open_fds", NULL, (double)(n > 0 ? n - 1 : 0)); /* minus opendir's */
  }
}
