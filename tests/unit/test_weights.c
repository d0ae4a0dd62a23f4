/* psctl export's file writers (psctl/psctl_weights.h): the safetensors header (length,
 * JSON, dtype, shape, data offsets, metadata, alignment) and bytes, the .npz's zip
 * structure (local headers, CRC-32, .npy headers, central directory), and the errors: an
 * unknown format, bad entries or metadata, an unwritable file (nothing left behind). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <zlib.h>

#include "psctl_weights.h"
#include "ts_err.h"

static const float kernel[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 7.0f};
static const float bias[3] = {0.1f, 0.2f, 0.3f};
static const char meta[] = "{\"format\":\"tessera\",\"tessera.step\":\"42\"}";

static const psctl_weights_entry_t entries[] = {
    {.name = "fc1/kernel", .dtype = PSCTL_DT_F32, .shape = {2, 3}, .rank = 2, .data = kernel},
    {.name = "fc1/bias", .dtype = PSCTL_DT_F32, .shape = {3}, .rank = 1, .data = bias},
};

static char dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/ts-weights-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*len ? *len : 1);
  assert_int_equal(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

static uint64_t rd(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

static void test_formats(void **state) {
  (void)state;
  psctl_weights_format_t f;
  assert_int_equal(psctl_weights_parse_format("safetensors", &f), 0);
  assert_int_equal(f, PSCTL_WEIGHTS_SAFETENSORS);
  assert_int_equal(psctl_weights_parse_format("npz", &f), 0);
  assert_int_equal(f, PSCTL_WEIGHTS_NPZ);
  assert_int_equal(psctl_weights_parse_format("onnx", &f), TS_EINVAL);
  assert_int_equal(psctl_weights_parse_format(NULL, &f), TS_EINVAL);
}

static void test_safetensors(void **state) {
  (void)state;
  char path[128], err[256] = "";
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  assert_int_equal(
      psctl_weights_write(path, PSCTL_WEIGHTS_SAFETENSORS, entries, 2, meta, err, sizeof err), 0);
  size_t len;
  uint8_t *b = slurp(path, &len);
  uint64_t hl = rd(b, 8);
  assert_int_equal(hl % 8, 0); /* the data starts aligned */
  assert_int_equal(len, 8 + hl + sizeof kernel + sizeof bias);
  cJSON *h = cJSON_ParseWithLength((const char *)b + 8, (size_t)hl);
  assert_non_null(h);
  cJSON *m = cJSON_GetObjectItem(h, "__metadata__");
  assert_string_equal(cJSON_GetObjectItem(m, "tessera.step")->valuestring, "42");
  const float *want[] = {kernel, bias};
  for (int i = 0; i < 2; i++) {
    cJSON *t = cJSON_GetObjectItem(h, entries[i].name);
    assert_non_null(t);
    assert_string_equal(cJSON_GetObjectItem(t, "dtype")->valuestring, "F32");
    cJSON *shape = cJSON_GetObjectItem(t, "shape");
    assert_int_equal(cJSON_GetArraySize(shape), entries[i].rank);
    for (size_t k = 0; k < entries[i].rank; k++)
      assert_int_equal(cJSON_GetArrayItem(shape, (int)k)->valuedouble, entries[i].shape[k]);
    cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
    size_t lo = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
    size_t hi = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
    size_t bytes = i == 0 ? sizeof kernel : sizeof bias;
    assert_int_equal(hi - lo, bytes);
    assert_memory_equal(b + 8 + hl + lo, want[i], bytes);
  }
  cJSON_Delete(h);
  free(b);
}

/* The .npy header of the member at p (after its name): magic, version 1.0, a dict ending
 * in a newline, the whole a multiple of 64 bytes. Returns the header's length. */
static size_t check_npy(const uint8_t *p, const char *descr, const char *shape) {
  assert_memory_equal(p, "\x93NUMPY\x01\x00", 8);
  size_t total = 10 + (size_t)rd(p + 8, 2);
  assert_int_equal(total % 64, 0);
  assert_int_equal(p[total - 1], '\n');
  char dict[256];
  snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
           shape);
  assert_memory_equal(p + 10, dict, strlen(dict));
  return total;
}

static void test_npz(void **state) {
  (void)state;
  char path[128], err[256] = "";
  snprintf(path, sizeof path, "%s/m.npz", dir);
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_NPZ, entries, 2, meta, err, sizeof err),
                   0);
  size_t len;
  uint8_t *b = slurp(path, &len);
  /* end of central directory: 3 members (the metadata last) */
  const uint8_t *eocd = b + len - 22;
  assert_int_equal(rd(eocd, 4), 0x06054b50);
  assert_int_equal(rd(eocd + 10, 2), 3);
  size_t cd = (size_t)rd(eocd + 16, 4);
  const char *names[] = {"fc1/kernel.npy", "fc1/bias.npy", "__metadata__.npy"};
  const char *descr[] = {"<f4", "<f4", "|u1"};
  char mshape[32];
  snprintf(mshape, sizeof mshape, "(%zu,)", strlen(meta));
  const char *shapes[] = {"(2, 3)", "(3,)", mshape};
  const void *data[] = {kernel, bias, meta};
  size_t sizes[] = {sizeof kernel, sizeof bias, strlen(meta)};
  const uint8_t *c = b + cd;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(rd(c, 4), 0x02014b50);
    size_t nl = (size_t)rd(c + 28, 2);
    assert_int_equal(nl, strlen(names[i]));
    assert_memory_equal(c + 46, names[i], nl);
    const uint8_t *l = b + rd(c + 42, 4);
    assert_int_equal(rd(l, 4), 0x04034b50);
    assert_int_equal(rd(l + 8, 2), 0); /* stored */
    uint32_t crc = (uint32_t)rd(l + 14, 4), size = (uint32_t)rd(l + 18, 4);
    assert_int_equal(size, rd(l + 22, 4));
    assert_int_equal(crc, rd(c + 16, 4));
    const uint8_t *body = l + 30 + nl;
    assert_int_equal(crc, crc32(0L, body, size));
    size_t hl = check_npy(body, descr[i], shapes[i]);
    assert_int_equal(size, hl + sizes[i]);
    assert_memory_equal(body + hl, data[i], sizes[i]);
    c += 46 + nl;
  }
  assert_ptr_equal(c, eocd);
  free(b);
}

/* Nothing is left under the name or beside it. */
static void assert_dir_empty(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_errors(void **state) {
  (void)state;
  char path[128], err[256] = "";
  snprintf(path, sizeof path, "%s/bad.npz", dir);
  /* a file under a folder that does not exist */
  char missing[160];
  snprintf(missing, sizeof missing, "%s/no/such/m.safetensors", dir);
  int rc =
      psctl_weights_write(missing, PSCTL_WEIGHTS_SAFETENSORS, entries, 2, meta, err, sizeof err);
  assert_true(rc < 0);
  assert_non_null(strstr(err, "cannot write"));
  assert_non_null(strstr(err, "No such file or directory"));
  /* two entries of one name */
  psctl_weights_entry_t twice[2] = {entries[0], entries[0]};
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_NPZ, twice, 2, meta, err, sizeof err),
                   TS_EINVAL);
  assert_non_null(strstr(err, "two entries are named fc1/kernel"));
  /* the reserved name, no data, a rank too high */
  psctl_weights_entry_t bad = entries[1];
  bad.name = "__metadata__";
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_NPZ, &bad, 1, NULL, err, sizeof err),
                   TS_EINVAL);
  bad = entries[1];
  bad.data = NULL;
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_NPZ, &bad, 1, NULL, err, sizeof err),
                   TS_EINVAL);
  bad = entries[1];
  bad.rank = PSCTL_WEIGHTS_MAX_RANK + 1;
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_NPZ, &bad, 1, NULL, err, sizeof err),
                   TS_EINVAL);
  /* metadata must be an object of strings (safetensors' rule) */
  assert_int_equal(psctl_weights_write(path, PSCTL_WEIGHTS_SAFETENSORS, entries, 2,
                                       "{\"step\": 42}", err, sizeof err),
                   TS_EINVAL);
  assert_int_equal(
      psctl_weights_write(path, PSCTL_WEIGHTS_SAFETENSORS, entries, 2, "[1]", err, sizeof err),
      TS_EINVAL);
  assert_dir_empty();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_safetensors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_npz, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
