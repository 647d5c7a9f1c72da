// bench_train: median images/s of a full training step (forward, loss, backward, SGD) on random
// 3x32x32 inputs, the protocol of ../shared/bench/torch_cpu_train.py (warm-up steps, then at least
// --steps timed steps, continued until --min-time seconds), so the two can be run side by side.
// Also reports the activation memory of the step (reference §5) for each policy, and the median process
// CPU time of a step: CPU ms / (wall ms · threads) is how busy the team kept the cores (with
// OMP_WAIT_POLICY=passive, so that waiting threads sleep instead of spinning). --rounds N repeats the
// policy list N times so that policies can be compared in back-to-back pairs on a shared machine.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/saved_tensor.h"
#include "bench/step_timing.h"
#include "compress/policy.h"
#include "layers/optim/sgd.h"
#include "models/registry.h"
#include "train/cli.h"

using namespace actlab;
using namespace actlab::bench;

int main(int argc, char** argv) {
  FlagParser flags("bench_train", "Training-step throughput (median img/s) on random inputs.");
  flags.add("models", "string", "resnet20,resnet18", "comma-separated models");
  flags.add("batch", "int", "128", "batch size");
  flags.add("threads", "int", "2", "CPU threads");
  flags.add("policies", "string", "exact", "policies separated by ';'");
  StepTiming{2, 8, 200, 4}.add_flags(flags);
  flags.add("image-size", "int", "32", "input size");
  flags.add("channels", "int", "3", "input channels");
  flags.add("rounds", "int", "1", "repeat the policy list this many times (paired comparisons)");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    omp_set_num_threads(static_cast<int>(flags.get_int("threads")));
    const int64_t B = flags.get_int("batch"), S = flags.get_int("image-size"), C = flags.get_int("channels");
    std::printf("%-12s %-22s %6s %10s %10s %10s %14s %9s %9s\n", "model", "policy", "batch", "img/s", "best", "steps",
                "activation", "wall ms", "cpu ms");
    std::vector<std::string> runs;  // the policy list, --rounds times
    for (int64_t round = 0; round < flags.get_int("rounds"); ++round)
      for (const auto& policy : split_list(flags.get("policies"), ';')) runs.push_back(policy);
    for (const auto& name : split_list(flags.get("models"), ',')) {
      for (const auto& policy : runs) {
        seed_init(0);
        set_pack_seed(0);
        auto model = make_model({name, C, 10, S});
        Sgd opt(model->parameters(), {0.01f, 0.9f, 0.f, 5e-4f, false});
        PolicySet set(parse_policy(policy));
        PhiloxStream rng(0, 5);
        Tensor x = Tensor::randn({B, C, S, S}, rng);
        Tensor y = Tensor::empty({B}, DType::I64);
        for (int64_t i = 0; i < B; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng.next_below(10));
        int64_t act = 0;
        auto step = [&]() {
          const int64_t before = memory_stats().total.current;
          Variable logits, loss;
          {
            ActivationCacheScope scope(set);
            MemTagScope tag(MemTag::Activation);
            logits = (*model)(Variable(x));
            loss = cross_entropy(logits, y);
          }
          act = memory_stats().total.current - before - static_cast<int64_t>(logits.data().nbytes()) -
                static_cast<int64_t>(loss.data().nbytes()) + static_cast<int64_t>(x.nbytes());
          logits = Variable();
          opt.zero_grad();
          {
            MemTagScope tag(MemTag::Activation);
            backward(loss);
          }
          opt.step();
        };
        CacheStats::global().set_enabled(false);
        std::vector<double> cpu;
        const std::vector<double> ts = time_steps(StepTiming::from_flags(flags), step, [] {}, &cpu);
        const double med = median(ts), best = *std::min_element(ts.begin(), ts.end());
        std::printf("%-12s %-22s %6lld %10.1f %10.1f %10zu %10.1f MiB %9.1f %9.1f\n", name.c_str(), policy.c_str(),
                    static_cast<long long>(B), B / med, B / best, ts.size(), act / 1048576.0, 1e3 * med,
                    1e3 * median(cpu));
        std::fflush(stdout);
        CacheStats::global().set_enabled(true);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
    return 2;
  }
}
