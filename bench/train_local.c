/*
 * train_local: the one-process compute ceiling of a training job (bench/train.sh).
 *
 * The same model code and CPU kernels as ps-worker (worker/ts_model.c over
 * ts_kernels_cpu(), OpenBLAS), the same batch assembly (a shuffled copy of B examples), and
 * the shard's optimizer loop (server/ts_optim.c, Adam by default) applied in place, with no
 * parameter server and no network. Prints, like ps-worker:
 *
 *   done: steps=S examples=E loss=L examples_per_sec=X
 *
 * usage: train_local [--layers 784,128,10] [--batch 64] [--steps 500] [--optimizer adam|sgd]
 *                    [--lr 0.002] [--data DIR]   (DIR holds Fashion-MNIST's IDX files)
 *                    [--config JOB]  (a job file's model.layers, a layer list such as
 *                    deploy/local/lenet5.cfg's, its optimizer and its
 *                    device.intra_op_parallelism_threads; options after it override)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ts_alloc.h"
#include "ts_config.h"
#include "ts_fpenv.h"
#include "ts_init.h"
#include "ts_idx.h"
#include "ts_kernels.h"
#include "ts_layers.h"
#include "ts_log.h"
#include "ts_model.h"
#include "ts_optim.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  ts_kernels_cpu_reexec_for_core(argv); /* as ps-worker: OpenBLAS's kernels for this CPU */
  ts_fpenv_flush_denormals();            /* as ps-worker and ps-server */
  int widths[TS_MODEL_MAX_LAYERS] = {784, 128, 10};
  size_t nw = 3;
  int batch = 64;
  long steps = 500;
  const char *data = "/usr/share/datasets/fashion-mnist";
  ts_optim_t opt = {.kind = TS_OPT_ADAM, .lr = 0.002f, .beta1 = 0.9f, .beta2 = 0.999f,
                    .epsilon = 1e-8f};
  ts_config_t cfg;
  bool have_cfg = false;
  char err[512];
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (strcmp(a, "--config") == 0) {
      if (have_cfg) ts_config_free(&cfg);
      if (ts_config_load(&cfg, v, NULL, NULL, 0, err, sizeof err) < 0) {
        fprintf(stderr, "train_local: %s\n", err);
        return 2;
      }
      have_cfg = true;
      ts_optim_from_config(&opt, &cfg);
      opt.decay = TS_DECAY_NONE; /* the schedule's length is the job's, not this run's */
      ts_kernels_cpu_set_threads(cfg.intra_op_threads);
      batch = cfg.batch_size;
    } else if (strcmp(a, "--layers") == 0) {
      nw = 0;
      for (char *s = (char *)v; *s && nw < TS_MODEL_MAX_LAYERS;) {
        widths[nw++] = (int)strtol(s, &s, 10);
        if (*s == ',') s++;
        else break;
      }
    } else if (strcmp(a, "--batch") == 0) {
      batch = atoi(v);
    } else if (strcmp(a, "--steps") == 0) {
      steps = atol(v);
    } else if (strcmp(a, "--optimizer") == 0) {
      opt.kind = strcmp(v, "sgd") == 0 ? TS_OPT_SGD : TS_OPT_ADAM;
    } else if (strcmp(a, "--lr") == 0) {
      opt.lr = strtof(v, NULL);
    } else if (strcmp(a, "--data") == 0) {
      data = v;
    } else {
      fprintf(stderr, "train_local: unknown option %s\n", a);
      return 2;
    }
  }
  if (batch < 1 || steps < 1) {
    fprintf(stderr, "train_local: --batch and --steps must be positive\n");
    return 2;
  }
  ts_log_init("train_local", TS_LOG_WARN);
  char img[512], lab[512];
  snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", data);
  snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", data);
  ts_dataset_t train;
  memset(&train, 0, sizeof train);
  if (ts_idx_load_pair(img, lab, &train, err, sizeof err) < 0) {
    fprintf(stderr, "train_local: %s\n", err);
    return 1;
  }
  size_t dim = train.rows * train.cols;
  ts_model_t m;
  int rc;
  if (have_cfg && cfg.num_net_layers > 0) {
    ts_layer_spec_t specs[TS_LAYERS_MAX];
    ts_layer_shape_t in = {train.rows, train.cols, 1};
    rc = ts_layers_from_config(cfg.net_layers, cfg.num_net_layers, specs, err, sizeof err);
    if (rc == 0)
      rc = ts_model_init_seq(&m, specs, cfg.num_net_layers, in, (size_t)batch, ts_kernels_cpu(),
                             err, sizeof err);
  } else {
    rc = ts_model_init(&m, widths, nw, TS_ACT_RELU, (size_t)batch, ts_kernels_cpu(), err,
                       sizeof err);
  }
  if (have_cfg) ts_config_free(&cfg);
  if (rc < 0 || ts_model_init_params(&m, 42) < 0) {
    fprintf(stderr, "train_local: %s\n", err);
    return 1;
  }
  float *s0 = calloc(m.param_count, sizeof(float));
  float *s1 = calloc(m.param_count, sizeof(float));
  float *bx = malloc((size_t)batch * dim * sizeof(float));
  int32_t *by = malloc((size_t)batch * sizeof(int32_t));
  uint32_t *perm = malloc(train.n * sizeof(uint32_t));
  if (!s0 || !s1 || !bx || !by || !perm) {
    fprintf(stderr, "train_local: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < train.n; i++) perm[i] = (uint32_t)i;
  srand(42);
  for (size_t i = train.n; i > 1; i--) {
    size_t j = (size_t)rand() % i;
    uint32_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
  size_t per_epoch = train.n / (size_t)batch;
  double loss_sum = 0;
  const double t0 = now_s();
  for (long k = 0; k < steps; k++) {
    size_t base = (size_t)k % per_epoch * (size_t)batch;
    for (int i = 0; i < batch; i++) {
      uint32_t e = perm[base + (size_t)i];
      memcpy(bx + (size_t)i * dim, train.x + (size_t)e * dim, dim * sizeof *bx);
      by[i] = train.labels[e];
    }
    float loss = 0;
    if (ts_model_forward_backward(&m, bx, by, (size_t)batch, &loss) < 0) {
      fprintf(stderr, "train_local: forward/backward failed at step %ld\n", k);
      return 1;
    }
    ts_optim_apply(&opt, m.params, m.grads, 1.0f, m.param_count, s0, s1, (uint64_t)k + 1);
    loss_sum += (double)loss;
  }
  double secs = now_s() - t0;
  printf("done: steps=%ld examples=%ld loss=%.4f examples_per_sec=%.1f params=%zu\n", steps,
         steps * batch, loss_sum / (double)steps, (double)(steps * batch) / secs, m.param_count);
  free(s0);
  free(s1);
  free(bx);
  free(by);
  free(perm);
  ts_model_destroy(&m);
  ts_dataset_free(&train);
  return 0;
}
