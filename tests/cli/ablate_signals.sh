#!/usr/bin/env bash
# actlab-ablate ended from outside while a cell trains (docs/reliability.md, "Guarantees"):
#  - SIGKILL of the grid: the running actlab-train gets its parent-death signal (SIGHUP, once per exiting
#    thread of the grid) and stops after its step with a mid-epoch checkpoint, not killed by a repeated
#    SIGTERM before it (a probe lost the epoch in 3 of 6 kills); the next grid run resumes the cell;
#  - SIGHUP of the grid (a closed terminal): forwarded, the cell checkpoints, the grid exits 129;
#  - SIGKILL of a grid under nohup (SIGHUP ignored): the cell still gets and takes its parent-death signal;
#  - the grid's reader gone (`| head`): the grid still finishes and writes its reports.
#   tests/cli/ablate_signals.sh BUILD_DIR
set -u
build="$1"
source "$(dirname "$0")/lib.sh"
# OMP_NUM_THREADS=8: the grid process then has several threads (libgomp's), each of whose exits sends the
# child its parent-death signal, as on a machine with more cores; the cells run with --threads 1.
grid=(env OMP_NUM_THREADS=8 "$build/actlab-ablate" --train-bin "$build/actlab-train" --policies exact --models resnet20
      --datasets synthetic --seeds 0 --epochs 1 --batch-size 16 --test-limit 32 --threads 1
      --train-arg=--synthetic-size --train-arg=1280 --train-arg=--print-every --train-arg=1)
cell_log() { echo "$1/cells/resnet20-synthetic-exact-s0/log.txt"; }
# wait_for_step LOG: until the cell has finished a few steps of its first epoch (at most 60 s)
wait_for_step() {
  for _ in $(seq 1 600); do grep -aq "step [3-9]/" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# wait_gone PATTERN: until no process matches (at most 30 s)
wait_gone() {
  for _ in $(seq 1 300); do pgrep -f -- "$1" >/dev/null || return 0; sleep 0.1; done
  return 1
}

for case in KILL HUP NOHUP-KILL; do
  sig=${case##*-} out="$work/$case"
  if [ "$case" = NOHUP-KILL ]; then  # under nohup: SIGHUP ignored, which a child would inherit across exec
    bash -c 'trap "" HUP; exec "$@"' _ "${grid[@]}" --out "$out" > "$work/$case.out" 2>&1 &
  else
    "${grid[@]}" --out "$out" > "$work/$case.out" 2>&1 &
  fi
  pid=$!
  wait_for_step "$(cell_log "$out")" || { fail "$case: the cell made no progress: $(tail -3 "$work/$case.out")"; continue; }
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  [ "$case" != HUP ] || [ "$rc" = 129 ] || fail "SIGHUP: the grid exited $rc, expected 129"
  wait_gone "$out/cells/" || fail "$case: a training run of the grid is still running 30 s later"
  grep -aq "actlab-train: interrupted at epoch 1 step [0-9]*; resume with" "$(cell_log "$out")" ||
    fail "$case: the cell did not checkpoint before it ended: $(tail -2 "$(cell_log "$out")")"
  "${grid[@]}" --out "$out" > "$work/$case.rerun" 2>&1 || fail "$case: the rerun failed: $(tail -3 "$work/$case.rerun")"
  grep -q "resume from epoch 0 step [1-9]" "$work/$case.rerun" ||
    fail "$case: the rerun did not resume the cell mid-epoch: $(grep 'resnet20' "$work/$case.rerun" | tail -2)"
done

# The reader of the grid's output exits after its first line; the grid goes on to its reports.
"$build/actlab-ablate" --train-bin "$build/actlab-train" --policies exact --models mlp --datasets synthetic --seeds 0 \
  --epochs 1 --batch-size 16 --test-limit 32 --threads 1 --train-arg=--synthetic-size --train-arg=256 \
  --out "$work/pipe" 2>&1 | head -n 1 > /dev/null
[ -s "$work/pipe/results.csv" ] || fail "the grid whose reader exited wrote no results.csv"

echo "ablate signal checks: $failures failed"
[ "$failures" -eq 0 ]
