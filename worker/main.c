/* ps-worker: data-parallel training against the job's parameter servers (docs/configuration.md). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ts_alloc.h"
#include "ts_cli.h"
#include "tessera/client.h"
#include "ts_config.h"
#include "ts_config_job.h"
#include "ts_backend.h"
#include "ts_ctr_train.h"
#include "ts_device.h"
#include "ts_err.h"
#include "ts_fpenv.h"
#include "ts_gpu.h"
#include "ts_idx.h"
#include "ts_kernels.h"
#include "ts_log.h"
#include "ts_model.h"
#include "ts_observe.h"
#include "ts_trainer.h"

static volatile sig_atomic_t stop_requested = 0;
static ts_client_t *volatile signal_client = NULL; /* interrupted by the handler */

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
  if (signal_client) ts_client_interrupt(signal_client);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ps-worker -c FILE [--task N] [--set KEY=VALUE]...\n"
          "\n"
          "Trains the job's model as worker N of cluster.workers against the shards of\n"
          "cluster.ps, then prints one line:\n"
          "  done: task=T steps=S examples=E loss=L test_accuracy=A examples_per_sec=X\n"
          "        started_at=U0 finished_at=U1   (the training window, Unix seconds)\n"
          "to which the one worker that evaluated the job's final parameters, once every\n"
          "worker finished, appends final_test_accuracy=F.\n"
          "\n"
          "  -c, --config FILE     job file (libconfig)\n"
          "  -t, --task N          which worker (default: from TF_CONFIG's task)\n"
          "      --set KEY=VALUE   override a key, e.g. --set train.max_steps=200\n"
          "      --log-level LVL   crit|err|warn|notice|info|debug (default info)\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "Exit codes: 0 done (or stopped by SIGTERM/SIGINT, also while waiting for the\n"
          "shards), 1 runtime failure (also: a shard unreachable for job.connect_timeout_s),\n"
          "2 usage, 3 nothing to train (a sync job already at its last step), 78 bad configuration, data or device placement, or a job file that\n"
          "differs from the shards' (job.mode, cluster.workers, optimizer.*, model.*).\n");
}

/* Check the data against the model before anything is sent to a shard: a layer list is
 * checked on the images' shape (NHWC, one channel), the widths against the pixel count. */
static int check_data(const ts_config_t *cfg, const ts_dataset_t *train, const ts_dataset_t *test,
                      char *errmsg, size_t errlen) {
  size_t in = 0, classes = 0;
  if (cfg->num_net_layers > 0) {
    ts_layer_spec_t specs[TS_LAYERS_MAX];
    ts_layer_shape_t input = {train->rows, train->cols, 1};
    int rc = ts_backend_layers(cfg, input, specs, errmsg, errlen);
    if (rc < 0) return rc;
    const ts_config_layer_t *last = &cfg->net_layers[cfg->num_net_layers - 1];
    in = train->rows * train->cols;
    classes = (size_t)last->units;
  } else {
    in = (size_t)cfg->layers[0];
    classes = (size_t)cfg->layers[cfg->num_layers - 1];
  }
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

/* device.log_device_placement for the variables: each partition of each tensor on the
 * shard that holds it, in TensorFlow's format for a variable on a parameter server
 * ("fc1/weights: (VariableV2): /job:ps/replica:0/task:1/device:CPU:0"; a tensor cut in
 * several partitions is named as TensorFlow names a partitioned variable's parts,
 * "fc1/weights/part_0"). */
static void log_variable_placement(const ts_client_t *client, const ts_model_t *model) {
  size_t n = ts_client_num_parts(client);
  for (size_t k = 0; k < n; k++) {
    ts_client_part_t part, next;
    if (ts_client_part(client, k, &part) != 0 || part.tensor >= model->num_tensors) continue;
    bool split = part.part > 0 ||
                 (ts_client_part(client, k + 1, &next) == 0 && next.tensor == part.tensor);
    char suffix[32] = "";
    if (split) snprintf(suffix, sizeof suffix, "/part_%u", part.part);
    fprintf(stderr, "%s%s: (VariableV2): /job:ps/replica:0/task:%u/device:CPU:0\n",
            model->tensors[part.tensor].name, suffix, part.shard);
  }
}

/* A re-run of a finished job (or a worker joining at its last step): no "done:" line, whose
 * loss would be made up, and its own exit status. */
static int nothing_to_train(const ts_train_result_t *res) {
  ts_log_err("the job is at step %llu of %llu: nothing to train; raise train.epochs or "
             "train.max_steps, or psctl model reset",
             (unsigned long long)res->job_step, (unsigned long long)res->total_steps);
  return TS_EXIT_NOTHING_TO_TRAIN;
}

/* The CTR job (data.format "criteo"): declare, train, evaluate, the done: line with the
 * test AUC and log loss. Returns the exit code. */

static int run_ctr(const ts_config_t *cfg, long task, ts_ctr_t *m, uint64_t rows,
                   ts_client_t *client, ts_observe_t *obs) {
  char err[1024];
  int rc = ts_ctr_declare(m, client, (uint64_t)cfg->seed, err, sizeof err);
  if (rc < 0 && stop_requested) return TS_EXIT_OK;
  if (rc < 0) {
    ts_log_err("declaring the model: %s", err);
    return rc == TS_ESHAPE ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
  }
  ts_log_info("model [ctr] declared on %zu shard(s): %zu dense parameters in %zu tensors, %zu "
              "embedding table(s)", cfg->num_ps, m->net.desc.param_count, m->net.desc.num_tensors,
              m->num_tables);
  uint64_t per_epoch = rows / ((uint64_t)cfg->batch_size * cfg->num_workers);
  uint64_t planned = per_epoch * (uint64_t)cfg->epochs;
  if (cfg->max_steps > 0 && (uint64_t)cfg->max_steps < planned) planned = (uint64_t)cfg->max_steps;
  ts_observe_ready(obs, planned);
  ts_ctr_trainer_t t = {.cfg = cfg, .task = (int)task, .num_workers = (int)cfg->num_workers,
                        .model = m, .client = client, .train_rows = rows,
                        .stop = &stop_requested, .on_progress = ts_observe_progress,
                        .on_step = ts_observe_step, .on_activity = ts_observe_activity,
                        .progress_arg = obs};
  ts_train_result_t res;
  rc = ts_ctr_train(&t, &res, err, sizeof err);
  ts_observe_trained(obs);
  if (rc < 0) {
    ts_log_err("%s", err);
    return rc == TS_ECONFIG || rc == TS_EDATA ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
  }
  if (!res.stopped && res.nothing_to_train) return nothing_to_train(&res);
  if (!res.stopped) {
    printf("done: task=%ld steps=%llu examples=%llu loss=%.4f test_accuracy=%.4f "
           "examples_per_sec=%.1f started_at=%.3f finished_at=%.3f auc=%.6f logloss=%.6f\n",
           task, (unsigned long long)res.steps, (unsigned long long)res.examples, res.loss,
           res.test_accuracy, res.examples_per_sec, res.started_at, res.finished_at,
           res.test_auc, res.test_loss);
    fflush(stdout);
  }
  return TS_EXIT_OK;
}

int main(int argc, char **argv) {
  ts_kernels_cpu_reexec_for_core(argv); /* OpenBLAS's fastest kernels for this CPU */
  ts_fpenv_flush_denormals();            /* as TensorFlow's compute threads: ts_fpenv.h */
  static const ts_cli_spec_t spec = {.prog = "ps-worker", .id_name = "task",
                                     .id_role = TS_ROLE_WORKER, .usage = usage};
  ts_cli_t cli;
  ts_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  int exit_code = ts_cli_parse(&spec, argc, argv, &cli);
  if (exit_code < 0) exit_code = ts_cli_load(&spec, &cli, &cfg);
  long task = cli.id;
  ts_cli_free(&cli);
  if (exit_code >= 0) {
    ts_config_free(&cfg);
    return exit_code;
  }
  char err[1024];
  ts_dataset_t train = {0}, test = {0};
  ts_towers_t towers;
  memset(&towers, 0, sizeof towers);
  ts_client_t *client = NULL;
  ts_observe_t *obs = NULL;
  char *token = NULL;
  int rc;
  exit_code = TS_EXIT_CONFIG;

  /* data.format "criteo": the CTR model (worker/ts_ctr_train.h), on the CPU. */
  const bool ctr = strcmp(cfg.data_format, "criteo") == 0;
  ts_ctr_t ctr_model;
  memset(&ctr_model, 0, sizeof ctr_model);
  uint64_t ctr_rows = 0;
  if (ctr) {
    if (!cfg.train_path[0] || !cfg.test_path[0]) {
      ts_log_err("data.format \"criteo\" needs data.train_path and data.test_path");
      goto out;
    }
    if (ts_ctr_init(&ctr_model, cfg.net_layers, cfg.num_net_layers, (size_t)cfg.batch_size, err,
                    sizeof err) < 0 ||
        ts_criteo_count(cfg.train_path, &ctr_rows, err, sizeof err) < 0) {
      ts_log_err("%s", err);
      goto out;
    }
    ts_log_info("data: %llu training rows in %s (Criteo TSV)", (unsigned long long)ctr_rows,
                cfg.train_path);
  }
  /* Everything that can be wrong with the data or the model is found before any shard is
   * contacted, so a bad job never touches the parameter servers. */
  if (!ctr && (ts_idx_load_pair(cfg.train_images, cfg.train_labels, &train, err, sizeof err) < 0 ||
               ts_idx_load_pair(cfg.test_images, cfg.test_labels, &test, err, sizeof err) < 0 ||
               check_data(&cfg, &train, &test, err, sizeof err) < 0)) {
    ts_log_err("%s", err);
    goto out;
  }
  if (!ctr)
    ts_log_info("data: %zu training and %zu test examples of %zux%zu", train.n, test.n,
                train.rows, train.cols);
  if (getenv("TS_OPENBLAS_CORE_WAS"))
    ts_log_info("OpenBLAS: %s kernels (it chose %s, which this CPU outgrew; OPENBLAS_CORETYPE "
                "overrides)",
                getenv("OPENBLAS_CORETYPE"), getenv("TS_OPENBLAS_CORE_WAS"));
  /* Devices: placement of the ops (TensorFlow's rules), the back end and the towers
   * (worker/ts_backend.h). Evaluation runs in chunks of up to 1000 examples. */
  ts_layer_shape_t input = {train.rows, train.cols, 1}; /* NHWC: grey images */
  rc = ctr ? 0 : ts_backend_setup(&cfg, (int)task, input, 1000, &towers, err, sizeof err);
  if (rc < 0) {
    ts_log_err("%s", err);
    exit_code = rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
    goto out;
  }
  ts_model_t *model = &towers.models[0];
  char device[64];
  if (ctr)
    snprintf(device, sizeof device, "/job:worker/replica:0/task:%ld/device:CPU:0", task);
  else
    ts_backend_device_name(&towers, device, sizeof device);
  if (cfg.token_file && *cfg.token_file && !(token = ts_client_token_read(cfg.token_file, err, sizeof err))) {
    ts_log_err("%s", err);
    goto out;
  }

  /* The admin endpoint and the event file before any shard is contacted: a taken port or
   * an unwritable logdir stops the worker before it joins the job. */
  rc = ts_observe_start(&obs, &cfg, (int)task, err, sizeof err);
  if (rc < 0) {
    ts_log_err("%s", err);
    if (rc != TS_ECONFIG) exit_code = TS_EXIT_FAILURE;
    goto out;
  }
  ts_observe_set_device(obs, device);

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
  /* SIGPIPE: ignored, as it always was for ps-worker; the client library itself only
   * blocks it on its own thread. */
  signal(SIGPIPE, SIG_IGN);
  ts_client_opts_t o;
  ts_client_opts_init(&o);
  o.addrs = (const char *const *)cfg.ps;
  o.num_shards = cfg.num_ps;
  o.task = (int)task;
  o.identity = ident;
  o.token = token;
  if (cfg.tls) {
    o.tls_ca_file = cfg.tls_ca_file;
    o.tls_cert_file = cfg.tls_cert_file;
    o.tls_key_file = cfg.tls_key_file;
  }
  o.connect_timeout_s = cfg.connect_timeout_s;
  o.cancel = &stop_requested;
  /* The job as this worker's file has it: a shard whose file differs refuses it. */
  ts_config_job_setting_t job[TS_CONFIG_JOB_MAX];
  ts_client_job_setting_t job_kv[TS_CONFIG_JOB_MAX];
  size_t num_job = ts_config_job_settings(&cfg, job);
  for (size_t i = 0; i < num_job; i++) job_kv[i] = (ts_client_job_setting_t){job[i].key, job[i].value};
  o.job = job_kv;
  o.num_job = num_job;
  o.request_timeout_s = cfg.sync_timeout_s * 3.0 > 30.0 ? cfg.sync_timeout_s * 3.0 : 30.0;
  o.heartbeat_interval_s = cfg.heartbeat_interval_s;
  o.heartbeat_timeout_s = cfg.heartbeat_timeout_s;
  o.require_all = true;
  o.busy_poll_us = (uint32_t)cfg.busy_poll_us;
  o.log = ts_log_forward;
  o.log_level = TS_CLIENT_LOG_DEBUG;
  ts_log_info("connecting to %zu shard(s), waiting up to %g s (job.connect_timeout_s)",
              cfg.num_ps, cfg.connect_timeout_s);
  rc = ts_client_open(&client, &o, err, sizeof err);
  if (rc < 0 && stop_requested) {
    ts_log_notice("stopped by a signal while waiting for the shards");
    exit_code = TS_EXIT_OK;
    goto out;
  }
  if (rc == TS_EUNAVAIL) {
    ts_log_err("gave up after %g s (job.connect_timeout_s): %s", cfg.connect_timeout_s, err);
    goto out;
  }
  if (rc < 0) {
    ts_log_err("%s", err);
    if (rc == TS_EAUTH || rc == TS_ECONFIG) exit_code = TS_EXIT_CONFIG;
    goto out;
  }
  signal_client = client;
  ts_observe_set_client(obs, client);
  ts_client_set_device(client, device);
  if (stop_requested) ts_client_interrupt(client);
  if (ctr) {
    exit_code = run_ctr(&cfg, task, &ctr_model, ctr_rows, client, obs);
    goto out;
  }
  ts_client_tensor_t *decl = ts_calloc(model->num_tensors, sizeof *decl);
  if (!decl) goto out;
  for (size_t i = 0; i < model->num_tensors; i++) {
    decl[i].name = model->tensors[i].name;
    decl[i].shape = model->tensors[i].shape;
    decl[i].rank = model->tensors[i].rank;
    decl[i].init = (ts_client_init_t)model->tensors[i].init;
  }
  rc = ts_client_declare(client, decl, model->num_tensors, (uint64_t)cfg.seed, err, sizeof err);
  ts_free(decl);
  if (rc < 0 && stop_requested) {
    exit_code = TS_EXIT_OK;
    goto out;
  }
  if (rc < 0) {
    ts_log_err("declaring the model: %s", err);
    /* A model other than the one the job declared: this worker's job file is wrong. */
    if (rc == TS_ESHAPE) exit_code = TS_EXIT_CONFIG;
    goto out;
  }
  if (cfg.log_device_placement) log_variable_placement(client, model);
  ts_log_info("model [%s] declared on %zu shard(s): %zu parameters in %zu tensors",
              ts_model_engine_name(model), cfg.num_ps, model->param_count, model->num_tensors);

  uint64_t per_epoch = ts_trainer_steps_per_epoch(train.n, (int)cfg.num_workers, cfg.batch_size);
  uint64_t planned = per_epoch * (uint64_t)cfg.epochs;
  if (cfg.max_steps > 0 && (uint64_t)cfg.max_steps < planned) planned = (uint64_t)cfg.max_steps;
  ts_observe_ready(obs, planned);
  ts_trainer_t t = {.cfg = &cfg, .task = (int)task, .num_workers = (int)cfg.num_workers,
                    .train = &train, .test = &test, .model = model, .towers = &towers,
                    .client = client, .stop = &stop_requested, .on_progress = ts_observe_progress,
                    .on_step = ts_observe_step, .on_activity = ts_observe_activity,
                    .on_live = ts_observe_live,
                    .progress_arg = obs};
  ts_train_result_t res;
  rc = ts_trainer_run(&t, &res, err, sizeof err);
  ts_observe_trained(obs);
  ts_backend_log_memory(&towers);
  if (rc < 0) {
    ts_log_err("%s", err);
    exit_code = rc == TS_ECONFIG ? TS_EXIT_CONFIG : TS_EXIT_FAILURE;
    goto out;
  }
  exit_code = TS_EXIT_OK;
  if (!res.stopped && res.nothing_to_train) {
    exit_code = nothing_to_train(&res);
  } else if (!res.stopped) {
    /* The worker that evaluated the job's final parameters appends them. */
    char final[96] = "", workers[32] = "";
    if (res.workers > 0) snprintf(workers, sizeof workers, " workers=%u", res.workers);
    if (res.has_final) {
      ts_observe_final_accuracy(obs, res.global_step ? res.global_step : res.last_step,
                                res.final_test_accuracy);
      snprintf(final, sizeof final, " final_test_accuracy=%.6f", res.final_test_accuracy);
    }
    printf("done: task=%ld steps=%llu examples=%llu loss=%.4f test_accuracy=%.4f "
           "examples_per_sec=%.1f started_at=%.3f finished_at=%.3f%s%s\n",
           task, (unsigned long long)res.steps, (unsigned long long)res.examples, res.loss,
           res.test_accuracy, res.examples_per_sec, res.started_at, res.finished_at, workers, final);
    fflush(stdout);
  }
out:
  signal_client = NULL;
  ts_observe_set_client(obs, NULL);
  ts_client_close(client);
  ts_observe_stop(obs);
  ts_towers_destroy(&towers);
  ts_ctr_destroy(&ctr_model);
  ts_dataset_free(&train);
  ts_dataset_free(&test);
  ts_client_token_free(token);
  ts_config_free(&cfg);
  return exit_code;
}
