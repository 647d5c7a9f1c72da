// Trains a ResNet-20 with DIVISION through actlab's library API, and prints the allocator's memory table
// and the activation memory of one step under DIVISION and under exact storage.
//   train_division [STEPS]      (default 50; Fashion-MNIST from Debian's package, else generated data)
#include <cstdio>
#include <cstdlib>

#include "actlab/autograd/saved_tensor.h"
#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/data/dataloader.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/data_splits.h"
#include "actlab/train/step.h"

int main(int argc, char** argv) {
  using namespace actlab;
  try {
    char* end = nullptr;
    const long steps = argc > 1 ? std::strtol(argv[1], &end, 10) : 50;
    if (argc > 2 || (argc > 1 && (*end != '\0' || end == argv[1] || steps < 1 || steps > 100000))) {
      std::fprintf(stderr, "train_division: error: STEPS must be a whole number from 1 to 100000\n"
                           "usage: train_division [STEPS]   (default 50)\n");
      return 2;
    }
    TrainConfig config;  // the data set and its transforms, as actlab-train would load them
    config.dataset = "fashion-mnist";
    DataSplits data;
    try {
      data = load_data(config);
    } catch (const Error& e) {
      std::printf("no Fashion-MNIST (%s): generated data instead\n", e.what());
      config.dataset = "synthetic";
      data = load_data(config);
    }
    const ImageSpec spec = data.train->spec();
    seed_init(0);
    set_pack_seed(0);
    auto model = make_model({"resnet20", spec.channels, spec.num_classes, spec.height});
    Sgd opt(model->parameters(), {0.05f, 0.9f, 0.f, 5e-4f, false});
    const PolicySet division(parse_policy("division:B=8,Q=2")), exact;

    DataLoader loader(*data.train, 128, /*shuffle=*/true, /*seed=*/0, /*drop_last=*/true, data.train_transforms);
    loader.start_epoch(0);
    Batch batch;
    for (long step = 0; step < steps && loader.next(batch); ++step) {
      set_pack_step(static_cast<uint64_t>(step));  // the stochastic rounding's stream of this step
      const StepResult r = run_step(*model, &opt, division, batch.images, batch.labels);
      if (step % 10 == 0 || step + 1 == steps)
        std::printf("step %3ld  loss %.4f  accuracy %5.1f%%  activations %.2f MiB\n", step, r.loss,
                    100.0 * static_cast<double>(r.correct) / static_cast<double>(batch.labels.size(0)),
                    static_cast<double>(r.activation_bytes) / (1 << 20));
    }
    std::printf("%s", memory_stats().table().c_str());
    // The same batch once more under each policy, without an update: what DIVISION saves.
    const int64_t packed = run_step(*model, nullptr, division, batch.images, batch.labels).activation_bytes;
    const int64_t full = run_step(*model, nullptr, exact, batch.images, batch.labels).activation_bytes;
    std::printf("activation memory of one step: DIVISION %.2f MiB, exact %.2f MiB (%.1fx less)\n",
                static_cast<double>(packed) / (1 << 20), static_cast<double>(full) / (1 << 20),
                static_cast<double>(full) / static_cast<double>(packed));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_division: error: %s\n", e.what());
    return 1;
  }
}
