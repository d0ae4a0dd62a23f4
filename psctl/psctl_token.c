/* psctl's credentials (psctl_token.h). */
#include "psctl_token.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void psctl_token_file(const ts_config_t *cfg, bool admin_cmd, const char **file,
                      const char **key) {
  bool admin = cfg->admin_token_file && *cfg->admin_token_file;
  bool worker = cfg->token_file && *cfg->token_file;
  if (admin && (admin_cmd || !worker || access(cfg->admin_token_file, R_OK) == 0)) {
    *file = cfg->admin_token_file;
    *key = "auth.admin_token_file";
  } else if (worker) {
    *file = cfg->token_file;
    *key = "auth.token_file";
  } else {
    *file = *key = NULL;
  }
}

int psctl_token_refused(ts_client_t *client, const ts_config_t *cfg, long only_shard,
                        const char *file, const char *key) {
  int refused = 0;
  for (size_t s = 0; s < cfg->num_ps; s++) {
    if (only_shard >= 0 && (size_t)only_shard != s) continue;
    if (ts_client_shard_error(client, (uint32_t)s) != TS_CLIENT_EAUTH) continue;
    char why[512];
    ts_client_shard_up(client, (uint32_t)s, why, sizeof why);
    fprintf(stderr, "psctl: shard %zu (%s): %s\n", s, cfg->ps[s], why);
    refused++;
  }
  if (!refused) return 0;
  if (file)
    fprintf(stderr,
            "psctl: authentication failed (not a shard down): psctl used %s = %s; compare it "
            "with the shards' auth.token_file%s\n",
            key, file, strcmp(key, "auth.admin_token_file") == 0 ? " and auth.admin_token_file"
                                                                : "");
  else
    fprintf(stderr,
            "psctl: authentication failed (not a shard down): the shards use a token; set "
            "auth.token_file (or auth.admin_token_file) to its file\n");
  return PSCTL_EXIT_AUTH;
}

int psctl_token_derive(const ts_config_t *cfg, long task) {
  if (!cfg->token_file || !*cfg->token_file) {
    fprintf(stderr, "psctl: token derive needs the job's token: set auth.token_file\n");
    return TS_EXIT_CONFIG;
  }
  if (task < 0 || (size_t)task >= cfg->num_workers) {
    fprintf(stderr, "psctl: token derive --task %ld: the job has %zu worker(s) (cluster.workers)\n",
            task, cfg->num_workers);
    return TS_EXIT_USAGE;
  }
  char err[512], out[TS_CLIENT_TASK_KEY_LEN + 1];
  char *token = ts_client_token_read(cfg->token_file, err, sizeof err);
  if (!token) {
    fprintf(stderr, "psctl: %s\n", err);
    return TS_EXIT_CONFIG;
  }
  int rc = ts_client_task_key(token, (int)task, out, sizeof out);
  ts_client_token_free(token);
  if (rc < 0) return TS_EXIT_FAILURE;
  printf("%s\n", out);
  memset(out, 0, sizeof out);
  return TS_EXIT_OK;
}
