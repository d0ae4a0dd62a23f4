/* ps-worker: data-parallel training against the job's parameter servers (DESIGN.md §1, §5). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_build_config.h"
#include "ts_client.h"
#include "ts_config.h"
#include "ts_device.h"
#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_idx.h"
#include "ts_kernels.h"
#include "ts_log.h"
#include "ts_model.h"
#include "ts_trainer.h"

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ps-worker -c FILE [--task N] [--set KEY=VALUE]...\n"
          "\n"
          "Trains the job's model as worker N of cluster.workers against the shards of\n"
          "cluster.ps, then prints one line:\n"
          "  done: task=T steps=S examples=E loss=L test_accuracy=A examples_per_sec=X\n"
          "\n"
          "  -c, --config FILE     job file (libconfig)\n"
          "  -t, --task N          which worker (default: from TF_CONFIG's task)\n"
          "      --set KEY=VALUE   override a key, e.g. --set train.max_steps=200\n"
          "      --log-level LVL   crit|err|warn|notice|info|debug (default info)\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "Exit codes: 0 done (or stopped by SIGTERM/SIGINT), 1 runtime failure, 2 usage,\n"
          "78 bad configuration, data or device placement.\n");
}

static char *read_token(const char *path, char *errmsg, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(errmsg, errlen, "cannot read auth.token_file %s", path);
    return NULL;
  }
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
  return ts_strdup(buf);
}

/* Check the data against the model before anything is sent to a shard. */
static int check_data(const ts_config_t *cfg, const ts_dataset_t *train, const ts_dataset_t *test,
                      char *errmsg, size_t errlen) {
  size_t in = (size_t)cfg->layers[0];
  size_t classes = (size_t)cfg->layers[cfg->num_layers - 1];
  if (train->rows * train->cols != in) {
    snprintf(errmsg, errlen,
             "model.layers starts with %zu inputs but %s holds %zux%zu = %zu pixels per image",
             in, cfg->train_images, train->rows, train->cols, train->rows * train->cols);
    return TS_ECONFIG;
  }
  if (test->rows != train->rows || test->cols != train->cols) {
    snprintf(errmsg, errlen, "%s holds %zux%zu images but %s holds %zux%zu", cfg->test_images,
             test->rows, test->cols, cfg->train_images, train->rows, train->cols);
    return TS_ECONFIG;
  }
  int32_t max_label = train->max_label > test->max_label ? train->max_label : test->max_label;
  if ((size_t)max_label >= classes) {
    snprintf(errmsg, errlen,
             "model.layers ends with %zu classes but the labels go up to %d (%s / %s)", classes,
             (int)max_label, cfg->train_labels, cfg->test_labels);
    return TS_ECONFIG;
  }
  return 0;
}

/* Resolve device placement for every op; logs placement lines and soft-placement moves. */
static int place_ops(const ts_config_t *cfg, int task, const ts_model_t *m, char *errmsg,
                     size_t errlen) {
  ts_device_spec_t want;
  int rc = ts_device_parse(cfg->placement, &want, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "device.placement");
    return TS_ECONFIG;
  }
  char gpu_why[256] = "";
  int gpu_count = ts_gpu_count(gpu_why, sizeof gpu_why);
  for (int g = 0; g < gpu_count; g++) {
    ts_gpu_info_t info;
    if (ts_gpu_info(g, &info) == 0)
      ts_log_info("/gpu:%d is %s (PCI %s, %.1f GiB, compute capability %d.%d)", g, info.name,
                  info.pci_bus_id, (double)info.total_bytes / (1024.0 * 1024.0 * 1024.0),
                  info.major, info.minor);
  }
  ts_placement_op_t *ops = ts_calloc(m->num_ops, sizeof *ops);
  ts_placement_t *pl = ts_calloc(m->num_ops, sizeof *pl);
  if (!ops || !pl) {
    ts_free(ops);
    ts_free(pl);
    snprintf(errmsg, errlen, "out of memory");
    return TS_ENOMEM;
  }
  for (size_t i = 0; i < m->num_ops; i++) {
    ops[i].name = m->ops[i].name;
    ops[i].type = m->ops[i].type;
    ops[i].gpu_kernel = false; /* the CUDA back end has no model kernels yet */
  }
  rc = ts_device_place(&want, gpu_count, gpu_why, ops, m->num_ops, cfg->allow_soft_placement, pl,
                       errmsg, errlen);
  if (rc == 0) {
    bool logged_soft = false;
    for (size_t i = 0; i < m->num_ops; i++) {
      char dev[96];
      ts_device_long_name((ts_device_type_t)pl[i].type, pl[i].index, task, dev, sizeof dev);
      if (pl[i].soft && !logged_soft) {
        char spec[48];
        ts_device_short_name(want.type, want.index, spec, sizeof spec);
        ts_log_warn("allow_soft_placement: '%s' is not available: %s; placing the model's ops on %s",
                    spec, pl[i].reason, dev);
        logged_soft = true;
      }
      if (cfg->log_device_placement) fprintf(stderr, "%s: (%s): %s\n", ops[i].name, ops[i].type, dev);
    }
  }
  ts_free(ops);
  ts_free(pl);
  return rc;
}

int main(int argc, char **argv) {
  const char *config_path = NULL;
  long task = -1;
  ts_log_level_t level = TS_LOG_INFO;
  const char **sets = calloc((size_t)argc, sizeof *sets);
  size_t nsets = 0;
  if (!sets) return TS_EXIT_FAILURE;
  enum { OPT_SET = 256, OPT_LOG_LEVEL };
  static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},  {"task", required_argument, NULL, 't'},
      {"set", required_argument, NULL, OPT_SET}, {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
      {"help", no_argument, NULL, 'h'},          {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  int opt, exit_code = TS_EXIT_USAGE;
  while ((opt = getopt_long(argc, argv, "c:t:hV", longopts, NULL)) != -1) {
    switch (opt) {
      case 'c':
        config_path = optarg;
        break;
      case 't': {
        char *end;
        task = strtol(optarg, &end, 10);
        if (*end || task < 0 || task > 65535) {
          fprintf(stderr, "ps-worker: --task takes a worker index, not '%s'\n", optarg);
          free(sets);
          return TS_EXIT_USAGE;
        }
        break;
      }
      case OPT_SET:
        sets[nsets++] = optarg;
        break;
      case OPT_LOG_LEVEL:
        if (!ts_log_parse_level(optarg, &level)) {
          fprintf(stderr, "ps-worker: unknown log level '%s'\n", optarg);
          free(sets);
          return TS_EXIT_USAGE;
        }
        break;
      case 'h':
        usage(stdout);
        free(sets);
        return TS_EXIT_OK;
      case 'V':
        printf("ps-worker %s\n", TS_VERSION);
        free(sets);
        return TS_EXIT_OK;
      default:
        usage(stderr);
        free(sets);
        return TS_EXIT_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "ps-worker: unexpected argument '%s'\n", argv[optind]);
    free(sets);
    return TS_EXIT_USAGE;
  }
  ts_log_init("ps-worker", level);

  ts_config_t cfg;
  char err[1024];
  ts_dataset_t train = {0}, test = {0};
  ts_model_t model;
  memset(&model, 0, sizeof model);
  ts_client_t *client = NULL;
  char *token = NULL;
  int rc = ts_config_load(&cfg, config_path, getenv("TF_CONFIG"), sets, nsets, err, sizeof err);
  free(sets);
  if (rc < 0) {
    ts_log_err("%s", err);
    ts_config_free(&cfg);
    return TS_EXIT_CONFIG;
  }
  if (task < 0) {
    if (cfg.task_role == TS_ROLE_WORKER && cfg.task_index >= 0) {
      task = cfg.task_index;
    } else {
      ts_log_err("which worker? pass --task N, or a TF_CONFIG whose task is {\"type\":\"worker\",...}");
      ts_config_free(&cfg);
      return TS_EXIT_USAGE;
    }
  }
  if ((size_t)task >= cfg.num_workers) {
    ts_log_err("--task %ld: cluster.workers lists %zu worker(s)", task, cfg.num_workers);
    ts_config_free(&cfg);
    return TS_EXIT_CONFIG;
  }
  char name[32];
  snprintf(name, sizeof name, "ps-worker[%ld]", task);
  ts_log_init(name, level);
  exit_code = TS_EXIT_CONFIG;

  if (strcmp(cfg.data_format, "idx") != 0) {
    ts_log_err("data.format \"%s\" is not supported (use \"idx\")", cfg.data_format);
    goto out;
  }
  /* Everything that can be wrong with the data or the model is found before any shard is
   * contacted, so a bad job never touches the parameter servers. */
  if (ts_idx_load_pair(cfg.train_images, cfg.train_labels, &train, err, sizeof err) < 0 ||
      ts_idx_load_pair(cfg.test_images, cfg.test_labels, &test, err, sizeof err) < 0 ||
      check_data(&cfg, &train, &test, err, sizeof err) < 0) {
    ts_log_err("%s", err);
    goto out;
  }
  ts_log_info("data: %zu training and %zu test examples of %zux%zu", train.n, test.n, train.rows,
              train.cols);
  size_t capacity = (size_t)cfg.batch_size > 1000 ? (size_t)cfg.batch_size : 1000;
  rc = ts_model_init(&model, cfg.layers, cfg.num_layers, cfg.activation, capacity, ts_kernels_cpu(),
                     err, sizeof err);
  if (rc < 0) {
    ts_log_err("model: %s", err);
    exit_code = rc == TS_EINVAL ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
    goto out;
  }
  if (place_ops(&cfg, (int)task, &model, err, sizeof err) < 0) {
    ts_log_err("%s", err);
    goto out;
  }
  if (cfg.token_file && *cfg.token_file && !(token = read_token(cfg.token_file, err, sizeof err))) {
    ts_log_err("%s", err);
    goto out;
  }

  exit_code = TS_EXIT_FAILURE;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  char ident[128], host[64] = "?";
  gethostname(host, sizeof host);
  host[sizeof host - 1] = 0;
  snprintf(ident, sizeof ident, "ps-worker task %ld pid %d@%s", task, (int)getpid(), host);
  ts_client_opts_t o = {.addrs = (const char *const *)cfg.ps,
                        .num_shards = cfg.num_ps,
                        .task = (int)task,
                        .identity = ident,
                        .token = token,
                        .connect_timeout_s = 30.0,
                        .request_timeout_s = cfg.sync_timeout_s * 3.0 > 30.0 ? cfg.sync_timeout_s * 3.0 : 30.0,
                        .heartbeat_interval_s = cfg.heartbeat_interval_s,
                        .require_all = true};
  rc = ts_client_open(&client, &o, err, sizeof err);
  if (rc < 0) {
    ts_log_err("%s", err);
    if (rc == TS_EAUTH) exit_code = TS_EXIT_CONFIG;
    goto out;
  }
  ts_client_tensor_t *decl = ts_calloc(model.num_tensors, sizeof *decl);
  if (!decl) goto out;
  for (size_t i = 0; i < model.num_tensors; i++) {
    decl[i].name = model.tensors[i].name;
    decl[i].shape = model.tensors[i].shape;
    decl[i].rank = model.tensors[i].rank;
    decl[i].init = model.tensors[i].init;
  }
  rc = ts_client_declare(client, decl, model.num_tensors, (uint64_t)cfg.seed, err, sizeof err);
  ts_free(decl);
  if (rc < 0) {
    ts_log_err("declaring the model: %s", err);
    goto out;
  }
  ts_log_info("model [%s] declared on %zu shard(s): %zu parameters", "mlp", cfg.num_ps,
              model.param_count);

  ts_trainer_t t = {.cfg = &cfg, .task = (int)task, .num_workers = (int)cfg.num_workers,
                    .train = &train, .test = &test, .model = &model, .client = client,
                    .stop = &stop_requested};
  ts_train_result_t res;
  rc = ts_trainer_run(&t, &res, err, sizeof err);
  if (rc < 0) {
    ts_log_err("%s", err);
    exit_code = rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
    goto out;
  }
  exit_code = TS_EXIT_OK;
  if (!res.stopped) {
    printf("done: task=%ld steps=%llu examples=%llu loss=%.4f test_accuracy=%.4f "
           "examples_per_sec=%.1f\n",
           task, (unsigned long long)res.steps, (unsigned long long)res.examples, res.loss,
           res.test_accuracy, res.examples_per_sec);
    fflush(stdout);
  }
out:
  ts_client_close(client);
  ts_model_destroy(&model);
  ts_dataset_free(&train);
  ts_dataset_free(&test);
  ts_free(token);
  ts_config_free(&cfg);
  return exit_code;
}
