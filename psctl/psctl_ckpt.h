/* psctl checkpoint list: the checkpoint files in checkpoint.dir, read on this host (and
 * what psctl export --from-checkpoint needs before it reads them). */
#ifndef PSCTL_CKPT_H
#define PSCTL_CKPT_H

#include <cjson/cJSON.h>

#include "ts_config.h"

/* Before psctl reads checkpoint.dir: it is set, and with checkpoint.sign the files' key
 * is taken from the admin token. Returns 0, or TS_EXIT_CONFIG after printing why. */
int psctl_checkpoint_dir_ready(const ts_config_t *cfg);

/* Per shard of cfg (or shard only_shard when >= 0), each checkpoint file in
 * cfg->checkpoint_dir, oldest first: FILE, STEP, SIZE, AGE and VALID (the file read whole,
 * its BLAKE2b hash and sizes checked; else the reason). Printed as a table, or, when json
 * is not NULL, put in *json as an array of objects {shard, file, step, bytes, age_s,
 * valid, error} (the caller prints and frees it). Returns the exit code: 0 listed (also
 * when there is none), 1 when a file is not valid, 78 without checkpoint.dir or for a
 * directory that cannot be read, with the reason on stderr. */
int psctl_checkpoint_list(const ts_config_t *cfg, long only_shard, cJSON **json);

#endif
