/*
 * The shard store (server/ts_store.h) without a network: declaring the model (this shard's
 * partitions only, deterministic initial values, redeclare rules), slice checks, async
 * pushes (immediate, or deferred while a pull reply is being written), the sync barrier
 * (accumulate, duplicate, stale, average-and-apply, apply deferred by writers), the lowest
 * version, and allocation failure during declare.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera.pb-c.h"
#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_init.h"
#include "ts_plan.h"
#include "ts_store.h"

#define LR 0.5f

/* --- helpers ---------------------------------------------------------------------------- */

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* Replace a config string list by n copies of addr (allocated as ts_config_free expects). */
static void set_list(char ***list, size_t *count, size_t n, const char *addr) {
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

static void store_init(ts_store_t *s, const setup_t *u, uint32_t shard) {
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

static void decl_init(decl_t *x, uint64_t seed) {
  memset(x, 0, sizeof *x);
  tessera__declare__init(&x->d);
  x->d.seed = seed;
  x->d.tensors = x->tp;
}

static void decl_add(decl_t *x, const char *name, Tessera__Init init, size_t rank,
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
static void model(decl_t *x, uint64_t seed) {
  decl_init(x, seed);
  decl_add(x, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  decl_add(x, "fc1/b", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){30});
  decl_add(x, "fc2/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){30, 10});
  decl_add(x, "fc2/b", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){10});
}
static const uint64_t model_elems[] = {3000, 30, 300, 10};

static void declare_ok(ts_store_t *s, const decl_t *x) {
  char err[256] = "";
  bool created = false;
  int rc = ts_store_declare(s, &x->d, &created, err, sizeof err);
  if (rc != 0) fail_msg("declare failed: %d (%s) %s", rc, ts_err_name(rc), err);
  assert_true(created);
  assert_true(s->declared);
}

static void declare_err(ts_store_t *s, const decl_t *x, int want, const char *needle) {
  char err[256] = "";
  bool created = true;
  int rc = ts_store_declare(s, &x->d, &created, err, sizeof err);
  if (rc != want)
    fail_msg("declare returned %d (%s), want %d (%s); message '%s'", rc, ts_err_name(rc), want,
             ts_err_name(want), err);
  assert_false(created);
  assert_contains(err, needle);
}

static float *copy_w(const ts_spart_t *p) {
  float *c = malloc(p->plan->count * sizeof *c + 1);
  assert_non_null(c);
  memcpy(c, p->w, p->plan->count * sizeof *c);
  return c;
}

static void fill_grad(float *g, size_t n, float base) {
  for (size_t i = 0; i < n; i++) g[i] = base + 0.001f * (float)(i % 97) - 0.05f;
}

static void check_close(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i]))))
      fail_msg("%s: element %zu is %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

static void check_equal(const char *what, const float *got, const float *want, size_t n) {
  if (memcmp(got, want, n * sizeof *got) != 0)
    for (size_t i = 0; i < n; i++)
      if (memcmp(&got[i], &want[i], sizeof *got) != 0)
        fail_msg("%s: element %zu is %.9g, want %.9g", what, i, (double)got[i], (double)want[i]);
}

/* The first partition this shard holds. */
static ts_spart_t *first_part(ts_store_t *s) {
  assert_true(s->num_parts > 0);
  return &s->parts[0];
}

/* --- declare ---------------------------------------------------------------------------- */

static void test_declare_partitions(void **state) {
  (void)state;
  const setup_t u = {3, 2, TS_MODE_ASYNC, 1024, TS_OPT_MOMENTUM};
  decl_t x;
  model(&x, SEED);
  ts_plan_t plan;
  assert_int_equal(ts_plan_build(model_elems, 4, 3, 1024, &plan), 0);
  assert_int_equal(plan.num_parts, 16);
  size_t total = 0;
  for (uint32_t shard = 0; shard < 3; shard++) {
    ts_store_t s, again;
    store_init(&s, &u, shard);
    declare_ok(&s, &x);
    assert_int_equal(s.num_tensors, 4);
    assert_int_equal(s.num_parts, plan.shard_parts[shard]);
    assert_int_equal(s.bytes, plan.shard_bytes[shard]);
    assert_int_equal(s.state_bytes, plan.shard_bytes[shard]); /* one velocity buffer */
    assert_int_equal(ts_store_min_version(&s), 0);
    total += s.num_parts;
    store_init(&again, &u, shard);
    declare_ok(&again, &x);
    for (size_t i = 0; i < plan.num_parts; i++) {
      const ts_part_t *pp = &plan.parts[i];
      ts_spart_t *p = ts_store_find(&s, pp->tensor, pp->part);
      if (pp->shard != shard) {
        if (p)
          fail_msg("shard %u holds tensor %u part %u of shard %u", shard, pp->tensor, pp->part,
                   pp->shard);
        continue;
      }
      assert_non_null(p);
      assert_int_equal(p->plan->tensor, pp->tensor);
      assert_int_equal(p->plan->part, pp->part);
      assert_int_equal(p->plan->offset, pp->offset);
      assert_int_equal(p->plan->count, pp->count);
      assert_int_equal(p->version, 0);
      assert_int_equal(p->writers, 0);
      assert_non_null(p->s0);
      assert_null(p->s1);
      assert_null(p->accum);
      assert_null(p->contributed);
      float *want = malloc(pp->count * sizeof *want);
      assert_non_null(want);
      const Tessera__TensorDecl *t = x.d.tensors[pp->tensor];
      ts_init_fill(want, (ts_init_kind_t)t->init, SEED, t->name, t->shape, t->n_shape, pp->offset,
                   pp->count);
      check_equal(t->name, p->w, want, pp->count);
      /* The same shard declared again from scratch starts from the same values. */
      check_equal("second store", ts_store_find(&again, pp->tensor, pp->part)->w, want, pp->count);
      if (t->init == TESSERA__INIT__INIT_GLOROT_UNIFORM) {
        double fan_in = (double)t->shape[0], fan_out = (double)t->shape[1];
        float lim = (float)sqrt(6.0 / (fan_in + fan_out));
        for (size_t k = 0; k < pp->count; k++) assert_true(fabsf(p->w[k]) <= lim);
        /* The values are the tensor's at this partition's offset, not at 0. */
        if (pp->offset > 0) {
          ts_init_fill(want, (ts_init_kind_t)t->init, SEED, t->name, t->shape, t->n_shape, 0,
                       pp->count);
          assert_true(memcmp(want, p->w, pp->count * sizeof *want) != 0);
        }
      } else {
        float v = t->init == TESSERA__INIT__INIT_ONES ? 1.0f : 0.0f;
        for (size_t k = 0; k < pp->count; k++) assert_true(p->w[k] == v);
      }
      for (size_t k = 0; k < pp->count; k++) assert_true(p->s0[k] == 0.0f);
      free(want);
    }
    /* Out-of-range lookups. */
    assert_null(ts_store_find(&s, 4, 0));
    assert_null(ts_store_find(&s, 1, 1));
    assert_null(ts_store_find(&s, 0, 12));
    ts_store_free(&s);
    ts_store_free(&again);
    assert_false(s.declared);
  }
  assert_int_equal(total, plan.num_parts);
  ts_plan_free(&plan);
}

/* A different seed gives different glorot values (and identical constant ones). */
static void test_declare_seed(void **state) {
  (void)state;
  const setup_t u = {1, 1, TS_MODE_ASYNC, 1 << 20, TS_OPT_SGD};
  decl_t a, b;
  model(&a, 1);
  model(&b, 2);
  ts_store_t sa, sb;
  store_init(&sa, &u, 0);
  store_init(&sb, &u, 0);
  declare_ok(&sa, &a);
  declare_ok(&sb, &b);
  assert_int_equal(sa.num_parts, 4);
  assert_true(memcmp(ts_store_find(&sa, 0, 0)->w, ts_store_find(&sb, 0, 0)->w, 3000 * 4) != 0);
  check_equal("ones", ts_store_find(&sa, 3, 0)->w, ts_store_find(&sb, 3, 0)->w, 10);
  ts_store_free(&sa);
  ts_store_free(&sb);
}

/* Optimizer state and sync buffers follow the configuration. */
static void test_declare_buffers(void **state) {
  (void)state;
  const setup_t u = {2, 3, TS_MODE_SYNC, 1024, TS_OPT_ADAM};
  decl_t x;
  model(&x, SEED);
  ts_store_t s;
  store_init(&s, &u, 1);
  declare_ok(&s, &x);
  /* Adam: two moments; sync: an accumulator. */
  assert_int_equal(s.state_bytes, 3 * s.bytes);
  for (size_t i = 0; i < s.num_parts; i++) {
    ts_spart_t *p = &s.parts[i];
    assert_non_null(p->s0);
    assert_non_null(p->s1);
    assert_non_null(p->accum);
    assert_non_null(p->contributed);
    for (uint32_t w = 0; w < 3; w++) assert_int_equal(p->contributed[w], 0);
    assert_int_equal(p->accum_n, 0);
  }
  ts_store_free(&s);
}

static void test_redeclare(void **state) {
  (void)state;
  const setup_t u = {2, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);

  /* Change the parameters so that a redeclare that re-initialised would show. */
  ts_spart_t *p = first_part(&s);
  float *g = calloc(p->plan->count, sizeof *g);
  assert_non_null(g);
  fill_grad(g, p->plan->count, 0.5f);
  ts_store_async_push(&s, p, g);
  float *before = copy_w(p);
  size_t parts = s.num_parts;

  /* Identical: ok, not created. */
  char err[256] = "";
  bool created = true;
  assert_int_equal(ts_store_declare(&s, &x.d, &created, err, sizeof err), 0);
  assert_false(created);

  /* Different shape. */
  decl_t y;
  model(&y, SEED);
  y.shape[2][1] = 11;
  declare_err(&s, &y, TS_ESHAPE, "'fc2/w'");
  {
    char e[256];
    bool c;
    assert_int_equal(ts_store_declare(&s, &y.d, &c, e, sizeof e), TS_ESHAPE);
    assert_contains(e, "[30,10]");
    assert_contains(e, "[30,11]");
  }
  /* Different rank. */
  model(&y, SEED);
  y.t[1].n_shape = 2;
  y.shape[1][1] = 1;
  declare_err(&s, &y, TS_ESHAPE, "'fc1/b'");

  /* Different seed. */
  model(&y, SEED + 1);
  declare_err(&s, &y, TS_ESHAPE, "seed 42, not 43");

  /* Different initializer. */
  model(&y, SEED);
  y.t[3].init = TESSERA__INIT__INIT_ZEROS;
  declare_err(&s, &y, TS_ESHAPE, "'fc2/b'");
  {
    char e[256];
    bool c;
    assert_int_equal(ts_store_declare(&s, &y.d, &c, e, sizeof e), TS_ESHAPE);
    assert_contains(e, "initializer ones, not zeros");
  }

  /* Fewer tensors: the message names the one missing. */
  model(&y, SEED);
  y.d.n_tensors = 3;
  declare_err(&s, &y, TS_ESHAPE, "'fc2/b'");
  /* More tensors: the message names the extra one. */
  model(&y, SEED);
  decl_add(&y, "fc3/w", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){5});
  declare_err(&s, &y, TS_ESHAPE, "'fc3/w'");
  /* Same count, one renamed. */
  model(&y, SEED);
  snprintf(y.name[1], sizeof y.name[1], "fc1/bias");
  declare_err(&s, &y, TS_ESHAPE, "'fc1/bias'");

  /* Reordered. */
  decl_init(&y, SEED);
  decl_add(&y, "fc1/b", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){30});
  decl_add(&y, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  decl_add(&y, "fc2/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){30, 10});
  decl_add(&y, "fc2/b", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){10});
  declare_err(&s, &y, TS_ESHAPE, "'fc1/b'");

  /* Duplicate names, same count. */
  decl_init(&y, SEED);
  decl_add(&y, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  decl_add(&y, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  decl_add(&y, "fc2/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){30, 10});
  decl_add(&y, "fc2/b", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){10});
  declare_err(&s, &y, TS_ESHAPE, "'fc1/w'");
  /* The whole model, then one of its tensors again. */
  model(&y, SEED);
  decl_add(&y, "fc1/w", TESSERA__INIT__INIT_GLOROT_UNIFORM, 2, (const uint64_t[]){100, 30});
  declare_err(&s, &y, TS_ESHAPE, "tensor 'fc1/w' is declared at position 0, not 4");

  /* Nothing changed on the way. */
  assert_true(s.declared);
  assert_int_equal(s.num_parts, parts);
  assert_int_equal(s.seed, SEED);
  check_equal("after redeclares", p->w, before, p->plan->count);
  assert_int_equal(p->version, 1);
  free(g);
  free(before);
  ts_store_free(&s);
}

/* Invalid first declarations leave the store undeclared and usable. */
static void test_declare_invalid(void **state) {
  (void)state;
  const setup_t u = {2, 2, TS_MODE_SYNC, 1024, TS_OPT_ADAM};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t y;
  decl_init(&y, SEED);
  decl_add(&y, "a", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){4});
  decl_add(&y, "b", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){4});
  decl_add(&y, "a", TESSERA__INIT__INIT_ZEROS, 1, (const uint64_t[]){4});
  declare_err(&s, &y, TS_ESHAPE, "tensor 'a' is declared twice");
  assert_false(s.declared);
  assert_null(s.tensors);
  assert_null(s.parts);
  assert_int_equal(s.num_tensors, 0);

  decl_init(&y, SEED);
  declare_err(&s, &y, TS_EINVAL, "cannot plan partitions");
  assert_false(s.declared);

  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  ts_store_free(&s);
}

/* --- slices ----------------------------------------------------------------------------- */

static Tessera__PartSlice slice(uint32_t tensor, uint32_t part, uint64_t count) {
  Tessera__PartSlice sl = TESSERA__PART_SLICE__INIT;
  sl.tensor = tensor;
  sl.part = part;
  sl.count = count;
  return sl;
}

static void expect_slices(ts_store_t *s, Tessera__PartSlice *sl, size_t n, int want,
                          const char *needle) {
  Tessera__PartSlice *ptr[8];
  assert_true(n <= 8);
  for (size_t i = 0; i < n; i++) ptr[i] = &sl[i];
  char err[256] = "";
  int rc = ts_store_check_slices(s, ptr, n, err, sizeof err);
  if (rc != want)
    fail_msg("check_slices returned %d (%s), want %d (%s); message '%s'", rc, ts_err_name(rc), want,
             ts_err_name(want), err);
  if (needle) assert_contains(err, needle);
}

static void test_check_slices(void **state) {
  (void)state;
  const setup_t u = {3, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 1);
  Tessera__PartSlice sl[4];
  sl[0] = slice(0, 0, 250);
  expect_slices(&s, sl, 1, TS_ENOTDECLARED, "no model is declared on shard 1");
  expect_slices(&s, sl, 0, TS_ENOTDECLARED, NULL);

  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  /* A partition held here and one held elsewhere. */
  const ts_part_t *mine = s.parts[0].plan;
  size_t oi = SIZE_MAX;
  for (size_t i = 0; i < s.plan.num_parts; i++)
    if (s.plan.parts[i].shard != 1) oi = i;
  assert_true(oi < s.plan.num_parts);
  const ts_part_t *other = &s.plan.parts[oi];

  expect_slices(&s, sl, 0, 0, NULL);
  sl[0] = slice(mine->tensor, mine->part, mine->count);
  expect_slices(&s, sl, 1, 0, NULL);

  sl[1] = slice(4, 0, 10);
  expect_slices(&s, sl, 2, TS_ENOTENSOR, "unknown tensor index 4 (the model has 4 tensors)");
  sl[1] = slice(UINT32_MAX, 0, 10);
  expect_slices(&s, sl, 2, TS_ENOTENSOR, "unknown tensor index");

  sl[1] = slice(other->tensor, other->part, other->count);
  char want[128];
  snprintf(want, sizeof want, "'%s' partition %u is not held by shard 1",
           s.tensors[other->tensor].name, other->part);
  expect_slices(&s, sl, 2, TS_ENOTENSOR, want);

  sl[1] = slice(1, 7, 30); /* fc1/b has one partition */
  expect_slices(&s, sl, 2, TS_ENOTENSOR, "'fc1/b' partition 7");

  sl[1] = slice(mine->tensor, mine->part, mine->count + 1);
  snprintf(want, sizeof want, "'%s' partition %u has %llu values, not %llu",
           s.tensors[mine->tensor].name, mine->part, (unsigned long long)mine->count,
           (unsigned long long)mine->count + 1);
  expect_slices(&s, sl, 2, TS_ESHAPE, want);
  sl[1] = slice(mine->tensor, mine->part, 0);
  expect_slices(&s, sl, 2, TS_ESHAPE, "not 0");

  /* Every partition of this shard at once. */
  Tessera__PartSlice all[8];
  assert_true(s.num_parts <= 8);
  for (size_t i = 0; i < s.num_parts; i++)
    all[i] = slice(s.parts[i].plan->tensor, s.parts[i].plan->part, s.parts[i].plan->count);
  expect_slices(&s, all, s.num_parts, 0, NULL);
  ts_store_free(&s);
}

/* --- async ------------------------------------------------------------------------------ */

static void sgd_ref(float *w, const float *g, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) w[i] -= LR * scale * g[i];
}

static void test_async_push(void **state) {
  (void)state;
  const setup_t u = {1, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  ts_spart_t *p = ts_store_find(&s, 0, 3);
  assert_non_null(p);
  size_t n = p->plan->count;
  float *g = malloc(n * sizeof *g);
  assert_non_null(g);
  float *want = copy_w(p);
  for (int k = 1; k <= 3; k++) {
    fill_grad(g, n, 0.1f * (float)k);
    ts_store_async_push(&s, p, g);
    sgd_ref(want, g, n, 1.0f);
    check_close("async push", p->w, want, n);
    assert_int_equal(p->version, (uint64_t)k);
    assert_int_equal(p->updates, (uint64_t)k);
    assert_int_equal(s.applied, (uint64_t)k);
  }
  /* Other partitions did not move. */
  assert_int_equal(ts_store_find(&s, 0, 2)->version, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  /* writer_done with no writer and nothing pending is a no-op. */
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 0);
  assert_int_equal(p->version, 3);
  free(g);
  free(want);
  ts_store_free(&s);
}

static void test_async_waits_for_writers(void **state) {
  (void)state;
  const setup_t u = {1, 2, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  ts_spart_t *p = ts_store_find(&s, 2, 1);
  assert_non_null(p);
  size_t n = p->plan->count;
  float *g = malloc(n * sizeof *g);
  assert_non_null(g);
  float *w0 = copy_w(p), *want = copy_w(p);

  p->writers = 2; /* two pull replies are being written from p->w */
  fill_grad(g, n, -0.2f);
  assert_false(ts_store_async_push(&s, p, g));
  check_equal("a push must not touch w while it is written", p->w, w0, n);
  assert_int_equal(p->version, 0);
  assert_int_equal(s.applied, 0);
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 1);
  assert_false(ts_store_async_push(&s, p, g));
  assert_false(ts_store_writer_done(&s, p)); /* no sync update waited: nothing applied */
  assert_int_equal(p->writers, 0);
  check_equal("writers done, push not retried yet", p->w, w0, n);
  /* The caller retries once the writers are done: applied as usual. */
  assert_true(ts_store_async_push(&s, p, g));
  sgd_ref(want, g, n, 1.0f);
  check_close("retried push", p->w, want, n);
  assert_int_equal(p->version, 1);
  assert_false(ts_store_writer_done(&s, p));
  assert_int_equal(p->writers, 0);
  free(g);
  free(w0);
  free(want);
  ts_store_free(&s);
}

/* --- sync ------------------------------------------------------------------------------- */

typedef struct {
  ts_store_t s;
  ts_spart_t *p;
  size_t n;
  float *g0, *g1, *g2, *want;
} sync_fx_t;

static void sync_setup(sync_fx_t *f, ts_optimizer_t opt) {
  const setup_t u = {2, 3, TS_MODE_SYNC, 1024, opt};
  store_init(&f->s, &u, 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&f->s, &x);
  f->p = first_part(&f->s);
  f->n = f->p->plan->count;
  f->g0 = malloc(f->n * sizeof(float));
  f->g1 = malloc(f->n * sizeof(float));
  f->g2 = malloc(f->n * sizeof(float));
  assert_non_null(f->g0);
  assert_non_null(f->g1);
  assert_non_null(f->g2);
  fill_grad(f->g0, f->n, 0.25f);
  fill_grad(f->g1, f->n, -0.5f);
  fill_grad(f->g2, f->n, 2.0f);
  f->want = copy_w(f->p);
}

static void sync_teardown(sync_fx_t *f) {
  free(f->g0);
  free(f->g1);
  free(f->g2);
  free(f->want);
  ts_store_free(&f->s);
}

static void expect_push(sync_fx_t *f, const float *g, int task, uint64_t step,
                        Tessera__PushResult want) {
  Tessera__PushResult r = ts_store_sync_push(&f->s, f->p, g, task, step, 1000 + step, 2);
  if (r != want)
    fail_msg("task %d step %llu: push result %d, want %d", task, (unsigned long long)step, (int)r,
             (int)want);
}

static void test_sync_barrier(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_SGD);
  ts_spart_t *p = f.p;
  float *w0 = copy_w(p);

  expect_push(&f, f.g0, 0, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(p->opened_ms, 1000);
  expect_push(&f, f.g1, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  /* Task 0 again: a duplicate, not counted. */
  expect_push(&f, f.g2, 0, 0, TESSERA__PUSH_RESULT__PUSH_DUPLICATE);
  assert_int_equal(p->accum_n, 2);
  check_equal("nothing applied before the barrier closes", p->w, w0, f.n);
  assert_int_equal(p->version, 0);

  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * (0.5f * (f.g0[i] + f.g1[i]));
  check_close("mean of two gradients applied once", p->w, f.want, f.n);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->updates, 1);
  assert_int_equal(f.s.applied, 1);
  assert_int_equal(p->accum_n, 0);
  for (uint32_t t = 0; t < 3; t++) assert_int_equal(p->contributed[t], 0);
  /* Nothing to complete now. */
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 1);

  /* A late push for step 0 is stale: dropped and counted. */
  float *w1 = copy_w(p);
  expect_push(&f, f.g2, 2, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 1);
  assert_int_equal(p->accum_n, 0);
  check_equal("stale push changes nothing", p->w, w1, f.n);

  /* Step 1: task 0 may push again; three gradients averaged. */
  expect_push(&f, f.g0, 0, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 2, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g2, 1, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g2, 1, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 2);
  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++)
    f.want[i] -= LR * ((f.g0[i] + f.g1[i] + f.g2[i]) * (1.0f / 3.0f));
  check_close("mean of three", p->w, f.want, f.n);
  assert_int_equal(p->version, 2);
  assert_int_equal(ts_store_min_version(&f.s), f.s.num_parts == 1 ? 2 : 0);
  free(w0);
  free(w1);
  sync_teardown(&f);
}

static void test_sync_deferred_by_writers(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_SGD);
  ts_spart_t *p = f.p;
  float *w0 = copy_w(p);
  expect_push(&f, f.g0, 0, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  p->writers = 2;
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_true(p->apply_pending);
  assert_int_equal(p->version, 0);
  check_equal("apply waits for the writers", p->w, w0, f.n);
  /* Completing again while pending does nothing more. */
  assert_false(ts_store_sync_complete(&f.s, p));

  /* Task 2 arrives late for step 0: the barrier is closed, so it is stale. */
  expect_push(&f, f.g2, 2, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 1);
  /* And task 0 again for step 0 also stale (not duplicate). */
  expect_push(&f, f.g2, 0, 0, TESSERA__PUSH_RESULT__PUSH_STALE);
  assert_int_equal(f.s.stale_dropped, 2);
  assert_int_equal(p->accum_n, 2);

  assert_false(ts_store_writer_done(&f.s, p));
  check_equal("one writer left", p->w, w0, f.n);
  assert_true(ts_store_writer_done(&f.s, p));
  assert_false(p->apply_pending);
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * (0.5f * (f.g0[i] + f.g1[i]));
  check_close("applied when the last writer finished", p->w, f.want, f.n);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->updates, 1);
  assert_int_equal(p->accum_n, 0);

  /* The next step is open to every task. */
  expect_push(&f, f.g2, 2, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g0, 0, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_true(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 2);
  free(w0);
  sync_teardown(&f);
}

/* One gradient closes a barrier (the timeout path with one live worker); tasks outside
 * [0, num_workers) are not tracked for duplicates. Momentum state moves once per barrier. */
static void test_sync_single_and_untracked(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_MOMENTUM);
  ts_spart_t *p = f.p;
  expect_push(&f, f.g0, 1, 0, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_true(ts_store_sync_complete(&f.s, p));
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * f.g0[i];
  check_close("one gradient", p->w, f.want, f.n);
  check_close("velocity", p->s0, f.g0, f.n);

  expect_push(&f, f.g1, -1, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  expect_push(&f, f.g1, 7, 1, TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_int_equal(p->accum_n, 2);
  assert_true(ts_store_sync_complete(&f.s, p));
  assert_int_equal(p->version, 2);
  sync_teardown(&f);
}

/* A barrier that one gradient closes applies it straight from the caller's buffer; with
 * writers, or a second gradient needed, it goes through the accumulator as before. */
static void test_sync_direct_apply(void **state) {
  (void)state;
  sync_fx_t f;
  sync_setup(&f, TS_OPT_MOMENTUM);
  ts_spart_t *p = f.p;
  Tessera__PushResult r = ts_store_sync_push(&f.s, p, f.g0, 0, 0, 1000, 1);
  assert_int_equal(r, TESSERA__PUSH_RESULT__PUSH_APPLIED);
  assert_int_equal(p->version, 1);
  assert_int_equal(p->accum_n, 0);
  assert_int_equal(ts_store_sync_count(p), 0);
  for (size_t i = 0; i < f.n; i++) f.want[i] -= LR * f.g0[i];
  check_close("direct apply", p->w, f.want, f.n);
  /* The same step again: stale. */
  assert_int_equal(ts_store_sync_push(&f.s, p, f.g1, 1, 0, 1001, 1), TESSERA__PUSH_RESULT__PUSH_STALE);
  /* With a writer the gradient waits in the accumulator. */
  p->writers = 1;
  assert_int_equal(ts_store_sync_push(&f.s, p, f.g1, 0, 1, 1002, 1),
                   TESSERA__PUSH_RESULT__PUSH_ACCUMULATED);
  assert_false(ts_store_sync_complete(&f.s, p));
  assert_true(ts_store_writer_done(&f.s, p));
  assert_int_equal(p->version, 2);
  sync_teardown(&f);
}

static void test_min_version(void **state) {
  (void)state;
  const setup_t u = {2, 1, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  ts_store_t s;
  store_init(&s, &u, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  decl_t x;
  model(&x, SEED);
  declare_ok(&s, &x);
  assert_true(s.num_parts >= 2);
  float *g = calloc(3000, sizeof *g);
  assert_non_null(g);
  for (size_t i = 0; i < s.num_parts; i++)
    for (size_t k = 0; k < 2 + i; k++) ts_store_async_push(&s, &s.parts[i], g);
  assert_int_equal(ts_store_min_version(&s), 2);
  ts_store_async_push(&s, &s.parts[0], g);
  assert_int_equal(ts_store_min_version(&s), 3);
  ts_store_free(&s);

  /* A shard that holds no partition. */
  const setup_t many = {8, 1, TS_MODE_ASYNC, 1024, TS_OPT_SGD};
  store_init(&s, &many, 7);
  decl_init(&x, SEED);
  decl_add(&x, "tiny", TESSERA__INIT__INIT_ONES, 1, (const uint64_t[]){3});
  declare_ok(&s, &x);
  assert_int_equal(s.num_parts, 0);
  assert_int_equal(s.bytes, 0);
  assert_int_equal(ts_store_min_version(&s), 0);
  assert_null(ts_store_find(&s, 0, 0));
  free(g);
  ts_store_free(&s);
}

/* --- allocation failure ----------------------------------------------------------------- */

static void alloc_failure_case(const setup_t *u, uint32_t shard) {
  decl_t x;
  model(&x, SEED);
  ts_store_t ref;
  store_init(&ref, u, shard);
  declare_ok(&ref, &x);

  int n;
  for (n = 1; n < 1000; n++) {
    ts_store_t s;
    store_init(&s, u, shard);
    char err[256] = "";
    bool created = true;
    ts_alloc_fail_after(n);
    int rc = ts_store_declare(&s, &x.d, &created, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      assert_true(created);
      ts_store_free(&s);
      break;
    }
    if (rc != TS_ENOMEM)
      fail_msg("allocation %d failing: declare returned %d (%s) '%s'", n, rc, ts_err_name(rc), err);
    assert_false(created);
    assert_contains(err, "out of memory");
    assert_false(s.declared);
    assert_null(s.tensors);
    assert_null(s.parts);
    assert_null(s.local);
    assert_null(s.plan.parts);
    assert_int_equal(s.num_tensors, 0);
    assert_int_equal(s.num_parts, 0);
    assert_int_equal(s.bytes, 0);
    assert_int_equal(s.state_bytes, 0);
    /* The same store declares fine once memory is back, with the same values. */
    declare_ok(&s, &x);
    assert_int_equal(s.num_parts, ref.num_parts);
    for (size_t i = 0; i < s.num_parts; i++)
      check_equal("after a failed declare", s.parts[i].w, ref.parts[i].w, s.parts[i].plan->count);
    ts_store_free(&s);
  }
  assert_true(n > 5);
  assert_true(n < 1000);
  ts_store_free(&ref);
}

static void test_declare_alloc_failure(void **state) {
  (void)state;
  const setup_t a = {3, 2, TS_MODE_SYNC, 1024, TS_OPT_ADAM};
  alloc_failure_case(&a, 0);
  alloc_failure_case(&a, 2);
  const setup_t b = {2, 1, TS_MODE_ASYNC, 1024, TS_OPT_MOMENTUM};
  alloc_failure_case(&b, 1);
  const setup_t c = {1, 1, TS_MODE_ASYNC, 1 << 20, TS_OPT_SGD};
  alloc_failure_case(&c, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_declare_partitions),
      cmocka_unit_test(test_declare_seed),
      cmocka_unit_test(test_declare_buffers),
      cmocka_unit_test(test_redeclare),
      cmocka_unit_test(test_declare_invalid),
      cmocka_unit_test(test_check_slices),
      cmocka_unit_test(test_async_push),
      cmocka_unit_test(test_async_waits_for_writers),
      cmocka_unit_test(test_sync_barrier),
      cmocka_unit_test(test_sync_deferred_by_writers),
      cmocka_unit_test(test_sync_single_and_untracked),
      cmocka_unit_test(test_sync_direct_apply),
      cmocka_unit_test(test_min_version),
      cmocka_unit_test(test_declare_alloc_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
