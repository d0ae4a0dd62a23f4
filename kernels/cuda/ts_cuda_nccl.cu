// Averaging tower gradients across GPUs with NCCL (kernels/ts_kernels_cuda.h). Built with
// TS_HAVE_NCCL = 1 when meson finds NCCL; otherwise create says so and the worker averages
// through pinned host memory.
#include <stdio.h>
#include <string.h>

#include "ts_build_config.h"
#include "ts_cuda.h"

extern "C" {
#include "ts_alloc.h"
}

#if TS_HAVE_NCCL
#include <nccl.h>

struct ts_kernels_cuda_nccl {
  size_t n;
  ncclComm_t *comms;
  ts_cuda_ctx **ctx;
};

extern "C" bool ts_kernels_cuda_have_nccl(void) {
  return true;
}

extern "C" int ts_kernels_cuda_nccl_create(ts_kernels_t *const *towers, size_t n,
                                           ts_kernels_cuda_nccl_t **out, char *errmsg,
                                           size_t errlen) {
  if (!out) return TS_EINVAL;
  *out = nullptr;
  if (!towers || n < 2 || n > 64) {
    ts_errmsg_printf(errmsg, errlen, "NCCL: 2 to 64 towers, not %zu", n);
    return TS_EINVAL;
  }
  int devs[64];
  for (size_t i = 0; i < n; i++) {
    ts_cuda_ctx *c = ts_cuda_ctx_of(towers[i]);
    if (!c || towers[i]->alloc != ts_kernels_cuda_ops()->alloc) {
      ts_errmsg_printf(errmsg, errlen, "NCCL: tower %zu is not on a GPU", i);
      return TS_EINVAL;
    }
    devs[i] = c->device;
    for (size_t j = 0; j < i; j++)
      if (devs[j] == devs[i]) {
        ts_errmsg_printf(errmsg, errlen, "NCCL: towers %zu and %zu share GPU %d (one rank per GPU)",
                         j, i, devs[i]);
        return TS_EDEVICE;
      }
  }
  ts_kernels_cuda_nccl_t *c =
      static_cast<ts_kernels_cuda_nccl_t *>(ts_calloc(1, sizeof(ts_kernels_cuda_nccl_t)));
  if (c) {
    c->comms = static_cast<ncclComm_t *>(ts_calloc(n, sizeof(ncclComm_t)));
    c->ctx = static_cast<ts_cuda_ctx **>(ts_calloc(n, sizeof(ts_cuda_ctx *)));
  }
  if (!c || !c->comms || !c->ctx) {
    if (c) {
      ts_free(c->comms);
      ts_free(c->ctx);
    }
    ts_free(c);
    ts_errmsg_printf(errmsg, errlen, "NCCL: out of host memory");
    return TS_ENOMEM;
  }
  c->n = n;
  for (size_t i = 0; i < n; i++) c->ctx[i] = ts_cuda_ctx_of(towers[i]);
  ncclResult_t r = ncclCommInitAll(c->comms, (int)n, devs);
  if (r != ncclSuccess) {
    ts_errmsg_printf(errmsg, errlen, "NCCL: ncclCommInitAll over %zu GPUs: %s", n,
                     ncclGetErrorString(r));
    ts_free(c->comms);
    ts_free(c->ctx);
    ts_free(c);
    return TS_EDEVICE;
  }
  *out = c;
  return 0;
}

extern "C" int ts_kernels_cuda_nccl_mean(ts_kernels_cuda_nccl_t *c, float *const *bufs,
                                         size_t count, char *errmsg, size_t errlen) {
  if (!c || !bufs) return TS_EINVAL;
  if (count == 0) return 0;
  // Each rank's reduce is queued on its tower's stream, after that tower's backward pass.
  ncclResult_t r = ncclGroupStart();
  for (size_t i = 0; i < c->n && r == ncclSuccess; i++)
    r = ncclReduce(bufs[i], bufs[i], count, ncclFloat, ncclAvg, 0, c->comms[i], c->ctx[i]->stream);
  ncclResult_t r2 = ncclGroupEnd();
  if (r == ncclSuccess) r = r2;
  if (r != ncclSuccess) {
    ts_errmsg_printf(errmsg, errlen, "NCCL: ncclReduce of %zu floats: %s", count,
                     ncclGetErrorString(r));
    return TS_EDEVICE;
  }
  for (size_t i = 0; i < c->n; i++) {
    cudaError_t e = cudaSetDevice(c->ctx[i]->device);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->ctx[i]->stream);
    if (e != cudaSuccess) {
      ts_errmsg_printf(errmsg, errlen, "NCCL: GPU %d: cudaStreamSynchronize: %s", c->ctx[i]->device,
                       cudaGetErrorString(e));
      return TS_EDEVICE;
    }
  }
  return 0;
}

extern "C" void ts_kernels_cuda_nccl_destroy(ts_kernels_cuda_nccl_t *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) ncclCommDestroy(c->comms[i]);
  ts_free(c->comms);
  ts_free(c->ctx);
  ts_free(c);
}

#else  // no NCCL in this build

extern "C" bool ts_kernels_cuda_have_nccl(void) {
  return false;
}

extern "C" int ts_kernels_cuda_nccl_create(ts_kernels_t *const *towers, size_t n,
                                           ts_kernels_cuda_nccl_t **out, char *errmsg,
                                           size_t errlen) {
  (void)towers;
  (void)n;
  if (out) *out = nullptr;
  ts_errmsg_printf(errmsg, errlen, "this build has no NCCL (nccl.h or libnccl not found)");
  return TS_EDEVICE;
}

extern "C" int ts_kernels_cuda_nccl_mean(ts_kernels_cuda_nccl_t *c, float *const *bufs,
                                         size_t count, char *errmsg, size_t errlen) {
  (void)c;
  (void)bufs;
  (void)count;
  ts_errmsg_printf(errmsg, errlen, "this build has no NCCL");
  return TS_EDEVICE;
}

extern "C" void ts_kernels_cuda_nccl_destroy(ts_kernels_cuda_nccl_t *c) {
  (void)c;
}

#endif
