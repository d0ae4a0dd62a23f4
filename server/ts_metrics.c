#include "ts_metrics.h"

#include "ts_msg.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "ts_build_config.h"
#include "ts_err.h"
#include "ts_frame.h"

#define CODE_BASE 30000 /* TS_E* codes are -(30000 + n) */

static const char *const req_names[TS_METRICS_REQ__COUNT] = {
    [TS_METRICS_REQ_OTHER] = "other",         [TS_METRICS_REQ_PUSH] = "push",
    [TS_METRICS_REQ_PULL] = "pull",           [TS_METRICS_REQ_DECLARE] = "declare",
    [TS_METRICS_REQ_HEARTBEAT] = "heartbeat", [TS_METRICS_REQ_STATUS] = "status",
    [TS_METRICS_REQ_HANDSHAKE] = "handshake",
    [TS_METRICS_REQ_SPARSE_PULL] = "sparse_pull",
    [TS_METRICS_REQ_SPARSE_PUSH] = "sparse_push",
};

static const double barrier_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
static const double checkpoint_bounds[] = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300};
/* How late the shard's tick ran: a healthy loop is within a few ms, a second is a stall. */
static const double loop_lag_bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25,  0.5,   1,    2.5,   5,    10};

void ts_metrics_init(ts_metrics_t *m) {
  memset(m, 0, sizeof *m);
  ts_prom_hist_init(&m->push_duration, ts_prom_duration_bounds, ts_prom_num_duration_bounds);
  ts_prom_hist_init(&m->pull_duration, ts_prom_duration_bounds, ts_prom_num_duration_bounds);
  ts_prom_hist_init(&m->barrier_wait, barrier_bounds, sizeof barrier_bounds / sizeof *barrier_bounds);
  ts_prom_hist_init(&m->checkpoint_duration, checkpoint_bounds,
                    sizeof checkpoint_bounds / sizeof *checkpoint_bounds);
  ts_prom_hist_init(&m->loop_lag, loop_lag_bounds, sizeof loop_lag_bounds / sizeof *loop_lag_bounds);
}

/* The metrics column of TS_FRAME_MAP (proto/ts_frame.h). */
ts_metrics_req_t ts_metrics_req_of(int type) {
  switch (type) {
#define REQ_CASE_(name, value, desc, metrics, dir, data) \
  case TS_MSG_##name:                                    \
    return TS_METRICS_REQ_##metrics;
    TS_FRAME_MAP(REQ_CASE_)
#undef REQ_CASE_
    default:
      return TS_METRICS_REQ_OTHER;
  }
}

static unsigned code_index(int code) {
  int i = -code - CODE_BASE;
  return i > 0 && i < TS_METRICS_NUM_CODES ? (unsigned)i : 0;
}

void ts_metrics_refused(ts_metrics_t *m, ts_metrics_req_t kind, int code) {
  if ((unsigned)kind >= TS_METRICS_REQ__COUNT) kind = TS_METRICS_REQ_OTHER;
  m->refused[kind][code_index(code)]++;
}

void ts_metrics_rejected(ts_metrics_t *m, int code) { m->rejected[code_index(code)]++; }

/* The reason label of a code index: the error's name without its E, in lower case
 * ("ENONFINITE" -> "nonfinite"); "other" for index 0. */
static void reason_of(unsigned idx, char *out, size_t n) {
  if (idx == 0) {
    snprintf(out, n, "other");
    return;
  }
  const char *name = ts_err_name(-(int)(CODE_BASE + idx));
  if (name[0] == 'E') name++;
  size_t i = 0;
  for (; name[i] && i + 1 < n; i++) out[i] = (char)tolower((unsigned char)name[i]);
  out[i] = 0;
}

static void counter1(ts_buf_t *b, const char *name, const char *help, double v) {
  ts_prom_family(b, name, "counter", help);
  ts_prom_sample(b, name, NULL, v);
}

static void gauge1(ts_buf_t *b, const char *name, const char *help, double v) {
  ts_prom_family(b, name, "gauge", help);
  ts_prom_sample(b, name, NULL, v);
}

/* Embedding tables (docs/architecture.md, "Tables"): a series per table, by name. */
static void render_tables(ts_buf_t *b, const Tessera__ShardStatus *st) {
  static const struct {
    const char *name, *type, *help;
  } fams[] = {
      {"tessera_ps_table_rows", "gauge", "Rows an embedding table holds on this shard."},
      {"tessera_ps_table_bytes", "gauge",
       "Memory an embedding table holds on this shard: rows, optimizer state, index, "
       "admission sketch and sync accumulator (all tables within server.max_table_bytes)."},
      {"tessera_ps_table_version", "gauge",
       "An embedding table's version on this shard: sync, its closed steps; else pushes applied."},
      {"tessera_ps_table_rows_created_total", "counter", "Rows made (admitted keys)."},
      {"tessera_ps_table_rows_evicted_total", "counter",
       "Rows evicted: steps to live, max_rows and the byte budget."},
      {"tessera_ps_table_rows_filtered_total", "counter",
       "Gradient rows dropped for keys not admitted (or finding no room)."},
  };
  char esc[300], lab[320];
  for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
    ts_prom_family(b, fams[f].name, fams[f].type, fams[f].help);
    for (size_t i = 0; i < st->n_tables; i++) {
      const Tessera__TableStatus *t = st->tables[i];
      const uint64_t v[] = {t->rows, t->bytes, t->version, t->created, t->evicted, t->filtered};
      snprintf(lab, sizeof lab, "table=\"%s\"", ts_prom_label_escape(t->name, esc, sizeof esc));
      ts_prom_sample(b, fams[f].name, lab, (double)v[f]);
    }
  }
}

void ts_metrics_render(ts_buf_t *b, const ts_metrics_t *m, const Tessera__ShardStatus *st) {
  char lab[160], reason[48];
  ts_prom_family(b, "tessera_build_info", "gauge",
                 "Build of this daemon: version, role and whether the CUDA back end is built.");
  snprintf(lab, sizeof lab, "version=\"%s\",role=\"ps\",cuda=\"%s\"", TS_VERSION,
           TS_HAVE_CUDA ? "yes" : "no");
  ts_prom_sample(b, "tessera_build_info", lab, 1);

  if (st) {
    ts_prom_family(b, "tessera_ps_info", "gauge", "This shard's index, the shard count and the training mode.");
    snprintf(lab, sizeof lab, "shard=\"%u\",shards=\"%u\",mode=\"%s\"", st->shard, st->num_shards,
             ts_msg_mode_name(st->mode));
    ts_prom_sample(b, "tessera_ps_info", lab, 1);
    gauge1(b, "tessera_ps_step", "Global step: the lowest partition version in sync mode, pushes applied otherwise.",
           (double)st->step);
    gauge1(b, "tessera_ps_partition_version_min", "Lowest version (update count) of this shard's partitions.",
           (double)st->version);
    uint32_t live = 0;
    for (size_t i = 0; i < st->n_workers; i++) live += st->workers[i]->alive;
    gauge1(b, "tessera_ps_live_workers", "Workers connected, heartbeating and not done.", live);
    gauge1(b, "tessera_ps_expected_workers", "Workers of the job (cluster.workers).", st->num_workers);
    gauge1(b, "tessera_ps_connections", "Open client connections (workers and admin).",
           (double)st->connections);
    gauge1(b, "tessera_ps_tensors", "Tensors declared.", st->tensors);
    gauge1(b, "tessera_ps_partitions", "Partitions held by this shard.", st->partitions);
    gauge1(b, "tessera_ps_parameters_bytes", "Bytes of parameters held by this shard (without optimizer state).",
           (double)st->bytes);
    gauge1(b, "tessera_ps_barrier_waiting_workers", "Sync mode: live workers the open barrier still waits for.",
           (double)st->n_barrier_waiting_for);
    counter1(b, "tessera_ps_stale_gradients_dropped_total",
             "Gradient partitions dropped because they were computed for an older step.",
             (double)st->stale_dropped);    if (st->n_tables > 0) render_tables(b, st);
  }

  /* Requests by result; refusals are broken down by reason below. */
  uint64_t refused_kind[TS_METRICS_REQ__COUNT] = {0};
  for (int k = 0; k < TS_METRICS_REQ__COUNT; k++)
    for (int c = 0; c < TS_METRICS_NUM_CODES; c++) refused_kind[k] += m->refused[k][c];
  ts_prom_family(b, "tessera_ps_push_requests_total", "counter", "Push requests by result.");
  ts_prom_sample(b, "tessera_ps_push_requests_total", "result=\"ok\"", st ? (double)st->pushes : 0);
  ts_prom_sample(b, "tessera_ps_push_requests_total", "result=\"refused\"",
                 (double)refused_kind[TS_METRICS_REQ_PUSH]);
  ts_prom_family(b, "tessera_ps_pull_requests_total", "counter", "Pull requests by result.");
  ts_prom_sample(b, "tessera_ps_pull_requests_total", "result=\"ok\"", st ? (double)st->pulls : 0);
  ts_prom_sample(b, "tessera_ps_pull_requests_total", "result=\"refused\"",
                 (double)refused_kind[TS_METRICS_REQ_PULL]);

  static const char *const part_results[4] = {"applied", "accumulated", "stale", "duplicate"};
  ts_prom_family(b, "tessera_ps_pushed_partitions_total", "counter",
                 "Gradient partitions received in accepted pushes, by outcome.");
  for (int i = 0; i < 4; i++) {
    snprintf(lab, sizeof lab, "result=\"%s\"", part_results[i]);
    ts_prom_sample(b, "tessera_ps_pushed_partitions_total", lab, (double)m->push_parts[i]);
  }

  counter1(b, "tessera_ps_push_duplicates_total",
           "Pushes with partitions not applied again because their push id already was (a "
           "client's retry; server.push_dedup_clients).",
           (double)m->push_duplicates);
  counter1(b, "tessera_ps_push_dedup_evictions_total",
           "Clients whose applied push ids were forgotten to make room for another client of "
           "the same worker task (server.push_dedup_clients).",
           (double)m->push_dedup_evictions);
  gauge1(b, "tessera_ps_push_dedup_bytes",
         "Memory of the applied push ids remembered for retries (server.push_dedup_clients).",
         (double)m->push_dedup_bytes);

  ts_prom_family(b, "tessera_ps_push_waits_total", "counter",
                 "Pushes that waited: for a pull reply being written from their partition, or "
                 "for a staging buffer.");
  ts_prom_sample(b, "tessera_ps_push_waits_total", "reason=\"pull_reply\"",
                 (double)m->push_waits_reply);
  ts_prom_sample(b, "tessera_ps_push_waits_total", "reason=\"staging\"",
                 (double)m->push_waits_staging);
  ts_prom_family(b, "tessera_ps_staging_bytes", "gauge",
                 "Bytes of the buffers pushes are read into (a pool shared by all connections).");
  ts_prom_sample(b, "tessera_ps_staging_bytes", NULL, (double)m->staging_bytes);

  gauge1(b, "tessera_ps_staging_buffers_in_use",
         "Staging buffers held by pushes being read (server.push_min_bytes_per_s).",
         (double)m->staging_in_use);
  gauge1(b, "tessera_ps_reply_queue_memory_bytes",
         "Memory of the replies queued to all connections (server.max_reply_bytes).",
         (double)m->reply_memory);
  gauge1(b, "tessera_ps_pull_replies_writing",
         "Pull replies still being written, each holding its partitions' updates "
         "(server.pull_hold_timeout_s).",
         (double)m->pull_replies_writing);
  gauge1(b, "tessera_ps_parked_pulls",
         "Pulls waiting for a version or clock (server.max_parked_pulls per connection).",
         (double)m->parked_pulls);
  static const char *const limit_names[TS_METRICS_LIMIT__COUNT] = {
      [TS_METRICS_LIMIT_PUSH_RATE] = "push_min_bytes_per_s",
      [TS_METRICS_LIMIT_PUSH_CONTENDED] = "push_contended_min_bytes_per_s",
      [TS_METRICS_LIMIT_PULL_HOLD] = "pull_hold_timeout_s",
      [TS_METRICS_LIMIT_REPLY_FULL] = "reply_full_timeout_s",
      [TS_METRICS_LIMIT_REPLY_TOTAL] = "max_reply_bytes",
      [TS_METRICS_LIMIT_STATUS_REPLY] = "max_status_reply_bytes",
      [TS_METRICS_LIMIT_PULL_REPEATS] = "pull_repeats",
      [TS_METRICS_LIMIT_PARKED_PULLS] = "max_parked_pulls",
  };
  ts_prom_family(b, "tessera_ps_limit_drops_total", "counter",
                 "Connections closed for holding more than a per-peer limit allows, by limit.");
  for (int i = 0; i <= TS_METRICS_LIMIT_STATUS_REPLY; i++) {
    snprintf(lab, sizeof lab, "limit=\"%s\"", limit_names[i]);
    ts_prom_sample(b, "tessera_ps_limit_drops_total", lab, (double)m->limit_drops[i]);
  }
  ts_prom_family(b, "tessera_ps_limit_refusals_total", "counter",
                 "Requests refused by a per-peer limit, by limit (also counted in "
                 "tessera_ps_refused_requests_total).");
  for (int i = TS_METRICS_LIMIT_PULL_REPEATS; i < TS_METRICS_LIMIT__COUNT; i++) {
    snprintf(lab, sizeof lab, "limit=\"%s\"", limit_names[i]);
    ts_prom_sample(b, "tessera_ps_limit_refusals_total", lab, (double)m->limit_refusals[i]);
  }

  /* The refusals every operator looks for always have a series, even at zero. */
  static const int push_reasons[] = {TS_ENONFINITE, TS_ESHAPE, TS_ENOTENSOR, TS_EFUTURE};
  static const int declare_reasons[] = {TS_ETOOBIG, TS_ESHAPE};
  ts_prom_family(b, "tessera_ps_model_bytes", "gauge",
                 "Bytes the declared model holds on this shard: parameters, optimizer state "
                 "and sync accumulators.");
  ts_prom_sample(b, "tessera_ps_model_bytes", NULL, (double)m->model_bytes);
  ts_prom_family(b, "tessera_ps_model_bytes_limit", "gauge",
                 "Most a declared model may hold on this shard (server.max_model_bytes).");
  ts_prom_sample(b, "tessera_ps_model_bytes_limit", NULL, (double)m->model_bytes_limit);
  counter1(b, "tessera_ps_model_resets_total",
           "Declared models dropped by an admin (psctl model reset).", (double)m->model_resets);

  ts_prom_family(b, "tessera_ps_refused_requests_total", "counter",
                 "Requests answered with an error, by request and reason; request=\"push\" are "
                 "refused gradients.");
  for (int k = 0; k < TS_METRICS_REQ__COUNT; k++) {
    for (unsigned c = 0; c < TS_METRICS_NUM_CODES; c++) {
      bool always = false;
      if (k == TS_METRICS_REQ_PUSH)
        for (size_t i = 0; i < sizeof push_reasons / sizeof *push_reasons; i++)
          always |= code_index(push_reasons[i]) == c;
      if (k == TS_METRICS_REQ_DECLARE)
        for (size_t i = 0; i < sizeof declare_reasons / sizeof *declare_reasons; i++)
          always |= code_index(declare_reasons[i]) == c;
      if (!m->refused[k][c] && !always) continue;
      reason_of(c, reason, sizeof reason);
      snprintf(lab, sizeof lab, "request=\"%s\",reason=\"%s\"", req_names[k], reason);
      ts_prom_sample(b, "tessera_ps_refused_requests_total", lab, (double)m->refused[k][c]);
    }
  }
  ts_prom_family(b, "tessera_ps_rejected_frames_total", "counter",
                 "Protocol violations that closed their connection, by reason.");
  for (unsigned c = 0; c < TS_METRICS_NUM_CODES; c++) {
    /* The reasons docs/operations.md names are there from the start, at 0. */
    if (!m->rejected[c] && c != code_index(TS_EPROTO) && c != code_index(TS_ETOOBIG)) continue;
    reason_of(c, reason, sizeof reason);
    snprintf(lab, sizeof lab, "reason=\"%s\"", reason);
    ts_prom_sample(b, "tessera_ps_rejected_frames_total", lab, (double)m->rejected[c]);
  }
  counter1(b, "tessera_ps_auth_failures_total", "Handshakes refused for a wrong token.",
           (double)m->auth_failures);
  gauge1(b, "tessera_ps_preauth_connections",
         "Connections waiting for their handshake (server.max_preauth_connections).",
         (double)m->preauth_connections);
  static const char *const drop_reasons[TS_METRICS_DROP__COUNT] = {
      "handshake_timeout", "preauth_quota", "slow_frame", "max_connections"};
  ts_prom_family(b, "tessera_ps_connections_dropped_total", "counter",
                 "Connections closed or refused to protect the shard, by the limit that did it.");
  for (int r = 0; r < TS_METRICS_DROP__COUNT; r++) {
    snprintf(lab, sizeof lab, "reason=\"%s\"", drop_reasons[r]);
    ts_prom_sample(b, "tessera_ps_connections_dropped_total", lab, (double)m->dropped[r]);
  }
  counter1(b, "tessera_ps_received_bytes_total", "Bytes received from clients.", (double)m->bytes_in);
  counter1(b, "tessera_ps_sent_bytes_total", "Bytes sent to clients.", (double)m->bytes_out);

  ts_prom_family(b, "tessera_ps_request_duration_seconds", "histogram",
                 "Time from a request's last byte to its reply being queued; a pull that waits "
                 "for its version includes the wait.");
  ts_prom_hist_samples(b, "tessera_ps_request_duration_seconds", "request=\"push\"", &m->push_duration);
  ts_prom_hist_samples(b, "tessera_ps_request_duration_seconds", "request=\"pull\"", &m->pull_duration);
  ts_prom_family(b, "tessera_ps_barrier_wait_seconds", "histogram",
                 "Sync mode: time from a partition's first gradient of a step to its barrier "
                 "closing, per partition and step.");
  ts_prom_hist_samples(b, "tessera_ps_barrier_wait_seconds", NULL, &m->barrier_wait);
  ts_prom_family(b, "tessera_ps_loop_lag_seconds", "histogram",
                 "How late the shard's periodic tick (every 100 ms) ran: time the event loop "
                 "spent elsewhere (a long callback, the host descheduling the process), during "
                 "which it read and sent nothing.");
  ts_prom_hist_samples(b, "tessera_ps_loop_lag_seconds", NULL, &m->loop_lag);

  ts_prom_family(b, "tessera_ps_checkpoints_total", "counter", "Checkpoints written, by result.");
  ts_prom_sample(b, "tessera_ps_checkpoints_total", "result=\"ok\"", (double)m->checkpoints_ok);
  ts_prom_sample(b, "tessera_ps_checkpoints_total", "result=\"error\"", (double)m->checkpoints_failed);
  ts_prom_family(b, "tessera_ps_checkpoint_duration_seconds", "histogram",
                 "Time to write one checkpoint of this shard.");
  ts_prom_hist_samples(b, "tessera_ps_checkpoint_duration_seconds", NULL, &m->checkpoint_duration);
  if (m->checkpoint_last_success_unix > 0)
    gauge1(b, "tessera_ps_checkpoint_last_success_timestamp_seconds",
           "When the last checkpoint was written, in seconds since the epoch.",
           m->checkpoint_last_success_unix);
  ts_prom_process(b);
}
