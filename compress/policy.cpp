// PolicySet, the per-thread policy scope, module-path globbing and CacheStats.
#include "actlab/compress/policy.h"

#include <algorithm>
#include <mutex>

#include "actlab/compress/exact.h"
#include "actlab/core/precision.h"

namespace actlab {
namespace {
thread_local const PolicySet* t_policy_set = nullptr;
std::mutex g_stats_mutex;

// describe() joins the rules, checkpointed modules included, with '|' and '=': a pattern holding either
// would not read back.
void check_rule_pattern(const std::string& pattern) {
  ACTLAB_CHECK(!pattern.empty(), "empty module pattern in a policy rule");
  ACTLAB_CHECK(pattern.find_first_of("|=") == std::string::npos, "module pattern '", pattern,
               "' holds '|' or '=', which separate the rules of a policy string");
}
}  // namespace

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative '*' matching with backtracking to the last star.
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    // '*' first: tested after the literal comparison it would match a '*' in the text literally and
    // never backtrack ("*" against "**" failed; found by fuzz/policy.cpp).
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && (pattern[p] == text[t] || pattern[p] == '?')) {
      ++p; ++t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string save_path(const SaveInfo& info) { return info.module_path + "/" + info.op + "/" + info.role; }

void check_defined_input(const Tensor& x, const std::string& policy) {
  ACTLAB_CHECK(x.defined(), "policy ", policy, ": cannot pack an undefined tensor");
}

namespace {
// A negative extent or a count past kMaxClosedFormElements would give a wrapped size, not an error.
void check_closed_form_shape(const ActivationCachePolicy& policy, const Shape& shape) {
  for (int64_t d : shape)
    ACTLAB_CHECK(d >= 0, "policy ", policy.name(), ": shape dimensions must be >= 0, got ", shape_str(shape));
  ACTLAB_CHECK(shape_numel(shape) <= ActivationCachePolicy::kMaxClosedFormElements, "policy ", policy.name(),
               ": a float32 tensor of shape ", shape_str(shape),
               " has more elements than the closed forms count (2^57)");
}
}  // namespace

size_t ActivationCachePolicy::expected_bytes(const Shape& shape) const {
  check_closed_form_shape(*this, shape);
  return closed_form_bytes(shape);
}

size_t ActivationCachePolicy::layer_expected_bytes(const Shape& shape, const SaveInfo& info) const {
  check_closed_form_shape(*this, shape);
  return layer_closed_form_bytes(shape, info);
}

PolicySet::PolicySet() : default_(std::make_shared<ExactPolicy>()) {}
PolicySet::PolicySet(std::shared_ptr<const ActivationCachePolicy> default_policy)
    : default_(std::move(default_policy)) {
  ACTLAB_CHECK(default_ != nullptr, "PolicySet needs a default policy");
}

void PolicySet::add_rule(const std::string& pattern, std::shared_ptr<const ActivationCachePolicy> policy) {
  check_rule_pattern(pattern);
  ACTLAB_CHECK(policy != nullptr, "policy rule '", pattern, "' has no policy");
  rules_.push_back({pattern, pattern.find('/') != std::string::npos, std::move(policy)});
}

void PolicySet::add_rule(const std::string& rule) {
  const size_t eq = rule.find('=');
  ACTLAB_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < rule.size(), "bad --policy-rule '", rule,
               "': expected MODULE_PATTERN=POLICY, e.g. conv1=exact, layer1.*=quant:Q=4 or layer1.*=checkpoint");
  const std::string pattern = rule.substr(0, eq), policy = rule.substr(eq + 1);
  if (policy == "checkpoint") {
    ACTLAB_CHECK(pattern.find('/') == std::string::npos, "bad --policy-rule '", rule,
                 "': checkpointing takes modules, not saves (drop the '/...' part)");
    check_rule_pattern(pattern);
    checkpoint_.modules.push_back(pattern);
    return;
  }
  ACTLAB_CHECK(policy.compare(0, 11, "checkpoint:") != 0, "bad --policy-rule '", rule,
               "': a rule checkpoints with the bare word (", pattern,
               "=checkpoint); segments=K belongs to the run's policy string");
  add_rule(pattern, parse_policy(policy));
}

void PolicySet::set_checkpoint_segments(int segments) {
  ACTLAB_CHECK(segments > 0 || segments == CheckpointRequest::kAutoSegments, "checkpoint: segments must be >= 1, got ",
               segments);
  checkpoint_.segments = segments;
}

const ActivationCachePolicy& PolicySet::for_module(const std::string& module_path) const {
  for (auto it = rules_.rbegin(); it != rules_.rend(); ++it)
    if (!it->names_saves && glob_match(it->pattern, module_path)) {
      it->matched.set();
      return *it->policy;
    }
  return *default_;
}

const ActivationCachePolicy& PolicySet::for_save(const SaveInfo& info) const {
  std::string path;  // built for the first save rule met: most runs have none, and this runs at every save
  for (auto it = rules_.rbegin(); it != rules_.rend(); ++it) {
    if (it->names_saves && path.empty()) path = save_path(info);
    if (glob_match(it->pattern, it->names_saves ? path : info.module_path)) {
      it->matched.set();
      return *it->policy;
    }
  }
  return *default_;
}

void PolicySet::check_rules_matched(const std::string& model) const {
  for (const auto& rule : rules_)
    ACTLAB_CHECK(rule.matched.get(), "the policy rule for '", rule.pattern, "' matched no save of ", model,
                 " in a training step (module paths: actlab-train --model ", model, " --summary)");
}

std::vector<const ActivationCachePolicy*> PolicySet::policies() const {
  std::vector<const ActivationCachePolicy*> out{default_.get()};
  for (const auto& rule : rules_)
    if (std::find(out.begin(), out.end(), rule.policy.get()) == out.end()) out.push_back(rule.policy.get());
  return out;
}

bool PolicySet::takes_channels_last_flow() const {
  const auto takes = [](const ActivationCachePolicy& p) { return p.is_lossless() || p.takes_channels_last(); };
  return takes(*default_) && std::all_of(rules_.begin(), rules_.end(), [&](const Rule& r) { return takes(*r.policy); });
}

std::string PolicySet::describe() const {
  std::string s;
  if (checkpoint_.segments != 0)
    s = "checkpoint:segments=" +
        (checkpoint_.segments == CheckpointRequest::kAutoSegments ? std::string("auto")
                                                                   : std::to_string(checkpoint_.segments)) +
        "+";
  s += default_->name();
  for (const auto& r : rules_) s += "|" + r.pattern + "=" + r.policy->name();
  for (const auto& m : checkpoint_.modules) s += "|" + m + "=checkpoint";
  return s;
}

std::string checkpoint_forms() {
  return "checkpoint[:segments=K]           checkpoint all but the last of K segments of the model's blocks "
         "(K a count or auto: sqrt(blocks)), exact saves\n"
         "checkpoint[:segments=K]+P         the same, everything kept (segment inputs, recomputed saves) through policy P\n"
         "--policy-rule 'GLOB=checkpoint'   checkpoint each outermost module matching GLOB\n"
         "SET|GLOB=P|...                    SET (any form above) with per-module rules (per save when GLOB has a '/': "
         "MODULE/OP/ROLE), as --policy-rule adds them, "
         "e.g. 'quant:Q=2,R=1|*.attn.proj=division:B=8,Q=2,R=1'";
}

PolicySet parse_policy_set(const std::string& spec) {
  // "SET|PATTERN=POLICY|...": per-module rules after the set, as --policy-rule adds them, so that one
  // string (a grid's or a benchmark's policy list entry, a table's row) names a mixed policy whole.
  if (const size_t bar = spec.find('|'); bar != std::string::npos) {
    PolicySet set = parse_policy_set(spec.substr(0, bar));
    for (size_t at = bar + 1;;) {
      const size_t next = spec.find('|', at);
      const std::string rule = spec.substr(at, next == std::string::npos ? std::string::npos : next - at);
      ACTLAB_CHECK(!rule.empty(), "bad policy '", spec, "': an empty rule after '|' (the form is ",
                   "POLICY|PATTERN=POLICY|..., e.g. quant:Q=2,R=1|*.attn.proj=division:B=8,Q=2,R=1)");
      set.add_rule(rule);
      if (next == std::string::npos) break;
      at = next + 1;
    }
    return set;
  }
  const std::string word = "checkpoint";
  if (spec.compare(0, word.size(), word) != 0) return PolicySet(parse_policy(spec));
  const size_t plus = spec.find('+');
  const std::string head = spec.substr(0, plus);
  const auto bad = [&](const std::string& why) {
    ACTLAB_FAIL("bad policy '", spec, "': ", why, "; checkpoint forms: checkpoint, checkpoint:segments=K, "
                "checkpoint:segments=auto, each optionally followed by +POLICY (e.g. checkpoint:segments=4+division:B=8,Q=2)");
  };
  int segments = CheckpointRequest::kAutoSegments;
  if (head.size() > word.size()) {
    const std::string key = word + ":segments=";
    if (head.compare(0, key.size(), key) != 0) bad("expected segments=K after 'checkpoint:'");
    const std::string value = head.substr(key.size());
    if (value != "auto") {
      if (value.empty() || value.size() > 6 || value.find_first_not_of("0123456789") != std::string::npos)
        bad("segments needs a whole number of at most 6 digits or 'auto', got '" + value + "'");
      segments = std::stoi(value);
      if (segments < 1) bad("segments must be >= 1");
    }
  }
  if (plus != std::string::npos && plus + 1 == spec.size()) bad("nothing after '+'");
  PolicySet set(plus == std::string::npos ? std::make_shared<ExactPolicy>() : parse_policy(spec.substr(plus + 1)));
  set.set_checkpoint_segments(segments);
  return set;
}

ActivationCacheScope::ActivationCacheScope(const PolicySet& set) : previous_(t_policy_set) { t_policy_set = &set; }
ActivationCacheScope::~ActivationCacheScope() { t_policy_set = previous_; }

const PolicySet& current_policy_set() {
  static const PolicySet exact_everywhere;
  return t_policy_set ? *t_policy_set : exact_everywhere;
}

// ---------------------------------------------------------------- CacheStats
CacheStats& CacheStats::global() {
  static CacheStats* stats = new CacheStats();
  return *stats;
}

std::string CacheStats::record_pack(const SaveInfo& info, const std::string& policy, const Shape& shape,
                                    int64_t bytes_raw, int64_t bytes_packed, int64_t bytes_expected, double seconds) {
  if (!enabled_) return "";
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  std::string key = save_path(info) + "|" + policy + "|";
  for (const int64_t d : shape) key += std::to_string(d) + ",";
  auto it = index_.find(key);
  if (it == index_.end()) {
    it = index_.emplace(key, entries_.size()).first;
    CacheEntryStats e;
    e.module_path = info.module_path;
    e.op = info.op + (info.role.empty() ? "" : "." + info.role);
    e.lossy = info.lossy_ok;
    e.policy = policy;
    e.shape = shape;
    entries_.push_back(e);
  }
  CacheEntryStats& e = entries_[it->second];
  e.packs += 1;
  e.bytes_raw += bytes_raw;
  e.bytes_packed += bytes_packed;
  e.bytes_expected += bytes_expected;
  e.pack_seconds += seconds;
  return key;
}

void CacheStats::record_unpack(const std::string& row, double seconds) {
  if (!enabled_ || row.empty()) return;
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  auto it = index_.find(row);  // gone after a reset(): the unpack belongs to a step no longer reported
  if (it != index_.end()) entries_[it->second].unpack_seconds += seconds;
}

void CacheStats::reset() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  entries_.clear();
  index_.clear();
}

std::vector<CacheEntryStats> CacheStats::entries() const {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return entries_;
}

int64_t CacheStats::total_raw() const {
  int64_t s = 0;
  for (const auto& e : entries()) s += e.bytes_raw;
  return s;
}
int64_t CacheStats::total_packed() const {
  int64_t s = 0;
  for (const auto& e : entries()) s += e.bytes_packed;
  return s;
}
int64_t CacheStats::total_expected() const {
  int64_t s = 0;
  for (const auto& e : entries()) s += e.bytes_expected;
  return s;
}

const ExactPolicy& exact_policy() {
  static const ExactPolicy* p = new ExactPolicy();
  return *p;
}
const Bf16Policy& bf16_policy() {
  static const Bf16Policy* p = new Bf16Policy();
  return *p;
}
const F16Policy& f16_policy() {
  static const F16Policy* p = new F16Policy();
  return *p;
}
const ActivationCachePolicy& exact_keep_policy() {
  if (compute_precision() == Precision::BF16) return bf16_policy();
  if (compute_precision() == Precision::F16) return f16_policy();
  return exact_policy();
}

}  // namespace actlab
