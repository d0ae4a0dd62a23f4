/*
 * Corpus replay: runs a fuzz target's LLVMFuzzerTestOneInput on every file of the corpus
 * directories named on the command line, without libFuzzer, so the corpus is an ordinary
 * test (suite 'fuzz'). Each input gets a buffer of exactly its size, so a sanitizer build
 * catches any read past it. Fails when a directory is missing, unreadable or empty.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_target.h"

/* Reads path into a new buffer of exactly its size (*len); NULL on failure. */
static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t *buf = NULL;
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size < 0) goto done;
  *len = (size_t)st.st_size;
  buf = malloc(*len ? *len : 1);
  if (buf && *len && fread(buf, 1, *len, f) != *len) {
    free(buf);
    buf = NULL;
  }
done:
  fclose(f);
  return buf;
}

static int skip_entry(const struct dirent *e) { return e->d_name[0] != '.'; }

/* Replays every regular file of dir in name order. Returns the count, or -1 on error. */
static long replay_dir(const char *dir) {
  struct dirent **names = NULL;
  int n = scandir(dir, &names, skip_entry, alphasort);
  if (n < 0) {
    fprintf(stderr, "replay: cannot read corpus directory %s: %s\n", dir, strerror(errno));
    return -1;
  }
  long count = 0;
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    int w = snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    struct stat st;
    if (!failed && (w < 0 || (size_t)w >= sizeof path || stat(path, &st) != 0)) {
      fprintf(stderr, "replay: cannot stat %s/%s\n", dir, names[i]->d_name);
      failed = 1;
    }
    if (!failed && S_ISREG(st.st_mode)) {
      size_t len = 0;
      uint8_t *buf = read_file(path, &len);
      if (!buf) {
        fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno));
        failed = 1;
      } else {
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
        count++;
      }
    }
    free(names[i]);
  }
  free(names);
  if (failed) return -1;
  if (count == 0) {
    fprintf(stderr, "replay: corpus directory %s has no inputs\n", dir);
    return -1;
  }
  return count;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    long n = replay_dir(argv[i]);
    if (n < 0) return 1;
    printf("replay: %ld inputs from %s\n", n, argv[i]);
  }
  return 0;
}
