#include "ts_cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_err.h"

int ts_cli_parse(const ts_cli_spec_t *spec, int argc, char **argv, ts_cli_t *out) {
  memset(out, 0, sizeof *out);
  out->id = -1;
  out->level = TS_LOG_INFO;
  out->sets = ts_calloc((size_t)argc, sizeof *out->sets);
  if (!out->sets) return TS_EXIT_FAILURE;
  enum { OPT_SET = 256, OPT_INSECURE, OPT_FRESH, OPT_ADOPT, OPT_LOG_LEVEL };
  const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},
      {spec->id_name, required_argument, NULL, 'i'},
      {"set", required_argument, NULL, OPT_SET},
      {"insecure", no_argument, NULL, OPT_INSECURE},
      {"fresh", no_argument, NULL, OPT_FRESH},
      {"adopt", no_argument, NULL, OPT_ADOPT},
      {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  char shortopts[] = "c:x:hV";
  shortopts[2] = spec->id_name[0]; /* -s for --shard, -t for --task */
  optind = 1;
  int opt;
  while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    if (opt == spec->id_name[0]) opt = 'i';
    switch (opt) {
      case 'c':
        out->config_path = optarg;
        break;
      case 'i': {
        char *end;
        out->id = strtol(optarg, &end, 10);
        if (*end || !*optarg || out->id < 0 || out->id > 65535) {
          fprintf(stderr, "%s: --%s takes an index from 0 to 65535, not '%s'\n", spec->prog,
                  spec->id_name, optarg);
          return TS_EXIT_USAGE;
        }
        break;
      }
      case OPT_SET:
        out->sets[out->num_sets++] = optarg;
        break;
      case OPT_INSECURE:
        if (!spec->allow_insecure) {
          fprintf(stderr, "%s: unknown option --insecure\n", spec->prog);
          return TS_EXIT_USAGE;
        }
        out->insecure = true;
        break;
      case OPT_FRESH:
      case OPT_ADOPT:
        if (!spec->allow_fresh) {
          fprintf(stderr, "%s: unknown option --%s\n", spec->prog,
                  opt == OPT_FRESH ? "fresh" : "adopt");
          return TS_EXIT_USAGE;
        }
        if (opt == OPT_FRESH)
          out->fresh = true;
        else
          out->adopt = true;
        break;
      case OPT_LOG_LEVEL:
        if (!ts_log_parse_level(optarg, &out->level)) {
          fprintf(stderr, "%s: unknown log level '%s' (crit, err, warn, notice, info, debug)\n",
                  spec->prog, optarg);
          return TS_EXIT_USAGE;
        }
        break;
      case 'h':
        spec->usage(stdout);
        return TS_EXIT_OK;
      case 'V':
        printf("%s %s\n", spec->prog, TS_VERSION);
        return TS_EXIT_OK;
      default:
        spec->usage(stderr);
        return TS_EXIT_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", spec->prog, argv[optind]);
    spec->usage(stderr);
    return TS_EXIT_USAGE;
  }
  ts_log_init(spec->prog, out->level);
  return -1;
}

int ts_cli_load(const ts_cli_spec_t *spec, ts_cli_t *cli, ts_config_t *cfg) {
  char err[1024];
  if (ts_config_load(cfg, cli->config_path, getenv("TF_CONFIG"), cli->sets, cli->num_sets, err,
                     sizeof err) < 0) {
    ts_log_err("%s", err);
    return TS_EXIT_CONFIG;
  }
  const char *role = spec->id_role == TS_ROLE_PS ? "ps" : "worker";
  if (cli->id < 0) {
    if (cfg->task_role == spec->id_role && cfg->task_index >= 0) {
      cli->id = cfg->task_index;
    } else {
      ts_log_err("which %s? pass --%s N, or a TF_CONFIG whose task is {\"type\":\"%s\",...}",
                 spec->id_name, spec->id_name, role);
      return TS_EXIT_USAGE;
    }
  }
  size_t count = spec->id_role == TS_ROLE_PS ? cfg->num_ps : cfg->num_workers;
  if ((size_t)cli->id >= count) {
    ts_log_err("%s %ld does not exist: cluster.%s lists %zu", spec->id_name, cli->id,
               spec->id_role == TS_ROLE_PS ? "ps" : "workers", count);
    return TS_EXIT_CONFIG;
  }
  char name[64];
  snprintf(name, sizeof name, "%s[%ld]", spec->prog, cli->id);
  ts_log_init(name, cli->level);
  return -1;
}

void ts_cli_free(ts_cli_t *cli) {
  ts_free(cli->sets);
  cli->sets = NULL;
}
