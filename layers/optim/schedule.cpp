// Learning-rate schedules.
#include "actlab/layers/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "actlab/core/error.h"

namespace actlab {

float LrSchedule::lr_at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const int64_t s = step - warmup_steps;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  switch (kind) {
    case Kind::Constant: return base_lr;
    case Kind::Step: return step_size > 0 ? base_lr * std::pow(gamma, static_cast<float>(s / step_size)) : base_lr;
    case Kind::Cosine: {
      const double t = std::min<double>(1.0, static_cast<double>(s) / static_cast<double>(span));
      return min_lr + (base_lr - min_lr) * static_cast<float>(0.5 * (1.0 + std::cos(M_PI * t)));
    }
  }
  return base_lr;
}

LrSchedule::Kind LrSchedule::parse_kind(const std::string& s) {
  if (s == "cosine") return Kind::Cosine;
  if (s == "step") return Kind::Step;
  if (s == "constant") return Kind::Constant;
  ACTLAB_FAIL("unknown schedule '", s, "': expected cosine, step or constant");
}

const char* LrSchedule::kind_name(Kind k) {
  switch (k) {
    case Kind::Cosine: return "cosine";
    case Kind::Step: return "step";
    case Kind::Constant: return "constant";
  }
  return "?";
}

}  // namespace actlab
