// CPU kernels for everything a training step does besides convolution/GEMM: batch norm, ReLU/ReLU6
// with 1-bit masks, add, dropout, the CIFAR "option A" shortcut, max/avg/global pooling, softmax
// cross-entropy, accuracy and the fused SGD update. One .cpp per family (kernels_norm, _eltwise,
// _pool, _loss, _optim). Tested against naive loops and central differences in
// tests/test_cpu_kernels.cpp.
//
// Common contract: raw pointers, outputs first, then inputs, then sizes; tensors are NCHW
// contiguous f32; outputs are ASSIGNED (never accumulated) unless a comment says otherwise; outputs
// never alias inputs unless a comment says they may. Loops are OpenMP-parallel (threads follow
// omp_set_num_threads) and stay serial below kParallelGrain elements, where a fork costs more than
// the work. Results do not depend on the thread count, except the cross-entropy loss (a parallel
// double reduction).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

namespace actlab::cpu {

// Element count below which element-wise loops run on the calling thread only.
constexpr int64_t kParallelGrain = 32768;

// Implementation detail of the kernels_*.cpp files: their hot inner loops are compiled three times
// (baseline x86-64, x86-64-v3 = AVX2+FMA, x86-64-v4 = AVX-512) and the loader picks one for the
// machine (GCC target_clones, an ifunc), so a portable build runs the wide code PyTorch's
// dispatched kernels run, without -march=native. Empty where that does not apply (other compilers
// or ISAs, or a build that already targets AVX2). NOTE: clones may contract a·b + c into an FMA,
// so low bits of results can differ between machines (never between runs or thread counts).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__AVX2__)
#define ACTLAB_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), noinline))
#else
#define ACTLAB_CPU_CLONES
#endif

// Implementation detail of the kernels_*.cpp files: range(i0, i1) over [0, n) in chunks of 16384
// elements, in parallel from kParallelGrain elements on, so an ACTLAB_CPU_CLONES range function is
// dispatched once per chunk rather than once per element. A template (no std::function to allocate on
// every element-wise call); the pragma is guarded because this header is also read without OpenMP.
template <typename RangeFn>
void parallel_elements(int64_t n, RangeFn range) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel : n >= kParallelGrain)
#endif
  for (int64_t c = 0; c < chunks; ++c) range(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// ---------------------------------------------------------------------------------------------
// 1-bit masks. Bit i of a mask is bit (i % 32) of word i / 32 (LSB first); a mask for n elements
// has mask_words(n) words and the unused high bits of the last word are written as 0.
constexpr int64_t mask_words(int64_t n) { return (n + 31) / 32; }
inline bool mask_bit(const uint32_t* mask, int64_t i) { return (mask[i >> 5] >> (i & 31)) & 1u; }

// ---------------------------------------------------------------------------------------------
// Batch norm 2-D. x, y, dy, dx: (N,C,HW) (HW = H·W); per-channel vectors: (C).
// gamma/beta may be nullptr (affine = false: gamma = 1, beta = 0).

// Training forward with batch statistics over M = N·HW values per channel (M > 1, checked):
//   save_mean = mean, save_invstd = 1/sqrt(var_biased + eps), y = (x - mean)·invstd·gamma + beta,
//   running_mean = (1 - momentum)·running_mean + momentum·mean,
//   running_var  = (1 - momentum)·running_var  + momentum·var_unbiased   (PyTorch semantics).
// running_mean/running_var are updated in place; both nullptr skips the update
// (track_running_stats = false). y may alias x. Statistics are accumulated in double.
void batchnorm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma,
                             const float* beta, int64_t N, int64_t C, int64_t HW, float momentum,
                             float eps);
// Inference forward: y = (x - running_mean)/sqrt(running_var + eps)·gamma + beta. y may alias x.
void batchnorm_forward_eval(float* y, const float* x, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var, int64_t N,
                            int64_t C, int64_t HW, float eps);
// Training backward through the batch statistics. x_hat is recomputed as
// (x - save_mean)·save_invstd, so x may be a lossy reconstruction of the forward input (activation
// compression): only x and the two (C) vectors are needed. With M = N·HW, per channel:
//   dbeta = Σ dy, dgamma = Σ dy·x_hat,
//   dx = gamma·invstd·(dy - dbeta/M - x_hat·dgamma/M).
// Assigns dx, dgamma, dbeta; dgamma/dbeta may be nullptr (not wanted). One pass over (dy, x) for
// both reductions and one for dx, per channel while its data is hot in cache.
void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        int64_t N, int64_t C, int64_t HW);
// The same two passes on channels-last tensors: x, y, dy, dx as (M, C) rows (M = N·H·W, a channel per column),
// the layout bf16 convolutions write and read (Tensor::is_channels_last). Rows are summed in fixed blocks whose
// double sums are added in order, so the bits do not depend on the thread count; they differ from the (N, C, HW)
// kernels' in the summation order only (tests/test_cpu_kernels.cpp compares the two).
void batchnorm_forward_train_channels_last(float* y, float* save_mean, float* save_invstd, float* running_mean,
                                           float* running_var, const float* x, const float* gamma, const float* beta,
                                           int64_t M, int64_t C, float momentum, float eps);
void batchnorm_backward_channels_last(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                                      const float* gamma, const float* save_mean, const float* save_invstd, int64_t M,
                                      int64_t C);
// The same with x given as bf16 bits (a bf16 run's kept copy), widened inside the loops: the bits of the f32 call
// on the widened x, without writing that copy out.
void batchnorm_backward_channels_last(float* dx, float* dgamma, float* dbeta, const float* dy, const uint16_t* x_bf16,
                                      const float* gamma, const float* save_mean, const float* save_invstd, int64_t M,
                                      int64_t C);
// batchnorm_backward split at its reduction, for a caller that adds other batches' sums in between
// (synchronized batch norm): the per-channel Σdy and Σdy·(x - mean) (double, C each), then dx from
// such sums over `count` values per channel. With this batch's sums and count N·HW the two give
// batchnorm_backward's dx bit for bit.
void batchnorm_grad_sums(double* sum_dy, double* sum_dy_xc, const float* dy, const float* x, const float* save_mean,
                         int64_t N, int64_t C, int64_t HW);
// sums[c] = Σ x and Σ (x - center[c])² over channel c of (N, C, HW), every value added in double in (n, i)
// order (synchronized batch norm's forward rounds).
void channel_sums(double* sums, const float* x, int64_t N, int64_t C, int64_t HW);
void channel_square_deviations(double* sums, const float* x, const double* center, int64_t N, int64_t C, int64_t HW);
void batchnorm_backward_from_sums(float* dx, const float* dy, const float* x, const float* gamma,
                                  const float* save_mean, const float* save_invstd, const double* sum_dy,
                                  const double* sum_dy_xc, double count, int64_t N, int64_t C, int64_t HW);
// The same with x supplied one channel at a time: x_channel(c, out) writes channel c's N planes
// (n, c) one after another into out (N·HW f32; called from the channel loop, on several threads at
// once). For an input kept compressed: each channel is decoded into a per-thread buffer
// (MemTag::Workspace) that stays in cache for both passes, so the full-size x is never written out.
// Bit-identical to decoding x whole and calling batchnorm_backward.
using ChannelSource = std::function<void(int64_t c, float* out)>;
void batchnorm_backward_channels(float* dx, float* dgamma, float* dbeta, const float* dy,
                                 const ChannelSource& x_channel, const float* gamma,
                                 const float* save_mean, const float* save_invstd, int64_t N, int64_t C,
                                 int64_t HW);
// batchnorm_grad_sums and batchnorm_backward_from_sums with x supplied the same way (each reads every
// channel once, so a synchronized batch norm on a compressed input decodes it twice and never whole).
void batchnorm_grad_sums_channels(double* sum_dy, double* sum_dy_xc, const float* dy, const ChannelSource& x_channel,
                                  const float* save_mean, int64_t N, int64_t C, int64_t HW);
void batchnorm_backward_from_sums_channels(float* dx, const float* dy, const ChannelSource& x_channel,
                                           const float* gamma, const float* save_mean, const float* save_invstd,
                                           const double* sum_dy, const double* sum_dy_xc, double count, int64_t N,
                                           int64_t C, int64_t HW);
// y (N, C, HW) bf16 = the channels x_channel writes, each rounded as to_bf16 rounds (core/bf16.h), through
// the same per-thread buffers: the bf16 copy a convolution computing in bf16 reads, from an input kept
// compressed, without writing and re-reading the f32 tensor first.
void to_bf16_channels(uint16_t* y, const ChannelSource& x_channel, int64_t N, int64_t C, int64_t HW);
// Backward of batchnorm_forward_eval (running statistics are constants, e.g. frozen BN):
// dx = dy·gamma/sqrt(running_var + eps); dgamma = Σ dy·x_hat, dbeta = Σ dy (nullptr: skipped).
void batchnorm_backward_eval(float* dx, float* dgamma, float* dbeta, const float* dy,
                             const float* x, const float* gamma, const float* running_mean,
                             const float* running_var, int64_t N, int64_t C, int64_t HW, float eps);

// ---------------------------------------------------------------------------------------------
// Element-wise. All arrays have n elements.

// y = max(x, 0) (NaN propagates), mask bit = (x > 0). y may alias x.
// ---- transformer ops (kernels_token.cpp)
// GELU y = x·Φ(x) (erf form) or 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) (tanh_approx); dx = dy·gelu'(x).
// Fast path: oneDNN's vectorized eltwise (kernels_token_dnnl.cpp); _ref: the spec loops over libm's erff,
// tanhf and expf (core/token_math.h, the CUDA kernel's arithmetic). They agree to a few f32 ulps.
void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);
void gelu_forward_ref(float* y, const float* x, int64_t n, bool tanh_approx);
void gelu_backward_ref(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx);
// LayerNorm over the last dimension of x (rows, d): y = x̂·γ + β with x̂ = (x − mean)·rstd and the biased
// variance; mean and rstd (rows) are written, and x̂ too unless xhat is null. Backward reads x̂ (which may be
// a policy's reconstruction) and rstd: dx = rstd·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂)), dγ = Σ dy·x̂, dβ = Σ dy.
// The fast path (oneDNN's layer normalization, kernels_token_dnnl.cpp) and the spec loop (_ref, the CUDA
// kernel's arithmetic): the same values to f32 rounding.
void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps);
void layernorm_forward_ref(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                           const float* beta, int64_t rows, int64_t d, float eps);
void layernorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat, const float* gamma,
                        const float* rstd, int64_t rows, int64_t d);
// The spec of layernorm_backward (the CUDA kernel's loops): the fast path above interchanges the loops of
// dγ and dβ and keeps their order of summation, so the two agree bit for bit.
void layernorm_backward_ref(float* dx, float* dgamma, float* dbeta, const float* dy, const float* xhat,
                            const float* gamma, const float* rstd, int64_t rows, int64_t d);
// Softmax of scale·x over the last dimension of x (rows, d); backward from the output y (which may be a
// policy's reconstruction): dx = scale·y·(dy − Σ dy·y) per row.
// Fast paths: oneDNN's softmax (kernels_token_dnnl.cpp); _ref: the spec loops.
void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale);
void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale);
void softmax_forward_ref(float* y, const float* x, int64_t rows, int64_t d, float scale);
void softmax_backward_ref(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale);
// Row-wise broadcasts over (rows, d): y = x·s[row] (drop-path's per-sample scale) and y = x + p (a
// position embedding p of d values added to every row). y may alias x.
void scale_rows(float* y, const float* x, const float* s, int64_t rows, int64_t d);
void add_to_rows(float* y, const float* x, const float* p, int64_t rows, int64_t d);
// out[j] = Σ_r x[r·d + j] in f32 in token_math::column_sum's order (the gradient of a broadcast; the same
// order as the CUDA twin, so both give the same bits).
void column_sums(float* out, const float* x, int64_t rows, int64_t d);

// Row gather and its adjoint (a relative-position bias table read through a fixed index): out (n, d) =
// table[index[i]]; grad (rows, d) = Σ over i with index[i] == r of dy[i], i in order (deterministic, and
// the CUDA twin adds in the same order). index values must lie in [0, rows) (checked by the caller).
void gather_rows(float* out, const float* table, const int64_t* index, int64_t n, int64_t d);
void scatter_add_rows(float* grad, const float* dy, const int64_t* index, int64_t n, int64_t rows, int64_t d);

// ---- copies between layouts (kernels_copy.cpp): what Tensor::copy_ runs when either side is strided
// (a permute made contiguous, a slice, a concat's parts). Element (i0, .., i(n-1)) of `shape` is at
// Σ ik·strides[k] elements from each base pointer; elem_bytes is 1, 2, 4 or 8.
struct StridedCopy {
  int ndim = 0;
  int64_t shape[8] = {};
  int64_t dst_strides[8] = {};
  int64_t src_strides[8] = {};
  int elem_bytes = 4;
};
// Parallel over rows (all dims but the last), the last dim an inner loop.
void strided_copy(void* dst, const void* src, const StridedCopy& c);
// The same copy with fewer dims: size-1 dims dropped, and each dim merged into the next where both layouts
// run on contiguously across them (stride[k] = stride[k+1]·shape[k+1] in dst and src). Rows get longer and
// the index arithmetic shorter; the element mapping is unchanged (the CUDA launcher runs it first).
StridedCopy coalesce_dims(const StridedCopy& c);
// The executable spec: one element at a time, serial.
void strided_copy_ref(void* dst, const void* src, const StridedCopy& c);

// ---- bf16 conversions (kernels_copy.cpp): y = x rounded to the nearest bf16 (even on ties, NaN kept
// NaN: core/bf16.h), and back (exact). What the bf16 policy stores and returns (compress/exact.h).
// The element functions of core/bf16.h are their reference twins (tests/test_cpu_kernels.cpp).
void to_bf16(uint16_t* y, const float* x, int64_t n);
void from_bf16(float* y, const uint16_t* x, int64_t n);
// The same on the calling thread only, for callers inside a parallel loop of their own. (to_bf16_channels,
// beside the batch-norm kernels, rounds a tensor supplied one channel at a time.)
void to_bf16_serial(uint16_t* y, const float* x, int64_t n);
void from_bf16_serial(float* y, const uint16_t* x, int64_t n);
// y (N, HW, C) bf16 = x (N, C, HW) rounded as to_bf16 rounds, transposed to channels-last on the way: the
// layout oneDNN's bf16 convolutions compute on, so that a bf16 keep in it is read without a reorder
// (compress/exact.h). On AVX-512 CPUs 16 x 16 blocks are transposed in registers; allow_avx512 = false runs the
// portable loop there too (for the tests). Its reference twin is to_bf16 followed by an element-by-element
// transposition (tests/test_cpu_kernels.cpp).
void to_bf16_channels_last(uint16_t* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512 = true);
// y (N, C, HW) f32 = x (N, HW, C) f32: a channels-last tensor made (N, C, H, W) (a convolution's output as its
// oneDNN kernel wrote it). 16 x 16 blocks transposed in registers on AVX-512 CPUs; allow_avx512 = false runs the
// plain loop there too (for the tests, which compare both with an element-by-element loop).
void channels_last_to_nchw(float* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512 = true);
// Its inverse, y (N, HW, C) f32 = x (N, C, HW) f32: an (N, C, H, W) tensor made channels-last where it meets a
// channels-last one (Tensor::channels_last). Same blocks, same test.
void nchw_to_channels_last(float* y, const float* x, int64_t N, int64_t C, int64_t HW, bool allow_avx512 = true);
// Channels [c0, c0 + nc) of one channels-last image x (HW, C) as nc planes of HW (planes[(c - c0)·HW + p]): a
// tile of the (N, C, HW) layout for a consumer that reads planes (the plane codecs' pack of a channels-last save).
void channels_last_planes(float* planes, const float* x, int64_t C, int64_t HW, int64_t c0, int64_t nc);
// The same for IEEE fp16 (core/bf16.h float_to_f16 / f16_to_float): what `exact` keeps under fp16.
void to_f16(uint16_t* y, const float* x, int64_t n);
void from_f16(float* y, const uint16_t* x, int64_t n);

void relu_forward(float* y, uint32_t* mask, const float* x, int64_t n);
// mask bit = (y > 0) from an already computed ReLU output (e.g. a fused conv+ReLU).
void relu_mask_from_output(uint32_t* mask, const float* y, int64_t n);
// A lossy decode of a ReLU output given back what its mask (relu_mask_from_output) recorded, a NaN kept either
// way. positive: v = mask bit ? max(v, FLT_MIN) : 0, the forward's signs, for ReLU's own backward, which tests
// v > 0. Not positive: v = mask bit ? v : 0, only the zeros, for a layer that multiplies by the values: the
// zeros are exact, and the decode where the mask is set keeps its unbiased noise (clipping it at 0 raised
// the mean of a 2-bit decode of a ReLU output by about 2 %). The Python module's pack(keep_sign=True) uses it.
void restore_sign(float* v, const uint32_t* mask, int64_t n, bool positive);
// dx = mask bit ? dy : 0. dx may alias dy.
void relu_backward(float* dx, const uint32_t* mask, const float* dy, int64_t n);
// Fused residual tail of a ResNet block: y = relu(a + b), mask bit = (a + b > 0).
// y may alias a or b.
void add_relu_forward(float* y, uint32_t* mask, const float* a, const float* b, int64_t n);

// y = min(max(x, 0), 6) (NaN propagates), mask bit = (0 < x < 6) (where the gradient passes).
// y may alias x.
void relu6_forward(float* y, uint32_t* mask, const float* x, int64_t n);
// dx = mask bit ? dy : 0. dx may alias dy.
void relu6_backward(float* dx, const uint32_t* mask, const float* dy, int64_t n);

// y = a + b. y may alias a or b.
void add(float* y, const float* a, const float* b, int64_t n);
// y += a (ACCUMULATES). y must not alias a.
void accumulate(float* y, const float* a, int64_t n);

// Inverted dropout: element i is kept iff philox_uniform(seed, stream, i) >= p; kept elements are
// scaled by 1/(1 - p), dropped ones are 0. keep_mask bit = kept. 0 <= p <= 1 (checked); p = 1
// drops everything. Deterministic for a given (seed, stream), independent of thread count, and
// identical to a CUDA kernel drawing the same (seed, stream, i). y may alias x.
void dropout_forward(float* y, uint32_t* keep_mask, const float* x, int64_t n, float p,
                     uint64_t seed, uint64_t stream);
// dx = keep bit ? dy/(1 - p) : 0. dx may alias dy.
void dropout_backward(float* dx, const uint32_t* keep_mask, const float* dy, int64_t n, float p);

// CIFAR ResNet shortcut "option A" (He et al. 2016): x (N,C_in,H,W) -> y (N,C_out,Ho,Wo) with
// Ho = ceil(H/stride), Wo = ceil(W/stride): y = x[:, :, ::stride, ::stride] zero-padded on
// channels, pad_front = (C_out - C_in)/2 channels in front and the rest behind, exactly
// F.pad(x[:, :, ::s, ::s], (0, 0, 0, 0, p//2, p - p//2)) with p = C_out - C_in >= 0 (checked).
void shortcut_pad_forward(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W,
                          int64_t stride, int64_t C_out);
// dx (N,C_in,H,W) = dy's matching channels scattered back to the strided positions, 0 elsewhere.
void shortcut_pad_backward(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H,
                           int64_t W, int64_t stride, int64_t C_out);
// The same two on channels-last tensors (x, dx (N,H,W,C_in); y, dy (N,Ho,Wo,C_out) in memory): a bf16 run's
// activations. Tested against the pair above on transposed data.
void shortcut_pad_forward_channels_last(float* y, const float* x, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                        int64_t stride, int64_t C_out);
void shortcut_pad_backward_channels_last(float* dx, const float* dy, int64_t N, int64_t C_in, int64_t H, int64_t W,
                                         int64_t stride, int64_t C_out);

// ---------------------------------------------------------------------------------------------
// Pooling 2-D, floor mode. x: (N,C,H,W), y: (N,C,P,Q); window R×S.
struct Pool2dShape {
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t R = 0, S = 0;  // window height, width
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t P() const { return (H + 2 * pad_h - R) / stride_h + 1; }  // output height
  int64_t Q() const { return (W + 2 * pad_w - S) / stride_w + 1; }  // output width
};
// Throws actlab::Error unless sizes are positive, strides >= 1, 0 <= pad <= window/2 (PyTorch's
// rule, so every window holds at least one real input) and the output is non-empty.
void check_pool_shape(const Pool2dShape& s);

// y = max over the window (padding never wins); argmax (N,C,P,Q) u8 = r·S + s of the winner inside
// the window (first maximum in row-major window order wins; a NaN wins and sticks).
// Needs R·S <= 256 (checked).
void maxpool2d_forward(float* y, uint8_t* argmax, const float* x, const Pool2dShape& s);
// dx (N,C,H,W): zeroed, then dy scattered through argmax (overlapping windows add up). Assigns dx.
void maxpool2d_backward(float* dx, const float* dy, const uint8_t* argmax, const Pool2dShape& s);

// y = window sum / (R·S) (count_include_pad = true, PyTorch's default; in floor mode every window
// fits in the padded input, so the divisor is always R·S).
void avgpool2d_forward(float* y, const float* x, const Pool2dShape& s);
// dx (N,C,H,W) = Σ over windows covering a position of dy/(R·S). Assigns dx.
void avgpool2d_backward(float* dx, const float* dy, const Pool2dShape& s);

// y (N,C) = mean over the H·W plane of x (N,C,HW).
void global_avgpool_forward(float* y, const float* x, int64_t N, int64_t C, int64_t HW);
// dx (N,C,HW) = dy[n,c]/HW broadcast over the plane. Assigns dx.
void global_avgpool_backward(float* dx, const float* dy, int64_t N, int64_t C, int64_t HW);

// ---------------------------------------------------------------------------------------------
// Loss and metrics. logits, probs, dlogits: (N,K); labels: (N) int64 in [0, K) (checked: the error
// names the first bad label and its row).

// Softmax cross-entropy averaged over the batch, with label smoothing eps in [0, 1] (PyTorch:
// target = (1 - eps)·onehot + eps/K). loss: one float. probs = softmax(logits), saved for backward.
// Numerically stable (max-subtracted, log-sum-exp). probs may not alias logits.
void softmax_cross_entropy_forward(float* loss, float* probs, const float* logits,
                                   const int64_t* labels, int64_t N, int64_t K, float smoothing);
// dlogits = (probs - target)/N · dloss. dlogits may alias probs.
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int64_t* labels,
                                    int64_t N, int64_t K, float smoothing, float dloss);
// Number of rows whose argmax (first maximum wins) equals the label.
int64_t top1_correct(const float* logits, const int64_t* labels, int64_t N, int64_t K);

// ---------------------------------------------------------------------------------------------
// SGD, PyTorch semantics, one fused pass over w, grad (and momentum_buf):
//   g = grad + weight_decay·w
//   momentum != 0: buf = first_step ? g : momentum·buf + (1 - dampening)·g
//                  g = nesterov ? g + momentum·buf : buf
//   w -= lr·g
// momentum_buf (n) may be nullptr when momentum == 0; nesterov needs momentum > 0 and
// dampening == 0 (checked, like torch.optim.SGD).
void sgd_update(float* w, float* momentum_buf, const float* grad, int64_t n, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step);

// AdamW, PyTorch semantics (torch.optim.AdamW, amsgrad off), one fused pass over w, m, v and grad;
// `step` is this parameter's update count including this one (>= 1), m and v start at zero:
//   w -= lr·weight_decay·w                        (decoupled decay, before the moments are used)
//   m = beta1·m + (1 - beta1)·g,  v = beta2·v + (1 - beta2)·g²
//   w -= lr / (1 - beta1^step) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
void adamw_update(float* w, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step);

}  // namespace actlab::cpu
