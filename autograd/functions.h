// Differentiable operations on Variables. Each is its forward function plus its Node, in the .cpp
// of its family (functions_conv.cpp, functions_norm.cpp, functions_eltwise.cpp, functions_pool.cpp,
// functions_loss.cpp, functions_token.cpp); each Node says what it saves and in what form.
// Tested in tests/test_functions.cpp (naive references and central-difference gradient checks).
#pragma once
#include <cstdint>

#include "actlab/autograd/tape.h"

namespace actlab {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
};
// x: (N,C,H,W); w: (K,C/groups,R,S); b: (K) or undefined. Returns (N,K,P,Q).
// saves: x (lossy_ok: through the policy), w (a parameter: kept by reference, never packed).
Variable conv2d(const Variable& x, const Variable& w, const Variable& b, const Conv2dOptions& opt);

// x: (..., D); w: (M,D); b: (M) or undefined. Returns (..., M) = x·wᵀ + b.
// saves: x (lossy_ok) in its own shape — a (B, T, D) token map reaches the policy as one, and the policies
// lay 3-D saves out along the token axis (docs/policies.md) — and w (parameter).
Variable linear(const Variable& x, const Variable& w, const Variable& b);

// Training mode: batch statistics, updates running_mean/var in place. Eval: running statistics.
// x: (N,C,H,W) or (N,C); gamma, beta: (C). saves (training): x (lossy_ok), mean and invstd (C each).
Variable batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                    Tensor& running_var, bool training, float momentum = 0.1f, float eps = 1e-5f);

// GELU: x·Φ(x), or the tanh approximation. saves: x (lossy_ok: through the policy; no f32 copy kept
// beside it). In functions_token.cpp.
Variable gelu(const Variable& x, bool tanh_approx = false);
// LayerNorm over the last dimension; gamma, beta (D). saves: the normalized input x̂ (lossy_ok), gamma
// (parameter), rstd per row (exact). In functions_token.cpp.
Variable layer_norm(const Variable& x, const Variable& gamma, const Variable& beta, float eps = 1e-5f);

// Softmax of scale·x over the last dimension. saves: the output y (lossy_ok: through the policy — for
// attention it is the same tensor the following matmul saves, so it is packed once — with codes of at
// least kProbabilityBits bits). In functions_token.cpp.
Variable softmax(const Variable& x, float scale = 1.f);
// The fewest code bits a softmax output is kept with (SaveInfo::min_bits). Its backward,
// dx = y ⊙ (dy − Σ dy·y), scales each value's gradient by the probability itself, so an absolute error in a
// stored probability is relative to it: at 2 bits a row's small probabilities (most of an attention row)
// round to 0 or to a step near the largest one's. On a ViT-Tiny trained with AdamW, 2-bit softmax codes
// made the mean weight-gradient error of DIVISION Q=2 3.3 (1.25 with the probabilities at 8 bits, 1.25 kept
// exact: docs/policies.md, "Token maps"). Mesa keeps them at 8 bits; AC-GC's unbounded saves take 8 too.
constexpr int kProbabilityBits = 8;
// Batched matrix product over the last two dims (ops::matmul): a (..., M, K) or its transpose, b (..., K, N)
// or its transpose. saves: both operands as stored (lossy_ok): attention's (B, heads, T, d) maps, whose
// (T, d) planes a plane policy compresses — for q·kᵀ the second operand is k itself, already "transposed
// first". In functions_token.cpp.
Variable matmul(const Variable& a, const Variable& b, bool trans_a = false, bool trans_b = false);

// Views and copies between layouts (functions_eltwise.cpp). saves: nothing (shapes and offsets).
Variable reshape(const Variable& x, const Shape& shape);  // a view when x is contiguous
Variable permute(const Variable& x, const std::vector<int64_t>& order);  // a contiguous copy
std::vector<Variable> split(const Variable& x, int64_t dim, const std::vector<int64_t>& sizes);
// x[start:end:step] along dim (a contiguous copy); end is clamped like Tensor::slice.
Variable slice(const Variable& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// Element i along dim moves to (i + shift) mod size (torch.roll; Swin's shifted windows).
Variable roll(const Variable& x, int64_t shift, int64_t dim);
Variable concat(const std::vector<Variable>& xs, int64_t dim);
// x + p, p of shape (1, ...) broadcast over dim 0 (a position embedding). saves: nothing.
Variable add_rows(const Variable& x, const Variable& p);
// p (1, ...) repeated n times along dim 0 (a class token for every sample). saves: nothing.
Variable expand_rows(const Variable& p, int64_t n);
// Stochastic depth: each sample (dim 0) is zeroed with probability p, the others scaled by 1/(1-p)
// (training only). saves: the per-sample scale, exact (one f32 per sample). Randomness: philox(seed, stream, sample).
Variable drop_path(const Variable& x, float p, bool training, uint64_t seed, uint64_t stream);

// alpha·x. saves: nothing.
Variable scale(const Variable& x, float alpha);
// Rows of a parameter table (rows, d) at index (n, i64): (n, d) — a relative-position bias. saves: the index,
// exact.
Variable gather_rows(const Variable& table, const Tensor& index);

// saves: a 1-bit mask (x > 0), exact.
Variable relu(const Variable& x);
// saves: a 1-bit gradient mask (0 < x < 6), exact.
Variable relu6(const Variable& x);
// saves: nothing.
Variable add(const Variable& a, const Variable& b);
// relu(a + b) in one pass (the tail of a residual block). saves: a 1-bit mask, exact.
Variable add_relu(const Variable& a, const Variable& b);
// A view with dims start_dim.. merged. saves: nothing (the shape).
Variable flatten(const Variable& x, int64_t start_dim = 1);
// Keeps each element with probability 1-p and scales by 1/(1-p) (training only).
// saves: a 1-bit keep mask, exact. Randomness: philox(seed, stream, element).
Variable dropout(const Variable& x, float p, bool training, uint64_t seed, uint64_t stream);

struct Pool2dOptions {
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t padding = 0;
};
// saves: u8 argmax index per output element, exact.
Variable max_pool2d(const Variable& x, const Pool2dOptions& opt);
// saves: nothing (shapes).
Variable avg_pool2d(const Variable& x, const Pool2dOptions& opt);
// (N,C,H,W) -> (N,C). saves: nothing.
Variable global_avg_pool(const Variable& x);
// CIFAR ResNet option-A shortcut: x[:, :, ::stride, ::stride] zero-padded on channels to c_out.
// saves: nothing.
Variable shortcut_pad(const Variable& x, int64_t stride, int64_t c_out);

// Mean softmax cross-entropy of logits (N,K) against labels (N) i64, optional label smoothing.
// Returns a scalar of shape (1). saves: the probabilities (N,K), exact.
Variable cross_entropy(const Variable& logits, const Tensor& labels, float label_smoothing = 0.f);
// Number of rows whose arg-max equals the label.
int64_t count_correct(const Tensor& logits, const Tensor& labels);

// Σ t² over a f32 tensor of any device, summed in double on the host in element order (so both devices
// give the same number). For the gradient sensitivities the nodes report to a policy that asks
// (Node::observe_sensitivity); a GPU tensor is copied to the host first, as that happens every I steps.
double squared_norm(const Tensor& t);

}  // namespace actlab
