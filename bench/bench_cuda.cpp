// bench_cuda: the GPU numbers of scripts/gpu-check.sh. (1) Bandwidth: device-to-device copy, and the
// fused codec kernels (pack / unpack) on ResNet-18 CIFAR activation shapes at batch 256, as bytes read +
// written per second and as a fraction of the copy's. (2) Training: median img/s of a full ResNet-18
// step (forward, loss, backward, SGD) on random inputs on cuda:0 per policy, with the activation memory
// (run_step's measure, docs/measures.md: the cuDNN/cuBLAS workspace does not count), the step's peak
// tracked and reserved bytes, and the bytes SWAP keeps in pinned host memory at the step's peak. The
// device <-> pinned host copy bandwidth (one way, on the copy stream SWAP uses) lets gpu-check.sh say how
// much of SWAP's copying its step hides. Prints tables; --json writes one JSON object.
// Builds everywhere; without CUDA (build or device) it prints "no CUDA" and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "bench/step_timing.h"
#include "actlab/compress/policy.h"
#include "actlab/core/cuda/runtime.h"
#include "actlab/core/precision.h"
#include "actlab/io/files.h"
#include "actlab/io/json.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/cli.h"
#include "actlab/train/step.h"

#if defined(ACTLAB_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "actlab/core/cuda/codec.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/conv.h"
#include "actlab/core/cuda/context.h"
#include "actlab/core/cuda/transfer.h"
#endif

using namespace actlab;
using namespace actlab::bench;

namespace {
// The first bytes of the --json object (JsonWriter writes its first field so): a file that begins so is an
// earlier run's, replaced without --overwrite.
constexpr const char* kJsonStart = "{\"device\":";

#if defined(ACTLAB_WITH_CUDA)

double mib(int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// Median seconds of `reps` runs of f() on the device stream, timed by CUDA events after one warm-up run.
template <typename F>
double time_on_stream(int reps, F f) {
  cuda::CudaContext& ctx = cuda::cuda_context(0);
  cudaEvent_t start, stop;
  ACTLAB_CUDA_CHECK(cudaEventCreate(&start));
  ACTLAB_CUDA_CHECK(cudaEventCreate(&stop));
  f();
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    ACTLAB_CUDA_CHECK(cudaEventRecord(start, ctx.stream()));
    f();
    ACTLAB_CUDA_CHECK(cudaEventRecord(stop, ctx.stream()));
    ACTLAB_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    ACTLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ts.push_back(ms * 1e-3);
  }
  ACTLAB_CUDA_CHECK(cudaEventDestroy(start));
  ACTLAB_CUDA_CHECK(cudaEventDestroy(stop));
  return median(ts);
}

struct KernelRow {
  std::string name;
  double gbps = 0, of_copy = 0;
};

// Device-to-device copy of 256 MiB: GB/s counting bytes read + written.
double copy_bandwidth(std::vector<KernelRow>& rows) {
  const int64_t n = int64_t(64) << 20;  // floats
  const Tensor src = Tensor::zeros({n}, DType::F32, Device::cuda(0));
  Tensor dst = Tensor::empty({n}, DType::F32, Device::cuda(0));
  const double s = time_on_stream(20, [&] { dst.copy_(src); });
  const double gbps = 2.0 * static_cast<double>(src.nbytes()) / s / 1e9;
  rows.push_back({"copy d2d 256 MiB", gbps, 1.0});
  return gbps;
}

// Device -> pinned host and back, 256 MiB each way through copy_async (SWAP's transfers): GB/s one way,
// host-timed median of 10 after a warm-up.
void host_bandwidth(std::vector<KernelRow>& rows, double copy_gbps) {
  const int64_t n = int64_t(64) << 20;  // floats
  Tensor dev = Tensor::zeros({n}, DType::F32, Device::cuda(0));
  Tensor host = Tensor::empty_tagged({n}, MemTag::Offloaded, DType::F32, Device::cpu());
  for (const bool to_host : {true, false}) {
    const auto once = [&] {
      const auto t0 = std::chrono::steady_clock::now();
      (to_host ? copy_async(host.raw_data(), Device::cpu(), dev.raw_data(), dev.device(), host.nbytes())
               : copy_async(dev.raw_data(), dev.device(), host.raw_data(), Device::cpu(), host.nbytes()))
          .wait();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    once();
    std::vector<double> ts;
    for (int r = 0; r < 10; ++r) ts.push_back(once());
    const double gbps = static_cast<double>(host.nbytes()) / median(ts) / 1e9;
    rows.push_back({to_host ? "copy d2h pinned 256 MiB (one way)" : "copy h2d pinned 256 MiB (one way)", gbps,
                    gbps / copy_gbps});
  }
}

// division:B=8,Q=2 (or quant with B = 0) pack and unpack of one activation: (N,C,H,W) as planes, or a
// token map (B,T,D) pooled along the tokens, as compress/policies.cpp lays them out.
void codec_bandwidth(std::vector<KernelRow>& rows, const Shape& shape, int64_t block, int bits, double copy_gbps,
                     int reps) {
  const bool with_lfc = block > 0, tokens = shape.size() == 3;
  const int64_t b = with_lfc ? block : 1;
  const PlaneGeometry g = tokens ? make_token_geometry(shape[0], shape[1], shape[2], b, bits)
                                 : make_plane_geometry(shape[0] * shape[1], shape[2], shape[3], b, bits);
  const Device gpu = Device::cuda(0);
  PhiloxStream rng(1, 2);
  const Tensor x = Tensor::randn(shape, rng).to(gpu);
  Tensor lfc = Tensor::empty({with_lfc ? g.planes * g.lfc_elems() * 2 : 1}, DType::U8, gpu);
  Tensor codes = Tensor::empty({g.planes * g.code_bytes_per_plane()}, DType::U8, gpu);
  Tensor ranges = Tensor::empty({g.planes * 4}, DType::U8, gpu);
  Tensor out = Tensor::empty(shape, DType::F32, gpu);
  auto* lp = with_lfc ? reinterpret_cast<uint16_t*>(lfc.data<uint8_t>()) : nullptr;
  auto* mins = reinterpret_cast<uint16_t*>(ranges.data<uint8_t>());
  uint16_t* steps = mins + g.planes;
  const double packed = static_cast<double>((with_lfc ? g.planes * g.lfc_elems() * 2 : 0) + codes.nbytes() +
                                            g.planes * 4);
  const double raw = static_cast<double>(x.nbytes());
  const double pack_s = time_on_stream(reps, [&] {
    cuda::plane_pack(lp, codes.data<uint8_t>(), mins, steps, nullptr, x.data<float>(), g, with_lfc, 7, 8, 0);
  });
  const double unpack_s = time_on_stream(reps, [&] {
    cuda::plane_unpack(out.data<float>(), lp, codes.data<uint8_t>(), mins, steps, g, 0);
  });
  const std::string tag = (with_lfc ? "division B=" + std::to_string(block) : std::string("quant")) + " Q=" +
                          std::to_string(bits) + " " + shape_str(shape) + (tokens ? " tokens" : "");
  const double pack_gbps = (raw + packed) / pack_s / 1e9, unpack_gbps = (raw + packed) / unpack_s / 1e9;
  rows.push_back({"pack   " + tag, pack_gbps, pack_gbps / copy_gbps});
  rows.push_back({"unpack " + tag, unpack_gbps, unpack_gbps / copy_gbps});
}

std::string run_kernels(int reps) {
  std::vector<KernelRow> rows;
  const double copy_gbps = copy_bandwidth(rows);
  host_bandwidth(rows, copy_gbps);
  for (const Shape& s : {Shape{256, 64, 32, 32}, Shape{256, 128, 16, 16}, Shape{256, 256, 8, 8}, Shape{256, 512, 4, 4}})
    codec_bandwidth(rows, s, 8, 2, copy_gbps, reps);
  codec_bandwidth(rows, {256, 64, 32, 32}, 0, 2, copy_gbps, reps);
  // ViT-Tiny at batch 256: a linear layer's input, an MLP's hidden map, an attention product's operand.
  for (const Shape& s : {Shape{256, 65, 192}, Shape{256, 65, 768}, Shape{256, 3, 65, 64}})
    codec_bandwidth(rows, s, 8, 2, copy_gbps, reps);
  std::printf("\n%-48s %10s %10s\n", "kernel (bytes read + written)", "GB/s", "of copy");
  JsonWriter json;
  json.begin_array();
  for (const KernelRow& r : rows) {
    std::printf("%-48s %10.1f %9.0f%%\n", r.name.c_str(), r.gbps, 100.0 * r.of_copy);
    json.begin_object().field("kernel", r.name).field("gbps", r.gbps).field("of_copy", r.of_copy).end_object();
  }
  std::fflush(stdout);
  return json.end_array().str();
}

struct TrainRow {
  std::string policy;
  double img_s = 0, best_img_s = 0;
  int64_t steps = 0, activation = 0, peak = 0, reserved_peak = 0;
  int64_t offloaded = 0;  // pinned host bytes (MemTag::Offloaded) at the step's peak: what SWAP moved out
};

// One policy: warm-up steps (cuDNN selects algorithms then), then timed steps; every step ends with a
// read-back after the update, so the host waits for the GPU and wall time is the step time.
TrainRow run_policy(const FlagParser& flags, const std::string& policy) {
  const Device gpu = Device::cuda(0);
  const int64_t B = flags.get_int("batch");
  seed_init(0);
  set_pack_seed(0);
  auto model = make_model({flags.get("model"), 3, 10, 32});
  model->to(gpu);
  Sgd opt(model->parameters(), {0.01f, 0.9f, 0.f, 5e-4f, false});
  // "POLICY@PRECISION" (exact@bf16, exact@fp16): the step in that precision. fp16 runs without loss scaling
  // here: an underflowing gradient changes no step time.
  const RunEntry entry = parse_run_entry(policy, Precision::F32);
  check_precision_supported(entry.precision, gpu);
  const PrecisionScope precision(entry.precision);
  const PolicySet set = parse_policy_set(entry.policy);
  PhiloxStream rng(0, 5);
  Tensor x, y;
  {
    MemTagScope tag(MemTag::Data);
    x = Tensor::randn({B, 3, 32, 32}, rng).to(gpu);
    Tensor labels = Tensor::empty({B}, DType::I64);
    for (int64_t i = 0; i < B; ++i) labels.data<int64_t>()[i] = static_cast<int64_t>(rng.next_below(10));
    y = labels.to(gpu);
  }
  TrainRow row{policy};
  int64_t step_index = 0;
  const auto step = [&] {
    set_pack_step(static_cast<uint64_t>(step_index++));
    reset_peak(gpu);
    reset_peak(Device::cpu());
    row.activation = run_step(*model, &opt, set, x, y).activation_bytes;
    // Waits for the update: the copy of the last parameter the optimizer wrote queues behind it.
    (void)model->parameters().back().data().to(Device::cpu());
    const MemoryStats s = memory_stats(gpu);
    row.peak = s.total.peak;
    row.reserved_peak = s.reserved_peak;
    row.offloaded = memory_stats(Device::cpu())[MemTag::Offloaded].peak;
  };
  CacheStats::global().set_enabled(false);
  // After warm-up, drop what it cached (cuDNN's algorithm search workspace): reserved = steady state.
  const std::vector<double> ts = time_steps(StepTiming::from_flags(flags), step, [&] { empty_cache(gpu); });
  CacheStats::global().set_enabled(true);
  row.img_s = static_cast<double>(B) / median(ts);
  row.best_img_s = static_cast<double>(B) / *std::min_element(ts.begin(), ts.end());
  row.steps = static_cast<int64_t>(ts.size());
  return row;
}

std::string run_training(const FlagParser& flags) {
  cuda::math_options().allow_tf32 = flags.get_bool("tf32");
  cuda::math_options().benchmark = flags.get_bool("cudnn-benchmark");
  std::printf("\n%s, batch %lld, tf32 %s, cuDNN benchmark %s\n", flags.get("model").c_str(),
              static_cast<long long>(flags.get_int("batch")), flags.get_bool("tf32") ? "on" : "off",
              flags.get_bool("cudnn-benchmark") ? "on" : "off");
  std::printf("%-22s %10s %10s %6s %14s %12s %14s\n", "policy", "img/s", "best", "steps", "activation MiB",
              "peak MiB", "reserved MiB");
  JsonWriter json;
  json.begin_array();
  for (const std::string& policy : split_list(flags.get("policies"), ';')) {
    const TrainRow r = run_policy(flags, policy);
    std::printf("%-22s %10.1f %10.1f %6lld %14.1f %12.1f %14.1f\n", r.policy.c_str(), r.img_s, r.best_img_s,
                static_cast<long long>(r.steps), mib(r.activation), mib(r.peak), mib(r.reserved_peak));
    std::fflush(stdout);
    json.begin_object().field("policy", r.policy).field("img_per_s", r.img_s).field("activation_bytes", r.activation)
        .field("peak_bytes", r.peak).field("reserved_peak_bytes", r.reserved_peak).field("offloaded_bytes", r.offloaded)
        .field("steps", r.steps).end_object();
  }
  return json.end_array().str();
}

#endif  // ACTLAB_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("bench_cuda", "GPU bandwidth of copies and codec kernels; ResNet training throughput per policy.");
  flags.add("what", "string", "kernels,train", "what to run: kernels, train or both (comma-separated)");
  flags.add("model", "string", "resnet18", "model for the training benchmark");
  flags.add("kernel-reps", "int", "20",
            "timed runs of each codec kernel (1 under a profiler: one launch per shape after the warm-up)");
  flags.add("batch", "int", "256", "batch size");
  flags.add("policies", "string", "exact;division:B=8,Q=2;swap:P=2;exact@bf16;exact@fp16;division:B=8,Q=2@bf16",
            "policies separated by ';', each optionally POLICY@PRECISION (swap's step against exact's: how much "
            "copying the copy stream hides; @bf16/@fp16: tensor cores)");
  StepTiming{3, 10, 200, 5}.add_flags(flags);
  flags.add("tf32", "bool", "false", "TF32 tensor cores for convolutions and GEMMs");
  flags.add("cudnn-benchmark", "bool", "true", "time cuDNN's algorithms per shape (like cudnn.benchmark)");
  flags.add("json", "string", "", "also write the results as one JSON object to this file");
  flags.add("overwrite", "bool", "false", "replace a --json file that exists and is not an earlier result of this program");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
#if !defined(ACTLAB_WITH_CUDA)
    std::printf("no CUDA: actlab was built without the CUDA backend\n");
    return 0;
#else
    if (!cuda_available()) {
      std::printf("no CUDA: no usable CUDA device\n");
      return 0;
    }
    cuda_init();
    std::printf("device: %s\n", cuda_device_name(0).c_str());
    const std::vector<std::string> what = split_list(flags.get("what"), ',');
    const auto wants = [&](const char* w) { return std::find(what.begin(), what.end(), w) != what.end(); };
    check_writable(flags.get("json"), flags.get_bool("overwrite") || replaceable_output(flags.get("json"), kJsonStart),
                   "--json file");
    JsonWriter json;
    json.begin_object().field("device", cuda_device_name(0));
    if (wants("kernels")) json.key("kernels").raw(run_kernels(static_cast<int>(flags.get_int("kernel-reps"))));
    if (wants("train")) json.key("train").raw(run_training(flags));
    json.end_object();
    // The rule above knows this output by kJsonStart: a writer that began otherwise would make every rerun
    // refuse its own file.
    ACTLAB_CHECK(json.str().rfind(kJsonStart, 0) == 0, "the --json object does not begin with ", kJsonStart);
    if (!flags.get("json").empty()) write_text_atomic(flags.get("json"), json.str() + "\n");
    return 0;
#endif
  } catch (const std::exception& e) {
    return report_error("bench_cuda", e);
  }
}
