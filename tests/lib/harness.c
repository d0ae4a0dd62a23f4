/*
 * The test harness (harness.h): a job file written into a fresh temporary directory, free
 * loopback ports picked, real ps-server processes started (each dies with the test,
 * PR_SET_PDEATHSIG) and waited for until they accept connections, their stderr kept for
 * the failure message, and ts_cluster_stop's SIGTERM, then SIGKILL, and removal of the
 * directory.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *ts_ps_server_path = TS_PS_SERVER;
const char *ts_psctl_path = TS_PSCTL;
const char *ts_ps_worker_path = TS_PS_WORKER;
const char *ts_fake_shard_path = TS_FAKE_SHARD;

/* Ports come from 15000-29999, below Linux's ephemeral range (32768-60999) where the
 * kernel picks the local ports of outgoing connections, so a client's connection cannot
 * take a port a shard is about to bind; none is handed out twice by one test process. */
int ts_free_port(void) {
  static unsigned char used[15000];
  static unsigned seed;
  if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
  for (int attempt = 0; attempt < 1000; attempt++) {
    seed = seed * 1103515245u + 12345u;
    int port = 15000 + (int)((seed >> 8) % 15000u);
    if (used[port - 15000]) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0) return -1;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) {
      used[port - 15000] = 1;
      return port;
    }
  }
  return -1;
}

int ts_http_get(int port, const char *path, char *body, size_t n, char *ctype, size_t ctn) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct timeval tv = {5, 0};
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  char req[512];
  int len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n",
                     path, port);
  if (write(fd, req, (size_t)len) != len) {
    close(fd);
    return -1;
  }
  size_t cap = 1 << 20, got = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while (buf && got + 1 < cap && (r = read(fd, buf + got, cap - 1 - got)) > 0) got += (size_t)r;
  close(fd);
  if (!buf) return -1;
  buf[got] = 0;
  int status = -1;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = -1;
  char *hend = strstr(buf, "\r\n\r\n");
  if (ctype && ctn) {
    ctype[0] = 0;
    for (char *l = strstr(buf, "\r\n"); l && (!hend || l < hend); l = strstr(l + 2, "\r\n")) {
      if (strncasecmp(l + 2, "Content-Type:", 13) == 0) {
        const char *v = l + 2 + 13;
        while (*v == ' ') v++;
        size_t k = strcspn(v, "\r");
        if (k >= ctn) k = ctn - 1;
        memcpy(ctype, v, k);
        ctype[k] = 0;
        break;
      }
    }
  }
  if (body && n) {
    const char *b = hend ? hend + 4 : "";
    snprintf(body, n, "%s", b);
  }
  free(buf);
  return status;
}

void ts_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

double ts_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

char *ts_cluster_log(const ts_cluster_t *c, int i) {
  char path[400];
  snprintf(path, sizeof path, "%s/ps-%d.log", c->dir, i);
  return ts_read_file(path);
}

bool ts_cluster_log_has(const ts_cluster_t *c, int i, const char *needle) {
  char *log = ts_cluster_log(c, i);
  bool has = log && strstr(log, needle);
  if (!has) fprintf(stderr, "shard %d's log lacks '%s':\n%s\n", i, needle, log ? log : "");
  free(log);
  return has;
}

char *ts_read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  buf[got] = 0;
  fclose(f);
  return buf;
}

int ts_workers_run(ts_cluster_t *c, int n, const char *const *extra, double timeout_s,
                   ts_proc_t *w) {
  for (int t = 0; t < n; t++)
    if (ts_worker_start(c, t, extra, &w[t]) != 0) return -1;
  int first = 0;
  for (int t = 0; t < n; t++) {
    int rc = ts_proc_wait(&w[t], timeout_s);
    if (rc != 0) ts_proc_dump(&w[t]);
    if (rc != 0 && first == 0) first = rc;
  }
  return first;
}

bool ts_file_has(const char *path, const char *needle) {
  char *s = ts_read_file(path);
  bool has = s && strstr(s, needle);
  free(s);
  return has;
}

void ts_proc_dump(const ts_proc_t *p) {
  char *e = ts_read_file(p->err);
  fprintf(stderr, "--- worker log %s:\n%s\n", p->err, e ? e : "(none)");
  free(e);
}

double ts_done_field(const ts_proc_t *p, const char *key) {
  char *out = ts_read_file(p->out);
  double v = -1;
  const char *d = out ? strstr(out, "done: task=") : NULL;
  const char *a = d ? strstr(d, key) : NULL;
  if (a) v = atof(a + strlen(key));
  free(out);
  return v;
}

int ts_cluster_start_shard(ts_cluster_t *c, int i) {
  return ts_cluster_start_shard_arg(c, i, NULL);
}

int ts_cluster_start_shard_arg(ts_cluster_t *c, int i, const char *arg) {
  char log[400], shard[16];
  snprintf(log, sizeof log, "%s/ps-%d.log", c->dir, i);
  snprintf(shard, sizeof shard, "%d", i);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    execl(ts_ps_server_path, "ps-server", "-c", c->config, "--shard", shard, arg, (char *)NULL);
    _exit(127);
  }
  c->pid[i] = pid;
  for (int t = 0; t < 1000; t++) {
    if (port_open(c->port[i])) return 0;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      c->pid[i] = 0;
      char *l = ts_cluster_log(c, i);
      fprintf(stderr, "harness: ps-server %d exited (status %d):\n%s\n", i, st, l ? l : "");
      free(l);
      return -1;
    }
    ts_sleep_ms(10);
  }
  fprintf(stderr, "harness: ps-server %d did not listen on %d within 10 s\n", i, c->port[i]);
  return -1;
}

static int cluster_start_once(ts_cluster_t *c, int num_shards, int num_workers,
                              const char *extra_cfg) {
  memset(c, 0, sizeof *c);
  c->num_shards = num_shards;
  c->num_workers = num_workers;
  snprintf(c->dir, sizeof c->dir, "/tmp/tessera-test-XXXXXX");
  if (!mkdtemp(c->dir)) {
    perror("mkdtemp");
    return -1;
  }
  snprintf(c->config, sizeof c->config, "%s/job.cfg", c->dir);
  FILE *f = fopen(c->config, "w");
  if (!f) return -1;
  fprintf(f, "cluster = {\n  ps = [");
  for (int i = 0; i < num_shards; i++) {
    c->port[i] = ts_free_port();
    snprintf(c->addr[i], sizeof c->addr[i], "127.0.0.1:%d", c->port[i]);
    c->addrs[i] = c->addr[i];
    fprintf(f, "%s\"%s\"", i ? ", " : "", c->addr[i]);
  }
  fprintf(f, "];\n  ps_http = [");
  for (int i = 0; i < num_shards; i++) {
    c->http_port[i] = ts_free_port();
    fprintf(f, "%s\"127.0.0.1:%d\"", i ? ", " : "", c->http_port[i]);
  }
  fprintf(f, "];\n  workers = [");
  for (int i = 0; i < num_workers; i++) {
    int p = ts_free_port();
    if (i < TS_CLUSTER_MAX) c->worker_port[i] = p;
    fprintf(f, "%s\"127.0.0.1:%d\"", i ? ", " : "", p);
  }
  fprintf(f, "];\n};\n%s\n", extra_cfg ? extra_cfg : "");
  fclose(f);
  for (int i = 0; i < num_shards; i++) {
    if (ts_cluster_start_shard(c, i) < 0) {
      ts_cluster_stop(c);
      return -1;
    }
  }
  return 0;
}

int ts_cluster_start(ts_cluster_t *c, int num_shards, int num_workers, const char *extra_cfg) {
  /* Tests write to shards on raw sockets too (rawconn): a shard that closes one must fail
   * the write, not kill the test. (The client library blocks SIGPIPE on its own thread
   * only.) */
  signal(SIGPIPE, SIG_IGN);
  /* Another program may take a port between our check and the shard's bind: try again
   * with new ports (a configuration error fails every attempt alike). */
  for (int attempt = 1;; attempt++) {
    if (cluster_start_once(c, num_shards, num_workers, extra_cfg) == 0) return 0;
    if (attempt == 3) return -1;
    fprintf(stderr, "harness: starting the cluster failed; retrying with other ports\n");
  }
}

void ts_cluster_signal(ts_cluster_t *c, int i, int sig) {
  if (c->pid[i] <= 0) return;
  kill(c->pid[i], sig);
  if (sig != SIGTERM && sig != SIGKILL && sig != SIGINT) return;
  for (int t = 0; t < 500; t++) {
    int st;
    if (waitpid(c->pid[i], &st, WNOHANG) == c->pid[i]) {
      c->pid[i] = 0;
      if (sig != SIGKILL && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        char *log = ts_cluster_log(c, i);
        fprintf(stderr, "harness: ps-server %d did not exit cleanly (status 0x%x); its log:\n%s\n",
                i, st, log ? log : "");
        free(log);
        c->bad_exits++;
      }
      return;
    }
    ts_sleep_ms(10);
  }
  kill(c->pid[i], SIGKILL);
  waitpid(c->pid[i], NULL, 0);
  c->pid[i] = 0;
  if (sig != SIGKILL) {
    /* A shard that does not stop on SIGTERM hangs its deployment's restarts too. */
    char *log = ts_cluster_log(c, i);
    fprintf(stderr,
            "harness: ps-server %d did not exit within 5 s of signal %d; killed. Its log:\n%s\n", i,
            sig, log ? log : "");
    free(log);
    c->bad_exits++;
  }
}

int ts_cluster_stop(ts_cluster_t *c) {
  for (int i = 0; i < c->num_shards; i++) ts_cluster_signal(c, i, SIGTERM);
  for (int i = 0; i < c->num_shards; i++) {
    char *log = ts_cluster_log(c, i);
    if (log && (strstr(log, "Sanitizer") || strstr(log, "runtime error:"))) {
      fprintf(stderr, "harness: ps-server %d reported a sanitizer error:\n%s\n", i, log);
      c->bad_exits++;
    }
    free(log);
  }
  if (c->dir[0] && getenv("TS_KEEP_TEST_DIRS") == NULL) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    if (system(cmd) != 0) fprintf(stderr, "harness: could not remove %s\n", c->dir);
  }
  return c->bad_exits;
}

void ts_asan_small_quarantine(void) {
  const char *asan = getenv("ASAN_OPTIONS");
  char opts[1024];
  snprintf(opts, sizeof opts, "%s%squarantine_size_mb=4:thread_local_quarantine_size_kb=64",
           asan ? asan : "", asan && *asan ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1);
}

long ts_proc_rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

int ts_proc_cpu_split(pid_t pid, double *user, double *sys) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t got = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  line[got] = 0;
  /* The command name may hold spaces and parentheses: fields start after the last ')'. */
  char *p = strrchr(line, ')');
  unsigned long long utime, stime;
  long tck = sysconf(_SC_CLK_TCK);
  if (!p || tck <= 0 ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
    return -1;
  *user = (double)utime / (double)tck;
  *sys = (double)stime / (double)tck;
  return 0;
}

double ts_proc_cpu_s(pid_t pid) {
  double user, sys;
  return ts_proc_cpu_split(pid, &user, &sys) < 0 ? -1 : user + sys;
}

int ts_run_capture(const char *const *argv, char *out, size_t n, char *err, size_t errn) {
  int po[2], pe[2];
  if (pipe(po) < 0 || pipe(pe) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  size_t got = 0, egot = 0;
  /* Read both pipes to the end; outputs here are small, so read stdout then stderr. */
  ssize_t r;
  while ((r = read(po[0], out + got, n - 1 - got)) > 0) got += (size_t)r;
  out[got] = 0;
  if (err) {
    while ((r = read(pe[0], err + egot, errn - 1 - egot)) > 0) egot += (size_t)r;
    err[egot] = 0;
  }
  close(po[0]);
  close(pe[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int ts_run_psctl(const char *const *args, char *out, size_t n, char *err, size_t errn) {
  const char *argv[32] = {ts_psctl_path};
  size_t k = 1;
  while (*args && k < 31) argv[k++] = *args++;
  argv[k] = NULL;
  return ts_run_capture(argv, out, n, err, errn);
}

int ts_worker_start(ts_cluster_t *c, int task, const char *const *extra, ts_proc_t *p) {
  return ts_worker_start_with(c, task, extra, p, NULL, NULL);
}

bool ts_proc_wait_log(const ts_proc_t *p, const char *needle, double timeout_s) {
  double t0 = ts_now_s();
  while (ts_now_s() - t0 < timeout_s) {
    if (ts_file_has(p->err, needle)) return true;
    ts_sleep_ms(2);
  }
  return false;
}

int ts_file_count(const char *path, const char *needle) {
  char *s = ts_read_file(path);
  int n = 0;
  for (const char *q = s; q && (q = strstr(q, needle)); q += strlen(needle)) n++;
  free(s);
  return n;
}

int ts_worker_start_with(ts_cluster_t *c, int task, const char *const *extra, ts_proc_t *p,
                         int (*setup)(void *), void *arg) {
  memset(p, 0, sizeof *p);
  snprintf(p->out, sizeof p->out, "%s/worker-%d.out", c->dir, task);
  snprintf(p->err, sizeof p->err, "%s/worker-%d.log", c->dir, task);
  char taskarg[16];
  snprintf(taskarg, sizeof taskarg, "%d", task);
  const char *argv[64] = {"ps-worker", "-c", c->config, "--task", taskarg};
  int n = 5;
  for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fo = open(p->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo >= 0) dup2(fo, 1);
    if (fe >= 0) dup2(fe, 2);
    if (setup && setup(arg) != 0) _exit(126);
    execv(ts_ps_worker_path, (char *const *)argv);
    _exit(127);
  }
  p->pid = pid;
  return 0;
}

int ts_proc_wait(ts_proc_t *p, double timeout_s) {
  if (p->pid <= 0) return p->status;
  for (double waited = 0; waited < timeout_s; waited += 0.01) {
    int st;
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
      p->pid = 0;
      p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return p->status;
    }
    ts_sleep_ms(10);
  }
  fprintf(stderr, "harness: worker pid %d still running after %.0f s: killed\n", (int)p->pid, timeout_s);
  kill(p->pid, SIGKILL);
  waitpid(p->pid, NULL, 0);
  p->pid = 0;
  p->status = -1;
  return -1;
}

double ts_metric_value(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, series, n) == 0 && l[n] == ' ') return strtod(l + n + 1, NULL);
  return -1;
}

double ts_metric_wait(int http_port, const char *series, double lo, double hi) {
  static char body[1 << 18];
  double v = -1;
  for (int i = 0; i < 50; i++) {
    if (ts_http_get(http_port, "/metrics", body, sizeof body, NULL, 0) == 200) {
      v = ts_metric_value(body, series);
      if (v >= 0 && v >= lo && v <= hi) return v;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "%s is %g, want it within [%g, %g]\n", series, v, lo, hi);
  return v;
}

int ts_promtool_check(const char *text) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    ts_skip_note("promtool is not on PATH: `promtool check metrics` left out (tests/run.sh "
                 "puts Debian's in .tools/usr/bin)");
    return 0;
  }
  char path[] = "/tmp/tessera-metrics-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  size_t len = strlen(text);
  ssize_t wrote = write(fd, text, len);
  close(fd);
  if (wrote != (ssize_t)len) {
    unlink(path);
    return -1;
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
  int st = system(cmd);
  unlink(path);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

double ts_rel_l2(const float *a, const float *b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    diff += d * d;
    norm += (double)b[i] * (double)b[i];
  }
  return norm > 0 ? sqrt(diff / norm) : 0.0;
}

int ts_cluster_stop_rm(ts_cluster_t *c, const char *dir) {
  int rc = ts_cluster_stop(c);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "harness: cannot remove %s\n", dir);
  return rc;
}

int ts_tls_certs(char *dir, size_t n, char *auth_out, size_t auth_n) {
  snprintf(dir, n, "/tmp/tessera-tls-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("harness: mkdtemp");
    return -1;
  }
  char script[600], out[256], err[2048];
  snprintf(script, sizeof script, "%s/tests/lib/make_tls_certs.sh", TS_SOURCE_ROOT);
  const char *argv[] = {"/bin/bash", script, dir, NULL};
  if (ts_run_capture(argv, out, sizeof out, err, sizeof err) != 0) {
    fprintf(stderr, "harness: %s failed: %s\n", script, err);
    return -1;
  }
  snprintf(auth_out, auth_n,
           "auth = { tls = true; tls_ca_file = \"%s/ca.pem\"; tls_cert_file = \"%s/shard.pem\"; "
           "tls_key_file = \"%s/shard.key\"; };\n",
           dir, dir, dir);
  return 0;
}

void ts_tls_certs_rm(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "harness: could not remove %s\n", dir);
}

pid_t ts_fake_shard_start(const char *mode, int *port) {
  int po[2];
  if (pipe(po) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(po[1], 1);
    close(po[0]);
    execl(ts_fake_shard_path, "fake-shard", mode, (char *)NULL);
    _exit(127);
  }
  close(po[1]);
  char buf[32] = {0};
  ssize_t n = pid > 0 ? read(po[0], buf, sizeof buf - 1) : -1;
  close(po[0]);
  if (n <= 0) {
    if (pid > 0) ts_fake_shard_stop(pid);
    return -1;
  }
  *port = atoi(buf);
  return pid;
}

void ts_fake_shard_stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}
