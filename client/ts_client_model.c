/*
 * Read access to the model the shards hold, for a client that did not declare it (psctl
 * export): ts_client_attach asks one shard for its declared tensors and tables and plans
 * them as a declare would, without sending a Declare; the names and shapes are then the
 * client's to enumerate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_client_int.h"
#include "ts_err.h"
#include "ts_msg.h"

int ts_client_attach(ts_client_t *c, uint32_t shard, char *errmsg, size_t errlen) {
  if (!c) return TS_EINVAL;
  if (shard >= c->n) {
    ts_errmsg_printf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  if (ts_cl_on_client_thread(c)) {
    ts_errmsg_printf(errmsg, errlen, "a blocking call cannot be made on the client thread");
    return TS_EINVAL;
  }
  ts_cl_op_t op = {.kind = OP_STATUS, .wait_ready = false, .shard = shard, .with_model = true};
  int rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc < 0) return rc;
  Tessera__ShardStatus *st = op.status;
  ts_client_tensor_t *t = NULL;
  ts_client_kind_t *kinds = NULL;
  ts_client_table_t *tb = NULL;
  if (!st) {
    ts_errmsg_printf(errmsg, errlen, "shard %u sent no status", shard);
    rc = TS_EINTERNAL;
    goto out;
  }
  if (st->n_model == 0 && st->n_tables == 0) {
    ts_errmsg_printf(errmsg, errlen,
                     "shard %u holds no model: nothing was declared or restored from a "
                     "checkpoint (or the model was reset)",
                     shard);
    rc = TS_ENOTDECLARED;
    goto out;
  }
  rc = TS_ENOMEM;
  t = ts_calloc(st->n_model ? st->n_model : 1, sizeof *t);
  kinds = ts_calloc(st->n_model ? st->n_model : 1, sizeof *kinds);
  tb = ts_calloc(st->n_tables ? st->n_tables : 1, sizeof *tb);
  if (!t || !kinds || !tb) {
    ts_errmsg_printf(errmsg, errlen, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < st->n_model; i++) {
    const Tessera__TensorDecl *d = st->model[i];
    t[i] = (ts_client_tensor_t){
        .name = d->name, .shape = d->shape, .rank = d->n_shape, .init = (ts_client_init_t)d->init};
    kinds[i] =
        d->kind == TESSERA__TENSOR_KIND__TENSOR_STATE ? TS_CLIENT_STATE : TS_CLIENT_TRAINABLE;
  }
  /* Only a table's name and width matter to a reader: the other settings are the
   * declaring worker's, and no Declare is sent from here. */
  for (size_t i = 0; i < st->n_tables; i++)
    tb[i] = (ts_client_table_t){.name = st->tables[i]->name, .dim = st->tables[i]->dim};
  rc = ts_cl_set_model(c, t, st->n_model, kinds, tb, st->n_tables, st->model_seed, false, errmsg,
                       errlen);
out:
  ts_free(t);
  ts_free(kinds);
  ts_free(tb);
  if (st) ts_msg_free(&st->base);
  return rc;
}

const char *ts_client_tensor_name(const ts_client_t *c, size_t t) {
  return c && c->plan.parts && t < c->decl.n_tensors ? c->decl.tensors[t]->name : NULL;
}

size_t ts_client_tensor_shape(const ts_client_t *c, size_t t, const uint64_t **shape) {
  if (!c || !c->plan.parts || t >= c->decl.n_tensors) {
    if (shape) *shape = NULL;
    return 0;
  }
  if (shape) *shape = c->decl.tensors[t]->shape;
  return c->decl.tensors[t]->n_shape;
}

ts_client_kind_t ts_client_tensor_kind(const ts_client_t *c, size_t t) {
  return c && c->plan.parts && t < c->decl.n_tensors &&
                 c->decl.tensors[t]->kind == TESSERA__TENSOR_KIND__TENSOR_STATE
             ? TS_CLIENT_STATE
             : TS_CLIENT_TRAINABLE;
}

const char *ts_client_table_name(const ts_client_t *c, size_t t) {
  return c && t < c->decl.n_tables ? c->decl.tables[t]->name : NULL;
}

/* --- a table's keys ------------------------------------------------------------------ */

int ts_client_table_keys(ts_client_t *c, uint32_t table, uint32_t shard, uint64_t cursor,
                         int64_t *keys, size_t max, ts_client_keys_page_t *page, char *errmsg,
                         size_t errlen) {
  if (!c || !page || (!keys && max)) return TS_EINVAL;
  memset(page, 0, sizeof *page);
  if (shard >= c->n) {
    ts_errmsg_printf(errmsg, errlen, "shard %u does not exist", shard);
    return TS_EINVAL;
  }
  if (max == 0 || max > TS_MSG_MAX_KEYS) {
    ts_errmsg_printf(errmsg, errlen, "a page of %zu keys: ask for 1 to %llu", max,
                     (unsigned long long)TS_MSG_MAX_KEYS);
    return TS_EINVAL;
  }
  if (ts_cl_on_client_thread(c)) {
    ts_errmsg_printf(errmsg, errlen, "a blocking call cannot be made on the client thread");
    return TS_EINVAL;
  }
  ts_cl_op_t op = {.kind = OP_TABLE_KEYS, .wait_ready = false, .shard = shard,
                   .keys_table = table, .keys_cursor = cursor, .keys_max = max,
                   .keys_out = (uint64_t *)(void *)keys};
  int rc = ts_cl_run_op(c, &op, errmsg, errlen);
  if (rc < 0) return rc;
  if (!op.keys_got) {
    ts_errmsg_printf(errmsg, errlen, "shard %u sent no keys", shard);
    return TS_EINTERNAL;
  }
  page->num_keys = (size_t)op.keys_n;
  page->next_cursor = op.keys_next;
  page->done = op.keys_done;
  page->erased = op.keys_erased;
  page->rows = op.keys_rows;
  return 0;
}

/* Keys per page of ts_client_table_keys_all, and its restarts per shard. */
#define ALL_PAGE ((size_t)1 << 16)
#define ALL_RESTARTS 3

static int cmp_key(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int ts_client_table_keys_all(ts_client_t *c, uint32_t table, int64_t **keys, size_t *n,
                             uint32_t *restarts, char *errmsg, size_t errlen) {
  if (!c || !keys || !n) return TS_EINVAL;
  *keys = NULL;
  *n = 0;
  if (restarts) *restarts = 0;
  int64_t *all = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (uint32_t s = 0; s < c->n && rc == 0; s++) {
    size_t start = len; /* this shard's keys begin here */
    uint64_t cursor = 0, erased = 0;
    bool first = true;
    int again = 0;
    for (;;) {
      if (cap - len < ALL_PAGE) {
        size_t ncap = cap ? cap * 2 : ALL_PAGE;
        while (ncap - len < ALL_PAGE) ncap *= 2;
        int64_t *grown = ts_realloc(all, ncap * sizeof *all);
        if (!grown) {
          ts_errmsg_printf(errmsg, errlen, "out of memory for %zu keys", ncap);
          rc = TS_ENOMEM;
          break;
        }
        all = grown;
        cap = ncap;
      }
      ts_client_keys_page_t page;
      rc = ts_client_table_keys(c, table, s, cursor, all + len, ALL_PAGE, &page, errmsg, errlen);
      if (rc < 0) break;
      if (!first && page.erased != erased && again < ALL_RESTARTS) {
        again++; /* rows went meanwhile: walk this shard again */
        if (restarts) (*restarts)++;
        len = start;
        cursor = 0;
        first = true;
        continue;
      }
      if (first) erased = page.erased;
      first = false;
      len += page.num_keys;
      cursor = page.next_cursor;
      if (page.done) break;
    }
  }
  if (rc < 0) {
    ts_free(all);
    return rc;
  }
  if (len) qsort(all, len, sizeof *all, cmp_key);
  size_t m = 0;
  for (size_t i = 0; i < len; i++)
    if (m == 0 || all[i] != all[m - 1]) all[m++] = all[i];
  if (m == 0) {
    ts_free(all);
    all = NULL;
  }
  *keys = all;
  *n = m;
  return 0;
}

void ts_client_keys_free(int64_t *keys) { ts_free(keys); }
