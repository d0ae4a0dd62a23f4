/*
 * Text from peers, made safe to print.
 *
 * Strings a peer chose (an error's detail, a worker's identity and device, a table's name)
 * reach terminals, logs, JSON and exceptions. A control byte in one (ESC, BEL, a newline)
 * could redraw an operator's terminal or forge a log line, and a byte that is not UTF-8 can
 * make a reader fail. Such strings are cleaned once, where they are received and before
 * they are stored, so that every reader holds safe text: no byte below 0x20, no DEL, no C1
 * control, only valid UTF-8.
 */
#ifndef TS_TEXT_H
#define TS_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Copy in to out (outlen bytes, always NUL-terminated when outlen > 0) with every control
 * byte (below 0x20), DEL, C1 control (U+0080-U+009F, whose CSI a terminal may obey) and
 * byte outside valid UTF-8 written as \xNN; with `backslash` a
 * backslash becomes \\ too (logs, where an escape must not be forged). Valid UTF-8 without
 * control bytes passes unchanged, so cleaning (backslash false) twice changes nothing.
 * Truncates at a whole character or escape. Returns the length written; with out NULL
 * (or outlen 0) writes nothing and returns the length the whole escape needs. Pure. */
size_t ts_text_escape(const char *in, char *out, size_t outlen, bool backslash);

/* ts_text_escape without backslash escapes: the form peer strings are stored in. */
size_t ts_text_clean(const char *in, char *out, size_t outlen);

/* A ts_malloc'd clean copy of in (NULL in: ""), freed with ts_free; NULL when out of memory. */
char *ts_text_clean_dup(const char *in);

/* True when in needs no cleaning (NULL is safe). */
bool ts_text_is_safe(const char *in);

#endif
