// The fast CPU convolution path: oneDNN primitives (created once per shape, direction and
// implementation, then cached) with NCHW user memory reordered into the layout the primitive
// picked; an im2col + gemm candidate kept for comparison in fp32; and under bf16, dense pointwise layers' three
// passes and the backward weights of small maps as bf16 matmuls on channels-last operands, and on AMX CPUs the
// forward of 4x4 maps as one matmul too and the backward data of stride-1 layers as the forward of the flipped
// kernels. The reorders between f32 (N, C, H, W)
// and channels-last operands run actlab's own transposing kernels. The spec lives in conv_ref.cpp.
// Tested against it in tests/test_cpu_conv.cpp; the candidates are timed in bench/bench_conv.cpp.
#include "actlab/core/cpu/conv.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "actlab/core/allocator.h"
#include "actlab/core/bf16.h"
#include "actlab/core/cpu/dnnl_common.h"
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {

namespace {

struct ImplName { ConvImpl impl; const char* name; };
constexpr std::array<ImplName, 6> kImplNames{{{ConvImpl::Auto, "auto"},
                                              {ConvImpl::DnnlBlocked, "dnnl-blocked"},
                                              {ConvImpl::DnnlNhwc, "dnnl-nhwc"},
                                              {ConvImpl::DnnlPlain, "dnnl-plain"},
                                              {ConvImpl::DnnlWinograd, "dnnl-wino"},
                                              {ConvImpl::Im2colGemm, "im2col"}}};

}  // namespace

const char* conv_impl_name(ConvImpl impl) {
  for (const auto& e : kImplNames)
    if (e.impl == impl) return e.name;
  return "?";
}

ConvImpl conv_impl_from_name(const std::string& name) {
  std::string known;
  for (const auto& e : kImplNames) {
    if (name == e.name) return e.impl;
    known += std::string(known.empty() ? "" : ", ") + e.name;
  }
  ACTLAB_FAIL("unknown conv implementation '", name, "' (known: ", known, ")");
}

void check_conv_impl(ConvImpl impl, Precision compute) {
  ACTLAB_CHECK(compute == Precision::F32 || compute == Precision::BF16,
               "the CPU convolution computes in fp32 or bf16, not ", precision_name(compute));
  // oneDNN has no bf16 Winograd.
  ACTLAB_CHECK(compute == Precision::F32 || impl != ConvImpl::DnnlWinograd, "conv implementation ",
               conv_impl_name(impl), " has no bf16 path (auto, dnnl-blocked, dnnl-nhwc, dnnl-plain and im2col have)");
}

bool dnnl_runs_amx() {
  static const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  return amx;
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Direction { Forward, BackwardData, BackwardWeight };
const char* direction_name(Direction d) {
  switch (d) {
    case Direction::Forward: return "convolution_forward";
    case Direction::BackwardData: return "convolution_backward_data";
    case Direction::BackwardWeight: return "convolution_backward_weights";
  }
  return "?";
}

// The measured choice (bench/RESULTS_conv.md): oneDNN's blocked layouts (reorders included) beat
// plain NCHW (2.5-3x), channels-last and im2col + sgemm on the ResNet and MobileNet layers, and
// Winograd F(4x4,3x3) beats direct by 1.3-2x on 3x3 stride-1 layers with >= 64 channels in and out
// (relative error ~3e-6 vs 3e-7; slower than direct below 64 channels). Pointwise convs (1x1,
// stride 1, no pad) are one GEMM per image on NCHW, so plain memory wins there: no reorders.
bool winograd_pays(const ConvShape& s) {
  return s.groups == 1 && s.R == 3 && s.S == 3 && s.stride_h == 1 && s.stride_w == 1 &&
         s.pad_h <= 1 && s.pad_w <= 1 && s.C >= 64 && s.K >= 64 && s.C % 16 == 0 &&
         s.K % 16 == 0;
}
// 1x1, stride 1, no pad, one group: one GEMM per image on NCHW.
bool dense_pointwise(const ConvShape& s) {
  return s.R == 1 && s.S == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0 &&
         s.groups == 1;
}
// Where bf16 backward weights run faster as one matmul than as oneDNN's convolution kernel (the route is
// gemm_backward_weight_bf16 below), measured layer by layer at batch 128 on ResNet-20, ResNet-18 and
// MobileNetV2 on an AMX Xeon (bench/RESULTS_conv.md, "bf16 backward weights as one matmul"): strided 1x1
// projections; and on maps of at most 64 output positions, strided layers, pointwise layers and layers with
// 256 or more input channels (the measured wins had 256 and 512, the loss 64; 128 was not measured).
// oneDNN's kernel stayed faster on the 64-channel 8x8 layer, on pointwise layers at 16x16 and on every larger
// map, measured on (N, C, H, W) operands. Without AMX (avx512_bf16 kernels, measured on a Zen 5 EPYC,
// bench/RESULTS_conv.md, "bf16 backward weights as one matmul without AMX") the matmul won on every 4x4 map
// (ResNet-18's layer 4, 1.5-1.8x in alternated runs) and by less on the strided layers onto 8x8 maps (1.2x on
// ResNet-18's 3x3 one, 1.5-2x on ResNet-20's 1x1 projection, even on its 3x3 one); oneDNN's kernel won or tied on
// the unstrided 8x8 layers and on every 16x16 or larger map. On both, dense pointwise
// layers take the route at every size, as their forward and backward data do, so that a channels-last run needs no
// reorder there (resolve).
bool bf16_weight_gemm_pays(const ConvShape& s) {
  if (s.groups != 1) return false;
  if (dense_pointwise(s)) return true;
  const bool strided = s.stride_h > 1 || s.stride_w > 1;
  const int64_t positions = s.P() * s.Q();
  if (!dnnl_runs_amx()) return positions <= 16 || (positions <= 64 && strided);
  if (s.R * s.S == 1) return true;  // the strided 1x1 projections (see above)
  return positions <= 64 && (strided || s.C >= 256);
}

ConvImpl resolve(ConvImpl impl, const ConvShape& s, Precision compute, Direction dir) {
  check_conv_impl(impl, compute);
  if (compute == Precision::BF16) {
    // Measured (bench/RESULTS_conv.md, "bf16"): pointwise convs are fastest on plain NCHW in bf16 too (up to 2x
    // over blocked at 32x32), depthwise and 3x3 ones on blocked layouts (plain is 4x slower for depthwise).
    // im2col under bf16 is the matmul route of backward weights (one group only); its forward and backward
    // data, and a grouped layer's backward weights, run dnnl-blocked. Under Auto, pointwise layers run all three
    // passes as matmuls instead (bf16_forward_gemm_pays) and grouped ones dnnl-nhwc, so that every layer of
    // MobileNetV2 reads and writes channels-last and its activations stay so between layers (docs/precision.md):
    // its bf16 step became 1.33-1.41x as fast on an AMX Xeon (bench/RESULTS.md §7, "forty-fourth session") and
    // 1.4-1.5x on a Zen 5 without AMX (DIVISION@bf16's 1.2x; "forty-fifth session"), where dnnl-plain and
    // dnnl-blocked had cost it a reorder on each side of every layer. (Under Auto a dense pointwise layer never
    // resolves here: its three passes are matmuls. dnnl-plain stays its kernel for an explicit request.)
    if (dir == Direction::BackwardWeight && s.groups == 1 &&
        (impl == ConvImpl::Im2colGemm || (impl == ConvImpl::Auto && bf16_weight_gemm_pays(s))))
      return ConvImpl::Im2colGemm;
    if (impl == ConvImpl::Im2colGemm) return ConvImpl::DnnlBlocked;
    if (impl != ConvImpl::Auto) return impl;
    if (s.groups > 1) return ConvImpl::DnnlNhwc;  // depthwise (no AMX kernel either way)
    return dense_pointwise(s) ? ConvImpl::DnnlPlain : ConvImpl::DnnlBlocked;
  }
  if (impl != ConvImpl::Auto) return impl;
  if (winograd_pays(s)) return ConvImpl::DnnlWinograd;
  return dense_pointwise(s) ? ConvImpl::DnnlPlain : ConvImpl::DnnlBlocked;
}

// The two reorders of a bf16 step that actlab's own transposing kernels (core/cpu/kernels.h) make instead of
// oneDNN's: an f32 (N, C, H, W) operand into a channels-last bf16 one (an input, an output gradient; the weights
// of the matmul routes too, as (K, R, S, C)), and a channels-last f32 result back to (N, C, H, W) (an output, a
// gradient, the matmul route's weight gradient). On an AMX Xeon (ResNet-18, bf16, 2 threads) oneDNN's reorders
// of these kinds took 27 and 66 ms of a 550 ms step (DNNL_VERBOSE); the step with the kernels instead is in
// bench/RESULTS.md §7 ("forty-second session").
enum class FastReorder { None, NarrowToChannelsLast, ChannelsLastToNchw, Narrow };
FastReorder fast_reorder(const memory::desc& from, const memory::desc& to) {
  const memory::dims d = from.dims();
  if (d.size() != 4 || to.dims() != d) return FastReorder::None;
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  if (from == memory::desc(d, f32, Tag::nchw) && to == memory::desc(d, bf16, Tag::nhwc))
    return FastReorder::NarrowToChannelsLast;
  if (from == memory::desc(d, f32, Tag::nhwc) && to == memory::desc(d, f32, Tag::nchw))
    return FastReorder::ChannelsLastToNchw;
  if (from == memory::desc(d, f32, Tag::nhwc) && to == memory::desc(d, bf16, Tag::nhwc)) return FastReorder::Narrow;
  return FastReorder::None;
}

// One tensor argument of a primitive: as the user holds it and as the primitive wants it.
struct Port {
  memory::desc user_md, prim_md;
  bool reorder = false;
  FastReorder fast = FastReorder::None;  // the reorder is one of actlab's kernels (then no oneDNN one is made)
  dnnl::reorder to_prim, to_user;  // only the one matching the data flow is created
};

Port make_port(const memory::desc& user_md, const memory::desc& prim_md, bool is_output) {
  Port p;
  p.user_md = user_md;
  p.prim_md = prim_md;
  p.reorder = user_md != prim_md;
  p.fast = p.reorder ? (is_output ? fast_reorder(prim_md, user_md) : fast_reorder(user_md, prim_md)) : FastReorder::None;
  if (p.reorder && p.fast == FastReorder::None) {
    dnnl::engine& eng = dnnl_engine();
    if (is_output)
      p.to_user = dnnl::reorder(dnnl::reorder::primitive_desc(eng, prim_md, eng, user_md));
    else
      p.to_prim = dnnl::reorder(dnnl::reorder::primitive_desc(eng, user_md, eng, prim_md));
  }
  return p;
}

// A port's reorder in its direction (user -> primitive for an input, primitive -> user for an output): actlab's
// kernel where make_port chose one, else oneDNN's. Returns when the copy is written. Only for a port that
// reorders (p.reorder): the others have no reorder to run.
void run_port(const Port& p, const void* from, void* to) {
  ACTLAB_CHECK(p.reorder, "conv: run_port on a port whose layouts match (nothing to reorder)");
  const memory::dims d = p.user_md.dims();
  if (p.fast == FastReorder::NarrowToChannelsLast) {
    to_bf16_channels_last(static_cast<uint16_t*>(to), static_cast<const float*>(from), d[0], d[1], d[2] * d[3]);
  } else if (p.fast == FastReorder::ChannelsLastToNchw) {
    channels_last_to_nchw(static_cast<float*>(to), static_cast<const float*>(from), d[0], d[1], d[2] * d[3]);
  } else if (p.fast == FastReorder::Narrow) {
    to_bf16(static_cast<uint16_t*>(to), static_cast<const float*>(from), d[0] * d[1] * d[2] * d[3]);
  } else {
    dnnl::engine& eng = dnnl_engine();
    const bool input = static_cast<bool>(p.to_prim);
    memory src(input ? p.user_md : p.prim_md, eng, const_cast<void*>(from)), dst(input ? p.prim_md : p.user_md, eng, to);
    (input ? p.to_prim : p.to_user).execute(dnnl_stream(), src, dst);
    dnnl_stream().wait();
  }
}

// A ready-to-run primitive for one (shape, direction, implementation, bias?) plus its reorders.
// Forward: in0 = src, in1 = weights, out = dst. BackwardData: in0 = diff_dst, in1 = weights,
// out = diff_src. BackwardWeight: in0 = src, in1 = diff_dst, out = diff_weights.
struct Plan {
  dnnl::primitive prim;
  Port in0, in1, out;
  int in0_arg = 0, in1_arg = 0, out_arg = 0, bias_arg = 0;
  int grad_input = -1;  // which input is diff_dst (0 or 1; -1 forward), for ConvGradShare
  bool with_bias = false;
  memory::desc bias_md, scratchpad_md;
  std::string impl_info;  // oneDNN's kernel name, e.g. "jit:avx512_core"
};

// How the caller holds a convolution's src: f32 (in the call's activation layout), or bf16 bits, (N, C, H, W) or
// channels-last (Layout).
enum class UserSrc { F32, Bf16Nchw, Bf16Nhwc };
UserSrc bf16_user_src(Layout layout) { return layout == Layout::ChannelsLast ? UserSrc::Bf16Nhwc : UserSrc::Bf16Nchw; }
// Whether the src is held channels-last: a bf16 one in that layout, or an f32 one in a call whose f32 activations
// (x, y, dy, dx) are channels-last (nhwc).
bool src_is_nhwc(UserSrc user_src, bool nhwc) {
  return user_src == UserSrc::Bf16Nhwc || (user_src == UserSrc::F32 && nhwc);
}
memory::desc user_src_desc(const memory::dims& dims, UserSrc user_src, bool nhwc) {
  return memory::desc(dims, user_src == UserSrc::F32 ? memory::data_type::f32 : memory::data_type::bf16,
                      src_is_nhwc(user_src, nhwc) ? Tag::nhwc : Tag::nchw);
}
// The f32 activations' layout tag: channels-last (nhwc) or (N, C, H, W).
Tag act_tag_of(bool nhwc) { return nhwc ? Tag::nhwc : Tag::nchw; }

struct PlanKey {
  std::array<int64_t, 12> shape;
  Direction dir;
  ConvImpl impl;
  bool with_bias;
  Precision compute;
  UserSrc user_src;  // how the caller holds the src (forward, backward weight)
  bool nhwc;         // the caller's f32 activations are channels-last
  bool operator<(const PlanKey& o) const {
    return std::tie(shape, dir, impl, with_bias, compute, user_src, nhwc) <
           std::tie(o.shape, o.dir, o.impl, o.with_bias, o.compute, o.user_src, o.nhwc);
  }
};
std::array<int64_t, 12> shape_key(const ConvShape& s) {
  return {s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w, s.pad_h, s.pad_w, s.groups};
}

struct Descs {
  memory::desc src, wei, dst, bias, user_src, user_wei, user_dst;
  memory::dims strides, pad_l, pad_r;
  dnnl::algorithm alg;
};

// The primitive's data types: all f32, or under bf16 the operands the kernel multiplies in bf16 and what
// it writes in f32 (forward: src, wei -> dst; backward data: diff_dst, wei -> diff_src; backward weight:
// src, diff_dst -> diff_wei). The user's activations are f32 NCHW, or channels-last where nhwc says so (the src
// may be bf16, NCHW or channels-last: user_src); the reorders in and out convert.
Descs make_descs(const ConvShape& s, ConvImpl impl, Direction dir = Direction::Forward,
                 Precision compute = Precision::F32, UserSrc user_src = UserSrc::F32, bool nhwc = false) {
  const int64_t P = s.P(), Q = s.Q(), G = s.groups;
  const memory::dims src_dims{s.N, s.C, s.H, s.W}, dst_dims{s.N, s.K, P, Q};
  const memory::dims wei_dims = G > 1 ? memory::dims{G, s.K / G, s.C / G, s.R, s.S}
                                      : memory::dims{s.K, s.C, s.R, s.S};
  const Tag user_wei_tag = G > 1 ? Tag::goihw : Tag::oihw;
  const Tag act_tag = impl == ConvImpl::DnnlPlain ? Tag::nchw
                      : impl == ConvImpl::DnnlNhwc ? Tag::nhwc : Tag::any;
  const Tag wei_tag = impl == ConvImpl::DnnlPlain ? user_wei_tag : Tag::any;
  const auto f32 = memory::data_type::f32;
  const auto low = compute == Precision::BF16 ? memory::data_type::bf16 : f32;
  Descs d;
  d.src = memory::desc(src_dims, dir == Direction::BackwardData ? f32 : low, act_tag);
  d.dst = memory::desc(dst_dims, dir == Direction::Forward ? f32 : low, act_tag);
  d.wei = memory::desc(wei_dims, dir == Direction::BackwardWeight ? f32 : low, wei_tag);
  d.bias = memory::desc({s.K}, f32, Tag::x);
  d.user_src = user_src_desc(src_dims, user_src, nhwc);
  d.user_dst = memory::desc(dst_dims, f32, act_tag_of(nhwc));
  d.user_wei = memory::desc(wei_dims, f32, user_wei_tag);
  d.strides = {s.stride_h, s.stride_w};
  d.pad_l = {s.pad_h, s.pad_w};
  // Tight right padding (what the output size really uses), never negative.
  d.pad_r = {std::max<int64_t>(0, (P - 1) * s.stride_h + s.R - s.H - s.pad_h),
             std::max<int64_t>(0, (Q - 1) * s.stride_w + s.S - s.W - s.pad_w)};
  d.alg = impl == ConvImpl::DnnlWinograd ? dnnl::algorithm::convolution_winograd
                                         : dnnl::algorithm::convolution_direct;
  return d;
}

dnnl::convolution_forward::primitive_desc make_forward_pd(const Descs& d, bool with_bias,
                                                          const dnnl::primitive_attr& attr) {
  using F = dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  F::desc desc = with_bias ? F::desc(prop, d.alg, d.src, d.wei, d.bias, d.dst, d.strides, d.pad_l,
                                     d.pad_r)
                           : F::desc(prop, d.alg, d.src, d.wei, d.dst, d.strides, d.pad_l,
                                     d.pad_r);
  return F::primitive_desc(desc, attr, dnnl_engine());
}

std::unique_ptr<Plan> build_plan(const ConvShape& s, Direction dir, ConvImpl impl, bool with_bias,
                                 Precision compute, UserSrc user_src, bool nhwc) {
  const dnnl::primitive_attr attr = user_scratchpad_attr();
  if (impl == ConvImpl::DnnlWinograd) {
    try {  // Winograd exists only for some shapes; elsewhere use the direct blocked kernels
      make_forward_pd(make_descs(s, impl, Direction::Forward, compute), false, attr);
    } catch (const dnnl::error&) {
      impl = ConvImpl::DnnlBlocked;
    }
  }
  const Descs d = make_descs(s, impl, dir, compute, user_src, nhwc);
  // The backward primitives take a forward one as a hint: the forward of the same implementation and precision.
  const Descs fwd = make_descs(s, impl, Direction::Forward, compute);
  auto plan = std::make_unique<Plan>();
  plan->with_bias = with_bias;
  plan->bias_md = d.bias;
  if (dir == Direction::Forward) {
    auto pd = make_forward_pd(d, with_bias, attr);
    plan->prim = dnnl::convolution_forward(pd);
    plan->in0 = make_port(d.user_src, pd.src_desc(), false);
    plan->in1 = make_port(d.user_wei, pd.weights_desc(), false);
    plan->out = make_port(d.user_dst, pd.dst_desc(), true);
    plan->in0_arg = DNNL_ARG_SRC, plan->in1_arg = DNNL_ARG_WEIGHTS, plan->out_arg = DNNL_ARG_DST;
    plan->bias_arg = DNNL_ARG_BIAS;
    plan->scratchpad_md = pd.scratchpad_desc();
    plan->impl_info = pd.impl_info_str();
  } else if (dir == Direction::BackwardData) {
    auto hint = make_forward_pd(fwd, false, dnnl::primitive_attr());
    using B = dnnl::convolution_backward_data;
    B::primitive_desc pd(B::desc(d.alg, d.src, d.wei, d.dst, d.strides, d.pad_l, d.pad_r), attr,
                         dnnl_engine(), hint);
    plan->prim = B(pd);
    plan->in0 = make_port(d.user_dst, pd.diff_dst_desc(), false);
    plan->in1 = make_port(d.user_wei, pd.weights_desc(), false);
    plan->out = make_port(d.user_src, pd.diff_src_desc(), true);
    plan->in0_arg = DNNL_ARG_DIFF_DST, plan->in1_arg = DNNL_ARG_WEIGHTS;
    plan->out_arg = DNNL_ARG_DIFF_SRC;
    plan->grad_input = 0;
    plan->scratchpad_md = pd.scratchpad_desc();
    plan->impl_info = pd.impl_info_str();
  } else {
    auto hint = make_forward_pd(fwd, with_bias, dnnl::primitive_attr());
    using B = dnnl::convolution_backward_weights;
    B::desc desc = with_bias ? B::desc(d.alg, d.src, d.wei, d.bias, d.dst, d.strides, d.pad_l,
                                       d.pad_r)
                             : B::desc(d.alg, d.src, d.wei, d.dst, d.strides, d.pad_l, d.pad_r);
    B::primitive_desc pd(desc, attr, dnnl_engine(), hint);
    plan->prim = B(pd);
    plan->in0 = make_port(d.user_src, pd.src_desc(), false);
    plan->in1 = make_port(d.user_dst, pd.diff_dst_desc(), false);
    plan->out = make_port(d.user_wei, pd.diff_weights_desc(), true);
    plan->in0_arg = DNNL_ARG_SRC, plan->in1_arg = DNNL_ARG_DIFF_DST;
    plan->out_arg = DNNL_ARG_DIFF_WEIGHTS, plan->bias_arg = DNNL_ARG_DIFF_BIAS;
    plan->grad_input = 1;
    plan->scratchpad_md = pd.scratchpad_desc();
    plan->impl_info = pd.impl_info_str();
  }
  return plan;
}

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<PlanKey, std::unique_ptr<Plan>>& plan_cache() {
  static std::map<PlanKey, std::unique_ptr<Plan>> cache;
  return cache;
}

// Plans are created once and never move (unique_ptr), so the pointer stays valid until
// conv_clear_cache().
const Plan& get_plan(const ConvShape& s, Direction dir, ConvImpl impl, bool with_bias, Precision compute,
                     UserSrc user_src = UserSrc::F32, bool nhwc = false) {
  const PlanKey key{shape_key(s), dir, impl, with_bias, compute, user_src, nhwc};
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_plan(s, dir, impl, with_bias, compute, user_src, nhwc)).first;
  return *it->second;
}

}  // namespace

// The output gradient of the convolution whose backward passes run under a ConvGradShare: its user
// pointer and, once a pass has reordered it, that copy and its layout.
struct ConvGradShare::Slot {
  const void* user = nullptr;
  memory::desc prim_md;
  Buffer copy;
  Slot* outer = nullptr;  // the share this one hides until it ends
};

namespace {

thread_local ConvGradShare::Slot* t_grad_share = nullptr;

// The user's input `user` as the port's primitive memory: itself, or a reorder of it into a fresh Workspace
// buffer (kept in `buffers`). is_grad: the input is an output gradient, which a ConvGradShare for it reorders
// once for both backward passes (its copy is reused when the layout matches, else made and kept there).
memory bind_input(const Port& port, const void* user, bool is_grad, std::vector<Buffer>& buffers) {
  dnnl::engine& eng = dnnl_engine();
  memory user_mem(port.user_md, eng, const_cast<void*>(user));
  if (!port.reorder) return user_mem;
  ConvGradShare::Slot* share = is_grad && t_grad_share != nullptr && t_grad_share->user == user ? t_grad_share : nullptr;
  if (share != nullptr && share->copy.data() != nullptr && share->prim_md == port.prim_md)
    return memory(port.prim_md, eng, share->copy.data());
  Buffer fresh(port.prim_md.get_size(), MemTag::Workspace);
  memory prim_mem(port.prim_md, eng, fresh.data());
  run_port(port, user, fresh.data());
  if (share != nullptr) {
    share->prim_md = port.prim_md;
    share->copy = std::move(fresh);
  } else {
    buffers.push_back(std::move(fresh));
  }
  return prim_mem;
}

// Runs a plan on user pointers: reorders inputs into fresh Workspace buffers where the primitive
// wants another layout, executes, and reorders the output back. `bias` is an input (forward)
// or an output (backward weight); nullptr when the plan has none. in0_is_prim: in0 is already in the
// primitive's layout (no reorder). Under a ConvGradShare for this diff_dst, its reorder is made once and
// kept in the share's slot for the other backward pass. in0_is_grad: in0 is an output gradient although the
// plan is a forward one (bf16 backward data as a forward convolution), so it shares that reorder too.
void run_plan(const Plan& plan, const void* in0, const float* in1, float* out, float* bias,
              bool in0_is_prim = false, bool in0_is_grad = false) {
  dnnl::engine& eng = dnnl_engine();
  dnnl::stream& strm = dnnl_stream();
  std::vector<Buffer> buffers;  // reorder targets and the scratchpad: alive until the end
  buffers.reserve(4);
  std::unordered_map<int, memory> args;
  if (in0_is_prim) {
    args.emplace(plan.in0_arg, memory(plan.in0.prim_md, eng, const_cast<void*>(in0)));
  } else {
    args.emplace(plan.in0_arg, bind_input(plan.in0, in0, plan.grad_input == 0 || in0_is_grad, buffers));
  }
  args.emplace(plan.in1_arg, bind_input(plan.in1, in1, plan.grad_input == 1, buffers));
  memory out_user(plan.out.user_md, eng, out);
  memory out_prim = out_user;
  if (plan.out.reorder) {
    const Buffer& buf = buffers.emplace_back(plan.out.prim_md.get_size(), MemTag::Workspace);
    out_prim = memory(plan.out.prim_md, eng, buf.data());
  }
  args.emplace(plan.out_arg, out_prim);
  if (plan.with_bias) args.emplace(plan.bias_arg, memory(plan.bias_md, eng, bias));
  bind_scratchpad(args, plan.scratchpad_md, buffers);
  plan.prim.execute(strm, args);
  strm.wait();
  if (plan.out.reorder) run_port(plan.out, out_prim.get_data_handle(), out);
}

void run_dnnl(Direction dir, ConvImpl impl, const ConvShape& s, const void* in0, const float* in1, float* out,
              float* bias, Precision compute, bool in0_is_prim = false, UserSrc user_src = UserSrc::F32,
              bool in0_is_grad = false, bool nhwc = false) {
  try {
    run_plan(get_plan(s, dir, impl, bias != nullptr, compute, user_src, nhwc), in0, in1, out, bias, in0_is_prim,
             in0_is_grad);
  } catch (const dnnl::error& e) {
    ACTLAB_FAIL("oneDNN ", direction_name(dir), " (", conv_impl_name(impl), ", ", precision_name(compute),
                ") failed for ", s.str(), ": ", e.what(), " (status ", static_cast<int>(e.status), ")");
  }
}

// ---- im2col + gemm in fp32 (a candidate kept for comparison; one image at a time)

// col (C*R*S, P*Q) of one image x (C,H,W); zeros where the window leaves the input.
void im2col(float* col, const float* x, const ConvShape& s) {
  const int64_t P = s.P(), Q = s.Q(), rows = s.C * s.R * s.S;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t c = row / (s.R * s.S), r = row / s.S % s.R, t = row % s.S;
    float* dst = col + row * P * Q;
    for (int64_t p = 0; p < P; ++p) {
      const int64_t h = p * s.stride_h - s.pad_h + r;
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t w = q * s.stride_w - s.pad_w + t;
        dst[p * Q + q] = (h >= 0 && h < s.H && w >= 0 && w < s.W) ? x[(c * s.H + h) * s.W + w]
                                                                   : 0.f;
      }
    }
  }
}

// dx (C,H,W) += col (C*R*S, P*Q) scattered back; one thread per channel, so no write races.
void col2im_add(float* dx, const float* col, const ConvShape& s) {
  const int64_t P = s.P(), Q = s.Q();
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < s.C; ++c)
    for (int64_t r = 0; r < s.R; ++r)
      for (int64_t t = 0; t < s.S; ++t) {
        const float* src = col + ((c * s.R + r) * s.S + t) * P * Q;
        for (int64_t p = 0; p < P; ++p) {
          const int64_t h = p * s.stride_h - s.pad_h + r;
          if (h < 0 || h >= s.H) continue;
          for (int64_t q = 0; q < Q; ++q) {
            const int64_t w = q * s.stride_w - s.pad_w + t;
            if (w >= 0 && w < s.W) dx[(c * s.H + h) * s.W + w] += src[p * Q + q];
          }
        }
      }
}

bool is_pointwise(const ConvShape& s) {  // 1x1, stride 1, no pad: the image is its own col
  return s.R == 1 && s.S == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 &&
         s.pad_w == 0;
}

void im2col_forward(float* y, const float* x, const float* w, const float* b,
                    const ConvShape& s) {
  const int64_t PQ = s.P() * s.Q(), G = s.groups, Kg = s.K / G, CgRS = s.C / G * s.R * s.S;
  Buffer col_buf(is_pointwise(s) ? 0 : sizeof(float) * s.C * s.R * s.S * PQ, MemTag::Workspace);
  for (int64_t n = 0; n < s.N; ++n) {
    const float* xn = x + n * s.C * s.H * s.W;
    const float* col = xn;
    if (!is_pointwise(s)) im2col(col_buf.as<float>(), xn, s), col = col_buf.as<float>();
    float* yn = y + n * s.K * PQ;
    for (int64_t g = 0; g < G; ++g)
      gemm(false, false, Kg, PQ, CgRS, 1.f, w + g * Kg * CgRS, CgRS, col + g * CgRS * PQ, PQ,
           0.f, yn + g * Kg * PQ, PQ);
    if (b) {
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < s.K; ++k)
        for (int64_t i = 0; i < PQ; ++i) yn[k * PQ + i] += b[k];
    }
  }
}

void im2col_backward_data(float* dx, const float* dy, const float* w, const ConvShape& s) {
  const int64_t PQ = s.P() * s.Q(), G = s.groups, Kg = s.K / G, CgRS = s.C / G * s.R * s.S;
  const bool pointwise = is_pointwise(s);
  Buffer col_buf(pointwise ? 0 : sizeof(float) * s.C * s.R * s.S * PQ, MemTag::Workspace);
  for (int64_t n = 0; n < s.N; ++n) {
    float* dxn = dx + n * s.C * s.H * s.W;
    float* col = pointwise ? dxn : col_buf.as<float>();
    for (int64_t g = 0; g < G; ++g)
      gemm(true, false, CgRS, PQ, Kg, 1.f, w + g * Kg * CgRS, CgRS, dy + (n * s.K + g * Kg) * PQ,
           PQ, 0.f, col + g * CgRS * PQ, PQ);
    if (!pointwise) {
      std::memset(dxn, 0, sizeof(float) * s.C * s.H * s.W);
      col2im_add(dxn, col, s);
    }
  }
}

void im2col_backward_weight(float* dw, float* db, const float* dy, const float* x,
                            const ConvShape& s) {
  const int64_t PQ = s.P() * s.Q(), G = s.groups, Kg = s.K / G, CgRS = s.C / G * s.R * s.S;
  Buffer col_buf(is_pointwise(s) ? 0 : sizeof(float) * s.C * s.R * s.S * PQ, MemTag::Workspace);
  for (int64_t n = 0; n < s.N; ++n) {
    const float* xn = x + n * s.C * s.H * s.W;
    const float* col = xn;
    if (!is_pointwise(s)) im2col(col_buf.as<float>(), xn, s), col = col_buf.as<float>();
    for (int64_t g = 0; g < G; ++g)
      gemm(false, true, Kg, CgRS, PQ, 1.f, dy + (n * s.K + g * Kg) * PQ, PQ, col + g * CgRS * PQ,
           PQ, n == 0 ? 0.f : 1.f, dw + g * Kg * CgRS, CgRS);
  }
  if (db) {
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < s.K; ++k) {
      double acc = 0.0;
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t i = 0; i < PQ; ++i) acc += dy[(n * s.K + k) * PQ + i];
      db[k] = static_cast<float>(acc);
    }
  }
}

// ---- bf16 backward weights as one matmul
// oneDNN 2.6's bf16 backward-weights kernels are slow where the maps are small: on an AMX Xeon, ResNet-18's
// 512-channel 4x4 layers ran at 120-150 GF/s and its strided 1x1 projections under 100, against 700-740 for the
// forward of the same layers and 570-920 through this route (bench/RESULTS_conv.md, "bf16 backward weights as
// one matmul"). dW is one product over the N·P·Q output positions: with dy channels-last (rows (n, p, q) of
// K values) and col the input window of each output position (rows of R·S·C values, the im2col of the
// channels-last input; for a 1x1 layer the input at the positions it reads), dW as (K, R·S·C) = dyᵀ·col,
// reordered into (K, C, R, S). dy's channels-last bf16 copy goes through the ConvGradShare, so backward data
// reuses it where its kernel reads that layout (oneDNN's AMX kernels on 3x3 and strided layers, and the matmul
// forward that a stride-1 layer's backward data runs as: on AMX, and for dense pointwise layers on every CPU;
// without AMX oneDNN's backward data of a strided layer reads dy channel-blocked and converts it again).

// A 1x1 layer without padding reads the input at positions (p·stride, q·stride) only: channels-last, those
// positions are its col, which one reorder of a strided view of the input makes (no im2col pass, and a
// stride-2 layer converts a quarter of the input). oneDNN takes the view only when its rows and columns stay
// inside the plane (stride·P <= H, stride·Q <= W: even maps at stride 2); the others take im2col.
bool subsampled_pointwise(const ConvShape& s) {
  return s.R == 1 && s.S == 1 && s.pad_h == 0 && s.pad_w == 0 && s.P() * s.stride_h <= s.H && s.Q() * s.stride_w <= s.W;
}

struct GemmWeightPlan {
  Port x;   // the user's input (f32 NCHW, or bf16 bits NCHW or NHWC) -> bf16 NHWC (1x1 without padding: the
            // positions read)
  Port dy;  // the user's f32 output gradient (NCHW or channels-last) -> bf16 NHWC
  Port dw;  // the product's (K, R, S, C) f32 -> the user's (K, C, R, S)
};

std::map<PlanKey, std::unique_ptr<GemmWeightPlan>>& gemm_weight_cache() {
  static std::map<PlanKey, std::unique_ptr<GemmWeightPlan>> cache;
  return cache;
}

// The x port of the matmul routes: the user's input -> bf16 channels-last, or for a 1x1 layer without padding
// the positions it reads (a strided view of the input: col itself).
Port gemm_input_port(const ConvShape& s, UserSrc user_src, bool nhwc) {
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  if (subsampled_pointwise(s)) {
    const memory::dims col_dims{s.N, s.C, s.P(), s.Q()};
    const memory::dims strides = src_is_nhwc(user_src, nhwc)
                                     ? memory::dims{s.H * s.W * s.C, 1, s.stride_h * s.W * s.C, s.stride_w * s.C}
                                     : memory::dims{s.C * s.H * s.W, s.H * s.W, s.stride_h * s.W, s.stride_w};
    return make_port(memory::desc(col_dims, user_src == UserSrc::F32 ? f32 : bf16, strides),
                     memory::desc(col_dims, bf16, Tag::nhwc), false);
  }
  const memory::dims x_dims{s.N, s.C, s.H, s.W};
  return make_port(user_src_desc(x_dims, user_src, nhwc), memory::desc(x_dims, bf16, Tag::nhwc), false);
}

const GemmWeightPlan& get_gemm_weight_plan(const ConvShape& s, UserSrc user_src, bool nhwc) {
  const PlanKey key{shape_key(s), Direction::BackwardWeight, ConvImpl::Im2colGemm, false, Precision::BF16, user_src,
                    nhwc};
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& cache = gemm_weight_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
    const memory::dims dy_dims{s.N, s.K, s.P(), s.Q()}, w_dims{s.K, s.C, s.R, s.S};
    auto plan = std::make_unique<GemmWeightPlan>();
    plan->x = gemm_input_port(s, user_src, nhwc);
    plan->dy = make_port(memory::desc(dy_dims, f32, act_tag_of(nhwc)), memory::desc(dy_dims, bf16, Tag::nhwc), false);
    plan->dw = make_port(memory::desc(w_dims, f32, Tag::oihw),
                         memory::desc(w_dims, f32, memory::dims{s.R * s.S * s.C, 1, s.S * s.C, s.C}), true);
    it = cache.emplace(key, std::move(plan)).first;
  }
  return *it->second;
}

// col (N·P·Q, R·S·C) bf16 of x (N, H, W, C) bf16: row (n, p, q) holds the input window of output (p, q) of
// image n, (r, s, c) in order, zeros where the window leaves the input.
void im2col_nhwc(uint16_t* col, const uint16_t* x, const ConvShape& s) {
  const int64_t P = s.P(), Q = s.Q(), C = s.C, RSC = s.R * s.S * s.C;
  const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(C);
#pragma omp parallel for schedule(static)
  for (int64_t np = 0; np < s.N * P; ++np) {
    const int64_t n = np / P, p = np % P;
    for (int64_t q = 0; q < Q; ++q) {
      uint16_t* row = col + (np * Q + q) * RSC;
      for (int64_t r = 0; r < s.R; ++r) {
        const int64_t h = p * s.stride_h - s.pad_h + r;
        for (int64_t t = 0; t < s.S; ++t) {
          const int64_t w = q * s.stride_w - s.pad_w + t;
          uint16_t* dst = row + (r * s.S + t) * C;
          if (h < 0 || h >= s.H || w < 0 || w >= s.W)
            std::memset(dst, 0, bytes);
          else
            std::memcpy(dst, x + ((n * s.H + h) * s.W + w) * C, bytes);
        }
      }
    }
  }
}

// db[k] = the sum of column k of m (rows, K) bf16, in double: the bias gradient from the rounded dy, as the
// reference computes it on the rounded operands.
void column_sums_bf16(float* db, const uint16_t* m, int64_t rows, int64_t K) {
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static)
  for (int64_t k0 = 0; k0 < K; k0 += kCols) {
    const int64_t k1 = std::min(K, k0 + kCols);
    double acc[kCols] = {};
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = k0; k < k1; ++k) acc[k - k0] += bf16_to_float(m[i * K + k]);
    for (int64_t k = k0; k < k1; ++k) db[k] = static_cast<float>(acc[k - k0]);
  }
}

// The col operand of the matmul routes (N·P·Q, R·S·C) bf16: x's channels-last copy through the port, then its
// im2col (kept in `buffers`; the copy is freed once read), or for a 1x1 layer without padding that copy itself.
// x_is_grad: x is an output gradient, whose copy a ConvGradShare may hold.
const uint16_t* gemm_col(const Port& port, const void* x, const ConvShape& s, bool x_is_grad,
                         std::vector<Buffer>& buffers) {
  if (subsampled_pointwise(s))
    return static_cast<const uint16_t*>(bind_input(port, x, x_is_grad, buffers).get_data_handle());
  std::vector<Buffer> x_buffers;
  const auto* xs = static_cast<const uint16_t*>(bind_input(port, x, x_is_grad, x_buffers).get_data_handle());
  const Buffer& col = buffers.emplace_back(sizeof(uint16_t) * s.N * s.P() * s.Q() * s.R * s.S * s.C, MemTag::Workspace);
  im2col_nhwc(col.as<uint16_t>(), xs, s);
  return col.as<uint16_t>();
}

void gemm_backward_weight_bf16(float* dw, float* db, const float* dy, const void* x, const ConvShape& s,
                               UserSrc user_src, bool nhwc) {
  try {
    const GemmWeightPlan& plan = get_gemm_weight_plan(s, user_src, nhwc);
    std::vector<Buffer> buffers;  // dy's reorder, col and the product: alive until the end
    buffers.reserve(3);
    const uint16_t* col = gemm_col(plan.x, x, s, false, buffers);
    const memory dy_nhwc = bind_input(plan.dy, dy, true, buffers);
    const auto* dys = static_cast<const uint16_t*>(dy_nhwc.get_data_handle());
    const int64_t rows = s.N * s.P() * s.Q(), RSC = s.R * s.S * s.C;
    float* product = dw;
    if (plan.dw.reorder) product = buffers.emplace_back(sizeof(float) * s.K * RSC, MemTag::Workspace).as<float>();
    gemm_bf16_bits(true, false, s.K, RSC, rows, dys, col, product);
    if (plan.dw.reorder) run_port(plan.dw, product, dw);
    if (db) column_sums_bf16(db, dys, rows, s.K);
  } catch (const dnnl::error& e) {
    ACTLAB_FAIL("oneDNN backward weights as a bf16 matmul failed for ", s.str(), ": ", e.what(), " (status ",
                static_cast<int>(e.status), ")");
  }
}

// ---- bf16 forward of 4x4 maps (and of dense pointwise layers) as one matmul
// oneDNN 2.6's AMX forward kernel tiles a layer's output by rows of one image, so a 4x4 map gives its tiles four
// rows: ResNet-18's 512-channel 3x3 layers on 4x4 maps ran at 0.9 TFLOP/s where the same work on 8x8 maps ran at
// 3.4 (DNNL_VERBOSE on an AMX Xeon, bench/RESULTS.md §7, "forty-second session"). As one matmul over the batch the
// rows are all N·P·Q output positions: y (rows, K) = col (rows, R·S·C) · Wᵀ, W as (K, R·S·C) in (k, r, s, c)
// order, col the im2col of the channels-last input (as in gemm_backward_weight_bf16). Without AMX oneDNN's
// kernel was faster on ResNet-18's unstrided 512-channel 4x4 layer (the matmul about 10 % faster on its strided one)
// (bench/RESULTS_conv.md, "bf16 backward weights as one matmul without AMX"), so the route stays AMX-only.
// Dense pointwise layers on every CPU: col is the channels-last input itself, and the matmul reads and writes
// channels-last, where dnnl-plain's kernel computes on (N, C, H, W) (resolve).
bool bf16_forward_gemm_pays(const ConvShape& s) {
  return s.groups == 1 && (dense_pointwise(s) || (dnnl_runs_amx() && s.R * s.S > 1 && s.P() * s.Q() <= 16));
}

struct GemmForwardPlan {
  Port x;  // gemm_input_port
  Port w;  // the user's f32 (K, C, R, S) -> bf16 (K, R, S, C)
  Port y;  // the product's channels-last f32 (N, K, P, Q) -> the user's (N, K, P, Q) (none if channels-last too)
};

std::map<PlanKey, std::unique_ptr<GemmForwardPlan>>& gemm_forward_cache() {
  static std::map<PlanKey, std::unique_ptr<GemmForwardPlan>> cache;
  return cache;
}

const GemmForwardPlan& get_gemm_forward_plan(const ConvShape& s, UserSrc user_src, bool nhwc) {
  const PlanKey key{shape_key(s), Direction::Forward, ConvImpl::Im2colGemm, false, Precision::BF16, user_src, nhwc};
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& cache = gemm_forward_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
    const memory::dims y_dims{s.N, s.K, s.P(), s.Q()}, w_dims{s.K, s.C, s.R, s.S};
    auto plan = std::make_unique<GemmForwardPlan>();
    plan->x = gemm_input_port(s, user_src, nhwc);
    plan->w = make_port(memory::desc(w_dims, f32, Tag::oihw), memory::desc(w_dims, bf16, Tag::ohwi), false);
    plan->y = make_port(memory::desc(y_dims, f32, act_tag_of(nhwc)), memory::desc(y_dims, f32, Tag::nhwc), true);
    it = cache.emplace(key, std::move(plan)).first;
  }
  return *it->second;
}

// x_is_grad: x is an output gradient (backward data as a forward), whose reorder a ConvGradShare shares.
void gemm_forward_bf16(float* y, const void* x, const float* w, const float* b, const ConvShape& s, UserSrc user_src,
                       bool x_is_grad, bool nhwc) {
  try {
    const GemmForwardPlan& plan = get_gemm_forward_plan(s, user_src, nhwc);
    std::vector<Buffer> buffers;  // the weights' and col's copies and the product: alive until the end
    buffers.reserve(3);
    const uint16_t* col = gemm_col(plan.x, x, s, x_is_grad, buffers);
    const memory w_t = bind_input(plan.w, w, false, buffers);
    const int64_t rows = s.N * s.P() * s.Q(), RSC = s.R * s.S * s.C, K = s.K;
    // Where y is channels-last (or that and (N, K, P, Q) are one layout: P·Q = 1 or K = 1) the product is y itself.
    float* product = plan.y.reorder ? buffers.emplace_back(sizeof(float) * rows * K, MemTag::Workspace).as<float>() : y;
    gemm_bf16_bits(false, true, rows, K, RSC, col, static_cast<const uint16_t*>(w_t.get_data_handle()), product);
    if (b) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < K; ++k) product[i * K + k] += b[k];
    }
    if (plan.y.reorder) run_port(plan.y, product, y);
  } catch (const dnnl::error& e) {
    ACTLAB_FAIL("oneDNN forward as a bf16 matmul failed for ", s.str(), ": ", e.what(), " (status ",
                static_cast<int>(e.status), ")");
  }
}

// The bf16 forward: one matmul on dense pointwise layers and, on AMX, 4x4 maps (Auto: bf16_forward_gemm_pays) and
// wherever im2col is asked for (one group), else oneDNN's kernel of the resolved implementation (a grouped im2col
// request: dnnl-blocked).
bool bf16_forward_is_gemm(const ConvShape& s, ConvImpl impl) {
  return (impl == ConvImpl::Auto && bf16_forward_gemm_pays(s)) || (impl == ConvImpl::Im2colGemm && s.groups == 1);
}
void forward_bf16(float* y, const void* x, const float* w, const float* b, const ConvShape& s, ConvImpl impl,
                  UserSrc user_src, bool x_is_grad, bool nhwc) {
  if (bf16_forward_is_gemm(s, impl)) return gemm_forward_bf16(y, x, w, b, s, user_src, x_is_grad, nhwc);
  run_dnnl(Direction::Forward, resolve(impl, s, Precision::BF16, Direction::Forward), s, x, w, y,
           const_cast<float*>(b), Precision::BF16, false, user_src, x_is_grad, nhwc);
}

// Channels-last f32 activations are a bf16 layout: the fp32 kernels compute on (N, C, H, W).
bool channels_last_act(Layout act, Precision compute, const char* op) {
  ACTLAB_CHECK(act == Layout::Nchw || compute == Precision::BF16, op,
               ": channels-last f32 activations need bf16 compute, got ", precision_name(compute));
  return act == Layout::ChannelsLast;
}

}  // namespace

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvShape& s,
                    ConvImpl impl, Precision compute, Layout act) {
  check_conv_shape(s);
  check_conv_impl(impl, compute);
  const bool nhwc = channels_last_act(act, compute, "conv2d_forward");
  if (compute == Precision::BF16) return forward_bf16(y, x, w, b, s, impl, UserSrc::F32, false, nhwc);
  impl = resolve(impl, s, compute, Direction::Forward);
  if (impl == ConvImpl::Im2colGemm) return im2col_forward(y, x, w, b, s);
  run_dnnl(Direction::Forward, impl, s, x, w, y, const_cast<float*>(b), compute);
}

void conv2d_forward_bf16_input(float* y, const uint16_t* x_bf16, const float* w, const float* b, const ConvShape& s,
                               ConvImpl impl, Layout layout, Layout act) {
  check_conv_shape(s);
  check_conv_impl(impl, Precision::BF16);
  forward_bf16(y, x_bf16, w, b, s, impl, bf16_user_src(layout), false, act == Layout::ChannelsLast);
}

bool conv2d_bf16_reads_channels_last(const ConvShape& s, bool with_bias, ConvImpl impl, Layout act) {
  check_conv_shape(s);
  if (bf16_forward_is_gemm(s, impl)) return true;  // the matmul route's col is made from channels-last
  impl = resolve(impl, s, Precision::BF16, Direction::Forward);
  if (impl == ConvImpl::DnnlPlain) return false;  // computes on (N, C, H, W) by construction
  try {
    // The plan a channels-last input would run: no reorder of the src means the kernel reads that layout.
    return !get_plan(s, Direction::Forward, impl, with_bias, Precision::BF16, UserSrc::Bf16Nhwc,
                     act == Layout::ChannelsLast)
                .in0.reorder;
  } catch (const dnnl::error&) {
    return false;  // the call itself will report it
  }
}

bool conv2d_backward_data_as_forward(const ConvShape& s, ConvImpl impl, Precision compute) {
  check_conv_shape(s);
  if (compute != Precision::BF16 || s.groups != 1 || s.stride_h != 1 || s.stride_w != 1 || s.pad_h > s.R - 1 ||
      s.pad_w > s.S - 1)
    return false;
  // Auto: on AMX, where oneDNN's backward-data kernel lost to its forward; elsewhere on dense pointwise layers only,
  // so that their three passes read channels-last (bf16_forward_gemm_pays), where oneDNN's kernel stays faster on
  // 3x3 layers (bench/RESULTS_conv.md, "bf16 backward weights as one matmul without AMX").
  return impl == ConvImpl::Im2colGemm || (impl == ConvImpl::Auto && (dnnl_runs_amx() || dense_pointwise(s)));
}

void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvShape& s,
                          ConvImpl impl, Precision compute, Layout act) {
  check_conv_shape(s);
  const bool nhwc = channels_last_act(act, compute, "conv2d_backward_data");
  if (conv2d_backward_data_as_forward(s, impl, compute)) {
    // dx = the forward convolution of dy with w's kernels flipped and its in/out channels swapped, padded by
    // R - 1 - pad: each input position gathers the output positions its window reached. The flip is one pass
    // over the weights (2.4 M floats on ResNet-18's 512-channel layers, against their 4x4 maps' 1 M of dy).
    ConvShape t = s;
    t.C = s.K, t.H = s.P(), t.W = s.Q(), t.K = s.C, t.pad_h = s.R - 1 - s.pad_h, t.pad_w = s.S - 1 - s.pad_w;
    Buffer flipped(sizeof(float) * static_cast<size_t>(s.K * s.C * s.R * s.S), MemTag::Workspace);
    float* wt = flipped.as<float>();
    const int64_t RS = s.R * s.S;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t k = 0; k < s.K; ++k)
        for (int64_t i = 0; i < RS; ++i) wt[(c * s.K + k) * RS + (RS - 1 - i)] = w[(k * s.C + c) * RS + i];
    forward_bf16(dx, dy, wt, nullptr, t, impl, UserSrc::F32, true, nhwc);
    return;
  }
  impl = resolve(impl, s, compute, Direction::BackwardData);
  // A bf16 backward data resolves to im2col only where asked for a layer the flipped forward does not take
  // (strided or grouped); it is the fp32 loop, (N, C, H, W) only.
  if (impl == ConvImpl::Im2colGemm && !nhwc) return im2col_backward_data(dx, dy, w, s);
  if (impl == ConvImpl::Im2colGemm) impl = ConvImpl::DnnlBlocked;
  run_dnnl(Direction::BackwardData, impl, s, dy, w, dx, nullptr, compute, false, UserSrc::F32, false, nhwc);
}

void conv2d_backward_weight(float* dw, float* db, const float* dy, const float* x,
                            const ConvShape& s, ConvImpl impl, Precision compute, Layout act) {
  check_conv_shape(s);
  const bool nhwc = channels_last_act(act, compute, "conv2d_backward_weight");
  impl = resolve(impl, s, compute, Direction::BackwardWeight);
  if (impl == ConvImpl::Im2colGemm && compute == Precision::BF16)
    return gemm_backward_weight_bf16(dw, db, dy, x, s, UserSrc::F32, nhwc);
  if (impl == ConvImpl::Im2colGemm) return im2col_backward_weight(dw, db, dy, x, s);
  run_dnnl(Direction::BackwardWeight, impl, s, x, dy, dw, db, compute, false, UserSrc::F32, false, nhwc);
}

ConvImpl conv2d_backward_weight_impl(const ConvShape& s, ConvImpl impl, Precision compute) {
  check_conv_shape(s);
  return resolve(impl, s, compute, Direction::BackwardWeight);
}

// The channel block of a plan's input layout: 16 for aBcd16b with whole blocks, else 0 (with C % 16 != 0
// oneDNN pads the last block with zero channels, a layout the callers do not write).
int input_channel_block(const Plan& plan, const ConvShape& s) {
  const memory::desc blocked({s.N, s.C, s.H, s.W}, memory::data_type::f32, Tag::aBcd16b);
  return s.C % 16 == 0 && plan.in0.prim_md == blocked ? 16 : 0;
}

int conv2d_backward_weight_input_block(const ConvShape& s, bool with_bias, ConvImpl impl) {
  check_conv_shape(s);
  impl = resolve(impl, s, Precision::F32, Direction::BackwardWeight);
  // Grouped and depthwise convolutions too (MobileNetV2's): oneDNN's backward-weights kernels read them on
  // aBcd16b as well, and the blocked input gives the NCHW call's bits (tests/test_cpu_conv.cpp).
  if (impl == ConvImpl::Im2colGemm) return 0;
  try {
    return input_channel_block(get_plan(s, Direction::BackwardWeight, impl, with_bias, Precision::F32), s);
  } catch (const dnnl::error&) {
    return 0;  // the call itself will report it
  }
}

void conv2d_backward_weight_blocked_input(float* dw, float* db, const float* dy, const float* x_blocked,
                                          const ConvShape& s, ConvImpl impl) {
  ACTLAB_CHECK(conv2d_backward_weight_input_block(s, db != nullptr, impl) == 16,
               "conv2d_backward_weight_blocked_input: the primitive for ", s.str(),
               " does not take a channel-blocked input");
  run_dnnl(Direction::BackwardWeight, resolve(impl, s, Precision::F32, Direction::BackwardWeight), s, x_blocked, dy, dw,
           db, Precision::F32, true);
}

void conv2d_backward_weight_bf16_input(float* dw, float* db, const float* dy, const uint16_t* x_bf16,
                                       const ConvShape& s, ConvImpl impl, Layout layout, Layout act) {
  check_conv_shape(s);
  const bool nhwc = act == Layout::ChannelsLast;
  impl = resolve(impl, s, Precision::BF16, Direction::BackwardWeight);
  if (impl == ConvImpl::Im2colGemm)
    return gemm_backward_weight_bf16(dw, db, dy, x_bf16, s, bf16_user_src(layout), nhwc);
  run_dnnl(Direction::BackwardWeight, impl, s, x_bf16, dy, dw, db, Precision::BF16, false, bf16_user_src(layout), false,
           nhwc);
}

ConvGradShare::ConvGradShare(const float* dy) : slot_(std::make_unique<Slot>()) {
  slot_->user = dy;
  slot_->outer = t_grad_share;
  t_grad_share = slot_.get();
}

ConvGradShare::~ConvGradShare() { t_grad_share = slot_->outer; }

void conv_clear_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  plan_cache().clear();
  gemm_weight_cache().clear();
  gemm_forward_cache().clear();
}

}  // namespace actlab::cpu
