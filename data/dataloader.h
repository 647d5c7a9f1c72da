// DataLoader: turns a Dataset into a stream of transformed (N,C,H,W) f32 batches, assembled ahead of
// the consumer on a background thread (and, with workers > 1, helper threads that share each batch's
// samples) with a bounded queue. Shuffling and augmentation are pure functions of (seed, epoch,
// sample index), so every run with a seed sees the same bytes, whatever the number of workers.
// Tested in tests/test_data.cpp; throughput measured by bench/bench_data.cpp.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actlab/core/tensor.h"
#include "actlab/data/dataset.h"
#include "actlab/data/transforms.h"

namespace actlab {

struct Batch {
  Tensor images;       // (N,C,H,W) f32 contiguous, transformed; tagged MemTag::Data
  Tensor labels;       // (N) i64; tagged MemTag::Data
  int64_t index = -1;  // batch number within the epoch, 0-based
};

// Usage:
//   DataLoader loader(train_set, 128, /*shuffle=*/true, seed, /*drop_last=*/true, transforms);
//   for (int64_t epoch = 0; epoch < E; ++epoch) {
//     loader.start_epoch(epoch);
//     Batch batch;
//     while (loader.next(batch)) step(batch);
//   }
// N = batch_size for every batch except the last one of an epoch when drop_last is false.
// NOTE: the loader keeps a reference to `dataset`, which must outlive it; dataset.read_sample() is
// called from the background thread and the helpers, several at once. One consumer thread calls
// start_epoch/next.
// The distributed sampler: rank's share of an epoch's order, order[rank], order[rank + world], ...,
// size/world of them, so the shards are disjoint, every rank takes the same number of steps, and batch
// k of every rank together is batch k of one loader with world times the batch. The remainder (fewer
// than world samples) is dropped, or with keep_tail given to the first ranks, one each, so that the
// shards cover the whole order (evaluation).
std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int64_t rank, int64_t world,
                                 bool keep_tail = false);

class SamplePool;

class DataLoader {
 public:
  // prefetch_depth: finished batches that may wait for the consumer. workers: threads that assemble
  // a batch (read, transform), the background thread included; 1 reads on that thread alone.
  // Throws Error on batch_size < 1, an empty data set, batch_size > size with drop_last,
  // prefetch_depth < 1, workers outside [1, 256], or transforms that do not fit the data set's
  // channel count.
  DataLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed,
             bool drop_last = false, TransformConfig transforms = {}, int prefetch_depth = 2,
             int workers = 1);
  ~DataLoader();  // stops and joins the worker, even mid-epoch; drops queued batches
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts producing the batches of `epoch` (>= 0) from batch `first_batch` on (0 <= first_batch
  // <= num_batches(); a resumed run skips the batches it has used without reading them); abandons
  // any epoch still in progress.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // Moves the next batch into `batch` and returns true, or returns false at the end of the epoch.
  // An exception thrown while assembling a batch (dataset.read, allocation) is rethrown here, after
  // the batches that preceded it; the epoch then counts as ended.
  bool next(Batch& batch);

  int64_t num_batches() const { return num_batches_; }
  int workers() const { return workers_; }
  // The most finished batches that waited in the queue at once since the last start_epoch; never
  // more than prefetch_depth.
  int64_t queue_peak();
  // The most bytes (MemTag::Data) the loader itself holds at once: prefetch_depth queued batches,
  // the one being assembled and one staging image per worker. The batch the consumer holds is the
  // consumer's, and a data set's own buffers (a decoded file per reading thread) are not counted.
  int64_t max_bytes_held() const;
  int64_t batch_size() const { return batch_size_; }
  const Dataset& dataset() const { return dataset_; }
  // Dataset indices in the order `epoch` visits them: identity without shuffle, otherwise a
  // Fisher-Yates permutation drawn from PhiloxStream(seed, shuffle stream of epoch). The whole data
  // set's order, also when the loader is sharded.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // Data-parallel training: from the next start_epoch on, this loader yields only shard `rank` of
  // `world` of each epoch's order (shard_order; the tail kept without drop_last, so that evaluation
  // sees every sample once), so its batches are rank's part of every global batch. Every rank must
  // use the same seed. Throws when a shard would be smaller than a batch with drop_last; without it a shard
  // may be empty (a rank past the last example of a small test split yields no batch).
  void shard(int64_t rank, int64_t world);

 private:
  void stop_worker();
  void worker_main(int64_t epoch, int64_t first_batch);
  Batch make_batch(const std::vector<int64_t>& order, int64_t batch_index, int64_t epoch,
                   const std::vector<Buffer>& staging) const;

  const Dataset& dataset_;
  ImageSpec spec_;
  int64_t size_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  TransformConfig transforms_;
  PixelAffine affine_;
  size_t prefetch_depth_;
  int workers_;
  int64_t num_batches_;
  int64_t shard_rank_ = 0, shard_world_ = 1;

  // Shared with the worker, guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable produced_;  // worker -> consumer: a batch was queued or the worker ended
  std::condition_variable consumed_;  // consumer -> worker: a slot freed up or stop was requested
  std::deque<Batch> queue_;
  bool stop_ = false;
  bool worker_done_ = false;
  std::exception_ptr error_;
  size_t queue_peak_ = 0;

  std::unique_ptr<SamplePool> pool_;  // workers - 1 helpers; used by the background thread only
  std::thread worker_;
  bool epoch_started_ = false;  // consumer-side only
};

}  // namespace actlab
