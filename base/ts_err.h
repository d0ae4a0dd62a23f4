/*
 * Error codes of Tessera.
 *
 * 0 is success, a positive return is a count, a negative return is an error. OS and libuv
 * errors pass through as negative errno values (libuv's UV_E* are -errno on Linux); Tessera's
 * own codes live in one table below, far from the errno range. The same codes travel on the
 * wire in Error.code, so a client can tell whose fault an error was.
 */
#ifndef TS_ERR_H
#define TS_ERR_H

#include <stdbool.h>
#include <stdio.h>

/* X(NAME, value, message). Keep the values stable: they are part of the wire protocol. */
#define TS_ERR_MAP(X)                                                                  \
  X(EINCOMPLETE, -30001, "incomplete input: more bytes are needed")                   \
  X(EPROTO, -30002, "protocol violation")                                              \
  X(EVERSION, -30003, "unsupported protocol version")                                  \
  X(ETOOBIG, -30004, "message exceeds a size limit")                                   \
  X(ESIZE, -30005, "payload size does not match its description")                      \
  X(ENOTENSOR, -30006, "unknown tensor or partition")                                  \
  X(ESHAPE, -30007, "tensor shape mismatch")                                           \
  X(ESTALE, -30008, "stale gradient")                                                  \
  X(EFUTURE, -30009, "step is ahead of the parameters")                                \
  X(ENONFINITE, -30010, "gradient contains NaN or Inf")                                \
  X(EAUTH, -30011, "authentication failed")                                            \
  X(EPERM, -30012, "operation needs the admin role")                                   \
  X(ECONFIG, -30013, "invalid configuration")                                          \
  X(EINVAL, -30014, "invalid argument")                                                \
  X(ENOMEM, -30015, "out of memory")                                                   \
  X(ETIMEDOUT, -30016, "timed out")                                                    \
  X(EUNAVAIL, -30017, "server unreachable")                                            \
  X(ECLOSED, -30018, "connection closed")                                              \
  X(ESHUTDOWN, -30019, "shutting down")                                                \
  X(EINTERNAL, -30020, "internal error")                                               \
  X(EDATA, -30021, "invalid data file")                                                \
  X(EDEVICE, -30022, "device error")                                                   \
  X(ENOTDECLARED, -30023, "no model declared yet")                                     \
  X(EROLE, -30024, "request not allowed for this role")                                \
  X(EBUSY, -30025, "resource busy")                                                   \
  X(ENOTREADY, -30026, "the model's initial values are not set yet")                   \
  X(ENOTABLE, -30027, "unknown embedding table")

typedef enum {
  TS_OK = 0,
#define TS_ERR_ENUM(name, value, msg) TS_##name = (value),
  TS_ERR_MAP(TS_ERR_ENUM)
#undef TS_ERR_ENUM
} ts_err_t;

/* libuv's end of stream (UV_EOF), which is not an errno: named here so base/ needs no libuv. */
#define TS_ERRNO_EOF (-4095)

/* A person-readable message for any code: Tessera's, negative errno or libuv's. Never NULL. */
const char *ts_strerror(int err);

/* The symbolic name ("ENOTENSOR", "ECONNREFUSED"); "UNKNOWN" for codes in neither table. */
const char *ts_err_name(int err);

/* True when err is one of Tessera's own codes (not an errno). */
bool ts_err_is_ts(int err);

/* Fatal invariant check, always on: logs the expression and location and aborts. */
#define ts_require(e)                                                                  \
  ((e) ? (void)0 : ts_require_fail(#e, __FILE__, __LINE__, __func__))

/* Soft assertion: logs the failed expression and evaluates to true, so the caller can drop
 * the request and the daemon lives on: `if (ts_fails_assert(n <= cap)) return TS_EINTERNAL;` */
#define ts_fails_assert(e) (!(e) && ts_assert_log(#e, __FILE__, __LINE__, __func__))

void ts_require_fail(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn));
bool ts_assert_log(const char *expr, const char *file, int line, const char *func);

/* Format a message into buf (size n), prefixing what is already there: used to wrap an
 * errmsg with context on its way up ("loading job.cfg: " + "line 3: ..."). */
void ts_errmsg_wrapf(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Format into buf, replacing its content. Both take a NULL buf (or n == 0) as "no message
 * wanted" and write nothing. */
void ts_errmsg_printf(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resource-acquiring functions use one cleanup label `fail` and an int `rc`:
 *   TS_CHECK(ts_thing_init(&t));      negative -> goto fail
 *   TS_UV_CHECK(uv_listen(...));      libuv errors are already negative errno */
#define TS_CHECK(expr)                                                                 \
  do {                                                                                 \
    rc = (expr);                                                                       \
    if (rc < 0) goto fail;                                                             \
  } while (0)
#define TS_UV_CHECK(expr) TS_CHECK(expr)

#endif
