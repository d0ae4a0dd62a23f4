/*
 * A shard's admin HTTP endpoint (docs/operations.md) on cluster.ps_http[shard]: the shard's
 * role of the endpoint every daemon serves (obs/ts_admin.h).
 *
 *   /metrics  Prometheus text (ts_metrics.h) of the published counters and ShardStatus
 *   /livez    200 while the shard's event loop keeps publishing (it does every tick), 503
 *             when it has not for TS_SHARD_ADMIN_STALL_S: restart me
 *   /readyz   200 once the shard serves (listening, not stopping), else 503 with a reason
 *   /status   the JSON of `psctl status --output json` (ts_job_status.h), as this shard
 *             sees the job: "shards" lists this shard alone
 *
 * Threads: the loop publishes every tick with ts_admin_publish(admin, &metrics,
 * packed Tessera__ShardStatus, its length, ready, why): the snapshot is the ts_metrics_t,
 * the blob the ShardStatus. The HTTP thread renders from the last copy and never reads the
 * loop's state (CONTRIBUTING.md). Stop the endpoint with ts_admin_stop.
 */
#ifndef TS_SHARD_ADMIN_H
#define TS_SHARD_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "ts_admin.h"
#include "ts_config.h"

/* Seconds without a publish after which /livez says the loop is stalled. */
#define TS_SHARD_ADMIN_STALL_S 10.0

/* Serve shard `shard` of cfg on cfg->ps_http[shard]. Returns 0, TS_ENOMEM, TS_ECONFIG
 * (address) or a negative errno (bind) with errmsg; cfg must outlive the endpoint. Until
 * the first publish every page but /livez answers 503. */
int ts_shard_admin_start(ts_admin_t **out, const ts_config_t *cfg, uint32_t shard, char *errmsg,
                         size_t errlen);

#endif
