// The --optimizer names, apart from the optimizers themselves, so that configs and grid cells (plain
// data, train/config.h and train/grid.h) can spell them without pulling in autograd.
#pragma once
#include <string>
#include <vector>

namespace actlab {

// The --optimizer names: the one spelling the flags, the configs, the grid ids and the checkpoints use.
inline constexpr const char kSgdName[] = "sgd";
inline constexpr const char kAdamwName[] = "adamw";
// Both names, in the order the help lists them: the one list the flags, the grid and the checks read.
const std::vector<std::string>& optimizer_names();
// How logs and tables write an optimizer's name ("SGD", "AdamW").
const char* optimizer_title(const std::string& name);
// Error naming the known ones unless `name` is one of them.
void check_optimizer_name(const std::string& name);

}  // namespace actlab
