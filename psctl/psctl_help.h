/*
 * psctl's commands: the one table that psctl's help, each command's --help and the
 * "unknown command" message are made from, so that none of them forgets a command.
 */
#ifndef PSCTL_HELP_H
#define PSCTL_HELP_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
  const char *name;     /* the verb: "status", "model" (for model reset) */
  const char *synopsis; /* "shutdown [--no-checkpoint]": its options (--NAME, -X) and fixed
                         * words ("model reset", "completion bash|zsh") are what the shell
                         * completion offers after the command */
  const char *summary;  /* one line, for the command list */
  const char *help;     /* the command's own help (psctl COMMAND --help) */
} psctl_command_t;

/* The commands, in the order of psctl --help: psctl_command_at(i) for i < count (NULL
 * past the end). What else knows the commands (completion, "did you mean") reads them
 * here, so a command added to the table is known everywhere. */
size_t psctl_command_count(void);
const psctl_command_t *psctl_command_at(size_t i);

/* The command called name, or NULL. */
const psctl_command_t *psctl_command_find(const char *name);

/* psctl --help: every command with its one line, the global options, the exit codes. */
void psctl_usage(FILE *f);

/* psctl COMMAND --help. */
void psctl_command_help(FILE *f, const psctl_command_t *c);

/* "status, shards, ..., model reset, help" into buf (cut at n). */
void psctl_command_names(char *buf, size_t n);

#endif
