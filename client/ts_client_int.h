/*
 * Inside the client library (include/tessera/client.h): the types shared by its three
 * parts and the functions they call across.
 *
 *   ts_client_link.c  a shard's connection state machine: connect, hello, handshake,
 *                     re-declare, backoff, liveness; decoding every reply.
 *   ts_client_ops.c   operations: a caller's request (an op) split into wire requests per
 *                     shard, their encoding and completion, deadlines.
 *   ts_client_thread.c  the client thread: its loop, timers and shutdown, ops handed in
 *                     from the callers' threads and their waits for the results.
 *   ts_client.c       the public API: open/close, declare, submit/wait/run, admin, status.
 *   ts_client_sparse.c  requests of embedding tables: keys sorted, deduplicated and split
 *                     per shard, rows gathered back in the caller's order.
 *
 * Threads: everything in an op, a shard and a wire request belongs to the client thread
 * once the op is handed over; fields marked "mu" are shared with callers under c->mu.
 */
#ifndef TS_CLIENT_INT_H
#define TS_CLIENT_INT_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "tessera.pb-c.h"
#include "tessera/client.h"
#include "ts_auth.h"
#include "ts_conn.h"
#include "ts_plan.h"

#define TS_CL_TICK_MS 20
#define TS_CL_BACKOFF_MIN_MS 100
#define TS_CL_BACKOFF_MAX_MS 5000
/* A reply may carry every partition a shard holds; the largest frame a client accepts. */
#define TS_CL_MAX_DATA (UINT64_C(1) << 40)
/* The longest deadline a request takes (longer ones, an infinite one too, are cut to it):
 * 40 days, in milliseconds within a u32. */
#define TS_CL_MAX_TIMEOUT_S 3456000.0
/* Failed pushes whose shards that answered are remembered, so a retry skips them. */
#define TS_CL_FAILED_PUSHES 16

/* A push that failed: which shards had answered it (client thread only). */
typedef struct {
  uint64_t push_id; /* 0: a free entry */
  uint8_t *acked;   /* one per shard (owned) */
  /* what the push was: a retry_of that names it for another kind, table or key count
   * does not repeat it, and its acks (a table push's piece cut) are not used */
  bool sparse;
  uint32_t table;
  size_t nkeys;
} ts_cl_failed_push_t;

/* ts_client_req_t.priv_state */
enum {
  TS_CL_REQ_IDLE = 0,        /* never submitted, or its submit was refused */
  TS_CL_REQ_INFLIGHT = 1,    /* submitted, no callback: ts_client_wait may wait */
  TS_CL_REQ_INFLIGHT_CB = 2, /* submitted with a callback */
  TS_CL_REQ_DONE = 3,
  TS_CL_REQ_SUBMITTING = 4,  /* claimed by a ts_client_submit still checking it */
};

/* A request of an embedding table, as the client thread sends it (ts_client_sparse.c):
 * the caller's keys sorted and deduplicated, grouped by the shard that holds them. */
typedef struct {
  ts_client_t *c;      /* whose arena cache the memory goes back to */
  void *arena;         /* one block holding the arrays below (and prepare's temporaries) */
  size_t arena_cap;
  uint32_t table, dim;
  size_t nkeys;        /* the caller's keys */
  size_t nuniq;        /* distinct keys */
  uint64_t *ukeys;     /* the distinct keys, shard by shard, ascending within a shard */
  /* The caller's keys by distinct key: ukeys[p] is the caller's keys
   * pos[at[p] .. at[p + 1]), in the caller's order */
  uint32_t *at;        /* nuniq + 1 offsets into pos */
  uint32_t *pos;       /* nkeys caller's indices */
  size_t *shard_off;   /* shard s's keys are ukeys[shard_off[s] .. shard_off[s + 1]) */
  /* push, per shard: a bit per piece (SparsePush.piece) sent in this attempt, and a bit per
   * piece answered (and GOT_APPLIED, ts_client_sparse.c) */
  uint8_t *sent, *answered;
  float *rows;         /* pull: nuniq x dim, the replies' rows (ukeys' order) */
  uint8_t *records;    /* push: nuniq records (key, then dim floats: duplicates summed) */
  float *dst;          /* pull: the caller's rows_dst */
  const float *grad;   /* push: the caller's rows_grad, made into records as they are sent */
  uint64_t rows_filtered;
  bool read_only;      /* pull: TS_CLIENT_ROWS_READ_ONLY */
  /* Shards sent the request with no keys of theirs: sync, the push and the pull (each
   * shard's step counts every worker and every pull waits for the step); ssp, the push
   * (each shard knows every worker's clock for its staleness bound) */
  bool push_every_shard, pull_every_shard;
  bool async;               /* the job's mode is async: a push+pull may go in one frame */
} ts_cl_sparse_t;

typedef enum {
  OP_DECLARE, OP_PULL, OP_PUSH, OP_PUSH_PULL, OP_HEARTBEAT, OP_STATUS, OP_CHECKPOINT, OP_SHUTDOWN,
  OP_MODEL_RESET, OP_TABLE_KEYS
} ts_cl_op_kind_t;

typedef struct ts_cl_wreq ts_cl_wreq_t;
typedef struct ts_cl_shard ts_cl_shard_t;

/* What a push_pull's pull part took from one shard, made the shard's pulled_version only
 * when the whole request succeeds. */
typedef struct {
  uint64_t version;
  uint64_t incarnation;     /* of the shard that answered */
  bool set;
} ts_cl_staged_t;

/* One operation: a caller's request (req != NULL: heap-allocated, freed when published) or
 * an internal blocking call (declare, heartbeat, status, admin: on the caller's stack, its
 * caller waits for done). */
typedef struct ts_cl_op {
  struct ts_cl_op *next;
  ts_cl_op_kind_t kind;
  bool wait_ready;          /* queue for shards not ready yet instead of failing */
  double timeout_s;
  uint64_t deadline_ms;
  int remaining;
  int rc;
  bool rc_from_push;        /* OP_PUSH_PULL: rc and err are the push part's */
  char err[256];
  /* Internal ops: set last by the loop thread (release), read by the caller while it polls
   * (acquire) or under mu: once it is true the loop thread no longer touches the op. */
  atomic_bool done;
  ts_cl_wreq_t *reqs;       /* outstanding wire requests of this op, linked by op_next */
  /* a caller's request */
  ts_client_req_t *req;
  ts_client_done_fn cb;
  void *cb_arg;
  /* arguments */
  float *const *dst;
  const float *const *grad;
  size_t *parts;            /* owned: plan indices of a subset; NULL = the whole model */
  size_t nparts;
  uint64_t min_version;     /* or TS_CLIENT_VERSION_NEXT */
  uint64_t step;            /* or TS_CLIENT_STEP_PULLED */
  uint64_t clock;
  uint64_t push_id;         /* OP_PUSH, OP_PUSH_PULL: its id (0 until start_op gives a new
                               push one; a retry's from the start) */
  bool retry;               /* push_id came with the request: a retry of an earlier one */
  uint8_t *acked;           /* with push_id: per shard, 1 when its push reply came (a
                               table's push: a bit per piece answered) (owned;
                               NULL when it could not be had) */
  ts_cl_staged_t *stage;    /* OP_PUSH_PULL: one per shard (owned) */
  ts_cl_sparse_t *sp;       /* a table's request (owned): OP_PULL, OP_PUSH, OP_PUSH_PULL of
                               rows instead of partitions */
  bool checkpoint;          /* shutdown: final checkpoint */
  bool force;               /* model reset: close the worker connections first */
  bool with_model;          /* status: ask for the declared model too (ts_client_attach) */
  int push_kind;            /* OP_PUSH: Tessera__PushKind (gradients, or values to assign) */
  bool awaiting;            /* declare: a shard's model waits for its initial values */
  uint32_t shard;
  /* results */
  uint64_t version_min;
  uint64_t applied, accumulated, stale, duplicate;
  int push_rc, pull_rc;
  Tessera__ShardStatus *status;
  char path[600];           /* checkpoint, shutdown */
  uint64_t ckpt_step;
  bool dropped;             /* model reset: the reply */
  uint64_t reset_bytes;
  uint32_t workers_closed;
  uint32_t keys_table;      /* table keys: the request (TableKeys), where the keys go */
  uint64_t keys_cursor, keys_max;
  uint64_t *keys_out;
  uint64_t keys_n, keys_next, keys_erased, keys_rows; /* table keys: the reply */
  bool keys_done, keys_got;
  bool ask_end;             /* heartbeat: ts_client_job_end's (Heartbeat.job_end) */
  bool hb0;                 /* heartbeat: shard 0 answered, with: */
  ts_client_job_end_t job_end;
} ts_cl_op_t;

/* One frame sent to one shard, waiting for its reply. */
struct ts_cl_wreq {
  ts_cl_wreq_t *next;       /* in its shard's queued or pending list */
  ts_cl_wreq_t *op_next;
  ts_cl_op_t *op;           /* NULL for internal requests and orphans of a finished op */
  ts_cl_shard_t *sh;
  uint64_t id;
  uint16_t type;
  bool internal;
  bool staged;              /* a push_pull's pull: its reply never moves pulled_version itself */
  size_t *parts;            /* plan indices */
  size_t n;
  uv_buf_t *iov;            /* payload: pull destinations or push sources; a table's
                               request: the keys or records it sends */
  /* a table's request: keys [sp_off, sp_off + sp_n) of its op's ukeys, and where a pull's
   * reply rows go */
  size_t sp_off, sp_n;
  uv_buf_t rx;
  uint64_t pull_id;         /* a table's push+pull in one frame: the push names its pull */
  bool rides;               /* ... and the pull, answered without a frame of its own */
  uint8_t piece;            /* a table's push: SparsePush.piece */
  uint64_t sent_end;        /* its link's bytes_out once its frame was queued: a reply
                               before ts_conn_released reaches it is refused (EPROTO) */
};

typedef enum { SH_DOWN, SH_CONNECTING, SH_HELLO, SH_HANDSHAKE, SH_DECLARING, SH_READY } ts_cl_sh_state_t;

typedef struct {
  ts_conn_t conn;
  ts_cl_shard_t *sh;
  uv_connect_t creq;
} ts_cl_link_t;

struct ts_cl_shard {
  ts_client_t *cl;
  uint32_t index;
  char addr[160];
  char host[256];           /* addr's host: what a TLS shard's certificate must name */
  struct sockaddr_storage sa;
  bool by_name;             /* addr's host is a name: resolved again before each connect
                               (a name that does not resolve yet, a shard moved to a new
                               address), on the loop through uv_getaddrinfo */
  bool resolving;           /* gai is in flight */
  uv_getaddrinfo_t gai;
  ts_cl_link_t *link;
  ts_cl_sh_state_t state;   /* mu for writes */
  uv_timer_t retry;
  uint64_t backoff_ms;
  ts_cl_wreq_t *queued, *pending;
  uint64_t hs_id;
  uint8_t hs_nonce[2][TS_AUTH_NONCE_LEN]; /* the shard's and ours, for its proof */
  bool tried;               /* mu: at least one attempt finished (for ts_client_open) */
  uint64_t incarnation;     /* from the shard's Hello; a change means it restarted */
  uint32_t features;        /* from the shard's Hello (TS_FEATURE_*) */
  uint64_t max_reply_rows;  /* and the most bytes of rows one reply carries (0: not said) */
  uint64_t pulled_version;  /* lowest version of the last pull from this shard */
  bool have_version;        /* pulled_version is valid for the shard's current incarnation */
  uint64_t state_ms;        /* loop time of the last state change (handshake timeout) */
  uint64_t rx_ms;           /* loop time of the last sign of life: a frame received, or
                               progress inside a large frame in either direction */
  uint64_t seen_in;         /* conn.bytes_in at the last check_links */
  size_t seen_wq;           /* write queue bytes at the last check_links */
  int fatal;                /* mu: a refusal that retrying will not fix (auth, version) */
  bool job_refused;         /* mu: the shard refused this worker's job settings (ECONFIG) */
  bool job_refused_logged;  /* ... and that was logged */
  char why[256];            /* mu */
};

struct ts_client {
  ts_client_opts_t opts;
  char *identity, *token;
  struct ts_tls_ctx *tls;        /* opts.tls_ca_file: every link speaks TLS with it */
  char **addrs;
  uv_thread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  uv_timer_t tick, hb;
  uv_mutex_t mu;
  uv_cond_t cv;
  ts_cl_op_t *queue_head, *queue_tail; /* mu */
  bool stop;                     /* mu */
  atomic_int interrupted;         /* set by ts_client_interrupt, from a signal handler (a
                                    lock-free atomic: safe there, and across threads) */
  ts_cl_op_t *inflight;          /* loop thread */
  uint64_t activity, activity_seen; /* loop thread: frames and hand-overs, for ts_poll */
  ts_cl_shard_t *shards;
  uint32_t n;
  uint64_t next_id;
  /* Pushes are numbered per client (ts_client_req_t.push_id): the last id given, by the
   * client thread in start_op (read by submit to check a retry_of), and this client's
   * random incarnation, sent with each push so shards tell its ids from another's. */
  _Atomic uint64_t last_push_id;
  uint64_t incarnation;
  ts_cl_failed_push_t failed[TS_CL_FAILED_PUSHES]; /* loop thread; the oldest is replaced */
  unsigned failed_next;
  int ready;                     /* mu: shards in SH_READY */

  uint64_t partition_bytes;      /* mu */
  uint32_t job_workers;          /* mu */
  Tessera__Mode mode;            /* mu */

  bool declared;                 /* mu (set when the first declare succeeds) */
  Tessera__Declare decl;
  Tessera__TensorDecl *decl_t;
  Tessera__TensorDecl **decl_p;
  ts_plan_t plan;
  Tessera__TableDecl *decl_tb;   /* the declared tables (decl.tables points at decl_tp) */
  Tessera__TableDecl **decl_tp;
  /* per shard and table (s * n_tables + t): the table's version last pulled from the shard,
   * valid while the shard's incarnation is the one it was pulled from */
  ts_cl_staged_t *table_pulled;
  size_t **shard_parts;
  size_t *shard_nparts;

  uint64_t p_step;               /* mu: progress for heartbeats */
  double p_loss, p_eps, p_prog;
  bool p_done;
  bool p_reported;               /* mu: ts_client_set_progress was called */
  char p_device[64];             /* mu: ts_client_set_device */
  bool p_has_final;         /* ts_client_set_final_accuracy */
  double p_final;
  bool p_has_auc, p_has_test_auc; /* mu: ts_client_set_auc, ts_client_set_test_auc */
  double p_auc, p_test_auc, p_test_logloss;
  _Atomic double timeout_s;      /* ts_client_set_timeout may change it from any thread */
  uint64_t restarts;             /* mu */

  /* mu: the memory of finished table requests, kept for the next ones (ts_client_sparse.c):
   * a request of the same size then takes no fresh pages */
  void *arena[2];
  size_t arena_cap[2];

  /* The worker's job settings sent in every handshake (opts.job, copied; owned). */
  Tessera__JobSetting *job_s;
  Tessera__JobSetting **job_p;
  size_t n_job;
  bool opening;                  /* mu: ts_client_open is waiting for the shards */
  uint64_t open_ms, wait_log_ms; /* loop thread: when the wait began, its last log line */
};

/* ts_client.c */
void ts_cl_free_model(ts_client_t *c);
/* The model's Declare and partition plan from a tensor and table list (copied), as
 * ts_client_declare_ex takes them, replacing any model the client had (`declared` is left
 * false: the caller sends the Declare, or only reads, ts_client_attach). Returns 0,
 * TS_EINVAL, TS_EUNAVAIL (no partition size yet) or TS_ENOMEM, errmsg saying why. */
int ts_cl_set_model(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n,
                    const ts_client_kind_t *kinds, const ts_client_table_t *tables,
                    size_t num_tables, uint64_t seed, bool values_follow, char *errmsg,
                    size_t errlen);

/* ts_client_link.c */
extern const ts_conn_cbs_t ts_cl_link_cbs;
void ts_cl_start_connect(ts_cl_shard_t *sh);
void ts_cl_check_links(ts_client_t *c, uint64_t now);
/* While ts_client_open waits: every opts.wait_log_interval_s, one NOTICE line per shard not
 * ready, with why. */
void ts_cl_log_waiting(ts_client_t *c, uint64_t now);
void ts_cl_set_state(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_sh_state_t st);
void ts_cl_note_why(ts_cl_shard_t *sh, const char *prefix, const char *detail);
/* Why shard sh is not ready: its last failure, or else what its connection is doing
 * ("connected, no hello yet"); the caller holds mu or is the loop thread. */
const char *ts_cl_why(const ts_cl_shard_t *sh);

/* ts_client_ops.c */
/* Queue or send a wire request to shard sh for op (NULL for internal requests); takes
 * parts (ts_malloc'd), also on failure. */
int ts_cl_submit_wire(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, uint16_t type,
                      size_t *parts, size_t n);
/* Link wire request r (made by the caller, r->op == op) into op and send it, queue it for
 * a shard not ready yet, or fail it; r is the callee's from here. */
int ts_cl_enqueue_wire(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op, ts_cl_wreq_t *r);
void ts_cl_flush_queued(ts_cl_shard_t *sh);
/* A wire request is answered (rc 0) or failed; frees it. */
void ts_cl_complete_req(ts_cl_wreq_t *r, int rc, const char *detail);
/* The pending wire request of sh with id `id` that a frame of type `reply` answers (its
 * request type + 1; TS_MSG_ERROR answers any; 0: any, not a reply but the client's own
 * bookkeeping), unlinked (take) or left (find); NULL
 * when there is none: a reply to a request of another type is dropped as a reply to no
 * request is, and the request fails by its deadline rather than succeed with nothing. */
ts_cl_wreq_t *ts_cl_take_pending(ts_cl_shard_t *sh, uint64_t id, uint16_t reply);
ts_cl_wreq_t *ts_cl_find_pending(ts_cl_shard_t *sh, uint64_t id, uint16_t reply);
void ts_cl_free_wreq(ts_cl_wreq_t *r);
void ts_cl_free_op(ts_cl_op_t *op);
/* Forget the failed pushes remembered for retries (closing the client). */
void ts_cl_free_failed_pushes(ts_client_t *c);
/* An op handed to the client thread: split it into wire requests and send them (or queue
 * them for shards not ready); it completes as they are answered. */
void ts_cl_start_op(ts_client_t *c, ts_cl_op_t *op);
/* Abort every op in flight whose deadline is at or before now (loop time, ms) with
 * TS_ETIMEDOUT, naming the shards that did not answer. */
void ts_cl_expire_ops(ts_client_t *c, uint64_t now);
/* Abort every op in flight with rc and msg (interrupt, close). */
void ts_cl_abort_ops(ts_client_t *c, int rc, const char *msg);
/* Complete an op handed over but never started (the client is stopping) with rc and msg. */
void ts_cl_refuse_op(ts_client_t *c, ts_cl_op_t *op, int rc, const char *msg);

/* ts_client_sparse.c */
/* Check a table's request and prepare op->sp from it (the caller's thread). Returns 0, or
 * TS_EINVAL / TS_ENOTABLE / TS_ETOOBIG / TS_ENOMEM with why (static) set. */
int ts_cl_sparse_prepare(ts_client_t *c, const ts_client_req_t *req, ts_cl_op_t *op,
                         const char **why);
/* Submit op's wire requests to shard sh (start_op, one shard at a time). */
int ts_cl_sparse_start(ts_client_t *c, ts_cl_shard_t *sh, ts_cl_op_t *op);
/* A push+pull's pull that rode in its push and was answered EBUSY (the shard had no room
 * for its rows; the push went alone): sent again on its own, r completed. 0, or the error
 * (r untouched). */
int ts_cl_sparse_pull_again(ts_cl_shard_t *sh, ts_cl_wreq_t *r);
/* Encode and send a table's wire request r on conn. */
int ts_cl_sparse_send(ts_client_t *c, ts_cl_wreq_t *r, ts_conn_t *conn);
/* Where a SparsePullReply's rows go (on_meta): 0 with *iov set, or TS_EPROTO when it does
 * not answer its request. */
int ts_cl_sparse_reply_meta(ts_cl_shard_t *sh, const Tessera__SparsePullReply *m,
                            const uv_buf_t **iov, unsigned *niov);
/* A SparsePullReply or SparsePushReply arrived (on_frame). */
void ts_cl_sparse_on_reply(ts_cl_shard_t *sh, uint16_t type, const ProtobufCMessage *msg,
                           bool discarded);
/* The op succeeded or failed: its rows to the caller's order, its results into q. */
void ts_cl_sparse_publish(ts_client_t *c, ts_cl_op_t *op, ts_client_req_t *q);
void ts_cl_sparse_free(ts_cl_sparse_t *sp);
/* Free the arenas the client keeps (ts_client_close). */
void ts_cl_sparse_cache_free(ts_client_t *c);

/* ts_client_thread.c */
/* Hand op to the client thread (fails with TS_ESHUTDOWN, op untouched, when stopping). */
int ts_cl_enqueue(ts_client_t *c, ts_cl_op_t *op);
/* Run an internal op and wait for it; errmsg gets its error. */
int ts_cl_run_op(ts_client_t *c, ts_cl_op_t *op, char *errmsg, size_t errlen);
bool ts_cl_on_client_thread(ts_client_t *c);
/* Wait (busy-polling first, per the options) until done(arg), which the client thread
 * makes true under c->mu with a broadcast of c->cv. */
void ts_cl_wait_flag(ts_client_t *c, bool (*done)(void *), void *arg);
void ts_cl_thread_main(void *arg);
void ts_cl_on_wake(uv_async_t *a);
void ts_cl_on_tick(uv_timer_t *t);
void ts_cl_on_heartbeat(uv_timer_t *t);

#endif
