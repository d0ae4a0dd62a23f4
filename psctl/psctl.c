/* psctl: the admin CLI of a Tessera job (docs/configuration.md). */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psctl_ckpt.h"
#include "psctl_complete.h"
#include "psctl_export.h"
#include "psctl_fmt.h"
#include "psctl_help.h"
#include "psctl_json.h"
#include "psctl_suggest.h"
#include "psctl_tables.h"
#include "psctl_token.h"
#include "psctl_watch.h"
#include "tessera/client.h"
#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_job_status.h"
#include "ts_status.h"
#include "ts_log.h"

typedef enum { OUT_TABLE, OUT_JSON } output_t;

typedef struct {
  ts_config_t cfg;
  ts_client_t *client;
  ts_client_shard_status_t **st; /* per shard, NULL when it did not answer */
  char **why;                /* per shard, why it did not answer */
  long only_shard;           /* --shard N, else -1 */
  ts_client_shard_status_t **before; /* tables --interval: the first sample, per shard */
  double interval;                   /* seconds between the samples (0: one sample) */
  bool in_place;                     /* --watch on a terminal: the table says who is down */
  bool admin_cmd;                    /* checkpoint, shutdown, model reset */
  const char *token_file, *token_key; /* the credential used (psctl_token_file) */
} cluster_view_t;

/* Ask every shard that is up for its status into v->st (the why of those that are not). */
static void ask_statuses(cluster_view_t *v) {
  char err[1024];
  for (uint32_t s = 0; s < v->cfg.num_ps; s++) {
    char why[512];
    if (!ts_client_shard_up(v->client, s, why, sizeof why)) {
      v->why[s] = ts_strdup(why);
      continue;
    }
    if (ts_client_status(v->client, s, &v->st[s], err, sizeof err) < 0) v->why[s] = ts_strdup(err);
  }
}

/* tables --interval: keep this sample as the first, wait, and take the second. */
static int sample_again(cluster_view_t *v) {
  size_t n = v->cfg.num_ps;
  v->before = v->st;
  v->st = ts_calloc(n, sizeof *v->st);
  if (!v->st) return TS_EXIT_FAILURE;
  for (size_t s = 0; s < n; s++) {
    ts_free(v->why[s]);
    v->why[s] = NULL;
  }
  struct timespec ts = {(time_t)v->interval,
                        (long)((v->interval - (double)(time_t)v->interval) * 1e9)};
  nanosleep(&ts, NULL);
  ask_statuses(v);
  return 0;
}

static int gather(cluster_view_t *v, double timeout) {
  ts_config_t *cfg = &v->cfg;
  char err[1024];
  const char *tfile;
  psctl_token_file(cfg, v->admin_cmd, &tfile, &v->token_key);
  v->token_file = tfile;
  char *token = NULL;
  if (tfile && !(token = ts_client_token_read(tfile, err, sizeof err))) {
    fprintf(stderr, "psctl: %s\n", err);
    return TS_EXIT_CONFIG;
  }
  char ident[64];
  snprintf(ident, sizeof ident, "psctl pid %d", (int)getpid());
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = (const char *const *)cfg->ps;
  o.num_shards = cfg->num_ps;
  o.admin = true;
  o.identity = ident;
  o.token = token;
  if (cfg->tls) {
    o.tls_ca_file = cfg->tls_ca_file;
    o.tls_cert_file = cfg->tls_cert_file;
    o.tls_key_file = cfg->tls_key_file;
  }
  o.connect_timeout_s = timeout;
  o.request_timeout_s = timeout;
  o.require_all = false;
  o.log = ts_log_forward;
  o.log_level = TS_CLIENT_LOG_DEBUG;
  int rc = ts_client_open(&v->client, &o, err, sizeof err);
  ts_client_token_free(token);
  if (rc < 0) {
    fprintf(stderr, "psctl: %s\n", err);
    return rc == TS_EINVAL || rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
  }
  v->st = ts_calloc(cfg->num_ps, sizeof *v->st);
  v->why = ts_calloc(cfg->num_ps, sizeof *v->why);
  if (!v->st || !v->why) return TS_EXIT_FAILURE;
  ask_statuses(v);
  return v->interval > 0 ? sample_again(v) : 0;
}

static void release(cluster_view_t *v) {
  for (size_t s = 0; s < v->cfg.num_ps; s++) {
    if (v->st) ts_client_status_free(v->st[s]);
    if (v->before) ts_client_status_free(v->before[s]);
    if (v->why) ts_free(v->why[s]);
  }
  ts_free(v->st);
  ts_free(v->before);
  ts_free(v->why);
  ts_client_close(v->client);
  ts_config_free(&v->cfg);
}

static void print_json(cJSON *root) { psctl_json_print(stdout, root); }

/* Colour only on a terminal, never with NO_COLOR set (no-color.org) or TERM=dumb. */
static bool use_colour(void) {
  const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
  if (nc && *nc) return false;
  if (term && strcmp(term, "dumb") == 0) return false;
  return isatty(STDOUT_FILENO) == 1;
}

static bool colour;

/* text in green (good) or red (bad) when colour is on; the padding stays outside the
 * escape codes so columns line up. */
static void cell(const char *text, int width, bool good) {
  int pad = width - (int)strlen(text);
  if (colour) printf("\033[%sm%s\033[0m", good ? "32" : "1;31", text);
  else printf("%s", text);
  for (int i = 0; i < pad; i++) putchar(' ');
}

static bool shard_selected(const cluster_view_t *v, size_t s) {
  return v->only_shard < 0 || (size_t)v->only_shard == s;
}

static void print_shards_table(const cluster_view_t *v) {
  printf("%-5s %-22s %-5s %10s %10s %9s %9s %s\n", "SHARD", "ADDRESS", "UP", "PARTITIONS",
         "BYTES", "VERSION", "STALE", "NOTE");
  for (size_t s = 0; s < v->cfg.num_ps; s++) {
    if (!shard_selected(v, s)) continue;
    const ts_client_shard_status_t *st = v->st[s];
    printf("%-5zu %-22s ", s, v->cfg.ps[s]);
    cell(st ? "yes" : "NO", 5, st != NULL);
    if (st) {
      char b[32];
      psctl_human_bytes(b, sizeof b, (double)st->bytes);
      char note[128] = "";
      if (st->num_barrier_waiting_for) {
        size_t len = (size_t)snprintf(note, sizeof note, "barrier waits for task");
        for (size_t i = 0; i < st->num_barrier_waiting_for && len < sizeof note; i++)
          len += (size_t)snprintf(note + len, sizeof note - len, "%s%d", i ? "," : " ",
                                  st->barrier_waiting_for[i]);
      }
      printf(" %10u %10s %9llu %9llu %s\n", st->partitions, b, (unsigned long long)st->version,
             (unsigned long long)st->stale_dropped, note);
    } else {
      printf(" %10s %10s %9s %9s %s\n", "-", "-", "-", "-", v->why[s] ? v->why[s] : "no answer");
    }
  }
}

static void print_workers_table(const ts_job_status_worker_t *w, size_t n) {
  bool ctr = false; /* a CTR model's AUC columns, when a worker reports one */
  for (size_t i = 0; i < n; i++) ctr |= w[i].has_auc || w[i].has_test_auc;
  printf("%-5s %10s %10s %12s %11s %8s ", "TASK", "STEP", "LOSS", "EXAMPLES/S", "LAST SEEN",
         "EPOCH");
  if (ctr) printf("%7s %8s %12s ", "AUC", "TEST AUC", "TEST LOGLOSS");
  printf("%-10s %s\n", "STATE", "DEVICE");
  for (size_t i = 0; i < n; i++) {
    /* '-': not reported yet (before a worker's first report, never a made-up 0). */
    char step[24] = "-", loss[24] = "-", eps[24] = "-", seen[32] = "never", epoch[16] = "-";
    if (w[i].step_known) snprintf(step, sizeof step, "%llu", (unsigned long long)w[i].step);
    if (w[i].reported) {
      snprintf(loss, sizeof loss, "%.4f", w[i].loss);
      snprintf(eps, sizeof eps, "%.1f", w[i].examples_per_sec);
      snprintf(epoch, sizeof epoch, "%.0f%%", w[i].epoch_progress * 100.0);
    }
    if (w[i].seen) snprintf(seen, sizeof seen, "%.1fs ago", w[i].last_seen_s);
    printf("%-5d %10s %10s %12s %11s %8s ", w[i].task, step, loss, eps, seen, epoch);
    char auc[16] = "-", tauc[16] = "-", tloss[24] = "-";
    if (w[i].has_auc) snprintf(auc, sizeof auc, "%.4f", w[i].auc);
    if (w[i].has_test_auc) snprintf(tauc, sizeof tauc, "%.4f", w[i].test_auc);
    if (w[i].has_test_auc) snprintf(tloss, sizeof tloss, "%.4f", w[i].test_logloss);
    if (ctr) printf("%7s %8s %12s ", auc, tauc, tloss);
    const char *state = ts_job_status_worker_state(&w[i]);
    if (w[i].seen)
      cell(state, 10, w[i].done || w[i].alive);
    else
      printf("%-10s", state);
    printf(" %s\n", w[i].device && *w[i].device ? w[i].device : "-");
  }
}

/* The workers' mean progress through their current epoch (done counts as 1), as a bar. */
static void print_progress_bar(const ts_job_status_worker_t *w, size_t n) {
  double sum = 0;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (!w[i].seen || (!w[i].done && !w[i].reported)) continue;
    sum += w[i].done ? 1.0 : w[i].epoch_progress;
    k++;
  }
  if (k == 0) return;
  double f = sum / (double)k;
  if (f < 0) f = 0;
  if (f > 1) f = 1;
  const int width = 40;
  int fill = (int)(f * width + 0.5);
  printf("epoch [");
  if (colour) printf("\033[32m");
  for (int i = 0; i < width; i++) fputs(i < fill ? "#" : "-", stdout);
  if (colour) printf("\033[0m");
  printf("] %3.0f%%\n\n", f * 100.0);
}

/* A line per shard whose checkpoints fail: "shard 0: last checkpoint: failed 3× (...)". */
static void print_ckpt_failures(const ts_job_status_shard_t *sh, size_t n) {
  for (size_t s = 0; s < n; s++) {
    if (!sh[s].st || !sh[s].st->checkpoint_failures) continue;
    char note[256];
    ts_status_checkpoint_note(note, sizeof note, sh[s].st->checkpoint_failures,
                              sh[s].st->checkpoint_error);
    printf("shard %zu: ", sh[s].index);
    cell(note, 0, false);
    printf("\n");
  }
}

static int cmd_report(cluster_view_t *v, const char *cmd, output_t out) {
  size_t nw = v->cfg.num_workers;
  ts_job_status_shard_t *sh = ts_calloc(v->cfg.num_ps, sizeof *sh);
  ts_job_status_worker_t *w = ts_calloc(nw ? nw : 1, sizeof *w);
  if (!sh || !w) {
    ts_free(sh);
    ts_free(w);
    return TS_EXIT_FAILURE;
  }
  /* With --shard, the view is that shard alone: its health decides the exit code. */
  size_t n = 0;
  for (size_t s = 0; s < v->cfg.num_ps; s++) {
    if (!shard_selected(v, s)) continue;
    sh[n++] = (ts_job_status_shard_t){
        .index = s, .address = v->cfg.ps[s], .st = v->st[s], .error = v->why[s]};
  }
  ts_job_status_view_t view = {.shards = sh,
                               .num_shards = n,
                               .num_workers = nw,
                               .configured_mode = ts_mode_name(v->cfg.mode)};
  ts_job_status_merge_workers(&view, w);
  ts_client_mode_t mode;
  uint64_t step = ts_job_status_job_step(&view, &mode);
  size_t up = ts_job_status_shards_up(&view);
  size_t failing = ts_job_status_ckpt_failing(&view);
  uint32_t joined = ts_job_status_workers_joined(&view);
  const char *mname = up ? ts_client_mode_name(mode) : ts_mode_name(v->cfg.mode);
  if (out == OUT_JSON) {
    cJSON *root = NULL;
    if (strcmp(cmd, "status") == 0 || strcmp(cmd, "health") == 0) {
      root = ts_job_status_json_job(&view, strcmp(cmd, "status") == 0);
    } else if (strcmp(cmd, "tables") == 0) {
      root = psctl_tables_json(sh, n, v->before, v->interval);
    } else if (strcmp(cmd, "shards") == 0) {
      root = cJSON_CreateArray();
      for (size_t s = 0; s < n; s++) cJSON_AddItemToArray(root, ts_job_status_json_shard(&sh[s]));
    } else {
      root = cJSON_CreateArray();
      for (size_t i = 0; i < nw; i++) cJSON_AddItemToArray(root, ts_job_status_json_worker(&w[i]));
    }
    print_json(root);
  } else if (strcmp(cmd, "status") == 0) {
    const char *id = ts_job_status_job_id(&view);
    printf("job%s%s: mode %s, step %llu, %zu of %zu shard(s) up, %zu worker(s) (%u took "
           "part)\n",
           id ? " " : "", id ? id : "", mname, (unsigned long long)step, up, n, nw, joined);
    double acc;
    int by = -1;
    if (ts_job_status_final_accuracy(&view, &acc, &by))
      printf("final test accuracy: %.4f (worker %d evaluated the final parameters), %u of %zu "
             "workers took part\n",
             acc, by, joined, nw);
    print_ckpt_failures(sh, n);
    printf("\n");
    if (isatty(STDOUT_FILENO) == 1) print_progress_bar(w, nw);
    print_shards_table(v);
    printf("\n");
    print_workers_table(w, nw);
  } else if (strcmp(cmd, "shards") == 0) {
    print_shards_table(v);
  } else if (strcmp(cmd, "tables") == 0) {
    psctl_tables_print(stdout, sh, n, v->before, v->interval);
  } else if (strcmp(cmd, "workers") == 0) {
    print_workers_table(w, nw);
    printf("%u of %zu workers took part\n", joined, nw);
  } else {
    cell(up == n && !failing ? "healthy" : "unhealthy", 0, up == n && !failing);
    printf(": %zu of %zu shard(s) up\n", up, n);
    print_ckpt_failures(sh, n);
  }
  for (size_t s = 0; s < n && !v->in_place; s++)
    if (!sh[s].st)
      fprintf(stderr, "psctl: shard %zu (%s) is down: %s\n", sh[s].index, sh[s].address,
              sh[s].error ? sh[s].error : "no answer");
  ts_free(sh);
  ts_free(w);
  /* health: checkpoints that fail make the job unhealthy, as a shard down does. */
  return up == n && !(failing && strcmp(cmd, "health") == 0) ? TS_EXIT_OK : TS_EXIT_FAILURE;
}

/* checkpoint / shutdown / model reset: one request per shard that answered; every shard
 * must succeed. */
static int cmd_admin(cluster_view_t *v, const char *cmd, bool checkpoint, bool force,
                     output_t out) {
  int failures = 0;
  bool reset = strcmp(cmd, "model") == 0;
  cJSON *arr = out == OUT_JSON ? cJSON_CreateArray() : NULL;
  for (uint32_t s = 0; s < v->cfg.num_ps; s++) {
    char err[512] = "", path[600] = "";
    uint64_t step = 0, bytes = 0;
    uint32_t closed = 0;
    bool dropped = false;
    int rc;
    if (!shard_selected(v, s)) continue;
    if (!v->st[s]) {
      rc = TS_EUNAVAIL;
      snprintf(err, sizeof err, "%s", v->why[s] ? v->why[s] : "no answer");
    } else if (reset) {
      rc = ts_client_model_reset(v->client, s, force, &dropped, &bytes, &closed, err, sizeof err);
    } else if (strcmp(cmd, "checkpoint") == 0) {
      rc = ts_client_checkpoint(v->client, s, path, sizeof path, &step, err, sizeof err);
    } else {
      rc = ts_client_shutdown(v->client, s, checkpoint, path, sizeof path, err, sizeof err);
    }
    if (rc < 0) failures++;
    if (arr) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddNumberToObject(o, "index", s);
      cJSON_AddStringToObject(o, "address", v->cfg.ps[s]);
      cJSON_AddBoolToObject(o, "ok", rc == 0);
      if (rc == 0 && reset) {
        cJSON_AddBoolToObject(o, "dropped", dropped);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes);
        cJSON_AddNumberToObject(o, "workers_closed", closed);
      } else if (rc == 0) {
        cJSON_AddStringToObject(o, "checkpoint", path);
        if (strcmp(cmd, "checkpoint") == 0) cJSON_AddNumberToObject(o, "step", (double)step);
      } else {
        cJSON_AddStringToObject(o, "error", err);
      }
      cJSON_AddItemToArray(arr, o);
    } else if (rc == 0 && reset) {
      if (dropped && closed)
        printf("shard %u (%s): model dropped (%.1f MiB freed, %u worker connection(s) closed)\n",
               s, v->cfg.ps[s], (double)bytes / (1024.0 * 1024.0), closed);
      else if (dropped)
        printf("shard %u (%s): model dropped (%.1f MiB freed)\n", s, v->cfg.ps[s],
               (double)bytes / (1024.0 * 1024.0));
      else
        printf("shard %u (%s): no model declared\n", s, v->cfg.ps[s]);
    } else if (rc == 0) {
      if (strcmp(cmd, "checkpoint") == 0)
        printf("shard %u (%s): checkpoint at step %llu: %s\n", s, v->cfg.ps[s],
               (unsigned long long)step, path);
      else
        printf("shard %u (%s): stopped%s%s\n", s, v->cfg.ps[s], *path ? " after checkpoint " : "",
               path);
    }
    if (rc < 0)
      fprintf(stderr, "psctl: shard %u (%s): %s failed: %s\n", s, v->cfg.ps[s],
              reset ? "model reset" : cmd, err);
  }
  if (arr) print_json(arr);
  return failures ? TS_EXIT_FAILURE : TS_EXIT_OK;
}

/* psctl COMMAND --watch: the report again every `every` seconds, asked anew of the shards
 * on the same connections, until SIGINT or SIGTERM (exit 0) or a closed stdout (the last
 * report's exit code). */
static int watch_report(cluster_view_t *v, const char *cmd, output_t out, double every) {
  bool tty = isatty(STDOUT_FILENO) == 1;
  char title[64];
  snprintf(title, sizeof title, "psctl %s", cmd);
  v->in_place = tty;
  psctl_watch_begin(stdout, tty);
  int rc = TS_EXIT_OK;
  for (unsigned n = 0;; n++) {
    psctl_watch_frame_begin(stdout, tty, n, out == OUT_TABLE ? title : NULL, every);
    rc = cmd_report(v, cmd, out);
    if (!psctl_watch_frame_end(stdout) || !psctl_watch_sleep(every)) break;
    for (size_t s = 0; s < v->cfg.num_ps; s++) {
      ts_client_status_free(v->st[s]);
      v->st[s] = NULL;
      ts_free(v->why[s]);
      v->why[s] = NULL;
    }
    ask_statuses(v);
  }
  psctl_watch_end(stdout, tty);
  return psctl_watch_stopped() ? TS_EXIT_OK : rc;
}

#define DEFAULT_CONFIG "/etc/tessera/job.cfg"

/* Without -c and without DEFAULT_CONFIG: say on stderr which shards psctl asks and where
 * their addresses came from, so an empty answer is not a mystery. */
static void note_defaults(const ts_config_t *cfg, size_t nsets) {
  const char *tf = getenv("TF_CONFIG");
  const char *from = tf && *tf ? "TF_CONFIG" : nsets ? "defaults and --set" : "defaults";
  char list[512] = "";
  size_t len = 0;
  for (size_t s = 0; s < cfg->num_ps && len < sizeof list; s++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", s ? ", " : "", cfg->ps[s]);
  if (cfg->num_ps == 1)
    fprintf(stderr, "psctl: no -c and no %s: asking shard 0 at %s (%s)\n", DEFAULT_CONFIG, list,
            from);
  else
    fprintf(stderr, "psctl: no -c and no %s: asking %zu shards at %s (%s)\n", DEFAULT_CONFIG,
            cfg->num_ps, list, from);
}

enum {
  OPT_SET = 256,
  OPT_TIMEOUT,
  OPT_SHARD,
  OPT_NO_CHECKPOINT,
  OPT_FORCE,
  OPT_INTERVAL,
  OPT_FORMAT,
  OPT_VOCAB,
  OPT_TASK,
  OPT_FROM_CHECKPOINT
};

/* getopt's table: also what the shell completion and "did you mean" know of the options
 * (a command's own options are those its synopsis names, psctl_help.c). */
static const struct option longopts[] = {
    {"config", required_argument, NULL, 'c'},
    {"set", required_argument, NULL, OPT_SET},
    {"output", required_argument, NULL, 'o'},
    {"watch", no_argument, NULL, 'w'},
    {"interval", required_argument, NULL, OPT_INTERVAL},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"no-checkpoint", no_argument, NULL, OPT_NO_CHECKPOINT},
    {"force", no_argument, NULL, OPT_FORCE},
    {"shard", required_argument, NULL, OPT_SHARD},
    {"task", required_argument, NULL, OPT_TASK},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"from-checkpoint", no_argument, NULL, OPT_FROM_CHECKPOINT},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0}};

/* The values the completion offers for an option: file names for -c, the formats of -o. */
static const psctl_value_hint_t value_hints[] = {
    {"config", NULL}, {"output", "table json"}, {"format", "safetensors npz"}};

static const psctl_options_t options = {longopts, value_hints,
                                        sizeof value_hints / sizeof value_hints[0]};

/* export: every shard holds part of the model, so all must answer. */
static int export_report(cluster_view_t *v, const psctl_export_opts_t *xo) {
  if (v->only_shard >= 0) {
    fprintf(stderr, "psctl: export reads every shard: --shard does not apply\n");
    return TS_EXIT_USAGE;
  }
  for (size_t s = 0; s < v->cfg.num_ps; s++)
    if (!v->st[s]) {
      fprintf(stderr, "psctl: export: shard %zu (%s) is down: %s\n", s, v->cfg.ps[s],
              v->why[s] ? v->why[s] : "no answer");
      return TS_EXIT_FAILURE;
    }
  return psctl_export_run(v->client, &v->cfg, xo);
}

/* psctl help [COMMAND], psctl [COMMAND] --help: on stdout, exit 0; an unknown command is a
 * usage error. */
static int print_help(const char *name) {
  if (!name) {
    psctl_usage(stdout);
    return TS_EXIT_OK;
  }
  const psctl_command_t *c = psctl_command_find(name);
  if (!c) {
    psctl_unknown_command(stderr, name);
    return TS_EXIT_USAGE;
  }
  psctl_command_help(stdout, c);
  return TS_EXIT_OK;
}

/* --shard N, --task T: an index of cluster.ps or cluster.workers; -1 (said) when not one. */
static long parse_index(const char *arg, const char *opt, const char *what) {
  char *end;
  long v = strtol(arg, &end, 10);
  if (*end || !*arg || v < 0 || v >= TS_CONFIG_MAX_HOSTS) {
    fprintf(stderr, "psctl: %s takes a %s index, not '%s'\n", opt, what, arg);
    return -1;
  }
  return v;
}

int main(int argc, char **argv) {
  const char *config_path = NULL;
  output_t out = OUT_TABLE;
  double timeout = 3.0, interval = 0;
  long only_shard = -1;
  const char **sets = calloc((size_t)argc, sizeof *sets);
  size_t nsets = 0;
  if (!sets) return TS_EXIT_FAILURE;
  bool final_checkpoint = true, force = false, help = false, watch = false;
  long task = -1; /* token derive --task T */
  /* export: -o names its file, not the output format: read once the command is known */
  const char *o_arg = NULL;
  psctl_export_opts_t xo = {0};
  char xerr[256];
  int opt, rc = TS_EXIT_USAGE;
  /* Options anywhere on the line, as kubectl's and etcdctl's: `psctl status -o json` is
   * `psctl -o json status` (GNU getopt moves the command behind the options). Its own
   * messages are off (opterr = 0, the leading ':'): ours name the option and point to
   * --help instead of printing the whole usage. */
  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":c:o:whV", longopts, NULL)) != -1) {
    switch (opt) {
      case 'c':
        config_path = optarg;
        break;
      case OPT_SET:
        sets[nsets++] = optarg;
        break;
      case 'w':
        watch = true;
        break;
      case 'o':
        o_arg = optarg;
        break;
      case OPT_FORMAT:
        xo.format = optarg;
        break;
      case OPT_FROM_CHECKPOINT:
        xo.from_checkpoint = true;
        break;
      case OPT_VOCAB:
        if (psctl_export_add_vocab(&xo, optarg, xerr, sizeof xerr) < 0) {
          fprintf(stderr, "psctl: %s\n", xerr);
          goto done;
        }
        break;
      case OPT_TIMEOUT: {
        char *end;
        timeout = strtod(optarg, &end);
        if (*end || !(timeout > 0.0) || timeout > 3600.0) {
          fprintf(stderr, "psctl: --timeout takes seconds (0 < t <= 3600), not '%s'\n", optarg);
          goto done;
        }
        break;
      }
      case OPT_NO_CHECKPOINT:
        final_checkpoint = false;
        break;
      case OPT_FORCE:
        force = true;
        break;
      case OPT_INTERVAL: {
        char *end;
        interval = strtod(optarg, &end);
        if (*end || !(interval > 0.0) || interval > 3600.0) {
          fprintf(stderr, "psctl: --interval takes seconds (0 < t <= 3600), not '%s'\n", optarg);
          goto done;
        }
        break;
      }
      case OPT_SHARD:
        if ((only_shard = parse_index(optarg, "--shard", "shard")) < 0) goto done;
        break;
      case OPT_TASK:
        if ((task = parse_index(optarg, "--task", "worker")) < 0) goto done;
        break;
      case 'h':
        help = true;
        break;
      case 'V':
        printf("psctl %s\n", TS_VERSION);
        rc = TS_EXIT_OK;
        goto done;
      case ':':
        fprintf(stderr, "psctl: option '%s' needs a value (see psctl --help)\n", argv[optind - 1]);
        goto done;
      default: {
        /* A long option is named as written: getopt's optopt is then 0 (unknown), or, for
         * one that takes no value given one (--force=1), its code, not a character. */
        const char *arg = argv[optind - 1], *eq = strchr(arg, '=');
        bool valued = false; /* arg is "--NAME=..." of such an option (NAME maybe cut short) */
        for (const struct option *o = longopts; eq && o->name && !valued; o++)
          valued = strncmp(arg, "--", 2) == 0 && o->has_arg == no_argument && o->val == optopt &&
                   strncmp(o->name, arg + 2, (size_t)(eq - arg - 2)) == 0;
        if (valued)
          fprintf(stderr, "psctl: option '%.*s' takes no value (see psctl --help)\n",
                  (int)(eq - arg), arg);
        else if (!optopt)
          psctl_unknown_option(stderr, arg, longopts);
        else
          fprintf(stderr, "psctl: unknown option '-%c' (see psctl --help)\n", optopt);
        goto done;
      }
    }
  }
  char names[512];
  psctl_command_names(names, sizeof names);
  const char *cmd = optind < argc ? argv[optind] : NULL;
  if (help || (cmd && strcmp(cmd, "help") == 0)) {
    /* psctl --help, psctl status --help, psctl help, psctl help status */
    int first = optind + (cmd && strcmp(cmd, "help") == 0);
    const char *topic = first < argc ? argv[first] : help && cmd ? cmd : NULL;
    int end = first + 1;
    if (topic && strcmp(topic, "model") == 0 && end < argc && strcmp(argv[end], "reset") == 0) end++;
    if (topic && strcmp(topic, "token") == 0 && end < argc && strcmp(argv[end], "derive") == 0) end++;
    if (topic && end < argc) {
      fprintf(stderr, "psctl: help is about one command, not '%s' too\n", argv[end]);
      goto done;
    }
    rc = print_help(topic);
    goto done;
  }
  if (!cmd) {
    fprintf(stderr, "psctl: which command? (%s; see psctl --help)\n", names);
    goto done;
  }
  const psctl_command_t *command = psctl_command_find(cmd);
  if (!command) {
    if (watch && (strcmp(cmd, "json") == 0 || strcmp(cmd, "table") == 0))
      fprintf(stderr, "psctl: unknown command '%s': -w is --watch now; the output format is -o %s\n",
              cmd, cmd);
    else
      psctl_unknown_command(stderr, cmd);
    goto done;
  }
  if (strcmp(cmd, "completion") == 0) {
    const char *shell = optind + 1 < argc ? argv[optind + 1] : NULL;
    if (!shell || optind + 2 < argc) {
      fprintf(stderr, "psctl: completion takes one shell: bash or zsh (see psctl completion --help)\n");
      goto done;
    }
    if (psctl_completion_print(stdout, shell, &options) < 0) {
      fprintf(stderr, "psctl: completion takes bash or zsh, not '%s'\n", shell);
      goto done;
    }
    rc = fflush(stdout) == 0 ? TS_EXIT_OK : TS_EXIT_FAILURE;
    goto done;
  }
  bool export_cmd = strcmp(cmd, "export") == 0;
  if (export_cmd) {
    xo.path = o_arg;
    if ((rc = psctl_export_check(&xo)) != TS_EXIT_OK) goto done;
    rc = TS_EXIT_USAGE;
  } else if (o_arg && strcmp(o_arg, "json") == 0) {
    out = OUT_JSON;
  } else if (o_arg && strcmp(o_arg, "table") != 0) {
    fprintf(stderr, "psctl: --output takes table or json, not '%s'\n", o_arg);
    goto done;
  }
  if (!export_cmd && (xo.format || xo.num_vocab || xo.from_checkpoint)) {
    fprintf(stderr, "psctl: %s has no --%s (see psctl %s --help)\n", cmd,
            xo.format ? "format" : xo.num_vocab ? "vocab" : "from-checkpoint", cmd);
    goto done;
  }
  bool model_cmd = strcmp(cmd, "model") == 0, token_cmd = strcmp(cmd, "token") == 0;
  /* checkpoint list: the files in checkpoint.dir, read here (psctl_ckpt.h). */
  bool ckpt_list = strcmp(cmd, "checkpoint") == 0 && optind + 1 < argc &&
                   strcmp(argv[optind + 1], "list") == 0;
  bool admin_cmd = strcmp(cmd, "checkpoint") == 0 || strcmp(cmd, "shutdown") == 0 || model_cmd;
  if (model_cmd && (optind + 1 >= argc || strcmp(argv[optind + 1], "reset") != 0)) {
    fprintf(stderr, "psctl: model takes one subcommand: reset (see psctl model --help)\n");
    goto done;
  }
  if (token_cmd && (optind + 1 >= argc || strcmp(argv[optind + 1], "derive") != 0 || task < 0)) {
    fprintf(stderr, "psctl: token takes one subcommand: derive --task T (see psctl token --help)\n");
    goto done;
  }
  if (task >= 0 && !token_cmd) {
    fprintf(stderr, "psctl: --task is an option of token derive only\n");
    goto done;
  }
  int sub = model_cmd || token_cmd || ckpt_list;
  if (optind + 1 + sub < argc) {
    fprintf(stderr, "psctl: unexpected argument '%s' after %s (see psctl %s --help)\n",
            argv[optind + 1 + sub],
            model_cmd   ? "model reset"
            : token_cmd ? "token derive"
            : ckpt_list ? "checkpoint list"
                        : cmd,
            cmd);
    goto done;
  }
  if (force && !model_cmd) {
    fprintf(stderr, "psctl: --force is an option of model reset only\n");
    goto done;
  }
  if (watch && !psctl_command_takes(command, &options, "watch")) {
    fprintf(stderr, "psctl: %s has no --watch (see psctl %s --help)\n", cmd, cmd);
    goto done;
  }
  if (interval > 0 && !psctl_command_takes(command, &options, "interval")) {
    fprintf(stderr, "psctl: %s has no --interval (see psctl %s --help)\n", cmd, cmd);
    goto done;
  }
  if (interval > 0 && !watch && strcmp(cmd, "tables") != 0) {
    fprintf(stderr, "psctl: --interval goes with --watch (psctl %s --watch --interval %g)\n", cmd,
            interval);
    goto done;
  }
  bool defaults = false;
  if (!config_path) {
    if (access(DEFAULT_CONFIG, R_OK) == 0)
      config_path = DEFAULT_CONFIG;
    else
      defaults = true;
  }
  ts_log_init("psctl", TS_LOG_ERR);
  /* A closed stdout (psctl status | head -1) ends the output, not psctl: the exit code
   * still tells the job's health. */
  signal(SIGPIPE, SIG_IGN);

  cluster_view_t v;
  memset(&v, 0, sizeof v);
  char err[512];
  if (ts_config_load(&v.cfg, config_path, getenv("TF_CONFIG"), sets, nsets, err, sizeof err) < 0) {
    fprintf(stderr, "psctl: %s\n", err);
    ts_config_free(&v.cfg);
    rc = TS_EXIT_CONFIG;
    goto done;
  }
  if (defaults && !token_cmd) note_defaults(&v.cfg, nsets);
  if (only_shard >= 0 && (size_t)only_shard >= v.cfg.num_ps) {
    fprintf(stderr, "psctl: --shard %ld: the job has %zu shard(s) (cluster.ps)\n", only_shard,
            v.cfg.num_ps);
    ts_config_free(&v.cfg);
    rc = TS_EXIT_USAGE;
    goto done;
  }
  if (export_cmd && xo.from_checkpoint) { /* the files on this host: no shard asked */
    rc = only_shard >= 0 ? TS_EXIT_USAGE : psctl_export_checkpoint(&v.cfg, &xo);
    if (only_shard >= 0) fprintf(stderr, "psctl: export reads every shard: --shard does not apply\n");
    ts_config_free(&v.cfg);
    goto done;
  }
  if (ckpt_list) {
    cJSON *list = NULL;
    rc = psctl_checkpoint_list(&v.cfg, only_shard, out == OUT_JSON ? &list : NULL);
    if (list) print_json(list);
    ts_config_free(&v.cfg);
    goto done;
  }
  v.only_shard = only_shard;
  v.interval = watch ? 0 : interval; /* tables: two samples this far apart */
  colour = out == OUT_TABLE && use_colour();
  v.admin_cmd = admin_cmd;
  if (token_cmd) {
    rc = psctl_token_derive(&v.cfg, task);
    ts_config_free(&v.cfg);
    goto done;
  }
  rc = gather(&v, timeout);
  /* A refused credential is not a shard down: its own message and exit code. */
  if (rc == 0) rc = psctl_token_refused(v.client, &v.cfg, only_shard, v.token_file, v.token_key);
  if (rc == 0 && export_cmd)
    rc = export_report(&v, &xo);
  else if (rc == 0 && watch)
    rc = watch_report(&v, cmd, out, interval > 0 ? interval : 2.0);
  else if (rc == 0)
    rc = admin_cmd ? cmd_admin(&v, cmd, final_checkpoint, force, out) : cmd_report(&v, cmd, out);
  release(&v);
done:
  free(sets);
  return rc;
}
