#!/usr/bin/env bash
# Crash and resume: one training run is killed with SIGKILL three times, each time at a randomly
# chosen step (mid-epoch, or at an epoch end while the checkpoint is being written), and resumed
# from DIR/last.safetensors after each kill; the final weights must equal an uninterrupted run's bit
# for bit. The kill points come from $RANDOM seeded by ACTLAB_CRASH_SEED (printed, so a failure can
# be replayed: ACTLAB_CRASH_SEED=1234 tests/cli/crash_resume.sh build/actlab-train).
#   tests/cli/crash_resume.sh PATH/TO/actlab-train
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
seed="${ACTLAB_CRASH_SEED:-$$}"
RANDOM=$seed
echo "crash/resume: kill points drawn with ACTLAB_CRASH_SEED=$seed"
steps_per_epoch=8 epochs=6
total=$((steps_per_epoch * epochs))
common=(--dataset synthetic --synthetic-size 256 --batch-size 32 --epochs $epochs --threads 2 --seed 9
        --policy division:B=4,Q=2)
# The global step of the newest progress line ("epoch E/6 step S/8 ..."), 0 before the first.
progress_of() {
  grep -o 'epoch [0-9]*/[0-9]* step [0-9]*/' "$1" | tail -1 |
    awk -F'[ /]' -v n=$steps_per_epoch '{ print ($2 - 1) * n + $5 } END { if (NR == 0) print 0 }' | tail -1
}

"$bin" "${common[@]}" --quiet --save-dir "$work/full" || fail "uninterrupted run failed"
dir="$work/crashed"
for kill_number in 1 2 3; do
  resume=()
  done_steps=0
  if [ -f "$dir/last.safetensors" ]; then
    resume=(--resume "$dir/last.safetensors")
    done_steps=$(($(epoch_of "$dir/last.safetensors") * steps_per_epoch))
  fi
  # Somewhere in the next 12 steps, never past the run's last step.
  target=$((done_steps + 1 + RANDOM % 12))
  [ "$target" -ge "$total" ] && target=$((total - 1))
  temps_before=$(ls "$dir" 2>/dev/null | grep -c '\.tmp\.')
  out="$work/attempt$kill_number.out"
  "$bin" "${common[@]}" --save-dir "$dir" --print-every 1 "${resume[@]}" > "$out" 2>"$work/attempt$kill_number.err" &
  pid=$!
  for _ in $(seq 1 3000); do
    [ "$(progress_of "$out")" -ge "$target" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  reached=$(progress_of "$out")
  kill -9 "$pid" 2>/dev/null
  { wait "$pid"; } 2>/dev/null  # no "Killed" job notice
  rc=$?
  [ "$rc" -eq 137 ] || fail "attempt $kill_number exited $rc before the kill at step $target: $(cat "$work/attempt$kill_number.err")"
  echo "kill $kill_number: resumed at global step $done_steps, killed at step ~$reached (target $target);" \
       "checkpoint now at epoch $(epoch_of "$dir/last.safetensors" 2>/dev/null || echo none)"
  temps_after=$(ls "$dir" 2>/dev/null | grep -c '\.tmp\.')
  [ "$temps_after" -gt "$temps_before" ] &&
    echo "  (killed during a checkpoint write: its temp file was left, the checkpoints are whole)"
done
if [ -f "$dir/last.safetensors" ]; then
  "$bin" --resume "$dir/last.safetensors" --quiet || fail "the final resume failed"
else
  "$bin" "${common[@]}" --quiet --save-dir "$dir" || fail "the final run failed"
fi
[ "$(epoch_of "$dir/last.safetensors")" = "$epochs" ] || fail "the resumed run did not finish epoch $epochs"
# A temp file of a killed writer is removed by the next run on the same --save-dir.
leftover=$(ls "$dir" | grep '\.tmp\.' || true)
[ -z "$leftover" ] || fail "temp files of killed runs left in the save directory: $leftover"
data_of "$dir/last.safetensors" | cmp -s - <(data_of "$work/full/last.safetensors") ||
  fail "3 kills + resumes differ from the uninterrupted run"
echo "crash/resume checks: $failures failed"
[ "$failures" -eq 0 ]
