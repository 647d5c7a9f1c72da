// Error formatting: keeps only the file's base name so messages stay one readable line.
#include "actlab/core/error.h"

#include <cstring>

namespace actlab::detail {

namespace {
std::string location(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(" [") + (base ? base + 1 : file) + ":" + std::to_string(line) + "]";
}
}  // namespace

void throw_error(const char* file, int line, const std::string& msg) { throw Error(msg, location(file, line)); }

void throw_out_of_memory(const char* file, int line, const std::string& msg) {
  throw OutOfMemory(msg + "; out of memory: try a smaller batch or a compressing --policy such as division:B=8,Q=2",
                    location(file, line));
}

}  // namespace actlab::detail
