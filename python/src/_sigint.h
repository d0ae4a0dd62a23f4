/*
 * tessera._client: Ctrl-C (SIGINT) seen from any thread, for the waits of _request.c.
 *
 * Python runs signal handlers on the main thread only, and only between bytecodes: a wait
 * on another thread (the thread TensorFlow runs a tf.numpy_function on, while the main
 * thread sits in TensorFlow's C++ step waiting for it) can neither run the handler
 * (PyErr_CheckSignals does nothing there) nor learn that a SIGINT arrived. So:
 *
 *  - A C-level SIGINT handler, installed over the one in place (Python's) and chaining to
 *    it first, counts the signals (the generation) and wakes a watcher thread through a
 *    pipe; all of it async-signal-safe (atomics, clock_gettime() and write()). It is
 *    installed at a wait, only over a handler function (never over SIG_IGN or SIG_DFL:
 *    then Python has no handler to run either), and again at a later wait when
 *    signal.signal() put Python's own C handler back; a handler other code installed over
 *    it is left alone (it may chain to this one: installing over it would make a loop).
 *  - sigint_pending(), called by a wait on a thread other than the main thread between
 *    two slices, says to abandon the wait with KeyboardInterrupt when a SIGINT arrived
 *    since the wait started, or arrived before it and the main thread has not run Python
 *    since (below), and Python's handler of SIGINT is signal.default_int_handler. With
 *    the default handler Ctrl-C so stops every wait of the process, on every thread (the
 *    main thread's own waits run the handler with PyErr_CheckSignals, as before). A
 *    handler of the user's own is respected: waits on other threads go on, and the
 *    handler runs on the main thread when Python gets to run it.
 *  - "The main thread has not run Python since": the watcher thread (no GIL, no Python
 *    objects) schedules a pending call (Py_AddPendingCall) after each SIGINT. It runs on
 *    the main thread, after Python's signal handlers, when that thread next takes the GIL
 *    or is asked to hand it over (which a thread running Python is within the 5 ms switch
 *    interval once another thread, such as a waiting one, wants the GIL), and marks the
 *    generation acknowledged. A SIGINT that came before a wait (while its thread
 *    computed) and is not acknowledged SIGINT_GRACE_S after it came is one the main thread is
 *    not handling: it waits in C, as in a TensorFlow step, quite likely for this very
 *    thread.
 *
 * Python's pending SIGINT is left as it is: once the thread that TensorFlow (or the
 * caller) waits for returns, the main thread runs Python's handler, and the user sees the
 * KeyboardInterrupt there.
 */
#ifndef TESSERA_PY_SIGINT_H
#define TESSERA_PY_SIGINT_H

#include <stdbool.h>
#include <stdint.h>

/* How long a wait sleeps between two looks at signals (seconds). */
#define SIGINT_SLICE_S 0.05
/* How long after it came a SIGINT from before a wait may stay unacknowledged by the main
 * thread before the wait takes it as its own (seconds): a main thread that runs Python runs
 * the pending call well within this (the GIL's switch interval is 5 ms). */
#define SIGINT_GRACE_S 0.1

/* The state one wait keeps between its calls to sigint_pending (sigint_wait_start). */
typedef struct {
  uint64_t start_gen;    /* the generation when the wait started */
  uint64_t declined_gen; /* a generation this wait decided to leave to the user's handler */
} sigint_wait_t;

/* Install the chained handler (and start the watcher) if it is not in place and the
 * current handler is a function. Idempotent and cheap (one sigaction() call); GIL held. */
void sigint_arm(void);
/* Whether the calling thread is the main thread of the interpreter. GIL held. */
bool sigint_is_main_thread(void);
/* The number of SIGINTs seen so far by the chained handler. Any thread. */
uint64_t sigint_generation(void);
/* The main thread has run the signal handlers of every SIGINT up to generation gen (it
 * called PyErr_CheckSignals after reading gen). GIL held, main thread. */
void sigint_handled(uint64_t gen);
/* Whether a SIGINT arrived that the main thread has not handled yet (for at most a few
 * milliseconds after a signal when it runs Python; until it does when it waits in C). */
bool sigint_unhandled(void);
/* A wait starts (it is about to sleep; after sigint_arm). GIL held. */
void sigint_wait_start(sigint_wait_t *w);
/* For a wait on a thread other than the main thread: 1 when it is to be abandoned with
 * KeyboardInterrupt (see above), 0 to go on waiting, -1 with an exception set (the
 * signal module could not be asked for its handler). GIL held. */
int sigint_pending(sigint_wait_t *w);

#endif
