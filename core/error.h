// actlab::Error and the check macros every library function uses to report bad input.
// Apps catch Error at main, print its one-line message and exit non-zero.
// Tested in tests/test_core.cpp.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace actlab {

// A user-facing error: the message names the problem and the offending values; `where` is the " [file:line]"
// the check macros append. what() is the two together. They are kept apart so that a handler can add to the
// message and still end the line with the place that found the problem (train/trainer.cpp's read error).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, const std::string& where = "")
      : std::runtime_error(message + where), message_size_(message.size()) {}
  std::string message() const { return std::string(what(), message_size_); }
  std::string where() const { return std::string(what() + message_size_); }

 private:
  size_t message_size_;
};

// Thrown when memory runs out (core/error.h so that library-call checks can throw it too): the first line
// names the failed request and a remedy; the allocator's stats table may follow on later lines. Apps
// print the first line as the error and exit 3.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& message, const std::string& where = "") : Error(message, where) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
// OutOfMemory(msg + "; " + the remedy + " [file:line]"), for allocation failures a library reports.
[[noreturn]] void throw_out_of_memory(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace actlab

// ACTLAB_CHECK(cond, "x has ", n, " dims") throws actlab::Error("x has 3 dims", " [file.cpp:line]").
#define ACTLAB_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) ::actlab::detail::throw_error(__FILE__, __LINE__,                     \
                                               ::actlab::detail::concat(__VA_ARGS__)); \
  } while (0)

#define ACTLAB_FAIL(...) \
  ::actlab::detail::throw_error(__FILE__, __LINE__, ::actlab::detail::concat(__VA_ARGS__))
