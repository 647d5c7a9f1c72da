// CUDA fused optimizer steps: SGD (weight decay, momentum with dampening, Nesterov), one pass over w,
// grad and the momentum buffer, torch.optim.SGD semantics; AdamW, core/optim_math.h's element. Contract in core/cuda/kernels.h (CPU twin:
// core/cpu/kernels_optim.cpp); tested in tests/test_cuda_ops.cpp.
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"
#include "actlab/core/optim_math.h"

namespace actlab::cuda {
namespace {

enum class SgdVariant { Plain, FirstStep, Nesterov, Momentum };

// The four variants of cpu::sgd_update as one template, so each kernel's inner loop is branch-free.
template <SgdVariant kVariant>
__global__ void sgd_kernel(float* w, float* buf, const float* grad, int64_t n, float lr, float mu, float keep,
                           float wd, bool nesterov) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float g = grad[i] + wd * w[i];
    if (kVariant == SgdVariant::Plain) {
      w[i] -= lr * g;
    } else if (kVariant == SgdVariant::FirstStep) {  // PyTorch clones the first gradient: no dampening
      buf[i] = g;
      w[i] -= lr * (nesterov ? g + mu * g : g);
    } else if (kVariant == SgdVariant::Nesterov) {
      const float b = mu * buf[i] + keep * g;
      buf[i] = b;
      w[i] -= lr * (g + mu * b);
    } else {
      const float b = mu * buf[i] + keep * g;
      buf[i] = b;
      w[i] -= lr * b;
    }
  }
}

__global__ void adamw_kernel(float* w, float* m, float* v, const float* grad, int64_t n, optim_math::AdamwFactors f,
                             float beta1, float beta2, float eps) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    optim_math::adamw_element(w[i], m[i], v[i], grad[i], f, beta1, beta2, eps);
}

}  // namespace

void sgd_update(float* w, float* momentum_buf, const float* grad, int64_t n, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step, cudaStream_t cuda_stream) {
  ACTLAB_CHECK(n >= 0, "sgd_update: n must be >= 0, got ", n);
  ACTLAB_CHECK(momentum >= 0.f, "sgd_update: momentum must be >= 0, got ", momentum);
  ACTLAB_CHECK(!nesterov || (momentum > 0.f && dampening == 0.f),
               "sgd_update: nesterov needs momentum > 0 and dampening 0, got momentum ", momentum, " dampening ",
               dampening);
  ACTLAB_CHECK(momentum == 0.f || momentum_buf != nullptr, "sgd_update: momentum ", momentum,
               " needs a momentum buffer");
  if (n == 0) return;
  const int blocks = grid_blocks(n);
  const float keep = 1.f - dampening;
  if (momentum == 0.f) {
    sgd_kernel<SgdVariant::Plain><<<blocks, kBlockThreads, 0, cuda_stream>>>(w, nullptr, grad, n, lr, 0.f, keep,
                                                                        weight_decay, false);
  } else if (first_step) {
    sgd_kernel<SgdVariant::FirstStep><<<blocks, kBlockThreads, 0, cuda_stream>>>(w, momentum_buf, grad, n, lr, momentum,
                                                                            keep, weight_decay, nesterov);
  } else if (nesterov) {
    sgd_kernel<SgdVariant::Nesterov><<<blocks, kBlockThreads, 0, cuda_stream>>>(w, momentum_buf, grad, n, lr, momentum,
                                                                           keep, weight_decay, true);
  } else {
    sgd_kernel<SgdVariant::Momentum><<<blocks, kBlockThreads, 0, cuda_stream>>>(w, momentum_buf, grad, n, lr, momentum,
                                                                           keep, weight_decay, false);
  }
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void adamw_update(float* w, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step, cudaStream_t cuda_stream) {
  ACTLAB_CHECK(n >= 0, "adamw_update: n must be >= 0, got ", n);
  ACTLAB_CHECK(step >= 1, "adamw_update: step counts from 1, got ", step);
  if (n == 0) return;
  adamw_kernel<<<grid_blocks(n), kBlockThreads, 0, cuda_stream>>>(
      w, m, v, grad, n, optim_math::adamw_factors(lr, beta1, beta2, weight_decay, step), beta1, beta2, eps);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
