/*
 * A memory pool: sub-allocation of a few large backing chunks (docs/gpu.md).
 *
 * The CUDA back end takes device memory from the driver in large chunks (cudaMalloc) and
 * hands out pieces of them here, so that device.memory_fraction can reserve memory up front
 * and never exceed it, and device.allow_growth can grow the pool on demand (up to that
 * fraction when both are set). The pool itself
 * is plain C and never touches the memory it manages: it only does address arithmetic on
 * the chunks and keeps its bookkeeping in host memory. So it works for device memory, and
 * unit tests drive it with host memory on machines without a GPU.
 *
 * Glossary.
 *   chunk    one piece of backing memory from backing_alloc, returned with backing_free
 *            only when the pool is destroyed.
 *   block    a piece of a chunk, free or handed out; handed-out blocks are TS_POOL_ALIGN
 *            aligned and sized in multiples of it.
 *   held     bytes of all chunks; in use: bytes of handed-out blocks.
 *
 * Policy. At creation the pool takes `reserve` bytes as one chunk (when not 0). When a
 * request finds no free block large enough and `grow` is set, the pool takes a new chunk of
 * at least min_chunk bytes, provided held + chunk stays within `limit` (0 = no limit but what
 * backing_alloc gives). Freed blocks return to the pool, merged with free neighbours, not to
 * the backing.
 *
 * Thread safety: every function may be called from any thread (one mutex per pool).
 * Ownership: the caller owns the pool from ts_pool_create until ts_pool_destroy, which frees
 * every chunk, also those of blocks never freed.
 */
#ifndef TS_POOL_H
#define TS_POOL_H

#include <stdbool.h>
#include <stddef.h>

#define TS_POOL_ALIGN 256 /* cudaMalloc's alignment; cuBLAS and vector loads want 16 */

typedef struct ts_pool ts_pool_t;

/* Backing memory: *out = `bytes` bytes aligned to TS_POOL_ALIGN, or a negative code with the
 * reason in errmsg ("cudaMalloc(256.0 MiB): out of memory; 1.2 GiB of 139.8 GiB free"). */
typedef int (*ts_pool_backing_alloc_cb)(void *arg, size_t bytes, void **out, char *errmsg,
                                        size_t errlen);
typedef void (*ts_pool_backing_free_cb)(void *arg, void *chunk);

typedef struct {
  size_t reserve;   /* bytes taken at creation (0 = none) */
  size_t limit;     /* most bytes held in all (0 = no limit of its own) */
  bool grow;        /* take more chunks on demand */
  size_t min_chunk; /* smallest growth in bytes (0 = 32 MiB) */
  ts_pool_backing_alloc_cb backing_alloc;
  ts_pool_backing_free_cb backing_free;
  void *arg;                /* passed to both callbacks */
  const char *name;         /* "GPU 0", for messages (copied; may be NULL) */
  const char *limit_reason; /* "device.memory_fraction = 0.05", for messages (copied) */
} ts_pool_opts_t;

typedef struct {
  size_t held;         /* bytes of all chunks */
  size_t in_use;       /* bytes of handed-out blocks */
  size_t peak;         /* largest in_use so far */
  size_t chunks;       /* chunks held */
  size_t blocks;       /* blocks handed out now */
  size_t largest_free; /* the largest free block */
} ts_pool_stats_t;

/* Create a pool and take its reserve. Returns 0, TS_EINVAL (no callbacks, reserve above a
 * non-zero limit), TS_ENOMEM (host memory, or the reserve could not be had: errmsg says
 * why). On failure *out is NULL and nothing is held. */
int ts_pool_create(const ts_pool_opts_t *opts, ts_pool_t **out, char *errmsg, size_t errlen);

/* *out = a block of at least `bytes` bytes (0 gives a unique block). Returns 0, or TS_ENOMEM
 * with errmsg naming the limit, what is in use and what was asked ("GPU 0: out of memory
 * under device.memory_fraction = 0.01: the pool holds at most 1.4 GiB, 1.3 GiB in use, 512.0
 * MiB more asked"), or the backing's failure. */
int ts_pool_alloc(ts_pool_t *pool, size_t bytes, void **out, char *errmsg, size_t errlen);

/* Return a block. NULL is a no-op (0); a pointer the pool did not hand out is TS_EINVAL and
 * changes nothing. */
int ts_pool_free(ts_pool_t *pool, void *ptr);

void ts_pool_stats(ts_pool_t *pool, ts_pool_stats_t *out);

/* Free every chunk and the pool. NULL is a no-op. */
void ts_pool_destroy(ts_pool_t *pool);

/* "1.5 GiB", "256.0 MiB", "12.0 KiB", "100 B" into buf; returns buf. */
const char *ts_pool_format_bytes(size_t bytes, char *buf, size_t n);

#endif
