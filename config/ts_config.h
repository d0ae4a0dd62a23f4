/*
 * Job configuration (docs/configuration.md): one libconfig file, `--set KEY=VALUE` overrides and the
 * TF_CONFIG environment variable, validated against one table of keys (ts_config_defs in
 * ts_config.c) with types, bounds and defaults.
 *
 * Precedence, lowest first: the table's defaults, the file, TF_CONFIG (cluster lists and
 * identity), then the overrides in the order given. Unknown keys are errors. Every error
 * names the file and line (or the override, or TF_CONFIG) and the key; the binaries exit
 * with TS_EXIT_CONFIG (78) on them. docs/configuration.md lists every key (it is generated
 * from the table by ts-config-reference).
 *
 * Values: a float key also takes an integer (60 for 60.0); an int64 key takes any integer.
 * libconfig 1.5 silently wraps integer literals beyond 32 bits that lack an L suffix; the
 * loader adds the suffix before parsing (the file itself and --set values, not files pulled
 * in by @include), so "max_message_bytes = 4294967296;" means what it says.
 *
 * Overrides: "KEY=VALUE", VALUE in libconfig syntax ("train.max_steps=200",
 * "model.layers=[784, 10]", "job.mode=\"async\""). Because the shell eats the quotes of
 * --set job.mode="async", a string key also takes a VALUE that does not start with '"' as it
 * stands ("job.mode=async", "train.logdir=/tmp/tb"; "checkpoint.dir=" is the empty string).
 *
 * TF_CONFIG: {"cluster":{"ps":[...],"worker":[...]},"task":{"type":"ps"|"worker","index":N}}.
 * cluster.ps sets cluster.ps, cluster.worker sets cluster.workers (both optional); task sets
 * task_role and task_index. Other cluster jobs (chief, evaluator) are errors, since Tessera
 * would never start them; other top-level members (environment, rpc_layer) are ignored. An
 * empty or blank TF_CONFIG counts as unset.
 */
#ifndef TS_CONFIG_H
#define TS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ts_config_layers.h"

/* Exit codes shared by every binary (docs/configuration.md). */
#define TS_EXIT_OK 0
#define TS_EXIT_FAILURE 1
#define TS_EXIT_USAGE 2
#define TS_EXIT_NOTHING_TO_TRAIN 3 /* ps-worker: the job had no step left for it */
#define TS_EXIT_CONFIG 78

#define TS_CONFIG_MAX_HOSTS 256
#define TS_CONFIG_MAX_LAYERS 64

typedef enum { TS_MODE_ASYNC = 1, TS_MODE_SYNC = 2, TS_MODE_SSP = 3 } ts_mode_t;
typedef enum { TS_OPT_SGD = 1, TS_OPT_MOMENTUM = 2, TS_OPT_ADAM = 3 } ts_optimizer_t;
typedef enum { TS_DECAY_NONE = 1, TS_DECAY_EXPONENTIAL = 2, TS_DECAY_COSINE = 3 } ts_decay_t;
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
  double start_timeout_s;     /* sync: step 1 waits this long for every worker to join */
  int min_workers;            /* sync: step 1 needs this many joined, 0 = all workers */
  char *job_name;             /* job.name: part of the job's identity when set */
  double heartbeat_timeout_s;
  double heartbeat_interval_s;
  int busy_poll_us;
  int64_t partition_bytes;
  double connect_timeout_s;   /* a worker waits this long for every shard at its start */

  /* server */
  int64_t max_message_bytes;  /* largest frame payload a shard accepts */
  int max_connections;        /* authenticated connections */
  int max_preauth_connections;
  double handshake_timeout_s;
  int max_handshake_bytes;
  double frame_grace_s;
  int64_t min_recv_bytes_per_s; /* 0 = no rate floor */

  int64_t max_model_bytes;    /* most a declared model may make one shard allocate */
  int64_t max_table_bytes;    /* most the embedding tables may hold on one shard */
  /* what one authenticated peer may hold (docs/architecture.md) */
  int64_t push_min_bytes_per_s; /* a push holding a staging buffer slower than this loses it */
  double push_rate_window_s;    /* over windows of this long */
  int64_t push_contended_min_bytes_per_s; /* ... and this while pushes wait for a buffer */
  double pull_hold_timeout_s;   /* a pull reply may keep an update waiting this long */
  int64_t max_reply_bytes_per_connection; /* memory of the replies queued to one peer */
  int64_t max_reply_bytes;                /* ... and to all peers together */
  int64_t max_status_reply_bytes;         /* ... of which Status replies */
  double reply_full_timeout_s;  /* a peer whose queue stays this full this long is dropped */
  int max_parked_pulls;         /* pulls one connection may have waiting for a version */
  int push_dedup_clients;       /* clients per worker task whose push ids are remembered */
  double max_pull_wait_s;       /* longest a pull waits (a longer client timeout is clamped) */

  /* http: the admin endpoints of shards and workers */
  int http_max_connections;
  int http_max_connections_per_ip;
  double http_request_timeout_s;

  /* optimizer */
  ts_optimizer_t optimizer;
  double learning_rate;
  double momentum;
  double beta1, beta2, epsilon;
  ts_decay_t decay;            /* the learning rate's schedule over a partition's updates */
  int64_t decay_steps;
  double decay_rate;           /* exponential: the factor per decay_steps updates */
  bool staircase;              /* exponential: in whole steps of decay_steps */
  double decay_alpha;          /* cosine: the final rate, as a fraction of learning_rate */

  /* model */
  /* model.layers is either the widths of an MLP (num_layers > 0, num_net_layers == 0) or a
   * layer list (net_layers[0..num_net_layers), num_layers == 0); see worker/ts_layers.h. */
  int layers[TS_CONFIG_MAX_LAYERS];
  size_t num_layers;
  ts_config_layer_t *net_layers; /* TS_CONFIG_LAYERS_MAX entries, ts_malloc'd; NULL = none */
  size_t num_net_layers;
  ts_activation_t activation;
  int64_t seed;

  /* data */
  char *data_format;          /* "idx" */
  char *train_images, *train_labels, *test_images, *test_labels;
  char *train_path, *test_path; /* data.format "criteo" */

  /* train */
  int batch_size;
  int epochs;
  int64_t max_steps;          /* 0 = no limit */
  char *logdir;
  char *run_name;             /* TensorBoard run under logdir ("": the worker's start time) */
  double log_interval_s;
  int state_every;        /* train.state_every: steps between the workers' state pushes */
  double stall_timeout_s; /* train.stall_timeout_s: the worker's /livez threshold (0: auto,
                             ts_config_stall_timeout_s) */

  /* device */
  char *placement;          /* "" = TensorFlow's default choice */
  char **placement_rules;   /* device.rules: "PATTERN=DEVICE", first match wins */
  size_t num_placement_rules;
  bool allow_soft_placement;
  bool log_device_placement;
  bool allow_growth;          /* take GPU memory on demand (kernels/ts_gpu.h's plan) */
  double memory_fraction;     /* most of each GPU the pool may hold; 0 = no limit of ours */
  int towers;                 /* model replicas per worker; 0 = one per visible GPU */
  int intra_op_threads;       /* OpenBLAS threads; 0 = its own choice */
  bool allow_tf32;            /* cuBLAS may use TF32 for float32 products */

  /* checkpoint */
  char *checkpoint_dir;
  double checkpoint_interval_s;
  int checkpoint_keep;
  int checkpoint_full_every;
  bool checkpoint_sign; /* a keyed hash from the admin token (ts_ckpt_file.h) */
  char **checkpoint_restore_from; /* old shards' checkpoint directories, to re-shard from */
  size_t num_checkpoint_restore_from;

  /* auth */
  char *token_file;
  char *admin_token_file;
  bool tls;                   /* TLS on shard and admin connections (net/ts_tls.h) */
  char *tls_ca_file;
  char *tls_cert_file;
  char *tls_key_file;

  /* identity, from TF_CONFIG's task (or the --shard/--task flags, which the caller sets) */
  ts_task_role_t task_role;
  int task_index;             /* -1 when not given */

  /* where the file was read from, for messages ("-" when none) */
  char *source;
} ts_config_t;

/* Fill *cfg with the table's defaults. Never fails except for memory (TS_ENOMEM); on failure
 * *cfg holds nothing (it is freed and zeroed). Free a filled one with ts_config_free. */
int ts_config_defaults(ts_config_t *cfg);

/* Load a job: defaults, then `path` (NULL = no file), then the TF_CONFIG value `tf_config`
 * (NULL = none; callers pass getenv("TF_CONFIG")), then each "KEY=VALUE" of overrides[n]
 * in order, then cross-key validation (for example replicas_to_aggregate <= workers).
 * Returns 0 or a negative code (TS_ECONFIG, TS_ENOMEM); on error errmsg holds one line such
 * as "job.cfg:12: job.mode: must be one of \"sync\", \"async\", \"ssp\", not \"fast\"".
 * Cross-key errors name where the offending value was set. *cfg is an output (its old content
 * is not freed); on error everything in it is already freed, and it is always left freeable
 * with ts_config_free. errmsg may be NULL. The caller applies --shard/--task itself and checks
 * the index against num_ps/num_workers; a task from TF_CONFIG is checked here. */
int ts_config_load(ts_config_t *cfg, const char *path, const char *tf_config,
                   const char *const *overrides, size_t n, char *errmsg, size_t errlen);

/* Frees everything *cfg owns and zeroes it (task_index -1); calling it again, or with NULL,
 * does nothing. */
void ts_config_free(ts_config_t *cfg);

/* The configuration spelling ("sync", "adam"); "unknown" for a value outside the enum. */
const char *ts_mode_name(ts_mode_t mode);

/* The worker's /livez threshold in seconds: train.stall_timeout_s, or when that is 0,
 * max(60, 2 x (job.sync_timeout_s + job.heartbeat_timeout_s)). */
double ts_config_stall_timeout_s(const ts_config_t *cfg);
const char *ts_optimizer_name(ts_optimizer_t opt);
const char *ts_decay_name(ts_decay_t decay);

/* Write the key reference (Markdown table: key, type, default, bounds, meaning), generated
 * from the table, to f. docs/configuration.md is made from it. */
void ts_config_write_reference(FILE *f);

/* Every key's value, read generically from the key table (the Python package builds its Job
 * from these, so a new key needs no code there). */
typedef enum {
  TS_CONFIG_VALUE_BOOL,    /* b */
  TS_CONFIG_VALUE_INT,     /* i (int and int64 keys) */
  TS_CONFIG_VALUE_FLOAT,   /* f */
  TS_CONFIG_VALUE_STRING,  /* s, never NULL ("" for unset); enums give their spelling */
  TS_CONFIG_VALUE_STRINGS, /* strs[0..n) */
  TS_CONFIG_VALUE_INTS,    /* ints[0..n) (model.layers: the widths) */
} ts_config_value_kind_t;

typedef struct {
  const char *key;   /* "train.batch_size" */
  const char *field; /* "batch_size": the ts_config_t member, and Python's Job attribute */
  const char *doc;   /* the reference's text for the key */
  ts_config_value_kind_t kind;
  bool b;
  int64_t i;
  double f;
  const char *s;
  char *const *strs;
  const int *ints;
  size_t n;
} ts_config_value_t;

/* How many keys the table has; key i's value in cfg (i < ts_config_num_keys()). Pointers
 * in *out point into cfg or the table: valid while cfg is. */
size_t ts_config_num_keys(void);
void ts_config_value(const ts_config_t *cfg, size_t i, ts_config_value_t *out);

/* Write the Python module of the job's keys (python/src/tessera/_job_keys.py: a frozen
 * dataclass with one typed field per key), generated from the table, to f. */
void ts_config_write_python(FILE *f);

#endif
