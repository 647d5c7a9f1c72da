// Shared by the fuzz targets (fuzz/<target>.cpp): a per-process scratch directory for parsers that
// only read files (each input is written there, then parsed; fast enough and keeps the parser APIs
// as they are), and the rule for what counts as a finding: an actlab::Error is the parser doing its
// job; any other exception, a crash, a sanitizer report, a hang or a huge allocation is a bug.
// Built with libFuzzer (ACTLAB_FUZZ) or with fuzz/replay_main.cpp (the fuzz_replay_* CTest tests).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "actlab/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace actlab::fuzz {

// One directory per process (libFuzzer -jobs/-fork runs several), removed at normal exit.
class Scratch {
 public:
  static Scratch& get() {
    static Scratch s;
    return s;
  }
  const std::filesystem::path& dir() const { return dir_; }
  // Writes bytes to dir/relative (creating parent folders) and returns the full path.
  std::string write(const std::string& relative, const uint8_t* data, size_t size) const {
    const std::filesystem::path p = dir_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    ACTLAB_CHECK(out.flush().good(), "fuzz scratch: cannot write ", p.string());
    return p.string();
  }
  // Empties the directory (targets that build a folder tree per input).
  void clear() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) std::filesystem::remove_all(e.path(), ec);
  }

 private:
  Scratch() : dir_(std::filesystem::temp_directory_path() / ("actlab_fuzz_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

// Little-endian integer from up to 4 bytes at data[at] (missing bytes read as 0).
inline uint32_t take_u32(const uint8_t* data, size_t size, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4 && at + i < size; ++i) v |= uint32_t{data[at + i]} << (8 * i);
  return v;
}

// Called with every actlab::Error a target catches: silent, unless ACTLAB_FUZZ_VERBOSE is set (then
// printed, to see which inputs a parser accepts: `ACTLAB_FUZZ_VERBOSE=1 fuzz_replay_idx fuzz/corpus/idx`).
inline void expected(const Error& e) {
  static const bool verbose = std::getenv("ACTLAB_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  refused: %s\n", e.what());
}

}  // namespace actlab::fuzz
