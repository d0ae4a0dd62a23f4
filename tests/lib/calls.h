/*
 * Blocking one-call requests for the tests, on the public request API of
 * include/tessera/client.h (ts_client_run), so that the tests written against the old
 * per-variant calls assert the same things: each builds one ts_client_req_t over the whole
 * model (or a list of partitions) and copies its results out.
 */
#ifndef TS_TEST_CALLS_H
#define TS_TEST_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/client.h"

/* A push's outcome: the request's counts and, for a push+pull, each part's rc. */
typedef struct {
  uint64_t applied, accumulated, stale, duplicate;
  int push_rc, pull_rc;
} tc_result_t;

/* Pull every tensor into dst (min_version may be TS_CLIENT_VERSION_NEXT); *version
 * (optional) gets the lowest version pulled, on success. */
int tc_pull(ts_client_t *c, float *const *dst, uint64_t min_version, uint64_t clock,
            uint64_t *version, char *errmsg, size_t errlen);

/* Push every tensor's gradient tagged with step (may be TS_CLIENT_STEP_PULLED). */
int tc_push(ts_client_t *c, const float *const *grad, uint64_t step, tc_result_t *res,
            char *errmsg, size_t errlen);

/* Push only the listed plan partitions. */
int tc_push_parts(ts_client_t *c, const float *const *grad, const size_t *parts, size_t n,
                  uint64_t step, tc_result_t *res, char *errmsg, size_t errlen);

/* Push then pull in one round trip. */
int tc_push_pull(ts_client_t *c, const float *const *grad, uint64_t step, float *const *dst,
                 uint64_t min_version, uint64_t clock, uint64_t *version, tc_result_t *res,
                 char *errmsg, size_t errlen);

/* Partitions of tensor t, and partitions held by shard s, in the declared plan. */
size_t tc_tensor_parts(const ts_client_t *c, uint32_t t);
size_t tc_shard_parts(const ts_client_t *c, uint32_t s);

/* Shard options with struct_size set and the client's logs sent to ts_log. */
void tc_opts(ts_client_opts_t *o, const char *const *addrs, size_t num_shards);

/* Push a gradient of n values v (one tensor), times times. Returns 0, or the negative
 * code after saying why on stderr. */
int tc_push_filled(ts_client_t *c, float v, size_t n, int times);

/* tc_opts for an admin client, or worker task 0, that needs every shard (require_all),
 * connects within 5 s and waits 10 s for a request. */
void tc_opts_role(ts_client_opts_t *o, const char *const *addrs, size_t num_shards, bool admin);

/* A client of the shards at addrs with tc_opts_role's options: an admin client, or worker
 * task 0 declaring model's n tensors with seed. NULL (having said why) when that fails. */
ts_client_t *tc_open_role(const char *const *addrs, size_t num_shards, bool admin,
                          const ts_client_tensor_t *model, size_t n, uint64_t seed);

/* Open a client with options o into *cl and, when model is not NULL, declare its n tensors
 * with seed. Returns 0, or the negative code after saying on stderr which step failed and
 * why (*cl may then hold an open client, the caller's to close). */
int tc_open(ts_client_t **cl, const ts_client_opts_t *o, const ts_client_tensor_t *model,
            size_t n, uint64_t seed);
/* The same with a model of n embedding tables alone. */
int tc_open_tables(ts_client_t **cl, const ts_client_opts_t *o, const ts_client_table_t *tables,
                   size_t n, uint64_t seed);

/* Ask shard `shard` of the num_shards at addrs for a checkpoint over an admin connection
 * (no token): 0 with its file in path, or the negative code after saying why on stderr. */
int tc_checkpoint(const char *const *addrs, size_t num_shards, uint32_t shard, char *path,
                  size_t n);

#endif
