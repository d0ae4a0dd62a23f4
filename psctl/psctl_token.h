/*
 * psctl's credentials: which token file a command uses, how a refused token is reported,
 * and `psctl token derive` (docs/security.md).
 */
#ifndef PSCTL_TOKEN_H
#define PSCTL_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "tessera/client.h"
#include "ts_config.h"

/* The exit code of a refused credential (sysexits' EX_NOPERM). */
#define PSCTL_EXIT_AUTH 77

/* The token file a command uses and its key's name: an admin command the admin token's
 * (auth.admin_token_file, else auth.token_file); a read-only one (status, health, shards,
 * workers, tables) the admin token's when that file is readable here, else the worker
 * token's, which the shards accept for reading. *file is NULL without tokens. */
void psctl_token_file(const ts_config_t *cfg, bool admin_cmd, const char **file,
                      const char **key);

/* After the shards were asked: when one refused the credential (or could not prove it
 * knows it), says so on stderr per shard, naming the file and the key to compare, and
 * returns PSCTL_EXIT_AUTH; 0 otherwise. only_shard < 0: every shard. */
int psctl_token_refused(ts_client_t *client, const ts_config_t *cfg, long only_shard,
                        const char *file, const char *key);

/* psctl token derive --task T: prints task T's key under the job's token (auth.token_file).
 * Returns the exit code. */
int psctl_token_derive(const ts_config_t *cfg, long task);

#endif
