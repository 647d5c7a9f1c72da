// The per-element, per-row and per-column arithmetic of the transformer ops (GELU, LayerNorm, softmax, the
// column reductions of bias gradients, strided offsets), written once as ACTLAB_HD functions that the CPU
// kernels (core/cpu/kernels_token.cpp, kernels_copy.cpp) and their CUDA twins (core/cuda/token.cu) both run,
// so the two devices compute the same formulas in the same order (as core/codec.h does for the codec).
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

// The row functions come in two parts: the row's statistics (sums over the row in order, in double: one
// thread's work) and the per-element update. The CPU runs both on one thread per row; the GPU stages a row in
// shared memory, one lane takes the statistics and the whole warp the elements (core/cuda/token.cu). Both
// call the parts below, so both compute the same sums in the same order.

// LayerNorm statistics of one row xr of d values: mean and rstd (biased variance), computed in double.
ACTLAB_HD void layernorm_stats(const float* xr, int64_t d, float eps, float* mean, float* rstd) {
  double sum = 0, sq = 0;
  for (int64_t j = 0; j < d; ++j) sum += xr[j];
  const double mu = sum / static_cast<double>(d);
  for (int64_t j = 0; j < d; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
  *mean = static_cast<float>(mu);
  *rstd = static_cast<float>(1.0 / sqrt(sq / static_cast<double>(d) + eps));
}

// The element updates of the row functions, which both devices' row loops call.
ACTLAB_HD float layernorm_normalize(float x, float mean, float rstd) { return (x - mean) * rstd; }
ACTLAB_HD float layernorm_output(float h, float gamma, float beta) { return h * gamma + beta; }
ACTLAB_HD float layernorm_dx(float g, float h, float gamma, float rstd, float mg, float mgx) {
  return rstd * (g * gamma - mg - h * mgx);
}
ACTLAB_HD float softmax_exp(float x, float mx, float scale) { return expf(scale * (x - mx)); }
ACTLAB_HD float softmax_dx(float g, float y, float dot, float scale) { return scale * y * (g - dot); }

// Row r of a LayerNorm forward. x̂ = (x − mean)·rstd is written too when xhat is not null: it is what
// backward reads (see below).
ACTLAB_HD void layernorm_row(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                             const float* beta, int64_t r, int64_t d, float eps) {
  const float* xr = x + r * d;
  float m, s;
  layernorm_stats(xr, d, eps, &m, &s);
  mean[r] = m;
  rstd[r] = s;
  for (int64_t j = 0; j < d; ++j) {
    const float h = layernorm_normalize(xr[j], m, s);
    if (xhat) xhat[r * d + j] = h;
    y[r * d + j] = layernorm_output(h, gamma[j], beta[j]);
  }
}

// Statistics of one row of LayerNorm's backward, from its dy row gr and x̂ row hr: mean(dy·γ) and
// mean(dy·γ·x̂), summed in double.
ACTLAB_HD void layernorm_backward_stats(const float* gr, const float* hr, const float* gamma, int64_t d, float* mg,
                                        float* mgx) {
  double sum_g = 0, sum_gx = 0;
  for (int64_t j = 0; j < d; ++j) {
    const double g = static_cast<double>(gr[j]) * gamma[j];
    sum_g += g;
    sum_gx += g * hr[j];
  }
  *mg = static_cast<float>(sum_g / static_cast<double>(d));
  *mgx = static_cast<float>(sum_gx / static_cast<double>(d));
}

// dx of row r: rstd·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂)), from the normalized input x̂ and the row's rstd.
// Backward reads x̂, not x: x̂ has zero mean and unit variance in every row, so a policy's per-sample step
// fits every token alike, while x (the residual stream) mixes rows of very different scales, and an error
// of one step in x is an error of step·rstd in x̂ (measured: docs/policies.md, "Token maps").
ACTLAB_HD void layernorm_row_backward(float* dx, const float* dy, const float* xhat, const float* gamma,
                                      const float* rstd, int64_t r, int64_t d) {
  const float s = rstd[r];
  float mg, mgx;
  layernorm_backward_stats(dy + r * d, xhat + r * d, gamma, d, &mg, &mgx);
  for (int64_t j = 0; j < d; ++j)
    dx[r * d + j] = layernorm_dx(dy[r * d + j], xhat[r * d + j], gamma[j], s, mg, mgx);
}

// Column reductions (a bias's gradient, LayerNorm's dγ and dβ: sums down each column of a rows×d matrix) go
// in fixed chunks of kColumnChunk rows: each chunk's rows in order, then the chunk sums in chunk order. Every
// backend keeps this order, so they give the same bits; the chunks let the GPU put many warps on a column (a
// walk down all rows, one thread per column, left a ViT step on one SM: docs/cuda.md, "ViT on the GPU").
constexpr int64_t kColumnChunk = 64;

// The end of the row chunk that starts at r0.
ACTLAB_HD int64_t column_chunk_end(int64_t r0, int64_t rows) {
  return r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
}

// Σ x[r·d + j] over the rows [r0, r0 + kColumnChunk) ∩ [0, rows), in order, in f32.
ACTLAB_HD float column_chunk_sum(const float* x, int64_t j, int64_t r0, int64_t rows, int64_t d) {
  const int64_t r1 = column_chunk_end(r0, rows);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += x[r * d + j];
  return acc;
}

// Σ x[r·d + j] over all rows: the chunk sums of column_chunk_sum added in chunk order (the spec of
// cpu::column_sums and its CUDA twin).
ACTLAB_HD float column_sum(const float* x, int64_t j, int64_t rows, int64_t d) {
  float acc = 0.f;
  for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) acc += column_chunk_sum(x, j, r0, rows, d);
  return acc;
}

// One chunk of LayerNorm's parameter gradients for column j, in double: a = Σ dy·x̂, b = Σ dy.
ACTLAB_HD void layernorm_chunk_grads(double* a, double* b, const float* dy, const float* xhat, int64_t j,
                                     int64_t r0, int64_t rows, int64_t d) {
  const int64_t r1 = column_chunk_end(r0, rows);
  double sa = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = dy[r * d + j];
    sa += static_cast<double>(g) * xhat[r * d + j];
    sb += g;
  }
  *a = sa;
  *b = sb;
}

// dγ[j] = Σ_rows dy·x̂ and dβ[j] = Σ_rows dy for column j: chunk sums in chunk order (deterministic on both
// devices).
ACTLAB_HD void layernorm_column_grads(float* dgamma, float* dbeta, const float* dy, const float* xhat, int64_t j,
                                      int64_t rows, int64_t d) {
  double a = 0, b = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kColumnChunk) {
    double ca, cb;
    layernorm_chunk_grads(&ca, &cb, dy, xhat, j, r0, rows, d);
    a += ca;
    b += cb;
  }
  dgamma[j] = static_cast<float>(a);
  dbeta[j] = static_cast<float>(b);
}

// The largest value of a row, in order (a NaN is passed over here; it reaches the output through its
// exponential).
ACTLAB_HD float row_max(const float* xr, int64_t d) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < d; ++j) mx = xr[j] > mx ? xr[j] : mx;
  return mx;
}

// 1 / Σ er[j], summed in double in order: the normalizer of a row of exponentials.
ACTLAB_HD float inverse_row_sum(const float* er, int64_t d) {
  double sum = 0;
  for (int64_t j = 0; j < d; ++j) sum += er[j];
  return static_cast<float>(1.0 / sum);
}

// Row r of softmax(scale·x) over the last dimension d: the row max subtracted first (no overflow for any
// finite input), the sum of exponentials in double, rows independent.
ACTLAB_HD void softmax_row(float* y, const float* x, int64_t r, int64_t d, float scale) {
  const float* xr = x + r * d;
  float* yr = y + r * d;
  const float mx = row_max(xr, d);
  for (int64_t j = 0; j < d; ++j) yr[j] = softmax_exp(xr[j], mx, scale);
  const float inv = inverse_row_sum(yr, d);
  for (int64_t j = 0; j < d; ++j) yr[j] *= inv;
}

// Σ dy·y over one row, in double, in order: softmax backward's per-row statistic.
ACTLAB_HD float row_dot(const float* gr, const float* yr, int64_t d) {
  double dot = 0;
  for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(gr[j]) * yr[j];
  return static_cast<float>(dot);
}

// dx of row r from the softmax output y: scale·y·(dy − Σ dy·y). y may be a policy's reconstruction.
ACTLAB_HD void softmax_row_backward(float* dx, const float* dy, const float* y, int64_t r, int64_t d, float scale) {
  const float* yr = y + r * d;
  const float* gr = dy + r * d;
  const float dotf = row_dot(gr, yr, d);
  for (int64_t j = 0; j < d; ++j) dx[r * d + j] = softmax_dx(gr[j], yr[j], dotf, scale);
}

// The largest rank a strided copy takes (Tensor::copy_ between layouts: permute, slice, concat).
constexpr int kMaxCopyDims = 8;

// Where element i (in row-major order of `shape`) of a strided tensor lives, in elements from its start.
// Index is int64_t, or int32_t where the caller has checked that every index and offset fits (the GPU's
// 32-bit division is several times cheaper than its 64-bit one).
template <typename Index>
ACTLAB_HD Index strided_offset(Index i, const int64_t* shape, const int64_t* strides, int ndim) {
  Index off = 0;
  for (int k = ndim - 1; k >= 0; --k) {
    const Index n = static_cast<Index>(shape[k]);
    const Index q = i / n;
    off += (i - q * n) * static_cast<Index>(strides[k]);
    i = q;
  }
  return off;
}

}  // namespace actlab::token_math
