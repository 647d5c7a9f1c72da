// The rule of direction of docs/architecture.md §1, checked on the sources: a folder includes only
// folders below it in that list. The list is read from the document itself, so the rule tested is the
// rule written; a folder of sources that the list does not name fails too (a new folder needs its line).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ACTLAB_SOURCE_DIR;

// Top-level folder names of the §1 block, top (may include the most) first. Sub-folders listed there
// (core/cpu/, layers/optim/ ...) belong to their top-level folder's layer.
std::vector<std::string> layer_order() {
  std::ifstream in(kRoot / "docs" / "architecture.md");
  REQUIRE_MESSAGE(in.good(), "cannot read docs/architecture.md");
  std::vector<std::string> order;
  std::string line;
  bool in_section = false, in_block = false;
  while (std::getline(in, line)) {
    if (line.rfind("## 1.", 0) == 0) in_section = true;
    else if (in_section && line.rfind("```", 0) == 0) {
      if (in_block) break;
      in_block = true;
    } else if (in_block) {
      const std::string first = line.substr(0, line.find_first_of(" \t"));
      const std::string top = first.substr(0, first.find('/'));
      if (!top.empty() && first.find('/') != std::string::npos &&
          std::find(order.begin(), order.end(), top) == order.end())
        order.push_back(top);
    }
  }
  return order;
}

bool is_source(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".cpp" || e == ".h" || e == ".cu" || e == ".cuh";
}

}  // namespace

TEST_CASE("layering: no file includes a folder above its own in docs/architecture.md") {
  const std::vector<std::string> order = layer_order();
  REQUIRE(order.size() >= 8);  // the document lists apps/ ... core/
  // Test and fuzz code may include anything; they are not layers of the library.
  const std::set<std::string> free_folders = {"tests", "fuzz", "third_party"};
  std::map<std::string, size_t> rank;
  for (size_t i = 0; i < order.size(); ++i) rank[order[i]] = i;
  for (const char* f : {"core", "autograd", "compress", "layers", "train", "apps", "io"})
    CHECK_MESSAGE(rank.count(f) == 1, "docs/architecture.md §1 does not list ", f, "/");

  const std::regex include_re(R"(^\s*#\s*include\s+"(actlab/)?([A-Za-z_0-9]+)/[^"]+")");
  std::vector<std::string> violations;
  size_t files = 0, includes = 0;
  for (const auto& top : fs::directory_iterator(kRoot)) {
    const std::string name = top.path().filename().string();
    if (!top.is_directory() || name.empty() || name[0] == '.' || name.rfind("build", 0) == 0) continue;
    bool has_sources = false;
    for (const auto& e : fs::recursive_directory_iterator(top.path()))
      if (e.is_regular_file() && is_source(e.path())) {
        has_sources = true;
        break;
      }
    if (!has_sources || free_folders.count(name)) continue;
    CHECK_MESSAGE(rank.count(name) == 1, "folder ", name, "/ holds sources but docs/architecture.md §1 has no line for it");
    if (!rank.count(name)) continue;
    for (const auto& e : fs::recursive_directory_iterator(top.path())) {
      if (!e.is_regular_file() || !is_source(e.path())) continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      int line_no = 0;
      while (std::getline(in, line)) {
        ++line_no;
        std::smatch m;
        if (!std::regex_search(line, m, include_re)) continue;
        const auto it = rank.find(m[2].str());
        if (it == rank.end()) continue;  // a system header such as "doctest/doctest.h"
        ++includes;
        const std::string where = fs::relative(e.path(), kRoot).string() + ":" + std::to_string(line_no);
        if (it->second < rank[name])
          violations.push_back(where + " includes " + m[2].str() + "/, which is above " + name + "/");
        // Library headers are included under the actlab/ prefix (CMakeLists.txt says why); the project's
        // own programs' folders (bench/) are not installed and have none.
        const bool library_folder = m[2].str() != "apps" && m[2].str() != "bench";
        if (library_folder && !m[1].matched)
          violations.push_back(where + " includes " + m[2].str() + "/ without the actlab/ prefix");
      }
    }
  }
  CHECK(files > 100);     // the walk really saw the sources
  CHECK(includes > 300);
  for (const auto& v : violations) FAIL_CHECK(v);
  CHECK(violations.empty());
}
