/*
 * GPU discovery (DESIGN.md §5, §6). Plain C: no CUDA types cross this header.
 *
 * GPUs are the devices the CUDA runtime reports, so CUDA_VISIBLE_DEVICES decides what a
 * worker sees and /gpu:N is the N-th visible one. On a machine without a GPU or a driver the
 * runtime answers cudaGetDeviceCount with an error (35, insufficient driver; 100, no
 * device): that is zero GPUs, not a failure. A build without the CUDA back end always
 * reports zero GPUs and says why.
 */
#ifndef TS_GPU_H
#define TS_GPU_H

#include <stddef.h>

typedef struct {
  int index;               /* N of /gpu:N */
  char name[128];          /* "NVIDIA H200" */
  char pci_bus_id[32];     /* "0000:19:00.0" */
  size_t total_bytes;      /* device memory */
  int major, minor;        /* compute capability */
} ts_gpu_info_t;

/* The number of visible GPUs (0 or more). When 0, why (may be NULL) gets the reason, such
 * as "no CUDA driver (cudaGetDeviceCount: CUDA driver version is insufficient ...)". */
int ts_gpu_count(char *why, size_t whylen);

/* Details of visible GPU i. Returns 0 or TS_EDEVICE. */
int ts_gpu_info(int i, ts_gpu_info_t *out);

#endif
