// Synchronized batch norm for data-parallel training (--sync-bn): training-mode batch norm whose mean
// and variance are those of the global batch, every rank's samples together, as one process would
// compute them; its backward all-reduces the two per-channel sums the input gradient needs. The
// trainer installs it for every BatchNorm2d (layers/layers.h, set_batch_norm_train_override). On CPU or
// GPU ranks: the sums are made on the tensors' device (core/ops.h channel_sums, batchnorm_grad_sums) and
// all-reduced on the host (2C doubles per round). Tested in tests/test_dist.cpp (one-process communicator
// and mpirun); the GPU case in tests/test_cuda_ops.cpp.
#pragma once
#include "actlab/autograd/variable.h"
#include "actlab/dist/communicator.h"

namespace actlab {

// x: (N,C,H,W) or (N,C) f32; gamma, beta: (C), on x's device. Updates running_mean/var in place from the
// global statistics (the variance unbiased over the global count). Collective: every rank calls it for
// the same layers in the same order, in forward and (through its node) in backward.
// saves: x (lossy_ok, through the policy), gamma (parameter), mean and invstd (C floats each, exact).
// Parameter gradients are this rank's part (the gradient reducer averages them); the input gradient
// accounts for every rank's loss through the shared statistics.
Variable sync_batch_norm(const Variable& x, const Variable& gamma, const Variable& beta, Tensor& running_mean,
                         Tensor& running_var, float momentum, float eps, Communicator& comm);

}  // namespace actlab
