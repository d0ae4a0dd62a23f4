/* psctl --watch (psctl_watch.h). The escape sequences are ECMA-48's, which every terminal
 * psctl meets understands: CSI H (cursor home), CSI J (erase below), and DEC's
 * CSI ?25 l/h (hide/show the cursor). A frame is home, erase, then its lines, in one
 * write: a terminal shows the new frame whole, without old characters left behind where
 * a line got shorter. */
#include "psctl_watch.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#define HOME "\033[H"
#define ERASE_BELOW "\033[J"
#define HIDE_CURSOR "\033[?25l"
#define SHOW_CURSOR "\033[?25h"

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

void psctl_watch_begin(FILE *f, bool tty) {
  /* No SA_RESTART: the signal cuts the sleep short. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  /* A frame goes out in one write (up to this size) at psctl_watch_frame_end. */
  static char buf[1 << 16];
  setvbuf(f, buf, _IOFBF, sizeof buf);
  if (tty) fputs(HIDE_CURSOR, f);
}

void psctl_watch_frame_begin(FILE *f, bool tty, unsigned n, const char *title, double interval) {
  if (tty)
    fputs(HOME ERASE_BELOW, f);
  else if (n > 0)
    fputc('\n', f);
  if (!title) return;
  time_t now = time(NULL);
  struct tm tm;
  char when[32] = "";
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  fprintf(f, "Every %.1fs: %s  (Ctrl-C to stop)  %s\n\n", interval, title, when);
}

bool psctl_watch_frame_end(FILE *f) {
  return fflush(f) == 0 && !ferror(f);
}

bool psctl_watch_sleep(double seconds) {
  struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (!stop_signal && nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
  return !stop_signal;
}

bool psctl_watch_stopped(void) { return stop_signal != 0; }

void psctl_watch_end(FILE *f, bool tty) {
  if (tty) fputs(SHOW_CURSOR, f);
  fflush(f);
}
