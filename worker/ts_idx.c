/*
 * IDX reader (ts_idx.h): one function, read_idx, reads both kinds of file, images and
 * labels; a kind (idx_kind_t) says which magic and how many dimensions to expect, what its
 * messages call the data, and how a byte becomes a value (a pixel scaled to [0, 1], or a
 * label). zlib's gzread reads gzip and plain files alike (a file without the gzip magic is
 * passed through), so one path serves both. Bytes are converted in chunks, so the raw bytes
 * never need a second full-size buffer.
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

/* The two kinds of file this reader knows, and how each turns its bytes into values. */
typedef struct {
  uint32_t magic;
  unsigned ndims;
  const char *kind;  /* "images": the wrong-dimensions message */
  const char *what;  /* "pixel data": the truncated and trailing-data messages */
  const char *units; /* "pixels": the out-of-memory message */
  size_t elem_size;  /* bytes of one converted value */
  /* Convert buf[0..n) into values at..at+n of out; *max is the largest byte seen so far. */
  void (*convert)(void *out, uint64_t at, const unsigned char *buf, size_t n, int32_t *max);
} idx_kind_t;

static void convert_pixels(void *out, uint64_t at, const unsigned char *buf, size_t n,
                           int32_t *max) {
  (void)max;
  float *x = (float *)out + at;
  for (size_t i = 0; i < n; i++) x[i] = (float)buf[i] / 255.0f;
}

static void convert_labels(void *out, uint64_t at, const unsigned char *buf, size_t n,
                           int32_t *max) {
  int32_t *labels = (int32_t *)out + at;
  for (size_t i = 0; i < n; i++) {
    labels[i] = buf[i];
    if (buf[i] > *max) *max = buf[i];
  }
}

static const idx_kind_t images_kind = {
    TS_IDX_MAGIC_IMAGES, 3, "images", "pixel data", "pixels", sizeof(float), convert_pixels};
static const idx_kind_t labels_kind = {
    TS_IDX_MAGIC_LABELS, 1, "labels", "labels", "labels", sizeof(int32_t), convert_labels};

/* Read a whole file of this kind: dims[0..kind->ndims) and *out (ts_malloc'd, the caller's on
 * success: dims' product values of kind->elem_size bytes), *max the largest byte. On error
 * nothing is allocated and the outputs are untouched. args_ok: the caller's own outputs are
 * there (else "idx: invalid argument"). */
static int read_idx(const char *path, const idx_kind_t *kind, bool args_ok, uint32_t *dims,
                    void **out, int32_t *max, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!path || !args_ok) {
    ts_errmsg_printf(errmsg, errlen, "idx: invalid argument");
    return TS_EINVAL;
  }
  reader_t r;
  int rc = open_reader(&r, path, errmsg, errlen);
  if (rc < 0) return rc;
  void *values = NULL;
  unsigned char *buf = NULL;
  uint64_t total = 0;
  TS_CHECK(read_header(&r, kind->magic, kind->kind, dims, kind->ndims, &total));
  values = ts_malloc((size_t)total * kind->elem_size);
  buf = ts_malloc(total < CHUNK ? (size_t)total : CHUNK);
  if (!values || !buf) {
    ts_errmsg_printf(errmsg, errlen, "%s: out of memory for %llu %s", path,
                     (unsigned long long)total, kind->units);
    rc = TS_ENOMEM;
    goto fail;
  }
  int32_t largest = 0;
  uint64_t done = 0;
  while (done < total) {
    size_t want = total - done > CHUNK ? CHUNK : (size_t)(total - done);
    long got = read_some(&r, buf, want);
    if (got < 0) {
      rc = (int)got;
      goto fail;
    }
    kind->convert(values, done, buf, (size_t)got, &largest);
    done += (uint64_t)got;
    if ((size_t)got < want) {
      rc = truncated(&r, total, done, kind->what, 4 + 4 * (size_t)kind->ndims);
      goto fail;
    }
  }
  TS_CHECK(check_end(&r, total, kind->what));
  gzclose(r.f);
  ts_free(buf);
  *out = values; /* ownership: the caller's */
  *max = largest;
  return 0;

fail:
  gzclose(r.f);
  ts_free(buf);
  ts_free(values);
  return rc;
}

int ts_idx_read_images(const char *path, size_t *n, size_t *rows, size_t *cols, float **x,
                       char *errmsg, size_t errlen) {
  uint32_t dims[3];
  void *values = NULL;
  int32_t max = 0;
  int rc =
      read_idx(path, &images_kind, n && rows && cols && x, dims, &values, &max, errmsg, errlen);
  if (rc < 0) return rc;
  *n = dims[0];
  *rows = dims[1];
  *cols = dims[2];
  *x = values;
  return 0;
}

int ts_idx_read_labels(const char *path, size_t *n, int32_t **labels, int32_t *max_label,
                       char *errmsg, size_t errlen) {
  uint32_t dims[1];
  void *values = NULL;
  int32_t max = 0;
  int rc = read_idx(path, &labels_kind, n && labels, dims, &values, &max, errmsg, errlen);
  if (rc < 0) return rc;
  *n = dims[0];
  *labels = values;
  if (max_label) *max_label = max;
  return 0;
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
