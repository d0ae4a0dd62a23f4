/*
 * Requests of embedding tables (include/tessera/client.h, TS_CLIENT_SPARSE_*): a caller's
 * key list, in any order and with duplicates, becomes one key list per shard.
 *
 * In async mode a push+pull goes to a shard in one frame where it can (SparsePush's
 * pull_request_id): the shard reads each row as it applies its gradient, so it looks each
 * key up once, and the keys cross the wire once.
 *
 * On the caller's thread (ts_cl_sparse_prepare) the keys are sorted, deduplicated and
 * grouped by the shard proto/ts_key.h names for each, ascending within a shard as the wire
 * requires, with each distinct key's list of the caller's places. On the client thread
 * each shard gets its push (in async mode up to TS_MSG_MAX_PUSH_PIECES frames: SparsePush's
 * piece) and its pulls, a pull cut into requests whose replies stay under
 * TS_MSG_SPARSE_PULL_CUT. A push's records are made as each frame is sent: a distinct key
 * and its gradient rows summed in the caller's order, so the sums do not depend on timing.
 * Each reply lands in one buffer in the distinct keys' order and its rows go to the
 * caller's places at once (scatter_rows), a key listed twice its row twice.
 *
 * Versions. A table has a version per shard; what was last pulled of it from each shard
 * (c->table_pulled) tags a push made with TS_CLIENT_STEP_PULLED and makes the next
 * TS_CLIENT_VERSION_NEXT pull wait for the step after it, as the dense partitions' pulled
 * version does. In sync mode every shard is sent the push and the pull, with no keys where
 * the caller has none of its rows, so every shard's barrier counts the worker and every
 * pull waits for the step; in ssp mode every shard is sent the push, so every shard knows
 * each worker's clock for the staleness bound of its pulls.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_client_int.h"
#include "ts_err.h"
#include "ts_key.h"
#include "ts_msg.h"
#include "ts_sort.h"

/* Most keys one request may list (client.h). */
#define MAX_CALLER_KEYS (UINT64_C(1) << 26)

/* --- memory ------------------------------------------------------------------------
 * A request's arrays are carved from one block, its arena. When the request is done the
 * arena goes to its client's cache (two blocks at most, the larger ones kept), where the
 * next request of at most that size finds it: a worker sending batches of similar size
 * touches no fresh pages after its first steps (fresh pages cost a tenth of the client's
 * time otherwise: page faults and zeroing, bench/RESULTS.md section 17). The cache holds
 * at most twice the memory of the largest recent request. An arena of 2 MiB or more is on
 * transparent huge pages (ts_huge_alloc), as the shard's buffers are: the sums, the scatter
 * and the kernel's copies walk its records and rows with a TLB miss every 2 MiB. */

#define ALIGN 64

static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* An arena of at least need bytes: the smallest cached one that fits, or a new one. */
static void *arena_take(ts_client_t *c, size_t need, size_t *cap) {
  int best = -1;
  uv_mutex_lock(&c->mu);
  for (int i = 0; i < 2; i++)
    if (c->arena[i] && c->arena_cap[i] >= need &&
        (best < 0 || c->arena_cap[i] < c->arena_cap[best]))
      best = i;
  void *p = NULL;
  if (best >= 0) {
    p = c->arena[best];
    *cap = c->arena_cap[best];
    c->arena[best] = NULL;
    c->arena_cap[best] = 0;
  }
  uv_mutex_unlock(&c->mu);
  if (!p && (p = ts_huge_alloc(need))) *cap = need;
  return p;
}

/* Keep an arena for a later request (the two largest stay), or free it. */
static void arena_give(ts_client_t *c, void *p, size_t cap) {
  if (!p) return;
  uv_mutex_lock(&c->mu);
  int slot = !c->arena[0] ? 0 : !c->arena[1] ? 1 : c->arena_cap[0] < c->arena_cap[1] ? 0 : 1;
  void *drop = NULL;
  size_t drop_cap = 0;
  if (!c->arena[slot] || c->arena_cap[slot] < cap) {
    drop = c->arena[slot];
    drop_cap = c->arena_cap[slot];
    c->arena[slot] = p;
    c->arena_cap[slot] = cap;
  } else {
    drop = p;
    drop_cap = cap;
  }
  uv_mutex_unlock(&c->mu);
  ts_huge_free(drop, drop_cap);
}

void ts_cl_sparse_cache_free(ts_client_t *c) {
  for (int i = 0; i < 2; i++) {
    ts_huge_free(c->arena[i], c->arena_cap[i]);
    c->arena[i] = NULL;
    c->arena_cap[i] = 0;
  }
}

void ts_cl_sparse_free(ts_cl_sparse_t *sp) {
  if (!sp) return;
  arena_give(sp->c, sp->arena, sp->arena_cap);
  ts_free(sp);
}

/* prepare's temporaries, carved from the arena after the request's own arrays */
typedef struct {
  uint64_t *skey;   /* the caller's keys sorted, */
  uint32_t *sidx;   /* and each one's index in the caller's order */
  void *sort;       /* ts_sort_keys's scratch */
  uint64_t *sorted;
  uint32_t *shard_of, *place, *run; /* run: where each distinct key's run in skey starts */
  size_t *fill;
} scratch_t;

/* Carve the arena: the request's arrays into sp, the temporaries into *t. With arena NULL,
 * only count: returns the bytes needed. */
static size_t carve(ts_cl_sparse_t *sp, char *arena, uint32_t nshards, bool pull, bool push,
                    scratch_t *t) {
  size_t n = sp->nkeys ? sp->nkeys : 1, at = 0;
#define TAKE(ptr, bytes)                                    \
  do {                                                      \
    if (arena) ptr = (void *)(arena + at);                  \
    at += align_up(bytes);                                  \
  } while (0)
  TAKE(sp->ukeys, n * sizeof *sp->ukeys);
  TAKE(sp->at, (n + 1) * sizeof *sp->at);
  TAKE(sp->pos, n * sizeof *sp->pos);
  TAKE(sp->shard_off, ((size_t)nshards + 1) * sizeof *sp->shard_off);
  TAKE(sp->sent, nshards);
  TAKE(sp->answered, nshards);
  if (pull) TAKE(sp->rows, n * sp->dim * sizeof(float));
  if (push) TAKE(sp->records, n * (size_t)ts_msg_sparse_record_bytes(sp->dim));
  TAKE(t->skey, n * sizeof *t->skey);
  TAKE(t->sidx, n * sizeof *t->sidx);
  TAKE(t->sort, ts_sort_scratch_bytes(n));
  TAKE(t->sorted, n * sizeof *t->sorted);
  TAKE(t->shard_of, n * sizeof *t->shard_of);
  TAKE(t->place, n * sizeof *t->place);
  TAKE(t->run, (n + 1) * sizeof *t->run);
  TAKE(t->fill, ((size_t)nshards + 1) * sizeof *t->fill);
#undef TAKE
  return at;
}

/* Sort the caller's keys, keep the distinct ones grouped by shard (ascending within each),
 * and list each distinct key's callers' indices (sp->at, sp->pos). */
static void group_keys(ts_cl_sparse_t *sp, const int64_t *keys, uint32_t nshards,
                       const scratch_t *t) {
  size_t n = sp->nkeys;
  const uint64_t *skey = t->skey;
  ts_sort_keys((const uint64_t *)(const void *)keys, n, t->sort, t->skey, t->sidx);
  /* Distinct keys in ascending order, each with the start of its run in skey. */
  size_t u = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == 0 || skey[i] != skey[i - 1]) {
      t->sorted[u] = skey[i];
      t->run[u++] = (uint32_t)i;
    }
  }
  t->run[u] = (uint32_t)n;
  sp->nuniq = u;
  /* Stable counting sort by shard: ascending order stays within each shard. */
  memset(sp->shard_off, 0, ((size_t)nshards + 1) * sizeof *sp->shard_off);
  for (size_t k = 0; k < u; k++) {
    t->shard_of[k] = ts_key_shard(t->sorted[k], nshards);
    sp->shard_off[t->shard_of[k] + 1]++;
  }
  for (uint32_t s = 0; s < nshards; s++) sp->shard_off[s + 1] += sp->shard_off[s];
  memcpy(t->fill, sp->shard_off, nshards * sizeof *t->fill);
  sp->at[0] = 0;
  for (size_t k = 0; k < u; k++) {
    size_t at = t->fill[t->shard_of[k]]++;
    sp->ukeys[at] = t->sorted[k];
    t->place[k] = (uint32_t)at;
    sp->at[at + 1] = t->run[k + 1] - t->run[k];
  }
  for (size_t p = 0; p < u; p++) sp->at[p + 1] += sp->at[p];
  for (size_t k = 0; k < u; k++) {
    uint32_t *dst = sp->pos + sp->at[t->place[k]];
    for (uint32_t i = t->run[k]; i < t->run[k + 1]; i++) *dst++ = t->sidx[i];
  }
}

/* dst += g over dim floats (distinct arrays: the loop vectorises). */
static void add_row(float *restrict dst, const float *restrict g, uint32_t dim) {
  for (uint32_t j = 0; j < dim; j++) dst[j] += g[j];
}

/* The caller's rows are read and written in the order of the distinct keys, so at random
 * places: each is prefetched this many of the caller's keys ahead. */
#define PREFETCH_AHEAD 8

static void prefetch_row(const float *row, size_t bytes, int write) {
  for (size_t b = 0; b < bytes; b += 64) {
    if (write)
      __builtin_prefetch((const char *)row + b, 1);
    else
      __builtin_prefetch((const char *)row + b, 0);
  }
}

/* The records of distinct keys [off, off + count): each key, then the sum of its rows'
 * gradients in the caller's order (the first copied, the later ones added). Made by the
 * client thread as it sends them, piece by piece: the shard applies one piece while the
 * next is made. */
static void make_records(ts_cl_sparse_t *sp, size_t off, size_t count) {
  size_t rec = (size_t)ts_msg_sparse_record_bytes(sp->dim), row = sp->dim * sizeof(float);
  const float *grad = sp->grad;
  uint32_t n = sp->at[off + count];
  for (size_t p = off; p < off + count; p++) {
    uint8_t *r = sp->records + p * rec;
    float *dst = (float *)(void *)(r + 8);
    memcpy(r, &sp->ukeys[p], 8);
    for (uint32_t j = sp->at[p]; j < sp->at[p + 1]; j++) {
      if (j + PREFETCH_AHEAD < n)
        prefetch_row(grad + (size_t)sp->pos[j + PREFETCH_AHEAD] * sp->dim, row, 0);
      const float *g = grad + (size_t)sp->pos[j] * sp->dim;
      if (j == sp->at[p])
        memcpy(dst, g, row);
      else
        add_row(dst, g, sp->dim);
    }
  }
}

/* The pulled rows of distinct keys [off, off + n) into the caller's places. */
static void scatter_rows(const ts_cl_sparse_t *sp, size_t off, size_t n) {
  size_t row = sp->dim * sizeof(float);
  uint32_t end = sp->at[off + n];
  for (size_t p = off; p < off + n; p++) {
    const float *src = sp->rows + p * sp->dim;
    for (uint32_t j = sp->at[p]; j < sp->at[p + 1]; j++) {
      if (j + PREFETCH_AHEAD < end)
        prefetch_row(sp->dst + (size_t)sp->pos[j + PREFETCH_AHEAD] * sp->dim, row, 1);
      memcpy(sp->dst + (size_t)sp->pos[j] * sp->dim, src, row);
    }
  }
}

int ts_cl_sparse_prepare(ts_client_t *c, const ts_client_req_t *req, ts_cl_op_t *op,
                         const char **why) {
  bool pull = req->kind == TS_CLIENT_SPARSE_PULL || req->kind == TS_CLIENT_SPARSE_PUSH_PULL;
  bool push = req->kind != TS_CLIENT_SPARSE_PULL;
  if (req->table >= c->decl.n_tables) {
    *why = c->decl.n_tables ? "no table of that index was declared" : "no table was declared";
    return c->decl.n_tables ? TS_ENOTABLE : TS_ENOTDECLARED;
  }
  if ((uint64_t)req->num_keys > MAX_CALLER_KEYS) {
    *why = "more than 2^26 keys in one request";
    return TS_ETOOBIG;
  }
  if (req->num_keys && !req->keys) {
    *why = "no keys";
    return TS_EINVAL;
  }
  uint32_t dim = c->decl.tables[req->table]->dim;
  if (req->num_keys && ((pull && !req->rows_dst) || (push && !req->rows_grad))) {
    *why = pull && !req->rows_dst ? "no rows_dst for the pull" : "no rows_grad for the push";
    return TS_EINVAL;
  }
  size_t bytes = req->num_keys * dim * sizeof(float);
  if (pull && push && req->num_keys) {
    uintptr_t g0 = (uintptr_t)req->rows_grad, d0 = (uintptr_t)req->rows_dst;
    if (g0 < d0 + bytes && d0 < g0 + bytes) {
      *why = "rows_grad and rows_dst overlap";
      return TS_EINVAL;
    }
  }
  ts_cl_sparse_t *sp = ts_calloc(1, sizeof *sp);
  if (!sp) {
    *why = "out of memory";
    return TS_ENOMEM;
  }
  op->sp = sp;
  sp->table = req->table;
  sp->dim = dim;
  sp->nkeys = req->num_keys;
  sp->dst = pull ? req->rows_dst : NULL;
  sp->read_only = req->kind == TS_CLIENT_SPARSE_PULL && req->struct_size == sizeof *req &&
                  (req->sparse_flags & TS_CLIENT_ROWS_READ_ONLY);
  uv_mutex_lock(&c->mu);
  sp->push_every_shard = c->mode == TESSERA__MODE__MODE_SYNC || c->mode == TESSERA__MODE__MODE_SSP;
  sp->pull_every_shard = c->mode == TESSERA__MODE__MODE_SYNC;
  sp->async = c->mode == TESSERA__MODE__MODE_ASYNC;
  uv_mutex_unlock(&c->mu);
  sp->c = c;
  scratch_t t;
  size_t need = carve(sp, NULL, c->n, pull, push, &t);
  if (!(sp->arena = arena_take(c, need, &sp->arena_cap))) {
    *why = "out of memory";
    return TS_ENOMEM;
  }
  carve(sp, sp->arena, c->n, pull, push, &t);
  group_keys(sp, req->keys, c->n, &t);
  sp->grad = push ? req->rows_grad : NULL;
  if (push) {
    for (uint32_t s = 0; s < c->n; s++) {
      if (sp->shard_off[s + 1] - sp->shard_off[s] > TS_MSG_MAX_KEYS) {
        *why = "over 2^20 distinct keys of one shard in one push";
        return TS_ETOOBIG;
      }
    }
  }
  return 0;
}

/* The least bytes of rows a pull request is cut to, whatever a shard says. */
#define REPLY_ROWS_FLOOR ((uint64_t)32 << 10)

/* The most bytes of rows one reply of sh carries: TS_MSG_SPARSE_PULL_CUT (what a shard's
 * reply budget holds four of by default), or less where the shard says so. */
static uint64_t reply_rows_max(const ts_cl_shard_t *sh) {
  uint64_t most = TS_MSG_SPARSE_PULL_CUT, said = sh->max_reply_rows;
  if (said == 0 || said >= most) return most;
  /* a shard never says less than its smallest budget leaves (64 KiB less a reply's
   * overhead): one saying less gets requests of this floor and refuses them */
  return said < REPLY_ROWS_FLOOR ? REPLY_ROWS_FLOOR : said;
}

/* Keys a pull request to sh may list: at most TS_MSG_MAX_KEYS, with a reply within
 * reply_rows_max (one at least: a row too wide for the shard is refused there). */
static size_t pull_chunk(const ts_cl_shard_t *sh, uint32_t dim) {
  uint64_t k = reply_rows_max(sh) / ((uint64_t)dim * sizeof(float));
  if (k == 0) k = 1;
  return (size_t)(k < TS_MSG_MAX_KEYS ? k : TS_MSG_MAX_KEYS);
}

/* In async mode a push's keys on one shard go in up to TS_MSG_MAX_PUSH_PIECES frames
 * (SparsePush.piece) of about PIECE_MIN keys or more: the client thread makes a piece's
 * records as it sends it, the shard applies it while the next is made, and with a push+pull
 * in one frame the client puts a piece's rows in place while the shard works on the next
 * (+44-52 % rows/s at 8,000-26,000 distinct keys on one shard, +10 % at 2,400,
 * bench/RESULTS.md 17.6). */
#define PIECE_MIN 1024

/* op->acked[s] of a table's push: a bit per piece the shard answered, and the piece count
 * the first attempt chose (a retry must send the same pieces: each piece's id is applied
 * once, so a different cut would apply some rows twice or never). */
#define ACKED_COUNT_SHIFT 4
#define ACKED_COUNTED 0x40u

static size_t push_pieces(const ts_cl_op_t *op, const ts_cl_shard_t *sh, size_t n) {
  const ts_cl_sparse_t *sp = op->sp;
  if (op->acked && (op->acked[sh->index] & ACKED_COUNTED))
    return ((op->acked[sh->index] >> ACKED_COUNT_SHIFT) & 3u) + 1;
  if (!sp->async || !(sh->features & TS_FEATURE_SPARSE_PUSH_PIECES)) return 1;
  size_t p = n / PIECE_MIN;
  return p < 1 ? 1 : p > TS_MSG_MAX_PUSH_PIECES ? TS_MSG_MAX_PUSH_PIECES : p;
}

/* One wire request of op for keys [off, off + n) of shard sh, made but not queued yet. */
static ts_cl_wreq_t *make_req(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, uint16_t type,
                              size_t off, size_t n) {
  ts_cl_wreq_t *r = ts_calloc(1, sizeof *r);
  if (!r) return NULL;
  r->op = op;
  r->sh = sh;
  r->id = ++c->next_id;
  r->type = type;
  r->staged = op->stage && type == TS_MSG_SPARSE_PULL;
  r->sp_off = off;
  r->sp_n = n;
  ts_cl_sparse_t *sp = op->sp;
  if (n) {
    r->iov = ts_calloc(1, sizeof *r->iov);
    if (!r->iov) {
      ts_cl_free_wreq(r);
      return NULL;
    }
    size_t rec = (size_t)ts_msg_sparse_record_bytes(sp->dim);
    if (type == TS_MSG_SPARSE_PUSH) {
      r->iov[0] = uv_buf_init((char *)(sp->records + off * rec), 0);
      r->iov[0].len = n * rec;
    } else {
      r->iov[0] = uv_buf_init((char *)(sp->ukeys + off), 0);
      r->iov[0].len = n * sizeof(uint64_t);
      r->rx = uv_buf_init((char *)(sp->rows + off * sp->dim), 0);
      r->rx.len = n * sp->dim * sizeof(float);
    }
  }
  return r;
}

/* One wire request of op for keys [off, off + n) of shard sh, sent or queued. */
static int submit(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, uint16_t type, size_t off,
                  size_t n, unsigned piece) {
  ts_cl_wreq_t *r = make_req(c, sh, op, type, off, n);
  if (!r) return TS_ENOMEM;
  r->piece = (uint8_t)piece;
  return ts_cl_enqueue_wire(c, sh, op, r);
}

/* A push+pull of keys [off, off + n) of shard sh in one frame (async mode, a shard that
 * does it, the rows in one reply): the push names the pull, which is answered without a
 * frame of its own; its reply reads into the op's rows as a SparsePull's does. */
static int submit_fused(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, size_t off, size_t n,
                        unsigned piece) {
  ts_cl_wreq_t *push = make_req(c, sh, op, TS_MSG_SPARSE_PUSH, off, n);
  ts_cl_wreq_t *pull = push ? make_req(c, sh, op, TS_MSG_SPARSE_PULL, off, n) : NULL;
  if (!pull) {
    ts_cl_free_wreq(push);
    return TS_ENOMEM;
  }
  push->piece = (uint8_t)piece;
  push->pull_id = pull->id;
  pull->rides = true;
  /* The pull first: it is pending (or failed) before its push can be answered, and a push
   * that cannot be sent fails it (ts_cl_sparse_send). */
  int rc = ts_cl_enqueue_wire(c, sh, op, pull);
  if (rc < 0) {
    ts_cl_free_wreq(push);
    return rc;
  }
  return ts_cl_enqueue_wire(c, sh, op, push);
}

int ts_cl_sparse_pull_again(ts_cl_shard_t *sh, ts_cl_wreq_t *r) {
  if (!r->op || !r->op->sp) return TS_EINVAL;
  int rc = submit(sh->cl, sh, r->op, TS_MSG_SPARSE_PULL, r->sp_off, r->sp_n, 0);
  if (rc < 0) return rc;
  ts_cl_complete_req(r, 0, NULL); /* the op waits for the new one instead */
  return 0;
}

int ts_cl_sparse_start(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op) {
  ts_cl_sparse_t *sp = op->sp;
  size_t off = sp->shard_off[sh->index], n = sp->shard_off[sh->index + 1] - off;
  int rc = 0;
  size_t pieces = push_pieces(op, sh, n), each = pieces > 1 ? (n + pieces - 1) / pieces : n;
  /* A retry's remembered cut that its keys here cannot fill (they differ from the failed
   * push's): not the same push, so not sent as its pieces. */
  if (pieces > 1 && (pieces - 1) * each >= n) return TS_EINVAL;
  /* A retry: the pieces this shard answered in earlier attempts are not sent again. */
  unsigned all = (1u << pieces) - 1, had = op->acked ? op->acked[sh->index] & all : 0;
  if (op->acked)
    op->acked[sh->index] = (uint8_t)(had | ACKED_COUNTED | (pieces - 1) << ACKED_COUNT_SHIFT);
  bool push = (op->kind == OP_PUSH || op->kind == OP_PUSH_PULL) && (n || sp->push_every_shard);
  sp->sent[sh->index] = push ? (uint8_t)(all & ~had) : 0;
  sp->answered[sh->index] = 0;
  /* In one frame: async mode (the pull need not wait for a step: after this push the shard
   * is past the version last pulled, what TS_CLIENT_VERSION_NEXT asks), not a retry (its
   * push could be a duplicate), each piece's rows in one reply. */
  bool any_version = op->min_version == TS_CLIENT_VERSION_NEXT || op->min_version == 0;
#define PIECE_KEYS(i) ((i) + 1 < pieces ? each : n - (i) * each) /* the last: the rest */
  if (op->kind == OP_PUSH_PULL && !had && !op->retry && sp->async && any_version && n > 0 &&
      (uint64_t)each * sp->dim * sizeof(float) <= reply_rows_max(sh) &&
      (sh->features & TS_FEATURE_SPARSE_PUSH_PULL)) {
    for (size_t i = 0; rc == 0 && i < pieces; i++)
      rc = submit_fused(c, sh, op, off + i * each, PIECE_KEYS(i), (unsigned)i);
    return rc;
  }
  for (size_t i = 0; push && rc == 0 && i < pieces; i++)
    if (sp->sent[sh->index] >> i & 1)
      rc = submit(c, sh, op, TS_MSG_SPARSE_PUSH, off + i * each, PIECE_KEYS(i), (unsigned)i);
#undef PIECE_KEYS
  if (op->kind == OP_PUSH || (n == 0 && !sp->pull_every_shard)) return rc;
  /* The pull, back to back with the push on one connection: the shard handles them in
   * order, so the pull sees the push applied (sync: waits for its step). */
  size_t chunk = pull_chunk(sh, sp->dim);
  for (size_t k = 0; rc == 0 && (k < n || (n == 0 && k == 0)); k += chunk)
    rc = submit(c, sh, op, TS_MSG_SPARSE_PULL, off + k, n - k < chunk ? n - k : chunk, 0);
  return rc;
}

static ts_cl_staged_t *pulled(ts_client_t *c, uint32_t shard, uint32_t table) {
  return &c->table_pulled[(size_t)shard * c->decl.n_tables + table];
}

/* The table's version last pulled from sh, when it is of the shard's current incarnation. */
static bool last_pulled(ts_client_t *c, ts_cl_shard_t *sh, uint32_t table, uint64_t *v) {
  ts_cl_staged_t *p = pulled(c, sh->index, table);
  if (!p->set || p->incarnation != sh->incarnation) return false;
  *v = p->version;
  return true;
}

int ts_cl_sparse_send(ts_client_t *c, ts_cl_wreq_t *r, ts_conn_t *conn) {
  ts_cl_op_t *op = r->op;
  ts_cl_shard_t *sh = r->sh;
  ts_cl_sparse_t *sp = op->sp;
  uint64_t v = 0;
  bool have = last_pulled(c, sh, sp->table, &v);
  if (r->type == TS_MSG_SPARSE_PUSH) {
    Tessera__SparsePush m = TESSERA__SPARSE_PUSH__INIT;
    m.request_id = r->id;
    m.table = sp->table;
    m.num_keys = r->sp_n;
    m.dim = sp->dim;
    m.step = op->step == TS_CLIENT_STEP_PULLED ? (have ? v : 0) : op->step;
    m.push_id = op->push_id;
    m.piece = r->piece;
    if (r->piece && !(sh->features & TS_FEATURE_SPARSE_PUSH_PIECES)) {
      /* A retry of a push sent in pieces, to a shard that no longer takes them: in one
       * frame it would be applied twice or not at all where the first attempt had part. */
      ts_cl_wreq_t *riding = r->pull_id ? ts_cl_take_pending(sh, r->pull_id, 0) : NULL;
      if (riding) ts_cl_complete_req(riding, TS_EPROTO, "the shard no longer takes a push in pieces");
      return TS_EPROTO;
    }
    m.client_incarnation = m.push_id ? c->incarnation : 0;
    m.pull_request_id = r->pull_id;
    if (r->sp_n) make_records(sp, r->sp_off, r->sp_n);
    int rc = ts_conn_send(conn, TS_MSG_SPARSE_PUSH, &m.base, r->iov, r->sp_n ? 1 : 0, NULL, NULL);
    ts_cl_wreq_t *riding = rc < 0 && r->pull_id ? ts_cl_take_pending(sh, r->pull_id, 0) : NULL;
    if (riding) ts_cl_complete_req(riding, rc, "the push carrying this pull could not be sent");
    return rc;
  }
  if (r->rides) return 0; /* its push carried it */
  Tessera__SparsePull m = TESSERA__SPARSE_PULL__INIT;
  m.request_id = r->id;
  m.table = sp->table;
  m.num_keys = r->sp_n;
  m.min_version = op->min_version == TS_CLIENT_VERSION_NEXT ? (have ? v + 1 : 0) : op->min_version;
  m.clock = op->clock;
  m.timeout_ms = (uint32_t)(op->timeout_s * 1000.0);
  m.read_only = sp->read_only;
  return ts_conn_send(conn, TS_MSG_SPARSE_PULL, &m.base, r->iov, r->sp_n ? 1 : 0, NULL, NULL);
}

int ts_cl_sparse_reply_meta(ts_cl_shard_t *sh, const Tessera__SparsePullReply *m,
                            const uv_buf_t **iov, unsigned *niov) {
  ts_cl_wreq_t *r = ts_cl_find_pending(sh, m->request_id, TS_MSG_SPARSE_PULL_REPLY);
  if (!r || !r->op) return 0; /* nobody waits for it: read and drop */
  if (r->type != TS_MSG_SPARSE_PULL || !r->op->sp || m->num_keys != r->sp_n ||
      m->dim != r->op->sp->dim || m->table != r->op->sp->table)
    return TS_EPROTO;
  if (r->sp_n) {
    *iov = &r->rx;
    *niov = 1;
  }
  return 0;
}

/* sp->answered: a piece answered applied (the pieces' bits are below it) */
#define GOT_APPLIED 0x80u

static void count_result(ts_cl_op_t *op, Tessera__PushResult result) {
  switch (result) {
    case TESSERA__PUSH_RESULT__PUSH_APPLIED:
      op->applied++;
      break;
    case TESSERA__PUSH_RESULT__PUSH_ACCUMULATED:
      op->accumulated++;
      break;
    case TESSERA__PUSH_RESULT__PUSH_STALE:
      op->stale++;
      break;
    case TESSERA__PUSH_RESULT__PUSH_DUPLICATE:
      op->duplicate++;
      break;
    default:
      break;
  }
}

void ts_cl_sparse_on_reply(ts_cl_shard_t *sh, uint16_t type, const ProtobufCMessage *msg,
                           bool discarded) {
  ts_client_t *c = sh->cl;
  if (type == TS_MSG_SPARSE_PUSH_REPLY) {
    const Tessera__SparsePushReply *m = (const Tessera__SparsePushReply *)msg;
    ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, TS_MSG_SPARSE_PUSH_REPLY);
    if (!r) return;
    if (r->op && r->op->sp) {
      ts_cl_op_t *op = r->op;
      ts_cl_sparse_t *sp = op->sp;
      uint8_t *got = &sp->answered[sh->index];
      if (op->acked) op->acked[sh->index] |= (uint8_t)(1u << r->piece);
      sp->rows_filtered += m->rows_filtered;
      /* A shard's result counts once, when its last piece is answered: applied when any
       * piece was (a retry's pieces may be partly duplicates), else the pieces' result. */
      *got |= (uint8_t)(1u << r->piece);
      if (m->result == TESSERA__PUSH_RESULT__PUSH_APPLIED) *got |= GOT_APPLIED;
      if ((*got & sp->sent[sh->index]) == sp->sent[sh->index])
        count_result(op, *got & GOT_APPLIED ? TESSERA__PUSH_RESULT__PUSH_APPLIED : m->result);
    }
    ts_cl_complete_req(r, 0, NULL);
    return;
  }
  const Tessera__SparsePullReply *m = (const Tessera__SparsePullReply *)msg;
  ts_cl_wreq_t *r = ts_cl_take_pending(sh, m->request_id, TS_MSG_SPARSE_PULL_REPLY);
  if (!r) return;
  if (!r->op || discarded || !r->op->sp) {
    ts_cl_complete_req(r, TS_ENOMEM, "pull reply dropped");
    return;
  }
  ts_cl_op_t *op = r->op;
  ts_cl_staged_t v = {.version = m->version, .incarnation = sh->incarnation, .set = true};
  if (r->staged)
    op->stage[sh->index] = v;
  else
    *pulled(c, sh->index, op->sp->table) = v;
  if (m->version < op->version_min) op->version_min = m->version;
  /* Each reply's rows go to the caller's places as it lands, while the shards still work
   * on the request's other pieces. */
  if (op->sp->dst) scatter_rows(op->sp, r->sp_off, r->sp_n);
  ts_cl_complete_req(r, 0, NULL);
}

void ts_cl_sparse_publish(ts_client_t *c, ts_cl_op_t *op, ts_client_req_t *q) {
  ts_cl_sparse_t *sp = op->sp;
  if (op->stage && op->rc == 0) {
    for (uint32_t s = 0; s < c->n; s++)
      if (op->stage[s].set && op->stage[s].incarnation == c->shards[s].incarnation)
        *pulled(c, s, sp->table) = op->stage[s];
  }
  q->rows_filtered = sp->rows_filtered;
}
