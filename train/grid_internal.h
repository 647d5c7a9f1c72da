// Private to the grid runner: the few helpers that its three sources share — grid.cpp (cells,
// cell directories, child processes), grid_presets.cpp (presets, tables, estimates) and
// grid_report.cpp (results.csv, tables.md, figures). Not part of the library's interface; include
// train/grid.h instead. Tested through grid.h in tests/test_ablate.cpp.
#pragma once
#include <string>

#include "actlab/train/grid.h"

namespace actlab::grid_detail {

// printf-style formatting of one number: fmt("%.2f", 88.931) == "88.93". (grid.cpp)
std::string fmt(const char* format, double v);

// The tables `cell` is listed in, in its order, joined by `sep`: "1c,fig3". (grid.cpp)
std::string table_list(const Cell& cell, const char* sep);

// "division:B=8,Q=2" → "division"; a policy string without parameters is its own kind. (grid_report.cpp)
std::string policy_kind(const std::string& policy);

// Whether a run of `policy` (canonical_policy's spelling) at `precision` trains with exact's gradients bit for
// bit: SWAP at every precision (it offloads the precision's exact keep), checkpointing with exact saves at
// fp32 only (under bf16 it recomputes a segment from its input's bf16 copy: docs/policies.md). The presets
// run such rows on one seed, and tables.md proves them equal to Normal's. (grid_report.cpp)
bool same_gradients_as_exact(const std::string& policy, const std::string& precision);

// The paper's spelling of a data set name, "cifar10" → "CIFAR-10"; unknown names unchanged. (grid_report.cpp)
std::string display_dataset(const std::string& dataset);

}  // namespace actlab::grid_detail
