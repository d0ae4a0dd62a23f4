/*
 * libtessera-client: a worker's (or an admin tool's) connections to every shard of a Tessera
 * parameter-server job, in C.
 *
 * Build against the installed library with
 *   cc prog.c $(pkg-config --cflags --libs tessera-client)
 * Only names starting with ts_client_, tessera_, TS_CLIENT_ and TESSERA_ are part of it.
 *
 * Model. A client (ts_client_t) holds one connection per shard and runs its own thread with
 * its own event loop (the "client thread"). The model is declared once (ts_client_declare);
 * the library splits every tensor into partitions spread over the shards (the "plan",
 * ts_client_num_parts / ts_client_part). A request (ts_client_req_t) pulls parameters into
 * the caller's buffers, pushes gradients from them, or both in one round trip; it fans out
 * to every shard concurrently and the replies are read straight into the caller's memory.
 * Several requests may be in flight on one client at once: each shard handles the frames
 * of a connection in order, so requests submitted one after the other (for example one
 * push per tensor as backpropagation produces its gradient) pipeline on the wire and are
 * applied in submission order on every shard.
 *
 * A lost connection is re-established in the background with exponential backoff (100 ms
 * doubling to 5 s); after a reconnect the client handshakes again and re-declares the
 * model, so a restarted shard is usable without the caller noticing. Requests that were in
 * flight on a lost connection fail with TS_CLIENT_ECLOSED; the caller decides whether to
 * retry. Pulls are always safe to retry. A push is retried safely by submitting it again
 * with retry_of set to the push_id it was given (ts_client_req_t): every shard applies a
 * push id of a client at most once and answers a repeat as a duplicate, so a shard that had
 * applied it before the connection was lost (or before the deadline passed) does not apply
 * it twice, in any mode.
 *
 * Threading contract.
 *  - Every function here may be called from any thread, concurrently, except:
 *    ts_client_close (once, from a thread that is not the client thread, after every other
 *    call on that client has returned), and ts_client_declare (not concurrently with a
 *    request in flight or another declare on the same client).
 *  - Blocking calls on a client (ts_client_declare, ts_client_wait, ts_client_run,
 *    ts_client_heartbeat, ts_client_status, ts_client_checkpoint, ts_client_shutdown) must
 *    not be made on that client's thread, that is from its completion or log callbacks:
 *    they fail with TS_CLIENT_EINVAL there instead of deadlocking (ts_client_close is
 *    ignored there).
 *  - Completion callbacks (ts_client_submit) and the log callback run on the client thread.
 *    They must return quickly (the thread serves every shard); they may call the
 *    non-blocking functions: ts_client_submit, ts_client_interrupt, ts_client_set_progress,
 *    ts_client_set_timeout, ts_client_shard_up, ts_client_num_shards, the job and plan
 *    queries, ts_client_strerror, tessera_version.
 *  - ts_client_interrupt is also async-signal-safe.
 *
 * Process-wide effects: none. The library installs no signal handler; SIGPIPE is blocked
 * in the client thread only (pthread_sigmask), which suffices because a socket write
 * raises SIGPIPE in the writing thread, and only the client thread writes. It calls
 * sodium_init(), which is idempotent and thread-safe. It writes nothing to stdout or
 * stderr: diagnostics go to the log callback of the options, and are dropped without one.
 *
 * Errors. Functions return 0 or a negative TS_CLIENT_E* code (stable: they are the wire
 * protocol's); ts_client_strerror names any of them. Functions that take an errmsg buffer
 * write a person-readable explanation there on failure (errmsg may be NULL).
 *
 * Latency: with busy_poll_us > 0 the client thread keeps polling its sockets for
 * busy_poll_us after each frame it reads and each request handed to it, and a thread in
 * ts_client_wait polls for its answer for up to busy_poll_us before it sleeps; both yield
 * the CPU on every turn, and neither polls longer, so a long wait (a sync barrier) sleeps.
 */
#ifndef TESSERA_CLIENT_H
#define TESSERA_CLIENT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TS_CLIENT_API __attribute__((visibility("default")))
#else
#define TS_CLIENT_API
#endif

/* The version of this header: the one in the repository's VERSION file, which the build
 * reads; a unit test (tests/unit/test_client_offline.c) checks that these agree with it. */
#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0

/* The library's version, "MAJOR.MINOR.PATCH" (of the library loaded at run time, which may
 * be newer than the header compiled against). Never NULL; static storage. */
TS_CLIENT_API const char *tessera_version(void);

/* --- errors ------------------------------------------------------------------------- */

/* Error codes: the server's, which travel on the wire, plus the client's own. Negative
 * errno values (a failed connect: -ECONNREFUSED) may also be returned. */
enum {
  TS_CLIENT_OK = 0,
  TS_CLIENT_EINCOMPLETE = -30001,
  TS_CLIENT_EPROTO = -30002,       /* protocol violation */
  TS_CLIENT_EVERSION = -30003,     /* the shard speaks another protocol version */
  TS_CLIENT_ETOOBIG = -30004,
  TS_CLIENT_ESIZE = -30005,
  TS_CLIENT_ENOTENSOR = -30006,    /* unknown tensor or partition */
  TS_CLIENT_ESHAPE = -30007,       /* the model differs from the one the job declared */
  TS_CLIENT_ESTALE = -30008,
  TS_CLIENT_EFUTURE = -30009,      /* a push's step is ahead of the shard's parameters */
  TS_CLIENT_ENONFINITE = -30010,   /* a gradient holds NaN or Inf */
  TS_CLIENT_EAUTH = -30011,        /* the handshake's token was refused */
  TS_CLIENT_EPERM = -30012,        /* the request needs an admin client */
  TS_CLIENT_ECONFIG = -30013,
  TS_CLIENT_EINVAL = -30014,       /* invalid argument */
  TS_CLIENT_ENOMEM = -30015,
  TS_CLIENT_ETIMEDOUT = -30016,    /* the request's deadline passed */
  TS_CLIENT_EUNAVAIL = -30017,     /* a shard has no ready connection */
  TS_CLIENT_ECLOSED = -30018,      /* the connection was lost with the request in flight */
  TS_CLIENT_ESHUTDOWN = -30019,    /* the client was interrupted or is closing */
  TS_CLIENT_EINTERNAL = -30020,
  TS_CLIENT_EDATA = -30021,
  TS_CLIENT_EDEVICE = -30022,
  TS_CLIENT_ENOTDECLARED = -30023, /* no model declared (or the shard lost it) */
  TS_CLIENT_EROLE = -30024,
  TS_CLIENT_EBUSY = -30025,        /* the request is already in flight */
  TS_CLIENT_ENOTREADY = -30026,    /* the model waits for its initial values (the chief's) */
  TS_CLIENT_ENOTABLE = -30027,     /* unknown embedding table */
};

/* A person-readable message for any code the library returns. Never NULL; static. */
TS_CLIENT_API const char *ts_client_strerror(int err);

/* --- options and lifetime ----------------------------------------------------------- */

/* Log levels (syslog's numbers). */
enum {
  TS_CLIENT_LOG_ERR = 3,
  TS_CLIENT_LOG_WARN = 4,
  TS_CLIENT_LOG_NOTICE = 5,
  TS_CLIENT_LOG_INFO = 6,
  TS_CLIENT_LOG_DEBUG = 7,
};

/* Receives one diagnostic line (no newline) at `level`: a lost connection, a restarted
 * shard. Runs on the client thread (or, rarely, in ts_client_close); msg is valid during
 * the call only. */
typedef void (*ts_client_log_fn)(void *arg, int level, const char *msg);

typedef struct {
  /* sizeof(ts_client_opts_t) of the header the caller compiled against, set by
   * ts_client_opts_init: fields added in later versions go at the end, and a library reading
   * an older, shorter struct uses their defaults. */
  uint32_t struct_size;
  const char *const *addrs;      /* "host:port" of each shard, in shard order (copied) */
  size_t num_shards;
  bool admin;                    /* admin role (psctl) instead of worker (default false) */
  int task;                      /* worker index (ignored for admin; default 0) */
  const char *identity;          /* free text for logs (copied, cut to 127 bytes; may be NULL) */
  const char *token;             /* shared secret for the handshake MAC (copied); NULL = none.
                                    A token file (auth.token_file) is read with
                                    ts_client_token_read */
  double connect_timeout_s;      /* ts_client_open waits this long for the shards (5) */
  double request_timeout_s;      /* default deadline of a request (60) */
  double heartbeat_interval_s;   /* 0 = no heartbeats (default 0) */
  double heartbeat_timeout_s;    /* with heartbeats: a shard silent this long is presumed dead
                                    and its connection re-established (5); bytes of a large
                                    frame moving either way count as not silent */
  bool require_all;              /* open fails unless every shard answered (default false) */
  uint32_t busy_poll_us;         /* poll this long for an answer before sleeping; 0 = always
                                    sleep (default 0) */
  ts_client_log_fn log;          /* NULL (default): diagnostics are dropped */
  void *log_arg;
  int log_level;                 /* the most verbose level passed to log (0 or default:
                                    TS_CLIENT_LOG_INFO) */
  /* The job this worker belongs to, as its job file says (see ts_client_job_setting_t):
   * each shard compares every setting with its own job file in the handshake and refuses
   * a worker that differs, so ts_client_open fails with TS_CLIENT_ECONFIG and errmsg holds
   * the shard's line naming the key and both values. Copied; ignored for admin clients.
   * NULL or 0 settings (default): not checked. */
  const struct ts_client_job_setting *job;
  size_t num_job;
  /* While ts_client_open waits for the shards: every this many seconds, one line per shard
   * not ready yet to the log (TS_CLIENT_LOG_NOTICE), naming its address and why it is not
   * (connection refused, no handshake in time, the shard's refusal). 0 = default 5 s;
   * negative = never. */
  double wait_log_interval_s;
  /* When not NULL, ts_client_open gives up within 50 ms of *cancel becoming non-zero (a
   * flag a signal handler sets), failing with TS_CLIENT_ESHUTDOWN. Default NULL. */
  const volatile sig_atomic_t *cancel;
  /* TLS 1.3 to the shards (a job file's auth.tls): PEM files of the CA that signs the
   * shards' certificates, and of this client's own certificate and key (the shards ask for
   * one: mutual TLS). Each shard's certificate must name the host of its address. A shard
   * whose certificate fails the check, or that speaks plaintext, is refused: ts_client_open
   * fails with errmsg saying why (require_all), as for any shard it cannot reach. A file
   * that cannot be loaded fails ts_client_open with TS_CLIENT_ECONFIG naming it. NULL
   * tls_ca_file (default): plaintext. */
  const char *tls_ca_file;
  const char *tls_cert_file;
  const char *tls_key_file;
} ts_client_opts_t;

/* One setting of a job, for ts_client_opts_t.job: a key as a job file spells it
 * ("job.mode", "optimizer.learning_rate") and its value as text, spelt as ps-server and
 * ps-worker spell it ("\"sync\"", "0.1", "[784, 128, 10]", "2 workers" for
 * cluster.workers; docs/architecture.md, "A worker joining its job"). A key a shard
 * does not know is not compared. Both strings are copied by ts_client_open. */
typedef struct ts_client_job_setting {
  const char *key;
  const char *value;
} ts_client_job_setting_t;

/* Fill *opts with the defaults above and set struct_size. Call it before setting fields.
 * (A zeroed struct with only struct_size set means the same defaults: every 0 above stands
 * for its default.) */
TS_CLIENT_API void ts_client_opts_init(ts_client_opts_t *opts);

/* Read a token file (a job file's auth.token_file or auth.admin_token_file) for
 * ts_client_opts_t.token: the file's content less trailing white space (spaces, tabs, line
 * ends), which must be at least 16 bytes. Returns the token, to be freed with
 * ts_client_token_free (once ts_client_open returned: the client keeps its own copy), or
 * NULL with errmsg naming the file and why: it cannot be read, the token is too short, it
 * is the placeholder that deploy/k8s/configmap.yaml ships with, or memory ran out. Reads at most the first 1023 bytes. Any thread; no client needed. */
TS_CLIENT_API char *ts_client_token_read(const char *path, char *errmsg, size_t errlen);

/* Wipe a token of ts_client_token_read from memory and free it. NULL is ignored. */
TS_CLIENT_API void ts_client_token_free(char *token);

/* The task key of worker `task` under the job's token: HMAC-SHA256(token, "worker/T") as 64
 * lower-case hex characters and a 0 into out (n > TS_CLIENT_TASK_KEY_LEN). A worker whose token is its task
 * key proves to the shards that it is that task (docs/security.md); psctl token derive
 * prints it. Returns 0, or TS_CLIENT_EINVAL (no token, a negative task, out too small). */
#define TS_CLIENT_TASK_KEY_LEN 64
TS_CLIENT_API int ts_client_task_key(const char *token, int task, char *out, size_t n);

typedef struct ts_client ts_client_t;

/* Start the client thread and connect to every shard. Waits up to connect_timeout_s for
 * the shards to answer the handshake. With require_all, fails (TS_CLIENT_EUNAVAIL, errmsg
 * naming each unreachable shard and why) unless all did; otherwise succeeds with whatever
 * answered and keeps trying the rest in the background. A shard named by a host name is
 * resolved before each connection attempt: a name that does not resolve (yet) is retried
 * like a refused connection ("cannot resolve 'NAME': ..."). Also fails for addresses that
 * are not host:port or options (TS_CLIENT_EINVAL; also when opts->struct_size is 0 or larger than this library
 * knows) or a refused handshake (TS_CLIENT_EAUTH, TS_CLIENT_EVERSION ...; TS_CLIENT_ECONFIG
 * when a shard's job differs from opts->job, with or without require_all), or when
 * opts->cancel is set meanwhile (TS_CLIENT_ESHUTDOWN). While it waits it logs the shards
 * it waits for (opts->wait_log_interval_s). *out is NULL on failure. */
TS_CLIENT_API int ts_client_open(ts_client_t **out, const ts_client_opts_t *opts, char *errmsg,
                                 size_t errlen);

/* Make every request in flight, and every later one, fail at once with TS_CLIENT_ESHUTDOWN
 * ("interrupted"): for a signal handler (async-signal-safe), so a worker told to stop does
 * not sit out a pull that waits for an unreachable shard. Irreversible. */
TS_CLIENT_API void ts_client_interrupt(ts_client_t *c);

/* Fail every request still in flight with TS_CLIENT_ESHUTDOWN (their callbacks run, on the
 * client thread, before this returns), close every connection, stop the thread and free
 * the client. NULL is ignored. */
TS_CLIENT_API void ts_client_close(ts_client_t *c);

/* Set the default deadline of later requests (seconds; > 0). */
TS_CLIENT_API void ts_client_set_timeout(ts_client_t *c, double seconds);

/* --- the job ------------------------------------------------------------------------ */

typedef enum {
  TS_CLIENT_MODE_UNSPECIFIED = 0, /* no shard has answered yet */
  TS_CLIENT_MODE_ASYNC = 1,
  TS_CLIENT_MODE_SYNC = 2,
  TS_CLIENT_MODE_SSP = 3,
} ts_client_mode_t;

/* "async", "sync", "ssp", or "unspecified". Never NULL; static. */
TS_CLIENT_API const char *ts_client_mode_name(ts_client_mode_t mode);

TS_CLIENT_API uint32_t ts_client_num_shards(const ts_client_t *c);

/* Whether shard i currently has a ready connection; when not, *why (optional) gets the last
 * error seen ("connection refused"). */
TS_CLIENT_API bool ts_client_shard_up(ts_client_t *c, uint32_t shard, char *why, size_t whylen);

/* Why shard i is refused for good, when retrying will not help: TS_CLIENT_EAUTH (the shard
 * refused this client's token, or could not prove it knows it: not a shard of this job),
 * or another code of such a refusal (version, configuration); 0 when none. */
TS_CLIENT_API int ts_client_shard_error(ts_client_t *c, uint32_t shard);

/* The job's settings as the shards announced them in the handshake (0 / UNSPECIFIED before
 * any shard answered, or for a NULL client). */
TS_CLIENT_API uint64_t ts_client_partition_bytes(ts_client_t *c);
TS_CLIENT_API uint32_t ts_client_job_workers(ts_client_t *c);
TS_CLIENT_API ts_client_mode_t ts_client_job_mode(ts_client_t *c);

/* How many times a shard was seen to restart (a new incarnation in its handshake). */
TS_CLIENT_API uint64_t ts_client_restarts(ts_client_t *c);

/* --- the model ---------------------------------------------------------------------- */

/* How a shard initialises a tensor it has not seen (deterministic in the declare's seed
 * and the tensor's name, identical on every shard). */
typedef enum {
  TS_CLIENT_INIT_ZEROS = 0,
  TS_CLIENT_INIT_GLOROT_UNIFORM = 1,
  TS_CLIENT_INIT_ONES = 2,
} ts_client_init_t;

typedef struct {
  const char *name;
  const uint64_t *shape;
  size_t rank;
  ts_client_init_t init;
} ts_client_tensor_t;

/* What a tensor is for (ts_client_declare_ex). A state tensor (BatchNormalization's moving
 * statistics, any non-trainable variable a layer updates) is pushed as its values, not a
 * gradient, and the shards keep the mean over the workers: sync, the mean of a step's
 * values; async and ssp, each push moves it by 1/num_workers of the difference. */
typedef enum {
  TS_CLIENT_TRAINABLE = 0,
  TS_CLIENT_STATE = 1,
} ts_client_kind_t;

/* --- embedding tables (docs/architecture.md, "Tables") ---
 * A table holds rows of dim floats keyed by int64 ids, spread over the shards by a hash of
 * the key, each made on first touch from (seed, table name, key) and updated row-wise by
 * its own lazy optimizer: only the rows a batch touched move. */
typedef enum {
  TS_CLIENT_ROW_ZEROS = 0,
  TS_CLIENT_ROW_UNIFORM = 1,          /* uniform in [-init_param, init_param) */
  TS_CLIENT_ROW_NORMAL = 2,           /* normal, standard deviation init_param */
  TS_CLIENT_ROW_TRUNCATED_NORMAL = 3, /* normal, sd init_param, redrawn beyond 2 sd */
} ts_client_row_init_t;

typedef enum {
  TS_CLIENT_ROWOPT_DEFAULT = 0, /* the job's optimizer: sgd or adam (momentum has none) */
  TS_CLIENT_ROWOPT_SGD = 1,
  TS_CLIENT_ROWOPT_ADAGRAD = 2,
  TS_CLIENT_ROWOPT_ADAM = 3,  /* lazy: each row's own step corrects its bias */
  TS_CLIENT_ROWOPT_FTRL = 4,  /* FTRL-proximal, as TensorFlow's ApplyFtrlV2 */
} ts_client_rowopt_t;

/* One table. Every number left 0 takes its default (tessera.proto's TableDecl). */
typedef struct {
  const char *name;
  uint32_t dim; /* 1 .. 4096 */
  ts_client_row_init_t init;
  double init_param;
  ts_client_rowopt_t optimizer;
  double learning_rate; /* 0: the job's */
  double beta1, beta2, epsilon, initial_accumulator, l1, l2, beta;
  /* Admission: a key becomes a row once pulled admit_count times (0, 1: at once) and, with
   * admit_probability in (0, 1), when a hash of it falls under it; until then pulls read
   * the initializer's row and its gradients are dropped (counted in rows_filtered). */
  uint32_t admit_count;
  double admit_probability;
  /* Eviction: rows untouched for steps_to_live of the table's steps go (0: never); a shard
   * at max_rows rows (0: none; server.max_table_bytes always holds) replaces the least
   * recently used. */
  uint64_t steps_to_live;
  uint64_t max_rows;
} ts_client_table_t;

typedef struct {
  uint32_t struct_size; /* set by ts_client_declare_opts_init */
  uint64_t seed;        /* of the shards' initialisation (without values_follow) */
  /* The model's values come from a worker, as TensorFlow's chief initialises the
   * variables: a model this declare creates is not initialised by the shards; pulls and
   * pushes of it fail with TS_CLIENT_ENOTREADY until one worker (the job's task 0) has
   * sent the values with a TS_CLIENT_ASSIGN_INITIAL request. */
  bool values_follow;
  const ts_client_kind_t *kinds; /* per tensor; NULL = every tensor trainable */
  /* out: some shard's model still waits for its initial values */
  bool awaiting_values;
  /* The model's embedding tables, in the same order on every worker (copied); requests
   * name them by index. A declare may list tables and no tensors (n = 0). */
  const ts_client_table_t *tables;
  size_t num_tables;
} ts_client_declare_opts_t;

TS_CLIENT_API void ts_client_declare_opts_init(ts_client_declare_opts_t *opts);

/* Declare the model (the same tensor list, in the same order, on every worker) and compute
 * the partition plan. The list is copied. Needs a shard to have answered (else
 * TS_CLIENT_EUNAVAIL); waits for every shard to be connected, up to the request timeout.
 * Returns 0, or the first shard's error (TS_CLIENT_ESHAPE for a mismatching redeclaration,
 * with the server's detail in errmsg). Not concurrently with requests in flight. */
TS_CLIENT_API int ts_client_declare(ts_client_t *c, const ts_client_tensor_t *tensors, size_t n,
                                    uint64_t seed, char *errmsg, size_t errlen);

/* ts_client_declare with the options above (opts->seed as its seed). A declare of a model
 * the shards hold already (declared before, restored from a checkpoint) leaves its values
 * as they are, values_follow or not: awaiting_values then tells the caller whether it has
 * initial values to send. Declaring again (the same model) is how another worker waits for
 * them: it polls until awaiting_values is false. */
TS_CLIENT_API int ts_client_declare_ex(ts_client_t *c, const ts_client_tensor_t *tensors,
                                       size_t n, ts_client_declare_opts_t *opts, char *errmsg,
                                       size_t errlen);

/* One partition of the plan: elements [offset, offset + count) of tensor `tensor`, held by
 * shard `shard`; `part` is its index among the tensor's partitions. */
typedef struct {
  uint32_t tensor;
  uint32_t part;
  uint32_t shard;
  uint64_t offset;
  uint64_t count;
} ts_client_part_t;

/* The plan of the declared model (0 before a declare succeeded). Partitions are numbered
 * 0..num_parts-1 tensor by tensor, in order. */
TS_CLIENT_API size_t ts_client_num_tensors(const ts_client_t *c);
TS_CLIENT_API size_t ts_client_num_parts(const ts_client_t *c);
/* Elements of tensor t (0 when out of range). */
TS_CLIENT_API uint64_t ts_client_tensor_elems(const ts_client_t *c, size_t t);
/* Partition k into *out; TS_CLIENT_EINVAL when out of range. */
TS_CLIENT_API int ts_client_part(const ts_client_t *c, size_t k, ts_client_part_t *out);

/* Tables of the declared model (0 before a declare succeeded) and table t's row width (0
 * when out of range). */
TS_CLIENT_API size_t ts_client_num_tables(const ts_client_t *c);
TS_CLIENT_API uint32_t ts_client_table_dim(const ts_client_t *c, size_t t);

/* Declared tensor t's name and shape (rank returned, *shape (may be NULL) pointing into the
 * client, valid until the model changes or the client is closed; NULL and 0 out of range),
 * its kind, and table t's name (NULL out of range). */
TS_CLIENT_API const char *ts_client_tensor_name(const ts_client_t *c, size_t t);
TS_CLIENT_API size_t ts_client_tensor_shape(const ts_client_t *c, size_t t,
                                            const uint64_t **shape);
TS_CLIENT_API ts_client_kind_t ts_client_tensor_kind(const ts_client_t *c, size_t t);
TS_CLIENT_API const char *ts_client_table_name(const ts_client_t *c, size_t t);

/* Read the model the shards hold without declaring it (an admin client may not declare;
 * psctl export): ask shard `shard` for its declared tensors and tables and plan them as a
 * declare of that list would, replacing any model this client had. Then the functions
 * above enumerate it and PULL and SPARSE_PULL requests read it; nothing is re-declared when
 * a shard reconnects. Returns 0; TS_CLIENT_ENOTDECLARED when the shard holds no model;
 * TS_CLIENT_EUNAVAIL when it has no ready connection; TS_CLIENT_EINVAL for a shard out of
 * range or a call on the client thread; TS_CLIENT_ENOMEM. Not concurrently with requests in
 * flight. */
TS_CLIENT_API int ts_client_attach(ts_client_t *c, uint32_t shard, char *errmsg, size_t errlen);

/* The keys of a table's rows (evaluation and export of a table with no bounded vocabulary;
 * tessera.proto's TableKeys). `table` is its index in the declared (or attached) model's
 * tables. Read-only: a worker or any admin client may list, the worker token is enough.
 *
 * ts_client_table_keys asks shard `shard` for one page: at most max (1 to 1,048,576) keys
 * of its rows from `cursor` on (0 first, then page->next_cursor), in the shard's slot
 * order, into keys[0..page->num_keys). page->done says the walk is through; page->erased
 * counts the rows the table ever lost on that shard and page->rows its live rows now. A
 * key present for the whole walk is listed exactly once (rows never move while they live,
 * a growing table re-hashes only its index); a key erased meanwhile may be listed though
 * gone, one erased and made again twice. Errors: TS_CLIENT_ENOTABLE (no such table),
 * TS_CLIENT_ENOTDECLARED, TS_CLIENT_EINVAL (max out of range, a cursor past the shard's
 * row slots: start again at 0), TS_CLIENT_EUNAVAIL.
 *
 * ts_client_table_keys_all lists every shard's keys with the restart rule: when a shard's
 * `erased` changes between two pages it walks that shard again from 0, up to 3 times (a
 * table evicting all the time is then listed as it walks, duplicates removed); pages of
 * 65,536 keys. *keys (free with ts_client_keys_free; NULL when there are none) gets the
 * keys, ascending and each once, *n their number, *restarts (may be NULL) the walks
 * started again. Not concurrently with requests in flight on the calling thread. */
typedef struct {
  size_t num_keys;
  uint64_t next_cursor;
  bool done;
  uint64_t erased, rows;
} ts_client_keys_page_t;
TS_CLIENT_API int ts_client_table_keys(ts_client_t *c, uint32_t table, uint32_t shard,
                                       uint64_t cursor, int64_t *keys, size_t max,
                                       ts_client_keys_page_t *page, char *errmsg, size_t errlen);
TS_CLIENT_API int ts_client_table_keys_all(ts_client_t *c, uint32_t table, int64_t **keys,
                                           size_t *n, uint32_t *restarts, char *errmsg,
                                           size_t errlen);
TS_CLIENT_API void ts_client_keys_free(int64_t *keys);

/* --- requests ----------------------------------------------------------------------- */

typedef enum {
  TS_CLIENT_PULL = 1,      /* read parameters into dst */
  TS_CLIENT_PUSH = 2,      /* send gradients from grad */
  TS_CLIENT_PUSH_PULL = 3, /* push then pull, in one round trip (see below) */
  /* Values, not gradients, from grad: they replace the shards' values of the partitions
   * (the optimizer state and the versions stay). Counted in applied; in sync mode a
   * partition whose step is open (some worker pushed for it) refuses and counts in stale:
   * assign between steps. step, min_version and clock are not used. */
  TS_CLIENT_ASSIGN = 4,
  /* The model's initial values (ts_client_declare_ex's values_follow): set only where a
   * shard's partition still waits for them (applied); the others count in duplicate. */
  TS_CLIENT_ASSIGN_INITIAL = 5,
  /* Embedding tables (the sparse fields of the request): read the rows of `keys` into
   * rows_dst; push their gradients from rows_grad; or push then pull, in one round trip.
   * step, min_version, clock, timeout_s and retry_of as for the dense kinds (a table has a
   * version per shard as a partition has). */
  TS_CLIENT_SPARSE_PULL = 6,
  TS_CLIENT_SPARSE_PUSH = 7,
  TS_CLIENT_SPARSE_PUSH_PULL = 8,
} ts_client_req_kind_t;

/* step: tag each shard's push with the version last pulled from that shard (sync mode:
 * each shard's barrier counts the gradients for the step they were computed at). */
#define TS_CLIENT_STEP_PULLED UINT64_MAX
/* min_version: from each shard, wait for the version after the one last pulled from it
 * (sync mode's next step), or take whatever it has when nothing was pulled from it yet or
 * it restarted since (restored from a checkpoint, it may be behind the others). */
#define TS_CLIENT_VERSION_NEXT UINT64_MAX

typedef struct ts_client_req ts_client_req_t;

/* Called once on the client thread when a submitted request is done, with its results
 * filled in. The request (and its buffers) belong to the caller again from the callback's
 * first line on: it may free, reuse or resubmit it. */
typedef void (*ts_client_done_fn)(ts_client_req_t *req, void *arg);

struct ts_client_req {
  /* Set by ts_client_req_init: sizeof(ts_client_req_t) of the caller's header. */
  uint32_t struct_size;

  /* --- in: read at submit; the buffers are used until the request is done --- */
  ts_client_req_kind_t kind;
  /* Per declared tensor t, its gradient (push) and its destination (pull): arrays of
   * ts_client_num_tensors() pointers, each to tensor t's element count of floats. Only the
   * entries of the tensors the request covers are read; others may be NULL. The memory
   * must not be touched (pull) or changed (push) until the request is done; for a
   * PUSH_PULL, no grad range may overlap a dst range (TS_CLIENT_EINVAL), since the pull's
   * replies are read into dst while the push is still being written from grad. */
  const float *const *grad;
  float *const *dst;
  /* Optional subset, at most one of the two (NULL = the whole model):
   * tensors[0..num_tensors) — indices of declared tensors, every partition of each;
   * parts[0..num_parts) — plan partition indices (ts_client_part). Both arrays are read at
   * submit only. */
  const uint32_t *tensors;
  size_t num_tensors;
  const size_t *parts;
  size_t num_parts;
  /* push: the step the gradients are tagged with (sync mode: the version pulled; the
   * worker's clock otherwise), or TS_CLIENT_STEP_PULLED. */
  uint64_t step;
  /* pull: wait until every partition pulled is at least this version (sync long poll), or
   * TS_CLIENT_VERSION_NEXT. 0 = take what is there. */
  uint64_t min_version;
  /* pull: the caller's clock, for the ssp staleness bound. */
  uint64_t clock;
  /* Deadline in seconds; 0 = the client's (request_timeout_s, ts_client_set_timeout). */
  double timeout_s;
  /* push: 0 (as ts_client_req_init sets it) = a new push, given a new push_id; else the
   * push_id of an earlier push of this client, which this one repeats (a retry after it
   * failed with TS_CLIENT_ECLOSED, TS_CLIENT_EUNAVAIL or TS_CLIENT_ETIMEDOUT, with the same
   * gradients and partitions): a shard that has applied that push id to a partition
   * answers duplicate for it instead of applying it again, and a shard that answered one
   * of the failed attempts is not sent it again (for the last 16 failed pushes of this
   * client; the results then count only the shards it was sent to; a PUSH_PULL still
   * pulls from every shard). A shard takes an id more than
   * 64 pushes older than the newest it applied to a partition for applied, so retry soon,
   * before many later pushes. TS_CLIENT_EINVAL when no push of this client had that id.
   * Ignored for pulls. */
  uint64_t retry_of;

  /* --- out: valid once the request is done --- */
  int rc;                 /* 0, or the request's error (as returned by wait and run) */
  /* PUSH_PULL: each part's own outcome (0 or an error), since rc tells only one: a caller
   * that must know whether the push went through (to retry it or not) looks here. rc is
   * the push part's error when it failed anywhere, else the pull part's. Both 0 for the
   * other kinds. */
  int push_rc, pull_rc;
  /* push: partitions, summed over the shards, by outcome (duplicate: a repeat of a push
   * id the shard had applied, or, in sync mode, a second push of the worker for a step) */
  uint64_t applied, accumulated, stale, duplicate;
  /* pull: the lowest version pulled (0 when the request failed or pulled nothing) */
  uint64_t version;
  /* push: the id it was sent with (new, or retry_of), numbered from 1 up per client; 0
   * when its submit was refused. Set it as retry_of to retry the push. */
  uint64_t push_id;
  char errmsg[256];       /* on failure: why, naming the shard */

  /* --- private to the library (and room to grow without changing the layout) --- */
  int priv_state;
  void *priv_reserved[2];

  /* --- sparse kinds (TS_CLIENT_SPARSE_*): after the fields above, so a caller built
   * against an older header (a smaller struct_size) is refused them (TS_CLIENT_EINVAL) --- */
  /* in: the table (index in ts_client_declare_opts_t.tables) and num_keys ids in any order,
   * duplicates allowed (at most 2^26). The library sorts and deduplicates them, sends each
   * to the shard that holds it, sums the gradients of a key listed several times, and
   * fills rows_dst in the caller's order (a key listed twice gets its row twice). */
  uint32_t table;
  const int64_t *keys;
  size_t num_keys;
  const float *rows_grad; /* push: num_keys x dim gradients, row i for keys[i] */
  float *rows_dst;        /* pull: num_keys x dim, row i for keys[i]; may not overlap
                             rows_grad (PUSH_PULL) */
  /* out: push: rows whose gradients were dropped because their key is not admitted yet */
  uint64_t rows_filtered;

  /* --- in, after the sparse fields (a caller built before it has it 0) --- */
  /* TS_CLIENT_SPARSE_PULL: TS_CLIENT_ROWS_READ_ONLY reads without changing anything (for
   * evaluation and export): a key with no row gets the initializer's row, and no row is
   * made, no admission sighting counted, no row's recency refreshed. */
  uint32_t sparse_flags;
};

#define TS_CLIENT_ROWS_READ_ONLY 1u

/* Zero *req, set its kind and struct_size. */
TS_CLIENT_API void ts_client_req_init(ts_client_req_t *req, ts_client_req_kind_t kind);

/* Hand req to the client thread and return at once. Requests submitted one after the other
 * (from one thread, or ordered by the caller) reach every shard in that order; requests
 * submitted concurrently from several threads are ordered arbitrarily. On 0 the request
 * is in flight: cb
 * (optional) is called exactly once on the client thread when it is done, whatever its
 * outcome; without cb, ts_client_wait waits for it. On an error nothing was sent, cb is never
 * called, and req->rc / req->errmsg say why:
 *   TS_CLIENT_EINVAL     req NULL or its struct_size wrong (then req is not written); c
 *                        NULL, a bad kind, a buffer missing, a subset index out of range
 *                        or listed twice, both subsets given, grad and dst overlapping
 *                        (PUSH_PULL: then push_rc and pull_rc are EINVAL too), a
 *                        retry_of that is no push_id of this client;
 *   TS_CLIENT_EBUSY      req is already in flight (then req is left untouched);
 *   TS_CLIENT_ENOTDECLARED  no model declared;
 *   TS_CLIENT_ESHUTDOWN  the client was interrupted or is closing;
 *   TS_CLIENT_ENOMEM.
 * A request in flight waits for shards that are not connected yet (reconnecting), up to
 * its deadline; it fails with TS_CLIENT_ETIMEDOUT when the deadline passes, and with
 * TS_CLIENT_ECLOSED when a connection is lost under it. Once it is done (callback or wait),
 * the library no longer touches its buffers, also when it ended early: a shard connection
 * still sending a push's payload from grad, or reading a pull reply into dst, is closed
 * first (and re-established in the background; other requests in flight on it fail with
 * TS_CLIENT_ECLOSED).
 *
 * PUSH_PULL: each shard is sent its push and its pull back to back, without waiting for
 * the push's reply, and handles them in order, so the pull sees the push applied (sync:
 * waits for the version the push takes part in). When it fails, dst's content is
 * unspecified and the shards' last pulled versions are left as they were, so the
 * STEP_PULLED push / VERSION_NEXT pull a caller retries with are tagged and wait as the
 * first attempt's were. A PULL that fails likewise leaves dst unspecified and the last
 * pulled versions as they were (some shards may have answered: a VERSION_NEXT retry still
 * asks every shard for the version after the last successful pull). */
TS_CLIENT_API int ts_client_submit(ts_client_t *c, ts_client_req_t *req, ts_client_done_fn cb,
                                   void *arg);

/* Wait until req (submitted on c without a callback) is done and return req->rc. Returns
 * at once for a request already done. TS_CLIENT_EINVAL (and req untouched) when c or req is
 * NULL, req was never submitted (or its submit failed), req is in flight with a callback
 * (the callback is its completion: it may free req), or when called on the client thread.
 * Any number of threads may wait for the same request. */
TS_CLIENT_API int ts_client_wait(ts_client_t *c, ts_client_req_t *req);

/* ts_client_submit then ts_client_wait: returns req->rc (the submit's error when it failed).
 * Not on the client thread. */
TS_CLIENT_API int ts_client_run(ts_client_t *c, ts_client_req_t *req);

/* --- heartbeats and progress -------------------------------------------------------- */

/* Progress carried by the next heartbeats (sent every heartbeat_interval_s from the client
 * thread, so a worker busy computing stays alive). done = the worker leaves the job's
 * barriers. */
TS_CLIENT_API void ts_client_set_progress(ts_client_t *c, uint64_t step, double loss,
                                          double examples_per_sec, double epoch_progress,
                                          bool done);

/* done (as ts_client_set_progress's) without a progress report: the next heartbeats carry
 * what ts_client_set_progress last set, or, before its first call, no report (the shards
 * show the loss, examples/s and epoch progress as not reported). */
TS_CLIENT_API void ts_client_set_done(ts_client_t *c, bool done);

/* The device this worker's model really runs on ("/cpu:0", "/gpu:0", after soft
 * placement), carried by the next heartbeats so `psctl workers` can show it. NULL or ""
 * clears it; longer than 63 bytes is cut. */
TS_CLIENT_API void ts_client_set_device(ts_client_t *c, const char *device);

/* A CTR model's AUC over its last log interval's batches, each scored before its update
 * (progressive validation), carried by the next heartbeats so `psctl workers` can show it.
 * A value outside [0, 1] (NaN) clears it. */
TS_CLIENT_API void ts_client_set_auc(ts_client_t *c, double auc);

/* A CTR model's AUC and log loss on the test rows, once the worker has evaluated them,
 * carried by the next heartbeats (`psctl workers`: test auc, test logloss). An AUC outside
 * [0, 1] or a log loss that is negative or not finite clears them. */
TS_CLIENT_API void ts_client_set_test_auc(ts_client_t *c, double auc, double logloss);

/* Send a heartbeat to every ready shard now and wait for the replies. */
TS_CLIENT_API int ts_client_heartbeat(ts_client_t *c, char *errmsg, size_t errlen);

/* The end of a job as shard 0 sees it (ts_client_job_end). */
typedef struct {
  uint32_t workers_finished; /* done, or silent for the job's heartbeat timeout */
  uint32_t num_workers;      /* the job's workers */
  bool report_final;         /* this worker evaluates and reports the final parameters */
  uint32_t workers_joined;   /* workers that joined the job: those taking part (0: the
                                shard does not say) */
} ts_client_job_end_t;

/* A heartbeat (as ts_client_heartbeat) that returns shard 0's count of finished workers.
 * Once a worker that set done (ts_client_set_progress) asks while every worker has
 * finished, shard 0 chooses it, once per job, to evaluate the final parameters:
 * report_final is true for it, in this reply and the next. Only this call can get a worker
 * chosen: a plain heartbeat with done (ts_client_heartbeat, the periodic ones, the last one
 * as the client closes) only counts it finished. Fails with TS_CLIENT_EUNAVAIL
 * when shard 0 has no ready connection. */
TS_CLIENT_API int ts_client_job_end(ts_client_t *c, ts_client_job_end_t *out, char *errmsg,
                                    size_t errlen);

/* The job's final test accuracy, sent with every heartbeat from now on (by the worker
 * ts_client_job_end chose); shards keep it for their status (final_test_accuracy). */
TS_CLIENT_API void ts_client_set_final_accuracy(ts_client_t *c, double accuracy);

/* --- status and admin --------------------------------------------------------------- */

typedef struct {
  int32_t task;
  uint64_t step;
  double loss;
  double examples_per_sec;
  double last_seen_s;          /* seconds since the shard last heard from the worker */
  bool alive, done;
  double epoch_progress;
  const char *identity;
  uint64_t clock;
  uint64_t stale_dropped;      /* this worker's gradient partitions dropped as stale */
  bool reported;               /* loss, examples_per_sec, epoch_progress were reported
                                  (ts_client_set_progress); else they are 0 and unknown */
  bool step_known;             /* step was reported or taken from a push the shard accepted */
  const char *device;          /* the device it trains on ("/cpu:0"); "" until reported */
  bool has_auc;                /* a CTR model's progressive AUC (ts_client_set_auc) */
  double auc;
  bool has_test_auc;           /* its test AUC and log loss (ts_client_set_test_auc) */
  double test_auc, test_logloss;
} ts_client_worker_status_t;

/* One embedding table on one shard. */
typedef struct {
  const char *name;
  uint32_t dim;
  uint64_t rows;        /* rows held now */
  uint64_t bytes;       /* memory the table holds: rows, their state, the index */
  uint64_t version;     /* the table's steps (sync) or pushes applied (async, ssp) here */
  uint64_t created;     /* rows made (admitted keys), ever */
  uint64_t evicted;     /* rows evicted: steps to live, max_rows, server.max_table_bytes */
  uint64_t filtered;    /* gradient rows dropped for keys not admitted */
  uint64_t pulled_rows, pushed_rows;
  /* The keys pulls asked for most of late, hottest first, and the share of the pulled keys
   * they were (a lower bound, from a sample; 0 when nothing was pulled). */
  uint64_t hot_keys[8];
  uint32_t num_hot_keys;
  double hot_share;
} ts_client_table_status_t;

/* One shard's view of itself and of the workers it has seen. */
typedef struct {
  uint32_t shard, num_shards;
  ts_client_mode_t mode;
  uint64_t step;               /* sync: the lowest partition version; else pushes applied */
  uint32_t partitions;
  uint64_t bytes;
  uint64_t version;            /* lowest partition version */
  uint32_t tensors;
  const ts_client_worker_status_t *workers;
  size_t num_workers_seen;
  uint64_t pushes, pulls, stale_dropped, rejected_frames, errors;
  double uptime_s;
  uint32_t num_workers;        /* configured workers */
  const int32_t *barrier_waiting_for; /* sync: tasks the open barrier waits for */
  size_t num_barrier_waiting_for;
  uint64_t connections, auth_failures, nonfinite_refused, incarnation;
  const char *last_checkpoint; /* newest checkpoint written or restored ("" when none) */
  double last_checkpoint_age_s; /* -1 when none */
  uint64_t checkpoints_written;
  uint64_t restored_step;      /* step restored at start (0 when none) */
  bool has_final_test_accuracy; /* the job's final accuracy has been reported: */
  double final_test_accuracy;   /* ts_client_set_final_accuracy's value */
  int32_t final_reporter;       /* and the task that sent it */
  const ts_client_table_status_t *tables; /* the declared tables, in declared order */
  size_t num_tables;
  uint32_t checkpoint_failures; /* checkpoint attempts failed in a row (0: the last worked) */
  const char *checkpoint_error; /* the last failure's reason ("" when none) */
  const char *job_id;           /* the job's identity, 16 hex digits ("" before a declare) */
  uint32_t workers_joined;      /* workers that joined since the model was declared: those
                                   taking part (older shards: 0) */
} ts_client_shard_status_t;

/* Ask shard i for its status; *out (one allocation, strings and arrays included) is freed
 * with ts_client_status_free. Fails with TS_CLIENT_EUNAVAIL at once when the shard has no
 * ready connection, TS_CLIENT_EINVAL for a shard out of range. */
TS_CLIENT_API int ts_client_status(ts_client_t *c, uint32_t shard, ts_client_shard_status_t **out,
                                   char *errmsg, size_t errlen);
TS_CLIENT_API void ts_client_status_free(ts_client_shard_status_t *st);

/* Admin: ask shard i to write a checkpoint now; path (may be NULL) gets the file, *step
 * (may be NULL) the step it holds. Needs an admin client (TS_CLIENT_EPERM). */
TS_CLIENT_API int ts_client_checkpoint(ts_client_t *c, uint32_t shard, char *path, size_t pathlen,
                                       uint64_t *step, char *errmsg, size_t errlen);

/* Admin: ask shard i to stop (after a final checkpoint when `checkpoint` and the job keeps
 * checkpoints); path (may be NULL) gets the final checkpoint ("" when none). */
TS_CLIENT_API int ts_client_shutdown(ts_client_t *c, uint32_t shard, bool checkpoint, char *path,
                                     size_t pathlen, char *errmsg, size_t errlen);

/* Admin: ask shard i to drop its declared model and the model's optimizer state, so the
 * next declare defines the model anew (psctl model reset; docs/security.md). The shard
 * refuses with TS_CLIENT_EBUSY while worker connections are open, unless `force`: then it
 * closes them first (their clients reconnect and declare again). *dropped (may be NULL) is
 * false when no model was declared; *bytes (may be NULL) gets the bytes freed and
 * *workers_closed (may be NULL) the worker connections closed. Needs an admin client
 * (TS_CLIENT_EPERM). */
TS_CLIENT_API int ts_client_model_reset(ts_client_t *c, uint32_t shard, bool force, bool *dropped,
                                        uint64_t *bytes, uint32_t *workers_closed, char *errmsg,
                                        size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
