/*
 * ps-server internals: the state the server's modules share and the functions they call on
 * each other (the way libuv's uv-common.h does). Not part of the server's interface
 * (ts_server.h); nothing outside server/ includes it.
 *
 * Modules, by job:
 *   ts_server.c        lifecycle: start, stop, signals, the tick (heartbeats, barrier
 *                      timeouts, stalled peers); drives ts_barrier from the loop's clock
 *   ts_session.c       accept, the handshake and authentication, frame dispatch, the small
 *                      requests (heartbeat), error replies, close
 *   ts_declare.c       the model's lifecycle: a Declare checked against the budget, built in
 *                      the thread pool, concurrent declares; psctl model reset
 *   ts_push_rx.c       a push received piece by piece into staging buffers, applied as it lands
 *   ts_sparse_push.c   a table's row gradients received piece by piece (the staging pool
 *                      of ts_push_rx.c), applied or accumulated
 *   ts_sparse_pull.c   a table's rows for a list of keys: keys in a budgeted buffer, the
 *                      reply copied out of the table; expiry swept from the tick
 *   ts_table_keys.c    a page of a table's keys (evaluation, export)
 *   ts_pull.c          pull replies written straight from parameter memory
 *   ts_waitq.c         pulls parked until their version (or ssp clock) is there
 *   ts_sync.c          the sync barrier applied to the store: steps closed, pulls answered
 *   ts_replyq.c        the memory budgets of the replies queued to peers
 *   ts_shard_status.c  the ShardStatus for STATUS requests, /status, /metrics and systemd
 *   ts_ckpt_sched.c    when checkpoints are written: the timer, psctl, shutdown, signals
 * and what they use, each with a header of its own: the store (ts_store.h: the modules above
 * call its functions and never look inside a partition), the pure rules of who is waited
 * for (ts_barrier.h) and of retried pushes (ts_pushid.h), staging buffers (ts_stage.h),
 * checkpoints (ts_ckpt.h: store to snapshot and back; ts_ckpt_file.h: the format;
 * ts_ckpt_reshard.h), metrics and the admin endpoint.
 *
 * Everything runs on the shard's one loop thread (CONTRIBUTING.md); only a checkpoint's
 * write (on a snapshot) and a declared model's allocation and initialisation (on a model
 * not yet the store's) run in the thread pool.
 *
 * Message ownership: a request handler (ts_*_handle, ts_session.c's handlers) takes the
 * decoded message and frees it (ts_msg_free) before it returns. A pull that must wait is
 * parked as a compact copy (ts_pull_req_t), which the wait queue owns until the pull is
 * answered, times out or its session closes.
 */
#ifndef TS_SERVER_INT_H
#define TS_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "tessera.pb-c.h"
#include "ts_auth.h"
#include "ts_barrier.h"
#include "ts_conn.h"
#include "ts_metrics.h"
#include "ts_pushid.h"
#include "ts_server.h"
#include "ts_shard_admin.h"
#include "ts_stage.h"
#include "ts_store.h"

#define TS_SERVER_TICK_MS 100
/* Sparse pull reply buffers a shard keeps for reuse: at most this many, of at most
 * TS_REPLY_CACHE_BYTES together. */
#define TS_REPLY_CACHE_BUFS 8
#define TS_REPLY_CACHE_BYTES (UINT64_C(64) << 20)

typedef struct ts_session ts_session_t;

/* The model's lifecycle (ts_declare.c). */
typedef struct ts_declare_build ts_declare_build_t;
typedef struct {
  ts_declare_build_t *build; /* the declare being built in the thread pool, or NULL */
  /* psctl model reset waiting for the partitions to be free (pull replies written, worker
   * connections closed) */
  bool reset_pending;
  uv_timer_t *reset_timer; /* polls while a reset waits (owned; freed when closed) */
  uint64_t reset_session, reset_request, reset_deadline_ms;
  uint32_t reset_closed;
} ts_declare_state_t;

/* One partition a pull asks for. */
typedef struct {
  uint32_t tensor, part;
} ts_pull_slice_t;

/* A pull, as much of it as answering needs: the decoded protobuf (with whatever unknown
 * fields its peer added) is freed as soon as this is made (ts_pull_handle). Parked, it
 * waits in srv->waiting (ts_waitq.c) until it can be answered. One allocation. */
typedef struct ts_pull_req {
  struct ts_pull_req *next;
  ts_session_t *sess;
  uint64_t request_id, min_version, clock;
  uint64_t deadline_ms;
  uint64_t start_ns; /* when the request arrived, for the latency histogram */
  /* A SparsePull (ts_sparse_pull.c): table `table`, nkeys keys (checked) in the same
   * allocation, after the slices; key_bytes of key_task's share of keys are its to give
   * back. */
  bool sparse;
  bool read_only; /* SparsePull.read_only: nothing made or refreshed */
  uint32_t table;
  uint64_t *keys;
  size_t nkeys;
  uint64_t key_bytes;
  int key_task; /* whose share they are: a worker task, or -1 (the others' pool) */
  size_t n;
  ts_pull_slice_t slices[];
} ts_pull_req_t;

/* A pull reply being written (ts_pull.c): its partitions hold a writer each until their
 * bytes are out. Listed in its session so the tick can find a reader that keeps an update
 * waiting too long (server.pull_hold_timeout_s). */
typedef struct ts_pull_write ts_pull_write_t;

/* What a worker last told us, for status; its liveness is srv->barrier's. step is the
 * step it finished last: set by every push this shard accepts from it (the push's step + 1,
 * so it moves with the job's step, not at the heartbeat's pace) and raised, never
 * lowered, by heartbeats (which carry the progress of the worker's last log interval). */
typedef struct {
  uint64_t step;
  double loss, examples_per_sec, progress;
  uint64_t stale_dropped;
  bool reported;   /* a heartbeat carried a progress report (loss and speed are known) */
  bool step_known; /* step came from a report or an accepted push */
  char identity[128];
  char device[64]; /* the device it reported ("" until then) */
  bool has_auc, has_test_auc; /* a CTR model's AUC (Heartbeat.auc, .test_auc) */
  double auc, test_auc, test_logloss;
  ts_session_t *holder; /* the connection that speaks for the task (ts_identity.h), or NULL */
  uint64_t sparse_key_bytes; /* keys its SparsePulls hold being read or parked (its share) */
} ts_worker_info_t;

/* A push is received piece by piece (docs/architecture.md, "Pushes"): its
 * partitions are grouped into pieces of at most one staging buffer, each piece is read into
 * the buffer, checked and applied, and the buffer is reused for the next piece. */
typedef struct {
  bool active;            /* between ts_push_rx_meta and ts_push_rx_handle */
  const Tessera__Push *m; /* its meta (the connection's until on_frame) */
  ts_stage_waiter_t wait; /* queued for a staging buffer */
  float *buf;             /* the staging buffer, while active */
  size_t *first;          /* piece k holds slices [first[k], first[k + 1]) */
  size_t cap;             /* entries of first */
  size_t npieces;
  uv_buf_t *iov;       /* the payload in chunks (a piece is one or more) */
  size_t *chunk_off;   /* chunk k lands at buf + chunk_off[k] (floats) */
  size_t *chunk_piece; /* and belongs to that piece */
  size_t chunk_cap, off_cap, piece_cap, nchunks;
  bool piece_bad;               /* a chunk of the piece being read holds NaN or Inf */
  size_t piece;                 /* the piece being applied */
  size_t next;                  /* next slice of it to apply (a piece is checked whole first) */
  size_t next_off;              /* its offset in buf, in floats */
  uint64_t rate_ms;             /* holding a buffer: the start of the rate window */
  uint64_t rate_bytes;          /* and conn.bytes_in then */
  ts_spart_t *held_on;          /* async: partition whose pull replies it waits for */
  ts_session_t *held_next;      /* srv->held list */
  Tessera__PushResult *results; /* one per slice */
  size_t results_cap;
  uint64_t start_ns; /* when its meta arrived (uv_hrtime): the latency's start */
  uint64_t stale, refused, applied_slices;
  uint64_t duplicates; /* partitions not applied again: their push id was (ts_pushid.h) */
  char refused_detail[256]; /* the first refused piece */
  int refuse_code;          /* refused whole at the meta (payload discarded) */
  /* A SparsePush (ts_sparse_push.c) instead of a Push: its meta, table, records per piece
   * (first[] counts records), the last key checked, what it did, and the first refusal. */
  bool sparse;
  const Tessera__SparsePush *sm;
  uint32_t table;
  size_t rec_floats;            /* floats per record: 2 (the key) + dim */
  uint64_t sp_prev_key;
  bool sp_have_prev;
  Tessera__PushResult sp_result; /* decided at the meta: ACCUMULATED, APPLIED, STALE, DUPLICATE */
  uint64_t sp_rows, sp_filtered, sp_pieces_applied;
  int sp_bad_code;              /* a piece refused (EINVAL, ENONFINITE): the rest is dropped */
  uint64_t sp_pull_id;          /* a push+pull in one frame: the pull's request id, else 0 */
  struct ts_rows_reply *sp_reply; /* and its rows as the pieces are applied, */
  uint64_t sp_reply_bytes;        /* these bytes of srv->fused_rows_bytes */
  uint64_t sp_version0;           /* the table's version when its first piece was applied */
  uint64_t sp_t0;                 /* and when (uv_hrtime) */
  /* Its push id, client and piece (for ts_sparse_push_abort: the meta is gone by then); a
   * retry of a push cut off after some records (ts_pushid_part_t) skips the records up to
   * sp_resume_key; the last key applied. */
  uint64_t sp_push_id, sp_client;
  uint32_t sp_piece;
  bool sp_resumed, sp_skipping;
  uint64_t sp_resume_key;
  bool sp_applied_any;
  uint64_t sp_last_key;
  char refuse_msg[256];
} ts_push_rx_t;

struct ts_session {
  ts_conn_t conn;
  ts_server_t *srv;
  uint64_t id; /* unique per server: replies after background work find it by id */
  ts_session_t *prev, *next;
  /* Until its handshake succeeds a session is also on srv's pre-authentication FIFO
   * (oldest first): it has its own quota and deadline (ts_session_preauth_expire). */
  ts_session_t *pa_prev, *pa_next;
  bool preauth;       /* on that FIFO */
  bool counted;       /* authenticated: counts against server.max_connections */
  uint64_t accepted_ms;
  bool handshaken;
  Tessera__Role role;
  int task;
  int holder_of;    /* the task it holds (ts_identity.h), -1 when none */
  bool task_proven; /* its handshake used the task's key, not the shared token */
  bool dup_warned;  /* a second connection for its task was refused and logged */
  bool read_only;   /* an admin client with the worker token: status only */
  uint8_t nonce[TS_AUTH_NONCE_LEN];
  uint64_t frame_ns; /* when its last frame was read (uv_hrtime), for the latencies */
  ts_push_rx_t rx;   /* the push being received */
  uint32_t parked;   /* its pulls in srv->waiting (server.max_parked_pulls) */
  ts_pull_write_t *writes; /* its pull replies being written, oldest first */
  ts_pull_req_t *spull;    /* a SparsePull whose keys are being read (ts_sparse_pull.c) */
  uv_buf_t spull_iov;      /* where its keys land */
  int spull_code;          /* refused at its meta (its keys are read and dropped) */
  char spull_msg[256];
  uint64_t reply_full_ms;  /* since when its queued replies are over half their budget (0: not) */
  uint64_t status_mem;     /* of reply_mem, its queued Status replies' (ts_shard_status.c) */
  /* Log lines this peer causes (ts_session_log_allowed): a token bucket, and the lines
   * suppressed since the last one written. */
  double log_tokens;
  uint64_t log_refill_ms, log_suppressed;
};

struct ts_server {
  uv_loop_t *loop;
  const ts_config_t *cfg;
  uint32_t shard;
  uv_tcp_t listener;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint;
  int open_handles; /* libuv handles opened and not yet closed (ts_server_free checks) */
  bool stopping;

  ts_store_t store;
  ts_declare_state_t model; /* a declare being built, a reset waiting (ts_declare.c) */
  ts_stage_t stage;   /* staging buffers for push payloads (ts_stage.h) */
  ts_session_t *held; /* sessions whose push waits for pull replies to be written */
  ts_session_t *sessions;
  size_t num_sessions;             /* every open connection */
  ts_session_t *preauth_head, *preauth_tail; /* waiting for their handshake, oldest first */
  size_t num_preauth;
  size_t num_authed;               /* authenticated: against server.max_connections */
  ts_pull_req_t *waiting;
  size_t num_parked;        /* pulls in waiting */
  size_t pull_writes;       /* pull replies being written (ts_pull_write_t) */
  uint64_t sparse_key_others; /* keys held by SparsePulls being read or parked of connections
                                 that are no worker task's (a task's: ts_worker_info_t) */
  uint64_t fused_rows_bytes; /* rows held by push+pulls in one frame being read */
  /* Sparse pull replies' buffers kept for the next ones (ts_sparse_pull.c): fresh pages
   * cost a page fault each */
  struct ts_rows_reply *reply_cache[TS_REPLY_CACHE_BUFS];
  size_t reply_cache_bytes;
  uint32_t hot_ticks;        /* ticks since the tables' hottest keys were last decayed */
  uint64_t reply_mem;       /* memory of the replies queued to all connections (ts_conn.h) */
  uint64_t status_reply_mem; /* of it, Status replies' (server.max_status_reply_bytes) */
  uint64_t last_tick_ms;    /* when the tick last ran (ts_server.c: the loop's lag) */
  ts_worker_info_t *workers;
  uint32_t num_workers;
  ts_barrier_t barrier; /* membership, liveness and the rules of who is waited for */
  ts_pushid_t pushids;  /* the push ids applied, per task and client (ts_pushid.h) */

  char *token, *admin_token;
  struct ts_tls_ctx *tls;    /* auth.tls: every connection speaks TLS with it */
  uint64_t started_ms;

  /* The end of the job (ts_session.c, handle_heartbeat): the worker shard 0 chose to
   * evaluate the final parameters (-1 until every worker finished), and the accuracy it
   * sent (any shard keeps it). */
  int final_reporter;
  uint64_t job_since_ms; /* start, or the last model reset: workers never seen since then
                          * count as finished after job.heartbeat_timeout_s */
  /* Sync: step 1 waits for every worker (job.start_timeout_s, ts_sync.c). */
  bool start_passed;       /* step 1 may close: every worker joined, or the wait is over */
  uint64_t start_wait_ms;  /* when the first barrier of step 1 opened (0: none yet) */
  uint64_t start_log_ms;   /* the last "waiting for its workers" notice */
  bool has_final_acc;
  double final_acc;
  bool final_refused_warned; /* a report was refused (warned once) */

  uint64_t pushes, pulls, rejected_frames, errors, nonfinite, auth_failures;
  uint64_t activity, activity_seen; /* frames and push chunks read, for busy-polling */
  char address[128];
  uint64_t incarnation;
  uint64_t next_session_id;

  /* checkpoints */
  uv_timer_t ckpt_timer;
  bool ckpt_busy;        /* a snapshot is being written */
  bool stop_after_ckpt;  /* a shutdown waits for it */
  uint64_t ckpt_seq;     /* sequence of the newest checkpoint on disk */
  uint64_t ckpt_base;    /* sequence of this model's last full checkpoint written (0: none) */
  uint32_t ckpt_since_full; /* increments written since it (checkpoint.full_every) */
  uint64_t ckpt_applied; /* ts_ckpt_changes at the last checkpoint written or restored */
  uint64_t ckpt_saved_step; /* the step it holds */
  uint32_t ckpt_failures;   /* attempts failed in a row since (0: the last one worked) */
  char ckpt_error[200];     /* the last failure's reason, e.g. "No space left on device" */
  int ckpt_final_tries;     /* attempts at the final checkpoint of a stop */
  char last_ckpt[600];
  uint64_t last_ckpt_ms; /* loop time of the last checkpoint written or restored */
  bool have_ckpt;
  uint64_t ckpts_written, restored_step;
  bool served_pull; /* the first pull was answered (logged once, with the delay) */

  /* Admin endpoint, metrics and systemd notification (ts_shard_admin.h, ts_metrics.h). */
  ts_metrics_t metrics;
  ts_admin_t *admin; /* NULL without cluster.ps_http */
  bool notify;       /* under systemd with a notify socket */
  uint64_t next_publish_ms, next_status_ms, watchdog_ms, next_watchdog_ms;
  char notify_status[160];
};

/* The loop's clock, the one time every rule of the server reads. */
static inline uint64_t ts_server_now_ms(const ts_server_t *srv) {
  return uv_now(srv->loop);
}

/* --- ts_sync.c ------------------------------------------------------------------------- */

/* Close the sync barriers (partitions' and tables') that have enough gradients (and, when timeouts, those open for
 * sync_timeout_s with at least one), then answer the pulls that waited for them. */
void ts_sync_check_barriers(ts_server_t *srv, bool timeouts);

/* A frame of `task` arrived (any task; admin sessions pass -1). */
void ts_sync_worker_seen(ts_server_t *srv, int task);

/* --- ts_server.c ----------------------------------------------------------------------- */

/* The one call from a handler back into the lifecycle: a stopping server closes its tick once the
 * last session is gone. */
void ts_server_stop_tick_when_idle(ts_server_t *srv);

/* --- ts_session.c ---------------------------------------------------------------------- */

/* The listener's connection callback: a new session, greeted with a Hello. */
void ts_session_accept(uv_stream_t *listener, int status);

/* From the tick: close the connections whose handshake is past server.handshake_timeout_s
 * (oldest first, each with an Error frame, a log line and a count). */
void ts_session_preauth_expire(ts_server_t *srv, uint64_t now_ms);

/* The session of id, or NULL when it has closed (replies after background work). */
ts_session_t *ts_session_find(ts_server_t *srv, uint64_t id);

/* Answer request_id, a request of frame type req_type (TS_MSG_PULL...), with an Error frame
 * (code, detail) and count it in /metrics under the request's label
 * (tessera_ps_refused_requests_total; the label comes from TS_FRAME_MAP). The type is the
 * caller's to name: replies after a wait or background work come long after the frame that
 * asked. When the reply cannot be queued, the connection is closed: its peer would
 * otherwise wait for an answer that never comes. */
void ts_session_reply_error(ts_session_t *s, uint16_t req_type, uint64_t request_id, int code,
                            const char *detail);

/* Admin requests that change the shard need the admin role and, when authentication is on,
 * an admin token. False: refused with an EPERM reply naming `what` (the caller frees its
 * message as usual). */
bool ts_session_admin_allowed(ts_session_t *s, uint16_t type, uint64_t request_id,
                              const char *what);

/* A reply could not be queued (rc from ts_conn_send): log it and close the connection. */
void ts_session_reply_failed(ts_session_t *s, uint16_t type, int rc);

/* Whether a log line this peer causes may be written: a burst of 20, then 2 a second, per
 * connection (ts_session_log asks only for the levels the log writes), so that a peer repeating a refused request cannot flood the log. A line
 * allowed after some were dropped is preceded by "suppressed N log lines about this peer";
 * the connection's close says how many were dropped since. */
bool ts_session_log_allowed(ts_session_t *s);
#define ts_session_log(s, level, ...)                                                  \
  do {                                                                                 \
    if (ts_log_enabled(level) && ts_session_log_allowed(s)) ts_log(level, __VA_ARGS__); \
  } while (0)

/* Queue a reply frame (no payload). When it cannot be queued the connection is closed, for
 * the same reason. Returns 0 or the negative code of ts_conn_send. */
int ts_session_reply(ts_session_t *s, uint16_t type, const ProtobufCMessage *msg);

/* --- ts_push_rx.c ---------------------------------------------------------------------- */

/* ts_conn's on_meta for a Push of a handshaken session: check it, cut it into pieces and
 * say where its payload goes (ts_conn.h). Remembers the meta's arrival for the latency. */
int ts_push_rx_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__Push *m,
                    const uv_buf_t **iov, unsigned *niov);

/* ts_conn's on_piece: chunk i of the payload has landed. */
int ts_push_rx_on_piece(ts_conn_t *c, unsigned i);

/* The whole push has been read: reply. Takes m and frees it. */
void ts_push_rx_handle(ts_session_t *s, Tessera__Push *m, bool discarded);

/* Pull replies finished writing from some partitions: go on with the pushes that waited. */
void ts_push_rx_wake_held(ts_server_t *srv);

/* The session closes: drop its push (held or being read) and give its buffers back. */
void ts_push_rx_close(ts_session_t *s);

/* From the tick: close the connections whose push holds a staging buffer while its bytes
 * arrive slower than server.push_min_bytes_per_s (a trickler keeps the pool from the
 * others), or, while other pushes wait for a buffer, slower than
 * server.push_contended_min_bytes_per_s (tricklers just above the floor holding the whole
 * pool; their buffers go to the pushes in line). Time the shard itself holds the connection back does not count. late_ms: how
 * late this tick runs; the loop did not run for that long, so it is taken out of every
 * push's window (the rate is over the time the shard was there to read), without resetting
 * the window (a lagging shard must not let a trickler escape the floor). */
void ts_push_rx_drop_slow(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms);

/* The staging pool as ts_sparse_push.c uses it too: set the pool up (sized for the largest
 * partition, at least 1 MiB); make room for n results and nchunks chunks in rx; take a
 * buffer for the push's first piece (0 and *iov pointed, TS_CONN_HOLD when queued, or a
 * negative code); after a piece, hand the buffer to a waiting push and queue again; give it
 * back. */
int ts_push_rx_stage_ready(ts_server_t *srv);
int ts_push_rx_reserve(ts_push_rx_t *rx, size_t n, size_t nchunks);
int ts_push_rx_acquire(ts_session_t *s, const uv_buf_t **iov, unsigned *niov);
int ts_push_rx_take_turns(ts_session_t *s);
void ts_push_rx_give_back(ts_server_t *srv, ts_push_rx_t *rx);

/* --- ts_sparse_push.c ------------------------------------------------------------------ */

/* SparsePush: the meta (checks that refuse the whole push before its payload: role, table,
 * width, sync step, a retried push id; then pieces of whole records), a piece landed (its
 * keys and gradients checked, then applied or accumulated), the whole frame read (reply). */
int ts_sparse_push_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__SparsePush *m,
                        const uv_buf_t **iov, unsigned *niov);
int ts_sparse_push_on_piece(ts_session_t *s, unsigned i);
void ts_sparse_push_handle(ts_session_t *s, Tessera__SparsePush *m, bool discarded);
/* The session closes: drop a push+pull's rows being filled. */
void ts_sparse_push_close(ts_session_t *s);
/* The connection closed: a push cut off after some of its records were applied is
 * remembered (ts_pushid_part_t) so its retry applies the rest only; async, the table's
 * version moves. Before ts_push_rx_close. */
void ts_sparse_push_abort(ts_session_t *s);

/* --- ts_sparse_pull.c ------------------------------------------------------------------ */

/* SparsePull: the meta (table, reply size, the key budget; the keys go into the request's
 * own buffer), then the whole frame (keys checked; answered or parked). */
int ts_sparse_pull_meta(ts_session_t *s, const ts_frame_header_t *h, const Tessera__SparsePull *m,
                        const uv_buf_t **iov, unsigned *niov);
void ts_sparse_pull_handle(ts_session_t *s, Tessera__SparsePull *m, bool discarded);
bool ts_sparse_pull_ready(ts_server_t *srv, const ts_pull_req_t *q);
void ts_sparse_pull_send(ts_session_t *s, const ts_pull_req_t *q);
/* The rows of a SparsePullReply (a SparsePull's, or a push+pull's in one frame), freed once
 * written; charged: what the connection's reply budget counts for it while it waits. */
typedef struct ts_rows_reply {
  size_t charged;
  size_t cap; /* floats it has room for */
  float rows[];
} ts_rows_reply_t;
/* Room for nfloats (a cached buffer when one fits), or NULL (out of memory). */
ts_rows_reply_t *ts_rows_reply_new(ts_server_t *srv, size_t nfloats);
/* The most bytes of rows one reply may carry (Hello.max_reply_rows): what
 * server.max_reply_bytes leaves of a reply charged to its connection while it is written
 * (past it the shard would close the connection), at most TS_MSG_MAX_SPARSE_REPLY. */
uint64_t ts_rows_reply_max(const ts_server_t *srv);
/* Whether a reply of nfloats rows is within ts_rows_reply_max. */
bool ts_rows_reply_fits(const ts_server_t *srv, size_t nfloats);
/* Done with rb: kept for a later reply while the cache has room, else freed. */
void ts_rows_reply_free(ts_server_t *srv, ts_rows_reply_t *rb);
/* Free the cached buffers (the server's end). */
void ts_rows_reply_cache_free(ts_server_t *srv);
/* Send rb as the SparsePullReply `request_id` of nkeys rows of table (width dim) at version:
 * the reply owns rb from here, sent or not. */
void ts_rows_reply_send(ts_session_t *s, ts_rows_reply_t *rb, uint64_t request_id,
                        uint32_t table, uint64_t nkeys, uint32_t dim, uint64_t version,
                        uint64_t start_ns);
/* Free a pull request (dense or sparse), giving its keys' budget back. */
void ts_pull_req_free(ts_server_t *srv, ts_pull_req_t *q);
/* The session closes: drop a SparsePull being read. */
void ts_sparse_pull_close(ts_session_t *s);

/* --- ts_table_keys.c: TableKeys, a page of a table's keys ---------------------------- */
void ts_table_keys_handle(ts_session_t *s, Tessera__TableKeys *m);
/* From the tick: evict expired rows (steps_to_live), a bounded number of slots per table. */
void ts_sparse_tick(ts_server_t *srv);

/* --- ts_pull.c ------------------------------------------------------------------------- */

/* True when pull q can be answered now (versions there, no update pending or held on its
 * partitions, the ssp bound met). */
bool ts_pull_ready(ts_server_t *srv, const ts_pull_req_t *q);

/* Answer pull q now (it must be ready). Does not take q. */
void ts_pull_send(ts_session_t *s, const ts_pull_req_t *q);

/* A Pull request: refuse it (unknown or repeated partitions), answer it or park it. Takes
 * m and frees it before it returns. */
void ts_pull_handle(ts_session_t *s, Tessera__Pull *m);

/* From the tick: close the connections whose pull replies have kept an update of one of
 * their partitions waiting longer than server.pull_hold_timeout_s (a slow reader), counted
 * from the first tick that sees the update wait, less late_ms of each tick (time the loop
 * did not run). */
void ts_pull_drop_slow_readers(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms);

/* The session closes: its replies' writes are cancelled by then (ts_conn reports them
 * before on_close); forget any left. */
void ts_pull_close(ts_session_t *s);

/* --- ts_waitq.c ------------------------------------------------------------------------ */

/* Park pull q until it is ready or its deadline passes (timeout_ms: the client's, 0 for
 * the default, clamped to server.max_pull_wait_s). Takes q: the queue frees it, or, when
 * the session already has server.max_parked_pulls waiting, it is refused (EBUSY) and
 * freed here. */
void ts_waitq_park(ts_session_t *s, ts_pull_req_t *q, uint64_t timeout_ms);

/* Answer every parked pull that can be answered; time out those past their deadline. */
void ts_waitq_serve(ts_server_t *srv);

/* Forget the parked pulls of a session that closes. */
void ts_waitq_drop_session(ts_server_t *srv, ts_session_t *s);

/* Free every parked pull (the server is being freed). */
void ts_waitq_free(ts_server_t *srv);

/* --- ts_replyq.c ----------------------------------------------------------------------- */

/* After queuing replies: while the replies queued to all connections take more than
 * server.max_reply_bytes, close the connection holding the most (log line, counter). */
void ts_replyq_enforce(ts_server_t *srv);

/* From the tick: close the connections whose queued replies stayed over half their budget
 * for server.reply_full_timeout_s, then ts_replyq_enforce. */
void ts_replyq_tick(ts_server_t *srv, uint64_t now_ms, uint64_t late_ms);

/* --- ts_shard_status.c ----------------------------------------------------------------------- */

/* A ShardStatus and the arrays it points into. */
typedef struct {
  Tessera__ShardStatus r;
  Tessera__WorkerStatus *ws;
  Tessera__WorkerStatus **wp;
  int32_t *waiting;
  Tessera__TableStatus *ts; /* one per table */
  Tessera__TableStatus **tp;
  uint64_t *hot; /* TS_STABLE_HOT_KEYS per table: the tables' hottest keys */
  Tessera__TensorDecl *md; /* Status.with_model: one per declared tensor */
  Tessera__TensorDecl **mdp;
  char job_id[17]; /* ts_ckpt_job_id ("" before a model is declared) */
} ts_shard_status_msg_t;

/* Fill *sm with the shard's state now. Returns 0 or TS_ENOMEM; release it in both cases. */
int ts_shard_status_build(ts_server_t *srv, ts_shard_status_msg_t *sm);
void ts_shard_status_release(ts_shard_status_msg_t *sm);

/* A Status request. Takes m. */
void ts_shard_status_handle(ts_session_t *s, Tessera__Status *m);

/* From the tick (and at start and stop): publish the admin endpoint's snapshot, tell
 * systemd how the shard is doing, pet its watchdog. */
void ts_shard_status_publish(ts_server_t *srv);

/* --- ts_declare.c ----------------------------------------------------------------------- */

/* A Declare: answered at once when a model is there (same model or TS_ESHAPE) or refused
 * (role, server.max_model_bytes: TS_ETOOBIG, before anything is allocated); else the model
 * is built in the thread pool and the reply follows. A Declare that arrives while one is
 * being built waits for it when it declares the same model, else is refused (TS_ESHAPE).
 * Frames that follow a Declare on its connection are handled meanwhile (a pull finds no
 * model yet: TS_ENOTDECLARED); the client library sends nothing else to a shard before
 * its Declare is answered. Takes m. */
void ts_declare_handle(ts_session_t *s, Tessera__Declare *m);

/* psctl model reset (admin role): drop the model and its optimizer state. Refused
 * (TS_EBUSY) while worker connections are open unless m->force, which closes them first,
 * and while a declare is being built. The reply follows once nothing points into the
 * partitions. Takes m. */
void ts_declare_reset(ts_session_t *s, Tessera__ModelReset *m);

/* --- ts_ckpt_sched.c ------------------------------------------------------------------- */

/* At start, before listening (a client that can connect finds the restored model): check
 * that checkpoint.dir takes a file (made if missing: a test file written, fsynced and
 * removed), delete temporary files of interrupted writes, restore the newest checkpoint of
 * checkpoint.dir (or re-shard one of another layout, also from checkpoint.restore_from:
 * ts_ckpt.h; files of another job only when adopt, --adopt) unless fresh (--fresh,
 * logged), and learn the sequence to go on from.
 * Returns 0, also when the directory cannot be listed (logged), or TS_ECONFIG with errmsg:
 * the directory takes no file, every checkpoint of this shard was rejected (without
 * fresh), or checkpoints of another layout exist but hold no usable set (or no memory to
 * look at them): the shard must not start. */
int ts_ckpt_sched_restore(ts_server_t *srv, bool fresh, bool adopt, char *errmsg,
                          size_t errlen);

/* Once listening: initialise srv->ckpt_timer (the caller closes it) and start it when
 * checkpoint.interval_s asks for periodic checkpoints. */
void ts_ckpt_sched_start(ts_server_t *srv);

/* Checkpoint and Shutdown requests (admin role). Take m. */
void ts_ckpt_sched_checkpoint(ts_session_t *s, Tessera__Checkpoint *m);
void ts_ckpt_sched_shutdown(ts_session_t *s, Tessera__Shutdown *m);

/* A stop signal: when there is something new to save, start a final checkpoint (or wait
 * for the one being written) and return true: the stop follows it. False: stop now. */
bool ts_ckpt_sched_final(ts_server_t *srv);

#endif
