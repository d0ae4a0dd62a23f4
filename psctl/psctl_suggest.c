/* "Did you mean" (psctl_suggest.h). */
#include "psctl_suggest.h"

#include <stdint.h>
#include <string.h>

#include "psctl_help.h"

#define MAX_WORD 64

size_t psctl_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > MAX_WORD || lb > MAX_WORD) return SIZE_MAX;
  /* d[i][j]: the distance of a's first i characters to b's first j. */
  size_t d[MAX_WORD + 1][MAX_WORD + 1];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      size_t cost = a[i - 1] != b[j - 1];
      size_t best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[la][lb];
}

const char *psctl_suggest(const char *word, const char *const *cands, size_t n) {
  size_t len = strlen(word), best = SIZE_MAX;
  const char *pick = NULL, *prefix_of = NULL;
  size_t prefixes = 0;
  for (size_t i = 0; i < n; i++) {
    if (!cands[i]) continue;
    size_t d = psctl_edit_distance(word, cands[i]);
    if (d < best) {
      best = d;
      pick = cands[i];
    }
    if (len && strncmp(cands[i], word, len) == 0) {
      prefixes++;
      prefix_of = cands[i];
    }
  }
  if (pick && best <= 2 && best < len) return pick;
  return prefixes == 1 ? prefix_of : NULL;
}

void psctl_unknown_command(FILE *f, const char *name) {
  const char *cands[64];
  size_t n = 0;
  for (size_t i = 0; i < psctl_command_count() && n < 64; i++)
    cands[n++] = psctl_command_at(i)->name;
  const char *near = psctl_suggest(name, cands, n);
  char names[512];
  psctl_command_names(names, sizeof names);
  if (near)
    fprintf(f, "psctl: unknown command '%s'; did you mean '%s'? (see psctl --help)\n", name, near);
  else
    fprintf(f, "psctl: unknown command '%s' (%s; see psctl --help)\n", name, names);
}

void psctl_unknown_option(FILE *f, const char *arg, const struct option *longopts) {
  const char *near = NULL;
  if (strncmp(arg, "--", 2) == 0) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    const char *cands[64];
    size_t n = 0;
    for (const struct option *o = longopts; o->name && n < 64; o++) cands[n++] = o->name;
    near = psctl_suggest(name, cands, n);
  }
  if (near)
    fprintf(f, "psctl: unknown option '%s'; did you mean '--%s'? (see psctl --help)\n", arg, near);
  else
    fprintf(f, "psctl: unknown option '%s' (see psctl --help)\n", arg);
}
