#include "ts_notify.h"

#include <stdarg.h>
#include <stdio.h>

#include "ts_build_config.h"

#if TS_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

bool ts_notify_available(void) { return TS_HAVE_SYSTEMD; }

int ts_notify(const char *state) {
#if TS_HAVE_SYSTEMD
  return sd_notify(0, state);
#else
  (void)state;
  return 0;
#endif
}

int ts_notify_printf(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return ts_notify(buf);
}

uint64_t ts_notify_watchdog_interval_ms(void) {
#if TS_HAVE_SYSTEMD
  uint64_t usec = 0;
  /* sd_watchdog_enabled checks WATCHDOG_PID against getpid() for us. */
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    uint64_t ms = usec / 2000;
    return ms ? ms : 1;
  }
#endif
  return 0;
}
