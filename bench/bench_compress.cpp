// Benchmark of the activation codec (compress/policies.h, core/cpu/codec.cpp) on the saved-activation
// shapes of CIFAR ResNet-18 at batch 128: pack and unpack speed (plain planes, the 16-channel blocks a
// convolution's backward reads, one channel at a time as batch-norm backward reads) against a plain memcpy of
// the same f32 bytes, and the measured compression rate against the closed form. Results: bench/RESULTS_compress.md.
// --shapes vit takes vit_tiny_cifar's saves at 28² instead (token maps (B, 50, 192) and (B, 50, 768), attention
// planes (B, 3, 50, 64) and the softmax's probabilities (B, 3, 50, 50), packed as training packs them: at
// least kProbabilityBits-bit codes).
// Usage: bench_compress --help.
// --clock cpu divides by the process CPU time instead of wall time: GB/s per busy core, which stays
// meaningful on a shared, oversubscribed machine (the wall clock then measures the neighbours).
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/compress/policies.h"
#include "actlab/core/allocator.h"
#include "actlab/io/files.h"
#include "actlab/train/cli.h"

namespace {
// The first bytes of the --out file: a file that begins so is an earlier run's, replaced without --overwrite.
constexpr const char* kOutStart = "GB/s = f32 bytes of the tensor";

using namespace actlab;
bool g_cpu_clock = false;

double now_seconds() {
  if (!g_cpu_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best time in seconds (wall or CPU) of `reps` calls of f after two warm-up calls.
template <typename F>
double best_seconds(int reps, F f) {
  f();
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double start = now_seconds();
    f();
    t.push_back(now_seconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[0];  // the minimum: the machine is shared, so the fastest run is the least disturbed one
}

// memcpy split over the OpenMP threads, like the codec's plane loop.
void parallel_copy(float* dst, const float* src, int64_t n) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * 4);
  }
}

struct Row {
  std::string policy, shape;
  double pack_gbs, unpack_kernel_gbs, unpack_api_gbs, memcpy_gbs;
  double blocked_gbs = 0, channels_gbs = 0, channels_last_gbs = 0;  // 0: the policy has no such path
  double bits_measured, bits_closed;
  double rate_measured, rate_closed;
};

// "12.3", or "-" for a path the policy does not have.
std::string gbs_or_dash(double gbs) {
  if (gbs <= 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", gbs);
  return text;
}

// One saved shape; min_bits as its SaveInfo asks (the attention probabilities: kProbabilityBits).
struct SavedShape {
  Shape shape;
  int min_bits = 0;
};

Row measure(const ActivationCachePolicy& policy, const SavedShape& saved, int reps, bool channels_last) {
  const Shape& shape = saved.shape;
  SaveInfo info;
  info.min_bits = saved.min_bits;
  info.channels_last = channels_last;
  PhiloxStream rng(1, 2);
  // A bf16 run's channels-last flow hands its saves over channels-last to the policies that take them so
  // (takes_channels_last: the bf16 keep, the plane codecs); the others keep the (N, C, H, W) flow and get that.
  const bool cl = channels_last && shape.size() == 4 && policy.takes_channels_last();
  const Tensor x = cl ? Tensor::randn(shape, rng).channels_last() : Tensor::randn(shape, rng);
  const int64_t numel = x.numel();
  const double f32_bytes = static_cast<double>(numel) * 4;
  Tensor dst = Tensor::empty(shape);
  dst.fill_(0.f);  // touch the pages once: memcpy and kernel unpack write into warm memory
  uint64_t stream = 0;

  Row row;
  row.policy = policy.name();
  row.shape = shape_str(shape) + (saved.min_bits ? " probabilities" : "");
  row.memcpy_gbs = f32_bytes / best_seconds(reps, [&] { parallel_copy(dst.data<float>(), x.data<float>(), numel); }) / 1e9;
  row.pack_gbs = f32_bytes / best_seconds(reps, [&] { policy.pack(x, info, {7, stream++}); }) / 1e9;
  const auto packed = policy.pack(x, info, {7, 0});
  row.unpack_api_gbs = f32_bytes / best_seconds(reps, [&] { policy.unpack(*packed, {}); }) / 1e9;
  // Kernel only, into warm memory (what a backward that reuses its workspace would see).
  if (const auto* planes = dynamic_cast<const PackedPlanes*>(packed.get()); planes && !planes->residual()) {
    row.unpack_kernel_gbs = f32_bytes / best_seconds(reps, [&] {
      cpu::plane_unpack(dst.data<float>(), planes->lfc(), planes->codes(), planes->mins(), planes->steps(),
                        planes->geometry());
    }) / 1e9;
  } else if (const auto* groups = dynamic_cast<const PackedGroups*>(packed.get())) {
    row.unpack_kernel_gbs = f32_bytes / best_seconds(reps, [&] {
      cpu::group_unpack(dst.data<float>(), groups->codes(), groups->mins(), groups->steps(), groups->geometry());
    }) / 1e9;
  } else {
    row.unpack_kernel_gbs = row.unpack_api_gbs;
  }
  // The two layouts a backward asks for: 16-channel blocks (a convolution's backward-weights input) and one
  // channel at a time into a per-thread buffer that stays in cache (batch-norm backward). Both decode one
  // code range per plane; a policy with ranges of R rows (R=1) has neither path, as in training.
  if (const auto* planes = dynamic_cast<const PackedPlanes*>(packed.get());
      planes && !planes->residual() && shape[1] % cpu::kChannelBlock == 0 && planes->geometry().ranges_per_plane() == 1) {
    row.blocked_gbs = f32_bytes / best_seconds(reps, [&] {
      cpu::plane_unpack_blocked(dst.data<float>(), planes->lfc(), planes->codes(), planes->mins(), planes->steps(),
                                planes->geometry(), shape[1]);
    }) / 1e9;
    const int64_t channel_elems = shape[0] * shape[2] * shape[3];
    std::vector<float> buffers(static_cast<size_t>(omp_get_max_threads() * channel_elems));
    row.channels_gbs = f32_bytes / best_seconds(reps, [&] {
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < shape[1]; ++c)
        cpu::plane_unpack_channel(buffers.data() + omp_get_thread_num() * channel_elems, planes->lfc(), planes->codes(),
                                  planes->mins(), planes->steps(), planes->geometry(), shape[1], c);
    }) / 1e9;
  }
  // The decode a consumer computing channels-last asks for (batch norm's backward in a bf16 run), where the policy
  // writes it directly (the plane codecs' lane kernels).
  if (policy.unpack_channels_last(*packed, info).defined())
    row.channels_last_gbs = f32_bytes / best_seconds(reps, [&] { policy.unpack_channels_last(*packed, info); }) / 1e9;
  row.bits_measured = 8.0 * static_cast<double>(packed->nbytes()) / static_cast<double>(numel);
  row.bits_closed = 8.0 * static_cast<double>(policy.layer_expected_bytes(shape, info)) / static_cast<double>(numel);
  row.rate_measured = 32.0 / row.bits_measured;
  row.rate_closed = 32.0 / row.bits_closed;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  FlagParser flags("bench_compress",
                   "Pack and unpack speed of the activation codec on ResNet-18's (or vit_tiny_cifar's) saved shapes, and the\n"
                   "measured compression against the closed form (a Markdown table on stdout).");
  flags.add("policies", "string", "division:B=8,Q=2;quant:Q=2;lfc:B=8;hfc:B=8,Q=2;pergroup:G=256,Q=2;division:B=8,Q=4",
            "policies separated by ';'");
  flags.add("batch", "int", "128", "batch size");
  flags.add("reps", "int", "10", "timed repetitions, best kept");
  flags.add("threads", "int", "2", "OpenMP threads");
  flags.add("clock", "string", "wall", "wall|cpu: divide by wall time or by the process's CPU time");
  flags.add("shapes", "string", "resnet18", "resnet18|vit");
  flags.add("simd", "string", cpu::codec_simd_name(cpu::codec_simd_supported()),
            "portable|avx2|avx512: the widest hand-written codec paths to use (the default is the widest this CPU runs)");
  flags.add("channels-last", "bool", "false",
            "pack a channels-last f32 tensor for a consumer computing channels-last, as a bf16 run's\n"
            "channels-last flow does (SaveInfo::channels_last: the bf16 keep narrows it in its layout, the\n"
            "plane codecs pack it without an (N, C, H, W) copy)");
  flags.add("out", "string", "", "also write the table to this file");
  flags.add("overwrite", "bool", "false", "replace an --out file that exists and is not an earlier table of this program");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const std::string policies = flags.get("policies"), out_path = flags.get("out"), shape_set = flags.get("shapes");
    const std::string simd = flags.get("simd");
    const int64_t batch = flags.get_int("batch");
    const int reps = static_cast<int>(flags.get_int("reps")), threads = static_cast<int>(flags.get_int("threads"));
    ACTLAB_CHECK(batch >= 1 && reps >= 1 && threads >= 1, "--batch, --reps and --threads must be >= 1");
    ACTLAB_CHECK(!split_list(policies, ';').empty(), "--policies is empty; give e.g. 'division:B=8,Q=2;quant:Q=2'");
    ACTLAB_CHECK(flags.get("clock") == "wall" || flags.get("clock") == "cpu", "--clock: wall or cpu, got '",
                 flags.get("clock"), "'");
    g_cpu_clock = flags.get("clock") == "cpu";
    bool known_level = false;
    for (const cpu::CodecSimd level : {cpu::CodecSimd::Portable, cpu::CodecSimd::Avx2, cpu::CodecSimd::Avx512})
      if (simd == cpu::codec_simd_name(level)) {
        ACTLAB_CHECK(level <= cpu::codec_simd_supported(), "--simd ", simd, ": this CPU runs at most ",
                     cpu::codec_simd_name(cpu::codec_simd_supported()));
        cpu::set_codec_simd(level);
        known_level = true;
      }
    ACTLAB_CHECK(known_level, "--simd: portable, avx2 or avx512, got '", simd, "'");
    std::printf("codec paths: %s (this CPU runs up to %s)\n", simd.c_str(),
                cpu::codec_simd_name(cpu::codec_simd_supported()));
    omp_set_num_threads(threads);
    check_writable(out_path, flags.get_bool("overwrite") || replaceable_output(out_path, kOutStart), "--out file");
    ACTLAB_CHECK(shape_set == "resnet18" || shape_set == "vit", "--shapes: resnet18 or vit, got '", shape_set, "'");
    const std::vector<SavedShape> shapes =
        shape_set == "vit"
            ? std::vector<SavedShape>{{{batch, 50, 192}}, {{batch, 50, 768}}, {{batch, 3, 50, 64}},
                                      {{batch, 3, 50, 50}, kProbabilityBits}}
            : std::vector<SavedShape>{{{batch, 64, 32, 32}}, {{batch, 128, 16, 16}}, {{batch, 256, 8, 8}},
                                      {{batch, 512, 4, 4}}};

    std::ostringstream md;
    md << "| policy | shape | pack GB/s | unpack GB/s (kernel) | unpack GB/s (API) | blocked unpack GB/s | "
          "channel reads GB/s | channels-last unpack GB/s | memcpy GB/s | bits/elem | closed form | rate | "
          "closed-form rate |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    // Every policy parsed before the first is measured: a typo late in the list fails now.
    std::vector<std::shared_ptr<const ActivationCachePolicy>> parsed;
    for (const std::string& spec : split_list(policies, ';')) parsed.push_back(parse_policy(spec));
    std::fputs(md.str().c_str(), stdout);  // the rows below are printed as they are measured
    for (const auto& policy : parsed) {
      for (const SavedShape& shape : shapes) {
        const Row r = measure(*policy, shape, reps, flags.get_bool("channels-last"));
        char line[512];
        // swap keeps 0 bits on the device: its rate is no number ("-"), not "infx"
        const auto rate = [](double x) {
          char text[32];
          std::snprintf(text, sizeof text, "%.2fx", x);
          return std::isfinite(x) ? std::string(text) : std::string("-");
        };
        std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.1f | %s | %s | %s | %.1f | %.3f | %.3f | %s | %s |\n",
                      r.policy.c_str(), r.shape.c_str(), r.pack_gbs, r.unpack_kernel_gbs, r.unpack_api_gbs,
                      gbs_or_dash(r.blocked_gbs).c_str(), gbs_or_dash(r.channels_gbs).c_str(),
                      gbs_or_dash(r.channels_last_gbs).c_str(), r.memcpy_gbs, r.bits_measured,
                      r.bits_closed, rate(r.rate_measured).c_str(), rate(r.rate_closed).c_str());
        md << line;
        std::fputs(line, stdout);
        std::fflush(stdout);
      }
    }
    if (!out_path.empty()) {
      std::ostringstream f;
      f << kOutStart << " / best " << (g_cpu_clock ? "process CPU" : "wall") << " time of " << reps
        << " reps, " << threads << " threads; memcpy copies the same f32 bytes.\n\n"
        << md.str();
      write_text_atomic(out_path, f.str());
    }
  } catch (const std::exception& e) {
    return report_error("bench_compress", e);
  }
  return 0;
}
