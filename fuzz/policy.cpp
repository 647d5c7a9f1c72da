// Fuzz target: policy strings (compress/policy.h): parse_policy, PolicySet rules and glob matching.
// Input: text lines; line 1 is the default policy, each further line a "pattern=policy" rule, and
// the last line doubles as a module path to look up. Checked properties besides "no crash":
// a parsed policy's canonical name parses to itself; glob_match agrees with a plain dynamic-
// programming matcher; a tiny tensor packs to exactly expected_bytes() and unpacks to its shape.
// Seeds: fuzz/corpus/policy (fuzz/make_seeds.cpp). Replayed by the fuzz_replay_policy test.
#include <string>
#include <vector>

#include "actlab/compress/policy.h"
#include "fuzz/fuzz_util.h"

namespace {

// Reference glob: '*' any run (also empty), '?' any one character; O(|p|·|t|).
bool glob_reference(const std::string& p, const std::string& t) {
  std::vector<std::vector<char>> m(p.size() + 1, std::vector<char>(t.size() + 1, 0));
  m[p.size()][t.size()] = 1;
  for (size_t i = p.size(); i-- > 0;)
    for (size_t j = t.size() + 1; j-- > 0;) {
      if (p[i] == '*') m[i][j] = m[i + 1][j] || (j < t.size() && m[i][j + 1]);
      else m[i][j] = j < t.size() && (p[i] == '?' || p[i] == t[j]) && m[i + 1][j + 1];
    }
  return m[0][0];
}

void check_policy(const actlab::ActivationCachePolicy& policy) {
  if (actlab::parse_policy(policy.name())->name() != policy.name()) __builtin_trap();
  // A small activation map: enough to run the pooling, quantization and group paths once.
  actlab::PhiloxStream rng(1, 2);
  const actlab::Tensor x = actlab::Tensor::randn({2, 3, 5, 4}, rng);
  const actlab::SaveInfo info{"conv2d", "input", true, "fuzz"};
  const auto packed = policy.pack(x, info, actlab::PackContext{3, 4});
  if (packed->shape() != x.shape() || packed->nbytes() != policy.expected_bytes(x.shape())) __builtin_trap();
  const actlab::Tensor y = policy.unpack(*packed, info);
  if (y.shape() != x.shape()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // the DP reference is quadratic; long strings add nothing
  std::vector<std::string> lines(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') lines.emplace_back();
    else lines.back() += static_cast<char>(data[i]);
  }
  try {
    actlab::PolicySet set(actlab::parse_policy(lines[0]));
    check_policy(set.default_policy());
    for (size_t i = 1; i < lines.size(); ++i) {
      try {
        set.add_rule(lines[i]);
      } catch (const actlab::Error&) {
        continue;  // a bad rule must not spoil the set
      }
      const size_t eq = lines[i].find('=');
      const std::string pattern = lines[i].substr(0, eq);
      for (const std::string& path : {lines.back(), std::string("layer1.0.conv1"), std::string()})
        if (actlab::glob_match(pattern, path) != glob_reference(pattern, path)) __builtin_trap();
    }
    check_policy(set.for_module(lines.back()));
    (void)set.describe();
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
