/*
 * psctl export: the job's parameters, read from the live shards (or from a checkpoint
 * directory: psctl_export_ckpt.c), as a safetensors or .npz file (psctl_weights.h) with the
 * job's description as metadata.
 */
#ifndef PSCTL_EXPORT_H
#define PSCTL_EXPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "tessera/client.h"
#include "ts_config.h"

/* --vocab NAME=N: table NAME exported as a dense [N, dim] matrix of the rows of keys
 * 0..N-1. A table without one is exported as NAME/ids (int64, the keys its rows have on
 * the shards, listed with ts_client_table_keys_all, ascending) and NAME/rows (float32,
 * [n, dim]). */
typedef struct {
  char name[128];
  uint64_t rows;
} psctl_vocab_t;

/* The most --vocab options, and the largest N. */
#define PSCTL_EXPORT_MAX_VOCABS 64
#define PSCTL_EXPORT_MAX_VOCAB (1u << 20)

typedef struct {
  const char *path;   /* -o FILE */
  const char *format; /* --format: "safetensors" or "npz" */
  psctl_vocab_t vocab[PSCTL_EXPORT_MAX_VOCABS];
  size_t num_vocab;
  bool from_checkpoint; /* --from-checkpoint: checkpoint.dir, not the live shards */
} psctl_export_opts_t;

/* Parses "NAME=N" into o->vocab. Returns 0, or TS_EINVAL with errmsg saying why. */
int psctl_export_add_vocab(psctl_export_opts_t *o, const char *arg, char *errmsg, size_t errlen);

/* Checks o before anything is asked of the shards: -o given, --format known. Returns 0 or
 * TS_EXIT_USAGE after printing why on stderr. */
int psctl_export_check(const psctl_export_opts_t *o);

/* Reads the model from the shards (every one must be up: c's connections), writes the file
 * and prints what was written on stdout. cfg supplies the metadata (the job settings).
 * Returns a TS_EXIT_* code after printing why on stderr. */
int psctl_export_run(ts_client_t *c, const ts_config_t *cfg, const psctl_export_opts_t *o);

/* The same from checkpoint.dir on this host, no shard needed: the newest checkpoint of the
 * job's own layout or a complete set of its files re-sharded into one store, as a shard's
 * restore picks them (another job's files too: exporting adopts nothing). Returns a
 * TS_EXIT_* code after printing why on stderr. */
int psctl_export_checkpoint(const ts_config_t *cfg, const psctl_export_opts_t *o);

#endif
