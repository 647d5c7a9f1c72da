// CUDA batch norm 2-D: training forward (batch statistics + running update), inference forward and the
// two backwards, as three small steps each: per-(channel, slice) partial sums (float per thread, double
// across threads), a per-channel finalize in double (the CPU's formulas, core/cpu/kernels_norm.cpp), and
// one element-wise apply. Own kernels rather than cuDNN's batch norm: the CPU's arithmetic plan (shifted
// one-pass moments, x_hat recomputed from a possibly lossy x) is kept and parity is testable.
// Contracts in core/cuda/kernels.h; tested in tests/test_cuda_ops.cpp.
#include <cmath>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

// Each (channel, slice) block sums about this many values: enough work per block, and every thread's
// float partial stays a short sum (~kSliceElems / kBlockThreads values).
constexpr int64_t kSliceElems = 16384;
constexpr int kMaxSlices = 1024;

struct Slicing {
  int64_t N, C, HW;
  int slices;  // slices of the batch per channel: block (c, s) owns images [s·N/slices, (s+1)·N/slices)
};

Slicing make_slicing(int64_t N, int64_t C, int64_t HW) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "batchnorm: sizes must be positive, got N=", N, " C=", C, " HW=", HW);
  ACTLAB_CHECK(C <= INT32_MAX, "batchnorm: ", C, " channels are more than one grid dimension holds");
  const int64_t wanted = (N * HW + kSliceElems - 1) / kSliceElems;
  return {N, C, HW, static_cast<int>(std::min<int64_t>({wanted, N, kMaxSlices}))};
}

// Σ (x - shift) and Σ (x - shift)² of channel c (shift = its first value, as on the CPU).
struct Moments {
  const float* x;
  __device__ float2 operator()(int64_t c, int64_t off, int64_t HW) const {
    const float d = x[off] - x[c * HW];
    return make_float2(d, d * d);
  }
};
// Σ dy and Σ dy·(x - mean_c).
struct GradSums {
  const float* dy;
  const float* x;
  const float* mean;
  __device__ float2 operator()(int64_t c, int64_t off, int64_t) const {
    const float g = dy[off];
    return make_float2(g, g * (x[off] - mean[c]));
  }
};

// partial[(c·slices + s)·2 + {0,1}] = the two sums of `Pair` over block (c, s)'s values, in double.
template <typename Pair>
__global__ void channel_partials(double* partial, Slicing sl, Pair pair) {
  __shared__ double scratch[32];
  const int64_t c = blockIdx.x, s = blockIdx.y;
  const int64_t n0 = s * sl.N / sl.slices, n1 = (s + 1) * sl.N / sl.slices;
  const int64_t count = (n1 - n0) * sl.HW;
  float a = 0.f, b = 0.f;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t n = n0 + j / sl.HW, i = j % sl.HW;
    const float2 v = pair(c, (n * sl.C + c) * sl.HW + i, sl.HW);
    a += v.x;
    b += v.y;
  }
  const double sum_a = block_sum(static_cast<double>(a), scratch);
  const double sum_b = block_sum(static_cast<double>(b), scratch);
  if (threadIdx.x == 0) {
    partial[(c * sl.slices + s) * 2] = sum_a;
    partial[(c * sl.slices + s) * 2 + 1] = sum_b;
  }
}

__device__ double2 channel_total(const double* partial, int64_t c, int slices) {
  double a = 0.0, b = 0.0;
  for (int s = 0; s < slices; ++s) {  // a fixed order: results do not depend on scheduling
    a += partial[(c * slices + s) * 2];
    b += partial[(c * slices + s) * 2 + 1];
  }
  return make_double2(a, b);
}

// Σ x, and Σ (x - center_c)² (synchronized batch norm's two rounds; the second value of each pair unused).
struct Sums {
  const float* x;
  __device__ float2 operator()(int64_t, int64_t off, int64_t) const { return make_float2(x[off], 0.f); }
};
struct SquareDeviations {
  const float* x;
  const double* center;
  __device__ float2 operator()(int64_t c, int64_t off, int64_t) const {
    const float d = static_cast<float>(static_cast<double>(x[off]) - center[c]);
    return make_float2(d * d, 0.f);
  }
};

// sums[c] = the first total of channel c and, when `both`, sums[C + c] = the second.
__global__ void channel_totals(double* sums, const double* partial, Slicing sl, bool both) {
  const int64_t c = global_thread();
  if (c >= sl.C) return;
  const double2 t = channel_total(partial, c, sl.slices);
  sums[c] = t.x;
  if (both) sums[sl.C + c] = t.y;
}

// Channel c's coefficients of dx = a·dy + k·(x - mean) + b (coef = [a | k | b]) from its sums Σ dy and
// Σ dy·(x - mean) over `count` values: the CPU's channel_dx_from_sums (gamma may be nullptr).
__device__ void dx_coefficients(float* coef, int64_t c, int64_t C, const float* gamma, const float* save_invstd,
                                double sum_dy, double sum_dy_xc, double count) {
  const double inv_m = 1.0 / count, invstd = save_invstd[c];
  const double a = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * invstd;
  coef[c] = static_cast<float>(a);
  coef[C + c] = static_cast<float>(-a * invstd * invstd * sum_dy_xc * inv_m);
  coef[2 * C + c] = static_cast<float>(-a * sum_dy * inv_m);
}

// The same from sums already totalled (synchronized batch norm's all-reduced ones).
__global__ void finalize_from_sums(float* coef, const double* sums, const float* gamma, const float* save_invstd,
                                   int64_t C, double count) {
  const int64_t c = global_thread();
  if (c >= C) return;
  dx_coefficients(coef, c, C, gamma, save_invstd, sums[c], sums[C + c], count);
}

// Per-channel coefficients of the apply step y = (x - shift)·scale + bias: coef = [shift | scale | bias].
__global__ void finalize_train(float* coef, float* save_mean, float* save_invstd, float* running_mean,
                               float* running_var, const double* partial, const float* x, const float* gamma,
                               const float* beta, Slicing sl, float momentum, float eps) {
  const int64_t c = global_thread();
  if (c >= sl.C) return;
  const double2 t = channel_total(partial, c, sl.slices);
  const double M = static_cast<double>(sl.N * sl.HW);
  const double mean_shifted = t.x / M;
  const double var = fmax(0.0, t.y / M - mean_shifted * mean_shifted);  // biased
  const double mean = static_cast<double>(x[c * sl.HW]) + mean_shifted;
  const double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
  save_mean[c] = static_cast<float>(mean);
  save_invstd[c] = static_cast<float>(invstd);
  if (running_mean != nullptr) {
    const double var_unbiased = var * M / (M - 1.0);
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var_unbiased);
  }
  coef[c] = static_cast<float>(mean);
  coef[sl.C + c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
  coef[2 * sl.C + c] = beta[c];
}

__global__ void finalize_eval(float* coef, const float* gamma, const float* beta, const float* running_mean,
                              const float* running_var, int64_t C, float eps) {
  const int64_t c = global_thread();
  if (c >= C) return;
  coef[c] = running_mean[c];
  coef[C + c] = static_cast<float>(gamma[c] / sqrt(static_cast<double>(running_var[c]) + eps));
  coef[2 * C + c] = beta[c];
}

// Backward coefficients of dx = a·dy + k·(x - mean) + b: coef = [a | k | b]; also dgamma and dbeta.
__global__ void finalize_backward(float* coef, float* dgamma, float* dbeta, const double* partial,
                                  const float* gamma, const float* save_invstd, Slicing sl) {
  const int64_t c = global_thread();
  if (c >= sl.C) return;
  const double2 t = channel_total(partial, c, sl.slices);  // (Σ dy, Σ dy·(x - mean))
  dbeta[c] = static_cast<float>(t.x);
  dgamma[c] = static_cast<float>(t.y * static_cast<double>(save_invstd[c]));
  dx_coefficients(coef, c, sl.C, gamma, save_invstd, t.x, t.y, static_cast<double>(sl.N * sl.HW));
}

// Eval backward: dx = dy·gamma·invstd (coef = [0 | scale | 0]); dgamma, dbeta from the sums.
__global__ void finalize_backward_eval(float* coef, float* dgamma, float* dbeta, const double* partial,
                                       const float* gamma, const float* running_var, Slicing sl, float eps) {
  const int64_t c = global_thread();
  if (c >= sl.C) return;
  const double2 t = channel_total(partial, c, sl.slices);
  const double invstd = 1.0 / sqrt(static_cast<double>(running_var[c]) + eps);
  dbeta[c] = static_cast<float>(t.x);
  dgamma[c] = static_cast<float>(t.y * invstd);
  coef[c] = 0.f;
  coef[sl.C + c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
  coef[2 * sl.C + c] = 0.f;
}

// y = (x - shift_c)·scale_c + bias_c with coef = [shift | scale | bias]. y may alias x.
__global__ void channel_affine(float* y, const float* x, const float* coef, int64_t C, int64_t HW, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t c = (i / HW) % C;
    y[i] = (x[i] - coef[c]) * coef[C + c] + coef[2 * C + c];
  }
}

// dx = a_c·dy + k_c·(x - mean_c) + b_c with coef = [a | k | b].
__global__ void backward_dx(float* dx, const float* dy, const float* x, const float* mean, const float* coef,
                            int64_t C, int64_t HW, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t c = (i / HW) % C;
    dx[i] = coef[c] * dy[i] + coef[C + c] * (x[i] - mean[c]) + coef[2 * C + c];
  }
}

// Scratch of one call: the partial sums and the three coefficient vectors (freed in stream order).
struct Scratch {
  Buffer partial, coef;
  Scratch(const Slicing& sl, int device)
      : partial(static_cast<size_t>(sl.C * sl.slices * 2) * sizeof(double), MemTag::Workspace, Device::cuda(device)),
        coef(static_cast<size_t>(3 * sl.C) * sizeof(float), MemTag::Workspace, Device::cuda(device)) {}
};

template <typename Pair>
void launch_partials(double* partial, const Slicing& sl, Pair pair, cudaStream_t cuda_stream) {
  channel_partials<<<dim3(static_cast<unsigned>(sl.C), static_cast<unsigned>(sl.slices)), kBlockThreads, 0,
                     cuda_stream>>>(partial, sl, pair);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void launch_affine(float* y, const float* x, const float* coef, const Slicing& sl, cudaStream_t cuda_stream) {
  const int64_t n = sl.N * sl.C * sl.HW;
  channel_affine<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(y, x, coef, sl.C, sl.HW, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void batchnorm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma, const float* beta, int64_t N,
                             int64_t C, int64_t HW, float momentum, float eps, int device, cudaStream_t cuda_stream) {
  const Slicing sl = make_slicing(N, C, HW);
  ACTLAB_CHECK(N * HW > 1, "batchnorm (training): need more than 1 value per channel, got N=", N, " HW=", HW);
  ACTLAB_CHECK((running_mean == nullptr) == (running_var == nullptr),
               "batchnorm: running_mean and running_var must both be given or both be nullptr");
  Scratch scratch(sl, device);
  double* partial = scratch.partial.as<double>();
  float* coef = scratch.coef.as<float>();
  launch_partials(partial, sl, Moments{x}, cuda_stream);
  finalize_train<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(coef, save_mean, save_invstd, running_mean,
                                                               running_var, partial, x, gamma, beta, sl, momentum,
                                                               eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
  launch_affine(y, x, coef, sl, cuda_stream);
}

void batchnorm_forward_eval(float* y, const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, int64_t N, int64_t C, int64_t HW, float eps, int device,
                            cudaStream_t cuda_stream) {
  const Slicing sl = make_slicing(N, C, HW);
  Buffer coef(static_cast<size_t>(3 * C) * sizeof(float), MemTag::Workspace, Device::cuda(device));
  finalize_eval<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(coef.as<float>(), gamma, beta, running_mean,
                                                              running_var, C, eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
  launch_affine(y, x, coef.as<float>(), sl, cuda_stream);
}

void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* gamma,
                        const float* save_mean, const float* save_invstd, int64_t N, int64_t C, int64_t HW,
                        int device, cudaStream_t cuda_stream) {
  const Slicing sl = make_slicing(N, C, HW);
  Scratch scratch(sl, device);
  double* partial = scratch.partial.as<double>();
  float* coef = scratch.coef.as<float>();
  launch_partials(partial, sl, GradSums{dy, x, save_mean}, cuda_stream);
  finalize_backward<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(coef, dgamma, dbeta, partial, gamma, save_invstd,
                                                                  sl);
  ACTLAB_CUDA_CHECK_LAUNCH();
  const int64_t n = N * C * HW;
  backward_dx<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, dy, x, save_mean, coef, C, HW, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void batchnorm_backward_eval(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                             const float* gamma, const float* running_mean, const float* running_var, int64_t N,
                             int64_t C, int64_t HW, float eps, int device, cudaStream_t cuda_stream) {
  const Slicing sl = make_slicing(N, C, HW);
  Scratch scratch(sl, device);
  double* partial = scratch.partial.as<double>();
  float* coef = scratch.coef.as<float>();
  launch_partials(partial, sl, GradSums{dy, x, running_mean}, cuda_stream);
  finalize_backward_eval<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(coef, dgamma, dbeta, partial, gamma,
                                                                       running_var, sl, eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
  launch_affine(dx, dy, coef, sl, cuda_stream);
}

namespace {
template <typename Pair>
void channel_sums_of(double* sums, Pair pair, bool both, int64_t N, int64_t C, int64_t HW, int device,
                     cudaStream_t cuda_stream) {
  const Slicing sl = make_slicing(N, C, HW);
  Buffer partial(static_cast<size_t>(sl.C * sl.slices * 2) * sizeof(double), MemTag::Workspace, Device::cuda(device));
  launch_partials(partial.as<double>(), sl, pair, cuda_stream);
  channel_totals<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(sums, partial.as<double>(), sl, both);
  ACTLAB_CUDA_CHECK_LAUNCH();
}
}  // namespace

void channel_sums(double* sums, const float* x, int64_t N, int64_t C, int64_t HW, int device, cudaStream_t cuda_stream) {
  channel_sums_of(sums, Sums{x}, false, N, C, HW, device, cuda_stream);
}

void channel_square_deviations(double* sums, const float* x, const double* center, int64_t N, int64_t C, int64_t HW,
                               int device, cudaStream_t cuda_stream) {
  channel_sums_of(sums, SquareDeviations{x, center}, false, N, C, HW, device, cuda_stream);
}

void batchnorm_grad_sums(double* sums, const float* dy, const float* x, const float* save_mean, int64_t N, int64_t C,
                         int64_t HW, int device, cudaStream_t cuda_stream) {
  channel_sums_of(sums, GradSums{dy, x, save_mean}, true, N, C, HW, device, cuda_stream);
}

void batchnorm_backward_from_sums(float* dx, const float* dy, const float* x, const float* gamma, const float* save_mean,
                                  const float* save_invstd, const double* sums, double count, int64_t N, int64_t C,
                                  int64_t HW, int device, cudaStream_t cuda_stream) {
  make_slicing(N, C, HW);  // the size checks
  Buffer coef(static_cast<size_t>(3 * C) * sizeof(float), MemTag::Workspace, Device::cuda(device));
  finalize_from_sums<<<grid_blocks(C), kBlockThreads, 0, cuda_stream>>>(coef.as<float>(), sums, gamma, save_invstd, C,
                                                                   count);
  ACTLAB_CUDA_CHECK_LAUNCH();
  const int64_t n = N * C * HW;
  backward_dx<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(dx, dy, x, save_mean, coef.as<float>(), C, HW, n);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
