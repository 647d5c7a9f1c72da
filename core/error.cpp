// Error formatting: keeps only the file's base name so messages stay one readable line.
#include "core/error.h"

#include <cstring>

namespace actlab::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  throw Error(msg + " [" + base + ":" + std::to_string(line) + "]");
}

}  // namespace actlab::detail
