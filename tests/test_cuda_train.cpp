// The training job on a GPU (TrainConfig::device, actlab-train --device): the same short run on the CPU
// and on cuda:0 must give the same losses to fp32 tolerance and the same measured activation memory
// (the allocator counts the same saved tensors on either device: the issue's "activation memory equal
// to the CPU backend's"), and a checkpoint written on the GPU must resume on the CPU. Without a GPU the
// GPU cases print "SKIPPED: no CUDA device" and return; the device-selection errors run everywhere.
// Run: actlab_tests -tc='cuda train*,train --device*'.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "tests/error_of.h"
#include "tests/test_cuda_util.h"
#include "actlab/train/trainer.h"

using namespace actlab;
using namespace actlab::testing;

namespace {

// ResNet-20 on generated 1×28×28 data: cuDNN convolutions, batch norm, pooling, the linear head and
// the fused SGD step all run, with maps (28, 14, 7) that exercise the codec's ragged blocks.
TrainConfig short_run(const std::string& policy) {
  TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 64;
  c.epochs = 1;
  c.threads = 2;
  c.policy = policy;
  c.quiet = true;
  return c;
}

}  // namespace

TEST_CASE("train --device: a malformed or absent device is one clear error before any work") {
  TrainConfig c = short_run("exact");
  c.device = "gpu";
  CHECK(error_of([&] { train(c); }).find("bad device 'gpu': expected cpu, cuda or cuda:N") != std::string::npos);
  c.device = "cuda:9999";  // no machine has that many: CPU-only build, no driver, or "only N visible"
  const std::string why = error_of([&] { train(c); });
  CHECK(why.find("CUDA") != std::string::npos);
  if (!cuda_available()) CHECK(why.find("CUDA requested but") != std::string::npos);  // says why there is none
  c.device = "cpu";
  c.cudnn_benchmark = true;  // GPU math on a CPU run is a mistake worth a line, not a silent no-op
  CHECK(error_of([&] { train(c); }).find("--cudnn-benchmark and --tf32 choose GPU math; this run is on cpu") !=
        std::string::npos);
}

TEST_CASE("cuda train: --device cuda matches the CPU run (losses, accuracy, activation memory)") {
  if (!gpu_or_skip("actlab-train --device cuda")) return;
  for (const char* policy : {"exact", "division:B=8,Q=2"}) {
    INFO("policy " << policy);
    TrainConfig c = short_run(policy);
    const TrainSummary cpu = train(c);
    c.device = "cuda";
    const TrainSummary gpu = train(c);
    REQUIRE(gpu.epochs.size() == cpu.epochs.size());
    // 4 SGD steps: cuDNN's and oneDNN's summation orders differ by fp32 rounding, and stochastic rounding
    // may flip a few codes where the inputs differ by an ulp; a layout or indexing bug moves the loss by O(1).
    CHECK(gpu.epochs[0].train_loss == doctest::Approx(cpu.epochs[0].train_loss).epsilon(1e-2));
    CHECK(gpu.final_test_loss == doctest::Approx(cpu.final_test_loss).epsilon(2e-2));
    CHECK(gpu.steps == cpu.steps);
    CHECK(gpu.activation_bytes == cpu.activation_bytes);
    CHECK(gpu.saved_raw_bytes == cpu.saved_raw_bytes);
    CHECK(gpu.saved_packed_bytes == cpu.saved_packed_bytes);
    CHECK(gpu.reserved_peak_bytes >= gpu.peak_bytes);
  }
  TrainConfig summary = short_run("exact");  // --summary probes the model where it lives
  summary.device = "cuda";
  summary.summary_only = true;
  CHECK_NOTHROW(train(summary));
}

TEST_CASE("cuda train: a checkpoint saved on the GPU resumes on the CPU") {
  if (!gpu_or_skip("actlab-train --device cuda --save-dir, then --resume on the CPU")) return;
  const std::string dir = "/tmp/actlab-cuda-train-" + std::to_string(::getpid());
  TrainConfig c = short_run("division:B=8,Q=2");
  c.device = "cuda";
  c.save_dir = dir;
  c.epochs = 2;
  c.stop_after_steps = 4;  // stop after the first epoch's 4 steps
  const TrainSummary first = train(c);
  REQUIRE(first.interrupted);
  TrainConfig resumed = short_run("division:B=8,Q=2");
  resumed.epochs = 2;
  resumed.resume = dir + "/last.safetensors";
  resumed.save_dir = dir;
  const TrainSummary rest = train(resumed);
  CHECK(!rest.interrupted);
  CHECK(rest.steps == 8);
  CHECK(std::isfinite(rest.final_test_loss));
  std::filesystem::remove_all(dir);
}

TEST_CASE("cuda train: swap:P=2 on the GPU gives exact's losses bit for bit") {
  if (!gpu_or_skip("actlab-train --device cuda --policy swap:P=2")) return;
  TrainConfig c = short_run("exact");
  c.device = "cuda";
  // cuDNN's fastest backward algorithms add partial sums with atomics: two exact runs then differ in the
  // last bits (seen on an H200). Bit-for-bit claims need its deterministic algorithms.
  c.deterministic = true;
  const TrainSummary exact = train(c);
  const TrainSummary again = train(c);
  CHECK(again.epochs[0].train_loss == exact.epochs[0].train_loss);  // the premise: the GPU run repeats
  c.policy = "swap:P=2";  // the copies out and back run on the copy stream (compress/swap.h)
  const TrainSummary swapped = train(c);
  REQUIRE(swapped.epochs.size() == exact.epochs.size());
  // The same kernels on the same saved bytes: only where the bytes waited differs.
  CHECK(swapped.epochs[0].train_loss == exact.epochs[0].train_loss);
  CHECK(swapped.final_test_loss == exact.final_test_loss);
  CHECK(swapped.saved_packed_bytes == 0);
  // Under bf16 and fp16 SWAP offloads the precision's 16-bit exact keep (compress/swap.h): exact's losses at
  // that precision, bit for bit. Written after the last GPU session: its first run there is this one.
  for (const char* precision : {"bf16", "fp16"}) {
    INFO("precision " << precision);
    c.precision = precision;
    c.policy = "exact";
    const TrainSummary low = train(c);
    c.policy = "swap:P=2";
    const TrainSummary low_swapped = train(c);
    REQUIRE(low_swapped.epochs.size() == low.epochs.size());
    CHECK(low_swapped.epochs[0].train_loss == low.epochs[0].train_loss);
    CHECK(low_swapped.final_test_loss == low.final_test_loss);
  }
}

TEST_CASE("cuda train: --precision bf16 and fp16 on the GPU train like fp32 (fp16 under dynamic loss scaling)") {
  if (!gpu_or_skip("actlab-train --device cuda --precision bf16|fp16")) return;
  TrainConfig c = short_run("exact");
  c.device = "cuda";
  const TrainSummary fp32 = train(c);
  for (const char* precision : {"bf16", "fp16"}) {
    INFO("precision " << precision);
    c.precision = precision;
    const TrainSummary low = train(c);
    REQUIRE(low.epochs.size() == fp32.epochs.size());
    // 4 SGD steps from the same weights: 16-bit operands move the loss by a few per cent at most.
    CHECK(low.epochs[0].train_loss == doctest::Approx(fp32.epochs[0].train_loss).epsilon(5e-2));
    CHECK(std::isfinite(low.final_test_loss));
    if (std::string(precision) == "bf16") CHECK(low.activation_bytes < fp32.activation_bytes);  // bf16 exact saves
    if (std::string(precision) == "fp16") CHECK(low.loss_scale > 1);  // auto: dynamic scaling from 65536
  }
}
