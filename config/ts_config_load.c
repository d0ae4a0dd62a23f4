/*
 * The loader behind ts_config_load: the defaults, the job file, TF_CONFIG, the --set
 * overrides, then the rules across keys, in that order (ts_config.h). Each source sets
 * ld->where before applying anything, so every error names where its value came from, and
 * each key remembers where it was last set, so a cross-key error can name the source of
 * the value that broke the rule rather than of its defaulted partner.
 */
#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_config_int.h"
#include "ts_err.h"
#include "ts_log.h"

/* ---- The file --------------------------------------------------------------------------- */

static int walk(ts_config_loader_t *ld, const config_setting_t *group, const char *prefix,
                const char *path) {
  int n = config_setting_length(group);
  for (int i = 0; i < n; i++) {
    const config_setting_t *s = config_setting_get_elem(group, (unsigned)i);
    const char *file = config_setting_source_file(s) ? config_setting_source_file(s) : path;
    snprintf(ld->where, sizeof ld->where, "%s:%d", file, (int)config_setting_source_line(s));
    char name[TS_CONFIG_KEY_LEN];
    int len = snprintf(name, sizeof name, "%s%s%s", prefix ? prefix : "", prefix ? "." : "",
                       config_setting_name(s));
    if (len < 0 || (size_t)len >= sizeof name) return ts_config_fail(ld, NULL, "key name too long");
    const ts_config_def_t *d = ts_config_find_def(name);
    int rc;
    if (d)
      rc = ts_config_apply_setting(ld, d, s);
    else if (ts_config_is_section(name) && config_setting_is_group(s))
      rc = walk(ld, s, name, path);
    else if (ts_config_is_section(name))
      rc = ts_config_fail(ld, name, "must be a group: %s = { ... };", name);
    else
      rc = ts_config_fail_unknown(ld, name);
    if (rc < 0) return rc;
  }
  return 0;
}

/* The job file is read whole (it is small) so the integer widening (ts_config_parse.c) can
 * see it. Errors are prefixed with ld->where, which holds the path. */
#define MAX_FILE_BYTES (16u << 20)

static int read_text(ts_config_loader_t *ld, const char *path, char **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ts_config_fail(ld, NULL, "%s", strerror(errno));
  int rc = 0;
  struct stat st;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  if (fstat(fileno(f), &st) != 0) {
    rc = ts_config_fail(ld, NULL, "%s", strerror(errno));
  } else if (S_ISDIR(st.st_mode)) {
    rc = ts_config_fail(ld, NULL, "%s", strerror(EISDIR));
  } else {
    /* Read to EOF rather than trusting st_size: -c <(...) and -c /dev/stdin are pipes. */
    for (;;) {
      if (len + 1 >= cap) {
        if (cap >= MAX_FILE_BYTES) {
          rc = ts_config_fail(ld, NULL, "larger than %u bytes; not a job file", MAX_FILE_BYTES);
          break;
        }
        size_t ncap = cap ? cap * 2 : 4096;
        char *nbuf = ts_realloc(buf, ncap);
        if (!nbuf) {
          ts_errmsg_printf(ld->errmsg, ld->errlen, "%s: out of memory", path);
          rc = TS_ENOMEM;
          break;
        }
        buf = nbuf;
        cap = ncap;
      }
      size_t got = fread(buf + len, 1, cap - 1 - len, f);
      len += got;
      if (got == 0) {
        if (ferror(f)) rc = ts_config_fail(ld, NULL, "%s", strerror(errno));
        break;
      }
    }
    if (rc == 0) {
      buf[len] = '\0';
      if (memchr(buf, '\0', len))
        rc = ts_config_fail(ld, NULL, "contains a NUL byte; not a job file");
    }
  }
  fclose(f);
  if (rc < 0)
    ts_free(buf);
  else
    *out = buf;
  return rc;
}

static int load_file(ts_config_loader_t *ld, const char *path) {
  snprintf(ld->where, sizeof ld->where, "%s", path);
  char *source = ts_strdup(path);
  if (!source) return ts_config_oom(ld, "source");
  ts_free(ld->cfg->source);
  ld->cfg->source = source;

  char *text = NULL;
  int rc = read_text(ld, path, &text);
  if (rc < 0) return rc;
  /* @include paths are relative to the job file's folder. */
  char *dir = ts_strdup(path);
  if (!dir) {
    ts_free(text);
    return ts_config_oom(ld, "source");
  }
  char *slash = strrchr(dir, '/');
  if (slash) slash[slash == dir ? 1 : 0] = '\0';
  config_t c;
  config_init(&c);
  rc = ts_config_parse_text(ld, &c, text, path, slash ? dir : NULL);
  if (rc == 0) rc = walk(ld, config_root_setting(&c), NULL, path);
  config_destroy(&c);
  ts_free(dir);
  ts_free(text);
  return rc;
}

/* ---- Overrides -------------------------------------------------------------------------- */

static int apply_override(ts_config_loader_t *ld, const char *ov) {
  snprintf(ld->where, sizeof ld->where, "--set %s", ov);
  const char *eq = strchr(ov, '=');
  const char *k = ov;
  while (isspace((unsigned char)*k)) k++;
  size_t klen = eq ? (size_t)(eq - k) : 0;
  while (klen && isspace((unsigned char)k[klen - 1])) klen--;
  if (!eq || klen == 0)
    return ts_config_fail(ld, NULL, "expected KEY=VALUE, such as train.max_steps=200");
  char key[TS_CONFIG_KEY_LEN];
  snprintf(key, sizeof key, "%.*s", (int)klen, k);
  const ts_config_def_t *d = klen < sizeof key ? ts_config_find_def(key) : NULL;
  if (!d) {
    if (ts_config_is_section(key))
      return ts_config_fail(ld, key, "is a section; set its keys one by one");
    return ts_config_fail_unknown(ld, key);
  }
  const char *value = eq + 1;
  while (isspace((unsigned char)*value)) value++;
  /* The shell eats the quotes of --set job.mode="async", so a string key takes an unquoted
   * value as it stands. */
  if ((d->type == TS_CT_STRING || d->type == TS_CT_ENUM) && *value != '"') {
    int rc = ts_config_set_string(ld, d, value);
    if (rc == 0) ts_config_note_origin(ld, d);
    return rc;
  }
  size_t vlen = strlen(value);
  char *text = ts_malloc(vlen + 8);
  if (!text) return ts_config_oom(ld, d->name);
  snprintf(text, vlen + 8, "v = %s;", value);
  config_t c;
  config_init(&c);
  int rc = ts_config_parse_text(ld, &c, text, NULL, NULL);
  ts_free(text);
  if (rc == TS_ECONFIG) {
    char why[256];
    snprintf(why, sizeof why, "%s", ld->errmsg);
    rc = ts_config_fail(ld, d->name,
                        "cannot parse the value (%s; write it in libconfig syntax: "
                        "\"text\", 12, 0.5, true, [1, 2])",
                        why);
  } else if (rc == 0) {
    const config_setting_t *root = config_root_setting(&c);
    if (config_setting_length(root) != 1)
      rc = ts_config_fail(ld, d->name, "the value must be one setting's value");
    else
      rc = ts_config_apply_setting(ld, d, config_setting_get_elem(root, 0));
  }
  config_destroy(&c);
  return rc;
}

/* ---- Cross-key rules -------------------------------------------------------------------- */

/* The origin of a key nobody set: a rule broken by a default is blamed on the other key. */
static const char default_origin[] = "(default)";

/* Names the source of the first key unless it is a default and the second key's is not. */
static void where_for(ts_config_loader_t *ld, const char *a, const char *b) {
  const char *oa = ld->origin[ts_config_def_named(a) - ts_config_defs];
  const char *ob = b ? ld->origin[ts_config_def_named(b) - ts_config_defs] : oa;
  const char *pick = (strcmp(oa, default_origin) == 0 && strcmp(ob, default_origin) != 0) ? ob : oa;
  snprintf(ld->where, sizeof ld->where, "%s", pick);
}

static int check_distinct(ts_config_loader_t *ld) {
  static const char *const keys[] = {"cluster.ps", "cluster.ps_http", "cluster.workers"};
  ts_config_t *cfg = ld->cfg;
  char **lists[3] = {cfg->ps, cfg->ps_http, cfg->workers};
  size_t counts[3] = {cfg->num_ps, cfg->num_ps_http, cfg->num_workers};
  for (int a = 0; a < 3; a++)
    for (size_t i = 0; i < counts[a]; i++)
      for (int b = 0; b <= a; b++)
        for (size_t j = 0; j < (b == a ? i : counts[b]); j++)
          if (strcmp(lists[a][i], lists[b][j]) == 0) {
            where_for(ld, keys[a], NULL);
            char name[TS_CONFIG_KEY_LEN + 16];
            snprintf(name, sizeof name, "%s[%zu]", keys[a], i);
            return ts_config_fail(ld, name,
                                  "address %s is also %s[%zu]; each process needs its own",
                                  lists[a][i], keys[b], j);
          }
  return 0;
}

/* A count of workers (key's value n) cannot exceed cluster.workers: it would never be
 * reached. */
static int at_most_workers(ts_config_loader_t *ld, const char *key, int n) {
  if ((size_t)n <= ld->cfg->num_workers) return 0;
  where_for(ld, key, "cluster.workers");
  return ts_config_fail(ld, key,
                        "%d is more than the %zu workers of cluster.workers; it would never be "
                        "reached",
                        n, ld->cfg->num_workers);
}

static int validate(ts_config_loader_t *ld) {
  ts_config_t *cfg = ld->cfg;
  if (cfg->num_ps_http != 0 && cfg->num_ps_http != cfg->num_ps) {
    where_for(ld, "cluster.ps_http", "cluster.ps");
    return ts_config_fail(ld, "cluster.ps_http",
                          "has %zu entries but cluster.ps has %zu; give one per shard or set "
                          "cluster.ps_http = []",
                          cfg->num_ps_http, cfg->num_ps);
  }
  int rc = check_distinct(ld);
  if (rc < 0) return rc;
  if ((rc = at_most_workers(ld, "job.replicas_to_aggregate", cfg->replicas_to_aggregate)) < 0 ||
      (rc = at_most_workers(ld, "job.min_workers", cfg->min_workers)) < 0)
    return rc;
  if (cfg->heartbeat_interval_s >= cfg->heartbeat_timeout_s) {
    where_for(ld, "job.heartbeat_interval_s", "job.heartbeat_timeout_s");
    return ts_config_fail(
        ld, "job.heartbeat_interval_s",
        "%g must be less than job.heartbeat_timeout_s (%g), else live workers are "
        "taken for dead",
        cfg->heartbeat_interval_s, cfg->heartbeat_timeout_s);
  }
  if (cfg->stall_timeout_s > 0 &&
      cfg->stall_timeout_s <= cfg->sync_timeout_s + cfg->heartbeat_timeout_s) {
    where_for(ld, "train.stall_timeout_s", "job.sync_timeout_s");
    return ts_config_fail(
        ld, "train.stall_timeout_s",
        "%g must exceed job.sync_timeout_s + job.heartbeat_timeout_s (%g + %g): a sync "
        "barrier may hold a worker's pull that long, and /livez would call it stuck",
        cfg->stall_timeout_s, cfg->sync_timeout_s, cfg->heartbeat_timeout_s);
  }
  if (cfg->partition_bytes > cfg->max_message_bytes) {
    where_for(ld, "job.partition_bytes", "server.max_message_bytes");
    return ts_config_fail(
        ld, "job.partition_bytes",
        "%lld exceeds server.max_message_bytes (%lld); a partition must fit one frame",
        (long long)cfg->partition_bytes, (long long)cfg->max_message_bytes);
  }
  if (cfg->task_role != TS_ROLE_NONE) {
    bool ps = cfg->task_role == TS_ROLE_PS;
    size_t n = ps ? cfg->num_ps : cfg->num_workers;
    if (cfg->task_index < 0 || (size_t)cfg->task_index >= n) {
      snprintf(ld->where, sizeof ld->where, "%s", ld->task_origin);
      return ts_config_fail(ld, "task.index", "%d is out of range: %s has %zu entries",
                            cfg->task_index, ps ? "cluster.ps" : "cluster.workers", n);
    }
  }
  return 0;
}

/* ---- Public API ------------------------------------------------------------------------- */

/* The loader ends in one origin per key, a flexible array: the table's length is a constant
 * only in the file that defines the table. */
static size_t loader_size(void) {
  return sizeof(ts_config_loader_t) + ts_config_ndefs * TS_CONFIG_WHERE_LEN;
}

static int apply_defaults(ts_config_loader_t *ld) {
  ts_config_t *cfg = ld->cfg;
  memset(cfg, 0, sizeof *cfg);
  cfg->task_role = TS_ROLE_NONE;
  cfg->task_index = -1;
  cfg->source = ts_strdup("-");
  if (!cfg->source) return TS_ENOMEM;
  for (size_t i = 0; i < ts_config_ndefs; i++) {
    const ts_config_def_t *d = &ts_config_defs[i];
    snprintf(ld->where, sizeof ld->where, "default of %s", d->name);
    config_t c;
    config_init(&c);
    char text[TS_CONFIG_KEY_LEN + 128];
    snprintf(text, sizeof text, "v = %s;", d->def);
    int rc = ts_config_parse_text(ld, &c, text, ld->where, NULL);
    if (rc == 0)
      rc = ts_config_apply_setting(ld, d, config_setting_get_elem(config_root_setting(&c), 0));
    config_destroy(&c);
    if (rc == TS_ECONFIG) { /* the table contradicts itself: a bug, not a bad job */
      ts_log_crit("%s", ld->errmsg);
      ts_require(rc != TS_ECONFIG);
    }
    if (rc < 0) return rc;
    snprintf(ld->origin[i], TS_CONFIG_WHERE_LEN, "%s", default_origin);
  }
  return 0;
}

int ts_config_defaults(ts_config_t *cfg) {
  char errmsg[256];
  ts_config_loader_t *ld = ts_calloc(1, loader_size());
  if (!ld) {
    memset(cfg, 0, sizeof *cfg);
    cfg->task_index = -1;
    return TS_ENOMEM;
  }
  ld->cfg = cfg;
  ld->errmsg = errmsg;
  ld->errlen = sizeof errmsg;
  int rc = apply_defaults(ld);
  ts_free(ld);
  if (rc < 0) ts_config_free(cfg);
  return rc;
}

int ts_config_load(ts_config_t *cfg, const char *path, const char *tf_config,
                   const char *const *overrides, size_t n, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg || errlen == 0) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  errmsg[0] = '\0';
  /* The loader carries one origin per key: too big for a daemon's stack to take lightly. */
  ts_config_loader_t *ld = ts_calloc(1, loader_size());
  if (!ld) {
    memset(cfg, 0, sizeof *cfg);
    cfg->task_index = -1;
    ts_errmsg_printf(errmsg, errlen, "loading the configuration: out of memory");
    return TS_ENOMEM;
  }
  ld->cfg = cfg;
  ld->errmsg = errmsg;
  ld->errlen = errlen;
  int rc = apply_defaults(ld);
  if (rc < 0) ts_errmsg_printf(errmsg, errlen, "applying the defaults: out of memory");
  if (rc == 0 && path) rc = load_file(ld, path);
  if (rc == 0 && tf_config) rc = ts_tfconfig_apply(ld, tf_config);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = apply_override(ld, overrides[i]);
  if (rc == 0) rc = validate(ld);
  ts_free(ld);
  if (rc < 0) ts_config_free(cfg);
  return rc;
}

void ts_config_free(ts_config_t *cfg) {
  if (!cfg) return;
  for (size_t i = 0; i < ts_config_ndefs; i++) {
    const ts_config_def_t *d = &ts_config_defs[i];
    if (d->type == TS_CT_STRING) {
      ts_free(*(char **)ts_config_field(cfg, d->offset));
    } else if (d->type == TS_CT_LAYERS) {
      ts_free(cfg->net_layers);
      cfg->net_layers = NULL;
      cfg->num_net_layers = 0;
    } else if (d->type == TS_CT_STRINGS) {
      ts_config_free_strings(*(char ***)ts_config_field(cfg, d->offset), *ts_config_count(cfg, d));
    }
  }
  ts_free(cfg->source);
  memset(cfg, 0, sizeof *cfg);
  cfg->task_index = -1;
}
