/* psctl tables (psctl_tables.h). A table is matched across shards by its name: every shard
 * of a job declares the same tables, in the same order. */
#include "psctl_tables.h"

#include <string.h>

#include "psctl_fmt.h"

/* The first shard that answered holds the job's table list. */
static const ts_client_shard_status_t *first_up(const ts_job_status_shard_t *sh, size_t n) {
  for (size_t s = 0; s < n; s++)
    if (sh[s].st) return sh[s].st;
  return NULL;
}

/* Table `name` on shard st, or NULL. */
static const ts_client_table_status_t *find(const ts_client_shard_status_t *st, const char *name) {
  for (size_t i = 0; st && i < st->num_tables; i++)
    if (strcmp(st->tables[i].name, name) == 0) return &st->tables[i];
  return NULL;
}

typedef struct {
  double rows, bytes, created, evicted, filtered;
} totals_t;

static totals_t sum(const ts_job_status_shard_t *sh, size_t n, const char *name) {
  totals_t t = {0, 0, 0, 0, 0};
  for (size_t s = 0; s < n; s++) {
    const ts_client_table_status_t *x = find(sh[s].st, name);
    if (!x) continue;
    t.rows += (double)x->rows;
    t.bytes += (double)x->bytes;
    t.created += (double)x->created;
    t.evicted += (double)x->evicted;
    t.filtered += (double)x->filtered;
  }
  return t;
}

cJSON *psctl_tables_json(const ts_job_status_shard_t *sh, size_t n) {
  cJSON *arr = cJSON_CreateArray();
  const ts_client_shard_status_t *any = first_up(sh, n);
  for (size_t i = 0; arr && any && i < any->num_tables; i++) {
    const char *name = any->tables[i].name;
    totals_t t = sum(sh, n, name);
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "dim", any->tables[i].dim);
    cJSON_AddNumberToObject(o, "rows", t.rows);
    cJSON_AddNumberToObject(o, "bytes", t.bytes);
    cJSON_AddNumberToObject(o, "created", t.created);
    cJSON_AddNumberToObject(o, "evicted", t.evicted);
    cJSON_AddNumberToObject(o, "filtered", t.filtered);
    cJSON *shards = cJSON_AddArrayToObject(o, "shards");
    for (size_t s = 0; shards && s < n; s++) {
      const ts_client_table_status_t *x = find(sh[s].st, name);
      if (!x) continue;
      cJSON *e = ts_job_status_json_table(x);
      if (!e) continue;
      cJSON_DeleteItemFromObject(e, "name");
      cJSON_DeleteItemFromObject(e, "dim");
      cJSON_AddNumberToObject(e, "index", (double)sh[s].index);
      cJSON_AddItemToArray(shards, e);
    }
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

void psctl_tables_print(FILE *f, const ts_job_status_shard_t *sh, size_t n) {
  const ts_client_shard_status_t *any = first_up(sh, n);
  if (!any || any->num_tables == 0) {
    fprintf(f, "no embedding tables declared%s\n", any ? "" : " (no shard answered)");
    return;
  }
  fprintf(f, "%-24s %-6s %5s %12s %11s %9s %12s %12s %12s\n", "TABLE", "SHARD", "DIM", "ROWS",
          "BYTES", "VERSION", "CREATED", "EVICTED", "FILTERED");
  for (size_t i = 0; i < any->num_tables; i++) {
    const char *name = any->tables[i].name;
    totals_t t = sum(sh, n, name);
    char b[32];
    psctl_human_bytes(b, sizeof b, t.bytes);
    fprintf(f, "%-24.24s %-6s %5u %12.0f %11s %9s %12.0f %12.0f %12.0f\n", name, "all",
            any->tables[i].dim, t.rows, b, "-", t.created, t.evicted, t.filtered);
    for (size_t s = 0; s < n; s++) {
      const ts_client_table_status_t *x = find(sh[s].st, name);
      if (!x) continue;
      psctl_human_bytes(b, sizeof b, (double)x->bytes);
      fprintf(f, "%-24s %-6zu %5s %12llu %11s %9llu %12llu %12llu %12llu\n", "", sh[s].index, "",
              (unsigned long long)x->rows, b, (unsigned long long)x->version,
              (unsigned long long)x->created, (unsigned long long)x->evicted,
              (unsigned long long)x->filtered);
    }
  }
}
