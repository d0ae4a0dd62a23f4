/* The Criteo TSV reader (ts_criteo.h). */
#include "ts_criteo.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ts_alloc.h"
#include "ts_err.h"

struct ts_criteo_reader {
  gzFile f;
  char *path;
  uint64_t line; /* lines read so far */
  char buf[TS_CRITEO_LINE_MAX + 2];
};

static int bad(char *why, size_t len, int field, const char *what, const char *v, size_t vlen) {
  char name[16];
  if (field == 0)
    snprintf(name, sizeof name, "label");
  else if (field <= TS_CRITEO_INTS)
    snprintf(name, sizeof name, "I%d", field);
  else
    snprintf(name, sizeof name, "C%d", field - TS_CRITEO_INTS);
  if (why)
    snprintf(why, len, "field %d (%s): \"%.*s\" %s", field + 1, name, (int)(vlen > 40 ? 40 : vlen),
             v, what);
  return TS_EDATA;
}

int ts_criteo_parse(const char *line, ts_criteo_row_t *row, char *why, size_t whylen) {
  if (!line || !row) return TS_EINVAL;
  memset(row, 0, sizeof *row);
  size_t end = strlen(line);
  while (end > 0 && (line[end - 1] == '\n' || line[end - 1] == '\r')) end--;
  const char *p = line, *stop = line + end;
  int field = 0;
  for (;; field++) {
    const char *q = memchr(p, '\t', (size_t)(stop - p));
    if (!q) q = stop;
    size_t n = (size_t)(q - p);
    if (field >= 1 + TS_CRITEO_INTS + TS_CRITEO_CATS) {
      if (why)
        snprintf(why, whylen,
                 "more than %d tab-separated fields (label, 13 integers, 26 "
                 "categoricals)",
                 1 + TS_CRITEO_INTS + TS_CRITEO_CATS);
      return TS_EDATA;
    }
    char v[24];
    if (n >= sizeof v) return bad(why, whylen, field, "is too long", p, n);
    memcpy(v, p, n);
    v[n] = '\0';
    if (field == 0) {
      if (n != 1 || (v[0] != '0' && v[0] != '1'))
        return bad(why, whylen, field, "is not 0 or 1", p, n);
      row->label = v[0] - '0';
    } else if (field <= TS_CRITEO_INTS) {
      int j = field - 1;
      if (n == 0) {
        row->int_missing[j] = true;
      } else {
        char *e;
        errno = 0;
        long long x = strtoll(v, &e, 10);
        if (errno || *e || e == v) return bad(why, whylen, field, "is not an integer", p, n);
        row->dense[j] = x > 0 ? (float)log1p((double)x) : 0.0f;
      }
    } else {
      int j = field - 1 - TS_CRITEO_INTS;
      if (n == 0) {
        row->cat_missing[j] = true;
      } else {
        if (n > 16) return bad(why, whylen, field, "has more than 16 hex digits", p, n);
        uint64_t x = 0;
        for (size_t i = 0; i < n; i++) {
          char c = v[i];
          int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
          if (d < 0) return bad(why, whylen, field, "is not hex", p, n);
          x = x << 4 | (uint64_t)d;
        }
        row->cat[j] = x;
      }
    }
    if (q == stop) break;
    p = q + 1;
  }
  if (field != TS_CRITEO_INTS + TS_CRITEO_CATS) {
    if (why)
      snprintf(why, whylen,
               "%d tab-separated fields, expected %d (label, 13 integers, 26 "
               "categoricals)",
               field + 1, 1 + TS_CRITEO_INTS + TS_CRITEO_CATS);
    return TS_EDATA;
  }
  return 0;
}

int ts_criteo_open(ts_criteo_reader_t **out, const char *path, char *errmsg, size_t errlen) {
  if (!out || !path) return TS_EINVAL;
  *out = NULL;
  ts_criteo_reader_t *r = ts_calloc(1, sizeof *r);
  if (!r || !(r->path = ts_strdup(path))) {
    ts_free(r);
    return TS_ENOMEM;
  }
  r->f = gzopen(path, "rb");
  if (!r->f) {
    int e = errno ? errno : EIO;
    if (errmsg) snprintf(errmsg, errlen, "%s: %s", path, strerror(e));
    ts_criteo_close(r);
    return -e;
  }
  gzbuffer(r->f, 1 << 17);
  *out = r;
  return 0;
}

int ts_criteo_next(ts_criteo_reader_t *r, ts_criteo_row_t *row, char *errmsg, size_t errlen) {
  if (!r || !row) return TS_EINVAL;
  for (;;) {
    if (!gzgets(r->f, r->buf, (int)sizeof r->buf)) {
      int zerr = 0;
      const char *msg = gzerror(r->f, &zerr);
      if (zerr != Z_OK && zerr != Z_BUF_ERROR) {
        if (errmsg)
          snprintf(errmsg, errlen, "%s:%llu: %s", r->path, (unsigned long long)r->line + 1, msg);
        return TS_EDATA;
      }
      return 0;
    }
    r->line++;
    size_t n = strlen(r->buf);
    /* The line without its newline; gzgets stops one byte past the limit, so a longer line
     * shows here as one over it. */
    if (n - (n > 0 && r->buf[n - 1] == '\n') > TS_CRITEO_LINE_MAX) {
      if (errmsg)
        snprintf(errmsg, errlen, "%s:%llu: a line longer than %d bytes", r->path,
                 (unsigned long long)r->line, TS_CRITEO_LINE_MAX);
      return TS_EDATA;
    }
    if (n == 0 || (n == 1 && r->buf[0] == '\n')) continue; /* a blank line */
    char why[160];
    if (ts_criteo_parse(r->buf, row, why, sizeof why) < 0) {
      if (errmsg)
        snprintf(errmsg, errlen, "%s:%llu: %s", r->path, (unsigned long long)r->line, why);
      return TS_EDATA;
    }
    return 1;
  }
}

int ts_criteo_rewind(ts_criteo_reader_t *r) {
  if (!r) return TS_EINVAL;
  r->line = 0;
  return gzrewind(r->f) == 0 ? 0 : -EIO;
}

int ts_criteo_count(const char *path, uint64_t *rows, char *errmsg, size_t errlen) {
  ts_criteo_reader_t *r = NULL;
  int rc = ts_criteo_open(&r, path, errmsg, errlen);
  if (rc < 0) return rc;
  ts_criteo_row_t row;
  uint64_t n = 0;
  while ((rc = ts_criteo_next(r, &row, errmsg, errlen)) == 1) n++;
  ts_criteo_close(r);
  if (rc < 0) return rc;
  *rows = n;
  return 0;
}

void ts_criteo_close(ts_criteo_reader_t *r) {
  if (!r) return;
  if (r->f) gzclose(r->f);
  ts_free(r->path);
  ts_free(r);
}
