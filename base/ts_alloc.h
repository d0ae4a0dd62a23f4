/*
 * Allocation. Every allocation of Tessera goes through these, so tests can make the N-th
 * allocation fail (ts_alloc_fail_after) and check that the failure is reported and nothing
 * leaks. ts_malloc(0) returns a unique pointer or NULL; ts_free(NULL) does nothing.
 */
#ifndef TS_ALLOC_H
#define TS_ALLOC_H

#include <stddef.h>

void *ts_malloc(size_t n);
void *ts_calloc(size_t count, size_t size);
void *ts_realloc(void *p, size_t n);
void ts_free(void *p);
char *ts_strdup(const char *s);

/* 64-byte aligned memory for parameter and gradient buffers (vector loads, no false sharing).
 * Freed with ts_free. */
void *ts_aligned_alloc(size_t n);

/* As ts_aligned_alloc, for the large buffers every pushed and pulled byte passes through
 * (parameters, optimizer state, sync accumulators, push staging): from 2 MiB on, aligned to
 * 2 MiB and advised as transparent huge pages (madvise MADV_HUGEPAGE; the default THP mode
 * "madvise" uses them only when asked), so the optimizer's pass and the kernel's copies into
 * and out of them take a TLB miss every 2 MiB rather than every 4 KiB. Zero-filled from
 * 2 MiB on (a mapping of its own). Freed with ts_huge_free and the same n, never ts_free. */
void *ts_huge_alloc(size_t n);
void ts_huge_free(void *p, size_t n);

/* What an allocation of n bytes costs the heap, approximately: glibc's malloc rounds a
 * request plus its 8-byte header up to 16 bytes, and never hands out less than 32. For
 * budgets of memory a peer makes us hold (server.max_reply_bytes). */
static inline size_t ts_alloc_cost(size_t n) {
  size_t c = (n + 8 + 15) & ~(size_t)15;
  return c < 32 ? 32 : c;
}

/* Test hook: the n-th allocation from now (1 = the next) and every one after it fail,
 * until called again with 0. */
void ts_alloc_fail_after(long n);

/* protobuf-c allocator that routes through ts_malloc/ts_free. */
struct ProtobufCAllocator;
extern struct ProtobufCAllocator ts_protobuf_allocator;

#endif
