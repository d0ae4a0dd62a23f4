/*
 * What a worker shows the outside: its admin HTTP endpoint on cluster.workers[task]
 * (/metrics, /livez, /readyz, /status), TensorBoard event files in train.logdir, and
 * systemd notifications (READY, STATUS, WATCHDOG).
 *
 * It is the trainer's observer (ts_trainer.h): ts_observe_step after every step and
 * ts_observe_progress at every log interval and at the end, both on the training thread,
 * which is the thread every ts_observe_* call comes from. Each change is published to the
 * admin endpoint (obs/ts_admin.h, the worker's role of it) as a snapshot the HTTP thread
 * renders from; the HTTP thread never touches the trainer (CONTRIBUTING.md).
 *
 * Event files go to train.logdir/RUN/worker-T/{train,validation}/ as Keras's TensorBoard
 * callback lays them out (RUN: train.run_name, or the worker's start time), opened by
 * ts_observe_ready so a start that fails leaves none: train/ holds epoch_loss,
 * epoch_accuracy (the training accuracy), epoch_learning_rate (the rate applied at that step) and examples/sec at every log
 * interval; validation/ holds epoch_accuracy and epoch_loss on the test set at the end,
 * and on the worker that evaluated the job's final parameters final_test_accuracy; each at
 * the step it was reached (the job's step in sync mode).
 */
#ifndef TS_OBSERVE_H
#define TS_OBSERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/client.h"
#include "ts_config.h"
#include "ts_trainer.h"

typedef struct ts_observe ts_observe_t;

/* Start the endpoint of worker `task` and, when train.logdir is set, check it (its event
 * files are opened by ts_observe_ready).
 * Returns 0; TS_ECONFIG for an address that does not parse or resolve, or an event
 * directory that cannot be created or written, a bad train.run_name; a negative errno when the port cannot be bound; with
 * errmsg. cfg must outlive the observer. */
int ts_observe_start(ts_observe_t **out, const ts_config_t *cfg, int task, char *errmsg,
                     size_t errlen);

/* The worker has declared its model and trains: /readyz answers 200 and systemd hears
 * READY=1. */
void ts_observe_ready(ts_observe_t *o, uint64_t total_steps);

/* The device the model really runs on ("/cpu:0" after soft placement moved it off a GPU):
 * /status shows it as "device". */
void ts_observe_set_device(ts_observe_t *o, const char *device);

/* Trainer callbacks; arg is the ts_observe_t. */
void ts_observe_progress(void *arg, const ts_progress_t *p);
void ts_observe_step(void *arg, uint64_t step, const double phase_s[3]);


/* Trainer callback (ts_activity_cb): what the training loop does. /livez answers 503
 * "training loop stuck: no progress for S s (train.stall_timeout_s T): <what it does>;
 * since then: <the last retry's reason>" once no progress came for
 * ts_config_stall_timeout_s, between ts_observe_ready and ts_observe_trained. What counts
 * as progress is the trainer's (ts_trainer.c): each phase of a step, the final pull and
 * evaluation, and each answer from shard 0 while a finished worker waits for the others. A
 * wait that wakes up to retry an unreachable shard is not progress, so a worker whose
 * shard is stopped is called stuck, with that shard named; a sync pull held by a barrier
 * is bounded by job.sync_timeout_s, below the threshold. */
void ts_observe_activity(void *arg, bool progress, const char *what);

/* The client whose shards /livez's 503 names when they are not connected ("; not connected:
 * shard 1 (HOST:PORT): WHY"): a request waiting for a shard to come back blocks the loop
 * without a retry to report. The HTTP thread asks the client (which has its own lock),
 * never the trainer. NULL detaches it, and must come before the client closes. */
void ts_observe_set_client(ts_observe_t *o, ts_client_t *client);

/* Trainer callback (on_live): after every step; draws the live progress line when stderr
 * is a terminal (ts_progress_line.h), else does nothing. */
void ts_observe_live(void *arg, const ts_progress_t *p);

/* The training loop returned: /livez no longer judges it; the progress line is erased. */
void ts_observe_trained(ts_observe_t *o);

/* This worker evaluated the job's final parameters: /status's final_test_accuracy and the
 * TensorBoard scalar final_test_accuracy at `step`. */
void ts_observe_final_accuracy(ts_observe_t *o, uint64_t step, double accuracy);

/* Stop the endpoint, close the event file, free. NULL is ignored. */
void ts_observe_stop(ts_observe_t *o);


#endif
