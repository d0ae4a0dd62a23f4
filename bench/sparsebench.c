/*
 * sparsebench: embedding-table throughput of Tessera (issue 27): sparse push+pull of Zipf
 * keys against real ps-server shards.
 *
 * Starts --shards ps-server processes (the integration tests' harness, tests/lib/harness.h)
 * in async mode, declares one table (--dim floats a row, SGD, rows made as zeros on first
 * touch) and runs --workers threads, each with its own client (worker task i), each doing
 * one TS_CLIENT_SPARSE_PUSH_PULL after the other: the gradients of a batch of --batch keys
 * pushed and the same keys' rows pulled back, in one round trip. The keys are drawn
 * Zipf(--zipf) over --vocab ids (bench/sparse_common.h; ids repeat within a batch, and the
 * client sorts, dedupes and sums them, as a user's would be); --batches batches per worker
 * are precomputed, so drawing keys is not timed. After --warmup-seconds (and at least
 * --warmup-requests) of the same requests (rows made, buffers grown) one run of --seconds is
 * timed.
 *
 *   rows_per_s = sum over workers of batch x requests / wall time   (the caller's keys)
 *   gbps       = 2 x rows_per_s x dim x 4 / 1e9                   (rows pushed + pulled)
 *
 * Also: p50 / p99 request latency (every request of every worker), the shards' CPU seconds
 * per million rows over the timed run (ts_proc_cpu_split of the ps-server pids; clock-tick
 * resolution) split user / system, the same for this process (the clients), the rows the
 * shards hold afterwards (their status), the shards' RSS growth since before the declare per
 * held row against the raw bytes of a row (dim x 4: SGD keeps no state) and the table's own
 * byte count per row, and this machine's memcpy bandwidth measured in the same run (after the
 * shards are stopped; --memcpy-mib 0 skips it). One JSON object with --output json.
 *
 * A table of a given size under a steady load (bench/table_size.sh): --prefill makes a row
 * of every id of [0, --vocab) before the warm-up; --hot-ids R draws the Zipf ranks over
 * [0, R) and scatters them over the vocabulary (a fixed set of R ids, so a request carries
 * the same work whatever the table's size); --fresh-share F replaces that share of every
 * request's keys by ids no request used before (vocab and up: rows made every step); and
 * --max-rows N bounds each shard's table, which then evicts its least recently used rows.
 * --prefill-stream makes the prefill's table as a stream where the hot ids recur would: their
 * rows first, kept by eviction (the plain prefill leaves them anywhere in the table).
 *
 * The clients, and the job file the shards read, poll for replies for --busy-poll-us
 * (job.busy_poll_us; default its configuration default), as ps-worker's clients and the
 * shards do in a job.
 *
 * Everything stops by itself: one bounded run, client deadlines, the shards stopped (SIGTERM
 * then SIGKILL) and their directory removed.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_config.h"
#include "bench_stats.h"
#include "harness.h"
#include "sparse_common.h"
#include "tessera/client.h"
#include "ts_log.h"

#define MAX_WORKERS 8

static struct {
  int shards, workers;
  uint32_t dim;
  size_t batch, nbatches, warmup_requests;
  double zipf;
  uint64_t vocab;
  double seconds, warmup_seconds, lr;
  long memcpy_mib;
  long busy_poll_us; /* -1 = job.busy_poll_us's default */
  uint64_t hot_ids, max_rows, max_table_bytes;
  size_t prefill_keys;
  double fresh_share;
  bool prefill, prefill_stream, json, verbose;
} opt = {.shards = 1, .workers = 1, .dim = 64, .batch = 65536, .nbatches = 8, .zipf = 1.0,
         .vocab = 1000000, .seconds = 1.5, .warmup_seconds = 0.5, .warmup_requests = 1, .lr = 0.01,
         .memcpy_mib = 256, .busy_poll_us = -1};

typedef struct {
  int task;
  ts_cluster_t *cluster;
  pthread_barrier_t *barrier;
  ts_client_t *cl;
  int64_t *keys;              /* nbatches x batch */
  float *grad, *dst;          /* batch x dim each */
  long requests;              /* in the timed run */
  double *lat;                /* microseconds, one per timed request */
  size_t nlat, cap;
  uint64_t next_fresh;        /* the next never-used id of this worker (--fresh-share) */
  int err;
  char errmsg[512];
} worker_t;

static volatile double warm_deadline, run_deadline;

static void usage(FILE *f) {
  fprintf(f,
          "usage: sparsebench [options]\n"
          "  --shards N          ps-server processes (1..%d, default 1)\n"
          "  --workers N         client threads, each its own client (1..%d, default 1)\n"
          "  --dim D             floats per row (default 64)\n"
          "  --batch B           keys per request, duplicates included (default 65536)\n"
          "  --zipf S            Zipf exponent of the keys (default 1.0)\n"
          "  --vocab V           ids drawn from [0, V) (default 1000000)\n"
          "  --batches N         precomputed batches per worker, used in turn (default 8;\n"
          "                      at most 2^27 keys per worker in all)\n"
          "  --seconds T         the timed run (default 1.5)\n"
          "  --warmup-seconds T  untimed requests before it (default 0.5)\n"
          "  --warmup-requests N and at least N of them per worker (default 1; --batches:\n"
          "                      every row the timed run touches is made before it)\n"
          "  --lr X              the table's SGD learning rate (default 0.01)\n"
          "  --memcpy-mib N      buffer of the memcpy measurement; 0 = skip (default 256)\n"
          "  --busy-poll-us N    job.busy_poll_us of the clients and the shards; 0 = sleep\n"
          "                      at once (default: its configuration default)\n"
          "  --prefill           make a row of every id of [0, V) before the warm-up\n"
          "  --prefill-keys N    keys per pull of the prefill (default: 8 MiB of rows)\n"
          "  --prefill-stream    --prefill as a stream where the hot ids recur makes the\n"
          "                      table: their rows first, then after every pull of the\n"
          "                      prefill a push of them (zero gradients: their recency\n"
          "                      renewed, so eviction keeps them where they were made)\n"
          "  --hot-ids R         Zipf ranks over [0, R) scattered over [0, V) (default V:\n"
          "                      rank r is id r)\n"
          "  --fresh-share F     share of each request's keys that are new ids (default 0)\n"
          "  --max-rows N        rows per shard; the least recently used are evicted\n"
          "                      (default 0: no bound)\n"
          "  --max-table-bytes N server.max_table_bytes of each shard (default: the\n"
          "                      server's, 4 GiB)\n"
          "  --output table|json (default table)\n"
          "  --verbose\n",
          TS_CLUSTER_MAX, MAX_WORKERS);
}

static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--verbose")) {
      opt.verbose = true;
      continue;
    } else if (!strcmp(a, "--prefill")) {
      opt.prefill = true;
      continue;
    } else if (!strcmp(a, "--prefill-stream")) {
      opt.prefill = opt.prefill_stream = true;
      continue;
    }
    if (!v) {
      fprintf(stderr, "sparsebench: %s needs a value (or is unknown; see --help)\n", a);
      return -1;
    }
    i++;
    if (!strcmp(a, "--shards")) opt.shards = atoi(v);
    else if (!strcmp(a, "--workers")) opt.workers = atoi(v);
    else if (!strcmp(a, "--dim")) opt.dim = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--batch")) opt.batch = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--zipf")) opt.zipf = atof(v);
    else if (!strcmp(a, "--vocab")) opt.vocab = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--batches")) opt.nbatches = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--seconds")) opt.seconds = atof(v);
    else if (!strcmp(a, "--warmup-seconds")) opt.warmup_seconds = atof(v);
    else if (!strcmp(a, "--warmup-requests")) opt.warmup_requests = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--lr")) opt.lr = atof(v);
    else if (!strcmp(a, "--memcpy-mib")) opt.memcpy_mib = atol(v);
    else if (!strcmp(a, "--busy-poll-us")) opt.busy_poll_us = atol(v);
    else if (!strcmp(a, "--hot-ids")) opt.hot_ids = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--fresh-share")) opt.fresh_share = atof(v);
    else if (!strcmp(a, "--max-rows")) opt.max_rows = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--max-table-bytes")) opt.max_table_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--prefill-keys")) opt.prefill_keys = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--output")) {
      if (!strcmp(v, "json")) opt.json = true;
      else if (!strcmp(v, "table")) opt.json = false;
      else {
        fprintf(stderr, "sparsebench: --output is table or json\n");
        return -1;
      }
    } else {
      fprintf(stderr, "sparsebench: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
  }
  if (opt.shards < 1 || opt.shards > TS_CLUSTER_MAX || opt.workers < 1 ||
      opt.workers > MAX_WORKERS || opt.dim < 1 || opt.dim > 4096 || opt.batch < 1 ||
      opt.batch > (1u << 26) || !(opt.zipf > 0) || opt.vocab < 1 || opt.nbatches < 1 ||
      opt.nbatches > 65536 || opt.nbatches * opt.batch > ((size_t)1 << 27) ||
      !(opt.seconds > 0 && opt.seconds <= 600) ||
      !(opt.warmup_seconds >= 0 && opt.warmup_seconds <= 600) || !(opt.lr > 0) ||
      opt.memcpy_mib < 0 || opt.memcpy_mib > 16384 || opt.busy_poll_us < -1 ||
      opt.busy_poll_us > 1000000 || opt.hot_ids > opt.vocab ||
      !(opt.fresh_share >= 0 && opt.fresh_share <= 1) || opt.vocab > ((uint64_t)1 << 60) ||
      opt.prefill_keys > ((size_t)1 << 26) || opt.warmup_requests > 65536) {
    fprintf(stderr, "sparsebench: an option is out of range (see --help)\n");
    return -1;
  }
  return 0;
}

/* One TS_CLIENT_SPARSE_PUSH_PULL or (grad NULL) TS_CLIENT_SPARSE_PULL of n keys. */
static int sparse_request(ts_client_t *cl, const int64_t *keys, size_t n, const float *grad,
                          float *dst, uint64_t step, char *err, size_t errlen) {
  ts_client_req_t q;
  ts_client_req_init(&q, grad ? TS_CLIENT_SPARSE_PUSH_PULL : TS_CLIENT_SPARSE_PULL);
  q.table = 0;
  q.keys = keys;
  q.num_keys = n;
  q.rows_grad = grad;
  q.rows_dst = dst;
  q.step = q.clock = step;
  int rc = ts_client_run(cl, &q);
  if (rc < 0) snprintf(err, errlen, "%s", q.errmsg);
  return rc;
}

static int one_request(worker_t *w, uint64_t n) {
  int64_t *keys = w->keys + (n % opt.nbatches) * opt.batch;
  /* The first keys of the batch (its draws are independent) become ids never used before:
   * vocab and up, each worker its own stride of them. */
  size_t fresh = (size_t)(opt.fresh_share * (double)opt.batch);
  for (size_t i = 0; i < fresh; i++) {
    keys[i] = (int64_t)(opt.vocab + w->next_fresh * (uint64_t)opt.workers + (uint64_t)w->task);
    w->next_fresh++;
  }
  /* async: the step is the worker's clock */
  return sparse_request(w->cl, keys, opt.batch, w->grad, w->dst, n, w->errmsg, sizeof w->errmsg);
}

/* Make a row of every id of [0, vocab) (--prefill): pulls of --prefill-keys keys (default
 * 8 MiB of rows), under a shard's reply budget (server.max_reply_bytes_per_connection).
 * With --prefill-stream the hot ids' rows come first and are pushed (zero gradients) after
 * every pull, as a stream where they recur would touch them: a table that evicts its least
 * recently used rows keeps them in the memory they were made in, with the other rows
 * flowing through the rest, as a long-running job's table is. Without it, the hot rows are
 * wherever their ids' turn and the evictions put them: scattered over the table. */
static int prefill(ts_client_t *cl, char *err, size_t errlen) {
  const size_t chunk = opt.prefill_keys ? opt.prefill_keys
                                        : ((size_t)8 << 20) / (opt.dim * sizeof(float));
  bool stream = opt.prefill_stream && opt.hot_ids && opt.hot_ids < opt.vocab;
  size_t nhot = stream ? (size_t)opt.hot_ids : 0, big = chunk > nhot ? chunk : nhot;
  int64_t *keys = malloc(chunk * sizeof *keys), *hot = malloc((nhot ? nhot : 1) * sizeof *hot);
  float *dst = malloc(big * opt.dim * sizeof *dst);
  float *zero = calloc(nhot ? nhot * opt.dim : 1, sizeof *zero);
  int rc = keys && hot && dst && zero ? 0 : -1;
  if (rc < 0) snprintf(err, errlen, "out of memory");
  uint64_t step = 0;
  for (size_t r = 0; r < nhot; r++) hot[r] = (int64_t)(sb_mix64((uint64_t)r) % opt.vocab);
  if (rc == 0 && nhot) rc = sparse_request(cl, hot, nhot, zero, dst, step++, err, errlen);
  for (uint64_t at = 0; rc == 0 && at < opt.vocab; at += chunk) {
    size_t n = opt.vocab - at < chunk ? (size_t)(opt.vocab - at) : chunk;
    for (size_t i = 0; i < n; i++) keys[i] = (int64_t)(at + i);
    rc = sparse_request(cl, keys, n, NULL, dst, 0, err, errlen);
    if (rc == 0 && nhot) rc = sparse_request(cl, hot, nhot, zero, dst, step++, err, errlen);
  }
  free(keys);
  free(hot);
  free(dst);
  free(zero);
  return rc;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  uint64_t n = 0;
  /* Warm-up: at least warmup_requests requests (and one), then until warm_deadline. */
  while (!w->err && (n == 0 || n < opt.warmup_requests || sb_now_s() < warm_deadline))
    w->err = one_request(w, n++);
  pthread_barrier_wait(w->barrier); /* main sets run_deadline */
  pthread_barrier_wait(w->barrier);
  while (!w->err && sb_now_s() < run_deadline) {
    double t0 = sb_now_s();
    w->err = one_request(w, n++);
    if (w->nlat == w->cap) {
      size_t cap = w->cap ? 2 * w->cap : 4096;
      double *nl = realloc(w->lat, cap * sizeof *nl);
      if (!nl) {
        w->err = -1;
        snprintf(w->errmsg, sizeof w->errmsg, "out of memory for latencies");
        break;
      }
      w->lat = nl;
      w->cap = cap;
    }
    w->lat[w->nlat++] = (sb_now_s() - t0) * 1e6;
    w->requests++;
  }
  pthread_barrier_wait(w->barrier); /* main records the end */
  return NULL;
}

typedef struct {
  double user, sys;
} cpu_t;

static cpu_t shards_cpu(const ts_cluster_t *c) {
  cpu_t s = {0, 0};
  for (int i = 0; i < c->num_shards; i++) {
    double u, y;
    if (ts_proc_cpu_split(c->pid[i], &u, &y) < 0) return (cpu_t){NAN, NAN};
    s.user += u;
    s.sys += y;
  }
  return s;
}

static cpu_t self_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (cpu_t){(double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6,
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6};
}

static void json_num(const char *name, int decimals, double v) {
  if (isnan(v) || isinf(v)) printf(", \"%s\": null", name);
  else printf(", \"%s\": %.*f", name, decimals, v);
}

int main(int argc, char **argv) {
  if (parse_args(argc, argv) < 0) return 2;
  signal(SIGPIPE, SIG_IGN);
  ts_log_init("sparsebench", TS_LOG_WARN);
  if (getenv("PSBENCH_SERVER")) ts_ps_server_path = getenv("PSBENCH_SERVER");

  const size_t rowbytes = (size_t)opt.dim * sizeof(float);
  worker_t w[MAX_WORKERS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < opt.workers; i++) {
    w[i].task = i;
    bool hot = opt.hot_ids && opt.hot_ids < opt.vocab;
    w[i].keys = sb_zipf_batches(27, i, opt.nbatches, opt.batch, hot ? opt.hot_ids : opt.vocab,
                                opt.zipf);
    if (hot && w[i].keys)
      for (size_t k = 0; k < opt.nbatches * opt.batch; k++)
        w[i].keys[k] = (int64_t)(sb_mix64((uint64_t)w[i].keys[k]) % opt.vocab);
    w[i].grad = malloc(opt.batch * rowbytes);
    w[i].dst = malloc(opt.batch * rowbytes);
    if (!w[i].keys || !w[i].grad || !w[i].dst) {
      fprintf(stderr, "sparsebench: out of memory for the batches\n");
      return 1;
    }
    for (size_t k = 0; k < opt.batch * opt.dim; k++) w[i].grad[k] = 1e-3f;
    memset(w[i].dst, 0, opt.batch * rowbytes);
  }

  if (opt.busy_poll_us < 0 && (opt.busy_poll_us = bench_default_busy_poll_us()) < 0) {
    fprintf(stderr, "sparsebench: out of memory\n");
    return 1;
  }
  char extra[512], budget[96] = "";
  if (opt.max_table_bytes)
    snprintf(budget, sizeof budget, " max_table_bytes = %" PRIu64 ";", opt.max_table_bytes);
  snprintf(extra, sizeof extra,
           "job = { mode = \"async\"; sync_timeout_s = 60.0; heartbeat_timeout_s = 60.0; "
           "busy_poll_us = %ld; };\n"
           "optimizer = { name = \"sgd\"; learning_rate = %g; };\n"
           "server = { max_message_bytes = 4294967296;%s };\n",
           opt.busy_poll_us, opt.lr, budget);
  ts_cluster_t cluster;
  if (ts_cluster_start(&cluster, opt.shards, opt.workers, extra) < 0) {
    fprintf(stderr, "sparsebench: could not start the shards\n");
    return 1;
  }
  long rss0[TS_CLUSTER_MAX];
  for (int i = 0; i < opt.shards; i++) rss0[i] = ts_proc_rss_kib(cluster.pid[i]);

  ts_client_table_t table = {.name = "emb", .dim = opt.dim, .init = TS_CLIENT_ROW_ZEROS,
                             .optimizer = TS_CLIENT_ROWOPT_SGD, .learning_rate = opt.lr,
                             .max_rows = opt.max_rows};
  int failed = 0;
  for (int i = 0; i < opt.workers && !failed; i++) {
    ts_client_opts_t o;
    ts_client_opts_init(&o);
    o.addrs = cluster.addrs;
    o.num_shards = (size_t)opt.shards;
    o.task = i;
    o.identity = "sparsebench";
    o.connect_timeout_s = 10;
    o.request_timeout_s = 60;
    o.heartbeat_interval_s = 1.0;
    o.require_all = true;
    o.busy_poll_us = (uint32_t)opt.busy_poll_us;
    o.log = ts_log_forward;
    o.log_level = TS_CLIENT_LOG_DEBUG;
    ts_client_declare_opts_t d;
    ts_client_declare_opts_init(&d);
    d.seed = 42;
    d.tables = &table;
    d.num_tables = 1;
    if (ts_client_open(&w[i].cl, &o, w[i].errmsg, sizeof w[i].errmsg) < 0 ||
        ts_client_declare_ex(w[i].cl, NULL, 0, &d, w[i].errmsg, sizeof w[i].errmsg) < 0) {
      fprintf(stderr, "sparsebench: worker %d: %s\n", i, w[i].errmsg);
      failed = 1;
    }
  }

  double prefill_s = 0;
  if (!failed && opt.prefill) {
    double p0 = sb_now_s();
    if (prefill(w[0].cl, w[0].errmsg, sizeof w[0].errmsg) < 0) {
      fprintf(stderr, "sparsebench: prefill: %s\n", w[0].errmsg);
      failed = 1;
    }
    prefill_s = sb_now_s() - p0;
  }

  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)opt.workers + 1);
  pthread_t th[MAX_WORKERS];
  double t0 = 0, t1 = 0;
  cpu_t sc0 = {0, 0}, sc1 = {0, 0}, cc0 = {0, 0}, cc1 = {0, 0};
  if (!failed) {
    warm_deadline = sb_now_s() + opt.warmup_seconds;
    for (int i = 0; i < opt.workers; i++) {
      w[i].cluster = &cluster;
      w[i].barrier = &barrier;
      pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    pthread_barrier_wait(&barrier); /* warm-up done */
    sc0 = shards_cpu(&cluster);
    cc0 = self_cpu();
    t0 = sb_now_s();
    run_deadline = t0 + opt.seconds;
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    t1 = sb_now_s();
    sc1 = shards_cpu(&cluster);
    cc1 = self_cpu();
    for (int i = 0; i < opt.workers; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < opt.workers; i++) {
      if (w[i].err) {
        fprintf(stderr, "sparsebench: worker %d: %s\n", i, w[i].errmsg);
        failed = 1;
      }
    }
  }

  /* Rows held and the table's bytes, from the shards' status; RSS growth since the start. */
  uint64_t rows_held = 0, table_bytes = 0, created = 0, evicted = 0;
  double rss_growth = 0;
  long rss_max = 0;
  for (int i = 0; i < opt.shards && !failed; i++) {
    ts_client_shard_status_t *st = NULL;
    char err[256];
    if (ts_client_status(w[0].cl, (uint32_t)i, &st, err, sizeof err) < 0) {
      fprintf(stderr, "sparsebench: status of shard %d: %s\n", i, err);
      failed = 1;
      break;
    }
    if (st->num_tables > 0) {
      rows_held += st->tables[0].rows;
      table_bytes += st->tables[0].bytes;
      created += st->tables[0].created;
      evicted += st->tables[0].evicted;
    }
    ts_client_status_free(st);
    long k = ts_proc_rss_kib(cluster.pid[i]);
    if (k > rss_max) rss_max = k;
    rss_growth += (double)(k - rss0[i]) * 1024.0;
  }
  for (int i = 0; i < opt.workers; i++)
    if (w[i].cl) ts_client_close(w[i].cl);
  if (ts_cluster_stop(&cluster)) failed = 1;
  pthread_barrier_destroy(&barrier);
  if (failed) return 1;

  double memcpy_gbps =
      opt.memcpy_mib ? sb_memcpy_gbps((size_t)opt.memcpy_mib << 20, 0.5) : (double)NAN;

  long requests = 0;
  size_t nl = 0;
  for (int i = 0; i < opt.workers; i++) {
    requests += w[i].requests;
    nl += w[i].nlat;
  }
  double *lat = malloc((nl ? nl : 1) * sizeof *lat);
  double p50 = NAN, p99 = NAN;
  if (lat) {
    size_t k = 0;
    for (int i = 0; i < opt.workers; i++) {
      memcpy(lat + k, w[i].lat, w[i].nlat * sizeof *lat);
      k += w[i].nlat;
    }
    qsort(lat, nl, sizeof *lat, bench_cmp_double);
    p50 = bench_quantile(lat, nl, 0.5);
    p99 = bench_quantile(lat, nl, 0.99);
    free(lat);
  }
  double wall = t1 - t0;
  double rows = (double)requests * (double)opt.batch;
  double rows_per_s = rows / wall;
  double gbps = 2.0 * rows_per_s * (double)rowbytes / 1e9;
  double mrows = rows / 1e6;
  double load[3] = {NAN, NAN, NAN};
  if (getloadavg(load, 3) < 0) load[0] = NAN;
  double raw = (double)rowbytes; /* SGD: no optimizer state */

  if (opt.json) {
    printf("{\"system\": \"tessera\", \"shards\": %d, \"workers\": %d, \"dim\": %u, "
           "\"batch\": %zu, \"zipf\": %.2f, \"vocab\": %" PRIu64 ", \"seconds\": %.3f, "
           "\"requests\": %ld",
           opt.shards, opt.workers, opt.dim, opt.batch, opt.zipf, opt.vocab, wall, requests);
    json_num("rows_per_s", 0, rows_per_s);
    json_num("gbps", 4, gbps);
    json_num("p50_us", 1, p50);
    json_num("p99_us", 1, p99);
    json_num("shard_cpu_s_per_mrows", 4, (sc1.user + sc1.sys - sc0.user - sc0.sys) / mrows);
    json_num("shard_user_s_per_mrows", 4, (sc1.user - sc0.user) / mrows);
    json_num("shard_sys_s_per_mrows", 4, (sc1.sys - sc0.sys) / mrows);
    json_num("client_cpu_s_per_mrows", 4, (cc1.user + cc1.sys - cc0.user - cc0.sys) / mrows);
    json_num("client_user_s_per_mrows", 4, (cc1.user - cc0.user) / mrows);
    json_num("client_sys_s_per_mrows", 4, (cc1.sys - cc0.sys) / mrows);
    printf(", \"rows_held\": %" PRIu64 ", \"rows_created\": %" PRIu64 ", \"rows_evicted\": %" PRIu64
           ", \"shard_rss_kib\": %ld, \"prefill\": %s, \"prefill_stream\": %s, \"hot_ids\": %" PRIu64
           ", \"max_rows\": %" PRIu64 ", \"busy_poll_us\": %ld",
           rows_held, created, evicted, rss_max, opt.prefill ? "true" : "false",
           opt.prefill_stream ? "true" : "false", opt.hot_ids, opt.max_rows, opt.busy_poll_us);
    json_num("fresh_share", 3, opt.fresh_share);
    json_num("prefill_s", 1, prefill_s);
    json_num("rss_bytes_per_row", 1, rows_held ? rss_growth / (double)rows_held : (double)NAN);
    json_num("table_bytes_per_row", 1,
             rows_held ? (double)table_bytes / (double)rows_held : (double)NAN);
    json_num("raw_bytes_per_row", 0, raw);
    json_num("memcpy_gbps", 3, memcpy_gbps);
    json_num("loadavg", 2, load[0]);
    printf("}\n");
  } else {
    printf("%d+%d dim %u batch %zu zipf %.2f: %.0f rows/s, %.3f GB/s, p50 %.1f us, p99 %.1f us\n",
           opt.shards, opt.workers, opt.dim, opt.batch, opt.zipf, rows_per_s, gbps, p50, p99);
    printf("shard CPU s per M rows %.4f (user %.4f, sys %.4f); client %.4f\n",
           (sc1.user + sc1.sys - sc0.user - sc0.sys) / mrows, (sc1.user - sc0.user) / mrows,
           (sc1.sys - sc0.sys) / mrows, (cc1.user + cc1.sys - cc0.user - cc0.sys) / mrows);
    printf("rows made %" PRIu64 ", evicted %" PRIu64 " (prefill %.1f s)\n", created, evicted,
           prefill_s);
    printf("rows held %" PRIu64 ", RSS growth per row %.1f B, table bytes per row %.1f, raw %.0f; "
           "memcpy %.3f GB/s; load %.2f\n",
           rows_held, rows_held ? rss_growth / (double)rows_held : (double)NAN,
           rows_held ? (double)table_bytes / (double)rows_held : (double)NAN, raw, memcpy_gbps, load[0]);
  }
  for (int i = 0; i < opt.workers; i++) {
    free(w[i].keys);
    free(w[i].grad);
    free(w[i].dst);
    free(w[i].lat);
  }
  return 0;
}
