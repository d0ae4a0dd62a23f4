/*
 * What the files of the CPU back end share: the window kernels of ts_kernels_cpu_conv.c,
 * and the fused bias + ReLU kernels of ts_kernels_cpu_fused.c, which the table in
 * ts_kernels_cpu.c points to, and the direct convolution of ts_kernels_cpu_direct.c the
 * window kernels hand few-channel inputs to. Nobody else includes this header.
 */
#ifndef TS_KERNELS_CPU_INT_H
#define TS_KERNELS_CPU_INT_H

#include "ts_kernels.h"

/* Vector width. The build targets the baseline of the architecture (x86-64: SSE2). On x86-64
 * with GCC or Clang the hot loops are compiled three times, for AVX-512, for AVX2 + FMA and
 * for the baseline, and ts_cpu_isa() picks one when they run: a loop is written once, as a
 * plain C body the compiler vectorises (TS_CPU_BODY), and TS_CPU_DISPATCH makes the three
 * copies and the function that chooses. Elsewhere only the baseline copy exists. The C
 * bodies are built in ISO C mode, where GCC does not contract a * b + c (-ffp-contract=off):
 * their AVX2 and AVX-512 copies use wider vectors but a multiply and an add, not FMA (Clang
 * contracts by default and does use it); the hand-written AVX-512 loops (intrinsics) use FMA
 * with either compiler. */
typedef enum { TS_CPU_ISA_BASE = 0, TS_CPU_ISA_AVX2 = 1, TS_CPU_ISA_AVX512 = 2 } ts_cpu_isa_t;

/* The widest set this CPU supports (and this build compiled), lowered by ts_cpu_isa_limit. */
ts_cpu_isa_t ts_cpu_isa(void);
/* Caps ts_cpu_isa() at `max` from now on (tests run every copy); returns the cap before. */
ts_cpu_isa_t ts_cpu_isa_limit(ts_cpu_isa_t max);

#define TS_CPU_BODY static inline __attribute__((always_inline))

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TS_CPU_MULTI_ISA 1
#define TS_CPU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define TS_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
/* static void name params, running avx512 args, or name##_body args (a void TS_CPU_BODY) in
 * its AVX2 or baseline copy, by what the CPU has: for a loop whose AVX-512 form is written by
 * hand (intrinsics). */
#define TS_CPU_DISPATCH_OWN_AVX512(name, avx512, params, args) \
  TS_CPU_TARGET_AVX2 static void name##_avx2 params {          \
    name##_body args;                                          \
  }                                                            \
  static void name##_base params {                             \
    name##_body args;                                          \
  }                                                            \
  static void name params {                                    \
    switch (ts_cpu_isa()) {                                    \
      case TS_CPU_ISA_AVX512:                                  \
        avx512 args;                                           \
        break;                                                 \
      case TS_CPU_ISA_AVX2:                                    \
        name##_avx2 args;                                      \
        break;                                                 \
      default:                                                 \
        name##_base args;                                      \
        break;                                                 \
    }                                                          \
  }
/* The same with the AVX-512 copy compiled from the body too. */
#define TS_CPU_DISPATCH(name, params, args)               \
  TS_CPU_TARGET_AVX512 static void name##_avx512 params { \
    name##_body args;                                     \
  }                                                       \
  TS_CPU_DISPATCH_OWN_AVX512(name, name##_avx512, params, args)
#else
#define TS_CPU_DISPATCH(name, params, args) \
  static void name params {                 \
    name##_body args;                       \
  }
#define TS_CPU_DISPATCH_OWN_AVX512(name, avx512, params, args) \
  static void name params {                                    \
    name##_body args;                                          \
  }
#endif

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
/* The direct convolution (ts_kernels_cpu_direct.c): fits when g has stride 1, at most 4 input
 * channels, a window larger than 1x1 and ws_bytes holds its scratch; the three kernels then
 * take the whole batch (arguments already checked) and use ws as scratch. */
bool ts_cpu_direct_fits(const ts_conv2d_t *g, size_t ws_bytes);
void ts_cpu_direct_fwd(const ts_conv2d_t *g, const float *x, const float *w, float *y, float *ws);
void ts_cpu_direct_bwd_filter(const ts_conv2d_t *g, const float *x, const float *dy, float *dw,
                              float *ws);
void ts_cpu_direct_bwd_data(const ts_conv2d_t *g, const float *w, const float *dy, float *dx,
                            float *ws);
/* The fused bias + ReLU kernels (ts_kernels_cpu_fused.c). */
int ts_cpu_bias_relu(const ts_kernels_t *k, size_t rows, size_t cols, const float *bias, float *y);
int ts_cpu_relu_bwd_bias_grad(const ts_kernels_t *k, size_t rows, size_t cols, const float *y,
                              const float *dy, float *dx, float *db);
int ts_cpu_mul(const ts_kernels_t *k, size_t n, const float *a, const float *b, float *y);

#endif
