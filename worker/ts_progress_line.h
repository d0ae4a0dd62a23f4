/*
 * The live progress line of a worker on a terminal: step/total, epoch, examples/s, loss and
 * the time left, redrawn in place (base/ts_log.h's status line, so log lines written
 * meanwhile are not garbled) at most ten times a second. Rates and loss are smoothed over
 * the last seconds of steps. Used from the training thread only.
 */
#ifndef TS_PROGRESS_LINE_H
#define TS_PROGRESS_LINE_H

#include <stdint.h>

#include "ts_trainer.h"

typedef struct ts_progress_line ts_progress_line_t;

/* A progress line for worker `task` of batch `batch`, or NULL when stderr is not a
 * terminal (or is journald's), or out of memory: then ps-worker only logs. */
ts_progress_line_t *ts_progress_line_new(int task, int batch);

/* After every step: p->step, total_steps, epoch, epoch_progress, loss (that step's) and
 * seconds (since training started). Redraws when 0.1 s passed since the last drawing. */
void ts_progress_line_step(ts_progress_line_t *pl, const ts_progress_t *p);

/* Erase the line and free. NULL is ignored. */
void ts_progress_line_free(ts_progress_line_t *pl);

#endif
