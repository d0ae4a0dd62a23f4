/*
 * Which physical GPU each /gpu:N is (worker/ts_gpu_visible.h), without a GPU:
 * CUDA_VISIBLE_DEVICES read as the CUDA runtime reads it (indices, GPU-/MIG- UUIDs and their
 * prefixes, -1, empty, unset, repeats, blanks, an entry that stops the list), reconciled with
 * the count the runtime reports, and the start-up and "Created device" log lines built from
 * made-up ts_gpu_info_t values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_gpu_visible.h"

#define UUID0 "8932f937-d72c-4106-c12f-20bd9faed9f6"
#define UUID1 "8e4a1b2c-0f0f-4c4c-a0a0-112233445566"

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* The physical identity of /gpu:0.. /gpu:n-1 ("1", "GPU-8e4a") joined by commas, "" for none,
 * so each case is one string compare that prints both sides when it fails. */
static const char *mapping(const ts_gpu_visible_t *v, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < v->n; i++) {
    char one[96];
    ts_gpu_visible_physical(v, (int)i, NULL, one, sizeof one);
    len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? "," : "", one);
  }
  return buf;
}

typedef struct {
  const char *value; /* NULL: unset */
  const char *map;   /* the physical GPUs in /gpu:N order */
  const char *stop;  /* the entry CUDA stops at, or the repeated one */
  bool repeated;
} case_t;

static void test_parse_cases(void **state) {
  (void)state;
  const case_t cases[] = {
      {"1", "1", "", false},
      {"0,1", "0,1", "", false},
      {"1,0", "1,0", "", false},
      {"2,1", "2,1", "", false},
      /* -1, or any invalid first entry, hides every GPU */
      {"-1", "", "-1", false},
      {"none", "", "none", false},
      /* empty: "no GPU devices are visible" (the CUDA Programming Guide) */
      {"", "", "", false},
      {"   ", "", "   ", false},
      /* the guide's own example: parsing stops at the first invalid entry */
      {"0,2,-1,1", "0,2", "-1", false},
      {"0,1,-1,2", "0,1", "-1", false},
      {"0,,1", "0", "", false},
      {"0,x", "0", "x", false},
      /* a repeat hides every GPU, unless an invalid entry stopped the list before it */
      {"0,0", "", "0", true},
      {"1,0,1", "", "1", true},
      {"0,-1,0", "0", "-1", false},
      /* strtoul's reading: blanks and '+' before the digits, anything after them ignored */
      {" 1", "1", "", false},
      {"0, 1", "0,1", "", false},
      {"0 ,1 ", "0,1", "", false},
      {"\t2,\n3", "2,3", "", false},
      {"+1", "1", "", false},
      {"1gpu,2ampere", "1,2", "", false},
      {"-0", "0", "", false},
      {"99999999999", "", "99999999999", false},
      /* UUIDs, in full or as a prefix; a list of one kind only */
      {"GPU-" UUID0, "GPU-" UUID0, "", false},
      {"GPU-8e4a", "GPU-8e4a", "", false},
      {"GPU-8e4a,GPU-" UUID0, "GPU-8e4a,GPU-" UUID0, "", false},
      {"GPU-8e4a,1", "GPU-8e4a", "1", false},
      {"GPU-8e4a,MIG-" UUID1, "GPU-8e4a", "MIG-" UUID1, false},
      {"GPU-8e4a,GPU-8e4a", "", "GPU-8e4a", true},
      {"0,GPU-8e4a", "0", "GPU-8e4a", false},
      {"MIG-" UUID1, "MIG-" UUID1, "", false},
      {" GPU-8e4a", "", " GPU-8e4a", false}, /* no blanks are skipped before a UUID */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const case_t *c = &cases[i];
    ts_gpu_visible_t v;
    int rc = ts_gpu_visible_parse(c->value, &v);
    char map[512];
    mapping(&v, map, sizeof map);
    if (strcmp(map, c->map) != 0 || strcmp(v.stop, c->stop) != 0 || v.repeated != c->repeated ||
        rc != (int)v.n || !v.set)
      fail_msg(
          "CUDA_VISIBLE_DEVICES=\"%s\": mapping '%s' (want '%s'), stop '%s' (want '%s'), "
          "repeated %d (want %d), rc %d, n %zu",
          c->value, map, c->map, v.stop, c->stop, v.repeated, c->repeated, rc, v.n);
  }
}

static void test_unset_and_invalid_arguments(void **state) {
  (void)state;
  assert_int_equal(ts_gpu_visible_parse("0", NULL), TS_EINVAL);
  ts_gpu_visible_t v;
  assert_int_equal(ts_gpu_visible_parse(NULL, &v), 0);
  assert_false(v.set);
  /* Unset: every GPU the runtime reports, /gpu:N is GPU N. */
  char buf[256];
  assert_int_equal(ts_gpu_visible_physical(&v, 5, NULL, buf, sizeof buf), 5);
  assert_string_equal(buf, "5");
  ts_gpu_visible_apply(&v, 3);
  assert_int_equal(v.n, 3);
  assert_string_equal(mapping(&v, buf, sizeof buf), "0,1,2");
  assert_false(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  assert_string_equal(ts_gpu_visible_describe(&v, buf, sizeof buf),
                      "CUDA_VISIBLE_DEVICES is not set: every GPU is visible, /gpu:N is "
                      "physical GPU N");
  assert_int_equal(ts_gpu_visible_physical(NULL, 2, NULL, NULL, 0), 2);
  ts_gpu_visible_apply(NULL, 1); /* no-op */
}

/* The runtime sees fewer GPUs than the text lists: an index or a UUID this machine lacks. */
static void test_apply_runtime_count(void **state) {
  (void)state;
  ts_gpu_visible_t v;
  char buf[512];
  assert_int_equal(ts_gpu_visible_parse("1,7,0", &v), 3);
  ts_gpu_visible_apply(&v, 1);
  assert_int_equal(v.n, 1);
  assert_int_equal(v.listed, 3);
  assert_string_equal(v.stop, "7");
  assert_string_equal(ts_gpu_visible_describe(&v, buf, sizeof buf),
                      "CUDA_VISIBLE_DEVICES=\"1,7,0\": /gpu:0 is physical GPU 1; CUDA sees 1 of "
                      "the 3 listed: \"7\" is not a GPU of this machine, so CUDA ignores it and "
                      "everything after it");
  /* As many as listed, or more (never from CUDA): nothing changes. */
  assert_int_equal(ts_gpu_visible_parse("1,0", &v), 2);
  ts_gpu_visible_apply(&v, 2);
  assert_int_equal(v.n, 2);
  assert_string_equal(v.stop, "");
  ts_gpu_visible_apply(&v, 8);
  assert_int_equal(v.n, 2);
  /* None at all: the runtime may have no driver, so no entry is blamed. */
  assert_int_equal(ts_gpu_visible_parse("GPU-8e4a", &v), 1);
  ts_gpu_visible_apply(&v, 0);
  assert_int_equal(v.n, 0);
  assert_string_equal(v.stop, "");
  assert_false(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  assert_string_equal(ts_gpu_visible_describe(&v, buf, sizeof buf),
                      "CUDA_VISIBLE_DEVICES=\"GPU-8e4a\": /gpu:0 is GPU-8e4a; the CUDA runtime "
                      "reports no GPU");
  /* A UUID that matched no GPU. */
  assert_int_equal(ts_gpu_visible_parse("GPU-8e4a,GPU-ffff", &v), 2);
  ts_gpu_visible_apply(&v, 1);
  assert_string_equal(v.stop, "GPU-ffff");
}

static void test_describe(void **state) {
  (void)state;
  ts_gpu_visible_t v;
  char buf[512];
  const struct {
    const char *value, *line;
  } lines[] = {
      {"1", "CUDA_VISIBLE_DEVICES=\"1\": /gpu:0 is physical GPU 1"},
      {"0,1", "CUDA_VISIBLE_DEVICES=\"0,1\": /gpu:0 is physical GPU 0, /gpu:1 is physical GPU 1"},
      {"1,0", "CUDA_VISIBLE_DEVICES=\"1,0\": /gpu:0 is physical GPU 1, /gpu:1 is physical GPU 0"},
      {"-1", "CUDA_VISIBLE_DEVICES=\"-1\": no GPU is visible (\"-1\" is not a GPU)"},
      {"", "CUDA_VISIBLE_DEVICES=\"\": no GPU is visible (the list is empty)"},
      {"0,1,-1,2",
       "CUDA_VISIBLE_DEVICES=\"0,1,-1,2\": /gpu:0 is physical GPU 0, /gpu:1 is physical GPU 1; "
       "\"-1\" is not a GPU, so CUDA ignores it and everything after it"},
      {"0,0",
       "CUDA_VISIBLE_DEVICES=\"0,0\": no GPU is visible (\"0\" is listed twice, and CUDA "
       "then shows none)"},
      {"GPU-8e4a,GPU-" UUID0,
       "CUDA_VISIBLE_DEVICES=\"GPU-8e4a,GPU-" UUID0 "\": /gpu:0 is GPU-8e4a, /gpu:1 is GPU-" UUID0},
  };
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
    ts_gpu_visible_parse(lines[i].value, &v);
    assert_string_equal(ts_gpu_visible_describe(&v, buf, sizeof buf), lines[i].line);
  }
  /* hides_all: the reason for placement messages. */
  ts_gpu_visible_parse("-1", &v);
  assert_true(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  assert_string_equal(buf, "CUDA_VISIBLE_DEVICES=\"-1\" hides every GPU");
  ts_gpu_visible_parse("", &v);
  assert_true(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  assert_string_equal(buf, "CUDA_VISIBLE_DEVICES=\"\" hides every GPU");
  ts_gpu_visible_parse("3,3", &v);
  assert_true(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  assert_string_equal(buf, "CUDA_VISIBLE_DEVICES=\"3,3\" hides every GPU, as it lists \"3\" twice");
  ts_gpu_visible_parse("0", &v);
  assert_false(ts_gpu_visible_hides_all(&v, buf, sizeof buf));
  /* Small buffers are cut, never overrun. */
  ts_gpu_visible_parse("1,0", &v);
  char small[16];
  ts_gpu_visible_describe(&v, small, sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
}

/* Values longer than the log copy, control characters, more entries than kept. */
static void test_long_and_odd_values(void **state) {
  (void)state;
  ts_gpu_visible_t v;
  char value[1024];
  size_t len = 0;
  for (int i = 0; i < 100; i++)
    len += (size_t)snprintf(value + len, sizeof value - len, "%s%d", i ? "," : "", i);
  assert_int_equal(ts_gpu_visible_parse(value, &v), TS_GPU_VISIBLE_MAX);
  assert_true(v.truncated);
  assert_int_equal(v.entries[63].index, 63);
  assert_int_equal(strlen(v.value), sizeof v.value - 1);
  assert_string_equal(v.value + sizeof v.value - 4, "...");
  char buf[4096];
  assert_contains(ts_gpu_visible_describe(&v, buf, sizeof buf), "only the first 64 entries");
  /* A UUID entry too long to be one stops the list. */
  char lng[200] = "GPU-";
  memset(lng + 4, 'a', 150);
  lng[154] = '\0';
  assert_int_equal(ts_gpu_visible_parse(lng, &v), 0);
  assert_int_equal(strlen(v.stop), sizeof v.stop - 1);
  assert_int_equal(ts_gpu_visible_parse("1\x01,2", &v), 2); /* strtoul stops at \x01 */
  ts_gpu_visible_parse("x\x1b[2J", &v);
  assert_string_equal(v.value, "x?[2J");
  assert_string_equal(v.stop, "x?[2J");
}

static ts_gpu_info_t h100(int index, const char *uuid) {
  ts_gpu_info_t g = {.index = index, .total_bytes = (size_t)80 << 30, .major = 9, .minor = 0};
  snprintf(g.name, sizeof g.name, "NVIDIA H100 80GB HBM3");
  snprintf(g.pci_bus_id, sizeof g.pci_bus_id, "0000:1A:00.0");
  snprintf(g.uuid, sizeof g.uuid, "%s", uuid);
  return g;
}

/* TensorFlow's line, word for word, with the physical GPU as "device:". */
static void test_created_line(void **state) {
  (void)state;
  ts_gpu_visible_t v;
  char buf[512];
  const size_t mem = (size_t)79078 << 20;
  ts_gpu_info_t g0 = h100(0, UUID0), g1 = h100(1, UUID1);

  ts_gpu_visible_parse(NULL, &v);
  ts_gpu_visible_apply(&v, 2);
  assert_string_equal(ts_gpu_visible_created_line(&v, &g0, 0, mem + 12345, buf, sizeof buf),
                      "Created device /job:worker/replica:0/task:0/device:GPU:0 with 79078 MB "
                      "memory:  -> device: 0, name: NVIDIA H100 80GB HBM3, pci bus id: "
                      "0000:1a:00.0, compute capability: 9.0");

  ts_gpu_visible_parse("1", &v);
  ts_gpu_visible_apply(&v, 1);
  assert_string_equal(ts_gpu_visible_created_line(&v, &g0, 3, mem, buf, sizeof buf),
                      "Created device /job:worker/replica:0/task:3/device:GPU:0 with 79078 MB "
                      "memory:  -> device: 1, name: NVIDIA H100 80GB HBM3, pci bus id: "
                      "0000:1a:00.0, compute capability: 9.0");

  ts_gpu_visible_parse("1,0", &v);
  ts_gpu_visible_apply(&v, 2);
  assert_contains(ts_gpu_visible_created_line(&v, &g0, 0, mem, buf, sizeof buf),
                  "device:GPU:0 with 79078 MB memory:  -> device: 1, name:");
  assert_contains(ts_gpu_visible_created_line(&v, &g1, 0, mem, buf, sizeof buf),
                  "device:GPU:1 with 79078 MB memory:  -> device: 0, name:");

  /* By UUID: the runtime's full UUID when the entry is its prefix, else the entry. */
  ts_gpu_visible_parse("GPU-8932", &v);
  ts_gpu_visible_apply(&v, 1);
  assert_int_equal(ts_gpu_visible_physical(&v, 0, &g0, buf, sizeof buf), -1);
  assert_string_equal(buf, "GPU-" UUID0);
  assert_contains(ts_gpu_visible_created_line(&v, &g0, 0, mem, buf, sizeof buf),
                  "memory:  -> device: GPU-" UUID0 ", name: NVIDIA H100 80GB HBM3");
  ts_gpu_info_t unknown = h100(0, "");
  assert_contains(ts_gpu_visible_created_line(&v, &unknown, 0, mem, buf, sizeof buf),
                  "-> device: GPU-8932, name:");
  ts_gpu_visible_parse("GPU-8932F937", &v); /* hex digits in either case */
  assert_int_equal(ts_gpu_visible_physical(&v, 0, &g0, buf, sizeof buf), -1);
  assert_string_equal(buf, "GPU-" UUID0);
  ts_gpu_visible_parse("MIG-" UUID1, &v);
  assert_int_equal(ts_gpu_visible_physical(&v, 0, &g1, buf, sizeof buf), -1);
  assert_string_equal(buf, "MIG-" UUID1);

  /* An ordinal the text does not account for: what the runtime says. */
  ts_gpu_visible_parse("0", &v);
  assert_int_equal(ts_gpu_visible_physical(&v, 1, &g1, buf, sizeof buf), -1);
  assert_string_equal(buf, "GPU-" UUID1);
  assert_int_equal(ts_gpu_visible_physical(&v, 1, NULL, buf, sizeof buf), -1);
  assert_string_equal(buf, "?");

  /* Memory in 2^20-byte MB, rounded down; no info: an empty line. */
  ts_gpu_visible_parse(NULL, &v);
  assert_contains(ts_gpu_visible_created_line(&v, &g0, 0, ((size_t)1 << 20) - 1, buf, sizeof buf),
                  "with 0 MB memory:");
  assert_string_equal(ts_gpu_visible_created_line(&v, NULL, 0, 0, buf, sizeof buf), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_cases),
      cmocka_unit_test(test_unset_and_invalid_arguments),
      cmocka_unit_test(test_apply_runtime_count),
      cmocka_unit_test(test_describe),
      cmocka_unit_test(test_long_and_odd_values),
      cmocka_unit_test(test_created_line),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
