/*
 * The learning rate's schedule (optimizer.decay): one formula for the shards, which apply
 * it to every update, and the workers, which report the rate of each step (TensorBoard,
 * /metrics, the log). Pure functions.
 */
#ifndef TS_SCHEDULE_H
#define TS_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "ts_config.h"

typedef struct {
  ts_decay_t decay;     /* TS_DECAY_NONE: lr for every update */
  float lr;             /* optimizer.learning_rate */
  uint64_t decay_steps; /* at least 1 */
  double decay_rate;    /* exponential: the factor per decay_steps updates */
  bool staircase;       /* exponential: in whole steps of decay_steps */
  double decay_alpha;   /* cosine: the final rate, as a fraction of lr */
} ts_schedule_t;

/* The schedule of a job file's optimizer group. */
void ts_schedule_from_config(ts_schedule_t *s, const ts_config_t *cfg);

/* The learning rate of update t (1-based: the rate that made step t), on the schedule that
 * starts from the first update (t - 1 = 0); t = 0 is taken as 1. */
float ts_schedule_rate(const ts_schedule_t *s, uint64_t t);

#endif
