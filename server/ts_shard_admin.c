#include "ts_shard_admin.h"

#include <stdio.h>

#include "ts_alloc.h"
#include "ts_err.h"
#include "ts_job_status.h"
#include "ts_metrics.h"
#include "ts_status.h"

/* The role's ctx: which shard of which job. */
typedef struct {
  const ts_config_t *cfg;
  uint32_t shard;
} shard_ctx_t;

/* The published ShardStatus, unpacked (NULL when none was published or it does not
 * unpack); free with tessera__shard_status__free_unpacked. */
static Tessera__ShardStatus *unpack_status(const ts_admin_view_t *v) {
  if (!v->blob_len) return NULL;
  return tessera__shard_status__unpack(&ts_protobuf_allocator, v->blob_len, v->blob);
}

static void render_metrics(const ts_admin_view_t *v, ts_buf_t *b) {
  Tessera__ShardStatus *st = unpack_status(v);
  ts_metrics_render(b, v->snap, st);
  if (st) tessera__shard_status__free_unpacked(st, &ts_protobuf_allocator);
}

static cJSON *render_status(const ts_admin_view_t *v) {
  const shard_ctx_t *ctx = v->ctx;
  Tessera__ShardStatus *st = unpack_status(v);
  ts_client_shard_status_t *pub = NULL;
  int rc = st ? ts_status_from_pb(st, &pub) : 0;
  if (st) tessera__shard_status__free_unpacked(st, &ts_protobuf_allocator);
  if (rc < 0) return NULL;
  ts_job_status_shard_t sh = {.index = ctx->shard,
                              .address = ctx->cfg->ps[ctx->shard],
                              .st = pub,
                              .error = pub ? NULL : "no status published"};
  ts_job_status_view_t sv = {.shards = &sh,
                             .num_shards = 1,
                             .num_workers = ctx->cfg->num_workers,
                             .configured_mode = ts_mode_name(ctx->cfg->mode)};
  cJSON *j = ts_job_status_json_job(&sv, true);
  ts_free(pub);
  return j;
}

static const ts_admin_role_t shard_role = {
    .title = "Tessera parameter-server shard",
    .metrics_prefix = "tessera_ps_admin",
    .snap_size = sizeof(ts_metrics_t),
    .stall_s = TS_SHARD_ADMIN_STALL_S,
    .metrics = render_metrics,
    .status = render_status,
};

int ts_shard_admin_start(ts_admin_t **out, const ts_config_t *cfg, uint32_t shard, char *errmsg,
                         size_t errlen) {
  shard_ctx_t ctx = {.cfg = cfg, .shard = shard};
  int rc = ts_admin_new(out, &shard_role, &ctx, sizeof ctx);
  if (rc < 0) {
    snprintf(errmsg, errlen, "admin endpoint: %s", ts_strerror(rc));
    return rc;
  }
  ts_http_limits_t lim = {.max_connections = (unsigned)cfg->http_max_connections,
                          .max_connections_per_ip = (unsigned)cfg->http_max_connections_per_ip,
                          .request_timeout_s = cfg->http_request_timeout_s,
                          .tls_cert_file = cfg->tls ? cfg->tls_cert_file : NULL,
                          .tls_key_file = cfg->tls ? cfg->tls_key_file : NULL};
  rc = ts_admin_listen(*out, cfg->ps_http[shard], &lim, errmsg, errlen);
  if (rc < 0) {
    ts_errmsg_wrapf(errmsg, errlen, "cluster.ps_http[%u]", shard);
    ts_admin_stop(*out);
    *out = NULL;
  }
  return rc;
}
