/*
 * The model budget of the shard store (server.max_model_bytes, ts_store_prepare): what a
 * Declare would make a shard allocate, counted with the optimizer state and sync
 * accumulators and checked before anything is allocated; the three steps of a declare
 * (prepare, build, install) and a reset after which another model can be declared.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tessera.pb-c.h"
#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_store.h"
#include "ts_store_int.h" /* the store's own tests look inside a partition */

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

static void set_list(char ***list, size_t *count, size_t n, const char *addr) {
  for (size_t i = 0; i < *count; i++) ts_free((*list)[i]);
  ts_free(*list);
  *list = ts_calloc(n, sizeof **list);
  assert_non_null(*list);
  for (size_t i = 0; i < n; i++) (*list)[i] = ts_strdup(addr);
  *count = n;
}

static void store_init(ts_store_t *s, uint32_t num_ps, ts_mode_t mode, ts_optimizer_t opt,
                       int64_t max_bytes) {
  ts_config_t cfg;
  assert_int_equal(ts_config_defaults(&cfg), 0);
  set_list(&cfg.ps, &cfg.num_ps, num_ps, "127.0.0.1:7100");
  set_list(&cfg.workers, &cfg.num_workers, 2, "127.0.0.1:9200");
  cfg.mode = mode;
  cfg.optimizer = opt;
  cfg.partition_bytes = 4096;
  cfg.max_model_bytes = max_bytes;
  ts_store_init(s, &cfg, 0);
  ts_config_free(&cfg);
}

/* One tensor "x" of n float32 values. */
typedef struct {
  Tessera__Declare d;
  Tessera__TensorDecl t;
  Tessera__TensorDecl *tp[1];
  uint64_t shape[1];
} decl_t;

static void decl(decl_t *x, const char *name, uint64_t n, uint64_t seed) {
  memset(x, 0, sizeof *x);
  tessera__declare__init(&x->d);
  tessera__tensor_decl__init(&x->t);
  x->shape[0] = n;
  x->t.name = (char *)name;
  x->t.shape = x->shape;
  x->t.n_shape = 1;
  x->t.init = TESSERA__INIT__INIT_ONES;
  x->tp[0] = &x->t;
  x->d.tensors = x->tp;
  x->d.n_tensors = 1;
  x->d.seed = seed;
}

static void test_model_bytes(void **state) {
  (void)state;
  /* Parameters alone, then x3 with Adam's two moments, then one more copy for sync. */
  uint64_t base = ts_store_model_bytes(1 << 20, 0, 0, 0, 0, false, 0);
  assert_int_equal(base, 1 << 20);
  assert_int_equal(ts_store_model_bytes(1 << 20, 0, 0, 0, 2, false, 0), 3u << 20);
  assert_int_equal(ts_store_model_bytes(1 << 20, 0, 0, 0, 2, true, 4), 4u << 20);
  /* Bookkeeping counts too, per partition and per tensor. */
  assert_true(ts_store_model_bytes(0, 10, 10, 1, 0, true, 4) > 10 * sizeof(ts_spart_t));
  /* Saturates instead of wrapping. */
  assert_int_equal(ts_store_model_bytes(UINT64_MAX / 2, 0, 0, 0, 2, false, 0), UINT64_MAX);
  assert_int_equal(ts_store_model_bytes(1, SIZE_MAX, SIZE_MAX, 1, 0, true, 1), UINT64_MAX);
}

/* Refused with TS_ETOOBIG before any allocation: every allocation fails meanwhile. */
static void refused_before_allocating(ts_store_t *s, const decl_t *x, const char *needle) {
  char err[256] = "";
  bool created = true;
  ts_alloc_fail_after(1);
  int rc = ts_store_declare(s, &x->d, &created, err, sizeof err);
  ts_alloc_fail_after(0);
  if (rc != TS_ETOOBIG) fail_msg("declare returned %d (%s): %s", rc, ts_err_name(rc), err);
  assert_false(created);
  assert_false(s->declared);
  assert_contains(err, "server.max_model_bytes");
  assert_contains(err, needle);
}

static void test_budget(void **state) {
  (void)state;
  decl_t x;
  decl(&x, "x", 1 << 18, 1); /* 1 MiB of parameters */
  char err[256];
  bool created;

  /* SGD: 1 MiB and its bookkeeping fit 2 MiB; Adam's x3 does not. */
  ts_store_t s;
  store_init(&s, 1, TS_MODE_ASYNC, TS_OPT_SGD, 2 << 20);
  assert_int_equal(ts_store_declare(&s, &x.d, &created, err, sizeof err), 0);
  assert_int_equal(s.bytes + s.state_bytes, 1 << 20);
  ts_store_free(&s);
  store_init(&s, 1, TS_MODE_ASYNC, TS_OPT_ADAM, 2 << 20);
  refused_before_allocating(&s, &x, "x3 with optimizer state");
  /* Sync adds the accumulator: momentum (x2) + accumulator = x3. */
  ts_store_free(&s);
  store_init(&s, 1, TS_MODE_SYNC, TS_OPT_MOMENTUM, 2 << 20);
  refused_before_allocating(&s, &x, "sync accumulators");
  ts_store_free(&s);

  /* The 20-byte attack: 2^60 values, far past any budget and past 64-bit byte counts. */
  decl_t huge;
  decl(&huge, "x", (uint64_t)1 << 60, 1);
  store_init(&s, 2, TS_MODE_ASYNC, TS_OPT_ADAM, 16LL << 30);
  refused_before_allocating(&s, &huge, "on average over 2 shard(s)");
  ts_store_free(&s);

  /* Spread over 4 shards, each holds a quarter: 3 MiB of Adam in all fits a 1 MiB budget
   * per shard only if the shard's own share does. */
  store_init(&s, 4, TS_MODE_ASYNC, TS_OPT_ADAM, 1 << 20);
  assert_int_equal(ts_store_declare(&s, &x.d, &created, err, sizeof err), 0);
  assert_true(s.bytes + s.state_bytes <= 1 << 20);
  ts_store_free(&s);
}

static void test_prepare_build_install_reset(void **state) {
  (void)state;
  decl_t a, b, a2;
  decl(&a, "a", 5000, 1);
  decl(&b, "b", 300, 2);
  decl(&a2, "a", 5001, 1);
  ts_store_t s;
  store_init(&s, 1, TS_MODE_SYNC, TS_OPT_ADAM, 1 << 20);
  char err[256];
  ts_store_model_t m;
  assert_int_equal(ts_store_prepare(&s, &a.d, &m, err, sizeof err), 0);
  assert_true(m.need_bytes >= 5000 * 4 * 4);
  assert_int_equal(m.bytes, 0); /* nothing allocated yet */
  /* A declare arriving meanwhile is compared with the model being built. */
  assert_int_equal(ts_store_same_model(&s, &m, &a.d, err, sizeof err), 0);
  assert_int_equal(ts_store_same_model(&s, &m, &a2.d, err, sizeof err), TS_ESHAPE);
  assert_contains(err, "shape [5000], not [5001]");
  assert_int_equal(ts_store_build(&m, err, sizeof err), 0);
  assert_false(s.declared);
  ts_store_install(&s, &m);
  assert_true(s.declared);
  assert_null(m.parts);
  assert_int_equal(s.bytes, 5000 * 4);
  assert_int_equal(s.state_bytes, 5000 * 4 * 3);
  ts_spart_t *p = ts_store_find(&s, 0, 0);
  assert_non_null(p);
  assert_true(p->w[0] == 1.0f && p->s0[0] == 0.0f);
  bool created;
  assert_int_equal(ts_store_declare(&s, &b.d, &created, err, sizeof err), TS_ESHAPE);

  /* After a reset the next declare defines the model anew. */
  s.applied = 7;
  ts_store_reset(&s);
  assert_false(s.declared);
  assert_int_equal(s.applied, 0);
  assert_int_equal(s.bytes + s.state_bytes, 0);
  assert_int_equal(ts_store_declare(&s, &b.d, &created, err, sizeof err), 0);
  assert_true(created);
  assert_int_equal(s.num_tensors, 1);
  assert_string_equal(s.tensors[0].name, "b");
  ts_store_free(&s);

  /* A prepared model that is never built or installed frees cleanly. */
  store_init(&s, 1, TS_MODE_ASYNC, TS_OPT_SGD, 1 << 20);
  assert_int_equal(ts_store_prepare(&s, &a.d, &m, err, sizeof err), 0);
  ts_store_model_free(&m);
  ts_store_model_free(&m);
  ts_store_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_bytes),
      cmocka_unit_test(test_budget),
      cmocka_unit_test(test_prepare_build_install_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
