/*
 * Reading a model without declaring it (ts_client_attach) and psctl export, on real
 * shards: an admin client learns the declared tensors (names, shapes, kinds) and tables from
 * a shard's status and pulls exactly what a worker pulls; psctl export writes them, and the
 * safetensors file's bytes are the pulled values. A table without --vocab is written as
 * emb/ids (the keys its rows have on the shards, ascending) and emb/rows, exactly the rows
 * a read-only pull of those ids gets. Before any declare both say that no model is held.
 * With the shards stopped, psctl export --from-checkpoint writes the same arrays out of
 * their checkpoints (2 shards' files re-sharded into one store); a directory without one
 * is an error.
 * (tests/python/test_export.py loads such files into Keras.)
 */
#include <cjson/cJSON.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "calls.h"
#include "harness.h"

/* Small partitions: each tensor spreads over both shards. */
static const char job[] =
    "job = { mode = \"async\"; partition_bytes = 256; };\n"
    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };\n";

#define NT 2
static const uint64_t shape0[] = {12, 10}, shape1[] = {7};
static const ts_client_tensor_t model[NT] = {
    {.name = "fc1/kernel", .shape = shape0, .rank = 2, .init = TS_CLIENT_INIT_GLOROT_UNIFORM},
    {.name = "bn/moving_mean", .shape = shape1, .rank = 1, .init = TS_CLIENT_INIT_ONES},
};
static const ts_client_kind_t kinds[NT] = {TS_CLIENT_TRAINABLE, TS_CLIENT_STATE};

static ts_client_t *open_client(ts_cluster_t *c, bool admin) {
  ts_client_opts_t o;
  tc_opts_role(&o, c->addrs, (size_t)c->num_shards, admin);
  ts_client_t *cl = NULL;
  assert_int_equal(tc_open(&cl, &o, NULL, 0, 0), 0);
  return cl;
}

static char out[8192], err[8192];

/* The bytes of entry `name` of a safetensors file (NULL when absent), *len their size. */
static const char *entry(const char *file, const char *name, size_t *len) {
  uint64_t hl = 0;
  for (int k = 7; k >= 0; k--) hl = hl << 8 | (uint8_t)file[k];
  cJSON *h = cJSON_ParseWithLength(file + 8, (size_t)hl);
  assert_non_null(h);
  cJSON *e = cJSON_GetObjectItem(h, name);
  const char *at = NULL;
  if (e) {
    cJSON *off = cJSON_GetObjectItem(e, "data_offsets");
    size_t lo = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    *len = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble - lo;
    at = file + 8 + hl + lo;
  }
  cJSON_Delete(h);
  return at;
}

static int export_ids(ts_cluster_t *c, const char *path) {
  const char *args[] = {"-c", c->config, "export", "--format", "safetensors", "-o", path, NULL};
  return ts_run_psctl(args, out, sizeof out, err, sizeof err);
}

static int export(ts_cluster_t *c, const char *fmt, const char *path) {
  const char *args[] = {"-c",      c->config, "export", "--format", fmt,
                        "--vocab", "emb=5",   "-o",     path,       NULL};
  return ts_run_psctl(args, out, sizeof out, err, sizeof err);
}

/* Every array of file a is in file b with the same bytes, and b has no other. */
static void same_arrays(const char *a, const char *b) {
  char *fa = ts_read_file(a), *fb = ts_read_file(b);
  assert_non_null(fa);
  assert_non_null(fb);
  uint64_t hl = 0, hlb = 0;
  for (int k = 7; k >= 0; k--) hl = hl << 8 | (uint8_t)fa[k];
  for (int k = 7; k >= 0; k--) hlb = hlb << 8 | (uint8_t)fb[k];
  cJSON *h = cJSON_ParseWithLength(fa + 8, (size_t)hl), *hb = cJSON_ParseWithLength(fb + 8, (size_t)hlb);
  assert_non_null(h);
  assert_non_null(hb);
  assert_int_equal(cJSON_GetArraySize(h), cJSON_GetArraySize(hb));
  int n = 0;
  for (cJSON *e = h->child; e; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) continue;
    size_t la = 0, lb = 0;
    const char *da = entry(fa, e->string, &la), *db = entry(fb, e->string, &lb);
    if (!db) fail_msg("%s: no %s", b, e->string);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    n++;
  }
  assert_true(n >= 3);
  cJSON_Delete(h);
  cJSON_Delete(hb);
  free(fa);
  free(fb);
}

static void test_attach_and_export(void **state) {
  (void)state;
  ts_cluster_t c;
  char ckdir[] = "/tmp/tessera-export-XXXXXX", cfg[1024];
  assert_non_null(mkdtemp(ckdir));
  snprintf(cfg, sizeof cfg, "%scheckpoint = { dir = \"%s\"; interval_s = 3600; };\n", job, ckdir);
  assert_int_equal(ts_cluster_start(&c, 2, 1, cfg), 0);
  char e[512], path[600];
  snprintf(path, sizeof path, "%s/m.safetensors", c.dir);

  /* nothing declared yet */
  ts_client_t *admin = open_client(&c, true);
  assert_int_equal(ts_client_attach(admin, 0, e, sizeof e), TS_CLIENT_ENOTDECLARED);
  assert_non_null(strstr(e, "holds no model"));
  assert_int_equal(export(&c, "safetensors", path), 1);
  assert_non_null(strstr(err, "holds no model"));

  /* a worker declares and trains a little */
  ts_client_t *w = open_client(&c, false);
  ts_client_table_t tb = {.name = "emb",
                          .dim = 3,
                          .init = TS_CLIENT_ROW_UNIFORM,
                          .init_param = 0.5,
                          .optimizer = TS_CLIENT_ROWOPT_SGD};
  ts_client_declare_opts_t d;
  ts_client_declare_opts_init(&d);
  d.seed = 9;
  d.kinds = kinds;
  d.tables = &tb;
  d.num_tables = 1;
  if (ts_client_declare_ex(w, model, NT, &d, e, sizeof e) < 0) fail_msg("declare: %s", e);
  float g0[120], g1[7] = {0}, want0[120], want1[7];
  for (int i = 0; i < 120; i++) g0[i] = (float)(i % 9) / 8.0f;
  const float *grad[NT] = {g0, g1};
  assert_int_equal(tc_push(w, grad, 0, NULL, NULL, 0), 0);
  float *wdst[NT] = {want0, want1};
  assert_int_equal(tc_pull(w, wdst, 0, 0, NULL, NULL, 0), 0);

  /* the admin client plans the same model and pulls the same values */
  assert_int_equal(ts_client_attach(admin, 1, e, sizeof e), 0);
  assert_int_equal(ts_client_num_tensors(admin), NT);
  assert_int_equal(ts_client_num_parts(admin), ts_client_num_parts(w));
  for (size_t t = 0; t < NT; t++) {
    const uint64_t *shape;
    assert_string_equal(ts_client_tensor_name(admin, t), model[t].name);
    assert_int_equal(ts_client_tensor_shape(admin, t, &shape), model[t].rank);
    assert_memory_equal(shape, model[t].shape, model[t].rank * sizeof *shape);
    assert_int_equal(ts_client_tensor_kind(admin, t), kinds[t]);
  }
  assert_null(ts_client_tensor_name(admin, NT));
  assert_int_equal(ts_client_num_tables(admin), 1);
  assert_string_equal(ts_client_table_name(admin, 0), "emb");
  assert_int_equal(ts_client_table_dim(admin, 0), 3);
  float got0[120], got1[7];
  float *adst[NT] = {got0, got1};
  assert_int_equal(tc_pull(admin, adst, 0, 0, NULL, NULL, 0), 0);
  assert_memory_equal(got0, want0, sizeof got0);
  assert_memory_equal(got1, want1, sizeof got1);

  /* psctl export: the file's bytes are the pulled values */
  assert_int_equal(export(&c, "safetensors", path), 0);
  assert_non_null(strstr(out, "exported 2 tensor(s), 1 table(s)"));
  char *file = ts_read_file(path);
  assert_non_null(file);
  uint64_t hl = 0;
  for (int k = 7; k >= 0; k--) hl = hl << 8 | (uint8_t)file[k];
  cJSON *h = cJSON_ParseWithLength(file + 8, (size_t)hl);
  assert_non_null(h);
  cJSON *k = cJSON_GetObjectItem(h, "fc1/kernel");
  size_t lo = (size_t)cJSON_GetArrayItem(cJSON_GetObjectItem(k, "data_offsets"), 0)->valuedouble;
  assert_memory_equal(file + 8 + hl + lo, want0, sizeof want0);
  cJSON *emb = cJSON_GetObjectItem(h, "emb");
  assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(emb, "shape"), 0)->valuedouble, 5);
  cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
  assert_string_equal(cJSON_GetObjectItem(meta, "tessera.state_tensors")->valuestring,
                      "[\"bn/moving_mean\"]");
  cJSON_Delete(h);
  free(file);
  snprintf(path, sizeof path, "%s/m.npz", c.dir);
  assert_int_equal(export(&c, "npz", path), 0);

  /* Without --vocab: the table's ids and rows. No row yet: both empty. */
  snprintf(path, sizeof path, "%s/ids.safetensors", c.dir);
  assert_int_equal(export_ids(&c, path), 0);
  file = ts_read_file(path);
  size_t len = 99;
  assert_non_null(entry(file, "emb/ids", &len));
  assert_int_equal(len, 0);
  assert_non_null(entry(file, "emb/rows", &len));
  assert_int_equal(len, 0);
  assert_null(entry(file, "emb", &len));
  free(file);
  /* the worker makes rows (hashed ids: negative, huge) and trains some of them */
  int64_t ids[] = {1000000007, -5, 3, 42, INT64_MIN + 1, 77};
  const size_t nid = sizeof ids / sizeof ids[0];
  float rows[6 * 3], grads[6 * 3];
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_SPARSE_PULL);
  q.table = 0;
  q.keys = ids;
  q.num_keys = nid;
  q.rows_dst = rows;
  assert_int_equal(ts_client_run(w, &q), 0);
  for (size_t i = 0; i < nid * 3; i++) grads[i] = 0.25f * (float)(i % 5);
  ts_client_req_init(&q, TS_CLIENT_SPARSE_PUSH);
  q.table = 0;
  q.keys = ids;
  q.num_keys = 3;
  q.rows_grad = grads;
  assert_int_equal(ts_client_run(w, &q), 0);
  assert_int_equal(export_ids(&c, path), 0);
  assert_non_null(strstr(out, "1 table(s)"));
  /* what the file must hold: the ids ascending and their rows now */
  int64_t want_ids[6];
  memcpy(want_ids, ids, sizeof ids);
  for (size_t i = 0; i < nid; i++)
    for (size_t j = i + 1; j < nid; j++)
      if (want_ids[j] < want_ids[i]) {
        int64_t t = want_ids[i];
        want_ids[i] = want_ids[j];
        want_ids[j] = t;
      }
  float want_rows[6 * 3];
  ts_client_req_init(&q, TS_CLIENT_SPARSE_PULL);
  q.table = 0;
  q.keys = want_ids;
  q.num_keys = nid;
  q.rows_dst = want_rows;
  q.sparse_flags = TS_CLIENT_ROWS_READ_ONLY;
  assert_int_equal(ts_client_run(w, &q), 0);
  file = ts_read_file(path);
  assert_non_null(file);
  const char *got = entry(file, "emb/ids", &len);
  assert_int_equal(len, sizeof want_ids);
  assert_memory_equal(got, want_ids, sizeof want_ids);
  got = entry(file, "emb/rows", &len);
  assert_int_equal(len, sizeof want_rows);
  assert_memory_equal(got, want_rows, sizeof want_rows);
  free(file);
  snprintf(path, sizeof path, "%s/ids.npz", c.dir);
  const char *nargs[] = {"-c", c.config, "export", "--format", "npz", "-o", path, NULL};
  assert_int_equal(ts_run_psctl(nargs, out, sizeof out, err, sizeof err), 0);

  /* From the checkpoints, the shards stopped: the same arrays, with and without --vocab. */
  char live_ids[600], live_vocab[600], ck_ids[600], ck_vocab[600];
  snprintf(live_ids, sizeof live_ids, "%s/ids.safetensors", c.dir);
  snprintf(live_vocab, sizeof live_vocab, "%s/vocab.safetensors", c.dir);
  snprintf(ck_ids, sizeof ck_ids, "%s/ck-ids.safetensors", c.dir);
  snprintf(ck_vocab, sizeof ck_vocab, "%s/ck-vocab.safetensors", c.dir);
  assert_int_equal(export(&c, "safetensors", live_vocab), 0);
  const char *cargs[] = {"-c", c.config, "checkpoint", NULL};
  assert_int_equal(ts_run_psctl(cargs, out, sizeof out, err, sizeof err), 0);
  ts_client_close(w);
  ts_client_close(admin);
  for (int i = 0; i < 2; i++) ts_cluster_signal(&c, i, SIGTERM);
  const char *f1[] = {"-c", c.config, "export", "--from-checkpoint", "--format", "safetensors",
                      "-o", ck_ids, NULL};
  assert_int_equal(ts_run_psctl(f1, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(out, "exported 2 tensor(s), 1 table(s)"));
  assert_non_null(strstr(err, "from the set "));
  same_arrays(live_ids, ck_ids);
  const char *f2[] = {"-c", c.config, "export", "--from-checkpoint", "--vocab", "emb=5",
                      "--format", "safetensors", "-o", ck_vocab, NULL};
  assert_int_equal(ts_run_psctl(f2, out, sizeof out, err, sizeof err), 0);
  same_arrays(live_vocab, ck_vocab);
  /* a directory with no checkpoint */
  char set[600];
  snprintf(set, sizeof set, "checkpoint.dir=%s", c.dir);
  const char *f3[] = {"-c", c.config, "--set", set, "export", "--from-checkpoint", "--format",
                      "npz", "-o", ck_vocab, NULL};
  assert_int_equal(ts_run_psctl(f3, out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(err, "no checkpoint in"));
  /* signed files are verified with the admin token's key: none, no export */
  const char *f4[] = {"-c", c.config, "--set", "checkpoint.sign=true", "export",
                      "--from-checkpoint", "--format", "npz", "-o", ck_vocab, NULL};
  assert_int_equal(ts_run_psctl(f4, out, sizeof out, err, sizeof err), 78);
  assert_non_null(strstr(err, "checkpoint.sign needs auth.admin_token_file"));
  assert_int_equal(ts_cluster_stop_rm(&c, ckdir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attach_and_export),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
