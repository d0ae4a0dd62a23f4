/* The GPU memory policy as arithmetic (kernels/ts_gpu.h): plain C, built in every build so
 * it is unit-tested on machines without a GPU. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_pool.h"

/* TensorFlow's default without allow_growth takes nearly the whole GPU; leave a tenth of the
 * free memory for the CUDA context, cuBLAS and other processes. */
#define TAKE_ALL_SHARE 0.9

int ts_gpu_memory_plan(int device, size_t total, size_t free_bytes,
                       const ts_gpu_memory_policy_t *policy, ts_gpu_memory_plan_t *out,
                       char *errmsg, size_t errlen) {
  char scratch[8];
  if (!errmsg) {
    errmsg = scratch;
    errlen = sizeof scratch;
  }
  if (!out || !policy) return TS_EINVAL;
  memset(out, 0, sizeof *out);
  double f = policy->memory_fraction;
  if (!(f >= 0.0 && f <= 1.0)) {
    ts_errmsg_printf(errmsg, errlen, "device.memory_fraction = %g: must be within [0, 1]", f);
    return TS_EINVAL;
  }
  char tot[32], fr[32], want[32];
  ts_pool_format_bytes(total, tot, sizeof tot);
  ts_pool_format_bytes(free_bytes, fr, sizeof fr);
  if (f > 0.0) {
    size_t r = (size_t)floor(f * (double)total);
    r = r / TS_GPU_MEMORY_GRANULE * TS_GPU_MEMORY_GRANULE;
    if (r < TS_GPU_MEMORY_GRANULE) r = TS_GPU_MEMORY_GRANULE;
    ts_pool_format_bytes(r, want, sizeof want);
    out->limit = r;
    out->usable = r;
    if (policy->allow_growth) {
      /* TensorFlow's allow_growth under per_process_gpu_memory_fraction: the fraction is the
       * most the allocator may grow to, and nothing is taken before it is needed. */
      out->grow = true;
      snprintf(out->summary, sizeof out->summary,
               "growing on demand up to %s (%zu bytes): device.allow_growth = true, "
               "device.memory_fraction = %g of %s (%s free)",
               want, r, f, tot, fr);
      snprintf(out->limit_reason, sizeof out->limit_reason,
               "device.memory_fraction = %g with device.allow_growth = true", f);
      return 0;
    }
    if (r > free_bytes) {
      memset(out, 0, sizeof *out);
      ts_errmsg_printf(errmsg, errlen,
                       "GPU %d: device.memory_fraction = %g asks for %s of its %s, but only %s "
                       "are free (other processes hold the rest)",
                       device, f, want, tot, fr);
      return TS_ENOMEM;
    }
    out->reserve = r;
    out->grow = false;
    snprintf(out->summary, sizeof out->summary,
             "reserving %s (%zu bytes) up front: device.memory_fraction = %g of %s", want, r, f,
             tot);
    snprintf(out->limit_reason, sizeof out->limit_reason, "device.memory_fraction = %g", f);
    return 0;
  }
  if (policy->allow_growth) {
    out->grow = true;
    out->usable = free_bytes;
    snprintf(out->summary, sizeof out->summary,
             "growing on demand (device.allow_growth = true; %s of %s free)", fr, tot);
    return 0;
  }
  size_t r = (size_t)floor(TAKE_ALL_SHARE * (double)free_bytes);
  r = r / TS_GPU_MEMORY_GRANULE * TS_GPU_MEMORY_GRANULE;
  if (r < TS_GPU_MEMORY_GRANULE) {
    ts_errmsg_printf(errmsg, errlen,
                     "GPU %d: device.allow_growth = false reserves 90%% of the free memory, but "
                     "only %s of %s are free",
                     device, fr, tot);
    return TS_ENOMEM;
  }
  ts_pool_format_bytes(r, want, sizeof want);
  out->reserve = r;
  out->limit = r;
  out->usable = r;
  snprintf(out->summary, sizeof out->summary,
           "reserving %s (%zu bytes) up front: device.allow_growth = false takes 90%% of the "
           "%s free",
           want, r, fr);
  snprintf(out->limit_reason, sizeof out->limit_reason,
           "device.allow_growth = false (90%% of the free memory)");
  return 0;
}
