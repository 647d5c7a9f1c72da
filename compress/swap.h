// SWAP, the offloading baseline: a save leaves the device right after forward packs it and comes back
// when backward needs it, prefetched ahead so the copy overlaps the backward of the layers in between.
// Tested in tests/test_baselines.cpp.
//
// What moves: every tensor a policy is offered (conv, linear, batch-norm, LayerNorm, GELU, softmax and
// matmul inputs), kept exactly; masks, indices and statistics stay where they are, as under every policy.
// In what form: the precision's exact keep. Under --precision bf16 (fp16) the save is rounded to a 16-bit
// copy before it leaves, as exact keeps it, so SWAP moves half the bytes and backward reads the values
// exact@bf16 reads (its gradients are exact@bf16's, bit for bit); unpack widens it back to f32.
// Where it goes: host memory under MemTag::Offloaded. On a CPU run the host *is* the device, so the copy
// goes to a pool tagged apart: the accounting (device bytes vs host bytes) and the correctness of the
// round trip are what a CPU run tests, and the copy costs a memcpy each way.
// Prefetch: backward unpacks saves in about the reverse of the order forward packed them, so when save
// k is unpacked the policy starts bringing back the `ahead` saves packed just before it; an unpack that
// finds its save on the way waits for that copy instead of starting another.
// On the CPU the copies back run on a copy thread of the policy's own.
// On a GPU both directions run on the device's copy stream (core/cuda/transfer.h), into and out of
// pinned host memory (the Offloaded blocks come from the pinned allocator once CUDA is initialised):
// pack queues the copy out and returns, keeping the device tensor until its copy is done (retired when a
// later pack or unpack finds it done), so the offload overlaps the rest of forward; a prefetch queues the
// copy back and returns, and the unpack makes the compute stream wait for it.
// The bound F (MiB, default kDefaultInFlightMiB; 0: none): once more than F MiB of earlier saves are still
// on their way out, pack waits for the oldest of those copies (its own, already queued, does not count, so
// it overlaps what forward does next however large it is). Without the bound a fast GPU finishes forward
// long before the copies out do, and the saves are still on the device when backward starts (an H200 kept
// 1028.5 of exact's 1156.5 MiB for ResNet-18 b256: docs/policies.md); with it forward runs no faster than
// the copies drain, and the device holds at most F MiB of leaving saves plus the newest.
// The copy out reads the save after pack returned, so a later kernel writing that tensor in place would
// race with it; forward writes no tensor it has offered for saving (in-place ops act on gradients).
// Whether the copies really hide behind the kernels is measured on a GPU
// (scripts/gpu-check.sh: bench_cuda's swap rows).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/core/cuda/transfer.h"

namespace actlab {

// One offloaded save: the host copy and, once brought back, the device copy waiting for its unpack.
struct SwapState {
  enum class Where { Away, Coming, Back };
  Tensor host;     // MemTag::Offloaded, on the host
  Device device;   // where the save lived and goes back to
  DType dtype = DType::F32;  // of the form that left (f32, or the 16-bit copy under bf16/fp16)
  std::mutex mutex;
  std::condition_variable arrived;
  Where where = Where::Away;
  Tensor back;     // Where::Back: the device copy
  size_t index = 0;  // position in the policy's pack order
  // GPU saves: the copy out and the device tensor it reads, kept until that copy is done; the copy back
  // into `back`, which the unpack orders the compute stream behind.
  CopyFence out, in;
  Tensor leaving;
  // The pack that owns this state was destroyed (backward is done with it). The copy thread may hold the
  // state a moment longer, so a freed pack is told by this flag, not by its weak reference expiring.
  std::atomic<bool> released{false};
  // A prefetched copy back that no unpack took (a step that threw after the prefetch): the compute stream
  // waits for it before `back`'s block can be reused there, or the copy would write into another tensor.
  ~SwapState();
};

class PackedSwap final : public Packed {
 public:
  explicit PackedSwap(std::shared_ptr<SwapState> s) : state_(std::move(s)) {}
  // Tells the copy thread, and on the host frees the offloaded copy at once: the copy thread may hold the
  // state a moment after its last copy, and the bytes it kept alive made --check-memory fail at random.
  ~PackedSwap() override;
  size_t nbytes() const override { return 0; }  // nothing stays on the device
  const Shape& shape() const override { return state_->host.shape(); }
  const std::shared_ptr<SwapState>& state() const { return state_; }
 private:
  std::shared_ptr<SwapState> state_;
};

class SwapPolicy final : public ActivationCachePolicy {
 public:
  static constexpr int64_t kDefaultInFlightMiB = 64;
  // ahead: saves brought back ahead of their backward (>= 0); in_flight_mib: the bound F above (>= 0).
  explicit SwapPolicy(int ahead, int64_t in_flight_mib = kDefaultInFlightMiB);
  ~SwapPolicy() override;
  std::unique_ptr<Packed> pack(const Tensor& x, const SaveInfo& info, const PackContext& ctx) const override;
  Tensor unpack(const Packed& p, const SaveInfo& info) const override;
  Tensor unpack_bf16(const Packed& p, const SaveInfo& info) const override;
  std::string name() const override;
  bool is_lossless() const override { return true; }

  // What moved since the policy was made: bytes out to the host, bytes back, and how many unpacks found
  // their save already back (prefetched) or had to copy it themselves.
  // out_waits: packs that waited for older copies out (the bound F; GPU only).
  struct Traffic {
    int64_t bytes_out = 0, bytes_back = 0, prefetched = 0, fetched_on_demand = 0, out_waits = 0;
  };
  Traffic traffic() const;
  // Entries of the prefetch order: the packs of the current step, or, for callers that number no steps,
  // those since the last pack that found every earlier one freed.
  size_t ordered_saves() const;

 private:
  // Device bytes kept: none (the host copy is MemTag::Offloaded, 4·numel bytes, 2·numel under bf16/fp16;
  // StepResult::offloaded_bytes).
  size_t closed_form_bytes(const Shape& shape) const override;
  void copy_thread();
  bool all_freed() const;  // every entry of order_ released by its pack (mutex_ held)
  void prefetch_before(size_t index) const;
  static Tensor bring_back(const SwapState& s);
  // The save back on its device in the form it left in (f32, or the 16-bit copy): unpack's work.
  Tensor fetch(const Packed& p) const;
  // GPU: queues the copy of s.host into a fresh device tensor (s.back, s.in). s.mutex held.
  static void queue_back(SwapState& s);
  // GPU: drops the device tensors whose copy out is done, and waits for the oldest ones while more than
  // `bound` bytes are still leaving (kWaitAll: for every one). Returns whether it waited. mutex_ held.
  bool retire_leaving(int64_t bound) const;
  static constexpr int64_t kNoBound = INT64_MAX, kWaitAll = -1;

  int ahead_;
  int64_t in_flight_bytes_;  // the bound F in bytes; kNoBound for F=0
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;
  // Packs in the order forward made them (weak: a pack freed by backward or a cleared tape drops out).
  mutable std::vector<std::weak_ptr<SwapState>> order_;
  mutable uint64_t order_step_ = ~uint64_t{0};             // the pack step order_ belongs to (PackContext::step)
  mutable std::deque<std::shared_ptr<SwapState>> queue_;  // waiting for the copy thread
  mutable std::deque<std::shared_ptr<SwapState>> leaving_;  // GPU saves whose copy out may still run
  mutable int64_t leaving_bytes_ = 0;                        // their device bytes
  mutable Traffic traffic_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace actlab
