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
    "  -o, -w, --output FORMAT  table (default) or json (a stable schema, see\n"
    "                           docs/operations.md)\n"
    "      --shard N            only shard N (a container's own healthcheck)\n"
    "      --timeout SECONDS    how long to wait for each shard (default 3)\n"
    "  -h, --help               help (psctl COMMAND --help: that command's)\n"
    "  -V, --version            print the version\n";

static const psctl_command_t commands[] = {
    {"status", "status", "job mode, global step, every shard and worker",
     "Shows the job's mode and global step, then the SHARDS table (see psctl shards) and the\n"
     "WORKERS table (see psctl workers). On a terminal a bar shows the workers' progress\n"
     "through the epoch. With -o json: one object {mode, step, healthy, shards[], workers[]}.\n"
     "Exit 0 when every shard answered, 1 when one is down.\n"},
    {"shards", "shards", "one line per shard: address, up, partitions, bytes, version",
     "One line per shard of cluster.ps: ADDRESS, UP, PARTITIONS, BYTES, VERSION (its lowest\n"
     "partition version), STALE (gradients dropped as stale) and a NOTE (which tasks the open\n"
     "sync barrier waits for, or why the shard did not answer). -o json: an array.\n"},
    {"workers", "workers", "one line per worker: step, loss, examples/s, state, device",
     "One line per worker of cluster.workers, as the shards see it:\n"
     "  STEP        the last step it finished (in sync mode it moves with every push, so it\n"
     "              is never more than one step from the job's while the worker keeps up)\n"
     "  LOSS, EXAMPLES/S, EPOCH   its last progress report (every train.log_interval_s)\n"
     "  LAST SEEN   since the shards last heard from it\n"
     "  STATE       alive; stopped (it finished and said so); dead (it vanished or missed\n"
     "              its heartbeats for job.heartbeat_timeout_s); not joined (never seen)\n"
     "  DEVICE      the device its model really runs on (/cpu:0 when soft placement moved\n"
     "              it off a GPU)\n"
     "'-' is a value the worker has not reported yet (null in -o json).\n"},
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
    {"help", "help [COMMAND]", "this list, or one command's help", "Prints psctl's help, or COMMAND's.\n"},
};

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
          "2 usage error, 78 bad configuration (also an unreadable token file).\n"
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
                            strcmp(commands[i].name, "model") == 0 ? "model reset"
                                                                   : commands[i].name);
}
