#!/usr/bin/env bash
# A rank killed mid-run (docs/distributed.md, "Faults"): 2 ranks under mpirun, SIGKILL to rank 1 once
# the first checkpoint exists. The surviving rank must exit non-zero within a bounded time with one
# line naming rank 1, the checkpoint must still load, and --resume on 2 ranks must finish the run.
# Each rank's stderr goes to its own file: Open MPI's mpirun ends the job itself as soon as a rank dies
# by a signal, and it may do so before it has forwarded the survivor's last line (docs/distributed.md,
# "Faults"), so the survivor's line is read where the rank wrote it, and the job's output must name
# rank 1 as well (mpirun's own notice).
# Then ranks launched with different options (MPMD) must be refused by both, each saying what differs.
# Without mpirun or an MPI build: a visible skip (a failure under CI, where scripts/setup.sh installs both).
#   tests/cli/dist_fault.sh PATH/TO/actlab-train HAVE_MPI(ON|OFF)
set -u
bin="$1"
have_mpi="$2"
source "$(dirname "$0")/lib.sh"
if [ "$have_mpi" != "ON" ] || ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: missing prerequisite: mpirun (openmpi-bin) and a build with MPI (libopenmpi-dev; scripts/setup.sh)"
  case "${CI:-}" in "" | false | 0) exit 0 ;; *) exit 1 ;; esac
fi
epochs=30
launch=(mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" --distributed)
common=(--model mlp --dataset synthetic --synthetic-size 256 --batch-size 16 --steps-per-epoch 4 --epochs $epochs
        --threads 1 --test-limit 64 --no-augment --dist-timeout 60 --save-dir "$work/ck")
# exec: the rank's process is the binary itself (its pid is the one rank 0 names).
per_rank_stderr=(bash -c 'exec "$0" "$@" 2>> "$ACTLAB_TEST_ERR.$OMPI_COMM_WORLD_RANK"')
ACTLAB_TEST_ERR="$work/err" mpirun --allow-run-as-root --oversubscribe -np 2 -x ACTLAB_TEST_ERR \
  "${per_rank_stderr[@]}" "$bin" --distributed "${common[@]}" --print-every 1 > "$work/run.out" 2>&1 &
mpirun_pid=$!
for _ in $(seq 1 600); do [ -f "$work/ck/last.safetensors" ] && break; sleep 0.1; done
[ -f "$work/ck/last.safetensors" ] || fail "no checkpoint after 60 s"
rank1=""
for child in $(pgrep -P "$mpirun_pid"); do
  tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && rank1=$child
done
[ -n "$rank1" ] || fail "rank 1's process not found among mpirun's children"
kill -9 "$rank1"
killed_at=$(date +%s)
for _ in $(seq 1 300); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$mpirun_pid" 2>/dev/null; then
  fail "the job still runs 30 s after rank 1 was killed"
  kill -9 "$mpirun_pid"
fi
wait "$mpirun_pid"
status=$?
echo "rank 1 (pid $rank1) killed; mpirun exited with $status after $(($(date +%s) - killed_at)) s"
[ "$status" -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -q "^actlab-train: error: rank 0 of 2: rank 1 (pid $rank1 on .*) died" "$work/err.0" ||
  fail "no line from rank 0 naming rank 1; rank 0's stderr: $(tail -5 "$work/err.0" 2>/dev/null)"
# Besides actlab's line, Open MPI's shared-memory transport may print its own when the peer vanished in the
# middle of a single-copy read ("[host:pid] Read -1, expected N, errno = 3"): the library writes it, not
# actlab, and whether it appears depends on where in the transfer the kill lands. Only actlab's lines count.
ours=$(grep -v -E '^\[[^]]+:[0-9]+\] Read -1, expected [0-9]+, errno = [0-9]+$' "$work/err.0" | grep -c .)
[ "$ours" = 1 ] || fail "rank 0 wrote more than one line of its own to stderr: $(cat "$work/err.0")"
grep -q "rank 1" "$work/run.out" || fail "the job's output does not name rank 1: $(tail -8 "$work/run.out")"
epoch_before=$(epoch_of "$work/ck/last.safetensors")
"${launch[@]}" --resume "$work/ck/last.safetensors" --quiet > "$work/resume.out" 2>&1 ||
  fail "resume after the kill failed: $(tail -3 "$work/resume.out")"
[ "$(epoch_of "$work/ck/last.safetensors")" = "$epochs" ] ||
  fail "the resumed run (from epoch $epoch_before) did not finish epoch $epochs"
# Ranks launched with different options (an MPMD command line) are refused by every rank before training,
# each naming its side, instead of training on overlapping shards at different rates or waiting in a
# collective the other rank never starts. A rank's placement (--threads) and rank 0's outputs may differ.
small=(--distributed --model mlp --dataset synthetic --synthetic-size 64 --batch-size 8 --steps-per-epoch 2
       --epochs 1 --test-limit 16 --no-augment --dist-timeout 60 --quiet)
mpmd=(mpirun --allow-run-as-root --oversubscribe -np 1 "$bin" "${small[@]}" --threads 1)
"${mpmd[@]}" --lr 0.05 : -np 1 "$bin" "${small[@]}" --threads 1 --lr 0.5 > "$work/mpmd.out" 2>&1
status=$?
[ "$status" -ne 0 ] || fail "ranks launched with different --lr trained (exit 0)"
grep -q "rank 1 of 2: launched with other options than rank 0: --lr '0.5' (was '0.05')" "$work/mpmd.out" ||
  fail "rank 1 does not name the option it differs in: $(tail -4 "$work/mpmd.out")"
grep -q "rank 0 of 2: rank 1 was launched with other options than rank 0" "$work/mpmd.out" ||
  fail "rank 0 does not name rank 1: $(tail -4 "$work/mpmd.out")"
# A repeated option given on one rank only (a policy rule) is named as such, not as a shifted list.
"${mpmd[@]}" : -np 1 "$bin" "${small[@]}" --threads 1 --policy-rule fc1=exact > "$work/mpmd-rule.out" 2>&1
[ $? -ne 0 ] || fail "ranks launched with different policy rules trained (exit 0)"
grep -q "rank 1 of 2: launched with other options than rank 0: --policy-rule 'fc1=exact' (was '')" "$work/mpmd-rule.out" ||
  fail "rank 1 does not name its policy rule: $(tail -4 "$work/mpmd-rule.out")"
# The same rule on rank 0 only: rank 1 has no rule of its own to compare, and must still see rank 0's.
"${mpmd[@]}" --policy-rule fc1=exact : -np 1 "$bin" "${small[@]}" --threads 1 > "$work/mpmd-rule0.out" 2>&1
[ $? -ne 0 ] || fail "a policy rule on rank 0 alone trained (exit 0)"
grep -q "rank 1 of 2: launched with other options than rank 0: --policy-rule '' (was 'fc1=exact')" "$work/mpmd-rule0.out" ||
  fail "rank 1 does not name rank 0's policy rule: $(tail -4 "$work/mpmd-rule0.out")"
"${mpmd[@]}" --log "$work/mpmd.csv" : -np 1 "$bin" "${small[@]}" --threads 2 > "$work/mpmd-ok.out" 2>&1 ||
  fail "ranks differing only in --threads and rank 0's --log were refused: $(tail -3 "$work/mpmd-ok.out")"
[ -s "$work/mpmd.csv" ] || fail "rank 0's --log was not written"
# Ranks given other data through --data-dir (which may differ between ranks): refused by every rank, the
# differing one naming both data sets, instead of an MPI abort in a collective of another size.
make_idx() {  # make_idx DIR N [LABEL]: N train and N test images of 28x28, all of label LABEL (1)
  mkdir -p "$1"
  local n; n=$(printf '\\x%02x' "$2")
  { printf "\x00\x00\x08\x03\x00\x00\x00$n\x00\x00\x00\x1c\x00\x00\x00\x1c"; head -c $(($2 * 784)) /dev/zero; } > "$1/train-images-idx3-ubyte"
  { printf "\x00\x00\x08\x01\x00\x00\x00$n"; head -c "$2" /dev/zero | tr '\0' "\\${3:-1}"; } > "$1/train-labels-idx1-ubyte"
  cp "$1/train-images-idx3-ubyte" "$1/t10k-images-idx3-ubyte"
  cp "$1/train-labels-idx1-ubyte" "$1/t10k-labels-idx1-ubyte"
}
make_idx "$work/idx16" 16 && make_idx "$work/idx32" 32 && make_idx "$work/idx16b" 16 2
data=(--distributed --model mlp --dataset mnist --batch-size 8 --epochs 1 --threads 1 --dist-timeout 60 --quiet)
mpirun --allow-run-as-root --oversubscribe -np 1 "$bin" "${data[@]}" --data-dir "$work/idx16" : \
  -np 1 "$bin" "${data[@]}" --data-dir "$work/idx32" > "$work/data.out" 2>&1
[ $? -ne 0 ] || fail "ranks reading other data sets trained (exit 0)"
grep -q "rank 1 of 2: its data set has 32 training and 32 test images, 10 classes, contents [0-9a-f]*, rank 0's 16 training and 16 test images" "$work/data.out" ||
  fail "rank 1 does not name both data sets: $(tail -4 "$work/data.out")"
grep -q "MPI_ERR\|MPI_ABORT was invoked" "$work/data.out" && fail "an MPI error, not one line: $(tail -4 "$work/data.out")"
# The same sizes and classes, other labels (another copy under the same shape: MNIST where Fashion-MNIST was).
mpirun --allow-run-as-root --oversubscribe -np 1 "$bin" "${data[@]}" --data-dir "$work/idx16" : \
  -np 1 "$bin" "${data[@]}" --data-dir "$work/idx16b" > "$work/data-labels.out" 2>&1
[ $? -ne 0 ] || fail "ranks reading data sets of other labels trained (exit 0)"
grep -q "rank 1 of 2: its data set has 16 training and 16 test images, 10 classes, contents [0-9a-f]*, rank 0's 16 training" "$work/data-labels.out" ||
  fail "rank 1 does not name both data sets of other labels: $(tail -4 "$work/data-labels.out")"
# Batch norm without --sync-bn: each rank's running statistics are its own batches', and the evaluation is
# sharded; the test figures logged must be those of the model saved (rank 0's statistics on every shard).
"${launch[@]}" --model resnet20 --dataset synthetic --synthetic-size 96 --batch-size 16 --epochs 2 --threads 1 \
  --test-limit 64 --save-dir "$work/bn" --log "$work/bn.csv" --quiet > "$work/bn.out" 2>&1 ||
  fail "the batch-norm run failed: $(tail -3 "$work/bn.out")"
logged=$(tail -1 "$work/bn.csv" | cut -d, -f5)
evaluated=$("$bin" --resume "$work/bn/last.safetensors" --eval-only --threads 1 2>&1 | sed -n 's/.*test loss \([0-9.]*\) .*/\1/p')
[ -n "$evaluated" ] && [ "$(printf '%.4f' "$logged")" = "$evaluated" ] ||
  fail "2 ranks logged test loss $logged; the saved model evaluates to '$evaluated'"
echo "dist fault checks: $failures failed"
[ "$failures" -eq 0 ]
