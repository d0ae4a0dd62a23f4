#include "ts_log.h"

#include "ts_text.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static char log_name[64] = "tessera";
static ts_log_level_t log_level = TS_LOG_INFO;
static bool log_journal = false;
static _Thread_local ts_log_sink_fn tl_sink;
static _Thread_local void *tl_sink_arg;
static _Thread_local ts_log_level_t tl_sink_level;
static _Thread_local bool tl_in_sink;

/* The status line (ts_log_status): drawn last on the terminal, cleared and drawn again
 * around every log line, all under status_mu so that lines and redraws never interleave. */
#define ERASE_LINE "\r\033[K"
static pthread_mutex_t status_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool status_on;
static char status_text[512];
static int status_fit(void);

static const char *const level_names[] = {
    [TS_LOG_CRIT] = "crit", [TS_LOG_ERR] = "error", [TS_LOG_WARN] = "warning",
    [TS_LOG_NOTICE] = "notice", [TS_LOG_INFO] = "info", [TS_LOG_DEBUG] = "debug",
};

size_t ts_log_escape(const char *in, char *out, size_t outlen) {
  return ts_text_escape(in, out, outlen, true);
}

bool ts_log_parse_level(const char *s, ts_log_level_t *out) {
  static const struct {
    const char *name;
    ts_log_level_t level;
  } names[] = {{"crit", TS_LOG_CRIT},     {"err", TS_LOG_ERR},   {"error", TS_LOG_ERR},
               {"warn", TS_LOG_WARN},     {"warning", TS_LOG_WARN}, {"notice", TS_LOG_NOTICE},
               {"info", TS_LOG_INFO},     {"debug", TS_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcasecmp(s, names[i].name) == 0) {
      *out = names[i].level;
      return true;
    }
  }
  return false;
}

void ts_log_init(const char *name, ts_log_level_t level) {
  snprintf(log_name, sizeof log_name, "%s", name);
  log_level = level;
  const char *env = getenv("TS_LOG_LEVEL");
  ts_log_level_t from_env;
  if (env && ts_log_parse_level(env, &from_env)) log_level = from_env;
  log_journal = getenv("JOURNAL_STREAM") != NULL;
}

void ts_log_set_thread_sink(ts_log_sink_fn fn, void *arg, ts_log_level_t max_level) {
  tl_sink = fn;
  tl_sink_arg = arg;
  tl_sink_level = max_level;
}

void ts_log_forward(void *arg, int level, const char *msg) {
  (void)arg;
  if (level < TS_LOG_CRIT) level = TS_LOG_CRIT;
  if (level > TS_LOG_DEBUG) level = TS_LOG_DEBUG;
  ts_log((ts_log_level_t)level, "%s", msg);
}

bool ts_log_enabled(ts_log_level_t level) {
  if (tl_sink && !tl_in_sink) return level <= tl_sink_level;
  return level <= log_level;
}

void ts_log(ts_log_level_t level, const char *fmt, ...) {
  if (!ts_log_enabled(level)) return;
  char raw[2048], line[2048 + 64];
  int n;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  if (tl_sink && !tl_in_sink) {
    ts_log_escape(raw, line, sizeof line);
    tl_in_sink = true;
    tl_sink(tl_sink_arg, level, line);
    tl_in_sink = false;
    return;
  }
  if (log_journal) {
    n = snprintf(line, sizeof line, "<%d>%s %s: ", (int)level, log_name, level_names[level]);
  } else {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 ts.tv_nsec / 1000000, log_name, level_names[level]);
  }
  if (n < 0 || (size_t)n >= sizeof line - 1) return;
  size_t len = (size_t)n + ts_log_escape(raw, line + n, sizeof line - (size_t)n - 1);
  line[len++] = '\n';
  if (!atomic_load(&status_on)) {
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
    return;
  }
  /* Erase the status line, write the log line, draw the status line again: one write. */
  char out[sizeof line + sizeof status_text + 16];
  pthread_mutex_lock(&status_mu);
  int m = snprintf(out, sizeof out, ERASE_LINE "%.*s%.*s", (int)len, line, status_fit(),
                   status_text);
  ssize_t w = write(STDERR_FILENO, out, m > 0 && (size_t)m < sizeof out ? (size_t)m : 0);
  (void)w;
  pthread_mutex_unlock(&status_mu);
}

/* How much of the status line fits on one row of the terminal: a line that wraps would
 * leave its first rows behind, since ERASE_LINE erases only the row the cursor is on. */
static int status_fit(void) {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1) return ws.ws_col - 1;
  return (int)sizeof status_text;
}

bool ts_log_status_available(void) {
  return !log_journal && isatty(STDERR_FILENO) == 1;
}

void ts_log_status(const char *text) {
  pthread_mutex_lock(&status_mu);
  bool was = atomic_load(&status_on);
  if (text && *text) {
    char esc[sizeof status_text];
    ts_log_escape(text, esc, sizeof esc);
    snprintf(status_text, sizeof status_text, "%s", esc);
    atomic_store(&status_on, true);
  } else {
    status_text[0] = 0;
    atomic_store(&status_on, false);
  }
  if (was || status_text[0]) {
    char out[sizeof status_text + 8];
    int m = snprintf(out, sizeof out, ERASE_LINE "%.*s", status_fit(), status_text);
    ssize_t w = write(STDERR_FILENO, out, m > 0 && (size_t)m < sizeof out ? (size_t)m : 0);
    (void)w;
  }
  pthread_mutex_unlock(&status_mu);
}
