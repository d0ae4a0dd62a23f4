/*
 * The Criteo TSV reader (worker/ts_criteo.h) and the CTR model's pieces (worker/ts_ctr.h):
 * missing values, bad lines named by file and line, gzip and plain files, rewinding; keys
 * distinct per field; the binned AUC; and the embedding rows' gradients against finite
 * differences of the loss, with the vectors concatenated and with dot interactions.
 */
#include <math.h>
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

#include "ts_config.h"
#include "ts_criteo.h"
#include "ts_ctr.h"
#include "ts_err.h"

#define GOOD                                                                                       \
  "1\t5\t\t-"                                                                                      \
  "2\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t68fd1e64\t\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9\ta\tb\tc\td\te\tf\t1" \
  "0\t11\t12\t13\t14\t15\t16\tFFFFFFFFFFFFFFFF"

static void test_parse(void **state) {
  (void)state;
  ts_criteo_row_t r;
  char why[160];
  assert_int_equal(ts_criteo_parse(GOOD "\r\n", &r, why, sizeof why), 0);
  assert_int_equal(r.label, 1);
  assert_float_equal(r.dense[0], logf(6.0f), 1e-6);
  assert_true(r.int_missing[1]);
  assert_float_equal(r.dense[1], 0.0f, 0);
  assert_float_equal(r.dense[2], 0.0f, 0); /* -2: counted as 0 */
  assert_false(r.int_missing[2]);
  assert_int_equal(r.cat[0], 0x68fd1e64u);
  assert_true(r.cat_missing[1]);
  assert_false(r.cat_missing[2]);
  assert_int_equal(r.cat[25], UINT64_MAX);

  static const struct {
    const char *prefix, *rest, *why;
  } bad[] = {
      {"2", GOOD + 1, "field 1 (label): \"2\" is not 0 or 1"},
      {"1\t1x", GOOD + 2, "field 2 (I1): \"1x5\" is not an integer"},
      {"0", "", "1 tab-separated fields, expected 40"},
      {GOOD, "\t", "more than 40 tab-separated fields"},
  };
  char line[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why[0] = '\0';
    snprintf(line, sizeof line, "%s%s", bad[i].prefix, bad[i].rest);
    assert_int_equal(ts_criteo_parse(line, &r, why, sizeof why), TS_EDATA);
    if (!strstr(why, bad[i].why)) fail_msg("line %zu: \"%s\" lacks \"%s\"", i, why, bad[i].why);
  }
  snprintf(line, sizeof line, "%s", GOOD);
  char *c15 = strstr(line, "68fd1e64");
  c15[0] = 'g';
  assert_int_equal(ts_criteo_parse(line, &r, why, sizeof why), TS_EDATA);
  assert_non_null(strstr(why, "field 15 (C1): \"g8fd1e64\" is not hex"));
  snprintf(line, sizeof line, "%s", GOOD);
  strcpy(strstr(line, "FFFFFFFFFFFFFFFF"), "123456789abcdef01");
  assert_int_equal(ts_criteo_parse(line, &r, why, sizeof why), TS_EDATA);
  assert_non_null(strstr(why, "field 40 (C26)"));
  assert_int_equal(ts_criteo_parse(NULL, &r, why, sizeof why), TS_EINVAL);
}

/* A file of three good lines, a blank one, then a bad one; plain and gzip. */
static void test_reader(void **state) {
  (void)state;
  for (int gz = 0; gz <= 1; gz++) {
    char path[] = "/tmp/ts_criteo_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gzFile f = gzopen(path, gz ? "wb" : "wbT");
    assert_non_null(f);
    gzprintf(f, "%s\n%s\n\n%s\n1\t2\n", GOOD, GOOD, GOOD);
    gzclose(f);
    ts_criteo_reader_t *r = NULL;
    char err[512];
    assert_int_equal(ts_criteo_open(&r, path, err, sizeof err), 0);
    ts_criteo_row_t row;
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < 3; i++) assert_int_equal(ts_criteo_next(r, &row, err, sizeof err), 1);
      assert_int_equal(ts_criteo_next(r, &row, err, sizeof err), TS_EDATA);
      char want[128];
      snprintf(want, sizeof want, "%s:5: 2 tab-separated fields, expected 40", path);
      if (!strstr(err, want)) fail_msg("\"%s\" lacks \"%s\"", err, want);
      assert_int_equal(ts_criteo_rewind(r), 0);
    }
    ts_criteo_close(r);
    uint64_t n = 0;
    assert_int_equal(ts_criteo_count(path, &n, err, sizeof err), TS_EDATA);
    /* A line over TS_CRITEO_LINE_MAX bytes. */
    f = gzopen(path, gz ? "wb" : "wbT");
    gzprintf(f, "%s\n", GOOD);
    for (int i = 0; i < TS_CRITEO_LINE_MAX + 1; i++) gzputc(f, 'x');
    gzputc(f, '\n');
    gzclose(f);
    assert_int_equal(ts_criteo_open(&r, path, err, sizeof err), 0);
    assert_int_equal(ts_criteo_next(r, &row, err, sizeof err), 1);
    assert_int_equal(ts_criteo_next(r, &row, err, sizeof err), TS_EDATA);
    assert_non_null(strstr(err, ":2: a line longer than 4096 bytes"));
    ts_criteo_close(r);
    unlink(path);
    assert_true(ts_criteo_open(&r, path, err, sizeof err) < 0);
    assert_non_null(strstr(err, path));
  }
}

static void test_keys_and_auc(void **state) {
  (void)state;
  assert_true(ts_ctr_key(0, 42, false) != ts_ctr_key(1, 42, false));
  assert_true(ts_ctr_key(0, 0, false) != ts_ctr_key(0, 0, true));
  assert_true(ts_ctr_key(3, 7, false) == ts_ctr_key(3, 7, false));
  static uint64_t pos[TS_CTR_AUC_BINS], neg[TS_CTR_AUC_BINS];
  const float p[] = {0.1f, 0.2f, 0.8f, 0.9f};
  const int32_t up[] = {0, 0, 1, 1}, down[] = {1, 1, 0, 0};
  ts_ctr_auc_add(pos, neg, p, up, 4);
  assert_float_equal(ts_ctr_auc(pos, neg), 1.0, 1e-12);
  memset(pos, 0, sizeof pos);
  memset(neg, 0, sizeof neg);
  ts_ctr_auc_add(pos, neg, p, down, 4);
  assert_float_equal(ts_ctr_auc(pos, neg), 0.0, 1e-12);
  const float same[] = {0.5f, 0.5f};
  const int32_t one_each[] = {0, 1};
  memset(pos, 0, sizeof pos);
  memset(neg, 0, sizeof neg);
  ts_ctr_auc_add(pos, neg, same, one_each, 2);
  assert_float_equal(ts_ctr_auc(pos, neg), 0.5, 1e-12);
}

/* The rows' gradients are the derivative of the mean loss (finite differences), with the
 * vectors concatenated (dot = false) and with DLRM's dot interactions too. */
static void check_row_grads(bool dot) {
  ts_config_layer_t l[4];
  memset(l, 0, sizeof l);
  size_t k = 0;
  snprintf(l[k].type, sizeof l[k].type, "embedding");
  snprintf(l[k].table, sizeof l[k].table, "t");
  l[k].dim = 3;
  l[k].fields[0] = 1;
  l[k].fields[1] = 5;
  l[k].fields[2] = 9;
  l[k++].num_fields = 3;
  if (dot) snprintf(l[k++].type, sizeof l[0].type, "dot");
  snprintf(l[k].type, sizeof l[k].type, "dense");
  l[k].units = 4;
  snprintf(l[k++].activation, sizeof l[0].activation, "tanh");
  snprintf(l[k].type, sizeof l[k].type, "dense");
  l[k++].units = 2;
  ts_ctr_t m;
  char err[256];
  assert_int_equal(ts_ctr_init(&m, l, k, 4, err, sizeof err), 0);
  assert_int_equal(m.input_elems, 26 + 9 + (dot ? 3 : 0)); /* 13 + 13 missing flags; 3 fields of 3; 3 pairs */
  assert_int_equal(m.num_tables, 1);
  assert_int_equal(ts_seq_init_params(&m.net, 7), 0);
  ts_criteo_row_t rows[4];
  char why[160];
  for (int b = 0; b < 4; b++) {
    assert_int_equal(ts_criteo_parse(GOOD, &rows[b], why, sizeof why), 0);
    rows[b].label = b & 1;
    rows[b].cat[0] = (uint64_t)b;
  }
  ts_ctr_keys(&m, rows, 4);
  ts_ctr_table_t *t = &m.tables[0];
  assert_int_equal(t->keys[0], ts_ctr_key(0, 0, false));
  assert_int_equal(t->keys[1], ts_ctr_key(4, 2, false)); /* example 0's field 5: "2" */
  enum { ROW_ELEMS = 4 * 3 * 3 };                        /* batch x fields x dim */
  for (size_t i = 0; i < ROW_ELEMS; i++) t->rows[i] = 0.1f * (float)((i * 7) % 11) - 0.5f;
  float loss = 0, p[4];
  assert_int_equal(ts_ctr_step(&m, 4, true, &loss, p), 0);
  for (int b = 0; b < 4; b++) assert_true(p[b] > 0.0f && p[b] < 1.0f);
  float g[ROW_ELEMS];
  memcpy(g, t->row_grads, sizeof g);
  for (size_t i = 0; i < ROW_ELEMS; i++) {
    const float h = 1e-2f, keep = t->rows[i];
    float lp = 0, lm = 0;
    t->rows[i] = keep + h;
    assert_int_equal(ts_ctr_step(&m, 4, false, &lp, NULL), 0);
    t->rows[i] = keep - h;
    assert_int_equal(ts_ctr_step(&m, 4, false, &lm, NULL), 0);
    t->rows[i] = keep;
    double num = ((double)lp - (double)lm) / (2.0 * (double)h);
    if (fabs(num - (double)g[i]) > 2e-3 + 1e-2 * fabs(num))
      fail_msg("row element %zu: gradient %g, finite difference %g", i, (double)g[i], num);
  }
  ts_ctr_destroy(&m);
  /* A layer list without embedding layers, or one not ending in 2 logits. */
  assert_int_equal(ts_ctr_init(&m, l + k - 2, 2, 4, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "needs embedding layers first"));
  l[k - 1].units = 3;
  assert_int_equal(ts_ctr_init(&m, l, k, 4, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "must have 2 units"));
}

static void test_row_grads(void **state) {
  (void)state;
  check_row_grads(false);
  check_row_grads(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_reader),
      cmocka_unit_test(test_keys_and_auc),
      cmocka_unit_test(test_row_grads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
