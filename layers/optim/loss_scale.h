// Loss scaling for low-precision training: the loss's gradient is multiplied by a scale S before
// backward, so that small gradients stay representable in a narrow format (fp16 flushes below 2^-24),
// and every parameter gradient is divided by S again before the optimizer sees it. Dynamic scaling
// (PyTorch's GradScaler protocol) skips a step whose gradients overflowed and halves S, and doubles S
// after `interval` good steps in a row. Every factor is a power of two, so scaling and unscaling are
// exact in binary floating point: without an overflow the weights are bit for bit those of an unscaled
// run (tests/test_loss_scale.cpp checks it on a training run). Tested in tests/test_loss_scale.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actlab/autograd/variable.h"

namespace actlab {

struct LossScaleOptions {
  enum class Mode { None, Static, Dynamic };
  Mode mode = Mode::None;
  double init = 65536;       // 2^16, PyTorch's GradScaler default
  int64_t interval = 2000;   // Dynamic: good steps in a row before the scale doubles
  // Dynamic: an overflow at this scale is not the scale's fault (the gradient is non-finite unscaled
  // too), so it goes to the run's non-finite guard instead of halving the scale again.
  double min_scale = 1;
};

// "none", "dynamic", "dynamic:init=65536,interval=2000", or a power of two (a static scale, e.g. "1024").
// Throws Error naming the form for anything else (a scale that is not a power of two in [2^-24, 2^64],
// an interval < 1).
LossScaleOptions parse_loss_scale(const std::string& text);
// The forms parse_loss_scale takes, for --help.
std::string loss_scale_forms();
// The options back as parse_loss_scale's text (the run header, the saved configuration).
std::string loss_scale_name(const LossScaleOptions& o);

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options);
  bool enabled() const { return options_.mode != LossScaleOptions::Mode::None; }
  bool dynamic() const { return options_.mode == LossScaleOptions::Mode::Dynamic; }
  // The factor the loss's gradient is seeded with (1 when disabled).
  double scale() const { return scale_; }
  // Divides every defined gradient of `params` by scale() (nothing when the scale is 1).
  void unscale(const std::vector<Variable>& params) const;
  // After a step's gradients were checked. Returns true when the update may go ahead. An overflow with
  // dynamic scaling above min_scale returns false after halving the scale (the caller skips the step);
  // at min_scale, or with a static scale, it returns false and leaves the scale alone (the caller's
  // non-finite guard decides). A good step counts towards the next doubling.
  bool update(bool overflow);
  // True when update(true) would halve the scale: the overflow is the scaler's to handle.
  bool absorbs_overflow() const { return dynamic() && scale_ > options_.min_scale; }
  int64_t good_steps() const { return good_steps_; }
  int64_t overflow_skips() const { return overflow_skips_; }
  // Resume: the scale and the good-step count a checkpoint saved.
  void restore(double scale, int64_t good_steps);
 private:
  LossScaleOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t overflow_skips_ = 0;  // steps this process skipped for an overflow
};

}  // namespace actlab
