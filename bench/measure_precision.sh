#!/usr/bin/env bash
# The mixed-precision measurements of bench/RESULTS.md §7, in one run (about 5 minutes on 2 cores; run
# it with nothing else on the machine): PyTorch fp32 and bf16 autocast beside actlab fp32 and bf16
# (compare_torch.sh), MobileNetV2 in both frameworks, and DIVISION against exact within each precision.
#   bench/measure_precision.sh [BUILD_DIR]   (needs python3-torch; ../shared/bench beside the checkout)
set -eu  # a missing peer script or build stops the run: half a measurement is not a result
cd "$(dirname "$0")/.."
build="${1:-build}"
[ -x "$build/bench_train" ] || { echo "measure_precision: no $build/bench_train; build first (scripts/setup.sh)" >&2; exit 2; }
[ -f ../shared/bench/torch_cpu_train.py ] || { echo "measure_precision: ../shared/bench/torch_cpu_train.py not found" >&2; exit 2; }
echo "== $(date -u) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, bf16 flags: $(grep -o -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
uptime
bash bench/compare_torch.sh "$build" resnet20,resnet18
echo "== MobileNetV2: PyTorch fp32 and bf16 autocast"
for a in off bf16; do
  /usr/bin/python3 ../shared/bench/torch_cpu_train.py --models mobilenet_v2 --batches 128 --threads 2 --autocast $a \
    --out /tmp/t_mb.json > /tmp/t_mb.log 2>&1 || echo "PyTorch MobileNetV2 --autocast $a failed (PyTorch 1.13 has no bf16 kernel for one of its ops): $(tail -1 /tmp/t_mb.log)"
  grep -v '^wrote' /tmp/t_mb.log | tail -4
done
echo "== MobileNetV2: actlab, paired"
"$build/bench_train" --models mobilenet_v2 --batch 128 --threads 2 --interleave \
  --policies 'exact;division:B=8,Q=2;exact@bf16;division:B=8,Q=2@bf16'
echo "== DIVISION against exact within each precision (paired), ResNet-20 and ResNet-18"
"$build/bench_train" --models resnet20,resnet18 --batch 128 --threads 2 --interleave --policies 'exact@bf16;division:B=8,Q=2@bf16'
"$build/bench_train" --models mobilenet_v2 --batch 128 --threads 2 --interleave --policies 'exact@bf16;division:B=8,Q=2@bf16'
uptime
