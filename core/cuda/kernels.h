// CUDA kernels for everything a training step does besides convolution and GEMM: batch norm, ReLU/ReLU6
// and add+ReLU with 1-bit masks, add/axpy/scale, dropout, the "option A" shortcut, max/avg/global pooling,
// softmax cross-entropy, top-1 and the fused SGD update. Each is the twin of the cpu:: kernel of the same
// name (core/cpu/kernels.h: formats, formulas and contracts are the same) and is called only from the
// dispatch point core/ops.cpp. One .cu per family (eltwise, norm, pool, loss, optim).
// Tested against the CPU kernels in tests/test_cuda_ops.cpp.
//
// Common contract: raw device pointers on the current device, outputs first, then inputs, sizes, then the
// stream (the device's actlab stream, core/cuda/context.h). Every call is asynchronous (queued on
// `stream`) unless it returns a host value. Outputs are ASSIGNED unless a comment says otherwise.
// Masks are the CPU's: bit i is bit (i % 32) of word i / 32, LSB first, unused high bits 0.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "actlab/core/cpu/kernels.h"  // Pool2dShape (shared plain struct)
#include "actlab/core/device.h"        // DType

namespace actlab::cuda {

// ---------------------------------------------------------------- element-wise (eltwise.cu)
// y = max(x, 0) (NaN propagates), mask bit = (x > 0). y may alias x.
// ---- transformer ops (token.cu): the contracts of cpu::gelu_* and cpu::layernorm_* (core/cpu/kernels.h).
void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx, cudaStream_t cuda_stream);
void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps, cudaStream_t cuda_stream);
void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat, const float* gamma,
                        const float* rstd, int64_t rows, int64_t d, cudaStream_t cuda_stream);
// The contracts of cpu::softmax_*, cpu::scale_rows, cpu::add_to_rows, cpu::column_sums, cpu::strided_copy,
// cpu::gather_rows and cpu::scatter_add_rows.
void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale, cudaStream_t cuda_stream);
void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale,
                      cudaStream_t cuda_stream);
void scale_rows(float* y, const float* x, const float* s, int64_t rows, int64_t d, cudaStream_t cuda_stream);
void add_to_rows(float* y, const float* x, const float* p, int64_t rows, int64_t d, cudaStream_t cuda_stream);
void column_sums(float* out, const float* x, int64_t rows, int64_t d, cudaStream_t cuda_stream);
void strided_copy(void* dst, const void* src, const cpu::StridedCopy& c, cudaStream_t cuda_stream);
// n f32 values rounded to a 16-bit type (DType::BF16 or F16, core/bf16.h's conversions: the CPU's bits),
// and such values widened back to f32.
void narrow_16(uint16_t* y, const float* x, int64_t n, DType type, cudaStream_t cuda_stream);
void widen_16(float* y, const uint16_t* x, int64_t n, DType type, cudaStream_t cuda_stream);
void gather_rows(float* out, const float* table, const int64_t* index, int64_t n, int64_t d, cudaStream_t cuda_stream);
void scatter_add_rows(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows, int64_t d,
                      cudaStream_t cuda_stream);

void relu_forward(float* y, uint32_t* mask, const float* x, int64_t n, cudaStream_t cuda_stream);
// y = min(max(x, 0), 6), mask bit = (0 < x < 6). y may alias x.
void relu6_forward(float* y, uint32_t* mask, const float* x, int64_t n, cudaStream_t cuda_stream);
// y = relu(a + b), mask bit = (a + b > 0). y may alias a or b.
void add_relu_forward(float* y, uint32_t* mask, const float* a, const float* b, int64_t n, cudaStream_t cuda_stream);
// dx = mask bit ? dy·scale : 0 (ReLU, ReLU6: scale 1; dropout: 1/(1-p)). dx may alias dy.
void masked_scale(float* dx, const uint32_t* mask, const float* dy, int64_t n, float scale, cudaStream_t cuda_stream);
// y = a + b. y may alias a or b.
void add(float* y, const float* a, const float* b, int64_t n, cudaStream_t cuda_stream);
// y += alpha·x (ACCUMULATES). y must not alias x.
void axpy(float* y, const float* x, float alpha, int64_t n, cudaStream_t cuda_stream);
// y *= value.
void scale(float* y, float value, int64_t n, cudaStream_t cuda_stream);
// Inverted dropout with the CPU's draws: element i is kept iff philox_uniform(seed, subsequence, i) >= p.
void dropout_forward(float* y, uint32_t* keep_mask, const float* x, int64_t n, float p, uint64_t seed,
                     uint64_t subsequence, cudaStream_t cuda_stream);
// CIFAR "option A" shortcut (see cpu::shortcut_pad_forward): x (N,C_in,H,W) -> y (N,C_out,ceil(H/s),ceil(W/s)).
void shortcut_pad_forward(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W, int64_t stride,
                          int64_t C_out, cudaStream_t cuda_stream);
void shortcut_pad_backward(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H, int64_t W,
                           int64_t stride, int64_t C_out, cudaStream_t cuda_stream);
// True when every one of the n floats is finite. Synchronizes `stream` (returns a host value).
bool all_finite(const float* x, int64_t n, int device, cudaStream_t cuda_stream);
// finite[i] = all_finite(xs[i], ns[i]) for i < count, with one copy back and one synchronization.
void all_finite_each(bool* finite, const float* const* xs, const int64_t* ns, int count, int device,
                     cudaStream_t cuda_stream);

// ---------------------------------------------------------------- batch norm (norm.cu)
// Same semantics and the same arithmetic plan as the CPU kernels: per-channel sums of (x - shift) and
// (x - shift)² (shift = the channel's first value) in float per thread and double across threads, biased
// variance for the normalisation, unbiased for running_var, PyTorch's momentum rule. x, y, dy, dx:
// (N,C,HW); per-channel vectors (C); gamma/beta never nullptr here (the op layer always has them).
// running_mean/var: both nullptr or both given (updated in place). Scratch comes from the tracking
// allocator (MemTag::Workspace), freed in stream order.
void batchnorm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma, const float* beta, int64_t N,
                             int64_t C, int64_t HW, float momentum, float eps, int device, cudaStream_t cuda_stream);
void batchnorm_forward_eval(float* y, const float* x, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, int64_t N, int64_t C, int64_t HW, float eps, int device,
                            cudaStream_t cuda_stream);
// dx = gamma·invstd·(dy - Σdy/M - x_hat·Σ(dy·x_hat)/M), x_hat recomputed from x (may be a lossy
// reconstruction); dgamma = Σ dy·x_hat, dbeta = Σ dy (both assigned).
void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x, const float* gamma,
                        const float* save_mean, const float* save_invstd, int64_t N, int64_t C, int64_t HW,
                        int device, cudaStream_t cuda_stream);
void batchnorm_backward_eval(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                             const float* gamma, const float* running_mean, const float* running_var, int64_t N,
                             int64_t C, int64_t HW, float eps, int device, cudaStream_t cuda_stream);
// The pieces of synchronized batch norm (dist/sync_batch_norm.cpp), whose sums are all-reduced between
// them; the CPU's are cpu::channel_sums, channel_square_deviations, batchnorm_grad_sums and
// batchnorm_backward_from_sums. sums/center: device memory, double. Summed per thread in float and across
// threads in double (the batch-norm kernels' plan), so they agree with the CPU's to float rounding.
//   channel_sums: sums[c] = Σ x;  channel_square_deviations: sums[c] = Σ (x - center[c])²;
//   batchnorm_grad_sums: sums[c] = Σ dy, sums[C + c] = Σ dy·(x - mean[c]);
//   batchnorm_backward_from_sums: dx from such sums over `count` values per channel (gamma may be nullptr).
void channel_sums(double* sums, const float* x, int64_t N, int64_t C, int64_t HW, int device, cudaStream_t cuda_stream);
void channel_square_deviations(double* sums, const float* x, const double* center, int64_t N, int64_t C, int64_t HW,
                               int device, cudaStream_t cuda_stream);
void batchnorm_grad_sums(double* sums, const float* dy, const float* x, const float* save_mean, int64_t N, int64_t C,
                         int64_t HW, int device, cudaStream_t cuda_stream);
void batchnorm_backward_from_sums(float* dx, const float* dy, const float* x, const float* gamma, const float* save_mean,
                                  const float* save_invstd, const double* sums, double count, int64_t N, int64_t C,
                                  int64_t HW, int device, cudaStream_t cuda_stream);

// ---------------------------------------------------------------- pooling (pool.cu)
// Same formats as the CPU: argmax (N,C,P,Q) u8 = r·S + s inside the window, first maximum wins, a NaN
// wins and sticks. Backward kernels gather (one thread per input element, windows in row-major order),
// so they need no atomics and add in the CPU's order.
void maxpool2d_forward(float* y, uint8_t* argmax, const float* x, const cpu::Pool2dShape& s, cudaStream_t cuda_stream);
void maxpool2d_backward(float* dx, const float* dy, const uint8_t* argmax, const cpu::Pool2dShape& s,
                        cudaStream_t cuda_stream);
void avgpool2d_forward(float* y, const float* x, const cpu::Pool2dShape& s, cudaStream_t cuda_stream);
void avgpool2d_backward(float* dx, const float* dy, const cpu::Pool2dShape& s, cudaStream_t cuda_stream);
void global_avgpool_forward(float* y, const float* x, int64_t N, int64_t C, int64_t HW, cudaStream_t cuda_stream);
void global_avgpool_backward(float* dx, const float* dy, int64_t N, int64_t C, int64_t HW, cudaStream_t cuda_stream);

// ---------------------------------------------------------------- loss and metrics (loss.cu)
// loss (1 float on the device) = mean over rows of -Σ target·log softmax, target = (1-eps)·onehot + eps/K;
// probs = softmax(logits). Validates the labels: synchronizes `stream` once and throws Error naming the
// first bad label and its row, like the CPU.
void softmax_cross_entropy_forward(float* loss, float* probs, const float* logits, const int64_t* labels, int64_t N,
                                   int64_t K, float smoothing, int device, cudaStream_t cuda_stream);
// dlogits = (probs - target)/N·dloss. dlogits may alias probs. Rows whose label is out of range (forward
// already refused them) get no on-target term.
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int64_t* labels, int64_t N, int64_t K,
                                    float smoothing, float dloss, cudaStream_t cuda_stream);
// Rows whose argmax (first maximum wins) equals the label. Synchronizes `stream`. Labels are not validated
// here (cross-entropy forward does; an out-of-range label simply never matches).
int64_t top1_correct(const float* logits, const int64_t* labels, int64_t N, int64_t K, int device,
                     cudaStream_t cuda_stream);

// ---------------------------------------------------------------- optimizer (optim.cu)
// One fused pass, the formulas of cpu::sgd_update (torch.optim.SGD semantics). momentum_buf may be
// nullptr when momentum == 0.
void sgd_update(float* w, float* momentum_buf, const float* grad, int64_t n, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step, cudaStream_t cuda_stream);
// The formulas of cpu::adamw_update (torch.optim.AdamW semantics), core/optim_math.h's element.
void adamw_update(float* w, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step, cudaStream_t cuda_stream);

}  // namespace actlab::cuda
