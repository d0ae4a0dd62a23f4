/*
 * bare_pushpull: psbench's push+pull with nothing of a parameter server around it, to
 * measure what this machine allows (bench/RESULTS.md section 12.2).
 *
 * --shards processes each hold an equal slice of one tensor of --size bytes; --workers
 * processes each connect to every shard over 127.0.0.1 TCP (a blocking socket and a thread
 * per connection, on both sides). An iteration of a worker sends every shard its slice of
 * the gradient (an 8-byte length, then the floats) and reads the shard's slice of the
 * parameters back; the worker's threads meet at a barrier after each iteration, as
 * psbench's client waits for every shard's reply. A shard reads a push in pieces of
 * --piece-bytes into a staging buffer and, with --apply sgd, applies each piece as it lands
 * with the shards' own SGD loop (server/ts_optim.c, w -= lr * g), then writes its slice of
 * the parameters back in one write. With --apply none it only moves the bytes.
 *
 * There is no framing beyond the length, no finiteness check, no versions, no event loop,
 * no busy-polling, no copy the kernel does not make: two socket copies of every byte each
 * way (sender into the socket, socket into the receiver) and the update. Concurrent
 * pushes to one shard apply one piece at a time (a mutex), and a pull reply may carry a
 * piece being updated by another worker's push (as a lock-free async server would).
 *
 *   throughput = workers x iterations x 2 x size / window   (GB/s, 1e9 B)
 *
 * the byte accounting of psbench and bench/peers/pslite; the window is from the first
 * worker's start of timing (after one warm-up iteration each) to the last one's end.
 * Prints one line:
 *   bare_run workers=2 shards=2 size=419430400 apply=sgd piece=4194304 iterations=27 seconds=3.012 gbps=3.210
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_size.h"
#include "ts_alloc.h"
#include "ts_optim.h"

#define MAX_PEERS 8

typedef struct {
  int workers, shards;
  uint64_t size, piece;
  double seconds;
  bool apply;
} opts_t;

/* What a worker process tells the parent through its pipe. */
typedef struct {
  uint64_t iterations;
  double t0, t1;
  int failed;
} report_t;

static opts_t opt = {.workers = 1, .shards = 1, .size = 40ull << 20, .piece = 4ull << 20,
                     .seconds = 1.0, .apply = true};

static void die(const char *what) {
  fprintf(stderr, "bare_pushpull: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Slice s of the tensor, in floats: equal slices, the remainder to the first ones. */
static size_t slice_floats(int s) {
  size_t n = opt.size / sizeof(float), k = (size_t)opt.shards;
  return n / k + ((size_t)s < n % k ? 1 : 0);
}

/* Read or write exactly n bytes; false at end of stream or on an error. */
static bool read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

static bool write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

/* ---- shard ---- */

typedef struct {
  float *w; /* the shard's slice of the parameters */
  size_t n;
  pthread_mutex_t lock; /* one piece applied at a time */
  ts_optim_t sgd;
} shard_t;

typedef struct {
  shard_t *shard;
  int fd;
} shard_conn_t;

/* Serve one worker's connection until it closes. */
static void *shard_conn(void *arg) {
  shard_conn_t *c = arg;
  shard_t *sh = c->shard;
  size_t piece = opt.piece / sizeof(float);
  float *stage = ts_huge_alloc(piece * sizeof(float));
  if (!stage) die("staging buffer");
  uint64_t len;
  while (read_all(c->fd, &len, sizeof len)) {
    if (len != sh->n * sizeof(float)) {
      fprintf(stderr, "bare_pushpull: push of %" PRIu64 " bytes, the slice is %zu\n", len,
              sh->n * sizeof(float));
      exit(1);
    }
    for (size_t off = 0; off < sh->n; off += piece) {
      size_t k = sh->n - off < piece ? sh->n - off : piece;
      if (!read_all(c->fd, stage, k * sizeof(float))) goto out;
      if (!opt.apply) continue;
      pthread_mutex_lock(&sh->lock);
      ts_optim_apply(&sh->sgd, sh->w + off, stage, 1.0f, k, NULL, NULL, 1);
      pthread_mutex_unlock(&sh->lock);
    }
    if (!write_all(c->fd, sh->w, sh->n * sizeof(float))) break;
  }
out:
  ts_huge_free(stage, piece * sizeof(float));
  close(c->fd);
  return NULL;
}

static void shard_main(int s, int listen_fd) {
  shard_t sh = {.n = slice_floats(s)};
  sh.w = ts_huge_alloc(sh.n * sizeof(float));
  if (!sh.w) die("parameters");
  memset(sh.w, 0, sh.n * sizeof(float));
  pthread_mutex_init(&sh.lock, NULL);
  sh.sgd = (ts_optim_t){.kind = TS_OPT_SGD, .lr = 1e-6f, .decay = TS_DECAY_NONE, .decay_steps = 1};
  shard_conn_t conns[MAX_PEERS];
  pthread_t threads[MAX_PEERS];
  for (int w = 0; w < opt.workers; w++) {
    conns[w] = (shard_conn_t){.shard = &sh, .fd = accept(listen_fd, NULL, NULL)};
    if (conns[w].fd < 0) die("accept");
  }
  close(listen_fd);
  for (int w = 0; w < opt.workers; w++)
    if (pthread_create(&threads[w], NULL, shard_conn, &conns[w]) != 0) die("pthread_create");
  for (int w = 0; w < opt.workers; w++) pthread_join(threads[w], NULL);
  _exit(0);
}

/* ---- worker ---- */

typedef struct {
  int fd, shard;
  float *grad, *params; /* this shard's slices of the worker's tensors */
  pthread_barrier_t *barrier;
  volatile bool *stop;
  bool failed;
} worker_conn_t;

/* One push+pull per iteration until *stop, meeting the worker's other threads at the
 * barrier after each (and once before each, where the first thread decides to stop). */
static void *worker_conn(void *arg) {
  worker_conn_t *c = arg;
  size_t n = slice_floats(c->shard);
  uint64_t len = n * sizeof(float);
  for (;;) {
    pthread_barrier_wait(c->barrier);
    if (*c->stop) break;
    if (!c->failed && !(write_all(c->fd, &len, sizeof len) && write_all(c->fd, c->grad, len) &&
                        read_all(c->fd, c->params, len)))
      c->failed = true;
    pthread_barrier_wait(c->barrier);
  }
  return NULL;
}

static void worker_main(const struct sockaddr_in *addrs, int report_fd) {
  size_t total = opt.size / sizeof(float);
  float *grad = ts_huge_alloc(total * sizeof(float)), *params = ts_huge_alloc(total * sizeof(float));
  if (!grad || !params) die("worker buffers");
  for (size_t i = 0; i < total; i++) grad[i] = 1.0f;
  memset(params, 0, total * sizeof(float));
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)opt.shards + 1);
  volatile bool stop = false;
  worker_conn_t conns[MAX_PEERS];
  pthread_t threads[MAX_PEERS];
  size_t off = 0;
  for (int s = 0; s < opt.shards; s++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)&addrs[s], sizeof addrs[s]) < 0)
      die("connect");
    conns[s] = (worker_conn_t){.fd = fd, .shard = s, .grad = grad + off, .params = params + off,
                               .barrier = &barrier, .stop = &stop};
    off += slice_floats(s);
    if (pthread_create(&threads[s], NULL, worker_conn, &conns[s]) != 0) die("pthread_create");
  }
  report_t r = {0};
  for (uint64_t it = 0;; it++) { /* iteration 0 is the warm-up */
    if (it == 1) r.t0 = now_s();
    if (it > 1 && now_s() - r.t0 >= opt.seconds) stop = true;
    pthread_barrier_wait(&barrier);
    if (stop) break;
    pthread_barrier_wait(&barrier);
    if (it > 0) r.iterations++;
  }
  r.t1 = now_s();
  for (int s = 0; s < opt.shards; s++) {
    pthread_join(threads[s], NULL);
    r.failed |= conns[s].failed;
    shutdown(conns[s].fd, SHUT_WR);
  }
  /* With one worker every pulled value is the same (each push subtracted lr * 1.0 from
   * every parameter); with more, a reply may catch another worker's push half applied. */
  for (size_t i = 1; opt.workers == 1 && i < total && !r.failed; i++)
    if (params[i] != params[0]) r.failed = 1;
  if (write(report_fd, &r, sizeof r) != (ssize_t)sizeof r) die("report");
  _exit(0);
}

/* ---- main ---- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: bare_pushpull [options]\n"
          "  --size N         tensor size: 4MiB, 40MiB, 400MiB ... (default 40MiB)\n"
          "  --workers N      worker processes (1..%d, default 1)\n"
          "  --shards N       shard processes (1..%d, default 1)\n"
          "  --seconds S      timed seconds after one warm-up iteration (default 1)\n"
          "  --apply sgd|none the shards' SGD update on each piece, or only the bytes (default sgd)\n"
          "  --piece-bytes N  a shard reads and applies a push in pieces of N bytes (default 4MiB)\n",
          MAX_PEERS, MAX_PEERS);
}

static void bad_option(const char *a) {
  fprintf(stderr, "bare_pushpull: bad option or value: %s\n", a);
  usage(stderr);
  exit(2);
}

static void parse(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (!v) bad_option(a);
    i++;
    if (strcmp(a, "--size") == 0) opt.size = bench_parse_size(v);
    else if (strcmp(a, "--workers") == 0) opt.workers = atoi(v);
    else if (strcmp(a, "--shards") == 0) opt.shards = atoi(v);
    else if (strcmp(a, "--seconds") == 0) opt.seconds = atof(v);
    else if (strcmp(a, "--piece-bytes") == 0) opt.piece = bench_parse_size(v);
    else if (strcmp(a, "--apply") == 0 && (strcmp(v, "sgd") == 0 || strcmp(v, "none") == 0))
      opt.apply = strcmp(v, "sgd") == 0;
    else bad_option(a);
  }
  if (opt.workers < 1 || opt.workers > MAX_PEERS || opt.shards < 1 || opt.shards > MAX_PEERS ||
      opt.size < sizeof(float) * (uint64_t)opt.shards || opt.piece < sizeof(float) ||
      !(opt.seconds > 0)) {
    fprintf(stderr, "bare_pushpull: a value is out of range\n");
    usage(stderr);
    exit(2);
  }
}

int main(int argc, char **argv) {
  parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  struct sockaddr_in addrs[MAX_PEERS];
  pid_t shard_pids[MAX_PEERS];
  for (int s = 0; s < opt.shards; s++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    addrs[s] = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addrs[s];
    if (fd < 0 || bind(fd, (struct sockaddr *)&addrs[s], sizeof addrs[s]) < 0 ||
        listen(fd, MAX_PEERS) < 0 || getsockname(fd, (struct sockaddr *)&addrs[s], &len) < 0)
      die("listen on 127.0.0.1");
    shard_pids[s] = fork();
    if (shard_pids[s] < 0) die("fork");
    if (shard_pids[s] == 0) shard_main(s, fd);
    close(fd);
  }
  int pipefd[2];
  if (pipe(pipefd) < 0) die("pipe");
  for (int w = 0; w < opt.workers; w++) {
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
      close(pipefd[0]);
      worker_main(addrs, pipefd[1]);
    }
  }
  close(pipefd[1]);
  uint64_t iterations = 0;
  double t0 = 0, t1 = 0;
  int failed = 0;
  for (int w = 0; w < opt.workers; w++) {
    report_t r;
    if (read(pipefd[0], &r, sizeof r) != (ssize_t)sizeof r) {
      failed = 1;
      break;
    }
    iterations += r.iterations;
    failed |= r.failed;
    if (w == 0 || r.t0 < t0) t0 = r.t0;
    if (w == 0 || r.t1 > t1) t1 = r.t1;
  }
  int status;
  while (wait(&status) > 0)
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  if (failed || !(t1 > t0)) {
    fprintf(stderr, "bare_pushpull: a worker or shard failed\n");
    return 1;
  }
  printf("bare_run workers=%d shards=%d size=%" PRIu64 " apply=%s piece=%" PRIu64
         " iterations=%" PRIu64 " seconds=%.3f gbps=%.3f\n",
         opt.workers, opt.shards, opt.size, opt.apply ? "sgd" : "none", opt.piece, iterations,
         t1 - t0, (double)iterations * 2.0 * (double)opt.size / (t1 - t0) / 1e9);
  return 0;
}
