/* The client library's calls that need no shard: its version against the project's (the
 * one VERSION file, which meson reads; client.h's TESSERA_VERSION_* cannot, so this checks
 * they agree), and reading token files (ts_client_token_read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tessera/client.h"
#include "ts_build_config.h"

#define STR2(x) #x
#define STR(x) STR2(x)

static void test_version_is_the_project_s(void **state) {
  (void)state;
  const char *header = STR(TESSERA_VERSION_MAJOR) "." STR(TESSERA_VERSION_MINOR) "." STR(
      TESSERA_VERSION_PATCH);
  assert_string_equal(header, TS_VERSION); /* TS_VERSION: meson.project_version() */
  assert_string_equal(tessera_version(), TS_VERSION);
}

/* A file of `text` in a fresh temporary directory; path gets its name. */
static void write_file(char *path, size_t len, const char *text) {
  char dir[] = "/tmp/ts-token-XXXXXX";
  assert_non_null(mkdtemp(dir));
  snprintf(path, len, "%s/token", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void remove_file(const char *path) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = 0;
  unlink(path);
  rmdir(dir);
}

static void test_token_read(void **state) {
  (void)state;
  char path[256], err[512];
  write_file(path, sizeof path, "correct horse battery staple \t\r\n\n");
  char *t = ts_client_token_read(path, err, sizeof err);
  assert_non_null(t);
  assert_string_equal(t, "correct horse battery staple"); /* trailing white space dropped */
  ts_client_token_free(t);
  ts_client_token_free(NULL);
  remove_file(path);
}

static void test_token_refused(void **state) {
  (void)state;
  char path[256], err[512] = "";
  write_file(path, sizeof path, "short token\n");
  assert_null(ts_client_token_read(path, err, sizeof err));
  assert_non_null(strstr(err, "holds 11 bytes; a token needs at least 16"));
  assert_non_null(strstr(err, path));
  assert_null(ts_client_token_read(path, NULL, 0)); /* errmsg may be NULL */
  remove_file(path);
  assert_null(ts_client_token_read(path, err, sizeof err));
  assert_non_null(strstr(err, "cannot read token file"));
  assert_null(ts_client_token_read(NULL, err, sizeof err));
  assert_string_equal(err, "no token file named");
}

/* The placeholder of the Kubernetes Secret is not a token, with or without a line end. */
static void test_token_placeholder_refused(void **state) {
  (void)state;
  char path[256], err[512] = "";
  write_file(path, sizeof path, "replace-me-with-openssl-rand-hex-32-output\n");
  assert_null(ts_client_token_read(path, err, sizeof err));
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "holds the placeholder 'replace-me-with-openssl-rand-hex-32-output'"));
  assert_non_null(strstr(err, "openssl rand -hex 32"));
  remove_file(path);
  write_file(path, sizeof path, "replace-me-with-openssl-rand-hex-32-output-not");
  char *t = ts_client_token_read(path, err, sizeof err); /* only the placeholder itself */
  assert_non_null(t);
  ts_client_token_free(t);
  remove_file(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_is_the_project_s),
      cmocka_unit_test(test_token_read),
      cmocka_unit_test(test_token_placeholder_refused),
      cmocka_unit_test(test_token_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
