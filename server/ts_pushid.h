/*
 * Which pushes a shard has applied, so that a push sent again (a client's retry after a lost
 * connection or a timeout) is applied at most once (docs/architecture.md, "Retried pushes").
 *
 * Glossary:
 *   client   one incarnation of a client library instance (ts_client_t): a random 64-bit
 *            number it sends with every push (Push.client_incarnation), new each time a
 *            worker starts, so a restarted worker is never taken for its former self
 *   push id  Push.push_id: numbered by the client from 1 up, one per push request and the
 *            same on every shard; a retry carries the id of the push it repeats. 0 = the
 *            push has no id (older clients): it is always applied
 *   slot     what a shard remembers of one client of one worker task: per partition of the
 *            shard, a window of push ids
 *   window   the highest id applied to the partition (top) and a bitmap of the 64 ids below
 *            it, as IPsec's anti-replay window (RFC 4303, 3.4.3): an id above top is new; an
 *            id in the window is new when its bit is clear; an id below the window cannot be
 *            told apart and is taken as already applied (a retry that comes 64 pushes late)
 *
 * Memory is bounded by the job, not by peers: cluster.workers tasks x
 * server.push_dedup_clients slots x the shard's partitions x 16 bytes. A slot is allocated
 * when its client's first push with an id arrives; a client beyond a task's
 * server.push_dedup_clients takes the slot least recently used (an eviction: that client's
 * retries are then no longer recognised).
 *
 * This module is pure: no libuv, no sockets, no logging (tests/unit/test_pushid.c). Used
 * from the server's loop thread only.
 */
#ifndef TS_PUSHID_H
#define TS_PUSHID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One partition's window. */
typedef struct {
  uint64_t top;  /* highest id applied (0: none yet) */
  uint64_t bits; /* bit k set: id top - 1 - k was applied */
} ts_pushid_window_t;

/* A push whose frame was cut off (its connection lost) after some of its records were
 * applied: a table's push, its records in strictly ascending key order, so "every record up
 * to key `key`" says what went in. Its retry applies only the records after it. */
typedef struct {
  uint64_t id;   /* the push id (0: none) */
  size_t unit;   /* the window it belongs to (ts_store_pushid_unit) */
  uint64_t key;  /* the last key applied */
} ts_pushid_part_t;

typedef struct {
  bool used;
  uint64_t client;          /* its incarnation */
  ts_pushid_part_t part;    /* its push applied in part, the latest one */
  uint64_t last_use;        /* ts_pushid_t.clock at its last lookup (least recently used) */
  ts_pushid_window_t *wins; /* num_parts windows (owned), NULL until first used */
} ts_pushid_slot_t;

typedef struct {
  uint32_t num_workers;    /* tasks */
  uint32_t per_worker;     /* slots per task (server.push_dedup_clients; 0 = off) */
  size_t num_parts;        /* windows per slot: the shard's partitions */
  ts_pushid_slot_t *slots; /* num_workers x per_worker (owned) */
  uint64_t clock;          /* counts lookups, for least recently used */
  uint64_t evictions;      /* slots taken from another client */
  uint64_t bytes;          /* memory held: the slots and their windows */
} ts_pushid_t;

/* An empty table for num_workers tasks of per_worker slots each (per_worker 0: duplicate
 * detection is off and ts_pushid_lookup always returns NULL). Returns 0 or TS_ENOMEM. */
int ts_pushid_init(ts_pushid_t *t, uint32_t num_workers, uint32_t per_worker);

/* Free everything; t may then be initialised again. */
void ts_pushid_free(ts_pushid_t *t);

/* Forget every client (the model was dropped or replaced): the memory of the windows is
 * freed, the slots stay. */
void ts_pushid_reset(ts_pushid_t *t);

/* The windows of client `client` of worker `task` over a model of num_parts partitions:
 * its slot, or a free one, or the least recently used slot of the task taken over (then
 * *evicted is set true; evicted may be NULL). A change of num_parts (a new model) forgets
 * every client first. Returns NULL when detection is off, task is out of range or the
 * memory cannot be had (the push is then applied without detection). The pointer stays
 * valid until the next call of any ts_pushid_* function on t. */
ts_pushid_window_t *ts_pushid_lookup(ts_pushid_t *t, int task, uint64_t client, size_t num_parts,
                                     bool *evicted);

/* The record of client `client`'s push applied in part, looked up (and its slot taken) as
 * ts_pushid_lookup does; NULL where that returns NULL. A client is one connection to the
 * shard at a time, so one frame at most is cut off before its retry: one record a client. */
ts_pushid_part_t *ts_pushid_lookup_part(ts_pushid_t *t, int task, uint64_t client,
                                        size_t num_parts);

/* Whether push id `id` was applied to the window's partition (or is below the window: taken
 * as applied). False for id 0. */
bool ts_pushid_seen(const ts_pushid_window_t *w, uint64_t id);

/* Record that push id `id` (not 0) was applied to the window's partition. */
void ts_pushid_record(ts_pushid_window_t *w, uint64_t id);

#endif
