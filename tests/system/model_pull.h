/* The parameters a job's shards hold, pulled as a model lays them out (tests/system and
 * tests/gpu: a test compares them, or evaluates them, once the workers are done). */
#ifndef TS_TESTS_MODEL_PULL_H
#define TS_TESTS_MODEL_PULL_H

#include <stdint.h>

#include "harness.h"
#include "ts_model.h"

/* Declares m's tensors on c's shards (initialized from seed, as the job's workers declared
 * them) under identity (NULL: none), and pulls them all: m->param_count floats in m's
 * parameter order (tensor t at m->tensors[t].offset). calloc'd, the caller frees. Fails the
 * running cmocka test when a step fails. */
float *ts_pull_model_params(ts_cluster_t *c, const ts_model_t *m, uint64_t seed,
                            const char *identity);

#endif
