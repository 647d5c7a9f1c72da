// LossScaler: the scale's protocol (parse, skip/shrink, grow) and the exact unscale of the gradients.
#include "actlab/layers/optim/loss_scale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "actlab/core/error.h"

namespace actlab {
namespace {

// A power of two in the range a scale may take: 2^-24 (below it fp16's smallest subnormal is 1) to 2^64.
bool power_of_two_scale(double v) {
  if (!(v > 0) || !std::isfinite(v)) return false;
  int e = 0;
  return std::frexp(v, &e) == 0.5 && e - 1 >= -24 && e - 1 <= 64;
}

double parse_scale(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  ACTLAB_CHECK(!text.empty() && *end == '\0' && power_of_two_scale(v), what, " must be a power of two in [2^-24, 2^64] "
               "(so that scaling is exact), got '", text, "'");
  return v;
}

std::string scale_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string loss_scale_forms() {
  return "none | dynamic[:init=S,interval=N] (skip the step and halve S on overflow, double S after N good steps; "
         "default init=65536, interval=2000) | S (a static scale); S a power of two";
}

LossScaleOptions parse_loss_scale(const std::string& text) {
  LossScaleOptions o;
  if (text == "none") return o;
  const std::string head = text.substr(0, text.find(':'));
  if (head == "dynamic") {
    o.mode = LossScaleOptions::Mode::Dynamic;
    if (head.size() == text.size()) return o;
    std::string rest = text.substr(head.size() + 1);
    ACTLAB_CHECK(!rest.empty(), "--loss-scale '", text, "': nothing after 'dynamic:' (", loss_scale_forms(), ")");
    std::set<std::string> seen;  // a key given twice is a typo, not "the last one wins"
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string kv = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      const size_t eq = kv.find('=');
      ACTLAB_CHECK(eq != std::string::npos, "--loss-scale '", text, "': '", kv, "' is not KEY=VALUE (", loss_scale_forms(), ")");
      const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
      ACTLAB_CHECK(seen.insert(key).second, "--loss-scale '", text, "': '", key, "' is given twice");
      if (key == "init") {
        o.init = parse_scale(value, "--loss-scale init");
      } else if (key == "interval") {
        char* end = nullptr;
        const long long n = std::strtoll(value.c_str(), &end, 10);
        ACTLAB_CHECK(!value.empty() && *end == '\0' && n >= 1, "--loss-scale interval must be an integer >= 1, got '",
                     value, "'");
        o.interval = n;
      } else {
        ACTLAB_FAIL("--loss-scale '", text, "': unknown key '", key, "' (", loss_scale_forms(), ")");
      }
    }
    return o;
  }
  ACTLAB_CHECK(text.find_first_not_of("0123456789.eE+-") == std::string::npos && !text.empty(), "--loss-scale '", text,
               "' is not one of: ", loss_scale_forms());
  o.mode = LossScaleOptions::Mode::Static;
  o.init = parse_scale(text, "--loss-scale");
  return o;
}

std::string loss_scale_name(const LossScaleOptions& o) {
  switch (o.mode) {
    case LossScaleOptions::Mode::None: return "none";
    case LossScaleOptions::Mode::Static: return scale_text(o.init);
    case LossScaleOptions::Mode::Dynamic: break;
  }
  return "dynamic:init=" + scale_text(o.init) + ",interval=" + std::to_string(o.interval);
}

LossScaler::LossScaler(const LossScaleOptions& options)
    : options_(options), scale_(options.mode == LossScaleOptions::Mode::None ? 1.0 : options.init) {}

void LossScaler::unscale(const std::vector<Variable>& params) const {
  if (scale_ == 1) return;
  const float inverse = static_cast<float>(1.0 / scale_);  // a power of two: exact in f32
  for (const Variable& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.mul_(inverse);
  }
}

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    if (dynamic() && ++good_steps_ >= options_.interval) {
      if (scale_ * 2 <= 0x1p64) scale_ *= 2;
      good_steps_ = 0;
    }
    return true;
  }
  if (!absorbs_overflow()) return false;
  scale_ = std::max(scale_ / 2, options_.min_scale);
  good_steps_ = 0;
  ++overflow_skips_;
  return false;
}

void LossScaler::restore(double scale, int64_t good_steps) {
  ACTLAB_CHECK(power_of_two_scale(scale) && good_steps >= 0, "checkpoint loss scale ", scale, " (good steps ", good_steps,
               ") is not a power of two in [2^-24, 2^64]");
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace actlab
