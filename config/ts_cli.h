/*
 * The command line shared by ps-server and ps-worker: -c FILE, --set KEY=VALUE..., an
 * identity flag (--shard N or --task N), --log-level, --help, --version, and for the server
 * --insecure, --fresh and --adopt; then loading the job (ts_config_load with TF_CONFIG) and resolving the
 * identity from TF_CONFIG when the flag is absent.
 */
#ifndef TS_CLI_H
#define TS_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "ts_config.h"
#include "ts_log.h"

typedef struct {
  const char *prog;        /* "ps-server" */
  const char *id_name;     /* "shard" or "task": the long option and the TF_CONFIG role */
  ts_task_role_t id_role;  /* TS_ROLE_PS or TS_ROLE_WORKER */
  bool allow_insecure;     /* accept --insecure */
  bool allow_fresh;        /* accept --fresh and --adopt */
  void (*usage)(FILE *f);
} ts_cli_spec_t;

typedef struct {
  const char *config_path;
  const char **sets;       /* --set values, in order */
  size_t num_sets;
  long id;                 /* -1 until resolved */
  bool insecure;
  bool fresh, adopt;
  ts_log_level_t level;
} ts_cli_t;

/* Parse argv. Returns -1 to go on, or the exit code to leave with right away (0 after
 * --help or --version, TS_EXIT_USAGE after a usage error, which is printed). Free with
 * ts_cli_free in both cases. */
int ts_cli_parse(const ts_cli_spec_t *spec, int argc, char **argv, ts_cli_t *out);

/* Load the job into *cfg and resolve out->id (the flag, else TF_CONFIG's task of the right
 * role; it must be below the cluster's count of that role). Logs the problem and returns
 * the exit code on failure (TS_EXIT_CONFIG, TS_EXIT_USAGE); -1 on success. *cfg is always
 * freeable. Re-initialises logging with the name "prog[id]". */
int ts_cli_load(const ts_cli_spec_t *spec, ts_cli_t *cli, ts_config_t *cfg);

void ts_cli_free(ts_cli_t *cli);

#endif
