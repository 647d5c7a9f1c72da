// The activation-cache policy: how a tensor that backward needs is kept between forward and backward.
// Owns SaveInfo, Packed, ActivationCachePolicy, the policy set in force (default + per-module rules)
// and CacheStats (per save: raw, packed and closed-form bytes, pack/unpack time).
// Tested in tests/test_policies.cpp.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actlab/core/error.h"
#include "actlab/core/tensor.h"

namespace actlab {

// What a node says about a tensor it saves. lossy_ok: backward tolerates an approximation
// (conv/linear/batchnorm inputs); false for masks, indices and anything that must stay exact. SavedTensor
// keeps a save that is not lossy_ok exact whatever the policy (autograd/saved_tensor.cpp); a policy's own
// pack() does not read the flag and codes what it is given.
struct SaveInfo {
  std::string op;           // "conv2d", "linear", "batchnorm2d", "relu", ...
  std::string role;         // "input", "mask", "indices", ...
  bool lossy_ok = false;
  std::string module_path;  // "layer2.0.conv1"
  // The fewest code bits per element this save takes from a lossy policy (0: any). A node sets it when
  // its backward's error grows as the saved values shrink (softmax: kProbabilityBits); a policy with
  // Q-bit codes codes such a save at code_bits(Q, info) instead, in its own layout otherwise.
  int min_bits = 0;
  // The consumer computes on this (N, C, H, W) save channels-last (a bf16 convolution on the CPU whose oneDNN
  // kernels read that layout: autograd/functions_conv.cpp). A policy keeping a 16-bit copy may write it so
  // (compress/exact.h), and the consumer then reads it without a reorder. Only a hint: a pack shared with
  // another consumer serves both, and every consumer takes either layout.
  bool channels_last = false;
};
// The width a Q-bit policy codes this save at: max(Q, info.min_bits).
inline int code_bits(int policy_bits, const SaveInfo& info) { return policy_bits > info.min_bits ? policy_bits : info.min_bits; }
// "layer2.0.conv1/conv2d/input": one save's name, the key of the per-save accounting and what a policy
// rule with a '/' in its pattern is matched against.
std::string save_path(const SaveInfo& info);
// The first check of every policy's pack(): an undefined tensor is one error naming the policy.
void check_defined_input(const Tensor& x, const std::string& policy);

// Where stochastic rounding draws its numbers: element i of this pack uses philox(seed, stream, i).
struct PackContext {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t step = 0;  // the training step the pack belongs to (pack_step(); policies with per-step state)
};

// What a node measures in backward for a policy whose choice depends on the gradient (acgc): to first
// order, an error dx in the saved input changes the gradient the node computes from it by at most
// sensitivity * |dx|^2 in squared norm, and `reference` is the squared norm of that exact gradient.
// Conv2d/linear: 2 * (kernel area / stride area) * |dy|^2 against |dW|^2; batch norm: the mean over
// channels of (gamma rstd^2 dgamma / M)^2 against |dx|^2 (docs/policies.md, "acgc").
struct GradientSensitivity {
  double sensitivity = 0;
  double reference = 0;
};

// What stays in memory until backward. Packed bytes are allocated under MemTag::ActivationPacked.
class Packed {
 public:
  virtual ~Packed() = default;
  virtual size_t nbytes() const = 0;     // bytes held until backward
  virtual const Shape& shape() const = 0;
};

// `p` as the Packed type a policy makes, or one Error naming `policy`: a pack handed to a policy that did not
// make it (library code mixing policies) must fail, not be read as the wrong type.
template <typename P>
const P& packed_as(const Packed& p, const std::string& policy) {
  const auto* q = dynamic_cast<const P*>(&p);
  ACTLAB_CHECK(q != nullptr, "policy ", policy, " cannot unpack a pack it did not make (shape ", shape_str(p.shape()),
               ")");
  return *q;
}

// Reads a 4-D (N, C, H, W) pack one channel at a time (ActivationCachePolicy::channel_reader).
class ChannelReader {
 public:
  virtual ~ChannelReader() = default;
  // Writes the planes (n, c), n < N, of channel c one after another into out (N·H·W f32), with exactly
  // the values unpack() gives. May be called from several threads at once (for different channels).
  virtual void read(int64_t c, float* out) const = 0;
  virtual const Shape& shape() const = 0;  // (N, C, H, W) of the pack
};

class ActivationCachePolicy {
 public:
  virtual ~ActivationCachePolicy() = default;
  // x: the tensor to keep (any shape; contiguous f32 for lossy policies). Must not keep a reference
  // to x unless the policy stores x itself (exact).
  virtual std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const = 0;
  // Returns a fresh f32 tensor of p.shape() (exact: the stored tensor itself).
  virtual Tensor unpack(const Packed& p, const SaveInfo& info) const = 0;
  // The same values in the channel-blocked layout (N, C/channel_block, H, W, channel_block) of a 4-D (N, C, H, W) pack,
  // for a consumer that computes in that layout (ops::conv2d_backward_weight_input_block); an undefined
  // tensor when this policy cannot write it directly (the consumer then takes unpack() and reorders).
  virtual Tensor unpack_blocked(const Packed& /*p*/, const SaveInfo& /*info*/, int /*channel_block*/) const { return {}; }
  // The same values laid out channels-last (Tensor::is_channels_last) for a consumer computing in that layout (batch
  // norm's backward in a bf16 run's channels-last flow), written so directly; an undefined tensor when this policy
  // cannot (the consumer then transposes unpack()'s).
  virtual Tensor unpack_channels_last(const Packed& /*p*/, const SaveInfo& /*info*/) const { return {}; }
  // The values as a BF16 tensor where this policy holds them so (bf16: its copy itself, not a new one; swap:
  // its offloaded bf16 copy, brought back) or can decode them so under --precision bf16 (the plane codecs:
  // unpack()'s values rounded, with no f32 tensor in between), for a consumer that computes in bf16 and
  // would only round unpack()'s f32 again; else an undefined tensor.
  virtual Tensor unpack_bf16(const Packed& /*p*/, const SaveInfo& /*info*/) const { return {}; }
  // A reader for a consumer that goes over the channels of a 4-D pack (batch-norm backward; the plane
  // codecs' unpack_bf16): each channel is decoded into the consumer's buffer, which stays in cache, and the
  // full-size f32 tensor is never written.
  // nullptr when this policy has none for this pack (the consumer then takes unpack()). The reader refers
  // to p, which must outlive it.
  virtual std::unique_ptr<ChannelReader> channel_reader(const Packed& /*p*/, const SaveInfo& /*info*/) const {
    return nullptr;
  }
  virtual std::string name() const = 0;    // the canonical string, parseable by parse_policy
  // The closed-form number of bytes pack() holds for an f32 tensor of this shape. Throws Error for a shape
  // with a negative extent or more than kMaxClosedFormElements elements.
  size_t expected_bytes(const Shape& shape) const;
  // The closed form for this layer's save (what CacheStats records right after pack()): equal to
  // expected_bytes(shape) unless the policy keeps per-layer state that sets the size (acgc's widths) or
  // the save asks for wider codes than the policy's (SaveInfo::min_bits). Throws as expected_bytes does.
  size_t layer_expected_bytes(const Shape& shape, const SaveInfo& info) const;
  // The closed forms count bits (up to 8 per element, plus per-range headers) in 64-bit sizes: 2^60 elements
  // wrapped blpa's, mesa's and actnn's. 2^57 leaves them 3 bits of headroom.
  static constexpr int64_t kMaxClosedFormElements = int64_t(1) << 57;
  virtual bool is_exact() const { return false; }
  // Whether unpack gives back every value bit for bit (exact; swap, which only moves the bytes away).
  virtual bool is_lossless() const { return is_exact(); }
  // Whether pack() takes a channels-last 4-D tensor on the CPU as it is (Tensor::is_channels_last, a bf16 run's
  // activations: the bf16 keep, the plane codecs); the others are handed a contiguous copy (SavedTensor).
  virtual bool takes_channels_last() const { return false; }
  // Whether backward should measure the gradient sensitivity of this save (Node::observe_sensitivity),
  // and where it is reported. info is that of the pack's first consumer; a shared pack's consumers all
  // report to it (their sensitivities add up, as the gradient errors they cause do).
  virtual bool wants_gradient_sensitivity(const SaveInfo& /*info*/) const { return false; }
  virtual void observe_gradient_sensitivity(const SaveInfo& /*info*/, const GradientSensitivity& /*s*/) const {}

 private:
  // Each policy's closed forms, reached only through expected_bytes and layer_expected_bytes, which check
  // the shape first: one check for every policy, not one per closed form.
  virtual size_t closed_form_bytes(const Shape& shape) const = 0;
  virtual size_t layer_closed_form_bytes(const Shape& shape, const SaveInfo& /*info*/) const {
    return closed_form_bytes(shape);
  }
};

// Parses "exact", "division:B=8,Q=2", "quant:Q=2", "lfc:B=8", "hfc:B=8,Q=2", "hfc:B=8",
// "pergroup:G=256,Q=2", "actnn:G=256,Q=2", "blpa:Q=4", "mesa:Q=8", "acgc:E=0,I=100,G=256". Throws Error naming the accepted forms on
// anything else.
std::shared_ptr<const ActivationCachePolicy> parse_policy(const std::string& spec);
// One line per accepted form, for --help and error messages.
std::string policy_forms();

// Which modules keep only their input and recompute their forward in backward (gradient checkpointing;
// the tape side is autograd/checkpoint.h, the choice of modules layers/checkpoint.h). It belongs to the
// policy set because it is the same decision — what the network keeps for backward — and every tool
// that takes a policy string (trainer, memtable, bench_train, ablation grids) then takes it too.
struct CheckpointRequest {
  // Cut the model's chain of blocks into this many segments of consecutive blocks and checkpoint all
  // but the last (torch.utils.checkpoint.checkpoint_sequential's rule); kAutoSegments: round(sqrt(blocks)).
  static constexpr int kAutoSegments = -1;
  int segments = 0;                   // 0: no segments
  std::vector<std::string> modules;   // globs: each outermost matching module is its own segment
  bool any() const { return segments != 0 || !modules.empty(); }
};

// The policies in force: a default plus rules "pattern=policy" matched against module paths
// ("conv1", "layer1.*", "*.bn1"; '*' matches any run of characters, the last matching rule wins) or,
// when the pattern holds a '/', against save paths ("*/softmax/output", "blocks.*.attn/matmul/rhs":
// save_path), and what is checkpointed. Whatever is kept — a checkpointed segment's input, the saves of its
// recomputed forward — goes through these policies.
class PolicySet {
 public:
  PolicySet();  // exact everywhere
  explicit PolicySet(std::shared_ptr<const ActivationCachePolicy> default_policy);
  void add_rule(const std::string& pattern, std::shared_ptr<const ActivationCachePolicy> policy);
  // "layer1.*=exact"; "layer1.*=checkpoint" checkpoints the outermost matching modules. Throws Error when
  // malformed.
  void add_rule(const std::string& rule);
  void set_checkpoint_segments(int segments);  // > 0 or CheckpointRequest::kAutoSegments
  const ActivationCachePolicy& for_module(const std::string& module_path) const;
  // The policy of one save: the last rule whose pattern matches its module path, or its save path
  // for a pattern with a '/'.
  const ActivationCachePolicy& for_save(const SaveInfo& info) const;
  const ActivationCachePolicy& default_policy() const { return *default_; }
  const std::shared_ptr<const ActivationCachePolicy>& shared_default() const { return default_; }
  // The default and every rule's policy, each once, in that order (reports of per-policy state: acgc's widths).
  std::vector<const ActivationCachePolicy*> policies() const;
  // Whether every policy in force keeps its values exactly or takes a channels-last save as it is
  // (ActivationCachePolicy::takes_channels_last): only then do a bf16 run's activations stay channels-last
  // between convolutions (autograd/functions_conv.cpp). Asked at every convolution, so it builds no list.
  bool takes_channels_last_flow() const;
  const CheckpointRequest& checkpoint() const { return checkpoint_; }
  // "checkpoint:segments=4+division:B=8,Q=2|conv1=exact|layer1.*=checkpoint", which parse_policy_set reads back.
  std::string describe() const;
  // Throws Error naming the first codec rule that no for_module or for_save call has matched yet. Called
  // after a whole training step of `model` (a checkpointed segment's saves are looked up in its recompute):
  // such a rule names nothing there (a typo such as "conv9=exact"), or every save it names is taken by a
  // later rule, and training on would ignore it silently. Checkpoint rules are checked by the checkpoint plan.
  void check_rules_matched(const std::string& model) const;
 private:
  std::shared_ptr<const ActivationCachePolicy> default_;
  struct Rule {
    std::string pattern;
    bool names_saves;  // the pattern holds a '/': matched against save_path, not the module path
    std::shared_ptr<const ActivationCachePolicy> policy;
    // A lookup has returned this rule. Diagnostics for check_rules_matched only: no lookup reads it. Atomic
    // (relaxed) because the lookups are const and a set may serve models on several threads at once.
    struct Flag {
      mutable std::atomic<bool> value{false};
      Flag() = default;
      Flag(const Flag& o) : value(o.value.load(std::memory_order_relaxed)) {}
      Flag& operator=(const Flag& o) {
        value.store(o.value.load(std::memory_order_relaxed), std::memory_order_relaxed);
        return *this;
      }
      void set() const { value.store(true, std::memory_order_relaxed); }
      bool get() const { return value.load(std::memory_order_relaxed); }
    } matched;
  };
  std::vector<Rule> rules_;
  CheckpointRequest checkpoint_;
};

// A run's policy string: a policy (parse_policy), "checkpoint[:segments=K]" (K a count or auto;
// checkpointing with exact saves) or "checkpoint[:segments=K]+POLICY" (checkpointing, whatever is kept
// through POLICY), each optionally followed by per-module rules "|PATTERN=POLICY" (add_rule's form), as
// describe() writes them. Throws Error naming the accepted forms.
PolicySet parse_policy_set(const std::string& spec);
// The checkpoint forms, for --help (one line each).
std::string checkpoint_forms();
bool glob_match(const std::string& pattern, const std::string& text);

// The policy set used by autograd while this scope is alive (per thread; default: exact).
class ActivationCacheScope {
 public:
  explicit ActivationCacheScope(const PolicySet& set);
  ~ActivationCacheScope();
  ActivationCacheScope(const ActivationCacheScope&) = delete;
  ActivationCacheScope& operator=(const ActivationCacheScope&) = delete;
 private:
  const PolicySet* previous_;
};
const PolicySet& current_policy_set();

// Accounting of what went through a policy, a row per save path, policy and shape (CacheStats::record_pack).
struct CacheEntryStats {
  std::string module_path;
  std::string op;
  std::string policy;
  Shape shape;
  bool lossy = false;          // SaveInfo::lossy_ok: offered to the policy (conv/linear/BN inputs)
  int64_t packs = 0;
  int64_t bytes_raw = 0;       // f32 bytes of the tensors offered
  int64_t bytes_packed = 0;    // nbytes() of what was kept
  int64_t bytes_expected = 0;  // closed form for the same shapes
  double pack_seconds = 0;
  double unpack_seconds = 0;
};
class CacheStats {
 public:
  static CacheStats& global();
  // Adds a pack to its row and returns the row's key for record_unpack ("" while disabled). A row is one save
  // path with one policy and shape: a module that saves twice under one path (attention's two products:
  // matmul/lhs is q and the probabilities) gets a row per save, each with its own shape and bytes.
  std::string record_pack(const SaveInfo& info, const std::string& policy, const Shape& shape, int64_t bytes_raw,
                          int64_t bytes_packed, int64_t bytes_expected, double seconds);
  void record_unpack(const std::string& row, double seconds);
  void reset();
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  std::vector<CacheEntryStats> entries() const;  // in first-seen order
  int64_t total_raw() const;
  int64_t total_packed() const;
  int64_t total_expected() const;
 private:
  std::atomic<bool> enabled_{true};  // read by packs on any thread, outside the mutex
  std::vector<CacheEntryStats> entries_;
  std::map<std::string, size_t> index_;  // row key (save path, policy, shape) -> entries_ slot
};

}  // namespace actlab
