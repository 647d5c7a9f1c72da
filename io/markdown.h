// Markdown table cells, the one place the reports' tables (actlab-ablate's tables.md, actlab-memtable,
// actlab-inspect, the benchmarks) put free text into a cell: a policy string such as
// `quant:Q=2|layer1.*=division:B=8,Q=2` carries '|', which GitHub-flavoured Markdown reads as a column
// break even inside a code span unless it is written `\|`. Tested in tests/test_json.cpp.
#pragma once
#include <string>

namespace actlab {

// `text` with every '|' written as "\|", so that it stays one cell of a Markdown table row.
inline std::string md_cell(const std::string& text) {
  std::string s;
  s.reserve(text.size());
  for (char ch : text) {
    if (ch == '|') s += '\\';
    s += ch;
  }
  return s;
}

}  // namespace actlab
