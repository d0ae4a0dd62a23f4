/*
 * "Did you mean": the known word nearest to a mistyped one, as kubectl and git suggest a
 * command. Near is an edit distance (insertions, deletions, substitutions and swaps of
 * two neighbouring letters, each 1) of at most 2, and less than the word's length, so
 * that a short word is not "corrected" into an unrelated one; or the word is the start of
 * exactly one candidate.
 */
#ifndef PSCTL_SUGGEST_H
#define PSCTL_SUGGEST_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

/* The edit distance of a and b (optimal string alignment: a swap of neighbours is 1),
 * SIZE_MAX when either is longer than 64 characters. */
size_t psctl_edit_distance(const char *a, const char *b);

/* The candidate nearest to word (the first of equals), or NULL when none is near
 * (see above). cands[0..n) are compared as they are; NULL entries are skipped. The result
 * points into cands. */
const char *psctl_suggest(const char *word, const char *const *cands, size_t n);

/* On f: "psctl: unknown command 'stauts'; did you mean 'status'? ..." from the command
 * table (psctl_help.h), or the list of commands when none is near. */
void psctl_unknown_command(FILE *f, const char *name);

/* On f: "psctl: unknown option '--ouptut=json'; did you mean '--output'? ..." (arg as
 * written; only long options are matched, against getopt's table longopts, which ends
 * with a NULL name). */
void psctl_unknown_option(FILE *f, const char *arg, const struct option *longopts);

#endif
