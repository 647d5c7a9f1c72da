// GradReducer and bucket assignment (dist/reducer.h).
#include "actlab/dist/reducer.h"

#include <chrono>

#include "actlab/autograd/tape.h"

namespace actlab {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

std::vector<std::vector<size_t>> assign_buckets(const std::vector<int64_t>& param_bytes, int64_t cap_bytes,
                                                int64_t tail_bytes) {
  ACTLAB_CHECK(cap_bytes >= 1, "bucket size must be >= 1 byte, got ", cap_bytes);
  ACTLAB_CHECK(tail_bytes >= 0, "bucket tail size must be >= 0 bytes, got ", tail_bytes);
  const bool taper = tail_bytes > 0 && tail_bytes < cap_bytes;
  int64_t rest = 0;  // bytes not assigned yet
  for (int64_t b : param_bytes) rest += b;
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0, cap = cap_bytes;
  for (size_t i = param_bytes.size(); i-- > 0;) {
    if (buckets.empty() || (filled + param_bytes[i] > cap && !buckets.back().empty())) {
      buckets.emplace_back();
      filled = 0;
      if (taper) cap = std::min(cap_bytes, std::max(tail_bytes, rest / 2));
    }
    buckets.back().push_back(i);
    filled += param_bytes[i];
    rest -= param_bytes[i];
  }
  return buckets;
}

GradReducer::GradReducer(std::vector<Variable> params, Communicator& comm, int64_t bucket_cap_bytes,
                         int64_t bucket_tail_bytes, Averaging averaging)
    : params_(std::move(params)), comm_(comm), averaging_(averaging) {
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < params_.size(); ++i) {
    bytes.push_back(static_cast<int64_t>(params_[i].data().nbytes()));
    index_of_[params_[i].impl().get()] = i;
  }
  buckets_ = assign_buckets(bytes, bucket_cap_bytes, bucket_tail_bytes);
  bucket_of_.resize(params_.size());
  offset_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t n = 0;
    for (size_t i : buckets_[b]) {
      bucket_of_[i] = b;
      offset_[i] = n;
      n += params_[i].data().numel();
    }
    flat_.push_back(Tensor::empty_tagged({n}, MemTag::Grad, DType::F32, params_.front().data().device()));
  }
  pending_.resize(buckets_.size());
  ready_.resize(params_.size());
  work_.resize(buckets_.size());
}

GradReducer::~GradReducer() {
  if (armed_) Tape::current().set_grad_ready_hook(nullptr);
  // A step abandoned by an exception may still have all-reduces in flight that write into flat_.
  for (auto& w : work_) {
    if (!w) continue;
    try {
      w->wait();
    } catch (const std::exception&) {  // the exception that brought us here says what went wrong
    }
  }
}

double GradReducer::seed_factor() const {
  return averaging_ == Averaging::ThroughSeed ? 1.0 / comm_.world_size() : 1.0;
}

void GradReducer::begin_backward() {
  ACTLAB_CHECK(!armed_, "GradReducer: begin_backward twice without finish");
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].size();
  std::fill(ready_.begin(), ready_.end(), false);
  next_to_start_ = 0;
  armed_ = true;
  Tape::current().set_grad_ready_hook([this](VariableImpl& leaf) { grad_ready(leaf); });
}

void GradReducer::grad_ready(VariableImpl& leaf) {
  const auto it = index_of_.find(&leaf);
  if (it == index_of_.end() || ready_[it->second]) return;  // not a parameter (an input that wants a gradient)
  ready_[it->second] = true;
  --pending_[bucket_of_[it->second]];
  // Start in index order only: every rank must issue the same collectives in the same order, and the
  // order in which gradients become final could differ between ranks in principle.
  while (next_to_start_ < buckets_.size() && pending_[next_to_start_] == 0) start_bucket(next_to_start_++);
}

void GradReducer::start_bucket(size_t b) {
  Tensor& flat = flat_[b];
  for (size_t i : buckets_[b]) {
    const Tensor& value = params_[i].data();
    Tensor slot = flat.slice(0, offset_[i], offset_[i] + value.numel());
    const Tensor grad = params_[i].grad();  // undefined: backward did not reach it this step
    if (!grad.defined()) slot.zero_();
    // From the second step on the gradient is a view of its slot (finish), so backward has written it
    // in place: no copy. Anything that replaced the gradient tensor since is copied in as before.
    else if (grad.raw_data() != slot.raw_data()) slot.copy_(grad.reshape({value.numel()}));
  }
  work_[b] = comm_.allreduce_sum_async(flat);
  ++stats_.buckets;
  stats_.bytes += static_cast<int64_t>(flat.nbytes());
}

void GradReducer::finish() {
  ACTLAB_CHECK(armed_, "GradReducer: finish without begin_backward");
  Tape::current().set_grad_ready_hook(nullptr);
  armed_ = false;
  for (size_t b = next_to_start_; b < buckets_.size(); ++b) start_bucket(b);
  next_to_start_ = buckets_.size();
  const float inverse_world = 1.0f / static_cast<float>(comm_.world_size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto wait_start = Clock::now();
    std::unique_ptr<CollectiveWork> work = std::move(work_[b]);
    work->wait();
    stats_.exposed_s += seconds_since(wait_start);
    stats_.comm_s += work->seconds();
    stats_.comm_cpu_s += work->cpu_seconds();
    Tensor& flat = flat_[b];
    if (comm_.world_size() > 1 && averaging_ == Averaging::AfterSum) flat.mul_(inverse_world);
    for (size_t i : buckets_[b]) {
      VariableImpl& p = *params_[i].impl();
      Tensor slot = flat.slice(0, offset_[i], offset_[i] + p.data.numel()).view(p.data.shape());
      // The averaged gradient stays where the all-reduce left it: the parameter's gradient becomes a
      // view of its bucket slot (once; later steps find it there). That saves a copy out here and a
      // copy in at start_bucket per step, and a second gradient-sized buffer per rank.
      if (!p.grad.defined() || p.grad.raw_data() != slot.raw_data() || p.grad.shape() != slot.shape())
        p.grad = std::move(slot);
      p.grad_stale = false;
    }
  }
  ++stats_.steps;
}

void GradReducer::cancel() {
  if (!armed_) return;
  Tape::current().set_grad_ready_hook(nullptr);
  armed_ = false;
  for (auto& w : work_) {
    if (w) w->wait();  // cannot happen before backward, but never leave a transfer writing into flat_
    w.reset();
  }
}

}  // namespace actlab
