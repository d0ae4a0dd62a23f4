/*
 * The store's own view of a partition (ts_store.h): for ts_store.c, ts_store_part.c and the
 * store's unit tests only. Everything else in the shard goes through ts_store.h's functions,
 * so a second kind of unit (a table's rows) fits behind the same calls.
 */
#ifndef TS_STORE_INT_H
#define TS_STORE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "ts_plan.h"
#include "ts_store.h"

struct ts_spart {
  const ts_part_t *plan;
  float *w;             /* parameters, plan->count values */
  float *s0, *s1;       /* optimizer state (NULL when the optimizer needs none) */
  float *accum;         /* sync: sum of this step's gradients */
  uint32_t held_pushes; /* async/ssp: pushes waiting for the writers to finish (the server
                          keeps new pulls of p waiting meanwhile, so pushes never starve) */
  uint64_t version;
  uint64_t updates;     /* optimizer steps taken (Adam's t) */
  uint32_t accum_n;     /* sync: gradients in accum */
  uint32_t skip_n;      /* sync: workers whose gradient for this version was refused */
  uint8_t *contributed; /* sync: per task, 1 when it pushed for this version */
  uint64_t opened_ms;   /* sync: when the first gradient of this version arrived */
  int writers;
  bool apply_pending; /* sync: the barrier is complete; apply when writers reaches 0 */
  bool unset;         /* waits for its initial values (Declare.values_follow) */
};

#endif
