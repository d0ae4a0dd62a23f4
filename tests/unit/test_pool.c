/*
 * GPU memory without a GPU: the pool allocator (kernels/ts_pool.h) over host memory standing
 * in for device chunks, the memory-policy arithmetic (ts_gpu_memory_plan), and the CUDA back
 * end's entry points on a machine with no GPU (a clean TS_EDEVICE, never a crash).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_kernels_cuda.h"
#include "ts_pool.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* Backing "device" memory: host memory, with counts so tests see every chunk come and go. */
typedef struct {
  int chunks_live;
  size_t bytes_live;
  size_t fail_above; /* refuse chunks above this many bytes (0 = never) */
} backing_t;

static int fake_alloc(void *arg, size_t bytes, void **out, char *errmsg, size_t errlen) {
  backing_t *b = arg;
  if (b->fail_above && bytes > b->fail_above) {
    ts_errmsg_printf(errmsg, errlen, "fake cudaMalloc(%zu): out of memory", bytes);
    return TS_ENOMEM;
  }
  *out = aligned_alloc(TS_POOL_ALIGN, (bytes + TS_POOL_ALIGN - 1) / TS_POOL_ALIGN * TS_POOL_ALIGN);
  if (!*out) return TS_ENOMEM;
  b->chunks_live++;
  b->bytes_live += bytes;
  return 0;
}

static void fake_free(void *arg, void *chunk) {
  backing_t *b = arg;
  b->chunks_live--;
  free(chunk);
}

static ts_pool_opts_t opts(backing_t *b, size_t reserve, size_t limit, bool grow) {
  ts_pool_opts_t o = {.reserve = reserve,
                      .limit = limit,
                      .grow = grow,
                      .min_chunk = MIB,
                      .backing_alloc = fake_alloc,
                      .backing_free = fake_free,
                      .arg = b,
                      .name = "GPU 0",
                      .limit_reason = "device.memory_fraction = 0.5"};
  return o;
}

static void test_pool_invalid(void **state) {
  (void)state;
  ts_pool_t *p = (ts_pool_t *)1;
  char err[256] = "";
  assert_int_equal(ts_pool_create(NULL, &p, err, sizeof err), TS_EINVAL);
  assert_null(p);
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, 4 * MIB, 2 * MIB, false);
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), TS_EINVAL); /* reserve > limit */
  o = opts(&b, 0, 0, true);
  o.backing_alloc = NULL;
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), TS_EINVAL);
  o = opts(&b, MIB, 0, false);
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), 0);
  void *x = NULL;
  assert_int_equal(ts_pool_alloc(p, 10, NULL, err, sizeof err), TS_EINVAL);
  assert_int_equal(ts_pool_free(p, NULL), 0);
  int local;
  assert_int_equal(ts_pool_free(p, &local), TS_EINVAL); /* not from the pool */
  assert_int_equal(ts_pool_alloc(p, SIZE_MAX, &x, err, sizeof err), TS_ENOMEM);
  assert_null(x);
  ts_pool_destroy(p);
  assert_int_equal(b.chunks_live, 0);
  ts_pool_destroy(NULL);
}

/* A reserved pool never grows: it hands out its reserve exactly, then says how much it has. */
static void test_pool_fraction_never_exceeded(void **state) {
  (void)state;
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, 4 * MIB, 4 * MIB, false);
  ts_pool_t *p = NULL;
  char err[512] = "";
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), 0);
  assert_int_equal(b.chunks_live, 1);
  void *a = NULL, *c = NULL, *d = NULL;
  assert_int_equal(ts_pool_alloc(p, 3 * MIB, &a, err, sizeof err), 0);
  assert_int_equal((uintptr_t)a % TS_POOL_ALIGN, 0);
  assert_int_equal(ts_pool_alloc(p, MIB, &c, err, sizeof err), 0);
  assert_int_equal(ts_pool_alloc(p, 1, &d, err, sizeof err), TS_ENOMEM);
  assert_null(d);
  assert_contains(err, "GPU 0: out of memory under device.memory_fraction = 0.5");
  assert_contains(err, "at most 4.0 MiB");
  assert_contains(err, "4.0 MiB are in use");
  assert_contains(err, "256 B more asked");
  assert_int_equal(b.chunks_live, 1); /* no growth behind the limit's back */
  ts_pool_stats_t st;
  ts_pool_stats(p, &st);
  assert_int_equal(st.held, 4 * MIB);
  assert_int_equal(st.in_use, 4 * MIB);
  assert_int_equal(st.blocks, 2);
  /* Freed memory is reused. */
  assert_int_equal(ts_pool_free(p, c), 0);
  assert_int_equal(ts_pool_alloc(p, MIB, &d, err, sizeof err), 0);
  assert_ptr_equal(c, d);
  assert_int_equal(ts_pool_free(p, a), 0);
  assert_int_equal(ts_pool_free(p, a), TS_EINVAL); /* twice */
  assert_int_equal(ts_pool_free(p, d), 0);
  ts_pool_stats(p, &st);
  assert_int_equal(st.in_use, 0);
  assert_int_equal(st.peak, 4 * MIB);
  assert_int_equal(st.largest_free, 4 * MIB); /* neighbours merged back into one block */
  ts_pool_destroy(p);
  assert_int_equal(b.chunks_live, 0);
}

static void test_pool_growth(void **state) {
  (void)state;
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, 0, 0, true);
  ts_pool_t *p = NULL;
  char err[512] = "";
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), 0);
  assert_int_equal(b.chunks_live, 0); /* allow_growth: nothing up front */
  void *x[40];
  for (int i = 0; i < 40; i++) {
    assert_int_equal(ts_pool_alloc(p, 100 * 1024, &x[i], err, sizeof err), 0);
    for (int j = 0; j < i; j++) assert_true(x[j] != x[i]);
  }
  assert_true(b.chunks_live >= 4); /* 40 x 100 KiB over 1 MiB chunks */
  void *big = NULL;
  assert_int_equal(ts_pool_alloc(p, 5 * MIB, &big, err, sizeof err), 0); /* a chunk its size */
  ts_pool_stats_t st;
  ts_pool_stats(p, &st);
  assert_int_equal(st.chunks, (size_t)b.chunks_live);
  assert_int_equal(st.blocks, 41);
  /* Zero bytes: a unique block. */
  void *z1 = NULL, *z2 = NULL;
  assert_int_equal(ts_pool_alloc(p, 0, &z1, err, sizeof err), 0);
  assert_int_equal(ts_pool_alloc(p, 0, &z2, err, sizeof err), 0);
  assert_true(z1 && z2 && z1 != z2);
  /* The backing refusing a chunk: its reason comes through. */
  b.fail_above = 2 * MIB;
  void *huge = NULL;
  assert_int_equal(ts_pool_alloc(p, 64 * MIB, &huge, err, sizeof err), TS_ENOMEM);
  assert_contains(err, "fake cudaMalloc");
  assert_contains(err, "growing the pool");
  for (int i = 0; i < 40; i += 2) assert_int_equal(ts_pool_free(p, x[i]), 0);
  ts_pool_destroy(p); /* frees chunks with blocks still out */
  assert_int_equal(b.chunks_live, 0);
}

/* Growth under a limit takes what still fits, then stops. */
static void test_pool_growth_capped(void **state) {
  (void)state;
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, 0, 3 * MIB, true);
  o.limit_reason = "a test limit";
  ts_pool_t *p = NULL;
  char err[512] = "";
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), 0);
  void *a = NULL, *c = NULL, *d = NULL;
  assert_int_equal(ts_pool_alloc(p, 2 * MIB, &a, err, sizeof err), 0);
  assert_int_equal(ts_pool_alloc(p, MIB / 2, &c, err, sizeof err), 0);
  assert_int_equal(ts_pool_alloc(p, MIB, &d, err, sizeof err), TS_ENOMEM);
  assert_contains(err, "under a test limit");
  ts_pool_stats_t st;
  ts_pool_stats(p, &st);
  assert_true(st.held <= 3 * MIB);
  ts_pool_destroy(p);
  assert_int_equal(b.chunks_live, 0);
}

static void test_pool_host_alloc_failure(void **state) {
  (void)state;
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, MIB, 0, true);
  for (long n = 1; n <= 4; n++) {
    ts_pool_t *p = NULL;
    char err[256] = "";
    ts_alloc_fail_after(n);
    int rc = ts_pool_create(&o, &p, err, sizeof err);
    void *x = NULL;
    if (rc == 0) rc = ts_pool_alloc(p, 100, &x, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0)
      assert_non_null(x);
    else
      assert_int_equal(rc, TS_ENOMEM);
    ts_pool_destroy(p);
    assert_int_equal(b.chunks_live, 0);
  }
}

/* --- the memory policy ----------------------------------------------------------------- */

/* memory_fraction without allow_growth: TensorFlow's per_process_gpu_memory_fraction, the
 * fraction reserved up front and never exceeded. */
static void test_plan_fraction(void **state) {
  (void)state;
  ts_gpu_memory_plan_t pl;
  char err[256] = "";
  size_t total = 140 * GIB, free_b = 138 * GIB;
  ts_gpu_memory_policy_t pol = {.allow_growth = false, .memory_fraction = 0.25};
  assert_int_equal(ts_gpu_memory_plan(0, total, free_b, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve, 35 * GIB);
  assert_int_equal(pl.limit, 35 * GIB);
  assert_int_equal(pl.usable, 35 * GIB);
  assert_false(pl.grow);
  assert_contains(pl.summary, "reserving 35.0 GiB (37580963840 bytes) up front");
  assert_contains(pl.summary, "device.memory_fraction = 0.25 of 140.0 GiB");
  assert_string_equal(pl.limit_reason, "device.memory_fraction = 0.25");
  /* Rounded down to 2 MiB, at least 2 MiB. */
  pol.memory_fraction = 0.3;
  assert_int_equal(
      ts_gpu_memory_plan(0, 1000 * MIB + 12345, 1000 * MIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve % TS_GPU_MEMORY_GRANULE, 0);
  assert_true(pl.reserve <= (size_t)(0.3 * (double)(1000 * MIB + 12345)));
  assert_true(pl.reserve > (size_t)(0.3 * (double)(1000 * MIB)) - TS_GPU_MEMORY_GRANULE);
  pol.memory_fraction = 1e-9;
  assert_int_equal(ts_gpu_memory_plan(0, total, free_b, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve, TS_GPU_MEMORY_GRANULE);
  /* More than is free: a clear error naming the key, the need and what is free. */
  pol.memory_fraction = 0.9;
  assert_int_equal(ts_gpu_memory_plan(3, total, 100 * GIB, &pol, &pl, err, sizeof err), TS_ENOMEM);
  assert_contains(err, "GPU 3: device.memory_fraction = 0.9 asks for 126.0 GiB of its 140.0 GiB");
  assert_contains(err, "only 100.0 GiB are free");
  /* Out of range, with or without growth. */
  pol.allow_growth = true;
  pol.memory_fraction = 1.5;
  assert_int_equal(ts_gpu_memory_plan(0, total, free_b, &pol, &pl, err, sizeof err), TS_EINVAL);
  pol.memory_fraction = -0.1;
  assert_int_equal(ts_gpu_memory_plan(0, total, free_b, &pol, &pl, err, sizeof err), TS_EINVAL);
  assert_int_equal(ts_gpu_memory_plan(0, total, free_b, NULL, &pl, err, sizeof err), TS_EINVAL);
}

/* allow_growth and memory_fraction together: TensorFlow's allow_growth under
 * per_process_gpu_memory_fraction. Nothing up front, growth on demand, never beyond the
 * fraction; the pool made from the plan enforces it while growing. */
static void test_plan_growth_up_to_fraction(void **state) {
  (void)state;
  ts_gpu_memory_plan_t pl;
  char err[512] = "";
  ts_gpu_memory_policy_t pol = {.allow_growth = true, .memory_fraction = 0.25};
  assert_int_equal(ts_gpu_memory_plan(0, 140 * GIB, 138 * GIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve, 0);
  assert_int_equal(pl.limit, 35 * GIB);
  assert_int_equal(pl.usable, 35 * GIB);
  assert_true(pl.grow);
  assert_string_equal(pl.summary,
                      "growing on demand up to 35.0 GiB (37580963840 bytes): device.allow_growth "
                      "= true, device.memory_fraction = 0.25 of 140.0 GiB (138.0 GiB free)");
  assert_string_equal(pl.limit_reason,
                      "device.memory_fraction = 0.25 with device.allow_growth = true");
  /* Rounded down to 2 MiB like a reservation, at least 2 MiB. */
  pol.memory_fraction = 0.3;
  assert_int_equal(
      ts_gpu_memory_plan(0, 1000 * MIB + 12345, 1000 * MIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.limit % TS_GPU_MEMORY_GRANULE, 0);
  assert_int_equal(pl.limit, 300 * MIB);
  pol.memory_fraction = 1e-9;
  assert_int_equal(ts_gpu_memory_plan(0, 140 * GIB, 138 * GIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.limit, TS_GPU_MEMORY_GRANULE);
  /* Nothing is reserved, so a limit above what is free now is no error: other processes may
   * free memory, and cudaMalloc says so when they have not. */
  pol.memory_fraction = 0.9;
  assert_int_equal(ts_gpu_memory_plan(3, 140 * GIB, 100 * GIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.limit, 126 * GIB);

  /* The pool from a plan for a 40 MiB GPU at 0.1: 4 MiB at most, grown in 1 MiB chunks of
   * two 512 KiB blocks each. */
  pol.memory_fraction = 0.1;
  assert_int_equal(ts_gpu_memory_plan(0, 40 * MIB, 40 * MIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.limit, 4 * MIB);
  backing_t b = {0};
  ts_pool_opts_t o = opts(&b, pl.reserve, pl.limit, pl.grow);
  o.limit_reason = pl.limit_reason;
  ts_pool_t *p = NULL;
  assert_int_equal(ts_pool_create(&o, &p, err, sizeof err), 0);
  assert_int_equal(b.chunks_live, 0); /* nothing up front */
  void *x[10] = {0};
  int got = 0;
  while (got < 10 && ts_pool_alloc(p, 512 * 1024, &x[got], err, sizeof err) == 0) {
    ts_pool_stats_t st;
    ts_pool_stats(p, &st);
    assert_true(st.held <= pl.limit);
    got++;
  }
  assert_int_equal(got, 8); /* 8 x 512 KiB fill 4 MiB; the ninth does not fit */
  assert_contains(err,
                  "GPU 0: out of memory under device.memory_fraction = 0.1 with "
                  "device.allow_growth = true: the pool may hold at most 4.0 MiB");
  assert_contains(err, "512.0 KiB more asked");
  ts_pool_stats_t st;
  ts_pool_stats(p, &st);
  assert_true(st.held <= 4 * MIB);
  assert_int_equal(st.held, 4 * MIB);
  assert_int_equal(st.chunks, 4); /* it grew four times, then stopped at the limit */
  assert_int_equal(st.held, b.bytes_live);
  /* Freed memory is reused without growing past the limit. */
  assert_int_equal(ts_pool_free(p, x[0]), 0);
  void *again = NULL;
  assert_int_equal(ts_pool_alloc(p, 512 * 1024, &again, err, sizeof err), 0);
  assert_ptr_equal(again, x[0]);
  ts_pool_stats(p, &st);
  assert_true(st.held <= 4 * MIB);
  ts_pool_destroy(p);
  assert_int_equal(b.chunks_live, 0);
}

static void test_plan_growth_and_default(void **state) {
  (void)state;
  ts_gpu_memory_plan_t pl;
  char err[256] = "";
  ts_gpu_memory_policy_t pol = {.allow_growth = true, .memory_fraction = 0.0};
  assert_int_equal(ts_gpu_memory_plan(0, 80 * GIB, 79 * GIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve, 0);
  assert_int_equal(pl.limit, 0);
  assert_true(pl.grow);
  assert_int_equal(pl.usable, 79 * GIB); /* all that is free, for the "Created device" line */
  assert_string_equal(pl.summary,
                      "growing on demand (device.allow_growth = true; 79.0 GiB of "
                      "80.0 GiB free)");
  assert_string_equal(pl.limit_reason, "");
  /* TensorFlow's default without allow_growth: most of the free memory, up front. */
  pol.allow_growth = false;
  assert_int_equal(ts_gpu_memory_plan(0, 80 * GIB, 70 * GIB, &pol, &pl, err, sizeof err), 0);
  assert_int_equal(pl.reserve, 63 * GIB);
  assert_int_equal(pl.limit, 63 * GIB);
  assert_int_equal(pl.usable, 63 * GIB);
  assert_false(pl.grow);
  assert_int_equal(ts_gpu_memory_plan(0, 80 * GIB, MIB, &pol, &pl, err, sizeof err), TS_ENOMEM);
  assert_contains(err, "only 1.0 MiB of 80.0 GiB are free");
}

static void test_format_bytes(void **state) {
  (void)state;
  char b[32];
  assert_string_equal(ts_pool_format_bytes(100, b, sizeof b), "100 B");
  assert_string_equal(ts_pool_format_bytes(1536, b, sizeof b), "1.5 KiB");
  assert_string_equal(ts_pool_format_bytes(256 * MIB, b, sizeof b), "256.0 MiB");
  assert_string_equal(ts_pool_format_bytes(3 * GIB / 2, b, sizeof b), "1.5 GiB");
}

/* --- the CUDA back end where there is no GPU --------------------------------------------- */

static void test_cuda_without_gpu(void **state) {
  (void)state;
  char why[256] = "";
  if (ts_gpu_count(why, sizeof why) > 0) skip(); /* a GPU machine: tests/gpu covers it */
  assert_true(why[0] != 0);
  ts_kernels_t *k = (ts_kernels_t *)1;
  char err[512] = "";
  assert_int_equal(ts_kernels_cuda_create(0, NULL, &k, err, sizeof err), TS_EDEVICE);
  assert_null(k);
  assert_true(err[0] != 0);
  ts_kernels_cuda_destroy(NULL);
  size_t fr = 1, tot = 1;
  assert_int_equal(ts_gpu_memory(0, &fr, &tot), TS_EDEVICE);
  ts_kernels_cuda_nccl_t *c = (ts_kernels_cuda_nccl_t *)1;
  assert_int_equal(ts_kernels_cuda_nccl_create(NULL, 2, &c, err, sizeof err) < 0, 1);
  assert_null(c);
  /* The placement table says which ops a GPU could run, built or not. */
  const ts_kernels_t *ops = ts_kernels_cuda_ops();
  if (ts_kernels_cuda_built()) {
    assert_non_null(ops);
    assert_non_null(ops->gemm);
    assert_non_null(ops->softmax_xent);
    assert_non_null(ops->argmax_correct);
    assert_false(ops->device_is_host);
    float x = 0.0f;
    assert_int_equal(ops->fill(ops, 1, 0.0f, &x), TS_EINVAL); /* no context: never runs */
    assert_non_null(ops->mul);
    assert_int_equal(ops->mul(ops, 1, &x, &x, &x), TS_EINVAL);
    /* Convolution and max pooling exactly where cuDNN is built in; never run without a GPU. */
    bool dnn = ts_kernels_cuda_have_cudnn();
    assert_int_equal(ops->conv2d_workspace != NULL, dnn);
    assert_int_equal(ops->conv2d_fwd != NULL, dnn);
    assert_int_equal(ops->conv2d_bwd_data != NULL, dnn);
    assert_int_equal(ops->conv2d_bwd_filter != NULL, dnn);
    assert_int_equal(ops->maxpool_fwd != NULL, dnn);
    assert_int_equal(ops->maxpool_bwd != NULL, dnn);
    if (dnn) {
      ts_conv2d_t g;
      assert_int_equal(ts_conv_geometry(&g, 1, 4, 4, 1, 3, 3, 1, 1, TS_PAD_SAME, 2), 0);
      assert_int_equal(ops->conv2d_workspace(ops, &g), 0);
      assert_int_equal(ops->conv2d_fwd(ops, &g, &x, &x, &x, &x, 4), TS_EINVAL);
      int32_t am = 0;
      assert_int_equal(ops->maxpool_fwd(ops, &g, &x, &x, &am), TS_EINVAL);
    }
  } else {
    assert_null(ops);
    assert_false(ts_kernels_cuda_have_nccl());
    assert_false(ts_kernels_cuda_have_cudnn());
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_invalid),
      cmocka_unit_test(test_pool_fraction_never_exceeded),
      cmocka_unit_test(test_pool_growth),
      cmocka_unit_test(test_pool_growth_capped),
      cmocka_unit_test(test_pool_host_alloc_failure),
      cmocka_unit_test(test_plan_fraction),
      cmocka_unit_test(test_plan_growth_up_to_fraction),
      cmocka_unit_test(test_plan_growth_and_default),
      cmocka_unit_test(test_format_bytes),
      cmocka_unit_test(test_cuda_without_gpu),
  };
  return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
