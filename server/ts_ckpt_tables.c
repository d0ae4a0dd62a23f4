/*
 * Embedding tables in checkpoint files (ts_ckpt_tables.h): the snapshot of every table's
 * live rows as records, the size check of a file's table section, and reading the records
 * back into a store, whole (this shard's own file) or filtered by key (re-sharding, where
 * every old shard's file is read and each row kept only by the shard ts_key_shard gives it
 * under the new count). The rest of the file is ts_ckpt.c's and ts_ckpt_file.c's.
 */
#include "ts_ckpt_tables.h"

#include <math.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_key.h"
#include "ts_msg.h"
#include "ts_table.h"

#define REC_HEAD 24 /* key, updates, last_step */
#define MAX_DIM 4096

static size_t record_bytes(uint32_t dim, uint32_t nstate) {
  return REC_HEAD + (size_t)dim * (1 + nstate) * sizeof(float);
}

/* --- the snapshot ------------------------------------------------------------------- */

/* Rows an increment holds of t: those changed since the last full checkpoint. */
static size_t changed_rows(const ts_table_t *rows) {
  size_t n = 0;
  uint32_t cursor = 0;
  for (uint32_t id; (id = ts_table_next(rows, &cursor)) != TS_TABLE_NONE;)
    n += ts_stable_row_changed(ts_table_meta(rows, id));
  return n;
}

int ts_ckpt_tables_snapshot(const ts_store_t *s, bool incremental, ts_ckpt_tables_t *out,
                            char *errmsg, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (s->num_tables == 0) return 0;
  size_t n = s->num_tables, total = 0;
  for (size_t i = 0; i < n; i++) {
    const ts_stable_t *t = ts_stables_at(s->tables, (uint32_t)i);
    const ts_table_t *rows = ts_stable_rows(t);
    size_t nrows = incremental ? changed_rows(rows) : rows->size, ntomb = 0;
    if (incremental) ts_stable_tombstones(t, &ntomb);
    total += nrows * record_bytes(rows->dim, (uint32_t)ts_stable_nstate(t)) + ntomb * 8;
  }
  out->n = n;
  out->decls = ts_calloc(n, sizeof *out->decls);
  out->ct = ts_calloc(n, sizeof *out->ct);
  out->ctp = ts_calloc(n, sizeof *out->ctp);
  out->records = ts_malloc(total);
  if (!out->decls || !out->ct || !out->ctp || !out->records) {
    ts_ckpt_tables_free(out);
    ts_errmsg_printf(errmsg, errlen, "out of memory for a checkpoint snapshot of %zu table bytes",
                     total);
    return TS_ENOMEM;
  }
  out->records_len = total;
  uint8_t *p = out->records;
  for (size_t i = 0; i < n; i++) {
    ts_stable_t *t = ts_stables_at(s->tables, (uint32_t)i);
    const ts_table_t *rows = ts_stable_rows(t);
    ts_stable_info_t info;
    ts_stable_info(t, &info);
    out->decls[i] = (Tessera__TableDecl *)ts_stable_decl(t);
    Tessera__CheckpointTable *ct = &out->ct[i];
    tessera__checkpoint_table__init(ct);
    ct->dim = rows->dim;
    ct->state_buffers = (uint32_t)ts_stable_nstate(t);
    ct->rows = 0;
    ct->version = info.version;
    ct->created = info.created;
    ct->evicted = info.evicted;
    ct->filtered = info.filtered;
    ct->pulled_rows = info.pulled_rows;
    ct->pushed_rows = info.pushed_rows;
    out->ctp[i] = ct;
    if (incremental) { /* the erased keys first: a key made again is in the rows after */
      size_t ntomb;
      const uint64_t *tomb = ts_stable_tombstones(t, &ntomb);
      if (ntomb) memcpy(p, tomb, ntomb * 8);
      p += ntomb * 8;
      ct->tombstones = ntomb;
    }
    size_t floats = rows->stride;
    uint32_t cursor = 0;
    for (uint32_t id; (id = ts_table_next(rows, &cursor)) != TS_TABLE_NONE;) {
      const ts_table_meta_t *m = ts_table_meta(rows, id);
      if (incremental && !ts_stable_row_changed(m)) continue;
      ct->rows++;
      const float *w = ts_table_row(rows, id);
      for (size_t j = 0; j < floats; j++)
        if (!isfinite(w[j])) {
          ts_errmsg_printf(errmsg, errlen,
                           "table '%s' key %llu holds NaN or Inf %s: not checkpointed (the "
                           "previous checkpoint is kept)",
                           info.name, (unsigned long long)m->key,
                           j < rows->dim ? "values" : "optimizer state");
          ts_ckpt_tables_free(out);
          return TS_ENONFINITE;
        }
      memcpy(p, &m->key, 8);
      memcpy(p + 8, &m->updates, 8);
      memcpy(p + 16, &m->last_step, 8);
      memcpy(p + REC_HEAD, w, floats * sizeof(float));
      p += REC_HEAD + floats * sizeof(float);
    }
  }
  ts_require(p == out->records + total); /* the walk saw every live row once */
  return 0;
}

void ts_ckpt_tables_fill(const ts_ckpt_tables_t *t, Tessera__CheckpointMeta *m) {
  if (t->n == 0) return;
  m->format = TS_CKPT_TABLES_FORMAT;
  m->n_tables = t->n;
  m->tables = t->decls;
  m->n_table_rows = t->n;
  m->table_rows = t->ctp;
}

void ts_ckpt_tables_free(ts_ckpt_tables_t *t) {
  ts_free(t->decls);
  ts_free(t->ct);
  ts_free(t->ctp);
  ts_free(t->records);
  memset(t, 0, sizeof *t);
}

bool ts_ckpt_tables_need_full(const ts_store_t *s) {
  for (uint32_t i = 0; i < s->num_tables; i++)
    if (ts_stable_tombstones_lost(ts_stables_at(s->tables, i))) return true;
  return false;
}

void ts_ckpt_tables_full_taken(ts_store_t *s) {
  for (uint32_t i = 0; i < s->num_tables; i++) ts_stable_full_taken(ts_stables_at(s->tables, i));
}

void ts_ckpt_tables_full_done(ts_store_t *s, bool written) {
  for (uint32_t i = 0; i < s->num_tables; i++)
    ts_stable_full_done(ts_stables_at(s->tables, i), written);
}

uint64_t ts_ckpt_tables_min_version(const ts_store_t *s, bool *any) {
  uint64_t v = UINT64_MAX;
  for (uint32_t i = 0; i < s->num_tables; i++) {
    uint64_t tv = ts_stable_version(ts_stables_at(s->tables, i));
    if (tv < v) v = tv;
  }
  *any = s->num_tables > 0;
  return *any ? v : 0;
}

uint64_t ts_ckpt_tables_changes(const ts_store_t *s) {
  uint64_t c = 0;
  for (uint32_t i = 0; i < s->num_tables; i++) {
    ts_stable_info_t info;
    ts_stable_info(ts_stables_at(s->tables, i), &info);
    c += info.version + info.created + info.evicted + info.pushed_rows;
  }
  return c;
}

/* --- the file's table section -------------------------------------------------------- */

bool ts_ckpt_tables_section_bytes(const Tessera__CheckpointMeta *m, uint64_t room,
                                  uint64_t *bytes) {
  *bytes = 0;
  if (m->format != TS_CKPT_TABLES_FORMAT)
    return m->n_tables == 0 && m->n_table_rows == 0 && m->base_sequence == 0;
  if (m->n_tables == 0 || m->n_tables != m->n_table_rows) return false;
  uint64_t sum = 0;
  for (size_t i = 0; i < m->n_tables; i++) {
    const Tessera__CheckpointTable *ct = m->table_rows[i];
    if (ct->dim == 0 || ct->dim > MAX_DIM || ct->dim != m->tables[i]->dim || ct->state_buffers > 2)
      return false;
    if (ct->tombstones && !m->base_sequence) return false; /* only increments have them */
    uint64_t rec = record_bytes(ct->dim, ct->state_buffers);
    /* no count beyond the file, and no sum that wraps */
    if (ct->rows > room / rec || ct->rows * rec > room - sum) return false;
    sum += ct->rows * rec;
    if (ct->tombstones > (room - sum) / 8) return false;
    sum += ct->tombstones * 8;
  }
  *bytes = sum;
  return true;
}

bool ts_ckpt_tables_same(const Tessera__CheckpointMeta *a, const Tessera__CheckpointMeta *b) {
  if (a->n_tables != b->n_tables) return false;
  bool same = true;
  for (size_t i = 0; i < a->n_tables && same; i++) {
    size_t la = tessera__table_decl__get_packed_size(a->tables[i]);
    size_t lb = tessera__table_decl__get_packed_size(b->tables[i]);
    if (la != lb) return false;
    uint8_t *x = ts_malloc(la), *y = ts_malloc(lb);
    if (x && y) {
      tessera__table_decl__pack(a->tables[i], x);
      tessera__table_decl__pack(b->tables[i], y);
      same = memcmp(x, y, la) == 0;
    } else {
      same = false;
    }
    ts_free(x);
    ts_free(y);
  }
  return same;
}

/* --- restoring ---------------------------------------------------------------------- */

int ts_ckpt_tables_read(ts_store_t *s, FILE *f, const Tessera__CheckpointMeta *m, bool merge,
                        bool *state_dropped, char *why, size_t whylen) {
  if (m->n_tables != s->num_tables) {
    ts_errmsg_printf(why, whylen, "holds %zu tables, the model declares %u", m->n_tables,
                     s->num_tables);
    return TS_EDATA;
  }
  if (m->n_tables == 0) return 0;
  /* The widest record of the file: dim and state buffers were checked (at most 4096 and 2)
   * when the file was opened, so this is at most 48 KiB. */
  size_t max = REC_HEAD;
  for (size_t i = 0; i < m->n_tables; i++) {
    size_t r = record_bytes(m->table_rows[i]->dim, m->table_rows[i]->state_buffers);
    if (r > max) max = r;
  }
  uint8_t *rec = ts_aligned_alloc(max);
  if (!rec) {
    ts_errmsg_printf(why, whylen, "out of memory");
    return TS_ENOMEM;
  }
  int rc = 0;
  for (size_t i = 0; i < m->n_tables && rc == 0; i++) {
    const Tessera__CheckpointTable *ct = m->table_rows[i];
    ts_stable_t *t = ts_stables_at(s->tables, (uint32_t)i);
    const char *name = ts_stable_name(t);
    if (ct->dim != ts_stable_dim(t)) {
      ts_errmsg_printf(why, whylen, "table '%s' has width %u in the file, %u declared", name,
                       ct->dim, ts_stable_dim(t));
      rc = TS_EDATA;
      break;
    }
    /* An increment's erased keys go first (a key made again is among its rows). */
    bool incr = m->base_sequence != 0;
    for (uint64_t r = 0; r < ct->tombstones && rc == 0; r++) {
      uint64_t key;
      if (fread(&key, 1, 8, f) != 8) {
        ts_errmsg_printf(why, whylen, "truncated while reading table '%s'", name);
        rc = TS_EDATA;
      } else if (!merge || ts_key_shard(key, s->num_shards) == s->shard) {
        ts_stable_forget(t, key);
      }
    }
    if (rc < 0) break;
    /* This shard's own full file must fit whole: refused before a row is read. */
    uint64_t need = ts_table_row_bytes(ct->dim, (uint32_t)ts_stable_nstate(t));
    const ts_stable_budget_t *b = &s->table_budget;
    uint64_t room = b->max_bytes > b->bytes ? b->max_bytes - b->bytes : 0;
    if (!merge && !incr && ct->rows > room / need) {
      ts_errmsg_printf(why, whylen,
                       "table '%s' holds %llu rows, more than server.max_table_bytes %llu "
                       "leaves room for",
                       name, (unsigned long long)ct->rows,
                       (unsigned long long)s->table_budget.max_bytes);
      rc = TS_ETOOBIG;
      break;
    }
    if (ct->state_buffers != (uint32_t)ts_stable_nstate(t)) *state_dropped = true;
    size_t rb = record_bytes(ct->dim, ct->state_buffers);
    for (uint64_t r = 0; r < ct->rows && rc == 0; r++) {
      if (fread(rec, 1, rb, f) != rb) {
        ts_errmsg_printf(why, whylen, "truncated while reading table '%s'", name);
        rc = TS_EDATA;
        break;
      }
      uint64_t key, updates, last_step;
      memcpy(&key, rec, 8);
      memcpy(&updates, rec + 8, 8);
      memcpy(&last_step, rec + 16, 8);
      if (ts_key_shard(key, m->num_shards) != m->shard) {
        ts_errmsg_printf(why, whylen, "table '%s' key %llu is not a key of shard %u of %u", name,
                         (unsigned long long)key, m->shard, m->num_shards);
        rc = TS_EDATA;
        break;
      }
      if (merge && ts_key_shard(key, s->num_shards) != s->shard) continue;
      size_t nf = (rb - REC_HEAD) / sizeof(float), at;
      float v = 0;
      for (at = 0; at < nf; at++) {
        memcpy(&v, rec + REC_HEAD + at * sizeof(float), sizeof v);
        if (!isfinite(v)) break;
      }
      if (at < nf) {
        ts_errmsg_printf(why, whylen, "table '%s' key %llu %s element %zu is %s", name,
                         (unsigned long long)key, at < ct->dim ? "value" : "optimizer state",
                         ct->dim ? at % ct->dim : at, isnan(v) ? "NaN" : "Inf");
        rc = TS_EDATA;
        break;
      }
      rc = ts_stable_restore_row(t, &s->table_budget, key, updates, last_step,
                                 (const float *)(rec + REC_HEAD), (int)ct->state_buffers, incr, why,
                                 whylen);
    }
    if (rc < 0) break;
    ts_stable_info_t info = {.version = ct->version,
                             .created = ct->created,
                             .evicted = ct->evicted,
                             .filtered = ct->filtered,
                             .pulled_rows = ct->pulled_rows,
                             .pushed_rows = ct->pushed_rows};
    if (merge) {
      /* Re-sharded: the rows are another mix; the version is the newest shard's. */
      ts_stable_info(t, &info);
      if (ct->version > info.version) info.version = ct->version;
    }
    ts_stable_restore_counters(t, &info);
  }
  ts_free(rec);
  return rc;
}
