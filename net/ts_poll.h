/*
 * Bounded busy-polling of a libuv loop.
 *
 * Waking a thread that sleeps in epoll_wait costs tens of microseconds on bare metal and
 * 100 us or more on a virtual machine (Firecracker measures this), more than a whole
 * loopback round trip. A loop run by ts_poll_run keeps polling, without sleeping, for a
 * short window after each sign of activity, so the reply to a request it has just sent, or
 * the next request of a busy peer, is picked up at once; when the window passes quietly it
 * sleeps in the kernel as uv_run(UV_RUN_DEFAULT) would, so an idle process never polls.
 *
 * Glossary:
 *   activity  what the caller's callback reports after each turn of the loop: a message
 *             read, a request handed over, work in flight whose answer is due soon.
 *   window    poll_us microseconds after the last activity, during which the loop is run
 *             with UV_RUN_NOWAIT and the thread calls sched_yield() between turns, so a
 *             polling thread never keeps another runnable thread off a CPU.
 *
 * The module has no state of its own: any loop, any thread, one call per loop at a time.
 */
#ifndef TS_POLL_H
#define TS_POLL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* Called on the loop's thread before every turn of the loop; returns true when there was
 * activity since the previous call (see above), or while work is in flight whose answer
 * should be polled for. It must be cheap: while polling it runs once per turn, about once
 * per microsecond on an idle machine. */
typedef bool (*ts_poll_active_cb)(void *arg);

/* Run loop until it has no active handles or requests left, as uv_run(loop,
 * UV_RUN_DEFAULT) does, but without sleeping for poll_us after the last time active(arg)
 * returned true (starting counts as activity). poll_us == 0, or active == NULL, is exactly
 * uv_run(loop, UV_RUN_DEFAULT).
 *
 * End a loop by closing its handles, not with uv_stop(): uv_run forgets a stop request at
 * the end of each turn, so with poll_us > 0 uv_stop() only ends the current turn.
 *
 * Returns 0 when the loop ran out of handles (uv_run's return value when poll_us == 0). */
int ts_poll_run(uv_loop_t *loop, uint64_t poll_us, ts_poll_active_cb active, void *arg);

#endif
