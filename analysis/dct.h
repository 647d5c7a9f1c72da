// The orthonormal 2-D DCT-II / DCT-III pair for H×W planes, the DIVISION paper's low-pass mask M
// (§3, Eq. 4–5) and the split of a map into its frequency components LFC = iDCT(DCT(x) ⊙ M) and
// HFC = x − LFC. Analysis code (actlab-inspect), not a training path: plain separable matrix products.
// Tested in tests/test_inspect.cpp ("dct: ...").
#pragma once
#include <cstdint>
#include <vector>

#include "actlab/core/tensor.h"

namespace actlab {

// The orthonormal DCT-II basis of length n, row k = frequency k:
//   C[k·n + i] = a_k · cos(π (2i + 1) k / (2n)),  a_0 = √(1/n),  a_k = √(2/n) for k > 0.
// C is orthogonal (C·Cᵀ = I), so DCT-III (the inverse) is Cᵀ and ‖C x‖ = ‖x‖ (Parseval).
std::vector<float> dct_basis(int64_t n);

// A 2-D transform for H×W planes: Y = C_H · X · C_Wᵀ (forward), X = C_Hᵀ · Y · C_W (inverse).
// Y[u, v] holds vertical frequency u (rows) and horizontal frequency v (columns); Y[0, 0] is the DC
// term, √(H·W) × the plane mean. Cost per plane: H·W·(H + W) multiply-adds.
class Dct2d {
 public:
  Dct2d(int64_t height, int64_t width);  // throws Error unless both >= 1
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }

  // coeffs, planes: `count` contiguous H×W planes each; never alias. Parallel over planes (OpenMP).
  void forward(float* coeffs, const float* planes, int64_t count) const;
  void inverse(float* planes, const float* coeffs, int64_t count) const;

 private:
  int64_t height_, width_;
  std::vector<float> basis_h_, basis_h_t_;  // C_H (H×H, row = frequency) and its transpose
  std::vector<float> basis_w_, basis_w_t_;  // C_W (W×W) and its transpose
};

// The paper's low-pass mask M for an H×W plane, as a row-major H×W array of 0/1.
//
// The paper (N×N maps, 1-based indices) sets m_ij = 1 for 1 ≤ i, j ≤ W and 0 elsewhere, and quotes the
// cut-off as the fraction W/N (0.1 in Fig. 3(a)). In 0-based frequency indices that is "keep (u, v) with
// u < W and v < W". Here the cut-off is the ratio r = W/N, applied per axis so non-square planes work:
//     M[u, v] = 1  ⟺  u < r·H  and  v < r·W.
// When r·H is an integer this keeps exactly the paper's r·H × r·W top-left block. Otherwise the block
// is ceil(r·H) × ceil(r·W), i.e. the paper's non-integer W is rounded up; in particular the DC term
// (u = v = 0) is always kept, so a 7×7 map at r = 0.1 keeps only its mean. r = 1 keeps everything.
struct LowPassMask {
  int64_t height = 0, width = 0;
  int64_t kept_rows = 0, kept_cols = 0;  // ceil(r·H), ceil(r·W): the kept top-left block
  std::vector<uint8_t> mask;             // H·W, 1 = low frequency
};
LowPassMask low_pass_mask(int64_t height, int64_t width, double ratio);  // throws unless 0 < ratio <= 1

// Tensor front end. x: f32, rank >= 2, any strides; the last two dims are the plane (H, W) and every
// leading index is one plane. Returns a fresh contiguous tensor of x's shape (never aliases x).
Tensor dct2d(const Tensor& x);
Tensor idct2d(const Tensor& coeffs);

// LFC = iDCT(DCT(x) ⊙ M), HFC = x − LFC, both fresh contiguous f32 tensors of x's shape (paper Eq. 4–5).
struct FrequencySplit {
  Tensor lfc, hfc;
};
FrequencySplit split_frequencies(const Tensor& x, double ratio);

}  // namespace actlab
