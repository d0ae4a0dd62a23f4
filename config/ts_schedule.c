#include "ts_schedule.h"

#include <math.h>

void ts_schedule_from_config(ts_schedule_t *s, const ts_config_t *cfg) {
  s->decay = cfg->decay;
  s->lr = (float)cfg->learning_rate;
  s->decay_steps = cfg->decay_steps > 0 ? (uint64_t)cfg->decay_steps : 1;
  s->decay_rate = cfg->decay_rate;
  s->staircase = cfg->staircase;
  s->decay_alpha = cfg->decay_alpha;
}

float ts_schedule_rate(const ts_schedule_t *s, uint64_t t) {
  double step = (double)(t ? t - 1 : 0), steps = (double)s->decay_steps;
  switch (s->decay) {
    case TS_DECAY_EXPONENTIAL: {
      double p = step / steps;
      if (s->staircase) p = floor(p);
      return (float)((double)s->lr * pow(s->decay_rate, p));
    }
    case TS_DECAY_COSINE: {
      double done = step < steps ? step / steps : 1.0;
      double cosine = 0.5 * (1.0 + cos(M_PI * done));
      return (float)((double)s->lr * ((1.0 - s->decay_alpha) * cosine + s->decay_alpha));
    }
    default:
      return s->lr;
  }
}
