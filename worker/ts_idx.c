/*
 * IDX reader. zlib's gzread reads gzip and plain files alike (a file without the gzip magic
 * is passed through), so one path serves both. Pixels are converted to floats in chunks, so
 * the raw bytes never need a second full-size buffer.
 */
#include "ts_idx.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <zlib.h>

#include "ts_alloc.h"
#include "ts_err.h"

#define CHUNK (1u << 20)

typedef struct {
  const char *path;
  gzFile f;
  char *errmsg;
  size_t errlen;
} reader_t;

static int open_reader(reader_t *r, const char *path, char *errmsg, size_t errlen) {
  r->path = path;
  r->errmsg = errmsg;
  r->errlen = errlen;
  errno = 0;
  r->f = gzopen(path, "rb");
  if (!r->f) {
    int err = errno ? -errno : TS_ENOMEM;
    ts_errmsg_printf(errmsg, errlen, "%s: cannot open: %s", path,
                     errno ? strerror(errno) : "out of memory");
    return err;
  }
  gzbuffer(r->f, 256 * 1024);
  return 0;
}

/* zlib's message without the "path: " it puts in front (our messages name the file once). */
static const char *zlib_message(reader_t *r, const char *msg) {
  if (!msg) return "";
  size_t n = strlen(r->path);
  if (strncmp(msg, r->path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ') return msg + n + 2;
  return msg;
}

/* Read up to len bytes; returns the count read (< len only at the end of the data) or a
 * negative code with errmsg set. */
static long read_some(reader_t *r, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    size_t want = len - got > CHUNK ? CHUNK : len - got;
    int n = gzread(r->f, (unsigned char *)buf + got, (unsigned)want);
    if (n < 0) {
      int zerr = Z_OK;
      const char *msg = gzerror(r->f, &zerr);
      if (zerr == Z_ERRNO) {
        int e = errno ? errno : EIO;
        ts_errmsg_printf(r->errmsg, r->errlen, "%s: read error: %s", r->path, strerror(e));
        return -e;
      }
      msg = zlib_message(r, msg);
      ts_errmsg_printf(r->errmsg, r->errlen, "%s: corrupt gzip data: %s", r->path,
                       *msg ? msg : "unknown zlib error");
      return TS_EDATA;
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  return (long)got;
}

/* What zlib says about a short read ("unexpected end of file" for a cut gzip stream), or "". */
static const char *short_read_note(reader_t *r) {
  int zerr = Z_OK;
  const char *msg = gzerror(r->f, &zerr);
  return zerr != Z_OK ? zlib_message(r, msg) : "";
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Read and validate the magic and the dimensions; dims[0..ndims) receive the sizes. */
static int read_header(reader_t *r, uint32_t want_magic, const char *kind, uint32_t *dims,
                       unsigned ndims, uint64_t *total) {
  unsigned char hdr[4 + 4 * 3];
  size_t hdr_len = 4 + 4 * (size_t)ndims;
  long got = read_some(r, hdr, 4);
  if (got < 0) return (int)got;
  if (got < 4) {
    ts_errmsg_printf(r->errmsg, r->errlen, "%s: truncated: %ld bytes, too short for an IDX header",
                     r->path, got);
    return TS_EDATA;
  }
  uint32_t magic = be32(hdr);
  if (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08) {
    ts_errmsg_printf(r->errmsg, r->errlen,
                     "%s: bad magic 0x%08x: not an IDX file of unsigned bytes (%s: 0x%08x)",
                     r->path, magic, kind, want_magic);
    return TS_EDATA;
  }
  if (magic != want_magic) {
    ts_errmsg_printf(r->errmsg, r->errlen,
                     "%s: wrong dimensions: magic 0x%08x has %u dimensions, %s need %u "
                     "(magic 0x%08x)%s",
                     r->path, magic, hdr[3], kind, ndims, want_magic,
                     magic == TS_IDX_MAGIC_IMAGES   ? ": this is an images file"
                     : magic == TS_IDX_MAGIC_LABELS ? ": this is a labels file"
                                                    : "");
    return TS_EDATA;
  }
  got = read_some(r, hdr + 4, hdr_len - 4);
  if (got < 0) return (int)got;
  if ((size_t)got < hdr_len - 4) {
    ts_errmsg_printf(r->errmsg, r->errlen,
                     "%s: truncated: header needs %zu bytes of dimensions, found %ld", r->path,
                     hdr_len - 4, got);
    return TS_EDATA;
  }
  uint64_t prod = 1;
  for (unsigned d = 0; d < ndims; d++) {
    dims[d] = be32(hdr + 4 + 4 * d);
    if (dims[d] == 0) {
      ts_errmsg_printf(r->errmsg, r->errlen, "%s: dimension %u is 0", r->path, d);
      return TS_EDATA;
    }
    prod *= dims[d]; /* each factor < 2^32 and the running product <= MAX_BYTES < 2^32 */
    if (prod > TS_IDX_MAX_BYTES) {
      ts_errmsg_printf(r->errmsg, r->errlen,
                       "%s: dimensions too large: more than %llu bytes of data", r->path,
                       (unsigned long long)TS_IDX_MAX_BYTES);
      return TS_EDATA;
    }
  }
  *total = prod;
  return 0;
}

/* After `expected` data bytes the file must end. */
static int check_end(reader_t *r, uint64_t expected, const char *what) {
  unsigned char tmp[4096];
  uint64_t extra = 0;
  for (;;) {
    long got = read_some(r, tmp, sizeof tmp);
    if (got < 0) return (int)got;
    if (got == 0) break;
    extra += (uint64_t)got;
  }
  if (extra) {
    ts_errmsg_printf(r->errmsg, r->errlen,
                     "%s: trailing data: %llu bytes after the expected %llu bytes of %s", r->path,
                     (unsigned long long)extra, (unsigned long long)expected, what);
    return TS_EDATA;
  }
  return 0;
}

static int truncated(reader_t *r, uint64_t expected, uint64_t found, const char *what,
                     size_t hdr_len) {
  const char *note = short_read_note(r);
  ts_errmsg_printf(r->errmsg, r->errlen,
                   "%s: truncated: expected %llu bytes of %s after the %zu-byte header, "
                   "found %llu%s%s%s",
                   r->path, (unsigned long long)expected, what, hdr_len, (unsigned long long)found,
                   *note ? " (zlib: " : "", note, *note ? ")" : "");
  return TS_EDATA;
}

int ts_idx_read_images(const char *path, size_t *n, size_t *rows, size_t *cols, float **x,
                       char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!path || !n || !rows || !cols || !x) {
    ts_errmsg_printf(errmsg, errlen, "idx: invalid argument");
    return TS_EINVAL;
  }
  reader_t r;
  int rc = open_reader(&r, path, errmsg, errlen);
  if (rc < 0) return rc;
  float *out = NULL;
  unsigned char *buf = NULL;
  uint32_t dims[3];
  uint64_t total = 0;
  TS_CHECK(read_header(&r, TS_IDX_MAGIC_IMAGES, "images", dims, 3, &total));

  out = ts_malloc((size_t)total * sizeof(float));
  buf = ts_malloc(CHUNK);
  if (!out || !buf) {
    ts_errmsg_printf(errmsg, errlen, "%s: out of memory for %llu pixels", path,
                     (unsigned long long)total);
    rc = TS_ENOMEM;
    goto fail;
  }
  float scale[256];
  for (int v = 0; v < 256; v++) scale[v] = (float)v / 255.0f;
  uint64_t done = 0;
  while (done < total) {
    size_t want = total - done > CHUNK ? CHUNK : (size_t)(total - done);
    long got = read_some(&r, buf, want);
    if (got < 0) {
      rc = (int)got;
      goto fail;
    }
    for (long i = 0; i < got; i++) out[done + (uint64_t)i] = scale[buf[i]];
    done += (uint64_t)got;
    if ((size_t)got < want) {
      rc = truncated(&r, total, done, "pixel data", 16);
      goto fail;
    }
  }
  TS_CHECK(check_end(&r, total, "pixel data"));
  gzclose(r.f);
  ts_free(buf);
  *n = dims[0];
  *rows = dims[1];
  *cols = dims[2];
  *x = out;
  return 0;

fail:
  gzclose(r.f);
  ts_free(buf);
  ts_free(out);
  return rc;
}

int ts_idx_read_labels(const char *path, size_t *n, int32_t **labels, int32_t *max_label,
                       char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!path || !n || !labels) {
    ts_errmsg_printf(errmsg, errlen, "idx: invalid argument");
    return TS_EINVAL;
  }
  reader_t r;
  int rc = open_reader(&r, path, errmsg, errlen);
  if (rc < 0) return rc;
  int32_t *out = NULL;
  unsigned char *buf = NULL;
  uint32_t dims[1];
  uint64_t total = 0;
  TS_CHECK(read_header(&r, TS_IDX_MAGIC_LABELS, "labels", dims, 1, &total));
  out = ts_malloc((size_t)total * sizeof(int32_t));
  buf = ts_malloc(total < CHUNK ? (size_t)total : CHUNK);
  if (!out || !buf) {
    ts_errmsg_printf(errmsg, errlen, "%s: out of memory for %llu labels", path,
                     (unsigned long long)total);
    rc = TS_ENOMEM;
    goto fail;
  }
  int32_t max = 0;
  uint64_t done = 0;
  while (done < total) {
    size_t want = total - done > CHUNK ? CHUNK : (size_t)(total - done);
    long got = read_some(&r, buf, want);
    if (got < 0) {
      rc = (int)got;
      goto fail;
    }
    for (long i = 0; i < got; i++) {
      out[done + (uint64_t)i] = buf[i];
      if (buf[i] > max) max = buf[i];
    }
    done += (uint64_t)got;
    if ((size_t)got < want) {
      rc = truncated(&r, total, done, "labels", 8);
      goto fail;
    }
  }
  TS_CHECK(check_end(&r, total, "labels"));
  gzclose(r.f);
  ts_free(buf);
  *n = dims[0];
  *labels = out;
  if (max_label) *max_label = max;
  return 0;

fail:
  gzclose(r.f);
  ts_free(buf);
  ts_free(out);
  return rc;
}

int ts_idx_load_pair(const char *images_path, const char *labels_path, ts_dataset_t *ds,
                     char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!ds) return TS_EINVAL;
  memset(ds, 0, sizeof *ds);
  size_t n_img = 0, n_lab = 0;
  int rc = ts_idx_read_images(images_path, &n_img, &ds->rows, &ds->cols, &ds->x, errmsg, errlen);
  if (rc < 0) return rc;
  rc = ts_idx_read_labels(labels_path, &n_lab, &ds->labels, &ds->max_label, errmsg, errlen);
  if (rc < 0) {
    ts_dataset_free(ds);
    return rc;
  }
  if (n_img != n_lab) {
    ts_errmsg_printf(errmsg, errlen, "%s and %s do not match: %zu images but %zu labels",
                     images_path, labels_path, n_img, n_lab);
    ts_dataset_free(ds);
    return TS_EDATA;
  }
  ds->n = n_img;
  return 0;
}

void ts_dataset_free(ts_dataset_t *ds) {
  if (!ds) return;
  ts_free(ds->x);
  ts_free(ds->labels);
  memset(ds, 0, sizeof *ds);
}
