/*
 * Large buffers made ready off the shard's loop thread. A buffer's first touch costs a
 * page fault and the zeroing of its page; on a virtual machine whose host takes memory back
 * (free page reporting, ballooning) the host's own fault as well, and a gigabyte then takes
 * seconds (7.2 s measured on the VM of bench/RESULTS.md section 18.4): spent on the loop
 * thread, every client's requests wait that long and their heartbeats time out. A
 * ts_prefault_t is one buffer, mapped by the caller (ts_huge_alloc: the allocation and its
 * failure stay on the caller's thread) and filled with one byte value, which faults every
 * page in, by a thread of its own; the caller takes it when it needs it.
 */
#ifndef TS_PREFAULT_H
#define TS_PREFAULT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ts_prefault ts_prefault_t;

/* Start making a buffer of n bytes, every byte `fill`. NULL when there is no memory or no
 * thread for it (the caller allocates when it needs the buffer, as it would without). */
ts_prefault_t *ts_prefault_start(size_t n, int fill);

/* The buffer, filled (ts_huge_free it with n bytes), after waiting for its thread if that
 * is not done yet. Frees p. */
void *ts_prefault_take(ts_prefault_t *p);

/* Give it up without waiting: the buffer is freed now, or by its thread once filled. */
void ts_prefault_drop(ts_prefault_t *p);

/* The buffer's size. */
size_t ts_prefault_bytes(const ts_prefault_t *p);

#endif
