// A test that needs something the machine may lack (a data package, a tool) asks here first, so that a
// missing prerequisite is never a silent pass: without it the case prints
// "SKIPPED: missing prerequisite: <what>" (CTest reports the case as skipped, not passed; see
// CMakeLists.txt), and under CI (CI set and not "false"), where scripts/setup.sh installs every
// prerequisite, it fails instead: a missing one there means the setup is broken.
#pragma once
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "actlab/core/precision.h"

namespace actlab::testing {

inline bool under_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && ci[0] != '\0' && std::string(ci) != "false" && std::string(ci) != "0";
}

// True when `present`; otherwise reports the skip (or, under CI, the failure) and returns false, and
// the caller returns.
inline bool have_prerequisite(bool present, const std::string& what) {
  if (present) return true;
  if (under_ci()) FAIL_CHECK("missing prerequisite under CI (scripts/setup.sh installs it): " << what);
  else MESSAGE("SKIPPED: missing prerequisite: " << what);
  return false;
}

// True when oneDNN has bf16 kernels for this CPU (core/precision.h); otherwise prints
// "SKIPPED: no bf16 kernels ..." and returns false. A CPU feature cannot be installed, so this is a skip
// under CI too (CTest reports it as skipped; see CMakeLists.txt).
inline bool have_bf16_kernels() {
  if (cpu_runs_bf16_kernels()) return true;
  MESSAGE("SKIPPED: no bf16 kernels on this CPU: oneDNN's need AVX-512 (avx512f/bw/vl/dq); flags: " << cpu_bf16_flags());
  return false;
}

}  // namespace actlab::testing
