#include "ts_checkpoint.h"

#include "ts_checkpoint_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"

#define MAGIC "TSCKPT01"
#define MAGIC_LEN 8
#define HASH_LEN crypto_generichash_BYTES /* 32 */
#define FORMAT 1

struct ts_ckpt_snapshot {
  uint32_t shard, num_shards;
  uint64_t partition_bytes;
  uint64_t step, sequence;
  uint8_t *meta;       /* packed CheckpointMeta */
  size_t meta_len;
  float *data;         /* every part's values and state, in file order */
  size_t data_count;
};

/* --- writing ------------------------------------------------------------------------ */

static const char *optimizer_name(ts_optimizer_t o) {
  return o == TS_OPT_ADAM ? "adam" : o == TS_OPT_MOMENTUM ? "momentum" : "sgd";
}

static const char *first_nonfinite(const float *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(v[i])) return "a NaN or Inf value";
  return NULL;
}

int ts_checkpoint_snapshot(const ts_store_t *s, uint64_t sequence, ts_ckpt_snapshot_t **out,
                           char *errmsg, size_t errlen) {
  *out = NULL;
  if (!s->declared) {
    snprintf(errmsg, errlen, "no model is declared on this shard: nothing to checkpoint");
    return TS_ENOTDECLARED;
  }
  if (s->awaiting) {
    snprintf(errmsg, errlen,
             "%zu partition(s) still wait for the model's initial values: nothing to checkpoint",
             s->awaiting);
    return TS_ENOTREADY;
  }
  int nstate = ts_optim_state_buffers(&s->optim);
  size_t total = 0;
  for (size_t i = 0; i < s->num_parts; i++) total += s->parts[i].plan->count * (size_t)(1 + nstate);
  for (size_t i = 0; i < s->num_parts; i++) {
    const ts_spart_t *p = &s->parts[i];
    const float *bufs[3] = {p->w, p->s0, p->s1};
    for (int b = 0; b <= nstate; b++) {
      if (first_nonfinite(bufs[b], p->plan->count)) {
        snprintf(errmsg, errlen,
                 "tensor '%s' part %u holds NaN or Inf %s: not checkpointed (the previous "
                 "checkpoint is kept)",
                 s->tensors[p->plan->tensor].name, p->plan->part,
                 b == 0 ? "parameters" : "optimizer state");
        return TS_ENONFINITE;
      }
    }
  }

  int rc = TS_ENOMEM;
  ts_ckpt_snapshot_t *snap = ts_calloc(1, sizeof *snap);
  Tessera__TensorDecl *td = ts_calloc(s->num_tensors, sizeof *td);
  Tessera__TensorDecl **tp = ts_calloc(s->num_tensors, sizeof *tp);
  uint64_t *shapes = ts_calloc((size_t)s->num_tensors * 8, sizeof *shapes);
  Tessera__CheckpointPart *cp = ts_calloc(s->num_parts ? s->num_parts : 1, sizeof *cp);
  Tessera__CheckpointPart **cpp = ts_calloc(s->num_parts ? s->num_parts : 1, sizeof *cpp);
  if (!snap || !td || !tp || !shapes || !cp || !cpp) goto fail;
  snap->data = ts_aligned_alloc(total * sizeof(float));
  if (!snap->data) goto fail;
  snap->data_count = total;
  Tessera__CheckpointMeta m = TESSERA__CHECKPOINT_META__INIT;
  m.format = FORMAT;
  m.shard = s->shard;
  m.num_shards = s->num_shards;
  m.mode = ts_store_wire_mode(s->mode);
  m.seed = s->seed;
  m.partition_bytes = s->partition_bytes;
  m.step = ts_store_min_version(s);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  m.wall_time = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
  m.optimizer = (char *)optimizer_name(s->optim.kind);
  m.sequence = sequence;
  for (uint32_t t = 0; t < s->num_tensors; t++) {
    tessera__tensor_decl__init(&td[t]);
    td[t].name = s->tensors[t].name;
    td[t].n_shape = s->tensors[t].rank;
    td[t].shape = shapes + (size_t)t * 8;
    memcpy(td[t].shape, s->tensors[t].shape, s->tensors[t].rank * sizeof(uint64_t));
    td[t].init = (Tessera__Init)s->tensors[t].init;
    td[t].kind = s->tensors[t].state ? TESSERA__TENSOR_KIND__TENSOR_STATE
                                     : TESSERA__TENSOR_KIND__TENSOR_TRAINABLE;
    tp[t] = &td[t];
  }
  m.n_tensors = s->num_tensors;
  m.tensors = tp;
  float *d = snap->data;
  for (size_t i = 0; i < s->num_parts; i++) {
    const ts_spart_t *p = &s->parts[i];
    tessera__checkpoint_part__init(&cp[i]);
    cp[i].tensor = p->plan->tensor;
    cp[i].part = p->plan->part;
    cp[i].offset = p->plan->offset;
    cp[i].count = p->plan->count;
    /* A completed barrier waiting for its writers counts as applied. */
    cp[i].version = p->version;
    cp[i].updates = p->updates;
    cp[i].state_buffers = (uint32_t)nstate;
    cpp[i] = &cp[i];
    const float *bufs[3] = {p->w, p->s0, p->s1};
    for (int b = 0; b <= nstate; b++) {
      memcpy(d, bufs[b], p->plan->count * sizeof(float));
      d += p->plan->count;
    }
  }
  m.n_parts = s->num_parts;
  m.parts = cpp;
  snap->meta_len = protobuf_c_message_get_packed_size(&m.base);
  snap->meta = ts_malloc(snap->meta_len ? snap->meta_len : 1);
  if (!snap->meta) goto fail;
  protobuf_c_message_pack(&m.base, snap->meta);
  snap->shard = s->shard;
  snap->num_shards = s->num_shards;
  snap->partition_bytes = s->partition_bytes;
  snap->step = m.step;
  snap->sequence = sequence;
  rc = 0;
  *out = snap;
  snap = NULL;
fail:
  if (rc == TS_ENOMEM) snprintf(errmsg, errlen, "out of memory for a checkpoint snapshot");
  ts_checkpoint_snapshot_free(snap);
  ts_free(td);
  ts_free(tp);
  ts_free(shapes);
  ts_free(cp);
  ts_free(cpp);
  return rc;
}

uint64_t ts_checkpoint_snapshot_step(const ts_ckpt_snapshot_t *snap) { return snap->step; }

void ts_checkpoint_snapshot_free(ts_ckpt_snapshot_t *snap) {
  if (!snap) return;
  ts_free(snap->meta);
  ts_free(snap->data);
  ts_free(snap);
}

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

int ts_ckpt_list(const char *dir, int shard, char ***names, uint32_t **shards) {
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
    ts_ckpt_free_names(v, (int)n);
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

void ts_ckpt_free_names(char **names, int n) {
  for (int i = 0; i < n; i++) ts_free(names[i]);
  ts_free(names);
}

bool ts_ckpt_same_layout(const ts_store_t *s, const Tessera__CheckpointMeta *m) {
  return m->num_shards == s->num_shards && m->partition_bytes == s->partition_bytes;
}

uint64_t ts_checkpoint_last_sequence(const char *dir, uint32_t shard) {
  char **names;
  int n = ts_ckpt_list(dir, (int)shard, &names, NULL);
  uint64_t seq = 0;
  if (n > 0) {
    const char *num = strrchr(names[n - 1], '-') + 1;
    seq = strtoull(num, NULL, 10);
  }
  ts_ckpt_free_names(names, n > 0 ? n : 0);
  return seq;
}

int ts_checkpoint_clean_tmp(const char *dir, uint32_t shard) {
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

/* After path was written into dir: delete this shard's checkpoints of its own layout
 * beyond the newest keep. Files of another layout stay: they may be a set other shards
 * still have to re-shard from (docs/operations.md). A file whose header cannot be read is
 * garbage of this shard's own and counts as its layout. */
static void prune(const ts_ckpt_snapshot_t *snap, const char *dir, int keep) {
  char **names;
  int n = ts_ckpt_list(dir, (int)snap->shard, &names, NULL);
  int kept = 0;
  for (int i = n - 1; i >= 0; i--) {
    char old[600], err[256];
    snprintf(old, sizeof old, "%s/%s", dir, names[i]);
    Tessera__CheckpointMeta *m = NULL;
    if (ts_ckpt_read_meta(old, &m, err, sizeof err) == 0) {
      bool mine = m->num_shards == snap->num_shards && m->partition_bytes == snap->partition_bytes;
      ts_msg_free(&m->base);
      if (!mine) continue;
    }
    if (++kept <= keep) continue;
    if (unlink(old) == 0) ts_log_debug("removed old checkpoint %s", old);
  }
  if (n > 0) ts_ckpt_free_names(names, n);
}

int ts_checkpoint_write(const ts_ckpt_snapshot_t *snap, const char *dir, int keep, char *path,
                        size_t pathlen, uint64_t *bytes, char *errmsg, size_t errlen) {
  int rc = mkdir_p(dir);
  if (rc < 0) {
    snprintf(errmsg, errlen, "cannot create checkpoint directory %s: %s", dir, strerror(-rc));
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
    snprintf(errmsg, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return rc;
  }
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, HASH_LEN);
  uint8_t len4[4] = {(uint8_t)snap->meta_len, (uint8_t)(snap->meta_len >> 8),
                     (uint8_t)(snap->meta_len >> 16), (uint8_t)(snap->meta_len >> 24)};
  uint8_t hash[HASH_LEN];
  if ((rc = write_all(fd, MAGIC, MAGIC_LEN, &h)) < 0 || (rc = write_all(fd, len4, 4, &h)) < 0 ||
      (rc = write_all(fd, snap->meta, snap->meta_len, &h)) < 0 ||
      (rc = write_all(fd, snap->data, snap->data_count * sizeof(float), &h)) < 0)
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
    snprintf(errmsg, errlen, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    unlink(tmp);
    return rc;
  }
  /* The rename is durable once the directory is: until then no older checkpoint may go. */
  if ((rc = fsync_dir(dir)) < 0) {
    snprintf(errmsg, errlen,
             "fsync of %s failed after renaming %s: %s (older checkpoints are kept)", dir, final,
             strerror(-rc));
    return rc;
  }
  if (path) snprintf(path, pathlen, "%s", final);
  if (bytes) *bytes = MAGIC_LEN + 4 + snap->meta_len + snap->data_count * sizeof(float) + HASH_LEN;
  prune(snap, dir, keep);
  return 0;
io_fail:
  snprintf(errmsg, errlen, "writing %s failed: %s", tmp, strerror(-rc));
  if (fd >= 0) close(fd);
  unlink(tmp);
  return rc;
}

/* --- reading ------------------------------------------------------------------------ */

static int bad(char *errmsg, size_t errlen, const char *path, const char *why) {
  snprintf(errmsg, errlen, "%.300s: %.200s", path, why);
  return TS_EDATA;
}

int ts_ckpt_read_meta(const char *path, Tessera__CheckpointMeta **meta, char *errmsg,
                      size_t errlen) {
  *meta = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(errmsg, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  uint8_t head[MAGIC_LEN + 4];
  if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, MAGIC, MAGIC_LEN) != 0) {
    fclose(f);
    return bad(errmsg, errlen, path, "not a Tessera checkpoint (bad magic or truncated)");
  }
  uint32_t meta_len = (uint32_t)head[8] | ((uint32_t)head[9] << 8) | ((uint32_t)head[10] << 16) |
                      ((uint32_t)head[11] << 24);
  uint8_t *buf = meta_len <= (64u << 20) ? ts_malloc(meta_len ? meta_len : 1) : NULL;
  if (!buf || fread(buf, 1, meta_len, f) != meta_len) {
    ts_free(buf);
    fclose(f);
    return bad(errmsg, errlen, path, "truncated or corrupt header");
  }
  fclose(f);
  *meta = tessera__checkpoint_meta__unpack(&ts_protobuf_allocator, meta_len, buf);
  ts_free(buf);
  if (!*meta || (*meta)->format != FORMAT) {
    if (*meta) ts_msg_free(&(*meta)->base);
    *meta = NULL;
    return bad(errmsg, errlen, path, "the checkpoint header does not parse");
  }
  return 0;
}

int ts_ckpt_open_checked(const char *path, FILE **fp, Tessera__CheckpointMeta **meta, char *errmsg,
                         size_t errlen) {
  *fp = NULL;
  *meta = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(errmsg, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  struct stat st;
  if (fstat(fileno(f), &st) < 0 || st.st_size < MAGIC_LEN + 4 + HASH_LEN) {
    fclose(f);
    return bad(errmsg, errlen, path, "truncated: shorter than a checkpoint header");
  }
  uint64_t size = (uint64_t)st.st_size;
  uint8_t head[MAGIC_LEN + 4];
  if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, MAGIC, MAGIC_LEN) != 0) {
    fclose(f);
    return bad(errmsg, errlen, path, "not a Tessera checkpoint (bad magic)");
  }
  uint32_t meta_len = (uint32_t)head[8] | ((uint32_t)head[9] << 8) | ((uint32_t)head[10] << 16) |
                      ((uint32_t)head[11] << 24);
  if (meta_len > (64u << 20) || MAGIC_LEN + 4 + (uint64_t)meta_len + HASH_LEN > size) {
    fclose(f);
    return bad(errmsg, errlen, path, "truncated or corrupt: the header is larger than the file");
  }
  /* The hash covers everything but its own 32 bytes: check it before trusting anything. */
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, HASH_LEN);
  crypto_generichash_update(&h, head, sizeof head);
  uint8_t *buf = ts_malloc(1 << 20);
  uint8_t *metabuf = ts_malloc(meta_len ? meta_len : 1);
  if (!buf || !metabuf) {
    ts_free(buf);
    ts_free(metabuf);
    fclose(f);
    snprintf(errmsg, errlen, "out of memory");
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
    return bad(errmsg, errlen, path, "checksum mismatch: the file is corrupt or truncated");
  }
  Tessera__CheckpointMeta *m = tessera__checkpoint_meta__unpack(&ts_protobuf_allocator, meta_len, metabuf);
  ts_free(metabuf);
  if (!m) {
    fclose(f);
    return bad(errmsg, errlen, path, "the checkpoint header does not parse");
  }
  /* The hash is not keyed: whoever can write the file can make it check, so the sizes are
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
  if (m->format != FORMAT || !fits ||
      MAGIC_LEN + 4 + (uint64_t)meta_len + data * 4 + HASH_LEN != size) {
    ts_msg_free(&m->base);
    fclose(f);
    return bad(errmsg, errlen, path, "unknown format or the data size does not match the header");
  }
  fseek(f, (long)(MAGIC_LEN + 4 + meta_len), SEEK_SET);
  *fp = f;
  *meta = m;
  return 0;
}

/* Load one verified file into the undeclared store s. */
static int load(ts_store_t *s, const char *path, FILE *f, const Tessera__CheckpointMeta *m,
                char *errmsg, size_t errlen) {
  char why[256];
  if (m->shard != s->shard || !ts_ckpt_same_layout(s, m)) {
    snprintf(why, sizeof why,
             "written by shard %u of %u with partition_bytes %llu; this is shard %u of %u with "
             "%llu",
             m->shard, m->num_shards, (unsigned long long)m->partition_bytes, s->shard,
             s->num_shards, (unsigned long long)s->partition_bytes);
    return bad(errmsg, errlen, path, why);
  }
  Tessera__Declare d = TESSERA__DECLARE__INIT;
  d.n_tensors = m->n_tensors;
  d.tensors = m->tensors;
  d.seed = m->seed;
  bool created = false;
  int rc = ts_store_declare(s, &d, &created, why, sizeof why);
  if (rc < 0) return bad(errmsg, errlen, path, why);
  int nstate = ts_optim_state_buffers(&s->optim);
  if (m->n_parts != s->num_parts) {
    snprintf(why, sizeof why, "holds %zu partitions, the plan gives this shard %zu", m->n_parts,
             s->num_parts);
    ts_store_free(s);
    return bad(errmsg, errlen, path, why);
  }
  /* Sized by this shard's plan: each part is checked against it before it is read. */
  size_t max = 0;
  for (size_t i = 0; i < s->num_parts; i++)
    if (s->parts[i].plan->count > max) max = s->parts[i].plan->count;
  float *skip = ts_malloc(max * sizeof(float) + 1);
  /* Each of this shard's partitions once: as many listed as the plan gives, so a repeat
   * would leave another partition at its initial values, silently. */
  uint8_t *seen = ts_calloc(s->num_parts ? s->num_parts : 1, 1);
  if (!skip || !seen) {
    ts_free(skip);
    ts_free(seen);
    ts_store_free(s);
    return TS_ENOMEM;
  }
  bool state_dropped = false;
  why[0] = '\0';
  for (size_t i = 0; i < m->n_parts && !why[0]; i++) {
    const Tessera__CheckpointPart *cp = m->parts[i];
    ts_spart_t *p = ts_store_find(s, cp->tensor, cp->part);
    if (!p || p->plan->offset != cp->offset || p->plan->count != cp->count) {
      snprintf(why, sizeof why, "partition %u of tensor %u does not match this shard's plan",
               cp->part, cp->tensor);
      break;
    }
    if (seen[p - s->parts]++) {
      snprintf(why, sizeof why,
               "tensor '%s' partition %u is listed twice (so another partition is missing)",
               s->tensors[cp->tensor].name, cp->part);
      break;
    }
    float *bufs[3] = {p->w, p->s0, p->s1};
    /* Optimizer state of another optimizer is read past: the new one starts fresh. */
    bool keep_state = cp->state_buffers == (uint32_t)nstate;
    if (!keep_state) state_dropped = true;
    for (uint32_t b = 0; b <= cp->state_buffers && !why[0]; b++) {
      float *dst = b == 0 ? p->w : keep_state ? bufs[b] : skip;
      if (fread(dst, sizeof(float), cp->count, f) != cp->count)
        snprintf(why, sizeof why, "truncated while reading partition data");
    }
    p->version = cp->version;
    p->updates = keep_state ? cp->updates : 0;
  }
  ts_free(skip);
  ts_free(seen);
  if (why[0]) {
    ts_store_free(s);
    return bad(errmsg, errlen, path, why);
  }
  if (state_dropped)
    ts_log_warn("%s was written with optimizer %s: its optimizer state is not used", path,
                m->optimizer);
  return 0;
}

/* The newest valid checkpoint of this shard in its own layout: 1 restored (*wall gets the
 * time it was written), 0 none. Files of another layout are passed over: they are
 * re-sharding's. */
static int restore_own(ts_store_t *s, const char *dir, char *path, size_t pathlen,
                       uint64_t *sequence, double *wall, char *errmsg, size_t errlen) {
  char **names;
  int n = ts_ckpt_list(dir, (int)s->shard, &names, NULL);
  if (n < 0) {
    snprintf(errmsg, errlen, "cannot read checkpoint directory %s: %s", dir, strerror(-n));
    return n;
  }
  int restored = 0;
  for (int i = n - 1; i >= 0 && !restored; i--) {
    char full[600], err[1024];
    snprintf(full, sizeof full, "%s/%s", dir, names[i]);
    FILE *f;
    Tessera__CheckpointMeta *m;
    /* A header that does not read is tried (and rejected, with the reason) below. */
    if (ts_ckpt_read_meta(full, &m, err, sizeof err) == 0) {
      bool mine = ts_ckpt_same_layout(s, m);
      ts_msg_free(&m->base);
      if (!mine) continue;
    }
    int rc = ts_ckpt_open_checked(full, &f, &m, err, sizeof err);
    if (rc == 0) {
      ts_require(m != NULL); /* set on success */
      rc = load(s, full, f, m, err, sizeof err);
      if (rc == 0) {
        restored = 1;
        if (path) snprintf(path, pathlen, "%s", full);
        if (sequence) *sequence = m->sequence;
        *wall = m->wall_time;
      }
      ts_msg_free(&m->base);
      fclose(f);
    }
    if (rc < 0) ts_log_err("checkpoint rejected, trying an older one: %s", err);
  }
  ts_ckpt_free_names(names, n);
  return restored;
}

int ts_checkpoint_restore(ts_store_t *s, const char *dir, char *const *from, size_t nfrom,
                          char *path, size_t pathlen, uint64_t *sequence, char *errmsg,
                          size_t errlen) {
  double own = -1;
  int rc = restore_own(s, dir, path, pathlen, sequence, &own, errmsg, errlen);
  if (rc < 0) return rc;
  /* The other layouts' files, in dir and in checkpoint.restore_from. */
  char **dirs = ts_calloc(nfrom + 1, sizeof *dirs);
  if (!dirs) {
    if (rc == 0) snprintf(errmsg, errlen, "out of memory");
    return rc == 1 ? 1 : TS_ENOMEM;
  }
  dirs[0] = (char *)dir;
  for (size_t i = 0; i < nfrom; i++) dirs[i + 1] = from[i];
  double set = 0;
  if (rc == 1 && ts_ckpt_newest_set(s, dirs, nfrom + 1, &set) == 1 && set > own) {
    /* The shard count changed back: the newest state is the other layout's set. */
    ts_log_notice("a checkpoint set of another layout is newer than %s: re-sharding from it", path);
    ts_store_free(s);
    char desc[600];
    int r = ts_ckpt_reshard(s, dirs, nfrom + 1, own, desc, sizeof desc, errmsg, errlen);
    if (r == 1) {
      snprintf(path, pathlen, "%s", desc);
      rc = 2;
    } else {
      ts_log_err("re-sharding failed, restoring this shard's own checkpoint again");
      rc = restore_own(s, dir, path, pathlen, sequence, &own, errmsg, errlen);
    }
  } else if (rc == 0) {
    rc = ts_ckpt_reshard(s, dirs, nfrom + 1, -1, path, pathlen, errmsg, errlen);
    if (rc == 1) rc = 2;
  }
  ts_free(dirs);
  if (rc == 2 && sequence) *sequence = 0;
  return rc;
}
