/* Helpers shared by the shard store unit tests (test_store.c, test_store_push.c): a store
 * set up from a few config values, a Declare built by hand, the test model, and float
 * comparisons. Each test program includes this once; everything here is static. */
#ifndef TS_TEST_STORE_FIXTURES_H
#define TS_TEST_STORE_FIXTURES_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera.pb-c.h"
#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_store.h"
#include "ts_store_int.h" /* the store's own tests look inside a partition */

#define LR 0.5f

/* Replace a config string list by n copies of addr (allocated as ts_config_free expects). */
static inline void set_list(char ***list, size_t *count, size_t n, const char *addr) {
  for (size_t i = 0; i < *count; i++) ts_free((*list)[i]);
  ts_free(*list);
  *list = ts_calloc(n, sizeof **list);
  assert_non_null(*list);
  for (size_t i = 0; i < n; i++) {
    (*list)[i] = ts_strdup(addr);
    assert_non_null((*list)[i]);
  }
  *count = n;
}

typedef struct {
  uint32_t num_ps, num_workers;
  ts_mode_t mode;
  int64_t partition_bytes;
  ts_optimizer_t optimizer;
} setup_t;

static inline void store_init(ts_store_t *s, const setup_t *u, uint32_t shard) {
  ts_config_t cfg;
  assert_int_equal(ts_config_defaults(&cfg), 0);
  set_list(&cfg.ps, &cfg.num_ps, u->num_ps, "127.0.0.1:7100");
  set_list(&cfg.workers, &cfg.num_workers, u->num_workers, "127.0.0.1:9200");
  cfg.mode = u->mode;
  cfg.partition_bytes = u->partition_bytes;
  cfg.optimizer = u->optimizer;
  cfg.learning_rate = (double)LR;
  ts_store_init(s, &cfg, shard);
  ts_config_free(&cfg);
  assert_int_equal(s->num_shards, u->num_ps);
  assert_int_equal(s->num_workers, u->num_workers);
  assert_false(s->declared);
}

/* A Declare built by hand. */
#define MAXT 8
typedef struct {
  Tessera__Declare d;
  Tessera__TensorDecl t[MAXT];
  Tessera__TensorDecl *tp[MAXT];
  uint64_t shape[MAXT][8];
  char name[MAXT][32];
} decl_t;

static inline void decl_init(decl_t *x, uint64_t seed) {
  memset(x, 0, sizeof *x);
  tessera__declare__init(&x->d);
  x->d.seed = seed;
  x->d.tensors = x->tp;
}

static inline void decl_add(decl_t *x, const char *name, Tessera__Init init, size_t rank,
                            const uint64_t *shape) {
  size_t i = x->d.n_tensors++;
  assert_true(i < MAXT);
  Tessera__TensorDecl *t = &x->t[i];
  tessera__tensor_decl__init(t);
  snprintf(x->name[i], sizeof x->name[i], "%s", name);
  memcpy(x->shape[i], shape, rank * sizeof *shape);
  t->name = x->name[i];
  t->shape = x->shape[i];
  t->n_shape = rank;
  t->init = init;
  x->tp[i] = t;
}

/* The test model: 3000 + 30 + 300 + 10 values. With partition_bytes = 1024 (256 values)
 * fc1/w has 12 partitions, fc2/w 2, the biases 1 each. */
#define SEED 42u
static inline void model(decl_t *x, uint64_t seed) {
  decl_init(x, seed);
  decl_add(x, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  decl_add(x, "fc1/b", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){30});
  decl_add(x, "fc2/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){30, 10});
  decl_add(x, "fc2/b", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){10});
}

static inline void declare_ok(ts_store_t *s, const decl_t *x) {
  char err[256] = "";
  bool created = false;
  int rc = ts_store_declare(s, &x->d, &created, err, sizeof err);
  if (rc != 0) fail_msg("declare failed: %d (%s) %s", rc, ts_err_name(rc), err);
  assert_true(created);
  assert_true(s->declared);
}

static inline float *copy_w(const ts_spart_t *p) {
  float *c = malloc(p->plan->count * sizeof *c + 1);
  assert_non_null(c);
  memcpy(c, p->w, p->plan->count * sizeof *c);
  return c;
}

static inline void fill_grad(float *g, size_t n, float base) {
  for (size_t i = 0; i < n; i++) g[i] = base + 0.001f * (float)(i % 97) - 0.05f;
}

static inline void check_close(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i]))))
      fail_msg("%s: element %zu is %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

static inline void check_equal(const char *what, const float *got, const float *want, size_t n) {
  if (memcmp(got, want, n * sizeof *got) != 0)
    for (size_t i = 0; i < n; i++)
      if (memcmp(&got[i], &want[i], sizeof *got) != 0)
        fail_msg("%s: element %zu is %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

/* The first partition this shard holds. */
static inline ts_spart_t *first_part(ts_store_t *s) {
  assert_true(s->num_parts > 0);
  return &s->parts[0];
}

#endif
