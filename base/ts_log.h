/*
 * Logging: one line per event on stderr, with a level.
 *
 * Lines look like `2026-11-29T21:40:00.123Z ps-server[0] info: listening on 127.0.0.1:7100`.
 * When JOURNAL_STREAM is set (the process runs under systemd with stderr on the journal) the
 * timestamp is left out and the line starts with journald's `<N>` priority prefix instead.
 * Thread-safe: each line is formatted into a buffer and written with one write(2).
 *
 * Every message is escaped before it is written (ts_log_escape): many carry strings a peer
 * chose (a worker's identity, a tensor's name, a detail from an error reply), and a newline
 * in one must not forge a line (or, under journald, a priority) of its own.
 */
#ifndef TS_LOG_H
#define TS_LOG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
  TS_LOG_CRIT = 2,
  TS_LOG_ERR = 3,
  TS_LOG_WARN = 4,
  TS_LOG_NOTICE = 5,
  TS_LOG_INFO = 6,
  TS_LOG_DEBUG = 7,
} ts_log_level_t;

/* Set the name shown on every line ("ps-server[1]") and the most verbose level written.
 * Reads JOURNAL_STREAM and TS_LOG_LEVEL (crit|err|warn|notice|info|debug) from the
 * environment. May be called again, for example once the shard index is known. */
void ts_log_init(const char *name, ts_log_level_t level);

/* Copy in to out (outlen bytes, always NUL-terminated when outlen > 0) with every byte that
 * could break a log line written as \xNN: control characters (newline, carriage return,
 * ESC ...), DEL, C1 controls, and bytes that are not part of valid UTF-8; a backslash
 * becomes \\ (ts_text_escape).
 * Valid UTF-8 text passes unchanged. Returns the length written (truncated at a whole
 * escape). */
size_t ts_log_escape(const char *in, char *out, size_t outlen);

/* Parse a level name; returns false for an unknown one. */
bool ts_log_parse_level(const char *s, ts_log_level_t *out);

bool ts_log_enabled(ts_log_level_t level);

void ts_log(ts_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Receives a line (no prefix, no newline) logged on a thread that installed it. */
typedef void (*ts_log_sink_fn)(void *arg, ts_log_level_t level, const char *msg);

/* Send what the calling thread logs to fn instead of stderr, up to max_level (the global
 * level does not apply); fn NULL restores stderr. Per thread: a library's own thread (the
 * client's) routes its lines to its user's callback without touching the process's
 * logging. While fn runs, ts_log on that thread writes to stderr as usual, so a sink may
 * forward to ts_log. */
/* Log msg through ts_log at level: the log callback (ts_client_log_fn) with which the
 * programs of this tree send the client library's diagnostics to their own log. */
void ts_log_forward(void *arg, int level, const char *msg);

void ts_log_set_thread_sink(ts_log_sink_fn fn, void *arg, ts_log_level_t max_level);

/* A status line: a live display (ps-worker's progress) kept as the last line of a
 * terminal. ts_log_status(text) draws text in place of the previous one (carriage return,
 * erase line; the text escaped as log messages are, with no newline); every log line
 * written meanwhile first erases it and draws it again after itself, so neither garbles
 * the other; it is cut to the terminal's width (a wrapped line could not be erased). NULL
 * or "" erases it and ends it. Only meaningful when
 * ts_log_status_available(): stderr is a terminal and not journald's. Thread-safe. */
bool ts_log_status_available(void);
void ts_log_status(const char *text);

#define ts_log_crit(...) ts_log(TS_LOG_CRIT, __VA_ARGS__)
#define ts_log_err(...) ts_log(TS_LOG_ERR, __VA_ARGS__)
#define ts_log_warn(...) ts_log(TS_LOG_WARN, __VA_ARGS__)
#define ts_log_notice(...) ts_log(TS_LOG_NOTICE, __VA_ARGS__)
#define ts_log_info(...) ts_log(TS_LOG_INFO, __VA_ARGS__)
#define ts_log_debug(...) \
  (ts_log_enabled(TS_LOG_DEBUG) ? ts_log(TS_LOG_DEBUG, __VA_ARGS__) : (void)0)

#endif
