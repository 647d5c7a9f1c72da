// CPU fused optimizer steps: SGD (weight decay, momentum with dampening, Nesterov), torch.optim.SGD
// semantics, and AdamW, torch.optim.AdamW semantics; one pass over each parameter. Contract in core/cpu/kernels.h; tested in
// tests/test_cpu_kernels.cpp. The four variants are separate loops so each inner loop is
// branch-free and vectorizes.
#include "actlab/core/cpu/kernels.h"

#include "actlab/core/error.h"
#include "actlab/core/optim_math.h"

namespace actlab::cpu {

void sgd_update(float* w, float* momentum_buf, const float* grad, int64_t n, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) {
  ACTLAB_CHECK(n >= 0, "sgd_update: n must be >= 0, got ", n);
  ACTLAB_CHECK(momentum >= 0.f, "sgd_update: momentum must be >= 0, got ", momentum);
  ACTLAB_CHECK(!nesterov || (momentum > 0.f && dampening == 0.f),
               "sgd_update: nesterov needs momentum > 0 and dampening 0, got momentum ", momentum,
               " dampening ", dampening);
  const float wd = weight_decay, mu = momentum, keep = 1.f - dampening;
  if (mu == 0.f) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * (grad[i] + wd * w[i]);
    return;
  }
  ACTLAB_CHECK(momentum_buf != nullptr, "sgd_update: momentum ", momentum,
               " needs a momentum buffer");
  float* buf = momentum_buf;
  if (first_step) {  // buf = g (PyTorch clones the first gradient: no dampening on step 1)
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * w[i];
      buf[i] = g;
      w[i] -= lr * (nesterov ? g + mu * g : g);
    }
  } else if (nesterov) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * w[i];
      const float b = mu * buf[i] + keep * g;
      buf[i] = b;
      w[i] -= lr * (g + mu * b);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const float b = mu * buf[i] + keep * (grad[i] + wd * w[i]);
      buf[i] = b;
      w[i] -= lr * b;
    }
  }
}

void adamw_update(float* w, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step) {
  ACTLAB_CHECK(n >= 0, "adamw_update: n must be >= 0, got ", n);
  ACTLAB_CHECK(step >= 1, "adamw_update: step counts from 1, got ", step);
  const optim_math::AdamwFactors f = optim_math::adamw_factors(lr, beta1, beta2, weight_decay, step);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) optim_math::adamw_element(w[i], m[i], v[i], grad[i], f, beta1, beta2, eps);
}

}  // namespace actlab::cpu
