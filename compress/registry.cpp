// parse_policy: the one place policy strings ("division:B=8,Q=2", ...) become policies, and policy_forms,
// the accepted forms for --help and error messages. Tested in tests/test_policies.cpp.
#include <map>
#include <vector>

#include "actlab/compress/acgc.h"
#include "actlab/compress/exact.h"
#include "actlab/compress/policies.h"
#include "actlab/compress/policy.h"
#include "actlab/compress/swap.h"

namespace actlab {
namespace {

struct Form {
  const char* name;
  const char* keys;     // the keys it accepts
  const char* example;  // canonical form with the defaults
  const char* what;
};
const Form kForms[] = {
    {"exact", "", "exact", "keep the f32 tensor (under --precision bf16: a bf16 copy, as bf16 does)"},
    {"bf16", "", "bf16", "keep a bf16 copy (round to nearest even): what an AMP run saves"},
    {"division", "BQR", "division:B=8,Q=2", "bf16 BxB-pooled LFC + Q-bit HFC (DIVISION); R=1: a range per row"},
    {"quant", "QR", "quant:Q=2", "Q-bit per-(sample,channel) x (Fixed Quant, DIVISION w/o LFC)"},
    {"lfc", "B", "lfc:B=8", "bf16 LFC only (DIVISION w/o HFC, LFC-ACT)"},
    {"hfc", "BQR", "hfc:B=8,Q=2 | hfc:B=8", "HFC only, Q-bit or (no Q) f32 (HFC-ACT)"},
    {"pergroup", "GQ", "pergroup:G=256,Q=2", "ActNN-style Q-bit groups of G elements"},
    {"actnn", "GQ", "actnn:G=256,Q=2", "ActNN L3: groups of G, per-sample widths {1,2,4,8} averaging Q"},
    {"blpa", "Q", "blpa:Q=4", "BLPA: Q-bit sign-preserving codes on a fixed +-3 sigma grid per channel"},
    {"mesa", "Q", "mesa:Q=8", "Mesa-style Q-bit codes, one range per head (4-D) or per tensor"},
    {"acgc", "EIG", "acgc:E=0,I=100,G=256",
     "AC-GC: per-layer widths {2,4,8} from a gradient-error bound 2^-E, re-chosen every I steps"},
    {"swap", "PF", "swap:P=2,F=64",
     "offload to host memory, P saves prefetched ahead of backward; on a GPU forward waits beyond F MiB of "
     "copies out in flight (F=0: never) (SWAP)"},
};

std::string compact_forms() {
  std::string s;
  for (const Form& f : kForms) s += (s.empty() ? "" : " | ") + std::string(f.example);
  return s + " (B>=1, G>=1, P>=0, F>=0, Q in {1,2,4,8}, R>=1, E in [0,60], I>=1; actnn: G a multiple of 8; blpa: Q 4 or "
             "8; R: rows per HFC range, default one range per plane; omitted keys take the defaults shown)";
}

[[noreturn]] void bad_policy(const std::string& spec, const std::string& why) {
  ACTLAB_FAIL("bad policy '", spec, "': ", why, "; accepted: ", compact_forms());
}

// "B=8,Q=2" → {B: 8, Q: 2}, keys restricted to `allowed`; values are positive decimal integers.
std::map<char, int64_t> parse_args(const std::string& spec, const std::string& args, const std::string& allowed) {
  std::map<char, int64_t> out;
  size_t at = 0;
  while (at <= args.size()) {
    const size_t comma = std::min(args.find(',', at), args.size());
    const std::string item = args.substr(at, comma - at);
    const size_t eq = item.find('=');
    if (item.empty()) bad_policy(spec, "empty parameter");
    if (eq != 1 || allowed.find(item[0]) == std::string::npos)
      bad_policy(spec, "unknown parameter '" + item + "' (this policy takes " +
                           (allowed.empty() ? std::string("none") : allowed) + ")");
    const std::string value = item.substr(2);
    if (value.empty() || value.size() > 9 || value.find_first_not_of("0123456789") != std::string::npos)
      bad_policy(spec, "parameter " + item.substr(0, 1) + " needs a whole number of at most 9 digits, got '" + value + "'");
    if (!out.emplace(item[0], std::stoll(value)).second) bad_policy(spec, "parameter " + item.substr(0, 1) + " given twice");
    at = comma + 1;
  }
  return out;
}

int64_t arg_or(const std::map<char, int64_t>& args, char key, int64_t fallback) {
  const auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}

}  // namespace

std::string policy_forms() {
  std::string s;
  for (const Form& f : kForms) s += std::string(f.example) + std::string(24 - std::string(f.example).size(), ' ') + f.what + "\n";
  return s + "B >= 1 (pool block), G >= 1 (group size; actnn: a multiple of 8), P >= 0 (prefetch), Q in {1,2,4,8} "
             "(blpa: 4 or 8), R >= 1 (division, quant, hfc with Q: one min and step per R rows of a plane, R=1 one per "
             "token of a (B, T, D) map; default one per plane), E in [0,60] (acgc: allowed gradient error 2^-E), I >= 1 (acgc: steps between "
             "measurements); omitted keys take the defaults shown";
}

std::shared_ptr<const ActivationCachePolicy> parse_policy(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const Form* form = nullptr;
  for (const Form& f : kForms)
    if (name == f.name) form = &f;
  if (!form) bad_policy(spec, "unknown policy name '" + name + "'");
  std::map<char, int64_t> args;
  if (colon != std::string::npos) {
    if (colon + 1 == spec.size()) bad_policy(spec, "nothing after ':'");
    args = parse_args(spec, spec.substr(colon + 1), form->keys);
  }
  const int64_t default_q = name == "mesa" ? 8 : name == "blpa" ? 4 : 2;
  const int64_t B = arg_or(args, 'B', 8), G = arg_or(args, 'G', 256), Q = arg_or(args, 'Q', default_q);
  if (B < 1) bad_policy(spec, "B must be >= 1");
  if (G < 1) bad_policy(spec, "G must be >= 1");
  if (Q != 1 && Q != 2 && Q != 4 && Q != 8) bad_policy(spec, "Q must be 1, 2, 4 or 8, got " + std::to_string(Q));
  if (name == "actnn" && G % 8 != 0) bad_policy(spec, "actnn needs G a multiple of 8, got " + std::to_string(G));
  if (name == "blpa" && Q != 4 && Q != 8) bad_policy(spec, "blpa takes Q 4 or 8 (BLPA's widths), got " + std::to_string(Q));

  const int64_t E = arg_or(args, 'E', 0), I = arg_or(args, 'I', 100);
  if (E > 60) bad_policy(spec, "E must be in [0, 60], got " + std::to_string(E));
  if (I < 1) bad_policy(spec, "I must be >= 1");
  const int64_t R = arg_or(args, 'R', 0);
  if (args.count('R') && R < 1) bad_policy(spec, "R must be >= 1");
  if (args.count('R') && name == "hfc" && !args.count('Q'))
    bad_policy(spec, "R (rows per range) applies to codes: hfc keeps an f32 residual unless Q is given");

  if (name == "exact") return std::make_shared<ExactPolicy>();
  if (name == "bf16") return std::make_shared<Bf16Policy>();
  if (name == "acgc") return std::make_shared<AcgcPolicy>(static_cast<int>(E), I, G);
  if (name == "pergroup") return std::make_shared<PerGroupPolicy>(G, static_cast<int>(Q));
  if (name == "actnn") return std::make_shared<AdaptiveGroupPolicy>(G, static_cast<int>(Q));
  if (name == "blpa") return std::make_shared<BlpaPolicy>(static_cast<int>(Q));
  if (name == "mesa") return std::make_shared<MesaPolicy>(static_cast<int>(Q));
  if (name == "swap")
    return std::make_shared<SwapPolicy>(static_cast<int>(arg_or(args, 'P', 2)),
                                        arg_or(args, 'F', SwapPolicy::kDefaultInFlightMiB));
  PlaneCodecConfig config;
  config.pool_block = B;
  config.bits = static_cast<int>(Q);
  config.range_rows = R;
  if (name == "division") config.kind = PlaneCodecKind::Division;
  if (name == "quant") config.kind = PlaneCodecKind::Quant;
  if (name == "lfc") config.kind = PlaneCodecKind::LfcOnly;
  if (name == "hfc") {
    config.kind = PlaneCodecKind::HfcOnly;
    if (!args.count('Q')) config.bits = 0;  // hfc:B=8 keeps the f32 residual
  }
  return std::make_shared<PlaneCodecPolicy>(config);
}

}  // namespace actlab
