/*
 * The shard store (server/ts_store.h) without a network: declaring the model (this shard's
 * partitions only, deterministic initial values, redeclare rules), slice checks, and
 * allocation failure during declare. Pushes (async and the sync barrier) and the lowest
 * version are in test_store_push.c.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"
#include "ts_init.h"
#include "ts_plan.h"

/* --- helpers ---------------------------------------------------------------------------- */

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* The element counts of model()'s four tensors. */
static const uint64_t model_elems[] = {3000, 30, 300, 10};

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
      cmocka_unit_test(test_declare_alloc_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
