#!/usr/bin/env bash
# Data-parallel scaling on this machine: the same global batch trained by 1 process (all threads) and
# by 2 MPI ranks (the threads split between them), through the real actlab-train. Prints, per model,
# images/s of the whole job, and for the ranks the gradient all-reduce time, the CPU time it cost the
# communication thread (copies, sums, polls: taken from the cores the ranks compute on), and the part the
# training thread waited for (hidden = 1 - exposed / communication), with DDP's fixed 25 MiB buckets,
# with the default 25 MiB buckets tapering to 1 MiB at the end of backward (docs/distributed.md), and
# with 1 MiB ones (more overlap, more messages).
#   bench/bench_dist.sh [BUILD_DIR] [MODELS] [GLOBAL_BATCH] [STEPS] [ROUNDS]
#   (defaults: build resnet20,resnet18 128 20 1)
# With ROUNDS > 1 it measures only the scaling ratio, on a machine whose runs spread too much for one pair
# to say it: ROUNDS rounds of (1 process, then 2 ranks with the default buckets), alternating, one line
# per round, and the ratio of the two medians of job img/s.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}" models="${2:-resnet20,resnet18}" batch="${3:-128}" steps="${4:-20}" rounds="${5:-1}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_dist: ROUNDS must be a positive integer, got '$rounds'" >&2; exit 1; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "bench_dist: STEPS must be a positive integer, got '$steps'" >&2; exit 1; }
# Two ranks each take half the global batch: an odd one would compare B images against 2 x floor(B/2).
[[ "$batch" =~ ^[1-9][0-9]*$ ]] && [ $((batch % 2)) -eq 0 ] ||
  { echo "bench_dist: GLOBAL_BATCH must be a positive even integer (two ranks take half each), got '$batch'" >&2; exit 1; }
[ -x "$build/actlab-train" ] || { echo "bench_dist: $build/actlab-train not found (BUILD_DIR is taken from the checkout: $(pwd))" >&2; exit 1; }
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
half=$((threads / 2 > 0 ? threads / 2 : 1))
median() { sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
if [ "$rounds" -gt 1 ]; then
  for model in ${models//,/ }; do
    printf '| %s: round | 1 x %d job img/s | 2 x %d job img/s | ratio | communication s | its CPU s | exposed wait s |\n' \
      "$model" "$threads" "$half"
    printf '|---|---|---|---|---|---|---|\n'
    : > "$out/one.txt"
    : > "$out/two.txt"
    for r in $(seq 1 "$rounds"); do
      "$build/actlab-train" $(common "$model" "$batch") --threads "$threads" --summary-json "$out/one.json" > /dev/null
      mpirun --allow-run-as-root --oversubscribe -np 2 "$build/actlab-train" --distributed \
        $(common "$model" $((batch / 2))) --threads "$half" --summary-json "$out/two.json" > /dev/null
      one=$(field "$out/one.json" median_img_per_s)
      two=$(awk -v r="$(field "$out/two.json" median_img_per_s)" 'BEGIN { print 2 * r }')
      echo "$one" >> "$out/one.txt"
      echo "$two" >> "$out/two.txt"
      printf '| %d | %.1f | %.1f | %.3f | %.3f | %.3f | %.3f |\n' "$r" "$one" "$two" "$(awk -v a="$two" -v b="$one" 'BEGIN { print a / b }')" \
        "$(field "$out/two.json" comm_s)" "$(field "$out/two.json" comm_cpu_s)" "$(field "$out/two.json" comm_exposed_s)"
    done
    m1=$(median < "$out/one.txt") m2=$(median < "$out/two.txt")
    printf '%s: medians over %d rounds: 1 x %d %.1f img/s, 2 x %d %.1f img/s, ratio %.3f\n' "$model" "$rounds" \
      "$threads" "$m1" "$half" "$m2" "$(awk -v a="$m2" -v b="$m1" 'BEGIN { print a / b }')"
  done
  exit 0
fi
printf '| model | ranks x threads | buckets: cap / tail MiB | job img/s | per rank img/s | communication s | its CPU s | exposed wait s | hidden |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for model in ${models//,/ }; do
  "$build/actlab-train" $(common "$model" "$batch") --threads "$threads" --summary-json "$out/one.json"
  printf '| %s | 1 x %d | - | %.1f | %.1f | - | - | - | - |\n' "$model" "$threads" "$(field "$out/one.json" median_img_per_s)" \
    "$(field "$out/one.json" median_img_per_s)"
  for buckets in 25/0 25/1 1/0; do
    mpirun --allow-run-as-root --oversubscribe -np 2 "$build/actlab-train" --distributed \
      $(common "$model" $((batch / 2))) --threads "$half" --bucket-mib "${buckets%/*}" \
      --bucket-tail-mib "${buckets#*/}" --summary-json "$out/two.json"
    rank=$(field "$out/two.json" median_img_per_s) comm=$(field "$out/two.json" comm_s) cpu=$(field "$out/two.json" comm_cpu_s)
    exposed=$(field "$out/two.json" comm_exposed_s)
    hidden=$(awk -v c="$comm" -v e="$exposed" 'BEGIN { h = c > 0 ? 1 - e / c : 0; if (h < 0) h = 0; printf "%.0f %%", 100 * h }')
    printf '| %s | 2 x %d | %s | %.1f | %.1f | %.3f | %.3f | %.3f | %s |\n' "$model" "$half" \
      "${buckets/\// \/ }" "$(awk -v r="$rank" 'BEGIN { print 2 * r }')" "$rank" "$comm" "$cpu" "$exposed" "$hidden"
  done
done
