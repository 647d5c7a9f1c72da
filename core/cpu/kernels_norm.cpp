// CPU batch norm 2-D: training forward (batch statistics + running update), inference forward and
// the two backwards, and the channel-by-channel bf16 rounding (to_bf16_channels) that shares their loop
// over decoded channels. Contracts in core/cpu/kernels.h; tested in tests/test_cpu_kernels.cpp and
// (to_bf16_channels) tests/test_precision.cpp.
// Work is split over ranges of channels (channel_block): one thread owns a range's N planes for the
// statistics pass and the apply pass, so the second pass finds them still in cache. The decoded-channel
// backwards (x handed over one channel at a time) take ranges of one. The per-channel loops are
// ACTLAB_CPU_CLONES functions (AVX2/AVX-512 where the CPU has them).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/bf16.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

// Inner sums run in float (vectorized) over chunks of this many values, then go to double: the
// float error stays bounded by the chunk length however large the plane or the batch is.
constexpr int64_t kChunk = 2048;

// The per-channel loops below take a range of channels [c0, c1) and visit its planes sample by sample:
// sample n's planes of the range are one run of memory (NCHW), where a channel alone is N planes C·HW
// apart. On 4² and 8² maps that walk read one or four cache lines per page and reduced 16 values at a
// time: batch norm ran at a quarter of memcpy's rate (MobileNetV2 at batch 128, bench/RESULTS.md). Each
// channel's sums still run in (n, chunk) order, so a channel's bits do not depend on the range it is in
// (a range of one is the channel-by-channel walk the decoded-channel paths take).
constexpr int64_t kMaxBlock = 64;
// Channels per range: about 64K values of x (256 KiB; the backward's passes read dy's as well), at least one
// channel (a larger one when its N planes alone are larger), and no more than a thread's share of C, so that
// every thread has a range.
int64_t channel_block(int64_t N, int64_t C, int64_t HW) {
  const int64_t threads = std::max(1, omp_get_max_threads());
  return std::max<int64_t>(1, std::min({(C + threads - 1) / threads, kMaxBlock, int64_t{65536} / (N * HW)}));
}
// f(c0, c1) for every range of channels (channel_block), the ranges in parallel.
template <typename F>
void for_each_range(int64_t N, int64_t C, int64_t HW, F f) {
  const int64_t block = channel_block(N, C, HW), blocks = (C + block - 1) / block;
#pragma omp parallel for schedule(static) if (parallel : N * C * HW >= kParallelGrain)
  for (int64_t r = 0; r < blocks; ++r) f(r * block, std::min(C, r * block + block));
}

// Σ (x - shift) and Σ (x - shift)² over each channel c of [c0, c1) (shift[c - c0]: any value of the
// channel; it keeps the one-pass variance free of the cancellation E[x²] - E[x]² suffers when
// |mean| >> std) → sum[c - c0], sum_sq[c - c0].
ACTLAB_CPU_CLONES void channel_moments(double* sum, double* sum_sq, const float* x, int64_t N, int64_t C, int64_t HW,
                                       int64_t c0, int64_t c1, const float* shift) {
  for (int64_t c = c0; c < c1; ++c) sum[c - c0] = 0.0, sum_sq[c - c0] = 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = c0; c < c1; ++c) {
      const float* plane = x + (n * C + c) * HW;
      const float sh = shift[c - c0];
      for (int64_t i0 = 0; i0 < HW; i0 += kChunk) {
        const int64_t i1 = std::min(HW, i0 + kChunk);
        float s = 0.f, ss = 0.f;
#pragma omp simd reduction(+ : s, ss)
        for (int64_t i = i0; i < i1; ++i) {
          const float d = plane[i] - sh;
          s += d;
          ss += d * d;
        }
        sum[c - c0] += s;
        sum_sq[c - c0] += ss;
      }
    }
}

// y = (x - shift)·scale + bias over the N planes of each channel of [c0, c1) (per-channel values at
// c - c0). Subtracting the mean first (rather than folding it into bias) avoids cancellation when
// |mean| >> std; the loop is memory-bound anyway.
ACTLAB_CPU_CLONES void channel_affine(float* y, const float* x, int64_t N, int64_t C, int64_t HW, int64_t c0,
                                      int64_t c1, const float* shift, const float* scale, const float* bias) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t off = (n * C + c) * HW;
      const float* xp = x + off;
      float* yp = y + off;
      const float sh = shift[c - c0], sc = scale[c - c0], b = bias[c - c0];
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) yp[i] = (xp[i] - sh) * sc + b;
    }
}

// Σ dy and Σ dy·(x - mean) over each channel c of [c0, c1), in one pass → sum_dy[c - c0],
// sum_dy_xc[c - c0]. Plane n of channel c's x is at xc + n·x_step + (c - c0)·HW (xc = x + c0·HW and
// x_step = C·HW inside an (N, C, HW) tensor; x_step = HW for one decoded channel).
ACTLAB_CPU_CLONES void channel_grad_sums(double* sum_dy, double* sum_dy_xc, const float* dy, const float* xc,
                                         int64_t x_step, int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1,
                                         const float* mean) {
  for (int64_t c = c0; c < c1; ++c) sum_dy[c - c0] = 0.0, sum_dy_xc[c - c0] = 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = c0; c < c1; ++c) {
      const float* dyp = dy + (n * C + c) * HW;
      const float* xp = xc + n * x_step + (c - c0) * HW;
      const float m = mean[c - c0];
      for (int64_t i0 = 0; i0 < HW; i0 += kChunk) {
        const int64_t i1 = std::min(HW, i0 + kChunk);
        float s = 0.f, sx = 0.f;
#pragma omp simd reduction(+ : s, sx)
        for (int64_t i = i0; i < i1; ++i) {
          s += dyp[i];
          sx += dyp[i] * (xp[i] - m);
        }
        sum_dy[c - c0] += s;
        sum_dy_xc[c - c0] += sx;
      }
    }
}

// dx = a·dy + k·(x - mean) + b over the N planes of each channel of [c0, c1) (per-channel values at
// c - c0; x as in channel_grad_sums).
ACTLAB_CPU_CLONES void channel_backward_dx(float* dx, const float* dy, const float* xc, int64_t x_step, int64_t N,
                                           int64_t C, int64_t HW, int64_t c0, int64_t c1, const float* mean,
                                           const float* a, const float* k, const float* b) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t off = (n * C + c) * HW;
      const float* dyp = dy + off;
      const float* xp = xc + n * x_step + (c - c0) * HW;
      float* dxp = dx + off;
      const float m = mean[c - c0], ac = a[c - c0], kc = k[c - c0], bc = b[c - c0];
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) dxp[i] = ac * dyp[i] + kc * (xp[i] - m) + bc;
    }
}

// A channel's backward coefficients from its sums over M values (1/M = inv_m): dx = a·dy + k·(x - mean) + b.
void dx_coefficients(double gamma, double invstd, double sum_dy, double sum_dy_xc, double inv_m, float* a, float* k,
                     float* b) {
  const double ad = gamma * invstd;
  *a = static_cast<float>(ad);
  *k = static_cast<float>(-ad * invstd * invstd * sum_dy_xc * inv_m);
  *b = static_cast<float>(-ad * sum_dy * inv_m);
}

// A channel's statistics from Σ(x - shift) and Σ(x - shift)² over M values: save_mean/save_invstd written, the
// running pair updated when given (PyTorch semantics), and the apply pass's mean, scale and bias returned.
struct ChannelApply {
  float mean, scale, bias;
};
ChannelApply channel_statistics(int64_t c, double sum, double sum_sq, float shift, int64_t M, float momentum,
                                float eps, const float* gamma, const float* beta, float* save_mean,
                                float* save_invstd, float* running_mean, float* running_var) {
  const double mean_shifted = sum / M;
  const double var = std::max(0.0, sum_sq / M - mean_shifted * mean_shifted);  // biased
  const double mean = shift + mean_shifted;
  const double invstd = 1.0 / std::sqrt(var + eps);
  save_mean[c] = static_cast<float>(mean);
  save_invstd[c] = static_cast<float>(invstd);
  if (running_mean) {
    const double var_unbiased = var * M / (M - 1);
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * var_unbiased);
  }
  return {static_cast<float>(mean), static_cast<float>((gamma ? gamma[c] : 1.0) * invstd),
          static_cast<float>(beta ? beta[c] : 0.0)};
}

// The input gradient of channels [c0, c1) from their sums Σdy and Σdy·(x - mean) (sum_dy[c - c0],
// sum_dy_xc[c - c0]) over M = count values (this batch's, or the global batch's under synchronized batch norm),
// x as in channel_grad_sums: dx = a·dy + k·(x - mean) + b with a = gamma·invstd, k = -a·invstd²·Σdy(x-mean)/M,
// b = -a·Σdy/M, the x_hat·dgamma/M term rewritten on (x - mean) so it needs no x_hat buffer.
void channel_dx_from_sums(float* dx, const float* dy, const float* xc, int64_t x_step, const float* gamma,
                          const float* save_mean, const float* save_invstd, const double* sum_dy,
                          const double* sum_dy_xc, double count, int64_t N, int64_t C, int64_t HW, int64_t c0,
                          int64_t c1) {
  float a[kMaxBlock], k[kMaxBlock], b[kMaxBlock];
  const double inv_m = 1.0 / count;
  for (int64_t c = c0; c < c1; ++c)
    dx_coefficients(gamma ? gamma[c] : 1.0, save_invstd[c], sum_dy[c - c0], sum_dy_xc[c - c0], inv_m, &a[c - c0],
                    &k[c - c0], &b[c - c0]);
  channel_backward_dx(dx, dy, xc, x_step, N, C, HW, c0, c1, save_mean + c0, a, k, b);
}

// The training backward of channels [c0, c1) (batchnorm_backward's contract), x as in channel_grad_sums.
void channel_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xc,
                      int64_t x_step, const float* gamma, const float* save_mean,
                      const float* save_invstd, int64_t N, int64_t C, int64_t HW, int64_t c0, int64_t c1) {
  double sum_dy[kMaxBlock], sum_dy_xc[kMaxBlock];
  channel_grad_sums(sum_dy, sum_dy_xc, dy, xc, x_step, N, C, HW, c0, c1, save_mean + c0);
  for (int64_t c = c0; c < c1; ++c) {
    if (dbeta) dbeta[c] = static_cast<float>(sum_dy[c - c0]);
    if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xc[c - c0] * save_invstd[c]);
  }
  channel_dx_from_sums(dx, dy, xc, x_step, gamma, save_mean, save_invstd, sum_dy, sum_dy_xc,
                       static_cast<double>(N * HW), N, C, HW, c0, c1);
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
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    float shift[kMaxBlock] = {}, mean_f[kMaxBlock], scale[kMaxBlock], bias[kMaxBlock];
    double sum[kMaxBlock], sum_sq[kMaxBlock];
    for (int64_t c = c0; c < c1; ++c) shift[c - c0] = x[c * HW];  // first value of the channel (n = 0, i = 0)
    channel_moments(sum, sum_sq, x, N, C, HW, c0, c1, shift);
    for (int64_t c = c0; c < c1; ++c) {
      const ChannelApply ap = channel_statistics(c, sum[c - c0], sum_sq[c - c0], shift[c - c0], M, momentum, eps, gamma,
                                                 beta, save_mean, save_invstd, running_mean, running_var);
      mean_f[c - c0] = ap.mean, scale[c - c0] = ap.scale, bias[c - c0] = ap.bias;
    }
    channel_affine(y, x, N, C, HW, c0, c1, mean_f, scale, bias);
  });
}

// ---- channels-last: (M, C) rows, a channel per column; the inner loops run along a row's channels.
namespace {
// Rows per block: float sums over a block, double across blocks (as kChunk above), and the blocks are the
// parallel grain, fixed whatever the thread count.
constexpr int64_t kRowBlock = 256;

// f(r0, r1, b) for every block b of rows [r0, r1), in parallel.
template <typename F>
void for_each_row_block(int64_t M, int64_t C, F f) {
  const int64_t blocks = (M + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (parallel : M * C >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) f(b * kRowBlock, std::min(M, b * kRowBlock + kRowBlock), b);
}

// s[c] = Σ (x - shift[c]) and ss[c] = Σ (x - shift[c])² over rows [r0, r1), in float.
ACTLAB_CPU_CLONES void rows_moments(float* s, float* ss, const float* x, int64_t C, int64_t r0, int64_t r1,
                                    const float* shift) {
  for (int64_t c = 0; c < C; ++c) s[c] = 0.f, ss[c] = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float d = row[c] - shift[c];
      s[c] += d;
      ss[c] += d * d;
    }
  }
}

// y = (x - shift)·scale + bias over rows [r0, r1).
ACTLAB_CPU_CLONES void rows_affine(float* y, const float* x, int64_t C, int64_t r0, int64_t r1, const float* shift,
                                   const float* scale, const float* bias) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - shift[c]) * scale[c] + bias[c];
  }
}

// The backward's x as f32, or as the bf16 keep it was saved as (widened exactly, in the loop: no f32 copy).
inline float x_value(float v) { return v; }
inline float x_value(uint16_t v) { return bf16_to_float(v); }

// s[c] = Σ dy and sx[c] = Σ dy·(x - mean[c]) over rows [r0, r1), in float.
template <typename X>
inline __attribute__((always_inline)) void rows_grad_sums_body(float* s, float* sx, const float* dy, const X* x,
                                                               int64_t C, int64_t r0, int64_t r1, const float* mean) {
  for (int64_t c = 0; c < C; ++c) s[c] = 0.f, sx[c] = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float* dyr = dy + r * C;
    const X* xr = x + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      s[c] += dyr[c];
      sx[c] += dyr[c] * (x_value(xr[c]) - mean[c]);
    }
  }
}
ACTLAB_CPU_CLONES void rows_grad_sums(float* s, float* sx, const float* dy, const float* x, int64_t C, int64_t r0,
                                      int64_t r1, const float* mean) {
  rows_grad_sums_body(s, sx, dy, x, C, r0, r1, mean);
}
ACTLAB_CPU_CLONES void rows_grad_sums(float* s, float* sx, const float* dy, const uint16_t* x, int64_t C, int64_t r0,
                                      int64_t r1, const float* mean) {
  rows_grad_sums_body(s, sx, dy, x, C, r0, r1, mean);
}

// dx = a·dy + k·(x - mean) + b over rows [r0, r1).
template <typename X>
inline __attribute__((always_inline)) void rows_backward_dx_body(float* dx, const float* dy, const X* x, int64_t C,
                                                                 int64_t r0, int64_t r1, const float* mean,
                                                                 const float* a, const float* k, const float* b) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* dyr = dy + r * C;
    const X* xr = x + r * C;
    float* dxr = dx + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] = a[c] * dyr[c] + k[c] * (x_value(xr[c]) - mean[c]) + b[c];
  }
}
ACTLAB_CPU_CLONES void rows_backward_dx(float* dx, const float* dy, const float* x, int64_t C, int64_t r0, int64_t r1,
                                        const float* mean, const float* a, const float* k, const float* b) {
  rows_backward_dx_body(dx, dy, x, C, r0, r1, mean, a, k, b);
}
ACTLAB_CPU_CLONES void rows_backward_dx(float* dx, const float* dy, const uint16_t* x, int64_t C, int64_t r0,
                                        int64_t r1, const float* mean, const float* a, const float* k, const float* b) {
  rows_backward_dx_body(dx, dy, x, C, r0, r1, mean, a, k, b);
}

// Two per-channel sums over all rows: each block's float sums (sum(s, t, r0, r1) writes C each), added in
// double in block order → first[c], second[c].
template <typename Sum>
void row_block_sums(double* first, double* second, int64_t M, int64_t C, Sum sum) {
  const int64_t blocks = (M + kRowBlock - 1) / kRowBlock;
  Buffer partial(sizeof(float) * static_cast<size_t>(blocks * 2 * C), MemTag::Workspace);
  float* const all = partial.as<float>();
  for_each_row_block(M, C, [&](int64_t r0, int64_t r1, int64_t b) {
    float* p = all + b * 2 * C;
    sum(p, p + C, r0, r1);
  });
  for (int64_t c = 0; c < C; ++c) first[c] = 0.0, second[c] = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* p = all + b * 2 * C;
    for (int64_t c = 0; c < C; ++c) first[c] += p[c], second[c] += p[C + c];
  }
}
}  // namespace

void batchnorm_forward_train_channels_last(float* y, float* save_mean, float* save_invstd, float* running_mean,
                                           float* running_var, const float* x, const float* gamma, const float* beta,
                                           int64_t M, int64_t C, float momentum, float eps) {
  check_bn_sizes(1, C, M);
  ACTLAB_CHECK(M > 1, "batchnorm (training): need more than 1 value per channel, got ", M);
  ACTLAB_CHECK((running_mean == nullptr) == (running_var == nullptr),
               "batchnorm: running_mean and running_var must both be given or both be nullptr");
  std::vector<float> shift(x, x + C), mean_f(C), scale(C), bias(C);  // shift: each channel's first value
  std::vector<double> sum(C), sum_sq(C);
  row_block_sums(sum.data(), sum_sq.data(), M, C, [&](float* s, float* ss, int64_t r0, int64_t r1) {
    rows_moments(s, ss, x, C, r0, r1, shift.data());
  });
  for (int64_t c = 0; c < C; ++c) {
    const ChannelApply ap = channel_statistics(c, sum[c], sum_sq[c], shift[c], M, momentum, eps, gamma, beta, save_mean,
                                               save_invstd, running_mean, running_var);
    mean_f[c] = ap.mean, scale[c] = ap.scale, bias[c] = ap.bias;
  }
  for_each_row_block(M, C, [&](int64_t r0, int64_t r1, int64_t) {
    rows_affine(y, x, C, r0, r1, mean_f.data(), scale.data(), bias.data());
  });
}

namespace {
template <typename X>
void backward_channels_last(float* dx, float* dgamma, float* dbeta, const float* dy, const X* x, const float* gamma,
                            const float* save_mean, const float* save_invstd, int64_t M, int64_t C) {
  check_bn_sizes(1, C, M);
  std::vector<double> sum_dy(C), sum_dy_xc(C);
  row_block_sums(sum_dy.data(), sum_dy_xc.data(), M, C, [&](float* s, float* sx, int64_t r0, int64_t r1) {
    rows_grad_sums(s, sx, dy, x, C, r0, r1, save_mean);
  });
  std::vector<float> a(C), k(C), b(C);
  const double inv_m = 1.0 / static_cast<double>(M);
  for (int64_t c = 0; c < C; ++c) {
    if (dbeta) dbeta[c] = static_cast<float>(sum_dy[c]);
    if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xc[c] * save_invstd[c]);
    dx_coefficients(gamma ? gamma[c] : 1.0, save_invstd[c], sum_dy[c], sum_dy_xc[c], inv_m, &a[c], &k[c], &b[c]);
  }
  for_each_row_block(M, C, [&](int64_t r0, int64_t r1, int64_t) {
    rows_backward_dx(dx, dy, x, C, r0, r1, save_mean, a.data(), k.data(), b.data());
  });
}
}  // namespace

void batchnorm_backward_channels_last(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                                      const float* gamma, const float* save_mean, const float* save_invstd, int64_t M,
                                      int64_t C) {
  backward_channels_last(dx, dgamma, dbeta, dy, x, gamma, save_mean, save_invstd, M, C);
}

void batchnorm_backward_channels_last(float* dx, float* dgamma, float* dbeta, const float* dy, const uint16_t* x_bf16,
                                      const float* gamma, const float* save_mean, const float* save_invstd, int64_t M,
                                      int64_t C) {
  backward_channels_last(dx, dgamma, dbeta, dy, x_bf16, gamma, save_mean, save_invstd, M, C);
}

void batchnorm_forward_eval(float* y, const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, int64_t N,
                            int64_t C, int64_t HW, float eps) {
  check_bn_sizes(N, C, HW);
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    float scale[kMaxBlock], bias[kMaxBlock];
    for (int64_t c = c0; c < c1; ++c) {
      const double g = gamma ? gamma[c] : 1.0;
      scale[c - c0] = static_cast<float>(g / std::sqrt(static_cast<double>(running_var[c]) + eps));
      bias[c - c0] = beta ? beta[c] : 0.f;
    }
    channel_affine(y, x, N, C, HW, c0, c1, running_mean + c0, scale, bias);
  });
}

void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        int64_t N, int64_t C, int64_t HW) {
  check_bn_sizes(N, C, HW);
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    channel_backward(dx, dgamma, dbeta, dy, x + c0 * HW, C * HW, gamma, save_mean, save_invstd, N, C, HW, c0, c1);
  });
}

void batchnorm_grad_sums(double* sum_dy, double* sum_dy_xc, const float* dy, const float* x, const float* save_mean,
                         int64_t N, int64_t C, int64_t HW) {
  check_bn_sizes(N, C, HW);
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    channel_grad_sums(sum_dy + c0, sum_dy_xc + c0, dy, x + c0 * HW, C * HW, N, C, HW, c0, c1, save_mean + c0);
  });
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
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    channel_dx_from_sums(dx, dy, x + c0 * HW, C * HW, gamma, save_mean, save_invstd, sum_dy + c0, sum_dy_xc + c0,
                         count, N, C, HW, c0, c1);
  });
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
    channel_backward(dx, dgamma, dbeta, dy, xc, HW, gamma, save_mean, save_invstd, N, C, HW, c, c + 1);
  });
}

void batchnorm_grad_sums_channels(double* sum_dy, double* sum_dy_xc, const float* dy, const ChannelSource& x_channel,
                                  const float* save_mean, int64_t N, int64_t C, int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    channel_grad_sums(sum_dy + c, sum_dy_xc + c, dy, xc, HW, N, C, HW, c, c + 1, save_mean + c);
  });
}

void batchnorm_backward_from_sums_channels(float* dx, const float* dy, const ChannelSource& x_channel,
                                           const float* gamma, const float* save_mean, const float* save_invstd,
                                           const double* sum_dy, const double* sum_dy_xc, double count, int64_t N,
                                           int64_t C, int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    channel_dx_from_sums(dx, dy, xc, HW, gamma, save_mean, save_invstd, sum_dy + c, sum_dy_xc + c, count, N, C, HW, c,
                         c + 1);
  });
}

void to_bf16_channels(uint16_t* y, const ChannelSource& x_channel, int64_t N, int64_t C, int64_t HW) {
  for_each_read_channel(x_channel, N, C, HW, [&](int64_t c, const float* xc) {
    for (int64_t n = 0; n < N; ++n) to_bf16_serial(y + (n * C + c) * HW, xc + n * HW, HW);
  });
}

void batchnorm_backward_eval(float* dx, float* dgamma, float* dbeta, const float* dy,
                             const float* x, const float* gamma, const float* running_mean,
                             const float* running_var, int64_t N, int64_t C, int64_t HW,
                             float eps) {
  check_bn_sizes(N, C, HW);
  for_each_range(N, C, HW, [&](int64_t c0, int64_t c1) {
    double invstd[kMaxBlock];
    float scale[kMaxBlock], zero[kMaxBlock] = {};
    for (int64_t c = c0; c < c1; ++c) {
      invstd[c - c0] = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
      scale[c - c0] = static_cast<float>((gamma ? gamma[c] : 1.0) * invstd[c - c0]);
    }
    if (dgamma || dbeta) {
      double sum_dy[kMaxBlock], sum_dy_xc[kMaxBlock];
      channel_grad_sums(sum_dy, sum_dy_xc, dy, x + c0 * HW, C * HW, N, C, HW, c0, c1, running_mean + c0);
      for (int64_t c = c0; c < c1; ++c) {
        if (dbeta) dbeta[c] = static_cast<float>(sum_dy[c - c0]);
        if (dgamma) dgamma[c] = static_cast<float>(sum_dy_xc[c - c0] * invstd[c - c0]);
      }
    }
    channel_affine(dx, dy, N, C, HW, c0, c1, zero, scale, zero);
  });
}

}  // namespace actlab::cpu
