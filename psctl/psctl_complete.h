/*
 * psctl completion bash|zsh: the shell completion scripts, made from psctl's own tables so
 * that they cannot drift from it: the commands, their one-line summaries and their fixed
 * words and options from the command table (psctl_help.h: a synopsis such as
 * "model reset [--force]" or "status [-w] [--interval S]"), the global options from
 * getopt's table (every option that no synopsis names), and the values an option takes
 * from the hints psctl passes.
 */
#ifndef PSCTL_COMPLETE_H
#define PSCTL_COMPLETE_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "psctl_help.h"

/* What the value of option `option` (a long name) may be: words, separated by spaces
 * ("table json"), or NULL for a file name. */
typedef struct {
  const char *option;
  const char *words;
} psctl_value_hint_t;

/* The options and shells psctl's completion knows; longopts ends with a NULL name. */
typedef struct {
  const struct option *longopts;
  const psctl_value_hint_t *hints;
  size_t num_hints;
} psctl_options_t;

/* Whether c's synopsis names the option called long_name, as --NAME or as its short
 * form -X. */
bool psctl_command_takes(const psctl_command_t *c, const psctl_options_t *o,
                         const char *long_name);

/* The completion script for shell ("bash" or "zsh") on f. Returns 0, or -1 (nothing
 * printed) for another shell. */
int psctl_completion_print(FILE *f, const char *shell, const psctl_options_t *o);

#endif
