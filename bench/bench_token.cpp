// Benchmark of the transformer ops' CPU paths against oneDNN's primitives for the same work, at the
// shapes of vit_tiny_cifar at batch 128 (28² images: 50 tokens, width 192, 3 heads of 64): softmax over
// attention rows, LayerNorm forward (with the x̂ it keeps for backward), and attention's batched products.
// Columns: the spec loops (cpu::*_ref, core/cpu/kernels_token.cpp), what actlab runs (ops::, on the CPU
// oneDNN's softmax and layer normalization since this measurement — kernels_token_dnnl.cpp — and
// cpu::gemm_batched for matmul), and oneDNN's primitive alone. Median of --reps after a warm-up, all
// measured alternately in one process. Results: bench/RESULTS.md, "Vision transformers".
// Usage: bench_token [--batch 128] [--reps 20] [--threads 2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"
#include "actlab/core/ops.h"

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

void row(const char* what, double ref, double own, double dnnl) {
  if (ref > 0) {
    std::printf("%-44s %9.3f ms %9.3f ms %9.3f ms\n", what, ref, own, dnnl);
  } else {
    std::printf("%-44s %12s %9.3f ms %9.3f ms\n", what, "-", own, dnnl);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t batch = 128;
    int reps = 20, threads = 2;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        ACTLAB_CHECK(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a == "--batch") batch = std::stoll(value());
      else if (a == "--reps") reps = std::stoi(value());
      else if (a == "--threads") threads = std::stoi(value());
      else ACTLAB_FAIL("unknown argument '", a, "' (see the header of bench/bench_token.cpp)");
    }
    ACTLAB_CHECK(batch >= 1 && reps >= 1 && threads >= 1, "--batch, --reps and --threads must be >= 1");
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
    for (const bool scores : {true, false}) {  // q·kᵀ (T×d by d×T) and attn·v (T×T by T×d), B·H matrices
      const int64_t M = T, K = scores ? d : T, N = scores ? T : d, n = batch * H;
      const Tensor a = random({n, M, K}, 5), bt = random(scores ? actlab::Shape{n, N, K} : actlab::Shape{n, K, N}, 6);
      Tensor c = Tensor::empty({n, M, N});
      const memory::desc a_md({n, M, K}, memory::data_type::f32, memory::format_tag::abc);
      const memory::desc b_md({n, K, N}, memory::data_type::f32, scores ? memory::format_tag::acb : memory::format_tag::abc);
      const memory::desc c_md({n, M, N}, memory::data_type::f32, memory::format_tag::abc);
      memory am(a_md, engine, a.raw_data()), bm(b_md, engine, bt.raw_data()), cm(c_md, engine, c.raw_data());
      dnnl::matmul prim(dnnl::matmul::primitive_desc({a_md, b_md, c_md}, engine));
      const double own = median_ms([&] { actlab::ops::matmul(a, bt, false, scores); }, reps);
      const double dn = median_ms([&] {
        prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        stream.wait();
      }, reps);
      row(scores ? "matmul q·kᵀ (B·3 of 50x64 · 64x50)" : "matmul attn·v (B·3 of 50x50 · 50x64)", 0, own, dn);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_token: error: %s\n", e.what());
    return 1;
  }
}
