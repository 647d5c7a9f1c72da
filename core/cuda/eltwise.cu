// CUDA element-wise kernels: ReLU / ReLU6 / add+ReLU with 1-bit masks, masked scale (their backward and
// dropout's), add, axpy, scale, Philox dropout, the "option A" shortcut and the finiteness check.
// Contracts in core/cuda/kernels.h (CPU twins: core/cpu/kernels_eltwise.cpp); tested in
// tests/test_cuda_ops.cpp. Mask kernels give each warp one 32-element mask word: lane j handles element
// 32·w + j and __ballot_sync assembles the word with bit j = lane j, exactly the CPU's LSB-first layout.
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"
#include "actlab/core/philox.h"

namespace actlab::cuda {
namespace {

// mask word w of an n-element mask = ballot of elem(i) over its 32 elements; elem also writes the output.
// The loop bound is warp-uniform, so every lane reaches the ballot.
template <typename Elem>
__device__ __forceinline__ void mask_words(uint32_t* mask, int64_t n, Elem elem) {
  const int lane = threadIdx.x & 31;
  const int64_t words = (n + 31) / 32;
  for (int64_t w = global_thread() >> 5; w < words; w += grid_threads() >> 5) {
    const int64_t i = w * 32 + lane;
    const bool bit = i < n && elem(i);
    const uint32_t bits = __ballot_sync(0xffffffffu, bit);
    if (lane == 0) mask[w] = bits;
  }
}

// The CPU's ReLU: (v <= 0) ? 0 : v keeps NaN; the bit (v > 0) is 0 for NaN.
__global__ void relu_kernel(float* y, uint32_t* mask, const float* x, int64_t n) {
  mask_words(mask, n, [=](int64_t i) {
    const float v = x[i];
    y[i] = v <= 0.f ? 0.f : v;
    return v > 0.f;
  });
}

__global__ void relu6_kernel(float* y, uint32_t* mask, const float* x, int64_t n) {
  mask_words(mask, n, [=](int64_t i) {
    const float v = x[i];
    y[i] = v <= 0.f ? 0.f : (v >= 6.f ? 6.f : v);  // NaN fails both tests and passes
    return v > 0.f && v < 6.f;
  });
}

__global__ void add_relu_kernel(float* y, uint32_t* mask, const float* a, const float* b, int64_t n) {
  mask_words(mask, n, [=](int64_t i) {
    const float v = a[i] + b[i];
    y[i] = v <= 0.f ? 0.f : v;
    return v > 0.f;
  });
}

__global__ void masked_scale_kernel(float* dx, const uint32_t* mask, const float* dy, int64_t n, float scale) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = (mask[i >> 5] >> (i & 31)) & 1u ? dy[i] * scale : 0.f;
}

__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = a[i] + b[i];
}

__global__ void axpy_kernel(float* y, const float* x, float alpha, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] += alpha * x[i];
}

__global__ void scale_kernel(float* y, float value, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] *= value;
}

// Each lane draws philox_uniform(seed, stream, i) for its own element: the CPU's numbers, in any order.
__global__ void dropout_kernel(float* y, uint32_t* keep_mask, const float* x, int64_t n, float p, float scale,
                               uint64_t seed, uint64_t subsequence) {
  mask_words(keep_mask, n, [=](int64_t i) {
    const bool keep = philox_uniform(seed, subsequence, static_cast<uint64_t>(i)) >= p;
    y[i] = keep ? x[i] * scale : 0.f;
    return keep;
  });
}

__global__ void shortcut_forward_kernel(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                        int64_t stride, int64_t C_out, int64_t Ho, int64_t Wo) {
  const int64_t total = N * C_out * Ho * Wo, pad_front = (C_out - C_in) / 2;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t w = i % Wo, h = (i / Wo) % Ho, nc = i / (Ho * Wo);
    const int64_t n = nc / C_out, c = nc % C_out - pad_front;
    y[i] = (c < 0 || c >= C_in) ? 0.f : x[((n * C_in + c) * H + h * stride) * W + w * stride];
  }
}

__global__ void shortcut_backward_kernel(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                         int64_t stride, int64_t C_out, int64_t Ho, int64_t Wo) {
  const int64_t total = N * C_in * H * W, pad_front = (C_out - C_in) / 2;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t w = i % W, h = (i / W) % H, nc = i / (H * W);
    const int64_t n = nc / C_in, c = nc % C_in;
    const bool hit = h % stride == 0 && w % stride == 0;
    dx[i] = hit ? dy[((n * C_out + c + pad_front) * Ho + h / stride) * Wo + w / stride] : 0.f;
  }
}

// *any_bad becomes 1 when some element is not finite (only 1s are ever written: no ordering needed).
__global__ void all_finite_kernel(int* any_bad, const float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    if (!isfinite(x[i])) *any_bad = 1;
}

void check_count(const char* op, int64_t n) { ACTLAB_CHECK(n >= 0, "cuda::", op, ": negative element count ", n); }

void check_shortcut(int64_t N, int64_t C_in, int64_t H, int64_t W, int64_t stride, int64_t C_out) {
  ACTLAB_CHECK(N > 0 && C_in > 0 && H > 0 && W > 0 && stride >= 1 && C_out >= C_in, "shortcut_pad: bad sizes N=",
               N, " C_in=", C_in, " H=", H, " W=", W, " stride=", stride, " C_out=", C_out);
}

}  // namespace

void relu_forward(float* y, uint32_t* mask, const float* x, int64_t n, cudaStream_t cuda_stream) {
  check_count("relu_forward", n);
  if (n == 0) return;
  relu_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, mask, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void relu6_forward(float* y, uint32_t* mask, const float* x, int64_t n, cudaStream_t cuda_stream) {
  check_count("relu6_forward", n);
  if (n == 0) return;
  relu6_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, mask, x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void add_relu_forward(float* y, uint32_t* mask, const float* a, const float* b, int64_t n, cudaStream_t cuda_stream) {
  check_count("add_relu_forward", n);
  if (n == 0) return;
  add_relu_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, mask, a, b, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void masked_scale(float* dx, const uint32_t* mask, const float* dy, int64_t n, float scale, cudaStream_t cuda_stream) {
  check_count("masked_scale", n);
  if (n == 0) return;
  masked_scale_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, mask, dy, n, scale);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void add(float* y, const float* a, const float* b, int64_t n, cudaStream_t cuda_stream) {
  check_count("add", n);
  if (n == 0) return;
  add_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, a, b, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void axpy(float* y, const float* x, float alpha, int64_t n, cudaStream_t cuda_stream) {
  check_count("axpy", n);
  if (n == 0) return;
  axpy_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, alpha, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void scale(float* y, float value, int64_t n, cudaStream_t cuda_stream) {
  check_count("scale", n);
  if (n == 0) return;
  scale_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, value, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void dropout_forward(float* y, uint32_t* keep_mask, const float* x, int64_t n, float p, uint64_t seed,
                     uint64_t subsequence, cudaStream_t cuda_stream) {
  check_count("dropout_forward", n);
  ACTLAB_CHECK(p >= 0.f && p <= 1.f, "dropout: p must be in [0, 1], got ", p);
  if (n == 0) return;
  const float scale = p < 1.f ? 1.f / (1.f - p) : 0.f;
  dropout_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, keep_mask, x, n, p, scale, seed, subsequence);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void shortcut_pad_forward(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W, int64_t stride,
                          int64_t C_out, cudaStream_t cuda_stream) {
  check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = (H + stride - 1) / stride, Wo = (W + stride - 1) / stride;
  shortcut_forward_kernel<<<grid_blocks(N * C_out * Ho * Wo), kBlockThreads, 0, cuda_stream>>>(y, x, N, C_in, H, W,
                                                                                          stride, C_out, Ho, Wo);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void shortcut_pad_backward(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H, int64_t W,
                           int64_t stride, int64_t C_out, cudaStream_t cuda_stream) {
  check_shortcut(N, C_in, H, W, stride, C_out);
  const int64_t Ho = (H + stride - 1) / stride, Wo = (W + stride - 1) / stride;
  shortcut_backward_kernel<<<grid_blocks(N * C_in * H * W), kBlockThreads, 0, cuda_stream>>>(dx, dy, N, C_in, H, W,
                                                                                        stride, C_out, Ho, Wo);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

bool all_finite(const float* x, int64_t n, int device, cudaStream_t cuda_stream) {
  check_count("all_finite", n);
  if (n == 0) return true;
  Buffer flag(sizeof(int), MemTag::Workspace, Device::cuda(device));
  ACTLAB_CUDA_CHECK(cudaMemsetAsync(flag.data(), 0, sizeof(int), cuda_stream));
  all_finite_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(flag.as<int>(), x, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
  int any_bad = 0;
  ACTLAB_CUDA_CHECK(cudaMemcpyAsync(&any_bad, flag.data(), sizeof(int), cudaMemcpyDeviceToHost, cuda_stream));
  ACTLAB_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  return any_bad == 0;
}

void all_finite_each(bool* finite, const float* const* xs, const int64_t* ns, int count, int device,
                     cudaStream_t cuda_stream) {
  ACTLAB_CHECK(count >= 0, "cuda::all_finite_each: negative count ", count);
  if (count == 0) return;
  Buffer flags(sizeof(int) * static_cast<size_t>(count), MemTag::Workspace, Device::cuda(device));
  ACTLAB_CUDA_CHECK(cudaMemsetAsync(flags.data(), 0, sizeof(int) * static_cast<size_t>(count), cuda_stream));
  for (int i = 0; i < count; ++i) {
    check_count("all_finite_each", ns[i]);
    if (ns[i] == 0) continue;
    all_finite_kernel<<<grid_blocks(ns[i]), kBlockThreads, 0, cuda_stream>>>(flags.as<int>() + i, xs[i], ns[i]);
    ACTLAB_CUDA_CHECK_LAUNCH();
  }
  std::vector<int> any_bad(static_cast<size_t>(count), 0);
  ACTLAB_CUDA_CHECK(cudaMemcpyAsync(any_bad.data(), flags.data(), sizeof(int) * static_cast<size_t>(count),
                                    cudaMemcpyDeviceToHost, cuda_stream));
  ACTLAB_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  for (int i = 0; i < count; ++i) finite[i] = any_bad[static_cast<size_t>(i)] == 0;
}

}  // namespace actlab::cuda
