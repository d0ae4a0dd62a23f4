#include "ts_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <errno.h>

#include "ts_log.h"

const char *ts_strerror(int err) {
  switch (err) {
    case 0:
      return "success";
#define TS_ERR_MSG(name, value, msg) \
  case value:                        \
    return msg;
      TS_ERR_MAP(TS_ERR_MSG)
#undef TS_ERR_MSG
    default:
      break;
  }
  if (err == TS_ERRNO_EOF) return "end of file";
  if (err < 0 && err > -4096) {
    /* libuv's errors are -errno on Linux; its messages are libc's with a lower-case first
     * letter ("connection refused"), which is how ours read in the middle of a sentence. */
    static _Thread_local char buf[128];
    snprintf(buf, sizeof buf, "%s", strerror(-err));
    buf[0] = (char)tolower((unsigned char)buf[0]);
    return buf;
  }
  return "unknown error";
}

const char *ts_err_name(int err) {
  switch (err) {
    case 0:
      return "OK";
#define TS_ERR_NAME(name, value, msg) \
  case value:                         \
    return #name;
      TS_ERR_MAP(TS_ERR_NAME)
#undef TS_ERR_NAME
    default:
      break;
  }
  if (err == TS_ERRNO_EOF) return "EOF";
  if (err < 0 && err > -4096) {
    const char *name = strerrorname_np(-err);
    if (name) return name;
  }
  return "UNKNOWN";
}

bool ts_err_is_ts(int err) {
  switch (err) {
#define TS_ERR_IS(name, value, msg) case value:
    TS_ERR_MAP(TS_ERR_IS)
#undef TS_ERR_IS
    return true;
    default:
      return false;
  }
}

void ts_require_fail(const char *expr, const char *file, int line, const char *func) {
  ts_log(TS_LOG_CRIT, "invariant broken: %s (%s:%d in %s)", expr, file, line, func);
  abort();
}

bool ts_assert_log(const char *expr, const char *file, int line, const char *func) {
  ts_log(TS_LOG_ERR, "assertion failed, request dropped: %s (%s:%d in %s)", expr, file, line,
         func);
  return true;
}

void ts_errmsg_printf(char *buf, size_t n, const char *fmt, ...) {
  if (!buf || n == 0) return; /* the caller asked for no message */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
}

void ts_errmsg_wrapf(char *buf, size_t n, const char *fmt, ...) {
  if (!buf || n == 0) return;
  char prefix[256];
  char old[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  snprintf(old, sizeof old, "%s", buf);
  snprintf(buf, n, "%s: %s", prefix, old);
}
