/* ps-server: one shard of the parameter server (docs/configuration.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "ts_alloc.h"
#include "ts_cli.h"
#include "ts_config.h"
#include "ts_err.h"
#include "ts_fpenv.h"
#include "ts_log.h"
#include "ts_notify.h"
#include "ts_poll.h"
#include "ts_server.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ps-server -c FILE [--shard N] [--set KEY=VALUE]... [--insecure] [--fresh|--adopt]\n"
          "\n"
          "Serves shard N of the job in FILE on cluster.ps[N].\n"
          "\n"
          "  -c, --config FILE     job file (libconfig)\n"
          "  -s, --shard N         which shard (default: from TF_CONFIG's task)\n"
          "      --set KEY=VALUE   override a key, e.g. --set job.mode=\"async\"\n"
          "      --insecure        allow a non-loopback address without auth tokens\n"
      "      --fresh           do not restore checkpoint.dir: start with no model (its\n"
      "                        files stay; needed when none of them is usable)\n"
      "      --adopt           restore checkpoints another job wrote (another job.mode\n"
      "                        or optimizer.name) and continue them as this job\n"
          "      --log-level LVL   crit|err|warn|notice|info|debug (default info)\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "Exit codes: 0 clean shutdown, 1 runtime failure, 2 usage, 78 bad configuration.\n");
}

/* Every connection the limits allow is a file descriptor: authenticated ones, those in
 * their handshake, and the admin endpoint's (with libmicrohttpd's margin of 64), plus a
 * few dozen for the process itself. Raise the soft limit towards the hard one (as redis
 * does), and say so when even that is short: connections past it would be refused by
 * accept(2), whatever the keys say. */
static void raise_fd_limit(const ts_config_t *cfg) {
  rlim_t want = (rlim_t)cfg->max_connections + (rlim_t)cfg->max_preauth_connections +
                (rlim_t)cfg->http_max_connections + 64 + 64;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want) return;
  rlim_t to = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
  if (to > rl.rlim_cur) {
    rl.rlim_cur = to;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < want)
    ts_log_warn(
        "open files limit is %llu, below the %llu that server.max_connections, "
        "server.max_preauth_connections and http.max_connections need: raise LimitNOFILE / "
        "ulimit -n",
        (unsigned long long)rl.rlim_cur, (unsigned long long)want);
}

int main(int argc, char **argv) {
  static const ts_cli_spec_t spec = {.prog = "ps-server", .id_name = "shard",
                                     .id_role = TS_ROLE_PS, .allow_insecure = true,
                                     .allow_fresh = true, .usage = usage};
  ts_cli_t cli;
  ts_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  int rc = ts_cli_parse(&spec, argc, argv, &cli);
  if (rc < 0) rc = ts_cli_load(&spec, &cli, &cfg);
  if (rc >= 0) {
    ts_config_free(&cfg);
    ts_cli_free(&cli);
    return rc;
  }
  raise_fd_limit(&cfg);
  ts_fpenv_flush_denormals(); /* the optimizers' passes: base/ts_fpenv.h */
  char err[2048]; /* a refused checkpoint directory names a few files */
  uv_loop_t loop;
  uv_loop_init(&loop);
  ts_server_t *srv = NULL;
  ts_server_opts_t opts = {.cfg = &cfg, .shard = (uint32_t)cli.id, .insecure = cli.insecure,
                           .fresh = cli.fresh,
                           .adopt = cli.adopt};
  rc = ts_server_start(&srv, &loop, &opts, err, sizeof err);
  ts_cli_free(&cli);
  if (rc < 0) {
    ts_log_err("%s", err);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    ts_config_free(&cfg);
    return rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
  }
  /* Listening (and, once checkpoints exist, restored): systemd may start what depends on
   * this shard. */
  ts_notify_printf("READY=1\nSTATUS=serving shard %u of %zu", opts.shard, cfg.num_ps);
  /* Poll for job.busy_poll_us after each message before sleeping: the next request of a
   * busy worker is then read without a wake-up from sleep. */
  ts_poll_run(&loop, (uint64_t)cfg.busy_poll_us, ts_server_poll_active, srv);
  ts_server_free(srv);
  rc = uv_loop_close(&loop);
  if (rc != 0) ts_log_warn("loop closed with handles open: %s", uv_strerror(rc));
  ts_config_free(&cfg);
  ts_log_info("stopped");
  return TS_EXIT_OK;
}
