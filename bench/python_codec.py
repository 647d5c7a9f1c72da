#!/usr/bin/python3
"""The Python module's codec speed against the C++ one, and the PyTorch adapter's step overhead.

    PYTHONPATH=build/python bench/python_codec.py [--threads 2]

(1) pack and unpack of division:B=8,Q=2 on ResNet-18 CIFAR activation shapes at batch 128, in GB/s of
    f32 input (best of 10), through actlab.pack/unpack: the C++ kernels plus the copy of the array
    into actlab's memory (pack) and the wrap of the result (unpack, no copy). Compare with
    build/bench_compress --policies division:B=8,Q=2 --batch 128 on the same machine.
(2) a PyTorch ResNet-20 (CIFAR, 3x32x32, option A) training step at batch 128: exact vs under
    actlab.torch.saved_tensors(division:B=8,Q=2), median of interleaved steps.
"""
import argparse
import statistics
import sys
import time

import numpy as np

import actlab

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=12)
args = ap.parse_args()

print("(1) actlab.pack / actlab.unpack, division:B=8,Q=2, best of 10")
for shape in [(128, 64, 32, 32), (128, 128, 16, 16), (128, 256, 8, 8), (128, 512, 4, 4)]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    pack_t, unpack_t = [], []
    for rep in range(10):  # packs back to back, then unpacks, as bench_compress times them
        t0 = time.perf_counter()
        p = actlab.pack(x, "division:B=8,Q=2", 0, rep)
        pack_t.append(time.perf_counter() - t0)
    for rep in range(10):
        t0 = time.perf_counter()
        y = actlab.unpack(p)
        unpack_t.append(time.perf_counter() - t0)
        del y
    gb = x.nbytes / 1e9
    print("  %-18s pack %6.1f GB/s   unpack %6.1f GB/s" % (str(shape), gb / min(pack_t), gb / min(unpack_t)))

try:
    import torch
    import actlab.torch as at
except ImportError as e:
    print("(2) skipped: no torch (%s)" % e)
    sys.exit(0)
sys.path.insert(0, "python/tests")
from test_actlab import resnet20  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = resnet20(torch, 3, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
xb, yb = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))


def step(policy):
    t0 = time.perf_counter()
    if policy:
        with at.saved_tensors(policy=policy):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
    else:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


for _ in range(2):
    step(None), step("division:B=8,Q=2")
exact, div = [], []
for _ in range(args.steps):
    exact.append(step(None))
    div.append(step("division:B=8,Q=2"))
ratios = [d / e for d, e in zip(div, exact)]
print("(2) PyTorch %s ResNet-20 b128, %d threads: exact %.1f img/s, under actlab.torch division:B=8,Q=2 %.1f img/s, "
      "step ratio %.2fx (median of %d interleaved pairs)"
      % (torch.__version__, args.threads, 128 / statistics.median(exact), 128 / statistics.median(div),
         statistics.median(ratios), args.steps))
