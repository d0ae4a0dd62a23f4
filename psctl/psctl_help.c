/* psctl's commands and their help (psctl_help.h). */
#include "psctl_help.h"

#include <string.h>

/* The options every command takes, shown under each command's help too. */
static const char global_options[] =
    "Global options (anywhere on the line: psctl status -o json = psctl -o json status;\n"
    "a value may follow as the next word, after '=' for a long option, or glued to a short\n"
    "one: -o json, --output json, --output=json, -ojson):\n"
    "  -c, --config FILE        the job file (default /etc/tessera/job.cfg; without it psctl\n"
    "                           uses the built-in defaults, shard 0 at 127.0.0.1:7100, and\n"
    "                           says so on stderr)\n"
    "      --set KEY=VALUE      override a key of the job file (e.g. --set\n"
    "                           auth.admin_token_file=\"/etc/tessera/admin.token\")\n"
    "  -o, --output FORMAT      table (default) or json (a stable schema, see\n"
    "                           docs/operations.md; indented by two spaces)\n"
    "      --shard N            only shard N (a container's own healthcheck)\n"
    "      --timeout SECONDS    how long to wait for each shard (default 3)\n"
    "  -h, --help               help (psctl COMMAND --help: that command's)\n"
    "  -V, --version            print the version\n";

/* The options of the commands that take --watch. */
#define WATCH_HELP                                                                          \
  "  -w, --watch      redraw it every --interval seconds (default 2) until Ctrl-C (exit\n"    \
  "                   0): in place on a terminal; elsewhere one block after another,\n"      \
  "                   separated by an empty line (with -o json: one JSON value each)\n"      \
  "  --interval S     the seconds between two refreshes of --watch\n"

static const psctl_command_t commands[] = {
    {"status", "status [-w] [--interval S]", "job mode, global step, every shard and worker",
     "Shows the job's mode and global step, then the SHARDS table (see psctl shards) and the\n"
     "WORKERS table (see psctl workers). On a terminal a bar shows the workers' progress\n"
     "through the epoch. With -o json: one object {mode, step, healthy, shards[], workers[]}.\n"
     WATCH_HELP
     "Exit 0 when every shard answered, 1 when one is down, 77 when a shard refused the\n"
     "token. Reading (status, health, shards, workers, tables) needs only the worker token.\n"},
    {"shards", "shards [-w] [--interval S]",
     "one line per shard: address, up, partitions, bytes, version",
     "One line per shard of cluster.ps: ADDRESS, UP, PARTITIONS, BYTES, VERSION (its lowest\n"
     "partition version), STALE (gradients dropped as stale) and a NOTE (which tasks the open\n"
     "sync barrier waits for, or why the shard did not answer). -o json: an array.\n"
     WATCH_HELP},
    {"workers", "workers [-w] [--interval S]",
     "one line per worker: step, loss, examples/s, state, device",
     "One line per worker of cluster.workers, as the shards see it:\n"
     "  STEP        the last step it finished (in sync mode it moves with every push, so it\n"
     "              is never more than one step from the job's while the worker keeps up)\n"
     "  LOSS, EXAMPLES/S, EPOCH   its last progress report (every train.log_interval_s)\n"
     "  LAST SEEN   since the shards last heard from it\n"
     "  STATE       alive; stopped (it finished and said so); dead (it vanished or missed\n"
     "              its heartbeats for job.heartbeat_timeout_s); not joined (never seen)\n"
     "  DEVICE      the device its model really runs on (/cpu:0 when soft placement moved\n"
     "              it off a GPU)\n"
     "'-' is a value the worker has not reported yet (null in -o json).\n"
     WATCH_HELP},
    {"tables", "tables [--interval SECONDS]",
     "the embedding tables: rows, bytes, created, evicted, hot keys, per shard",
     "One block per embedding table of the job: its totals over the shards, then a line per\n"
     "shard: DIM (row width), ROWS held, BYTES (rows, their optimizer state and the index),\n"
     "VERSION (the table's steps in sync mode, pushes applied otherwise), CREATED (rows made),\n"
     "EVICTED (by steps to live, max_rows or server.max_table_bytes), FILTERED (gradient\n"
     "rows dropped for keys not admitted yet) and HOT8 (the share of the keys pulled of late\n"
     "that were the shard's 8 hottest: a lower bound, from a sample).\n"
     "  --interval S   sample twice, S seconds apart, and add CREATED/S, EVICTED/S and\n"
     "                 PULLED/S (rows per second over the interval)\n"
     "-o json: an array, one object per table with its totals and its shards[] (hot_keys:\n"
     "the 8 hottest ids, as strings; with --interval the rates, *_per_s).\n"},
    {"health", "health", "'healthy' and exit 0 when every shard answers, else exit 1",
     "Prints 'healthy' and exits 0 when every shard (or shard N with --shard N) answers;\n"
     "prints 'unhealthy', the reason per shard on stderr, and exits 1 otherwise. For\n"
     "healthchecks (docker compose, systemd).\n"},
    {"checkpoint", "checkpoint [list]", "every shard writes a checkpoint now (admin); list: the files",
     "Asks every shard to write a checkpoint to checkpoint.dir now and prints each file and\n"
     "the step it holds. Needs the admin token (auth.admin_token_file).\n"
     "checkpoint list reads checkpoint.dir on this host instead (the shards' directory, or\n"
     "--set checkpoint.dir=\"DIR\" for one shard's): per shard each file with its STEP,\n"
     "SIZE, AGE and VALID (read whole, its hash and sizes checked, else why not), oldest\n"
     "first; -o json: an array. Exit 0, 1 when a file is not valid, 78 without a directory.\n"},
    {"shutdown", "shutdown [--no-checkpoint]",
     "every shard writes a final checkpoint and stops (admin)",
     "Asks every shard to write a final checkpoint (when checkpoint.dir is set) and stop.\n"
     "  --no-checkpoint   stop without the final checkpoint\n"
     "Needs the admin token (auth.admin_token_file).\n"},
    {"model", "model reset [--force]",
     "every shard drops its declared model and its optimizer state (admin)",
     "model reset: every shard drops its declared model and the model's optimizer state, so\n"
     "the next declare defines it anew. Refused while workers are connected unless\n"
     "  --force   close their connections (they reconnect and declare again)\n"
     "Needs the admin token (auth.admin_token_file).\n"},
    {"completion", "completion bash|zsh", "print the shell completion script for bash or zsh",
     "Prints a script that completes psctl's commands, their options and the values of -o\n"
     "and -c in bash or zsh. Load it in the current shell with\n"
     "  source <(psctl completion bash)        or        source <(psctl completion zsh)\n"
     "or install it: psctl completion bash > /etc/bash_completion.d/psctl, or psctl\n"
     "completion zsh > _psctl in a directory of $fpath. It is made from psctl's own tables\n"
     "of commands and options, so it knows every command of this psctl.\n"},
    /* --output=FILE, not -o FILE: an option a synopsis names is that command's own to the
     * completion (psctl_complete.h), and -o stays every command's output option. */
    {"export", "export --format F --output=FILE [--vocab TABLE=N]... [--from-checkpoint]",
     "the job's parameters as a safetensors or .npz file (for Keras, numpy, PyTorch)",
     "Pulls the model from every shard (all must be up) and writes it to FILE: each dense\n"
     "tensor by its name (conv1/kernel, float32, its declared shape; BatchNormalization's\n"
     "moving statistics too), with the job's settings, the step and the state tensors'\n"
     "names as metadata (safetensors' __metadata__; in an .npz the uint8 array\n"
     "__metadata__, UTF-8 JSON). The file appears whole or not at all (written beside it,\n"
     "then renamed). tessera.load_weights(FILE, keras_model) loads it into Keras.\n"
     "  --from-checkpoint  read checkpoint.dir on this host instead, with no shard up:\n"
     "                   every shard's newest checkpoint, re-sharded from a complete set\n"
     "                   of the job's files as a restore does (--set checkpoint.dir=DIR)\n"
     "  --format F       safetensors or npz (a zip of .npy files, stored; at most 4 GiB)\n"
     "  -o, --output FILE  the file to write (for export, -o names a file, not a format)\n"
     "  --vocab TABLE=N  export embedding table TABLE as a dense N x dim matrix of ids\n"
     "                   0..N-1 (read-only: an id with no row gets its initial row); a\n"
     "                   table without one is written as TABLE/ids (int64, the ids its\n"
     "                   rows have on the shards, ascending) and TABLE/rows (float32)\n"
     "Exit 0 when the file was written, 1 when a shard is down, a pull or the write\n"
     "failed or the directory holds no usable checkpoint, 2 for a usage error, 78 with\n"
     "--from-checkpoint and no checkpoint.dir.\n"},
    {"token", "token derive --task T", "print worker T's task key (from auth.token_file)",
     "token derive --task T: prints worker T's task key, HMAC-SHA256 of \"worker/T\" under\n"
     "the job's token (auth.token_file), as 64 hex characters. A worker whose\n"
     "auth.token_file holds its task key instead of the job's token proves to the shards\n"
     "that it is task T, and a connection that only claims T with the job's token\n"
     "cannot take the task from it (docs/security.md). Asks no shard.\n"},
    {"help", "help [COMMAND]", "this list, or one command's help", "Prints psctl's help, or COMMAND's.\n"},
};

size_t psctl_command_count(void) { return sizeof commands / sizeof commands[0]; }

const psctl_command_t *psctl_command_at(size_t i) {
  return i < sizeof commands / sizeof commands[0] ? &commands[i] : NULL;
}

const psctl_command_t *psctl_command_find(const char *name) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

void psctl_usage(FILE *f) {
  fprintf(f, "usage: psctl [OPTIONS] COMMAND [ARGS]\n\nCommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-28s %s\n", commands[i].synopsis, commands[i].summary);
  fprintf(f,
          "\n%s\n"
          "Colour is used only when stdout is a terminal and NO_COLOR is not set.\n"
          "\n"
          "Exit codes: 0 every shard (or shard N) answered, 1 a shard is down or failed,\n"
          "2 usage error, 77 a shard refused the token (or could not prove it knows it),\n"
          "78 bad configuration (also an unreadable token file). Reading commands work with\n"
          "the worker token (auth.token_file) when the admin token's file is not readable.\n"
          "\n"
          "psctl COMMAND --help (or psctl help COMMAND) describes one command.\n",
          global_options);
}

void psctl_command_help(FILE *f, const psctl_command_t *c) {
  fprintf(f, "usage: psctl [OPTIONS] %s\n\n%s: %s.\n\n%s\n%s", c->synopsis, c->name, c->summary,
          c->help, global_options);
}

void psctl_command_names(char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (size_t i = 0; i < sizeof commands / sizeof commands[0] && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "",
                            strcmp(commands[i].name, "model") == 0   ? "model reset"
                            : strcmp(commands[i].name, "token") == 0 ? "token derive"
                                                                     : commands[i].name);
}
