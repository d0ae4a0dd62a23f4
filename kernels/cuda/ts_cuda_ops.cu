// The CUDA kernels of the back end and their launchers (kernels/cuda/ts_cuda.h).
//
// The CPU back end is the reference (kernels/cpu/ts_kernels_cpu.c): each kernel computes the
// same formula in float32, with the same rounding where it is cheap to keep (products that
// the CPU rounds separately use __fmul_rn so nvcc does not fuse them into an FMA). Sums run
// in another order than the CPU's loops (tree reductions), so they agree to rounding, and
// every reduction is deterministic: no floating-point atomics, the same result run to run.
//
// Layout: elementwise kernels are grid-stride loops over size_t indices (sizes above 2^31
// work); row kernels (softmax, argmax) give one warp to a row; the column sums of bias_grad
// give one thread column to 32 matrix columns and reduce the rows through shared memory.
#include <cuda_runtime.h>
#include <math.h>

#include "ts_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ size_t global_index() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() {
  return (size_t)gridDim.x * blockDim.x;
}

// Blocks for n elements, at most `cap` (the launcher's bound from the SM count).
int blocks_for(size_t n, int cap) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return b > (size_t)cap ? cap : (int)b;
}

__global__ void bias_add_k(size_t rows, size_t cols, const float *__restrict__ bias,
                           float *__restrict__ y) {
  size_t n = rows * cols;
  for (size_t i = global_index(); i < n; i += global_stride()) y[i] += bias[i % cols];
}

// Column sums: block (32, 8) covers 32 columns; thread (tx, ty) sums rows ty, ty + 8, ...
// of column 32 * blockIdx.x + tx, then the 8 partial sums meet in shared memory.
constexpr int kColTile = 32, kRowLanes = 8;
__global__ void bias_grad_k(size_t rows, size_t cols, const float *__restrict__ dy,
                            float *__restrict__ db) {
  __shared__ float part[kRowLanes][kColTile + 1];
  size_t j = (size_t)blockIdx.x * kColTile + threadIdx.x;
  float s = 0.0f;
  if (j < cols)
    for (size_t i = threadIdx.y; i < rows; i += kRowLanes) s += dy[i * cols + j];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = part[0][threadIdx.x];
    for (int r = 1; r < kRowLanes; r++) t += part[r][threadIdx.x];
    db[j] = t;
  }
}

__global__ void axpy_k(size_t n, float alpha, const float *__restrict__ x, float *__restrict__ y) {
  for (size_t i = global_index(); i < n; i += global_stride()) y[i] += __fmul_rn(alpha, x[i]);
}

__global__ void scale_k(size_t n, float alpha, float *__restrict__ x) {
  for (size_t i = global_index(); i < n; i += global_stride()) x[i] *= alpha;
}

__global__ void fill_k(size_t n, float value, float *__restrict__ x) {
  for (size_t i = global_index(); i < n; i += global_stride()) x[i] = value;
}

__global__ void scale_matrix_k(size_t m, size_t n, size_t ldc, float beta, float *__restrict__ c) {
  size_t total = m * n;
  for (size_t e = global_index(); e < total; e += global_stride()) {
    float *p = c + (e / n) * ldc + e % n;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

// y may be a (in place), so no __restrict__ on them; one rounded product as on the CPU.
__global__ void mul_k(size_t n, const float *a, const float *__restrict__ b, float *y) {
  for (size_t i = global_index(); i < n; i += global_stride()) y[i] = __fmul_rn(a[i], b[i]);
}

__global__ void relu_fwd_k(size_t n, const float *__restrict__ x, float *__restrict__ y) {
  for (size_t i = global_index(); i < n; i += global_stride()) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_bwd_k(size_t n, const float *__restrict__ y, const float *__restrict__ dy,
                           float *__restrict__ dx) {
  for (size_t i = global_index(); i < n; i += global_stride()) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void tanh_fwd_k(size_t n, const float *__restrict__ x, float *__restrict__ y) {
  for (size_t i = global_index(); i < n; i += global_stride()) y[i] = tanhf(x[i]);
}

__global__ void tanh_bwd_k(size_t n, const float *__restrict__ y, const float *__restrict__ dy,
                           float *__restrict__ dx) {
  for (size_t i = global_index(); i < n; i += global_stride()) {
    float yy = __fmul_rn(y[i], y[i]);
    dx[i] = __fmul_rn(dy[i], 1.0f - yy);
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_down_sync(kFull, v, off));
  return __shfl_sync(kFull, v, 0);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_down_sync(kFull, v, off);
  return __shfl_sync(kFull, v, 0);
}

// One warp per row: the row maximum, exp(z - max) and its sum, probs = e / sum, and the row's
// loss logsumexp - z[label] = log(sum) - (z[label] - max).
__global__ void softmax_xent_k(size_t rows, size_t cols, const float *__restrict__ logits,
                               const int32_t *__restrict__ labels, float *__restrict__ probs,
                               float *__restrict__ rowloss, ts_cuda_result *result) {
  const int lane = threadIdx.x % kWarp;
  const size_t warps = global_stride() / kWarp;
  for (size_t r = global_index() / kWarp; r < rows; r += warps) {
    const float *z = logits + r * cols;
    float *p = probs + r * cols;
    float mx = -INFINITY;
    for (size_t j = lane; j < cols; j += kWarp) mx = fmaxf(mx, z[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (size_t j = lane; j < cols; j += kWarp) {
      float e = expf(z[j] - mx);
      p[j] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
    for (size_t j = lane; j < cols; j += kWarp) p[j] *= inv;
    if (lane == 0) {
      int32_t y = labels[r];
      float loss = 0.0f;
      if (y < 0 || (size_t)y >= cols)
        result->bad_label = 1;
      else
        loss = logf(sum) - (z[y] - mx);
      if (rowloss) rowloss[r] = loss;
    }
  }
}

// The mean of rowloss[0..rows) in double, by one block, in a fixed order.
__global__ void mean_k(size_t rows, const float *__restrict__ rowloss, ts_cuda_result *result) {
  __shared__ double part[kThreads];
  double s = 0.0;
  for (size_t i = threadIdx.x; i < rows; i += blockDim.x) s += (double)rowloss[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) result->loss = (float)(part[0] / (double)rows);
}

// dlogits = (probs - onehot) / rows, elementwise; dlogits may be probs.
__global__ void softmax_xent_grad_k(size_t rows, size_t cols, const float *probs,
                                    const int32_t *__restrict__ labels, float *dlogits,
                                    ts_cuda_result *result) {
  const float inv = 1.0f / (float)rows;
  size_t n = rows * cols;
  for (size_t e = global_index(); e < n; e += global_stride()) {
    size_t i = e / cols, j = e % cols;
    int32_t y = labels[i];
    float d = __fmul_rn(probs[e], inv);
    if (y < 0 || (size_t)y >= cols) {
      if (j == 0) result->bad_label = 1;
    } else if ((size_t)y == j) {
      d -= inv;
    }
    dlogits[e] = d;
  }
}

// One warp per row: the first maximum (smallest index on ties), counted when it is the label.
__global__ void argmax_correct_k(size_t rows, size_t cols, const float *__restrict__ logits,
                                 const int32_t *__restrict__ labels, ts_cuda_result *result) {
  const int lane = threadIdx.x % kWarp;
  const size_t warps = global_stride() / kWarp;
  for (size_t r = global_index() / kWarp; r < rows; r += warps) {
    const float *z = logits + r * cols;
    float bv = -INFINITY;
    size_t bi = (size_t)-1;
    for (size_t j = lane; j < cols; j += kWarp)
      if (bi == (size_t)-1 || z[j] > bv) {
        bv = z[j];
        bi = j;
      }
    for (int off = kWarp / 2; off > 0; off /= 2) {
      float ov = __shfl_down_sync(kFull, bv, off);
      unsigned long long oi = __shfl_down_sync(kFull, (unsigned long long)bi, off);
      if (oi != (unsigned long long)-1 &&
          (bi == (size_t)-1 || ov > bv || (ov == bv && (size_t)oi < bi))) {
        bv = ov;
        bi = (size_t)oi;
      }
    }
    if (lane == 0) {
      int32_t y = labels[r];
      if (y >= 0 && (size_t)y == bi) atomicAdd(&result->correct, 1ULL);
    }
  }
}

}  // namespace

cudaError_t ts_cuda_bias_add(cudaStream_t s, int blocks, size_t rows, size_t cols,
                             const float *bias, float *y) {
  bias_add_k<<<blocks_for(rows * cols, blocks), kThreads, 0, s>>>(rows, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t ts_cuda_bias_grad(cudaStream_t s, size_t rows, size_t cols, const float *dy,
                              float *db) {
  dim3 block(kColTile, kRowLanes);
  size_t grid = (cols + kColTile - 1) / kColTile;
  bias_grad_k<<<(unsigned)grid, block, 0, s>>>(rows, cols, dy, db);
  return cudaGetLastError();
}

cudaError_t ts_cuda_axpy(cudaStream_t s, int blocks, size_t n, float alpha, const float *x,
                         float *y) {
  axpy_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t ts_cuda_scale(cudaStream_t s, int blocks, size_t n, float alpha, float *x) {
  scale_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t ts_cuda_fill(cudaStream_t s, int blocks, size_t n, float value, float *x) {
  fill_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, value, x);
  return cudaGetLastError();
}

cudaError_t ts_cuda_scale_matrix(cudaStream_t s, int blocks, size_t m, size_t n, size_t ldc,
                                 float beta, float *c) {
  scale_matrix_k<<<blocks_for(m * n, blocks), kThreads, 0, s>>>(m, n, ldc, beta, c);
  return cudaGetLastError();
}

cudaError_t ts_cuda_mul(cudaStream_t s, int blocks, size_t n, const float *a, const float *b,
                        float *y) {
  mul_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t ts_cuda_relu_fwd(cudaStream_t s, int blocks, size_t n, const float *x, float *y) {
  relu_fwd_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t ts_cuda_relu_bwd(cudaStream_t s, int blocks, size_t n, const float *y, const float *dy,
                             float *dx) {
  relu_bwd_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t ts_cuda_tanh_fwd(cudaStream_t s, int blocks, size_t n, const float *x, float *y) {
  tanh_fwd_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t ts_cuda_tanh_bwd(cudaStream_t s, int blocks, size_t n, const float *y, const float *dy,
                             float *dx) {
  tanh_bwd_k<<<blocks_for(n, blocks), kThreads, 0, s>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t ts_cuda_softmax_xent(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                 const float *logits, const int32_t *labels, float *probs,
                                 float *rowloss, ts_cuda_result *result) {
  int b = blocks_for(rows * kWarp, blocks);
  softmax_xent_k<<<b, kThreads, 0, s>>>(rows, cols, logits, labels, probs, rowloss, result);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !rowloss) return e;
  mean_k<<<1, kThreads, 0, s>>>(rows, rowloss, result);
  return cudaGetLastError();
}

cudaError_t ts_cuda_softmax_xent_grad(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                      const float *probs, const int32_t *labels, float *dlogits,
                                      ts_cuda_result *result) {
  softmax_xent_grad_k<<<blocks_for(rows * cols, blocks), kThreads, 0, s>>>(rows, cols, probs,
                                                                           labels, dlogits, result);
  return cudaGetLastError();
}

cudaError_t ts_cuda_argmax_correct(cudaStream_t s, int blocks, size_t rows, size_t cols,
                                   const float *logits, const int32_t *labels,
                                   ts_cuda_result *result) {
  cudaError_t e = cudaMemsetAsync(&result->correct, 0, sizeof result->correct, s);
  if (e != cudaSuccess) return e;
  argmax_correct_k<<<blocks_for(rows * kWarp, blocks), kThreads, 0, s>>>(rows, cols, logits, labels,
                                                                         result);
  return cudaGetLastError();
}
