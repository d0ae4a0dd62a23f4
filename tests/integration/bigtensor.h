/*
 * The fixture of the push-path tests: a model of one tensor "big" of parts x part_floats
 * float32 values (zeros at first), with `parts` partitions when job.partition_bytes is
 * part_floats x 4. Helpers open a worker on it, make filled buffers and check what a pull
 * returns, partition by partition. They assert with cmocka.
 */
#ifndef TS_BIGTENSOR_H
#define TS_BIGTENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "calls.h"

typedef struct {
  size_t parts, part_floats, n;
  uint64_t shape[2];
  ts_client_tensor_t model;
} ts_big_t;

void ts_big_init(ts_big_t *b, size_t parts, size_t part_floats);

/* A worker client of task `task` on every shard of c with the model declared.
 * heartbeat_interval_s 0 = no heartbeats (else a 10 s heartbeat timeout). */
ts_client_t *ts_big_worker(ts_cluster_t *c, const ts_big_t *b, int task, const char *identity,
                           double request_timeout_s, double heartbeat_interval_s);

/* Start a one-shard async job of num_workers workers, partitioned as b, whose optimizer is
 * SGD at learning rate 1 (a push of -1 adds exactly 1); server_cfg goes inside the server
 * group. Asserts that it started. */
void ts_big_start_async(ts_cluster_t *c, const ts_big_t *b, int num_workers,
                        const char *server_cfg);

/* A malloc'd buffer of b->n values v. */
float *ts_big_filled(const ts_big_t *b, float v);

/* Pull, and check that every value of partition p equals want[p]. */
void ts_big_expect_parts(const ts_big_t *b, ts_client_t *cl, const float *want);

/* cl pushes -1 everywhere, then pulls: *value goes up by 1 and every value must equal it
 * (a job of ts_big_start_async); neither request may take longer than held_max_s. */
void ts_big_step(const ts_big_t *b, ts_client_t *cl, float *value, double held_max_s);

/* Every partition of w holds one value throughout (a reply never carries a half-applied
 * update when the updates move whole partitions by equal amounts). */
bool ts_big_parts_uniform(const ts_big_t *b, const float *w);

#endif
