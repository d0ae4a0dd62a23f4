/*
 * The CTR training loop of ps-worker (data.format "criteo", docs/embeddings.md): the model
 * of worker/ts_ctr.h, its dense layers a flat layout pulled and pushed as every model's,
 * its embedding rows pulled and pushed per batch through the client library's sparse
 * requests.
 *
 * Data order: the training file's own order, read as a stream. Global step k covers rows
 * [k W B, (k+1) W B) of an epoch and worker T takes the B at k W B + T B (it reads past the
 * others'), so W workers with batch B see what one worker with batch W B sees; the rows of
 * an epoch after its last whole group are dropped. Each epoch reads the file again.
 *
 * A step: every table's keys of the batch and the dense layers are pulled together (sync:
 * each shard's next version), forward and backward run, the dense gradient and every
 * table's row gradients are pushed together (sync: tagged with the versions pulled).
 * Progressive validation: the batch's click probabilities before its update give the
 * training AUC of each log interval. At the end the test file is evaluated: log loss, AUC
 * and accuracy at 0.5.
 */
#ifndef TS_CTR_TRAIN_H
#define TS_CTR_TRAIN_H

#include <signal.h>

#include "tessera/client.h"
#include "ts_config.h"
#include "ts_ctr.h"
#include "ts_trainer.h"

typedef struct {
  const ts_config_t *cfg;
  int task;
  int num_workers;
  ts_ctr_t *model;
  ts_client_t *client;
  uint64_t train_rows; /* counted before (ts_criteo_count) */
  volatile sig_atomic_t *stop;
  ts_progress_cb on_progress; /* may be NULL */
  ts_step_cb on_step;         /* may be NULL */
  ts_activity_cb on_activity; /* may be NULL */
  void *progress_arg;
} ts_ctr_trainer_t;

/* Declare the dense layers' tensors and the embedding tables (rows uniform in
 * [-0.05, 0.05), as Keras's Embedding; the job's optimizer row-wise). Returns 0 or the
 * client's error with errmsg. */
int ts_ctr_declare(const ts_ctr_t *m, ts_client_t *client, uint64_t seed, char *errmsg,
                   size_t errlen);

/* Train, then evaluate on data.test_path: res->test_loss (log loss), res->test_auc,
 * res->test_accuracy. Returns 0 (also when stopped: res->stopped) or an error with errmsg. */
int ts_ctr_train(const ts_ctr_trainer_t *t, ts_train_result_t *res, char *errmsg, size_t errlen);

#endif
