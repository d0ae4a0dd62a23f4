#include "ts_progress_line.h"

#include <stdio.h>

#include "ts_alloc.h"
#include "ts_log.h"

#define REDRAW_S 0.1  /* at most ten drawings a second */
#define RATE_S 2.0    /* steps per second over about the last two seconds */
#define LOSS_EMA 0.05 /* the loss shown: a moving average over about 20 steps */

struct ts_progress_line {
  int task, batch;
  double drawn_s;           /* training time of the last drawing (-1: none yet) */
  double ref_s;             /* start of the rate's window */
  uint64_t ref_step;
  uint64_t first_step;      /* the step this worker started from */
  bool started;
  double steps_per_s;       /* over the last window (0 until one is complete) */
  double loss;              /* smoothed */
  bool have_loss;
};

ts_progress_line_t *ts_progress_line_new(int task, int batch) {
  if (!ts_log_status_available()) return NULL;
  ts_progress_line_t *pl = ts_calloc(1, sizeof *pl);
  if (!pl) return NULL;
  pl->task = task;
  pl->batch = batch;
  pl->drawn_s = -1.0;
  return pl;
}

/* "1h02m", "3m05s", "12s". */
static void duration(char *buf, size_t n, double s) {
  if (s < 0) s = 0;
  unsigned long t = (unsigned long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%luh%02lum", t / 3600, t / 60 % 60);
  else if (t >= 60)
    snprintf(buf, n, "%lum%02lus", t / 60, t % 60);
  else
    snprintf(buf, n, "%lus", t);
}

void ts_progress_line_step(ts_progress_line_t *pl, const ts_progress_t *p) {
  if (!pl) return;
  double loss = p->loss;
  pl->loss = pl->have_loss ? pl->loss + LOSS_EMA * (loss - pl->loss) : loss;
  pl->have_loss = true;
  if (!pl->started) { /* the window starts where this worker did: a worker joining a
                        * running job at step 936 has made 1 step, not 937 */
    pl->started = true;
    pl->first_step = pl->ref_step = p->first_step;
  }
  if (p->seconds - pl->ref_s >= RATE_S) {
    pl->steps_per_s = (double)(p->step - pl->ref_step) / (p->seconds - pl->ref_s);
    pl->ref_s = p->seconds;
    pl->ref_step = p->step;
  }
  if (pl->drawn_s >= 0 && p->seconds - pl->drawn_s < REDRAW_S && p->step < p->total_steps)
    return;
  pl->drawn_s = p->seconds;
  /* Until the first window closes, the rate since the start. */
  double rate = pl->steps_per_s > 0 ? pl->steps_per_s
                : p->seconds > 0    ? (double)(p->step - pl->first_step) / p->seconds
                                    : 0.0;
  char eta[32] = "?";
  if (rate > 0) duration(eta, sizeof eta, (double)(p->total_steps - p->step) / rate);
  char bar[21];
  int fill = (int)(p->epoch_progress * 20.0 + 0.5);
  for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
  bar[20] = 0;
  char line[256];
  snprintf(line, sizeof line,
           "worker %d  step %llu/%llu %3.0f%%  epoch %llu [%s] %3.0f%%  %.0f examples/s  "
           "loss %.4f  ETA %s",
           pl->task, (unsigned long long)p->step, (unsigned long long)p->total_steps,
           p->total_steps ? 100.0 * (double)p->step / (double)p->total_steps : 100.0,
           (unsigned long long)p->epoch + 1, bar, p->epoch_progress * 100.0,
           rate * (double)pl->batch, pl->loss, eta);
  ts_log_status(line);
}

void ts_progress_line_free(ts_progress_line_t *pl) {
  if (!pl) return;
  ts_log_status(NULL);
  ts_free(pl);
}
