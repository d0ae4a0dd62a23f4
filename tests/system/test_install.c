/*
 * libtessera-client as a user gets it: `meson install --destdir D`, then examples/c/pushpull.c
 * built against the installed copy only (its header and pkg-config file under D, the
 * source copied into D, no -I into the source tree) and run, with D's library on
 * LD_LIBRARY_PATH, against two real ps-server shards. Also: the library exports only the
 * public names and needs only libuv, protobuf-c and libsodium; its header is strict C99 and
 * C++.
 *
 * Set by meson: TS_BUILD_ROOT, TS_SOURCE_ROOT, TS_PREFIX, TS_LIBDIR, TS_MESON.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "ts_build_config.h" /* TS_VERSION: the project's (VERSION) */

static char dest[256];
static bool quiet; /* the next command is expected to fail: do not report it */
static char libdir[400], incdir[400], pcdir[512];

/* Run a shell command line, stdout into out; returns its exit status. */
static int sh(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sh(char *out, size_t n, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char err[8192];
  const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
  int rc = ts_run_capture(argv, out, n, err, sizeof err);
  if (rc != 0 && !quiet) fprintf(stderr, "command failed (%d): %s\nstdout: %s\nstderr: %s\n", rc, cmd, out, err);
  return rc;
}

static bool exists(const char *dir, const char *name) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static int setup(void **state) {
  (void)state;
  snprintf(dest, sizeof dest, "/tmp/tessera-install-XXXXXX");
  if (!mkdtemp(dest)) return -1;
  snprintf(libdir, sizeof libdir, "%s%s/%s", dest, TS_PREFIX, TS_LIBDIR);
  snprintf(incdir, sizeof incdir, "%s%s/include", dest, TS_PREFIX);
  snprintf(pcdir, sizeof pcdir, "%s/pkgconfig", libdir);
  char out[4096];
  return sh(out, sizeof out, "'%s' install -C '%s' --destdir '%s' --no-rebuild >'%s/install.log' 2>&1",
            TS_MESON, TS_BUILD_ROOT, dest, dest);
}

static int teardown(void **state) {
  (void)state;
  char out[256];
  return sh(out, sizeof out, "rm -rf '%s'", dest);
}

static void test_installed_files(void **state) {
  (void)state;
  assert_true(exists(libdir, "libtessera-client.so.0"));
  assert_true(exists(libdir, "libtessera-client.so." TS_VERSION));
  assert_true(exists(incdir, "tessera/client.h"));
  assert_true(exists(pcdir, "tessera-client.pc"));
  /* The header stands alone: no internal header, no protobuf type. */
  char out[4096];
  assert_int_equal(sh(out, sizeof out, "grep -c '^#include' '%s/tessera/client.h'", incdir), 0);
  assert_int_equal(atoi(out), 4); /* signal (sig_atomic_t), stdbool, stddef, stdint */
  quiet = true;
  assert_int_not_equal(sh(out, sizeof out, "grep -n 'Tessera__\\|pb-c' '%s/tessera/client.h'", incdir), 0);
  quiet = false;
}

static void test_exports_only_public_names(void **state) {
  (void)state;
  char out[16384];
  assert_int_equal(sh(out, sizeof out, "nm -D --defined-only '%s/libtessera-client.so.0' | awk '{print $3}'",
                      libdir), 0);
  size_t n = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "ts_client_", 10) != 0 && strncmp(line, "tessera_", 8) != 0)
      fail_msg("exported symbol %s is not public", line);
    n++;
  }
  assert_true(n >= 20);
  /* Its only dependencies: libuv, protobuf-c, libsodium, OpenSSL (auth.tls) and the C
   * library (libc, libm, the dynamic loader for thread-local storage). */
  assert_int_equal(sh(out, sizeof out, "objdump -p '%s/libtessera-client.so.0' | awk '/NEEDED/ {print $2}'",
                      libdir), 0);
  static const char *const allowed[] = {"libuv.so.", "libprotobuf-c.so.", "libsodium.so.",
                                        "libssl.so.", "libcrypto.so.", "libc.so.", "libm.so.",
                                        "ld-linux"};
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    bool ok = false;
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
      ok |= strncmp(line, allowed[i], strlen(allowed[i])) == 0;
    if (!ok) fail_msg("libtessera-client needs %s", line);
  }
}

static void test_example_against_installed_copy(void **state) {
  (void)state;
  char out[8192];
  /* Build: the source copied into D, flags from the installed .pc with its prefix moved
   * into D. */
  assert_int_equal(sh(out, sizeof out, "cp '%s/examples/c/pushpull.c' '%s/pushpull.c'", TS_SOURCE_ROOT, dest), 0);
  assert_int_equal(sh(out, sizeof out,
                      "PKG_CONFIG_PATH='%s' pkg-config --define-variable=prefix='%s%s' --cflags --libs tessera-client",
                      pcdir, dest, TS_PREFIX), 0);
  assert_null(strstr(out, TS_SOURCE_ROOT));
  assert_non_null(strstr(out, dest));
  assert_int_equal(sh(out, sizeof out,
                      "cd '%s' && cc -std=c99 -pedantic -Wall -Wextra -Werror pushpull.c $(PKG_CONFIG_PATH='%s' pkg-config "
                      "--define-variable=prefix='%s%s' --cflags --libs tessera-client) -o pushpull",
                      dest, pcdir, dest, TS_PREFIX), 0);
  /* The header is C++ too (extern "C"): a C++ program links against the library. */
  assert_int_equal(sh(out, sizeof out,
                      "cd '%s' && printf '#include <tessera/client.h>\\nint main() { ts_client_opts_t o; "
                      "ts_client_opts_init(&o); return tessera_version()[0] == 0 || o.struct_size == 0; }\\n' "
                      "> cxx.cc && c++ -std=c++11 -pedantic -Wall -Wextra -Werror cxx.cc $(PKG_CONFIG_PATH='%s' "
                      "pkg-config --define-variable=prefix='%s%s' --cflags --libs tessera-client) -o cxx && "
                      "LD_LIBRARY_PATH='%s' ./cxx",
                      dest, pcdir, dest, TS_PREFIX, libdir), 0);
  /* It loads the installed library. */
  assert_int_equal(sh(out, sizeof out, "LD_LIBRARY_PATH='%s' ldd '%s/pushpull' | grep tessera-client", libdir, dest), 0);
  assert_non_null(strstr(out, libdir));

  ts_cluster_t c;
  assert_int_equal(ts_cluster_start(&c, 2, 1,
                                    "job = { mode = \"async\"; partition_bytes = 16; };\n"
                                    "optimizer = { name = \"sgd\"; learning_rate = 1.0; };"),
                   0);
  int rc = sh(out, sizeof out, "LD_LIBRARY_PATH='%s' '%s/pushpull' %s %s", libdir, dest, c.addrs[0],
              c.addrs[1]);
  printf("%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "libtessera-client " TS_VERSION ": 2 shard(s), mode async, 2 tensor(s)"));
  assert_non_null(strstr(out, "\npulled version 1\n"));
  assert_non_null(strstr(out, "\nw: -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1\n"));
  assert_non_null(strstr(out, "\nb: -0.5 -0.5 -0.5\n"));
  assert_null(strstr(out, " 0 partition(s) applied"));

  /* Errors exit non-zero: no arguments, a shard that is not there. */
  quiet = true;
  assert_int_not_equal(sh(out, sizeof out, "LD_LIBRARY_PATH='%s' '%s/pushpull' 2>/dev/null", libdir, dest), 0);
  int dead = ts_free_port();
  assert_int_not_equal(sh(out, sizeof out, "LD_LIBRARY_PATH='%s' '%s/pushpull' 127.0.0.1:%d 2>/dev/null",
                          libdir, dest, dead), 0);
  quiet = false;
  assert_int_equal(ts_cluster_stop(&c), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_installed_files),
      cmocka_unit_test(test_exports_only_public_names),
      cmocka_unit_test(test_example_against_installed_copy),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
