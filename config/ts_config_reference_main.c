/*
 * ts-config-reference: prints the configuration reference (docs/configuration.md) generated
 * from the key table in ts_config.c.
 *
 *   ts-config-reference > docs/configuration.md     regenerate the docs
 *   ts-config-reference --check docs/configuration.md
 *                                                   exit 1 when the file is not current
 *   ts-config-reference --python [--check FILE]     the same for the Python package's
 *                                                   python/src/tessera/_job_keys.py
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ts_config.h"

/* Compares what write makes with the file at path; reports the first differing line. */
static int check(void (*write)(FILE *), const char *path, const char *how) {
  FILE *want = tmpfile();
  if (!want) {
    perror("ts-config-reference: tmpfile");
    return TS_EXIT_FAILURE;
  }
  write(want);
  rewind(want);
  FILE *have = fopen(path, "rb");
  if (!have) {
    fprintf(stderr, "ts-config-reference: %s: %s\n", path, strerror(errno));
    fclose(want);
    return TS_EXIT_FAILURE;
  }
  int line = 1, a, b;
  do {
    a = fgetc(want);
    b = fgetc(have);
    if (a == '\n') line++;
  } while (a == b && a != EOF);
  fclose(want);
  fclose(have);
  if (a == b) return TS_EXIT_OK;
  fprintf(stderr,
          "ts-config-reference: %s differs from the key table at line %d; regenerate it:\n"
          "  build/config/ts-config-reference %s> %s\n",
          path, line, how, path);
  return TS_EXIT_FAILURE;
}

int main(int argc, char **argv) {
  bool python = argc > 1 && strcmp(argv[1], "--python") == 0;
  void (*write)(FILE *) = python ? ts_config_write_python : ts_config_write_reference;
  int rest = python ? 2 : 1;
  if (argc == rest + 2 && strcmp(argv[rest], "--check") == 0)
    return check(write, argv[rest + 1], python ? "--python " : "");
  if (argc != rest) {
    fprintf(stderr, "usage: ts-config-reference [--python] [--check FILE]\n");
    return TS_EXIT_USAGE;
  }
  write(stdout);
  return fflush(stdout) == 0 ? TS_EXIT_OK : TS_EXIT_FAILURE;
}
