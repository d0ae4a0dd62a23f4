/*
 * libconfig text in, a parsed tree out. The text is rewritten first only to work around
 * libconfig 1.5's integer wrap-around, keeping every line where it was so libconfig's own
 * file:line errors still point at the user's text.
 */
#include <ctype.h>
#include <libconfig.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_config_int.h"
#include "ts_err.h"

/* libconfig 1.5 reads an integer literal beyond 32 bits without an L suffix by silently
 * wrapping it (4294968320 becomes 1024). Before parsing, this adds the L such a literal needs,
 * so "max_message_bytes = 2147483648;" means what it says; lines stay where they were.
 * out == NULL only counts. Returns the number of L's added, or -1 with *bad_line set for a
 * literal beyond 64 bits. Files pulled in by @include are not rewritten. */
static long widen_ints(const char *s, char *out, int *bad_line) {
  size_t i = 0, o = 0;
  long added = 0;
  int line = 1;
#define EMIT(c)            \
  do {                     \
    if (out) out[o] = (c); \
    o++;                   \
  } while (0)
#define COPY_WHILE(cond)      \
  while (s[i] && (cond)) {    \
    if (s[i] == '\n') line++; \
    EMIT(s[i]);               \
    i++;                      \
  }
  while (s[i]) {
    char c = s[i];
    unsigned char uc = (unsigned char)c;
    if (c == '"') {
      EMIT(c);
      i++;
      while (s[i] && s[i] != '"') {
        if (s[i] == '\\' && s[i + 1]) {
          EMIT(s[i]);
          i++;
        }
        if (s[i] == '\n') line++;
        EMIT(s[i]);
        i++;
      }
      if (s[i]) {
        EMIT(s[i]);
        i++;
      }
    } else if (c == '#' || (c == '/' && s[i + 1] == '/')) {
      COPY_WHILE(s[i] != '\n');
    } else if (c == '/' && s[i + 1] == '*') {
      EMIT(s[i]);
      EMIT(s[i + 1]);
      i += 2;
      COPY_WHILE(!(s[i] == '*' && s[i + 1] == '/'));
      if (s[i]) {
        EMIT(s[i]);
        EMIT(s[i + 1]);
        i += 2;
      }
    } else if (isalpha(uc) || c == '*' || c == '_') {
      COPY_WHILE(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-' || s[i] == '*');
    } else if (isdigit(uc) || ((c == '-' || c == '+') && isdigit((unsigned char)s[i + 1]))) {
      bool neg = c == '-';
      size_t start = i;
      if (c == '-' || c == '+') i++;
      uint64_t v = 0;
      bool big = false, hex = false;
      if (s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        hex = true;
        i += 2;
        for (; isxdigit((unsigned char)s[i]); i++) {
          int dv =
              isdigit((unsigned char)s[i]) ? s[i] - '0' : (tolower((unsigned char)s[i]) - 'a' + 10);
          if (v > (UINT64_MAX >> 4)) big = true;
          v = (v << 4) | (uint64_t)dv;
        }
      } else {
        for (; isdigit((unsigned char)s[i]); i++) {
          uint64_t dv = (uint64_t)(s[i] - '0');
          if (v > (UINT64_MAX - dv) / 10) big = true;
          v = v * 10 + dv;
        }
      }
      bool is_float = !hex && (s[i] == '.' || s[i] == 'e' || s[i] == 'E');
      if (is_float) {
        while (isdigit((unsigned char)s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
               ((s[i] == '-' || s[i] == '+') && (s[i - 1] == 'e' || s[i - 1] == 'E')))
          i++;
      }
      for (size_t k = start; k < i; k++) EMIT(s[k]);
      if (!is_float && s[i] != 'L') {
        uint64_t lim32 = neg ? 2147483648u : 2147483647u;
        uint64_t lim64 = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        if (big || v > lim64) {
          *bad_line = line;
          return -1;
        }
        if (v > lim32) {
          EMIT('L');
          added++;
        }
      }
    } else {
      if (c == '\n') line++;
      EMIT(c);
      i++;
    }
  }
  if (out) out[o] = '\0';
  return added;
#undef EMIT
#undef COPY_WHILE
}

/* Parses libconfig text (after widen_ints) into c. Errors read "label:line: message", or just
 * the message when label is NULL (a --set value has one line). */
int ts_config_parse_text(ts_config_loader_t *ld, config_t *c, const char *text, const char *label,
                         const char *include_dir) {
  int bad_line = 0;
  long added = widen_ints(text, NULL, &bad_line);
  if (added < 0) {
    if (label)
      ts_errmsg_printf(ld->errmsg, ld->errlen, "%s:%d: integer out of the 64-bit range", label,
                       bad_line);
    else
      ts_errmsg_printf(ld->errmsg, ld->errlen, "integer out of the 64-bit range");
    return TS_ECONFIG;
  }
  char *wide = ts_malloc(strlen(text) + (size_t)added + 1);
  if (!wide) {
    ts_errmsg_printf(ld->errmsg, ld->errlen, "%s: out of memory", label ? label : ld->where);
    return TS_ENOMEM;
  }
  widen_ints(text, wide, &bad_line);
  if (include_dir) config_set_include_dir(c, include_dir); /* 1.5 strdup()s even NULL */
  int ok = config_read_string(c, wide);
  ts_free(wide);
  if (!ok) {
    const char *file = config_error_file(c) ? config_error_file(c) : label;
    if (file)
      ts_errmsg_printf(ld->errmsg, ld->errlen, "%s:%d: %s", file, config_error_line(c),
                       config_error_text(c));
    else
      ts_errmsg_printf(ld->errmsg, ld->errlen, "%s", config_error_text(c));
    return TS_ECONFIG;
  }
  return 0;
}
