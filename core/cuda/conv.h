// cuDNN 2-D convolution (NCHW fp32, groups incl. depthwise, dilation 1): forward, backward-data and
// backward-weight (+ bias), with one plan per (device, shape, options) holding the cuDNN descriptors and
// the algorithm chosen for each direction, so selection runs once per shape. Also the precision and
// search switches every backend kernel of this kind needs. Implemented in core/cuda/conv.cpp (host code
// calling cuDNN's convolution API); called only from core/ops.cpp. Tested in tests/test_cuda_ops.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

#include "actlab/core/cpu/conv.h"  // ConvShape (shared plain struct)
#include "actlab/core/cuda/context.h"
#include "actlab/core/precision.h"

namespace actlab::cuda {

// Process-wide GPU math settings, read when a plan is made (plans are keyed by them, so changing a setting
// makes new plans rather than reusing old ones).
struct MathOptions {
  // TF32 tensor cores for fp32 convolutions and GEMMs. Off by default: results then match the CPU backend
  // to fp32 rounding. (PyTorch's default is on for convolutions, off for matmuls.)
  bool allow_tf32 = false;
  // Time every applicable algorithm on the first use of a shape (cudnnFind*AlgorithmEx, like
  // torch.backends.cudnn.benchmark) instead of taking cuDNN's heuristic first choice.
  bool benchmark = false;
  // Only algorithms cuDNN marks deterministic (like torch.backends.cudnn.deterministic): the backward
  // algorithms that add partial sums with atomics give run-to-run differences in the last bits otherwise.
  bool deterministic = false;
  // Largest workspace an algorithm may ask for, bytes.
  size_t max_workspace = size_t(1) << 30;
};
MathOptions& math_options();

// All pointers: device memory of ctx's device, NCHW / (K, C/groups, R, S) contiguous fp32; outputs are
// assigned and must not alias inputs. Asynchronous on ctx.stream(); scratch memory is ctx.workspace().
// Throws Error (naming the cuDNN call) on a failure, or when actlab was built without cuDNN.

// With p = BF16 or F16 the two inputs are rounded to that format first (core/cuda/lowp.h), cuDNN computes
// on tensor cores with fp32 accumulation and writes a 16-bit output that is widened back into the fp32 one;
// the bias and its gradient stay fp32. Plans are per precision.

// y (N,K,P,Q) = conv(x, w) + b (K); b may be nullptr.
void conv2d_forward(float* y, const float* x, const float* w, const float* b, const cpu::ConvShape& s,
                    CudaContext& ctx, Precision p = Precision::F32);
// dx (N,C,H,W) = transposed convolution of dy with w.
void conv2d_backward_data(float* dx, const float* dy, const float* w, const cpu::ConvShape& s, CudaContext& ctx,
                          Precision p = Precision::F32);
// dw (K,C/g,R,S) = Σ dy ⊗ x-windows; db (K) = Σ dy over n,p,q unless db is nullptr.
void conv2d_backward_weight(float* dw, float* db, const float* dy, const float* x, const cpu::ConvShape& s,
                            CudaContext& ctx, Precision p = Precision::F32);

// Number of cached plans (one per distinct shape and settings) and the number of algorithm selections run
// so far (each plan selects once per direction it is used in): lets tests see the cache work.
int64_t conv_plan_count();
int64_t conv_algorithm_searches();
// Drops every cached plan (descriptors are destroyed; the next call selects again).
void conv_clear_cache();

}  // namespace actlab::cuda
