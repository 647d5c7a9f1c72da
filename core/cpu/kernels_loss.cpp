// CPU softmax cross-entropy (mean over the batch, label smoothing) forward/backward and top-1
// accuracy. Contracts in core/cpu/kernels.h; tested in tests/test_cpu_kernels.cpp.
// Labels are validated serially before any parallel loop, because an exception must not leave an
// OpenMP region.
#include <algorithm>
#include <cmath>

#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"

namespace actlab::cpu {
namespace {

void check_labels(const char* op, const int64_t* labels, int64_t N, int64_t K) {
  ACTLAB_CHECK(N > 0 && K > 0, op, ": sizes must be positive, got N=", N, " K=", K);
  for (int64_t i = 0; i < N; ++i)
    ACTLAB_CHECK(labels[i] >= 0 && labels[i] < K, op, ": label ", labels[i], " at index ", i,
                 " is outside [0, ", K, ")");
}

void check_smoothing(float smoothing) {
  ACTLAB_CHECK(smoothing >= 0.f && smoothing <= 1.f,
               "cross_entropy: label smoothing must be in [0, 1], got ", smoothing);
}

// probs_row = softmax(row); returns -Σ target·log(softmax) for this row, computed from the
// log-sum-exp (never from log(probs), which underflows to -inf for very negative logits).
double softmax_ce_row(float* probs_row, const float* row, int64_t label, int64_t K,
                      float smoothing) {
  float max_v = row[0];
  for (int64_t k = 1; k < K; ++k) max_v = std::max(max_v, row[k]);
  float sum_exp = 0.f;
  double sum_logits = 0.0;
  for (int64_t k = 0; k < K; ++k) {
    const float e = std::exp(row[k] - max_v);
    probs_row[k] = e;
    sum_exp += e;
    sum_logits += row[k];
  }
  const float inv = 1.f / sum_exp;
  for (int64_t k = 0; k < K; ++k) probs_row[k] *= inv;
  const double log_sum_exp = static_cast<double>(max_v) + std::log(static_cast<double>(sum_exp));
  // -Σ_k t_k (x_k - lse) with t = (1 - eps)·onehot + eps/K and Σ t_k = 1.
  return log_sum_exp - (1.0 - smoothing) * row[label] - smoothing * sum_logits / K;
}

}  // namespace

void softmax_cross_entropy_forward(float* loss, float* probs, const float* logits,
                                   const int64_t* labels, int64_t N, int64_t K, float smoothing) {
  check_labels("softmax_cross_entropy_forward", labels, N, K);
  check_smoothing(smoothing);
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) \
    if (parallel : N * K >= kParallelGrain)
  for (int64_t i = 0; i < N; ++i)
    total += softmax_ce_row(probs + i * K, logits + i * K, labels[i], K, smoothing);
  *loss = static_cast<float>(total / N);
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int64_t* labels,
                                    int64_t N, int64_t K, float smoothing, float dloss) {
  check_labels("softmax_cross_entropy_backward", labels, N, K);
  check_smoothing(smoothing);
  const float scale = dloss / static_cast<float>(N);
  const float off_target = smoothing / static_cast<float>(K);  // target of every class
  const float on_target = 1.f - smoothing;                     // added on the label
#pragma omp parallel for schedule(static) if (parallel : N * K >= kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    const float* p = probs + i * K;
    float* d = dlogits + i * K;
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) d[k] = (p[k] - off_target) * scale;
    d[labels[i]] -= on_target * scale;
  }
}

int64_t top1_correct(const float* logits, const int64_t* labels, int64_t N, int64_t K) {
  check_labels("top1_correct", labels, N, K);
  int64_t correct = 0;
#pragma omp parallel for schedule(static) reduction(+ : correct) \
    if (parallel : N * K >= kParallelGrain)
  for (int64_t i = 0; i < N; ++i) {
    const float* row = logits + i * K;
    int64_t best = 0;
    for (int64_t k = 1; k < K; ++k)
      if (row[k] > row[best]) best = k;
    correct += best == labels[i];
  }
  return correct;
}

}  // namespace actlab::cpu
