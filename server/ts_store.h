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
#include "ts_store_table.h"

typedef struct {
  char *name;
  uint64_t shape[8];
  size_t rank;
  uint64_t elems;
  ts_init_kind_t init;
  bool state; /* a state tensor (TENSOR_STATE): pushes carry values, kept as their mean */
} ts_tensor_t;

/* A partition this shard holds: opaque outside the store (ts_store_int.h). */
typedef struct ts_spart ts_spart_t;

typedef struct {
  uint32_t shard, num_shards, num_workers;
  ts_mode_t mode;
  uint64_t partition_bytes;
  uint64_t max_model_bytes; /* server.max_model_bytes: the budget of ts_store_prepare */
  ts_optim_t optim;
  char job_name[64]; /* job.name ("" when unset; a copy: the store outlives the configuration) */

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

  /* Embedding tables (ts_store_table.h), in declared order, and the budget they share
   * (server.max_table_bytes). A model may have tables and no tensors. */
  ts_stable_t *tables;
  uint32_t num_tables;
  ts_stable_budget_t table_budget;
} ts_store_t;

void ts_store_init(ts_store_t *s, const ts_config_t *cfg, uint32_t shard);
void ts_store_free(ts_store_t *s);

/* A model on its way into the store. Declaring is three steps, so that the allocation and
 * initialisation, the slow part, can leave the loop (server/ts_declare.c):
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
  ts_stable_t *tables; /* the Declare's tables (rows come later: nothing to build) */
  uint32_t num_tables;
} ts_store_model_t;

/* What declaring d would make this shard allocate, in bytes: its partitions' parameters,
 * optimizer state (ts_optim_state_buffers per partition), sync accumulators and
 * per-partition bookkeeping, plus the tensor list and partition table every shard keeps.
 * `parts` is this shard's share of the plan's partitions and `param_bytes` their
 * parameter bytes. Pure; saturates at UINT64_MAX instead of wrapping. */
uint64_t ts_store_model_bytes(uint64_t param_bytes, size_t parts, size_t total_parts,
                              uint32_t num_tensors, int nstate, bool sync, uint32_t num_workers);

/* Check Declare d against the store (which must have no model), the budget
 * (s->max_model_bytes) and plan it into *m, its tables made (ts_stables_make: empty, and
 * TS_ESHAPE for a table listed twice, TS_ECONFIG for one without a row optimizer). A
 * Declare may list no tensors when it lists tables. Returns 0, TS_ESHAPE (a tensor listed twice),
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

/* When the store has a model: 0 when d declares the same one (tensors and tables), else
 * TS_ESHAPE with the difference in errmsg. m may be a prepared model instead (m != NULL: compare with it). */
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
 * are the caller's to retry once ts_store_busy says p is free. */
bool ts_store_writer_done(ts_store_t *s, ts_spart_t *p);

/* --- The interface of a unit of the store ------------------------------------------ *
 * Push receive, pull replies, the wait queue, the sync barrier glue, status and
 * checkpoints use these (and the ts_store_t fields as read-only facts: mode, declared,
 * num_parts, num_tensors, tensors, plan, awaiting), never a partition's fields. A unit is a
 * dense partition today; another kind of unit answers the same calls. */

/* Partition i (< s->num_parts) of this shard, in plan order; and back. */
ts_spart_t *ts_store_part_at(const ts_store_t *s, size_t i);
size_t ts_store_part_index(const ts_store_t *s, const ts_spart_t *p);

/* What a checkpoint holds of a unit, and where it lives: its place in its tensor, version
 * and update count, and its buffers (values, then nstate optimizer state buffers), which a
 * snapshot reads and a restore into an undeclared-then-declared store writes. */
typedef struct {
  uint32_t tensor, part;
  uint64_t offset, count;
  uint64_t version, updates;
  float *bufs[3];
  int nstate;
} ts_store_record_t;
void ts_store_record(const ts_store_t *s, const ts_spart_t *p, ts_store_record_t *r);
/* A restore wrote p's buffers: its version and update count come with them. */
void ts_store_restored(ts_spart_t *p, uint64_t version, uint64_t updates);

/* Floats a push or pull of p carries; the most of any unit of the shard (0 when none). */
uint64_t ts_store_part_count(const ts_spart_t *p);
uint64_t ts_store_max_part_count(const ts_store_t *s);
uint64_t ts_store_part_version(const ts_spart_t *p);
/* The unit with the lowest version (NULL when none): the one a sync step waits on. */
ts_spart_t *ts_store_oldest_part(ts_store_t *s);

/* Sync: refuse a gradient push for a step no slice has reached. Returns 0, or TS_EFUTURE
 * with errmsg naming the first such unit. The slices were checked (ts_store_check_slices). */
int ts_store_check_step(ts_store_t *s, Tessera__PartSlice *const *slices, size_t n, uint64_t step,
                        char *errmsg, size_t errlen);

/* Pulls. A unit is ready for a pull when no update waits on it and it is at min_version.
 * A reply is sent from the unit's own memory: ts_store_read_begin counts a writer and
 * returns the values (ts_store_part_count floats), valid until the matching
 * ts_store_writer_done; no update lands on a unit while it has a writer. */
bool ts_store_pull_ready(const ts_spart_t *p, uint64_t min_version);
const float *ts_store_read_begin(ts_spart_t *p);
/* An update waits for p's writers: a push held on it, or a closed sync step to apply. */
bool ts_store_update_waiting(const ts_spart_t *p);

/* Pushes held back by writers (the caller keeps the payload and retries). busy: a writer is
 * on p. hold/unhold count a push waiting on p (new pulls of p wait behind it, so it never
 * starves); held_free: p has held pushes and no writer left, so they may go on. */
bool ts_store_busy(const ts_spart_t *p);
void ts_store_hold(ts_spart_t *p);
void ts_store_unhold(ts_spart_t *p);
bool ts_store_held_free(const ts_spart_t *p);
/* Anything points into the units (a writer or a held push): the model cannot be dropped. */
bool ts_store_in_use(const ts_store_t *s);

/* Sync: the tasks counted towards p's open step (num_workers bytes, 1 = counted), when its
 * first gradient came, and whether the step is closed but waits for writers to apply. */
const uint8_t *ts_store_contributed(const ts_spart_t *p);
uint64_t ts_store_opened_ms(const ts_spart_t *p);
bool ts_store_sync_pending(const ts_spart_t *p);

/* The table of index i, or NULL (no model, or i out of range). */
ts_stable_t *ts_store_table(ts_store_t *s, uint32_t i);

/* Windows of push ids a client has on this shard (ts_pushid.h): one per partition, then
 * one per table and piece of a push (SparsePush.piece: its pieces are applied once each). */
size_t ts_store_pushid_units(const ts_store_t *s);
/* The window of table's pushes' piece. */
size_t ts_store_pushid_unit(const ts_store_t *s, uint32_t table, uint32_t piece);

/* The wire form of a training mode (Hello, handshake reply, status, checkpoints). */
Tessera__Mode ts_store_wire_mode(ts_mode_t mode);

#endif
