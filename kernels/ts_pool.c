/*
 * The pool keeps one address-ordered list of blocks over all chunks. A model holds a few
 * dozen buffers, so a best-fit scan of the list is cheap and keeps fragmentation low; blocks
 * are looked up by address on free. Addresses are handled as uintptr_t and never
 * dereferenced: the memory may be on a GPU.
 */
#include "ts_pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ts_alloc.h"
#include "ts_err.h"

#define DEFAULT_MIN_CHUNK ((size_t)32 << 20)

typedef struct block {
  uintptr_t addr;
  size_t size;
  size_t chunk; /* index into chunks: blocks of different chunks never merge */
  bool used;
  struct block *prev, *next;
} block_t;

struct ts_pool {
  pthread_mutex_t mu;
  ts_pool_opts_t o;
  char name[64];
  char limit_reason[96];
  block_t *head;
  void **chunks;
  size_t num_chunks, cap_chunks;
  ts_pool_stats_t st;
};

const char *ts_pool_format_bytes(size_t bytes, char *buf, size_t n) {
  double b = (double)bytes;
  if (bytes >= ((size_t)1 << 30))
    snprintf(buf, n, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else if (bytes >= ((size_t)1 << 20))
    snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024.0));
  else if (bytes >= 1024)
    snprintf(buf, n, "%.1f KiB", b / 1024.0);
  else
    snprintf(buf, n, "%zu B", bytes);
  return buf;
}

static size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

/* Take a chunk of `bytes` and add it as one free block, in address order. */
static int add_chunk(ts_pool_t *p, size_t bytes, char *errmsg, size_t errlen) {
  if (p->num_chunks == p->cap_chunks) {
    size_t cap = p->cap_chunks ? 2 * p->cap_chunks : 8;
    void **c = ts_realloc(p->chunks, cap * sizeof *c);
    if (!c) {
      ts_errmsg_printf(errmsg, errlen, "%s: out of host memory for the pool", p->name);
      return TS_ENOMEM;
    }
    p->chunks = c;
    p->cap_chunks = cap;
  }
  block_t *b = ts_calloc(1, sizeof *b);
  if (!b) {
    ts_errmsg_printf(errmsg, errlen, "%s: out of host memory for the pool", p->name);
    return TS_ENOMEM;
  }
  void *mem = NULL;
  int rc = p->o.backing_alloc(p->o.arg, bytes, &mem, errmsg, errlen);
  if (rc < 0 || !mem) {
    ts_free(b);
    return rc < 0 ? rc : TS_ENOMEM;
  }
  if ((uintptr_t)mem % TS_POOL_ALIGN != 0 || (uintptr_t)mem > UINTPTR_MAX - bytes) {
    p->o.backing_free(p->o.arg, mem);
    ts_free(b);
    ts_errmsg_printf(errmsg, errlen, "%s: backing memory is not %d-byte aligned", p->name,
                     TS_POOL_ALIGN);
    return TS_EINTERNAL;
  }
  b->addr = (uintptr_t)mem;
  b->size = bytes;
  b->chunk = p->num_chunks;
  p->chunks[p->num_chunks++] = mem;
  block_t **at = &p->head, *prev = NULL;
  while (*at && (*at)->addr < b->addr) {
    prev = *at;
    at = &(*at)->next;
  }
  b->next = *at;
  b->prev = prev;
  if (*at) (*at)->prev = b;
  *at = b;
  p->st.held += bytes;
  p->st.chunks++;
  return 0;
}

int ts_pool_create(const ts_pool_opts_t *o, ts_pool_t **out, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!out) return TS_EINVAL;
  *out = NULL;
  if (!o || !o->backing_alloc || !o->backing_free) {
    ts_errmsg_printf(errmsg, errlen, "pool: no backing allocator");
    return TS_EINVAL;
  }
  if (o->limit && o->reserve > o->limit) {
    ts_errmsg_printf(errmsg, errlen, "pool: the reserve (%zu bytes) is above the limit (%zu)",
                     o->reserve, o->limit);
    return TS_EINVAL;
  }
  ts_pool_t *p = ts_calloc(1, sizeof *p);
  if (!p) {
    ts_errmsg_printf(errmsg, errlen, "pool: out of host memory");
    return TS_ENOMEM;
  }
  p->o = *o;
  if (!p->o.min_chunk) p->o.min_chunk = DEFAULT_MIN_CHUNK;
  p->o.min_chunk = round_up(p->o.min_chunk, TS_POOL_ALIGN);
  snprintf(p->name, sizeof p->name, "%s", o->name ? o->name : "pool");
  snprintf(p->limit_reason, sizeof p->limit_reason, "%s", o->limit_reason ? o->limit_reason : "");
  p->o.name = p->name;
  p->o.limit_reason = p->limit_reason;
  pthread_mutex_init(&p->mu, NULL);
  if (o->reserve) {
    int rc = add_chunk(p, round_up(o->reserve, TS_POOL_ALIGN), errmsg, errlen);
    if (rc < 0) {
      ts_pool_destroy(p);
      return rc;
    }
  }
  *out = p;
  return 0;
}

/* Best fit: the smallest free block that holds need bytes. */
static block_t *best_fit(ts_pool_t *p, size_t need) {
  block_t *best = NULL;
  for (block_t *b = p->head; b; b = b->next)
    if (!b->used && b->size >= need && (!best || b->size < best->size)) best = b;
  return best;
}

static size_t largest_free(const ts_pool_t *p) {
  size_t m = 0;
  for (const block_t *b = p->head; b; b = b->next)
    if (!b->used && b->size > m) m = b->size;
  return m;
}

static int out_of_memory(ts_pool_t *p, size_t need, char *errmsg, size_t errlen) {
  char lim[32], use[32], ask[32], big[32];
  ts_pool_format_bytes(p->o.limit ? p->o.limit : p->st.held, lim, sizeof lim);
  ts_pool_format_bytes(p->st.in_use, use, sizeof use);
  ts_pool_format_bytes(need, ask, sizeof ask);
  ts_pool_format_bytes(largest_free(p), big, sizeof big);
  ts_errmsg_printf(errmsg, errlen,
                   "%s: out of memory%s%s: the pool may hold at most %s, %s are in use "
                   "(largest free piece %s), %s more asked",
                   p->name, p->limit_reason[0] ? " under " : "", p->limit_reason, lim, use, big,
                   ask);
  return TS_ENOMEM;
}

int ts_pool_alloc(ts_pool_t *p, size_t bytes, void **out, char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!p || !out) return TS_EINVAL;
  *out = NULL;
  if (bytes > SIZE_MAX / 2) {
    ts_errmsg_printf(errmsg, errlen, "%s: %zu bytes asked: more than any device holds", p->name,
                     bytes);
    return TS_ENOMEM;
  }
  size_t need = round_up(bytes ? bytes : 1, TS_POOL_ALIGN);
  pthread_mutex_lock(&p->mu);
  int rc = 0;
  block_t *b = best_fit(p, need);
  if (!b) {
    size_t chunk = need > p->o.min_chunk ? need : p->o.min_chunk;
    if (p->o.limit && p->st.held + chunk > p->o.limit) chunk = need; /* the last bit that fits */
    if (!p->o.grow || (p->o.limit && p->st.held + chunk > p->o.limit)) {
      rc = out_of_memory(p, need, errmsg, errlen);
      goto out;
    }
    rc = add_chunk(p, chunk, errmsg, errlen);
    if (rc < 0) {
      char use[32];
      ts_errmsg_wrapf(errmsg, errlen, "%s: growing the pool by %zu bytes (%s in use)", p->name,
                      chunk, ts_pool_format_bytes(p->st.in_use, use, sizeof use));
      goto out;
    }
    b = best_fit(p, need);
    if (!b) { /* the new chunk holds need bytes: cannot happen */
      ts_assert_log("best_fit(p, need) != NULL", __FILE__, __LINE__, __func__);
      rc = TS_EINTERNAL;
      goto out;
    }
  }
  if (b->size - need >= TS_POOL_ALIGN) { /* split: the rest stays free after b */
    block_t *rest = ts_calloc(1, sizeof *rest);
    if (!rest) {
      ts_errmsg_printf(errmsg, errlen, "%s: out of host memory for the pool", p->name);
      rc = TS_ENOMEM;
      goto out;
    }
    rest->addr = b->addr + need;
    rest->size = b->size - need;
    rest->chunk = b->chunk;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = need;
  }
  b->used = true;
  p->st.in_use += b->size;
  p->st.blocks++;
  if (p->st.in_use > p->st.peak) p->st.peak = p->st.in_use;
  *out = (void *)b->addr;
out:
  pthread_mutex_unlock(&p->mu);
  return rc;
}

/* Merge b with its successor when both are free and in one chunk. */
static void merge_next(block_t *b) {
  block_t *n = b->next;
  if (!n || n->used || b->used || n->chunk != b->chunk) return;
  b->size += n->size;
  b->next = n->next;
  if (n->next) n->next->prev = b;
  ts_free(n);
}

int ts_pool_free(ts_pool_t *p, void *ptr) {
  if (!p) return TS_EINVAL;
  if (!ptr) return 0;
  pthread_mutex_lock(&p->mu);
  block_t *b = p->head;
  while (b && !(b->addr == (uintptr_t)ptr && b->used)) b = b->next;
  if (!b) {
    pthread_mutex_unlock(&p->mu);
    return TS_EINVAL;
  }
  b->used = false;
  p->st.in_use -= b->size;
  p->st.blocks--;
  merge_next(b);
  if (b->prev) merge_next(b->prev);
  pthread_mutex_unlock(&p->mu);
  return 0;
}

void ts_pool_stats(ts_pool_t *p, ts_pool_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  out->largest_free = largest_free(p);
  pthread_mutex_unlock(&p->mu);
}

void ts_pool_destroy(ts_pool_t *p) {
  if (!p) return;
  for (block_t *b = p->head, *n; b; b = n) {
    n = b->next;
    ts_free(b);
  }
  for (size_t i = 0; i < p->num_chunks; i++) p->o.backing_free(p->o.arg, p->chunks[i]);
  ts_free(p->chunks);
  pthread_mutex_destroy(&p->mu);
  ts_free(p);
}
