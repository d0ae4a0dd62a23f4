#include "ts_poll.h"

#include <sched.h>

int ts_poll_run(uv_loop_t *loop, uint64_t poll_us, ts_poll_active_cb active, void *arg) {
  if (poll_us == 0 || !active) return uv_run(loop, UV_RUN_DEFAULT);
  const uint64_t window_ns = poll_us * 1000u;
  /* Starting is activity: whoever starts a loop has usually just queued work on it. */
  uint64_t last = uv_hrtime();
  for (;;) {
    /* Asked before each turn rather than after it, so that time spent yielding does not
     * count against the window of work still in flight. */
    uint64_t now = uv_hrtime();
    if (active(arg)) last = now;
    bool polling = now - last < window_ns;
    /* UV_RUN_NOWAIT polls the sockets with a zero timeout; UV_RUN_ONCE sleeps until the
     * next event or timer. Both return 0 once nothing is left to run, where DEFAULT ends. */
    if (!uv_run(loop, polling ? UV_RUN_NOWAIT : UV_RUN_ONCE)) return 0;
    /* Give any runnable thread (the one about to hand over the next request, the peer
     * process on a small machine) the CPU before polling again: a poller must never be
     * what keeps the work it waits for from running. */
    if (polling) sched_yield();
  }
}
