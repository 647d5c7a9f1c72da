#!/usr/bin/env bash
# Side-by-side training throughput on this machine: PyTorch (Debian's python3-torch, the peer script in
# ../shared/bench) and actlab's bench_train, same models, batch, threads and timing protocol, one run.
#   bench/compare_torch.sh [BUILD_DIR]      (needs: apt-get install python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
peer="../shared/bench/torch_cpu_train.py"
[ -f "$peer" ] || { echo "compare_torch: $peer not found (run from the actlab checkout beside shared/)" >&2; exit 1; }
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "compare_torch: Debian's python3-torch is not installed (apt-get install python3-torch)" >&2; exit 1; }
out="${TMPDIR:-/tmp}/actlab_torch_cpu_train.json"
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') ($peer)"
/usr/bin/python3 "$peer" --models resnet20,resnet18 --batches 128 --threads 2 --out "$out" | grep -v '^wrote'
echo "== actlab ($build/bench_train)"
"$build/bench_train" --models resnet20,resnet18 --batch 128 --threads 2 --policies 'exact;division:B=8,Q=2'
