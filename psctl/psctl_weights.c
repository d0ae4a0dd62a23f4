/* The safetensors and .npz writers of psctl export (psctl_weights.h). */
#include "psctl_weights.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "ts_alloc.h"
#include "ts_err.h"

static const struct {
  const char *st;  /* safetensors' dtype */
  const char *npy; /* numpy's descr */
  size_t size;
} dtypes[] = {
    [PSCTL_DT_F32] = {"F32", "<f4", 4},
    [PSCTL_DT_I64] = {"I64", "<i8", 8},
    [PSCTL_DT_U64] = {"U64", "<u8", 8},
    [PSCTL_DT_U8] = {"U8", "|u1", 1},
};

int psctl_weights_parse_format(const char *name, psctl_weights_format_t *out) {
  if (name && strcmp(name, "safetensors") == 0)
    *out = PSCTL_WEIGHTS_SAFETENSORS;
  else if (name && strcmp(name, "npz") == 0)
    *out = PSCTL_WEIGHTS_NPZ;
  else
    return TS_EINVAL;
  return 0;
}

size_t psctl_dtype_size(psctl_dtype_t dtype) {
  return dtypes[dtype].size;
}

static uint64_t entry_bytes(const psctl_weights_entry_t *e) {
  uint64_t n = dtypes[e->dtype].size;
  for (size_t k = 0; k < e->rank; k++) n *= e->shape[k];
  return n;
}

/* The entries are well formed: names present, distinct, not __metadata__; ranks bounded;
 * no size overflow. */
static int check_entries(const psctl_weights_entry_t *e, size_t n, char *errmsg, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    if (!e[i].name || !*e[i].name || strcmp(e[i].name, "__metadata__") == 0) {
      ts_errmsg_printf(errmsg, errlen, "entry %zu has no name or a reserved one", i);
      return TS_EINVAL;
    }
    if (e[i].rank > PSCTL_WEIGHTS_MAX_RANK || (unsigned)e[i].dtype > PSCTL_DT_U8) {
      ts_errmsg_printf(errmsg, errlen, "%s: rank %zu or dtype %d out of range", e[i].name,
                       e[i].rank, (int)e[i].dtype);
      return TS_EINVAL;
    }
    uint64_t b = dtypes[e[i].dtype].size;
    for (size_t k = 0; k < e[i].rank; k++) {
      if (e[i].shape[k] && b > UINT64_MAX / e[i].shape[k]) {
        ts_errmsg_printf(errmsg, errlen, "%s: its size overflows", e[i].name);
        return TS_EINVAL;
      }
      b *= e[i].shape[k];
    }
    if (b && !e[i].data) {
      ts_errmsg_printf(errmsg, errlen, "%s: no data", e[i].name);
      return TS_EINVAL;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(e[i].name, e[j].name) == 0) {
        ts_errmsg_printf(errmsg, errlen, "two entries are named %s", e[i].name);
        return TS_EINVAL;
      }
  }
  return 0;
}

/* --- safetensors ---------------------------------------------------------------------- */

static int write_safetensors(FILE *f, const psctl_weights_entry_t *e, size_t n, cJSON *meta,
                             char *errmsg, size_t errlen) {
  cJSON *h = cJSON_CreateObject();
  if (!h) return TS_ENOMEM;
  if (meta) cJSON_AddItemToObject(h, "__metadata__", cJSON_Duplicate(meta, true));
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
    cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
    cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
    if (!shape || !offs || !cJSON_AddStringToObject(t, "dtype", dtypes[e[i].dtype].st)) {
      cJSON_Delete(h);
      return TS_ENOMEM;
    }
    for (size_t k = 0; k < e[i].rank; k++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e[i].shape[k]));
    uint64_t b = entry_bytes(&e[i]);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + b)));
    off += b;
  }
  char *text = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  if (!text) return TS_ENOMEM;
  /* The data starts 8-byte aligned: the header is padded with spaces, as the format allows. */
  size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
  uint8_t le[8];
  for (int k = 0; k < 8; k++) le[k] = (uint8_t)((uint64_t)padded >> (8 * k));
  bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
  for (size_t k = len; ok && k < padded; k++) ok = fputc(' ', f) != EOF;
  cJSON_free(text);
  for (size_t i = 0; ok && i < n; i++) {
    size_t b = (size_t)entry_bytes(&e[i]);
    ok = fwrite(e[i].data, 1, b, f) == b;
  }
  if (!ok) {
    ts_errmsg_printf(errmsg, errlen, "%s", strerror(errno));
    return errno ? -errno : TS_EINTERNAL;
  }
  return 0;
}

/* --- npz: a zip of .npy files, stored ------------------------------------------------- */

/* The .npy header of e (version 1.0): magic, length, a Python dict literal padded with
 * spaces to a multiple of 64 bytes and ended by a newline. Returns its length. */
static size_t npy_header(const psctl_weights_entry_t *e, char *out, size_t cap) {
  char shape[PSCTL_WEIGHTS_MAX_RANK * 24 + 8] = "(";
  size_t sl = 1;
  for (size_t k = 0; k < e->rank; k++)
    sl += (size_t)snprintf(shape + sl, sizeof shape - sl, "%s%llu", k ? ", " : "",
                           (unsigned long long)e->shape[k]);
  snprintf(shape + sl, sizeof shape - sl, "%s)", e->rank == 1 ? "," : "");
  char dict[sizeof shape + 96];
  int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    dtypes[e->dtype].npy, shape);
  size_t total = (10 + (size_t)dl + 1 + 63) & ~(size_t)63;
  if (total > cap) return 0;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  size_t hl = total - 10;
  out[8] = (char)(hl & 0xff);
  out[9] = (char)(hl >> 8);
  memcpy(out + 10, dict, (size_t)dl);
  memset(out + 10 + dl, ' ', total - 10 - (size_t)dl - 1);
  out[total - 1] = '\n';
  return total;
}

static void le16(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void le32(uint8_t *p, uint32_t v) {
  le16(p, v & 0xffff);
  le16(p + 2, v >> 16);
}

/* Zip's fixed time stamp, 1980-01-01 00:00: an export of the same parameters is the same
 * bytes. */
#define DOS_TIME 0
#define DOS_DATE 0x21

typedef struct {
  char name[512];
  uint32_t crc, size, offset;
} zip_member_t;

/* The 20 bytes the local header and the central directory share: method (stored), time,
 * date, CRC-32, compressed and uncompressed size, name length. */
static void zip_common(uint8_t *p, const zip_member_t *m, size_t name_len) {
  le16(p, 0);
  le16(p + 2, DOS_TIME);
  le16(p + 4, DOS_DATE);
  le32(p + 6, m->crc);
  le32(p + 10, m->size);
  le32(p + 14, m->size);
  le16(p + 18, (uint32_t)name_len);
}

static int write_npz(FILE *f, const psctl_weights_entry_t *e, size_t n, const char *metadata,
                     char *errmsg, size_t errlen) {
  size_t total = n + (metadata ? 1 : 0);
  if (total > 0xffff) {
    ts_errmsg_printf(errmsg, errlen, "%zu arrays: a zip without zip64 holds at most 65535", total);
    return TS_ETOOBIG;
  }
  zip_member_t *m = ts_calloc(total ? total : 1, sizeof *m);
  if (!m) return TS_ENOMEM;
  int rc = 0;
  uint64_t off = 0;
  for (size_t i = 0; i < total && rc == 0; i++) {
    psctl_weights_entry_t meta_e;
    const psctl_weights_entry_t *x = &e[i];
    if (i == n) { /* the metadata: its UTF-8 text as a uint8 array */
      meta_e = (psctl_weights_entry_t){.name = "__metadata__",
                                       .dtype = PSCTL_DT_U8,
                                       .shape = {strlen(metadata)},
                                       .rank = 1,
                                       .data = metadata};
      x = &meta_e;
    }
    char hdr[PSCTL_WEIGHTS_MAX_RANK * 24 + 192];
    size_t hl = npy_header(x, hdr, sizeof hdr);
    uint64_t b = entry_bytes(x), size = hl + b;
    int nl = snprintf(m[i].name, sizeof m[i].name, "%s.npy", x->name);
    if (!hl || nl < 0 || (size_t)nl >= sizeof m[i].name) {
      ts_errmsg_printf(errmsg, errlen, "%s: name too long for the .npz writer", x->name);
      rc = TS_EINVAL;
      break;
    }
    if (size > 0xffffffffu || off + 30 + (uint64_t)nl + size > 0xffffffffu) {
      ts_errmsg_printf(errmsg, errlen,
                       "%s: the .npz would pass 4 GiB, which needs zip64 (not written): use "
                       "--format safetensors",
                       x->name);
      rc = TS_ETOOBIG;
      break;
    }
    uLong crc = crc32(0L, (const Bytef *)hdr, (uInt)hl);
    for (uint64_t done = 0; done < b;) { /* crc32's length is a uInt: in pieces */
      uInt piece = b - done > (1u << 30) ? (1u << 30) : (uInt)(b - done);
      crc = crc32(crc, (const Bytef *)x->data + done, piece);
      done += piece;
    }
    m[i].crc = (uint32_t)crc;
    m[i].size = (uint32_t)size;
    m[i].offset = (uint32_t)off;
    uint8_t lh[30];
    le32(lh, 0x04034b50);
    le16(lh + 4, 20); /* version needed: 2.0 */
    le16(lh + 6, 0);  /* flags */
    zip_common(lh + 8, &m[i], (size_t)nl);
    le16(lh + 28, 0); /* extra */
    if (fwrite(lh, 1, 30, f) != 30 || fwrite(m[i].name, 1, (size_t)nl, f) != (size_t)nl ||
        fwrite(hdr, 1, hl, f) != hl || (b && fwrite(x->data, 1, (size_t)b, f) != (size_t)b))
      rc = -EIO;
    off += 30 + (uint64_t)nl + size;
  }
  uint64_t cd_start = off;
  for (size_t i = 0; i < total && rc == 0; i++) {
    size_t nl = strlen(m[i].name);
    uint8_t ch[46];
    le32(ch, 0x02014b50);
    le16(ch + 4, 20);
    le16(ch + 6, 20);
    le16(ch + 8, 0); /* flags */
    zip_common(ch + 10, &m[i], nl);
    le16(ch + 30, 0); /* extra */
    le16(ch + 32, 0); /* comment */
    le16(ch + 34, 0); /* disk */
    le16(ch + 36, 0); /* internal attributes */
    le32(ch + 38, 0); /* external attributes */
    le32(ch + 42, m[i].offset);
    if (fwrite(ch, 1, 46, f) != 46 || fwrite(m[i].name, 1, nl, f) != nl) rc = -EIO;
    off += 46 + nl;
  }
  if (rc == 0 && off > 0xffffffffu) {
    ts_errmsg_printf(errmsg, errlen,
                     "the .npz would pass 4 GiB (zip64 is not written): use "
                     "--format safetensors");
    rc = TS_ETOOBIG;
  }
  if (rc == 0) {
    uint8_t eocd[22];
    le32(eocd, 0x06054b50);
    le16(eocd + 4, 0);
    le16(eocd + 6, 0);
    le16(eocd + 8, (uint32_t)total);
    le16(eocd + 10, (uint32_t)total);
    le32(eocd + 12, (uint32_t)(off - cd_start));
    le32(eocd + 16, (uint32_t)cd_start);
    le16(eocd + 20, 0);
    if (fwrite(eocd, 1, 22, f) != 22) rc = -EIO;
  }
  if (rc == -EIO) ts_errmsg_printf(errmsg, errlen, "%s", strerror(errno ? errno : EIO));
  ts_free(m);
  return rc;
}

/* --- the file --------------------------------------------------------------------------- */

int psctl_weights_write(const char *path, psctl_weights_format_t fmt,
                        const psctl_weights_entry_t *entries, size_t n, const char *metadata,
                        char *errmsg, size_t errlen) {
  char why[256] = "";
  int rc = check_entries(entries, n, why, sizeof why);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "%s: %s", path, why);
    return rc;
  }
  cJSON *meta = NULL;
  if (metadata) {
    meta = cJSON_Parse(metadata);
    bool ok = cJSON_IsObject(meta);
    for (cJSON *it = ok ? meta->child : NULL; it; it = it->next) ok &= cJSON_IsString(it);
    if (!ok) {
      cJSON_Delete(meta);
      ts_errmsg_printf(errmsg, errlen, "%s: the metadata is not a JSON object of strings", path);
      return TS_EINVAL;
    }
  }
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
    cJSON_Delete(meta);
    ts_errmsg_printf(errmsg, errlen, "%s: path too long", path);
    return TS_EINVAL;
  }
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    rc = -errno;
    cJSON_Delete(meta);
    ts_errmsg_printf(errmsg, errlen, "cannot write %s: %s", path, strerror(-rc));
    return rc;
  }
  errno = 0;
  rc = fmt == PSCTL_WEIGHTS_SAFETENSORS ? write_safetensors(f, entries, n, meta, why, sizeof why)
                                        : write_npz(f, entries, n, metadata, why, sizeof why);
  cJSON_Delete(meta);
  if (rc == 0 && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
    rc = -errno;
    snprintf(why, sizeof why, "%s", strerror(errno));
  }
  if (fclose(f) != 0 && rc == 0) {
    rc = -errno;
    snprintf(why, sizeof why, "%s", strerror(errno));
  }
  if (rc == 0 && rename(tmp, path) != 0) {
    rc = -errno;
    snprintf(why, sizeof why, "%s", strerror(errno));
  }
  if (rc < 0) {
    unlink(tmp);
    ts_errmsg_printf(errmsg, errlen, "cannot write %s: %s", path, *why ? why : ts_strerror(rc));
  }
  return rc;
}
