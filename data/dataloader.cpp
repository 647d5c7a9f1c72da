// DataLoader: epoch order, batch assembly (split over a pool of helper threads) and the
// producer/consumer hand-off (see data/dataloader.h).
// Tested in tests/test_data.cpp.
#include "actlab/data/dataloader.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>
#include <utility>

#include "actlab/core/philox.h"

namespace actlab {
namespace {

// Shuffle draws use their own Philox stream family (top bits 0x5), apart from augmentation (0xA).
constexpr uint64_t kShuffleStreamTag = 0x5000000000000000ull;

}  // namespace

// Helper threads that share one batch's samples with the thread calling run(). Each sample's bytes
// depend only on its index, so which thread takes which sample changes nothing in the batch.
class SamplePool {
 public:
  explicit SamplePool(int helpers) {
    for (int h = 0; h < helpers; ++h) threads_.emplace_back(&SamplePool::helper_main, this, h + 1);
  }
  ~SamplePool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  // Runs fill(i, slot) for every i in [0, n) on the helpers and the calling thread (slot 0; helper
  // h is slot h) and returns when all are done. fill must not throw.
  void run(int64_t n, const std::function<void(int64_t, int)>& fill) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fill_ = &fill;
      n_ = n;
      next_ = 0;
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    work_.notify_all();
    take_samples(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fill_ = nullptr;
  }

 private:
  void take_samples(int slot) {
    for (int64_t i = next_++; i < n_; i = next_++) (*fill_)(i, slot);
  }
  void helper_main(int slot) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      take_samples(slot);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable work_, done_;
  const std::function<void(int64_t, int)>* fill_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;              // helpers still in the current run, guarded by mutex_
  uint64_t generation_ = 0;  // one per run(), guarded by mutex_
  bool stop_ = false;
};

DataLoader::DataLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed,
                       bool drop_last, TransformConfig transforms, int prefetch_depth, int workers)
    : dataset_(dataset),
      spec_(dataset.spec()),
      size_(dataset.size()),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      transforms_(std::move(transforms)),
      prefetch_depth_(static_cast<size_t>(std::max(prefetch_depth, 1))),
      workers_(workers) {
  ACTLAB_CHECK(batch_size >= 1, "batch size must be >= 1, got ", batch_size);
  ACTLAB_CHECK(size_ >= 1, "data set '", dataset.name(), "' is empty");
  ACTLAB_CHECK(!drop_last || batch_size <= size_, "batch size ", batch_size,
               " is larger than data set '", dataset.name(), "' (", size_,
               " examples) and drop_last is set: an epoch would have no batches");
  ACTLAB_CHECK(prefetch_depth >= 1, "prefetch depth must be >= 1, got ", prefetch_depth);
  ACTLAB_CHECK(workers >= 1 && workers <= 256, "data workers must be in [1, 256], got ", workers);
  ACTLAB_CHECK(spec_.image_bytes() > 0, "data set '", dataset.name(), "' has empty images (",
               spec_.channels, "x", spec_.height, "x", spec_.width, ")");
  affine_ = make_pixel_affine(transforms_, spec_.channels);  // validates transforms_
  num_batches_ = drop_last ? size_ / batch_size : (size_ + batch_size - 1) / batch_size;
  if (workers_ > 1) pool_ = std::make_unique<SamplePool>(workers_ - 1);
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::queue_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(queue_peak_);
}

int64_t DataLoader::max_bytes_held() const {
  const int64_t image_bytes = spec_.image_bytes();
  const int64_t batch_bytes = batch_size_ * (image_bytes * static_cast<int64_t>(sizeof(float)) +
                                             static_cast<int64_t>(sizeof(int64_t)));
  return (static_cast<int64_t>(prefetch_depth_) + 1) * batch_bytes + workers_ * image_bytes;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  ACTLAB_CHECK(epoch >= 0, "epoch must be >= 0, got ", epoch);
  const int64_t n = dataset_.size();  // not size_: that is this loader's shard
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle_) return order;
  PhiloxStream rng(seed_, kShuffleStreamTag ^ static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int64_t rank, int64_t world, bool keep_tail) {
  ACTLAB_CHECK(world >= 1 && rank >= 0 && rank < world, "shard ", rank, " of ", world, ": need 0 <= rank < world");
  const int64_t total = static_cast<int64_t>(order.size());
  const int64_t n = keep_tail ? (total - rank + world - 1) / world : total / world;
  std::vector<int64_t> shard(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) shard[i] = order[static_cast<size_t>(rank + i * world)];
  return shard;
}

void DataLoader::shard(int64_t rank, int64_t world) {
  ACTLAB_CHECK(world >= 1 && rank >= 0 && rank < world, "shard ", rank, " of ", world, ": need 0 <= rank < world");
  const int64_t n = static_cast<int64_t>(shard_order(std::vector<int64_t>(static_cast<size_t>(dataset_.size())), rank,
                                                      world, !drop_last_).size());
  // Without drop_last (evaluation) a rank may be left with nothing, a test split smaller than the number of
  // ranks: its sums are zeros and the ranks together still see every example once. A training shard must
  // hold a whole batch, or the ranks would not step together.
  ACTLAB_CHECK(!drop_last_ || batch_size_ <= n, "data set '", dataset_.name(), "' (", dataset_.size(),
               " examples) split over ", world, " ranks leaves ", n, " per rank, fewer than the batch size ",
               batch_size_);
  stop_worker();
  epoch_started_ = false;
  shard_rank_ = rank;
  shard_world_ = world;
  size_ = n;
  num_batches_ = drop_last_ ? size_ / batch_size_ : (size_ + batch_size_ - 1) / batch_size_;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  ACTLAB_CHECK(epoch >= 0, "epoch must be >= 0, got ", epoch);
  ACTLAB_CHECK(first_batch >= 0 && first_batch <= num_batches_, "first batch ", first_batch,
               " is outside the epoch's [0, ", num_batches_, "] batches");
  stop_worker();
  worker_ = std::thread(&DataLoader::worker_main, this, epoch, first_batch);
  epoch_started_ = true;  // only once a worker exists that will end the epoch
}

bool DataLoader::next(Batch& batch) {
  ACTLAB_CHECK(epoch_started_, "DataLoader::next called before start_epoch()");
  std::unique_lock<std::mutex> lock(mutex_);
  produced_.wait(lock, [&] { return !queue_.empty() || worker_done_; });
  if (!queue_.empty()) {
    batch = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    consumed_.notify_one();
    return true;
  }
  if (error_) {
    std::exception_ptr error = std::exchange(error_, nullptr);
    std::rethrow_exception(error);
  }
  return false;
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  consumed_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::deque<Batch> dropped;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(queue_);
    stop_ = false;
    worker_done_ = false;
    error_ = nullptr;
    queue_peak_ = 0;
  }
}

void DataLoader::worker_main(int64_t epoch, int64_t first_batch) {
  try {
    const std::vector<int64_t> order = shard_order(epoch_order(epoch), shard_rank_, shard_world_, !drop_last_);
    std::vector<Buffer> staging;  // one image per worker
    for (int w = 0; w < workers_; ++w)
      staging.emplace_back(static_cast<size_t>(spec_.image_bytes()), MemTag::Data);
    for (int64_t b = first_batch; b < num_batches_; ++b) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        consumed_.wait(lock, [&] { return stop_ || queue_.size() < prefetch_depth_; });
        if (stop_) break;
      }
      Batch batch = make_batch(order, b, epoch, staging);  // outside the lock
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) break;
        queue_.push_back(std::move(batch));
        queue_peak_ = std::max(queue_peak_, queue_.size());
      }
      produced_.notify_one();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    worker_done_ = true;
  }
  produced_.notify_all();
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t batch_index, int64_t epoch,
                             const std::vector<Buffer>& staging) const {
  const int64_t begin = batch_index * batch_size_;
  const int64_t n = std::min(batch_size_, size_ - begin);
  const int64_t image_floats = spec_.image_bytes();
  Batch batch;
  batch.index = batch_index;
  batch.images = Tensor::empty_tagged({n, spec_.channels, spec_.height, spec_.width}, MemTag::Data,
                                      DType::F32);  // (N,C,H,W)
  batch.labels = Tensor::empty_tagged({n}, MemTag::Data, DType::I64);  // (N)
  float* images = batch.images.data<float>();
  int64_t* labels = batch.labels.data<int64_t>();
  // Kept per sample, so that the error reported is the first sample's in batch order, whichever
  // worker met its own first.
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  const auto fill = [&](int64_t i, int slot) {
    try {
      uint8_t* pixels = staging[static_cast<size_t>(slot)].as<uint8_t>();
      const int64_t sample = order[static_cast<size_t>(begin + i)];
      const int64_t label = dataset_.read_sample(sample, seed_, epoch, pixels);
      ACTLAB_CHECK(label >= 0 && label < spec_.num_classes, "data set '", dataset_.name(),
                   "': sample ", sample, " has label ", label, ", outside [0, ", spec_.num_classes,
                   ")");
      labels[i] = label;
      const SampleAugment a = draw_augment(transforms_, seed_, static_cast<uint64_t>(epoch),
                                           static_cast<uint64_t>(sample));
      transform_image(images + i * image_floats, pixels, spec_.channels, spec_.height,
                      spec_.width, transforms_.crop_padding, a, affine_);
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  if (pool_) {
    pool_->run(n, fill);
  } else {
    for (int64_t i = 0; i < n; ++i) fill(i, 0);
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return batch;
}

}  // namespace actlab
