/* psctl tables (psctl_tables.h). A table is matched across shards, and across the two
 * samples of --interval, by its name: every shard of a job declares the same tables. */
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

/* Per second over the interval, of a counter that did not go back (a restart, a reset). */
typedef struct {
  bool known;
  double created, evicted, pulled;
} rates_t;

static rates_t rates_of(const ts_client_table_status_t *now, const ts_client_table_status_t *then,
                        double interval) {
  rates_t r = {false, 0, 0, 0};
  if (!now || !then || interval <= 0 || now->created < then->created ||
      now->evicted < then->evicted || now->pulled_rows < then->pulled_rows)
    return r;
  r.known = true;
  r.created = (double)(now->created - then->created) / interval;
  r.evicted = (double)(now->evicted - then->evicted) / interval;
  r.pulled = (double)(now->pulled_rows - then->pulled_rows) / interval;
  return r;
}

typedef struct {
  double rows, bytes, created, evicted, filtered;
  rates_t rate; /* known when every shard's is */
} totals_t;

static totals_t sum(const ts_job_status_shard_t *sh, size_t n, const char *name,
                    ts_client_shard_status_t *const *before, double interval) {
  totals_t t = {0, 0, 0, 0, 0, {before && interval > 0, 0, 0, 0}};
  for (size_t s = 0; s < n; s++) {
    const ts_client_table_status_t *x = find(sh[s].st, name);
    if (!x) continue;
    t.rows += (double)x->rows;
    t.bytes += (double)x->bytes;
    t.created += (double)x->created;
    t.evicted += (double)x->evicted;
    t.filtered += (double)x->filtered;
    rates_t r = rates_of(x, before ? find(before[sh[s].index], name) : NULL, interval);
    t.rate.known = t.rate.known && r.known;
    t.rate.created += r.created;
    t.rate.evicted += r.evicted;
    t.rate.pulled += r.pulled;
  }
  return t;
}

static void add_rates(cJSON *o, rates_t r) {
  if (!r.known) return;
  cJSON_AddNumberToObject(o, "created_per_s", r.created);
  cJSON_AddNumberToObject(o, "evicted_per_s", r.evicted);
  cJSON_AddNumberToObject(o, "pulled_rows_per_s", r.pulled);
}

cJSON *psctl_tables_json(const ts_job_status_shard_t *sh, size_t n,
                         ts_client_shard_status_t *const *before, double interval) {
  cJSON *arr = cJSON_CreateArray();
  const ts_client_shard_status_t *any = first_up(sh, n);
  for (size_t i = 0; arr && any && i < any->num_tables; i++) {
    const char *name = any->tables[i].name;
    totals_t t = sum(sh, n, name, before, interval);
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "dim", any->tables[i].dim);
    cJSON_AddNumberToObject(o, "rows", t.rows);
    cJSON_AddNumberToObject(o, "bytes", t.bytes);
    cJSON_AddNumberToObject(o, "created", t.created);
    cJSON_AddNumberToObject(o, "evicted", t.evicted);
    cJSON_AddNumberToObject(o, "filtered", t.filtered);
    add_rates(o, t.rate);
    cJSON *shards = cJSON_AddArrayToObject(o, "shards");
    for (size_t s = 0; shards && s < n; s++) {
      const ts_client_table_status_t *x = find(sh[s].st, name);
      if (!x) continue;
      cJSON *e = cJSON_CreateObject();
      cJSON *fields = ts_job_status_json_table(x);
      if (!e || !fields) {
        cJSON_Delete(e);
        cJSON_Delete(fields);
        continue;
      }
      cJSON_AddNumberToObject(e, "index", (double)sh[s].index);
      cJSON *f;
      while ((f = fields->child) != NULL) { /* every field after the index, but the table's */
        cJSON_DetachItemViaPointer(fields, f);
        if (strcmp(f->string, "name") == 0 || strcmp(f->string, "dim") == 0)
          cJSON_Delete(f);
        else
          cJSON_AddItemToObject(e, f->string, f);
      }
      cJSON_Delete(fields);
      add_rates(e, rates_of(x, before ? find(before[sh[s].index], name) : NULL, interval));
      cJSON_AddItemToArray(shards, e);
    }
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

static void rate_cells(FILE *f, rates_t r) {
  if (r.known)
    fprintf(f, " %10.1f %10.1f %10.1f", r.created, r.evicted, r.pulled);
  else
    fprintf(f, " %10s %10s %10s", "-", "-", "-");
}

void psctl_tables_print(FILE *f, const ts_job_status_shard_t *sh, size_t n,
                        ts_client_shard_status_t *const *before, double interval) {
  const ts_client_shard_status_t *any = first_up(sh, n);
  if (!any || any->num_tables == 0) {
    fprintf(f, "no embedding tables declared%s\n", any ? "" : " (no shard answered)");
    return;
  }
  bool rates = before && interval > 0;
  fprintf(f, "%-20s %-5s %5s %11s %10s %8s %11s %10s %10s %5s", "TABLE", "SHARD", "DIM", "ROWS",
          "BYTES", "VERSION", "CREATED", "EVICTED", "FILTERED", "HOT8");
  if (rates) fprintf(f, " %10s %10s %10s", "CREATED/S", "EVICTED/S", "PULLED/S");
  fprintf(f, "\n");
  for (size_t i = 0; i < any->num_tables; i++) {
    const char *name = any->tables[i].name;
    totals_t t = sum(sh, n, name, before, interval);
    char b[32];
    psctl_human_bytes(b, sizeof b, t.bytes);
    fprintf(f, "%-20.20s %-5s %5u %11.0f %10s %8s %11.0f %10.0f %10.0f %5s", name, "all",
            any->tables[i].dim, t.rows, b, "-", t.created, t.evicted, t.filtered, "-");
    if (rates) rate_cells(f, t.rate);
    fprintf(f, "\n");
    for (size_t s = 0; s < n; s++) {
      const ts_client_table_status_t *x = find(sh[s].st, name);
      if (!x) continue;
      char hot[16] = "-";
      if (x->num_hot_keys) snprintf(hot, sizeof hot, "%.0f%%", x->hot_share * 100.0);
      psctl_human_bytes(b, sizeof b, (double)x->bytes);
      fprintf(f, "%-20s %-5zu %5s %11llu %10s %8llu %11llu %10llu %10llu %5s", "", sh[s].index, "",
              (unsigned long long)x->rows, b, (unsigned long long)x->version,
              (unsigned long long)x->created, (unsigned long long)x->evicted,
              (unsigned long long)x->filtered, hot);
      if (rates)
        rate_cells(f, rates_of(x, before ? find(before[sh[s].index], name) : NULL, interval));
      fprintf(f, "\n");
    }
  }
}
