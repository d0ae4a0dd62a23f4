/* psctl export (psctl_export.h). */
#include "psctl_export.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psctl_export_int.h"
#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_config_job.h"
#include "ts_err.h"

/* A large model's pull takes longer than psctl's default 3 s per request. */
#define EXPORT_TIMEOUT_S 120.0

int psctl_export_add_vocab(psctl_export_opts_t *o, const char *arg, char *errmsg, size_t errlen) {
  const char *eq = strrchr(arg, '=');
  char *end = NULL;
  unsigned long long n = eq ? strtoull(eq + 1, &end, 10) : 0;
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof o->vocab[0].name || !end || *end || !eq[1] ||
      eq[1] == '-' || n == 0 || n > PSCTL_EXPORT_MAX_VOCAB) {
    ts_errmsg_printf(errmsg, errlen,
                     "--vocab takes TABLE=N (the table's ids 0..N-1 as a dense matrix, "
                     "1 <= N <= %u), not '%s'",
                     PSCTL_EXPORT_MAX_VOCAB, arg);
    return TS_EINVAL;
  }
  if (o->num_vocab == PSCTL_EXPORT_MAX_VOCABS) {
    ts_errmsg_printf(errmsg, errlen, "at most %d --vocab options", PSCTL_EXPORT_MAX_VOCABS);
    return TS_EINVAL;
  }
  psctl_vocab_t *v = &o->vocab[o->num_vocab++];
  memcpy(v->name, arg, (size_t)(eq - arg));
  v->name[eq - arg] = 0;
  v->rows = n;
  return 0;
}

int psctl_export_check(const psctl_export_opts_t *o) {
  psctl_weights_format_t f;
  if (!o->path || !*o->path) {
    fprintf(stderr, "psctl: export needs -o FILE (see psctl export --help)\n");
    return TS_EXIT_USAGE;
  }
  if (!o->format) {
    fprintf(stderr, "psctl: export needs --format safetensors or --format npz\n");
    return TS_EXIT_USAGE;
  }
  if (psctl_weights_parse_format(o->format, &f) < 0) {
    fprintf(stderr, "psctl: --format takes safetensors or npz, not '%s'\n", o->format);
    return TS_EXIT_USAGE;
  }
  return TS_EXIT_OK;
}

/* The file's description of the job: strings only, as safetensors' __metadata__ wants. */
static char *metadata(const ts_config_t *cfg, const char *const *state_names, size_t nstate,
                      uint64_t step) {
  cJSON *m = cJSON_CreateObject(), *job = cJSON_CreateObject(), *state = cJSON_CreateArray();
  char *out = NULL, *job_s = NULL, *state_s = NULL;
  ts_config_job_setting_t *set = ts_calloc(TS_CONFIG_JOB_MAX, sizeof *set);
  if (!m || !job || !state || !set) goto done;
  size_t ns = ts_config_job_settings(cfg, set);
  for (size_t i = 0; i < ns; i++) cJSON_AddStringToObject(job, set[i].key, set[i].value);
  for (size_t t = 0; t < nstate; t++)
    cJSON_AddItemToArray(state, cJSON_CreateString(state_names[t]));
  char num[32];
  snprintf(num, sizeof num, "%llu", (unsigned long long)step);
  job_s = cJSON_PrintUnformatted(job);
  state_s = cJSON_PrintUnformatted(state);
  if (!job_s || !state_s) goto done;
  cJSON_AddStringToObject(m, "format", "tessera");
  cJSON_AddStringToObject(m, "tessera.version", TS_VERSION);
  cJSON_AddStringToObject(m, "tessera.step", num);
  cJSON_AddStringToObject(m, "tessera.job", job_s);
  cJSON_AddStringToObject(m, "tessera.state_tensors", state_s);
  out = cJSON_PrintUnformatted(m);
done:
  cJSON_free(job_s);
  cJSON_free(state_s);
  cJSON_Delete(m);
  cJSON_Delete(job);
  cJSON_Delete(state);
  ts_free(set);
  return out;
}

psctl_weights_entry_t *psctl_entries_add(psctl_entries_t *es) {
  if (es->n == es->cap) {
    size_t cap = es->cap ? 2 * es->cap : 16;
    psctl_weights_entry_t *e = ts_realloc(es->e, cap * sizeof *e);
    if (e) es->e = e;
    void **o = e ? ts_realloc(es->owned, cap * sizeof *o) : NULL;
    if (!o) return NULL;
    es->owned = o;
    es->cap = cap;
  }
  es->owned[es->n] = NULL;
  memset(&es->e[es->n], 0, sizeof es->e[es->n]);
  return &es->e[es->n++];
}

void psctl_entries_free(psctl_entries_t *es) {
  for (size_t i = 0; i < es->n; i++) ts_free(es->owned[i]);
  ts_free(es->e);
  ts_free(es->owned);
}

/* The dense tensors, pulled in one request. Returns 0 or a TS_EXIT_* after printing why. */
static int pull_tensors(ts_client_t *c, psctl_entries_t *es, uint64_t *step) {
  size_t n = ts_client_num_tensors(c);
  if (n == 0) return 0;
  float **dst = ts_calloc(n, sizeof *dst);
  if (!dst) return TS_EXIT_FAILURE;
  for (size_t t = 0; t < n; t++) {
    psctl_weights_entry_t *e = psctl_entries_add(es);
    uint64_t elems = ts_client_tensor_elems(c, t);
    const uint64_t *shape;
    size_t rank = ts_client_tensor_shape(c, t, &shape);
    if (!e || rank > PSCTL_WEIGHTS_MAX_RANK ||
        !(dst[t] = ts_malloc((elems ? elems : 1) * sizeof(float)))) {
      fprintf(stderr, "psctl: export: out of memory (or tensor %zu of rank %zu)\n", t, rank);
      ts_free(dst);
      return TS_EXIT_FAILURE;
    }
    es->owned[es->n - 1] = dst[t];
    *e = (psctl_weights_entry_t){
        .name = ts_client_tensor_name(c, t), .dtype = PSCTL_DT_F32, .rank = rank, .data = dst[t]};
    memcpy(e->shape, shape, rank * sizeof *shape);
  }
  ts_client_req_t req;
  ts_client_req_init(&req, TS_CLIENT_PULL);
  req.dst = dst;
  req.timeout_s = EXPORT_TIMEOUT_S;
  int rc = ts_client_run(c, &req);
  ts_free(dst);
  if (rc < 0) {
    fprintf(stderr, "psctl: export: pulling the model failed: %s\n", req.errmsg);
    return TS_EXIT_FAILURE;
  }
  *step = req.version;
  return 0;
}

/* Keys per read-only pull of a table's rows (1 Mi rows of 64 floats make 256 MiB: pull
 * them a quarter million at a time). */
#define ROWS_CHUNK ((uint64_t)1 << 18)

/* Rows of keys[0..n) of table t into dst (n x dim), read-only, ROWS_CHUNK at a time. */
static int pull_rows(ts_client_t *c, size_t t, const int64_t *keys, uint64_t n, float *dst) {
  uint32_t dim = ts_client_table_dim(c, t);
  for (uint64_t off = 0; off < n; off += ROWS_CHUNK) {
    ts_client_req_t req;
    ts_client_req_init(&req, TS_CLIENT_SPARSE_PULL);
    req.table = (uint32_t)t;
    req.keys = keys + off;
    req.num_keys = n - off < ROWS_CHUNK ? n - off : ROWS_CHUNK;
    req.rows_dst = dst + off * dim;
    req.sparse_flags = TS_CLIENT_ROWS_READ_ONLY; /* an export changes no table */
    req.timeout_s = EXPORT_TIMEOUT_S;
    if (ts_client_run(c, &req) < 0) {
      fprintf(stderr, "psctl: export: pulling table %s failed: %s\n",
              ts_client_table_name(c, t), req.errmsg);
      return TS_EXIT_FAILURE;
    }
  }
  return 0;
}

/* Table t as a dense matrix of ids 0..rows-1. */
static int pull_table(ts_client_t *c, size_t t, uint64_t rows, psctl_entries_t *es) {
  uint32_t dim = ts_client_table_dim(c, t);
  int64_t *keys = ts_malloc(rows * sizeof *keys);
  float *dst = ts_malloc(rows * dim * sizeof *dst);
  psctl_weights_entry_t *e = keys && dst ? psctl_entries_add(es) : NULL;
  if (!e) {
    ts_free(keys);
    ts_free(dst);
    fprintf(stderr, "psctl: export: out of memory\n");
    return TS_EXIT_FAILURE;
  }
  es->owned[es->n - 1] = dst;
  *e = (psctl_weights_entry_t){.name = ts_client_table_name(c, t),
                               .dtype = PSCTL_DT_F32,
                               .shape = {rows, dim},
                               .rank = 2,
                               .data = dst};
  for (uint64_t k = 0; k < rows; k++) keys[k] = (int64_t)k;
  int rc = pull_rows(c, t, keys, rows, dst);
  ts_free(keys);
  return rc;
}

/* Table t as the ids of its rows, listed on the shards (ascending, each once), and their
 * rows: entries NAME/ids (int64, n) and NAME/rows (float32, n x dim). */
static int pull_table_ids(ts_client_t *c, size_t t, psctl_entries_t *es) {
  const char *name = ts_client_table_name(c, t);
  uint32_t dim = ts_client_table_dim(c, t);
  char err[512];
  int64_t *keys = NULL;
  size_t n = 0;
  if (ts_client_table_keys_all(c, (uint32_t)t, &keys, &n, NULL, err, sizeof err) < 0) {
    fprintf(stderr, "psctl: export: listing the ids of table %s failed: %s\n", name, err);
    return TS_EXIT_FAILURE;
  }
  /* One block the list owns for the ids and both names; the rows in another. */
  size_t nl = strlen(name) + sizeof "/rows";
  int64_t *ids = ts_malloc(n * sizeof *ids + 2 * nl);
  float *dst = ts_malloc((n ? n : 1) * dim * sizeof *dst);
  psctl_weights_entry_t *ei = ids && dst ? psctl_entries_add(es) : NULL;
  if (ei) es->owned[es->n - 1] = ids;
  psctl_weights_entry_t *er = ei ? psctl_entries_add(es) : NULL;
  if (!er) {
    if (!ei) ts_free(ids);
    ts_free(dst);
    ts_client_keys_free(keys);
    fprintf(stderr, "psctl: export: out of memory\n");
    return TS_EXIT_FAILURE;
  }
  es->owned[es->n - 1] = dst;
  ei = &es->e[es->n - 2]; /* add_entry may have moved the list */
  char *ids_name = (char *)(ids + n), *rows_name = ids_name + nl;
  snprintf(ids_name, nl, "%s/ids", name);
  snprintf(rows_name, nl, "%s/rows", name);
  if (n) memcpy(ids, keys, n * sizeof *ids);
  ts_client_keys_free(keys);
  *ei = (psctl_weights_entry_t){
      .name = ids_name, .dtype = PSCTL_DT_I64, .shape = {n}, .rank = 1, .data = ids};
  *er = (psctl_weights_entry_t){
      .name = rows_name, .dtype = PSCTL_DT_F32, .shape = {n, dim}, .rank = 2, .data = dst};
  return pull_rows(c, t, ids, n, dst);
}

int psctl_export_run(ts_client_t *c, const ts_config_t *cfg, const psctl_export_opts_t *o) {
  char err[512];
  if (ts_client_attach(c, 0, err, sizeof err) < 0) {
    fprintf(stderr, "psctl: export: %s\n", err);
    return TS_EXIT_FAILURE;
  }
  /* A --vocab names a table of the model. */
  for (size_t i = 0; i < o->num_vocab; i++) {
    bool found = false;
    for (size_t t = 0; t < ts_client_num_tables(c); t++)
      found |= strcmp(ts_client_table_name(c, t), o->vocab[i].name) == 0;
    if (!found) {
      fprintf(stderr, "psctl: export: --vocab %s: the model has no table of that name\n",
              o->vocab[i].name);
      return TS_EXIT_USAGE;
    }
  }
  psctl_entries_t es = {0};
  uint64_t step = 0;
  int rc = pull_tensors(c, &es, &step);
  for (size_t t = 0; rc == 0 && t < ts_client_num_tables(c); t++) {
    const char *name = ts_client_table_name(c, t);
    uint64_t rows = 0;
    for (size_t i = 0; i < o->num_vocab; i++)
      if (strcmp(o->vocab[i].name, name) == 0) rows = o->vocab[i].rows;
    /* With --vocab a dense matrix; without, the ids the shards hold and their rows. */
    rc = rows ? pull_table(c, t, rows, &es) : pull_table_ids(c, t, &es);
  }
  if (rc == 0) {
    const char **state = ts_calloc(ts_client_num_tensors(c) + 1, sizeof *state);
    size_t nstate = 0;
    for (size_t t = 0; state && t < ts_client_num_tensors(c); t++)
      if (ts_client_tensor_kind(c, t) == TS_CLIENT_STATE) state[nstate++] = ts_client_tensor_name(c, t);
    rc = state ? psctl_export_write(cfg, o, &es, state, nstate, ts_client_num_tensors(c),
                                    ts_client_num_tables(c), step)
               : TS_EXIT_FAILURE;
    if (!state) fprintf(stderr, "psctl: export: out of memory\n");
    ts_free(state);
  }
  psctl_entries_free(&es);
  return rc;
}

int psctl_export_write(const ts_config_t *cfg, const psctl_export_opts_t *o, psctl_entries_t *es,
                       const char *const *state, size_t nstate, size_t ntensors, size_t ntables,
                       uint64_t step) {
  char err[512];
  psctl_weights_format_t fmt;
  if (psctl_weights_parse_format(o->format, &fmt) < 0) {
    fprintf(stderr, "psctl: --format takes safetensors or npz, not '%s'\n", o->format);
    return TS_EXIT_USAGE;
  }
  int rc = 0;
  char *meta = metadata(cfg, state, nstate, step);
  if (!meta) {
    fprintf(stderr, "psctl: export: out of memory\n");
    rc = TS_EXIT_FAILURE;
  }
  if (rc == 0) {
    int wrc = psctl_weights_write(o->path, fmt, es->e, es->n, meta, err, sizeof err);
    if (wrc < 0) {
      fprintf(stderr, "psctl: export: %s\n", err);
      rc = TS_EXIT_FAILURE;
    } else {
      uint64_t bytes = 0;
      for (size_t i = 0; i < es->n; i++) {
        uint64_t b = 4;
        for (size_t k = 0; k < es->e[i].rank; k++) b *= es->e[i].shape[k];
        bytes += b;
      }
      printf("exported %zu tensor(s), %zu table(s), %.1f MiB at step %llu to %s (%s)\n",
             ntensors, ntables, (double)bytes / (1024.0 * 1024.0), (unsigned long long)step,
             o->path, o->format);
    }
  }
  cJSON_free(meta);
  return rc;
}
