// The timing protocol bench_train and bench_cuda share, so their img/s are measured the same way:
// --warmup untimed steps, then timed steps until at least --steps were taken and --min-time seconds
// passed (at most --max-steps), reported as medians. Header-only: each bench is one executable.
#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actlab/train/cli.h"

namespace actlab::bench {

// The q-quantile of v (0 <= q <= 1) by linear interpolation between order statistics (position q·(n−1):
// NumPy's and R's default), so the quartiles of 4 ratios are not simply their extremes; 0 for no values.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

inline double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct StepTiming {
  int64_t warmup = 2, steps = 8, max_steps = 200;
  double min_time = 4;

  // Declares --warmup, --steps, --min-time and --max-steps with these values as defaults.
  void add_flags(FlagParser& flags) const {
    flags.add("warmup", "int", std::to_string(warmup), "warm-up steps");
    flags.add("steps", "int", std::to_string(steps), "minimum timed steps");
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", min_time);
    flags.add("min-time", "float", seconds, "keep timing until this many seconds");
    flags.add("max-steps", "int", std::to_string(max_steps), "at most this many timed steps");
  }
  // Throws Error for a protocol that would time nothing (no steps, a cap below the minimum).
  static StepTiming from_flags(const FlagParser& flags) {
    const StepTiming t{flags.get_int("warmup"), flags.get_int("steps"), flags.get_int("max-steps"),
                       flags.get_float("min-time")};
    ACTLAB_CHECK(t.warmup >= 0 && t.steps >= 1 && t.max_steps >= t.steps && t.min_time >= 0,
                 "timing: --warmup >= 0, --steps >= 1, --max-steps >= --steps and --min-time >= 0, got ", t.warmup,
                 ", ", t.steps, ", ", t.max_steps, " and ", t.min_time);
    return t;
  }
};

// Wall seconds (and process CPU seconds, when `cpu` is given) of each timed call of step(); `after_warmup`
// runs once between the warm-up and the timed steps.
template <typename Step, typename AfterWarmup>
std::vector<double> time_steps(const StepTiming& t, Step&& step, AfterWarmup&& after_warmup,
                               std::vector<double>* cpu = nullptr) {
  for (int64_t i = 0; i < t.warmup; ++i) step();
  after_warmup();
  std::vector<double> wall;
  double total = 0;
  while (static_cast<int64_t>(wall.size()) < t.steps ||
         (total < t.min_time && static_cast<int64_t>(wall.size()) < t.max_steps)) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu ? process_cpu_seconds() : 0;
    step();
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (cpu) cpu->push_back(process_cpu_seconds() - c0);
    total += wall.back();
  }
  return wall;
}

}  // namespace actlab::bench
