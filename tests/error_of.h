// error_of(f): the message of the actlab::Error that f() throws, or "" when it returns normally. Shared
// by the suites that check error texts (a different exception type propagates and fails the test).
#pragma once
#include <string>

#include "actlab/core/error.h"

namespace actlab::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace actlab::testing
