// Benchmark of the transformer ops' CPU paths against oneDNN's primitives for the same work, at the
// shapes of vit_tiny_cifar at batch 128 (28² images: 50 tokens, width 192, 3 heads of 64): softmax over
// attention rows, LayerNorm forward (with the x̂ it keeps for backward) and GELU. Columns: the spec loops
// (cpu::*_ref, core/cpu/kernels_token.cpp), what actlab runs (ops::, on the CPU oneDNN's softmax,
// layer normalization and eltwise GELU since this measurement — kernels_token_dnnl.cpp) and oneDNN's primitive alone.
// Then attention's batched products (cpu::gemm_batched's two paths, core/cpu/gemm.h) at every transpose
// case forward and backward use, for vit_tiny_cifar and for swin_t's four stages (224², 49-token windows,
// heads of 32) at --swin-batch images. Median of --reps after a warm-up; the candidates of a row are run
// alternately, one call each in turn. Results: bench/RESULTS.md, "Vision transformers".
// Usage: bench_token --help.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "actlab/core/cpu/gemm.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"
#include "actlab/core/ops.h"
#include "actlab/train/cli.h"

namespace {

using actlab::Tensor;
using Clock = std::chrono::steady_clock;

double median_ms(const std::function<void()>& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t = Clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor random(const actlab::Shape& s, uint64_t seed) {
  actlab::PhiloxStream rng(seed);
  return Tensor::randn(s, rng);
}

// The median of each candidate over reps rounds, a round calling each once in turn, so that a change of
// outside load falls on all of them alike.
std::vector<double> interleaved_median_ms(const std::vector<std::function<void()>>& fs, int reps) {
  for (const auto& f : fs) f();
  std::vector<std::vector<double>> ms(fs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < fs.size(); ++i) {
      const auto t = Clock::now();
      fs[i]();
      ms[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    }
  std::vector<double> medians;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  return medians;
}

// s padded with spaces to `width` characters as a terminal shows them (printf's %-*s counts the bytes of ᵀ and ·).
std::string padded(const std::string& s, size_t width) {
  size_t shown = 0;
  for (const unsigned char ch : s) shown += (ch & 0xC0) != 0x80;  // UTF-8 continuation bytes add nothing
  return s + std::string(shown < width ? width - shown : 0, ' ');
}

// One batched product of attention: `matrices` products op(A) (M,K) · op(B) (K,N).
struct BatchedProduct {
  std::string what;
  int64_t matrices, M, N, K;
  bool trans_a, trans_b;
};

// Forward: scores q·kᵀ (T,d)·(T,d)ᵀ and out = attn·v (T,T)·(T,d). Backward (autograd/functions_token.cpp):
// d_attn = dO·vᵀ (the scores' case), dq = dS·k (the out case), dk = dSᵀ·q and dv = attnᵀ·dO (T,T)ᵀ·(T,d).
std::vector<BatchedProduct> attention_products(const std::string& model, int64_t matrices, int64_t T, int64_t d) {
  return {{model + " q·kᵀ, dO·vᵀ (NT)", matrices, T, T, d, false, true},
          {model + " attn·v, dS·k (NN)", matrices, T, d, T, false, false},
          {model + " dSᵀ·q, attnᵀ·dO (TN)", matrices, T, d, T, true, false}};
}

void row(const char* what, double ref, double own, double dnnl) {
  if (ref > 0) {
    std::printf("%-44s %9.3f ms %9.3f ms %9.3f ms\n", what, ref, own, dnnl);
  } else {
    std::printf("%-44s %12s %9.3f ms %9.3f ms\n", what, "-", own, dnnl);
  }
}

}  // namespace

int main(int argc, char** argv) {
  actlab::FlagParser flags("bench_token",
                           "The transformer ops' CPU paths (spec loop, actlab, oneDNN alone) and attention's batched\n"
                           "products at vit_tiny_cifar's and swin_t's shapes (median ms; bench/RESULTS.md).");
  flags.add("batch", "int", "128", "vit_tiny_cifar batch (28² images: 50 tokens, width 192, 3 heads)");
  flags.add("swin-batch", "int", "32", "swin_t images for the attention products (49-token windows)");
  flags.add("reps", "int", "20", "timed calls per candidate, median kept");
  flags.add("threads", "int", "2", "OpenMP threads");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const int64_t batch = flags.get_int("batch"), swin_batch = flags.get_int("swin-batch");
    const int reps = static_cast<int>(flags.get_int("reps")), threads = static_cast<int>(flags.get_int("threads"));
    ACTLAB_CHECK(batch >= 1 && swin_batch >= 1 && reps >= 1 && threads >= 1,
                 "--batch, --swin-batch, --reps and --threads must be >= 1");
    // The products of shapes below (batch·heads·tokens, images·windows·heads) are formed before any tensor
    // checks them: a bound keeps them far from int64's range.
    ACTLAB_CHECK(batch <= (int64_t{1} << 24) && swin_batch <= (int64_t{1} << 24),
                 "--batch and --swin-batch must be at most 2^24, got ", batch, " and ", swin_batch);
    omp_set_num_threads(threads);
    const int64_t T = 50, D = 192, H = 3, d = 64;
    using dnnl::memory;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    std::printf("bench_token: vit_tiny_cifar shapes at batch %lld, %d threads; median of %d\n",
                static_cast<long long>(batch), threads, reps);
    std::printf("%-44s %12s %12s %12s\n", "op", "spec loop", "actlab", "oneDNN alone");

    {  // softmax over (B·H·T) rows of T
      const Tensor x = random({batch * H * T, T}, 1);
      Tensor y = Tensor::empty(x.shape());
      const memory::desc md({batch * H * T, T}, memory::data_type::f32, memory::format_tag::ab);
      memory src(md, engine, x.raw_data()), dst(md, engine, y.raw_data());
      dnnl::softmax_forward prim(
          dnnl::softmax_forward::primitive_desc({dnnl::prop_kind::forward_training, md, 1}, engine));
      const double ref = median_ms([&] { actlab::cpu::softmax_forward_ref(y.data<float>(), x.data<float>(), batch * H * T, T, 1.f); }, reps);
      const double own = median_ms([&] { actlab::ops::softmax_forward(x, 1.f); }, reps);
      const double dn = median_ms([&] {
        prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
        stream.wait();
      }, reps);
      row("softmax (B·3·50 rows of 50)", ref, own, dn);
    }
    {  // LayerNorm forward over (B·T) rows of D, with statistics (training)
      const Tensor x = random({batch * T, D}, 2), g = random({D}, 3), b = random({D}, 4);
      Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({batch * T}), var = Tensor::empty({batch * T});
      Tensor ss = Tensor::empty({2, D});
      const memory::desc md({batch * T, D}, memory::data_type::f32, memory::format_tag::ab);
      const memory::desc stat_md({batch * T}, memory::data_type::f32, memory::format_tag::a);
      const memory::desc ss_md({2, D}, memory::data_type::f32, memory::format_tag::ab);
      memory src(md, engine, x.raw_data()), dst(md, engine, y.raw_data()), m(stat_md, engine, mean.raw_data()),
          v(stat_md, engine, var.raw_data()), w(ss_md, engine, ss.raw_data());
      dnnl::layer_normalization_forward prim(dnnl::layer_normalization_forward::primitive_desc(
          {dnnl::prop_kind::forward_training, md, 1e-6f, dnnl::normalization_flags::use_scale_shift}, engine));
      Tensor xhat = Tensor::empty(x.shape()), rstd = Tensor::empty({batch * T});
      const double ref = median_ms([&] {
        actlab::cpu::layernorm_forward_ref(y.data<float>(), xhat.data<float>(), mean.data<float>(), rstd.data<float>(),
                                           x.data<float>(), g.data<float>(), b.data<float>(), batch * T, D, 1e-6f);
      }, reps);
      const double own = median_ms([&] {
        Tensor mu, rs, xh;
        actlab::ops::layernorm_forward(x, g, b, 1e-6f, &mu, &rs, &xh);
      }, reps);
      const double dn = median_ms([&] {
        prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_MEAN, m}, {DNNL_ARG_VARIANCE, v},
                              {DNNL_ARG_SCALE_SHIFT, w}});
        stream.wait();
      }, reps);
      row("layer_norm forward (B·50 rows of 192)", ref, own, dn);
    }

    {  // GELU (erf form) over the MLP's hidden map, B·50 tokens of 4·192; the oneDNN column is the cached
       // primitive behind cpu::gelu_* (the actlab column adds the op's output allocation and checks)
      const int64_t n = batch * T * 4 * D;
      const Tensor x = random({n}, 7), dy = random({n}, 8);
      Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
      const double ref = median_ms([&] { actlab::cpu::gelu_forward_ref(y.data<float>(), x.data<float>(), n, false); }, reps);
      const double own = median_ms([&] { actlab::ops::gelu_forward(x, false); }, reps);
      const double dn = median_ms([&] { actlab::cpu::gelu_forward(y.data<float>(), x.data<float>(), n, false); }, reps);
      row("gelu forward (B·50·768 values)", ref, own, dn);
      const double bref = median_ms([&] {
        actlab::cpu::gelu_backward_ref(dx.data<float>(), dy.data<float>(), x.data<float>(), n, false);
      }, reps);
      const double bown = median_ms([&] { actlab::ops::gelu_backward(dy, x, false); }, reps);
      const double bdn = median_ms([&] {
        actlab::cpu::gelu_backward(dx.data<float>(), dy.data<float>(), x.data<float>(), n, false);
      }, reps);
      row("gelu backward (B·50·768 values)", bref, bown, bdn);
    }

    std::vector<BatchedProduct> products = attention_products("vit_tiny b" + std::to_string(batch), batch * H, T, d);
    const int64_t swin_windows[] = {64, 16, 4, 1}, swin_heads[] = {3, 6, 12, 24};
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t matrices = swin_batch * swin_windows[stage] * swin_heads[stage];
      for (auto& p : attention_products("swin_t b" + std::to_string(swin_batch) + " s" + std::to_string(stage + 1),
                                        matrices, 49, 32))
        products.push_back(p);
    }
    std::printf("\nbatched products, %d threads; median of %d, candidates alternating\n", threads, reps);
    std::printf("%-40s %8s %12s %12s %9s %12s\n", "product", "matrices", "per-matrix", "oneDNN mm", "ratio",
                "gemm_batched");
    for (const BatchedProduct& p : products) {
      const Tensor a = random({p.matrices, p.M * p.K}, 5), b = random({p.matrices, p.K * p.N}, 6);
      Tensor c = Tensor::empty({p.matrices, p.M * p.N});
      auto call = [&](decltype(&actlab::cpu::gemm_batched) path) {
        return [&, path] { path(p.trans_a, p.trans_b, p.matrices, p.M, p.N, p.K, a.data<float>(), b.data<float>(),
                                c.data<float>()); };
      };
      const auto ms = interleaved_median_ms({call(&actlab::cpu::gemm_batched_per_matrix),
                                             call(&actlab::cpu::gemm_batched_dnnl), call(&actlab::cpu::gemm_batched)},
                                            reps);
      std::printf("%s %8lld %9.3f ms %9.3f ms %8.2fx %9.3f ms\n", padded(p.what, 40).c_str(),
                  static_cast<long long>(p.matrices), ms[0], ms[1], ms[0] / ms[1], ms[2]);
    }
    return 0;
  } catch (const std::exception& e) {
    return actlab::report_error("bench_token", e);
  }
}
