/* GPU discovery in a build without the CUDA back end: there are no GPUs to use. */
#include <stdio.h>
#include <string.h>

#include "ts_err.h"
#include "ts_gpu.h"

int ts_gpu_count(char *why, size_t whylen) {
  if (why)
    snprintf(why, whylen, "this build has no CUDA back end (nvcc was not found, or -Dcuda=disabled)");
  return 0;
}

int ts_gpu_info(int i, ts_gpu_info_t *out) {
  (void)i;
  memset(out, 0, sizeof *out);
  return TS_EDEVICE;
}
