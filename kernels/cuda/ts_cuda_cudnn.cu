// Convolution and max pooling of the CUDA back end with cuDNN (docs/dev/ARCHITECTURE.md,
// "Convolution on the GPU"). Built only where meson finds cuDNN (TS_HAVE_CUDNN); without it
// the table's conv2d_* and maxpool_* stay NULL and placement keeps those layers off the GPU.
//
// Layouts. Activations are NHWC, which cuDNN takes as they are (CUDNN_TENSOR_NHWC). Kernels
// are HWIO (TensorFlow's), which is no cuDNN filter layout (KCRS or KRSC): read as a
// (win_h * win_w * in_c) x out_c row-major matrix, HWIO transposes exactly into KRSC
// (out_c x win_h x win_w x in_c), cuDNN's NHWC filter layout. So conv2d_fwd and bwd_data first
// transpose w into the workspace, and bwd_filter computes dw in KRSC there and transposes it
// back into HWIO. A transpose only moves floats: no rounding.
//
// Padding. TensorFlow's 'same' splits an odd total padding with the extra row (column) after;
// cuDNN pads symmetrically. An even total is cuDNN's own padding (pad_top = pad_bottom). An
// odd total in either direction copies x into the workspace with its whole padding written
// as zeros (in_h + total_h x in_w + total_w) and lets cuDNN pad nothing; bwd_data computes
// the padded dx there and crops it. That is exact for every stride (computing with the larger
// symmetric pad and cropping the output is exact only for stride 1). Max pooling always pads
// explicitly, with -infinity, so a padded position never wins, as on the CPU (which skips
// padding), whatever cuDNN's own padding does; every window holds an input element.
//
// Algorithms. Chosen once per geometry (batch included) by cuDNN's heuristics
// (cudnnGet*Algorithm_v7), deterministic ones first, and kept in a small cache per table
// with the descriptors. Without device.allow_tf32 the convolution's math type is
// CUDNN_FMA_MATH, so no TF32 tensor cores: the results match the CPU to float rounding.
//
// Workspace. conv2d_workspace asks the pool: cuDNN's own workspace for a geometry is bounded
// by half of what the memory policy still allows (the limit less what is in use; without a
// limit, what the GPU has free plus the pool's free blocks) and by kWorkspaceCap; each of
// the three directions takes the best algorithm whose workspace fits, else the next that
// does. The caller allocates the total with k->alloc, so device.memory_fraction counts it.
// Pooling's padded copies come from a scratch buffer of the table, also from the pool.
#include <cudnn.h>
#include <stdio.h>
#include <string.h>

#include <climits>
#include <cmath>

#include "ts_cuda.h"

extern "C" {
#include "ts_alloc.h"
}

namespace {

constexpr int kPlans = 32;                           // geometries cached per table
constexpr size_t kWorkspaceCap = (size_t)512 << 20;  // cuDNN's workspace, per geometry
constexpr size_t kAlign = TS_POOL_ALIGN;
constexpr int kThreads = 256;

// One geometry's descriptors and algorithms.
struct conv_plan {
  bool used;
  unsigned long long last_use;
  ts_conv2d_t g;
  bool explicit_pad;  // odd total padding: x copied padded into the workspace
  size_t ph, pw;      // the height and width cuDNN sees (padded when explicit_pad)
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t fwd_ws, bwd_data_ws, bwd_filter_ws;  // cuDNN's workspace of each
  size_t filter_bytes, pad_bytes;             // our scratch ahead of it (aligned)
  size_t total;                               // what the three kernels need in all
};

}  // namespace

struct ts_cudnn_state {
  cudnnHandle_t h;
  conv_plan plans[kPlans];
  unsigned long long clock;
  void *scratch;  // pooling's padded x and dx, from the pool
  size_t scratch_bytes;
};

namespace {

size_t align_up(size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

int cudnn_fail(ts_cuda_ctx *ctx, cudnnStatus_t s, const char *call, const char *file, int line) {
  snprintf(ctx->errmsg, sizeof ctx->errmsg, "GPU %d: %s: %s at %s:%d", ctx->device, call,
           cudnnGetErrorString(s), file, line);
  return s == CUDNN_STATUS_ALLOC_FAILED ? TS_ENOMEM : TS_EDEVICE;
}

#define TS_CUDNN_CHECK(call)                                                                     \
  do {                                                                                           \
    cudnnStatus_t ts_s_ = (call);                                                                \
    if (ts_s_ != CUDNN_STATUS_SUCCESS) return cudnn_fail(ctx, ts_s_, #call, __FILE__, __LINE__); \
  } while (0)

// Entry of a pooling kernel: the context (TS_EINVAL for the placement-only table), its GPU.
#define TS_CUDA_ENTER_CTX(k)            \
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k); \
  if (!ctx) return TS_EINVAL;           \
  TS_CUDA_CHECK(cudaSetDevice(ctx->device))

int fail_msg(ts_cuda_ctx *ctx, int rc, const char *what) {
  snprintf(ctx->errmsg, sizeof ctx->errmsg, "GPU %d: %s", ctx->device, what);
  return rc;
}

// --- layout kernels ------------------------------------------------------------------------

__device__ __forceinline__ size_t global_index() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() {
  return (size_t)gridDim.x * blockDim.x;
}

int blocks_for(const ts_cuda_ctx *ctx, size_t n) {
  size_t b = (n + kThreads - 1) / kThreads, cap = (size_t)ctx->sm_count * 8;
  if (b < 1) b = 1;
  return (int)(b > cap ? cap : b);
}

// dst (cols x rows) = src (rows x cols)^T, both row-major.
__global__ void transpose_k(size_t rows, size_t cols, const float *__restrict__ src,
                            float *__restrict__ dst) {
  size_t n = rows * cols;
  for (size_t i = global_index(); i < n; i += global_stride()) {
    size_t c = i / rows, r = i % rows;
    dst[i] = src[r * cols + c];
  }
}

// dst (N x dh x dw x C) = src (N x sh x sw x C) placed at (top, left), `fill` around it.
__global__ void pad_k(size_t N, size_t C, size_t sh, size_t sw, const float *__restrict__ src,
                      size_t dh, size_t dw, size_t top, size_t left, float fill,
                      float *__restrict__ dst) {
  size_t n = N * dh * dw * C;
  for (size_t i = global_index(); i < n; i += global_stride()) {
    size_t c = i % C, p = i / C;
    size_t x = p % dw, y = (p / dw) % dh, img = p / (dw * dh);
    size_t sy = y - top, sx = x - left;  // wraps around (large) above the source
    dst[i] = (y >= top && x >= left && sy < sh && sx < sw)
                 ? src[((img * sh + sy) * sw + sx) * C + c]
                 : fill;
  }
}

// dst (N x dh x dw x C) = the part of src (N x sh x sw x C) at (top, left).
__global__ void crop_k(size_t N, size_t C, size_t sh, size_t sw, const float *__restrict__ src,
                       size_t dh, size_t dw, size_t top, size_t left, float *__restrict__ dst) {
  size_t n = N * dh * dw * C;
  for (size_t i = global_index(); i < n; i += global_stride()) {
    size_t c = i % C, p = i / C;
    size_t x = p % dw, y = (p / dw) % dh, img = p / (dw * dh);
    dst[i] = src[((img * sh + y + top) * sw + x + left) * C + c];
  }
}

int transpose(ts_cuda_ctx *ctx, size_t rows, size_t cols, const float *src, float *dst) {
  transpose_k<<<blocks_for(ctx, rows * cols), kThreads, 0, ctx->stream>>>(rows, cols, src, dst);
  TS_CUDA_CHECK(cudaGetLastError());
  return 0;
}

int pad(ts_cuda_ctx *ctx, const ts_conv2d_t *g, size_t ph, size_t pw, float fill, const float *x,
        float *xp) {
  pad_k<<<blocks_for(ctx, g->batch * ph * pw * g->in_c), kThreads, 0, ctx->stream>>>(
      g->batch, g->in_c, g->in_h, g->in_w, x, ph, pw, g->pad_top, g->pad_left, fill, xp);
  TS_CUDA_CHECK(cudaGetLastError());
  return 0;
}

int crop(ts_cuda_ctx *ctx, const ts_conv2d_t *g, size_t ph, size_t pw, const float *dxp,
         float *dx) {
  crop_k<<<blocks_for(ctx, g->batch * g->in_h * g->in_w * g->in_c), kThreads, 0, ctx->stream>>>(
      g->batch, g->in_c, ph, pw, dxp, g->in_h, g->in_w, g->pad_top, g->pad_left, dx);
  TS_CUDA_CHECK(cudaGetLastError());
  return 0;
}

// --- geometry ------------------------------------------------------------------------------

// The total padding of one direction (TensorFlow's: the output's reach past the input).
size_t total_pad(size_t in, size_t win, size_t stride, size_t out) {
  size_t reach = (out - 1) * stride + win;
  return reach > in ? reach - in : 0;
}

bool geometry_ok(const ts_conv2d_t *g) {
  return g && g->batch && g->in_h && g->in_w && g->in_c && g->win_h && g->win_w && g->stride_h &&
         g->stride_w && g->out_h && g->out_w && g->out_c && g->win_h <= INT_MAX &&
         g->win_w <= INT_MAX && g->stride_h <= INT_MAX && g->stride_w <= INT_MAX &&
         g->pad_top <= INT_MAX && g->pad_left <= INT_MAX;
}

// cuDNN takes int sizes and strides: every tensor of the batch must stay within INT_MAX.
bool fits_int(size_t n, size_t h, size_t w, size_t c) {
  return n <= INT_MAX && h <= INT_MAX && w <= INT_MAX && c <= INT_MAX &&
         h * w * c <= (size_t)INT_MAX / n;
}

int state(ts_cuda_ctx *ctx, ts_cudnn_state **out) {
  if (!ctx->dnn) {
    ts_cudnn_state *st = static_cast<ts_cudnn_state *>(ts_calloc(1, sizeof(ts_cudnn_state)));
    if (!st) return fail_msg(ctx, TS_ENOMEM, "cuDNN state: out of host memory");
    cudnnStatus_t s = cudnnCreate(&st->h);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnSetStream(st->h, ctx->stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      if (st->h) cudnnDestroy(st->h);
      ts_free(st);
      return cudnn_fail(ctx, s, "cudnnCreate", __FILE__, __LINE__);
    }
    ctx->dnn = st;
  }
  *out = ctx->dnn;
  return 0;
}

void plan_clear(conv_plan *p) {
  if (p->x) cudnnDestroyTensorDescriptor(p->x);
  if (p->y) cudnnDestroyTensorDescriptor(p->y);
  if (p->w) cudnnDestroyFilterDescriptor(p->w);
  if (p->conv) cudnnDestroyConvolutionDescriptor(p->conv);
  memset(p, 0, sizeof *p);
}

// How much cuDNN workspace a new geometry may have: half of what the memory policy still
// allows, at most kWorkspaceCap, less `scratch` (our own part).
size_t workspace_budget(ts_cuda_ctx *ctx, size_t scratch) {
  ts_pool_stats_t st;
  ts_pool_stats(ts_cuda_pool(ctx), &st);
  size_t limit = ts_cuda_pool_limit(ctx), room;
  if (limit) {
    room = limit > st.in_use ? limit - st.in_use : 0;
  } else {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
      cudaGetLastError();
      fr = 0;
    }
    room = fr + (st.held - st.in_use);
  }
  room /= 2;
  if (room > kWorkspaceCap) room = kWorkspaceCap;
  return room > scratch ? room - scratch : 0;
}

// Not TF32 unless allowed: the tensor-op math types round inputs to 10-bit mantissas.
bool math_ok(const ts_cuda_ctx *ctx, cudnnMathType_t m) {
  return ctx->allow_tf32 || m == CUDNN_DEFAULT_MATH || m == CUDNN_FMA_MATH;
}

// The first algorithm of cuDNN's ranking that works, has an allowed math type and a
// workspace within `budget`; deterministic ones first. TS_ENOMEM when none fits.
template <typename Perf, typename Algo, typename SizeFn>
int pick(ts_cuda_ctx *ctx, const char *dir, const Perf *perf, int n, size_t budget, SizeFn size,
         Algo *algo, size_t *ws) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n; i++) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || !math_ok(ctx, perf[i].mathType)) continue;
      if (pass == 0 && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
      size_t need = 0;
      if (size(perf[i].algo, &need) != CUDNN_STATUS_SUCCESS || need > budget) continue;
      *algo = perf[i].algo;
      *ws = need;
      return 0;
    }
  char b[32], msg[160];
  snprintf(msg, sizeof msg, "cuDNN: no %s convolution algorithm fits a workspace of %s", dir,
           ts_pool_format_bytes(budget, b, sizeof b));
  return fail_msg(ctx, TS_ENOMEM, msg);
}

int choose_algorithms(ts_cuda_ctx *ctx, ts_cudnn_state *st, conv_plan *p, size_t budget) {
  cudnnHandle_t h = st->h;
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0;
    TS_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, p->x, p->w, p->conv, p->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    int rc = pick(
        ctx, "forward", perf, n, budget,
        [&](cudnnConvolutionFwdAlgo_t a, size_t *s) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y, a, s);
        },
        &p->fwd, &p->fwd_ws);
    if (rc < 0) return rc;
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0;
    TS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p->w, p->y, p->conv, p->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
    int rc = pick(
        ctx, "backward-data", perf, n, budget,
        [&](cudnnConvolutionBwdDataAlgo_t a, size_t *s) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv, p->x, a, s);
        },
        &p->bwd_data, &p->bwd_data_ws);
    if (rc < 0) return rc;
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    TS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p->x, p->y, p->conv, p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
    int rc = pick(
        ctx, "backward-filter", perf, n, budget,
        [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *s) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv, p->w, a, s);
        },
        &p->bwd_filter, &p->bwd_filter_ws);
    if (rc < 0) return rc;
  }
  size_t m = p->fwd_ws;
  if (p->bwd_data_ws > m) m = p->bwd_data_ws;
  if (p->bwd_filter_ws > m) m = p->bwd_filter_ws;
  p->total = p->filter_bytes + p->pad_bytes + align_up(m);
  return 0;
}

// Descriptors and padding of a new geometry (algorithms not yet chosen).
int describe(ts_cuda_ctx *ctx, const ts_conv2d_t *g, conv_plan *p) {
  p->g = *g;
  size_t th = total_pad(g->in_h, g->win_h, g->stride_h, g->out_h);
  size_t tw = total_pad(g->in_w, g->win_w, g->stride_w, g->out_w);
  p->explicit_pad = th != 2 * g->pad_top || tw != 2 * g->pad_left;
  p->ph = p->explicit_pad ? g->in_h + th : g->in_h;
  p->pw = p->explicit_pad ? g->in_w + tw : g->in_w;
  size_t taps = g->win_h * g->win_w * g->in_c;
  if (!fits_int(g->batch, p->ph, p->pw, g->in_c) ||
      !fits_int(g->batch, g->out_h, g->out_w, g->out_c) ||
      !fits_int(g->out_c, g->win_h, g->win_w, g->in_c))
    return fail_msg(ctx, TS_EINVAL, "cuDNN: a tensor of this convolution exceeds 2^31 elements");
  p->filter_bytes = align_up(taps * g->out_c * sizeof(float));
  p->pad_bytes = p->explicit_pad ? align_up(g->batch * p->ph * p->pw * g->in_c * sizeof(float)) : 0;
  TS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  TS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  TS_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  TS_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  TS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            (int)g->batch, (int)g->in_c, (int)p->ph, (int)p->pw));
  TS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            (int)g->batch, (int)g->out_c, (int)g->out_h,
                                            (int)g->out_w));
  // KRSC: cuDNN's filter layout for CUDNN_TENSOR_NHWC (k = out_c, c = in_c, r, s = window).
  TS_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                            (int)g->out_c, (int)g->in_c, (int)g->win_h,
                                            (int)g->win_w));
  int pad_h = p->explicit_pad ? 0 : (int)g->pad_top, pad_w = p->explicit_pad ? 0 : (int)g->pad_left;
  // TensorFlow's conv2d is a cross-correlation (the kernel is not flipped).
  TS_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, pad_h, pad_w, (int)g->stride_h,
                                                 (int)g->stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                                 CUDNN_DATA_FLOAT));
  TS_CUDNN_CHECK(
      cudnnSetConvolutionMathType(p->conv, ctx->allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  int n = 0, c = 0, hh = 0, ww = 0;
  TS_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &c, &hh, &ww));
  if ((size_t)n != g->batch || (size_t)c != g->out_c || (size_t)hh != g->out_h ||
      (size_t)ww != g->out_w)
    return fail_msg(ctx, TS_EINVAL,
                    "cuDNN: the convolution's output shape differs from ts_conv.h's");
  return 0;
}

// The plan of geometry g: the cached one, else a new one whose cuDNN workspace is at most
// `budget` (evicting the least recently used when the cache is full).
int get_plan(ts_cuda_ctx *ctx, const ts_conv2d_t *g, bool have_budget, size_t budget,
             conv_plan **out) {
  ts_cudnn_state *st = nullptr;
  int rc = state(ctx, &st);
  if (rc < 0) return rc;
  conv_plan *victim = &st->plans[0];
  for (int i = 0; i < kPlans; i++) {
    conv_plan *p = &st->plans[i];
    if (p->used && memcmp(&p->g, g, sizeof *g) == 0) {
      p->last_use = ++st->clock;
      *out = p;
      return 0;
    }
    if (!p->used ? victim->used : (victim->used && p->last_use < victim->last_use)) victim = p;
  }
  plan_clear(victim);
  rc = describe(ctx, g, victim);
  if (rc == 0) {
    size_t own = victim->filter_bytes + victim->pad_bytes;
    if (!have_budget) {
      budget = workspace_budget(ctx, own);
    } else if (budget < own) {
      rc = fail_msg(ctx, TS_EINVAL, "cuDNN: the workspace is smaller than conv2d_workspace asked");
    } else {
      budget -= own;
    }
  }
  if (rc == 0) rc = choose_algorithms(ctx, st, victim, budget);
  if (rc < 0) {
    plan_clear(victim);
    return rc;
  }
  victim->used = true;
  victim->last_use = ++st->clock;
  *out = victim;
  return 0;
}

// Entry of a convolution kernel: the context, its GPU, and the plan for a workspace ws of
// ws_bytes (TS_EINVAL when it is smaller than the plan needs).
#define CONV_ENTER(k, g, a, b, c)                                                       \
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);                                                 \
  if (!ctx) return TS_EINVAL;                                                           \
  if (!geometry_ok(g) || !(a) || !(b) || !(c) || !ws) return TS_EINVAL;                 \
  TS_CUDA_CHECK(cudaSetDevice(ctx->device));                                            \
  conv_plan *p = nullptr;                                                               \
  {                                                                                     \
    int rc_ = get_plan(ctx, g, true, ws_bytes, &p);                                     \
    if (rc_ < 0) return rc_;                                                            \
    if (ws_bytes < p->total)                                                            \
      return fail_msg(ctx, TS_EINVAL,                                                   \
                      "cuDNN: the workspace is smaller than conv2d_workspace asked");   \
  }                                                                                     \
  float *wk = static_cast<float *>(ws);                                                 \
  float *padded = reinterpret_cast<float *>(static_cast<char *>(ws) + p->filter_bytes); \
  void *cws = static_cast<char *>(ws) + p->filter_bytes + p->pad_bytes;                 \
  cudnnHandle_t h = ctx->dnn->h;                                                        \
  const float one = 1.0f, zero = 0.0f

size_t cudnn_conv2d_workspace(const ts_kernels_t *k, const ts_conv2d_t *g) {
  ts_cuda_ctx *ctx = ts_cuda_ctx_of(k);
  if (!ctx || !geometry_ok(g) || cudaSetDevice(ctx->device) != cudaSuccess) return 0;
  conv_plan *p = nullptr;
  if (get_plan(ctx, g, false, 0, &p) < 0) return 0;
  return p->total;
}

int cudnn_conv2d_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *w,
                     float *y, void *ws, size_t ws_bytes) {
  CONV_ENTER(k, g, x, w, y);
  int rc = transpose(ctx, g->win_h * g->win_w * g->in_c, g->out_c, w, wk);  // HWIO -> KRSC
  if (rc == 0 && p->explicit_pad) rc = pad(ctx, g, p->ph, p->pw, 0.0f, x, padded);
  if (rc < 0) return rc;
  TS_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p->x, p->explicit_pad ? padded : x, p->w, wk,
                                         p->conv, p->fwd, cws, p->fwd_ws, &zero, p->y, y));
  return 0;
}

int cudnn_conv2d_bwd_data(const ts_kernels_t *k, const ts_conv2d_t *g, const float *w,
                          const float *dy, float *dx, void *ws, size_t ws_bytes) {
  CONV_ENTER(k, g, w, dy, dx);
  int rc = transpose(ctx, g->win_h * g->win_w * g->in_c, g->out_c, w, wk);  // HWIO -> KRSC
  if (rc < 0) return rc;
  TS_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p->w, wk, p->y, dy, p->conv, p->bwd_data,
                                              cws, p->bwd_data_ws, &zero, p->x,
                                              p->explicit_pad ? padded : dx));
  return p->explicit_pad ? crop(ctx, g, p->ph, p->pw, padded, dx) : 0;
}

int cudnn_conv2d_bwd_filter(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x,
                            const float *dy, float *dw, void *ws, size_t ws_bytes) {
  CONV_ENTER(k, g, x, dy, dw);
  if (p->explicit_pad) {
    int rc = pad(ctx, g, p->ph, p->pw, 0.0f, x, padded);
    if (rc < 0) return rc;
  }
  TS_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p->x, p->explicit_pad ? padded : x, p->y,
                                                dy, p->conv, p->bwd_filter, cws, p->bwd_filter_ws,
                                                &zero, p->w, wk));
  return transpose(ctx, g->out_c, g->win_h * g->win_w * g->in_c, wk, dw);  // KRSC -> HWIO
}

// --- max pooling ---------------------------------------------------------------------------

// Pooling's scratch, at least `bytes`, grown (never shrunk) from the pool.
int ensure_scratch(ts_cuda_ctx *ctx, ts_cudnn_state *st, size_t bytes) {
  if (st->scratch_bytes >= bytes) return 0;
  TS_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));  // queued kernels may still use the old one
  ts_pool_free(ts_cuda_pool(ctx), st->scratch);
  st->scratch = nullptr;
  st->scratch_bytes = 0;
  int rc = ts_pool_alloc(ts_cuda_pool(ctx), bytes, &st->scratch, ctx->errmsg, sizeof ctx->errmsg);
  if (rc < 0) return rc;
  st->scratch_bytes = bytes;
  return 0;
}

// Descriptors of one pooling call; destroyed by its destructor.
struct pool_call {
  cudnnPoolingDescriptor_t pd = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  size_t ph = 0, pw = 0;
  bool padded = false;
  ~pool_call() {
    if (pd) cudnnDestroyPoolingDescriptor(pd);
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
  }
};

// Descriptors for pooling over x padded explicitly (-inf) to ph x pw; *scratch_out = where
// the padded x (and for the backward pass the padded dx after it) go.
int pool_setup(ts_cuda_ctx *ctx, const ts_conv2d_t *g, bool backward, pool_call *pc,
               float **scratch_out) {
  ts_cudnn_state *st = nullptr;
  int rc = state(ctx, &st);
  if (rc < 0) return rc;
  size_t th = total_pad(g->in_h, g->win_h, g->stride_h, g->out_h);
  size_t tw = total_pad(g->in_w, g->win_w, g->stride_w, g->out_w);
  pc->padded = th || tw;
  pc->ph = g->in_h + th;
  pc->pw = g->in_w + tw;
  if (!fits_int(g->batch, pc->ph, pc->pw, g->in_c) ||
      !fits_int(g->batch, g->out_h, g->out_w, g->out_c))
    return fail_msg(ctx, TS_EINVAL, "cuDNN: a tensor of this pooling exceeds 2^31 elements");
  *scratch_out = nullptr;
  if (pc->padded) {
    size_t one = align_up(g->batch * pc->ph * pc->pw * g->in_c * sizeof(float));
    rc = ensure_scratch(ctx, st, backward ? 2 * one : one);
    if (rc < 0) return rc;
    *scratch_out = static_cast<float *>(st->scratch);
  }
  TS_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pc->pd));
  TS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&pc->x));
  TS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&pc->y));
  // Deterministic max: the backward pass routes each window's gradient to one maximum.
  TS_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pc->pd, CUDNN_POOLING_MAX_DETERMINISTIC,
                                             CUDNN_NOT_PROPAGATE_NAN, (int)g->win_h, (int)g->win_w,
                                             0, 0, (int)g->stride_h, (int)g->stride_w));
  TS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(pc->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            (int)g->batch, (int)g->in_c, (int)pc->ph, (int)pc->pw));
  TS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(pc->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT,
                                            (int)g->batch, (int)g->out_c, (int)g->out_h,
                                            (int)g->out_w));
  int n = 0, c = 0, hh = 0, ww = 0;
  TS_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pc->pd, pc->x, &n, &c, &hh, &ww));
  if ((size_t)n != g->batch || (size_t)c != g->out_c || (size_t)hh != g->out_h ||
      (size_t)ww != g->out_w)
    return fail_msg(ctx, TS_EINVAL, "cuDNN: the pooling's output shape differs from ts_conv.h's");
  return 0;
}

int cudnn_maxpool_fwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, float *y,
                      int32_t *argmax) {
  TS_CUDA_ENTER_CTX(k);
  if (!geometry_ok(g) || g->out_c != g->in_c || !x || !y || !argmax) return TS_EINVAL;
  pool_call pc;
  float *xp = nullptr;
  int rc = pool_setup(ctx, g, false, &pc, &xp);
  if (rc == 0 && pc.padded) rc = pad(ctx, g, pc.ph, pc.pw, -INFINITY, x, xp);
  if (rc < 0) return rc;
  const float one = 1.0f, zero = 0.0f;
  // argmax stays unwritten: cuDNN's backward pass finds the maxima again from x and y.
  TS_CUDNN_CHECK(
      cudnnPoolingForward(ctx->dnn->h, pc.pd, &one, pc.x, pc.padded ? xp : x, &zero, pc.y, y));
  return 0;
}

int cudnn_maxpool_bwd(const ts_kernels_t *k, const ts_conv2d_t *g, const float *x, const float *y,
                      const float *dy, const int32_t *argmax, float *dx) {
  TS_CUDA_ENTER_CTX(k);
  (void)argmax;
  if (!geometry_ok(g) || g->out_c != g->in_c || !x || !y || !dy || !dx) return TS_EINVAL;
  pool_call pc;
  float *xp = nullptr;
  int rc = pool_setup(ctx, g, true, &pc, &xp);
  if (rc == 0 && pc.padded) rc = pad(ctx, g, pc.ph, pc.pw, -INFINITY, x, xp);
  if (rc < 0) return rc;
  float *dxp =
      pc.padded ? xp + align_up(g->batch * pc.ph * pc.pw * g->in_c * sizeof(float)) / sizeof(float)
                : dx;
  const float one = 1.0f, zero = 0.0f;
  // Overlapping windows add their gradients into dx (beta = 0 clears it first).
  TS_CUDNN_CHECK(cudnnPoolingBackward(ctx->dnn->h, pc.pd, &one, pc.y, y, pc.y, dy, pc.x,
                                      pc.padded ? xp : x, &zero, pc.x, dxp));
  return pc.padded ? crop(ctx, g, pc.ph, pc.pw, dxp, dx) : 0;
}

}  // namespace

void ts_cudnn_fill_table(ts_kernels_t *t) {
  t->conv2d_workspace = cudnn_conv2d_workspace;
  t->conv2d_fwd = cudnn_conv2d_fwd;
  t->conv2d_bwd_data = cudnn_conv2d_bwd_data;
  t->conv2d_bwd_filter = cudnn_conv2d_bwd_filter;
  t->maxpool_fwd = cudnn_maxpool_fwd;
  t->maxpool_bwd = cudnn_maxpool_bwd;
}

void ts_cudnn_destroy(ts_cuda_ctx *ctx) {
  ts_cudnn_state *st = ctx->dnn;
  if (!st) return;
  for (int i = 0; i < kPlans; i++) plan_clear(&st->plans[i]);
  if (st->scratch) ts_pool_free(ts_cuda_pool(ctx), st->scratch);
  cudnnDestroy(st->h);
  ts_free(st);
  ctx->dnn = nullptr;
}
