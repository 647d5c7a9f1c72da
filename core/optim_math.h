// The per-element arithmetic of the AdamW update, written once as ACTLAB_HD functions that the CPU kernel
// (core/cpu/kernels_optim.cpp) and its CUDA twin (core/cuda/optim.cu) both run, so the two devices
// compute the same formulas in the same order (as core/token_math.h does for GELU and LayerNorm).
#pragma once
#include <math.h>

#include <cstdint>

#include "actlab/core/hostdevice.h"

namespace actlab::optim_math {

// The per-step scalars of one AdamW update, computed once on the host in double and rounded once.
struct AdamwFactors {
  float decay;      // 1 - lr·weight_decay: the decoupled weight decay, applied first
  float step_size;  // lr / (1 - beta1^step)
  float inv_bc2;    // 1 / sqrt(1 - beta2^step)
};

inline AdamwFactors adamw_factors(float lr, float beta1, float beta2, float weight_decay, int64_t step) {
  const double bc1 = 1.0 - pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - pow(static_cast<double>(beta2), static_cast<double>(step));
  return {static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay), static_cast<float>(lr / bc1),
          static_cast<float>(1.0 / sqrt(bc2))};
}

// One element: w, m, v updated in place from its gradient g (torch.optim.AdamW's order of operations).
ACTLAB_HD void adamw_element(float& w, float& m, float& v, float g, const AdamwFactors& f, float beta1, float beta2,
                             float eps) {
  const float mi = beta1 * m + (1.f - beta1) * g;
  const float vi = beta2 * v + (1.f - beta2) * g * g;
  m = mi;
  v = vi;
  w = w * f.decay - f.step_size * mi / (sqrtf(vi) * f.inv_bc2 + eps);
}

}  // namespace actlab::optim_math
