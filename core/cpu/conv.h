// CPU 2-D convolution (NCHW fp32, groups incl. depthwise, dilation 1): forward, backward-data and
// backward-weight through oneDNN (blocked layouts with reorders, primitives cached per shape) plus
// naive *_ref loops that are the executable spec. Fast path in conv.cpp, spec in conv_ref.cpp.
// Tested in tests/test_cpu_conv.cpp; timed in bench/bench_conv.cpp (results: bench/RESULTS_conv.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "actlab/core/precision.h"

namespace actlab::cpu {

// Input x: (N,C,H,W); weight w: (K, C/groups, R, S); output y: (N,K,P,Q).
struct ConvShape {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input (N,C,H,W)
  int64_t K = 0, R = 0, S = 0;         // weight (K, C/groups, R, S)
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, groups = 1;
  int64_t P() const { return (H + 2 * pad_h - R) / stride_h + 1; }  // output height
  int64_t Q() const { return (W + 2 * pad_w - S) / stride_w + 1; }  // output width
  bool depthwise() const { return groups > 1 && groups == C && groups == K; }
  double flops() const { return 2.0 * N * K * P() * Q() * (C / groups) * R * S; }  // per direction
  std::string str() const;  // "N=128 C=64 H=32 W=32 K=64 R=3 S=3 stride=1x1 pad=1x1 groups=1"
};
// Throws actlab::Error unless every size is positive, pads >= 0, strides >= 1, groups divide C and
// K, and the output is non-empty.
void check_conv_shape(const ConvShape& s);

// Which implementation runs. Auto is what the library uses (see conv.cpp for the measured choice);
// the others exist so bench/bench_conv.cpp can compare the candidates.
enum class ConvImpl {
  Auto,          // the measured choice: DnnlWinograd for 3x3 stride-1 convs with >= 64 channels
                 // in and out, DnnlPlain for pointwise (1x1 stride 1), DnnlBlocked for the rest
                 // (depthwise included: oneDNN's jit_dw kernels); under bf16 no Winograd, dense pointwise
                 // layers as Im2colGemm's matmuls in all three passes and grouped ones DnnlNhwc, backward
                 // weights as Im2colGemm on small maps (each instruction set its measured rule), and on AMX CPUs
                 // the forward of 4x4 maps as that matmul and backward data of one-group stride-1 layers as the
                 // forward of the flipped kernels (conv.cpp)
  DnnlBlocked,   // oneDNN, memory format `any` (nChw16c / blocked weights), NCHW reordered in and out
  DnnlNhwc,      // oneDNN on channels-last activations, NCHW transposed in and out
  DnnlPlain,     // oneDNN on the user's NCHW / OIHW memory directly (no reorders)
  DnnlWinograd,  // oneDNN Winograd where it applies (3x3 stride 1), else DnnlBlocked
  Im2colGemm,    // fp32: im2col / col2im around cpu::gemm, one image at a time. bf16 (one group only; grouped
                 // layers run DnnlBlocked): forward and backward weights as one bf16 matmul over the whole batch
                 // on channels-last operands, backward data of stride-1 layers as the flipped kernels' forward
                 // matmul, of strided layers DnnlBlocked
};
const char* conv_impl_name(ConvImpl impl);            // "auto", "dnnl-blocked", ...
ConvImpl conv_impl_from_name(const std::string& name);  // inverse; throws on an unknown name

// How an activation operand is laid out in memory: (N, C, H, W), or channels-last ((N, H, W, C) in memory:
// Tensor::is_channels_last).
enum class Layout { Nchw, ChannelsLast };

// All three fast-path functions: pointers are NCHW / (K,C/groups,R,S) contiguous fp32 (the activations x, y,
// dy and dx channels-last instead where `act` says so: bf16 compute only), outputs must not alias inputs,
// threads follow omp_set_num_threads, scratch memory (reorders, im2col, oneDNN scratchpads) is allocated per
// call as MemTag::Workspace Buffers and freed before return.
// compute = BF16: the operands the kernel multiplies are rounded to bf16 on the way in (the reorder into
// the primitive's layout converts), products are accumulated in f32 and the result is written in f32;
// Winograd has no bf16 path. The spec of a bf16 call is the _ref loop on the operands rounded to bf16
// (tests/test_cpu_conv.cpp).

// y (N,K,P,Q) = conv(x (N,C,H,W), w (K,C/g,R,S)) + b (K). b may be nullptr. Assigns y.
void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvShape& s,
                    ConvImpl impl = ConvImpl::Auto, Precision compute = Precision::F32, Layout act = Layout::Nchw);
// dx (N,C,H,W) = transposed conv of dy (N,K,P,Q) with w (K,C/g,R,S). Assigns dx.
void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvShape& s,
                          ConvImpl impl = ConvImpl::Auto, Precision compute = Precision::F32,
                          Layout act = Layout::Nchw);
// dw (K,C/g,R,S) = sum over n,p,q of dy * x-window; db (K) = sum over n,p,q of dy, skipped when
// db is nullptr. Assigns dw and db (does not accumulate).
void conv2d_backward_weight(float* dw, float* db, const float* dy, const float* x,
                            const ConvShape& s, ConvImpl impl = ConvImpl::Auto, Precision compute = Precision::F32,
                            Layout act = Layout::Nchw);

// The implementation conv2d_backward_weight runs for these arguments: Auto resolved, and under bf16 the
// matmul route (Im2colGemm) or the layout it falls back to. A Winograd request is returned as is (oneDNN
// decides on its first call whether the shape has Winograd, else it runs DnnlBlocked). For tests.
ConvImpl conv2d_backward_weight_impl(const ConvShape& s, ConvImpl impl = ConvImpl::Auto,
                                     Precision compute = Precision::F32);
// Whether conv2d_backward_data runs as the forward convolution of dy with the kernels flipped and the channels
// swapped, padded by R - 1 - pad (the forward Auto or Im2colGemm would run for that shape): under bf16 for
// one-group stride-1 layers with pad <= R - 1, with Im2colGemm, and with Auto on AMX CPUs and for dense pointwise
// layers on any (a dense pointwise layer's then a matmul with the transposed weights). oneDNN 2.6's AMX backward-data
// kernel took 1.2-1.7 times its forward kernel's time on ResNet-18's stride-1 layers (bench/RESULTS.md §7,
// "forty-second session").
bool conv2d_backward_data_as_forward(const ConvShape& s, ConvImpl impl = ConvImpl::Auto,
                                     Precision compute = Precision::F32);
// Throws Error, one line, unless `impl` has a path at `compute` (dnnl-wino has no bf16 one): the check every
// call makes, for a caller that wants it before its first call.
void check_conv_impl(ConvImpl impl, Precision compute);
// Whether oneDNN runs its AMX kernels in this process (its effective instruction set: the CPU's amx_bf16,
// the kernel's permission and ONEDNN_MAX_CPU_ISA all count). Auto's bf16 routes differ with it: the forward of 4x4
// maps as a matmul and the flipped backward data of 3x3 layers only then, and each its own rule for which backward
// weights run as a matmul (measured on an AMX Xeon and on a Zen 5 without AMX). False in a minimal build.
bool dnnl_runs_amx();

// The input layout conv2d_backward_weight's oneDNN primitive computes on, as a channel block: 16 when it
// is aBcd16b (value (n, c, h, w) at ((n·C/16 + c/16)·H·W + h·W + w)·16 + c%16), so that a caller holding
// the input in another form (a compressed activation) can write that layout directly and skip the
// reorder; 0 when the primitive reads NCHW or another layout. with_bias as for the call itself. fp32
// calls only (a bf16 call converts its input on the way in anyway).
int conv2d_backward_weight_input_block(const ConvShape& s, bool with_bias, ConvImpl impl = ConvImpl::Auto);
// conv2d_backward_weight with x already in the layout conv2d_backward_weight_input_block reported
// (non-zero). Bit-identical to conv2d_backward_weight on the NCHW x.
void conv2d_backward_weight_blocked_input(float* dw, float* db, const float* dy, const float* x_blocked,
                                          const ConvShape& s, ConvImpl impl = ConvImpl::Auto);

// conv2d_backward_weight under bf16 compute with x given as bf16 bits (round-to-nearest values, core/bf16.h)
// in `layout`: the kept bf16 copy of a bf16 run's input, read without widening it to f32 first (dy laid out as
// `act` says). The same result as conv2d_backward_weight(..., impl, BF16) on the widened x, bit for bit, in
// either layout.
void conv2d_backward_weight_bf16_input(float* dw, float* db, const float* dy, const uint16_t* x_bf16,
                                       const ConvShape& s, ConvImpl impl = ConvImpl::Auto,
                                       Layout layout = Layout::Nchw, Layout act = Layout::Nchw);

// conv2d_forward under bf16 compute with x given as bf16 bits in `layout`: a bf16 run's kept copy of the input,
// which the convolution then reads as it is (no reorder where the kernel computes on that layout, else a bf16 →
// bf16 one, half the bytes of the f32 → bf16 one it makes of an f32 x). The same result as conv2d_forward(...,
// impl, BF16) on the widened x, bit for bit, and on x itself for every normal value (tests/test_cpu_conv.cpp); a
// subnormal input is kept by the copy (core/bf16.h), where oneDNN's own conversion may flush it to zero.
// y is written as `act` says: channels-last where the kernel computes on that layout saves the transpose back.
void conv2d_forward_bf16_input(float* y, const uint16_t* x_bf16, const float* w, const float* b, const ConvShape& s,
                               ConvImpl impl = ConvImpl::Auto, Layout layout = Layout::Nchw,
                               Layout act = Layout::Nchw);
// Whether conv2d_forward under bf16 (with a bias or not, as with_bias says) computes on a channels-last input:
// then a bf16 copy of x in that layout is read with no reorder, where an (N, C, H, W) one is reordered (oneDNN
// picks the layout per kernel: its AMX kernels on 3x3 and strided layers took channels-last on an AMX Xeon, as
// their backward weights did, and the matmul routes (dense pointwise layers on every CPU) make their im2col from
// channels-last; dnnl-plain's pointwise layers compute on (N, C, H, W)). Only the forward is asked, with the f32 output layout `act` the call will
// write (the plan it builds is then the call's own). False in a minimal build.
bool conv2d_bf16_reads_channels_last(const ConvShape& s, bool with_bias, ConvImpl impl = ConvImpl::Auto,
                                     Layout act = Layout::Nchw);

// While one is alive on this thread, the backward passes (oneDNN's data and weight kernels, and the bf16
// backward-weights matmul) that read the output gradient at `dy` reorder it into their layout once and share
// that copy (a MemTag::Workspace buffer held
// until the scope ends), where each pass would otherwise make its own: one pass over dy fewer per
// convolution in backward. The caller keeps dy alive and unchanged for the scope's life. Results are the
// same bit for bit (a reorder is a copy). Per thread; an inner share hides an outer one until it ends.
class ConvGradShare {
 public:
  explicit ConvGradShare(const float* dy);
  ~ConvGradShare();
  ConvGradShare(const ConvGradShare&) = delete;
  ConvGradShare& operator=(const ConvGradShare&) = delete;
  struct Slot;
 private:
  std::unique_ptr<Slot> slot_;
};

// The executable spec: the same contracts, naive loops, double accumulation, single thread.
void conv2d_forward_ref(float* y, const float* x, const float* w, const float* b,
                        const ConvShape& s);
void conv2d_backward_data_ref(float* dx, const float* dy, const float* w, const ConvShape& s);
void conv2d_backward_weight_ref(float* dw, float* db, const float* dy, const float* x,
                                const ConvShape& s);

// Drops every cached oneDNN primitive (they are created on first use of a shape and kept).
void conv_clear_cache();

}  // namespace actlab::cpu
