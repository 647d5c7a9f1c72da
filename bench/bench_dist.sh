#!/usr/bin/env bash
# Data-parallel scaling on this machine: the same global batch trained by 1 process (all threads) and
# by 2 MPI ranks (the threads split between them), through the real actlab-train. Prints, per model,
# images/s of the whole job, and for the ranks the gradient all-reduce time against the part the
# training thread waited for (hidden = 1 - exposed / communication), with DDP's fixed 25 MiB buckets,
# with the default 25 MiB buckets tapering to 1 MiB at the end of backward (docs/distributed.md), and
# with 1 MiB ones (more overlap, more messages).
#   bench/bench_dist.sh [BUILD_DIR] [MODELS] [GLOBAL_BATCH] [STEPS]   (defaults: build resnet20,resnet18 128 20)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}" models="${2:-resnet20,resnet18}" batch="${3:-128}" steps="${4:-20}"
threads=$(nproc)
command -v mpirun >/dev/null || { echo "bench_dist: mpirun not found (scripts/setup.sh installs openmpi-bin)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_WAIT_POLICY=passive
# One field of a summary JSON (flat numbers only).
field() { grep -o "\"$2\": *[-0-9.eE+]*" "$1" | head -1 | sed 's/.*: *//'; }
common() {  # common MODEL BATCH_PER_RANK
  echo --model "$1" --dataset synthetic --synthetic-size $((batch * (steps + 1))) --epochs 1 --steps-per-epoch "$steps" \
       --batch-size "$2" --test-limit 64 --no-augment --quiet --overwrite
}
echo "bench_dist: global batch $batch, $steps steps, $threads threads in all; $(lscpu | sed -n 's/^Model name: *//p')"
printf '| model | ranks x threads | buckets: cap / tail MiB | job img/s | per rank img/s | communication s | exposed wait s | hidden |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for model in ${models//,/ }; do
  "$build/actlab-train" $(common "$model" "$batch") --threads "$threads" --summary-json "$out/one.json"
  printf '| %s | 1 x %d | - | %.1f | %.1f | - | - | - |\n' "$model" "$threads" "$(field "$out/one.json" median_img_per_s)" \
    "$(field "$out/one.json" median_img_per_s)"
  for buckets in 25/0 25/1 1/0; do
    mpirun --allow-run-as-root --oversubscribe -np 2 "$build/actlab-train" --distributed \
      $(common "$model" $((batch / 2))) --threads $((threads / 2 > 0 ? threads / 2 : 1)) --bucket-mib "${buckets%/*}" \
      --bucket-tail-mib "${buckets#*/}" --summary-json "$out/two.json"
    rank=$(field "$out/two.json" median_img_per_s) comm=$(field "$out/two.json" comm_s)
    exposed=$(field "$out/two.json" comm_exposed_s)
    hidden=$(awk -v c="$comm" -v e="$exposed" 'BEGIN { h = c > 0 ? 1 - e / c : 0; if (h < 0) h = 0; printf "%.0f %%", 100 * h }')
    printf '| %s | 2 x %d | %s | %.1f | %.1f | %.3f | %.3f | %s |\n' "$model" $((threads / 2 > 0 ? threads / 2 : 1)) \
      "${buckets/\// \/ }" "$(awk -v r="$rank" 'BEGIN { print 2 * r }')" "$rank" "$comm" "$exposed" "$hidden"
  done
done
