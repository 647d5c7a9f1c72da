// The main of the fuzz_replay_<target> executables of the normal build: runs the target's
// LLVMFuzzerTestOneInput (fuzz/<target>.cpp, compiled without libFuzzer) once per file under the
// folders or files given, so every seed and every input that once crashed stays a regression test.
// A crash, sanitizer report or uncaught exception fails the run; missing folders are skipped (git
// keeps no empty fuzz/crashes/<target>/).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const char* usage = "usage: fuzz_replay_<target> PATH...: runs the fuzz target once on every file under the paths\n";
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (arg[0] == '-') {
      std::fprintf(stderr, "fuzz replay: error: unknown option %s; %s", arg.c_str(), usage);
      return 2;
    }
    const fs::path root(arg);
    std::error_code ec;
    if (fs::is_regular_file(root, ec)) files.push_back(root);
    if (!fs::is_directory(root, ec)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());  // a stable order makes a failing run easy to repeat
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz replay: error: no input files under the given paths\n");
    return 1;  // a renamed corpus folder must not turn the test into a silent pass
  }
  std::printf("replayed %zu inputs without a crash\n", files.size());
  return 0;
}
