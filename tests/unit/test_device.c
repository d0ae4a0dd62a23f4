/*
 * Worker devices (worker/ts_device.h): TensorFlow-style device specs, placement of a model's
 * ops with and without soft placement (and TensorFlow's exact error text), and the names
 * used in device-placement logs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_device.h"
#include "ts_err.h"

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

typedef struct {
  const char *spec;
  ts_device_type_t type;
  int index;
  bool has_job, has_replica, has_task;
  const char *job;
  int replica, task;
} good_t;

static void test_parse_accepts(void **state) {
  (void)state;
  const good_t good[] = {
      {"/cpu:0", TS_DEVICE_CPU, 0, false, false, false, "", 0, 0},
      {"/CPU:0", TS_DEVICE_CPU, 0, false, false, false, "", 0, 0},
      {"/gpu:3", TS_DEVICE_GPU, 3, false, false, false, "", 0, 0},
      {"/GPU:0", TS_DEVICE_GPU, 0, false, false, false, "", 0, 0},
      {"/device:GPU:1", TS_DEVICE_GPU, 1, false, false, false, "", 0, 0},
      {"/device:gpu:0", TS_DEVICE_GPU, 0, false, false, false, "", 0, 0},
      {"/device:CPU:0", TS_DEVICE_CPU, 0, false, false, false, "", 0, 0},
      {"/job:worker/replica:0/task:2/device:GPU:1", TS_DEVICE_GPU, 1, true, true, true, "worker", 0,
       2},
      {"/job:localhost/replica:0/task:0/device:CPU:0", TS_DEVICE_CPU, 0, true, true, true,
       "localhost", 0, 0},
      {"/task:5/gpu:2", TS_DEVICE_GPU, 2, false, false, true, "", 0, 5},
      {"/gpu:999999", TS_DEVICE_GPU, 999999, false, false, false, "", 0, 0},
      {"", TS_DEVICE_CPU, 0, false, false, false, "", 0, 0},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    const good_t *g = &good[i];
    ts_device_spec_t d;
    char err[256] = "";
    memset(&d, 0xa5, sizeof d);
    int rc = ts_device_parse(g->spec, &d, err, sizeof err);
    if (rc != 0) fail_msg("'%s' rejected: %d %s", g->spec, rc, err);
    if (d.type != g->type || d.index != g->index)
      fail_msg("'%s': type %d index %d, want type %d index %d", g->spec, (int)d.type, d.index,
               (int)g->type, g->index);
    assert_int_equal(d.has_job, g->has_job);
    assert_int_equal(d.has_replica, g->has_replica);
    assert_int_equal(d.has_task, g->has_task);
    assert_string_equal(d.job, g->job);
    assert_int_equal(d.replica, g->replica);
    assert_int_equal(d.task, g->task);
  }
  /* NULL is the CPU too. */
  ts_device_spec_t d;
  char err[64];
  assert_int_equal(ts_device_parse(NULL, &d, err, sizeof err), 0);
  assert_int_equal(d.type, TS_DEVICE_CPU);
  assert_int_equal(d.index, 0);
}

typedef struct {
  const char *spec;
  const char *why; /* a part of the message after "malformed device name '<spec>': " */
} bad_t;

static void test_parse_rejects(void **state) {
  (void)state;
  const bad_t bad[] = {
      {"gpu:0", "must start with '/'"},
      {"/gpu:x", "the device index must be a number"},
      {"/gpu:", "the device index must be a number"},
      {"/gpu:-1", "the device index must be a number"},
      {"/cpu:1", "there is one CPU device, /cpu:0"},
      {"/tpu:0", "unknown part"},
      {"/job:ps/device:CPU:0", "job 'worker'"},
      {"/device:GPU", "/device:TYPE:INDEX"},
      {"/device:TPU:0", "the device type must be CPU or GPU"},
      {"/gpu:0/task:1", "nothing may follow the device part"},
      {"/gpu:99999999", "out of range"},
      {"/gpu", "KEY:VALUE"},
      {"/gpu:0/", "KEY:VALUE"},
      {"//gpu:0", "KEY:VALUE"},
      {"/task:x/gpu:0", "the task must be a number"},
      {"/replica:/gpu:0", "the replica must be a number"},
      {"/job:/gpu:0", "bad job name"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ts_device_spec_t d;
    char err[256] = "";
    int rc = ts_device_parse(bad[i].spec, &d, err, sizeof err);
    if (rc != TS_EINVAL) fail_msg("'%s' returned %d, want TS_EINVAL", bad[i].spec, rc);
    char head[128];
    snprintf(head, sizeof head, "malformed device name '%s': ", bad[i].spec);
    if (strncmp(err, head, strlen(head)) != 0)
      fail_msg("'%s': message '%s' does not start with '%s'", bad[i].spec, err, head);
    assert_contains(err, bad[i].why);
  }
}

static void test_names(void **state) {
  (void)state;
  char buf[96];
  ts_device_long_name(TS_DEVICE_GPU, 1, 3, buf, sizeof buf);
  assert_string_equal(buf, "/job:worker/replica:0/task:3/device:GPU:1");
  ts_device_long_name(TS_DEVICE_CPU, 0, 0, buf, sizeof buf);
  assert_string_equal(buf, "/job:worker/replica:0/task:0/device:CPU:0");
  ts_device_short_name(TS_DEVICE_GPU, 7, buf, sizeof buf);
  assert_string_equal(buf, "/device:GPU:7");
  ts_device_short_name(TS_DEVICE_CPU, 0, buf, sizeof buf);
  assert_string_equal(buf, "/device:CPU:0");
  /* Truncation keeps a terminated string. */
  char small[8];
  ts_device_long_name(TS_DEVICE_GPU, 1, 3, small, sizeof small);
  assert_string_equal(small, "/job:wo");
  /* The long name parses back to the same device. */
  ts_device_spec_t d;
  char err[128];
  ts_device_long_name(TS_DEVICE_GPU, 2, 4, buf, sizeof buf);
  assert_int_equal(ts_device_parse(buf, &d, err, sizeof err), 0);
  assert_int_equal(d.type, TS_DEVICE_GPU);
  assert_int_equal(d.index, 2);
  assert_int_equal(d.task, 4);
}

static const ts_placement_op_t ops[] = {
    {"fc1/matmul", "MatMul", true, NULL, false},
    {"fc1/bias", "BiasAdd", true, NULL, false},
    {"loss/xent", "SoftmaxCrossEntropy", false, NULL, false},
};
#define NOPS (sizeof ops / sizeof ops[0])

static ts_device_spec_t spec(const char *s) {
  ts_device_spec_t d;
  char err[128];
  assert_int_equal(ts_device_parse(s, &d, err, sizeof err), 0);
  return d;
}

static void test_place_cpu(void **state) {
  (void)state;
  ts_device_spec_t want = spec("/cpu:0");
  for (int gpus = 0; gpus <= 2; gpus++)
    for (int soft = 0; soft <= 1; soft++) {
      ts_placement_t out[NOPS];
      char err[256] = "";
      assert_int_equal(ts_device_place(&want, gpus, NULL, 0, ops, NOPS, soft, out, err, sizeof err),
                       0);
      for (size_t i = 0; i < NOPS; i++) {
        assert_int_equal(out[i].type, TS_DEVICE_CPU);
        assert_int_equal(out[i].index, 0);
        assert_false(out[i].soft);
      }
    }
}

static void test_place_no_gpu(void **state) {
  (void)state;
  ts_device_spec_t want = spec("/gpu:0");
  ts_placement_t out[NOPS];
  char err[256] = "";
  assert_int_equal(ts_device_place(&want, 0, "the CUDA back end is not built", 0, ops, NOPS, true, out,
                                   err, sizeof err),
                   0);
  for (size_t i = 0; i < NOPS; i++) {
    assert_int_equal(out[i].type, TS_DEVICE_CPU);
    assert_int_equal(out[i].index, 0);
    assert_true(out[i].soft);
    assert_contains(out[i].reason, "the CUDA back end is not built");
  }
  /* Without a gpu_why the reason still says something. */
  assert_int_equal(ts_device_place(&want, 0, NULL, 0, ops, NOPS, true, out, err, sizeof err), 0);
  assert_true(out[0].soft);
  assert_true(out[0].reason[0] != 0);

  assert_int_equal(ts_device_place(&want, 0, "the CUDA back end is not built", 0, ops, NOPS, false,
                                   out, err, sizeof err),
                   TS_EDEVICE);
  assert_string_equal(err,
                      "Cannot assign a device for operation fc1/matmul: Could not satisfy "
                      "explicit device specification '/device:GPU:0' because no devices "
                      "matching that specification are registered in this process; available "
                      "devices: /job:worker/replica:0/task:0/device:CPU:0");
  /* The long form asks for the same device. */
  want = spec("/job:worker/replica:0/task:0/device:GPU:0");
  assert_int_equal(ts_device_place(&want, 0, NULL, 0, ops, NOPS, false, out, err, sizeof err),
                   TS_EDEVICE);
  assert_contains(err, "'/device:GPU:0'");
}

static void test_place_missing_index(void **state) {
  (void)state;
  ts_device_spec_t want = spec("/gpu:3");
  ts_placement_t out[NOPS];
  char err[512] = "";
  assert_int_equal(ts_device_place(&want, 1, NULL, 0, ops, 2, true, out, err, sizeof err), 0);
  for (size_t i = 0; i < 2; i++) {
    assert_int_equal(out[i].type, TS_DEVICE_GPU);
    assert_int_equal(out[i].index, 0);
    assert_true(out[i].soft);
    assert_contains(out[i].reason, "1 GPU");
  }
  assert_int_equal(ts_device_place(&want, 1, NULL, 0, ops, NOPS, false, out, err, sizeof err),
                   TS_EDEVICE);
  assert_string_equal(err,
                      "Cannot assign a device for operation fc1/matmul: Could not satisfy "
                      "explicit device specification '/device:GPU:3' because no devices "
                      "matching that specification are registered in this process; available "
                      "devices: /job:worker/replica:0/task:0/device:CPU:0, "
                      "/job:worker/replica:0/task:0/device:GPU:0");
  /* An index that exists is kept. */
  want = spec("/gpu:1");
  assert_int_equal(ts_device_place(&want, 2, NULL, 0, ops, 2, false, out, err, sizeof err), 0);
  assert_int_equal(out[0].type, TS_DEVICE_GPU);
  assert_int_equal(out[0].index, 1);
  assert_false(out[0].soft);
}

static void test_place_missing_kernel(void **state) {
  (void)state;
  ts_device_spec_t want = spec("/gpu:0");
  ts_placement_t out[NOPS];
  char err[256] = "";
  assert_int_equal(ts_device_place(&want, 1, NULL, 0, ops, NOPS, true, out, err, sizeof err), 0);
  assert_int_equal(out[0].type, TS_DEVICE_GPU);
  assert_int_equal(out[0].index, 0);
  assert_false(out[0].soft);
  assert_int_equal(out[1].type, TS_DEVICE_GPU);
  assert_false(out[1].soft);
  assert_int_equal(out[2].type, TS_DEVICE_CPU);
  assert_int_equal(out[2].index, 0);
  assert_true(out[2].soft);
  assert_contains(out[2].reason, "SoftmaxCrossEntropy");
  assert_contains(out[2].reason, "no GPU kernel");

  assert_int_equal(ts_device_place(&want, 1, NULL, 0, ops, NOPS, false, out, err, sizeof err),
                   TS_EDEVICE);
  assert_string_equal(err,
                      "Cannot assign a device for operation loss/xent: Could not satisfy "
                      "explicit device specification '/device:GPU:0' because no supported "
                      "kernel for GPU devices is available");
  /* A missing index and a missing kernel: soft placement ends on the CPU. */
  want = spec("/gpu:2");
  assert_int_equal(ts_device_place(&want, 1, NULL, 0, ops, NOPS, true, out, err, sizeof err), 0);
  assert_int_equal(out[2].type, TS_DEVICE_CPU);
  assert_true(out[2].soft);
  assert_int_equal(out[0].type, TS_DEVICE_GPU);
  assert_int_equal(out[0].index, 0);
}

/* No device asked for (device.placement empty): TensorFlow's placer's choice, /gpu:0 for ops
 * with a GPU kernel when a GPU is visible, else /cpu:0, and never "soft" (nothing was
 * asked), with or without soft placement. */
static void test_place_unspecified(void **state) {
  (void)state;
  ts_device_spec_t want = spec("");
  assert_true(want.unspecified);
  for (int soft = 0; soft <= 1; soft++) {
    ts_placement_t out[NOPS];
    char err[256] = "";
    assert_int_equal(ts_device_place(&want, 0, "no CUDA driver", 0, ops, NOPS, soft, out, err,
                                     sizeof err), 0);
    for (size_t i = 0; i < NOPS; i++) {
      assert_int_equal(out[i].type, TS_DEVICE_CPU);
      assert_false(out[i].soft);
      assert_string_equal(out[i].asked, "");
    }
    assert_int_equal(ts_device_place(&want, 2, NULL, 0, ops, NOPS, soft, out, err, sizeof err), 0);
    assert_int_equal(out[0].type, TS_DEVICE_GPU);
    assert_int_equal(out[0].index, 0);
    assert_int_equal(out[1].type, TS_DEVICE_GPU);
    assert_int_equal(out[2].type, TS_DEVICE_CPU); /* no GPU kernel: the CPU, silently */
    for (size_t i = 0; i < NOPS; i++) assert_false(out[i].soft);
  }
}

/* Per-op devices (device.rules) override the scope; ops outside the scope (the input
 * pipeline's) have no device unless a rule gives them one. Soft placement moves only the op
 * that cannot stay: the chapter's mixed placement. */
static void test_place_per_op(void **state) {
  (void)state;
  ts_device_spec_t scope = spec("/gpu:0"), cpu = spec("/cpu:0"), gpu1 = spec("/gpu:1");
  ts_placement_op_t mixed[] = {
      {"input/decode", "DecodeRaw", false, NULL, true},
      {"fc1/matmul", "MatMul", true, NULL, false},
      {"fc2/matmul", "MatMul", true, &cpu, false},
      {"fc3/matmul", "MatMul", true, &gpu1, false},
  };
  ts_placement_t out[4];
  char err[512] = "";
  assert_int_equal(ts_device_place(&scope, 2, NULL, 0, mixed, 4, false, out, err, sizeof err), 0);
  assert_int_equal(out[0].type, TS_DEVICE_CPU); /* no GPU kernel, no device asked: no error */
  assert_false(out[0].soft);
  assert_int_equal(out[1].type, TS_DEVICE_GPU);
  assert_int_equal(out[1].index, 0);
  assert_string_equal(out[1].asked, "/device:GPU:0");
  assert_int_equal(out[2].type, TS_DEVICE_CPU);
  assert_string_equal(out[2].asked, "/device:CPU:0");
  assert_int_equal(out[3].type, TS_DEVICE_GPU);
  assert_int_equal(out[3].index, 1);
  /* A rule sending the decode to the GPU: TensorFlow's "no supported kernel" without soft
   * placement; with it, only that op moves. */
  mixed[0].want = &scope;
  assert_int_equal(ts_device_place(&scope, 2, NULL, 0, mixed, 4, false, out, err, sizeof err),
                   TS_EDEVICE);
  assert_string_equal(err,
                      "Cannot assign a device for operation input/decode: Could not satisfy "
                      "explicit device specification '/device:GPU:0' because no supported "
                      "kernel for GPU devices is available");
  assert_int_equal(ts_device_place(&scope, 2, NULL, 0, mixed, 4, true, out, err, sizeof err), 0);
  assert_int_equal(out[0].type, TS_DEVICE_CPU);
  assert_true(out[0].soft);
  assert_contains(out[0].reason, "op DecodeRaw has no GPU kernel");
  for (size_t i = 1; i < 4; i++) assert_false(out[i].soft);
  assert_int_equal(out[1].type, TS_DEVICE_GPU);
  /* No GPU at all: every op that asked for one moves, each saying why. */
  assert_int_equal(ts_device_place(&scope, 0, "no CUDA driver", 0, mixed, 4, true, out, err,
                                   sizeof err), 0);
  for (size_t i = 0; i < 4; i++) assert_int_equal(out[i].type, TS_DEVICE_CPU);
  assert_true(out[0].soft && out[1].soft && out[3].soft);
  assert_false(out[2].soft); /* asked for the CPU */
  assert_contains(out[3].reason, "no CUDA driver");
}

static void test_place_empty(void **state) {
  (void)state;
  ts_device_spec_t want = spec("/gpu:0");
  char err[16] = "";
  assert_int_equal(ts_device_place(&want, 0, NULL, 0, NULL, 0, false, NULL, err, sizeof err), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_rejects),
      cmocka_unit_test(test_parse_accepts),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_place_cpu),
      cmocka_unit_test(test_place_no_gpu),
      cmocka_unit_test(test_place_missing_index),
      cmocka_unit_test(test_place_missing_kernel),
      cmocka_unit_test(test_place_unspecified),
      cmocka_unit_test(test_place_per_op),
      cmocka_unit_test(test_place_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
