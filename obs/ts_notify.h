/*
 * systemd's readiness protocol (sd_notify): READY=1, STATUS=..., WATCHDOG=1, STOPPING=1.
 *
 * With libsystemd (found by pkg-config at build time) the messages go to $NOTIFY_SOCKET
 * through sd_notify(3); without it, or when the process does not run under a Type=notify
 * unit (no NOTIFY_SOCKET), every call does nothing. Safe to call from any thread.
 */
#ifndef TS_NOTIFY_H
#define TS_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Send newline-separated assignments ("READY=1\nSTATUS=serving"). Returns 1 when sent,
 * 0 when there is no one to tell (or no libsystemd), a negative errno on failure. */
int ts_notify(const char *state);

/* printf-style ts_notify. */
int ts_notify_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* How often to send WATCHDOG=1, in milliseconds: half of $WATCHDOG_USEC when it is set for
 * this process ($WATCHDOG_PID absent or equal to getpid()), else 0 (no watchdog). */
uint64_t ts_notify_watchdog_interval_ms(void);

/* Whether notifications are compiled in (libsystemd was found). */
bool ts_notify_available(void);

#endif
