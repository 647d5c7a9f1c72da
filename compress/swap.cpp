// SwapPolicy: saves offloaded to the host after forward, prefetched back for backward (compress/swap.h):
// on the CPU through a copy thread, on a GPU through the copy stream (core/cuda/transfer.h).
#include "actlab/compress/swap.h"

#include "actlab/compress/exact.h"
#include "actlab/core/ops.h"

namespace actlab {

SwapPolicy::SwapPolicy(int ahead, int64_t in_flight_mib)
    : ahead_(ahead), in_flight_bytes_(in_flight_mib > 0 ? in_flight_mib * 1024 * 1024 : kNoBound) {
  ACTLAB_CHECK(ahead >= 0, "swap: P (saves prefetched ahead) must be >= 0, got ", ahead);
  ACTLAB_CHECK(in_flight_mib >= 0 && in_flight_mib <= (int64_t{1} << 40),
               "swap: F (MiB of copies out in flight) must be in [0, 2^40], got ", in_flight_mib);
  thread_ = std::thread([this] { copy_thread(); });
}

SwapPolicy::~SwapPolicy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // A device tensor must outlive the copy reading it: its block could otherwise be reused under it.
    retire_leaving(kWaitAll);
  }
  wake_.notify_all();
  thread_.join();
}

std::string SwapPolicy::name() const {
  const int64_t mib = in_flight_bytes_ == kNoBound ? 0 : in_flight_bytes_ / (1024 * 1024);
  return "swap:P=" + std::to_string(ahead_) + (mib == kDefaultInFlightMiB ? "" : ",F=" + std::to_string(mib));
}

size_t SwapPolicy::closed_form_bytes(const Shape&) const { return 0; }

namespace {
// What leaves the device: what the precision's exact keep keeps (compress/exact.h), always contiguous,
// since the copy moves raw bytes and a strided view (a transpose, a slice) would come back scrambled.
Tensor offloaded_form(const Tensor& view, const SaveInfo& info, const PackContext& ctx) {
  const ActivationCachePolicy& keep = exact_keep_policy();
  const Tensor x = view.contiguous();
  if (&keep == &exact_policy() || x.dtype() != DType::F32) return x;
  SaveInfo contiguous_keep = info;  // not the channels-last copy a convolution's keep may be
  contiguous_keep.channels_last = false;
  return packed_as<PackedHalf>(*keep.pack(x, contiguous_keep, ctx), keep.name()).half();
}
}  // namespace

std::unique_ptr<Packed> SwapPolicy::pack(const Tensor& view, const SaveInfo& info, const PackContext& ctx) const {
  check_defined_input(view, name());
  const Tensor x = offloaded_form(view, info, ctx);
  auto s = std::make_shared<SwapState>();
  s->device = x.device();
  s->dtype = x.dtype();
  s->host = Tensor::empty_tagged(x.shape(), MemTag::Offloaded, x.dtype(), Device::cpu());
  if (x.device().is_cpu()) {
    copy_bytes(s->host.raw_data(), Device::cpu(), x.raw_data(), x.device(), x.nbytes());
  } else {
    s->out = copy_async(s->host.raw_data(), Device::cpu(), x.raw_data(), x.device(), x.nbytes());
    s->leaving = x;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!x.device().is_cpu()) {
    // The bound applies to the copies queued before this one (already on the copy stream): the newest
    // always overlaps the next layers' kernels, even when one save is larger than F.
    if (retire_leaving(in_flight_bytes_)) traffic_.out_waits += 1;
    leaving_.push_back(s);
    leaving_bytes_ += static_cast<int64_t>(x.nbytes());
  }
  // A new step starts a new order, and so does a pack after every earlier one was freed: a caller that
  // numbers no steps (actlab.pack from Python, its PyTorch adapter) would otherwise add an entry per pack
  // forever, each holding its state's memory through the weak reference, and a prefetch near the start of a
  // step would walk all of them. A freed entry is never prefetched again, so dropping them changes nothing.
  if (ctx.step != order_step_ || all_freed()) {
    order_.clear();
    order_step_ = ctx.step;
  }
  s->index = order_.size();
  order_.push_back(s);
  traffic_.bytes_out += static_cast<int64_t>(x.nbytes());
  return std::make_unique<PackedSwap>(std::move(s));
}

bool SwapPolicy::all_freed() const {
  // From the newest: while forward packs, the newest entry is alive and this returns at once.
  for (size_t k = order_.size(); k-- > 0;)
    if (const std::shared_ptr<SwapState> s = order_[k].lock(); s && !s->released.load()) return false;
  return true;
}

size_t SwapPolicy::ordered_saves() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return order_.size();
}

Tensor SwapPolicy::bring_back(const SwapState& s) {
  Tensor t = Tensor::empty_tagged(s.host.shape(), MemTag::Activation, s.host.dtype(), s.device);
  copy_bytes(t.raw_data(), s.device, s.host.raw_data(), Device::cpu(), s.host.nbytes());
  return t;
}

PackedSwap::~PackedSwap() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->released.store(true);
  // A host save not on its way back is no longer read by anyone (the copy thread skips released states); a
  // GPU one may still be read or written by an asynchronous copy, and goes with the state.
  if (state_->device.is_cpu() && state_->where != SwapState::Where::Coming) {
    state_->host = Tensor();
    state_->back = Tensor();
  }
}

SwapState::~SwapState() {
  if (back.defined() && !in.empty()) {
    try {
      in.order_compute();
    } catch (...) {  // a destructor must not throw; a failing device fails its next call anyway
    }
  }
}

void SwapPolicy::queue_back(SwapState& s) {
  Tensor t = Tensor::empty_tagged(s.host.shape(), MemTag::Activation, s.host.dtype(), s.device);
  // Behind the copy out on the same copy stream, so the host bytes are complete when it reads them.
  s.in = copy_async(t.raw_data(), s.device, s.host.raw_data(), Device::cpu(), s.host.nbytes());
  s.back = std::move(t);
  s.where = SwapState::Where::Back;
}

bool SwapPolicy::retire_leaving(int64_t bound) const {
  // The copies of one device finish in the order they were queued (one copy stream), so the first one
  // not done ends the scan unless the bytes still leaving exceed the bound.
  bool waited = false;
  while (!leaving_.empty()) {
    SwapState& s = *leaving_.front();
    if (!s.out.done()) {
      if (bound != kWaitAll && leaving_bytes_ <= bound) break;
      s.out.wait();
      waited = true;
    }
    leaving_bytes_ -= static_cast<int64_t>(s.leaving.nbytes());
    s.leaving = Tensor();
    leaving_.pop_front();
  }
  return waited;
}

Tensor SwapPolicy::unpack(const Packed& p, const SaveInfo&) const {
  const Tensor t = fetch(p);
  if (t.dtype() == DType::BF16) return ops::from_bf16(t);
  if (t.dtype() == DType::F16) return ops::from_f16(t);
  return t;
}

// A consumer that computes in bf16 takes the copy as it came back, as it takes exact@bf16's.
Tensor SwapPolicy::unpack_bf16(const Packed& p, const SaveInfo&) const {
  const SwapState& s = *packed_as<PackedSwap>(p, name()).state();
  return s.dtype == DType::BF16 ? fetch(p) : Tensor();
}

Tensor SwapPolicy::fetch(const Packed& p) const {
  SwapState& s = *packed_as<PackedSwap>(p, name()).state();
  Tensor t;
  bool prefetched = false;
  if (!s.device.is_cpu()) {
    std::lock_guard<std::mutex> lock(mutex_);
    retire_leaving(kNoBound);
  }
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.arrived.wait(lock, [&] { return s.where != SwapState::Where::Coming; });
    prefetched = s.where == SwapState::Where::Back;
    if (s.device.is_cpu()) {
      t = prefetched ? std::move(s.back) : bring_back(s);
    } else {
      if (!prefetched) queue_back(s);
      t = std::move(s.back);
      s.in.order_compute();  // the kernels that read t start after its copy back
      s.in = CopyFence();
    }
    s.back = Tensor();
    s.where = SwapState::Where::Away;  // a second unpack (none in one backward) copies again
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    traffic_.bytes_back += static_cast<int64_t>(t.nbytes());
    (prefetched ? traffic_.prefetched : traffic_.fetched_on_demand) += 1;
  }
  prefetch_before(s.index);
  return t;
}

void SwapPolicy::prefetch_before(size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t queued = 0;
  bool wake = false;
  for (size_t k = index; k-- > 0 && queued < static_cast<size_t>(ahead_);) {
    if (k >= order_.size()) continue;
    std::shared_ptr<SwapState> s = order_[k].lock();
    if (!s) continue;  // freed already
    std::lock_guard<std::mutex> state_lock(s->mutex);
    if (s->released.load()) continue;  // its pack is gone (and a host save's bytes with it)
    ++queued;
    if (s->where != SwapState::Where::Away) continue;
    if (s->device.is_cpu()) {
      s->where = SwapState::Where::Coming;
      queue_.push_back(std::move(s));
      wake = true;
      continue;
    }
    try {
      queue_back(*s);  // the copy stream does the work; nothing waits here
    } catch (const OutOfMemory&) {  // no room yet: the unpack copies it, or reports it
    }
  }
  if (wake) wake_.notify_one();
}

void SwapPolicy::copy_thread() {
  for (;;) {
    std::shared_ptr<SwapState> s;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      s = std::move(queue_.front());
      queue_.pop_front();
    }
    Tensor t;
    try {
      t = bring_back(*s);
    } catch (...) {  // out of memory on the copy thread: leave it to the unpack, which reports it
    }
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      s->back = std::move(t);
      s->where = s->back.defined() ? SwapState::Where::Back : SwapState::Where::Away;
    }
    s->arrived.notify_all();
  }
}

SwapPolicy::Traffic SwapPolicy::traffic() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return traffic_;
}

}  // namespace actlab
