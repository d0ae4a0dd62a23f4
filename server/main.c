/* ps-server: one shard of the parameter server (DESIGN.md §1). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_log.h"
#include "ts_server.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ps-server -c FILE [--shard N] [--set KEY=VALUE]... [--insecure]\n"
          "\n"
          "Serves shard N of the job in FILE on cluster.ps[N].\n"
          "\n"
          "  -c, --config FILE     job file (libconfig)\n"
          "  -s, --shard N         which shard (default: from TF_CONFIG's task)\n"
          "      --set KEY=VALUE   override a key, e.g. --set job.mode=\"async\"\n"
          "      --insecure        allow a non-loopback address without auth tokens\n"
          "      --log-level LVL   crit|err|warn|notice|info|debug (default info)\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "Exit codes: 0 clean shutdown, 1 runtime failure, 2 usage, 78 bad configuration.\n");
}

int main(int argc, char **argv) {
  const char *config_path = NULL;
  long shard = -1;
  bool insecure = false;
  ts_log_level_t level = TS_LOG_INFO;
  const char **sets = calloc((size_t)argc, sizeof *sets);
  size_t nsets = 0;
  if (!sets) return TS_EXIT_FAILURE;

  enum { OPT_SET = 256, OPT_INSECURE, OPT_LOG_LEVEL };
  static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},  {"shard", required_argument, NULL, 's'},
      {"set", required_argument, NULL, OPT_SET}, {"insecure", no_argument, NULL, OPT_INSECURE},
      {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
      {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "c:s:hV", longopts, NULL)) != -1) {
    switch (opt) {
      case 'c':
        config_path = optarg;
        break;
      case 's': {
        char *end;
        shard = strtol(optarg, &end, 10);
        if (*end || shard < 0 || shard > 65535) {
          fprintf(stderr, "ps-server: --shard takes a shard index, not '%s'\n", optarg);
          free(sets);
          return TS_EXIT_USAGE;
        }
        break;
      }
      case OPT_SET:
        sets[nsets++] = optarg;
        break;
      case OPT_INSECURE:
        insecure = true;
        break;
      case OPT_LOG_LEVEL:
        if (!ts_log_parse_level(optarg, &level)) {
          fprintf(stderr, "ps-server: unknown log level '%s'\n", optarg);
          free(sets);
          return TS_EXIT_USAGE;
        }
        break;
      case 'h':
        usage(stdout);
        free(sets);
        return TS_EXIT_OK;
      case 'V':
        printf("ps-server %s\n", TS_VERSION);
        free(sets);
        return TS_EXIT_OK;
      default:
        usage(stderr);
        free(sets);
        return TS_EXIT_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ps-server: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    free(sets);
    return TS_EXIT_USAGE;
  }
  ts_log_init("ps-server", level);

  ts_config_t cfg;
  char err[512];
  int rc = ts_config_load(&cfg, config_path, getenv("TF_CONFIG"), sets, nsets, err, sizeof err);
  free(sets);
  if (rc < 0) {
    ts_log_err("%s", err);
    ts_config_free(&cfg);
    return TS_EXIT_CONFIG;
  }
  if (shard < 0) {
    if (cfg.task_role == TS_ROLE_PS && cfg.task_index >= 0) {
      shard = cfg.task_index;
    } else {
      ts_log_err("which shard? pass --shard N, or a TF_CONFIG whose task is {\"type\":\"ps\",...}");
      ts_config_free(&cfg);
      return TS_EXIT_USAGE;
    }
  }
  char name[32];
  snprintf(name, sizeof name, "ps-server[%ld]", shard);
  ts_log_init(name, level);

  uv_loop_t loop;
  uv_loop_init(&loop);
  ts_server_t *srv = NULL;
  ts_server_opts_t opts = {.cfg = &cfg, .shard = (uint32_t)shard, .insecure = insecure};
  rc = ts_server_start(&srv, &loop, &opts, err, sizeof err);
  if (rc < 0) {
    ts_log_err("%s", err);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    ts_config_free(&cfg);
    return rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  ts_server_free(srv);
  rc = uv_loop_close(&loop);
  if (rc != 0) ts_log_warn("loop closed with handles open: %s", uv_strerror(rc));
  ts_config_free(&cfg);
  ts_log_info("stopped");
  return TS_EXIT_OK;
}
