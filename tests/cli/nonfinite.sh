#!/usr/bin/env bash
# End-to-end checks of --on-nonfinite with the real actlab-train binary and its NaN test hook
# (ACTLAB_INJECT_NAN_STEP / _COUNT / _INTO, see docs/reliability.md):
#  - stop: exit 2 with one error line naming the step and where the NaN appeared, last.safetensors
#    holding the last good state; resuming from it (no NaN) ends bit-identical to a run that never
#    saw one; a NaN injected into a gradient names the layer;
#  - skip-step: one bad step is skipped and counted, the run finishes; ten in a row stop it;
#  - a diverging learning rate (1e6) trips the same check without any hook, and leaves the epoch-end
#    checkpoint as it was (the weights, not the data, gave the NaN);
# a finite training loss with a NaN test loss is named in a warning;
# and the other run guard, --check-memory: a DIVISION run ends with its one verdict line; and on a
# terminal (script(1) gives the run a pty) the error starts a line of its own, after the live '\r' line.
#   tests/cli/nonfinite.sh PATH/TO/actlab-train
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
common=(--dataset synthetic --synthetic-size 128 --batch-size 32 --epochs 2 --threads 2 --seed 4 --quiet)
expect_error() {  # expect_error NAME STDERR_FILE RC PATTERN: exit 2 and exactly one matching error line
  local lines
  lines=$(grep -c 'actlab-train: error:' "$2")
  [ "$3" -eq 2 ] || fail "$1: exit code $3, expected 2"
  [ "$lines" -eq 1 ] || fail "$1: $lines error lines, expected 1: $(cat "$2")"
  grep -Eq "$4" "$2" || fail "$1: error does not match '$4': $(cat "$2")"
}

"$bin" "${common[@]}" --save-dir "$work/clean" || fail "the clean run failed"

# stop: the NaN reaches the loss at global step 3; the checkpoint is the state after step 2.
ACTLAB_INJECT_NAN_STEP=3 "$bin" "${common[@]}" --save-dir "$work/stop" 2>"$work/stop.err"
expect_error "stop" "$work/stop.err" $? \
  "non-finite loss \(-?nan\) at epoch 1 step 3 \(global step 3\), in the input batch; the last good state is in $work/stop/last.safetensors"
[ "$(meta_of "$work/stop/last.safetensors" global_step)" = 2 ] || fail "stop: the checkpoint is not from global step 2"
"$bin" --resume "$work/stop/last.safetensors" --quiet || fail "stop: resuming the last good state failed"
data_of "$work/stop/last.safetensors" | cmp -s - <(data_of "$work/clean/last.safetensors") ||
  fail "stop: stopped at the NaN + resumed differs from the clean run"

# stop, NaN in a gradient (the loss stays finite): the layer nearest the loss is named. A gradient that is
# not finite on a finite batch is the weights' doing: the last epoch's checkpoint stays as it was.
"$bin" "${common[@]}" --epochs 1 --save-dir "$work/grad" || fail "grad: the first epoch failed"
cp "$work/grad/last.safetensors" "$work/grad-epoch1.safetensors"
ACTLAB_INJECT_NAN_STEP=6 ACTLAB_INJECT_NAN_INTO=grad "$bin" --resume "$work/grad/last.safetensors" --epochs 2 --quiet \
  2>"$work/grad.err"
expect_error "grad" "$work/grad.err" $? \
  "non-finite gradient at epoch 2 step 2 \(global step 6\), first in layer 'fc' \(parameter fc.bias; 1 of [0-9]+ .*$work/grad/last.safetensors was left as it was"
cmp -s "$work/grad/last.safetensors" "$work/grad-epoch1.safetensors" || fail "grad: the epoch-1 checkpoint was overwritten"

# skip-step: one bad step, skipped and counted; the run finishes.
ACTLAB_INJECT_NAN_STEP=3 "$bin" "${common[@]}" --on-nonfinite skip-step --save-dir "$work/skip" \
  --summary-json "$work/skip.json" 2>"$work/skip.err"
rc=$?
[ "$rc" -eq 0 ] || fail "skip-step: exit code $rc: $(cat "$work/skip.err")"
grep -q "global step 3), in the input batch; update skipped (1 skipped so far)" "$work/skip.err" ||
  fail "skip-step: no skip warning: $(cat "$work/skip.err")"
grep -q "1 steps skipped for non-finite values" "$work/skip.err" || fail "skip-step: no skip count at the end"
grep -q '"skipped_steps": 1,' "$work/skip.json" || fail "skip-step: --summary-json lacks \"skipped_steps\": 1"
[ "$(meta_of "$work/skip/last.safetensors" epoch)" = 2 ] || fail "skip-step: the run did not finish its 2 epochs"

# skip-step gives up after 10 non-finite steps in a row (8 steps per run here: use 4 epochs).
ACTLAB_INJECT_NAN_STEP=2 ACTLAB_INJECT_NAN_COUNT=100 "$bin" "${common[@]}" --epochs 4 --on-nonfinite skip-step \
  --save-dir "$work/skip10" 2>"$work/skip10.err"
rc=$?
grep -v "update skipped" "$work/skip10.err" > "$work/skip10.last"
expect_error "skip-step x10" "$work/skip10.last" $rc \
  "global step 11\), in the input batch \(10 non-finite steps in a row\); the last good state is in"
[ "$(grep -c "update skipped" "$work/skip10.err")" = 9 ] || fail "skip-step x10: expected 9 skip warnings"

# A learning rate of 1e6 diverges within a few steps: caught without any hook, a layer named. The weights
# give the NaN on finite data, so they are not saved as a good state: the epoch-end checkpoint it resumed
# from stays as it was (a smaller --lr can go on from it), and a run with none saves nothing.
# Batch 8: 16 steps an epoch, so the divergence comes within the resumed epoch (from scratch it comes by
# step 4) whatever the build's rounding.
"$bin" "${common[@]}" --batch-size 8 --epochs 1 --save-dir "$work/diverge" || fail "lr 1e6: the first epoch failed"
cp "$work/diverge/last.safetensors" "$work/diverge-epoch1.safetensors"
"$bin" --resume "$work/diverge/last.safetensors" --epochs 2 --lr 1e6 --quiet 2>"$work/diverge.err"
expect_error "lr 1e6" "$work/diverge.err" $? \
  "non-finite (loss|gradient) .* first in layer '[a-z0-9.]+'.*; .*$work/diverge/last.safetensors was left as it was"
cmp -s "$work/diverge/last.safetensors" "$work/diverge-epoch1.safetensors" ||
  fail "lr 1e6: the epoch-1 checkpoint was overwritten by the diverged weights"
"$bin" --resume "$work/diverge/last.safetensors" --epochs 2 --quiet || fail "lr 1e6: resuming the kept state failed"
"$bin" "${common[@]}" --batch-size 8 --epochs 1 --lr 1e6 --save-dir "$work/diverge0" 2>"$work/diverge0.err"
expect_error "lr 1e6, no checkpoint yet" "$work/diverge0.err" $? "first in layer .*, so nothing was saved"
[ ! -e "$work/diverge0/last.safetensors" ] || fail "lr 1e6: the diverged weights were saved as a good state"

# --check-memory: the verdict is the last line of a normal run's output.
out=$("$bin" "${common[@]/--quiet/--print-every=100}" --policy division:B=4,Q=2 --check-memory 2>&1) ||
  fail "--check-memory run failed: $out"
printf '%s\n' "$out" | tail -1 |
  grep -Eq '^memory check: live bytes back to [0-9.]+ MiB after every step, peak stable \(8 steps;' ||
  fail "--check-memory: no verdict line: $(printf '%s\n' "$out" | tail -2)"

# On a terminal the progress line is one live line redrawn after '\r'; the error must not be appended to it.
if command -v script >/dev/null 2>&1; then
  ACTLAB_INJECT_NAN_STEP=3 script -qec "$(printf '%q ' "$bin" "${common[@]/--quiet/--print-every=1}")" /dev/null \
    > "$work/tty.out" 2>&1
  tr '\r' '~' < "$work/tty.out" | grep -q '^actlab-train: error: non-finite loss' ||
    fail "on a terminal the error line does not start a line: $(tr '\r' '~' < "$work/tty.out" | grep -a error | cut -c1-300)"
else
  fail "script(1) (bsdutils, an Essential Debian package) is missing: the terminal check cannot run"
fi

# A run whose training loss stays finite but whose test loss is not (the hook puts a NaN into the first test
# batch after epoch 2) finishes, and says at that evaluation only that the test accuracy means little.
ACTLAB_INJECT_NAN_INTO=eval ACTLAB_INJECT_NAN_STEP=2 "$bin" "${common[@]}" --epochs 3 2> "$work/testnan.err" ||
  fail "the NaN-test-loss run failed: $(cat "$work/testnan.err")"
[ "$(grep -c "warning: the test loss on synthetic.* is NaN: the model gives non-finite outputs" "$work/testnan.err")" = 1 ] ||
  fail "a NaN test loss is not named once: $(cat "$work/testnan.err")"
# A model whose test loss is NaN is never the best one: a one-epoch run like that writes last, not best.
ACTLAB_INJECT_NAN_INTO=eval ACTLAB_INJECT_NAN_STEP=1 "$bin" "${common[@]}" --epochs 1 --save-dir "$work/testnan" \
  --summary-json "$work/testnan.json" 2>/dev/null || fail "the one-epoch NaN-test-loss run failed"
[ -f "$work/testnan/last.safetensors" ] && [ ! -e "$work/testnan/best.safetensors" ] ||
  fail "a NaN test loss: best.safetensors written (or last.safetensors missing): $(ls "$work/testnan")"
grep -q '"best_test_acc": null' "$work/testnan.json" ||
  fail "a NaN test loss: best_test_acc is not null: $(grep best_test_acc "$work/testnan.json")"

echo "non-finite checks: $failures failed"
[ "$failures" -eq 0 ]
