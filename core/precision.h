// The compute precision of a run (--precision fp32|bf16|fp16): what convolutions and linear layers
// compute in, and what `exact` keeps for backward. The one home of the names, the support check and the
// per-thread scope that ops and SavedTensor read (docs/precision.md). Tested in tests/test_precision.cpp.
#pragma once
#include <string>

#include "actlab/core/device.h"

namespace actlab {

// F32: everything in fp32. BF16: convolutions, linear layers and batched matmuls read bf16-rounded operands
// and accumulate in fp32 (oneDNN's bf16 kernels); their outputs, batch norm, softmax, the loss, reductions,
// the master weights and the optimizer state stay fp32; saves offered as lossy that the policy keeps
// exactly are kept in bf16. F16: the same with fp16 operands and fp16 keeps, GPUs only, with loss scaling
// (the trainer's --loss-scale auto). On a GPU both run on cuDNN's and cuBLAS's tensor cores
// (core/cuda/lowp.h).
enum class Precision { F32, BF16, F16 };

const char* precision_name(Precision p);  // "fp32", "bf16", "fp16"
// "fp32" | "f32" | "bf16" | "fp16" | "f16"; throws Error naming the accepted forms on anything else.
Precision parse_precision(const std::string& name);
// The canonical name of an accepted spelling ("f32" -> "fp32"), and any other string unchanged, so that a
// configuration can store what it was given and leave the error to its validation.
std::string canonical_precision_name(const std::string& name);
std::string precision_forms();  // "fp32|bf16|fp16", for --help

// Throws Error, one line saying what is missing, unless `p` can run on `device` in this build: bf16 on a
// CPU needs oneDNN and avx512_bf16 or amx_bf16 (without them oneDNN emulates bf16 and runs slower than
// fp32, so it is refused rather than slow); fp16 needs a GPU. On a GPU both are accepted (bf16 tensor cores
// need compute capability 8.0 or later, which cuDNN reports on the first convolution otherwise).
void check_precision_supported(Precision p, Device device);
// Whether this CPU has bf16 dot-product instructions (avx512_bf16 or amx_bf16), and their names.
bool cpu_has_bf16();
// Whether oneDNN has bf16 kernels for this CPU at all: AVX-512 (avx512f/bw/vl/dq; without avx512_bf16 it
// emulates the dot products). On AVX2-only CPUs it creates no bf16 primitive, so the bf16 op tests skip.
bool cpu_runs_bf16_kernels();
std::string cpu_bf16_flags();  // "avx512_bf16 amx_bf16", "avx512_bf16" or "none"

// The precision the calling thread computes in while this scope is alive (default: F32). Ops and
// SavedTensor read it, as the policy set is read from ActivationCacheScope.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;
 private:
  Precision previous_;
};
Precision compute_precision();

}  // namespace actlab
