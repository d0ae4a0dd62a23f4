/* Prometheus text exposition (ts_prom.h) and CRC-32C (ts_crc32c.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ts_alloc.h"
#include "ts_crc32c.h"
#include "ts_prom.h"

static void test_family_and_samples(void **state) {
  (void)state;
  ts_buf_t b = {0};
  ts_prom_family(&b, "x_total", "counter", "Back\\slash and\nnewline.");
  ts_prom_sample(&b, "x_total", NULL, 3);
  ts_prom_sample(&b, "x_total", "a=\"1\"", 0.5);
  ts_prom_sample(&b, "g", NULL, NAN);
  ts_prom_sample(&b, "g", NULL, INFINITY);
  ts_prom_sample(&b, "g", NULL, 9007199254740993.0); /* beyond 2^53: %g form */
  assert_false(b.failed);
  assert_string_equal(b.data,
                      "# HELP x_total Back\\\\slash and\\nnewline.\n"
                      "# TYPE x_total counter\n"
                      "x_total 3\n"
                      "x_total{a=\"1\"} 0.5\n"
                      "g NaN\n"
                      "g +Inf\n"
                      "g 9007199254740992\n");
  ts_buf_free(&b);
}

static void test_histogram(void **state) {
  (void)state;
  static const double bounds[] = {0.1, 1};
  ts_prom_hist_t h;
  ts_prom_hist_init(&h, bounds, 2);
  ts_prom_hist_observe(&h, 0.05);
  ts_prom_hist_observe(&h, 0.1); /* le is inclusive */
  ts_prom_hist_observe(&h, 0.5);
  ts_prom_hist_observe(&h, 7);
  ts_buf_t b = {0};
  ts_prom_hist_samples(&b, "d_seconds", "op=\"push\"", &h);
  assert_string_equal(b.data,
                      "d_seconds_bucket{op=\"push\",le=\"0.10000000000000001\"} 2\n"
                      "d_seconds_bucket{op=\"push\",le=\"1\"} 3\n"
                      "d_seconds_bucket{op=\"push\",le=\"+Inf\"} 4\n"
                      "d_seconds_sum{op=\"push\"} 7.6500000000000004\n"
                      "d_seconds_count{op=\"push\"} 4\n");
  ts_buf_free(&b);
  ts_prom_hist_samples(&b, "e", NULL, &(ts_prom_hist_t){.bounds = bounds, .num_bounds = 2});
  assert_non_null(strstr(b.data, "e_bucket{le=\"+Inf\"} 0\ne_sum 0\ne_count 0\n"));
  ts_buf_free(&b);
}

static void test_escape_and_growth(void **state) {
  (void)state;
  char out[16];
  assert_string_equal(ts_prom_label_escape("a\"b\\c\nd", out, sizeof out), "a\\\"b\\\\c\\nd");
  assert_string_equal(ts_prom_label_escape("0123456789abcdefgh", out, sizeof out), "0123456789abcd");
  ts_buf_t b = {0};
  for (int i = 0; i < 2000; i++) ts_buf_printf(&b, "%04d ", i);
  assert_int_equal(b.len, 10000);
  assert_int_equal(strlen(b.data), 10000);
  char big[600];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  ts_buf_printf(&b, "%s", big); /* longer than the stack buffer */
  assert_int_equal(b.len, 10599);
  ts_buf_free(&b);
  /* A failed allocation marks the buffer; later appends do nothing. */
  ts_alloc_fail_after(1);
  ts_buf_printf(&b, "x");
  ts_alloc_fail_after(0);
  assert_true(b.failed);
  ts_buf_printf(&b, "y");
  assert_null(b.data);
  ts_buf_free(&b);
}

static void test_process(void **state) {
  (void)state;
  ts_buf_t b = {0};
  ts_prom_process(&b);
  assert_non_null(strstr(b.data, "# TYPE process_cpu_seconds_total counter\n"));
  assert_non_null(strstr(b.data, "\nprocess_resident_memory_bytes "));
  assert_non_null(strstr(b.data, "\nprocess_open_fds "));
  assert_non_null(strstr(b.data, "\nprocess_start_time_seconds 1"));
  ts_buf_free(&b);
}

static void test_crc32c(void **state) {
  (void)state;
  /* The check value of CRC-32C, and TFRecord's mask of CRCs of known inputs. */
  assert_int_equal(ts_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(ts_crc32c(0, "", 0), 0);
  assert_int_equal(ts_crc32c(ts_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  uint8_t zeros[32] = {0};
  assert_int_equal(ts_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
  assert_int_equal(ts_crc32c_mask(0), 0xa282ead8u);
  assert_int_equal(ts_crc32c_mask(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_family_and_samples), cmocka_unit_test(test_histogram),
      cmocka_unit_test(test_escape_and_growth),  cmocka_unit_test(test_process),
      cmocka_unit_test(test_crc32c),
  };
  return cmocka_run_group_tests_name("prom", tests, NULL, NULL);
}
