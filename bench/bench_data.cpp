// Data-pipeline throughput: IDX load time, then images/s of the DataLoader (one background thread)
// over full epochs of Fashion-MNIST train at batch 128, with and without augmentation. Falls back to
// a synthetic 60000x1x28x28 set (saying so) when the Debian package is absent.
// Usage: bench_data [epochs=3]. Results: bench/RESULTS_data.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "actlab/data/dataloader.h"
#include "actlab/data/idx.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median images/s over `epochs` epochs; the consumer only reads one float per batch, so this is the
// producer's ceiling.
double loader_images_per_s(const actlab::Dataset& ds, const actlab::TransformConfig& cfg,
                           int epochs) {
  actlab::DataLoader loader(ds, 128, /*shuffle=*/true, /*seed=*/1, /*drop_last=*/false, cfg);
  std::vector<double> rates;
  volatile float sink = 0.f;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const Clock::time_point t0 = Clock::now();
    loader.start_epoch(epoch);
    actlab::Batch batch;
    int64_t images = 0;
    while (loader.next(batch)) {
      sink = sink + batch.images.data<float>()[0];
      images += batch.labels.size(0);
    }
    rates.push_back(static_cast<double>(images) / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int epochs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
    const std::string dir = actlab::default_fashion_mnist_dir();
    std::unique_ptr<actlab::InMemoryImageDataset> ds;
    const Clock::time_point t0 = Clock::now();
    if (actlab::idx_files_present(dir)) {
      ds = std::make_unique<actlab::InMemoryImageDataset>(actlab::load_fashion_mnist(dir, true));
    } else {
      std::printf("NOTE: no Fashion-MNIST in %s; using a synthetic 60000x1x28x28 set\n",
                  dir.c_str());
      ds = std::make_unique<actlab::InMemoryImageDataset>(
          actlab::make_synthetic_dataset(60000, 1, 28, 28, 10, 1));
    }
    const double load_s = seconds_since(t0);
    std::printf("data set: %s, %lld examples, loaded in %.3f s\n", ds->name().c_str(),
                static_cast<long long>(ds->size()), load_s);

    actlab::TransformConfig plain = actlab::default_transforms("fashion-mnist", false);
    actlab::TransformConfig augmented = plain;
    augmented.crop_padding = 4;
    augmented.horizontal_flip = true;
    std::printf("\n| transforms | batch | loader threads | images/s (median of %d epochs) |\n",
                epochs);
    std::printf("|---|---|---|---|\n");
    std::printf("| normalize | 128 | 1 | %.0f |\n", loader_images_per_s(*ds, plain, epochs));
    std::printf("| crop pad 4 + flip + normalize | 128 | 1 | %.0f |\n",
                loader_images_per_s(*ds, augmented, epochs));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
}
