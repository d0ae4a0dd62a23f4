/* psctl export --from-checkpoint (psctl_export.h): the job's state out of checkpoint.dir. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psctl_ckpt.h"
#include "psctl_export_int.h"
#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_err.h"
#include "ts_store.h"

/* Dense tensor t of s, gathered from the partitions that hold it (all of them: s is the
 * one shard of its layout). */
static int add_tensor(const ts_store_t *s, uint32_t t, psctl_entries_t *es) {
  const ts_tensor_t *x = &s->tensors[t];
  float *v = x->rank <= PSCTL_WEIGHTS_MAX_RANK ? ts_calloc(x->elems ? x->elems : 1, sizeof *v) : NULL;
  psctl_weights_entry_t *e = v ? psctl_entries_add(es) : NULL;
  if (!e) {
    ts_free(v);
    fprintf(stderr, "psctl: export: out of memory (or tensor %s of rank %zu)\n", x->name, x->rank);
    return TS_EXIT_FAILURE;
  }
  es->owned[es->n - 1] = v;
  *e = (psctl_weights_entry_t){.name = x->name, .dtype = PSCTL_DT_F32, .rank = x->rank, .data = v};
  memcpy(e->shape, x->shape, x->rank * sizeof *x->shape);
  /* the tensor's own partitions, by the plan: not a walk over every partition per tensor */
  size_t first = s->plan.tensor_first[t], end = first + s->plan.tensor_parts[t];
  for (size_t i = first; i < end; i++) {
    if (s->local[i] < 0) continue;
    ts_store_record_t r;
    ts_store_record(s, ts_store_part_at(s, (size_t)s->local[i]), &r);
    memcpy(v + r.offset, r.bufs[0], r.count * sizeof *v);
  }
  return 0;
}

static int cmp_key(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Table i: a dense [rows, dim] matrix of ids 0..rows-1 (rows > 0; an id without a row gets
 * the row it would be made with, as a live export's read-only pull does), or NAME/ids (the
 * keys of its rows, ascending as int64) and NAME/rows. */
static int add_table(ts_store_t *s, uint32_t i, uint64_t rows, psctl_entries_t *es) {
  ts_stable_t *t = ts_stables_at(s->tables, i);
  const ts_table_t *tab = ts_stable_rows(t);
  const char *name = ts_stable_name(t);
  uint32_t dim = ts_stable_dim(t);
  uint64_t n = rows ? rows : tab->size;
  size_t nl = strlen(name) + sizeof "/rows";
  /* the keys, then (without rows) both names, in the block the ids entry owns */
  int64_t *keys = ts_malloc(n * sizeof *keys + 2 * nl + 1);
  float *dst = ts_malloc((n ? n : 1) * dim * sizeof *dst);
  psctl_weights_entry_t *ek = keys && dst && !rows ? psctl_entries_add(es) : NULL;
  if (ek) es->owned[es->n - 1] = keys;
  psctl_weights_entry_t *er = keys && dst && (rows || ek) ? psctl_entries_add(es) : NULL;
  if (!er) {
    if (!ek) ts_free(keys);
    ts_free(dst);
    fprintf(stderr, "psctl: export: out of memory\n");
    return TS_EXIT_FAILURE;
  }
  es->owned[es->n - 1] = dst;
  if (rows) {
    for (uint64_t k = 0; k < n; k++) keys[k] = (int64_t)k;
  } else {
    uint32_t cursor = 0, id;
    size_t k = 0;
    while (k < n && (id = ts_table_next(tab, &cursor)) != TS_TABLE_NONE)
      keys[k++] = (int64_t)ts_table_meta(tab, id)->key;
    qsort(keys, k, sizeof *keys, cmp_key);
  }
  ts_stable_peek(t, (const uint64_t *)keys, n, dst);
  if (rows) {
    ts_free(keys);
    *er = (psctl_weights_entry_t){
        .name = name, .dtype = PSCTL_DT_F32, .shape = {n, dim}, .rank = 2, .data = dst};
    return 0;
  }
  char *ids_name = (char *)(keys + n), *rows_name = ids_name + nl;
  snprintf(ids_name, nl, "%s/ids", name);
  snprintf(rows_name, nl, "%s/rows", name);
  es->e[es->n - 2] = (psctl_weights_entry_t){
      .name = ids_name, .dtype = PSCTL_DT_I64, .shape = {n}, .rank = 1, .data = keys};
  es->e[es->n - 1] = (psctl_weights_entry_t){
      .name = rows_name, .dtype = PSCTL_DT_F32, .shape = {n, dim}, .rank = 2, .data = dst};
  return 0;
}

int psctl_export_checkpoint(const ts_config_t *cfg, const psctl_export_opts_t *o) {
  int rc = psctl_checkpoint_dir_ready(cfg);
  if (rc) return rc;
  /* One shard holding the whole model: the restore takes this layout's own file, or
   * re-shards the newest complete set of the job's files into it. Nothing read is bounded
   * by the shards' budgets: this is the operator's own host. */
  ts_store_t s;
  ts_store_init(&s, cfg, 0);
  s.num_shards = 1;
  s.max_model_bytes = UINT64_MAX;
  s.table_budget.max_bytes = UINT64_MAX;
  s.table_budget.track = false;
  char path[600], err[1536];
  uint64_t seq = 0;
  int r = ts_ckpt_restore(&s, cfg->checkpoint_dir, cfg->checkpoint_restore_from,
                          cfg->num_checkpoint_restore_from, true, path, sizeof path, &seq, err,
                          sizeof err);
  if (r <= 0) {
    if (r == 0)
      fprintf(stderr, "psctl: export: no checkpoint in %s\n", cfg->checkpoint_dir);
    else
      fprintf(stderr, "psctl: export: reading the checkpoints in %s: %s\n", cfg->checkpoint_dir,
              err);
    ts_store_free(&s);
    return TS_EXIT_FAILURE;
  }
  for (size_t i = 0; i < o->num_vocab && rc == 0; i++) {
    bool found = false;
    for (uint32_t t = 0; t < s.num_tables; t++)
      found |= strcmp(ts_stable_name(ts_stables_at(s.tables, t)), o->vocab[i].name) == 0;
    if (!found) {
      fprintf(stderr, "psctl: export: --vocab %s: the model has no table of that name\n",
              o->vocab[i].name);
      rc = TS_EXIT_USAGE;
    }
  }
  psctl_entries_t es = {0};
  const char **state = ts_calloc(s.num_tensors + 1, sizeof *state);
  size_t nstate = 0;
  if (!state && rc == 0) {
    fprintf(stderr, "psctl: export: out of memory\n");
    rc = TS_EXIT_FAILURE;
  }
  for (uint32_t t = 0; rc == 0 && t < s.num_tensors; t++) {
    rc = add_tensor(&s, t, &es);
    if (s.tensors[t].state) state[nstate++] = s.tensors[t].name;
  }
  for (uint32_t t = 0; rc == 0 && t < s.num_tables; t++) {
    uint64_t rows = 0;
    for (size_t i = 0; i < o->num_vocab; i++)
      if (strcmp(o->vocab[i].name, ts_stable_name(ts_stables_at(s.tables, t))) == 0)
        rows = o->vocab[i].rows;
    rc = add_table(&s, t, rows, &es);
  }
  if (rc == 0) {
    fprintf(stderr, "psctl: export: from %s%s\n", r == 2 ? "the set " : "", path);
    rc = psctl_export_write(cfg, o, &es, state, nstate, s.num_tensors, s.num_tables,
                            ts_ckpt_step(&s));
  }
  ts_free(state);
  psctl_entries_free(&es);
  ts_store_free(&s);
  return rc;
}
