#!/usr/bin/env bash
# Side-by-side training throughput on this machine: PyTorch (Debian's python3-torch, the peer script in
# ../shared/bench) and actlab's bench_train, same models, batch, threads and timing protocol, one run, in
# both precisions: PyTorch fp32 and under torch.cpu.amp.autocast(bfloat16), actlab fp32 and --precision
# bf16 (docs/precision.md). The CPU's model name and bf16 flags are printed first: ratios hold for it only.
#   bench/compare_torch.sh [BUILD_DIR] [MODELS]   (needs: apt-get install python3-torch; MODELS default
#                                                   resnet20,resnet18; BUILD_DIR relative to the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
# Checked before PyTorch's minutes of training, not after them.
[ -x "$build/bench_train" ] || { echo "compare_torch: $build/bench_train not found (BUILD_DIR is taken from the checkout: $(pwd))" >&2; exit 1; }
peer="../shared/bench/torch_cpu_train.py"
[ -f "$peer" ] || { echo "compare_torch: $peer not found (run from the actlab checkout beside shared/)" >&2; exit 1; }
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "compare_torch: Debian's python3-torch is not installed (apt-get install python3-torch)" >&2; exit 1; }
models="${2:-resnet20,resnet18}"
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'); bf16 flags: $(grep -o -w 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
out="${TMPDIR:-/tmp}/actlab_torch_cpu_train.json"
torch_version=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')
for autocast in off bf16; do
  echo "== PyTorch $torch_version ($peer), autocast $autocast"
  /usr/bin/python3 "$peer" --models "$models" --batches 128 --threads 2 --autocast "$autocast" --out "$out" |
    grep -v '^wrote' || echo "(PyTorch failed under autocast $autocast for one of: $models)"
done
echo "== actlab ($build/bench_train), fp32 and bf16 steps interleaved"
"$build/bench_train" --models "$models" --batch 128 --threads 2 --interleave \
  --policies 'exact;exact@bf16;division:B=8,Q=2;division:B=8,Q=2@bf16'

