#include "ts_optim.h"

#include <math.h>
#include <string.h>

#include "ts_schedule.h"

/* The two loops every pushed byte goes through (the finiteness check of each chunk as it
 * lands, then the update) in an AVX2 build beside the baseline SSE2 one, picked once at
 * load time from the CPU (GCC's target_clones: an ifunc). 32-byte vectors halve the
 * instructions of both loops; the operations and their order stay the same (no FMA: ISO C
 * mode keeps -ffp-contract=off), so the results are bit-identical on every CPU. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define TS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TS_VECTOR_CLONES
#endif

void ts_optim_from_config(ts_optim_t *o, const ts_config_t *cfg) {
  o->kind = cfg->optimizer;
  o->lr = (float)cfg->learning_rate;
  o->momentum = (float)cfg->momentum;
  o->beta1 = (float)cfg->beta1;
  o->beta2 = (float)cfg->beta2;
  o->epsilon = (float)cfg->epsilon;
  o->decay = cfg->decay;
  o->decay_steps = cfg->decay_steps > 0 ? (uint64_t)cfg->decay_steps : 1;
  o->decay_rate = cfg->decay_rate;
  o->decay_alpha = cfg->decay_alpha;
  o->staircase = cfg->staircase;
}

float ts_optim_rate(const ts_optim_t *o, uint64_t t) {
  const ts_schedule_t s = {.decay = o->decay, .lr = o->lr, .decay_steps = o->decay_steps,
                           .decay_rate = o->decay_rate, .staircase = o->staircase != 0,
                           .decay_alpha = o->decay_alpha};
  return ts_schedule_rate(&s, t);
}

int ts_optim_state_buffers(const ts_optim_t *o) {
  switch (o->kind) {
    case TS_OPT_MOMENTUM:
      return 1;
    case TS_OPT_ADAM:
      return 2;
    default:
      return 0;
  }
}

TS_VECTOR_CLONES int ts_optim_all_finite(const float *g, size_t n) {
  /* A float is NaN or inf exactly when its exponent bits are all ones. Testing the bits
   * (memcpy: no aliasing question) with an OR-reduction has no loop-carried float add, so it
   * vectorises and runs at memory speed; the earlier sum of g[i] * 0 was one dependent add
   * per value, 15% of a shard's time at 40 MiB pushes (bench/RESULTS.md). */
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &g[i], sizeof u);
    bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

TS_VECTOR_CLONES void ts_optim_apply(const ts_optim_t *o, float *restrict w,
                                     const float *restrict g, float scale, size_t n,
                                     float *restrict s0, float *restrict s1, uint64_t t) {
  const float lr = ts_optim_rate(o, t);
  switch (o->kind) {
    case TS_OPT_SGD: {
      const float a = lr * scale;
      for (size_t i = 0; i < n; i++) w[i] -= a * g[i];
      return;
    }
    case TS_OPT_MOMENTUM: {
      /* TensorFlow's MomentumOptimizer: v = m v + g; w -= lr v. */
      const float m = o->momentum;
      for (size_t i = 0; i < n; i++) {
        s0[i] = m * s0[i] + scale * g[i];
        w[i] -= lr * s0[i];
      }
      return;
    }
    case TS_OPT_ADAM: {
      const float b1 = o->beta1, b2 = o->beta2, eps = o->epsilon;
      const double tt = (double)(t ? t : 1);
      const float c1 = (float)(1.0 - pow((double)b1, tt));
      const float c2 = (float)(1.0 - pow((double)b2, tt));
      const float step = lr * sqrtf(c2) / c1;
      for (size_t i = 0; i < n; i++) {
        float gi = scale * g[i];
        s0[i] = b1 * s0[i] + (1.0f - b1) * gi;
        s1[i] = b2 * s1[i] + (1.0f - b2) * gi * gi;
        w[i] -= step * s0[i] / (sqrtf(s1[i]) + eps);
      }
      return;
    }
  }
}
