// Learning-rate schedules, evaluated per step: cosine annealing (to 0 at the last step, as
// CosineAnnealingLR with T_max = total), step decay, constant; each with an optional linear warm-up.
// Tested in tests/test_optim.cpp.
#pragma once
#include <cstdint>
#include <string>

namespace actlab {

struct LrSchedule {
  enum class Kind { Constant, Cosine, Step };
  Kind kind = Kind::Cosine;
  float base_lr = 0.1f;
  int64_t total_steps = 1;     // the whole run
  int64_t warmup_steps = 0;    // linear from base_lr/warmup_steps... to base_lr
  int64_t step_size = 0;       // Step: decay every step_size steps
  float gamma = 0.1f;          // Step: multiply by gamma
  float min_lr = 0.f;          // Cosine: floor

  // The rate for 0-based step `step`.
  float lr_at(int64_t step) const;
  static Kind parse_kind(const std::string& s);  // "cosine", "step", "constant"; throws Error
  static const char* kind_name(Kind k);
};

}  // namespace actlab
