// CPU vs CUDA parity of every op of core/ops.h: the same random inputs go through both backends and the
// results are compared — bit for bit where the kernels promise the CPU's arithmetic (masks, argmax,
// ReLU/add/dropout, pooling gathers, shortcut), to fp32 rounding elsewhere (cuDNN/cuBLAS, reductions) —
// plus mixed-device refusal, in-place tensor ops, Module::to and the conv plan cache. Without a GPU
// every case prints "SKIPPED: no CUDA device: ..." and returns. Run: actlab_tests -tc='cuda ops*'.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actlab/autograd/tape.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/ops.h"
#include "actlab/core/precision.h"
#include "actlab/core/token_math.h"
#include "actlab/dist/sync_batch_norm.h"
#include "actlab/layers/layers.h"
#include "tests/test_cuda_util.h"

#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/conv.h"
#endif

using namespace actlab;
using namespace actlab::testing;

namespace {

// Runs f(device) on the CPU and on cuda:0 with inputs moved there, returning both results.
// Convolutions are compared to 1e-4 of the largest value: cuDNN may pick Winograd or FFT algorithms,
// whose fp32 error is larger than a direct sum's; a layout or indexing bug is off by O(1).
struct Pair {
  Tensor cpu, cuda;
};
template <typename F>
Pair both(F f) {
  return {f(Device::cpu()), f(gpu())};
}

Tensor on(const Tensor& t, Device d) { return t.to(d); }

void check_conv(const ops::ConvParams& p, const Shape& x_shape, const Shape& w_shape, bool bias, const char* name) {
  const Tensor x = uniform(x_shape, 1), w = uniform(w_shape, 2, -0.5f, 0.5f);
  const Tensor b = bias ? uniform({w_shape[0]}, 3) : Tensor();
  const Pair y = both([&](Device d) { return ops::conv2d_forward(on(x, d), on(w, d), b.defined() ? on(b, d) : b, p); });
  check_close(y.cpu, y.cuda, 1e-4, std::string(name) + " forward");
  const Tensor dy = uniform(y.cpu.shape(), 4);
  const Pair dx = both([&](Device d) { return ops::conv2d_backward_data(on(dy, d), on(w, d), x_shape, p); });
  check_close(dx.cpu, dx.cuda, 1e-4, std::string(name) + " backward data");
  Tensor db_cpu, db_cuda;
  const Tensor dw_cpu = ops::conv2d_backward_weight(dy, x, w_shape, p, bias, &db_cpu);
  const Tensor dw_cuda = ops::conv2d_backward_weight(on(dy, gpu()), on(x, gpu()), w_shape, p, bias, &db_cuda);
  check_close(dw_cpu, dw_cuda, 1e-4, std::string(name) + " backward weight");
  if (bias) check_close(db_cpu, db_cuda, 1e-4, std::string(name) + " backward bias");
}

}  // namespace

TEST_CASE("cuda ops: conv2d forward, backward data and weight match the CPU (groups, depthwise, strides)") {
  if (!gpu_or_skip("conv2d parity")) return;
  const LiveBytesOnBoth live;
  check_conv({1, 1, 1}, {2, 3, 9, 11}, {8, 3, 3, 3}, true, "3x3 pad 1");
  check_conv({2, 1, 1}, {3, 8, 10, 10}, {16, 8, 3, 3}, false, "3x3 stride 2");
  check_conv({2, 0, 1}, {2, 8, 9, 9}, {12, 8, 1, 1}, false, "1x1 stride 2");
  check_conv({1, 1, 4}, {2, 8, 7, 7}, {12, 2, 3, 3}, true, "groups 4");
  check_conv({1, 1, 16}, {2, 16, 8, 8}, {16, 1, 3, 3}, false, "depthwise");
  check_conv({2, 3, 1}, {1, 3, 20, 20}, {6, 3, 7, 7}, false, "7x7 stride 2 pad 3");
  live.check();
}

#if defined(ACTLAB_WITH_CUDA)
TEST_CASE("cuda ops: conv2d selects an algorithm once per shape and direction") {
  if (!gpu_or_skip("the conv plan cache")) return;
  cuda::conv_clear_cache();
  const Tensor x = uniform({2, 4, 6, 6}, 5).to(gpu()), w = uniform({4, 4, 3, 3}, 6).to(gpu());
  const ops::ConvParams p{1, 1, 1};
  const int64_t searches = cuda::conv_algorithm_searches();
  const Tensor y1 = ops::conv2d_forward(x, w, Tensor(), p);
  CHECK(cuda::conv_plan_count() == 1);
  CHECK(cuda::conv_algorithm_searches() == searches + 1);
  const Tensor y2 = ops::conv2d_forward(x, w, Tensor(), p);
  CHECK(cuda::conv_algorithm_searches() == searches + 1);  // cached
  check_same_bytes(y1, y2, "repeated forward");
  (void)ops::conv2d_backward_data(y1, w, x.shape(), p);
  CHECK(cuda::conv_algorithm_searches() == searches + 2);  // a new direction of the same plan
  CHECK(cuda::conv_plan_count() == 1);
  (void)ops::conv2d_forward(uniform({3, 4, 6, 6}, 7).to(gpu()), w, Tensor(), p);  // a new shape
  CHECK(cuda::conv_plan_count() == 2);
  // Benchmark mode finds its own plans and hands its search workspace back.
  cuda::math_options().benchmark = true;
  const Tensor y3 = ops::conv2d_forward(x, w, Tensor(), p);
  cuda::math_options().benchmark = false;
  CHECK(cuda::conv_plan_count() == 3);
  check_close(y1, y3, 1e-5, "benchmark-mode forward");
}
#endif

TEST_CASE("cuda ops: linear forward and backward match the CPU") {
  if (!gpu_or_skip("linear parity")) return;
  const LiveBytesOnBoth live;
  {
    const Tensor x = uniform({7, 33}, 1), w = uniform({10, 33}, 2), b = uniform({10}, 3), dy = uniform({7, 10}, 4);
    const Pair y = both([&](Device d) { return ops::linear_forward(on(x, d), on(w, d), on(b, d)); });
    check_close(y.cpu, y.cuda, 1e-5, "linear forward");
    const Pair dx = both([&](Device d) { return ops::linear_backward_data(on(dy, d), on(w, d)); });
    check_close(dx.cpu, dx.cuda, 1e-5, "linear backward data");
    Tensor db_cpu, db_cuda;
    const Tensor dw_cpu = ops::linear_backward_weight(dy, x, true, &db_cpu);
    const Tensor dw_cuda = ops::linear_backward_weight(on(dy, gpu()), on(x, gpu()), true, &db_cuda);
    check_close(dw_cpu, dw_cuda, 1e-5, "linear backward weight");
    check_same_bytes(db_cpu, db_cuda, "linear backward bias (rows added in order)");
  }
  live.check();
}

TEST_CASE("cuda ops: batch norm train, eval and both backwards match the CPU") {
  if (!gpu_or_skip("batch norm parity")) return;
  const LiveBytesOnBoth live;
  {
    const Shape shape{5, 6, 7, 9};
    const Tensor x = uniform(shape, 1, 2.f, 5.f);  // |mean| >> std: the shifted moments matter
    const Tensor gamma = uniform({6}, 2, 0.5f, 1.5f), beta = uniform({6}, 3), dy = uniform(shape, 4);
    Tensor rm_cpu = uniform({6}, 5), rv_cpu = uniform({6}, 6, 0.5f, 2.f);
    Tensor rm_cuda = rm_cpu.to(gpu()), rv_cuda = rv_cpu.to(gpu());
    Tensor mean_cpu, invstd_cpu, mean_cuda, invstd_cuda;
    const Tensor y_cpu =
        ops::batchnorm_forward_train(x, gamma, beta, rm_cpu, rv_cpu, 0.1f, 1e-5f, &mean_cpu, &invstd_cpu);
    const Tensor y_cuda = ops::batchnorm_forward_train(on(x, gpu()), on(gamma, gpu()), on(beta, gpu()), rm_cuda,
                                                       rv_cuda, 0.1f, 1e-5f, &mean_cuda, &invstd_cuda);
    check_close(y_cpu, y_cuda, 1e-5, "bn train y");
    check_close(mean_cpu, mean_cuda, 1e-6, "bn save_mean");
    check_close(invstd_cpu, invstd_cuda, 1e-5, "bn save_invstd");
    check_close(rm_cpu, rm_cuda, 1e-6, "bn running_mean");
    check_close(rv_cpu, rv_cuda, 1e-5, "bn running_var");

    Tensor dg_cpu, dbt_cpu, dg_cuda, dbt_cuda;
    const Tensor dx_cpu = ops::batchnorm_backward(dy, x, gamma, mean_cpu, invstd_cpu, &dg_cpu, &dbt_cpu);
    const Tensor dx_cuda = ops::batchnorm_backward(on(dy, gpu()), on(x, gpu()), on(gamma, gpu()), mean_cuda,
                                                   invstd_cuda, &dg_cuda, &dbt_cuda);
    check_close(dx_cpu, dx_cuda, 1e-4, "bn backward dx");
    check_close(dg_cpu, dg_cuda, 1e-5, "bn backward dgamma");
    check_close(dbt_cpu, dbt_cuda, 1e-5, "bn backward dbeta");

    const Pair ye = both([&](Device d) {
      return ops::batchnorm_forward_eval(on(x, d), on(gamma, d), on(beta, d), on(rm_cpu, d), on(rv_cpu, d), 1e-5f);
    });
    check_close(ye.cpu, ye.cuda, 1e-5, "bn eval y");
    Tensor dge_cpu, dbe_cpu, dge_cuda, dbe_cuda;
    const Tensor dxe_cpu = ops::batchnorm_backward_eval(dy, x, gamma, rm_cpu, rv_cpu, 1e-5f, &dge_cpu, &dbe_cpu);
    const Tensor dxe_cuda = ops::batchnorm_backward_eval(on(dy, gpu()), on(x, gpu()), on(gamma, gpu()),
                                                         on(rm_cpu, gpu()), on(rv_cpu, gpu()), 1e-5f, &dge_cuda,
                                                         &dbe_cuda);
    check_close(dxe_cpu, dxe_cuda, 1e-5, "bn eval backward dx");
    check_close(dge_cpu, dge_cuda, 1e-5, "bn eval backward dgamma");
    check_close(dbe_cpu, dbe_cuda, 1e-5, "bn eval backward dbeta");
  }
  live.check();
}

TEST_CASE("cuda ops: ReLU, ReLU6, add+ReLU, add and dropout are bit-identical, masks included") {
  if (!gpu_or_skip("element-wise parity")) return;
  const LiveBytesOnBoth live;
  {
    const int64_t n = 100003;  // not a multiple of 32: the last mask word is partial
    Tensor a = uniform({n}, 1, -8.f, 8.f), b = uniform({n}, 2, -8.f, 8.f), dy = uniform({n}, 3);
    a.data<float>()[5] = 0.f, a.data<float>()[6] = 6.f, a.data<float>()[7] = -0.f;  // the boundaries
    for (const char* op : {"relu", "relu6", "add_relu"}) {
      const std::string name(op);
      Tensor mask_cpu, mask_cuda;
      const auto run = [&](Device d, Tensor* mask) {
        if (name == "relu") return ops::relu_forward(on(a, d), mask);
        if (name == "relu6") return ops::relu6_forward(on(a, d), mask);
        return ops::add_relu_forward(on(a, d), on(b, d), mask);
      };
      const Tensor y_cpu = run(Device::cpu(), &mask_cpu), y_cuda = run(gpu(), &mask_cuda);
      check_same_bytes(y_cpu, y_cuda, name + " output");
      check_same_bytes(mask_cpu, mask_cuda, name + " mask");
      const Tensor dx_cpu = name == "relu6" ? ops::relu6_backward(dy, mask_cpu) : ops::relu_backward(dy, mask_cpu);
      const Tensor dy_cuda = on(dy, gpu());
      const Tensor dx_cuda =
          name == "relu6" ? ops::relu6_backward(dy_cuda, mask_cuda) : ops::relu_backward(dy_cuda, mask_cuda);
      check_same_bytes(dx_cpu, dx_cuda, name + " backward");
    }
    check_same_bytes(ops::add(a, b), ops::add(on(a, gpu()), on(b, gpu())), "add");
    Tensor keep_cpu, keep_cuda;
    const Tensor d_cpu = ops::dropout_forward(a, 0.3f, 42, 7, &keep_cpu);
    const Tensor d_cuda = ops::dropout_forward(on(a, gpu()), 0.3f, 42, 7, &keep_cuda);
    check_same_bytes(d_cpu, d_cuda, "dropout output (same Philox draws)");
    check_same_bytes(keep_cpu, keep_cuda, "dropout keep mask");
    check_same_bytes(ops::dropout_backward(dy, keep_cpu, 0.3f), ops::dropout_backward(on(dy, gpu()), keep_cuda, 0.3f),
                     "dropout backward");
  }
  live.check();
}

TEST_CASE("cuda ops: max, average and global pooling match the CPU (argmax and gathers bit for bit)") {
  if (!gpu_or_skip("pooling parity")) return;
  const LiveBytesOnBoth live;
  {
    // Values on a coarse grid so windows hold ties: the first maximum must win on both.
    Tensor x = uniform({2, 3, 11, 13}, 1, -4.f, 4.f);
    float* xp = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) xp[i] = std::round(xp[i]);
    for (const ops::PoolParams p : {ops::PoolParams{2, 2, 0}, ops::PoolParams{3, 2, 1}, ops::PoolParams{3, 1, 1}}) {
      const std::string name = "pool k" + std::to_string(p.kernel) + " s" + std::to_string(p.stride) + " p" +
                               std::to_string(p.padding);
      Tensor arg_cpu, arg_cuda;
      const Tensor y_cpu = ops::maxpool2d_forward(x, p, &arg_cpu);
      const Tensor y_cuda = ops::maxpool2d_forward(on(x, gpu()), p, &arg_cuda);
      check_same_bytes(y_cpu, y_cuda, name + " max forward");
      check_same_bytes(arg_cpu, arg_cuda, name + " argmax");
      const Tensor dy = uniform(y_cpu.shape(), 2);
      check_same_bytes(ops::maxpool2d_backward(dy, arg_cpu, x.shape(), p),
                       ops::maxpool2d_backward(on(dy, gpu()), arg_cuda, x.shape(), p), name + " max backward");
      check_same_bytes(ops::avgpool2d_forward(x, p), ops::avgpool2d_forward(on(x, gpu()), p), name + " avg forward");
      check_same_bytes(ops::avgpool2d_backward(dy, x.shape(), p), ops::avgpool2d_backward(on(dy, gpu()), x.shape(), p),
                       name + " avg backward");
    }
    check_close(ops::global_avgpool_forward(x), ops::global_avgpool_forward(on(x, gpu())), 1e-6, "global avg forward");
    const Tensor gdy = uniform({2, 3}, 3);
    check_same_bytes(ops::global_avgpool_backward(gdy, x.shape()),
                     ops::global_avgpool_backward(on(gdy, gpu()), x.shape()), "global avg backward");
  }
  live.check();
}

TEST_CASE("cuda ops: the option-A shortcut is bit-identical both ways") {
  if (!gpu_or_skip("shortcut parity")) return;
  const Tensor x = uniform({2, 4, 7, 9}, 1);
  const Tensor y_cpu = ops::shortcut_pad_forward(x, 2, 10), y_cuda = ops::shortcut_pad_forward(on(x, gpu()), 2, 10);
  check_same_bytes(y_cpu, y_cuda, "shortcut forward");
  const Tensor dy = uniform(y_cpu.shape(), 2);
  check_same_bytes(ops::shortcut_pad_backward(dy, x.shape(), 2),
                   ops::shortcut_pad_backward(on(dy, gpu()), x.shape(), 2), "shortcut backward");
}

TEST_CASE("cuda ops: cross-entropy (label smoothing), its backward and top-1 match the CPU") {
  if (!gpu_or_skip("loss parity")) return;
  const LiveBytesOnBoth live;
  {
    const int64_t N = 37, K = 45;  // K > 32: a warp's lanes loop over the row
    const Tensor logits = uniform({N, K}, 1, -6.f, 6.f);
    Tensor labels = Tensor::empty({N}, DType::I64);
    for (int64_t i = 0; i < N; ++i) labels.data<int64_t>()[i] = (i * 7) % K;
    for (const float smoothing : {0.f, 0.1f}) {
      Tensor p_cpu, p_cuda;
      const Tensor l_cpu = ops::cross_entropy_forward(logits, labels, smoothing, &p_cpu);
      const Tensor l_cuda = ops::cross_entropy_forward(on(logits, gpu()), on(labels, gpu()), smoothing, &p_cuda);
      check_close(l_cpu, l_cuda, 1e-6, "loss");
      check_close(p_cpu, p_cuda, 1e-6, "probs");
      check_close(ops::cross_entropy_backward(p_cpu, labels, smoothing, 0.5f),
                  ops::cross_entropy_backward(p_cuda, on(labels, gpu()), smoothing, 0.5f), 1e-5, "dlogits");
    }
    CHECK(ops::count_correct(on(logits, gpu()), on(labels, gpu())) == ops::count_correct(logits, labels));
    labels.data<int64_t>()[11] = K;  // out of range: refused, naming the row like the CPU
    Tensor probs;
    std::string msg;
    try {
      (void)ops::cross_entropy_forward(on(logits, gpu()), on(labels, gpu()), 0.f, &probs);
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(msg.find("label 45 at index 11") != std::string::npos, msg);
  }
  live.check();
}

TEST_CASE("cuda ops: the fused SGD step matches the CPU in every variant") {
  if (!gpu_or_skip("SGD parity")) return;
  const int64_t n = 5000;
  const Tensor grad = uniform({n}, 1);
  struct Variant { float momentum, dampening; bool nesterov; };
  for (const Variant v : {Variant{0.f, 0.f, false}, Variant{0.9f, 0.f, false}, Variant{0.9f, 0.1f, false},
                          Variant{0.9f, 0.f, true}}) {
    Tensor w_cpu = uniform({n}, 2), buf_cpu = Tensor::zeros({n});
    Tensor w_cuda = w_cpu.to(gpu()), buf_cuda = buf_cpu.to(gpu()), g_cuda = grad.to(gpu());
    for (int step = 0; step < 3; ++step) {
      ops::sgd_update_(w_cpu, buf_cpu, grad, 0.1f, v.momentum, v.dampening, 5e-4f, v.nesterov, step == 0);
      ops::sgd_update_(w_cuda, buf_cuda, g_cuda, 0.1f, v.momentum, v.dampening, 5e-4f, v.nesterov, step == 0);
    }
    check_close(w_cpu, w_cuda, 1e-6, "sgd weights (momentum " + std::to_string(v.momentum) + ")");
    if (v.momentum != 0.f) check_close(buf_cpu, buf_cuda, 1e-6, "sgd momentum buffer");
  }
}

TEST_CASE("cuda ops: the fused AdamW step matches the CPU over several steps") {
  if (!gpu_or_skip("AdamW parity")) return;
  const int64_t n = 5000;
  Tensor w_cpu = uniform({n}, 2), m_cpu = Tensor::zeros({n}), v_cpu = Tensor::zeros({n});
  Tensor w_cuda = w_cpu.to(gpu()), m_cuda = m_cpu.to(gpu()), v_cuda = v_cpu.to(gpu());
  for (int step = 1; step <= 4; ++step) {
    const Tensor grad = uniform({n}, 10 + step);
    const Tensor g_cuda = grad.to(gpu());
    ops::adamw_update_(w_cpu, m_cpu, v_cpu, grad, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, step);
    ops::adamw_update_(w_cuda, m_cuda, v_cuda, g_cuda, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f, step);
  }
  check_close(w_cpu, w_cuda, 1e-6, "adamw weights");
  check_close(m_cpu, m_cuda, 1e-6, "adamw first moment");
  check_close(v_cpu, v_cuda, 1e-6, "adamw second moment");
}

TEST_CASE("cuda ops: finiteness, in-place tensor arithmetic and mixed-device refusal") {
  if (!gpu_or_skip("tensor ops on cuda:0")) return;
  Tensor x = uniform({1000}, 1).to(gpu());
  CHECK(ops::all_finite(x));
  Tensor host = x.to(Device::cpu());
  host.data<float>()[777] = std::nanf("");
  CHECK_FALSE(ops::all_finite(host.to(gpu())));
  // The batched form (one synchronization for a list, as the trainer's gradient check), mixed with a CPU
  // tensor and an undefined one.
  const std::vector<bool> flags =
      ops::all_finite_each({x, host.to(gpu()), Tensor(), host, Tensor::zeros({0}).to(gpu()), x.clone()});
  CHECK(flags == std::vector<bool>{true, false, true, false, true, true});

  const Tensor y = uniform({1000}, 2);
  Tensor acc = x.clone();
  acc.add_(y.to(gpu()), 0.5f);
  acc.mul_(2.f);
  Tensor want = x.to(Device::cpu());
  want.add_(y, 0.5f);
  want.mul_(2.f);
  check_close(want, acc, 1e-6, "add_ then mul_");
  acc.fill_(3.25f);
  for (float v : acc.to_vector()) REQUIRE(v == 3.25f);
  // A strided view (columns 2..4 of a 4x6 matrix, as a split's gradient part) is filled in place on the
  // GPU as on the CPU, the other columns untouched.
  Tensor grid_gpu = uniform({4, 6}, 3).to(gpu()), grid_cpu = grid_gpu.to(Device::cpu());
  Tensor part = grid_gpu.slice(1, 2, 5);
  part.fill_(-1.5f);
  grid_cpu.slice(1, 2, 5).fill_(-1.5f);
  check_same_bytes(grid_cpu, grid_gpu, "fill_ of a strided view");

  std::string msg;
  try {
    (void)ops::add(x, y);  // cuda:0 + cpu
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK_MESSAGE(msg.find("tensors on different devices") != std::string::npos, msg);
  CHECK_MESSAGE(msg.find("cuda:0") != std::string::npos, msg);
}

TEST_CASE("cuda ops: Module::to moves parameters and buffers in place and training matches the CPU") {
  if (!gpu_or_skip("Module::to and a small training step")) return;
  seed_init(3);
  auto cpu_net = std::make_shared<Sequential>();
  cpu_net->add(std::make_shared<Conv2d>(3, 8, 3, 1, 1));
  cpu_net->add(std::make_shared<BatchNorm2d>(8));
  cpu_net->add(std::make_shared<ReLU>());
  cpu_net->add(std::make_shared<MaxPool2d>(2, 2));
  cpu_net->add(std::make_shared<GlobalAvgPool>());
  cpu_net->add(std::make_shared<Linear>(8, 5));
  seed_init(3);  // the same initial weights for the GPU copy
  auto gpu_net = std::make_shared<Sequential>();
  gpu_net->add(std::make_shared<Conv2d>(3, 8, 3, 1, 1));
  gpu_net->add(std::make_shared<BatchNorm2d>(8));
  gpu_net->add(std::make_shared<ReLU>());
  gpu_net->add(std::make_shared<MaxPool2d>(2, 2));
  gpu_net->add(std::make_shared<GlobalAvgPool>());
  gpu_net->add(std::make_shared<Linear>(8, 5));
  const int64_t param_bytes = memory_stats(gpu())[MemTag::Param].current;
  gpu_net->to(gpu());
  for (const auto& p : gpu_net->named_parameters()) CHECK(p.second.data().device() == gpu());
  for (const auto& b : gpu_net->named_buffers()) CHECK(b.second.device() == gpu());
  CHECK(memory_stats(gpu())[MemTag::Param].current > param_bytes);  // still tagged Param there

  const Tensor x = uniform({4, 3, 8, 8}, 9);
  Tensor labels = Tensor::empty({4}, DType::I64);
  for (int64_t i = 0; i < 4; ++i) labels.data<int64_t>()[i] = i;
  const auto step = [&](Module& net, Device d) {
    net.zero_grad();
    Variable loss = cross_entropy(net(Variable(x.to(d))), labels.to(d));
    backward(loss);
    return loss.data().to(Device::cpu());
  };
  check_close(step(*cpu_net, Device::cpu()), step(*gpu_net, gpu()), 1e-5, "loss");
  const auto cpu_params = cpu_net->named_parameters(), gpu_params = gpu_net->named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i)
    check_close(cpu_params[i].second.grad(), gpu_params[i].second.grad(), 1e-4, "grad of " + cpu_params[i].first);
  const auto cpu_bufs = cpu_net->named_buffers(), gpu_bufs = gpu_net->named_buffers();
  for (size_t i = 0; i < cpu_bufs.size(); ++i)
    check_close(cpu_bufs[i].second, gpu_bufs[i].second, 1e-5, "buffer " + cpu_bufs[i].first);  // BN running stats
  gpu_net->to(Device::cpu());
  for (const auto& p : gpu_net->named_parameters()) CHECK(p.second.data().device() == Device::cpu());
}

TEST_CASE("cuda ops: GELU (both forms) and LayerNorm match the CPU, forward and backward") {
  if (!gpu_or_skip("GELU and LayerNorm parity")) return;
  const LiveBytesOnBoth live;
  {
    const Tensor x = uniform({6, 50, 96}, 21, -4.f, 4.f), dy = uniform({6, 50, 96}, 22);
    for (const bool tanh_form : {false, true}) {
      const std::string form = tanh_form ? "tanh" : "erf";
      // Against the CPU's spec loops, which run the CUDA kernel's arithmetic (core/token_math.h); the CPU's
      // fast path (oneDNN's polynomials) is tested against the same loops in tests/test_token_ops.cpp.
      // CUDA's erff/tanhf/expf may differ from the host libm by an ulp or two.
      Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
      cpu::gelu_forward_ref(y.data<float>(), x.data<float>(), x.numel(), tanh_form);
      cpu::gelu_backward_ref(dx.data<float>(), dy.data<float>(), x.data<float>(), x.numel(), tanh_form);
      check_close(y, ops::gelu_forward(on(x, gpu()), tanh_form), 1e-6, "gelu " + form);
      check_close(dx, ops::gelu_backward(on(dy, gpu()), on(x, gpu()), tanh_form), 1e-6, "gelu backward " + form);
    }
    const Tensor g = uniform({96}, 23), b = uniform({96}, 24);
    Tensor m_cpu, r_cpu, m_gpu, r_gpu, h_cpu, h_gpu;
    const Tensor y_cpu = ops::layernorm_forward(x, g, b, 1e-5f, &m_cpu, &r_cpu, &h_cpu);
    const Tensor y_gpu =
        ops::layernorm_forward(on(x, gpu()), on(g, gpu()), on(b, gpu()), 1e-5f, &m_gpu, &r_gpu, &h_gpu);
    check_close(y_cpu, y_gpu, 1e-5, "layer_norm");
    check_close(h_cpu, h_gpu, 1e-5, "layer_norm normalized input");
    check_close(m_cpu, m_gpu, 1e-6, "layer_norm mean");
    check_close(r_cpu, r_gpu, 1e-6, "layer_norm rstd");
    Tensor dg_cpu, db_cpu, dg_gpu, db_gpu;
    const Tensor dx_cpu = ops::layernorm_backward(dy, h_cpu, g, r_cpu, &dg_cpu, &db_cpu);
    const Tensor dx_gpu = ops::layernorm_backward(on(dy, gpu()), on(h_cpu, gpu()), on(g, gpu()), on(r_cpu, gpu()),
                                                  &dg_gpu, &db_gpu);
    check_close(dx_cpu, dx_gpu, 1e-5, "layer_norm dx");
    check_close(dg_cpu, dg_gpu, 1e-4, "layer_norm dgamma");
    check_close(db_cpu, db_gpu, 1e-4, "layer_norm dbeta");
  }
  live.check();
}

TEST_CASE("cuda ops: column reductions (bias and LayerNorm parameter gradients) keep the CPU's order over many chunks") {
  if (!gpu_or_skip("column reduction parity")) return;
  const LiveBytesOnBoth live;
  // Row counts around token_math::kColumnChunk and past one round of the kernel's 32 warps (5000 rows: 79
  // chunks, the last partial), and 70 columns: three blocks of 32, the last partial.
  for (const int64_t rows : {int64_t(1), token_math::kColumnChunk, int64_t(5000)}) {
    CAPTURE(rows);
    const int64_t d = 70;
    const Tensor x = uniform({rows, d}, 41), xhat = uniform({rows, d}, 42), g = uniform({d}, 43),
                 rstd = uniform({rows}, 44, 0.5f, 1.5f);
    check_close(ops::sum_rows(x, {d}), ops::sum_rows(on(x, gpu()), {d}), 0, "sum_rows");
    Tensor dg_cpu, db_cpu, dg_gpu, db_gpu;
    ops::layernorm_backward(x, xhat, g, rstd, &dg_cpu, &db_cpu);
    ops::layernorm_backward(on(x, gpu()), on(xhat, gpu()), on(g, gpu()), on(rstd, gpu()), &dg_gpu, &db_gpu);
    // dβ adds f32 values in double: the same order gives the same bits. dγ's products may be fused (an FMA)
    // on one device and not the other: double rounding apart, so at most one f32 rounding step once narrowed.
    check_close(db_cpu, db_gpu, 0, "layer_norm dbeta");
    check_close(dg_cpu, dg_gpu, 1.2e-7, "layer_norm dgamma");
  }
  live.check();
}

TEST_CASE("cuda ops: LayerNorm and softmax rows of every width: staged in shared memory or read in place") {
  if (!gpu_or_skip("wide-row parity")) return;
  const LiveBytesOnBoth live;
  // The row kernels stage up to 48 KiB of a row's inputs per warp: 96 columns stage 8 rows a block; 7000
  // stage one row a block forward but not backward (two inputs); 13000 stage nothing. Against the CPU's spec
  // loops, whose sums the kernels share (core/token_math.h).
  // 768 and 1536: a stage of exactly the old 48 KiB limit (12288 / (d·inputs) whole), which with the kernels'
  // static statistics did not launch.
  for (const int64_t d : {int64_t(96), int64_t(768), int64_t(1536), int64_t(7000), int64_t(13000)}) {
    CAPTURE(d);
    const int64_t rows = 11;
    const Tensor x = uniform({rows, d}, 51, -4.f, 4.f), dy = uniform({rows, d}, 52), g = uniform({d}, 53),
                 b = uniform({d}, 54);
    Tensor y = Tensor::empty({rows, d}), h = Tensor::empty({rows, d}), m = Tensor::empty({rows}),
           r = Tensor::empty({rows}), dx = Tensor::empty({rows, d}), dg = Tensor::empty({d}), db = Tensor::empty({d});
    cpu::layernorm_forward_ref(y.data<float>(), h.data<float>(), m.data<float>(), r.data<float>(), x.data<float>(),
                               g.data<float>(), b.data<float>(), rows, d, 1e-5f);
    Tensor m_gpu, r_gpu, h_gpu;
    const Tensor y_gpu =
        ops::layernorm_forward(on(x, gpu()), on(g, gpu()), on(b, gpu()), 1e-5f, &m_gpu, &r_gpu, &h_gpu);
    check_close(m, m_gpu, 0, "layer_norm mean");  // the same double sums, narrowed once
    check_close(r, r_gpu, 1e-7, "layer_norm rstd");  // CUDA's sqrt against the host's: an ulp
    check_close(h, h_gpu, 1e-6, "layer_norm normalized input");
    check_close(y, y_gpu, 1e-6, "layer_norm");
    cpu::layernorm_backward_ref(dx.data<float>(), dg.data<float>(), db.data<float>(), dy.data<float>(), h.data<float>(),
                                g.data<float>(), r.data<float>(), rows, d);
    Tensor dg_gpu, db_gpu;
    const Tensor dx_gpu =
        ops::layernorm_backward(on(dy, gpu()), on(h, gpu()), on(g, gpu()), on(r, gpu()), &dg_gpu, &db_gpu);
    check_close(dx, dx_gpu, 1e-6, "layer_norm dx");
    check_close(db, db_gpu, 0, "layer_norm dbeta");
    Tensor p = Tensor::empty({rows, d}), dp = Tensor::empty({rows, d});
    cpu::softmax_forward_ref(p.data<float>(), x.data<float>(), rows, d, 0.125f);
    cpu::softmax_backward_ref(dp.data<float>(), dy.data<float>(), p.data<float>(), rows, d, 0.125f);
    check_close(p, ops::softmax_forward(on(x, gpu()), 0.125f), 1e-6, "softmax");
    check_close(dp, ops::softmax_backward(on(dy, gpu()), on(p, gpu()), 0.125f), 1e-6, "softmax backward");
  }
  live.check();
}

TEST_CASE("cuda ops: strided copies, by rows of one or several segments and by elements, are the CPU's bytes") {
  if (!gpu_or_skip("strided copy parity")) return;
  const LiveBytesOnBoth live;
  {
    // The attention heads' split: (B, T, 3, H, dh) to (3, B, H, T, dh), rows of dh = 64; a slice whose
    // coalesced rows are 600 long (three segments, the last partial); a strided destination; a permute
    // ending in a dim of 3 (one thread per element); 1-, 2- and 8-byte elements.
    const Tensor qkv = uniform({2, 65, 3, 3, 64}, 61);
    check_same_bytes(qkv.permute({2, 0, 3, 1, 4}).contiguous(), on(qkv, gpu()).permute({2, 0, 3, 1, 4}).contiguous(),
                     "head split");
    const Tensor rows = uniform({5, 700}, 62);
    check_same_bytes(rows.slice(1, 10, 610).contiguous(), on(rows, gpu()).slice(1, 10, 610).contiguous(), "long rows");
    Tensor wide_cpu = Tensor::zeros({5, 900}), wide_gpu = Tensor::zeros({5, 900}).to(gpu());
    wide_cpu.slice(1, 100, 800).copy_(rows);
    wide_gpu.slice(1, 100, 800).copy_(on(rows, gpu()));
    check_same_bytes(wide_cpu, wide_gpu, "strided destination");
    const Tensor small = uniform({4, 3, 7, 5}, 63);
    check_same_bytes(small.permute({0, 2, 3, 1}).contiguous(), on(small, gpu()).permute({0, 2, 3, 1}).contiguous(),
                     "short rows");
    for (const DType type : {DType::U8, DType::BF16, DType::I64}) {
      Tensor t = Tensor::empty({6, 40, 20}, type);
      auto* p = static_cast<unsigned char*>(t.raw_data());
      for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(i * 37 + 11);
      check_same_bytes(t.permute({2, 0, 1}).contiguous(), on(t, gpu()).permute({2, 0, 1}).contiguous(),
                       std::string("permute of ") + dtype_name(type));
    }
  }
  live.check();
}

TEST_CASE("cuda ops: softmax, batched matmul, the row broadcasts, strided copies and row gathers match the CPU") {
  if (!gpu_or_skip("softmax, matmul, row broadcast and strided copy parity")) return;
  const LiveBytesOnBoth live;
  {
    const Tensor x = uniform({4, 3, 33, 33}, 31, -6.f, 6.f), dy = uniform({4, 3, 33, 33}, 32);
    const Tensor y_cpu = ops::softmax_forward(x, 0.125f);
    check_close(y_cpu, ops::softmax_forward(on(x, gpu()), 0.125f), 1e-6, "softmax");
    check_close(ops::softmax_backward(dy, y_cpu, 0.125f), ops::softmax_backward(on(dy, gpu()), on(y_cpu, gpu()), 0.125f),
                1e-6, "softmax backward");
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const Tensor a = uniform(ta ? Shape{2, 3, 16, 33} : Shape{2, 3, 33, 16}, 33);
        const Tensor b = uniform(tb ? Shape{2, 3, 20, 16} : Shape{2, 3, 16, 20}, 34);
        check_close(ops::matmul(a, b, ta, tb), ops::matmul(on(a, gpu()), on(b, gpu()), ta, tb), 1e-5,
                    std::string("matmul ") + (ta ? "T" : "N") + (tb ? "T" : "N"));
      }
    }
    const Tensor s = uniform({4}, 35), p = uniform({3, 33, 33}, 36);
    check_close(ops::scale_rows(x, s), ops::scale_rows(on(x, gpu()), on(s, gpu())), 0, "scale_rows");
    check_close(ops::add_to_rows(x, p), ops::add_to_rows(on(x, gpu()), on(p, gpu())), 0, "add_to_rows");
    check_close(ops::sum_rows(x, {3, 33, 33}), ops::sum_rows(on(x, gpu()), {3, 33, 33}), 0, "sum_rows (rows in order)");
    check_close(x.permute({0, 2, 3, 1}).contiguous(), on(x, gpu()).permute({0, 2, 3, 1}).contiguous(), 0, "permute copy");
    Tensor index = Tensor::empty({2401}, DType::I64);
    for (int64_t i = 0; i < 2401; ++i) index.data<int64_t>()[i] = (i * 37) % 169;
    const Tensor table = uniform({169, 3}, 37), rows_dy = uniform({2401, 3}, 38);
    check_close(ops::gather_rows(table, index), ops::gather_rows(on(table, gpu()), on(index, gpu())), 0, "gather_rows");
    check_close(ops::scatter_add_rows(rows_dy, index, 169),
                ops::scatter_add_rows(on(rows_dy, gpu()), on(index, gpu()), 169), 0, "scatter_add_rows (indices in order)");
  }
  live.check();
}

TEST_CASE("cuda ops: synchronized batch norm on a GPU rank matches the CPU's (--sync-bn on GPU ranks)") {
  if (!gpu_or_skip("sync batch norm on cuda:0")) return;
  const Tensor x0 = uniform({4, 6, 9, 7}, 81, -1.f, 3.f), dy = uniform({4, 6, 9, 7}, 82);
  const Tensor g0 = uniform({6}, 83, 0.5f, 1.5f), b0 = uniform({6}, 84);
  struct Out {
    Tensor y, dx, dgamma, dbeta, running_mean, running_var;
  };
  const auto run_on = [&](Device d) {
    Variable x(x0.to(d), true), gamma(g0.to(d), true), beta(b0.to(d), true);
    Tensor rm = Tensor::zeros({6}).to(d), rv = Tensor::full({6}, 1.f).to(d);
    LocalCommunicator one;  // the all-reduces on the host, as an MPI or NCCL rank does them
    const Variable y = sync_batch_norm(x, gamma, beta, rm, rv, 0.1f, 1e-5f, one);
    backward(y, dy.to(d));
    return Out{y.data(), x.grad(), gamma.grad(), beta.grad(), rm, rv};
  };
  const Out cpu = run_on(Device::cpu()), gpu_out = run_on(gpu());
  CHECK(gpu_out.y.device() == gpu());
  CHECK(gpu_out.dgamma.device() == gpu());
  CHECK(gpu_out.running_mean.device() == gpu());
  // The GPU sums per thread in float, the CPU every value in double: agreement to float rounding.
  check_close(cpu.y, gpu_out.y, 1e-5, "y");
  check_close(cpu.dx, gpu_out.dx, 1e-4, "dx");
  check_close(cpu.dgamma, gpu_out.dgamma, 1e-4, "dgamma");
  check_close(cpu.dbeta, gpu_out.dbeta, 1e-4, "dbeta");
  check_close(cpu.running_mean, gpu_out.running_mean, 1e-5, "running_mean");
  check_close(cpu.running_var, gpu_out.running_var, 1e-5, "running_var");
}

TEST_CASE("cuda ops: bf16 and fp16 convolutions, linear layers and batched matmuls track the CPU's fp32") {
  if (!gpu_or_skip("16-bit tensor-core convolutions and GEMMs")) return;
  // Operands rounded to 8 (bf16) or 11 (fp16) significant bits, sums in fp32: relative errors of about
  // 2^-8 and 2^-11 per operand, so bounds of 3e-2 and 4e-3 of the largest value; a wrong descriptor type or
  // stride is off by O(1).
  const ops::ConvParams p{1, 1, 1};
  const Tensor x = uniform({4, 16, 12, 12}, 91), w = uniform({32, 16, 3, 3}, 92, -0.3f, 0.3f), b = uniform({32}, 93);
  const Tensor a = uniform({6, 24, 40}, 94), m = uniform({6, 40, 16}, 95), lw = uniform({20, 40}, 96);
  const Tensor y32 = ops::conv2d_forward(x, w, b, p);
  const Tensor dy = uniform(y32.shape(), 97);
  const Tensor dx32 = ops::conv2d_backward_data(dy, w, x.shape(), p);
  Tensor db32;
  const Tensor dw32 = ops::conv2d_backward_weight(dy, x, w.shape(), p, true, &db32);
  const Tensor mm32 = ops::matmul(a, m, false, false);
  const Tensor rows = a.reshape({6 * 24, 40});
  const Tensor lin32 = ops::linear_forward(rows, lw, Tensor());
  for (const Precision pr : {Precision::BF16, Precision::F16}) {
    CAPTURE(precision_name(pr));
    const double tol = pr == Precision::BF16 ? 3e-2 : 4e-3;
    PrecisionScope scope(pr);
    check_close(y32, ops::conv2d_forward(x.to(gpu()), w.to(gpu()), b.to(gpu()), p), tol, "conv forward");
    check_close(dx32, ops::conv2d_backward_data(dy.to(gpu()), w.to(gpu()), x.shape(), p), tol, "conv backward data");
    Tensor db;
    check_close(dw32, ops::conv2d_backward_weight(dy.to(gpu()), x.to(gpu()), w.shape(), p, true, &db), tol,
                "conv backward weight");
    check_close(db32, db, 1e-5, "conv bias gradient (fp32)");
    check_close(mm32, ops::matmul(a.to(gpu()), m.to(gpu()), false, false), tol, "batched matmul");
    check_close(lin32, ops::linear_forward(rows.to(gpu()), lw.to(gpu()), Tensor()), tol, "linear");
  }
}
