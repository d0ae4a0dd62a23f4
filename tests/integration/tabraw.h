/*
 * Embedding tables in raw frames, for the integration tests that speak to real ps-server
 * shards without the client library (test_tables.c, test_ckpt_tables.c): frames read
 * whole, a Declare of tables only (seed TT_SEED), SparsePull and SparsePush, shard status,
 * the keys of one shard. They assert with cmocka.
 */
#ifndef TS_TABRAW_H
#define TS_TABRAW_H

#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "tessera.pb-c.h"

#define TT_SEED 11
#define TT_PUSH_ID 8 /* the request id of tt_send_push's pushes */

typedef struct {
  int type;
  uint8_t meta[8192];
  uint32_t meta_len;
  uint8_t *data; /* malloc'd payload (NULL when none) */
  uint64_t data_len;
} tt_frame_t;

typedef struct {
  int result;
  uint64_t rows, filtered;
} tt_push_reply_t;

/* Read one frame with its payload; the type, or -1. */
int tt_read_frame(int fd, tt_frame_t *f);

/* The code of an Error frame f (its detail into detail), else 0. */
int tt_error_of(const tt_frame_t *f, char *detail, size_t n);

/* A table of width dim, uniform(0.05) initializer, optimizer opt at learning rate lr. */
Tessera__TableDecl tt_table_decl(const char *name, uint32_t dim, Tessera__RowOptimizer opt,
                                 double lr);

/* Declare tables t[0..n) (no tensors); 0 or the error's code (detail into detail). */
int tt_declare(int fd, Tessera__TableDecl *t, size_t n, char *detail, size_t dn);

/* Send a SparsePull of keys[0..n) (request id, min_version; 10 s timeout). */
void tt_send_pull(int fd, uint64_t id, uint32_t table, const uint64_t *keys, size_t n,
                  uint64_t min_version);

/* The reply to a pull: 0 with rows (n x dim) and *version, or the error's code. */
int tt_read_pull(int fd, float *rows, size_t n, uint32_t dim, uint64_t *version, char *detail,
                 size_t dn);

/* The same for the reply (or Error) to request `id` (asserted; 0: any). */
int tt_read_pull_of(int fd, uint64_t id, float *rows, size_t n, uint32_t dim, uint64_t *version,
                    char *detail, size_t dn);

/* Both: 0 with rows, or the error's code. */
int tt_pull(int fd, uint32_t table, const uint64_t *keys, size_t n, uint32_t dim, float *rows,
            uint64_t *version, char *detail, size_t dn);

/* Send a SparsePush of n rows of gradients (push_id 0: none). */
void tt_send_push(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                  const uint64_t *keys, const float *grads, size_t n);

/* ... with pull_request_id pull_id: a push+pull in one frame (async mode). */
void tt_send_push_pull(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                       uint64_t pull_id, const uint64_t *keys, const float *grads, size_t n);

/* ... as piece `piece` of its push (SparsePush.piece). */
void tt_send_push_piece(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                        uint64_t pull_id, uint32_t piece, const uint64_t *keys, const float *grads,
                        size_t n);

/* A SparsePush of n rows of which only the first `sent` records are sent (the caller then
 * closes the connection: a push cut off mid-frame). */
void tt_send_push_cut(int fd, uint32_t table, uint32_t dim, uint64_t step, uint64_t push_id,
                      const uint64_t *keys, const float *grads, size_t n, size_t sent);

/* The reply to a push: 0 with *out (may be NULL), or the error's code. */
int tt_read_push(int fd, tt_push_reply_t *out, char *detail, size_t dn);

/* Both. */
int tt_push(int fd, uint32_t table, uint32_t dim, uint64_t step, const uint64_t *keys,
            const float *grads, size_t n, tt_push_reply_t *out, char *detail, size_t dn);

/* A page of table 0's keys from row slot 0 (TableKeys, max_keys): the reply (free with
 * tessera__table_keys_reply__free_unpacked), its payload's length into *data_len. */
Tessera__TableKeysReply *tt_keys_page(int fd, uint64_t max_keys, uint64_t *data_len);

/* The shard's status (free with tessera__shard_status__free_unpacked). */
Tessera__ShardStatus *tt_status(int fd);

/* n keys of shard `shard` of num_shards, ascending, from `from` on. */
void tt_shard_keys(uint64_t *out, size_t n, uint32_t shard, uint32_t num_shards, uint64_t from);

/* A raw worker connection of task to shard (asserted). */
int tt_worker(ts_cluster_t *c, int shard, int task);

#endif
