// The one dispatch point of every tensor op: shape checks, output allocation on the inputs' device, then
// the cpu:: kernel or (tensors on a GPU) the cuda:: kernel on that device's stream. Tensors of one op on
// different devices are refused with an error naming both. CUDA branches are compiled in CUDA builds
// only; in a CPU-only build no tensor can live on a GPU, so they are unreachable there.
// Tested through tests/test_functions.cpp, the kernel suites and tests/test_cuda_ops.cpp (CPU vs CUDA).
#include "actlab/core/ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "actlab/core/cpu/conv.h"
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/cpu/kernels.h"

#include "actlab/core/dispatch.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/blas.h"
#include "actlab/core/cuda/conv.h"
#include "actlab/core/cuda/kernels.h"
#endif

namespace actlab::ops {
namespace {

// The device all defined tensors of an op live on (the CPU when none is defined).
Device op_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    ACTLAB_CHECK(t->device() == first->device(), op, ": tensors on different devices: ", first->str(), " on ",
                 first->device().str(), " and ", t->str(), " on ", t->device().str(),
                 "; move them to one device first (Tensor::to, Module::to)");
  }
  return first ? first->device() : Device::cpu();
}

void require_f32_contig(const char* op, const char* what, const Tensor& t) {
  ACTLAB_CHECK(t.defined(), op, ": ", what, " is undefined");
  ACTLAB_CHECK(t.dtype() == DType::F32, op, ": ", what, " must be f32, got ", t.str());
  ACTLAB_CHECK(t.is_contiguous(), op, ": ", what, " must be contiguous, got ", t.str());
}

cpu::ConvShape conv_shape(const Shape& x, const Shape& w, const ConvParams& p) {
  ACTLAB_CHECK(x.size() == 4, "conv2d: input must be (N,C,H,W), got ", shape_str(x));
  ACTLAB_CHECK(w.size() == 4, "conv2d: weight must be (K,C/groups,R,S), got ", shape_str(w));
  ACTLAB_CHECK(p.groups >= 1 && x[1] % p.groups == 0 && w[0] % p.groups == 0, "conv2d: groups ", p.groups,
               " must divide input channels ", x[1], " and output channels ", w[0]);
  ACTLAB_CHECK(w[1] * p.groups == x[1], "conv2d: input ", shape_str(x), " vs weight ", shape_str(w),
               ": channels ", x[1], " != ", w[1], "*", p.groups);
  cpu::ConvShape s;
  s.N = x[0]; s.C = x[1]; s.H = x[2]; s.W = x[3];
  s.K = w[0]; s.R = w[2]; s.S = w[3];
  s.stride_h = s.stride_w = p.stride;
  s.pad_h = s.pad_w = p.padding;
  s.groups = p.groups;
  cpu::check_conv_shape(s);
  return s;
}

cpu::Pool2dShape pool_shape(const Shape& x, const PoolParams& p) {
  ACTLAB_CHECK(x.size() == 4, "pool2d: input must be (N,C,H,W), got ", shape_str(x));
  cpu::Pool2dShape s;
  s.N = x[0]; s.C = x[1]; s.H = x[2]; s.W = x[3];
  s.R = s.S = p.kernel;
  s.stride_h = s.stride_w = p.stride;
  s.pad_h = s.pad_w = p.padding;
  cpu::check_pool_shape(s);
  return s;
}

Tensor new_mask(int64_t n, Device dev) { return Tensor::empty({cpu::mask_words(n)}, DType::I32, dev); }
uint32_t* mask_ptr(const Tensor& m) { return reinterpret_cast<uint32_t*>(m.data<int32_t>()); }
const float* opt_ptr(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
float* f32(const Tensor& t) { return t.data<float>(); }

}  // namespace

// ---------------------------------------------------------------- convolution
namespace {
// The precision a convolution, linear layer or batched matmul computes in: the calling thread's
// (core/precision.h). The trainer checks the run's precision against its device up front; this guards
// direct callers (fp16 has no CPU kernels).
Precision gemm_precision(Device dev, const char* op) {
  const Precision p = compute_precision();
  ACTLAB_CHECK(p != Precision::F16 || dev.is_cuda(), op, " on ", dev.str(), ": --precision fp16 runs on GPUs only");
  return p;
}
Precision conv_precision(Device dev) { return gemm_precision(dev, "conv2d"); }

// A convolution input given as bf16 (a bf16 run's kept copy): only the CPU's bf16 kernels read one, laid out
// (N, C, H, W) or channels-last. Returns its layout.
cpu::Layout check_bf16_conv_input(const char* op, const Tensor& x, Device dev, Precision pr) {
  ACTLAB_CHECK(dev.is_cpu() && pr == Precision::BF16 && (x.is_contiguous() || x.is_channels_last()), op,
               ": a bf16 input needs bf16 compute on the CPU and a contiguous or channels-last tensor, got ", x.str(),
               " on ", dev.str(), " under ", precision_name(pr));
  return x.is_contiguous() ? cpu::Layout::Nchw : cpu::Layout::ChannelsLast;
}

// An f32 activation operand of `op`: contiguous, or channels-last where `allowed` (a bf16 run's activations;
// `where` says when, for the message). Element-wise kernels run over either as over a flat array; batch norm,
// the shortcut and the convolutions have channels-last kernels of their own. Returns whether it is channels-last.
bool f32_channels_last(const char* op, const char* what, const Tensor& t, bool allowed, const char* where) {
  ACTLAB_CHECK(t.defined() && t.dtype() == DType::F32, op, ": ", what, " must be a defined f32 tensor, got ",
               t.defined() ? t.str() : std::string("undefined"));
  if (t.is_contiguous()) return false;
  ACTLAB_CHECK(allowed && t.is_channels_last(), op, ": ", what, " must be contiguous", where, ", got ", t.str());
  return true;
}
// A convolution's f32 activation operand: channels-last only where the CPU's bf16 kernels compute (cpu::Layout).
cpu::Layout conv_act_layout(const char* op, const char* what, const Tensor& t, Device dev, Precision pr) {
  const bool allowed = dev.is_cpu() && pr == Precision::BF16;
  ACTLAB_CHECK(allowed || !t.defined() || t.is_contiguous(), op, ": ", what,
               " must be contiguous (channels-last only under bf16 compute on the CPU), got ", t.str(), " on ",
               dev.str(), " under ", precision_name(pr));
  const bool cl = f32_channels_last(op, what, t, allowed, " (or channels-last under bf16 compute on the CPU)");
  return cl ? cpu::Layout::ChannelsLast : cpu::Layout::Nchw;
}
// A 4-D tensor of one channel or one position: its two layouts are one memory order (and it is contiguous), so it
// may stand in either.
bool one_order(const Tensor& t) { return t.dim() == 4 && (t.size(1) == 1 || t.size(2) * t.size(3) == 1); }
// An output in its input's layout: contiguous, or channels-last.
Tensor empty_in_layout(const Shape& shape, bool channels_last, Device dev, DType dtype = DType::F32) {
  return channels_last ? Tensor::empty_channels_last(shape, dtype, dev) : Tensor::empty(shape, dtype, dev);
}
// An element-wise operand: either layout, on any device.
bool require_f32_dense(const char* op, const char* what, const Tensor& t) {
  return f32_channels_last(op, what, t, true, " or channels-last");
}
// Two element-wise operands of one call: both contiguous or both channels-last, one shape.
bool require_same_dense(const char* op, const Tensor& a, const Tensor& b, const char* a_name, const char* b_name) {
  const bool a_cl = require_f32_dense(op, a_name, a), b_cl = require_f32_dense(op, b_name, b);
  ACTLAB_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.str(), " vs ", b.str());
  ACTLAB_CHECK(a_cl == b_cl, op, ": ", a_name, " and ", b_name, " are laid out differently (",
               a_cl ? "channels-last" : "contiguous", " vs ", b_cl ? "channels-last" : "contiguous", ")");
  return a_cl;
}
}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, bool channels_last_out) {
  const Device dev = op_device("conv2d", {&x, &w, &b});
  const Precision pr = conv_precision(dev);
  ACTLAB_CHECK(!channels_last_out || (dev.is_cpu() && pr == Precision::BF16),
               "conv2d: a channels-last output needs bf16 compute on the CPU, got ", dev.str(), " under ",
               precision_name(pr));
  const cpu::Layout act = channels_last_out ? cpu::Layout::ChannelsLast : cpu::Layout::Nchw;
  if (x.dtype() != DType::BF16 && !one_order(x))
    ACTLAB_CHECK(conv_act_layout("conv2d", "input", x, dev, pr) == act, "conv2d: an f32 input ", x.str(),
                 " must be laid out as the output is asked to be (", channels_last_out ? "channels-last" : "contiguous",
                 ")");
  require_f32_contig("conv2d", "weight", w);
  const cpu::ConvShape s = conv_shape(x.shape(), w.shape(), p);
  if (b.defined()) {
    require_f32_contig("conv2d", "bias", b);
    ACTLAB_CHECK(b.numel() == s.K, "conv2d: bias ", b.str(), " for ", s.K, " output channels");
  }
  Tensor y = empty_in_layout({s.N, s.K, s.P(), s.Q()}, act == cpu::Layout::ChannelsLast, dev);
  if (x.dtype() == DType::BF16) {
    const cpu::Layout layout = check_bf16_conv_input("conv2d", x, dev, pr);
    cpu::conv2d_forward_bf16_input(f32(y), static_cast<const uint16_t*>(x.raw_data()), f32(w), opt_ptr(b), s,
                                   cpu::ConvImpl::Auto, layout, act);
    return y;
  }
  ACTLAB_DISPATCH(dev, cuda::conv2d_forward(f32(y), f32(x), f32(w), opt_ptr(b), s, gpu.ctx(), pr),
                  cpu::conv2d_forward(f32(y), f32(x), f32(w), opt_ptr(b), s, cpu::ConvImpl::Auto, pr, act));
  return y;
}

Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) {
  const Device dev = op_device("conv2d_backward_data", {&dy, &w});
  const Precision pr = conv_precision(dev);
  const cpu::Layout act = conv_act_layout("conv2d_backward_data", "grad", dy, dev, pr);
  require_f32_contig("conv2d_backward_data", "weight", w);
  const cpu::ConvShape s = conv_shape(x_shape, w.shape(), p);
  ACTLAB_CHECK(dy.shape() == Shape({s.N, s.K, s.P(), s.Q()}), "conv2d backward: grad ", dy.str(),
               " does not match the output of ", s.str());
  Tensor dx = empty_in_layout(x_shape, act == cpu::Layout::ChannelsLast, dev);
  ACTLAB_DISPATCH(dev, cuda::conv2d_backward_data(f32(dx), f32(dy), f32(w), s, gpu.ctx(), pr),
                  cpu::conv2d_backward_data(f32(dx), f32(dy), f32(w), s, cpu::ConvImpl::Auto, pr, act));
  return dx;
}

namespace {
// The bias gradient of a convolution's backward-weights pass: *db = (K) when wanted, its data (else null).
float* bias_grad(Tensor* db, bool want_bias, int64_t K, Device dev) {
  if (!want_bias) return nullptr;
  *db = Tensor::empty({K}, DType::F32, dev);
  return f32(*db);
}
}  // namespace

Tensor conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Shape& w_shape, const ConvParams& p,
                              bool want_bias, Tensor* db) {
  const Device dev = op_device("conv2d_backward_weight", {&dy, &x});
  const Precision pr = conv_precision(dev);
  cpu::Layout act = conv_act_layout("conv2d_backward_weight", "grad", dy, dev, pr);
  // An f32 x sets the layout where dy is of one order (it reads as either).
  if (x.dtype() == DType::F32 && one_order(dy)) act = conv_act_layout("conv2d_backward_weight", "input", x, dev, pr);
  const cpu::ConvShape s = conv_shape(x.shape(), w_shape, p);
  Tensor dw = Tensor::empty(w_shape, DType::F32, dev);
  float* db_ptr = bias_grad(db, want_bias, s.K, dev);
  if (x.dtype() == DType::BF16) {
    const cpu::Layout layout = check_bf16_conv_input("conv2d_backward_weight", x, dev, pr);
    cpu::conv2d_backward_weight_bf16_input(f32(dw), db_ptr, f32(dy), static_cast<const uint16_t*>(x.raw_data()), s,
                                           cpu::ConvImpl::Auto, layout, act);
    return dw;
  }
  ACTLAB_CHECK(one_order(x) || conv_act_layout("conv2d_backward_weight", "input", x, dev, pr) == act,
               "conv2d_backward_weight: an f32 input ", x.str(), " must be laid out as the grad ", dy.str(), " is");
  ACTLAB_DISPATCH(dev, cuda::conv2d_backward_weight(f32(dw), db_ptr, f32(dy), f32(x), s, gpu.ctx(), pr),
                  cpu::conv2d_backward_weight(f32(dw), db_ptr, f32(dy), f32(x), s, cpu::ConvImpl::Auto, pr, act));
  return dw;
}

ConvBackwardScope::ConvBackwardScope(const Tensor& dy) : dy_(dy) {
  if (dy.device().is_cpu() && dy.dtype() == DType::F32 && (dy.is_contiguous() || dy.is_channels_last()))
    share_ = std::make_unique<cpu::ConvGradShare>(f32(dy_));
}

ConvBackwardScope::~ConvBackwardScope() = default;

bool conv2d_bf16_reads_channels_last(const Tensor& x, const Shape& w_shape, const ConvParams& p, bool with_bias,
                                     bool channels_last_out) {
  if (!x.device().is_cpu() || x.dim() != 4 || compute_precision() != Precision::BF16) return false;
  return cpu::conv2d_bf16_reads_channels_last(conv_shape(x.shape(), w_shape, p), with_bias, cpu::ConvImpl::Auto,
                                              channels_last_out ? cpu::Layout::ChannelsLast : cpu::Layout::Nchw);
}

int conv2d_backward_weight_input_block(const Tensor& dy, const Shape& x_shape, const Shape& w_shape,
                                       const ConvParams& p, bool want_bias) {
  // A bf16 convolution converts its input on the way in: no blocked f32 input to write.
  if (!dy.device().is_cpu() || x_shape.size() != 4 || compute_precision() != Precision::F32) return 0;
  return cpu::conv2d_backward_weight_input_block(conv_shape(x_shape, w_shape, p), want_bias);
}

Tensor conv2d_backward_weight_blocked_input(const Tensor& dy, const Tensor& x_blocked, const Shape& x_shape,
                                            const Shape& w_shape, const ConvParams& p, bool want_bias, Tensor* db) {
  const Device dev = op_device("conv2d_backward_weight_blocked_input", {&dy, &x_blocked});
  ACTLAB_CHECK(dev.is_cpu(), "conv2d_backward_weight_blocked_input: CPU only");
  require_f32_contig("conv2d_backward_weight_blocked_input", "grad", dy);
  require_f32_contig("conv2d_backward_weight_blocked_input", "input", x_blocked);
  const cpu::ConvShape s = conv_shape(x_shape, w_shape, p);
  ACTLAB_CHECK(s.C % 16 == 0 && x_blocked.shape() == Shape({s.N, s.C / 16, s.H, s.W, 16}),
               "conv2d_backward_weight_blocked_input: input ", shape_str(x_blocked.shape()), " is not ",
               shape_str(x_shape), " in 16-channel blocks");
  Tensor dw = Tensor::empty(w_shape, DType::F32, dev);
  float* db_ptr = bias_grad(db, want_bias, s.K, dev);
  cpu::conv2d_backward_weight_blocked_input(f32(dw), db_ptr, f32(dy), f32(x_blocked), s);
  return dw;
}

// ---------------------------------------------------------------- linear
namespace {
// y (N,M) += b (M) on the CPU.
void add_row_bias(float* y, const float* b, int64_t N, int64_t M) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) y[n * M + m] += b[m];
}
// The rows of a (..., F) tensor: the product of every dim but the last (token maps (B,T,D) are B·T rows).
int64_t leading_rows(const Tensor& t) { return t.dim() >= 1 && t.size(-1) > 0 ? t.numel() / t.size(-1) : 0; }
Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}
}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Device dev = op_device("linear", {&x, &w, &b});
  require_f32_contig("linear", "input", x);
  require_f32_contig("linear", "weight", w);
  ACTLAB_CHECK(x.dim() >= 2 && w.dim() == 2 && x.size(-1) == w.size(1), "linear: input ", x.str(),
               " vs weight ", w.str(), ": features ", x.dim() >= 2 ? x.size(-1) : -1, " != ", w.size(-1));
  const int64_t N = leading_rows(x), D = x.size(-1), M = w.size(0);
  // An empty feature axis has no product to compute (the GEMM's leading dimensions would be 0).
  ACTLAB_CHECK(D > 0 && M > 0, "linear: input ", x.str(), " and weight ", w.str(), " have ",
               D == 0 ? "no input features" : "no output features", "; both must be >= 1");
  if (b.defined()) {
    require_f32_contig("linear", "bias", b);
    ACTLAB_CHECK(b.numel() == M, "linear: bias ", b.str(), " for ", M, " outputs");
  }
  const Precision pr = gemm_precision(dev, "linear");
  const bool bf16 = pr == Precision::BF16;
  Tensor y = Tensor::empty(with_last(x.shape(), M), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::linear_forward(f32(y), f32(x), f32(w), opt_ptr(b), N, D, M, gpu.ctx(), pr), {
    if (bf16) cpu::gemm_batched_bf16(false, true, 1, N, M, D, f32(x), f32(w), f32(y));
    else cpu::gemm(false, true, N, M, D, 1.f, f32(x), D, f32(w), D, 0.f, f32(y), M);
    if (b.defined()) add_row_bias(f32(y), f32(b), N, M);
  });
  return y;
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  const Device dev = op_device("linear_backward_data", {&dy, &w});
  require_f32_contig("linear_backward_data", "grad", dy);
  require_f32_contig("linear_backward_data", "weight", w);
  ACTLAB_CHECK(dy.dim() >= 2 && w.dim() == 2 && w.size(0) == dy.size(-1), "linear backward: grad ", dy.str(),
               " vs weight ", w.str());
  const int64_t N = leading_rows(dy), M = dy.size(-1), D = w.size(1);
  const Precision pr = gemm_precision(dev, "linear");
  const bool bf16 = pr == Precision::BF16;
  Tensor dx = Tensor::empty(with_last(dy.shape(), D), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::linear_backward_data(f32(dx), f32(dy), f32(w), N, M, D, gpu.ctx(), pr), {
    if (bf16) cpu::gemm_batched_bf16(false, false, 1, N, D, M, f32(dy), f32(w), f32(dx));
    else cpu::gemm(false, false, N, D, M, 1.f, f32(dy), M, f32(w), D, 0.f, f32(dx), D);
  });
  return dx;
}

Tensor linear_backward_weight(const Tensor& dy, const Tensor& x, bool want_bias, Tensor* db) {
  const Device dev = op_device("linear_backward_weight", {&dy, &x});
  require_f32_contig("linear_backward_weight", "grad", dy);
  require_f32_contig("linear_backward_weight", "input", x);
  const int64_t N = leading_rows(dy), M = dy.size(-1), D = x.size(-1);
  ACTLAB_CHECK(dy.dim() == x.dim() && leading_rows(x) == N, "linear backward: grad ", dy.str(), " vs input ", x.str());
  Tensor dw = Tensor::empty({M, D}, DType::F32, dev);
  float* db_ptr = nullptr;
  if (want_bias) {
    *db = Tensor::empty({M}, DType::F32, dev);
    db_ptr = f32(*db);
  }
  const Precision pr = gemm_precision(dev, "linear");
  const bool bf16 = pr == Precision::BF16;
  ACTLAB_DISPATCH(dev, cuda::linear_backward_weight(f32(dw), db_ptr, f32(dy), f32(x), N, M, D, gpu.ctx(), pr), {
    if (bf16) cpu::gemm_batched_bf16(true, false, 1, M, D, N, f32(dy), f32(x), f32(dw));
    else cpu::gemm(true, false, M, D, N, 1.f, f32(dy), M, f32(x), D, 0.f, f32(dw), D);
    if (db_ptr) cpu::column_sums(db_ptr, f32(dy), N, M);
  });
  return dw;
}

// ---------------------------------------------------------------- batch norm
namespace {
void bn_dims(const Tensor& x, int64_t* N, int64_t* C, int64_t* HW) {
  ACTLAB_CHECK(x.dim() >= 2, "batch_norm: input must be (N,C,...), got ", x.str());
  *N = x.size(0);
  *C = x.size(1);
  *HW = x.numel() / std::max<int64_t>(1, *N * *C);
}
void check_channel_vec(const char* what, const Tensor& t, int64_t C) {
  ACTLAB_CHECK(t.defined() && t.numel() == C && t.dtype() == DType::F32 && t.is_contiguous(), "batch_norm: ",
               what, " must be (", C, ") f32, got ", t.str());
}
// An activation operand of batch norm or shortcut_pad: channels-last on the CPU only.
bool cpu_channels_last(const char* op, const char* what, const Tensor& t, Device dev) {
  return f32_channels_last(op, what, t, dev.is_cpu(), " (or channels-last on the CPU)");
}
}  // namespace

Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps, Tensor* save_mean,
                               Tensor* save_invstd) {
  const Device dev = op_device("batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  const bool channels_last = cpu_channels_last("batch_norm", "input", x, dev);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  ACTLAB_CHECK(N * HW > 1, "batch_norm: training needs more than one value per channel, got input ", x.str());
  check_channel_vec("weight", gamma, C);
  check_channel_vec("bias", beta, C);
  check_channel_vec("running_mean", running_mean, C);
  check_channel_vec("running_var", running_var, C);
  Tensor y = empty_in_layout(x.shape(), channels_last, dev);
  *save_mean = Tensor::empty({C}, DType::F32, dev);
  *save_invstd = Tensor::empty({C}, DType::F32, dev);
  if (channels_last) {
    cpu::batchnorm_forward_train_channels_last(f32(y), f32(*save_mean), f32(*save_invstd), f32(running_mean),
                                               f32(running_var), f32(x), f32(gamma), f32(beta), N * HW, C, momentum,
                                               eps);
  } else {
    ACTLAB_DISPATCH(dev,
                  cuda::batchnorm_forward_train(f32(y), f32(*save_mean), f32(*save_invstd), f32(running_mean),
                                                f32(running_var), f32(x), f32(gamma), f32(beta), N, C, HW, momentum,
                                                eps, gpu.device(), gpu.stream()),
                  cpu::batchnorm_forward_train(f32(y), f32(*save_mean), f32(*save_invstd), f32(running_mean),
                                               f32(running_var), f32(x), f32(gamma), f32(beta), N, C, HW, momentum,
                                               eps));
  }
  running_mean.storage()->bump_version();
  running_var.storage()->bump_version();
  return y;
}

Tensor batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps) {
  const Device dev = op_device("batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  require_f32_contig("batch_norm", "input", x);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  check_channel_vec("weight", gamma, C);
  check_channel_vec("bias", beta, C);
  check_channel_vec("running_mean", running_mean, C);
  check_channel_vec("running_var", running_var, C);
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev,
                  cuda::batchnorm_forward_eval(f32(y), f32(x), f32(gamma), f32(beta), f32(running_mean),
                                               f32(running_var), N, C, HW, eps, gpu.device(), gpu.stream()),
                  cpu::batchnorm_forward_eval(f32(y), f32(x), f32(gamma), f32(beta), f32(running_mean),
                                              f32(running_var), N, C, HW, eps));
  return y;
}

Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                          const Tensor& save_invstd, Tensor* dgamma, Tensor* dbeta) {
  const Device dev = op_device("batch_norm_backward", {&dy, &x, &gamma, &save_mean, &save_invstd});
  const bool channels_last = cpu_channels_last("batch_norm_backward", "grad", dy, dev);
  const bool x_bf16 = x.defined() && x.dtype() == DType::BF16;
  ACTLAB_CHECK(!x_bf16 || (channels_last && x.is_channels_last()), "batch_norm backward: a bf16 input (", x.str(),
               ") is read channels-last only, with a channels-last grad (", dy.str(), ")");
  ACTLAB_CHECK(x_bf16 || cpu_channels_last("batch_norm_backward", "input", x, dev) == channels_last,
               "batch_norm backward: grad ", dy.str(), " and input ", x.str(), " are laid out differently");
  ACTLAB_CHECK(dy.shape() == x.shape(), "batch_norm backward: grad ", dy.str(), " vs input ", x.str());
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  Tensor dx = empty_in_layout(x.shape(), channels_last, dev);
  *dgamma = Tensor::empty({C}, DType::F32, dev);
  *dbeta = Tensor::empty({C}, DType::F32, dev);
  if (x_bf16) {
    cpu::batchnorm_backward_channels_last(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy),
                                          static_cast<const uint16_t*>(x.raw_data()), f32(gamma), f32(save_mean),
                                          f32(save_invstd), N * HW, C);
    return dx;
  }
  if (channels_last) {
    cpu::batchnorm_backward_channels_last(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(x), f32(gamma),
                                          f32(save_mean), f32(save_invstd), N * HW, C);
    return dx;
  }
  ACTLAB_DISPATCH(dev,
                  cuda::batchnorm_backward(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(x), f32(gamma),
                                           f32(save_mean), f32(save_invstd), N, C, HW, gpu.device(), gpu.stream()),
                  cpu::batchnorm_backward(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(x), f32(gamma),
                                          f32(save_mean), f32(save_invstd), N, C, HW));
  return dx;
}

namespace {
// A device copy of host doubles (synchronized batch norm's centres and all-reduced sums).
Buffer doubles_on(Device dev, const std::vector<double>& values) {
  Buffer on_device(values.size() * sizeof(double), MemTag::Workspace, dev);
  copy_bytes(on_device.data(), dev, values.data(), Device::cpu(), values.size() * sizeof(double));
  return on_device;
}
// `count` doubles of device memory written by `write`, brought to the host (the CPU writes them in place).
template <typename Write>
std::vector<double> host_sums(Device dev, size_t count, Write write) {
  std::vector<double> sums(count);
  if (dev.is_cpu()) {
    write(sums.data());
    return sums;
  }
  Buffer on_device(count * sizeof(double), MemTag::Workspace, dev);
  write(on_device.as<double>());
  copy_bytes(sums.data(), Device::cpu(), on_device.data(), dev, count * sizeof(double));
  return sums;
}
}  // namespace

std::vector<double> channel_sums(const Tensor& x) {
  const Device dev = op_device("channel_sums", {&x});
  require_f32_contig("channel_sums", "input", x);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  return host_sums(dev, static_cast<size_t>(C), [&](double* sums) {
    ACTLAB_DISPATCH(dev, cuda::channel_sums(sums, f32(x), N, C, HW, gpu.device(), gpu.stream()),
                    cpu::channel_sums(sums, f32(x), N, C, HW));
  });
}

std::vector<double> channel_square_deviations(const Tensor& x, const std::vector<double>& center) {
  const Device dev = op_device("channel_square_deviations", {&x});
  require_f32_contig("channel_square_deviations", "input", x);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  ACTLAB_CHECK(static_cast<int64_t>(center.size()) == C, "channel_square_deviations: ", center.size(),
               " centres for ", C, " channels");
  return host_sums(dev, static_cast<size_t>(C), [&](double* sums) {
    if (dev.is_cpu()) {
      cpu::channel_square_deviations(sums, f32(x), center.data(), N, C, HW);
      return;
    }
    const Buffer centre = doubles_on(dev, center);
    ACTLAB_CUDA_ONLY(cuda::DeviceScope gpu(dev.index);
                     cuda::channel_square_deviations(sums, f32(x), centre.as<double>(), N, C, HW, gpu.device(),
                                                     gpu.stream()));
  });
}

std::vector<double> batchnorm_grad_sums(const Tensor& dy, const Tensor& x, const Tensor& save_mean) {
  const Device dev = op_device("batch_norm_grad_sums", {&dy, &x, &save_mean});
  require_f32_contig("batch_norm_grad_sums", "grad", dy);
  require_f32_contig("batch_norm_grad_sums", "input", x);
  ACTLAB_CHECK(dy.shape() == x.shape(), "batch_norm backward: grad ", dy.str(), " vs input ", x.str());
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  return host_sums(dev, static_cast<size_t>(2 * C), [&](double* sums) {
    ACTLAB_DISPATCH(dev,
                    cuda::batchnorm_grad_sums(sums, f32(dy), f32(x), f32(save_mean), N, C, HW, gpu.device(),
                                              gpu.stream()),
                    cpu::batchnorm_grad_sums(sums, sums + C, f32(dy), f32(x), f32(save_mean), N, C, HW));
  });
}

Tensor batchnorm_backward_from_sums(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                    const Tensor& save_invstd, const std::vector<double>& sums, double count) {
  const Device dev = op_device("batch_norm_backward", {&dy, &x, &gamma, &save_mean, &save_invstd});
  require_f32_contig("batch_norm_backward", "grad", dy);
  require_f32_contig("batch_norm_backward", "input", x);
  ACTLAB_CHECK(dy.shape() == x.shape(), "batch_norm backward: grad ", dy.str(), " vs input ", x.str());
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  ACTLAB_CHECK(static_cast<int64_t>(sums.size()) == 2 * C && count > 0, "batch_norm_backward_from_sums: ", sums.size(),
               " sums and count ", count, " for ", C, " channels");
  Tensor dx = Tensor::empty(x.shape(), DType::F32, dev);
  if (dev.is_cpu()) {
    cpu::batchnorm_backward_from_sums(f32(dx), f32(dy), f32(x), f32(gamma), f32(save_mean), f32(save_invstd),
                                      sums.data(), sums.data() + C, count, N, C, HW);
    return dx;
  }
  const Buffer on_device = doubles_on(dev, sums);
  ACTLAB_CUDA_ONLY(cuda::DeviceScope gpu(dev.index);
                   cuda::batchnorm_backward_from_sums(f32(dx), f32(dy), f32(x), f32(gamma), f32(save_mean),
                                                      f32(save_invstd), on_device.as<double>(), count, N, C, HW,
                                                      gpu.device(), gpu.stream()));
  return dx;
}

namespace {
// The checks of the by-channel batch-norm backwards (gamma and save_invstd may be nullptr); returns the
// device (the CPU).
Device check_bn_channels(const Tensor& dy, const Shape& x_shape, const Tensor& save_mean, const Tensor* gamma,
                         const Tensor* save_invstd) {
  const Device dev = op_device("batch_norm_backward", {&dy, &save_mean, gamma, save_invstd});
  require_f32_contig("batch_norm_backward", "grad", dy);
  ACTLAB_CHECK(dev.is_cpu() && dy.dim() == 4, "batch_norm backward by channels: needs a 4-D CPU grad, got ",
               dy.str(), " on ", dev.str());
  ACTLAB_CHECK(dy.shape() == x_shape, "batch_norm backward: grad ", dy.str(), " vs input ", shape_str(x_shape));
  return dev;
}
}  // namespace

std::vector<double> batchnorm_grad_sums_channels(const Tensor& dy, const Shape& x_shape,
                                                 const std::function<void(int64_t c, float* out)>& x_channel,
                                                 const Tensor& save_mean) {
  check_bn_channels(dy, x_shape, save_mean, nullptr, nullptr);
  int64_t N, C, HW;
  bn_dims(dy, &N, &C, &HW);
  std::vector<double> sums(static_cast<size_t>(2 * C));
  cpu::batchnorm_grad_sums_channels(sums.data(), sums.data() + C, f32(dy), x_channel, f32(save_mean), N, C, HW);
  return sums;
}

Tensor batchnorm_backward_from_sums_channels(const Tensor& dy, const Shape& x_shape,
                                             const std::function<void(int64_t c, float* out)>& x_channel,
                                             const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                                             const std::vector<double>& sums, double count) {
  const Device dev = check_bn_channels(dy, x_shape, save_mean, &gamma, &save_invstd);
  int64_t N, C, HW;
  bn_dims(dy, &N, &C, &HW);
  ACTLAB_CHECK(static_cast<int64_t>(sums.size()) == 2 * C && count > 0, "batch_norm_backward_from_sums: ", sums.size(),
               " sums and count ", count, " for ", C, " channels");
  Tensor dx = Tensor::empty(dy.shape(), DType::F32, dev);
  cpu::batchnorm_backward_from_sums_channels(f32(dx), f32(dy), x_channel, f32(gamma), f32(save_mean), f32(save_invstd),
                                             sums.data(), sums.data() + C, count, N, C, HW);
  return dx;
}

Tensor batchnorm_backward_channels(const Tensor& dy, const Shape& x_shape,
                                   const std::function<void(int64_t c, float* out)>& x_channel, const Tensor& gamma,
                                   const Tensor& save_mean, const Tensor& save_invstd, Tensor* dgamma, Tensor* dbeta) {
  const Device dev = check_bn_channels(dy, x_shape, save_mean, &gamma, &save_invstd);
  int64_t N, C, HW;
  bn_dims(dy, &N, &C, &HW);
  Tensor dx = Tensor::empty(dy.shape(), DType::F32, dev);
  *dgamma = Tensor::empty({C}, DType::F32, dev);
  *dbeta = Tensor::empty({C}, DType::F32, dev);
  cpu::batchnorm_backward_channels(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), x_channel, f32(gamma),
                                   f32(save_mean), f32(save_invstd), N, C, HW);
  return dx;
}

Tensor batchnorm_backward_eval(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               Tensor* dgamma, Tensor* dbeta) {
  const Device dev = op_device("batch_norm_backward", {&dy, &x, &gamma, &running_mean, &running_var});
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  Tensor dx = Tensor::empty(x.shape(), DType::F32, dev);
  *dgamma = Tensor::empty({C}, DType::F32, dev);
  *dbeta = Tensor::empty({C}, DType::F32, dev);
  ACTLAB_DISPATCH(dev,
                  cuda::batchnorm_backward_eval(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(x), f32(gamma),
                                                f32(running_mean), f32(running_var), N, C, HW, eps, gpu.device(),
                                                gpu.stream()),
                  cpu::batchnorm_backward_eval(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(x), f32(gamma),
                                               f32(running_mean), f32(running_var), N, C, HW, eps));
  return dx;
}

// ---------------------------------------------------------------- element-wise
namespace {
enum class MaskOp { Relu, Relu6, AddRelu, Dropout };

// y and a 1-bit mask from one input (ReLU, ReLU6) or two (add+ReLU).
Tensor masked_forward(const char* op, MaskOp kind, const Tensor& a, const Tensor* b, Tensor* mask) {
  const Device dev = op_device(op, {&a, b});
  const bool channels_last =
      b ? require_same_dense(op, a, *b, "a", "b") : require_f32_dense(op, "input", a);
  const int64_t n = a.numel();
  Tensor y = empty_in_layout(a.shape(), channels_last, dev);  // the mask's bits follow memory order too
  *mask = new_mask(n, dev);
  float* yp = f32(y);
  uint32_t* m = mask_ptr(*mask);
  const float* ap = f32(a);
  const float* bp = b ? f32(*b) : nullptr;
  if (kind == MaskOp::Relu) {
    ACTLAB_DISPATCH(dev, cuda::relu_forward(yp, m, ap, n, gpu.stream()), cpu::relu_forward(yp, m, ap, n));
  } else if (kind == MaskOp::Relu6) {
    ACTLAB_DISPATCH(dev, cuda::relu6_forward(yp, m, ap, n, gpu.stream()), cpu::relu6_forward(yp, m, ap, n));
  } else {
    ACTLAB_DISPATCH(dev, cuda::add_relu_forward(yp, m, ap, bp, n, gpu.stream()),
                    cpu::add_relu_forward(yp, m, ap, bp, n));
  }
  return y;
}

// dx = mask bit ? dy·scale : 0: ReLU and ReLU6 (scale 1) and dropout (scale 1/(1-p)) backward.
Tensor masked_backward(const char* op, MaskOp kind, const Tensor& dy, const Tensor& mask, float p) {
  const Device dev = op_device(op, {&dy, &mask});
  // The mask's bits are in the forward's memory order: the caller hands dy in the forward input's layout.
  const bool channels_last = require_f32_dense(op, "grad", dy);
  ACTLAB_CHECK(mask.dtype() == DType::I32 && mask.numel() == cpu::mask_words(dy.numel()), op, ": mask ", mask.str(),
               " for a grad of ", dy.numel(), " elements");
  Tensor dx = empty_in_layout(dy.shape(), channels_last, dev);
  float* dxp = f32(dx);
  const float* dyp = f32(dy);
  const uint32_t* m = mask_ptr(mask);
  const int64_t n = dy.numel();
  [[maybe_unused]] const float scale = kind != MaskOp::Dropout ? 1.f : p < 1.f ? 1.f / (1.f - p) : 0.f;
  if (kind == MaskOp::Relu) {
    ACTLAB_DISPATCH(dev, cuda::masked_scale(dxp, m, dyp, n, scale, gpu.stream()), cpu::relu_backward(dxp, m, dyp, n));
  } else if (kind == MaskOp::Relu6) {
    ACTLAB_DISPATCH(dev, cuda::masked_scale(dxp, m, dyp, n, scale, gpu.stream()), cpu::relu6_backward(dxp, m, dyp, n));
  } else {
    ACTLAB_DISPATCH(dev, cuda::masked_scale(dxp, m, dyp, n, scale, gpu.stream()),
                    cpu::dropout_backward(dxp, m, dyp, n, p));
  }
  return dx;
}
}  // namespace

// ---------------------------------------------------------------- transformer ops
Tensor gelu_forward(const Tensor& x, bool tanh_approx) {
  const Device dev = op_device("gelu", {&x});
  require_f32_contig("gelu", "input", x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::gelu_forward(f32(y), f32(x), x.numel(), tanh_approx, gpu.stream()),
                  cpu::gelu_forward(f32(y), f32(x), x.numel(), tanh_approx));
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x, bool tanh_approx) {
  const Device dev = op_device("gelu_backward", {&dy, &x});
  require_f32_contig("gelu_backward", "grad", dy);
  require_f32_contig("gelu_backward", "input", x);
  ACTLAB_CHECK(dy.shape() == x.shape(), "gelu_backward: grad ", dy.str(), " for an input ", x.str());
  Tensor dx = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::gelu_backward(f32(dx), f32(dy), f32(x), x.numel(), tanh_approx, gpu.stream()),
                  cpu::gelu_backward(f32(dx), f32(dy), f32(x), x.numel(), tanh_approx));
  return dx;
}

Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor* mean,
                         Tensor* rstd, Tensor* xhat) {
  const Device dev = op_device("layer_norm", {&x, &gamma, &beta});
  require_f32_contig("layer_norm", "input", x);
  ACTLAB_CHECK(x.dim() >= 1 && x.numel() > 0, "layer_norm: input ", x.str());
  const int64_t d = x.size(x.dim() - 1), rows = x.numel() / d;
  ACTLAB_CHECK(gamma.numel() == d && beta.numel() == d, "layer_norm: gamma ", gamma.str(), " and beta ", beta.str(),
               " for rows of ", d);
  ACTLAB_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  *mean = Tensor::empty({rows}, DType::F32, dev);
  *rstd = Tensor::empty({rows}, DType::F32, dev);
  float* xhat_ptr = nullptr;
  if (xhat) {
    *xhat = Tensor::empty(x.shape(), DType::F32, dev);
    xhat_ptr = f32(*xhat);
  }
  ACTLAB_DISPATCH(dev,
                  cuda::layernorm_forward(f32(y), xhat_ptr, f32(*mean), f32(*rstd), f32(x), f32(gamma), f32(beta), rows,
                                          d, eps, gpu.stream()),
                  cpu::layernorm_forward(f32(y), xhat_ptr, f32(*mean), f32(*rstd), f32(x), f32(gamma), f32(beta), rows,
                                         d, eps));
  return y;
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& xhat, const Tensor& gamma, const Tensor& rstd,
                          Tensor* dgamma, Tensor* dbeta) {
  const Device dev = op_device("layer_norm_backward", {&dy, &xhat, &gamma, &rstd});
  require_f32_contig("layer_norm_backward", "grad", dy);
  require_f32_contig("layer_norm_backward", "normalized input", xhat);
  ACTLAB_CHECK(dy.shape() == xhat.shape(), "layer_norm_backward: grad ", dy.str(), " for an input ", xhat.str());
  // As the forward: an empty input would leave the CUDA kernel's dgamma/dbeta unwritten (it returns early)
  // where the CPU loop writes zeros, and a last dimension of 0 would divide by zero here.
  ACTLAB_CHECK(xhat.dim() >= 1 && xhat.numel() > 0, "layer_norm_backward: input ", xhat.str());
  const int64_t d = xhat.size(xhat.dim() - 1), rows = xhat.numel() / d;
  ACTLAB_CHECK(rstd.numel() == rows && gamma.numel() == d, "layer_norm_backward: statistics for ", rstd.numel(),
               " rows, the input has ", rows);
  Tensor dx = Tensor::empty(xhat.shape(), DType::F32, dev);
  *dgamma = Tensor::empty({d}, DType::F32, dev);
  *dbeta = Tensor::empty({d}, DType::F32, dev);
  ACTLAB_DISPATCH(dev,
                  cuda::layernorm_backward(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(xhat), f32(gamma),
                                           f32(rstd), rows, d, gpu.stream()),
                  cpu::layernorm_backward(f32(dx), f32(*dgamma), f32(*dbeta), f32(dy), f32(xhat), f32(gamma),
                                          f32(rstd), rows, d));
  return dx;
}

Tensor softmax_forward(const Tensor& x, float scale) {
  const Device dev = op_device("softmax", {&x});
  require_f32_contig("softmax", "input", x);
  ACTLAB_CHECK(x.dim() >= 1 && x.numel() > 0, "softmax: input ", x.str());
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::softmax_forward(f32(y), f32(x), rows, d, scale, gpu.stream()),
                  cpu::softmax_forward(f32(y), f32(x), rows, d, scale));
  return y;
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y, float scale) {
  const Device dev = op_device("softmax_backward", {&dy, &y});
  require_f32_contig("softmax_backward", "grad", dy);
  require_f32_contig("softmax_backward", "output", y);
  ACTLAB_CHECK(dy.shape() == y.shape(), "softmax_backward: grad ", dy.str(), " for an output ", y.str());
  const int64_t d = y.size(-1), rows = y.numel() / d;
  Tensor dx = Tensor::empty(y.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::softmax_backward(f32(dx), f32(dy), f32(y), rows, d, scale, gpu.stream()),
                  cpu::softmax_backward(f32(dx), f32(dy), f32(y), rows, d, scale));
  return dx;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Device dev = op_device("matmul", {&a, &b});
  require_f32_contig("matmul", "first operand", a);
  require_f32_contig("matmul", "second operand", b);
  ACTLAB_CHECK(a.dim() >= 2 && a.dim() == b.dim(), "matmul: operands ", a.str(), " and ", b.str(),
               " must have the same rank >= 2");
  int64_t batch = 1;
  for (int64_t k = 0; k + 2 < a.dim(); ++k) {
    ACTLAB_CHECK(a.size(k) == b.size(k), "matmul: batch dims of ", a.str(), " and ", b.str(), " differ");
    batch *= a.size(k);
  }
  const int64_t M = trans_a ? a.size(-1) : a.size(-2), K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t Kb = trans_b ? b.size(-1) : b.size(-2), N = trans_b ? b.size(-2) : b.size(-1);
  ACTLAB_CHECK(K == Kb, "matmul: inner sizes of ", a.str(), trans_a ? "ᵀ" : "", " and ", b.str(), trans_b ? "ᵀ" : "",
               " differ (", K, " vs ", Kb, ")");
  Shape out_shape = a.shape();
  out_shape[out_shape.size() - 2] = M;
  out_shape.back() = N;
  const Precision pr = gemm_precision(dev, "matmul");
  const bool bf16 = pr == Precision::BF16;
  Tensor c = Tensor::empty(out_shape, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::batched_matmul(f32(c), f32(a), f32(b), batch, M, N, K, trans_a, trans_b, gpu.ctx(), pr), {
    if (bf16) cpu::gemm_batched_bf16(trans_a, trans_b, batch, M, N, K, f32(a), f32(b), f32(c));
    else cpu::gemm_batched(trans_a, trans_b, batch, M, N, K, f32(a), f32(b), f32(c));
  });
  return c;
}

namespace {
// x (f32, contiguous or channels-last) rounded to a 16-bit type (BF16 or F16), and such a tensor widened back to
// f32, each in its input's layout.
Tensor narrow(const Tensor& x, DType type, const char* op) {
  const Device dev = op_device(op, {&x});
  Tensor h = empty_in_layout(x.shape(), require_f32_dense(op, "input", x), dev, type);
  auto* hp = static_cast<uint16_t*>(h.raw_data());
  const int64_t n = x.numel();
  ACTLAB_DISPATCH(dev, cuda::narrow_16(hp, f32(x), n, type, gpu.stream()),
                  type == DType::BF16 ? cpu::to_bf16(hp, f32(x), n) : cpu::to_f16(hp, f32(x), n));
  return h;
}
Tensor widen(const Tensor& h, DType type, const char* op) {
  const Device dev = op_device(op, {&h});
  ACTLAB_CHECK(h.dtype() == type && (h.is_contiguous() || h.is_channels_last()), op,
               ": needs a contiguous or channels-last ", dtype_name(type), " tensor, got ", h.str());
  Tensor x = empty_in_layout(h.shape(), !h.is_contiguous(), dev);
  const auto* hp = static_cast<const uint16_t*>(h.raw_data());
  const int64_t n = h.numel();
  ACTLAB_DISPATCH(dev, cuda::widen_16(f32(x), hp, n, type, gpu.stream()),
                  type == DType::BF16 ? cpu::from_bf16(f32(x), hp, n) : cpu::from_f16(f32(x), hp, n));
  return x;
}
}  // namespace

Tensor to_bf16(const Tensor& x) { return narrow(x, DType::BF16, "to_bf16"); }
Tensor to_bf16_channels(const Shape& shape, const std::function<void(int64_t c, float* out)>& x_channel) {
  ACTLAB_CHECK(shape.size() == 4 && shape_numel(shape) > 0, "to_bf16_channels: a non-empty 4-D (N, C, H, W) shape, got ",
               shape_str(shape));
  Tensor h = Tensor::empty(shape, DType::BF16, Device::cpu());
  cpu::to_bf16_channels(static_cast<uint16_t*>(h.raw_data()), x_channel, shape[0], shape[1], shape[2] * shape[3]);
  return h;
}
Tensor to_bf16_channels_last(const Tensor& x) {
  const Device dev = op_device("to_bf16_channels_last", {&x});
  require_f32_contig("to_bf16_channels_last", "input", x);
  ACTLAB_CHECK(dev.is_cpu() && x.dim() == 4, "to_bf16_channels_last: a 4-D (N, C, H, W) tensor on the CPU, got ",
               x.str(), " on ", dev.str());
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  Tensor h = Tensor::empty_channels_last(x.shape(), DType::BF16, dev);
  cpu::to_bf16_channels_last(static_cast<uint16_t*>(h.raw_data()), f32(x), N, C, H * W);
  return h;
}
Tensor from_bf16(const Tensor& h) { return widen(h, DType::BF16, "from_bf16"); }
Tensor to_f16(const Tensor& x) { return narrow(x, DType::F16, "to_f16"); }
Tensor from_f16(const Tensor& h) { return widen(h, DType::F16, "from_f16"); }

Tensor scale_rows(const Tensor& x, const Tensor& s) {
  const Device dev = op_device("scale_rows", {&x, &s});
  require_f32_contig("scale_rows", "input", x);
  require_f32_contig("scale_rows", "scales", s);
  ACTLAB_CHECK(x.dim() >= 1 && s.numel() == x.size(0), "scale_rows: ", s.str(), " scales for ", x.str());
  const int64_t rows = x.size(0), d = rows > 0 ? x.numel() / rows : 0;
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::scale_rows(f32(y), f32(x), f32(s), rows, d, gpu.stream()),
                  cpu::scale_rows(f32(y), f32(x), f32(s), rows, d));
  return y;
}

Tensor add_to_rows(const Tensor& x, const Tensor& p) {
  const Device dev = op_device("add_to_rows", {&x, &p});
  require_f32_contig("add_to_rows", "input", x);
  require_f32_contig("add_to_rows", "row", p);
  ACTLAB_CHECK(x.dim() >= 1 && x.size(0) > 0 && p.numel() * x.size(0) == x.numel(), "add_to_rows: ", p.str(),
               " does not broadcast over the rows of ", x.str());
  const int64_t rows = x.size(0), d = p.numel();
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::add_to_rows(f32(y), f32(x), f32(p), rows, d, gpu.stream()),
                  cpu::add_to_rows(f32(y), f32(x), f32(p), rows, d));
  return y;
}

Tensor sum_rows(const Tensor& x, const Shape& row_shape) {
  const Device dev = op_device("sum_rows", {&x});
  require_f32_contig("sum_rows", "input", x);
  const int64_t d = shape_numel(row_shape);
  ACTLAB_CHECK(d > 0 && x.numel() % d == 0, "sum_rows: ", x.str(), " is not rows of ", shape_str(row_shape));
  const int64_t rows = x.numel() / d;
  Tensor out = Tensor::empty(row_shape, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::column_sums(f32(out), f32(x), rows, d, gpu.stream()),
                  cpu::column_sums(f32(out), f32(x), rows, d));
  return out;
}

namespace {
void check_index(const char* op, const Tensor& index, int64_t rows) {
  ACTLAB_CHECK(index.defined() && index.dtype() == DType::I64 && index.dim() == 1 && index.is_contiguous(), op,
               ": index must be (n) i64, got ", index.defined() ? index.str() : "none");
  if (!index.device().is_cpu()) return;
  const int64_t* p = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i)
    ACTLAB_CHECK(p[i] >= 0 && p[i] < rows, op, ": index ", p[i], " at ", i, " is outside [0, ", rows, ")");
}
}  // namespace

Tensor gather_rows(const Tensor& table, const Tensor& index) {
  const Device dev = op_device("gather_rows", {&table, &index});
  require_f32_contig("gather_rows", "table", table);
  ACTLAB_CHECK(table.dim() == 2, "gather_rows: table must be (rows, d), got ", table.str());
  check_index("gather_rows", index, table.size(0));
  const int64_t n = index.numel(), d = table.size(1);
  Tensor out = Tensor::empty({n, d}, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::gather_rows(f32(out), f32(table), index.data<int64_t>(), n, d, gpu.stream()),
                  cpu::gather_rows(f32(out), f32(table), index.data<int64_t>(), n, d));
  return out;
}

Tensor scatter_add_rows(const Tensor& dy, const Tensor& index, int64_t rows) {
  const Device dev = op_device("scatter_add_rows", {&dy, &index});
  require_f32_contig("scatter_add_rows", "grad", dy);
  check_index("scatter_add_rows", index, rows);
  ACTLAB_CHECK(dy.dim() == 2 && dy.size(0) == index.numel(), "scatter_add_rows: grad ", dy.str(), " for ",
               index.numel(), " indices");
  const int64_t n = index.numel(), d = dy.size(1);
  Tensor grad = Tensor::empty({rows, d}, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::scatter_add_rows(f32(grad), f32(dy), index.data<int64_t>(), n, rows, d, gpu.stream()),
                  cpu::scatter_add_rows(f32(grad), f32(dy), index.data<int64_t>(), n, rows, d));
  return grad;
}

Tensor relu_forward(const Tensor& x, Tensor* mask) { return masked_forward("relu", MaskOp::Relu, x, nullptr, mask); }
Tensor relu_backward(const Tensor& dy, const Tensor& mask) {
  return masked_backward("relu_backward", MaskOp::Relu, dy, mask, 0.f);
}
Tensor relu6_forward(const Tensor& x, Tensor* mask) { return masked_forward("relu6", MaskOp::Relu6, x, nullptr, mask); }
Tensor relu6_backward(const Tensor& dy, const Tensor& mask) {
  return masked_backward("relu6_backward", MaskOp::Relu6, dy, mask, 0.f);
}
Tensor add_relu_forward(const Tensor& a, const Tensor& b, Tensor* mask) {
  return masked_forward("add_relu", MaskOp::AddRelu, a, &b, mask);
}

Tensor add(const Tensor& a, const Tensor& b) {
  const Device dev = op_device("add", {&a, &b});
  Tensor y = empty_in_layout(a.shape(), require_same_dense("add", a, b, "a", "b"), dev);
  ACTLAB_DISPATCH(dev, cuda::add(f32(y), f32(a), f32(b), a.numel(), gpu.stream()),
                  cpu::add(f32(y), f32(a), f32(b), a.numel()));
  return y;
}

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t stream, Tensor* keep_mask) {
  const Device dev = op_device("dropout", {&x});
  require_f32_contig("dropout", "input", x);
  Tensor y = Tensor::empty(x.shape(), DType::F32, dev);
  *keep_mask = new_mask(x.numel(), dev);
  ACTLAB_DISPATCH(dev,
                  cuda::dropout_forward(f32(y), mask_ptr(*keep_mask), f32(x), x.numel(), p, seed, stream, gpu.stream()),
                  cpu::dropout_forward(f32(y), mask_ptr(*keep_mask), f32(x), x.numel(), p, seed, stream));
  return y;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& keep_mask, float p) {
  ACTLAB_CHECK(p >= 0.f && p <= 1.f, "dropout: p must be in [0, 1], got ", p);
  return masked_backward("dropout_backward", MaskOp::Dropout, dy, keep_mask, p);
}

// ---------------------------------------------------------------- pooling
Tensor maxpool2d_forward(const Tensor& x, const PoolParams& p, Tensor* argmax) {
  const Device dev = op_device("max_pool2d", {&x});
  require_f32_contig("max_pool2d", "input", x);
  const cpu::Pool2dShape s = pool_shape(x.shape(), p);
  Tensor y = Tensor::empty({s.N, s.C, s.P(), s.Q()}, DType::F32, dev);
  *argmax = Tensor::empty({s.N, s.C, s.P(), s.Q()}, DType::U8, dev);
  ACTLAB_DISPATCH(dev, cuda::maxpool2d_forward(f32(y), argmax->data<uint8_t>(), f32(x), s, gpu.stream()),
                  cpu::maxpool2d_forward(f32(y), argmax->data<uint8_t>(), f32(x), s));
  return y;
}

Tensor maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const PoolParams& p) {
  const Device dev = op_device("max_pool2d_backward", {&dy, &argmax});
  require_f32_contig("max_pool2d_backward", "grad", dy);
  const cpu::Pool2dShape s = pool_shape(x_shape, p);
  Tensor dx = Tensor::empty(x_shape, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::maxpool2d_backward(f32(dx), f32(dy), argmax.data<uint8_t>(), s, gpu.stream()),
                  cpu::maxpool2d_backward(f32(dx), f32(dy), argmax.data<uint8_t>(), s));
  return dx;
}

Tensor avgpool2d_forward(const Tensor& x, const PoolParams& p) {
  const Device dev = op_device("avg_pool2d", {&x});
  require_f32_contig("avg_pool2d", "input", x);
  const cpu::Pool2dShape s = pool_shape(x.shape(), p);
  Tensor y = Tensor::empty({s.N, s.C, s.P(), s.Q()}, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::avgpool2d_forward(f32(y), f32(x), s, gpu.stream()),
                  cpu::avgpool2d_forward(f32(y), f32(x), s));
  return y;
}

Tensor avgpool2d_backward(const Tensor& dy, const Shape& x_shape, const PoolParams& p) {
  const Device dev = op_device("avg_pool2d_backward", {&dy});
  require_f32_contig("avg_pool2d_backward", "grad", dy);
  const cpu::Pool2dShape s = pool_shape(x_shape, p);
  Tensor dx = Tensor::empty(x_shape, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::avgpool2d_backward(f32(dx), f32(dy), s, gpu.stream()),
                  cpu::avgpool2d_backward(f32(dx), f32(dy), s));
  return dx;
}

Tensor global_avgpool_forward(const Tensor& x) {
  const Device dev = op_device("global_avg_pool", {&x});
  require_f32_contig("global_avg_pool", "input", x);
  ACTLAB_CHECK(x.dim() == 4, "global_avg_pool: input must be (N,C,H,W), got ", x.str());
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  Tensor y = Tensor::empty({N, C}, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::global_avgpool_forward(f32(y), f32(x), N, C, HW, gpu.stream()),
                  cpu::global_avgpool_forward(f32(y), f32(x), N, C, HW));
  return y;
}

Tensor global_avgpool_backward(const Tensor& dy, const Shape& x_shape) {
  const Device dev = op_device("global_avg_pool_backward", {&dy});
  require_f32_contig("global_avg_pool_backward", "grad", dy);
  const int64_t N = x_shape[0], C = x_shape[1], HW = x_shape[2] * x_shape[3];
  Tensor dx = Tensor::empty(x_shape, DType::F32, dev);
  ACTLAB_DISPATCH(dev, cuda::global_avgpool_backward(f32(dx), f32(dy), N, C, HW, gpu.stream()),
                  cpu::global_avgpool_backward(f32(dx), f32(dy), N, C, HW));
  return dx;
}

Tensor shortcut_pad_forward(const Tensor& x, int64_t stride, int64_t c_out) {
  const Device dev = op_device("shortcut_pad", {&x});
  const bool channels_last = cpu_channels_last("shortcut_pad", "input", x, dev);
  ACTLAB_CHECK(x.dim() == 4 && stride >= 1 && c_out >= x.size(1), "shortcut_pad: input ", x.str(), " stride ",
               stride, " to ", c_out, " channels");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  Tensor y = empty_in_layout({N, c_out, (H + stride - 1) / stride, (W + stride - 1) / stride}, channels_last, dev);
  if (channels_last) {
    cpu::shortcut_pad_forward_channels_last(f32(y), f32(x), N, C, H, W, stride, c_out);
    return y;
  }
  ACTLAB_DISPATCH(dev, cuda::shortcut_pad_forward(f32(y), f32(x), N, C, H, W, stride, c_out, gpu.stream()),
                  cpu::shortcut_pad_forward(f32(y), f32(x), N, C, H, W, stride, c_out));
  return y;
}

Tensor shortcut_pad_backward(const Tensor& dy, const Shape& x_shape, int64_t stride) {
  const Device dev = op_device("shortcut_pad_backward", {&dy});
  const bool channels_last = cpu_channels_last("shortcut_pad_backward", "grad", dy, dev);
  const int64_t N = x_shape[0], C = x_shape[1], H = x_shape[2], W = x_shape[3];
  Tensor dx = empty_in_layout(x_shape, channels_last, dev);
  if (channels_last) {
    cpu::shortcut_pad_backward_channels_last(f32(dx), f32(dy), N, C, H, W, stride, dy.size(1));
    return dx;
  }
  ACTLAB_DISPATCH(dev, cuda::shortcut_pad_backward(f32(dx), f32(dy), N, C, H, W, stride, dy.size(1), gpu.stream()),
                  cpu::shortcut_pad_backward(f32(dx), f32(dy), N, C, H, W, stride, dy.size(1)));
  return dx;
}

// ---------------------------------------------------------------- loss
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float smoothing, Tensor* probs) {
  const Device dev = op_device("cross_entropy", {&logits, &labels});
  require_f32_contig("cross_entropy", "logits", logits);
  ACTLAB_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N,K), got ", logits.str());
  ACTLAB_CHECK(labels.dtype() == DType::I64 && labels.dim() == 1 && labels.size(0) == logits.size(0),
               "cross_entropy: labels must be (", logits.size(0), ") i64, got ", labels.str());
  ACTLAB_CHECK(smoothing >= 0.f && smoothing <= 1.f, "cross_entropy: label smoothing must be in [0,1], got ",
               smoothing);
  const Tensor lab = labels.contiguous();
  Tensor loss = Tensor::empty({1}, DType::F32, dev);
  *probs = Tensor::empty(logits.shape(), DType::F32, dev);
  const int64_t N = logits.size(0), K = logits.size(1);
  ACTLAB_DISPATCH(dev,
                  cuda::softmax_cross_entropy_forward(f32(loss), f32(*probs), f32(logits), lab.data<int64_t>(), N, K,
                                                      smoothing, gpu.device(), gpu.stream()),
                  cpu::softmax_cross_entropy_forward(f32(loss), f32(*probs), f32(logits), lab.data<int64_t>(), N, K,
                                                     smoothing));
  return loss;
}

Tensor cross_entropy_backward(const Tensor& probs, const Tensor& labels, float smoothing, float dloss) {
  const Device dev = op_device("cross_entropy_backward", {&probs, &labels});
  require_f32_contig("cross_entropy_backward", "probs", probs);
  const Tensor lab = labels.contiguous();
  const int64_t N = probs.size(0), K = probs.size(1);
  Tensor dlogits = Tensor::empty(probs.shape(), DType::F32, dev);
  ACTLAB_DISPATCH(dev,
                  cuda::softmax_cross_entropy_backward(f32(dlogits), f32(probs), lab.data<int64_t>(), N, K, smoothing,
                                                       dloss, gpu.stream()),
                  cpu::softmax_cross_entropy_backward(f32(dlogits), f32(probs), lab.data<int64_t>(), N, K, smoothing,
                                                      dloss));
  return dlogits;
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const Device dev = op_device("count_correct", {&logits, &labels});
  const Tensor l = logits.contiguous();
  const Tensor lab = labels.contiguous();
  ACTLAB_CHECK(l.dim() == 2 && lab.dim() == 1 && lab.size(0) == l.size(0) && lab.dtype() == DType::I64,
               "count_correct: logits ", l.str(), " labels ", lab.str());
  int64_t correct = 0;
  ACTLAB_DISPATCH(dev,
                  correct = cuda::top1_correct(f32(l), lab.data<int64_t>(), l.size(0), l.size(1), gpu.device(),
                                               gpu.stream()),
                  correct = cpu::top1_correct(f32(l), lab.data<int64_t>(), l.size(0), l.size(1)));
  return correct;
}

// ---------------------------------------------------------------- optimizer
void sgd_update_(Tensor& w, Tensor& momentum_buf, const Tensor& grad, float lr, float momentum, float dampening,
                 float weight_decay, bool nesterov, bool first_step) {
  const Device dev = op_device("sgd_update", {&w, &momentum_buf, &grad});
  require_f32_contig("sgd_update", "parameter", w);
  require_f32_contig("sgd_update", "gradient", grad);
  ACTLAB_CHECK(w.shape() == grad.shape(), "sgd_update: parameter ", w.str(), " vs gradient ", grad.str());
  float* buf = nullptr;
  if (momentum != 0.f) {
    ACTLAB_CHECK(momentum_buf.defined() && momentum_buf.shape() == w.shape(), "sgd_update: momentum buffer ",
                 momentum_buf.str(), " for ", w.str());
    buf = f32(momentum_buf);
  }
  ACTLAB_DISPATCH(dev,
                  cuda::sgd_update(f32(w), buf, f32(grad), w.numel(), lr, momentum, dampening, weight_decay, nesterov,
                                   first_step, gpu.stream()),
                  cpu::sgd_update(f32(w), buf, f32(grad), w.numel(), lr, momentum, dampening, weight_decay, nesterov,
                                  first_step));
  w.storage()->bump_version();
}

void adamw_update_(Tensor& w, Tensor& m, Tensor& v, const Tensor& grad, float lr, float beta1, float beta2, float eps,
                   float weight_decay, int64_t step) {
  const Device dev = op_device("adamw_update", {&w, &m, &v, &grad});
  require_f32_contig("adamw_update", "parameter", w);
  require_f32_contig("adamw_update", "gradient", grad);
  require_f32_contig("adamw_update", "first moment", m);
  require_f32_contig("adamw_update", "second moment", v);
  ACTLAB_CHECK(w.shape() == grad.shape() && w.shape() == m.shape() && w.shape() == v.shape(),
               "adamw_update: parameter ", w.str(), ", gradient ", grad.str(), ", moments ", m.str(), " and ", v.str());
  ACTLAB_DISPATCH(dev,
                  cuda::adamw_update(f32(w), f32(m), f32(v), f32(grad), w.numel(), lr, beta1, beta2, eps, weight_decay,
                                     step, gpu.stream()),
                  cpu::adamw_update(f32(w), f32(m), f32(v), f32(grad), w.numel(), lr, beta1, beta2, eps, weight_decay,
                                    step));
  w.storage()->bump_version();
  m.storage()->bump_version();
  v.storage()->bump_version();
}

bool all_finite(const Tensor& x) {
  const Tensor c = x.contiguous();
  const int64_t n = c.numel();
  if (c.device().is_cuda()) {
    bool ok = true;
    ACTLAB_CUDA_ONLY(cuda::DeviceScope gpu(c.device().index);
                     ok = cuda::all_finite(f32(c), n, gpu.device(), gpu.stream()));
    return ok;
  }
  // A float is NaN or ±inf exactly when all 8 exponent bits are set. Testing the bits keeps the loop an
  // integer OR-reduction, which vectorizes without -ffast-math (a float reduction would not: its order
  // is fixed), so the scan runs at memory speed: it is the per-step gradient check of the trainer.
  const float* p = f32(c);
  uint32_t bad = 0;
#pragma omp parallel for simd reduction(| : bad) if (n > (int64_t{1} << 18))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);  // a plain load once compiled
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

std::vector<bool> all_finite_each(const std::vector<Tensor>& xs) {
  std::vector<bool> finite(xs.size(), true);
  // The tensors on the first GPU in the list go to the device together; every other one alone.
  std::vector<Tensor> on_gpu;
  std::vector<size_t> where;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) continue;
    if (xs[i].device().is_cuda() && (on_gpu.empty() || xs[i].device() == on_gpu.front().device())) {
      on_gpu.push_back(xs[i].contiguous());
      where.push_back(i);
    } else {
      finite[i] = all_finite(xs[i]);
    }
  }
  if (on_gpu.empty()) return finite;
  std::vector<const float*> data;
  std::vector<int64_t> counts;
  for (const Tensor& t : on_gpu) data.push_back(f32(t)), counts.push_back(t.numel());
  std::unique_ptr<bool[]> flags(new bool[on_gpu.size()]);
  ACTLAB_CUDA_ONLY(cuda::DeviceScope gpu(on_gpu.front().device().index);
                   cuda::all_finite_each(flags.get(), data.data(), counts.data(), static_cast<int>(on_gpu.size()),
                                         gpu.device(), gpu.stream()));
  for (size_t k = 0; k < where.size(); ++k) finite[where[k]] = flags[k];
  return finite;
}

}  // namespace actlab::ops
