/* GPU discovery and the CUDA back end's entry points in a build without CUDA: there are no
 * GPUs to use, and every attempt says so. */
#include <stdio.h>
#include <string.h>

#include "ts_err.h"
#include "ts_gpu.h"
#include "ts_kernels_cuda.h"

#define NO_CUDA "this build has no CUDA back end (nvcc was not found, or -Dcuda=disabled)"

int ts_gpu_count(char *why, size_t whylen) {
  if (why) snprintf(why, whylen, "%s", NO_CUDA);
  return 0;
}

int ts_gpu_info(int i, ts_gpu_info_t *out) {
  (void)i;
  memset(out, 0, sizeof *out);
  return TS_EDEVICE;
}

int ts_gpu_memory(int i, size_t *free_bytes, size_t *total_bytes) {
  (void)i;
  if (free_bytes) *free_bytes = 0;
  if (total_bytes) *total_bytes = 0;
  return TS_EDEVICE;
}

bool ts_kernels_cuda_built(void) {
  return false;
}

bool ts_kernels_cuda_have_cudnn(void) {
  return false;
}

bool ts_kernels_cuda_have_nccl(void) {
  return false;
}

const ts_kernels_t *ts_kernels_cuda_ops(void) {
  return NULL;
}

int ts_kernels_cuda_create(int device, const ts_kernels_cuda_opts_t *opts, ts_kernels_t **out,
                           char *errmsg, size_t errlen) {
  (void)device;
  (void)opts;
  if (out) *out = NULL;
  if (errmsg) snprintf(errmsg, errlen, "%s", NO_CUDA);
  return TS_EDEVICE;
}

void ts_kernels_cuda_destroy(ts_kernels_t *k) {
  (void)k;
}

int ts_kernels_cuda_memory(const ts_kernels_t *k, ts_pool_stats_t *stats,
                           ts_gpu_memory_plan_t *plan) {
  (void)k;
  (void)stats;
  (void)plan;
  return TS_EINVAL;
}

int ts_kernels_cuda_nccl_create(ts_kernels_t *const *towers, size_t n,
                                ts_kernels_cuda_nccl_t **out, char *errmsg, size_t errlen) {
  (void)towers;
  (void)n;
  if (out) *out = NULL;
  if (errmsg) snprintf(errmsg, errlen, "%s", NO_CUDA);
  return TS_EDEVICE;
}

int ts_kernels_cuda_nccl_mean(ts_kernels_cuda_nccl_t *c, float *const *bufs, size_t count,
                              char *errmsg, size_t errlen) {
  (void)c;
  (void)bufs;
  (void)count;
  if (errmsg) snprintf(errmsg, errlen, "%s", NO_CUDA);
  return TS_EDEVICE;
}

void ts_kernels_cuda_nccl_destroy(ts_kernels_cuda_nccl_t *c) {
  (void)c;
}
