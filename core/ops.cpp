// The one dispatch point of every tensor op: shape checks, output allocation, cpu:: (or cuda::) call.
#include "core/ops.h"

#include <cmath>

#include "core/cpu/conv.h"
#include "core/cpu/gemm.h"
#include "core/cpu/kernels.h"

namespace actlab::ops {
namespace {

// Every op below runs on the CPU backend; the CUDA backend plugs in here when it lands.
void require_cpu(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t && t->defined())
      ACTLAB_CHECK(t->device().is_cpu(), op, ": tensors on ", t->device().str(),
                   " are not supported yet (CUDA backend pending)");
  }
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

Tensor new_mask(int64_t n) { return Tensor::empty({cpu::mask_words(n)}, DType::I32); }
uint32_t* mask_ptr(const Tensor& m) { return reinterpret_cast<uint32_t*>(m.data<int32_t>()); }

}  // namespace

// ---------------------------------------------------------------- convolution
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p) {
  require_cpu("conv2d", {&x, &w, &b});
  require_f32_contig("conv2d", "input", x);
  require_f32_contig("conv2d", "weight", w);
  const cpu::ConvShape s = conv_shape(x.shape(), w.shape(), p);
  if (b.defined()) {
    require_f32_contig("conv2d", "bias", b);
    ACTLAB_CHECK(b.numel() == s.K, "conv2d: bias ", b.str(), " for ", s.K, " output channels");
  }
  Tensor y = Tensor::empty({s.N, s.K, s.P(), s.Q()});
  cpu::conv2d_forward(y.data<float>(), x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr,
                      s);
  return y;
}

Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, const ConvParams& p) {
  require_cpu("conv2d_backward_data", {&dy, &w});
  require_f32_contig("conv2d_backward_data", "grad", dy);
  const cpu::ConvShape s = conv_shape(x_shape, w.shape(), p);
  ACTLAB_CHECK(dy.shape() == Shape({s.N, s.K, s.P(), s.Q()}), "conv2d backward: grad ", dy.str(),
               " does not match the output of ", s.str());
  Tensor dx = Tensor::empty(x_shape);
  cpu::conv2d_backward_data(dx.data<float>(), dy.data<float>(), w.data<float>(), s);
  return dx;
}

Tensor conv2d_backward_weight(const Tensor& dy, const Tensor& x, const Shape& w_shape, const ConvParams& p,
                              bool want_bias, Tensor* db) {
  require_cpu("conv2d_backward_weight", {&dy, &x});
  require_f32_contig("conv2d_backward_weight", "grad", dy);
  require_f32_contig("conv2d_backward_weight", "input", x);
  const cpu::ConvShape s = conv_shape(x.shape(), w_shape, p);
  Tensor dw = Tensor::empty(w_shape);
  float* db_ptr = nullptr;
  if (want_bias) {
    *db = Tensor::empty({s.K});
    db_ptr = db->data<float>();
  }
  cpu::conv2d_backward_weight(dw.data<float>(), db_ptr, dy.data<float>(), x.data<float>(), s);
  return dw;
}

// ---------------------------------------------------------------- linear
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  require_cpu("linear", {&x, &w, &b});
  require_f32_contig("linear", "input", x);
  require_f32_contig("linear", "weight", w);
  ACTLAB_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: input ", x.str(),
               " vs weight ", w.str(), ": features ", x.dim() == 2 ? x.size(1) : -1, " != ", w.size(-1));
  const int64_t N = x.size(0), D = x.size(1), M = w.size(0);
  Tensor y = Tensor::empty({N, M});
  float* yp = y.data<float>();
  cpu::gemm(false, true, N, M, D, 1.f, x.data<float>(), D, w.data<float>(), D, 0.f, yp, M);
  if (b.defined()) {
    ACTLAB_CHECK(b.numel() == M, "linear: bias ", b.str(), " for ", M, " outputs");
    const float* bp = b.data<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) yp[n * M + m] += bp[m];
  }
  return y;
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  require_cpu("linear_backward_data", {&dy, &w});
  require_f32_contig("linear_backward_data", "grad", dy);
  const int64_t N = dy.size(0), M = dy.size(1), D = w.size(1);
  ACTLAB_CHECK(w.size(0) == M, "linear backward: grad ", dy.str(), " vs weight ", w.str());
  Tensor dx = Tensor::empty({N, D});
  cpu::gemm(false, false, N, D, M, 1.f, dy.data<float>(), M, w.data<float>(), D, 0.f, dx.data<float>(), D);
  return dx;
}

Tensor linear_backward_weight(const Tensor& dy, const Tensor& x, bool want_bias, Tensor* db) {
  require_cpu("linear_backward_weight", {&dy, &x});
  require_f32_contig("linear_backward_weight", "grad", dy);
  require_f32_contig("linear_backward_weight", "input", x);
  const int64_t N = dy.size(0), M = dy.size(1), D = x.size(1);
  ACTLAB_CHECK(x.size(0) == N, "linear backward: grad ", dy.str(), " vs input ", x.str());
  Tensor dw = Tensor::empty({M, D});
  cpu::gemm(true, false, M, D, N, 1.f, dy.data<float>(), M, x.data<float>(), D, 0.f, dw.data<float>(), D);
  if (want_bias) {
    *db = Tensor::zeros({M});
    float* dbp = db->data<float>();
    const float* g = dy.data<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) dbp[m] += g[n * M + m];
  }
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
}  // namespace

Tensor batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                               Tensor& running_var, float momentum, float eps, Tensor* save_mean,
                               Tensor* save_invstd) {
  require_cpu("batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  require_f32_contig("batch_norm", "input", x);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  ACTLAB_CHECK(N * HW > 1, "batch_norm: training needs more than one value per channel, got input ", x.str());
  check_channel_vec("weight", gamma, C);
  check_channel_vec("bias", beta, C);
  check_channel_vec("running_mean", running_mean, C);
  check_channel_vec("running_var", running_var, C);
  Tensor y = Tensor::empty(x.shape());
  *save_mean = Tensor::empty({C});
  *save_invstd = Tensor::empty({C});
  cpu::batchnorm_forward_train(y.data<float>(), save_mean->data<float>(), save_invstd->data<float>(),
                               running_mean.data<float>(), running_var.data<float>(), x.data<float>(),
                               gamma.data<float>(), beta.data<float>(), N, C, HW, momentum, eps);
  running_mean.storage()->bump_version();
  running_var.storage()->bump_version();
  return y;
}

Tensor batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              const Tensor& running_mean, const Tensor& running_var, float eps) {
  require_cpu("batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  require_f32_contig("batch_norm", "input", x);
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  check_channel_vec("weight", gamma, C);
  check_channel_vec("bias", beta, C);
  check_channel_vec("running_mean", running_mean, C);
  check_channel_vec("running_var", running_var, C);
  Tensor y = Tensor::empty(x.shape());
  cpu::batchnorm_forward_eval(y.data<float>(), x.data<float>(), gamma.data<float>(), beta.data<float>(),
                              running_mean.data<float>(), running_var.data<float>(), N, C, HW, eps);
  return y;
}

Tensor batchnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                          const Tensor& save_invstd, Tensor* dgamma, Tensor* dbeta) {
  require_cpu("batch_norm_backward", {&dy, &x});
  require_f32_contig("batch_norm_backward", "grad", dy);
  require_f32_contig("batch_norm_backward", "input", x);
  ACTLAB_CHECK(dy.shape() == x.shape(), "batch_norm backward: grad ", dy.str(), " vs input ", x.str());
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  Tensor dx = Tensor::empty(x.shape());
  *dgamma = Tensor::empty({C});
  *dbeta = Tensor::empty({C});
  cpu::batchnorm_backward(dx.data<float>(), dgamma->data<float>(), dbeta->data<float>(), dy.data<float>(),
                          x.data<float>(), gamma.data<float>(), save_mean.data<float>(), save_invstd.data<float>(),
                          N, C, HW);
  return dx;
}

Tensor batchnorm_backward_eval(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               Tensor* dgamma, Tensor* dbeta) {
  require_cpu("batch_norm_backward", {&dy, &x});
  int64_t N, C, HW;
  bn_dims(x, &N, &C, &HW);
  Tensor dx = Tensor::empty(x.shape());
  *dgamma = Tensor::empty({C});
  *dbeta = Tensor::empty({C});
  cpu::batchnorm_backward_eval(dx.data<float>(), dgamma->data<float>(), dbeta->data<float>(), dy.data<float>(),
                               x.data<float>(), gamma.data<float>(), running_mean.data<float>(),
                               running_var.data<float>(), N, C, HW, eps);
  return dx;
}

// ---------------------------------------------------------------- element-wise
Tensor relu_forward(const Tensor& x, Tensor* mask) {
  require_cpu("relu", {&x});
  require_f32_contig("relu", "input", x);
  Tensor y = Tensor::empty(x.shape());
  *mask = new_mask(x.numel());
  cpu::relu_forward(y.data<float>(), mask_ptr(*mask), x.data<float>(), x.numel());
  return y;
}

Tensor relu_backward(const Tensor& dy, const Tensor& mask) {
  require_f32_contig("relu_backward", "grad", dy);
  Tensor dx = Tensor::empty(dy.shape());
  cpu::relu_backward(dx.data<float>(), mask_ptr(mask), dy.data<float>(), dy.numel());
  return dx;
}

Tensor relu6_forward(const Tensor& x, Tensor* mask) {
  require_cpu("relu6", {&x});
  require_f32_contig("relu6", "input", x);
  Tensor y = Tensor::empty(x.shape());
  *mask = new_mask(x.numel());
  cpu::relu6_forward(y.data<float>(), mask_ptr(*mask), x.data<float>(), x.numel());
  return y;
}

Tensor relu6_backward(const Tensor& dy, const Tensor& mask) {
  require_f32_contig("relu6_backward", "grad", dy);
  Tensor dx = Tensor::empty(dy.shape());
  cpu::relu6_backward(dx.data<float>(), mask_ptr(mask), dy.data<float>(), dy.numel());
  return dx;
}

Tensor add(const Tensor& a, const Tensor& b) {
  require_cpu("add", {&a, &b});
  require_f32_contig("add", "a", a);
  require_f32_contig("add", "b", b);
  ACTLAB_CHECK(a.shape() == b.shape(), "add: shapes differ: ", a.str(), " vs ", b.str());
  Tensor y = Tensor::empty(a.shape());
  cpu::add(y.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  return y;
}

Tensor add_relu_forward(const Tensor& a, const Tensor& b, Tensor* mask) {
  require_cpu("add_relu", {&a, &b});
  require_f32_contig("add_relu", "a", a);
  require_f32_contig("add_relu", "b", b);
  ACTLAB_CHECK(a.shape() == b.shape(), "add_relu: shapes differ: ", a.str(), " vs ", b.str());
  Tensor y = Tensor::empty(a.shape());
  *mask = new_mask(a.numel());
  cpu::add_relu_forward(y.data<float>(), mask_ptr(*mask), a.data<float>(), b.data<float>(), a.numel());
  return y;
}

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t stream, Tensor* keep_mask) {
  require_cpu("dropout", {&x});
  require_f32_contig("dropout", "input", x);
  Tensor y = Tensor::empty(x.shape());
  *keep_mask = new_mask(x.numel());
  cpu::dropout_forward(y.data<float>(), mask_ptr(*keep_mask), x.data<float>(), x.numel(), p, seed, stream);
  return y;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& keep_mask, float p) {
  require_f32_contig("dropout_backward", "grad", dy);
  Tensor dx = Tensor::empty(dy.shape());
  cpu::dropout_backward(dx.data<float>(), mask_ptr(keep_mask), dy.data<float>(), dy.numel(), p);
  return dx;
}

// ---------------------------------------------------------------- pooling
Tensor maxpool2d_forward(const Tensor& x, const PoolParams& p, Tensor* argmax) {
  require_cpu("max_pool2d", {&x});
  require_f32_contig("max_pool2d", "input", x);
  const cpu::Pool2dShape s = pool_shape(x.shape(), p);
  Tensor y = Tensor::empty({s.N, s.C, s.P(), s.Q()});
  *argmax = Tensor::empty({s.N, s.C, s.P(), s.Q()}, DType::U8);
  cpu::maxpool2d_forward(y.data<float>(), argmax->data<uint8_t>(), x.data<float>(), s);
  return y;
}

Tensor maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape, const PoolParams& p) {
  require_f32_contig("max_pool2d_backward", "grad", dy);
  const cpu::Pool2dShape s = pool_shape(x_shape, p);
  Tensor dx = Tensor::empty(x_shape);
  cpu::maxpool2d_backward(dx.data<float>(), dy.data<float>(), argmax.data<uint8_t>(), s);
  return dx;
}

Tensor avgpool2d_forward(const Tensor& x, const PoolParams& p) {
  require_cpu("avg_pool2d", {&x});
  require_f32_contig("avg_pool2d", "input", x);
  const cpu::Pool2dShape s = pool_shape(x.shape(), p);
  Tensor y = Tensor::empty({s.N, s.C, s.P(), s.Q()});
  cpu::avgpool2d_forward(y.data<float>(), x.data<float>(), s);
  return y;
}

Tensor avgpool2d_backward(const Tensor& dy, const Shape& x_shape, const PoolParams& p) {
  require_f32_contig("avg_pool2d_backward", "grad", dy);
  const cpu::Pool2dShape s = pool_shape(x_shape, p);
  Tensor dx = Tensor::empty(x_shape);
  cpu::avgpool2d_backward(dx.data<float>(), dy.data<float>(), s);
  return dx;
}

Tensor global_avgpool_forward(const Tensor& x) {
  require_cpu("global_avg_pool", {&x});
  require_f32_contig("global_avg_pool", "input", x);
  ACTLAB_CHECK(x.dim() == 4, "global_avg_pool: input must be (N,C,H,W), got ", x.str());
  Tensor y = Tensor::empty({x.size(0), x.size(1)});
  cpu::global_avgpool_forward(y.data<float>(), x.data<float>(), x.size(0), x.size(1), x.size(2) * x.size(3));
  return y;
}

Tensor global_avgpool_backward(const Tensor& dy, const Shape& x_shape) {
  require_f32_contig("global_avg_pool_backward", "grad", dy);
  Tensor dx = Tensor::empty(x_shape);
  cpu::global_avgpool_backward(dx.data<float>(), dy.data<float>(), x_shape[0], x_shape[1], x_shape[2] * x_shape[3]);
  return dx;
}

Tensor shortcut_pad_forward(const Tensor& x, int64_t stride, int64_t c_out) {
  require_cpu("shortcut_pad", {&x});
  require_f32_contig("shortcut_pad", "input", x);
  ACTLAB_CHECK(x.dim() == 4 && stride >= 1 && c_out >= x.size(1), "shortcut_pad: input ", x.str(), " stride ",
               stride, " to ", c_out, " channels");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  Tensor y = Tensor::empty({N, c_out, (H + stride - 1) / stride, (W + stride - 1) / stride});
  cpu::shortcut_pad_forward(y.data<float>(), x.data<float>(), N, C, H, W, stride, c_out);
  return y;
}

Tensor shortcut_pad_backward(const Tensor& dy, const Shape& x_shape, int64_t stride) {
  require_f32_contig("shortcut_pad_backward", "grad", dy);
  Tensor dx = Tensor::empty(x_shape);
  cpu::shortcut_pad_backward(dx.data<float>(), dy.data<float>(), x_shape[0], x_shape[1], x_shape[2], x_shape[3],
                             stride, dy.size(1));
  return dx;
}

// ---------------------------------------------------------------- loss
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float smoothing, Tensor* probs) {
  require_cpu("cross_entropy", {&logits, &labels});
  require_f32_contig("cross_entropy", "logits", logits);
  ACTLAB_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N,K), got ", logits.str());
  ACTLAB_CHECK(labels.dtype() == DType::I64 && labels.dim() == 1 && labels.size(0) == logits.size(0),
               "cross_entropy: labels must be (", logits.size(0), ") i64, got ", labels.str());
  ACTLAB_CHECK(smoothing >= 0.f && smoothing <= 1.f, "cross_entropy: label smoothing must be in [0,1], got ",
               smoothing);
  const Tensor lab = labels.contiguous();
  Tensor loss = Tensor::empty({1});
  *probs = Tensor::empty(logits.shape());
  cpu::softmax_cross_entropy_forward(loss.data<float>(), probs->data<float>(), logits.data<float>(),
                                     lab.data<int64_t>(), logits.size(0), logits.size(1), smoothing);
  return loss;
}

Tensor cross_entropy_backward(const Tensor& probs, const Tensor& labels, float smoothing, float dloss) {
  const Tensor lab = labels.contiguous();
  Tensor dlogits = Tensor::empty(probs.shape());
  cpu::softmax_cross_entropy_backward(dlogits.data<float>(), probs.data<float>(), lab.data<int64_t>(),
                                      probs.size(0), probs.size(1), smoothing, dloss);
  return dlogits;
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  require_cpu("count_correct", {&logits, &labels});
  const Tensor l = logits.contiguous();
  const Tensor lab = labels.contiguous();
  ACTLAB_CHECK(l.dim() == 2 && lab.dim() == 1 && lab.size(0) == l.size(0) && lab.dtype() == DType::I64,
               "count_correct: logits ", l.str(), " labels ", lab.str());
  return cpu::top1_correct(l.data<float>(), lab.data<int64_t>(), l.size(0), l.size(1));
}

// ---------------------------------------------------------------- optimizer
void sgd_update_(Tensor& w, Tensor& momentum_buf, const Tensor& grad, float lr, float momentum, float dampening,
                 float weight_decay, bool nesterov, bool first_step) {
  require_cpu("sgd_update", {&w, &momentum_buf, &grad});
  require_f32_contig("sgd_update", "parameter", w);
  require_f32_contig("sgd_update", "gradient", grad);
  ACTLAB_CHECK(w.shape() == grad.shape(), "sgd_update: parameter ", w.str(), " vs gradient ", grad.str());
  float* buf = nullptr;
  if (momentum != 0.f) {
    ACTLAB_CHECK(momentum_buf.defined() && momentum_buf.shape() == w.shape(), "sgd_update: momentum buffer ",
                 momentum_buf.str(), " for ", w.str());
    buf = momentum_buf.data<float>();
  }
  cpu::sgd_update(w.data<float>(), buf, grad.data<float>(), w.numel(), lr, momentum, dampening, weight_decay,
                  nesterov, first_step);
  w.storage()->bump_version();
}

bool all_finite(const Tensor& x) {
  const Tensor c = x.contiguous();
  const float* p = c.data<float>();
  const int64_t n = c.numel();
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(p[i]);
  return ok;
}

}  // namespace actlab::ops
