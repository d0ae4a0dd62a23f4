/*
 * ts-config-reference: prints the configuration reference (docs/configuration.md) generated
 * from the key table in ts_config.c.
 *
 *   ts-config-reference > docs/configuration.md     regenerate the docs
 *   ts-config-reference --check docs/configuration.md
 *                                                   exit 1 when the file is not current
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ts_config.h"

/* Compares the generated reference with the file at path; reports the first differing line. */
static int check(const char *path) {
  FILE *want = tmpfile();
  if (!want) {
    perror("ts-config-reference: tmpfile");
    return TS_EXIT_FAILURE;
  }
  ts_config_write_reference(want);
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
          "  build/config/ts-config-reference > docs/configuration.md\n",
          path, line);
  return TS_EXIT_FAILURE;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--check") == 0) return check(argv[2]);
  if (argc != 1) {
    fprintf(stderr, "usage: ts-config-reference [--check FILE]\n");
    return TS_EXIT_USAGE;
  }
  ts_config_write_reference(stdout);
  return fflush(stdout) == 0 ? TS_EXIT_OK : TS_EXIT_FAILURE;
}
