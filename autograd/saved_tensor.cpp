// SavedTensor: packing through the policy in force, the pack-once table and CacheStats records.
#include "actlab/autograd/saved_tensor.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <tuple>

#include "actlab/autograd/checkpoint.h"
#include "actlab/compress/exact.h"

namespace actlab {
namespace {

using Clock = std::chrono::steady_clock;

// Identity of a tensor's contents within a step: same storage, same view, same version.
struct PackKey {
  uint64_t storage_id;
  int64_t offset;
  uint64_t version;
  Shape shape;
  Shape strides;
  const ActivationCachePolicy* policy;
  bool operator<(const PackKey& o) const {
    return std::tie(storage_id, offset, version, shape, strides, policy) <
           std::tie(o.storage_id, o.offset, o.version, o.shape, o.strides, o.policy);
  }
};

struct PackState {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t packs_this_step = 0;
  std::map<PackKey, std::weak_ptr<PackedEntry>> pack_once;  // the pack-once table
};
thread_local PackState t_state;


}  // namespace

void set_pack_seed(uint64_t seed) { t_state.seed = seed; }
uint64_t pack_step() { return t_state.step; }
void set_pack_step(uint64_t step) { t_state.step = step; }
void end_pack_step() {
  t_state.pack_once.clear();
  t_state.packs_this_step = 0;
  t_state.step += 1;
}

SavedTensor::SavedTensor(const Tensor& t, const SaveInfo& info) : info_(info), recorded_(!recomputing()) {
  ACTLAB_CHECK(t.defined(), "saving an undefined tensor in ", info.op, " (", info.module_path, ")");
  const ActivationCachePolicy* policy = &exact_policy();
  const bool lossy = info.lossy_ok && t.dtype() == DType::F32;
  if (lossy) {
    const ActivationCachePolicy& chosen = current_policy_set().for_save(info);
    // An exact lossy save is the precision's exact keep; saves that must stay exact (masks, statistics:
    // lossy_ok false) are untouched.
    policy = chosen.is_exact() ? &exact_keep_policy() : &chosen;
  }
  PackKey key{t.storage()->id(), t.offset(), t.storage()->version(), t.shape(), t.strides(), policy};
  const bool is_param = t.storage()->tag() == MemTag::Param;
  // Pack once: a second consumer of the same tensor shares the first pack, if that pack took the same
  // policy, or if it kept the tensor exact (at the compute precision, or in f32): an exact keep serves any
  // policy at no cost, where packing again would hold a second, lossy copy (a rule '*/softmax/*=exact' left
  // attn·v's operand to pack the same probabilities again). The share is recorded with zero bytes so
  // per-layer reports list it without counting the memory twice.
  PackKey precision_key = key, f32_key = key;
  precision_key.policy = lossy ? &exact_keep_policy() : policy;
  f32_key.policy = &exact_policy();
  for (const PackKey* k : {&key, &precision_key, &f32_key}) {
    auto it = t_state.pack_once.find(*k);
    if (it == t_state.pack_once.end()) continue;
    if (auto shared = it->second.lock()) {
      if (!is_param && recorded_)
        stats_row_ = CacheStats::global().record_pack(info, shared->policy->name() + " (shared)", t.shape(), 0, 0, 0, 0.0);
      entry_ = std::move(shared);
      return;
    }
  }
  auto entry = std::make_shared<PackedEntry>();
  entry->policy = policy;
  entry->info = info;
  entry->source = t.storage();
  entry->source_version = t.storage()->version();
  const PackContext ctx{t_state.seed, (t_state.step << 24) | (t_state.packs_this_step++ & 0xFFFFFF), t_state.step};
  const auto start = Clock::now();
  if (policy->is_exact()) {
    entry->packed = policy->pack(t, info, ctx);
  } else {
    // A channels-last tensor (a bf16 run's activation) goes as it is to the policies that take one (the bf16 keep
    // narrows it in its layout, the plane codecs pack it tile by tile); the others get a contiguous copy.
    const Tensor x = policy->takes_channels_last() ? t.dense() : t.contiguous();
    MemTagScope tag(MemTag::ActivationPacked);
    entry->packed = policy->pack(x, info, ctx);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t raw = static_cast<int64_t>(t.nbytes());
  // Parameters kept by reference cost nothing extra; they stay out of the activation accounting.
  if (!is_param && recorded_)
    stats_row_ = CacheStats::global().record_pack(info, policy->name(), t.shape(), raw,
                                     static_cast<int64_t>(entry->packed->nbytes()),
                                     t.dtype() == DType::F32 ? static_cast<int64_t>(policy->layer_expected_bytes(t.shape(), info))
                                                             : raw,
                                     seconds);
  t_state.pack_once[key] = entry;
  entry_ = std::move(entry);
}

bool SavedTensor::wants_gradient_sensitivity() const {
  return entry_ != nullptr && entry_->policy->wants_gradient_sensitivity(entry_->info);
}

void SavedTensor::observe_gradient_sensitivity(const GradientSensitivity& s) const {
  if (entry_ != nullptr) entry_->policy->observe_gradient_sensitivity(entry_->info, s);
}

void SavedTensor::check_unchanged() const {
  ACTLAB_CHECK(entry_ != nullptr, "unpacking an empty SavedTensor");
  if (const std::shared_ptr<Storage> source = entry_->source.lock())
    ACTLAB_CHECK(source->version() == entry_->source_version, "a tensor saved for backward by ", info_.op,
                 info_.module_path.empty() ? std::string() : " (" + info_.module_path + ")",
                 " was modified in place after it was saved (version ", source->version(), ", saved at ",
                 entry_->source_version, "): backward would compute its gradients from other values");
}

Tensor SavedTensor::unpack() const {
  check_unchanged();
  const auto start = Clock::now();
  Tensor t = entry_->policy->unpack(*entry_->packed, info_);
  if (!entry_->policy->is_exact())
    CacheStats::global().record_unpack(stats_row_, std::chrono::duration<double>(Clock::now() - start).count());
  return t;
}

Tensor SavedTensor::unpack_bf16() const {
  check_unchanged();
  // Timed like unpack_blocked: bf16's view of its own copy, SWAP's fetch back, the plane codecs' decode.
  const auto start = Clock::now();
  Tensor t = entry_->policy->unpack_bf16(*entry_->packed, info_);
  if (t.defined())
    CacheStats::global().record_unpack(stats_row_, std::chrono::duration<double>(Clock::now() - start).count());
  return t;
}

Tensor SavedTensor::exact_bf16_keep() const {
  if (!entry_ || entry_->policy != &exact_keep_policy()) return {};
  const Tensor t = entry_->policy->unpack_bf16(*entry_->packed, info_);  // a view for bf16, undefined for f32/f16
  return t.defined() && t.dtype() == DType::BF16 ? t : Tensor();
}

Tensor SavedTensor::unpack_blocked(int channel_block) const {
  check_unchanged();
  const auto start = Clock::now();
  Tensor t = entry_->policy->unpack_blocked(*entry_->packed, info_, channel_block);
  if (t.defined())
    CacheStats::global().record_unpack(stats_row_, std::chrono::duration<double>(Clock::now() - start).count());
  return t;
}

Tensor SavedTensor::unpack_channels_last() const {
  check_unchanged();
  const auto start = Clock::now();
  Tensor t = entry_->policy->unpack_channels_last(*entry_->packed, info_);
  if (!t.defined()) return unpack().channels_last();  // unpack() records itself
  CacheStats::global().record_unpack(stats_row_, std::chrono::duration<double>(Clock::now() - start).count());
  return t;
}

namespace {
// Times the reads of a policy's ChannelReader. They run on the threads of the consumer's channel loop, so
// the recorded unpack time is their summed time divided by the largest team that called read(): the wall
// time they took with the team decoding at once. Recorded when the reader is destroyed, unless no read
// happened or an exception is unwinding (then there is no unpack to report).
class TimedChannelReader final : public ChannelReader {
 public:
  TimedChannelReader(std::unique_ptr<ChannelReader> inner, std::string row)
      : inner_(std::move(inner)), row_(std::move(row)), exceptions_(std::uncaught_exceptions()) {}
  ~TimedChannelReader() override {
    if (team_.load() == 0 || std::uncaught_exceptions() > exceptions_) return;
    try {
      CacheStats::global().record_unpack(row_, static_cast<double>(nanoseconds_.load()) * 1e-9 / team_.load());
    } catch (...) {  // statistics are not worth terminating for (a destructor must not throw)
    }
  }
  void read(int64_t c, float* out) const override {
    const int team = omp_get_num_threads();
    for (int seen = team_.load(); seen < team && !team_.compare_exchange_weak(seen, team);) {
    }
    const auto start = Clock::now();
    inner_->read(c, out);
    nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }
  const Shape& shape() const override { return inner_->shape(); }
 private:
  std::unique_ptr<ChannelReader> inner_;
  std::string row_;  // its save's CacheStats row
  int exceptions_;
  mutable std::atomic<int64_t> nanoseconds_{0};
  mutable std::atomic<int> team_{0};
};
}  // namespace

std::unique_ptr<ChannelReader> SavedTensor::channel_reader() const {
  check_unchanged();
  std::unique_ptr<ChannelReader> reader = entry_->policy->channel_reader(*entry_->packed, info_);
  if (!reader || stats_row_.empty()) return reader;
  return std::make_unique<TimedChannelReader>(std::move(reader), stats_row_);
}

}  // namespace actlab
