// SavedTensor: a tensor kept for backward, as the activation-cache policy stored it.
// Owns the pack-once table's key (storage id, offset, version, shape, policy) shared between consumers.
// Tested in tests/test_autograd.cpp.
#pragma once
#include <memory>

#include "actlab/compress/policy.h"

namespace actlab {

// A policy's pack plus what is needed to unpack it. Shared when two consumers save one tensor.
struct PackedEntry {
  std::unique_ptr<Packed> packed;
  const ActivationCachePolicy* policy = nullptr;  // owned by the PolicySet in force (outlives the step)
  SaveInfo info;  // of the first consumer (module path, op)
  // The saved tensor's storage and its version at the save: an unpack while it lives at another version
  // (an in-place write between forward and backward) is an Error, not a gradient of other values. Weak, so
  // that a lossy pack does not keep the tensor it replaced alive.
  std::weak_ptr<Storage> source;
  uint64_t source_version = 0;
};

class SavedTensor {
 public:
  SavedTensor() = default;
  // Packs t through the policy for info.module_path when info.lossy_ok, else keeps it exactly;
  // reuses an identical pack made earlier in this step (pack once).
  SavedTensor(const Tensor& t, const SaveInfo& info);
  Tensor unpack() const;
  // The policy's unpack_blocked (undefined when it has none for this pack); timed as an unpack.
  Tensor unpack_blocked(int channel_block) const;
  // The policy's unpack_channels_last, else unpack() transposed to channels-last; timed as an unpack.
  Tensor unpack_channels_last() const;
  // The policy's unpack_bf16 (undefined when it has no bf16 form of this pack); timed as an unpack when it
  // returns one (a view of the policy's own copy for bf16, SWAP's fetch back from the host, the plane
  // codecs' channel-by-channel decode under bf16).
  Tensor unpack_bf16() const;
  // The bf16 copy a bf16 run's exact keep holds (a view, no work, not timed as an unpack); undefined for every
  // other pack, a SWAP one included (its unpack_bf16 fetches). The forward of the op that saved it may compute
  // on it (conv2d under bf16 on the CPU: autograd/functions_conv.cpp).
  Tensor exact_bf16_keep() const;
  // The policy's channel_reader (nullptr when it has none for this pack). Its reads are timed and
  // recorded as one unpack when the reader is destroyed; the reader must not outlive this SavedTensor.
  std::unique_ptr<ChannelReader> channel_reader() const;
  size_t nbytes() const { return entry_ ? entry_->packed->nbytes() : 0; }
  // The policy's gradient-sensitivity hooks, for the pack's first consumer (ActivationCachePolicy).
  bool wants_gradient_sensitivity() const;
  void observe_gradient_sensitivity(const GradientSensitivity& s) const;
  bool defined() const { return entry_ != nullptr; }
 private:
  // Checks that there is an entry and that its source was not written in place since the save.
  void check_unchanged() const;
  std::shared_ptr<PackedEntry> entry_;
  SaveInfo info_;
  // In CacheStats. A checkpoint's recomputed saves are not: the report and the memory table describe
  // what forward keeps until backward, and the recompute's cost is counted as its own (RecomputeStats).
  bool recorded_ = true;
  std::string stats_row_;  // the CacheStats row this save was recorded in, which its unpacks are timed in

};

// Seed for stochastic rounding of this run (element i of pack number p in step s draws
// philox(seed, (s << 24) | p, i)). Set once by the trainer.
void set_pack_seed(uint64_t seed);
// Called by the tape at the end of a step: forgets the pack-once table, advances the step counter.
void end_pack_step();
uint64_t pack_step();
void set_pack_step(uint64_t step);

}  // namespace actlab
