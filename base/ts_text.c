#include "ts_text.h"

#include <stdint.h>
#include <string.h>

#include "ts_alloc.h"

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when s does not start one (a stray
 * continuation byte, an overlong form, a surrogate, a value past U+10FFFF, a cut sequence). */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  size_t n;
  uint32_t min, v;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, min = 0x80, v = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, min = 0x800, v = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, min = 0x10000, v = c & 0x07;
  else return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
    v = (v << 6) | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  return n;
}

size_t ts_text_escape(const char *in, char *out, size_t outlen, bool backslash) {
  static const char hex[] = "0123456789abcdef";
  bool count = !out || outlen == 0;
  const unsigned char *s = (const unsigned char *)(in ? in : "");
  size_t o = 0;
  while (*s) {
    size_t n = utf8_len(s);
    char esc[4];
    const char *piece = (const char *)s;
    size_t plen = n;
    if (n == 1 && (*s < 0x20 || *s == 0x7f || (backslash && *s == '\\'))) n = 0;
    if (n == 2 && s[0] == 0xc2 && s[1] < 0xa0) n = 0; /* U+0080-U+009F: C1 controls (CSI) */
    if (n == 0) {
      if (*s == '\\') {
        esc[0] = esc[1] = '\\';
        plen = 2;
      } else {
        esc[0] = '\\', esc[1] = 'x', esc[2] = hex[*s >> 4], esc[3] = hex[*s & 15];
        plen = 4;
      }
      piece = esc;
      n = 1;
    }
    if (!count) {
      if (o + plen >= outlen) break;
      memcpy(out + o, piece, plen);
    }
    o += plen;
    s += n;
  }
  if (!count) out[o] = '\0';
  return o;
}

size_t ts_text_clean(const char *in, char *out, size_t outlen) {
  return ts_text_escape(in, out, outlen, false);
}

char *ts_text_clean_dup(const char *in) {
  size_t len = ts_text_escape(in, NULL, 0, false);
  char *out = ts_malloc(len + 1);
  if (out) ts_text_escape(in, out, len + 1, false);
  return out;
}

bool ts_text_is_safe(const char *in) {
  return !in || ts_text_escape(in, NULL, 0, false) == strlen(in);
}
