// The fast CPU paths of GELU, softmax and LayerNorm forward: oneDNN's primitives, chosen by measurement
// (bench/bench_token.cpp at vit_tiny_cifar's shapes on a Zen 5: softmax 5.6x and LayerNorm 7.9x faster
// than the _ref loops of kernels_token.cpp, GELU's numbers are in bench/RESULTS.md; the _ref loops stay
// as the spec these are tested against and as what a build without oneDNN runs,
// core/cpu/minimal/kernels_token_minimal.cpp). Primitives are cached per shape and thread.
// Contracts: core/cpu/kernels.h.
#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "actlab/core/cpu/dnnl_common.h"
#include "actlab/core/cpu/kernels.h"

namespace actlab::cpu {
namespace {

using dnnl::memory;

memory::desc rows_md(int64_t rows, int64_t d) {
  return memory::desc({rows, d}, memory::data_type::f32, memory::format_tag::ab);
}
memory::desc vector_md(int64_t n) { return memory::desc({n}, memory::data_type::f32, memory::format_tag::a); }

// The primitives of one call site for one key, made on first use by make() and kept per thread.
// make is a lambda, so each call site instantiates its own cache.
template <typename Key, typename Make>
auto& cached(const Key& key, Make make) {
  thread_local std::map<Key, decltype(make())> cache;
  auto& slot = cache[key];
  if (!slot) slot = make();
  return *slot;
}

struct SoftmaxPrims {
  dnnl::softmax_forward fwd;
  dnnl::softmax_backward bwd;
};
SoftmaxPrims& softmax_prims(int64_t rows, int64_t d) {
  return cached(std::make_pair(rows, d), [&] {
    const memory::desc md = rows_md(rows, d);
    dnnl::softmax_forward::primitive_desc fwd_pd({dnnl::prop_kind::forward_training, md, 1}, dnnl_engine());
    dnnl::softmax_backward::primitive_desc bwd_pd({md, md, 1}, dnnl_engine(), fwd_pd);
    return std::make_unique<SoftmaxPrims>(SoftmaxPrims{dnnl::softmax_forward(fwd_pd), dnnl::softmax_backward(bwd_pd)});
  });
}

// Normalization only (no scale/shift): the primitive writes x̂, and y = x̂·γ + β is one more light pass,
// so the x̂ backward keeps comes from the same arithmetic as y.
dnnl::layer_normalization_forward& layernorm_prim(int64_t rows, int64_t d, float eps) {
  return cached(std::make_tuple(rows, d, eps), [&] {
    dnnl::layer_normalization_forward::primitive_desc pd(
        {dnnl::prop_kind::forward_training, rows_md(rows, d), eps, dnnl::normalization_flags::none}, dnnl_engine());
    return std::make_unique<dnnl::layer_normalization_forward>(pd);
  });
}

// GELU over n values as one flat tensor: oneDNN's eltwise kernels evaluate erf (or tanh) with vector
// polynomials, where the _ref loop calls libm's scalar erff per element (and erff plus expf in backward).
struct GeluPrims {
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward bwd;
};
GeluPrims& gelu_prims(int64_t n, bool tanh_approx) {
  return cached(std::make_pair(n, tanh_approx), [&] {
    const memory::desc md = vector_md(n);
    const auto alg = tanh_approx ? dnnl::algorithm::eltwise_gelu_tanh : dnnl::algorithm::eltwise_gelu_erf;
    dnnl::eltwise_forward::primitive_desc fwd_pd({dnnl::prop_kind::forward_training, alg, md, 0.f, 0.f}, dnnl_engine());
    dnnl::eltwise_backward::primitive_desc bwd_pd({alg, md, md, 0.f, 0.f}, dnnl_engine(), fwd_pd);
    return std::make_unique<GeluPrims>(GeluPrims{dnnl::eltwise_forward(fwd_pd), dnnl::eltwise_backward(bwd_pd)});
  });
}

}  // namespace

void gelu_forward(float* y, const float* x, int64_t n, bool tanh_approx) {
  if (n == 0) return;
  memory src(vector_md(n), dnnl_engine(), const_cast<float*>(x)), dst(vector_md(n), dnnl_engine(), y);
  gelu_prims(n, tanh_approx).fwd.execute(dnnl_stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
  dnnl_stream().wait();
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
  if (n == 0) return;
  const memory::desc md = vector_md(n);
  memory src(md, dnnl_engine(), const_cast<float*>(x)), ddst(md, dnnl_engine(), const_cast<float*>(dy));
  memory dsrc(md, dnnl_engine(), dx);
  gelu_prims(n, tanh_approx).bwd.execute(dnnl_stream(),
                                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}});
  dnnl_stream().wait();
}

void softmax_forward(float* y, const float* x, int64_t rows, int64_t d, float scale) {
  if (rows * d == 0) return;
  const float* src = x;
  if (scale != 1.f) {  // softmax(scale·x): the scaled input into y, then softmax in place
#pragma omp parallel for if (rows * d > kParallelGrain)
    for (int64_t i = 0; i < rows * d; ++i) y[i] = scale * x[i];
    src = y;
  }
  SoftmaxPrims& p = softmax_prims(rows, d);
  const memory::desc md = rows_md(rows, d);
  memory s(md, dnnl_engine(), const_cast<float*>(src)), t(md, dnnl_engine(), y);
  p.fwd.execute(dnnl_stream(), {{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, t}});
  dnnl_stream().wait();
}

void softmax_backward(float* dx, const float* dy, const float* y, int64_t rows, int64_t d, float scale) {
  if (rows * d == 0) return;
  SoftmaxPrims& p = softmax_prims(rows, d);
  const memory::desc md = rows_md(rows, d);
  memory dst(md, dnnl_engine(), const_cast<float*>(y)), ddst(md, dnnl_engine(), const_cast<float*>(dy));
  memory dsrc(md, dnnl_engine(), dx);
  p.bwd.execute(dnnl_stream(), {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}});
  dnnl_stream().wait();
  if (scale != 1.f) {  // d softmax(scale·x)/dx = scale · (the softmax's own backward)
#pragma omp parallel for if (rows * d > kParallelGrain)
    for (int64_t i = 0; i < rows * d; ++i) dx[i] *= scale;
  }
}

void layernorm_forward(float* y, float* xhat, float* mean, float* rstd, const float* x, const float* gamma,
                       const float* beta, int64_t rows, int64_t d, float eps) {
  if (rows * d == 0) return;
  float* normalized = xhat ? xhat : y;  // without an x̂ output, normalize into y and apply γ, β in place
  memory src(rows_md(rows, d), dnnl_engine(), const_cast<float*>(x)), dst(rows_md(rows, d), dnnl_engine(), normalized);
  memory m(vector_md(rows), dnnl_engine(), mean), v(vector_md(rows), dnnl_engine(), rstd);  // variance, then rstd
  layernorm_prim(rows, d, eps).execute(dnnl_stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_MEAN, m},
                                                  {DNNL_ARG_VARIANCE, v}});
  dnnl_stream().wait();
#pragma omp parallel for if (rows * d > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    rstd[r] = 1.f / std::sqrt(rstd[r] + eps);
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = normalized[r * d + j] * gamma[j] + beta[j];
  }
}

}  // namespace actlab::cpu
