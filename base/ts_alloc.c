#include "ts_alloc.h"

#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_long fail_countdown = 0;

static int should_fail(void) {
  long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
  if (n <= 0) return 0;
  if (n == 1) return 1; /* stays at 1: every later allocation fails too */
  atomic_fetch_sub_explicit(&fail_countdown, 1, memory_order_relaxed);
  return 0;
}

void ts_alloc_fail_after(long n) { atomic_store(&fail_countdown, n); }

void *ts_malloc(size_t n) {
  if (should_fail()) return NULL;
  return malloc(n ? n : 1);
}

void *ts_calloc(size_t count, size_t size) {
  if (should_fail()) return NULL;
  return calloc(count ? count : 1, size ? size : 1);
}

void *ts_realloc(void *p, size_t n) {
  if (should_fail()) return NULL;
  return realloc(p, n ? n : 1);
}

void ts_free(void *p) { free(p); }

char *ts_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = ts_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void *ts_aligned_alloc(size_t n) {
  if (should_fail()) return NULL;
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
  return p;
}

/* Transparent huge pages are 2 MiB on x86-64 and arm64 with 4 KiB base pages. */
#define HUGE_PAGE ((size_t)2 << 20)
#define BASE_PAGE ((size_t)4096)

static size_t huge_len(size_t n) { return (n + BASE_PAGE - 1) & ~(BASE_PAGE - 1); }

void *ts_huge_alloc(size_t n) {
  if (n < HUGE_PAGE) return ts_aligned_alloc(n);
  if (should_fail()) return NULL;
  /* A mapping of its own, cut to [p, p + len) with p on a 2 MiB boundary. Not
   * posix_memalign: glibc would take n + 2 MiB for it and keep the slack mapped (and with
   * MALLOC_PERTURB_ set, written: 2 MiB more resident per buffer). */
  size_t len = huge_len(n), span = len + HUGE_PAGE;
  char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (p > m) munmap(m, (size_t)(p - m));
  if (m + span > p + len) munmap(p + len, (size_t)(m + span - (p + len)));
#ifdef MADV_HUGEPAGE
  /* A hint: where transparent huge pages are off ("never") or none is free, the kernel
   * simply uses 4 KiB pages; a last extent of less than 2 MiB stays on them. */
  (void)madvise(p, len, MADV_HUGEPAGE);
#endif
  return p;
}

void ts_huge_free(void *p, size_t n) {
  if (!p) return;
  if (n < HUGE_PAGE) {
    free(p);
    return;
  }
  munmap(p, huge_len(n));
}

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  return ts_malloc(size);
}

static void pb_free(void *data, void *p) {
  (void)data;
  ts_free(p);
}

ProtobufCAllocator ts_protobuf_allocator = {.alloc = pb_alloc, .free = pb_free, .allocator_data = NULL};
