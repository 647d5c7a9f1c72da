// Precision names, the support check and the per-thread compute precision (core/precision.h).
#include "actlab/core/precision.h"

#include "actlab/core/error.h"

namespace actlab {
namespace {
thread_local Precision t_precision = Precision::F32;
}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::F32: return "fp32";
    case Precision::BF16: return "bf16";
    case Precision::F16: return "fp16";
  }
  return "?";
}

std::string precision_forms() { return "fp32|bf16|fp16"; }

Precision parse_precision(const std::string& name) {
  // "f32" and "f16" are older spellings, still in checkpoints' stored configurations; a configuration stores
  // the canonical name (train/config_file.cpp), so the two read alike to the resume check and the reports.
  if (name == "fp32" || name == "f32") return Precision::F32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16" || name == "f16") return Precision::F16;
  ACTLAB_FAIL("unknown precision '", name, "' (accepted: ", precision_forms(), ")");
}

std::string canonical_precision_name(const std::string& name) {
  try {
    return precision_name(parse_precision(name));
  } catch (const Error&) {
    return name;
  }
}

bool cpu_has_bf16() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return false;
#endif
}

bool cpu_runs_bf16_kernels() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

std::string cpu_bf16_flags() {
#if defined(__x86_64__)
  std::string s;
  if (__builtin_cpu_supports("avx512bf16")) s += "avx512_bf16";
  if (__builtin_cpu_supports("amx-bf16")) s += std::string(s.empty() ? "" : " ") + "amx_bf16";
  return s.empty() ? "none" : s;
#else
  return "none";
#endif
}

void check_precision_supported(Precision p, Device device) {
  if (p == Precision::F32) return;
  if (device.is_cuda()) {
    // cuDNN's and cuBLAS's tensor-core kernels (core/cuda/lowp.h); a CPU-only build fails at the device itself.
    return;
  }
  ACTLAB_CHECK(p != Precision::F16, "--precision fp16 needs a GPU (fp16 with loss scaling); on a CPU use bf16");
#if defined(ACTLAB_MINIMAL_BUILD)
  ACTLAB_FAIL("--precision bf16 needs oneDNN's bf16 kernels, which a minimal (GPU check) build leaves out");
#endif
  ACTLAB_CHECK(cpu_has_bf16(), "--precision bf16: this CPU has neither avx512_bf16 nor amx_bf16 (lscpu flags), ",
               cpu_runs_bf16_kernels() ? "so oneDNN would emulate bf16, slower than fp32"
                                       : "and without AVX-512 oneDNN has no bf16 kernels for it",
               "; use --precision fp32");
}

PrecisionScope::PrecisionScope(Precision p) : previous_(t_precision) { t_precision = p; }
PrecisionScope::~PrecisionScope() { t_precision = previous_; }
Precision compute_precision() { return t_precision; }

}  // namespace actlab
