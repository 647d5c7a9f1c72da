// CUDA pooling: max pool 2-D with the CPU's u8 in-window argmax, average pool 2-D (count_include_pad) and
// global average pool, forward and backward. Forward: one thread per output; backward: one thread per
// input element gathering from the windows that cover it, in the CPU's row-major window order (no
// atomics, same additions). Contracts in core/cuda/kernels.h (CPU twins: core/cpu/kernels_pool.cpp);
// tested in tests/test_cuda_ops.cpp.
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

using cpu::Pool2dShape;

// Output rows [lo, hi] whose window covers input row h (window `R`, stride `st`, padding `pad`, `P` rows).
struct Cover {
  int64_t lo, hi;
};
__device__ __forceinline__ Cover covering(int64_t h, int64_t R, int64_t st, int64_t pad, int64_t P) {
  const int64_t top = h + pad;  // position in the padded input
  const int64_t lo = top < R ? 0 : (top - R) / st + 1;
  const int64_t hi = min64(top / st, P - 1);
  return {lo, hi};
}

__global__ void maxpool_forward_kernel(float* y, uint8_t* argmax, const float* x, Pool2dShape s, int64_t P,
                                       int64_t Q) {
  const int64_t total = s.N * s.C * P * Q;
  for (int64_t o = global_thread(); o < total; o += grid_threads()) {
    const int64_t q = o % Q, p = (o / Q) % P, nc = o / (P * Q);
    const float* xp = x + nc * s.H * s.W;
    const int64_t h0 = p * s.stride_h - s.pad_h, w0 = q * s.stride_w - s.pad_w;
    const int64_t r_lo = max64(0, -h0), r_hi = min64(s.R, s.H - h0);
    const int64_t t_lo = max64(0, -w0), t_hi = min64(s.S, s.W - w0);
    float best = xp[(h0 + r_lo) * s.W + w0 + t_lo];
    int64_t best_pos = r_lo * s.S + t_lo;
    for (int64_t r = r_lo; r < r_hi; ++r) {
      for (int64_t t = t_lo; t < t_hi; ++t) {
        const float v = xp[(h0 + r) * s.W + w0 + t];
        if (v > best || (v != v && best == best)) {  // first maximum wins; a NaN wins and sticks
          best = v;
          best_pos = r * s.S + t;
        }
      }
    }
    y[o] = best;
    argmax[o] = static_cast<uint8_t>(best_pos);
  }
}

__global__ void maxpool_backward_kernel(float* dx, const float* dy, const uint8_t* argmax, Pool2dShape s, int64_t P,
                                        int64_t Q) {
  const int64_t total = s.N * s.C * s.H * s.W;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t w = i % s.W, h = (i / s.W) % s.H, nc = i / (s.H * s.W);
    const Cover rows = covering(h, s.R, s.stride_h, s.pad_h, P), cols = covering(w, s.S, s.stride_w, s.pad_w, Q);
    float sum = 0.f;
    for (int64_t p = rows.lo; p <= rows.hi; ++p) {
      for (int64_t q = cols.lo; q <= cols.hi; ++q) {
        const int64_t o = (nc * P + p) * Q + q;
        const int64_t pos = (h - (p * s.stride_h - s.pad_h)) * s.S + (w - (q * s.stride_w - s.pad_w));
        if (argmax[o] == pos) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

__global__ void avgpool_forward_kernel(float* y, const float* x, Pool2dShape s, int64_t P, int64_t Q,
                                       float inv_area) {
  const int64_t total = s.N * s.C * P * Q;
  for (int64_t o = global_thread(); o < total; o += grid_threads()) {
    const int64_t q = o % Q, p = (o / Q) % P, nc = o / (P * Q);
    const float* xp = x + nc * s.H * s.W;
    const int64_t h0 = p * s.stride_h - s.pad_h, w0 = q * s.stride_w - s.pad_w;
    const int64_t r_lo = max64(0, -h0), r_hi = min64(s.R, s.H - h0);
    const int64_t t_lo = max64(0, -w0), t_hi = min64(s.S, s.W - w0);
    float sum = 0.f;
    for (int64_t r = r_lo; r < r_hi; ++r)
      for (int64_t t = t_lo; t < t_hi; ++t) sum += xp[(h0 + r) * s.W + w0 + t];
    y[o] = sum * inv_area;
  }
}

__global__ void avgpool_backward_kernel(float* dx, const float* dy, Pool2dShape s, int64_t P, int64_t Q,
                                        float inv_area) {
  const int64_t total = s.N * s.C * s.H * s.W;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t w = i % s.W, h = (i / s.W) % s.H, nc = i / (s.H * s.W);
    const Cover rows = covering(h, s.R, s.stride_h, s.pad_h, P), cols = covering(w, s.S, s.stride_w, s.pad_w, Q);
    float sum = 0.f;
    for (int64_t p = rows.lo; p <= rows.hi; ++p)
      // __fmul_rn: never contracted into an FMA, because the CPU rounds the product before adding it.
      for (int64_t q = cols.lo; q <= cols.hi; ++q) sum += __fmul_rn(dy[(nc * P + p) * Q + q], inv_area);
    dx[i] = sum;
  }
}

// One warp per (n, c) plane: lanes sum strided floats, double across lanes (the CPU: float chunks,
// double across chunks).
__global__ void global_avgpool_forward_kernel(float* y, const float* x, int64_t planes, int64_t HW) {
  const int lane = threadIdx.x & 31;
  const double inv_hw = 1.0 / static_cast<double>(HW);
  for (int64_t nc = global_thread() >> 5; nc < planes; nc += grid_threads() >> 5) {
    const float* xp = x + nc * HW;
    float sum = 0.f;
    for (int64_t i = lane; i < HW; i += 32) sum += xp[i];
    const double total = warp_sum(static_cast<double>(sum));
    if (lane == 0) y[nc] = static_cast<float>(total * inv_hw);
  }
}

__global__ void global_avgpool_backward_kernel(float* dx, const float* dy, int64_t n, int64_t HW, float inv_hw) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dx[i] = dy[i / HW] * inv_hw;
}

}  // namespace

void maxpool2d_forward(float* y, uint8_t* argmax, const float* x, const Pool2dShape& s, cudaStream_t cuda_stream) {
  cpu::check_pool_shape(s);
  ACTLAB_CHECK(s.R * s.S <= 256, "maxpool2d: window ", s.R, "x", s.S,
               " has more than 256 positions; the u8 argmax cannot index it");
  const int64_t P = s.P(), Q = s.Q();
  maxpool_forward_kernel<<<grid_blocks(s.N * s.C * P * Q), kBlockThreads, 0, cuda_stream>>>(y, argmax, x, s, P, Q);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void maxpool2d_backward(float* dx, const float* dy, const uint8_t* argmax, const Pool2dShape& s,
                        cudaStream_t cuda_stream) {
  cpu::check_pool_shape(s);
  maxpool_backward_kernel<<<grid_blocks(s.N * s.C * s.H * s.W), kBlockThreads, 0, cuda_stream>>>(dx, dy, argmax, s,
                                                                                           s.P(), s.Q());
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void avgpool2d_forward(float* y, const float* x, const Pool2dShape& s, cudaStream_t cuda_stream) {
  cpu::check_pool_shape(s);
  const int64_t P = s.P(), Q = s.Q();
  const float inv_area = 1.f / static_cast<float>(s.R * s.S);
  avgpool_forward_kernel<<<grid_blocks(s.N * s.C * P * Q), kBlockThreads, 0, cuda_stream>>>(y, x, s, P, Q, inv_area);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void avgpool2d_backward(float* dx, const float* dy, const Pool2dShape& s, cudaStream_t cuda_stream) {
  cpu::check_pool_shape(s);
  const float inv_area = 1.f / static_cast<float>(s.R * s.S);
  avgpool_backward_kernel<<<grid_blocks(s.N * s.C * s.H * s.W), kBlockThreads, 0, cuda_stream>>>(dx, dy, s, s.P(), s.Q(),
                                                                                           inv_area);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void global_avgpool_forward(float* y, const float* x, int64_t N, int64_t C, int64_t HW, cudaStream_t cuda_stream) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "global_avgpool: sizes must be positive, got N=", N, " C=", C, " HW=", HW);
  global_avgpool_forward_kernel<<<grid_blocks(N * C * 32), kBlockThreads, 0, cuda_stream>>>(y, x, N * C, HW);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void global_avgpool_backward(float* dx, const float* dy, int64_t N, int64_t C, int64_t HW, cudaStream_t cuda_stream) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "global_avgpool: sizes must be positive, got N=", N, " C=", C, " HW=", HW);
  const int64_t n = N * C * HW;
  global_avgpool_backward_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, dy, n, HW,
                                                                              1.f / static_cast<float>(HW));
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
