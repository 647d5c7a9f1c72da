#!/usr/bin/env bash
# End-to-end checkpoint/resume checks of the real actlab-train binary: a run killed with SIGKILL
# during epoch 2 and resumed from DIR/last.safetensors, and runs stopped with SIGINT (exit 130) and
# SIGTERM (exit 143) mid-epoch and resumed, and a streamed image-folder run stopped mid-epoch and
# resumed, all end with the same tensor bytes as an uninterrupted run; a resume that changes the recipe
# says so, and one into another --save-dir leaves the first run's outputs alone.
#   tests/cli/resume.sh PATH/TO/actlab-train
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
common=(--dataset synthetic --synthetic-size 512 --batch-size 32 --epochs 3 --threads 2 --seed 5 --quiet)

# Starts a run in the background, waits until it has written last.safetensors, sends `signal`.
# Prints the run's exit status.
run_and_signal() {  # run_and_signal DIR SIGNAL STDERR_FILE
  local dir="$1" sig="$2" err="$3"
  "$bin" "${common[@]}" --save-dir "$dir" 2>"$err" &
  local pid=$!
  for _ in $(seq 1 1200); do
    [ -f "$dir/last.safetensors" ] && break
    sleep 0.05
  done
  kill -"$sig" "$pid" 2>/dev/null || echo "note: run ended before it could be signalled" >&2
  wait "$pid"
  echo $?
}

"$bin" "${common[@]}" --save-dir "$work/full" || fail "uninterrupted run failed"
[ -f "$work/full/last.safetensors" ] || fail "no last.safetensors after the uninterrupted run"
data_of "$work/full/last.safetensors" > "$work/full.data"

# SIGKILL during epoch 2: last.safetensors is the epoch-1 checkpoint, written atomically.
rc=$(run_and_signal "$work/killed" KILL "$work/killed.err")
[ "$rc" -eq 137 ] || fail "SIGKILL run exited $rc, expected 137"
[ "$(epoch_of "$work/killed/last.safetensors")" = 1 ] || fail "the killed run's checkpoint is not from epoch 1"
ls "$work/killed" | grep -q '\.tmp\.' && echo "note: a temp file was left by the killed writer (expected if killed mid-write)"
"$bin" --resume "$work/killed/last.safetensors" --quiet || fail "resume after SIGKILL failed"
data_of "$work/killed/last.safetensors" | cmp -s - "$work/full.data" || fail "SIGKILL + resume differs from the uninterrupted run"

# SIGINT and SIGTERM: finish the step, save the mid-epoch state, say how to resume, exit 128+signal.
for sig in INT TERM; do
  want=$([ "$sig" = INT ] && echo 130 || echo 143)
  rc=$(run_and_signal "$work/$sig" "$sig" "$work/$sig.err")
  [ "$rc" -eq "$want" ] || fail "SIG$sig run exited $rc, expected $want"
  grep -Eq "interrupted at epoch [0-9]+ step [0-9]+; resume with: actlab-train --resume $work/$sig/last.safetensors" \
    "$work/$sig.err" || fail "SIG$sig: no resume hint; stderr: $(cat "$work/$sig.err")"
  "$bin" --resume "$work/$sig/last.safetensors" --quiet --summary-json "$work/$sig.json" || fail "resume after SIG$sig failed"
  # The summary counts the run's epochs, those done before the interruption included.
  grep -q '"epochs_done": 3' "$work/$sig.json" || fail "SIG$sig: the resumed run's summary does not count 3 epochs: $(grep epochs_done "$work/$sig.json")"
  data_of "$work/$sig/last.safetensors" | cmp -s - "$work/full.data" || fail "SIG$sig + resume differs from the uninterrupted run"
  [ "$(epoch_of "$work/$sig/last.safetensors")" = 3 ] || fail "SIG$sig: the resumed run did not finish epoch 3"
done

# A streamed image folder (--stream, 2 data workers) stopped mid-epoch by the test hook and resumed:
# the RandomResizedCrop draws are functions of (seed, epoch, sample), and the resumed run starts its
# loader at the step reached, so the bytes match an uninterrupted streamed run.
src=$(cd "$(dirname "$0")/../.." && pwd)
for c in cat dog; do
  mkdir -p "$work/folder/$c"
  for i in 1 2 3 4 5 6 7 8; do tail -c +3 "$src/fuzz/corpus/image_folder/seed-png-rgb" > "$work/folder/$c/$i.png"; done
done
streamed=(--dataset folder --data-dir "$work/folder" --stream --data-workers 2 --image-size 6 --model mlp
          --batch-size 2 --epochs 2 --threads 1 --seed 3 --quiet)
"$bin" "${streamed[@]}" --save-dir "$work/stream-full" || fail "uninterrupted streamed run failed"
ACTLAB_STOP_AFTER_STEPS=9 "$bin" "${streamed[@]}" --save-dir "$work/stream-stopped" 2>/dev/null
[ "$(epoch_of "$work/stream-stopped/last.safetensors")" = 1 ] || fail "the stopped streamed run did not stop in epoch 2"
"$bin" --resume "$work/stream-stopped/last.safetensors" --quiet || fail "resume of the streamed run failed"
data_of "$work/stream-stopped/last.safetensors" | cmp -s - <(data_of "$work/stream-full/last.safetensors") ||
  fail "streamed run stopped at step 9 + resume differs from the uninterrupted streamed run"

# A resume that changes the recipe (another --lr or policy rule) runs, and says what changed; one that only
# raises --epochs says nothing.
tiny=(--model mlp --dataset synthetic --synthetic-size 64 --batch-size 16 --steps-per-epoch 2 --threads 1 --quiet)
"$bin" "${tiny[@]}" --epochs 1 --save-dir "$work/recipe" || fail "the recipe run failed"
"$bin" "${tiny[@]}" --epochs 2 --resume "$work/recipe/last.safetensors" --lr 0.2 --policy-rule fc1=exact \
  2> "$work/recipe.err" || fail "a resume with another --lr failed: $(cat "$work/recipe.err")"
grep -q "note: resuming with options the checkpoint's run did not have: --lr '0.2' (was '0.1'), --policy-rule 'fc1=exact' (was '')" \
  "$work/recipe.err" || fail "a resume with another --lr does not say so: $(cat "$work/recipe.err")"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/recipe/last.safetensors" --lr 0.2 --policy-rule fc1=exact \
  2> "$work/recipe2.err" || fail "the second resume failed"
[ ! -s "$work/recipe2.err" ] || fail "a resume with the checkpoint's own options printed: $(cat "$work/recipe2.err")"

# A second SIGINT ends the run at once (exit 130, by the signal) with one line saying so (steps of batch 512
# take about a second here, so both land within one).
"$bin" --dataset synthetic --synthetic-size 4096 --batch-size 512 --threads 1 --print-every 1 --save-dir "$work/twice" \
  > "$work/twice.out" 2> "$work/twice.err" &
pid=$!
for _ in $(seq 1 600); do grep -q "step 1/" "$work/twice.out" 2>/dev/null && break; sleep 0.05; done
kill -INT "$pid"; sleep 0.2; kill -INT "$pid"  # apart: a pending signal would absorb the second
wait "$pid"
rc=$?
[ "$rc" -eq 130 ] || fail "a second SIGINT: exit $rc, expected 130"
grep -q "^actlab-train: a second interrupt: stopped at once" "$work/twice.err" ||
  fail "a second SIGINT said nothing: $(cat "$work/twice.err")"

# Outputs may sit in the --save-dir the run creates. A resume into another --save-dir (a branch) leaves the
# first run's log and summary as they were, and says so; one into the same directory appends to its log.
"$bin" "${tiny[@]}" --epochs 1 --save-dir "$work/trunk" --log "$work/trunk/log.csv" --summary-json "$work/trunk/s.json" ||
  fail "a run whose --log and --summary-json are in the --save-dir it creates failed"
cp "$work/trunk/log.csv" "$work/trunk-log.csv"
cp "$work/trunk/s.json" "$work/trunk-s.json"
cp "$work/trunk/last.safetensors" "$work/trunk-epoch1.safetensors"
"$bin" "${tiny[@]}" --epochs 2 --resume "$work/trunk/last.safetensors" --save-dir "$work/branch" 2> "$work/branch.err" ||
  fail "the branch failed: $(cat "$work/branch.err")"
grep -q "note: this resume saves to another --save-dir, so it leaves the first run's outputs alone: --log '$work/trunk/log.csv', --summary-json '$work/trunk/s.json'" \
  "$work/branch.err" || fail "the branch does not say it leaves the first run's outputs: $(cat "$work/branch.err")"
cmp -s "$work/trunk/log.csv" "$work/trunk-log.csv" && cmp -s "$work/trunk/s.json" "$work/trunk-s.json" ||
  fail "the branch rewrote the first run's log or summary"
[ "$(epoch_of "$work/branch/last.safetensors")" = 2 ] || fail "the branch did not train its epoch"
"$bin" "${tiny[@]}" --epochs 2 --resume "$work/trunk/last.safetensors" || fail "the trunk's own resume failed"
[ "$(grep -c . "$work/trunk/log.csv")" = 3 ] || fail "the trunk's own resume did not append its epoch to its log"
# A resume that fails at its first step (a policy rule given to it that names no layer: checked there, as
# for a new run) leaves the log it would have cut back to its checkpoint's epoch as it was. A memory report
# a resume asks for is written.
cp "$work/trunk/log.csv" "$work/trunk-log2.csv"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/trunk-epoch1.safetensors" --save-dir "$work/old" \
  --log "$work/trunk/log.csv" --policy-rule nosuchlayer=exact 2> "$work/badrule.err"
[ $? -eq 2 ] && grep -q "the policy rule for 'nosuchlayer' matched no save" "$work/badrule.err" ||
  fail "a resume's unmatched policy rule was not refused: $(cat "$work/badrule.err")"
cmp -s "$work/trunk/log.csv" "$work/trunk-log2.csv" || fail "a resume that failed at its first step cut the log back"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/trunk/last.safetensors" --memory-report "$work/trunk/mr.csv" ||
  fail "a resume with --memory-report failed"
[ -s "$work/trunk/mr.csv" ] || fail "a resume's --memory-report was not written"


# A resume onto another run's log under the name (a --log typed wrong) would cut that log back to the
# checkpoint's epoch and append to it: refused, the log as it was; --overwrite starts the log afresh.
"$bin" "${tiny[@]}" --epochs 2 --lr 0.05 --log "$work/other.csv" || fail "the other run failed"
cp "$work/other.csv" "$work/other-before.csv"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/trunk-epoch1.safetensors" --save-dir "$work/wronglog" \
  --log "$work/other.csv" 2> "$work/wronglog.err"
[ $? -eq 2 ] && grep -q "log file '$work/other.csv' is not the log of the run checkpointed in" "$work/wronglog.err" ||
  fail "a resume onto another run's log was not refused: $(cat "$work/wronglog.err")"
cmp -s "$work/other.csv" "$work/other-before.csv" || fail "a refused resume changed the other run's log"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/trunk-epoch1.safetensors" --save-dir "$work/wronglog" \
  --log "$work/other.csv" --overwrite || fail "the resume with --overwrite failed"
[ "$(cut -d, -f1 "$work/other.csv" | tr '\n' ' ')" = "epoch 2 3 " ] ||
  fail "--overwrite did not start the log afresh: $(cat "$work/other.csv")"
# --overwrite is the command's, not the run's: a run started with it does not pass it on to its resume.
cp "$work/other-before.csv" "$work/other.csv"
"$bin" "${tiny[@]}" --epochs 2 --save-dir "$work/ow" --log "$work/ow.csv" --overwrite || fail "the --overwrite run failed"
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/ow/last.safetensors" --log "$work/other.csv" 2> "$work/ow.err"
[ $? -eq 2 ] && cmp -s "$work/other.csv" "$work/other-before.csv" ||
  fail "a resume took --overwrite from its checkpoint and replaced another run's log: $(cat "$work/ow.err")"
# The resume command a stop prints passes on the --overwrite the stopped run was given: the export it had
# not yet replaced is replaced by the run that goes on.
echo "my notes" > "$work/ow-export.pt"
ACTLAB_STOP_AFTER_STEPS=1 "$bin" "${tiny[@]}" --epochs 2 --save-dir "$work/ow2" --export-weights "$work/ow-export.pt" \
  --overwrite 2> "$work/ow2.err"
hint=$(sed -n 's/.*resume with: actlab-train //p' "$work/ow2.err")
[ "$hint" = "--resume $work/ow2/last.safetensors --overwrite" ] || fail "the hint of an --overwrite run: $(cat "$work/ow2.err")"
# shellcheck disable=SC2086
"$bin" $hint --quiet || fail "the printed resume command failed"
grep -q "my notes" "$work/ow-export.pt" && fail "the resumed run did not write its export"
# A checkpoint of a stop in epoch 1 recorded no rows: a log with rows is not its run's.
ACTLAB_STOP_AFTER_STEPS=1 "$bin" "${tiny[@]}" --epochs 2 --save-dir "$work/early" --log "$work/early.csv" 2>/dev/null
[ $? -eq 130 ] && [ "$(epoch_of "$work/early/last.safetensors")" = 0 ] || fail "the early stop did not checkpoint epoch 0"
"$bin" "${tiny[@]}" --epochs 2 --resume "$work/early/last.safetensors" --log "$work/other.csv" 2> "$work/early.err"
[ $? -eq 2 ] && cmp -s "$work/other.csv" "$work/other-before.csv" ||
  fail "a resume of an epoch-0 checkpoint took another run's log: $(cat "$work/early.err")"
"$bin" "${tiny[@]}" --epochs 2 --resume "$work/early/last.safetensors" || fail "the early stop's own resume failed"
[ "$(cut -d, -f1 "$work/early.csv" | tr '\n' ' ')" = "epoch 1 2 " ] || fail "the early stop's log: $(cat "$work/early.csv")"
# A segment resumed without a log passes the log's mark on: the log is still the run's afterwards.
"$bin" "${tiny[@]}" --epochs 3 --resume "$work/early/last.safetensors" --log "" || fail "the segment without a log failed"
"$bin" "${tiny[@]}" --epochs 4 --resume "$work/early/last.safetensors" --log "$work/early.csv" 2> "$work/seg.err" ||
  fail "the log was refused after a segment without it: $(cat "$work/seg.err")"
[ "$(cut -d, -f1 "$work/early.csv" | tr '\n' ' ')" = "epoch 1 2 4 " ] || fail "the log after the segment: $(cat "$work/early.csv")"

echo "resume checks: $failures failed"
[ "$failures" -eq 0 ]
