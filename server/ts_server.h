/*
 * ps-server: the listener, the sessions and the request handlers of one shard.
 *
 * One libuv loop runs everything (CONTRIBUTING.md). Requests are answered from the shard store
 * (ts_store.h); pulls that must wait (a sync long poll, an ssp clock bound) are parked and
 * answered when the store moves or their deadline passes. Timers check heartbeats and open
 * sync barriers, so nothing waits forever.
 */
#ifndef TS_SERVER_H
#define TS_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "ts_config.h"
#include "ts_store.h"

typedef struct ts_server ts_server_t;

typedef struct {
  const ts_config_t *cfg;  /* must outlive the server */
  uint32_t shard;
  bool insecure;           /* allow a non-loopback address without tokens */
  bool fresh;              /* --fresh: do not restore checkpoint.dir */
  bool adopt;              /* --adopt: restore checkpoints of another job (ts_ckpt.h) */
} ts_server_opts_t;

/* Create the server of shard opts->shard on loop: load tokens, bind and listen on
 * cfg->ps[shard], install SIGTERM/SIGINT handlers. Returns 0, TS_ECONFIG (refusing a
 * non-loopback address without tokens, unreadable token file) or a negative errno (bind),
 * with the reason in errmsg. On error nothing is left on the loop. */
int ts_server_start(ts_server_t **out, uv_loop_t *loop, const ts_server_opts_t *opts,
                    char *errmsg, size_t errlen);

/* Stop accepting, close every connection, stop timers; the loop then runs out. */
void ts_server_stop(ts_server_t *srv);

/* For ts_poll_run (net/ts_poll.h): true when frames or pieces of a push were read
 * since the last call, so the loop keeps polling for job.busy_poll_us after each. */
bool ts_server_poll_active(void *srv);

/* Free the server after the loop has run out. */
void ts_server_free(ts_server_t *srv);

#endif
