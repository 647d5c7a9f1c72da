// Synchronized batch norm (dist/sync_batch_norm.h): the sums on the tensors' device, the statistics on the host.
#include "actlab/dist/sync_batch_norm.h"

#include <cmath>

#include "actlab/autograd/tape.h"
#include "actlab/core/ops.h"

namespace actlab {
namespace {

bool wants_grad(const Node::Edge& e) { return e.leaf || !e.node.expired(); }

// (N, C, S): the batch, the channels, the spatial size (1 for (N,C) inputs).
struct Dims {
  int64_t n, c, s;
};
Dims dims_of(const Tensor& x) {
  ACTLAB_CHECK((x.dim() == 4 || x.dim() == 2) && x.dtype() == DType::F32,
               "sync batch norm needs an (N,C,H,W) or (N,C) f32 tensor, got ", x.str(), " on ", x.device().str());
  return {x.size(0), x.size(1), x.numel() / (x.size(0) * x.size(1))};
}

// C floats made on the host, on `device`.
Tensor on_device(const std::vector<float>& values, Device device) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())}).to(device);
}

class SyncBatchNormNode final : public Node {
 public:
  SyncBatchNormNode(Communicator& comm, double count) : comm_(comm), count_(count) {}
  const char* name() const override { return "sync_batchnorm2d"; }
  const SlotList& slots() const override {
    static const SlotList s = {"input", "weight", "mean", "invstd"};
    return s;
  }
  // Batch norm's own backward split at its reduction (core/ops.h batchnorm_grad_sums): this rank's sums
  // give its parameter gradients, the global batch's sums the input gradient.
  // A compressed 4-D input is decoded channel by channel, once for the sums and once for dx, as batch
  // norm's own backward reads it (the full-size input is never written out; bit-identical to loading it).
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    const Tensor dy = grad_outputs[0].contiguous();
    const Tensor gamma = load("weight"), mean = load("mean"), invstd = load("invstd");
    const std::unique_ptr<ChannelReader> reader =
        dy.device().is_cpu() && dy.dim() == 4 ? load_channels("input") : nullptr;
    const Tensor x = reader ? Tensor() : load("input").contiguous();
    const auto read = [&](int64_t c, float* out) { reader->read(c, out); };
    // [Σ dy (C), Σ dy·(x - mean) (C)]
    std::vector<double> sums = reader ? ops::batchnorm_grad_sums_channels(dy, reader->shape(), read, mean)
                                      : ops::batchnorm_grad_sums(dy, x, mean);
    const int64_t C = mean.numel();
    const std::vector<float> rstd = invstd.to_vector();
    std::vector<float> dgamma(static_cast<size_t>(C)), dbeta(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      dbeta[c] = static_cast<float>(sums[c]);
      dgamma[c] = static_cast<float>(sums[C + c] * rstd[c]);
    }
    comm_.allreduce(sums, ReduceOp::Sum);
    const Tensor dx = reader ? ops::batchnorm_backward_from_sums_channels(dy, reader->shape(), read, gamma, mean,
                                                                          invstd, sums, count_)
                             : ops::batchnorm_backward_from_sums(dy, x, gamma, mean, invstd, sums, count_);
    std::vector<Tensor> grads(3);
    if (wants_grad(inputs[0])) grads[0] = dx;
    if (wants_grad(inputs[1])) grads[1] = on_device(dgamma, dy.device());
    if (wants_grad(inputs[2])) grads[2] = on_device(dbeta, dy.device());
    return grads;
  }
 private:
  Communicator& comm_;
  double count_;  // values per channel in the global batch
};

}  // namespace

Variable sync_batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                         Tensor& running_var, float momentum, float eps, Communicator& comm) {
  const Tensor xin = x.data().contiguous();
  const Dims d = dims_of(xin);
  const Device device = xin.device();
  // Round 1: sums and the global count, so every rank holds the same mean. Round 2: squared deviations
  // from it (no cancellation, as a shifted one-pass sum would risk with the ranks' different shifts).
  std::vector<double> sums = ops::channel_sums(xin);
  sums.push_back(static_cast<double>(d.n * d.s));
  comm.allreduce(sums, ReduceOp::Sum);
  const double count = sums[d.c];
  ACTLAB_CHECK(count > 1, "sync batch norm: need more than 1 value per channel over all ranks, got ", count);
  std::vector<double> mean(sums.begin(), sums.begin() + d.c);
  for (double& m : mean) m /= count;
  std::vector<double> squares = ops::channel_square_deviations(xin, mean);
  comm.allreduce(squares, ReduceOp::Sum);
  std::vector<float> rm = running_mean.to_vector(), rv = running_var.to_vector();
  std::vector<float> save_mean(static_cast<size_t>(d.c)), save_invstd(save_mean.size()), batch_var(save_mean.size());
  for (int64_t c = 0; c < d.c; ++c) {
    const double var = squares[c] / count;  // biased, for normalising
    save_mean[c] = static_cast<float>(mean[c]);
    batch_var[c] = static_cast<float>(var);
    save_invstd[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    rm[c] = static_cast<float>((1.0 - momentum) * rm[c] + momentum * mean[c]);
    rv[c] = static_cast<float>((1.0 - momentum) * rv[c] + momentum * var * count / (count - 1));
  }
  // In place, so the layer's handles on its buffers see the update wherever they live.
  copy_bytes(running_mean.raw_data(), running_mean.device(), rm.data(), Device::cpu(), rm.size() * sizeof(float));
  copy_bytes(running_var.raw_data(), running_var.device(), rv.data(), Device::cpu(), rv.size() * sizeof(float));
  running_mean.storage()->bump_version();
  running_var.storage()->bump_version();
  const Tensor mean_t = on_device(save_mean, device), invstd_t = on_device(save_invstd, device);
  // With the global batch's statistics in hand, normalising is batch norm's own per-channel affine map
  // (its inference kernel, which takes the statistics as given).
  Tensor y = ops::batchnorm_forward_eval(xin, gamma.data(), beta.data(), mean_t, on_device(batch_var, device), eps);
  auto node = make_node<SyncBatchNormNode>({&x, &gamma, &beta}, comm, count);
  if (node) {
    node->save_lossy("input", xin);
    node->save_exact("weight", gamma.data());
    node->save_exact("mean", mean_t);
    node->save_exact("invstd", invstd_t);
  }
  return make_output(std::move(y), node);
}

}  // namespace actlab
