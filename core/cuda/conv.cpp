// cuDNN convolutions behind core/cuda/conv.h: RAII descriptors, a plan cache keyed by (device, shape,
// math options), algorithm selection once per plan and direction (cuDNN's heuristic ranking, or timing
// every algorithm in benchmark mode), and the forward / backward-data / backward-filter / bias calls.
// Uses cuDNN's convolution API (cudnnConvolution*; deprecated in cuDNN 9 in favour of the graph API but
// still shipped and supported there). Tested in tests/test_cuda_ops.cpp.
#include "actlab/core/cuda/conv.h"

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/lowp.h"

namespace actlab::cuda {

MathOptions& math_options() {
  static MathOptions options;
  return options;
}

#if defined(ACTLAB_WITH_CUDNN)
namespace {

// One cuDNN descriptor, destroyed with its owner.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { ACTLAB_CUDNN_CHECK(Create(&desc_)); }
  ~Descriptor() { (void)Destroy(desc_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return desc_; }
 private:
  T desc_{};
};
using TensorDesc = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

int as_int(int64_t v, const char* what, const cpu::ConvShape& s) {
  ACTLAB_CHECK(v >= 0 && v <= INT_MAX, "conv2d on CUDA: ", what, " ", v, " does not fit cuDNN's int sizes (", s.str(),
               ")");
  return static_cast<int>(v);
}

void set_nchw(const TensorDesc& d, int64_t n, int64_t c, int64_t h, int64_t w, const cpu::ConvShape& s,
              cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  ACTLAB_CHECK(n * c * h * w <= INT_MAX, "conv2d on CUDA: a tensor of ", n * c * h * w,
               " elements exceeds cuDNN's 2^31 limit (", s.str(), "); use a smaller batch");
  ACTLAB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.get(), CUDNN_TENSOR_NCHW, type, as_int(n, "N", s),
                                                as_int(c, "C", s), as_int(h, "H", s), as_int(w, "W", s)));
}

// The storage type of a plan's x, w and y: fp32, or the 16-bit copies of --precision bf16|fp16.
cudnnDataType_t data_type(Precision p) {
  return p == Precision::BF16 ? CUDNN_DATA_BFLOAT16 : p == Precision::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

// The algorithm and workspace one direction of a plan runs with.
struct Choice {
  int algo = -1;  // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t; -1 until selected
  size_t workspace = 0;
};

// Everything a shape needs on one device: descriptors (one convolution descriptor per direction, since
// each direction's chosen algorithm sets its own math type) and the chosen algorithms. x, w and y are in
// the plan's precision; y32 and bias describe the fp32 output and bias the bias calls work on.
struct Plan {
  TensorDesc x, y, y32, bias;
  FilterDesc w;
  ConvDesc conv[3];  // forward, backward data, backward filter
  Choice choice[3];
  bool low;  // 16-bit x, w, y: the chosen algorithm's math type goes onto its descriptor (tensor cores)

  Plan(const cpu::ConvShape& s, const MathOptions& opt, Precision precision) : low(precision != Precision::F32) {
    const cudnnDataType_t type = data_type(precision);
    set_nchw(x, s.N, s.C, s.H, s.W, s, type);
    set_nchw(y, s.N, s.K, s.P(), s.Q(), s, type);
    set_nchw(y32, s.N, s.K, s.P(), s.Q(), s);
    set_nchw(bias, 1, s.K, 1, 1, s);
    ACTLAB_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), type, CUDNN_TENSOR_NCHW, as_int(s.K, "K", s),
                                                  as_int(s.C / s.groups, "C/groups", s), as_int(s.R, "R", s),
                                                  as_int(s.S, "S", s)));
    for (const ConvDesc& c : conv) {
      ACTLAB_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c.get(), as_int(s.pad_h, "pad", s), as_int(s.pad_w, "pad", s),
                                                         as_int(s.stride_h, "stride", s),
                                                         as_int(s.stride_w, "stride", s), 1, 1,
                                                         CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      ACTLAB_CUDNN_CHECK(cudnnSetConvolutionGroupCount(c.get(), as_int(s.groups, "groups", s)));
      // FMA math keeps fp32 exact to rounding (no TF32); default math lets cuDNN use TF32 tensor cores; 16-bit
      // operands (accumulated in fp32: the descriptor's compute type above) run on tensor cores.
      ACTLAB_CUDNN_CHECK(cudnnSetConvolutionMathType(
          c.get(), low ? CUDNN_TENSOR_OP_MATH : opt.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    }
  }
};

enum Direction { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

struct PlanKey {
  int device;
  int64_t N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, groups;
  bool tf32, benchmark, deterministic;
  size_t max_workspace;
  int precision;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, groups, tf32, benchmark,
                    deterministic, max_workspace, precision) <
           std::tie(o.device, o.N, o.C, o.H, o.W, o.K, o.R, o.S, o.stride_h, o.stride_w, o.pad_h, o.pad_w, o.groups,
                    o.tf32, o.benchmark, o.deterministic, o.max_workspace, o.precision);
  }
};

struct PlanCache {
  std::mutex mutex;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  int64_t searches = 0;
};
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed: descriptors outlive static teardown
  return *cache;
}

// The plan of shape s in `precision` on ctx's device under the current math options (made on first use).
// Plans are never removed except by conv_clear_cache, so the reference stays valid.
Plan& plan_for(const CudaContext& ctx, const cpu::ConvShape& s, MathOptions* opt, Precision precision) {
  cpu::check_conv_shape(s);
  *opt = math_options();
  const PlanKey key{ctx.device(), s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
                    s.groups, opt->allow_tf32, opt->benchmark, opt->deterministic, opt->max_workspace,
                    static_cast<int>(precision)};
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto& slot = cache.plans[key];
  if (!slot) slot = std::make_unique<Plan>(s, *opt, precision);
  return *slot;
}

// Picks the first usable entry of cuDNN's ranking (fastest first): status success, workspace within the
// limit, and deterministic when the options ask for it. With TF32 allowed or 16-bit operands, the chosen
// algorithm's math type goes onto the direction's descriptor, as cuDNN asks.
template <typename Perf>
Choice pick(const Perf* perf, int count, const MathOptions& opt, bool low, const ConvDesc& conv,
            const char* direction, const cpu::ConvShape& s) {
  const size_t limit = opt.max_workspace;
  const bool set_math = opt.allow_tf32 || low;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit) continue;
    if (opt.deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    // fp32 without TF32 keeps FMA math whatever the ranking says, so fp32 stays fp32.
    if (set_math) ACTLAB_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), perf[i].mathType));
    return {static_cast<int>(perf[i].algo), perf[i].memory};
  }
  ACTLAB_FAIL("cuDNN offers no ", opt.deterministic ? "deterministic " : "", direction, " algorithm for ", s.str(),
              " within a workspace of ", limit, " bytes");
}

// Workspace for a benchmark search: the limit, or what the device can spare, whichever is smaller.
size_t search_workspace(const MathOptions& opt) {
  size_t free_bytes = 0, total_bytes = 0;
  ACTLAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::min(opt.max_workspace, free_bytes / 2);
}

// Times every candidate on the caller's buffers (cudnnFind*AlgorithmEx; the output is overwritten, which
// the caller does next anyway) with a temporary workspace that is handed back afterwards, so the search's
// big scratch does not stay charged to the step.
Choice search_benchmark(CudaContext& ctx, Plan& plan, Direction dir, const MathOptions& opt, const cpu::ConvShape& s,
                        const void* in0, const void* in1, void* out) {
  constexpr int kMax = 16;  // more than any cuDNN 9 direction has
  const cudnnHandle_t h = ctx.cudnn();
  const ConvDesc& conv = plan.conv[dir];
  const size_t ws_bytes = search_workspace(opt);
  void* ws = ctx.workspace(ws_bytes);
  int count = 0;
  Choice choice;
  if (dir == kForward) {  // in0 = x, in1 = w, out = y
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    ACTLAB_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, plan.x.get(), in0, plan.w.get(), in1, conv.get(),
                                                              plan.y.get(), out, kMax, &count, perf, ws, ws_bytes));
    choice = pick(perf, count, opt, plan.low, conv, "forward", s);
  } else if (dir == kBackwardData) {  // in0 = dy, in1 = w, out = dx
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    ACTLAB_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, plan.w.get(), in1, plan.y.get(), in0, conv.get(),
                                                                   plan.x.get(), out, kMax, &count, perf, ws,
                                                                   ws_bytes));
    choice = pick(perf, count, opt, plan.low, conv, "backward-data", s);
  } else {  // in0 = dy, in1 = x, out = dw
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    ACTLAB_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, plan.x.get(), in1, plan.y.get(), in0,
                                                                     conv.get(), plan.w.get(), out, kMax, &count, perf,
                                                                     ws, ws_bytes));
    choice = pick(perf, count, opt, plan.low, conv, "backward-filter", s);
  }
  ctx.release_workspace();
  return choice;
}

// cuDNN's heuristic ranking (no kernels run).
Choice search_heuristic(CudaContext& ctx, Plan& plan, Direction dir, const MathOptions& opt,
                        const cpu::ConvShape& s) {
  constexpr int kMax = 16;
  const cudnnHandle_t h = ctx.cudnn();
  const ConvDesc& conv = plan.conv[dir];
  int count = 0;
  if (dir == kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    ACTLAB_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, plan.x.get(), plan.w.get(), conv.get(), plan.y.get(),
                                                              kMax, &count, perf));
    return pick(perf, count, opt, plan.low, conv, "forward", s);
  }
  if (dir == kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    ACTLAB_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, plan.w.get(), plan.y.get(), conv.get(),
                                                                   plan.x.get(), kMax, &count, perf));
    return pick(perf, count, opt, plan.low, conv, "backward-data", s);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
  ACTLAB_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, plan.x.get(), plan.y.get(), conv.get(),
                                                                   plan.w.get(), kMax, &count, perf));
  return pick(perf, count, opt, plan.low, conv, "backward-filter", s);
}

// Selects the algorithm of one direction, once per plan.
void select(CudaContext& ctx, Plan& plan, Direction dir, const MathOptions& opt, const cpu::ConvShape& s,
            const void* in0, const void* in1, void* out) {
  if (plan.choice[dir].algo >= 0) return;
  {
    std::lock_guard<std::mutex> lock(plan_cache().mutex);
    plan_cache().searches += 1;
  }
  plan.choice[dir] = opt.benchmark ? search_benchmark(ctx, plan, dir, opt, s, in0, in1, out)
                                   : search_heuristic(ctx, plan, dir, opt, s);
}

const float kOne = 1.f, kZero = 0.f;

}  // namespace

namespace {
// An fp32 operand as the plan reads it: itself, or its 16-bit copy (core/cuda/lowp.h).
struct Operand {
  Operand(const float* v, int64_t n, Precision p, const CudaContext& ctx) {
    if (p == Precision::F32) {
      ptr = v;
    } else {
      copy = std::make_unique<LowCopy>(v, n, p, ctx.device(), ctx.stream());
      ptr = copy->data();
    }
  }
  const void* ptr = nullptr;
  std::unique_ptr<LowCopy> copy;
};
// An fp32 output as the plan writes it: itself, or 16-bit room widened into it by finish().
struct Output {
  Output(float* v, int64_t n, Precision p, const CudaContext& ctx) : fp32(v) {
    if (p == Precision::F32) {
      ptr = v;
    } else {
      room = std::make_unique<LowOut>(n, p, ctx.device());
      ptr = room->data();
    }
  }
  void finish(const CudaContext& ctx) const {
    if (room) room->widen(fp32, ctx.stream());
  }
  float* fp32;
  void* ptr = nullptr;
  std::unique_ptr<LowOut> room;
};
int64_t x_elems(const cpu::ConvShape& s) { return s.N * s.C * s.H * s.W; }
int64_t y_elems(const cpu::ConvShape& s) { return s.N * s.K * s.P() * s.Q(); }
int64_t w_elems(const cpu::ConvShape& s) { return s.K * (s.C / s.groups) * s.R * s.S; }
}  // namespace

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const cpu::ConvShape& s,
                    CudaContext& ctx, Precision p) {
  MathOptions opt;
  Plan& plan = plan_for(ctx, s, &opt, p);
  const Operand xo(x, x_elems(s), p, ctx), wo(w, w_elems(s), p, ctx);
  const Output yo(y, y_elems(s), p, ctx);
  select(ctx, plan, kForward, opt, s, xo.ptr, wo.ptr, yo.ptr);
  const Choice& c = plan.choice[kForward];
  void* ws = ctx.workspace(c.workspace);
  ACTLAB_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &kOne, plan.x.get(), xo.ptr, plan.w.get(), wo.ptr,
                                             plan.conv[kForward].get(), static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                             ws, c.workspace, &kZero, plan.y.get(), yo.ptr));
  yo.finish(ctx);
  if (b != nullptr)  // in fp32, on the widened output
    ACTLAB_CUDNN_CHECK(cudnnAddTensor(ctx.cudnn(), &kOne, plan.bias.get(), b, &kOne, plan.y32.get(), y));
}

void conv2d_backward_data(float* dx, const float* dy, const float* w, const cpu::ConvShape& s, CudaContext& ctx,
                          Precision p) {
  MathOptions opt;
  Plan& plan = plan_for(ctx, s, &opt, p);
  const Operand dyo(dy, y_elems(s), p, ctx), wo(w, w_elems(s), p, ctx);
  const Output dxo(dx, x_elems(s), p, ctx);
  select(ctx, plan, kBackwardData, opt, s, dyo.ptr, wo.ptr, dxo.ptr);
  const Choice& c = plan.choice[kBackwardData];
  void* ws = ctx.workspace(c.workspace);
  ACTLAB_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &kOne, plan.w.get(), wo.ptr, plan.y.get(), dyo.ptr,
                                                  plan.conv[kBackwardData].get(),
                                                  static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws, c.workspace,
                                                  &kZero, plan.x.get(), dxo.ptr));
  dxo.finish(ctx);
}

void conv2d_backward_weight(float* dw, float* db, const float* dy, const float* x, const cpu::ConvShape& s,
                            CudaContext& ctx, Precision p) {
  MathOptions opt;
  Plan& plan = plan_for(ctx, s, &opt, p);
  const Operand dyo(dy, y_elems(s), p, ctx), xo(x, x_elems(s), p, ctx);
  const Output dwo(dw, w_elems(s), p, ctx);
  select(ctx, plan, kBackwardFilter, opt, s, dyo.ptr, xo.ptr, dwo.ptr);
  const Choice& c = plan.choice[kBackwardFilter];
  void* ws = ctx.workspace(c.workspace);
  ACTLAB_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &kOne, plan.x.get(), xo.ptr, plan.y.get(), dyo.ptr,
                                                    plan.conv[kBackwardFilter].get(),
                                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws,
                                                    c.workspace, &kZero, plan.w.get(), dwo.ptr));
  dwo.finish(ctx);
  if (db != nullptr)  // from the fp32 gradient
    ACTLAB_CUDNN_CHECK(cudnnConvolutionBackwardBias(ctx.cudnn(), &kOne, plan.y32.get(), dy, &kZero, plan.bias.get(), db));
}

int64_t conv_plan_count() {
  std::lock_guard<std::mutex> lock(plan_cache().mutex);
  return static_cast<int64_t>(plan_cache().plans.size());
}

int64_t conv_algorithm_searches() {
  std::lock_guard<std::mutex> lock(plan_cache().mutex);
  return plan_cache().searches;
}

void conv_clear_cache() {
  std::lock_guard<std::mutex> lock(plan_cache().mutex);
  plan_cache().plans.clear();
}

#else  // a CUDA build without cuDNN: convolutions on the GPU are unavailable, and say why

namespace {
[[noreturn]] void no_cudnn() {
  ACTLAB_FAIL("conv2d on CUDA needs cuDNN, but actlab was built without it (CMake did not find libcudnn)");
}
}  // namespace

void conv2d_forward(float*, const float*, const float*, const float*, const cpu::ConvShape&, CudaContext&, Precision) {
  no_cudnn();
}
void conv2d_backward_data(float*, const float*, const float*, const cpu::ConvShape&, CudaContext&, Precision) {
  no_cudnn();
}
void conv2d_backward_weight(float*, float*, const float*, const float*, const cpu::ConvShape&, CudaContext&,
                            Precision) {
  no_cudnn();
}
int64_t conv_plan_count() { return 0; }
int64_t conv_algorithm_searches() { return 0; }
void conv_clear_cache() {}

#endif  // ACTLAB_WITH_CUDNN

}  // namespace actlab::cuda
