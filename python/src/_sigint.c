/* tessera._client: SIGINT seen from any thread (_sigint.h says what and why). */
#include "_client_int.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "_sigint.h"

/* The handler may only touch lock-free atomics. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "int atomics must be lock-free");

static atomic_ullong gen;       /* SIGINTs counted by on_sigint */
static atomic_ullong acked;     /* the main thread ran Python's handler for these */
static atomic_ullong last_ns;   /* CLOCK_MONOTONIC of the latest SIGINT */
static atomic_int wake_fd = -1; /* the watcher pipe's write end */
/* The handler on_sigint chains to: written into the slot not in use, then published. */
static struct sigaction chained[2];
static atomic_int chained_i;
/* The handler first chained to (Python's): the only one installed over again. */
static bool have_first;
static struct sigaction first;

static void on_sigint(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  const struct sigaction *p = &chained[atomic_load(&chained_i)];
  /* Python's first: its flag is set before anyone can see the generation move. */
  if (p->sa_flags & SA_SIGINFO)
    p->sa_sigaction(sig, si, uc);
  else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN)
    p->sa_handler(sig);
  struct timespec ts; /* clock_gettime is async-signal-safe */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  atomic_store(&last_ns,
               (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  atomic_fetch_add(&gen, 1);
  int fd = atomic_load(&wake_fd);
  if (fd >= 0) {
    char b = 0;
    ssize_t n = write(fd, &b, 1); /* non-blocking; a full pipe already wakes the watcher */
    (void)n;
  }
  errno = saved;
}

/* --- the watcher ----------------------------------------------------------------------- */

/* Under mu: the process the watcher and pipe belong to, the pending call's state, and
 * whether the interpreter is exiting (then Py_AddPendingCall must no longer be called). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t owner;
static int read_fd = -1;
static bool scheduled, stopping, at_exit_registered;
static uint64_t target;
static unsigned long main_ident;

void sigint_handled(uint64_t g) {
  unsigned long long a = atomic_load(&acked);
  while (a < g && !atomic_compare_exchange_weak(&acked, &a, g)) {
  }
}

/* A pending call: runs on the main thread with the GIL, after Python's signal handlers. */
static int ack_cb(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  uint64_t t = target;
  scheduled = false;
  pthread_mutex_unlock(&mu);
  sigint_handled(t);
  return 0;
}

static void *watch_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  for (;;) {
    bool behind = atomic_load(&acked) < atomic_load(&gen);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, behind ? 20 : -1) > 0) {
      char buf[64];
      while (read(fd, buf, sizeof buf) > 0) {
      }
    }
    pthread_mutex_lock(&mu);
    if (stopping) {
      pthread_mutex_unlock(&mu);
      return NULL;
    }
    unsigned long long g = atomic_load(&gen);
    if (!scheduled && atomic_load(&acked) < g) {
      target = g;
      if (Py_AddPendingCall(ack_cb, NULL) == 0) scheduled = true; /* else: next turn */
    }
    pthread_mutex_unlock(&mu);
  }
}

static PyObject *at_exit(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
  pthread_mutex_lock(&mu);
  stopping = true;
  pthread_mutex_unlock(&mu);
  Py_RETURN_NONE;
}

static PyMethodDef at_exit_def = {"_tessera_sigint_atexit", at_exit, METH_NOARGS,
                                  "Stop tessera's SIGINT watcher (interpreter exit)."};

/* Stop using the watcher when the interpreter exits: atexit callbacks run before the
 * pending-call machinery is torn down. GIL held. */
static int register_at_exit(void) {
  PyObject *mod = PyImport_ImportModule("atexit");
  PyObject *fn = mod ? PyCFunction_New(&at_exit_def, NULL) : NULL;
  PyObject *r = fn ? PyObject_CallMethod(mod, "register", "O", fn) : NULL;
  Py_XDECREF(r);
  Py_XDECREF(fn);
  Py_XDECREF(mod);
  if (!r) return -1;
  at_exit_registered = true;
  return 0;
}

/* fork() while the watcher holds mu would leave it locked for good in the child. */
static void fork_prepare(void) {
  pthread_mutex_lock(&mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&mu);
}

static int start_watcher(void) {
  int p[2];
  if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) return -1;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&a, 64 * 1024);
  sigset_t all, old; /* no signal is ever delivered to the watcher */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t th;
  int e = pthread_create(&th, &a, watch_main, (void *)(intptr_t)p[0]);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&a);
  if (e != 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  read_fd = p[0];
  atomic_store(&wake_fd, p[1]);
  return 0;
}

/* This process's watcher and main thread: made once, and again in a forked child (which
 * has no watcher thread; its SIGINTs so far count as handled). GIL held. Returns whether
 * the watcher runs. */
static bool ensure_process(void) {
  pid_t pid = getpid();
  if (owner == pid) return true;
  pthread_mutex_lock(&mu);
  int old_w = atomic_exchange(&wake_fd, -1);
  if (old_w >= 0) close(old_w);
  if (read_fd >= 0) close(read_fd);
  read_fd = -1;
  scheduled = stopping = false;
  atomic_store(&acked, atomic_load(&gen));
  pthread_mutex_unlock(&mu);
  main_ident = 0;
  PyObject *th = PyImport_ImportModule("threading");
  PyObject *m = th ? PyObject_CallMethod(th, "main_thread", NULL) : NULL;
  PyObject *id = m ? PyObject_GetAttrString(m, "ident") : NULL;
  if (id) main_ident = PyLong_AsUnsignedLong(id);
  Py_XDECREF(id);
  Py_XDECREF(m);
  Py_XDECREF(th);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (!at_exit_registered) {
    if (register_at_exit() < 0) {
      PyErr_Clear();
      return false;
    }
    pthread_atfork(fork_prepare, fork_parent, fork_parent);
  }
  if (start_watcher() < 0) {
    PyErr_Clear();
    return false;
  }
  owner = pid;
  return true;
}

bool sigint_is_main_thread(void) {
  if (owner != getpid() && !ensure_process()) return true; /* then PyErr_CheckSignals */
  return PyThread_get_thread_ident() == main_ident;
}

static bool same_handler(const struct sigaction *a, const struct sigaction *b) {
  if ((a->sa_flags & SA_SIGINFO) != (b->sa_flags & SA_SIGINFO)) return false;
  return (a->sa_flags & SA_SIGINFO) ? a->sa_sigaction == b->sa_sigaction
                                    : a->sa_handler == b->sa_handler;
}

void sigint_arm(void) {
  if (!ensure_process()) return;
  struct sigaction cur;
  if (sigaction(SIGINT, NULL, &cur) < 0) return;
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigint) return;
  /* Ignored or default (the process dies): nothing to chain to, and no Python handler. A
   * one-shot handler is left alone too. */
  if (!(cur.sa_flags & SA_SIGINFO) && (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN))
    return;
  if (cur.sa_flags & SA_RESETHAND) return;
  /* Replaced since: by Python's own again (signal.signal with a Python handler), which is
   * chained to again; by anything else, which may chain to this handler in turn (a loop),
   * and is left alone. */
  if (have_first && !same_handler(&cur, &first)) return;
  if (!have_first) {
    first = cur;
    have_first = true;
  }
  int i = 1 - atomic_load(&chained_i);
  chained[i] = cur;
  atomic_store(&chained_i, i);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigint;
  sa.sa_mask = cur.sa_mask;
  sa.sa_flags = cur.sa_flags | SA_SIGINFO; /* Python's: SA_ONSTACK, and no SA_RESTART */
  sigaction(SIGINT, &sa, NULL);
}

uint64_t sigint_generation(void) {
  return atomic_load(&gen);
}

/* Whether Python's handler of SIGINT is signal.default_int_handler (the one that raises
 * KeyboardInterrupt): 1 or 0, -1 with an exception set. GIL held, any thread. */
static int default_handler(void) {
  PyObject *sig = PyImport_ImportModule("signal");
  if (!sig) return -1;
  PyObject *h = PyObject_CallMethod(sig, "getsignal", "i", SIGINT);
  PyObject *d = h ? PyObject_GetAttrString(sig, "default_int_handler") : NULL;
  int r = d ? h == d : -1;
  Py_XDECREF(d);
  Py_XDECREF(h);
  Py_DECREF(sig);
  return r;
}

void sigint_wait_start(sigint_wait_t *w) {
  memset(w, 0, sizeof *w);
  w->start_gen = atomic_load(&gen);
}

int sigint_pending(sigint_wait_t *w) {
  unsigned long long g = atomic_load(&gen);
  if (g == w->declined_gen) return 0;
  if (g <= w->start_gen) { /* nothing since the wait started: one from before it? */
    if (atomic_load(&acked) >= g) return 0;
    double age = mono_s() - (double)atomic_load(&last_ns) * 1e-9;
    if (age < SIGINT_GRACE_S) return 0;
  }
  int d = default_handler();
  if (d < 0) return -1;
  if (d == 0) {
    w->declined_gen = g; /* the user's handler decides, on the main thread */
    return 0;
  }
  return 1;
}

bool sigint_unhandled(void) {
  return atomic_load(&acked) < atomic_load(&gen);
}
