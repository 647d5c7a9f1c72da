// Benchmark of the CPU convolution backend (core/cpu/conv.h): every conv layer of CIFAR ResNet-20
// and ResNet-18 (and MobileNetV2 depthwise layers) at batch 128, forward / backward-data /
// backward-weight, median of --reps after a warm-up, for each --impl (IMPL or IMPL@bf16, e.g.
// auto,auto@bf16,dnnl-plain@bf16: the precision the layer computes in); prints GFLOP/s per layer and
// the conv time of one training step. --gemm compares dnnl_sgemm with OpenBLAS (loaded at run time).
// Results: bench/RESULTS_conv.md. Usage: bench_conv --help.
#include <dlfcn.h>
#include <omp.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <map>
#include <mutex>

#include "actlab/core/allocator.h"
#include "actlab/core/cpu/conv.h"
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/device.h"
#include "actlab/core/error.h"
#include "actlab/core/precision.h"
#include "actlab/train/cli.h"

namespace {

using actlab::cpu::ConvImpl;
using actlab::cpu::ConvShape;

struct Layer {
  std::string model, name;
  ConvShape shape;
  int count;           // how many layers of the network have this shape
  bool needs_dx;       // false for the stem: nobody wants the gradient of the image
};

ConvShape conv(int64_t N, int64_t C, int64_t HW, int64_t K, int64_t RS, int64_t stride,
               int64_t pad, int64_t groups = 1) {
  ConvShape s;
  s.N = N, s.C = C, s.H = s.W = HW, s.K = K, s.R = s.S = RS;
  s.stride_h = s.stride_w = stride, s.pad_h = s.pad_w = pad, s.groups = groups;
  return s;
}

std::vector<Layer> model_layers(const std::string& model, int64_t n) {
  std::vector<Layer> v;
  if (model == "resnet20" || model == "all") {  // 3 stages x 3 basic blocks, 16-32-64 channels
    v.push_back({"resnet20", "stem 3->16", conv(n, 3, 32, 16, 3, 1, 1), 1, false});
    v.push_back({"resnet20", "s1 16->16", conv(n, 16, 32, 16, 3, 1, 1), 6, true});
    v.push_back({"resnet20", "s2 16->32 /2", conv(n, 16, 32, 32, 3, 2, 1), 1, true});
    v.push_back({"resnet20", "s2 32->32", conv(n, 32, 16, 32, 3, 1, 1), 5, true});
    v.push_back({"resnet20", "s2 proj 1x1 /2", conv(n, 16, 32, 32, 1, 2, 0), 1, true});
    v.push_back({"resnet20", "s3 32->64 /2", conv(n, 32, 16, 64, 3, 2, 1), 1, true});
    v.push_back({"resnet20", "s3 64->64", conv(n, 64, 8, 64, 3, 1, 1), 5, true});
    v.push_back({"resnet20", "s3 proj 1x1 /2", conv(n, 32, 16, 64, 1, 2, 0), 1, true});
  }
  if (model == "resnet18" || model == "all") {  // 4 stages x 2 basic blocks, 64-128-256-512
    v.push_back({"resnet18", "stem 3->64", conv(n, 3, 32, 64, 3, 1, 1), 1, false});
    v.push_back({"resnet18", "l1 64->64", conv(n, 64, 32, 64, 3, 1, 1), 4, true});
    int64_t c = 64, hw = 32;
    for (int stage = 2; stage <= 4; ++stage, c *= 2, hw /= 2) {
      const std::string l = "l" + std::to_string(stage) + " ";
      v.push_back({"resnet18", l + std::to_string(c) + "->" + std::to_string(2 * c) + " /2",
                   conv(n, c, hw, 2 * c, 3, 2, 1), 1, true});
      v.push_back({"resnet18", l + std::to_string(2 * c) + "->" + std::to_string(2 * c),
                   conv(n, 2 * c, hw / 2, 2 * c, 3, 1, 1), 3, true});
      v.push_back({"resnet18", l + "proj 1x1 /2", conv(n, c, hw, 2 * c, 1, 2, 0), 1, true});
    }
  }
  if (model == "mobilenet" || model == "all") {  // MobileNetV2 (CIFAR, 32x32) depthwise + pointwise
    v.push_back({"mobilenet", "dw 96 /2", conv(n, 96, 32, 96, 3, 2, 1, 96), 1, true});
    v.push_back({"mobilenet", "dw 144", conv(n, 144, 16, 144, 3, 1, 1, 144), 1, true});
    v.push_back({"mobilenet", "dw 384", conv(n, 384, 4, 384, 3, 1, 1, 384), 1, true});
    v.push_back({"mobilenet", "pw 144->24", conv(n, 144, 16, 24, 1, 1, 0), 1, true});
    v.push_back({"mobilenet", "pw 24->144", conv(n, 24, 16, 144, 1, 1, 0), 1, true});
    v.push_back({"mobilenet", "pw 64->384", conv(n, 64, 4, 384, 1, 1, 0), 1, true});
  }
  ACTLAB_CHECK(!v.empty(), "unknown --model '", model, "' (resnet20, resnet18, mobilenet, all)");
  return v;
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The machine may be shared (other builds): before timing a layer, wait (up to --quiet-wait s) until
// the whole machine has been < 15% busy for 0.3 s. Returns false when it never got quiet.
int g_quiet_wait_s = 120;  // --quiet-wait SECONDS
bool wait_for_quiet_cpu() {
  auto sample = [](double& busy, double& total) {
    std::FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long v[8] = {};
    const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                                &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    std::fclose(f);
    if (got < 8) return false;
    total = 0;
    for (auto x : v) total += x;
    busy = total - v[3] - v[4];  // minus idle and iowait
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(g_quiet_wait_s)) {
    double b0, t0, b1, t1;
    if (!sample(b0, t0)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (!sample(b1, t1)) return true;
    if (t1 > t0 && (b1 - b0) / (t1 - t0) < 0.15) return true;
  }
  return false;
}

bool g_use_min = false;  // --stat min: the fastest rep (for a machine other jobs share)
// --clock cpu: process CPU time divided by the thread count instead of wall time. On a machine
// other jobs keep busy, this (with --threads 1) still measures the work, not the waiting.
bool g_cpu_clock = false;
int g_threads = 2;

double now_ms() {
  if (!g_cpu_clock)
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6) / g_threads;
}

template <typename F>
double median_ms(int reps, F&& f) {
  f();  // warm-up: creates the primitives, faults in the pages
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    f();
    ms.push_back(now_ms() - t0);
  }
  std::sort(ms.begin(), ms.end());
  return g_use_min ? ms.front() : ms[ms.size() / 2];
}

struct Timing { double fwd_ms, bwd_data_ms, bwd_weight_ms, workspace_mib; };

Timing time_layer(const ConvShape& s, ConvImpl impl, actlab::Precision compute, int reps) {
  const size_t x_n = s.N * s.C * s.H * s.W, w_n = s.K * (s.C / s.groups) * s.R * s.S;
  const size_t y_n = s.N * s.K * s.P() * s.Q();
  const auto x = random_vector(x_n, 1), w = random_vector(w_n, 2), dy = random_vector(y_n, 3);
  std::vector<float> y(y_n), dx(x_n), dw(w_n);
  Timing t;
  actlab::reset_peak();
  const int64_t workspace_before = actlab::memory_stats()[actlab::MemTag::Workspace].current;
  t.fwd_ms = median_ms(reps, [&] {
    actlab::cpu::conv2d_forward(y.data(), x.data(), w.data(), nullptr, s, impl, compute);
  });
  t.bwd_data_ms = median_ms(reps, [&] {
    actlab::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s, impl, compute);
  });
  t.bwd_weight_ms = median_ms(reps, [&] {
    actlab::cpu::conv2d_backward_weight(dw.data(), nullptr, dy.data(), x.data(), s, impl, compute);
  });
  t.workspace_mib =
      (actlab::memory_stats()[actlab::MemTag::Workspace].peak - workspace_before) / 1048576.0;
  return t;
}

// An --impl entry: IMPL, or IMPL@PRECISION ("dnnl-plain@bf16": the implementation at a compute precision,
// core/precision.h; fp32 without one). Throws on an unknown name, on a precision this CPU cannot run, and on
// an implementation without a path at that precision (dnnl-wino@bf16).
struct ImplSpec {
  ConvImpl impl;
  actlab::Precision compute;
};
ImplSpec parse_impl_spec(const std::string& entry) {
  const size_t at = entry.find('@');
  const ImplSpec spec{actlab::cpu::conv_impl_from_name(entry.substr(0, at)),
                      at == std::string::npos ? actlab::Precision::F32 : actlab::parse_precision(entry.substr(at + 1))};
  actlab::check_precision_supported(spec.compute, actlab::Device::cpu());
  actlab::cpu::check_conv_impl(spec.impl, spec.compute);
  return spec;
}

void run_conv(const std::vector<Layer>& layers, const std::vector<std::string>& impls, int reps) {
  std::printf("| model | layer | N,C,HxW -> K,PxQ (RxS/stride, groups) | x | impl | fwd ms | "
              "fwd GF/s | bwd-data ms | bwd-data GF/s | bwd-weight ms | bwd-weight GF/s | "
              "peak scratch MiB |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& impl_name : impls) {
    const auto [impl, compute] = parse_impl_spec(impl_name);
    std::string current_model;
    double step_ms = 0.0, step_gflop = 0.0;
    auto print_total = [&] {
      if (current_model.empty()) return;
      std::printf("| **%s** | **conv total per step** | fwd + bwd-weight, bwd-data except stem "
                  "| | %s | | | | | **%.1f ms** | **%.1f GF/s** |\n",
                  current_model.c_str(), impl_name.c_str(), step_ms, step_gflop / step_ms * 1e3);
    };
    for (const Layer& l : layers) {
      if (l.model != current_model) {
        print_total();
        current_model = l.model, step_ms = 0.0, step_gflop = 0.0;
      }
      const ConvShape& s = l.shape;
      const bool quiet = wait_for_quiet_cpu();
      const Timing t = time_layer(s, impl, compute, reps);
      const double gflop = s.flops() * 1e-9;
      step_ms += l.count * (t.fwd_ms + t.bwd_weight_ms + (l.needs_dx ? t.bwd_data_ms : 0.0));
      step_gflop += l.count * gflop * (l.needs_dx ? 3.0 : 2.0);
      std::printf("| %s | %s%s | %lld,%lld,%lldx%lld -> %lld,%lldx%lld (%lldx%lld/%lld, g%lld) | %d "
                  "| %s | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | %.1f |\n",
                  l.model.c_str(), l.name.c_str(), quiet ? "" : " (busy machine)", (long long)s.N, (long long)s.C,
                  (long long)s.H, (long long)s.W, (long long)s.K, (long long)s.P(),
                  (long long)s.Q(), (long long)s.R, (long long)s.S, (long long)s.stride_h,
                  (long long)s.groups, l.count, impl_name.c_str(), t.fwd_ms, gflop / t.fwd_ms * 1e3,
                  t.bwd_data_ms, gflop / t.bwd_data_ms * 1e3, t.bwd_weight_ms,
                  gflop / t.bwd_weight_ms * 1e3, t.workspace_mib);
      std::fflush(stdout);
    }
    print_total();
  }
}

// --alloc caching: a CPU backend that keeps freed blocks for reuse (never returns them), to show
// what fresh-page faults cost: on this VM a first touch costs ~15 us per 4 KiB page.
class CachingCpuAllocator final : public actlab::RawAllocator {
 public:
  void* raw_allocate(size_t bytes, int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = free_[bytes];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void raw_free(void* ptr, size_t bytes, int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[bytes].push_back(ptr);
  }
 private:
  std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
};

// --alloc hugepage: blocks >= 1 MiB are mmapped 2 MiB-aligned with MADV_HUGEPAGE (one fault per
// 2 MiB instead of per 4 KiB) and unmapped on free; smaller ones come from malloc.
class HugePageCpuAllocator final : public actlab::RawAllocator {
 public:
  static constexpr size_t kHuge = size_t(2) << 20;
  void* raw_allocate(size_t bytes, int) override {
    if (bytes < (size_t(1) << 20)) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    const size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
    char* raw = static_cast<char*>(
        mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (raw == MAP_FAILED) return nullptr;
    char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
    if (p > raw) munmap(raw, p - raw);  // trim to a 2 MiB-aligned region of len bytes
    if (raw + len + kHuge > p + len) munmap(p + len, raw + len + kHuge - (p + len));
    madvise(p, len, MADV_HUGEPAGE);
    return p;
  }
  void raw_free(void* ptr, size_t bytes, int) override {
    if (bytes < (size_t(1) << 20)) return std::free(ptr);
    munmap(ptr, (bytes + kHuge - 1) / kHuge * kHuge);
  }
};

// cblas_sgemm from the system OpenBLAS, loaded at run time so libactlab does not depend on it.
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);

void run_gemm(const std::vector<Layer>& layers, int reps, int threads) {
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  auto openblas = lib ? reinterpret_cast<CblasSgemm>(dlsym(lib, "cblas_sgemm")) : nullptr;
  if (lib) {
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(lib, "openblas_set_num_threads")))
      set(threads);
  }
  if (!openblas) std::printf("(OpenBLAS not found: %s)\n", dlerror());
  std::printf("| GEMM (M x N x K) | what | dnnl_sgemm GF/s | OpenBLAS cblas_sgemm GF/s |\n");
  std::printf("|---|---|---|---|\n");
  struct G { int64_t M, N, K; std::string what; };
  std::vector<G> shapes = {{1024, 1024, 1024, "square"}, {256, 4096, 1024, "wide"}};
  for (const Layer& l : layers) {  // forward im2col GEMM of one image: W (K, CRS) x col (CRS, PQ)
    const ConvShape& s = l.shape;
    if (s.groups == 1)
      shapes.push_back({s.K, s.P() * s.Q(), s.C * s.R * s.S, l.model + " " + l.name + " im2col"});
  }
  for (const G& g : shapes) {
    wait_for_quiet_cpu();
    const auto A = random_vector(g.M * g.K, 1), B = random_vector(g.K * g.N, 2);
    std::vector<float> C(g.M * g.N);
    const double gflop = 2.0 * g.M * g.N * g.K * 1e-9;
    const double dnnl_ms = median_ms(reps, [&] {
      actlab::cpu::gemm(false, false, g.M, g.N, g.K, 1.f, A.data(), g.K, B.data(), g.N, 0.f,
                        C.data(), g.N);
    });
    double blas_ms = 0.0;
    if (openblas)
      blas_ms = median_ms(reps, [&] {
        openblas(101, 111, 111, g.M, g.N, g.K, 1.f, A.data(), g.K, B.data(), g.N, 0.f, C.data(),
                 g.N);  // RowMajor, NoTrans, NoTrans
      });
    std::printf("| %lld x %lld x %lld | %s | %.0f | %.0f |\n", (long long)g.M, (long long)g.N,
                (long long)g.K, g.what.c_str(), gflop / dnnl_ms * 1e3,
                openblas ? gflop / blas_ms * 1e3 : 0.0);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  actlab::FlagParser flags("bench_conv",
                           "The CPU convolution backend per conv layer of CIFAR ResNet-20, ResNet-18 and MobileNetV2:\n"
                           "GFLOP/s forward / backward-data / backward-weight and one step's conv time per --impl\n"
                           "(bench/RESULTS_conv.md).");
  flags.add("impl", "string", "auto", "comma-separated implementations, each IMPL or IMPL@bf16 (auto,dnnl-blocked,...)");
  flags.add("model", "string", "all", "resnet20, resnet18, mobilenet or all");
  flags.add("batch", "int", "128", "batch size");
  flags.add("reps", "int", "5", "timed repetitions after one warm-up");
  flags.add("threads", "int", "2", "OpenMP threads");
  flags.add("gemm", "bool", "false", "compare dnnl_sgemm with OpenBLAS (loaded at run time) instead");
  flags.add("alloc", "string", "system", "CPU allocator: system, caching or hugepage");
  flags.add("stat", "string", "median", "median or min (the fastest rep, for a machine other jobs share)");
  flags.add("clock", "string", "wall", "wall or cpu (process CPU time / threads)");
  flags.add("quiet-wait", "int", "120", "seconds to wait at most for a quiet CPU before each layer");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const std::string impls = flags.get("impl"), model = flags.get("model"), alloc = flags.get("alloc");
    const int64_t batch = flags.get_int("batch");
    const int reps = static_cast<int>(flags.get_int("reps")), threads = static_cast<int>(flags.get_int("threads"));
    const bool gemm = flags.get_bool("gemm");
    ACTLAB_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
    ACTLAB_CHECK(reps >= 1, "--reps must be >= 1, got ", reps);
    ACTLAB_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
    // Every --impl entry is checked before the first is measured: a typo in the last one of a long list
    // used to surface only after minutes of timing the others.
    const std::vector<std::string> impl_list = actlab::split_list(impls, ',');
    ACTLAB_CHECK(gemm || !impl_list.empty(), "--impl is empty; give e.g. auto,auto@bf16");
    for (const std::string& name : impl_list) parse_impl_spec(name);
    ACTLAB_CHECK(model == "resnet20" || model == "resnet18" || model == "mobilenet" || model == "all",
                 "--model: resnet20, resnet18, mobilenet or all, got '", model, "'");
    ACTLAB_CHECK(flags.get("stat") == "median" || flags.get("stat") == "min", "--stat: median or min, got '",
                 flags.get("stat"), "'");
    ACTLAB_CHECK(flags.get("clock") == "wall" || flags.get("clock") == "cpu", "--clock: wall or cpu, got '",
                 flags.get("clock"), "'");
    g_use_min = flags.get("stat") == "min";
    g_cpu_clock = flags.get("clock") == "cpu";
    g_quiet_wait_s = static_cast<int>(flags.get_int("quiet-wait"));
    omp_set_num_threads(threads);
    g_threads = threads;
    static CachingCpuAllocator caching;
    static HugePageCpuAllocator hugepage;
    ACTLAB_CHECK(alloc == "system" || alloc == "caching" || alloc == "hugepage",
                 "--alloc: system, caching or hugepage");
    if (alloc == "caching") actlab::register_raw_allocator(actlab::DeviceType::CPU, &caching);
    if (alloc == "hugepage") actlab::register_raw_allocator(actlab::DeviceType::CPU, &hugepage);
    std::printf("bench_conv: batch %lld, %d threads, %s of %d reps after 1 warm-up, %s, "
                "%s allocator\n\n", (long long)batch, threads, g_use_min ? "min" : "median", reps,
                g_cpu_clock ? "process CPU time / threads" : "wall clock", alloc.c_str());
    const auto layers = model_layers(model, batch);
    if (gemm) run_gemm(layers, reps, threads);
    else run_conv(layers, impl_list, reps);
    return 0;
  } catch (const std::exception& e) {
    return actlab::report_error("bench_conv", e);
  }
}
