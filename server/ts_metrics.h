/*
 * A shard's counters and histograms for /metrics, and their rendering in the Prometheus
 * text format (ts_prom.h).
 *
 * ts_metrics_t is owned by the shard's loop thread and updated there with plain stores;
 * the admin endpoint renders a copy the loop publishes (ts_shard_admin.h), never the live struct.
 * The gauges (step, workers, partitions, bytes, connections) are not kept here: they come
 * from the same ShardStatus a STATUS request answers with, so /metrics, /status and
 * `psctl status` always agree.
 */
#ifndef TS_METRICS_H
#define TS_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera.pb-c.h"
#include "ts_prom.h"

/* Request kinds counted separately (the label request="..."). */
typedef enum {
  TS_METRICS_REQ_OTHER = 0,
  TS_METRICS_REQ_PUSH,
  TS_METRICS_REQ_PULL,
  TS_METRICS_REQ_DECLARE,
  TS_METRICS_REQ_HEARTBEAT,
  TS_METRICS_REQ_STATUS,
  TS_METRICS_REQ_HANDSHAKE,
  TS_METRICS_REQ_SPARSE_PULL,
  TS_METRICS_REQ_SPARSE_PUSH,
  TS_METRICS_REQ__COUNT
} ts_metrics_req_t;

/* The limits on what one peer may make the shard hold (docs/architecture.md, "What one
 * peer may hold"): each has a counter, of the connections it closed or of the requests it
 * refused. */
typedef enum {
  TS_METRICS_LIMIT_PUSH_RATE = 0, /* dropped: server.push_min_bytes_per_s */
  TS_METRICS_LIMIT_PUSH_CONTENDED, /* dropped: server.push_contended_min_bytes_per_s */
  TS_METRICS_LIMIT_PULL_HOLD,     /* dropped: server.pull_hold_timeout_s */
  TS_METRICS_LIMIT_REPLY_FULL,    /* dropped: server.reply_full_timeout_s */
  TS_METRICS_LIMIT_REPLY_TOTAL,   /* dropped: server.max_reply_bytes */
  TS_METRICS_LIMIT_STATUS_REPLY,  /* dropped: server.max_status_reply_bytes */
  TS_METRICS_LIMIT_PULL_REPEATS,  /* refused: a pull naming a partition twice */
  TS_METRICS_LIMIT_PARKED_PULLS,  /* refused: server.max_parked_pulls */
  TS_METRICS_LIMIT__COUNT
} ts_metrics_limit_t;

/* Connections the shard closed or refused to protect itself (the label reason="..."),
 * each with a log line naming the peer and the limit (docs/operations.md, "Hostile or
 * broken peers"). */
typedef enum {
  TS_METRICS_DROP_HANDSHAKE_TIMEOUT = 0, /* no handshake within server.handshake_timeout_s */
  TS_METRICS_DROP_PREAUTH_QUOTA,         /* oldest of server.max_preauth_connections */
  TS_METRICS_DROP_SLOW_FRAME,            /* below server.min_recv_bytes_per_s */
  TS_METRICS_DROP_MAX_CONNECTIONS,       /* authenticated past server.max_connections */
  TS_METRICS_DROP__COUNT
} ts_metrics_drop_t;

/* Error codes are counted by Tessera code (TS_E*, ts_err.h); index 0 holds everything else
 * (errno values). */
#define TS_METRICS_NUM_CODES 32

typedef struct {
  /* Requests answered with an error, by kind and code (reason="nonfinite"...). Refused
   * gradients are request="push". */
  uint64_t refused[TS_METRICS_REQ__COUNT][TS_METRICS_NUM_CODES];
  /* Protocol violations that closed a connection, by code. */
  uint64_t rejected[TS_METRICS_NUM_CODES];
  /* Pushed partitions by outcome, indexed by Tessera__PushResult (applied, accumulated,
   * stale, duplicate). */
  uint64_t push_parts[4];
  /* Pushes that had to wait: for a pull reply being written from their partition, or for
   * a staging buffer (docs/architecture.md, "Pushes, piece by piece"). */
  uint64_t push_waits_reply, push_waits_staging;
  uint64_t staging_bytes; /* staging buffers allocated, set when publishing */
  /* Per-peer limits: connections closed and requests refused, by limit (only the drop
   * kinds are used in limit_drops, the refusal kinds in limit_refusals). */
  uint64_t limit_drops[TS_METRICS_LIMIT__COUNT];
  uint64_t limit_refusals[TS_METRICS_LIMIT__COUNT];
  /* Gauges of the budgets' use, set when publishing. */
  uint64_t staging_in_use, reply_memory, parked_pulls, pull_replies_writing;
  uint64_t auth_failures;
  uint64_t dropped[TS_METRICS_DROP__COUNT]; /* connections closed or refused, by reason */
  uint64_t preauth_connections;             /* waiting for their handshake, set when publishing */
  /* Bytes of connections already closed; the live ones are added when publishing. */
  uint64_t bytes_in_closed, bytes_out_closed;
  uint64_t bytes_in, bytes_out; /* totals, set when publishing */
  /* Server-side request latency: from the last byte of the request to the reply queued
   * (a pull that waits for its version counts its wait). */
  ts_prom_hist_t push_duration, pull_duration;
  /* Sync mode: from a partition's first gradient of a step to its barrier closing (one
   * observation per partition and step). */
  ts_prom_hist_t barrier_wait;
  /* How late each run of the shard's tick was (ts_server.c): the event loop's lag. */
  ts_prom_hist_t loop_lag;
  /* Checkpoints (ts_ckpt.h): the last-success gauge is absent until one succeeds. */
  uint64_t checkpoints_ok, checkpoints_failed;
  ts_prom_hist_t checkpoint_duration;
  double checkpoint_last_success_unix; /* 0 = none yet */
  /* The model (server/ts_declare.c): bytes its declare made this shard allocate (parameters,
   * optimizer state, sync accumulators), the budget (server.max_model_bytes), and how many
   * times an admin dropped it (psctl model reset). Refused declares are counted in refused[]
   * (request="declare"). */
  uint64_t model_bytes, model_bytes_limit, model_resets;
  /* Retried pushes (server/ts_pushid.h): pushes with partitions not applied again because
   * their push id already was, clients forgotten to make room for another of the same task,
   * and the memory of the table (set when publishing; server.push_dedup_clients). */
  uint64_t push_duplicates, push_dedup_evictions, push_dedup_bytes;
} ts_metrics_t;

/* Zero *m and set the histograms' bounds. */
void ts_metrics_init(ts_metrics_t *m);

/* The kind of a request from its frame type (TS_MSG_*). */
ts_metrics_req_t ts_metrics_req_of(int frame_type);

/* Count a refused request / a rejected frame with its error code. */
void ts_metrics_refused(ts_metrics_t *m, ts_metrics_req_t kind, int code);
void ts_metrics_rejected(ts_metrics_t *m, int code);

/* Render every tessera_ps_* family, tessera_build_info and the process_* families into b.
 * st is the shard's status at the same moment (NULL before the first one: its gauges are
 * then left out). */
void ts_metrics_render(ts_buf_t *b, const ts_metrics_t *m, const Tessera__ShardStatus *st);

#endif
