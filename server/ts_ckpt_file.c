/*
 * The checkpoint file format (ts_ckpt_file.h): names, the atomic write of a snapshot, and
 * the two ways of reading a file back, its header alone or the whole file verified. No
 * store and no scheduling here: ts_ckpt.c turns a store into a snapshot and a file back
 * into a store, ts_ckpt_reshard.c reads sets of files of another layout.
 */
#include "ts_ckpt_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_ckpt_tables.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"

#define MAGIC "TSCKPT01"
#define MAGIC_LEN 8
#define HASH_LEN crypto_generichash_BYTES /* 32 */

/* --- signing ------------------------------------------------------------------------ */

static uint8_t sign_key[HASH_LEN];
static bool signing;

void ts_ckpt_file_key(const char *token, uint8_t key[32]) {
  static const char label[] = "tessera checkpoint signing key 1";
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, 32);
  crypto_generichash_update(&h, (const uint8_t *)label, sizeof label);
  crypto_generichash_update(&h, (const uint8_t *)token, strlen(token));
  crypto_generichash_final(&h, key, 32);
}

void ts_ckpt_file_set_key(const char *token) {
  signing = token != NULL;
  if (token)
    ts_ckpt_file_key(token, sign_key);
  else
    sodium_memzero(sign_key, sizeof sign_key);
}

/* The hash of a file: keyed while signing. */
static void hash_init(crypto_generichash_state *h) {
  crypto_generichash_init(h, signing ? sign_key : NULL, signing ? sizeof sign_key : 0, HASH_LEN);
}

/* --- writing ------------------------------------------------------------------------ */

static int write_all(int fd, const void *buf, size_t n, crypto_generichash_state *h) {
  if (h) crypto_generichash_update(h, buf, n);
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  int rc = fsync(fd) < 0 ? -errno : 0;
  close(fd);
  return rc;
}

/* Create dir and its missing parents; each new directory's parent is fsynced so that the
 * directory, and later the files in it, survive a crash. */
static int mkdir_p(const char *dir) {
  char buf[600];
  snprintf(buf, sizeof buf, "%s", dir);
  size_t len = strlen(buf);
  for (char *p = buf + 1; p <= buf + len; p++) {
    if (*p != '/' && *p != 0) continue;
    char c = *p;
    *p = 0;
    if (mkdir(buf, 0750) == 0) {
      char *slash = strrchr(buf, '/');
      if (slash && slash != buf) {
        *slash = 0;
        fsync_dir(buf);
        *slash = '/';
      }
    } else if (errno != EEXIST) {
      return -errno;
    }
    *p = c;
  }
  return 0;
}

/* "shard-<N>-<20 digits>.ckpt": *shard gets N. */
static bool parse_name(const char *name, uint32_t *shard) {
  size_t len = strlen(name);
  if (strncmp(name, "shard-", 6) != 0 || len < 6 + 2 + 20 + 5 ||
      strcmp(name + len - 5, ".ckpt") != 0 || name[len - 5 - 20 - 1] != '-')
    return false;
  const char *p = name + 6, *dash = name + len - 5 - 20 - 1;
  if (p == dash || dash - p > 10) return false;
  uint64_t n = 0;
  for (; p < dash; p++) {
    if (*p < '0' || *p > '9') return false;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  for (p = dash + 1; p < name + len - 5; p++)
    if (*p < '0' || *p > '9') return false;
  if (n > UINT32_MAX) return false;
  *shard = (uint32_t)n;
  return true;
}

int ts_ckpt_file_list(const char *dir, int shard, char ***names, uint32_t **shards) {
  *names = NULL;
  if (shards) *shards = NULL;
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -errno;
  size_t n = 0, cap = 0;
  char **v = NULL;
  uint32_t *sv = NULL;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    uint32_t idx;
    if (!parse_name(e->d_name, &idx) || (shard >= 0 && idx != (uint32_t)shard)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      char **nv = ts_realloc(v, cap * sizeof *v);
      if (nv) v = nv;
      uint32_t *ns = ts_realloc(sv, cap * sizeof *sv);
      if (ns) sv = ns;
      if (!nv || !ns) {
        rc = TS_ENOMEM;
        break;
      }
    }
    if (!(v[n] = ts_strdup(e->d_name))) {
      rc = TS_ENOMEM;
      break;
    }
    sv[n++] = idx;
  }
  closedir(d);
  if (rc < 0) {
    ts_ckpt_file_free_names(v, (int)n);
    ts_free(sv);
    return rc;
  }
  /* Sort by shard, then by sequence: fixed-width sequence numbers make lexical order age
   * order within a shard. */
  for (size_t i = 1; i < n; i++)
    for (size_t j = i;
         j > 0 && (sv[j - 1] > sv[j] || (sv[j - 1] == sv[j] && strcmp(v[j - 1], v[j]) > 0)); j--) {
      char *t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
      uint32_t ts = sv[j];
      sv[j] = sv[j - 1];
      sv[j - 1] = ts;
    }
  *names = v;
  if (shards)
    *shards = sv;
  else
    ts_free(sv);
  return (int)n;
}

void ts_ckpt_file_free_names(char **names, int n) {
  for (int i = 0; i < n; i++) ts_free(names[i]);
  ts_free(names);
}

size_t ts_ckpt_first_nonfinite(const float *v, size_t n) {
  size_t i = 0;
  while (i < n && isfinite(v[i])) i++;
  return i;
}

bool ts_ckpt_file_same_layout(const Tessera__CheckpointMeta *m, uint32_t num_shards,
                              uint64_t partition_bytes) {
  return m->num_shards == num_shards && m->partition_bytes == partition_bytes;
}

uint64_t ts_ckpt_file_last_sequence(const char *dir, uint32_t shard) {
  char **names;
  int n = ts_ckpt_file_list(dir, (int)shard, &names, NULL);
  uint64_t seq = 0;
  if (n > 0) {
    const char *num = strrchr(names[n - 1], '-') + 1;
    seq = strtoull(num, NULL, 10);
  }
  ts_ckpt_file_free_names(names, n > 0 ? n : 0);
  return seq;
}

int ts_ckpt_file_clean_tmp(const char *dir, uint32_t shard) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  char prefix[32];
  int plen = snprintf(prefix, sizeof prefix, ".shard-%u-", shard);
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, prefix, (size_t)plen) != 0 || len < 9 ||
        strcmp(e->d_name + len - 9, ".ckpt.tmp") != 0)
      continue;
    char full[600];
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    if (unlink(full) == 0) {
      ts_log_warn(
          "removed %s: a checkpoint whose write was interrupted (the shard stopped "
          "before it was complete)",
          full);
      removed++;
    }
  }
  closedir(d);
  return removed;
}

int ts_ckpt_file_probe(const char *dir, uint32_t shard, char *errmsg, size_t errlen) {
  int rc = mkdir_p(dir);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot create checkpoint directory %s: %s", dir,
                     strerror(-rc));
    return rc;
  }
  char tmp[640];
  snprintf(tmp, sizeof tmp, "%s/.shard-%u-write-test.tmp", dir, shard);
  /* A page, as a checkpoint's first write would be: a full disk fails here. */
  static const char page[4096];
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    rc = -errno;
    ts_errmsg_printf(errmsg, errlen, "checkpoint.dir %s takes no file: cannot create %s: %s", dir,
                     tmp, strerror(errno));
    return rc;
  }
  rc = write_all(fd, page, sizeof page, NULL);
  if (rc == 0 && fsync(fd) < 0) rc = -errno;
  close(fd);
  unlink(tmp);
  if (rc < 0)
    ts_errmsg_printf(errmsg, errlen, "checkpoint.dir %s takes no file: writing %s failed: %s", dir,
                     tmp, strerror(-rc));
  return rc;
}

/* After path was written into dir: delete this shard's checkpoints of its own layout
 * beyond the newest keep. Files of another layout stay: they may be a set other shards
 * still have to re-shard from (docs/operations.md). A file whose header cannot be read is
 * garbage of this shard's own and counts as its layout. */
static void prune(const ts_ckpt_snapshot_t *snap, const char *dir, int keep) {
  char **names;
  int n = ts_ckpt_file_list(dir, (int)snap->shard, &names, NULL);
  int kept = 0;
  /* The full checkpoints the kept increments are on stay too (newest first: an increment
   * is seen before its base). Without memory for the list nothing is deleted. */
  uint64_t *bases = ts_calloc((size_t)keep, sizeof *bases);
  for (int i = n - 1; i >= 0 && bases; i--) {
    char old[600], err[256];
    snprintf(old, sizeof old, "%s/%s", dir, names[i]);
    uint64_t seq = strtoull(strrchr(names[i], '-') + 1, NULL, 10), base = 0;
    Tessera__CheckpointMeta *m = NULL;
    if (ts_ckpt_file_read_meta(old, &m, err, sizeof err) == 0) {
      bool mine = ts_ckpt_file_same_layout(m, snap->num_shards, snap->partition_bytes);
      base = m->base_sequence;
      ts_msg_free(&m->base);
      if (!mine) continue;
    }
    if (++kept <= keep) {
      bases[kept - 1] = base;
      continue;
    }
    bool needed = false;
    for (int k = 0; k < keep && !needed; k++) needed = bases[k] == seq;
    if (!needed && unlink(old) == 0) ts_log_debug("removed old checkpoint %s", old);
  }
  ts_free(bases);
  if (n > 0) ts_ckpt_file_free_names(names, n);
}

int ts_ckpt_file_write(const ts_ckpt_snapshot_t *snap, const char *dir, int keep, char *path,
                       size_t pathlen, uint64_t *bytes, char *errmsg, size_t errlen) {
  int rc = mkdir_p(dir);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot create checkpoint directory %s: %s", dir, strerror(-rc));
    return rc;
  }
  char final[600], tmp[640];
  snprintf(final, sizeof final, "%s/shard-%u-%020llu.ckpt", dir, snap->shard,
           (unsigned long long)snap->sequence);
  snprintf(tmp, sizeof tmp, "%s/.shard-%u-%020llu.ckpt.tmp", dir, snap->shard,
           (unsigned long long)snap->sequence);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    rc = -errno;
    ts_errmsg_printf(errmsg, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return rc;
  }
  crypto_generichash_state h;
  hash_init(&h);
  uint8_t len4[4] = {(uint8_t)snap->meta_len, (uint8_t)(snap->meta_len >> 8),
                     (uint8_t)(snap->meta_len >> 16), (uint8_t)(snap->meta_len >> 24)};
  uint8_t hash[HASH_LEN];
  if ((rc = write_all(fd, MAGIC, MAGIC_LEN, &h)) < 0 || (rc = write_all(fd, len4, 4, &h)) < 0 ||
      (rc = write_all(fd, snap->meta, snap->meta_len, &h)) < 0 ||
      (rc = write_all(fd, snap->data, snap->data_count * sizeof(float), &h)) < 0 ||
      (snap->records_len && (rc = write_all(fd, snap->records, snap->records_len, &h)) < 0))
    goto io_fail;
  crypto_generichash_final(&h, hash, sizeof hash);
  if ((rc = write_all(fd, hash, sizeof hash, NULL)) < 0) goto io_fail;
  if (fsync(fd) < 0) {
    rc = -errno;
    goto io_fail;
  }
  close(fd);
  fd = -1;
  if (rename(tmp, final) < 0) {
    rc = -errno;
    ts_errmsg_printf(errmsg, errlen, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    unlink(tmp);
    return rc;
  }
  /* The rename is durable once the directory is: until then no older checkpoint may go. */
  if ((rc = fsync_dir(dir)) < 0) {
    ts_errmsg_printf(errmsg, errlen,
             "fsync of %s failed after renaming %s: %s (older checkpoints are kept)", dir, final,
             strerror(-rc));
    return rc;
  }
  if (path) snprintf(path, pathlen, "%s", final);
  if (bytes)
    *bytes = MAGIC_LEN + 4 + snap->meta_len + snap->data_count * sizeof(float) + snap->records_len +
             HASH_LEN;
  prune(snap, dir, keep);
  return 0;
io_fail:
  ts_errmsg_printf(errmsg, errlen, "writing %s failed: %s", tmp, strerror(-rc));
  if (fd >= 0) close(fd);
  unlink(tmp);
  return rc;
}

/* --- reading ------------------------------------------------------------------------ */

static int bad(char *errmsg, size_t errlen, const char *path, const char *why) {
  ts_errmsg_printf(errmsg, errlen, "%.300s: %.200s", path, why);
  return TS_EDATA;
}

/* The magic and the meta length that open every checkpoint file: false when f does not
 * start with them. */
static bool read_head(FILE *f, uint8_t head[MAGIC_LEN + 4], uint32_t *meta_len) {
  if (fread(head, 1, MAGIC_LEN + 4, f) != MAGIC_LEN + 4 || memcmp(head, MAGIC, MAGIC_LEN) != 0)
    return false;
  *meta_len = (uint32_t)head[8] | ((uint32_t)head[9] << 8) | ((uint32_t)head[10] << 16) |
              ((uint32_t)head[11] << 24);
  return true;
}

int ts_ckpt_file_read_meta(const char *path, Tessera__CheckpointMeta **meta, char *errmsg,
                           size_t errlen) {
  *meta = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    ts_errmsg_printf(errmsg, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  uint8_t head[MAGIC_LEN + 4];
  uint32_t meta_len;
  if (!read_head(f, head, &meta_len)) {
    fclose(f);
    return bad(errmsg, errlen, path, "not a Tessera checkpoint (bad magic or truncated)");
  }
  uint8_t *buf = meta_len <= (64u << 20) ? ts_malloc(meta_len ? meta_len : 1) : NULL;
  if (!buf || fread(buf, 1, meta_len, f) != meta_len) {
    ts_free(buf);
    fclose(f);
    return bad(errmsg, errlen, path, "truncated or corrupt header");
  }
  fclose(f);
  *meta = tessera__checkpoint_meta__unpack(&ts_protobuf_allocator, meta_len, buf);
  ts_free(buf);
  if (!*meta ||
      ((*meta)->format != TS_CKPT_FILE_FORMAT && (*meta)->format != TS_CKPT_TABLES_FORMAT)) {
    if (*meta) ts_msg_free(&(*meta)->base);
    *meta = NULL;
    return bad(errmsg, errlen, path, "the checkpoint header does not parse");
  }
  return 0;
}

int ts_ckpt_file_open(const char *path, FILE **fp, Tessera__CheckpointMeta **meta, char *errmsg,
                      size_t errlen) {
  *fp = NULL;
  *meta = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    ts_errmsg_printf(errmsg, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  struct stat st;
  if (fstat(fileno(f), &st) < 0 || st.st_size < MAGIC_LEN + 4 + HASH_LEN) {
    fclose(f);
    return bad(errmsg, errlen, path, "truncated: shorter than a checkpoint header");
  }
  uint64_t size = (uint64_t)st.st_size;
  uint8_t head[MAGIC_LEN + 4];
  uint32_t meta_len;
  if (!read_head(f, head, &meta_len)) {
    fclose(f);
    return bad(errmsg, errlen, path, "not a Tessera checkpoint (bad magic)");
  }
  if (meta_len > (64u << 20) || MAGIC_LEN + 4 + (uint64_t)meta_len + HASH_LEN > size) {
    fclose(f);
    return bad(errmsg, errlen, path, "truncated or corrupt: the header is larger than the file");
  }
  /* The hash covers everything but its own 32 bytes: check it before trusting anything. */
  crypto_generichash_state h;
  hash_init(&h);
  crypto_generichash_update(&h, head, sizeof head);
  uint8_t *buf = ts_malloc(1 << 20);
  uint8_t *metabuf = ts_malloc(meta_len ? meta_len : 1);
  if (!buf || !metabuf) {
    ts_free(buf);
    ts_free(metabuf);
    fclose(f);
    ts_errmsg_printf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  uint64_t left = size - sizeof head - HASH_LEN, done = 0;
  while (left > 0) {
    size_t want = left > (1 << 20) ? (1 << 20) : (size_t)left;
    if (fread(buf, 1, want, f) != want) break;
    crypto_generichash_update(&h, buf, want);
    if (done < meta_len) {
      size_t take = meta_len - done < want ? (size_t)(meta_len - done) : want;
      memcpy(metabuf + done, buf, take);
    }
    done += want;
    left -= want;
  }
  uint8_t want_hash[HASH_LEN], have_hash[HASH_LEN];
  crypto_generichash_final(&h, want_hash, sizeof want_hash);
  ts_free(buf);
  if (left != 0 || fread(have_hash, 1, HASH_LEN, f) != HASH_LEN) {
    ts_free(metabuf);
    fclose(f);
    return bad(errmsg, errlen, path, "truncated: read error before the end");
  }
  if (sodium_memcmp(want_hash, have_hash, HASH_LEN) != 0) {
    ts_free(metabuf);
    fclose(f);
    return bad(errmsg, errlen, path,
               signing ? "signature mismatch: not signed with this job's admin token "
                         "(checkpoint.sign), or corrupt"
                       : "checksum mismatch: the file is corrupt or truncated (or signed: "
                         "checkpoint.sign)");
  }
  Tessera__CheckpointMeta *m =
      tessera__checkpoint_meta__unpack(&ts_protobuf_allocator, meta_len, metabuf);
  ts_free(metabuf);
  if (!m) {
    fclose(f);
    return bad(errmsg, errlen, path, "the checkpoint header does not parse");
  }
  /* Unless signed, whoever can write the file can make its hash check, so the sizes are
   * summed without wrapping (at most two state buffers, Adam's, and no count beyond the
   * file), else a huge count could make the sum match a short file. */
  uint64_t data = 0, room = (size - MAGIC_LEN - 4 - meta_len - HASH_LEN) / 4;
  bool fits = true;
  for (size_t i = 0; i < m->n_parts && fits; i++) {
    const Tessera__CheckpointPart *cp = m->parts[i];
    fits = cp->state_buffers <= 2 && cp->count <= room;
    if (fits) data += cp->count * (1 + (uint64_t)cp->state_buffers);
    fits = fits && data <= room;
  }
  /* Then the table section (format 2), bounded by what is left of the file. */
  uint64_t table_bytes = 0;
  fits = fits && (m->format == TS_CKPT_FILE_FORMAT || m->format == TS_CKPT_TABLES_FORMAT) &&
         ts_ckpt_tables_section_bytes(m, room * 4 - data * 4, &table_bytes);
  if (!fits || MAGIC_LEN + 4 + (uint64_t)meta_len + data * 4 + table_bytes + HASH_LEN != size) {
    ts_msg_free(&m->base);
    fclose(f);
    return bad(errmsg, errlen, path, "unknown format or the data size does not match the header");
  }
  fseek(f, (long)(MAGIC_LEN + 4 + meta_len), SEEK_SET);
  *fp = f;
  *meta = m;
  return 0;
}
