/*
 * The system tests' small network (netemu.h): the namespaces and their TUN devices, set up
 * with iproute2 and removed at exit or on a fatal signal, and the switch thread that
 * forwards each packet between them with the delay, jitter, loss and partitions a test
 * asks for, counting what it did.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "netemu.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Packets held at once; past that one is dropped (a full queue), as netem's limit does. */
#define QUEUE_MAX 16384
/* As large as a TUN device takes: like the 64 KiB segments veth passes with GSO, so a
 * loss rate applies per segment as netem's does there. */
#define MTU 65000

typedef struct {
  uint64_t due_ns;
  int dst;
  size_t len;
  uint8_t *data; /* owned by the queue until written or dropped */
} pkt_t;

struct ts_netemu {
  int n;
  char addr[TS_NETEMU_MAX][24];
  int nsfd[TS_NETEMU_MAX];
  int tun[TS_NETEMU_MAX];
  int self_ns;
  int wake[2];
  pthread_t thread;
  bool running;
  pthread_t watch; /* watch_main: measures machine stalls */
  bool watching, stop_watch;
  /* Settings (the test's thread writes them) and stats (the switch's thread writes them):
   * atomics, no lock, so a busy switch never holds a cut back. */
  double delay_ms, jitter_ms, loss;
  bool cut[TS_NETEMU_MAX];
  ts_netemu_stats_t stats;
  pkt_t *queue; /* the switch thread's alone */
  size_t queued;
  uint64_t rng;
};

/* What the signal handler and atexit remove: filled before any namespace exists. */
static char g_ip[256];
static char g_ns[TS_NETEMU_MAX][32];
static volatile sig_atomic_t g_num_ns;

/* Async-signal-safe: fork, execv, waitpid. */
static void del_all_ns(void) {
  for (int i = 0; i < g_num_ns; i++) {
    if (!g_ns[i][0]) continue;
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, 2);
      char *argv[] = {"ip", "netns", "del", g_ns[i], NULL};
      execv(g_ip, argv);
      _exit(127);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
  }
  g_num_ns = 0;
}

static void on_fatal_signal(int sig) {
  del_all_ns();
  signal(sig, SIG_DFL);
  raise(sig);
}

static int run_ip(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char *argv[32];
  int argc = 0;
  argv[argc++] = "ip";
  for (char *tok = strtok(line, " "); tok && argc < 31; tok = strtok(NULL, " ")) argv[argc++] = tok;
  argv[argc] = NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    execv(g_ip, argv);
    _exit(127);
  }
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool find_ip(void) {
  const char *dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    snprintf(g_ip, sizeof g_ip, "%s/ip", dirs[i]);
    if (access(g_ip, X_OK) == 0) return true;
  }
  return false;
}

/* Namespaces of test processes that died without removing them (SIGKILL). */
static void remove_stale(void) {
  DIR *d = opendir("/var/run/netns");
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d))) {
    int pid, node;
    if (sscanf(de->d_name, "tsnf%d-%d", &pid, &node) != 2) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    run_ip("netns del %s", de->d_name);
  }
  closedir(d);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double rand01(ts_netemu_t *e) {
  e->rng ^= e->rng << 13;
  e->rng ^= e->rng >> 7;
  e->rng ^= e->rng << 17;
  return (double)(e->rng >> 11) / 9007199254740992.0;
}

/* Node of an IPv4 packet's address at offset off (12: source, 16: destination), or -1. */
static int node_of(const ts_netemu_t *e, const uint8_t *p, size_t len, size_t off) {
  if (len < 20 || (p[0] >> 4) != 4) return -1;
  if (p[off] != 10 || p[off + 1] != 77 || p[off + 2] != 0) return -1;
  int k = (int)p[off + 3] - 1;
  return k >= 0 && k < e->n ? k : -1;
}

static void take(ts_netemu_t *e, const uint8_t *p, size_t len) {
  int src = node_of(e, p, len, 12), dst = node_of(e, p, len, 16);
  if (src < 0 || dst < 0) return; /* not ours (IPv6 chatter): nowhere to go */
  double loss, delay_ms, jitter_ms;
  __atomic_load(&e->loss, &loss, __ATOMIC_RELAXED);
  __atomic_load(&e->delay_ms, &delay_ms, __ATOMIC_RELAXED);
  __atomic_load(&e->jitter_ms, &jitter_ms, __ATOMIC_RELAXED);
  bool cut = __atomic_load_n(&e->cut[src], __ATOMIC_RELAXED) ||
             __atomic_load_n(&e->cut[dst], __ATOMIC_RELAXED);
  bool lost = !cut && loss > 0 && rand01(e) < loss;
  double delay = delay_ms + jitter_ms * (2.0 * rand01(e) - 1.0);
  if (cut || lost) {
    __atomic_fetch_add(cut ? &e->stats.cut : &e->stats.lost, 1, __ATOMIC_RELAXED);
    return;
  }
  if (delay <= 0) {
    if (write(e->tun[dst], p, len) < 0) { /* a full device queue drops, as a link does */
    }
    __atomic_fetch_add(&e->stats.forwarded, 1, __ATOMIC_RELAXED);
    return;
  }
  uint8_t *copy = malloc(len);
  if (!copy || e->queued == QUEUE_MAX) {
    free(copy);
    __atomic_fetch_add(&e->stats.lost, 1, __ATOMIC_RELAXED);
    return;
  }
  memcpy(copy, p, len);
  e->queue[e->queued++] = (pkt_t){now_ns() + (uint64_t)(delay * 1e6), dst, len, copy};
}

/* Write the packets that are due; returns the nanoseconds to the next one (or 50 ms). */
static uint64_t deliver(ts_netemu_t *e) {
  uint64_t now = now_ns(), next = 50000000u;
  uint64_t sent = 0;
  for (size_t i = 0; i < e->queued;) {
    pkt_t *k = &e->queue[i];
    if (k->due_ns <= now) {
      if (write(e->tun[k->dst], k->data, k->len) < 0) { /* dropped, as above */
      }
      free(k->data);
      *k = e->queue[--e->queued];
      sent++;
      continue;
    }
    if (k->due_ns - now < next) next = k->due_ns - now;
    i++;
  }
  if (sent) __atomic_fetch_add(&e->stats.forwarded, sent, __ATOMIC_RELAXED);
  return next;
}

static void *switch_main(void *arg) {
  ts_netemu_t *e = arg;
  static uint8_t buf[65536];
  struct pollfd pf[TS_NETEMU_MAX + 1];
  uint64_t due = now_ns();
  for (;;) {
    /* How late this thread woke (watch_main measures the machine's stalls; this, the
     * switch's own). */
    uint64_t now = now_ns();
    if (now > due && now - due > __atomic_load_n(&e->stats.max_stall_ns, __ATOMIC_RELAXED))
      __atomic_store_n(&e->stats.max_stall_ns, now - due, __ATOMIC_RELAXED);
    uint64_t wait = deliver(e);
    due = now_ns() + wait;
    pf[0] = (struct pollfd){.fd = e->wake[0], .events = POLLIN};
    for (int i = 0; i < e->n; i++) pf[i + 1] = (struct pollfd){.fd = e->tun[i], .events = POLLIN};
    struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
    if (ppoll(pf, (nfds_t)e->n + 1, &ts, NULL) < 0 && errno != EINTR) break;
    if (pf[0].revents) break;
    due = now_ns(); /* woken by a packet: not late */
    for (int i = 0; i < e->n; i++) {
      if (!(pf[i + 1].revents & POLLIN)) continue;
      for (int k = 0; k < 64; k++) {
        ssize_t r = read(e->tun[i], buf, sizeof buf);
        if (r <= 0) break;
        take(e, buf, (size_t)r);
      }
    }
  }
  return NULL;
}

/* How late a thread that only sleeps wakes: a machine that stalls everything (a loaded
 * host, a paused VM) stalls the cluster too, and the test widens its bounds by that much.
 * The switch's own lateness misses such stalls while packets keep waking it. */
static void *watch_main(void *arg) {
  ts_netemu_t *e = arg;
  const uint64_t period = 10000000u; /* 10 ms */
  while (!__atomic_load_n(&e->stop_watch, __ATOMIC_RELAXED)) {
    uint64_t due = now_ns() + period;
    struct timespec ts = {0, (long)period};
    nanosleep(&ts, NULL);
    uint64_t now = now_ns();
    if (now > due && now - due > __atomic_load_n(&e->stats.max_stall_ns, __ATOMIC_RELAXED))
      __atomic_store_n(&e->stats.max_stall_ns, now - due, __ATOMIC_RELAXED);
  }
  return NULL;
}

static int fail(char *why, size_t n, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, n, fmt, ap);
  va_end(ap);
  return rc;
}

static int open_tun(ts_netemu_t *e, int i) {
  if (setns(e->nsfd[i], CLONE_NEWNET) < 0) return -1;
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "tnf0");
  if (fd >= 0 && ioctl(fd, TUNSETIFF, &ifr) < 0) {
    close(fd);
    fd = -1;
  }
  if (setns(e->self_ns, CLONE_NEWNET) < 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

int ts_netemu_start(ts_netemu_t **out, int n, char *why, size_t whylen) {
  *out = NULL;
  if (n < 1 || n > TS_NETEMU_MAX) return fail(why, whylen, -1, "%d nodes (1 to %d)", n, TS_NETEMU_MAX);
  if (geteuid() != 0) return fail(why, whylen, 77, "network namespaces need root");
  if (!find_ip()) return fail(why, whylen, 77, "iproute2's ip is not installed");
  if (run_ip("netns list") != 0) return fail(why, whylen, 77, "`ip netns` does not work here");
  if (access("/dev/net/tun", R_OK | W_OK) != 0) return fail(why, whylen, 77, "no /dev/net/tun");
  remove_stale();

  ts_netemu_t *e = calloc(1, sizeof *e);
  if (!e) return fail(why, whylen, -1, "out of memory");
  e->queue = calloc(QUEUE_MAX, sizeof *e->queue);
  e->n = n;
  e->rng = 0x9e3779b97f4a7c15u;
  e->wake[0] = e->wake[1] = -1;
  for (int i = 0; i < TS_NETEMU_MAX; i++) e->nsfd[i] = e->tun[i] = -1;
  e->self_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  *out = e;
  if (!e->queue || e->self_ns < 0) return fail(why, whylen, -1, "out of memory or no /proc");

  static bool registered;
  if (!registered) {
    registered = true;
    atexit(del_all_ns);
    int sigs[] = {SIGTERM, SIGINT, SIGALRM, SIGABRT, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_fatal_signal);
  }
  for (int i = 0; i < n; i++) {
    snprintf(g_ns[i], sizeof g_ns[i], "tsnf%d-%d", (int)getpid(), i);
    g_num_ns = i + 1;
    snprintf(e->addr[i], sizeof e->addr[i], "10.77.0.%d", i + 1);
    if (run_ip("netns add %s", g_ns[i]) != 0)
      return fail(why, whylen, i == 0 ? 77 : -1, "`ip netns add %s` failed", g_ns[i]);
    char path[300];
    snprintf(path, sizeof path, "/var/run/netns/%s", g_ns[i]);
    e->nsfd[i] = open(path, O_RDONLY | O_CLOEXEC);
    if (e->nsfd[i] < 0) return fail(why, whylen, -1, "cannot open %s", path);
    e->tun[i] = open_tun(e, i);
    if (e->tun[i] < 0) return fail(why, whylen, i == 0 ? 77 : -1, "no TUN device in %s", g_ns[i]);
    if (run_ip("-n %s link set lo up", g_ns[i]) != 0 ||
        run_ip("-n %s link set tnf0 mtu %d up", g_ns[i], MTU) != 0 ||
        run_ip("-n %s addr add %s/24 dev tnf0", g_ns[i], e->addr[i]) != 0)
      return fail(why, whylen, -1, "configuring %s failed", g_ns[i]);
  }
  if (pipe2(e->wake, O_CLOEXEC) < 0) return fail(why, whylen, -1, "pipe: %s", strerror(errno));
  if (pthread_create(&e->thread, NULL, switch_main, e) != 0)
    return fail(why, whylen, -1, "cannot start the switch thread");
  e->running = true;
  if (pthread_create(&e->watch, NULL, watch_main, e) != 0)
    return fail(why, whylen, -1, "cannot start the stall watch thread");
  e->watching = true;
  return 0;
}

void ts_netemu_set(ts_netemu_t *e, double delay_ms, double jitter_ms, double loss) {
  __atomic_store(&e->delay_ms, &delay_ms, __ATOMIC_RELAXED);
  __atomic_store(&e->jitter_ms, &jitter_ms, __ATOMIC_RELAXED);
  __atomic_store(&e->loss, &loss, __ATOMIC_RELAXED);
}

void ts_netemu_cut(ts_netemu_t *e, int node, bool cut) {
  if (node < 0 || node >= e->n) return;
  __atomic_store_n(&e->cut[node], cut, __ATOMIC_RELAXED);
}

const char *ts_netemu_addr(const ts_netemu_t *e, int node) {
  return node >= 0 && node < e->n ? e->addr[node] : "";
}

ts_netemu_stats_t ts_netemu_stats(ts_netemu_t *e) {
  ts_netemu_stats_t s = {
      .forwarded = __atomic_load_n(&e->stats.forwarded, __ATOMIC_RELAXED),
      .lost = __atomic_load_n(&e->stats.lost, __ATOMIC_RELAXED),
      .cut = __atomic_load_n(&e->stats.cut, __ATOMIC_RELAXED),
      .max_stall_ns = __atomic_load_n(&e->stats.max_stall_ns, __ATOMIC_RELAXED)};
  return s;
}

pid_t ts_netemu_spawn(ts_netemu_t *e, int node, const char *const *argv, const char *out,
                      const char *err) {
  if (node < 0 || node >= e->n) return -1;
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (setns(e->nsfd[node], CLONE_NEWNET) < 0) _exit(126);
  if (out) {
    int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 1);
  }
  if (err) {
    int fd = open(err, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
  }
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

int ts_netemu_enter(ts_netemu_t *e, int node) {
  if (node < 0 || node >= e->n) return -1;
  return setns(e->nsfd[node], CLONE_NEWNET);
}

void ts_netemu_stop(ts_netemu_t *e) {
  if (!e) return;
  if (e->running) {
    if (write(e->wake[1], "x", 1) < 0) { /* the thread also stops on the pipe's close */
    }
    pthread_join(e->thread, NULL);
  }
  if (e->watching) {
    __atomic_store_n(&e->stop_watch, true, __ATOMIC_RELAXED);
    pthread_join(e->watch, NULL);
  }
  if (e->self_ns >= 0) {
    if (setns(e->self_ns, CLONE_NEWNET) < 0) perror("netemu: setns back");
    close(e->self_ns);
  }
  for (size_t i = 0; i < e->queued; i++) free(e->queue[i].data);
  for (int i = 0; i < TS_NETEMU_MAX; i++) {
    if (e->tun[i] >= 0) close(e->tun[i]);
    if (e->nsfd[i] >= 0) close(e->nsfd[i]);
  }
  for (int i = 0; i < 2; i++)
    if (e->wake[i] >= 0) close(e->wake[i]);
  del_all_ns();
  free(e->queue);
  free(e);
}
