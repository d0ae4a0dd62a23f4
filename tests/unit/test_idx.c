/*
 * The IDX reader: small files written here, plain and gzip; every malformed variant is a
 * TS_EDATA (or errno) whose message names the file and what was wrong; and the real
 * Fashion-MNIST test set when Debian's dataset-fashion-mnist package is installed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_idx.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tmpdir[64];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_test_idx_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
  static char paths[4][192];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, sizeof paths[0], "%s/%s", tmpdir, name);
  return p;
}

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* Build an IDX image: magic, dims, then data_len bytes of data (value = index * 7 mod 256). */
static size_t build(unsigned char *buf, uint32_t magic, const uint32_t *dims, unsigned ndims,
                    size_t data_len) {
  put_be32(buf, magic);
  for (unsigned d = 0; d < ndims; d++) put_be32(buf + 4 + 4 * d, dims[d]);
  size_t h = 4 + 4 * (size_t)ndims;
  for (size_t i = 0; i < data_len; i++) buf[h + i] = (unsigned char)(i * 7);
  return h + data_len;
}

static void write_file(const char *path, const unsigned char *buf, size_t len, bool gz) {
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
  }
}

static unsigned char buf[4096];

/* Write images [n, 3, 2] and labels [n_labels], return their paths. */
static void write_pair(const char *img, const char *lab, uint32_t n, uint32_t n_labels, bool gz) {
  uint32_t d3[3] = {n, 3, 2}, d1[1] = {n_labels};
  write_file(img, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, (size_t)n * 6), gz);
  size_t len = build(buf, TS_IDX_MAGIC_LABELS, d1, 1, n_labels);
  for (uint32_t i = 0; i < n_labels; i++) buf[8 + i] = (unsigned char)(i % 10);
  write_file(lab, buf, len, gz);
}

static void expect_error(int rc, int want_rc, const char *err, const char *path,
                         const char *phrase) {
  if (rc != want_rc)
    fail_msg("rc %d (%s), want %d; message: %s", rc, ts_err_name(rc), want_rc, err);
  if (!strstr(err, path)) fail_msg("message does not name %s: %s", path, err);
  if (!strstr(err, phrase)) fail_msg("message lacks '%s': %s", phrase, err);
}

static void check_valid(bool gz) {
  const char *img = tmp_path(gz ? "ok-images.gz" : "ok-images");
  const char *lab = tmp_path(gz ? "ok-labels.gz" : "ok-labels");
  write_pair(img, lab, 5, 5, gz);
  ts_dataset_t ds;
  char err[256] = "";
  int rc = ts_idx_load_pair(img, lab, &ds, err, sizeof err);
  if (rc != 0) fail_msg("load: %s", err);
  assert_int_equal(ds.n, 5);
  assert_int_equal(ds.rows, 3);
  assert_int_equal(ds.cols, 2);
  for (size_t i = 0; i < 30; i++) {
    float want = (float)(unsigned char)(i * 7) / 255.0f;
    assert_true(ds.x[i] == want);
    assert_true(ds.x[i] >= 0.0f && ds.x[i] <= 1.0f);
  }
  for (size_t i = 0; i < 5; i++) assert_int_equal(ds.labels[i], (int32_t)i);
  assert_int_equal(ds.max_label, 4);
  ts_dataset_free(&ds);
  assert_null(ds.x);
  ts_dataset_free(&ds);
}

static void test_valid_plain(void **state) {
  (void)state;
  check_valid(false);
}

static void test_valid_gzip(void **state) {
  (void)state;
  check_valid(true);
}

static void test_labels_not_assumed_below_10(void **state) {
  (void)state;
  const char *p = tmp_path("big-labels");
  uint32_t d1[1] = {3};
  size_t len = build(buf, TS_IDX_MAGIC_LABELS, d1, 1, 3);
  buf[8] = 3;
  buf[9] = 200;
  buf[10] = 17;
  write_file(p, buf, len, false);
  size_t n = 0;
  int32_t *labels = NULL, max = -1;
  char err[256] = "";
  assert_int_equal(ts_idx_read_labels(p, &n, &labels, &max, err, sizeof err), 0);
  assert_int_equal(n, 3);
  assert_int_equal(max, 200);
  assert_int_equal(labels[1], 200);
  ts_free(labels);
}

static void test_truncated(void **state) {
  (void)state;
  uint32_t d3[3] = {4, 3, 2};
  char err[256] = "";
  size_t n, r, c;
  float *x = NULL;
  for (int gz = 0; gz < 2; gz++) {
    /* 24 pixels promised, 10 present */
    const char *p = tmp_path(gz ? "trunc-images.gz" : "trunc-images");
    write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, 10), gz);
    int rc = ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err);
    expect_error(rc, TS_EDATA, err, p,
                 "truncated: expected 24 bytes of pixel data after the 16-byte header, found 10");
    assert_null(x);
  }
  /* a header cut short, and an empty file */
  const char *p = tmp_path("short-header");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, 0) - 3, false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "truncated: header needs 12 bytes of dimensions, found 9");
  p = tmp_path("empty");
  write_file(p, buf, 0, false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "too short for an IDX header");
  /* labels: 5 promised, 2 present */
  uint32_t d1[1] = {5};
  int32_t *labels = NULL;
  p = tmp_path("trunc-labels");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_LABELS, d1, 1, 2), false);
  expect_error(ts_idx_read_labels(p, &n, &labels, NULL, err, sizeof err), TS_EDATA, err, p,
               "expected 5 bytes of labels after the 8-byte header, found 2");
  assert_null(labels);
}

/* A gzip stream cut in the middle (the download stopped): truncated, with zlib's word. */
static void test_truncated_gzip_stream(void **state) {
  (void)state;
  uint32_t d3[3] = {40, 3, 2};
  const char *full = tmp_path("full.gz");
  write_file(full, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, 240), true);
  FILE *f = fopen(full, "rb");
  assert_non_null(f);
  unsigned char gzbytes[1024];
  size_t len = fread(gzbytes, 1, sizeof gzbytes, f);
  fclose(f);
  assert_true(len > 30);
  const char *cut = tmp_path("cut.gz");
  write_file(cut, gzbytes, len - 12, false); /* loses the trailer and some of the data */
  char err[256] = "";
  size_t n, r, c;
  float *x = NULL;
  int rc = ts_idx_read_images(cut, &n, &r, &c, &x, err, sizeof err);
  expect_error(rc, TS_EDATA, err, cut, "truncated");
  assert_null(x);
  /* corrupt deflate data */
  for (size_t i = 12; i < len - 8; i++) gzbytes[i] ^= 0x5a;
  const char *bad = tmp_path("corrupt.gz");
  write_file(bad, gzbytes, len, false);
  rc = ts_idx_read_images(bad, &n, &r, &c, &x, err, sizeof err);
  if (rc != TS_EDATA) fail_msg("corrupt gzip: rc %d: %s", rc, err);
  assert_non_null(strstr(err, bad));
}

static void test_trailing_garbage(void **state) {
  (void)state;
  uint32_t d3[3] = {2, 3, 2};
  char err[256] = "";
  size_t n, r, c;
  float *x = NULL;
  for (int gz = 0; gz < 2; gz++) {
    const char *p = tmp_path(gz ? "trailing.gz" : "trailing");
    write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, 12 + 5), gz);
    expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
                 "trailing data: 5 bytes after the expected 12 bytes of pixel data");
    assert_null(x);
  }
}

static void test_wrong_magic_and_dims(void **state) {
  (void)state;
  char err[256] = "";
  size_t n, r, c;
  float *x = NULL;
  int32_t *labels = NULL;
  uint32_t d3[3] = {2, 3, 2}, d1[1] = {2}, d2[2] = {2, 6};
  /* not IDX at all */
  const char *p = tmp_path("not-idx");
  write_file(p, buf, build(buf, 0x89504e47u, d3, 3, 12), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "bad magic 0x89504e47");
  /* IDX of another element type (0x0D: float) */
  p = tmp_path("floats");
  write_file(p, buf, build(buf, 0x00000d03u, d3, 3, 12), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "not an IDX file of unsigned bytes");
  /* a labels file where images were expected, and the reverse */
  p = tmp_path("labels-as-images");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_LABELS, d1, 1, 2), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "wrong dimensions: magic 0x00000801 has 1 dimensions, images need 3");
  assert_non_null(strstr(err, "this is a labels file"));
  p = tmp_path("images-as-labels");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, d3, 3, 12), false);
  expect_error(ts_idx_read_labels(p, &n, &labels, NULL, err, sizeof err), TS_EDATA, err, p,
               "this is an images file");
  /* two dimensions */
  p = tmp_path("2d");
  write_file(p, buf, build(buf, 0x00000802u, d2, 2, 12), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "has 2 dimensions, images need 3");
  /* a zero dimension, and dimensions too large to be real */
  uint32_t zero[3] = {2, 0, 2}, huge[3] = {0x7fffffffu, 28, 28};
  p = tmp_path("zero-dim");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, zero, 3, 0), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "dimension 1 is 0");
  p = tmp_path("huge-dim");
  write_file(p, buf, build(buf, TS_IDX_MAGIC_IMAGES, huge, 3, 0), false);
  expect_error(ts_idx_read_images(p, &n, &r, &c, &x, err, sizeof err), TS_EDATA, err, p,
               "dimensions too large");
  assert_null(x);
  assert_null(labels);
}

static void test_count_mismatch(void **state) {
  (void)state;
  const char *img = tmp_path("mm-images.gz"), *lab = tmp_path("mm-labels.gz");
  write_pair(img, lab, 5, 4, true);
  ts_dataset_t ds;
  char err[256] = "";
  int rc = ts_idx_load_pair(img, lab, &ds, err, sizeof err);
  expect_error(rc, TS_EDATA, err, img, "5 images but 4 labels");
  assert_non_null(strstr(err, lab));
  assert_null(ds.x);
  assert_null(ds.labels);
  assert_int_equal(ds.n, 0);
}

static void test_missing_file(void **state) {
  (void)state;
  const char *img = tmp_path("ok2-images"), *lab = tmp_path("ok2-labels");
  write_pair(img, lab, 2, 2, false);
  const char *missing = tmp_path("no-such-file.gz");
  ts_dataset_t ds;
  char err[256] = "";
  expect_error(ts_idx_load_pair(missing, lab, &ds, err, sizeof err), -ENOENT, err, missing,
               "cannot open");
  expect_error(ts_idx_load_pair(img, missing, &ds, err, sizeof err), -ENOENT, err, missing,
               "No such file");
  assert_null(ds.x); /* the images read first were freed again */
  /* invalid arguments */
  assert_int_equal(ts_idx_load_pair(img, lab, NULL, err, sizeof err), TS_EINVAL);
  assert_int_equal(ts_idx_read_images(NULL, NULL, NULL, NULL, NULL, NULL, 0), TS_EINVAL);
}

static void test_alloc_failures(void **state) {
  (void)state;
  const char *img = tmp_path("af-images.gz"), *lab = tmp_path("af-labels.gz");
  write_pair(img, lab, 5, 5, true);
  char err[256] = "";
  ts_dataset_t ds;
  /* zlib allocates with malloc; ours are the output and staging buffers */
  for (long fail = 1; fail < 16; fail++) {
    ts_alloc_fail_after(fail);
    int rc = ts_idx_load_pair(img, lab, &ds, err, sizeof err);
    ts_alloc_fail_after(0);
    if (rc == 0) {
      ts_dataset_free(&ds);
      return;
    }
    expect_error(rc, TS_ENOMEM, err, fail <= 2 ? img : lab, "out of memory");
  }
  fail_msg("still failing after 15 allocations");
}

static void test_fashion_mnist_test_set(void **state) {
  (void)state;
  const char *img = FMNIST_DIR "/t10k-images-idx3-ubyte.gz";
  const char *lab = FMNIST_DIR "/t10k-labels-idx1-ubyte.gz";
  if (access(img, R_OK) != 0 || access(lab, R_OK) != 0) {
    print_message("skipped: %s not installed (Debian package dataset-fashion-mnist)\n", FMNIST_DIR);
    skip();
  }
  ts_dataset_t ds;
  char err[256] = "";
  int rc = ts_idx_load_pair(img, lab, &ds, err, sizeof err);
  if (rc != 0) fail_msg("%s", err);
  assert_int_equal(ds.n, 10000);
  assert_int_equal(ds.rows, 28);
  assert_int_equal(ds.cols, 28);
  assert_int_equal(ds.max_label, 9);
  size_t per_class[10] = {0};
  for (size_t i = 0; i < ds.n; i++) {
    assert_in_range(ds.labels[i], 0, 9);
    per_class[ds.labels[i]]++;
  }
  for (int k = 0; k < 10; k++) assert_int_equal(per_class[k], 1000); /* balanced test set */
  float lo = 1.0f, hi = 0.0f;
  double sum = 0.0;
  for (size_t i = 0; i < ds.n * 28 * 28; i++) {
    lo = ds.x[i] < lo ? ds.x[i] : lo;
    hi = ds.x[i] > hi ? ds.x[i] : hi;
    sum += (double)ds.x[i];
  }
  assert_true(lo == 0.0f && hi == 1.0f);
  double mean = sum / (double)(ds.n * 28 * 28);
  assert_true(mean > 0.2 && mean < 0.4); /* Fashion-MNIST's mean pixel is about 0.286 */
  ts_dataset_free(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_plain),
      cmocka_unit_test(test_valid_gzip),
      cmocka_unit_test(test_labels_not_assumed_below_10),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_truncated_gzip_stream),
      cmocka_unit_test(test_trailing_garbage),
      cmocka_unit_test(test_wrong_magic_and_dims),
      cmocka_unit_test(test_count_mismatch),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_alloc_failures),
      cmocka_unit_test(test_fashion_mnist_test_set),
  };
  return cmocka_run_group_tests_name("idx", tests, setup, teardown);
}
