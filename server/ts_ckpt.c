/*
 * A shard's store to and from checkpoint files (ts_ckpt.h): the snapshot taken on the loop,
 * and the restore at start: this shard's newest valid file of its own layout, or a set of
 * another layout re-sharded (ts_ckpt_reshard.c). The bytes on disk are ts_ckpt_file.c's,
 * the embedding tables' part ts_ckpt_tables.c's.
 */
#include "ts_ckpt.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_ckpt_file.h"
#include "ts_ckpt_reshard.h"
#include "ts_ckpt_tables.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_msg.h"

/* --- the job's identity -------------------------------------------------------------- */

static const char *optimizer_name(ts_optimizer_t o) {
  return o == TS_OPT_ADAM ? "adam" : o == TS_OPT_MOMENTUM ? "momentum" : "sgd";
}

static void hash_u64(crypto_generichash_state *h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  crypto_generichash_update(h, b, sizeof b);
}

static void hash_str(crypto_generichash_state *h, const char *str) {
  crypto_generichash_update(h, (const uint8_t *)str, strlen(str) + 1);
}

void ts_ckpt_job_id(const ts_store_t *s, char out[TS_CKPT_JOB_ID_LEN + 1]) {
  crypto_generichash_state h;
  uint8_t id[TS_CKPT_JOB_ID_LEN / 2];
  crypto_generichash_init(&h, NULL, 0, sizeof id);
  hash_str(&h, "tessera job 1");
  hash_u64(&h, (uint64_t)s->mode);
  hash_str(&h, optimizer_name(s->optim.kind));
  hash_u64(&h, s->seed);
  /* Only when set: a job without a name keeps the id it had before names existed. */
  if (*s->job_name) {
    hash_str(&h, "job.name");
    hash_str(&h, s->job_name);
  }
  for (uint32_t t = 0; t < s->num_tensors; t++) {
    const ts_tensor_t *x = &s->tensors[t];
    hash_str(&h, x->name);
    hash_u64(&h, x->rank);
    for (size_t d = 0; d < x->rank; d++) hash_u64(&h, x->shape[d]);
    hash_u64(&h, (uint64_t)x->init);
    hash_u64(&h, x->state);
  }
  for (uint32_t t = 0; t < s->num_tables; t++) {
    ts_stable_t *tab = ts_stables_at(s->tables, t);
    hash_str(&h, ts_stable_name(tab));
    hash_u64(&h, ts_stable_dim(tab));
  }
  crypto_generichash_final(&h, id, sizeof id);
  sodium_bin2hex(out, TS_CKPT_JOB_ID_LEN + 1, id, sizeof id);
}

/* --- the snapshot ------------------------------------------------------------------- */

int ts_ckpt_snapshot(const ts_store_t *s, uint64_t sequence, uint64_t base_sequence,
                     ts_ckpt_snapshot_t **out, char *errmsg, size_t errlen) {
  *out = NULL;
  if (!s->declared) {
    ts_errmsg_printf(errmsg, errlen, "no model is declared on this shard: nothing to checkpoint");
    return TS_ENOTDECLARED;
  }
  if (s->awaiting) {
    ts_errmsg_printf(errmsg, errlen,
             "%zu partition(s) still wait for the model's initial values: nothing to checkpoint",
             s->awaiting);
    return TS_ENOTREADY;
  }
  int nstate = ts_optim_state_buffers(&s->optim);
  size_t total = 0;
  for (size_t i = 0; i < s->num_parts; i++) {
    ts_store_record_t r;
    ts_store_record(s, ts_store_part_at(s, i), &r);
    total += r.count * (size_t)(1 + nstate);
    for (int b = 0; b <= nstate; b++) {
      if (ts_ckpt_first_nonfinite(r.bufs[b], r.count) < r.count) {
        ts_errmsg_printf(errmsg, errlen,
                 "tensor '%s' part %u holds NaN or Inf %s: not checkpointed (the previous "
                 "checkpoint is kept)",
                 s->tensors[r.tensor].name, r.part, b == 0 ? "parameters" : "optimizer state");
        return TS_ENONFINITE;
      }
    }
  }

  /* The tables at the same point of the loop as the partitions. */
  ts_ckpt_tables_t tabs;
  if (s->num_tables == 0) base_sequence = 0; /* increments are of tables */
  int rc = ts_ckpt_tables_snapshot(s, base_sequence != 0, &tabs, errmsg, errlen);
  if (rc < 0) return rc;
  rc = TS_ENOMEM;
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
  m.format = TS_CKPT_FILE_FORMAT;
  m.shard = s->shard;
  m.num_shards = s->num_shards;
  m.mode = ts_store_wire_mode(s->mode);
  m.seed = s->seed;
  m.partition_bytes = s->partition_bytes;
  m.step = ts_ckpt_step(s);
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
    ts_store_record_t r;
    ts_store_record(s, ts_store_part_at(s, i), &r);
    tessera__checkpoint_part__init(&cp[i]);
    cp[i].tensor = r.tensor;
    cp[i].part = r.part;
    cp[i].offset = r.offset;
    cp[i].count = r.count;
    /* A completed barrier waiting for its writers counts as applied. */
    cp[i].version = r.version;
    cp[i].updates = r.updates;
    cp[i].state_buffers = (uint32_t)nstate;
    cpp[i] = &cp[i];
    for (int b = 0; b <= nstate; b++) {
      memcpy(d, r.bufs[b], r.count * sizeof(float));
      d += r.count;
    }
  }
  m.n_parts = s->num_parts;
  m.parts = cpp;
  ts_ckpt_tables_fill(&tabs, &m);
  m.base_sequence = base_sequence;
  char job_id[TS_CKPT_JOB_ID_LEN + 1];
  ts_ckpt_job_id(s, job_id);
  m.job_id = job_id;
  m.job_name = (char *)s->job_name;
  snap->meta_len = protobuf_c_message_get_packed_size(&m.base);
  snap->meta = ts_malloc(snap->meta_len ? snap->meta_len : 1);
  if (!snap->meta) goto fail;
  protobuf_c_message_pack(&m.base, snap->meta);
  snap->shard = s->shard;
  snap->num_shards = s->num_shards;
  snap->partition_bytes = s->partition_bytes;
  snap->step = m.step;
  snap->sequence = sequence;
  snap->base_sequence = base_sequence;
  snap->records = tabs.records;
  snap->records_len = tabs.records_len;
  tabs.records = NULL;
  rc = 0;
  *out = snap;
  snap = NULL;
fail:
  if (rc == TS_ENOMEM) ts_errmsg_printf(errmsg, errlen, "out of memory for a checkpoint snapshot");
  ts_ckpt_snapshot_free(snap);
  ts_free(td);
  ts_free(tp);
  ts_free(shapes);
  ts_free(cp);
  ts_free(cpp);
  ts_ckpt_tables_free(&tabs);
  return rc;
}

uint64_t ts_ckpt_step(const ts_store_t *s) {
  /* Sync: every shard closes the same steps of its tables. Async and ssp: a table's version
   * counts the pushes its shard was sent (only those with its keys), no step the shards
   * share, so it does not count; a model of tables only is then at step 0 (re-sharding
   * takes the newest file of every old shard). */
  bool tables = false;
  uint64_t tv = s->mode == TS_MODE_SYNC ? ts_ckpt_tables_min_version(s, &tables) : 0;
  if (s->num_parts == 0) return tv;
  uint64_t v = ts_store_min_version(s);
  return tables && tv < v ? tv : v;
}

uint64_t ts_ckpt_changes(const ts_store_t *s) {
  return s->applied + ts_ckpt_tables_changes(s);
}

void ts_ckpt_snapshot_free(ts_ckpt_snapshot_t *snap) {
  if (!snap) return;
  ts_free(snap->meta);
  ts_free(snap->data);
  ts_free(snap->records);
  ts_free(snap);
}

/* --- restoring ---------------------------------------------------------------------- */

static int bad(char *errmsg, size_t errlen, const char *path, const char *why) {
  ts_errmsg_printf(errmsg, errlen, "%.300s: %.400s", path, why);
  return TS_EDATA;
}

/* Load one verified file into the undeclared store s. */
static int load(ts_store_t *s, const char *path, FILE *f, const Tessera__CheckpointMeta *m,
                char *errmsg, size_t errlen) {
  char why[256];
  if (m->shard != s->shard || !ts_ckpt_file_same_layout(m, s->num_shards, s->partition_bytes)) {
    ts_errmsg_printf(why, sizeof why,
             "written by shard %u of %u with partition_bytes %llu; this is shard %u of %u with "
             "%llu",
             m->shard, m->num_shards, (unsigned long long)m->partition_bytes, s->shard,
             s->num_shards, (unsigned long long)s->partition_bytes);
    return bad(errmsg, errlen, path, why);
  }
  Tessera__Declare d = TESSERA__DECLARE__INIT;
  d.n_tensors = m->n_tensors;
  d.tensors = m->tensors;
  d.n_tables = m->n_tables;
  d.tables = m->tables;
  d.seed = m->seed;
  bool created = false;
  int rc = ts_store_declare(s, &d, &created, why, sizeof why);
  if (rc < 0) return bad(errmsg, errlen, path, why);
  int nstate = ts_optim_state_buffers(&s->optim);
  if (m->n_parts != s->num_parts) {
    ts_errmsg_printf(why, sizeof why, "holds %zu partitions, the plan gives this shard %zu", m->n_parts,
             s->num_parts);
    ts_store_free(s);
    return bad(errmsg, errlen, path, why);
  }
  /* Sized by this shard's plan: each part is checked against it before it is read. */
  size_t max = (size_t)ts_store_max_part_count(s);
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
    ts_store_record_t r;
    if (p) ts_store_record(s, p, &r);
    if (!p || r.offset != cp->offset || r.count != cp->count) {
      ts_errmsg_printf(why, sizeof why, "partition %u of tensor %u does not match this shard's plan",
               cp->part, cp->tensor);
      break;
    }
    if (seen[ts_store_part_index(s, p)]++) {
      ts_errmsg_printf(why, sizeof why,
               "tensor '%s' partition %u is listed twice (so another partition is missing)",
               s->tensors[cp->tensor].name, cp->part);
      break;
    }
    /* Optimizer state of another optimizer is read past: the new one starts fresh. */
    bool keep_state = cp->state_buffers == (uint32_t)nstate;
    if (!keep_state) state_dropped = true;
    for (uint32_t b = 0; b <= cp->state_buffers && !why[0]; b++) {
      float *dst = b == 0 ? r.bufs[0] : keep_state ? r.bufs[b] : skip;
      if (fread(dst, sizeof(float), cp->count, f) != cp->count) {
        ts_errmsg_printf(why, sizeof why, "truncated while reading partition data");
        break;
      }
      size_t at = ts_ckpt_first_nonfinite(dst, cp->count);
      if (dst != skip && at < cp->count)
        ts_errmsg_printf(why, sizeof why, "tensor '%s' %s element %llu is %s",
                         s->tensors[cp->tensor].name, b == 0 ? "parameter" : "optimizer state",
                         (unsigned long long)(cp->offset + at), isnan(dst[at]) ? "NaN" : "Inf");
    }
    ts_store_restored(p, cp->version, keep_state ? cp->updates : 0);
  }
  if (!why[0] && ts_ckpt_tables_read(s, f, m, false, &state_dropped, why, sizeof why) < 0 &&
      !why[0])
    ts_errmsg_printf(why, sizeof why, "its tables do not load");
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

/* An increment's full checkpoint (sequence base, in dir), loaded into the undeclared s. */
static int load_base(ts_store_t *s, const char *dir, uint64_t base, const char *path,
                     char *errmsg, size_t errlen) {
  char full[600], err[1024];
  snprintf(full, sizeof full, "%s/shard-%u-%020llu.ckpt", dir, s->shard, (unsigned long long)base);
  FILE *f;
  Tessera__CheckpointMeta *m;
  int rc = ts_ckpt_file_open(full, &f, &m, err, sizeof err);
  if (rc == 0) {
    rc = m->base_sequence ? bad(err, sizeof err, full, "an increment, not a full checkpoint")
                          : load(s, full, f, m, err, sizeof err);
    ts_msg_free(&m->base);
    fclose(f);
  }
  if (rc < 0) ts_errmsg_printf(errmsg, errlen, "%.300s: an increment on %.600s", path, err);
  return rc < 0 ? TS_EDATA : 0;
}

/* This shard's rejected checkpoints: the first LOG_REJECTS logged one by one (a directory
 * of 3,000 bad files makes a few lines, then a count), the first NAME_REJECTS named in the
 * error when none is usable. */
#define LOG_REJECTS 20
#define NAME_REJECTS 3

typedef struct {
  int count;
  char named[1200];
} rejects_t;

static void reject(rejects_t *r, const char *err) {
  if (r->count < LOG_REJECTS) ts_log_err("checkpoint rejected, trying an older one: %s", err);
  if (r->count < NAME_REJECTS) {
    size_t len = strlen(r->named);
    snprintf(r->named + len, sizeof r->named - len, "%s%.350s", len ? "; " : "", err);
  }
  r->count++;
}

/* The newest valid checkpoint of this shard in its own layout: 1 restored (*wall gets the
 * time it was written), 0 none, TS_EDATA when there were some and every one was rejected
 * (errmsg names them). An increment is restored onto its full checkpoint. Files of another
 * layout are passed over: they are re-sharding's. */
bool ts_ckpt_other_job(const ts_store_t *s, const Tessera__CheckpointMeta *m, char *why,
                       size_t whylen) {
  char mine[TS_CKPT_JOB_ID_LEN + 1];
  ts_ckpt_job_id(s, mine);
  if (!m->job_id || !*m->job_id || strcmp(m->job_id, mine) == 0) return false;
  char theirs_name[96] = "", my_name[96] = "";
  if (m->job_name && *m->job_name)
    snprintf(theirs_name, sizeof theirs_name, "name '%.63s', ", m->job_name);
  if (*s->job_name)
    snprintf(my_name, sizeof my_name, "job.name '%.63s', ", s->job_name);
  ts_errmsg_printf(why, whylen,
                   "written by job %.16s (%smode %s, optimizer %s); this job, with the same "
                   "model, is %s (%sjob.mode %s, optimizer.name %s): start the shard with "
                   "--adopt to continue that training as this job",
                   m->job_id, theirs_name, ts_msg_mode_name(m->mode),
                   m->optimizer ? m->optimizer : "?", mine, my_name,
                   ts_msg_mode_name(ts_store_wire_mode(s->mode)), optimizer_name(s->optim.kind));
  return true;
}

static int restore_own(ts_store_t *s, const char *dir, bool adopt, char *path, size_t pathlen,
                       uint64_t *sequence, double *wall, char *errmsg, size_t errlen) {
  char **names;
  int n = ts_ckpt_file_list(dir, (int)s->shard, &names, NULL);
  if (n < 0) {
    ts_errmsg_printf(errmsg, errlen, "cannot read checkpoint directory %s: %s", dir, strerror(-n));
    return n;
  }
  int restored = 0;
  rejects_t rej = {0};
  for (int i = n - 1; i >= 0 && !restored; i--) {
    char full[600], err[1024];
    snprintf(full, sizeof full, "%s/%s", dir, names[i]);
    FILE *f;
    Tessera__CheckpointMeta *m;
    /* A header that does not read is tried (and rejected, with the reason) below. */
    if (ts_ckpt_file_read_meta(full, &m, err, sizeof err) == 0) {
      bool mine = ts_ckpt_file_same_layout(m, s->num_shards, s->partition_bytes);
      ts_msg_free(&m->base);
      if (!mine) continue;
    }
    int rc = ts_ckpt_file_open(full, &f, &m, err, sizeof err);
    if (rc == 0) {
      ts_require(m != NULL); /* set on success */
      if (m->base_sequence) rc = load_base(s, dir, m->base_sequence, full, err, sizeof err);
      if (rc == 0) rc = load(s, full, f, m, err, sizeof err);
      char why[400];
      if (rc == 0 && !adopt && ts_ckpt_other_job(s, m, why, sizeof why))
        rc = bad(err, sizeof err, full, why);
      if (rc < 0 && s->declared) ts_store_free(s); /* the base alone is not this state */
      if (rc == 0) {
        restored = 1;
        if (path && m->base_sequence)
          snprintf(path, pathlen, "%s (an increment on sequence %llu)", full,
                   (unsigned long long)m->base_sequence);
        else if (path)
          snprintf(path, pathlen, "%s", full);
        if (sequence) *sequence = m->sequence;
        *wall = m->wall_time;
      }
      ts_msg_free(&m->base);
      fclose(f);
    }
    if (rc < 0) reject(&rej, err);
  }
  ts_ckpt_file_free_names(names, n);
  if (rej.count > LOG_REJECTS)
    ts_log_err("... and %d more checkpoint(s) of shard %u rejected", rej.count - LOG_REJECTS,
               s->shard);
  if (restored || rej.count == 0) return restored;
  char more[96] = "";
  if (rej.count > NAME_REJECTS)
    snprintf(more, sizeof more, "; and %d more (the log names the first %d)",
             rej.count - NAME_REJECTS, LOG_REJECTS);
  ts_errmsg_printf(errmsg, errlen,
                   "no usable checkpoint of shard %u in %s: %d file(s) rejected: %s%s. Not "
                   "starting fresh, which would throw the training away: repair or move the "
                   "files, or start the shard with --fresh",
                   s->shard, dir, rej.count, rej.named, more);
  return TS_EDATA;
}

int ts_ckpt_restore(ts_store_t *s, const char *dir, char *const *from, size_t nfrom, bool adopt,
                    char *path, size_t pathlen, uint64_t *sequence, char *errmsg, size_t errlen) {
  double own = -1;
  int rc = restore_own(s, dir, adopt, path, pathlen, sequence, &own, errmsg, errlen);
  if (rc < 0 && rc != TS_EDATA) return rc;
  bool rejected = rc == TS_EDATA; /* every file of this shard's own layout */
  /* The other layouts' files, in dir and in checkpoint.restore_from. */
  char **dirs = ts_calloc(nfrom + 1, sizeof *dirs);
  if (!dirs) {
    if (rc == 0) ts_errmsg_printf(errmsg, errlen, "out of memory");
    return rc == 1 ? 1 : rejected ? TS_EDATA : TS_ENOMEM;
  }
  dirs[0] = (char *)dir;
  for (size_t i = 0; i < nfrom; i++) dirs[i + 1] = from[i];
  double set = 0;
  if (rc == 1 && ts_ckpt_reshard_newest_set(s, dirs, nfrom + 1, &set) == 1 && set > own) {
    /* The shard count changed back: the newest state is the other layout's set. */
    ts_log_notice("a checkpoint set of another layout is newer than %s: re-sharding from it", path);
    ts_store_free(s);
    char desc[600];
    int r = ts_ckpt_reshard(s, dirs, nfrom + 1, own, adopt, desc, sizeof desc, errmsg, errlen);
    if (r == 1) {
      snprintf(path, pathlen, "%s", desc);
      rc = 2;
    } else {
      ts_log_err("re-sharding failed, restoring this shard's own checkpoint again");
      rc = restore_own(s, dir, adopt, path, pathlen, sequence, &own, errmsg, errlen);
    }
  } else if (rc == 0 || rejected) {
    /* A complete set of another layout can still be restored; when there is none, the
     * rejection of this shard's own files stands. */
    char rerr[1024];
    rc = ts_ckpt_reshard(s, dirs, nfrom + 1, -1, adopt, path, pathlen, rejected ? rerr : errmsg,
                         rejected ? sizeof rerr : errlen);
    if (rc == 1) {
      rc = 2;
    } else if (rejected) {
      if (rc < 0) {
        size_t len = strlen(errmsg);
        snprintf(errmsg + len, errlen - len, "; re-sharding: %s", rerr);
      }
      rc = TS_EDATA;
    }
  }
  ts_free(dirs);
  if (rc == 2 && sequence) *sequence = 0;
  return rc;
}
