// Device-agnostic tensor operations (no autograd): each checks shapes, allocates its outputs under
// the current MemTagScope on its inputs' device and dispatches to cpu:: or cuda:: in exactly one place
// (core/ops.cpp). All tensors of one call must be on one device (else Error naming both); GPU calls are
// asynchronous on the device's stream except those returning host values (count_correct, all_finite) and
// cross_entropy_forward, which validates its labels. The autograd functions (autograd/functions.h) are
// built on these. Tested through tests/test_functions.cpp, the kernel suites and tests/test_cuda_ops.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actlab/core/tensor.h"

namespace actlab::cpu {
class ConvGradShare;
}

namespace actlab::ops {

struct ConvParams {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
};
// x (N,C,H,W), w (K,C/g,R,S), b (K) or undefined -> (N,K,P,Q). x may be a BF16 tensor on the CPU under bf16
// compute, contiguous or channels-last (a bf16 run's kept copy of the input: the convolution reads it as it is).
// channels_last_out (bf16 compute on the CPU only): y is written channels-last (Tensor::is_channels_last), the
// layout the bf16 kernels compute in, with no transpose back; an f32 x must then be channels-last too.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p,
                      bool channels_last_out = false);
// Whether conv2d_forward of an f32 x of this shape and device, under the compute precision in force, computes on
// a channels-last bf16 operand (cpu::conv2d_bf16_reads_channels_last): a bf16 keep of x is best made in that
// layout (SaveInfo::channels_last). False on a GPU and in fp32. channels_last_out: the output layout the
// forward will be asked for (the question then builds the forward's own plan).
bool conv2d_bf16_reads_channels_last(const Tensor& x, const Shape& w_shape, const ConvParams& p, bool with_bias,
                                     bool channels_last_out = false);
// dy (N,K,P,Q), w -> dx of x_shape, in dy's layout (a channels-last dy: bf16 compute on the CPU only).
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p);
// dy, x -> dw of w_shape; db (K) when want_bias. x may be a BF16 tensor on the CPU under bf16 compute,
// contiguous or channels-last (the kept bf16 copy of the input: read as it is, no f32 copy); an f32 x is laid out
// as dy is (contiguous, or under bf16 on the CPU channels-last).
Tensor conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Shape& w_shape, const ConvParams& p,
                              bool want_bias, Tensor* db);
// 16 when conv2d_backward_weight on dy's device computes on a channel-blocked input (on the CPU: oneDNN's
// aBcd16b, cpu::conv2d_backward_weight_input_block), else 0. A compressed activation can then be
// unpacked straight into that layout (ActivationCachePolicy::unpack_blocked) and the reorder skipped.
int conv2d_backward_weight_input_block(const Tensor& dy, const Shape& x_shape, const Shape& w_shape,
                                       const ConvParams& p, bool want_bias);
// conv2d_backward_weight with the input given blocked: x_blocked (N, C/16, H, W, 16) holds x (x_shape).
// Only where conv2d_backward_weight_input_block says 16; the same result bit for bit.
Tensor conv2d_backward_weight_blocked_input(const Tensor& dy, const Tensor& x_blocked, const Shape& x_shape,
                                            const Shape& w_shape, const ConvParams& p, bool want_bias, Tensor* db);

// Around one convolution's backward passes on the same dy (conv2d_backward_data and a
// conv2d_backward_weight*): on the CPU, dy's reorder into the kernels' layout is made once for both
// (cpu::ConvGradShare) instead of once per pass; on a GPU it does nothing. Holds dy for its life. The
// results are the same bit for bit.
class ConvBackwardScope {
 public:
  explicit ConvBackwardScope(const Tensor& dy);
  ~ConvBackwardScope();
  ConvBackwardScope(const ConvBackwardScope&) = delete;
  ConvBackwardScope& operator=(const ConvBackwardScope&) = delete;
 private:
  Tensor dy_;
  std::unique_ptr<cpu::ConvGradShare> share_;
};

// x (..., D), w (M,D), b (M) or undefined -> (..., M): every leading dim is a row (token maps (B,T,D)).
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor linear_backward_data(const Tensor& dy, const Tensor& w);  // (..., D)
// dw (M,D) from dy (..., M) and x (..., D); db (M) when want_bias.
Tensor linear_backward_weight(const Tensor& dy, const Tensor& x, bool want_bias, Tensor* db);

// ---- transformer ops. GELU of any shape (erf form, or the tanh approximation); dx from dy and x.
Tensor gelu_forward(const Tensor& x, bool tanh_approx);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, bool tanh_approx);
// LayerNorm over the last dimension D of x (..., D); gamma, beta (D). mean, rstd: one per row (the
// product of the other dims), allocated here; xhat (when asked for): the normalized input (x − mean)·rstd,
// which backward reads with rstd. Backward returns dx and sets dgamma, dbeta (D).
Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor* mean,
                         Tensor* rstd, Tensor* xhat = nullptr);
Tensor layernorm_backward(const Tensor& dy, const Tensor& xhat, const Tensor& gamma, const Tensor& rstd,
                          Tensor* dgamma, Tensor* dbeta);

// Softmax of scale·x over the last dimension (attention: scale = 1/√d folded in); backward from the output.
Tensor softmax_forward(const Tensor& x, float scale);
Tensor softmax_backward(const Tensor& dy, const Tensor& y, float scale);
// Batched matrix product over the last two dims: a (..., M, K) (or (..., K, M) when trans_a), b (..., K, N)
// (or (..., N, K) when trans_b), equal leading dims -> (..., M, N). CPU: cpu::gemm_batched; CUDA: cuBLAS
// strided-batched SGEMM.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
// A contiguous f32 tensor rounded to the nearest bf16 (a BF16 tensor of the same shape, under the current
// MemTag), and a BF16 tensor widened back to f32 (exact).
Tensor to_bf16(const Tensor& x);
Tensor from_bf16(const Tensor& h);
// to_bf16 of an (N, C, H, W) tensor supplied one channel at a time (CPU), as batchnorm_backward_channels
// takes it: x_channel(c, out) writes channel c's N planes as N·H·W f32 (cpu::to_bf16_channels).
Tensor to_bf16_channels(const Shape& shape, const std::function<void(int64_t c, float* out)>& x_channel);
// to_bf16 of a contiguous (N, C, H, W) f32 tensor on the CPU, written channels-last: a BF16 tensor of the same
// shape with Tensor::is_channels_last() (cpu::to_bf16_channels_last).
Tensor to_bf16_channels_last(const Tensor& x);
// The same for IEEE fp16 (DType::F16): what `exact` keeps under --precision fp16.
Tensor to_f16(const Tensor& x);
Tensor from_f16(const Tensor& h);
// Row-wise broadcasts over dim 0 of x: y = x·s[row] (s: one value per row), y = x + p (p: one row, any
// shape of x.numel()/x.size(0) values), and their adjoint sum_rows: Σ over rows of x, shaped row_shape.
Tensor scale_rows(const Tensor& x, const Tensor& s);
Tensor add_to_rows(const Tensor& x, const Tensor& p);
Tensor sum_rows(const Tensor& x, const Shape& row_shape);
// out (n, d) = table (rows, d) at rows index (n, i64, each in [0, rows): checked on the CPU; a GPU index must
// come from one the CPU checked); scatter_add_rows is its adjoint, (rows, d).
Tensor gather_rows(const Tensor& table, const Tensor& index);
Tensor scatter_add_rows(const Tensor& dy, const Tensor& index, int64_t rows);

// x (N,C,...) ; statistics over every dim but 1. save_mean/save_invstd: (C), allocated here. Training forward and
// backward also take a channels-last x (and dy) on the CPU, a bf16 run's activations, and answer in that layout;
// the backward's channels-last x may be the bf16 copy a bf16 run kept (read as it is, widened in the loop).
Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps, Tensor* save_mean,
                               Tensor* save_invstd);
Tensor batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps);
// Returns dx; sets dgamma, dbeta (C).
Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                          const Tensor& save_invstd, Tensor* dgamma, Tensor* dbeta);
// batchnorm_backward split at its reduction (CPU and GPU), for synchronized batch norm, which all-reduces
// the sums in between: batchnorm_grad_sums returns Σdy (C values) then Σdy·(x - mean) (C values), in
// double, on the host; batchnorm_backward_from_sums the input gradient from such sums over `count` values
// per channel. With this batch's own sums and count N·H·W, dx is batchnorm_backward's bit for bit on the
// CPU (to float rounding on a GPU), and dbeta = Σdy, dgamma = Σdy·(x - mean)·invstd are its parameter
// gradients.
std::vector<double> batchnorm_grad_sums(const Tensor& dy, const Tensor& x, const Tensor& save_mean);
// Per-channel sums of an (N,C,...) f32 tensor in double: Σ x, and Σ (x - center[c])² (synchronized batch
// norm's two forward rounds, all-reduced in between). The CPU sums every value in double in order; the
// GPU per thread in float, across threads in double, so the two agree to float rounding.
std::vector<double> channel_sums(const Tensor& x);
std::vector<double> channel_square_deviations(const Tensor& x, const std::vector<double>& center);
Tensor batchnorm_backward_from_sums(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                    const Tensor& save_invstd, const std::vector<double>& sums, double count);
// The same with the input (of shape x_shape, which must be dy's) supplied one channel at a time (CPU,
// 4-D): x_channel(c, out) writes channel c's N planes as N·H·W f32 (cpu::batchnorm_backward_channels).
// For an input kept compressed, decoded channel by channel (ActivationCachePolicy::channel_reader).
Tensor batchnorm_backward_channels(const Tensor& dy, const Shape& x_shape,
                                   const std::function<void(int64_t c, float* out)>& x_channel, const Tensor& gamma,
                                   const Tensor& save_mean, const Tensor& save_invstd, Tensor* dgamma, Tensor* dbeta);
// batchnorm_grad_sums and batchnorm_backward_from_sums with the input supplied the same way (synchronized
// batch norm on a compressed input: each call decodes every channel once, and the input is never whole).
std::vector<double> batchnorm_grad_sums_channels(const Tensor& dy, const Shape& x_shape,
                                                 const std::function<void(int64_t c, float* out)>& x_channel,
                                                 const Tensor& save_mean);
Tensor batchnorm_backward_from_sums_channels(const Tensor& dy, const Shape& x_shape,
                                             const std::function<void(int64_t c, float* out)>& x_channel,
                                             const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                                             const std::vector<double>& sums, double count);
Tensor batchnorm_backward_eval(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               Tensor* dgamma, Tensor* dbeta);

// Masks are I32 tensors of ceil(n/32) words (bit i = element i in memory order, LSB first). These element-wise
// ops (and to_bf16/from_bf16; not dropout) take their tensors contiguous or channels-last, all operands of a call in
// one layout, and write their results in it: their kernels run over memory as a flat array.
Tensor relu_forward(const Tensor& x, Tensor* mask);
Tensor relu_backward(const Tensor& dy, const Tensor& mask);
Tensor relu6_forward(const Tensor& x, Tensor* mask);
Tensor relu6_backward(const Tensor& dy, const Tensor& mask);
Tensor add(const Tensor& a, const Tensor& b);
// relu(a + b) and its mask (the tail of a residual block).
Tensor add_relu_forward(const Tensor& a, const Tensor& b, Tensor* mask);
Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t stream, Tensor* keep_mask);
Tensor dropout_backward(const Tensor& dy, const Tensor& keep_mask, float p);

struct PoolParams {
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t padding = 0;
};
Tensor maxpool2d_forward(const Tensor& x, const PoolParams& p, Tensor* argmax);  // argmax: U8 (N,C,P,Q)
Tensor maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const PoolParams& p);
Tensor avgpool2d_forward(const Tensor& x, const PoolParams& p);
Tensor avgpool2d_backward(const Tensor& dy, const Shape& x_shape, const PoolParams& p);
Tensor global_avgpool_forward(const Tensor& x);                       // (N,C,H,W) -> (N,C)
Tensor global_avgpool_backward(const Tensor& dy, const Shape& x_shape);
// x (and dy) contiguous, or channels-last on the CPU (a bf16 run's activations): the result takes that layout.
Tensor shortcut_pad_forward(const Tensor& x, int64_t stride, int64_t c_out);
Tensor shortcut_pad_backward(const Tensor& dy, const Shape& x_shape, int64_t stride);

// logits (N,K), labels (N) I64 -> loss (1); probs (N,K) for backward.
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float smoothing, Tensor* probs);
Tensor cross_entropy_backward(const Tensor& probs, const Tensor& labels, float smoothing, float dloss);
int64_t count_correct(const Tensor& logits, const Tensor& labels);

// One fused SGD step on w (PyTorch semantics). momentum_buf may be undefined when momentum == 0.
void sgd_update_(Tensor& w, Tensor& momentum_buf, const Tensor& grad, float lr, float momentum, float dampening,
                 float weight_decay, bool nesterov, bool first_step);
// One fused AdamW step on w with its moments m and v (PyTorch semantics); `step` counts this update (>= 1).
void adamw_update_(Tensor& w, Tensor& m, Tensor& v, const Tensor& grad, float lr, float beta1, float beta2, float eps,
                   float weight_decay, int64_t step);

// True when every value of x is finite.
bool all_finite(const Tensor& x);
// all_finite of each tensor (f32; undefined ones count as finite). Tensors on one GPU are checked with one
// device-to-host copy and one synchronization for the whole list (the trainer's per-step gradient check).
std::vector<bool> all_finite_each(const std::vector<Tensor>& xs);


}  // namespace actlab::ops
