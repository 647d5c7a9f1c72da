// CUDA kernels of the transformer ops: GELU, LayerNorm and softmax over the last dimension, the row-wise
// broadcasts, the strided copy and the bf16 conversions, twins of
// core/cpu/kernels_token.cpp around the same ACTLAB_HD arithmetic (core/token_math.h).
// Contracts in core/cuda/kernels.h; tested in tests/test_cuda_ops.cpp ("cuda ops: GELU and LayerNorm").
#include "actlab/core/bf16.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"
#include "actlab/core/token_math.h"

namespace actlab::cuda {
namespace {

__global__ void gelu_kernel(float* y, const float* x, int64_t n, bool tanh_approx) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = token_math::gelu(x[i], tanh_approx);
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dx[i] = dy[i] * token_math::gelu_grad(x[i], tanh_approx);
}

// The row kernels (LayerNorm, softmax): a warp per row. The warp stages the row's inputs in shared memory
// with coalesced loads; lane 0 computes the row's statistics from the stage (token_math's sequential sums:
// the CPU's order, the CPU's bits), and the warp writes the elements. One thread per row, the first form,
// read rows a model width apart from neighbouring lanes: a fifth of a ViT step's GPU time once the column
// sums were fixed (docs/cuda.md, "ViT on the GPU").
// RowStage says how many rows a block takes and whether they fit in shared memory; a row too wide to
// stage (over kStageBytes for one warp) is read from global memory by lane 0, in the same order.
constexpr int kRowWarps = 8;
// Static plus dynamic shared memory must stay within 48 KiB without an opt-in, and the row kernels hold
// their statistics (up to 64 bytes) statically: at exactly 48 KiB of stage a LayerNorm backward of d = 768
// (ViT-B) failed to launch (found by reading; these kernels had never run).
constexpr int64_t kStageBytes = 48 * 1024 - 256;

struct RowStage {
  int warps;     // rows (warps) per block
  bool staged;   // rows staged in shared memory
  size_t bytes;  // dynamic shared memory per block
  RowStage(int64_t d, int inputs) {
    const int64_t row_bytes = d * inputs * static_cast<int64_t>(sizeof(float));
    const int64_t fit = row_bytes > 0 ? kStageBytes / row_bytes : kRowWarps;
    staged = fit >= 1;
    warps = staged ? static_cast<int>(std::min<int64_t>(kRowWarps, fit)) : kRowWarps;
    bytes = staged ? static_cast<size_t>(warps * row_bytes) : 0;
  }
  int blocks(int64_t rows) const { return grid_blocks(rows, warps); }
  int threads() const { return warps * 32; }
};

// Copies row r's d values of `src` to the warp's stage (or returns the row itself when not staged).
__device__ __forceinline__ const float* stage_row(float* stage, const float* src, int64_t r, int64_t d, bool staged) {
  if (!staged) return src + r * d;
  for (int64_t j = threadIdx.x & 31; j < d; j += 32) stage[j] = src[r * d + j];
  return stage;
}

__global__ void layernorm_kernel(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                                 const float* beta, int64_t rows, int64_t d, float eps, bool staged) {
  extern __shared__ float stage[];
  __shared__ float stats[kRowWarps][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t r = global_warp(); r < rows; r += grid_warps()) {
    const float* xr = stage_row(stage + warp * d, x, r, d, staged);
    __syncwarp();
    if (lane == 0) {
      token_math::layernorm_stats(xr, d, eps, &stats[warp][0], &stats[warp][1]);
      mean[r] = stats[warp][0];
      rstd[r] = stats[warp][1];
    }
    __syncwarp();
    const float m = stats[warp][0], s = stats[warp][1];
    for (int64_t j = lane; j < d; j += 32) {
      const float h = token_math::layernorm_normalize(xr[j], m, s);
      if (xhat) xhat[r * d + j] = h;
      y[r * d + j] = token_math::layernorm_output(h, gamma[j], beta[j]);
    }
    __syncwarp();  // the stage and stats are the next row's
  }
}

__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* xhat, const float* gamma,
                                    const float* rstd, int64_t rows, int64_t d, bool staged) {
  extern __shared__ float stage[];
  __shared__ float stats[kRowWarps][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t r = global_warp(); r < rows; r += grid_warps()) {
    const float* gr = stage_row(stage + 2 * warp * d, dy, r, d, staged);
    const float* hr = stage_row(stage + (2 * warp + 1) * d, xhat, r, d, staged);
    __syncwarp();
    if (lane == 0) token_math::layernorm_backward_stats(gr, hr, gamma, d, &stats[warp][0], &stats[warp][1]);
    __syncwarp();
    const float s = rstd[r], mg = stats[warp][0], mgx = stats[warp][1];
    for (int64_t j = lane; j < d; j += 32) dx[r * d + j] = token_math::layernorm_dx(gr[j], hr[j], gamma[j], s, mg, mgx);
    __syncwarp();
  }
}

// The skeleton of the column reductions (token_math::column_sum's order): a block of 32 lanes × kColumnWarps
// warps covers 32 adjacent columns (a lane per column: each row read is one 128-byte line); in round k, warp
// w sums row chunk k·kColumnWarps + w of its lane's column, and warp 0 adds the round's chunk sums to the
// column's totals in chunk order. Many warps' loads in flight per column, no atomics, the CPU's bits.
constexpr int kColumnWarps = 32;
template <int N, typename T, typename ChunkSums>
__device__ void column_reduce(T (&total)[N], bool active, int64_t rows, ChunkSums chunk_sums) {
  __shared__ T part[kColumnWarps][32][N];
  const int lane = threadIdx.x, warp = threadIdx.y;
  for (int k = 0; k < N; ++k) total[k] = T(0);
  const int64_t chunks = (rows + token_math::kColumnChunk - 1) / token_math::kColumnChunk;
  for (int64_t c0 = 0; c0 < chunks; c0 += kColumnWarps) {
    T s[N];
    for (int k = 0; k < N; ++k) s[k] = T(0);
    if (active && c0 + warp < chunks) chunk_sums(s, (c0 + warp) * token_math::kColumnChunk);
    for (int k = 0; k < N; ++k) part[warp][lane][k] = s[k];
    __syncthreads();
    if (warp == 0)
      for (int w = 0; w < kColumnWarps && c0 + w < chunks; ++w)
        for (int k = 0; k < N; ++k) total[k] += part[w][lane][k];
    __syncthreads();
  }
}

__global__ void layernorm_dparams_kernel(float* dgamma, float* dbeta, const float* dy, const float* xhat, int64_t rows,
                                         int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double total[2];
  column_reduce<2>(total, j < d, rows, [&](double* s, int64_t r0) {
    token_math::layernorm_chunk_grads(&s[0], &s[1], dy, xhat, j, r0, rows, d);
  });
  if (threadIdx.y == 0 && j < d) {
    dgamma[j] = static_cast<float>(total[0]);
    dbeta[j] = static_cast<float>(total[1]);
  }
}

// Softmax rows (the token count long) as LayerNorm's: the warp writes the exponentials to its stage (or to
// y itself when the row is too wide to stage), lane 0 sums them in order, the warp scales.
__global__ void softmax_kernel(float* y, const float* x, int64_t rows, int64_t d, float scale, bool staged) {
  extern __shared__ float stage[];
  __shared__ float stats[kRowWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t r = global_warp(); r < rows; r += grid_warps()) {
    const float* xr = stage_row(stage + warp * d, x, r, d, staged);
    float* er = staged ? stage + warp * d : y + r * d;
    __syncwarp();
    if (lane == 0) stats[warp] = token_math::row_max(xr, d);
    __syncwarp();
    const float mx = stats[warp];
    for (int64_t j = lane; j < d; j += 32) er[j] = token_math::softmax_exp(xr[j], mx, scale);
    __syncwarp();
    if (lane == 0) stats[warp] = token_math::inverse_row_sum(er, d);
    __syncwarp();
    const float inv = stats[warp];
    for (int64_t j = lane; j < d; j += 32) y[r * d + j] = er[j] * inv;
    __syncwarp();
  }
}

__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, int64_t rows, int64_t d,
                                        float scale, bool staged) {
  extern __shared__ float stage[];
  __shared__ float stats[kRowWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t r = global_warp(); r < rows; r += grid_warps()) {
    const float* gr = stage_row(stage + 2 * warp * d, dy, r, d, staged);
    const float* yr = stage_row(stage + (2 * warp + 1) * d, y, r, d, staged);
    __syncwarp();
    if (lane == 0) stats[warp] = token_math::row_dot(gr, yr, d);
    __syncwarp();
    const float dotf = stats[warp];
    for (int64_t j = lane; j < d; j += 32) dx[r * d + j] = token_math::softmax_dx(gr[j], yr[j], dotf, scale);
    __syncwarp();
  }
}

__global__ void scale_rows_kernel(float* y, const float* x, const float* s, int64_t rows, int64_t d) {
  for (int64_t i = global_thread(); i < rows * d; i += grid_threads()) y[i] = x[i] * s[i / d];
}

__global__ void add_to_rows_kernel(float* y, const float* x, const float* p, int64_t rows, int64_t d) {
  for (int64_t i = global_thread(); i < rows * d; i += grid_threads()) y[i] = x[i] + p[i % d];
}

__global__ void column_sums_kernel(float* out, const float* x, int64_t rows, int64_t d) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float total[1];
  column_reduce<1>(total, j < d, rows,
                   [&](float* s, int64_t r0) { s[0] = token_math::column_chunk_sum(x, j, r0, rows, d); });
  if (threadIdx.y == 0 && j < d) out[j] = total[0];
}

// Blocks of column_reduce: one per 32 columns (the grid's x dimension allows 2^31 − 1).
dim3 column_blocks(int64_t d) { return dim3(static_cast<unsigned>((d + 31) / 32)); }
const dim3 kColumnBlock(32, kColumnWarps);

// Strided copies (on a plan cpu::coalesce_dims has shortened). The index arithmetic, a division per dim
// per offset, is what limits them, not the bytes: one thread per element spent 15 % of a ViT step on the
// H200 in the attention heads' split and merge (docs/cuda.md). Rows of the last dim at least
// kWarpRowMin long go in segments of up to kRowSegment elements, a warp per segment: the lanes share the
// row's offsets (computed once per segment, not per element) and walk the segment, and a long row still
// spreads over many warps. Shorter rows keep one thread per element. Index is int32_t when every index
// and offset fits, else int64_t.
constexpr int64_t kWarpRowMin = 16;
constexpr int64_t kRowSegment = 256;

template <typename T, typename Index>
__global__ void strided_copy_kernel(T* dst, const T* src, cpu::StridedCopy c, Index numel) {
  for (Index i = static_cast<Index>(global_thread()); i < numel; i += static_cast<Index>(grid_threads()))
    dst[token_math::strided_offset(i, c.shape, c.dst_strides, c.ndim)] =
        src[token_math::strided_offset(i, c.shape, c.src_strides, c.ndim)];
}

template <typename T, typename Index>
__global__ void strided_rows_kernel(T* dst, const T* src, cpu::StridedCopy c, Index segments, Index per_row) {
  const int last = c.ndim - 1;
  const Index n = static_cast<Index>(c.shape[last]);
  const Index ds = static_cast<Index>(c.dst_strides[last]), ss = static_cast<Index>(c.src_strides[last]);
  const int lane = threadIdx.x & 31;
  for (Index w = static_cast<Index>(global_warp()); w < segments; w += static_cast<Index>(grid_warps())) {
    const Index r = w / per_row, j0 = (w - r * per_row) * static_cast<Index>(kRowSegment);
    const Index j1 = j0 + static_cast<Index>(kRowSegment) < n ? j0 + static_cast<Index>(kRowSegment) : n;
    T* d = dst + token_math::strided_offset(r, c.shape, c.dst_strides, last);
    const T* s = src + token_math::strided_offset(r, c.shape, c.src_strides, last);
    for (Index j = j0 + lane; j < j1; j += 32) d[j * ds] = s[j * ss];
  }
}

// Every element index and every offset of the copy below 2^31 (offsets are sums of (shape − 1)·stride),
// with room for the grid-stride loops' last step: i + grid_threads() must not wrap either (a numel just under
// 2^31 overflowed the counter into negative indices).
bool fits_int32(const cpu::StridedCopy& c, int64_t numel) {
  int64_t dst_max = 0, src_max = 0;
  for (int k = 0; k < c.ndim; ++k) {
    dst_max += (c.shape[k] - 1) * c.dst_strides[k];
    src_max += (c.shape[k] - 1) * c.src_strides[k];
  }
  constexpr int64_t kLimit = (int64_t(1) << 31) - kMaxGridBlocks * kBlockThreads;
  return numel < kLimit && dst_max < kLimit && src_max < kLimit;
}

template <typename T, typename Index>
void launch_strided_copy(T* dst, const T* src, const cpu::StridedCopy& c, int64_t numel, cudaStream_t cuda_stream) {
  const int64_t n = c.ndim >= 1 ? c.shape[c.ndim - 1] : 1;
  if (n >= kWarpRowMin) {
    const int64_t per_row = (n + kRowSegment - 1) / kRowSegment, segments = numel / n * per_row;
    strided_rows_kernel<<<grid_blocks(segments * 32), kBlockThreads, 0, cuda_stream>>>(
        dst, src, c, static_cast<Index>(segments), static_cast<Index>(per_row));
  } else {
    strided_copy_kernel<<<grid_blocks(numel), kBlockThreads, 0, cuda_stream>>>(dst, src, c,
                                                                              static_cast<Index>(numel));
  }
}

template <typename T>
void strided_copy_typed(void* dst, const void* src, const cpu::StridedCopy& c, int64_t numel,
                        cudaStream_t cuda_stream) {
  if (fits_int32(c, numel))
    launch_strided_copy<T, int32_t>(static_cast<T*>(dst), static_cast<const T*>(src), c, numel, cuda_stream);
  else
    launch_strided_copy<T, int64_t>(static_cast<T*>(dst), static_cast<const T*>(src), c, numel, cuda_stream);
}

template <bool kBf16>
__global__ void narrow_kernel(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = kBf16 ? float_to_bf16(x[i]) : float_to_f16(x[i]);
}
template <bool kBf16>
__global__ void widen_kernel(float* y, const uint16_t* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = kBf16 ? bf16_to_float(x[i]) : f16_to_float(x[i]);
}

void check_16bit(DType type) {
  ACTLAB_CHECK(type == DType::BF16 || type == DType::F16, "16-bit conversion to ", dtype_name(type));
}

__global__ void gather_rows_kernel(float* out, const float* table, const int64_t* index, int64_t n, int64_t d) {
  for (int64_t k = global_thread(); k < n * d; k += grid_threads()) out[k] = table[index[k / d] * d + k % d];
}

// One thread per table element, indices in order: the CPU's summation order, no atomics.
__global__ void scatter_add_rows_kernel(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows,
                                        int64_t d) {
  for (int64_t k = global_thread(); k < rows * d; k += grid_threads()) {
    const int64_t r = k / d, j = k % d;
    float acc = 0.f;
    for (int64_t i = 0; i < n; ++i)
      if (index[i] == r) acc += dy[i * d + j];
    grad[k] = acc;
  }
}

}  // namespace

void gather_rows(float* out, const float* table, const int64_t* index, int64_t n, int64_t d, cudaStream_t cuda_stream) {
  if (n * d == 0) return;
  gather_rows_kernel<<<grid_blocks(n * d), kBlockThreads, 0, cuda_stream>>>(out, table, index, n, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows, int64_t d,
                      cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  scatter_add_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(grad, dy, index, n, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  const RowStage g(d, 1);
  softmax_kernel<<<g.blocks(rows), g.threads(), g.bytes, cuda_stream>>>(y, x, rows, d, scale, g.staged);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale,
                      cudaStream_t cuda_stream) {
  if (rows == 0) return;
  const RowStage g(d, 2);
  softmax_backward_kernel<<<g.blocks(rows), g.threads(), g.bytes, cuda_stream>>>(dx, dy, y, rows, d, scale, g.staged);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void scale_rows(float* y, const float* x, const float* s, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  scale_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(y, x, s, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void add_to_rows(float* y, const float* x, const float* p, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows * d == 0) return;
  add_to_rows_kernel<<<grid_blocks(rows * d), kBlockThreads, 0, cuda_stream>>>(y, x, p, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void column_sums(float* out, const float* x, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (d == 0) return;
  column_sums_kernel<<<column_blocks(d), kColumnBlock, 0, cuda_stream>>>(out, x, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void narrow_16(uint16_t* y, const float* x, int64_t n, DType type, cudaStream_t cuda_stream) {
  check_16bit(type);
  if (n == 0) return;
  if (type == DType::BF16) narrow_kernel<true><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  else narrow_kernel<false><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}
void widen_16(float* y, const uint16_t* x, int64_t n, DType type, cudaStream_t cuda_stream) {
  check_16bit(type);
  if (n == 0) return;
  if (type == DType::BF16) widen_kernel<true><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  else widen_kernel<false><<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void strided_copy(void* dst, const void* src, const cpu::StridedCopy& plan, cudaStream_t cuda_stream) {
  int64_t numel = 1;
  for (int k = 0; k < plan.ndim; ++k) numel *= plan.shape[k];
  if (numel == 0) return;
  const cpu::StridedCopy c = cpu::coalesce_dims(plan);
  switch (c.elem_bytes) {
    case 1: strided_copy_typed<uint8_t>(dst, src, c, numel, cuda_stream); break;
    case 2: strided_copy_typed<uint16_t>(dst, src, c, numel, cuda_stream); break;
    case 4: strided_copy_typed<uint32_t>(dst, src, c, numel, cuda_stream); break;
    default: strided_copy_typed<uint64_t>(dst, src, c, numel, cuda_stream); break;
  }
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream) {
  if (n == 0) return;
  gelu_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, n, tanh_approx);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, dy, x, n, tanh_approx);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  const RowStage g(d, 1);
  layernorm_kernel<<<g.blocks(rows), g.threads(), g.bytes, cuda_stream>>>(y, xhat, mean, rstd, x, gamma, beta, rows, d,
                                                                         eps, g.staged);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat, const float* gamma,
                        const float* rstd, int64_t rows, int64_t d, cudaStream_t cuda_stream) {
  if (rows == 0) return;
  const RowStage g(d, 2);
  layernorm_dx_kernel<<<g.blocks(rows), g.threads(), g.bytes, cuda_stream>>>(dx, dy, xhat, gamma, rstd, rows, d,
                                                                            g.staged);
  ACTLAB_CUDA_CHECK_LAUNCH();
  layernorm_dparams_kernel<<<column_blocks(d), kColumnBlock, 0, cuda_stream>>>(dgamma, dbeta, dy, xhat, rows, d);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
