/*
 * Checkpoint files as untrusted input: the BLAKE2b hash of a checkpoint is not keyed, so
 * anyone who can write into checkpoint.dir can make a file whose hash checks. Every count,
 * rank and index in it must be validated before it sizes a buffer or indexes an array;
 * a forged file is rejected (named, with its reason) and the shard refuses to start; it
 * never corrupts memory.
 * So is a forged table section (format 2): row counts, widths, repeated keys.
 * (Run under the sanitizer build to see the overflows these guard against.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "tessera.pb-c.h"
#include "ts_alloc.h"
#include "ts_ckpt.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_store.h"

#define PB 1024 /* partition bytes: 256 values */

static void set_list(char ***list, size_t *count, size_t n, const char *addr) {
  for (size_t i = 0; i < *count; i++) ts_free((*list)[i]);
  ts_free(*list);
  *list = ts_calloc(n, sizeof **list);
  assert_non_null(*list);
  for (size_t i = 0; i < n; i++) (*list)[i] = ts_strdup(addr);
  *count = n;
}

/* One shard, sgd (no optimizer state), async. */
static void store_init(ts_store_t *s) {
  ts_config_t cfg;
  assert_int_equal(ts_config_defaults(&cfg), 0);
  set_list(&cfg.ps, &cfg.num_ps, 1, "127.0.0.1:7100");
  set_list(&cfg.workers, &cfg.num_workers, 1, "127.0.0.1:9200");
  cfg.mode = TS_MODE_ASYNC;
  cfg.optimizer = TS_OPT_SGD;
  cfg.partition_bytes = PB;
  ts_store_init(s, &cfg, 0);
  ts_config_free(&cfg);
}

static char dir[] = "/tmp/tessera-ckpt-forged-XXXXXX";

/* The path of the one checkpoint file the tests write (shard 0, sequence 1). */
static void file_path(char *path, size_t n) {
  snprintf(path, n, "%s/shard-0-%020llu.ckpt", dir, 1ull);
}

/* The key write_forged signs with (NULL: the plain hash), as a shard with checkpoint.sign
 * would. */
static const uint8_t *forge_key;

/* Write the directory's checkpoint file as ts_ckpt_file_write lays it out (magic, meta
 * length, meta, data, BLAKE2b of all that), with whatever meta the test forged. */
static void write_forged(const Tessera__CheckpointMeta *m, const float *data, size_t ndata) {
  char path[600];
  file_path(path, sizeof path);
  size_t mlen = tessera__checkpoint_meta__get_packed_size(m);
  uint8_t *meta = malloc(mlen + 1);
  assert_non_null(meta);
  tessera__checkpoint_meta__pack(m, meta);
  uint8_t len4[4] = {(uint8_t)mlen, (uint8_t)(mlen >> 8), (uint8_t)(mlen >> 16),
                     (uint8_t)(mlen >> 24)};
  crypto_generichash_state h;
  crypto_generichash_init(&h, forge_key, forge_key ? 32 : 0, crypto_generichash_BYTES);
  crypto_generichash_update(&h, (const uint8_t *)"TSCKPT01", 8);
  crypto_generichash_update(&h, len4, 4);
  crypto_generichash_update(&h, meta, mlen);
  if (ndata) crypto_generichash_update(&h, (const uint8_t *)data, ndata * sizeof(float));
  uint8_t hash[crypto_generichash_BYTES];
  crypto_generichash_final(&h, hash, sizeof hash);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite("TSCKPT01", 1, 8, f), 8);
  assert_int_equal(fwrite(len4, 1, 4, f), 4);
  assert_int_equal(fwrite(meta, 1, mlen, f), mlen);
  if (ndata) assert_int_equal(fwrite(data, sizeof(float), ndata, f), ndata);
  assert_int_equal(fwrite(hash, 1, sizeof hash, f), sizeof hash);
  assert_int_equal(fclose(f), 0);
  free(meta);
}

/* A forged file of shard 0 of 1 (partition_bytes PB): one tensor "w" of the given shape,
 * the two partitions parts[0..2) (filled in by the caller), data as given. */
typedef struct {
  Tessera__CheckpointMeta m;
  Tessera__TensorDecl t;
  Tessera__TensorDecl *tp[1];
  Tessera__CheckpointPart p[2];
  Tessera__CheckpointPart *pp[2];
  uint64_t shape[32];
} forged_t;

static void forged_init(forged_t *x, const uint64_t *shape, size_t rank) {
  memset(x, 0, sizeof *x);
  tessera__checkpoint_meta__init(&x->m);
  x->m.format = 1;
  x->m.shard = 0;
  x->m.num_shards = 1;
  x->m.partition_bytes = PB;
  x->m.seed = 7;
  x->m.step = 3;
  x->m.sequence = 1;
  x->m.wall_time = 1.0;
  x->m.optimizer = "adam";
  tessera__tensor_decl__init(&x->t);
  x->t.name = "w";
  memcpy(x->shape, shape, rank * sizeof *shape);
  x->t.shape = x->shape;
  x->t.n_shape = rank;
  x->t.init = TESSERA__INIT__INIT_ZEROS;
  x->tp[0] = &x->t;
  x->m.tensors = x->tp;
  x->m.n_tensors = 1;
  for (int i = 0; i < 2; i++) {
    tessera__checkpoint_part__init(&x->p[i]);
    x->p[i].tensor = 0;
    x->p[i].part = (uint32_t)i;
    x->p[i].offset = 256u * (uint64_t)i;
    x->p[i].count = 256;
    x->p[i].version = 3;
    x->pp[i] = &x->p[i];
  }
  x->m.parts = x->pp;
  x->m.n_parts = 2;
}

static int make_dir(void **state) {
  (void)state;
  memcpy(dir + sizeof dir - 7, "XXXXXX", 6);
  return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state) {
  (void)state;
  char path[600];
  file_path(path, sizeof path);
  unlink(path);
  return rmdir(dir);
}

/* Restore the directory into a fresh store s (the caller frees it); why not into err. */
static int restore(ts_store_t *s, char *err, size_t errlen) {
  store_init(s);
  char got[600] = "";
  uint64_t seq = 0;
  return ts_ckpt_restore(s, dir, NULL, 0, false, got, sizeof got, &seq, err, errlen);
}

/* Restore must reject the file and leave the store undeclared: the only checkpoint
 * rejected, the shard refuses to start (TS_EDATA) rather than start fresh. */
static void expect_rejected(void) {
  ts_store_t s;
  char err[1536] = "";
  int rc = restore(&s, err, sizeof err);
  if (rc != TS_EDATA) fprintf(stderr, "restore: %d %s\n", rc, err);
  assert_int_equal(rc, TS_EDATA);
  assert_non_null(strstr(err, "no usable checkpoint of shard 0"));
  assert_false(s.declared);
  ts_store_free(&s);
}

/* A partition count so large that count * 4 wraps to 0: the data-size check must not be
 * fooled into accepting the file, nor may the largest count size a read buffer (a 1-byte
 * buffer would then take the first partition's optimizer state). */
static void test_count_wraps_the_size_check(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){512}, 1);
  x.p[0].state_buffers = 1; /* written with momentum: read past into a scratch buffer */
  x.p[1].count = 1ull << 62; /* 4 * 2^62 wraps to 0 */
  float data[512];
  for (int i = 0; i < 512; i++) data[i] = (float)i;
  write_forged(&x.m, data, 512);
  expect_rejected();
}

/* state_buffers of 2^32 - 1 makes (1 + state_buffers) wrap to 0 in 32 bits. */
static void test_state_buffers_wrap(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){512}, 1);
  x.p[1].state_buffers = UINT32_MAX;
  float data[256] = {0};
  write_forged(&x.m, data, 256);
  expect_rejected();
}

/* A tensor of rank 20 (the store keeps 8 dimensions): refused, not copied past the array. */
static void test_rank_beyond_store(void **state) {
  (void)state;
  uint64_t shape[20];
  for (int i = 0; i < 20; i++) shape[i] = 1;
  shape[19] = 512;
  forged_t x;
  forged_init(&x, shape, 20);
  float data[512] = {0};
  write_forged(&x.m, data, 512);
  expect_rejected();
}

/* More tensors than a Declare may list (4096): a file of 300000 one-value tensors and no
 * partitions is refused at once, not checked for repeated names pair by pair (hours). */
static void test_too_many_tensors(void **state) {
  (void)state;
  enum { NT = 300000 };
  Tessera__TensorDecl *t = calloc(NT, sizeof *t);
  Tessera__TensorDecl **tp = calloc(NT, sizeof *tp);
  char(*names)[16] = calloc(NT, sizeof *names);
  uint64_t one = 1;
  assert_non_null(t);
  assert_non_null(tp);
  assert_non_null(names);
  for (int i = 0; i < NT; i++) {
    tessera__tensor_decl__init(&t[i]);
    snprintf(names[i], sizeof names[i], "t%d", i);
    t[i].name = names[i];
    t[i].shape = &one;
    t[i].n_shape = 1;
    tp[i] = &t[i];
  }
  forged_t x;
  forged_init(&x, (const uint64_t[]){1}, 1);
  x.m.tensors = tp;
  x.m.n_tensors = NT;
  x.m.n_parts = 0;
  write_forged(&x.m, NULL, 0);
  expect_rejected();
  free(t);
  free(tp);
  free(names);
}


static char logged[2048]; /* the lines logged while a sink is installed */

static void log_sink(void *arg, ts_log_level_t level, const char *msg) {
  (void)arg;
  (void)level;
  size_t n = strlen(logged);
  snprintf(logged + n, sizeof logged - n, "%s\n", msg);
}

/* The same partition listed twice (and so another one missing): refused, naming it; the
 * missing partition would otherwise keep its initial values without a word. */
static void test_partition_listed_twice(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){512}, 1);
  x.p[1].part = 0;
  x.p[1].offset = 0;
  float data[512] = {0};
  write_forged(&x.m, data, 512);
  ts_store_t s;
  char err[1536] = "";
  logged[0] = '\0';
  ts_log_set_thread_sink(log_sink, NULL, TS_LOG_DEBUG);
  int rc = restore(&s, err, sizeof err);
  ts_log_set_thread_sink(NULL, NULL, TS_LOG_DEBUG);
  assert_true(rc <= 0);
  assert_false(s.declared);
  if (!strstr(logged, "tensor 'w' partition 0 is listed twice")) fail_msg("logged: %s", logged);
  ts_store_free(&s);
}

/* Peak resident memory of this process, in KiB. */
static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* Restore must refuse the file as corrupt (TS_EDATA, its error naming why) and leave the
 * store undeclared, before anything the file sizes is allocated: the peak RSS grows by less
 * than 16 MiB. */
static void expect_refused_unallocated(const char *why) {
  ts_store_t s;
  char err[1536] = "";
  long rss0 = max_rss_kib();
  int rc = restore(&s, err, sizeof err);
  long grew = max_rss_kib() - rss0;
  fprintf(stderr, "restore: %d (%s); peak RSS grew by %ld KiB\n", rc, err, grew);
  assert_int_equal(rc, TS_EDATA);
  assert_false(s.declared);
  assert_non_null(strstr(err, why));
  assert_true(grew < 16 * 1024);
  ts_store_free(&s);
}

/* A re-sharding set of one header-only file (another layout: partition_bytes 4) claiming
 * a model of 8 Mi parameters: its old plan would be a partition per parameter (some 320 MiB
 * of plan) and its model 32 MiB, all for a file of a few hundred bytes. Refused before
 * anything is allocated, with the refusal of a corrupt set. */
static void test_reshard_header_only_set(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){8u << 20}, 1);
  x.m.partition_bytes = 4;
  x.m.n_parts = 0;
  write_forged(&x.m, NULL, 0);
  expect_refused_unallocated("too few for the 8388608 parameters");
}

/* The same with enough bytes in the file for the model (padding after the hash is not
 * read by anything: the size check reads the header's sums), but a plan of a partition
 * per parameter that its header does not list: refused by the count, again before the plan
 * is built. */
static void test_reshard_plan_not_listed(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){4u << 20}, 1);
  x.m.partition_bytes = 4;
  x.m.n_parts = 2; /* the two 256-value partitions of forged_init */
  float *data = calloc(4u << 20, sizeof *data);
  assert_non_null(data);
  x.p[1].count = (4u << 20) - 256;
  write_forged(&x.m, data, 4u << 20);
  free(data);
  expect_refused_unallocated("cuts the model into 4194304 partitions, but its files list 2");
}
/* The control: the same file, well formed, is restored. */
static void test_well_formed_restores(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){512}, 1);
  float data[512];
  for (int i = 0; i < 512; i++) data[i] = (float)i;
  write_forged(&x.m, data, 512);
  ts_store_t s;
  char err[1536] = "";
  int rc = restore(&s, err, sizeof err);
  if (rc != 1) fail_msg("restore: %d %s", rc, err);
  assert_true(s.declared);
  assert_int_equal(s.num_parts, 2);
  ts_store_record_t r;
  ts_store_record(&s, ts_store_part_at(&s, 1), &r);
  assert_true(r.bufs[0][10] == 266.0f);
  ts_store_free(&s);
}

/* checkpoint.sign: with a key, only a file signed with it restores; an unsigned file whose
 * hash checks (anyone can make one) and one signed with another token are refused, and a
 * shard without the key refuses a signed file. */
static void test_signed(void **state) {
  (void)state;
  forged_t x;
  forged_init(&x, (const uint64_t[]){512}, 1);
  float data[512];
  for (int i = 0; i < 512; i++) data[i] = (float)i;
  uint8_t key[32], other[32];
  ts_ckpt_file_key("the admin token", key);
  ts_ckpt_file_key("another token", other);
  const struct {
    const uint8_t *forge;
    const char *token;
    int want;
    const char *why;
  } cases[] = {
      {NULL, "the admin token", TS_EDATA, "signature mismatch"},
      {other, "the admin token", TS_EDATA, "signature mismatch"},
      {key, "the admin token", 1, NULL},
      {key, NULL, TS_EDATA, "checksum mismatch"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    forge_key = cases[i].forge;
    write_forged(&x.m, data, 512);
    ts_ckpt_file_set_key(cases[i].token);
    ts_store_t s;
    char err[1536] = "";
    int rc = restore(&s, err, sizeof err);
    ts_ckpt_file_set_key(NULL);
    forge_key = NULL;
    if (rc != cases[i].want) fail_msg("case %zu: restore %d: %s", i, rc, err);
    if (cases[i].why) assert_non_null(strstr(err, cases[i].why));
    assert_int_equal(s.declared, rc == 1);
    ts_store_free(&s);
  }
}

/* --- embedding tables (format 2) ----------------------------------------------------- */

#define TDIM 4

/* x made format 2 with one SGD table "e" of width TDIM holding `rows` rows; the data is the
 * dense 512 floats then nrec records (key, updates, last_step, TDIM floats) written into
 * buf (floats, for write_forged: records are whole floats). */
typedef struct {
  Tessera__TableDecl d;
  Tessera__TableDecl *dp[1];
  Tessera__CheckpointTable ct;
  Tessera__CheckpointTable *ctp[1];
} forged_table_t;

static void forged_table(forged_t *x, forged_table_t *t, uint64_t rows) {
  tessera__table_decl__init(&t->d);
  t->d.name = "e";
  t->d.dim = TDIM;
  t->d.optimizer = TESSERA__ROW_OPTIMIZER__ROW_OPT_SGD;
  t->d.learning_rate = 0.5;
  t->dp[0] = &t->d;
  tessera__checkpoint_table__init(&t->ct);
  t->ct.dim = TDIM;
  t->ct.rows = rows;
  t->ct.version = 5;
  t->ct.created = 9;
  t->ctp[0] = &t->ct;
  x->m.format = 2;
  x->m.tables = t->dp;
  x->m.n_tables = 1;
  x->m.table_rows = t->ctp;
  x->m.n_table_rows = 1;
}

#define REC_FLOATS (6 + TDIM) /* 24 bytes of key, updates, last_step */

/* buf: 512 dense floats then records of keys[0..n); returns the floats written. */
static size_t table_data(float *buf, const uint64_t *keys, size_t n) {
  for (int i = 0; i < 512; i++) buf[i] = (float)i;
  float *r = buf + 512;
  for (size_t i = 0; i < n; i++, r += REC_FLOATS) {
    uint64_t head[3] = {keys[i], 10 + i, 4};
    memcpy(r, head, sizeof head);
    for (int j = 0; j < TDIM; j++) r[6 + j] = (float)(100 * i + (size_t)j);
  }
  return 512 + n * REC_FLOATS;
}

/* The control: rows, their update counts, last steps and the table's version restored. */
static void test_table_well_formed(void **state) {
  (void)state;
  forged_t x;
  forged_table_t t;
  forged_init(&x, (const uint64_t[]){512}, 1);
  forged_table(&x, &t, 3);
  float buf[512 + 3 * REC_FLOATS];
  write_forged(&x.m, buf, table_data(buf, (const uint64_t[]){7, 3, 1ull << 60}, 3));
  ts_store_t s;
  char err[1536] = "";
  int rc = restore(&s, err, sizeof err);
  if (rc != 1) fail_msg("restore: %d %s", rc, err);
  ts_stable_t *tab = ts_store_table(&s, 0);
  assert_non_null(tab);
  assert_int_equal(ts_stable_version(tab), 5);
  const ts_table_t *rows = ts_stable_rows(tab);
  assert_int_equal(rows->size, 3);
  uint32_t id = ts_table_find(rows, 1ull << 60);
  assert_int_not_equal(id, TS_TABLE_NONE);
  assert_int_equal(ts_table_meta(rows, id)->updates, 12);
  assert_int_equal(ts_table_meta(rows, id)->last_step, 4);
  assert_true(ts_table_row(rows, id)[3] == 203.0f);
  ts_store_free(&s);
}

/* A row count whose records would wrap the size sum, one the file does not hold, a width
 * not the declaration's, a format 1 file listing tables, a key listed twice, tombstones in
 * a full checkpoint, an increment without its full checkpoint: rejected. */
static void test_table_forged(void **state) {
  (void)state;
  float buf[512 + 3 * REC_FLOATS];
  size_t n = table_data(buf, (const uint64_t[]){7, 3, 7}, 3);
  for (int c = 0; c < 7; c++) {
    forged_t x;
    forged_table_t t;
    forged_init(&x, (const uint64_t[]){512}, 1);
    forged_table(&x, &t, 2);
    /* two rows: keys 7 and 3 */
    size_t floats = n - REC_FLOATS;
    if (c == 0) t.ct.rows = (UINT64_MAX / 40) + 2; /* x 40 bytes wraps */
    if (c == 1) t.ct.rows = 3;                     /* the file holds two */
    if (c == 2) t.ct.dim = TDIM + 1;
    if (c == 3) x.m.format = 1;
    if (c == 4) { /* key 7 twice */
      t.ct.rows = 3;
      floats = n;
    }
    if (c == 5) { /* tombstones in a full checkpoint (key 7 read as one) */
      t.ct.rows = 1;
      t.ct.tombstones = (REC_FLOATS * 4) / 8;
    }
    if (c == 6) x.m.base_sequence = 99; /* an increment whose full checkpoint is missing */
    write_forged(&x.m, buf, floats);
    expect_rejected();
  }
}

int main(void) {
  if (sodium_init() < 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_well_formed_restores, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_table_well_formed, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_table_forged, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_count_wraps_the_size_check, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_state_buffers_wrap, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_rank_beyond_store, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_too_many_tensors, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_partition_listed_twice, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_reshard_header_only_set, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_reshard_plan_not_listed, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_signed, make_dir, remove_dir),
  };
  return cmocka_run_group_tests_name("ckpt_forged", tests, NULL, NULL);
}
