// CUDA softmax cross-entropy (mean over the batch, label smoothing) forward/backward and top-1 counting.
// Forward: one warp per row (max, Σexp, Σlogits by shuffles; the row's loss in double, from the
// log-sum-exp as on the CPU), then one block adds the rows in a fixed order. Labels are checked on the
// device; the first bad row is reported after one synchronization. Contracts in core/cuda/kernels.h (CPU
// twins: core/cpu/kernels_loss.cpp); tested in tests/test_cuda_ops.cpp.
#include <cmath>

#include "actlab/core/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/kernels.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// row_loss[i] = -Σ_k t_k·log softmax(row)_k; probs row i = softmax. A label outside [0, K) records the
// smallest such row in *bad_row (atomicMin) and that row's loss is NaN.
__global__ void softmax_ce_rows(double* row_loss, float* probs, unsigned long long* bad_row, const float* logits,
                                const int64_t* labels, int64_t N, int64_t K, float smoothing) {
  const int lane = threadIdx.x & 31;
  for (int64_t i = global_thread() >> 5; i < N; i += grid_threads() >> 5) {
    const float* row = logits + i * K;
    float* prow = probs + i * K;
    float max_v = -INFINITY;
    for (int64_t k = lane; k < K; k += 32) max_v = fmaxf(max_v, row[k]);
    max_v = warp_max(max_v);
    float sum_exp = 0.f;
    double sum_logits = 0.0;
    for (int64_t k = lane; k < K; k += 32) {
      const float e = expf(row[k] - max_v);
      prow[k] = e;
      sum_exp += e;
      sum_logits += row[k];
    }
    sum_exp = warp_sum(sum_exp);
    sum_logits = warp_sum(sum_logits);
    const float inv = 1.f / sum_exp;
    for (int64_t k = lane; k < K; k += 32) prow[k] *= inv;
    if (lane == 0) {
      const int64_t label = labels[i];
      if (label < 0 || label >= K) {
        atomicMin(bad_row, static_cast<unsigned long long>(i));
        row_loss[i] = NAN;
      } else {
        const double lse = static_cast<double>(max_v) + log(static_cast<double>(sum_exp));
        row_loss[i] = lse - (1.0 - smoothing) * row[label] - smoothing * sum_logits / static_cast<double>(K);
      }
    }
  }
}

// loss[0] = Σ row_loss / N, one block, fixed order per thread then a tree: reproducible run to run.
__global__ void mean_of_rows(float* loss, const double* row_loss, int64_t N) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) sum += row_loss[i];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(sum / static_cast<double>(N));
}

__global__ void softmax_ce_backward_kernel(float* dlogits, const float* probs, const int64_t* labels, int64_t N,
                                           int64_t K, float scale, float off_target, float on_target) {
  for (int64_t j = global_thread(); j < N * K; j += grid_threads()) {
    const int64_t i = j / K, k = j % K;
    float d = (probs[j] - off_target) * scale;
    if (labels[i] == k) d -= on_target * scale;
    dlogits[j] = d;
  }
}

__global__ void top1_kernel(unsigned long long* correct, const float* logits, const int64_t* labels, int64_t N,
                            int64_t K) {
  for (int64_t i = global_thread(); i < N; i += grid_threads()) {
    const float* row = logits + i * K;
    int64_t best = 0;
    for (int64_t k = 1; k < K; ++k)
      if (row[k] > row[best]) best = k;
    if (best == labels[i]) atomicAdd(correct, 1ull);
  }
}

void check_sizes(const char* op, int64_t N, int64_t K, float smoothing) {
  ACTLAB_CHECK(N > 0 && K > 0, op, ": sizes must be positive, got N=", N, " K=", K);
  ACTLAB_CHECK(smoothing >= 0.f && smoothing <= 1.f, "cross_entropy: label smoothing must be in [0, 1], got ",
               smoothing);
}

}  // namespace

void softmax_cross_entropy_forward(float* loss, float* probs, const float* logits, const int64_t* labels, int64_t N,
                                   int64_t K, float smoothing, int device, cudaStream_t cuda_stream) {
  check_sizes("softmax_cross_entropy_forward", N, K, smoothing);
  const Device gpu = Device::cuda(device);
  Buffer row_loss(static_cast<size_t>(N) * sizeof(double), MemTag::Workspace, gpu);
  Buffer bad_row(sizeof(unsigned long long), MemTag::Workspace, gpu);
  ACTLAB_CUDA_CHECK(cudaMemsetAsync(bad_row.data(), 0xFF, sizeof(unsigned long long), cuda_stream));  // "none"
  softmax_ce_rows<<<grid_blocks(N * 32), kBlockThreads, 0, cuda_stream>>>(row_loss.as<double>(), probs,
                                                                    bad_row.as<unsigned long long>(), logits, labels,
                                                                    N, K, smoothing);
  ACTLAB_CUDA_CHECK_LAUNCH();
  mean_of_rows<<<1, 1024, 0, cuda_stream>>>(loss, row_loss.as<double>(), N);
  ACTLAB_CUDA_CHECK_LAUNCH();
  unsigned long long first_bad = 0;
  ACTLAB_CUDA_CHECK(cudaMemcpyAsync(&first_bad, bad_row.data(), sizeof first_bad, cudaMemcpyDeviceToHost, cuda_stream));
  ACTLAB_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  if (first_bad != ~0ull) {
    int64_t label = 0;
    ACTLAB_CUDA_CHECK(cudaMemcpyAsync(&label, labels + first_bad, sizeof label, cudaMemcpyDeviceToHost, cuda_stream));
    ACTLAB_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
    ACTLAB_FAIL("softmax_cross_entropy_forward: label ", label, " at index ", first_bad, " is outside [0, ", K, ")");
  }
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int64_t* labels, int64_t N, int64_t K,
                                    float smoothing, float dloss, cudaStream_t cuda_stream) {
  check_sizes("softmax_cross_entropy_backward", N, K, smoothing);
  const float scale = dloss / static_cast<float>(N);
  const float off_target = smoothing / static_cast<float>(K);
  const float on_target = 1.f - smoothing;
  softmax_ce_backward_kernel<<<grid_blocks(N * K), kBlockThreads, 0, cuda_stream>>>(dlogits, probs, labels, N, K, scale,
                                                                              off_target, on_target);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

int64_t top1_correct(const float* logits, const int64_t* labels, int64_t N, int64_t K, int device,
                     cudaStream_t cuda_stream) {
  ACTLAB_CHECK(N > 0 && K > 0, "top1_correct: sizes must be positive, got N=", N, " K=", K);
  Buffer counter(sizeof(unsigned long long), MemTag::Workspace, Device::cuda(device));
  ACTLAB_CUDA_CHECK(cudaMemsetAsync(counter.data(), 0, sizeof(unsigned long long), cuda_stream));
  top1_kernel<<<grid_blocks(N), kBlockThreads, 0, cuda_stream>>>(counter.as<unsigned long long>(), logits, labels, N, K);
  ACTLAB_CUDA_CHECK_LAUNCH();
  unsigned long long correct = 0;
  ACTLAB_CUDA_CHECK(cudaMemcpyAsync(&correct, counter.data(), sizeof correct, cudaMemcpyDeviceToHost, cuda_stream));
  ACTLAB_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
  return static_cast<int64_t>(correct);
}

}  // namespace actlab::cuda
