/*
 * psbench: push+pull throughput and latency of Tessera against real ps-server processes.
 *
 * Starts --shards ps-server processes on free 127.0.0.1 ports (the integration tests'
 * harness: a job file in a temporary directory, fork/exec of build/server/ps-server, each
 * child dies with this process), then runs --workers threads, each with its own client
 * (worker task i), that push a gradient of one tensor of --size bytes and pull the tensor
 * back, over and over. A run lasts --seconds (or --iters iterations per worker); after
 * one warm-up iteration per worker, --runs runs are timed.
 *
 *   throughput = workers x iterations x 2 x size / wall time of the run   (GB/s, 1e9 B)
 *
 * i.e. gradient bytes pushed plus parameter bytes pulled, the ps-lite convention of the
 * issue. Reported: the median over runs (gbps) with min and max, and the push+pull round
 * trip of every iteration of every worker (p50_us, p99_us), and the shards' CPU time per
 * byte moved: the ps-server processes' user + system CPU seconds (/proc/PID/stat) over the
 * timed runs, divided by the GB pushed plus pulled in them (cpu_s_per_gb; clock-tick
 * resolution, 10 ms, so short runs of small tensors give a coarse figure), and the same for the
 * clients (client_cpu_s_per_gb: this process's user + system CPU seconds, getrusage
 * RUSAGE_SELF, over the timed runs; the worker threads are this process's only busy
 * threads, so it is the clients' CPU time, their busy-polling included), and both split into
 * user and system time (shard_user_s_per_gb, shard_sys_s_per_gb, client_user_s_per_gb,
 * client_sys_s_per_gb: on the shard, user time is mostly the NaN/Inf check and the optimizer,
 * system time the kernel's copies of the push and the pull reply). Modes: async (push tagged
 * with the worker's clock, then pull) and sync (push_pulled with the version pulled, then
 * pull_next, which waits for the barrier of every worker); either way the push and the pull
 * travel together (one TS_CLIENT_PUSH_PULL request): one round trip, as the
 * worker makes them. The clients, and the job file the shards read, poll for replies for
 * --busy-poll-us (job.busy_poll_us; default its configuration default).
 *
 * In the same invocation it measures loopback TCP with iperf3 (one stream, 127.0.0.1,
 * --iperf-seconds, median of --iperf-runs: once before and once after the Tessera runs by
 * default, so a change of load shows as a spread), and prints ratio = gbps / iperf3_gbps.
 * When iperf3 is missing it tries `apt-get install -y iperf3` once (as root); if it is still
 * missing, or with --no-iperf, iperf3_gbps and ratio are null.
 *
 * Everything stops by itself: runs are bounded, client calls have deadlines, the servers
 * are stopped (SIGTERM, then SIGKILL) and their directory removed; iperf3 runs under
 * `timeout`.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_config.h"
#include "bench_stats.h"
#include "bench_size.h"
#include "harness.h"
#include "tessera/client.h"
#include "ts_log.h"

#define MAX_WORKERS 8
#define MAX_RUNS 100

typedef enum { OUT_TABLE, OUT_CSV, OUT_JSON } out_fmt_t;

typedef struct {
  uint64_t size;              /* bytes of the tensor */
  int workers, shards, runs;
  bool sync;
  double seconds;             /* per run, when iters == 0 */
  long iters;                 /* per worker per run; 0 = time-bounded */
  uint64_t partition_bytes;
  out_fmt_t out;
  bool iperf;
  double iperf_seconds;
  int iperf_runs;
  const char *optimizer;
  long busy_poll_us;          /* -1 = job.busy_poll_us's default */
  bool verbose;
  const char *tls_dir;     /* --tls: auth.tls with the certificates there */
} opts_t;

static opts_t opt = {
    .size = 40u << 20,
    .workers = 1,
    .shards = 1,
    .runs = 5,
    .seconds = 1.0,
    .partition_bytes = 4u << 20,
    .out = OUT_TABLE,
    .iperf = true,
    .iperf_seconds = 2.0,
    .iperf_runs = 2,
    .optimizer = "sgd",
    .busy_poll_us = -1,
};

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, bench_cmp_double);
  if (n == 0) return NAN;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: psbench [options]\n"
          "  --size N            tensor size: 4KiB, 4MiB, 40MiB, 400MiB ... (default 40MiB)\n"
          "  --workers N         client threads, each worker task i (1..%d, default 1)\n"
          "  --shards N          ps-server processes (1..%d, default 1)\n"
          "  --mode async|sync   (default async)\n"
          "  --runs N            timed runs (default 5); median, min, max are reported\n"
          "  --seconds S         length of a run (default 1.0)\n"
          "  --iters N           iterations per worker per run instead of --seconds\n"
          "  --partition-bytes N job.partition_bytes (default 4MiB)\n"
          "  --optimizer NAME    optimizer.name on the shards (default sgd)\n"
          "  --busy-poll-us N    job.busy_poll_us of the clients and shards, 0 = sleep at\n"
          "                      once (default: the configuration's default)\n"
          "  --output table|csv|json  (default table)\n"
          "  --iperf-seconds S   length of one iperf3 measurement (default 2)\n"
          "  --iperf-runs N      iperf3 measurements, half before and half after (default 2)\n"
          "  --no-iperf          skip iperf3 (iperf3_gbps and ratio are null)\n"
          "  --tls DIR           auth.tls with DIR's ca.pem, shard.pem/.key and client.pem/.key\n"
          "                      (tests/lib/make_tls_certs.sh makes them)\n"
          "  --verbose           progress on stderr\n",
          MAX_WORKERS, TS_CLUSTER_MAX);
}

static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                         \
  do {                                                       \
    if (!v) {                                                \
      fprintf(stderr, "psbench: %s needs a value\n", a);     \
      return -1;                                             \
    }                                                        \
    i++;                                                     \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--size") == 0) {
      NEED_VALUE();
      opt.size = bench_parse_size(v);
    } else if (strcmp(a, "--workers") == 0) {
      NEED_VALUE();
      opt.workers = atoi(v);
    } else if (strcmp(a, "--shards") == 0) {
      NEED_VALUE();
      opt.shards = atoi(v);
    } else if (strcmp(a, "--runs") == 0) {
      NEED_VALUE();
      opt.runs = atoi(v);
    } else if (strcmp(a, "--seconds") == 0) {
      NEED_VALUE();
      opt.seconds = atof(v);
    } else if (strcmp(a, "--iters") == 0) {
      NEED_VALUE();
      opt.iters = atol(v);
    } else if (strcmp(a, "--partition-bytes") == 0) {
      NEED_VALUE();
      opt.partition_bytes = bench_parse_size(v);
    } else if (strcmp(a, "--optimizer") == 0) {
      NEED_VALUE();
      opt.optimizer = v;
    } else if (strcmp(a, "--busy-poll-us") == 0) {
      NEED_VALUE();
      char *end;
      opt.busy_poll_us = strtol(v, &end, 10);
      if (*end || end == v || opt.busy_poll_us < 0 || opt.busy_poll_us > 1000000) {
        fprintf(stderr, "psbench: --busy-poll-us is 0..1000000\n");
        return -1;
      }
    } else if (strcmp(a, "--mode") == 0) {
      NEED_VALUE();
      if (strcmp(v, "sync") == 0) opt.sync = true;
      else if (strcmp(v, "async") == 0) opt.sync = false;
      else {
        fprintf(stderr, "psbench: --mode is async or sync\n");
        return -1;
      }
    } else if (strcmp(a, "--output") == 0) {
      NEED_VALUE();
      if (strcmp(v, "table") == 0) opt.out = OUT_TABLE;
      else if (strcmp(v, "csv") == 0) opt.out = OUT_CSV;
      else if (strcmp(v, "json") == 0) opt.out = OUT_JSON;
      else {
        fprintf(stderr, "psbench: --output is table, csv or json\n");
        return -1;
      }
    } else if (strcmp(a, "--iperf-seconds") == 0) {
      NEED_VALUE();
      opt.iperf_seconds = atof(v);
    } else if (strcmp(a, "--iperf-runs") == 0) {
      NEED_VALUE();
      opt.iperf_runs = atoi(v);
    } else if (strcmp(a, "--no-iperf") == 0) {
      opt.iperf = false;
    } else if (strcmp(a, "--tls") == 0) {
      NEED_VALUE();
      opt.tls_dir = v;
    } else if (strcmp(a, "--verbose") == 0) {
      opt.verbose = true;
    } else {
      fprintf(stderr, "psbench: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
#undef NEED_VALUE
  }
  if (opt.size < 4 || opt.size % 4) {
    fprintf(stderr, "psbench: --size must be a positive multiple of 4 bytes\n");
    return -1;
  }
  if (opt.workers < 1 || opt.workers > MAX_WORKERS || opt.shards < 1 ||
      opt.shards > TS_CLUSTER_MAX || opt.runs < 1 || opt.runs > MAX_RUNS ||
      (opt.iters <= 0 && !(opt.seconds > 0 && opt.seconds <= 600)) || opt.iperf_runs < 1 ||
      opt.iperf_runs > 20 || !(opt.iperf_seconds >= 1 && opt.iperf_seconds <= 60) ||
      opt.partition_bytes < 4 || opt.partition_bytes % 4) {
    fprintf(stderr, "psbench: an option is out of range (see --help)\n");
    return -1;
  }
  return 0;
}

/* --- iperf3 ------------------------------------------------------------------------- */

static bool have_iperf3(void) { return system("command -v iperf3 >/dev/null 2>&1") == 0; }

static bool ensure_iperf3(void) {
  if (have_iperf3()) return true;
  if (geteuid() == 0) {
    fprintf(stderr, "psbench: iperf3 missing; trying apt-get install -y iperf3\n");
    int rc = system("DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q iperf3 "
                    ">/dev/null 2>&1");
    (void)rc;
  }
  if (have_iperf3()) return true;
  fprintf(stderr, "psbench: iperf3 is not available; iperf3_gbps and ratio are null\n");
  return false;
}

/* One single-stream iperf3 measurement on 127.0.0.1: GB/s received, or NAN. */
static double iperf3_once(void) {
  int port = ts_free_port();
  pid_t srv = fork();
  if (srv < 0) return NAN;
  if (srv == 0) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execlp("timeout", "timeout", "120", "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", p,
           (char *)NULL);
    _exit(127);
  }
  double gbps = NAN;
  char cmd[256], *buf = NULL;
  size_t cap = 0, len = 0;
  /* The server needs a moment to listen: retry the client a few times. */
  for (int attempt = 0; attempt < 20 && isnan(gbps); attempt++) {
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    snprintf(cmd, sizeof cmd, "timeout %d iperf3 -J -c 127.0.0.1 -p %d -t %g 2>/dev/null",
             (int)opt.iperf_seconds + 30, port, opt.iperf_seconds);
    FILE *p = popen(cmd, "r");
    if (!p) break;
    len = 0;
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, p)) > 0) {
      if (len + r + 1 > cap) {
        cap = (len + r + 1) * 2;
        char *nb = realloc(buf, cap);
        if (!nb) break;
        buf = nb;
      }
      memcpy(buf + len, chunk, r);
      len += r;
    }
    pclose(p);
    if (!buf) continue;
    buf[len] = 0;
    cJSON *j = cJSON_Parse(buf);
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(j, "end");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(end, "sum_received");
    const cJSON *bps = cJSON_GetObjectItemCaseSensitive(sum, "bits_per_second");
    if (cJSON_IsNumber(bps)) gbps = bps->valuedouble / 8e9;
    cJSON_Delete(j);
  }
  free(buf);
  kill(srv, SIGTERM);
  waitpid(srv, NULL, 0);
  return gbps;
}

/* --- the benchmark ------------------------------------------------------------------ */

typedef struct {
  int task;
  ts_cluster_t *cluster;
  pthread_barrier_t *barrier;
  float *param, *grad;
  ts_client_t *cl;
  int err;
  char errmsg[512];
  long iters[MAX_RUNS];
  double *lat;                /* round trips, microseconds */
  size_t nlat, cap_lat;
} worker_t;

#define CALIBRATION_ITERS 3
static long sync_iters;               /* sync mode: steps per run, set after calibration */
static volatile double run_deadline;   /* set by the main thread before each run */
static double run_start[MAX_RUNS], run_end[MAX_RUNS];

/* CPU seconds so far, split as the kernel accounts them; negative when unreadable. */
typedef struct {
  double user, sys;
} cpu_t;

/* A process's user and system CPU seconds (/proc/PID/stat), or {-1, -1}. */
static cpu_t proc_cpu(pid_t pid) {
  cpu_t c;
  if (ts_proc_cpu_split(pid, &c.user, &c.sys) < 0) return (cpu_t){-1, -1};
  return c;
}

/* The shards' CPU seconds so far (summed over the shards), or {-1, -1} when one is
 * unreadable. */
static cpu_t shards_cpu(const ts_cluster_t *c) {
  cpu_t sum = {0, 0};
  for (int i = 0; i < opt.shards; i++) {
    cpu_t s = proc_cpu(c->pid[i]);
    if (s.user < 0) return s;
    sum.user += s.user;
    sum.sys += s.sys;
  }
  return sum;
}

/* This process's CPU seconds so far (every thread): the clients' CPU time. */
static cpu_t self_cpu(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) < 0) return (cpu_t){-1, -1};
  return (cpu_t){(double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6};
}

/* acc += b - a, or acc = unknown (-1) once a reading failed. */
static void cpu_add(cpu_t *acc, cpu_t a, cpu_t b) {
  if (a.user < 0 || b.user < 0 || acc->user < 0) {
    *acc = (cpu_t){-1, -1};
    return;
  }
  acc->user += b.user - a.user;
  acc->sys += b.sys - a.sys;
}

/* Seconds per GB of a CPU figure, NaN when unknown. */
static double per_gb(double s, double gb) { return s >= 0 && gb > 0 ? s / gb : (double)NAN; }

/* param and grad are separate allocations, as push_pull requires. */
static int one_iteration(worker_t *w, uint64_t clock) {
  float *dst[1] = {w->param};
  const float *g[1] = {w->grad};
  ts_client_req_t q;
  ts_client_req_init(&q, TS_CLIENT_PUSH_PULL);
  q.grad = g;
  q.dst = dst;
  q.step = opt.sync ? TS_CLIENT_STEP_PULLED : clock;
  q.min_version = opt.sync ? TS_CLIENT_VERSION_NEXT : 0;
  q.clock = clock;
  int rc = ts_client_run(w->cl, &q);
  if (rc < 0) snprintf(w->errmsg, sizeof w->errmsg, "%s", q.errmsg);
  return rc;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  uint64_t clock = 0;
  float *dst[1] = {w->param};
  /* Warm-up: one pull (sync: the version the first push is tagged with) and one iteration,
   * so pages are touched and buffers grown before anything is timed. */
  if (!w->err) {
    /* sync: nothing pulled yet, so VERSION_NEXT takes the current version without waiting */
    ts_client_req_t q;
    ts_client_req_init(&q, TS_CLIENT_PULL);
    q.dst = dst;
    q.min_version = opt.sync ? TS_CLIENT_VERSION_NEXT : 0;
    q.clock = clock;
    w->err = ts_client_run(w->cl, &q);
    if (w->err) snprintf(w->errmsg, sizeof w->errmsg, "%s", q.errmsg);
    if (!w->err) w->err = one_iteration(w, clock++);
  }
  /* Calibration (sync mode without --iters): CALIBRATION_ITERS timed by the main thread,
   * which then fixes the step count of every run. */
  pthread_barrier_wait(w->barrier);
  for (int k = 0; opt.sync && opt.iters <= 0 && k < CALIBRATION_ITERS && !w->err; k++)
    w->err = one_iteration(w, clock++);
  pthread_barrier_wait(w->barrier);
  for (int r = 0; r < opt.runs; r++) {
    pthread_barrier_wait(w->barrier);   /* main sets run_deadline, run_start */
    pthread_barrier_wait(w->barrier);
    long n = 0;
    /* In sync mode every worker must do the same number of steps, or the barrier of the
     * last step waits for a worker that stopped: sync runs have a fixed count (--iters, or
     * sync_iters from the calibration). A worker that failed still counts its steps so the
     * others are not left waiting at a barrier: they fail too, by their deadline. */
    long limit = opt.iters > 0 ? opt.iters : opt.sync ? sync_iters : 0;
    while (!w->err) {
      if (limit > 0) {
        if (n >= limit) break;
      } else if (bench_now_s() >= run_deadline) {
        break;
      }
      double t0 = bench_now_s();
      w->err = one_iteration(w, clock++);
      double dt = (bench_now_s() - t0) * 1e6;
      if (w->nlat == w->cap_lat) {
        size_t cap = w->cap_lat ? w->cap_lat * 2 : 4096;
        double *nl = realloc(w->lat, cap * sizeof *nl);
        if (!nl) {
          w->err = -1;
          snprintf(w->errmsg, sizeof w->errmsg, "out of memory for latencies");
          break;
        }
        w->lat = nl;
        w->cap_lat = cap;
      }
      w->lat[w->nlat++] = dt;
      n++;
    }
    w->iters[r] = n;
    pthread_barrier_wait(w->barrier);   /* main records run_end */
  }
  return NULL;
}

/* v with `decimals` digits after the point, or null when it is not a number. */
static void print_null_or(FILE *f, int decimals, double v) {
  if (isnan(v)) fputs("null", f);
  else fprintf(f, "%.*f", decimals, v);
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) < 0) return 2;
  signal(SIGPIPE, SIG_IGN);
  ts_log_init("psbench", TS_LOG_WARN);
  /* PSBENCH_SERVER: another ps-server binary (a before/after comparison). */
  if (getenv("PSBENCH_SERVER")) ts_ps_server_path = getenv("PSBENCH_SERVER");

  double iperf[20];
  int n_iperf = 0;
  bool iperf_ok = opt.iperf && ensure_iperf3();
  int iperf_before = (opt.iperf_runs + 1) / 2;
  for (int i = 0; iperf_ok && i < iperf_before; i++) {
    double g = iperf3_once();
    if (!isnan(g)) iperf[n_iperf++] = g;
    if (opt.verbose) fprintf(stderr, "psbench: iperf3 %.3f GB/s\n", g);
  }

  if (opt.busy_poll_us < 0 && (opt.busy_poll_us = bench_default_busy_poll_us()) < 0) {
    fprintf(stderr, "psbench: out of memory\n");
    return 1;
  }
  char extra[4096];
  snprintf(extra, sizeof extra,
           "job = { mode = \"%s\"; partition_bytes = %" PRIu64 "; sync_timeout_s = 60.0; "
           "heartbeat_timeout_s = 60.0; busy_poll_us = %ld; };\n"
           "optimizer = { name = \"%s\"; learning_rate = 0.0001; };\n"
           "server = { max_message_bytes = 2147483648; };\n",
           opt.sync ? "sync" : "async", opt.partition_bytes, opt.busy_poll_us, opt.optimizer);
  char ca[600], cert[600], key[600];
  if (opt.tls_dir) {
    size_t len = strlen(extra);
    snprintf(extra + len, sizeof extra - len,
             "auth = { tls = true; tls_ca_file = \"%s/ca.pem\"; tls_cert_file = "
             "\"%s/shard.pem\"; tls_key_file = \"%s/shard.key\"; };\n",
             opt.tls_dir, opt.tls_dir, opt.tls_dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", opt.tls_dir);
    snprintf(cert, sizeof cert, "%s/client.pem", opt.tls_dir);
    snprintf(key, sizeof key, "%s/client.key", opt.tls_dir);
  }
  ts_cluster_t cluster;
  if (ts_cluster_start(&cluster, opt.shards, opt.workers, extra) < 0) {
    fprintf(stderr, "psbench: could not start the shards\n");
    return 1;
  }

  uint64_t elems = opt.size / 4;
  uint64_t shape[1] = {elems};
  ts_client_tensor_t tensor = {.name = "w", .shape = shape, .rank = 1, .init = TS_CLIENT_INIT_ZEROS};
  worker_t w[MAX_WORKERS];
  memset(w, 0, sizeof w);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)opt.workers + 1);
  int failed = 0;
  for (int i = 0; i < opt.workers; i++) {
    w[i].task = i;
    w[i].cluster = &cluster;
    w[i].barrier = &barrier;
    w[i].param = aligned_alloc(64, (opt.size + 63) & ~(uint64_t)63);
    w[i].grad = aligned_alloc(64, (opt.size + 63) & ~(uint64_t)63);
    if (!w[i].param || !w[i].grad) {
      fprintf(stderr, "psbench: out of memory for %" PRIu64 "-byte tensors\n", opt.size);
      failed = 1;
      break;
    }
    memset(w[i].param, 0, opt.size);
    for (uint64_t k = 0; k < elems; k++) w[i].grad[k] = 1e-3f;
    ts_client_opts_t o;
    ts_client_opts_init(&o);
    o.addrs = cluster.addrs;
    o.num_shards = (size_t)opt.shards;
    o.task = i;
    o.identity = "psbench";
    o.connect_timeout_s = 10;
    o.request_timeout_s = 60;
    o.heartbeat_interval_s = 1.0;
    o.require_all = true;
    o.busy_poll_us = (uint32_t)opt.busy_poll_us;
    o.log = ts_log_forward;
    o.log_level = TS_CLIENT_LOG_DEBUG;
    if (opt.tls_dir) {
      o.tls_ca_file = ca;
      o.tls_cert_file = cert;
      o.tls_key_file = key;
    }
    if (ts_client_open(&w[i].cl, &o, w[i].errmsg, sizeof w[i].errmsg) < 0 ||
        ts_client_declare(w[i].cl, &tensor, 1, 42, w[i].errmsg, sizeof w[i].errmsg) < 0) {
      fprintf(stderr, "psbench: worker %d: %s\n", i, w[i].errmsg);
      failed = 1;
      break;
    }
  }

  double gbps_run[MAX_RUNS];
  double lat_all_p50 = NAN, lat_all_p99 = NAN;
  double gb_moved = 0;
  cpu_t shard_cpu = {0, 0};    /* over the timed runs; user < 0: unknown */
  cpu_t client_cpu = {0, 0};   /* likewise, this process (the clients) */
  size_t iters_total = 0;
  int threads = 0;
  pthread_t th[MAX_WORKERS];
  if (!failed) {
    for (int i = 0; i < opt.workers; i++) {
      pthread_create(&th[i], NULL, worker_main, &w[i]);
      threads++;
    }
    pthread_barrier_wait(&barrier);   /* warm-up done */
    double t0 = bench_now_s();
    pthread_barrier_wait(&barrier);   /* calibration done */
    double step = (bench_now_s() - t0) / CALIBRATION_ITERS;
    sync_iters = (long)ceil(opt.seconds / (step > 1e-7 ? step : 1e-7));
    if (sync_iters < 2) sync_iters = 2;
    if (sync_iters > 10000000) sync_iters = 10000000;
    for (int r = 0; r < opt.runs; r++) {
      cpu_t cpu0 = shards_cpu(&cluster);
      cpu_t self0 = self_cpu();
      pthread_barrier_wait(&barrier);
      run_start[r] = bench_now_s();
      run_deadline = run_start[r] + opt.seconds;
      pthread_barrier_wait(&barrier);
      pthread_barrier_wait(&barrier);
      run_end[r] = bench_now_s();
      cpu_add(&shard_cpu, cpu0, shards_cpu(&cluster));
      cpu_add(&client_cpu, self0, self_cpu());
      long n = 0;
      for (int i = 0; i < opt.workers; i++) n += w[i].iters[r];
      gb_moved += (double)n * 2.0 * (double)opt.size / 1e9;
      gbps_run[r] = (double)n * 2.0 * (double)opt.size / (run_end[r] - run_start[r]) / 1e9;
      iters_total += (size_t)n;
      if (opt.verbose)
        fprintf(stderr, "psbench: run %d: %ld iterations in %.3f s, %.3f GB/s\n", r, n,
                run_end[r] - run_start[r], gbps_run[r]);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < opt.workers; i++) {
      if (w[i].err) {
        fprintf(stderr, "psbench: worker %d: %s\n", i, w[i].errmsg);
        failed = 1;
      }
    }
  }
  /* Shard memory while the job is loaded (parameters, optimizer state, receive buffers). */
  long shard_rss_kib = 0;
  for (int i = 0; i < opt.shards; i++) {
    long k = ts_proc_rss_kib(cluster.pid[i]);
    if (k > shard_rss_kib) shard_rss_kib = k;
  }
  for (int i = 0; i < opt.workers; i++) {
    if (w[i].cl) ts_client_close(w[i].cl);
  }
  int bad = ts_cluster_stop(&cluster);
  if (bad) failed = 1;
  pthread_barrier_destroy(&barrier);

  /* Latencies over every worker and run. */
  size_t nl = 0;
  for (int i = 0; i < opt.workers; i++) nl += w[i].nlat;
  double *lat = malloc((nl ? nl : 1) * sizeof *lat);
  if (lat) {
    size_t k = 0;
    for (int i = 0; i < opt.workers; i++) {
      memcpy(lat + k, w[i].lat, w[i].nlat * sizeof *lat);
      k += w[i].nlat;
    }
    qsort(lat, nl, sizeof *lat, bench_cmp_double);
    lat_all_p50 = bench_quantile(lat, nl, 0.50);
    lat_all_p99 = bench_quantile(lat, nl, 0.99);
    free(lat);
  }
  for (int i = 0; i < opt.workers; i++) {
    free(w[i].lat);
    free(w[i].param);
    free(w[i].grad);
  }

  for (int i = iperf_before; iperf_ok && i < opt.iperf_runs; i++) {
    double g = iperf3_once();
    if (!isnan(g)) iperf[n_iperf++] = g;
    if (opt.verbose) fprintf(stderr, "psbench: iperf3 %.3f GB/s\n", g);
  }
  if (failed) return 1;

  double sorted[MAX_RUNS];
  memcpy(sorted, gbps_run, (size_t)opt.runs * sizeof *sorted);
  double gbps = median(sorted, (size_t)opt.runs);
  double gmin = sorted[0], gmax = sorted[opt.runs - 1];
  double ip = NAN, ip_min = NAN, ip_max = NAN;
  if (n_iperf) {
    ip = median(iperf, (size_t)n_iperf);
    ip_min = iperf[0];
    ip_max = iperf[n_iperf - 1];
  }
  double ratio = isnan(ip) ? (double)NAN : gbps / ip;
  double cpu_per_gb = per_gb(shard_cpu.user + shard_cpu.sys, gb_moved);
  double client_cpu_per_gb = per_gb(client_cpu.user + client_cpu.sys, gb_moved);
  /* user, system: shards, then clients */
  double split[4] = {per_gb(shard_cpu.user, gb_moved), per_gb(shard_cpu.sys, gb_moved),
                     per_gb(client_cpu.user, gb_moved), per_gb(client_cpu.sys, gb_moved)};
  static const char *const split_name[4] = {"shard_user_s_per_gb", "shard_sys_s_per_gb",
                                            "client_user_s_per_gb", "client_sys_s_per_gb"};
  double load[3] = {NAN, NAN, NAN};
  if (getloadavg(load, 3) < 0) load[0] = NAN;
  const char *mode = opt.sync ? "sync" : "async";

  switch (opt.out) {
    case OUT_JSON:
      printf("{\"size\": %" PRIu64 ", \"workers\": %d, \"shards\": %d, \"mode\": \"%s\", "
             "\"runs\": %d, \"iterations\": %zu, \"partition_bytes\": %" PRIu64 ", \"gbps\": %.4f, "
             "\"gbps_min\": %.4f, \"gbps_max\": %.4f, \"iperf3_gbps\": ",
             opt.size, opt.workers, opt.shards, mode, opt.runs, iters_total, opt.partition_bytes,
             gbps, gmin, gmax);
      print_null_or(stdout, 4, ip);
      printf(", \"iperf3_gbps_min\": ");
      print_null_or(stdout, 4, ip_min);
      printf(", \"iperf3_gbps_max\": ");
      print_null_or(stdout, 4, ip_max);
      printf(", \"ratio\": ");
      print_null_or(stdout, 4, ratio);
      printf(", \"p50_us\": ");
      print_null_or(stdout, 1, lat_all_p50);
      printf(", \"p99_us\": ");
      print_null_or(stdout, 1, lat_all_p99);
      printf(", \"cpu_s_per_gb\": ");
      print_null_or(stdout, 4, cpu_per_gb);
      printf(", \"client_cpu_s_per_gb\": ");
      print_null_or(stdout, 4, client_cpu_per_gb);
      printf(", \"busy_poll_us\": %ld", opt.busy_poll_us);
      printf(", \"shard_rss_kib\": %ld, \"loadavg\": ", shard_rss_kib);
      print_null_or(stdout, 2, load[0]);
      for (int i = 0; i < 4; i++) {
        printf(", \"%s\": ", split_name[i]);
        print_null_or(stdout, 4, split[i]);
      }
      printf("}\n");
      break;
    case OUT_CSV:
      printf("size,workers,shards,mode,runs,iterations,gbps,gbps_min,gbps_max,iperf3_gbps,ratio,"
             "p50_us,p99_us,shard_rss_kib,loadavg,cpu_s_per_gb,client_cpu_s_per_gb");
      for (int i = 0; i < 4; i++) printf(",%s", split_name[i]);
      putchar('\n');
      printf("%" PRIu64 ",%d,%d,%s,%d,%zu,%.4f,%.4f,%.4f,", opt.size, opt.workers, opt.shards,
             mode, opt.runs, iters_total, gbps, gmin, gmax);
      if (!isnan(ip)) printf("%.4f", ip);
      putchar(',');
      if (!isnan(ratio)) printf("%.4f", ratio);
      printf(",%.1f,%.1f,%ld,%.2f,", lat_all_p50, lat_all_p99, shard_rss_kib, load[0]);
      if (!isnan(cpu_per_gb)) printf("%.4f", cpu_per_gb);
      putchar(',');
      if (!isnan(client_cpu_per_gb)) printf("%.4f", client_cpu_per_gb);
      for (int i = 0; i < 4; i++) {
        putchar(',');
        if (!isnan(split[i])) printf("%.4f", split[i]);
      }
      putchar('\n');
      break;
    case OUT_TABLE:
      printf("%-10s %3s %3s %-5s %8s %8s %8s %8s %6s %9s %9s\n", "size", "w", "s", "mode",
             "GB/s", "min", "max", "iperf3", "ratio", "p50_us", "p99_us");
      printf("%-10" PRIu64 " %3d %3d %-5s %8.3f %8.3f %8.3f ", opt.size, opt.workers, opt.shards,
             mode, gbps, gmin, gmax);
      if (isnan(ip)) printf("%8s %6s ", "n/a", "n/a");
      else printf("%8.3f %6.3f ", ip, ratio);
      printf("%9.1f %9.1f\n", lat_all_p50, lat_all_p99);
      printf("(%d runs, %zu iterations, busy_poll_us %ld, shard peak RSS now %ld KiB, "
             "shard CPU s per GB moved %.3f, client %.3f, load %.2f)\n",
             opt.runs, iters_total, opt.busy_poll_us, shard_rss_kib, cpu_per_gb,
             client_cpu_per_gb, load[0]);
      printf("(CPU s per GB moved: shard user %.3f, system %.3f; client user %.3f, system %.3f)\n",
             split[0], split[1], split[2], split[3]);
      break;
  }
  return 0;
}
