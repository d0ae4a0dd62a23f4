/*
 * A shard's admin HTTP endpoint (docs/operations.md) on cluster.ps_http[shard]:
 *
 *   /metrics  Prometheus text (ts_metrics.h), content type TS_PROM_CONTENT_TYPE
 *   /livez    200 while the shard's event loop keeps publishing (it does every tick), 503
 *             when it has not for TS_ADMIN_STALL_S: restart me
 *   /readyz   200 once the shard serves (listening, not stopping), else 503 with a reason
 *   /status   the JSON of `psctl status --output json` (ts_status_json.h), as this shard
 *             sees the job: "shards" lists this shard alone
 *
 * Threads: the loop calls ts_admin_publish with a copy of its counters and its packed
 * ShardStatus; the HTTP thread renders from the last copy under a mutex and never reads
 * the loop's state (CONTRIBUTING.md).
 */
#ifndef TS_ADMIN_H
#define TS_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ts_config.h"
#include "ts_metrics.h"

/* Seconds without a publish after which /livez says the loop is stalled. */
#define TS_ADMIN_STALL_S 10.0

typedef struct ts_admin ts_admin_t;

/* Serve shard `shard` of cfg on cfg->ps_http[shard]. Returns 0, TS_ECONFIG (address) or a
 * negative errno (bind) with errmsg; cfg must outlive the endpoint. Until the first publish
 * every page but /livez answers 503. */
int ts_admin_start(ts_admin_t **out, const ts_config_t *cfg, uint32_t shard, char *errmsg,
                   size_t errlen);

/* Publish a snapshot: m is copied, status_pb (a packed Tessera__ShardStatus of len bytes)
 * is copied; ready says whether /readyz answers 200, why (may be NULL) what it says when
 * not. Called from the loop. */
void ts_admin_publish(ts_admin_t *a, const ts_metrics_t *m, const uint8_t *status_pb, size_t len,
                      bool ready, const char *why);

/* Stop serving and free. NULL is ignored. */
void ts_admin_stop(ts_admin_t *a);

#endif
