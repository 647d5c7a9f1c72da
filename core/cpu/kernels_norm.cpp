// CPU batch norm 2-D: training forward (batch statistics + running update), inference forward and
// the two backwards. Contracts in core/cpu/kernels.h; tested in tests/test_cpu_kernels.cpp.
// Work is split over channels: one thread owns a channel's N planes for the statistics pass and the
// apply pass, so the second pass finds the channel still in L2. The per-channel loops are
// ACTLAB_CPU_CLONES functions (AVX2/AVX-512 where the CPU has them).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>

#include "actlab/core/allocator.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

// Inner sums run in float (vectorized) over chunks of this many values, then go to double: the
// float error stays bounded by the chunk length however large the plane or the batch is.
constexpr int64_t kChunk = 2048;

// Σ (x - shift) and Σ (x - shift)² over one channel. The shift (any value of the channel) keeps
// the one-pass variance free of the cancellation E[x²] - E[x]² suffers when |mean| >> std.
ACTLAB_CPU_CLONES void channel_moments(double& sum, double& sum_sq, const float* x, int64_t N,
                                       int64_t C, int64_t HW, int64_t c, float shift) {
  sum = 0.0;
  sum_sq = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* plane = x + (n * C + c) * HW;
    for (int64_t i0 = 0; i0 < HW; i0 += kChunk) {
      const int64_t i1 = std::min(HW, i0 + kChunk);
      float s = 0.f, ss = 0.f;
#pragma omp simd reduction(+ : s, ss)
      for (int64_t i = i0; i < i1; ++i) {
        const float d = plane[i] - shift;
        s += d;
        ss += d * d;
      }
      sum += s;
      sum_sq += ss;
    }
  }
}

// y = (x - shift)·scale + bias over one channel's N planes. Subtracting the mean first (rather than
// folding it into bias) avoids cancellation when |mean| >> std; the loop is memory-bound anyway.
ACTLAB_CPU_CLONES void channel_affine(float* y, const float* x, int64_t N, int64_t C, int64_t HW,
                                      int64_t c, float shift, float scale, float bias) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t off = (n * C + c) * HW;
    const float* xp = x + off;
    float* yp = y + off;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) yp[i] = (xp[i] - shift) * scale + bias;
  }
}

// Σ dy and Σ dy·(x - mean) over one channel, in one pass. Plane n of the channel's x is at
// xc + n·x_step (x_step = C·HW inside an (N, C, HW) tensor, HW for one decoded channel).
ACTLAB_CPU_CLONES void channel_grad_sums(double& sum_dy, double& sum_dy_xc, const float* dy,
                                         const float* xc, int64_t x_step, int64_t N, int64_t C,
                                         int64_t HW, int64_t c, float mean) {
  sum_dy = 0.0;
  sum_dy_xc = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* dyp = dy + (n * C + c) * HW;
    const float* xp = xc + n * x_step;
    for (int64_t i0 = 0; i0 < HW; i0 += kChunk) {
      const int64_t i1 = std::min(HW, i0 + kChunk);
      float s = 0.f, sx = 0.f;
#pragma omp simd reduction(+ : s, sx)
      for (int64_t i = i0; i < i1; ++i) {
        s += dyp[i];
        sx += dyp[i] * (xp[i] - mean);
      }
      sum_dy += s;
      sum_dy_xc += sx;
    }
  }
}

// dx = a·dy + k·(x - mean) + b over one channel's N planes (x as in channel_grad_sums).
ACTLAB_CPU_CLONES void channel_backward_dx(float* dx, const float* dy, const float* xc, int64_t x_step,
                                           int64_t N, int64_t C, int64_t HW, int64_t c, float mean,
                                           float a, float k, float b) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t off = (n * C + c) * HW;
    const float* dyp = dy + off;
    const float* xp = xc + n * x_step;
    float* dxp = dx + off;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) dxp[i] = a * dyp[i] + k * (xp[i] - mean) + b;
  }
}

// Channel c's input gradient from its sums Σdy and Σdy·(x - mean) over M = count values (this batch's,
// or the global batch's under synchronized batch norm), x as in channel_grad_sums.
void channel_dx_from_sums(float* dx, const float* dy, const float* xc, int64_t x_step, const float* gamma,
                          const float* save_mean, const float* save_invstd, double sum_dy, double sum_dy_xc,
                          double count, int64_t N, int64_t C, int64_t HW, int64_t c) {
  const double inv_m = 1.0 / count;
  const double invstd = save_invstd[c];
  // dx = a·dy + k·(x - mean) + b with a = gamma·invstd, k = -a·invstd²·Σdy(x-mean)/M,
  // b = -a·Σdy/M: the x_hat·dgamma/M term rewritten on (x - mean) so it needs no x_hat buffer.
  const double a = (gamma ? gamma[c] : 1.0) * invstd;
  const float af = static_cast<float>(a);
  const float kf = static_cast<float>(-a * invstd * invstd * sum_dy_xc * inv_m);
  const float bf = static_cast<float>(-a * sum_dy * inv_m);
  channel_backward_dx(dx, dy, xc, x_step, N, C, HW, c, save_mean[c], af, kf, bf);
}

// The training backward of channel c (batchnorm_backward's contract), x as in channel_grad_sums.
void channel_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xc,
                      int64_t x_step, const float* gamma, const float* save_mean,
                      const float* save_invstd, int64_t N, int64_t C, int64_t HW, int64_t c) {
  double sum_dy, sum_dy_xc;
  channel_grad_sums(sum_dy, sum_dy_xc, dy, xc, x_step, N, C, HW, c, save_mean[c]);
  if (dbeta) dbeta[c] = static_cast<float>(sum_dy);
  if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xc * save_invstd[c]);
  channel_dx_from_sums(dx, dy, xc, x_step, gamma, save_mean, save_invstd, sum_dy, sum_dy_xc,
                       static_cast<double>(N * HW), N, C, HW, c);
}

void check_bn_sizes(int64_t N, int64_t C, int64_t HW) {
  ACTLAB_CHECK(N > 0 && C > 0 && HW > 0, "batchnorm: sizes must be positive, got N=", N, " C=", C,
               " HW=", HW);
}

}  // namespace

void batchnorm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma,
                             const float* beta, int64_t N, int64_t C, int64_t HW, float momentum,
                             float eps) {
  check_bn_sizes(N, C, HW);
  const int64_t M = N * HW;
  ACTLAB_CHECK(M > 1, "batchnorm (training): need more than 1 value per channel, got N=", N,
               " HW=", HW);
  ACTLAB_CHECK((running_mean == nullptr) == (running_var == nullptr),
               "batchnorm: running_mean and running_var must both be given or both be nullptr");
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c) {
    const float shift = x[c * HW];  // first value of the channel (n = 0, i = 0)
    double sum, sum_sq;
    channel_moments(sum, sum_sq, x, N, C, HW, c, shift);
    const double mean_shifted = sum / M;
    const double var = std::max(0.0, sum_sq / M - mean_shifted * mean_shifted);  // biased
    const double mean = shift + mean_shifted;
    const double invstd = 1.0 / std::sqrt(var + eps);
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    if (running_mean) {
      const double var_unbiased = var * M / (M - 1);
      running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] =
          static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var_unbiased);
    }
    const double g = gamma ? gamma[c] : 1.0;
    const double b = beta ? beta[c] : 0.0;
    channel_affine(y, x, N, C, HW, c, static_cast<float>(mean), static_cast<float>(g * invstd),
                   static_cast<float>(b));
  }
}

void batchnorm_forward_eval(float* y, const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, int64_t N,
                            int64_t C, int64_t HW, float eps) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c) {
    const double g = gamma ? gamma[c] : 1.0;
    const float scale =
        static_cast<float>(g / std::sqrt(static_cast<double>(running_var[c]) + eps));
    channel_affine(y, x, N, C, HW, c, running_mean[c], scale, beta ? beta[c] : 0.f);
  }
}

void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        int64_t N, int64_t C, int64_t HW) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c)
    channel_backward(dx, dgamma, dbeta, dy, x + c * HW, C * HW, gamma, save_mean, save_invstd, N, C, HW, c);
}

void batchnorm_grad_sums(double* sum_dy, double* sum_dy_xc, const float* dy, const float* x, const float* save_mean,
                         int64_t N, int64_t C, int64_t HW) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c)
    channel_grad_sums(sum_dy[c], sum_dy_xc[c], dy, x + c * HW, C * HW, N, C, HW, c, save_mean[c]);
}

namespace {
// sums[c] = Σ over channel c of f(x, c), in double, values in (n, i) order; channels in parallel.
template <typename F>
void channel_double_sums(double* sums, const float* x, int64_t N, int64_t C, int64_t HW, F f) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + (n * C + c) * HW;
      for (int64_t i = 0; i < HW; ++i) sum += f(row[i], c);
    }
    sums[c] = sum;
  }
}
}  // namespace

void channel_sums(double* sums, const float* x, int64_t N, int64_t C, int64_t HW) {
  channel_double_sums(sums, x, N, C, HW, [](float v, int64_t) { return static_cast<double>(v); });
}

void channel_square_deviations(double* sums, const float* x, const double* center, int64_t N, int64_t C, int64_t HW) {
  channel_double_sums(sums, x, N, C, HW, [&](float v, int64_t c) {
    const double d = static_cast<double>(v) - center[c];
    return d * d;
  });
}

void batchnorm_backward_from_sums(float* dx, const float* dy, const float* x, const float* gamma,
                                  const float* save_mean, const float* save_invstd, const double* sum_dy,
                                  const double* sum_dy_xc, double count, int64_t N, int64_t C, int64_t HW) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c)
    channel_dx_from_sums(dx, dy, x + c * HW, C * HW, gamma, save_mean, save_invstd, sum_dy[c], sum_dy_xc[c], count, N,
                         C, HW, c);
}

namespace {

// f(c, xc) for every channel, xc holding channel c's N planes as x_channel wrote them into a per-thread
// buffer (MemTag::Workspace) that stays in cache for what f does with it.
template <typename F>
void for_each_read_channel(const ChannelSource& x_channel, int64_t N, int64_t C, int64_t HW, F f) {
  check_bn_sizes(N, C, HW);
  const bool parallel = N * C * HW >= kParallelGrain;
  const int threads = parallel ? std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(C))) : 1;
  Buffer scratch(static_cast<size_t>(threads * N * HW) * sizeof(float), MemTag::Workspace);
  // An exception must not leave an OpenMP region (that terminates the process): the first one is kept,
  // the remaining channels are skipped, and it is rethrown after the loop (e.g. OutOfMemory from a decoder).
  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel : threads > 1)
  for (int64_t c = 0; c < C; ++c) {
    if (failed.load(std::memory_order_relaxed)) continue;
    try {
      float* xc = scratch.as<float>() + static_cast<int64_t>(omp_get_thread_num()) * N * HW;
      x_channel(c, xc);
      f(c, xc);
    } catch (...) {
#pragma omp critical(actlab_batchnorm_channels)
      if (!error) error = std::current_exception();
      failed = true;
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void batchnorm_backward_channels(float* dx, float* dgamma, float* dbeta, const float* dy,
                                 const ChannelSource& x_channel, const float* gamma,
                                 const float* save_mean, const float* save_invstd, int64_t N, int64_t C,
                                 int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    channel_backward(dx, dgamma, dbeta, dy, xc, HW, gamma, save_mean, save_invstd, N, C, HW, c);
  });
}

void batchnorm_grad_sums_channels(double* sum_dy, double* sum_dy_xc, const float* dy, const ChannelSource& x_channel,
                                  const float* save_mean, int64_t N, int64_t C, int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    channel_grad_sums(sum_dy[c], sum_dy_xc[c], dy, xc, HW, N, C, HW, c, save_mean[c]);
  });
}

void batchnorm_backward_from_sums_channels(float* dx, const float* dy, const ChannelSource& x_channel,
                                           const float* gamma, const float* save_mean, const float* save_invstd,
                                           const double* sum_dy, const double* sum_dy_xc, double count, int64_t N,
                                           int64_t C, int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    channel_dx_from_sums(dx, dy, xc, HW, gamma, save_mean, save_invstd, sum_dy[c], sum_dy_xc[c], count, N, C, HW, c);
  });
}

void batchnorm_backward_eval(float* dx, float* dgamma, float* dbeta, const float* dy,
                             const float* x, const float* gamma, const float* running_mean,
                             const float* running_var, int64_t N, int64_t C, int64_t HW,
                             float eps) {
  check_bn_sizes(N, C, HW);
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t c = 0; c < C; ++c) {
    const float mean = running_mean[c];
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    if (dgamma || dbeta) {
      double sum_dy, sum_dy_xc;
      channel_grad_sums(sum_dy, sum_dy_xc, dy, x + c * HW, C * HW, N, C, HW, c, mean);
      if (dbeta) dbeta[c] = static_cast<float>(sum_dy);
      if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xc * invstd);
    }
    const float scale = static_cast<float>((gamma ? gamma[c] : 1.0) * invstd);
    channel_affine(dx, dy, N, C, HW, c, 0.f, scale, 0.f);
  }
}

}  // namespace actlab::cpu
