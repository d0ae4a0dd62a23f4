/*
 * Re-sharding at restore (ts_ckpt_reshard.h): a shard that has no checkpoint of its own
 * layout takes its partitions out of a complete set of another layout's files.
 *
 * Why a set, and which: a file holds one old shard's partitions, so the new plan's
 * partitions come from every old shard's file. Files of one set must describe one state of
 * the model; the files carry the step (the lowest partition version) they were taken at,
 * and the set is the newest step at which every old shard has a file (`psctl checkpoint`
 * and `psctl shutdown` write one on every shard at once; periodic checkpoints of different
 * shards are usually at different steps). Where a shard has several files at that step
 * (nothing changed between two checkpoints), its newest is used.
 *
 * Checks before anything is trusted: every file of the set is verified whole (BLAKE2b), all
 * agree on the model (tensors, shapes, initializers, seed), and each holds exactly the
 * partitions the old plan (proto/ts_plan.h, recomputed from the old shard count and
 * partition size) gives its shard, once, so the set covers every element once. A new
 * partition made of pieces of several old ones (another job.partition_bytes) must find them
 * at one version and update count, else the set is refused: merging them would invent a
 * state no shard ever had.
 *
 * A set written by another job (ts_ckpt.h's job id, in every file) is refused as a file of
 * this layout is, unless adopt (ps-server --adopt): after loading, since the id is of the
 * model the set declares under this shard's settings.
 *
 * Embedding tables: every file's rows are read (ts_ckpt_tables_read) and a row kept where
 * ts_key_shard(key, new count) is this shard; each must be a key of the old shard whose
 * file holds it, and no key may come twice.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_ckpt_file.h"
#include "ts_ckpt_reshard.h"
#include "ts_ckpt_tables.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"

typedef struct {
  char *path;                    /* owned */
  Tessera__CheckpointMeta *meta; /* its header, not yet verified; owned */
} cand_t;

typedef struct {
  uint32_t num_shards;
  uint64_t partition_bytes, step, seed;
  cand_t **files; /* num_shards entries, NULL where that shard has none; point into cands */
  uint32_t have;  /* entries that are not NULL */
  double newest;  /* latest wall_time of its files */
} group_t;

typedef struct {
  cand_t *cands;
  size_t ncands;
  group_t *groups;
  size_t ngroups;
} found_t;

static void found_free(found_t *f) {
  for (size_t i = 0; i < f->ncands; i++) {
    ts_free(f->cands[i].path);
    ts_msg_free(&f->cands[i].meta->base);
  }
  for (size_t i = 0; i < f->ngroups; i++) ts_free(f->groups[i].files);
  ts_free(f->cands);
  ts_free(f->groups);
}

/* Every checkpoint file of another layout in dirs, by header. */
static int collect(const ts_store_t *s, char *const *dirs, size_t ndirs, found_t *f) {
  size_t cap = 0;
  int skipped = 0; /* the first 20 logged: a directory of junk makes a few lines */
  for (size_t d = 0; d < ndirs; d++) {
    char **names;
    uint32_t *shards;
    int n = ts_ckpt_file_list(dirs[d], -1, &names, &shards);
    if (n < 0) {
      ts_log_warn("re-sharding: cannot read checkpoint directory %s: %s", dirs[d], strerror(-n));
      continue;
    }
    for (int i = 0; i < n; i++) {
      char path[600], err[512];
      snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]);
      Tessera__CheckpointMeta *m;
      if (ts_ckpt_file_read_meta(path, &m, err, sizeof err) < 0) {
        if (skipped++ < 20) ts_log_warn("re-sharding: skipping %s", err);
        continue;
      }
      bool sane = m->shard == shards[i] && m->num_shards > 0 && m->shard < m->num_shards &&
                  m->num_shards <= 256 && (m->n_tensors > 0 || m->n_tables > 0);
      for (size_t t = 0; sane && t < m->n_tensors; t++) sane = m->tensors[t]->n_shape <= 8;
      if (!sane && skipped++ < 20)
        ts_log_warn("re-sharding: skipping %s: its header is inconsistent", path);
      /* This layout's own files are not re-sharding's, nor are increments (a set is of
       * full checkpoints: psctl checkpoint and shutdown write those). */
      if (!sane || m->base_sequence ||
          ts_ckpt_file_same_layout(m, s->num_shards, s->partition_bytes)) {
        ts_msg_free(&m->base);
        continue;
      }
      if (f->ncands == cap) {
        cap = cap ? 2 * cap : 16;
        cand_t *nc = ts_realloc(f->cands, cap * sizeof *nc);
        if (!nc) {
          ts_msg_free(&m->base);
          ts_ckpt_file_free_names(names, n);
          ts_free(shards);
          return TS_ENOMEM;
        }
        f->cands = nc;
      }
      f->cands[f->ncands].meta = m;
      if (!(f->cands[f->ncands].path = ts_strdup(path))) {
        ts_msg_free(&m->base);
        ts_ckpt_file_free_names(names, n);
        ts_free(shards);
        return TS_ENOMEM;
      }
      f->ncands++;
    }
    ts_ckpt_file_free_names(names, n);
    ts_free(shards);
  }
  if (skipped > 20) ts_log_warn("re-sharding: %d more file(s) skipped", skipped - 20);
  return 0;
}

static bool newer(const Tessera__CheckpointMeta *a, const Tessera__CheckpointMeta *b) {
  return a->wall_time != b->wall_time ? a->wall_time > b->wall_time : a->sequence > b->sequence;
}

/* Candidates by (layout, step, seed); within a group the newest file of each shard. */
static int group(found_t *f) {
  f->groups = ts_calloc(f->ncands ? f->ncands : 1, sizeof *f->groups);
  if (!f->groups) return TS_ENOMEM;
  for (size_t i = 0; i < f->ncands; i++) {
    cand_t *c = &f->cands[i];
    const Tessera__CheckpointMeta *m = c->meta;
    group_t *g = NULL;
    for (size_t k = 0; k < f->ngroups && !g; k++)
      if (f->groups[k].num_shards == m->num_shards &&
          f->groups[k].partition_bytes == m->partition_bytes && f->groups[k].step == m->step &&
          f->groups[k].seed == m->seed)
        g = &f->groups[k];
    if (!g) {
      g = &f->groups[f->ngroups];
      *g = (group_t){.num_shards = m->num_shards,
                     .partition_bytes = m->partition_bytes,
                     .step = m->step,
                     .seed = m->seed,
                     .newest = m->wall_time};
      if (!(g->files = ts_calloc(m->num_shards, sizeof *g->files))) return TS_ENOMEM;
      f->ngroups++;
    }
    if (!g->files[m->shard]) g->have++;
    if (!g->files[m->shard] || newer(m, g->files[m->shard]->meta)) g->files[m->shard] = c;
    if (m->wall_time > g->newest) g->newest = m->wall_time;
  }
  return 0;
}

/* Newest step first, then the most recently written. */
static int by_age(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->step != y->step) return x->step > y->step ? -1 : 1;
  if (x->newest != y->newest) return x->newest > y->newest ? -1 : 1;
  return 0;
}

static bool same_tensors(const Tessera__CheckpointMeta *a, const Tessera__CheckpointMeta *b) {
  if (a->n_tensors != b->n_tensors || a->seed != b->seed || !ts_ckpt_tables_same(a, b))
    return false;
  for (size_t t = 0; t < a->n_tensors; t++) {
    const Tessera__TensorDecl *x = a->tensors[t], *y = b->tensors[t];
    if (strcmp(x->name, y->name) != 0 || x->n_shape != y->n_shape || x->init != y->init ||
        x->kind != y->kind)
      return false;
    for (size_t k = 0; k < x->n_shape; k++)
      if (x->shape[k] != y->shape[k]) return false;
  }
  return true;
}

/* What restoring one set tracks per partition of this shard. */
typedef struct {
  uint64_t got; /* parameter elements copied in */
  uint64_t version, updates;
  bool seen;
} dst_t;

typedef struct {
  ts_store_t *s;
  const ts_plan_t *old;
  dst_t *dst;
  float *tmp;        /* one old partition's buffer */
  uint8_t *old_seen; /* per partition of the old plan: read already */
  int nstate;
  bool state_dropped;
} copy_t;

/* Whether any partition of this shard overlaps elements [lo, hi) of tensor t. */
static bool wanted(ts_store_t *s, uint32_t t, uint64_t lo, uint64_t hi) {
  for (uint32_t q = 0; q < s->plan.tensor_parts[t]; q++) {
    const ts_part_t *pp = ts_plan_part(&s->plan, t, q);
    if (pp->offset < hi && lo < pp->offset + pp->count && ts_store_find(s, t, q)) return true;
  }
  return false;
}

/* Read old partition cp's buffers from f and copy the overlap into this shard's
 * partitions. Returns 0 or TS_EDATA with why. */
static int copy_part(copy_t *c, FILE *f, const Tessera__CheckpointPart *cp, char *why,
                     size_t whylen) {
  ts_store_t *s = c->s;
  uint64_t lo = cp->offset, hi = cp->offset + cp->count;
  if (!wanted(s, cp->tensor, lo, hi)) {
    long skip = (long)((1 + cp->state_buffers) * cp->count * sizeof(float));
    if (fseek(f, skip, SEEK_CUR) == 0) return 0;
    ts_errmsg_printf(why, whylen, "cannot seek past tensor %u part %u", cp->tensor, cp->part);
    return TS_EDATA;
  }
  bool keep_state = cp->state_buffers == (uint32_t)c->nstate;
  if (!keep_state) c->state_dropped = true;
  for (uint32_t b = 0; b <= cp->state_buffers; b++) {
    if (fread(c->tmp, sizeof(float), cp->count, f) != cp->count) {
      ts_errmsg_printf(why, whylen, "truncated while reading tensor %u part %u", cp->tensor, cp->part);
      return TS_EDATA;
    }
    if (b > 0 && !keep_state) continue;
    size_t at = ts_ckpt_first_nonfinite(c->tmp, cp->count);
    if (at < cp->count) {
      ts_errmsg_printf(why, whylen, "tensor %u %s element %llu is %s", cp->tensor,
                       b == 0 ? "parameter" : "optimizer state",
                       (unsigned long long)(cp->offset + at), isnan(c->tmp[at]) ? "NaN" : "Inf");
      return TS_EDATA;
    }
    for (uint32_t q = 0; q < s->plan.tensor_parts[cp->tensor]; q++) {
      const ts_part_t *pp = ts_plan_part(&s->plan, cp->tensor, q);
      uint64_t a = pp->offset > lo ? pp->offset : lo;
      uint64_t z = pp->offset + pp->count < hi ? pp->offset + pp->count : hi;
      ts_spart_t *p = a < z ? ts_store_find(s, cp->tensor, q) : NULL;
      if (!p) continue;
      ts_store_record_t r;
      ts_store_record(s, p, &r);
      memcpy(r.bufs[b] + (a - pp->offset), c->tmp + (a - lo), (z - a) * sizeof(float));
      if (b > 0) continue;
      dst_t *d = &c->dst[ts_store_part_index(s, p)];
      uint64_t updates = keep_state ? cp->updates : 0;
      if (d->seen && (d->version != cp->version || d->updates != updates)) {
        ts_errmsg_printf(why, whylen,
                 "tensor '%s' partition %u would gather old partitions at version %llu and "
                 "%llu (updates %llu and %llu): a partition made of several old ones needs "
                 "them equal",
                 s->tensors[cp->tensor].name, q, (unsigned long long)d->version,
                 (unsigned long long)cp->version, (unsigned long long)d->updates,
                 (unsigned long long)updates);
        return TS_EDATA;
      }
      d->seen = true;
      d->version = cp->version;
      d->updates = updates;
      d->got += z - a;
    }
  }
  return 0;
}

/* One verified file of the set: its partitions must be the old plan's for its shard. */
static int copy_file(copy_t *c, const group_t *g, uint32_t shard, char *why, size_t whylen) {
  const char *path = g->files[shard]->path;
  FILE *f;
  Tessera__CheckpointMeta *m;
  char err[512];
  int rc = ts_ckpt_file_open(path, &f, &m, err, sizeof err);
  if (rc < 0) {
    ts_errmsg_printf(why, whylen, "%s", err);
    return TS_EDATA;
  }
  rc = TS_EDATA;
  if (m->shard != shard || m->num_shards != g->num_shards || m->step != g->step ||
      m->partition_bytes != g->partition_bytes || !same_tensors(m, g->files[0]->meta)) {
    ts_errmsg_printf(why, whylen, "%s changed while it was being read", path);
    goto out;
  }
  uint32_t want = c->old->shard_parts ? c->old->shard_parts[shard] : 0; /* none: tables only */
  if (m->n_parts != want) {
    ts_errmsg_printf(why, whylen, "%s holds %zu partitions, the old plan gives shard %u %u", path,
             m->n_parts, shard, want);
    goto out;
  }
  for (size_t i = 0; i < m->n_parts; i++) {
    const Tessera__CheckpointPart *cp = m->parts[i];
    const ts_part_t *pp = ts_plan_part(c->old, cp->tensor, cp->part);
    if (!pp || pp->shard != shard || pp->offset != cp->offset || pp->count != cp->count ||
        cp->state_buffers > 2 || c->old_seen[pp - c->old->parts]) {
      ts_errmsg_printf(why, whylen, "%s: tensor %u part %u is not the old plan's, or listed twice", path,
               cp->tensor, cp->part);
      goto out;
    }
    c->old_seen[pp - c->old->parts] = 1;
    char w[300];
    if (copy_part(c, f, cp, w, sizeof w) < 0) {
      ts_errmsg_printf(why, whylen, "%s: %s", path, w);
      goto out;
    }
  }
  char w[300];
  if (ts_ckpt_tables_read(c->s, f, m, true, &c->state_dropped, w, sizeof w) < 0) {
    ts_errmsg_printf(why, whylen, "%s: %s", path, w);
    goto out;
  }
  rc = 0;
out:
  ts_msg_free(&m->base);
  fclose(f);
  return rc;
}

/* Before anything is allocated for set g: a set holds every element of its model once, so
 * its files' real sizes bound the model it may make this shard declare; and the old plan
 * must cut that model into exactly the partitions the files' headers list (copy_file checks
 * each), so the headers, already read, bound the plan and its tables. A forged set of
 * header-only files claiming a large model, or partition_bytes of 4 (a partition per
 * element, tens of bytes of plan each), is refused here with nothing allocated. */
static int check_set(const group_t *g, char *why, size_t whylen) {
  const Tessera__CheckpointMeta *ref = g->files[0]->meta;
  if (g->partition_bytes < 4) {
    ts_errmsg_printf(why, whylen, "its partition_bytes %llu is below 4 (one float)",
             (unsigned long long)g->partition_bytes);
    return TS_EDATA;
  }
  uint64_t per_part = g->partition_bytes / 4, elems = 0, parts = 0, listed = 0, bytes = 0;
  for (size_t t = 0; t < ref->n_tensors; t++) {
    uint64_t e = 1;
    for (size_t k = 0; k < ref->tensors[t]->n_shape; k++) {
      uint64_t d = ref->tensors[t]->shape[k];
      if (d == 0 || e > (UINT64_MAX / 4) / d) {
        ts_errmsg_printf(why, whylen, "tensor '%s' has an impossible shape", ref->tensors[t]->name);
        return TS_EDATA;
      }
      e *= d;
    }
    if (e > UINT64_MAX / 4 - elems) {
      ts_errmsg_printf(why, whylen, "its model is larger than 2^64 bytes");
      return TS_EDATA;
    }
    elems += e;
    parts += (e + per_part - 1) / per_part; /* at most elems: no wrap */
  }
  for (uint32_t i = 0; i < g->num_shards; i++) {
    struct stat st;
    if (stat(g->files[i]->path, &st) < 0) {
      ts_errmsg_printf(why, whylen, "cannot stat %s: %s", g->files[i]->path, strerror(errno));
      return TS_EDATA;
    }
    bytes += (uint64_t)st.st_size;
    listed += g->files[i]->meta->n_parts;
  }
  if (elems > bytes / 4) {
    ts_errmsg_printf(why, whylen,
             "its files hold %llu bytes in all, too few for the %llu parameters (%.1f MiB) its "
             "headers declare: a truncated or forged set",
             (unsigned long long)bytes, (unsigned long long)elems,
             (double)elems * 4.0 / 1048576.0);
    return TS_EDATA;
  }
  if (parts != listed) {
    ts_errmsg_printf(why, whylen,
             "its partition_bytes %llu cuts the model into %llu partitions, but its files list "
             "%llu: a truncated or forged set",
             (unsigned long long)g->partition_bytes, (unsigned long long)parts,
             (unsigned long long)listed);
    return TS_EDATA;
  }
  return 0;
}

/* Restore set g into the undeclared store s. On failure s is undeclared again. */
static int load_set(ts_store_t *s, const group_t *g, char *why, size_t whylen) {
  const Tessera__CheckpointMeta *ref = g->files[0]->meta;
  for (uint32_t i = 1; i < g->num_shards; i++)
    if (!same_tensors(ref, g->files[i]->meta)) {
      ts_errmsg_printf(why, whylen, "%s and %s hold different models", g->files[0]->path,
               g->files[i]->path);
      return TS_EDATA;
    }
  int rc = check_set(g, why, whylen);
  if (rc < 0) return rc;
  Tessera__Declare d = TESSERA__DECLARE__INIT;
  d.n_tensors = ref->n_tensors;
  d.tensors = ref->tensors;
  d.n_tables = ref->n_tables;
  d.tables = ref->tables;
  d.seed = ref->seed;
  bool created;
  char err[256];
  rc = ts_store_declare(s, &d, &created, err, sizeof err);
  if (rc < 0) {
    ts_errmsg_printf(why, whylen, "cannot declare its model: %s", err);
    return TS_EDATA;
  }
  ts_plan_t old;
  uint64_t *elems = ts_calloc(s->num_tensors, sizeof *elems);
  copy_t c = {.s = s, .old = &old, .nstate = ts_optim_state_buffers(&s->optim)};
  c.dst = ts_calloc(s->num_parts ? s->num_parts : 1, sizeof *c.dst);
  memset(&old, 0, sizeof old);
  rc = TS_ENOMEM;
  if (!elems || !c.dst) goto out;
  for (uint32_t t = 0; t < s->num_tensors; t++) elems[t] = s->tensors[t].elems;
  if (s->num_tensors > 0 &&
      (rc = ts_plan_build(elems, s->num_tensors, g->num_shards, g->partition_bytes, &old)) < 0)
    goto out;
  uint64_t max = 1;
  for (size_t i = 0; i < old.num_parts; i++)
    if (old.parts[i].count > max) max = old.parts[i].count;
  rc = TS_ENOMEM;
  if (!(c.tmp = ts_aligned_alloc(max * sizeof(float))) ||
      !(c.old_seen = ts_calloc(old.num_parts ? old.num_parts : 1, 1)))
    goto out;
  for (uint32_t i = 0; i < g->num_shards; i++)
    if ((rc = copy_file(&c, g, i, why, whylen)) < 0) goto out;
  for (size_t i = 0; i < s->num_parts; i++) {
    ts_spart_t *p = ts_store_part_at(s, i);
    ts_store_record_t r;
    ts_store_record(s, p, &r);
    if (c.dst[i].got != r.count) {
      ts_errmsg_printf(why, whylen, "tensor '%s' partition %u is not covered by the set",
               s->tensors[r.tensor].name, r.part);
      rc = TS_EDATA;
      goto out;
    }
    ts_store_restored(p, c.dst[i].version, c.dst[i].updates);
  }
  if (c.state_dropped)
    ts_log_warn(
        "the checkpoint set was written with optimizer %s: its optimizer state is not "
        "used",
        ref->optimizer);
  rc = 0;
out:
  if (rc == TS_ENOMEM) ts_errmsg_printf(why, whylen, "out of memory");
  if (rc < 0) ts_store_free(s);
  ts_free(c.tmp);
  ts_free(c.old_seen);
  ts_free(c.dst);
  ts_free(elems);
  ts_plan_free(&old);
  return rc;
}

/* "step S: shards 0,2 of 3 (partition_bytes P); ..." for the refusal. */
static void describe(const found_t *f, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (size_t k = 0; k < f->ngroups && len + 1 < n; k++) {
    const group_t *g = &f->groups[k];
    len += (size_t)snprintf(buf + len, n - len, "%sstep %llu: shard(s) ", k ? "; " : "",
                            (unsigned long long)g->step);
    for (uint32_t i = 0, first = 1; i < g->num_shards && len + 1 < n; i++)
      if (g->files[i]) {
        len += (size_t)snprintf(buf + len, n - len, "%s%u", first ? "" : ",", i);
        first = 0;
      }
    if (len + 1 < n)
      len += (size_t)snprintf(buf + len, n - len, " of %u (partition_bytes %llu)", g->num_shards,
                              (unsigned long long)g->partition_bytes);
  }
}

/* Every file of another layout in dirs, grouped and sorted newest first. */
static int find(const ts_store_t *s, char *const *dirs, size_t ndirs, found_t *f, char *errmsg,
                size_t errlen) {
  int rc = collect(s, dirs, ndirs, f);
  if (rc == 0) rc = group(f);
  if (rc < 0) {
    ts_errmsg_printf(errmsg, errlen, "out of memory while looking for checkpoints to re-shard");
    return rc;
  }
  qsort(f->groups, f->ngroups, sizeof *f->groups, by_age);
  return 0;
}

int ts_ckpt_reshard_newest_set(const ts_store_t *s, char *const *dirs, size_t ndirs, double *wall) {
  found_t f = {0};
  char err[128];
  int found = 0;
  if (find(s, dirs, ndirs, &f, err, sizeof err) == 0)
    for (size_t k = 0; k < f.ngroups; k++)
      if (f.groups[k].have == f.groups[k].num_shards && (!found || f.groups[k].newest > *wall)) {
        *wall = f.groups[k].newest;
        found = 1;
      }
  found_free(&f);
  return found;
}

/* Whether a file of set g, loaded into s, was written by another job: why names it. */
static bool other_job(const ts_store_t *s, const group_t *g, char *why, size_t whylen) {
  for (uint32_t i = 0; i < g->num_shards; i++) {
    char w[400];
    if (ts_ckpt_other_job(s, g->files[i]->meta, w, sizeof w)) {
      ts_errmsg_printf(why, whylen, "%.250s: %s", g->files[i]->path, w);
      return true;
    }
  }
  return false;
}

int ts_ckpt_reshard(ts_store_t *s, char *const *dirs, size_t ndirs, double newer_than, bool adopt,
                    char *desc, size_t desclen, char *errmsg, size_t errlen) {
  found_t f = {0};
  int rc = find(s, dirs, ndirs, &f, errmsg, errlen);
  if (rc < 0 || f.ncands == 0) {
    found_free(&f);
    return rc;
  }
  char why[700] = "";
  int tried = 0;
  for (size_t k = 0; k < f.ngroups; k++) {
    const group_t *g = &f.groups[k];
    if (g->have != g->num_shards || g->newest <= newer_than) continue;
    tried++;
    int r = load_set(s, g, why, sizeof why);
    if (r == 0 && !adopt && other_job(s, g, why, sizeof why)) {
      ts_store_free(s);
      r = TS_EDATA;
    }
    if (r < 0) {
      ts_log_err("checkpoint set of %u shard(s) at step %llu rejected, trying an older one: %s",
                 g->num_shards, (unsigned long long)g->step, why);
      continue;
    }
    size_t len = (size_t)snprintf(desc, desclen,
                                  "of %u shard(s) (partition_bytes %llu) at step %llu, "
                                  "re-sharded from",
                                  g->num_shards, (unsigned long long)g->partition_bytes,
                                  (unsigned long long)g->step);
    for (uint32_t i = 0; i < g->num_shards && len + 1 < desclen; i++)
      len += (size_t)snprintf(desc + len, desclen - len, " %s", g->files[i]->path);
    found_free(&f);
    return 1;
  }
  if (newer_than >= 0) {
    /* This shard has a checkpoint of its own to fall back on. */
    found_free(&f);
    ts_errmsg_printf(errmsg, errlen, "no newer checkpoint set of another layout could be used");
    return 0;
  }
  if (tried > 0) {
    ts_errmsg_printf(errmsg, errlen,
             "every complete checkpoint set of another layout was rejected (%d of them, "
             "each logged above); the last: %s",
             tried, why);
    found_free(&f);
    return TS_EDATA;
  }
  char what[600];
  describe(&f, what, sizeof what);
  size_t len = (size_t)snprintf(errmsg, errlen,
                                "no complete checkpoint set to re-shard from (this is shard "
                                "%u of %u, partition_bytes %llu); searched",
                                s->shard, s->num_shards, (unsigned long long)s->partition_bytes);
  for (size_t d = 0; d < ndirs && len + 1 < errlen; d++)
    len += (size_t)snprintf(errmsg + len, errlen - len, " %s", dirs[d]);
  if (len + 1 < errlen)
    snprintf(errmsg + len, errlen - len,
             " and found %s. Re-sharding needs a file of every old shard at one step (psctl "
             "checkpoint writes such a set): list the old shards' directories in "
             "checkpoint.restore_from, or move the old files away to start fresh",
             what);
  found_free(&f);
  return TS_EDATA;
}
