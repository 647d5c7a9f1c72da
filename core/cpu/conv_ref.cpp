// The naive reference convolution loops: the executable spec of conv2d_* in conv.h, used by the
// tests to check the fast path. Double accumulation, one thread, no scratch beyond a double
// accumulator. Also ConvShape::str and check_conv_shape, here because this file needs no oneDNN and is
// built in every configuration (the minimal GPU-check build too). Tested (against central differences
// too) in tests/test_cpu_conv.cpp.
#include <sstream>
#include <string>
#include <vector>

#include "actlab/core/cpu/conv.h"
#include "actlab/core/error.h"

namespace actlab::cpu {

std::string ConvShape::str() const {
  std::ostringstream os;
  os << "N=" << N << " C=" << C << " H=" << H << " W=" << W << " K=" << K << " R=" << R
     << " S=" << S << " stride=" << stride_h << "x" << stride_w << " pad=" << pad_h << "x"
     << pad_w << " groups=" << groups;
  return os.str();
}

void check_conv_shape(const ConvShape& s) {
  ACTLAB_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0 && s.K > 0 && s.R > 0 && s.S > 0,
               "conv2d: sizes must be positive: ", s.str());
  ACTLAB_CHECK(s.stride_h >= 1 && s.stride_w >= 1 && s.pad_h >= 0 && s.pad_w >= 0,
               "conv2d: strides must be >= 1 and pads >= 0: ", s.str());
  ACTLAB_CHECK(s.groups >= 1 && s.C % s.groups == 0 && s.K % s.groups == 0,
               "conv2d: groups must divide C and K: ", s.str());
  ACTLAB_CHECK(s.H + 2 * s.pad_h >= s.R && s.W + 2 * s.pad_w >= s.S,
               "conv2d: kernel larger than the padded input: ", s.str());
}

void conv2d_forward_ref(float* y, const float* x, const float* w, const float* b,
                        const ConvShape& s) {
  check_conv_shape(s);
  const int64_t P = s.P(), Q = s.Q(), Cg = s.C / s.groups, Kg = s.K / s.groups;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t g = k / Kg;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          double acc = b ? b[k] : 0.0;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < s.R; ++r) {
              const int64_t h = p * s.stride_h - s.pad_h + r;
              if (h < 0 || h >= s.H) continue;
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t wi = q * s.stride_w - s.pad_w + t;
                if (wi < 0 || wi >= s.W) continue;
                const float xv = x[((n * s.C + g * Cg + c) * s.H + h) * s.W + wi];
                const float wv = w[((k * Cg + c) * s.R + r) * s.S + t];
                acc += static_cast<double>(xv) * wv;
              }
            }
          y[((n * s.K + k) * P + p) * Q + q] = static_cast<float>(acc);
        }
    }
}

void conv2d_backward_data_ref(float* dx, const float* dy, const float* w, const ConvShape& s) {
  check_conv_shape(s);
  const int64_t P = s.P(), Q = s.Q(), Cg = s.C / s.groups, Kg = s.K / s.groups;
  std::vector<double> acc(static_cast<size_t>(s.N * s.C * s.H * s.W), 0.0);  // (N,C,H,W)
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t g = k / Kg;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const double d = dy[((n * s.K + k) * P + p) * Q + q];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t r = 0; r < s.R; ++r) {
              const int64_t h = p * s.stride_h - s.pad_h + r;
              if (h < 0 || h >= s.H) continue;
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t wi = q * s.stride_w - s.pad_w + t;
                if (wi < 0 || wi >= s.W) continue;
                acc[((n * s.C + g * Cg + c) * s.H + h) * s.W + wi] +=
                    d * w[((k * Cg + c) * s.R + r) * s.S + t];
              }
            }
        }
    }
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<float>(acc[i]);
}

void conv2d_backward_weight_ref(float* dw, float* db, const float* dy, const float* x,
                                const ConvShape& s) {
  check_conv_shape(s);
  const int64_t P = s.P(), Q = s.Q(), Cg = s.C / s.groups, Kg = s.K / s.groups;
  for (int64_t k = 0; k < s.K; ++k) {
    const int64_t g = k / Kg;
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t r = 0; r < s.R; ++r)
        for (int64_t t = 0; t < s.S; ++t) {
          double acc = 0.0;
          for (int64_t n = 0; n < s.N; ++n)
            for (int64_t p = 0; p < P; ++p) {
              const int64_t h = p * s.stride_h - s.pad_h + r;
              if (h < 0 || h >= s.H) continue;
              for (int64_t q = 0; q < Q; ++q) {
                const int64_t wi = q * s.stride_w - s.pad_w + t;
                if (wi < 0 || wi >= s.W) continue;
                acc += static_cast<double>(dy[((n * s.K + k) * P + p) * Q + q]) *
                       x[((n * s.C + g * Cg + c) * s.H + h) * s.W + wi];
              }
            }
          dw[((k * Cg + c) * s.R + r) * s.S + t] = static_cast<float>(acc);
        }
    if (db) {
      double acc = 0.0;
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t i = 0; i < P * Q; ++i) acc += dy[(n * s.K + k) * P * Q + i];
      db[k] = static_cast<float>(acc);
    }
  }
}

}  // namespace actlab::cpu
