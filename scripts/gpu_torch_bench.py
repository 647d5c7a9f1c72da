#!/usr/bin/env python3
"""PyTorch peer of bench/bench_cuda.cpp's training table: the same CIFAR ResNet-18 (3x3 stem, no max-pool,
BasicBlocks with 1x1-conv downsampling, 11.17M parameters), the same step (zero_grad, forward, cross-entropy,
backward, SGD momentum 0.9 / weight decay 5e-4), the same protocol (warm-up steps, then at least --steps
timed steps until --min-time seconds; each step ends with loss.item()), fp32 NCHW on cuda:0, or under
torch.autocast with --amp bf16|fp16 (fp16 with torch.cuda.amp.GradScaler), the peer of bench_cuda's
exact@bf16 and exact@fp16 rows.

Reports median img/s, the activation memory of a step measured like actlab's (bytes allocated after
forward + loss, minus before, minus logits and loss, plus the input batch) and the step's peak allocated and
reserved bytes (torch.cuda.max_memory_*). TF32 and cuDNN benchmark mode follow the flags, so both frameworks
can be compared under the same math. Run by scripts/gpu-check.sh; prints one table line and, with --json,
writes one JSON object.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity)


class CifarResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for stage, planes in enumerate([64, 128, 256, 512]):
            for block in range(2):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layers(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--min-time", type=float, default=5.0)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--tf32", action="store_true", help="TF32 for convolutions and matmuls")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    ap.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                    help="automatic mixed precision (torch.autocast) in this 16-bit type")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    model = CifarResNet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    activation = [0]
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp == "fp16")

    def step():
        torch.cuda.reset_peak_memory_stats(dev)
        opt.zero_grad(set_to_none=True)
        before = torch.cuda.memory_allocated(dev)
        with torch.autocast(device_type="cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        activation[0] = (torch.cuda.memory_allocated(dev) - before - logits.numel() * logits.element_size()
                         - loss.numel() * loss.element_size() + x.numel() * 4)
        del logits
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()  # waits for the step

    for _ in range(args.warmup):
        step()
    torch.cuda.empty_cache()  # as bench_cuda: drop what warm-up cached (cuDNN benchmark workspaces)
    ts = []
    while len(ts) < args.steps or (sum(ts) < args.min_time and len(ts) < args.max_steps):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    res = {
        "framework": "pytorch " + torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(dev),
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "tf32": args.tf32,
        "amp": args.amp,
        "cudnn_benchmark": not args.no_cudnn_benchmark,
        "img_per_s": args.batch / med,
        "img_per_s_best": args.batch / min(ts),
        "steps": len(ts),
        "activation_bytes": activation[0],
        "peak_bytes": torch.cuda.max_memory_allocated(dev),
        "reserved_peak_bytes": torch.cuda.max_memory_reserved(dev),
    }
    mib = 1024.0 * 1024.0
    print("%-22s %10.1f %10.1f %6d %14.1f %12.1f %14.1f" % (
        "pytorch (exact)" if args.amp == "none" else "pytorch (amp %s)" % args.amp, res["img_per_s"], res["img_per_s_best"], res["steps"], res["activation_bytes"] / mib,
        res["peak_bytes"] / mib, res["reserved_peak_bytes"] / mib))
    print("pytorch %s, cuDNN %s, %s, %d parameters" % (torch.__version__, res["cudnn"], res["device"], res["params"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
            f.write("\n")


if __name__ == "__main__":
    main()
