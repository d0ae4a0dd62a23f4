/* psctl checkpoint list (psctl_ckpt.h): the shard's own reader of checkpoint files
 * (server/ts_ckpt_file.h), so "valid" means what a restoring shard checks first. */
#include "psctl_ckpt.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "psctl_fmt.h"
#include "tessera/client.h"
#include "ts_alloc.h"
#include "ts_ckpt_file.h"
#include "ts_err.h"
#include "ts_msg.h"

typedef struct {
  uint32_t shard;
  const char *name;
  bool have_meta;
  uint64_t step, bytes;
  double age_s; /* since it was written (its header's time, else the file's) */
  bool valid;
  char why[300];
} entry_t;

/* Whether every value of the partitions that follow in f (ts_ckpt_file_open's position)
 * is finite, as a restoring shard requires; else why names the first that is not. */
static bool all_finite(FILE *f, const Tessera__CheckpointMeta *m, char *why, size_t whylen) {
  static float buf[1 << 14];
  for (size_t i = 0; i < m->n_parts; i++) {
    const Tessera__CheckpointPart *cp = m->parts[i];
    for (uint32_t b = 0; b <= cp->state_buffers; b++) {
      for (uint64_t done = 0; done < cp->count;) {
        size_t want = cp->count - done < (1 << 14) ? (size_t)(cp->count - done) : (1 << 14);
        if (fread(buf, sizeof(float), want, f) != want) {
          snprintf(why, whylen, "truncated while reading partition data");
          return false;
        }
        size_t at = ts_ckpt_first_nonfinite(buf, want);
        if (at < want) {
          /* The name comes from the file: control bytes are not printed. */
          char name[101] = "?";
          if (cp->tensor < m->n_tensors && m->tensors[cp->tensor]->name)
            snprintf(name, sizeof name, "%s", m->tensors[cp->tensor]->name);
          for (char *c = name; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
          snprintf(why, whylen, "tensor '%s' %s element %llu is not finite", name,
                   b == 0 ? "parameter" : "optimizer state",
                   (unsigned long long)(cp->offset + done + at));
          return false;
        }
        done += want;
      }
    }
  }
  return true;
}

/* Look at dir/name: its size and age, its header's step, and whether it verifies. */
static void inspect(const char *dir, entry_t *e) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, e->name);
  struct stat st;
  double now = (double)time(NULL);
  if (stat(path, &st) == 0) {
    e->bytes = (uint64_t)st.st_size;
    e->age_s = now - (double)st.st_mtime;
  }
  Tessera__CheckpointMeta *m = NULL;
  FILE *f = NULL;
  char err[512];
  if (ts_ckpt_file_open(path, &f, &m, err, sizeof err) == 0) {
    e->have_meta = true;
    e->step = m->step;
    if (m->wall_time > 0) e->age_s = now - m->wall_time;
    e->valid = all_finite(f, m, e->why, sizeof e->why);
    ts_msg_free(&m->base);
    fclose(f);
    return;
  }
  /* Why it is not valid, without the path the table shows already. */
  const char *why = strncmp(err, path, strlen(path)) == 0 ? err + strlen(path) : err;
  while (*why == ':' || *why == ' ') why++;
  snprintf(e->why, sizeof e->why, "%.299s", why);
  if (ts_ckpt_file_read_meta(path, &m, err, sizeof err) == 0) {
    e->have_meta = true;
    e->step = m->step;
    ts_msg_free(&m->base);
  }
}

static void print_age(char *buf, size_t n, double s) {
  if (s < 0) s = 0;
  if (s < 120)
    snprintf(buf, n, "%.0fs", s);
  else if (s < 7200)
    snprintf(buf, n, "%.0fm", s / 60);
  else if (s < 172800)
    snprintf(buf, n, "%.0fh", s / 3600);
  else
    snprintf(buf, n, "%.0fd", s / 86400);
}

int psctl_checkpoint_dir_ready(const ts_config_t *cfg) {
  if (!cfg->checkpoint_dir || !*cfg->checkpoint_dir) {
    fprintf(stderr, "psctl: checkpoint.dir is not set: the job keeps no checkpoints (give the "
                    "job file, or --set checkpoint.dir=\"DIR\")\n");
    return TS_EXIT_CONFIG;
  }
  /* Signed checkpoints verify with the admin token's key, as on the shards. */
  if (cfg->checkpoint_sign) {
    char err[512];
    char *token = cfg->admin_token_file && *cfg->admin_token_file
                      ? ts_client_token_read(cfg->admin_token_file, err, sizeof err)
                      : NULL;
    if (!token) {
      fprintf(stderr, "psctl: checkpoint.sign needs auth.admin_token_file to verify: %s\n",
              cfg->admin_token_file && *cfg->admin_token_file ? err : "not set");
      return TS_EXIT_CONFIG;
    }
    ts_ckpt_file_set_key(token);
    ts_client_token_free(token);
  }
  return 0;
}

int psctl_checkpoint_list(const ts_config_t *cfg, long only_shard, cJSON **json) {
  int ready = psctl_checkpoint_dir_ready(cfg);
  if (ready) return ready;
  const char *dir = cfg->checkpoint_dir;
  char **names = NULL;
  uint32_t *shards = NULL;
  int n = ts_ckpt_file_list(dir, -1, &names, &shards);
  if (n < 0) {
    fprintf(stderr, "psctl: cannot read checkpoint.dir %s: %s\n", dir, ts_strerror(n));
    return TS_EXIT_CONFIG;
  }
  if (json) *json = cJSON_CreateArray();
  else
    printf("%-5s %-34s %10s %10s %6s %s\n", "SHARD", "FILE", "STEP", "SIZE", "AGE", "VALID");
  int rc = TS_EXIT_OK, listed = 0;
  for (int i = 0; i < n; i++) {
    if (only_shard >= 0 && shards[i] != (uint32_t)only_shard) continue;
    entry_t e = {.shard = shards[i], .name = names[i], .age_s = -1};
    inspect(dir, &e);
    listed++;
    if (!e.valid) rc = TS_EXIT_FAILURE;
    if (json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "shard", e.shard);
      cJSON_AddStringToObject(o, "file", e.name);
      if (e.have_meta)
        cJSON_AddNumberToObject(o, "step", (double)e.step);
      else
        cJSON_AddNullToObject(o, "step");
      cJSON_AddNumberToObject(o, "bytes", (double)e.bytes);
      cJSON_AddNumberToObject(o, "age_s", e.age_s);
      cJSON_AddBoolToObject(o, "valid", e.valid);
      cJSON_AddStringToObject(o, "error", e.why);
      cJSON_AddItemToArray(*json, o);
      continue;
    }
    char step[24] = "-", size[32], age[16];
    if (e.have_meta) snprintf(step, sizeof step, "%llu", (unsigned long long)e.step);
    psctl_human_bytes(size, sizeof size, (double)e.bytes);
    print_age(age, sizeof age, e.age_s);
    printf("%-5u %-34s %10s %10s %6s %s%s\n", e.shard, e.name, step, size, age,
           e.valid ? "yes" : "NO: ", e.why);
  }
  if (!json && listed == 0) printf("(no checkpoint in %s)\n", dir);
  ts_ckpt_file_free_names(names, n);
  ts_free(shards);
  return rc;
}
