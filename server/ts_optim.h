/*
 * Optimizers applied on the shard (docs/architecture.md): pure loops over one partition.
 *
 * `scale` multiplies the gradient first (1/n when n gradients were summed for a sync step).
 * State buffers (velocity, Adam moments) have the partition's length and live beside it.
 */
#ifndef TS_OPTIM_H
#define TS_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ts_config.h"

typedef struct {
  ts_optimizer_t kind;
  float lr, momentum, beta1, beta2, epsilon;
  ts_decay_t decay; /* the learning rate's schedule (optimizer.decay) */
  uint64_t decay_steps;
  double decay_rate, decay_alpha;
  int staircase;
} ts_optim_t;

void ts_optim_from_config(ts_optim_t *o, const ts_config_t *cfg);

/* How many state buffers of the partition's length the optimizer needs (0, 1 or 2). */
int ts_optim_state_buffers(const ts_optim_t *o);

/* The learning rate of update t (1-based, as ts_optim_apply's t): optimizer.learning_rate
 * on optimizer.decay's schedule, which starts from the first update (t - 1 = 0). */
float ts_optim_rate(const ts_optim_t *o, uint64_t t);

/* Apply one step to w[0..n) from gradient g. s0/s1 are the state buffers (may be NULL when
 * ts_optim_state_buffers says so). t is the 1-based update count of this partition (Adam's
 * bias correction, and the learning rate's schedule: ts_optim_rate). */
void ts_optim_apply(const ts_optim_t *o, float *restrict w, const float *restrict g, float scale,
                    size_t n, float *restrict s0, float *restrict s1, uint64_t t);

/* True when every value of g[0..n) is finite. */
int ts_optim_all_finite(const float *g, size_t n);

#endif
