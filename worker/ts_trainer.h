/*
 * The training loop of one worker (docs/architecture.md): pull -> forward/backward -> push, in
 * the job's mode, over a seed-reproducible slice of each epoch, then an evaluation.
 *
 * Data order: each epoch has one global permutation of the training set, computed from
 * (model.seed, epoch) alike by every worker. Global step k of an epoch covers positions
 * [k W B, (k+1) W B) of it and worker T takes the B examples at k W B + T B; so W workers
 * with batch B see exactly what one worker with batch W B sees, step for step. The last
 * partial group of an epoch is dropped, so every worker makes the same number of steps and
 * no barrier waits for a worker that ran out of data.
 *
 * Data path of a step (worker/ts_towers.h): the batch's copies to the towers start first, so
 * they overlap the pull; the pull lands in the towers' staging (the CPU back end's parameters
 * themselves, pinned host memory for a GPU) and is copied to every tower; the towers compute
 * their micro-batches, their gradients are averaged, and one push leaves from the staging.
 * The pull of the next step travels with that push (a TS_CLIENT_PUSH_PULL request: one round trip
 * instead of two), except after the last step, so the push phase of a step's timing
 * includes the next step's pull.
 */
#ifndef TS_TRAINER_H
#define TS_TRAINER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tessera/client.h"
#include "ts_config.h"
#include "ts_idx.h"
#include "ts_model.h"
#include "ts_towers.h"

typedef struct {
  uint64_t steps;             /* training steps this worker made */
  uint64_t examples;          /* training examples it processed */
  double loss;                /* mean training loss over the last log interval */
  double test_accuracy;
  double test_loss;
  double examples_per_sec;    /* over the whole run */
  double seconds;
  double started_at, finished_at; /* the training window, Unix seconds (wall clock: comparable
                                   * across the workers of a job, for its window) */
  uint64_t stale;             /* partitions of this worker's pushes dropped as stale */
  int stopped;                /* 1 when a signal stopped the run early */
  bool has_auc;               /* a CTR model (worker/ts_ctr_train.h): */
  double test_auc, train_auc; /* the test rows' AUC; the last log interval's training AUC */
  bool nothing_to_train;      /* sync: the job was at or past its last step when this worker
                                 joined (job_step, of total_steps): it made no step */
  uint64_t job_step, total_steps;
  bool has_final;             /* this worker reported the job's final accuracy: */
  double final_test_accuracy; /* on the parameters pulled once every worker finished */
  uint32_t workers;           /* workers that took part, as shard 0 counts them at the end
                                 (0: unknown) */
  uint32_t num_workers;       /* of the job's */
  uint64_t last_step;         /* the step of the last report: the job's step in sync mode,
                                 this worker's in async and ssp */
  uint64_t global_step;       /* the job's step of the final parameters (TensorBoard's
                                 step): last_step in sync mode; in async and ssp their
                                 version */
} ts_train_result_t;

/* What the trainer reports at every log interval and once at the end (final = true, with
 * the test results). Observers (metrics, TensorBoard event files) hook in here. */
typedef struct {
  uint64_t step;              /* steps done: the job's (global) step in sync mode, this
                                 worker's in async and ssp */
  uint64_t first_step;        /* the step this worker started from (a worker joining a
                                 running sync job starts at its step) */
  uint64_t global_step;       /* the job's step (TensorFlow's global_step), where the
                                 scalars are written: step in sync mode; in async and ssp
                                 the updates the pulled parameters had, plus this worker's
                                 push (0: step) */
  uint64_t total_steps;
  uint64_t epoch;             /* 0-based epoch of the last step */
  double epoch_progress;      /* 0..1 within that epoch */
  double loss;                /* mean training loss over the interval */
  double train_accuracy;      /* the interval's batches classified right, before each update */
  double examples_per_sec;    /* over the interval */
  double learning_rate;       /* the rate the shards applied at this step (optimizer.decay) */
  double seconds;             /* since training started */
  double phase_s[3];          /* time in pull, compute, push over the interval */
  bool final;
  double test_accuracy, test_loss; /* when final */
  double auc;                 /* a CTR model: the interval's training AUC (progressive
                               * validation), or the test AUC when final; 0 otherwise */
} ts_progress_t;

typedef void (*ts_progress_cb)(void *arg, const ts_progress_t *p);

/* Called after every step with the seconds that step spent in pull, compute and push
 * (for the step-duration histograms). Must be cheap: it runs on the training thread. */
typedef void (*ts_step_cb)(void *arg, uint64_t step, const double phase_s[3]);

/* What the training thread is doing, for /livez (worker/ts_observe.h): called when it
 * enters a phase (progress = true: the loop advanced) and when a wait wakes up without
 * getting anywhere (progress = false: a retry; what says why, naming the shard). Must be
 * cheap: it runs on the training thread. */
typedef void (*ts_activity_cb)(void *arg, bool progress, const char *what);

typedef struct {
  const ts_config_t *cfg;
  int task;
  int num_workers;
  const ts_dataset_t *train;
  const ts_dataset_t *test;
  ts_model_t *model;            /* the model when towers is NULL (one tower, borrowed) */
  ts_towers_t *towers;          /* the worker's towers (worker/ts_towers.h); may be NULL */
  ts_client_t *client;
  volatile sig_atomic_t *stop;  /* set by a signal handler: finish the step and leave */
  ts_progress_cb on_progress;   /* may be NULL */
  ts_step_cb on_step;           /* may be NULL */
  ts_activity_cb on_activity;   /* may be NULL */
  ts_progress_cb on_live;       /* may be NULL: after every step, with that step's loss and
                                   no rate (ts_progress_line.h) */
  void *progress_arg;           /* passed to every callback above */
} ts_trainer_t;

/* Seconds of clock id (CLOCK_MONOTONIC for durations, CLOCK_REALTIME for Unix times). */
double ts_trainer_clock_s(clockid_t id);

/* How long a training loop keeps retrying a request while shards are unreachable, and
 * which failures it retries: a connection closed or not up yet, a deadline, a shard that
 * restarted without its model (the client declares it again). Every loop (this one,
 * worker/ts_ctr_train.h) retries the same way: every 0.2 s (ts_trainer_sleep_s), logging
 * the first failure. */
#define TS_TRAINER_RETRY_GRACE_S 120.0
bool ts_trainer_transient(int rc);
void ts_trainer_sleep_s(double s);

/* After a step of `batch` examples with the given loss and stale partitions: marks are the
 * times it started pulling, computing, pushing and ended; its phases go to phase (the
 * interval's pull, compute, push seconds) and to on_step (may be NULL), its counts to res
 * and the interval's. Shared by every training loop (this one, worker/ts_ctr_train.h). */
void ts_trainer_count_step(const double marks[4], uint64_t step, float loss, uint64_t batch,
                           uint64_t stale, double phase[3], double *interval_loss,
                           uint64_t *interval_steps, uint64_t *interval_examples,
                           ts_train_result_t *res, ts_step_cb on_step, void *arg);

/* Steps per epoch for n examples, W workers of batch B (0 when one step does not fit). */
uint64_t ts_trainer_steps_per_epoch(size_t n, int workers, int batch);

/* The permutation of epoch `epoch` of n examples into perm[0..n). */
void ts_trainer_epoch_order(uint64_t seed, uint64_t epoch, uint32_t *perm, size_t n);

/* Train, then pull the final parameters and evaluate on the test set. The model must be
 * declared on the client. Returns 0 (also when stopped by a signal: res->stopped), or an
 * error with errmsg when the shards stay unreachable or refuse a request.
 *
 * Then the job's final accuracy: the worker waits until shard 0 counts every worker
 * finished (done, or silent for job.heartbeat_timeout_s) and, when shard 0 chose it
 * (ts_client_job_end: the first done worker to ask then, once per job), pulls the
 * parameters again, now that nobody pushes any more, evaluates them (res->has_final,
 * res->final_test_accuracy) and sends the result to the shards. A failure there is logged
 * and leaves res->has_final false; it does not fail the run. */
int ts_trainer_run(const ts_trainer_t *t, ts_train_result_t *res, char *errmsg, size_t errlen);

#endif
