// The CPU convolution of a minimal build (ACTLAB_GPU_CHECK: no oneDNN on the machine): the conv.h fast-path
// API served by the reference loops of conv_ref.cpp, parallel over images with OpenMP. Only the CMake
// option compiles this file (core/cpu/minimal/ is not globbed otherwise); it replaces core/cpu/conv.cpp.
// It is the CPU reference the CUDA parity suites (tests/test_cuda_*.cpp) compare against on a GPU host.
#include <string>
#include <vector>

#include "actlab/core/cpu/conv.h"
#include "actlab/core/error.h"

namespace actlab::cpu {

const char* conv_impl_name(ConvImpl impl) { return impl == ConvImpl::Auto ? "auto" : "reference"; }

ConvImpl conv_impl_from_name(const std::string& name) {
  ACTLAB_CHECK(name == "auto", "conv implementation '", name, "' is not available in a minimal build (only auto)");
  return ConvImpl::Auto;
}

namespace {
// check_precision_supported refuses bf16 in a minimal build; this is the kernel's own guard.
void require_f32(Precision compute) {
  ACTLAB_CHECK(compute == Precision::F32, "a minimal build's convolution computes in fp32 only, not ",
               precision_name(compute));
}
ConvShape one_image(const ConvShape& s) {
  ConvShape one = s;
  one.N = 1;
  return one;
}
}  // namespace

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvShape& s, ConvImpl,
                    Precision compute, Layout) {
  check_conv_shape(s);
  require_f32(compute);
  const ConvShape one = one_image(s);
  const int64_t x_image = s.C * s.H * s.W, y_image = s.K * s.P() * s.Q();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) conv2d_forward_ref(y + n * y_image, x + n * x_image, w, b, one);
}

void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvShape& s, ConvImpl,
                          Precision compute, Layout) {
  check_conv_shape(s);
  require_f32(compute);
  const ConvShape one = one_image(s);
  const int64_t x_image = s.C * s.H * s.W, y_image = s.K * s.P() * s.Q();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n) conv2d_backward_data_ref(dx + n * x_image, dy + n * y_image, w, one);
}

// Per-image weight gradients in parallel, then added image by image (a fixed order).
void conv2d_backward_weight(float* dw, float* db, const float* dy, const float* x, const ConvShape& s, ConvImpl,
                            Precision compute, Layout) {
  check_conv_shape(s);
  require_f32(compute);
  const ConvShape one = one_image(s);
  const int64_t x_image = s.C * s.H * s.W, y_image = s.K * s.P() * s.Q();
  const int64_t w_size = s.K * (s.C / s.groups) * s.R * s.S;
  std::vector<float> dw_part(static_cast<size_t>(s.N * w_size)), db_part(static_cast<size_t>(s.N * s.K));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < s.N; ++n)
    conv2d_backward_weight_ref(dw_part.data() + n * w_size, db ? db_part.data() + n * s.K : nullptr,
                               dy + n * y_image, x + n * x_image, one);
  for (int64_t i = 0; i < w_size; ++i) {
    double sum = 0.0;
    for (int64_t n = 0; n < s.N; ++n) sum += dw_part[n * w_size + i];
    dw[i] = static_cast<float>(sum);
  }
  for (int64_t k = 0; db && k < s.K; ++k) {
    double sum = 0.0;
    for (int64_t n = 0; n < s.N; ++n) sum += db_part[n * s.K + k];
    db[k] = static_cast<float>(sum);
  }
}

// A minimal build runs the reference loops whatever the request, and has no AMX kernels.
ConvImpl conv2d_backward_weight_impl(const ConvShape& s, ConvImpl impl, Precision compute) {
  check_conv_shape(s);
  require_f32(compute);
  return impl;
}
void check_conv_impl(ConvImpl, Precision compute) { require_f32(compute); }
bool dnnl_runs_amx() { return false; }

// The reference loops compute on NCHW only: no blocked input is ever asked for.
int conv2d_backward_weight_input_block(const ConvShape& s, bool, ConvImpl) {
  check_conv_shape(s);
  return 0;
}
void conv2d_backward_weight_blocked_input(float*, float*, const float*, const float*, const ConvShape& s, ConvImpl) {
  ACTLAB_FAIL("conv2d_backward_weight_blocked_input: not available in a minimal build (", s.str(), ")");
}

void conv2d_forward_bf16_input(float*, const uint16_t*, const float*, const float*, const ConvShape& s, ConvImpl,
                               Layout, Layout) {
  ACTLAB_FAIL("conv2d_forward_bf16_input: a minimal build has no bf16 convolution (", s.str(), ")");
}

bool conv2d_backward_data_as_forward(const ConvShape& s, ConvImpl, Precision) {
  check_conv_shape(s);
  return false;
}

bool conv2d_bf16_reads_channels_last(const ConvShape& s, bool, ConvImpl, Layout) {
  check_conv_shape(s);
  return false;
}

void conv2d_backward_weight_bf16_input(float*, float*, const float*, const uint16_t*, const ConvShape& s, ConvImpl,
                                       Layout, Layout) {
  ACTLAB_FAIL("conv2d_backward_weight_bf16_input: a minimal build has no bf16 convolution (", s.str(), ")");
}

// The reference loops read dy where it is: nothing to share.
struct ConvGradShare::Slot {};
ConvGradShare::ConvGradShare(const float*) {}
ConvGradShare::~ConvGradShare() = default;

void conv_clear_cache() {}

}  // namespace actlab::cpu
