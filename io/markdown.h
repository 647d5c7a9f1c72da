// Markdown table cells, the one place the reports' tables (actlab-ablate's tables.md, actlab-memtable,
// actlab-inspect, the benchmarks) put free text into a cell: a policy string such as
// `quant:Q=2|layer1.*=division:B=8,Q=2` carries '|', which GitHub-flavoured Markdown reads as a column
// break even inside a code span unless it is written `\|`. Tested in tests/test_json.cpp.
#pragma once
#include <cmath>
#include <cstdio>
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

// A figure rounded, in fixed notation, to `digits` significant digits from 1 up (10.5689 → "10.57",
// 8.29992 → "8.300", 1234.6 → "1235": at least a whole number) and to digits − 1 decimals below 1
// (0.12345 → "0.123"). Tables print ratios and seconds with it so that their columns read alike and the
// last digit is rounded, not cut off.
inline std::string md_number(double v, int digits = 4) {
  int decimals = digits - 1;
  // A value that rounds up to the next power of ten at this many decimals has one more whole digit.
  for (double a = std::fabs(v); decimals > 0 && a >= 10 - 0.5 * std::pow(10.0, -decimals); a /= 10) --decimals;
  char s[64];
  std::snprintf(s, sizeof s, "%.*f", decimals, v);
  return s;
}

}  // namespace actlab
