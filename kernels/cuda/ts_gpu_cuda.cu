// GPU discovery through the CUDA runtime (kernels/ts_gpu.h).
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "ts_err.h"
#include "ts_gpu.h"
}

extern "C" int ts_gpu_count(char *why, size_t whylen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why)
      snprintf(why, whylen, "no usable CUDA device (cudaGetDeviceCount: %s, error %d)",
               cudaGetErrorString(e), (int)e);
    cudaGetLastError(); /* clear the sticky error so later calls start clean */
    return 0;
  }
  if (n == 0 && why) snprintf(why, whylen, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
  return n;
}

extern "C" int ts_gpu_info(int i, ts_gpu_info_t *out) {
  memset(out, 0, sizeof *out);
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return TS_EDEVICE;
  out->index = i;
  snprintf(out->name, sizeof out->name, "%.127s", p.name);
  if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, i) != cudaSuccess)
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "?");
  // nvidia-smi's form of the 16 bytes, 8-4-4-4-12 lowercase hex digits, without its "GPU-" (or,
  // for a MIG instance, "MIG-") prefix: cudaDeviceProp does not say which the device is.
  const unsigned char *u = reinterpret_cast<const unsigned char *>(p.uuid.bytes);
  size_t at = 0;
  for (int b = 0; b < 16; b++) {
    if (b == 4 || b == 6 || b == 8 || b == 10) out->uuid[at++] = '-';
    at += (size_t)snprintf(out->uuid + at, sizeof out->uuid - at, "%02x", u[b]);
  }
  out->total_bytes = p.totalGlobalMem;
  out->major = p.major;
  out->minor = p.minor;
  return 0;
}

extern "C" int ts_gpu_memory(int i, size_t *free_bytes, size_t *total_bytes) {
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  size_t fr = 0, tot = 0;
  cudaError_t e = cudaSetDevice(i);
  if (e == cudaSuccess) e = cudaMemGetInfo(&fr, &tot);
  if (prev >= 0) cudaSetDevice(prev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return TS_EDEVICE;
  }
  if (free_bytes) *free_bytes = fr;
  if (total_bytes) *total_bytes = tot;
  return 0;
}
