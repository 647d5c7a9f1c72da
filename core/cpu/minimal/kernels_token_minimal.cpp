// The GELU, softmax and LayerNorm forward of a minimal build (ACTLAB_GPU_CHECK: no oneDNN on the machine): the
// _ref loops of kernels_token.cpp. Only the CMake option compiles this file; it replaces
// core/cpu/kernels_token_dnnl.cpp.
#include "actlab/core/cpu/kernels.h"

namespace actlab::cpu {

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx) { gelu_forward_ref(y, x, n, tanh_approx); }
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
  gelu_backward_ref(dx, dy, x, n, tanh_approx);
}

void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale) {
  softmax_forward_ref(y, x, rows, d, scale);
}
void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale) {
  softmax_backward_ref(dx, dy, y, rows, d, scale);
}
void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps) {
  layernorm_forward_ref(y, xhat, mean, rstd, x, gamma, beta, rows, d, eps);
}

}  // namespace actlab::cpu
