// Running programs from a test: run_command(cmd) runs a shell command and returns its exit status and its
// output (stdout and stderr together); app_bin(name) is a program the build makes next to actlab_tests.
// Shared by the suites that drive the command-line tools (ablate, dist, the CIFAR script).
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <string>

namespace actlab::testing {

struct CommandOutput {
  int rc = -1;       // the exit status, 128 + the signal for a command killed by one (as a shell says)
  std::string text;  // stdout and stderr together
};

inline CommandOutput run_command(const std::string& command) {
  CommandOutput o;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.text.append(buf, n);
  const int status = ::pclose(p);
  o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

inline std::string app_bin(const std::string& name) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return (std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path() / name).string();
}

}  // namespace actlab::testing
