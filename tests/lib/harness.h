/*
 * Test harness (tests/lib, for the integration, system and gpu suites and bench/psbench):
 * real ps-server processes on ephemeral loopback ports.
 *
 * ts_cluster_start writes a job file into a fresh temporary directory, picks free ports on
 * 127.0.0.1 (for each shard's protocol and admin HTTP endpoints, cluster.ps and
 * cluster.ps_http, and for each worker's admin endpoint, cluster.workers), starts one
 * ps-server per shard (each child dies with the test through
 * PR_SET_PDEATHSIG) and waits until every shard accepts connections. ts_cluster_stop stops
 * them (SIGTERM, then SIGKILL after 5 s) and removes the directory. Each server's stderr
 * goes to DIR/ps-N.log.
 */
#ifndef TS_HARNESS_H
#define TS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "skip.h"

#define TS_CLUSTER_MAX 8

typedef struct {
  int num_shards;
  int num_workers;
  char dir[256];
  char config[300];            /* DIR/job.cfg */
  char addr[TS_CLUSTER_MAX][32];
  const char *addrs[TS_CLUSTER_MAX];
  int port[TS_CLUSTER_MAX];
  int http_port[TS_CLUSTER_MAX];        /* shard i's admin endpoint (cluster.ps_http) */
  int worker_port[TS_CLUSTER_MAX];      /* worker t's admin endpoint (cluster.workers) */
  pid_t pid[TS_CLUSTER_MAX];
  int bad_exits;               /* shards that stopped on SIGTERM with a non-zero status */
  /* Set by a test whose job has auth.tls (ts_tls_certs's directory), after the start: the
   * helpers' clients (model_pull) then speak TLS with its certificates. */
  char tls_dir[256];
} ts_cluster_t;

/* Start num_shards servers for a job of num_workers workers. extra_cfg is appended to the
 * job file (libconfig text, e.g. "job = { mode = \"async\"; };" — groups given here replace
 * the defaults of their keys). Returns 0, or -1 after printing why. */
int ts_cluster_start(ts_cluster_t *c, int num_shards, int num_workers, const char *extra_cfg);

/* Start (again) shard i with the same job file; waits until it accepts. */
int ts_cluster_start_shard(ts_cluster_t *c, int i);
/* The same with one more argument for ps-server (e.g. "--fresh"; NULL: none). */
int ts_cluster_start_shard_arg(ts_cluster_t *c, int i, const char *arg);

/* Send sig to shard i and, for SIGTERM/SIGINT/SIGKILL, reap it. A shard that exits with a
 * non-zero status, or does not exit within 5 s of SIGTERM/SIGINT (it is then killed),
 * counts in bad_exits. */
void ts_cluster_signal(ts_cluster_t *c, int i, int sig);

/* Stop every shard and remove the directory. Returns the number of shards that did not
 * exit cleanly on SIGTERM or whose log holds a sanitizer report (each printed with its
 * log); tests assert it is 0, so a leak or UB in ps-server fails the test. */
int ts_cluster_stop(ts_cluster_t *c);

/* Stop c's shards (as ts_cluster_stop) and remove dir, a test's own directory beside
 * the cluster's: the number ts_cluster_stop returns. */
int ts_cluster_stop_rm(ts_cluster_t *c, const char *dir);

/* Monotonic time in seconds, and a sleep of ms milliseconds. */
double ts_now_s(void);
void ts_sleep_ms(int ms);

/* Under AddressSanitizer a shard's freed memory waits in a quarantine of up to 256 MiB,
 * which would show as RSS growth the plain build does not have: tests that bound a shard's
 * growth call this first, to keep it small (ASAN_OPTIONS, which the shards inherit), so the
 * bound means the same in both builds. */
void ts_asan_small_quarantine(void);

/* Resident set size of a process in KiB (0 when unknown). */
long ts_proc_rss_kib(pid_t pid);

/* CPU time of a process so far, user + system, in seconds (/proc/PID/stat's utime + stime,
 * clock-tick resolution); -1 when unknown. */
double ts_proc_cpu_s(pid_t pid);
/* The same split into user and system seconds; 0, or -1 when unreadable. */
int ts_proc_cpu_split(pid_t pid, double *user, double *sys);

/* The content of shard i's log (malloc'd, caller frees), or NULL. */
char *ts_cluster_log(const ts_cluster_t *c, int i);

/* Whether shard i's log holds needle; when it does not, says so on stderr with the log. */
bool ts_cluster_log_has(const ts_cluster_t *c, int i, const char *needle);

/* Run a command line, capture stdout into out (size n) and return its exit status. */
int ts_run_capture(const char *const *argv, char *out, size_t n, char *err, size_t errn);

/* ts_run_capture of psctl with exactly these arguments (NULL-terminated, at most 30). */
int ts_run_psctl(const char *const *args, char *out, size_t n, char *err, size_t errn);

/* A ps-worker process started by ts_worker_start; its stdout and stderr go to files. */
typedef struct {
  pid_t pid;
  int status;         /* exit status once reaped (128 + signal when killed) */
  char out[320], err[320];
} ts_proc_t;

/* Start worker `task` of the cluster's job with extra arguments (NULL-terminated, may be
 * NULL). Returns 0 or -1. */
int ts_worker_start(ts_cluster_t *c, int task, const char *const *extra, ts_proc_t *p);

/* ts_worker_start, with setup(arg) called in the child just before it runs ps-worker (to
 * enter a namespace, say); the child exits 126 when setup returns non-zero. */
int ts_worker_start_with(ts_cluster_t *c, int task, const char *const *extra, ts_proc_t *p,
                         int (*setup)(void *), void *arg);

/* Waits until p's log (stderr) holds needle (true) or timeout_s passes (false). */
bool ts_proc_wait_log(const ts_proc_t *p, const char *needle, double timeout_s);

/* How many times needle occurs in the file at path (0 when it cannot be read). */
int ts_file_count(const char *path, const char *needle);

/* Wait for p to exit, at most timeout_s seconds (then it is killed and -1 returned).
 * Returns the exit status (128 + signal for a killed process). */
int ts_proc_wait(ts_proc_t *p, double timeout_s);

/* Starts workers 0..n-1 of c's job with extra arguments (as ts_worker_start) into w[0..n-1],
 * then waits for each, at most timeout_s seconds, printing the log of one that does not exit
 * 0 (ts_proc_dump). Returns 0 when all exited 0, -1 when one could not be started (those
 * started before it are left running), else the first non-zero exit status. */
int ts_workers_run(ts_cluster_t *c, int n, const char *const *extra, double timeout_s,
                   ts_proc_t *w);

/* A whole file, malloc'd (caller frees), or NULL. */
char *ts_read_file(const char *path);

/* Whether the file at path holds needle (false when it cannot be read). */
bool ts_file_has(const char *path, const char *needle);

/* Prints p's log (its stderr file) on stderr, for a test that is about to fail. */
void ts_proc_dump(const ts_proc_t *p);

/* The number after key (e.g. "test_accuracy=") in the "done: task=..." line of a worker's
 * stdout; -1 when there is no such line or key. */
double ts_done_field(const ts_proc_t *p, const char *key);

/* The value of the sample `series` (name with its labels, as printed) in a /metrics body,
 * or -1 when absent. */
double ts_metric_value(const char *text, const char *series);

/* The relative L2 distance of a from b: |a - b| / |b| over n elements (0 when b is 0). */
double ts_rel_l2(const float *a, const float *b, size_t n);

/* Waits (up to 5 s: an admin endpoint publishes its snapshot every 250 ms) until the
 * /metrics series of the endpoint on http_port is present and within [lo, hi]; returns its
 * last value (-1 when absent), and says on stderr when it never got there. */
double ts_metric_wait(int http_port, const char *series, double lo, double hi);

/* `promtool check metrics` of text: 0 when promtool accepts it, else promtool's status (-1
 * when it cannot be run). Without promtool on PATH the check is noted as skipped
 * (skip.h: the test then exits 77, saying why) and 0 returned, so a test asserts
 * ts_promtool_check(body) == 0 and goes on with its other checks. */
int ts_promtool_check(const char *text);

/* A free TCP port on 127.0.0.1 (not one handed out before by this process). */
int ts_free_port(void);

/* GET http://127.0.0.1:port/path with a timeout of 5 s. Returns the HTTP status (or -1 when
 * the connection fails); the body (NUL-terminated, truncated to n-1) goes to body and the
 * Content-Type header's value to ctype (size ctn, may be NULL). */
int ts_http_get(int port, const char *path, char *body, size_t n, char *ctype, size_t ctn);

/* Test certificates for auth.tls (tests/lib/make_tls_certs.sh says which) in a new
 * temporary directory, its path into dir (n bytes; remove it with ts_tls_certs_rm). With
 * cert "shard", auth_out gets the job file's auth group for TLS with those files (the
 * shards' certificate serves the clients of the test too: one host). 0, or -1 after saying
 * why. */
int ts_tls_certs(char *dir, size_t n, char *auth_out, size_t auth_n);
void ts_tls_certs_rm(const char *dir);

/* Paths of the built binaries (set by meson). */
extern const char *ts_ps_server_path;
extern const char *ts_psctl_path;
extern const char *ts_ps_worker_path;
/* tests/lib/fake_shard.c: a hostile peer on a shard's address (its header comment). */
extern const char *ts_fake_shard_path;

/* Start fake-shard with its option `mode` (NULL: none); its pid, its port into *port, or -1.
 * It dies with the calling process; kill and reap it with ts_fake_shard_stop. */
pid_t ts_fake_shard_start(const char *mode, int *port);
void ts_fake_shard_stop(pid_t pid);

#endif
