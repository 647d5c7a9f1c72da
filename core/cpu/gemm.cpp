// CPU GEMM: gemm() forwards to oneDNN's dnnl_sgemm (it detects AVX-512 at run time; the Debian
// OpenBLAS 0.3.21 picks a slow kernel on Zen 5 unless an environment variable forces it), and the batched
// products run oneDNN's matmul primitive (cached per shape) or the per-matrix loop, by measurement. The
// argument checks, that loop and the _ref specs are in gemm_ref.cpp. Tested in tests/test_cpu_conv.cpp.
#include "actlab/core/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "actlab/core/cpu/dnnl_common.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

// C = beta * C, with beta == 0 meaning "overwrite" (BLAS semantics: NaNs in C do not survive).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  check_gemm_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {  // dnnl_sgemm's handling of K == 0 is not documented
    scale_c(M, N, beta, C, ldc);
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                          A, lda, B, ldb, beta, C, ldc);
  ACTLAB_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status),
               " for M=", M, " N=", N, " K=", K, " trans_a=", trans_a, " trans_b=", trans_b,
               " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

namespace {

using dnnl::memory;

struct MatmulKey {
  int64_t batch, M, N, K;
  bool trans_a, trans_b;
  bool bf16 = false;  // A and B in bf16 (C stays f32)
  bool operator<(const MatmulKey& o) const {
    return std::tie(batch, M, N, K, trans_a, trans_b, bf16) < std::tie(o.batch, o.M, o.N, o.K, o.trans_a, o.trans_b, o.bf16);
  }
};

struct MatmulPlan {
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, scratchpad_md;
};

// op(X) (batch, rows, cols) of matrices packed one after another; a transposed X is stored (batch, cols,
// rows), which the strides say, so oneDNN reads it where it lies.
memory::desc operand_md(int64_t batch, int64_t rows, int64_t cols, bool transposed,
                        memory::data_type type = memory::data_type::f32) {
  const memory::dims strides = transposed ? memory::dims{rows * cols, 1, rows} : memory::dims{rows * cols, cols, 1};
  return memory::desc({batch, rows, cols}, type, strides);
}

std::unique_ptr<MatmulPlan> build_matmul_plan(const MatmulKey& k) {
  auto plan = std::make_unique<MatmulPlan>();
  const auto in_type = k.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  plan->a_md = operand_md(k.batch, k.M, k.K, k.trans_a, in_type);
  plan->b_md = operand_md(k.batch, k.K, k.N, k.trans_b, in_type);
  plan->c_md = operand_md(k.batch, k.M, k.N, false);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan->a_md, plan->b_md, plan->c_md),
                                        user_scratchpad_attr(), dnnl_engine());
  plan->prim = dnnl::matmul(pd);
  plan->scratchpad_md = pd.scratchpad_desc();
  return plan;
}

// Plans are created once and never move (unique_ptr), so the reference stays valid for the process.
const MatmulPlan& matmul_plan(const MatmulKey& key) {
  static std::mutex mutex;
  static std::map<MatmulKey, std::unique_ptr<MatmulPlan>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_matmul_plan(key)).first;
  return *it->second;
}

}  // namespace

namespace {
// One call of a cached matmul plan on operands already in its types (f32, or bf16 bits for key.bf16).
void run_matmul(const MatmulKey& key, const void* A, const void* B, float* C) {
  ACTLAB_CHECK(key.batch >= 0 && key.M >= 0 && key.N >= 0 && key.K >= 0, "gemm_batched: negative size batch=",
               key.batch, " M=", key.M, " N=", key.N, " K=", key.K);
  if (key.batch == 0 || key.M == 0 || key.N == 0) return;
  if (key.K == 0) {  // an empty sum; A and B may be null
    std::fill(C, C + key.batch * key.M * key.N, 0.f);
    return;
  }
  try {
    const MatmulPlan& plan = matmul_plan(key);
    dnnl::engine& eng = dnnl_engine();
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(plan.a_md, eng, const_cast<void*>(A))},
                                         {DNNL_ARG_WEIGHTS, memory(plan.b_md, eng, const_cast<void*>(B))},
                                         {DNNL_ARG_DST, memory(plan.c_md, eng, C)}};
    std::vector<Buffer> scratchpad;
    bind_scratchpad(args, plan.scratchpad_md, scratchpad);
    plan.prim.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  } catch (const dnnl::error& e) {
    ACTLAB_FAIL("oneDNN ", key.bf16 ? "bf16 " : "", "matmul failed for batch=", key.batch, " M=", key.M, " N=", key.N,
                " K=", key.K, " trans_a=", key.trans_a, " trans_b=", key.trans_b, ": ", e.what(), " (status ",
                static_cast<int>(e.status), ")");
  }
}
}  // namespace

void gemm_batched_dnnl(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                       const float* B, float* C) {
  run_matmul({batch, M, N, K, trans_a, trans_b}, A, B, C);
}

void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                       const float* B, float* C) {
  const MatmulKey key{batch, M, N, K, trans_a, trans_b, true};
  if (batch <= 0 || M <= 0 || N <= 0 || K <= 0) return run_matmul(key, A, B, C);  // nothing to round
  // The matrices are packed one after another in either layout: rounding is one pass over each operand.
  const int64_t a_n = batch * M * K, b_n = batch * K * N;
  const Buffer a16(static_cast<size_t>(a_n) * 2, MemTag::Workspace), b16(static_cast<size_t>(b_n) * 2, MemTag::Workspace);
  to_bf16(a16.as<uint16_t>(), A, a_n);
  to_bf16(b16.as<uint16_t>(), B, b_n);
  run_matmul(key, a16.data(), b16.data(), C);
}

void gemm_bf16_bits(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    const uint16_t* B, float* C) {
  run_matmul({1, M, N, K, trans_a, trans_b, true}, A, B, C);
}

// The measured choice (bench/bench_token.cpp; figures in bench/RESULTS.md, "Vision transformers"): oneDNN's
// matmul beat the per-matrix loop on every ViT-Tiny and Swin-T attention product whose A is read as stored
// (q·kᵀ and dO·vᵀ: NT; attn·v and dS·k: NN), but with A transposed (dSᵀ·q and attnᵀ·dO: TN) it lost on Swin-T's
// (49×49)ᵀ·(49×32) products and won by only 5-15 % on ViT-Tiny's, a lead that shrank as the batch grew, so
// keeping it would take a cache-size threshold fitted to one CPU. TT, which no op uses, was not measured; it
// goes with TN.
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, const float* A,
                  const float* B, float* C) {
  if (trans_a)
    gemm_batched_per_matrix(trans_a, trans_b, batch, M, N, K, A, B, C);
  else
    gemm_batched_dnnl(trans_a, trans_b, batch, M, N, K, A, B, C);
}

}  // namespace actlab::cpu
