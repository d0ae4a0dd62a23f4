/*
 * The shard store: the tensors a job declared, the partitions of them this shard holds,
 * their optimizer state and, in sync mode, the per-partition barrier (docs/architecture.md).
 *
 * Glossary:
 *   partition  a contiguous slice of one tensor (proto/ts_plan.h), the unit of placement,
 *              versioning and the sync barrier
 *   version    how many updates the partition has had; a sync push for step t counts
 *              towards the barrier of version t
 *   writer     a pull reply being written from the partition's memory; updates wait until
 *              the partition has none, so no reply ever carries a half-applied update
 *
 * The store does no I/O and takes the time as an argument, so the barrier is testable
 * without a network or sleeping. It is used from the server's loop thread only.
 */
#ifndef TS_STORE_H
#define TS_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera.pb-c.h"
#include "ts_config.h"
#include "ts_init.h"
#include "ts_optim.h"
#include "ts_plan.h"

typedef struct {
  char *name;
  uint64_t shape[8];
  size_t rank;
  uint64_t elems;
  ts_init_kind_t init;
  bool state; /* a state tensor (TENSOR_STATE): pushes carry values, kept as their mean */
} ts_tensor_t;

typedef struct {
  const ts_part_t *plan;
  float *w;            /* parameters, plan->count values */
  float *s0, *s1;      /* optimizer state (NULL when the optimizer needs none) */
  float *accum;        /* sync: sum of this step's gradients */
  uint32_t held_pushes; /* async/ssp: pushes waiting for the writers to finish (the server
                          keeps new pulls of p waiting meanwhile, so pushes never starve) */
  uint64_t version;
  uint64_t updates;    /* optimizer steps taken (Adam's t) */
  uint32_t accum_n;    /* sync: gradients in accum */
  uint32_t skip_n;     /* sync: workers whose gradient for this version was refused */
  uint8_t *contributed; /* sync: per task, 1 when it pushed for this version */
  uint64_t opened_ms;  /* sync: when the first gradient of this version arrived */
  int writers;
  bool apply_pending;  /* sync: the barrier is complete; apply when writers reaches 0 */
  bool unset;          /* waits for its initial values (Declare.values_follow) */
} ts_spart_t;

typedef struct {
  uint32_t shard, num_shards, num_workers;
  ts_mode_t mode;
  uint64_t partition_bytes;
  uint64_t max_model_bytes; /* server.max_model_bytes: the budget of ts_store_prepare */
  ts_optim_t optim;

  bool declared;
  uint64_t seed;
  ts_tensor_t *tensors;
  uint32_t num_tensors;
  ts_plan_t plan;
  ts_spart_t *parts;   /* this shard's partitions, in plan order */
  size_t num_parts;
  int32_t *local;      /* plan index -> index in parts, or -1 */
  uint64_t bytes;      /* parameter bytes held */
  uint64_t state_bytes; /* optimizer state + accumulators */

  uint64_t applied;    /* updates applied (all partitions): optimizer steps and assigns */
  uint64_t stale_dropped;
  size_t awaiting;     /* partitions still waiting for their initial values (unset) */
} ts_store_t;

void ts_store_init(ts_store_t *s, const ts_config_t *cfg, uint32_t shard);
void ts_store_free(ts_store_t *s);

/* A model on its way into the store. Declaring is three steps, so that the allocation and
 * initialisation, the slow part, can leave the loop (server/ts_model.c):
 *   ts_store_prepare  (loop)        check the Declare and the budget, plan; no partition
 *                                   memory yet
 *   ts_store_build    (any thread)  allocate and initialise this shard's partitions; touches
 *                                   nothing but the model
 *   ts_store_install  (loop)        the model becomes the store's
 * ts_store_model_free releases a model at any step (and is safe on a zeroed one). */
typedef struct {
  uint64_t seed;
  ts_tensor_t *tensors;
  uint32_t num_tensors;
  ts_plan_t plan;
  ts_spart_t *parts; /* this shard's partitions, in plan order; memory from ts_store_build */
  size_t num_parts;
  int32_t *local;
  uint64_t bytes, state_bytes; /* as in ts_store_t, once built */
  uint64_t need_bytes;         /* what ts_store_prepare counted against the budget */
  /* what the build needs from the store, copied so it runs off the loop */
  uint32_t num_workers;
  ts_mode_t mode;
  int nstate;
  bool values_follow; /* the Declare's: partitions are left unset for the chief's values */
} ts_store_model_t;

/* What declaring d would make this shard allocate, in bytes: its partitions' parameters,
 * optimizer state (ts_optim_state_buffers per partition), sync accumulators and
 * per-partition bookkeeping, plus the tensor list and partition table every shard keeps.
 * `parts` is this shard's share of the plan's partitions and `param_bytes` their
 * parameter bytes. Pure; saturates at UINT64_MAX instead of wrapping. */
uint64_t ts_store_model_bytes(uint64_t param_bytes, size_t parts, size_t total_parts,
                              uint32_t num_tensors, int nstate, bool sync, uint32_t num_workers);

/* Check Declare d against the store (which must have no model), the budget
 * (s->max_model_bytes) and plan it into *m. Returns 0, TS_ESHAPE (a tensor listed twice),
 * TS_ETOOBIG (over the budget: errmsg names server.max_model_bytes and both sizes; nothing
 * was allocated beyond the tensor list), TS_EINVAL (over 4096 tensors, a rank over 8, or
 * no plan) or TS_ENOMEM, with errmsg. On failure *m is empty. */
int ts_store_prepare(const ts_store_t *s, const Tessera__Declare *d, ts_store_model_t *m,
                     char *errmsg, size_t errlen);

/* Allocate and initialise the partitions of a prepared model. Thread-safe: it reads and
 * writes only *m. Returns 0 or TS_ENOMEM (with errmsg; the partitions allocated so far stay
 * in *m for ts_store_model_free). */
int ts_store_build(ts_store_model_t *m, char *errmsg, size_t errlen);

/* Make a built model the store's (which must have none); *m is left empty. */
void ts_store_install(ts_store_t *s, ts_store_model_t *m);

/* Free whatever *m holds and empty it. */
void ts_store_model_free(ts_store_model_t *m);

/* When the store has a model: 0 when d declares the same one, else TS_ESHAPE with the
 * difference in errmsg. m may be a prepared model instead (m != NULL: compare with it). */
int ts_store_same_model(const ts_store_t *s, const ts_store_model_t *m,
                        const Tessera__Declare *d, char *errmsg, size_t errlen);

/* Drop the model and its optimizer state: the next declare defines it anew. The caller
 * makes sure nothing points into the partitions (no pull reply being written, no push held
 * or parked pull). */
void ts_store_reset(ts_store_t *s);

/* Declare the model, all three steps at once on the calling thread (checkpoint restore,
 * tests). The first call creates and initialises this shard's partitions (*created =
 * true); later calls must list the same tensors with the same shapes, seed and
 * initializers (else TS_ESHAPE with the difference in errmsg). TS_ETOOBIG over the
 * budget, TS_ENOMEM when the partitions do not fit. */
int ts_store_declare(ts_store_t *s, const Tessera__Declare *d, bool *created, char *errmsg,
                     size_t errlen);

/* The partition (tensor, part) if this shard holds it, else NULL. */
ts_spart_t *ts_store_find(ts_store_t *s, uint32_t tensor, uint32_t part);

/* Check a slice list against the store: every slice names a partition this shard holds and
 * its count equals the partition's size. Returns 0, TS_ENOTDECLARED, TS_ENOTENSOR or
 * TS_ESHAPE with errmsg. */
int ts_store_check_slices(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n,
                          char *errmsg, size_t errlen);

/* Check that none of the slices names a partition still waiting for its initial values.
 * Returns 0, or TS_ENOTREADY with errmsg. */
int ts_store_check_ready(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n,
                         char *errmsg, size_t errlen);

/* Replace p's values with v (a Push of kind ASSIGN or ASSIGN_INITIAL; initial: only while
 * p is unset). Returns false, changing nothing, while a pull reply is being written from p
 * (the caller retries as for ts_store_async_push); else true with *result:
 * PUSH_APPLIED (replaced), PUSH_DUPLICATE (initial, but p's values were set already) or
 * PUSH_STALE (sync: p's barrier is open, the job is between a step's pushes). The optimizer
 * state and the version stay. */
bool ts_store_assign(ts_store_t *s, ts_spart_t *p, const float *v, bool initial,
                     Tessera__PushResult *result);

/* Lowest version over this shard's partitions (0 when none). */
uint64_t ts_store_min_version(const ts_store_t *s);

/* Async/ssp: apply gradient g to p now and return true; or, when a reply is being written
 * from p (writers > 0), change nothing and return false: the caller keeps g and tries again
 * once ts_store_writer_done says p is free. */
bool ts_store_async_push(ts_store_t *s, ts_spart_t *p, const float *g);

/* Sync: count gradient g of `task` for `step` towards p's barrier. Returns
 * TESSERA__PUSH_RESULT__PUSH_ACCUMULATED, ..._STALE (step < version; counted in
 * stale_dropped) or ..._DUPLICATE (task already pushed this step). `step` must not be ahead
 * of the version (the caller checks: TS_EFUTURE). `need` is how many gradients close the
 * barrier now: when it is 1 and g is the first, g is applied straight away (no pass through
 * the accumulator) and the result is ..._APPLIED. */
Tessera__PushResult ts_store_sync_push(ts_store_t *s, ts_spart_t *p, const float *g, int task,
                                       uint64_t step, uint64_t now_ms, uint32_t need);

/* Sync: `task` pushed a gradient for `step` that was refused (NaN or Inf): it counts as
 * heard from, with nothing to add, so the barrier does not wait for it. Returns true when
 * it was counted (step is the open version and the task had not pushed). */
bool ts_store_sync_skip(ts_store_t *s, ts_spart_t *p, int task, uint64_t step, uint64_t now_ms);

/* Sync: gradients and refusals counted towards p's open barrier. */
uint32_t ts_store_sync_count(const ts_spart_t *p);

/* Sync: close p's barrier with the gradients it has (at least one): average, apply (now,
 * or when its writers finish), move to the next version. Returns true when applied now. */
bool ts_store_sync_complete(ts_store_t *s, ts_spart_t *p);

/* A pull reply written from p finished; runs a sync update that waited for it. Returns true
 * when an update was applied. Async pushes that waited (ts_store_async_push returned false)
 * are the caller's to retry once p->writers is 0. */
bool ts_store_writer_done(ts_store_t *s, ts_spart_t *p);

/* The wire form of a training mode (Hello, handshake reply, status, checkpoints). */
Tessera__Mode ts_store_wire_mode(ts_mode_t mode);

#endif
