// 2-D DCT-II/III as two matrix products per plane, the low-pass mask and the LFC/HFC split.
// Every inner loop is an axpy over a contiguous row (no strided access), so it vectorizes.
#include "actlab/analysis/dct.h"

#include <cmath>

#include "actlab/core/error.h"

namespace actlab {
namespace {

std::vector<float> transpose(const std::vector<float>& m, int64_t n) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) t[c * n + r] = m[r * n + c];
  return t;
}

// out (rows×cols) = a (rows×inner) · b (inner×cols), all row-major; assigns.
void matmul(float* out, const float* a, const float* b, int64_t rows, int64_t inner, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = 0.f;
    for (int64_t k = 0; k < inner; ++k) {
      const float s = a[r * inner + k];
      const float* brow = b + k * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] += s * brow[c];
    }
  }
}

// Both passes of one direction: out = left (H×H) · in (H×W) · right (W×W), through tmp (H×W).
void transform_planes(float* out, const float* in, int64_t count, int64_t h, int64_t w, const float* left,
                      const float* right) {
#pragma omp parallel
  {
    std::vector<float> tmp(static_cast<size_t>(h * w));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; ++p) {
      matmul(tmp.data(), in + p * h * w, right, h, w, w);  // X · right
      matmul(out + p * h * w, left, tmp.data(), h, h, w);  // left · (X · right)
    }
  }
}

Tensor apply(const Tensor& x, bool forward) {
  ACTLAB_CHECK(x.defined() && x.dtype() == DType::F32 && x.dim() >= 2, "dct2d: needs an f32 tensor of rank >= 2, got ",
               x.defined() ? x.str() : std::string("an undefined tensor"));
  const Tensor in = x.contiguous();
  Tensor out = Tensor::empty(x.shape());
  const int64_t h = x.size(-2), w = x.size(-1);
  if (in.numel() == 0) return out;
  const Dct2d dct(h, w);
  const int64_t count = in.numel() / (h * w);
  if (forward) dct.forward(out.data<float>(), in.data<float>(), count);
  else dct.inverse(out.data<float>(), in.data<float>(), count);
  return out;
}

}  // namespace

std::vector<float> dct_basis(int64_t n) {
  ACTLAB_CHECK(n >= 1, "dct_basis: length must be >= 1, got ", n);
  std::vector<float> c(static_cast<size_t>(n * n));
  const double pi = std::acos(-1.0);
  for (int64_t k = 0; k < n; ++k) {
    const double a = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i)
      c[k * n + i] = static_cast<float>(a * std::cos(pi * static_cast<double>((2 * i + 1) * k) / (2.0 * n)));
  }
  return c;
}

Dct2d::Dct2d(int64_t height, int64_t width) : height_(height), width_(width) {
  ACTLAB_CHECK(height >= 1 && width >= 1, "Dct2d: plane must be at least 1x1, got ", height, "x", width);
  basis_h_ = dct_basis(height);
  basis_h_t_ = transpose(basis_h_, height);
  basis_w_ = dct_basis(width);
  basis_w_t_ = transpose(basis_w_, width);
}

void Dct2d::forward(float* coeffs, const float* planes, int64_t count) const {
  transform_planes(coeffs, planes, count, height_, width_, basis_h_.data(), basis_w_t_.data());  // C_H X C_Wᵀ
}

void Dct2d::inverse(float* planes, const float* coeffs, int64_t count) const {
  transform_planes(planes, coeffs, count, height_, width_, basis_h_t_.data(), basis_w_.data());  // C_Hᵀ Y C_W
}

LowPassMask low_pass_mask(int64_t height, int64_t width, double ratio) {
  ACTLAB_CHECK(height >= 1 && width >= 1, "low_pass_mask: plane must be at least 1x1, got ", height, "x", width);
  ACTLAB_CHECK(std::isfinite(ratio) && ratio > 0.0 && ratio <= 1.0, "low-pass ratio must be in (0, 1], got ", ratio);
  LowPassMask m;
  m.height = height;
  m.width = width;
  // u < r·H for integer u ⟺ u < ceil(r·H); the comparison is done on the product to avoid a ceil of
  // a value like 3.0000000001 produced by rounding of r·H.
  for (int64_t u = 0; u < height; ++u) m.kept_rows += static_cast<double>(u) < ratio * static_cast<double>(height);
  for (int64_t v = 0; v < width; ++v) m.kept_cols += static_cast<double>(v) < ratio * static_cast<double>(width);
  m.mask.assign(static_cast<size_t>(height * width), 0);
  for (int64_t u = 0; u < m.kept_rows; ++u)
    for (int64_t v = 0; v < m.kept_cols; ++v) m.mask[u * width + v] = 1;
  return m;
}

Tensor dct2d(const Tensor& x) { return apply(x, true); }
Tensor idct2d(const Tensor& coeffs) { return apply(coeffs, false); }

FrequencySplit split_frequencies(const Tensor& x, double ratio) {
  ACTLAB_CHECK(x.defined() && x.dtype() == DType::F32 && x.dim() >= 2,
               "split_frequencies: needs an f32 tensor of rank >= 2, got ", x.defined() ? x.str() : "undefined");
  const int64_t h = x.size(-2), w = x.size(-1);
  const LowPassMask m = low_pass_mask(h, w, ratio);
  Tensor coeffs = dct2d(x);
  float* c = coeffs.data<float>();
  const int64_t count = coeffs.numel() / (h * w);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < count; ++p)
    for (int64_t i = 0; i < h * w; ++i) c[p * h * w + i] *= static_cast<float>(m.mask[i]);
  FrequencySplit s;
  s.lfc = idct2d(coeffs);
  s.hfc = x.contiguous().clone();
  s.hfc.add_(s.lfc, -1.f);
  return s;
}

}  // namespace actlab
