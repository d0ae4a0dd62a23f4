/*
 * The store's embedding tables (ts_store_table.h): a Declare's TableDecl made into a row
 * table with its optimizer, admission policy and sketch, compared with a later Declare;
 * and what requests do to its rows: pulls read (and make) rows, async pushes apply row
 * gradients at once, sync pushes sum them per key into an accumulator that the step's
 * close applies once, divided by the number of gradients the step aggregated.
 *
 * Memory. Every row made, and every accumulator row, is first checked against the shard's
 * budget (server.max_table_bytes, ts_stable_budget_t) with what the insert would allocate
 * (ts_table_insert_cost: a new slab, a larger index), so the tables never hold more than
 * it; a large table's next index, made ahead of its grow, is counted from its start. A
 * table at its budget or at max_rows makes room by evicting an approximately least
 * recently used row (ts_admit_evict_lru: a hand sweeping the rows, and random samples);
 * the freed slot takes the new row, so a table that reached the budget streams keys
 * through without growing. A table whose rows cannot make room (it holds none) serves a
 * pull the initialiser's row without storing it, and drops a gradient (counted filtered),
 * as for a key not admitted.
 *
 * Recency is the table's version: a row's last_step is the version when it was last pulled
 * or updated, which is what the LRU sample compares and steps_to_live counts in.
 */
#include "ts_store_table.h"

#include <math.h>
#include <string.h>

#include "ts_admit.h"
#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_init.h"
#include "ts_hotkeys.h"
#include "ts_key.h"
#include "ts_rowopt.h"
#include "ts_table.h"

/* Counters per row of the count-min sketch (4 rows of 16-bit counters: 128 KiB a table). */
#define SKETCH_WIDTH (1u << 14)
/* Rows sampled to pick an LRU victim. */
#define LRU_SAMPLE 8
/* Evictions tried to make room for one row before giving up on it. */
#define MAX_EVICT_TRIES 8
/* One pulled key in this many feeds the hottest keys' summary. */
#define HOT_SAMPLE 16

struct ts_stable {
  char *name;
  Tessera__TableDecl decl; /* as declared (name: ours), for a later Declare's comparison */
  ts_table_t rows;
  ts_rowopt_t opt;
  int nstate;
  ts_admit_policy_t policy;
  ts_admit_sketch_t sketch;
  ts_admit_pool_t pool; /* the LRU victims' candidates */
  bool has_sketch;
  uint64_t table_key; /* ts_init_key(seed, name): the initialiser's stream */
  uint64_t version;
  uint64_t created, evicted, filtered, pulled, pushed;
  uint32_t expire_cursor;
  ts_hotkeys_t hot; /* the keys pulled most of late */
  /* incremental checkpoints: erased keys, the first tomb_pending of them before the full
   * checkpoint being written; lost: some were not kept (the next checkpoint is full) */
  uint64_t *tomb;
  size_t ntomb, tomb_cap, tomb_pending;
  bool tomb_lost, tomb_lost_taken;
  /* sync */
  bool sync;
  uint32_t num_workers;
  ts_table_t accum;
  uint8_t *contributed;
  uint32_t have;
  /* tasks whose push for the step is in part only (its frame still being read, or its
   * connection lost): their records are each a key's whole gradient, so if the step closes
   * before the rest comes they count as having pushed those keys (ts_stable_sync_complete) */
  uint8_t *partial;
  uint32_t npartial;
  uint64_t opened_ms;
};

/* --- declaring --------------------------------------------------------------------- */

static const char *opt_name(Tessera__RowOptimizer o) {
  switch (o) {
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD:
      return "sgd";
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD:
      return "adagrad";
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM:
      return "adam";
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_FTRL:
      return "ftrl";
    default:
      return "default";
  }
}

/* The row optimizer of decl t under the job's optimizer. */
static int row_optimizer(const Tessera__TableDecl *t, const ts_optim_t *job, ts_rowopt_t *o,
                         char *errmsg, size_t errlen) {
  ts_rowopt_kind_t kind;
  bool from_job = false;
  switch (t->optimizer) {
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD:
      kind = TS_ROWOPT_SGD;
      break;
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAGRAD:
      kind = TS_ROWOPT_ADAGRAD;
      break;
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_ADAM:
      kind = TS_ROWOPT_ADAM;
      break;
    case TESSERA__ROW_OPTIMIZER__ROW_OPT_FTRL:
      kind = TS_ROWOPT_FTRL;
      break;
    default:
      from_job = true;
      if (job->kind == TS_OPT_SGD) {
        kind = TS_ROWOPT_SGD;
      } else if (job->kind == TS_OPT_ADAM) {
        kind = TS_ROWOPT_ADAM;
      } else {
        ts_errmsg_printf(errmsg, errlen,
                         "table '%s' takes the job's optimizer (%s), which has no row-wise "
                         "form: name a row optimizer for it (sgd, adagrad, adam or ftrl)",
                         t->name, ts_optimizer_name(job->kind));
        return TS_ECONFIG;
      }
  }
  ts_rowopt_defaults(o, kind, t->learning_rate > 0 ? (float)t->learning_rate : job->lr);
  if (from_job && kind == TS_ROWOPT_ADAM) {
    o->beta1 = job->beta1;
    o->beta2 = job->beta2;
    o->epsilon = job->epsilon;
  }
  if (t->beta1 > 0) o->beta1 = (float)t->beta1;
  if (t->beta2 > 0) o->beta2 = (float)t->beta2;
  if (t->epsilon > 0) o->epsilon = (float)t->epsilon;
  if (t->initial_accumulator > 0) o->initial_accumulator = (float)t->initial_accumulator;
  o->l1 = (float)t->l1;
  o->l2 = (float)t->l2;
  o->beta = (float)t->beta;
  return 0;
}

static void stable_free(ts_stable_t *t) {
  ts_table_free(&t->rows);
  ts_table_free(&t->accum);
  if (t->has_sketch) ts_admit_sketch_free(&t->sketch);
  ts_free(t->contributed);
  ts_free(t->partial);
  ts_free(t->tomb);
  ts_free(t->name);
}

void ts_stables_free(ts_stable_t *t, uint32_t n) {
  for (uint32_t i = 0; t && i < n; i++) stable_free(&t[i]);
  ts_free(t);
}

static int stable_make(ts_stable_t *t, const Tessera__TableDecl *d, uint64_t seed, bool sync,
                       const ts_optim_t *job, uint32_t num_workers, char *errmsg, size_t errlen) {
  int rc = row_optimizer(d, job, &t->opt, errmsg, errlen);
  if (rc < 0) return rc;
  t->nstate = ts_rowopt_state_buffers(&t->opt);
  t->name = ts_strdup(d->name);
  if (!t->name) goto nomem;
  t->decl = *d;
  t->decl.name = t->name;
  t->decl.base.unknown_fields = NULL;
  t->decl.base.n_unknown_fields = 0;
  if (ts_table_init(&t->rows, d->dim, (uint32_t)t->nstate, d->max_rows) < 0 ||
      ts_table_init(&t->accum, d->dim, 0, 0) < 0) {
    ts_errmsg_printf(errmsg, errlen, "table '%s': width %u is not a row width", d->name, d->dim);
    return TS_EINVAL;
  }
  t->table_key = ts_init_key(seed, d->name);
  t->policy.admit_count = d->admit_count;
  t->policy.admit_probability =
      d->admit_probability > 0 && d->admit_probability < 1 ? d->admit_probability : 1.0;
  t->policy.steps_to_live = d->steps_to_live;
  t->policy.sample = LRU_SAMPLE;
  t->policy.seed = t->table_key;
  ts_hotkeys_init(&t->hot, HOT_SAMPLE);
  if (d->admit_count > 1) {
    if (ts_admit_sketch_init(&t->sketch, SKETCH_WIDTH, t->table_key) < 0) goto nomem;
    t->has_sketch = true;
  }
  t->sync = sync;
  t->num_workers = num_workers ? num_workers : 1;
  if (sync && (!(t->contributed = ts_calloc(t->num_workers, 1)) ||
               !(t->partial = ts_calloc(t->num_workers, 1))))
    goto nomem;
  return 0;
nomem:
  ts_errmsg_printf(errmsg, errlen, "out of memory for table '%s'", d->name);
  return TS_ENOMEM;
}

int ts_stables_make(const Tessera__Declare *d, bool sync, const ts_optim_t *job,
                    uint32_t num_workers, ts_stable_t **out, char *errmsg, size_t errlen) {
  *out = NULL;
  if (d->n_tables == 0) return 0;
  for (size_t i = 0; i < d->n_tables; i++)
    for (size_t k = 0; k < i; k++)
      if (strcmp(d->tables[k]->name, d->tables[i]->name) == 0) {
        ts_errmsg_printf(errmsg, errlen, "table '%s' is declared twice (tables %zu and %zu)",
                         d->tables[i]->name, k, i);
        return TS_ESHAPE;
      }
  ts_stable_t *t = ts_calloc(d->n_tables, sizeof *t);
  if (!t) {
    ts_errmsg_printf(errmsg, errlen, "out of memory for %zu tables", d->n_tables);
    return TS_ENOMEM;
  }
  for (size_t i = 0; i < d->n_tables; i++) {
    int rc = stable_make(&t[i], d->tables[i], d->seed, sync, job, num_workers, errmsg, errlen);
    if (rc < 0) {
      ts_stables_free(t, (uint32_t)d->n_tables);
      return rc;
    }
  }
  *out = t;
  return 0;
}

int ts_stables_same(const ts_stable_t *t, uint32_t n, const Tessera__Declare *d, char *errmsg,
                    size_t errlen) {
  if (d->n_tables != n) {
    ts_errmsg_printf(errmsg, errlen, "model already declared with %u tables, not %zu", n,
                     d->n_tables);
    return TS_ESHAPE;
  }
  for (uint32_t i = 0; i < n; i++) {
    const Tessera__TableDecl *a = &t[i].decl, *b = d->tables[i];
    const char *what = NULL;
    char buf[96];
    if (strcmp(a->name, b->name) != 0) {
      ts_errmsg_printf(errmsg, errlen, "table %u is already declared as '%s', not '%s'", i,
                       a->name, b->name);
      return TS_ESHAPE;
    }
    if (a->dim != b->dim) {
      ts_errmsg_printf(buf, sizeof buf, "width %u, not %u", a->dim, b->dim);
      what = buf;
    } else if (a->init != b->init || a->init_param != b->init_param) {
      what = "another initializer";
    } else if (a->optimizer != b->optimizer) {
      ts_errmsg_printf(buf, sizeof buf, "optimizer %s, not %s", opt_name(a->optimizer),
                       opt_name(b->optimizer));
      what = buf;
    } else if (a->learning_rate != b->learning_rate || a->beta1 != b->beta1 ||
               a->beta2 != b->beta2 || a->epsilon != b->epsilon ||
               a->initial_accumulator != b->initial_accumulator || a->l1 != b->l1 ||
               a->l2 != b->l2 || a->beta != b->beta) {
      what = "other optimizer settings";
    } else if (a->admit_count != b->admit_count || a->admit_probability != b->admit_probability) {
      what = "another admission policy";
    } else if (a->steps_to_live != b->steps_to_live || a->max_rows != b->max_rows) {
      what = "another eviction policy (steps_to_live, max_rows)";
    }
    if (what) {
      ts_errmsg_printf(errmsg, errlen, "table '%s' is already declared with %s", a->name, what);
      return TS_ESHAPE;
    }
  }
  return 0;
}

ts_stable_t *ts_stables_at(ts_stable_t *t, uint32_t i) { return &t[i]; }
uint32_t ts_stable_dim(const ts_stable_t *t) { return t->rows.dim; }
uint64_t ts_stable_version(const ts_stable_t *t) { return t->version; }
const char *ts_stable_name(const ts_stable_t *t) { return t->name; }

uint64_t ts_stable_bytes(const ts_stable_t *t) {
  uint64_t b = ts_table_bytes(&t->rows) + ts_table_bytes(&t->accum);
  if (t->has_sketch) b += (uint64_t)TS_ADMIT_SKETCH_DEPTH * t->sketch.width * sizeof(uint16_t);
  return b + (t->contributed ? 2 * (uint64_t)t->num_workers : 0);
}

void ts_stable_info(const ts_stable_t *t, ts_stable_info_t *info) {
  info->name = t->name;
  info->dim = t->rows.dim;
  info->rows = t->rows.size;
  info->bytes = ts_stable_bytes(t);
  info->version = t->version;
  info->created = t->created;
  info->evicted = t->evicted;
  info->filtered = t->filtered;
  info->pulled_rows = t->pulled;
  info->pushed_rows = t->pushed;
  ts_hotkey_t top[TS_STABLE_HOT_KEYS];
  info->num_hot = (uint32_t)ts_hotkeys_top(&t->hot, top, TS_STABLE_HOT_KEYS);
  for (uint32_t i = 0; i < info->num_hot; i++) info->hot[i] = top[i].key;
  info->hot_share = ts_hotkeys_share(&t->hot, TS_STABLE_HOT_KEYS);
}

void ts_stable_decay_hot(ts_stable_t *t) { ts_hotkeys_decay(&t->hot); }

/* --- keys -------------------------------------------------------------------------- */

/* A key as the wire has it: 8 bytes, little-endian (every host the shard builds for is). */
static inline uint64_t load_key(const void *p) {
  uint64_t k;
  memcpy(&k, p, sizeof k);
  return k;
}

int ts_stable_check_keys(const void *keys, size_t stride, size_t n, uint64_t *prev, bool *have_prev,
                         uint32_t shard, uint32_t num_shards, uint64_t base, char *errmsg,
                         size_t errlen) {
  const char *p = keys;
  for (size_t i = 0; i < n; i++, p += stride) {
    uint64_t k = load_key(p);
    if (*have_prev && k <= *prev) {
      ts_errmsg_printf(errmsg, errlen,
                       "keys not strictly ascending at index %llu (key %llu after %llu)",
                       (unsigned long long)(base + i), (unsigned long long)k,
                       (unsigned long long)*prev);
      return TS_EINVAL;
    }
    uint32_t home = ts_key_shard(k, num_shards);
    if (home != shard) {
      ts_errmsg_printf(errmsg, errlen, "key %llu at index %llu belongs to shard %u, not %u",
                       (unsigned long long)k, (unsigned long long)(base + i), home, shard);
      return TS_EINVAL;
    }
    *prev = k;
    *have_prev = true;
  }
  return 0;
}

/* --- rows -------------------------------------------------------------------------- */

/* A row of t's was erased: its key is kept for the next incremental checkpoint. */
static void tomb_add(ts_stable_t *t, const ts_stable_budget_t *b, uint64_t key) {
  if (!b->track || t->tomb_lost) return;
  if (t->ntomb == t->tomb_cap) {
    size_t cap = t->tomb_cap ? 2 * t->tomb_cap : 256;
    uint64_t *n = cap <= TS_STABLE_MAX_TOMBSTONES ? ts_realloc(t->tomb, cap * sizeof *n) : NULL;
    if (!n) {
      t->tomb_lost = true;
      return;
    }
    t->tomb = n;
    t->tomb_cap = cap;
  }
  t->tomb[t->ntomb++] = key;
}

/* Whether cost more bytes of tab fit the budget: the accumulator's anywhere in it, rows
 * only where they leave the steps' gradient sums their room (b->accum_room). */
static bool fits(const ts_stable_t *t, const ts_stable_budget_t *b, const ts_table_t *tab,
                 uint64_t cost) {
  if (b->bytes + cost > b->max_bytes) return false;
  if (tab == &t->accum || b->accum_room == 0) return true;
  return b->bytes - b->accum_bytes + cost + b->accum_room <= b->max_bytes;
}

/* The row of key in tab (t's rows or its accumulator), made within the budget: the rows
 * table makes room by evicting its least recently used rows; the accumulator does not
 * (its rows are the step's gradients). TS_TABLE_NONE when there is no room. */
static uint32_t new_row(ts_stable_t *t, ts_stable_budget_t *b, ts_table_t *tab, uint64_t key) {
  for (int tries = 0;; tries++) {
    bool full = tab->size >= tab->max_rows;
    uint64_t cost = ts_table_insert_cost(tab);
    if (!full && fits(t, b, tab, cost)) break;
    /* The rows table's next index, made ahead while there was room, gives way first: the
     * budget is for rows (and a step's gradients), the index is only early. */
    if (!full && t->rows.next_index) {
      b->bytes -= ts_table_drop_next(&t->rows);
      continue;
    }
    uint64_t victim;
    if (tab != &t->rows || tries >= MAX_EVICT_TRIES ||
        !ts_admit_evict_lru(&t->policy, &t->rows, &t->pool, &b->rng, t->version, &victim))
      return TS_TABLE_NONE;
    tomb_add(t, b, victim);
    t->evicted++;
  }
  uint64_t before = ts_table_bytes(tab);
  bool created;
  int err;
  uint32_t id = ts_table_insert(tab, key, &created, &err);
  /* A large rows table's next index is made ahead when the budget has room for it and for
   * the rows before the grow as well: the grow then only moves the entries
   * (ts_table_prepare_grow), and a table near its budget holds as many rows as without. */
  uint64_t room = tab == &t->rows ? ts_table_prepare_room(tab) : 0;
  if (room && fits(t, b, tab, (ts_table_bytes(tab) - before) + room)) ts_table_prepare_grow(tab);
  b->bytes += ts_table_bytes(tab) - before;
  if (tab == &t->accum) b->accum_bytes += ts_table_bytes(tab) - before;
  return id;
}

/* A new row of the rows table: its first value and optimizer state. */
static void init_row(ts_stable_t *t, uint32_t id, uint64_t key) {
  float *w = ts_table_row(&t->rows, id);
  size_t dim = t->rows.dim;
  ts_key_row_init(w, dim, (ts_key_init_t)t->decl.init, t->decl.init_param, t->table_key, key);
  ts_rowopt_init_state(&t->opt, t->nstate >= 1 ? w + dim : NULL, t->nstate >= 2 ? w + 2 * dim : NULL,
                       dim);
  ts_table_meta_t *m = ts_table_meta(&t->rows, id);
  m->last_step = t->version;
  m->updates = 0;
  m->count |= TS_STABLE_DIRTY;
  t->created++;
}

/* How far ahead a loop over keys prefetches their index slots, and then their rows (the
 * slot loaded by then): a lookup's misses overlap the work on the keys before it. */
#define PREFETCH_SLOT 32
#define PREFETCH_ROW 16

void ts_stable_peek(ts_stable_t *t, const uint64_t *keys, size_t n, float *out) {
  size_t dim = t->rows.dim;
  for (size_t i = 0; i < n; i++, out += dim) {
    if (i + PREFETCH_SLOT < n) ts_table_prefetch_slot(&t->rows, ts_key_hash(keys[i + PREFETCH_SLOT]));
    if (i + PREFETCH_ROW < n) ts_table_prefetch_row(&t->rows, ts_key_hash(keys[i + PREFETCH_ROW]));
    uint32_t id = ts_table_find(&t->rows, keys[i]);
    if (id == TS_TABLE_NONE)
      ts_key_row_init(out, dim, (ts_key_init_t)t->decl.init, t->decl.init_param, t->table_key,
                      keys[i]);
    else
      memcpy(out, ts_table_row(&t->rows, id), dim * sizeof(float));
  }
  t->pulled += n;
}

/* A pull of key k, whose row is id (TS_TABLE_NONE: it has none), into out, touching the row
 * at `version`: a key without a row counts a sighting and is made when admitted, else gets
 * the initialiser's row without being stored. */
static void pull_row(ts_stable_t *t, ts_stable_budget_t *b, uint64_t k, uint32_t id,
                     uint64_t version, float *out) {
  size_t dim = t->rows.dim;
  ts_hotkeys_see(&t->hot, k);
  if (id == TS_TABLE_NONE && ts_admit_key(&t->policy, t->has_sketch ? &t->sketch : NULL, k)) {
    id = new_row(t, b, &t->rows, k);
    if (id != TS_TABLE_NONE) init_row(t, id, k);
  }
  if (id == TS_TABLE_NONE) {
    ts_key_row_init(out, dim, (ts_key_init_t)t->decl.init, t->decl.init_param, t->table_key, k);
    return;
  }
  memcpy(out, ts_table_row(&t->rows, id), dim * sizeof(float));
  ts_table_meta_t *m = ts_table_meta(&t->rows, id);
  if (m->last_step != version) m->count |= TS_STABLE_DIRTY; /* its recency changed */
  m->last_step = version;
}

void ts_stable_pull(ts_stable_t *t, ts_stable_budget_t *b, const uint64_t *keys, size_t n,
                    float *out) {
  size_t dim = t->rows.dim;
  for (size_t i = 0; i < n; i++, out += dim) {
    if (i + PREFETCH_SLOT < n) ts_table_prefetch_slot(&t->rows, ts_key_hash(keys[i + PREFETCH_SLOT]));
    if (i + PREFETCH_ROW < n) ts_table_prefetch_row(&t->rows, ts_key_hash(keys[i + PREFETCH_ROW]));
    pull_row(t, b, keys[i], ts_table_find(&t->rows, keys[i]), t->version, out);
  }
  t->pulled += n;
}

/* The row of key for a gradient: there, or made when key is admissible without a sighting
 * (admission by count needs pulls first); TS_TABLE_NONE: the gradient is dropped. */
static uint32_t grad_row(ts_stable_t *t, ts_stable_budget_t *b, uint64_t k) {
  uint32_t id = ts_table_find(&t->rows, k);
  if (id != TS_TABLE_NONE) return id;
  if (t->policy.admit_count > 1 || !ts_admit_key(&t->policy, NULL, k)) return TS_TABLE_NONE;
  id = new_row(t, b, &t->rows, k);
  if (id != TS_TABLE_NONE) init_row(t, id, k);
  return id;
}

/* One update of row id with gradient g times scale. */
static void update_row(ts_stable_t *t, uint32_t id, const float *g, float scale) {
  size_t dim = t->rows.dim;
  float *w = ts_table_row(&t->rows, id);
  ts_table_meta_t *m = ts_table_meta(&t->rows, id);
  m->updates++;
  m->last_step = t->version;
  m->count |= TS_STABLE_DIRTY;
  ts_rowopt_apply(&t->opt, w, g, scale, dim, t->nstate >= 1 ? w + dim : NULL,
                  t->nstate >= 2 ? w + 2 * dim : NULL, m->updates);
}

void ts_stable_apply_pull(ts_stable_t *t, ts_stable_budget_t *b, const float *records, size_t n,
                          uint64_t *rows, uint64_t *filtered, float *out) {
  size_t dim = t->rows.dim, rec = 2 + dim; /* floats per record: the key is two */
  for (size_t i = 0; i < n; i++, records += rec) {
    if (i + PREFETCH_SLOT < n)
      ts_table_prefetch_slot(&t->rows, ts_key_hash(load_key(records + PREFETCH_SLOT * rec)));
    if (i + PREFETCH_ROW < n)
      ts_table_prefetch_row(&t->rows, ts_key_hash(load_key(records + PREFETCH_ROW * rec)));
    uint64_t k = load_key(records);
    uint32_t id = grad_row(t, b, k);
    if (id == TS_TABLE_NONE) {
      t->filtered++;
      (*filtered)++;
    } else {
      update_row(t, id, records + 2, 1.0f);
      t->pushed++;
      (*rows)++;
    }
    /* The pull behind the push would read the row after the push's ts_stable_bump. */
    if (out) pull_row(t, b, k, id, t->version + 1, out + i * dim);
  }
  if (out) t->pulled += n;
}

void ts_stable_apply(ts_stable_t *t, ts_stable_budget_t *b, const float *records, size_t n,
                     uint64_t *rows, uint64_t *filtered) {
  ts_stable_apply_pull(t, b, records, n, rows, filtered, NULL);
}

void ts_stable_bump(ts_stable_t *t) { t->version++; }

/* --- sync -------------------------------------------------------------------------- */

int ts_stable_sync_state(const ts_stable_t *t, int task, uint64_t step) {
  if (step < t->version) return TESSERA__PUSH_RESULT__PUSH_STALE;
  if (step > t->version) return TS_EFUTURE;
  if (task >= 0 && (uint32_t)task < t->num_workers && t->contributed[task])
    return TESSERA__PUSH_RESULT__PUSH_DUPLICATE;
  return TESSERA__PUSH_RESULT__PUSH_ACCUMULATED;
}

void ts_stable_accumulate(ts_stable_t *t, ts_stable_budget_t *b, int task, const float *records,
                          size_t n, uint64_t *rows, uint64_t *filtered) {
  size_t dim = t->rows.dim, rec = 2 + dim;
  if (n && task >= 0 && (uint32_t)task < t->num_workers && !t->contributed[task] &&
      !t->partial[task]) {
    t->partial[task] = 1;
    t->npartial++;
  }
  for (size_t i = 0; i < n; i++, records += rec) {
    uint64_t k = load_key(records);
    /* a key summed already needs no room (a new slab's cost must not drop it) */
    uint32_t id = ts_table_find(&t->accum, k);
    if (id == TS_TABLE_NONE && (ts_table_find(&t->rows, k) != TS_TABLE_NONE ||
                                (t->policy.admit_count <= 1 && ts_admit_key(&t->policy, NULL, k))))
      id = new_row(t, b, &t->accum, k);
    if (id == TS_TABLE_NONE) {
      t->filtered++;
      (*filtered)++;
      continue;
    }
    float *acc = ts_table_row(&t->accum, id);
    const float *g = records + 2;
    for (size_t j = 0; j < dim; j++) acc[j] += g[j];
    (*rows)++;
  }
}

void ts_stable_contribute(ts_stable_t *t, int task, uint64_t now_ms) {
  ts_require(task >= 0 && (uint32_t)task < t->num_workers && !t->contributed[task]);
  if (t->have == 0) t->opened_ms = now_ms;
  t->contributed[task] = 1;
  t->have++;
  if (t->partial[task]) {
    t->partial[task] = 0;
    t->npartial--;
  }
}

uint32_t ts_stable_sync_count(const ts_stable_t *t) { return t->have; }
uint32_t ts_stable_sync_partial(const ts_stable_t *t) { return t->npartial; }
const uint8_t *ts_stable_contributed(const ts_stable_t *t) { return t->contributed; }
uint64_t ts_stable_opened_ms(const ts_stable_t *t) { return t->opened_ms; }

void ts_stable_sync_complete(ts_stable_t *t, ts_stable_budget_t *b) {
  ts_require(t->have > 0);
  float scale = 1.0f / (float)(t->have + t->npartial);
  uint32_t cursor = 0;
  for (uint32_t a; (a = ts_table_next(&t->accum, &cursor)) != TS_TABLE_NONE;) {
    uint64_t k = ts_table_meta(&t->accum, a)->key;
    uint32_t id = grad_row(t, b, k);
    if (id == TS_TABLE_NONE) { /* evicted since, and no room to make it again */
      t->filtered++;
      continue;
    }
    update_row(t, id, ts_table_row(&t->accum, a), scale);
    t->pushed++;
  }
  uint64_t before = ts_table_bytes(&t->accum);
  ts_table_free(&t->accum); /* keeps its shape: the next step's */
  b->bytes -= before - ts_table_bytes(&t->accum);
  b->accum_bytes -= before - ts_table_bytes(&t->accum);
  memset(t->contributed, 0, t->num_workers);
  memset(t->partial, 0, t->num_workers);
  t->have = t->npartial = 0;
  t->version++;
}

size_t ts_stable_expire(ts_stable_t *t, ts_stable_budget_t *b, size_t budget) {
  /* erased rows keep their slab: the bytes stay until the table is dropped */
  if (t->policy.steps_to_live == 0 || t->rows.size == 0) return 0;
  if (budget > t->rows.next_row) budget = t->rows.next_row;
  uint64_t *keys = b->track && !t->tomb_lost ? ts_malloc(budget * sizeof *keys) : NULL;
  if (b->track && !keys) t->tomb_lost = true;
  size_t n = ts_admit_expire(&t->policy, &t->rows, t->version, &t->expire_cursor, budget, keys);
  for (size_t i = 0; keys && i < n; i++) tomb_add(t, b, keys[i]);
  ts_free(keys);
  t->evicted += n;
  return n;
}

/* --- checkpoints ------------------------------------------------------------------- */

const Tessera__TableDecl *ts_stable_decl(const ts_stable_t *t) { return &t->decl; }
const ts_table_t *ts_stable_rows(const ts_stable_t *t) { return &t->rows; }
int ts_stable_nstate(const ts_stable_t *t) { return t->nstate; }

int ts_stable_restore_row(ts_stable_t *t, ts_stable_budget_t *b, uint64_t key, uint64_t updates,
                          uint64_t last_step, const float *floats, int file_nstate, bool replace,
                          char *errmsg, size_t errlen) {
  ts_table_t *tab = &t->rows;
  if (ts_table_find(tab, key) != TS_TABLE_NONE) {
    if (!replace) {
      ts_errmsg_printf(errmsg, errlen, "table '%s': key %llu is listed twice", t->name,
                       (unsigned long long)key);
      return TS_EDATA;
    }
    ts_table_erase(tab, key); /* its slot is reused just below: no room needed */
  }
  if (tab->size >= tab->max_rows || b->bytes + ts_table_insert_cost(tab) > b->max_bytes) {
    ts_errmsg_printf(errmsg, errlen,
                     "table '%s': %zu rows restored, the next does not fit max_rows %llu or "
                     "server.max_table_bytes %llu (%llu bytes held by tables)",
                     t->name, tab->size, (unsigned long long)tab->max_rows,
                     (unsigned long long)b->max_bytes, (unsigned long long)b->bytes);
    return TS_ETOOBIG;
  }
  uint64_t before = ts_table_bytes(tab);
  bool created;
  int err = 0;
  uint32_t id = ts_table_insert(tab, key, &created, &err);
  if (id == TS_TABLE_NONE) {
    ts_errmsg_printf(errmsg, errlen, "table '%s': cannot make the row of key %llu%s", t->name,
                     (unsigned long long)key, err == TS_ENOMEM ? ": out of memory" : "");
    return err == TS_ENOMEM ? TS_ENOMEM : TS_ETOOBIG;
  }
  b->bytes += ts_table_bytes(tab) - before;
  float *w = ts_table_row(tab, id);
  ts_table_meta_t *m = ts_table_meta(tab, id);
  size_t dim = tab->dim;
  if (file_nstate == t->nstate) {
    memcpy(w, floats, tab->stride * sizeof(float));
  } else {
    memcpy(w, floats, dim * sizeof(float));
    ts_rowopt_init_state(&t->opt, t->nstate >= 1 ? w + dim : NULL,
                         t->nstate >= 2 ? w + 2 * dim : NULL, dim);
    updates = 0;
  }
  m->updates = updates;
  m->last_step = last_step;
  return 0;
}

void ts_stable_forget(ts_stable_t *t, uint64_t key) { ts_table_erase(&t->rows, key); }

const uint64_t *ts_stable_tombstones(const ts_stable_t *t, size_t *n) {
  *n = t->ntomb;
  return t->tomb;
}

bool ts_stable_tombstones_lost(const ts_stable_t *t) { return t->tomb_lost; }

void ts_stable_full_taken(ts_stable_t *t) {
  uint32_t cursor = 0;
  for (uint32_t id; (id = ts_table_next(&t->rows, &cursor)) != TS_TABLE_NONE;) {
    ts_table_meta_t *m = ts_table_meta(&t->rows, id);
    if (m->count & TS_STABLE_DIRTY) m->count = (m->count & ~TS_STABLE_DIRTY) | TS_STABLE_PENDING;
  }
  t->tomb_pending = t->ntomb;
  t->tomb_lost_taken = t->tomb_lost;
  t->tomb_lost = false; /* the full checkpoint holds what was lost */
}

void ts_stable_full_done(ts_stable_t *t, bool written) {
  uint32_t cursor = 0;
  for (uint32_t id; (id = ts_table_next(&t->rows, &cursor)) != TS_TABLE_NONE;) {
    ts_table_meta_t *m = ts_table_meta(&t->rows, id);
    if (!(m->count & TS_STABLE_PENDING)) continue;
    m->count &= ~TS_STABLE_PENDING;
    if (!written) m->count |= TS_STABLE_DIRTY;
  }
  size_t p = t->tomb_pending <= t->ntomb ? t->tomb_pending : t->ntomb;
  if (written) {
    if (p > 0) memmove(t->tomb, t->tomb + p, (t->ntomb - p) * sizeof *t->tomb);
    t->ntomb -= p;
  } else {
    t->tomb_lost = t->tomb_lost || t->tomb_lost_taken;
  }
  t->tomb_pending = 0;
  t->tomb_lost_taken = false;
}

void ts_stable_restore_counters(ts_stable_t *t, const ts_stable_info_t *info) {
  t->version = info->version;
  t->created = info->created;
  t->evicted = info->evicted;
  t->filtered = info->filtered;
  t->pulled = info->pulled_rows;
  t->pushed = info->pushed_rows;
}
