/*
 * Job configuration (DESIGN.md §1): one libconfig file, `--set KEY=VALUE` overrides and the
 * TF_CONFIG environment variable, validated against one table of keys (ts_config_defs in
 * ts_config.c) with types, bounds and defaults.
 *
 * Precedence, lowest first: the table's defaults, the file, TF_CONFIG (cluster lists and
 * identity), then the overrides in the order given. Unknown keys are errors. Every error
 * names the file and line (or the override, or TF_CONFIG) and the key; the binaries exit
 * with TS_EXIT_CONFIG (78) on them.
 */
#ifndef TS_CONFIG_H
#define TS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes shared by every binary (DESIGN.md §1). */
#define TS_EXIT_OK 0
#define TS_EXIT_FAILURE 1
#define TS_EXIT_USAGE 2
#define TS_EXIT_CONFIG 78

#define TS_CONFIG_MAX_HOSTS 256
#define TS_CONFIG_MAX_LAYERS 64

typedef enum { TS_MODE_ASYNC = 1, TS_MODE_SYNC = 2, TS_MODE_SSP = 3 } ts_mode_t;
typedef enum { TS_OPT_SGD = 1, TS_OPT_MOMENTUM = 2, TS_OPT_ADAM = 3 } ts_optimizer_t;
typedef enum { TS_ACT_RELU = 1, TS_ACT_TANH = 2 } ts_activation_t;
typedef enum { TS_ROLE_NONE = 0, TS_ROLE_PS = 1, TS_ROLE_WORKER = 2 } ts_task_role_t;

typedef struct {
  /* cluster */
  char **ps;               /* "host:port" of each shard */
  size_t num_ps;
  char **ps_http;          /* each shard's admin HTTP address (may be empty) */
  size_t num_ps_http;
  char **workers;          /* each worker's admin HTTP address; its length is the worker count */
  size_t num_workers;

  /* job */
  ts_mode_t mode;
  int replicas_to_aggregate; /* 0 = all workers */
  int staleness;
  double sync_timeout_s;
  double heartbeat_timeout_s;
  double heartbeat_interval_s;
  int64_t partition_bytes;

  /* server */
  int64_t max_message_bytes;  /* largest frame payload a shard accepts */
  int max_connections;

  /* optimizer */
  ts_optimizer_t optimizer;
  double learning_rate;
  double momentum;
  double beta1, beta2, epsilon;

  /* model */
  int layers[TS_CONFIG_MAX_LAYERS];
  size_t num_layers;
  ts_activation_t activation;
  int64_t seed;

  /* data */
  char *data_format;          /* "idx" */
  char *train_images, *train_labels, *test_images, *test_labels;

  /* train */
  int batch_size;
  int epochs;
  int64_t max_steps;          /* 0 = no limit */
  char *logdir;
  double log_interval_s;

  /* device */
  char *placement;
  bool allow_soft_placement;
  bool log_device_placement;
  bool allow_growth;
  double memory_fraction;

  /* checkpoint */
  char *checkpoint_dir;
  double checkpoint_interval_s;
  int checkpoint_keep;

  /* auth */
  char *token_file;
  char *admin_token_file;

  /* identity, from TF_CONFIG's task (or the --shard/--task flags, which the caller sets) */
  ts_task_role_t task_role;
  int task_index;             /* -1 when not given */

  /* where the file was read from, for messages ("-" when none) */
  char *source;
} ts_config_t;

/* Fill *cfg with the table's defaults. Never fails except for memory (TS_ENOMEM). */
int ts_config_defaults(ts_config_t *cfg);

/* Load a job: defaults, then `path` (NULL = no file), then the TF_CONFIG value `tf_config`
 * (NULL = none; callers pass getenv("TF_CONFIG")), then each "KEY=VALUE" of overrides[n]
 * in order, then cross-key validation (for example replicas_to_aggregate <= workers).
 * Returns 0 or a negative code (TS_ECONFIG, TS_ENOMEM); on error errmsg holds one line such
 * as "job.cfg:12: job.mode: must be one of \"sync\", \"async\", \"ssp\", not \"fast\"".
 * *cfg is always left freeable with ts_config_free. */
int ts_config_load(ts_config_t *cfg, const char *path, const char *tf_config,
                   const char *const *overrides, size_t n, char *errmsg, size_t errlen);

void ts_config_free(ts_config_t *cfg);

const char *ts_mode_name(ts_mode_t mode);
const char *ts_optimizer_name(ts_optimizer_t opt);

/* Write the key reference (Markdown table: key, type, default, bounds, meaning), generated
 * from the table, to f. docs/configuration.md is made from it. */
void ts_config_write_reference(FILE *f);

/* Split "host:port" (or "[v6]:port") into host (buffer of hostlen) and port. Returns 0 or
 * TS_EINVAL. */
int ts_config_split_address(const char *addr, char *host, size_t hostlen, int *port);

#endif
