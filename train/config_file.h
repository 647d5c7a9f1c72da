// The run configuration as text: one table (the option table, in config_file.cpp) declares every
// TrainConfig option once — key, kind, help, default — and from it come actlab-train's flags and
// --help (add_config_flags), the config-file reader (`key = value` lines, `#` comments, repeatable
// `policy-rule`), the effective-configuration text and JSON (logs, checkpoints) and the reverse
// mapping used by --resume. Format documented in docs/example.conf. Tested in tests/test_config_file.cpp.
#pragma once
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actlab/train/cli.h"
#include "actlab/train/config.h"

namespace actlab {

// Sets the field named by the long flag `key` (e.g. "batch-size") from its text form. policy-rule
// appends one rule. Throws Error for an unknown key or a value of the wrong type / out of range.
void set_config_value(TrainConfig& c, const std::string& key, const std::string& value);
// True for keys set_config_value accepts.
bool is_config_key(const std::string& key);
// Declares every key of the table as a flag of `flags` (kind, help, TrainConfig's default).
void add_config_flags(FlagParser& flags);

// Every key with its effective value, in table order; policy-rule appears once per rule.
std::vector<std::pair<std::string, std::string>> config_entries(const TrainConfig& c);
// Where two runs' configurations are compared (the ranks of one job, a resume against its checkpoint), the
// options that only place a process (--device, --threads, --data-workers, --data-dir, --dist-timeout,
// --memory-limit) or say how it reports (--log, --quiet, --summary-json, ...) may differ; the others say
// what is trained.
bool is_placement_or_output_key(const std::string& key);
// The reporting half of those: where a run writes and how much it prints (--log, --memory-report,
// --summary-json, --export-weights, --overwrite, --quiet, --print-every, --check-memory). An evaluation of
// a checkpoint takes these from its own command line, not from the run that saved it.
bool is_output_key(const std::string& key);
// The files among them (--log, --memory-report, --summary-json, --export-weights): what a resume into another
// --save-dir would otherwise rewrite in the first run's name.
bool is_output_file_key(const std::string& key);
// The entries of `a` and `b` that differ, key by key (a repeated key, policy-rule, as its values joined),
// leaving out is_placement_or_output_key and `also_free`: "--lr '0.5' (was '0.1')" per difference, `a`'s
// value first, "" when none differs.
std::string config_differences(const TrainConfig& a, const TrainConfig& b, const std::set<std::string>& also_free = {});
// The same as config-file text ("key = value" lines), loadable with apply_config_file.
std::string config_to_text(const TrainConfig& c);
// The same as a flat JSON object of strings (policy-rule: an array of strings).
std::string config_to_json(const TrainConfig& c);
// Inverse of config_to_json (fields it does not name keep their defaults). Throws Error on bad JSON.
TrainConfig config_from_json(const std::string& json);

// Reads a config file into `c`. Lines: `key = value`, blank, or `# comment` (a `#` after a value
// starts a comment too); a value in double quotes is taken as it is, '#' and end spaces included (\" and
// \\ inside), as config_to_text writes one that needs them. Keys are the long flag names without "--";
// keys listed in `skip` (given on the command line, which overrides the file) are checked but not
// applied; a file with policy-rule lines replaces c.policy_rules. Errors: "FILE:LINE: ...".
void apply_config_file(TrainConfig& c, const std::string& path, const std::set<std::string>& skip = {});

}  // namespace actlab
