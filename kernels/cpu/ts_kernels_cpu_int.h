/*
 * What the files of the CPU back end share: the window kernels of ts_kernels_cpu_conv.c,
 * which the table in ts_kernels_cpu.c points to. Nobody else includes this header.
 */
#ifndef TS_KERNELS_CPU_INT_H
#define TS_KERNELS_CPU_INT_H

#include "ts_kernels.h"

size_t ts_cpu_conv2d_workspace(const ts_kernels_t *k, const ts_conv2d_t *g);
int ts_cpu_conv2d_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *w,
                      float *y, void *ws, size_t ws_bytes);
int ts_cpu_conv2d_bwd_data(const ts_kernels_t *k, const ts_conv2d_t *g, const float *w,
                           const float *dy, float *dx, void *ws, size_t ws_bytes);
int ts_cpu_conv2d_bwd_filter(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x,
                             const float *dy, float *dw, void *ws, size_t ws_bytes);
int ts_cpu_maxpool_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, float *y,
                       int32_t *argmax);
int ts_cpu_maxpool_bwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *y,
                       const float *dy, const int32_t *argmax, float *dx);
int ts_cpu_mul(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y);

#endif
