// The per-element and per-row arithmetic of GELU and LayerNorm, written once as ACTLAB_HD functions that
// the CPU kernels (core/cpu/kernels_token.cpp) and their CUDA twins (core/cuda/token.cu) both run, so the
// two devices compute the same formulas in the same order (as core/codec.h does for the codec).
#pragma once
#include <math.h>

#include <cstdint>

#include "actlab/core/hostdevice.h"

namespace actlab::token_math {

constexpr float kSqrt1_2 = 0.70710678118654752f;      // 1/√2
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // √(2/π)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1/√(2π)
constexpr float kTanhCubic = 0.044715f;

// x·Φ(x), or 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))).
ACTLAB_HD float gelu(float x, bool tanh_approx) {
  return tanh_approx ? 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kTanhCubic * x * x * x)))
                     : 0.5f * x * (1.f + erff(x * kSqrt1_2));
}

// d gelu / dx: Φ(x) + x·φ(x), or the tanh form's derivative.
ACTLAB_HD float gelu_grad(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float t = tanhf(kSqrt2OverPi * (x + kTanhCubic * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kTanhCubic * x * x);
  }
  return 0.5f * (1.f + erff(x * kSqrt1_2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

// Row r of a LayerNorm forward: statistics in double (rows are the model width), biased variance. x̂ =
// (x − mean)·rstd is written too when xhat is not null: it is what backward reads (see below).
ACTLAB_HD void layernorm_row(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                             const float* beta, int64_t r, int64_t d, float eps) {
  const float* xr = x + r * d;
  double sum = 0, sq = 0;
  for (int64_t j = 0; j < d; ++j) sum += xr[j];
  const double mu = sum / static_cast<double>(d);
  for (int64_t j = 0; j < d; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
  const float m = static_cast<float>(mu), s = static_cast<float>(1.0 / sqrt(sq / static_cast<double>(d) + eps));
  mean[r] = m;
  rstd[r] = s;
  for (int64_t j = 0; j < d; ++j) {
    const float h = (xr[j] - m) * s;
    if (xhat) xhat[r * d + j] = h;
    y[r * d + j] = h * gamma[j] + beta[j];
  }
}

// dx of row r: rstd·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂)), from the normalized input x̂ and the row's rstd.
// Backward reads x̂, not x: x̂ has zero mean and unit variance in every row, so a policy's per-sample step
// fits every token alike, while x (the residual stream) mixes rows of very different scales, and an error
// of one step in x is an error of step·rstd in x̂ (measured: docs/policies.md, "Token maps").
ACTLAB_HD void layernorm_row_backward(float* dx, const float* dy, const float* xhat, const float* gamma,
                                      const float* rstd, int64_t r, int64_t d) {
  const float s = rstd[r];
  double sum_g = 0, sum_gx = 0;
  for (int64_t j = 0; j < d; ++j) {
    const double g = static_cast<double>(dy[r * d + j]) * gamma[j];
    sum_g += g;
    sum_gx += g * xhat[r * d + j];
  }
  const float mg = static_cast<float>(sum_g / static_cast<double>(d));
  const float mgx = static_cast<float>(sum_gx / static_cast<double>(d));
  for (int64_t j = 0; j < d; ++j) dx[r * d + j] = s * (dy[r * d + j] * gamma[j] - mg - xhat[r * d + j] * mgx);
}

// dγ[j] = Σ_rows dy·x̂ and dβ[j] = Σ_rows dy for column j, rows in order (deterministic on both devices).
ACTLAB_HD void layernorm_column_grads(float* dgamma, float* dbeta, const float* dy, const float* xhat, int64_t j,
                                      int64_t rows, int64_t d) {
  double a = 0, b = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = dy[r * d + j];
    a += static_cast<double>(g) * xhat[r * d + j];
    b += g;
  }
  dgamma[j] = static_cast<float>(a);
  dbeta[j] = static_cast<float>(b);
}

// Row r of softmax(scale·x) over the last dimension d: the row max subtracted first (no overflow for any
// finite input), the sum of exponentials in double, rows independent.
ACTLAB_HD void softmax_row(float* y, const float* x, int64_t r, int64_t d, float scale) {
  const float* xr = x + r * d;
  float* yr = y + r * d;
  float mx = -INFINITY;
  for (int64_t j = 0; j < d; ++j) mx = xr[j] > mx ? xr[j] : mx;
  double sum = 0;
  for (int64_t j = 0; j < d; ++j) {
    yr[j] = expf(scale * (xr[j] - mx));
    sum += yr[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < d; ++j) yr[j] *= inv;
}

// dx of row r from the softmax output y: scale·y·(dy − Σ dy·y). y may be a policy's reconstruction.
ACTLAB_HD void softmax_row_backward(float* dx, const float* dy, const float* y, int64_t r, int64_t d, float scale) {
  const float* yr = y + r * d;
  const float* gr = dy + r * d;
  double dot = 0;
  for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(gr[j]) * yr[j];
  const float dotf = static_cast<float>(dot);
  for (int64_t j = 0; j < d; ++j) dx[r * d + j] = scale * yr[j] * (gr[j] - dotf);
}

// The largest rank a strided copy takes (Tensor::copy_ between layouts: permute, slice, concat).
constexpr int kMaxCopyDims = 8;

// Where element i (in row-major order of `shape`) of a strided tensor lives, in elements from its start.
ACTLAB_HD int64_t strided_offset(int64_t i, const int64_t* shape, const int64_t* strides, int ndim) {
  int64_t off = 0;
  for (int k = ndim - 1; k >= 0; --k) {
    const int64_t q = i / shape[k];
    off += (i - q * shape[k]) * strides[k];
    i = q;
  }
  return off;
}

}  // namespace actlab::token_math
