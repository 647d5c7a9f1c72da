#!/usr/bin/env bash
# Every app other than actlab-train (whose outputs bad_input.sh covers) fails with one clear error
# line and a non-zero exit when an output cannot be written, before its long work, and leaves no
# file behind: a directory that does not exist, a path under a regular file, a directory where a
# file is asked for, a full device; bad values of actlab-inspect's own flags fail the same way. And an
# output that can be written is written.
#   tests/cli/app_outputs.sh BUILD_DIR
set -u
build="$1"
source "$(dirname "$0")/lib.sh"
cases=0

check() {  # [late=1] [silent=1] check "description" "expected words (grep -E)" app args...
  local what="$1" expect="$2" app="$3"
  shift 3
  cases=$((cases + 1))
  local out rc
  out=$(timeout 120 "$build/$app" "$@" 2>&1 >"$work/check.stdout")
  rc=$?
  local errors
  errors=$(printf '%s\n' "$out" | grep -c "$app: error:")
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then fail "[$what] exit code $rc: $out"; return; fi
  if [ "$errors" -ne 1 ]; then fail "[$what] expected one error line, got: $out"; return; fi
  if ! printf '%s\n' "$out" | grep "$app: error:" | grep -Eq -- "$expect"; then
    fail "[$what] message does not match '$expect': $out"; return
  fi
  # "before its long work": nothing was measured or trained first (a full disk shows only at the write).
  if [ "${late:-0}" -eq 0 ] && printf '%s\n' "$out" | grep -q "^measuring\|^training"; then fail "[$what] the error came after the work: $out"; return; fi
  # silent=1: not even a table's header reached stdout (a table's rows print there as each is measured).
  if [ "${silent:-0}" -eq 1 ] && [ -s "$work/check.stdout" ]; then fail "[$what] printed before failing: $(head -3 "$work/check.stdout")"; return; fi
  echo "ok   [$what] $(printf '%s\n' "$out" | grep "$app: error:")"
}

: > "$work/a-file"
tiny_mem=(--models mlp --batches 2 --image-size 8 --channels 1 --policies exact)
check "memtable --out, no such dir"   "--out file '$work/no/t.md': directory '$work/no' does not exist" \
  actlab-memtable "${tiny_mem[@]}" --out "$work/no/t.md"
check "memtable --csv, under a file"  "--csv file '$work/a-file/t.csv'" \
  actlab-memtable "${tiny_mem[@]}" --csv "$work/a-file/t.csv"
check "memtable --out is a directory" "--out file '$work' is a directory" \
  actlab-memtable "${tiny_mem[@]}" --out "$work"
# /dev/full takes the open and fails the write with ENOSPC (and must stay a device afterwards).
late=1 check "memtable --csv, disk full" "writing '/dev/full' failed: No space left on device" \
  actlab-memtable "${tiny_mem[@]}" --csv /dev/full
[ -c /dev/full ] || fail "/dev/full is no longer a character device"
check "ablate --out not creatable"    "cannot create output directory '/proc/actlab-nope'" \
  actlab-ablate --out /proc/actlab-nope --policies exact --models mlp --seeds 0
check "ablate --out under a file"     "cannot create output directory '$work/a-file/x'" \
  actlab-ablate --out "$work/a-file/x" --policies exact --models mlp --seeds 0
check "ablate --radar, no results file" "--results file '$work/none.csv' cannot be read: No such file or directory" \
  actlab-ablate --radar --results "$work/none.csv" --memory "$work/none.csv" --throughput "$work/none.csv" --out "$work/r.svg"
check "ablate --radar --out under a file" "--out file '$work/a-file/r.svg'" \
  actlab-ablate --radar --results "$work/none.csv" --out "$work/a-file/r.svg"
echo "method,bytes" > "$work/mem.csv"
check "ablate --radar --out on its --memory" "--out and --memory name the same file" \
  actlab-ablate --radar --results "$work/none.csv" --memory "$work/mem.csv" --throughput "$work/none.csv" --out "$work/mem.csv"
[ "$(cat "$work/mem.csv")" = "method,bytes" ] || fail "ablate --radar --out on its --memory: the input was changed"
check "bench_train --csv, under a file" "--csv file '$work/a-file/b.csv'" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0 --csv "$work/a-file/b.csv"
check "inspect --out not creatable"   "cannot create output directory '/proc/actlab-nope'" \
  actlab-inspect --model mlp --out /proc/actlab-nope
check "inspect --out under a file"    "cannot create output directory '$work/a-file/x'" \
  actlab-inspect --model mlp --out "$work/a-file/x"
# A directory with files of its own (--out . in a project) keeps them: only an earlier report's are replaced.
mkdir -p "$work/project" && echo "a project's own README" > "$work/project/README.md"
check "inspect --out over a foreign README" "output file '$work/project/README.md' already exists; pass --overwrite" \
  actlab-inspect --model mlp --batch-size 4 --out "$work/project"
[ "$(cat "$work/project/README.md")" = "a project's own README" ] || fail "inspect replaced a README it did not write"
check "inspect --draws 0"             "--draws must be in \\[1, 10000\\], got 0" \
  actlab-inspect --model mlp --out "$work/i" --draws 0
check "inspect --policy-rule malformed" "bad --policy-rule 'nope': expected MODULE_PATTERN=POLICY" \
  actlab-inspect --model mlp --out "$work/i" --policy-rule nope
check "inspect --precision fp16 on a CPU" "--precision fp16 needs a GPU" \
  actlab-inspect --model mlp --out "$work/i" --precision fp16
mkdir -p "$work/iblock/grad_error.csv"  # one output's name taken by a directory: fails before the work
check "inspect output name is a directory" "output file '$work/iblock/grad_error.csv' is a directory" \
  actlab-inspect --model mlp --out "$work/iblock"
check "memtable unknown model, late in the list" "unknown model 'resnet7'" \
  actlab-memtable --models mlp,resnet7 --batches 2 --image-size 8 --channels 1 --policies exact
check "memtable --out and --csv on one file" "--out and --csv name the same file" \
  actlab-memtable "${tiny_mem[@]}" --out "$work/same.txt" --csv "$work/./same.txt"
ln -s later.txt "$work/later-link"  # dangling: a write through it creates later.txt
check "memtable --csv through a dangling link to --out" "--out and --csv name the same file" \
  actlab-memtable "${tiny_mem[@]}" --out "$work/later.txt" --csv "$work/later-link"
[ ! -e "$work/later.txt" ] || fail "memtable wrote through a dangling link to its other output"
check "memtable image too small for a later model" "image size 2 is too small for resnet20 \\(at least" \
  actlab-memtable --models mlp,resnet20 --batches 2 --image-size 2 --channels 1 --policies exact
check "memtable image size a later ViT cannot take" "image size 6 is not a multiple of the patch size 4" \
  actlab-memtable --models mlp,vit_tiny_cifar --batches 2 --image-size 6 --channels 1 --policies exact
# A policy that one model of the grid cannot follow (mlp has no blocks to checkpoint, nor a layer1) fails by the
# step's own rule before any cell is measured, not at its own cell after the rows before it.
silent=1 check "memtable checkpoint a later model cannot take" \
  "policy 'checkpoint' cannot run on mlp: checkpoint: this model has no blocks" \
  actlab-memtable --models resnet20,mlp --batches 2 --image-size 8 --channels 1 --policies 'exact;checkpoint'
silent=1 check "memtable checkpoint rule naming no module of a later model" \
  "policy 'exact\|layer1\.\*=checkpoint' cannot run on mlp: checkpoint rule 'layer1\.\*=checkpoint' matches no module" \
  actlab-memtable --models resnet20,mlp --batches 2 --image-size 8 --channels 1 --policies 'exact;exact|layer1.*=checkpoint'
silent=1 check "bench_train checkpoint a later model cannot take" "policy 'checkpoint' cannot run on mlp" \
  bench_train --models resnet20,mlp --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0 \
  --policies 'exact;checkpoint'
check "ablate --models empty"         "--models names no model" \
  actlab-ablate --dry-run --policies exact --models '' --out "$work/abx"
check "ablate --seeds empty"          "--seeds names no seed" \
  actlab-ablate --dry-run --policies exact --models mlp --seeds '' --out "$work/abx"
check "bench_compress empty policy list" "--policies is empty" \
  bench_compress --policies ''
check "bench_scale no rank counts"    "--ranks and --global-batches each need one or more counts" \
  bench_scale --ranks ''
check "bench_scale rank count not a number" "--ranks: '8x' is not a whole number" \
  bench_scale --ranks 8,8x
check "bench_scale link bandwidth not a number" "--links: bandwidth must be a number > 0" \
  bench_scale --links 'a=x@1'
check "bench_scale global batch 0"    "--global-batches: each must be a multiple of 512" \
  bench_scale --global-batches 0
check "bench_scale global batch no method divides" "--global-batches: each must be a multiple of 512 .*got 7" \
  bench_scale --global-batches 7
check "bench_scale check batch 0"     "--check-batch must be >= 1, got 0" \
  bench_scale --check --compute-ms 10 --link-gbs 1 --check-batch 0
check "bench_train empty list item"   "the list 'resnet20,,resnet18' has an empty item" \
  bench_train --models resnet20,,resnet18
check "bench_train batch 0 named"     "--batch must be >= 1, got 0" \
  bench_train --batch 0
check "bench_conv typo in the last impl, before any timing" "unknown conv implementation 'bogus'" \
  bench_conv --model resnet20 --impl auto,bogus
check "bench_conv empty impl list"    "--impl is empty" \
  bench_conv --model resnet20 --impl ''
# A CPU without bf16 refuses the precision first; one with it, the implementation (no bf16 Winograd).
check "bench_conv dnnl-wino@bf16, before any timing" "dnnl-wino has no bf16 path|neither avx512_bf16 nor amx_bf16" \
  bench_conv --model resnet20 --batch 1 --reps 1 --quiet-wait 0 --impl auto,dnnl-wino@bf16
# ... and an entry's precision too: nothing is timed (no table row on stdout) before fp16 is refused.
cases=$((cases + 1))
conv_out=$(timeout 120 "$build/bench_conv" --model resnet20 --batch 1 --reps 1 --quiet-wait 0 --impl auto,auto@fp16 2>&1)
if [ $? -ne 0 ] && echo "$conv_out" | grep -q "fp16 needs a GPU" && ! echo "$conv_out" | grep -q '^| resnet20 |'; then
  echo "ok   [bench_conv refuses auto@fp16 before timing auto]"
else
  fail "[bench_conv refuses auto@fp16 before timing auto] $conv_out"
fi
check "memtable batch past int64"     "bad batch size '99999999999999999999'" \
  actlab-memtable --models mlp --batches 99999999999999999999 --image-size 8 --channels 1 --policies exact
late=1 check "memtable elements past int64" "has more elements than a 64-bit count holds" \
  actlab-memtable --models mlp --batches 4611686018427387904 --image-size 28 --channels 1 --policies exact
check "bench_train no timed steps"    "--steps >= 1" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --steps 0 --max-steps 0
check "bench_train empty policy list" "--policies is empty" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --interleave --policies ''
late=1 check "bench_train rule matching nothing" "the policy rule for 'conv9' matched no save of mlp" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0 \
  --policies 'division:B=8,Q=2|conv9=exact'
# A typo late in a list fails before the earlier entries are measured (their rows, and --csv/--out, were lost).
check "bench_train bad policy late in the list" "bad policy 'divison:B=8'" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0 \
  --policies 'exact;divison:B=8' --csv "$work/late.csv"
check "bench_train bad model late in the list" "unknown model 'resnet2'" \
  bench_train --models mlp,resnet2 --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0
check "bench_train --rounds with --interleave" "--rounds repeats the policy list of a run without --interleave" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --interleave --rounds 2
check "bench_compress bad policy late in the list" "bad policy 'divison'" \
  bench_compress --batch 1 --reps 1 --threads 1 --policies 'quant:Q=2;divison' --out "$work/late.md"
if "$build/bench_compress" --batch 1 --reps 1 --threads 1 --policies 'division:B=8,Q=2,R=1' --out "$work/r1.md" \
    > "$work/r1.out" 2>&1 && grep -q "division:B=8,Q=2,R=1 | (1,64,32,32)" "$work/r1.md"; then
  echo "ok   [bench_compress measures a policy with a range per row]"
else
  fail "[bench_compress measures a policy with a range per row] $(tail -2 "$work/r1.out")"
fi
check "ablate --policies with no policy" "--policies names no policy" \
  actlab-ablate --policies '' --models mlp --out "$work/abl-empty"
check "ablate --policies ';' (an empty item)" "the list ';' has an empty item" \
  actlab-ablate --policies ';' --models mlp --out "$work/abl-empty"
check "ablate --train-arg on a managed flag" "--train-arg --epochs=2: the grid sets --epochs" \
  actlab-ablate --policies exact --models mlp --train-arg=--epochs=2 --out "$work/abl-managed"
# Cells that fail are FAILED lines in the progress on stdout, and one closing error line on stderr.
check "ablate cells that fail"        "2 of 2 cells failed; the first, mlp-fashion-mnist-exact-s0: exit 2: actlab-train: error: unknown option --frobnicate" \
  actlab-ablate --policies 'exact;quant:Q=2' --models mlp --seeds 0 --epochs 1 --threads 1 --train-arg=--frobnicate --out "$work/abl"
# A temp file a killed run left beside an output (NAME.tmp.PID of a process that is gone: 9999999 is past
# any pid_max) is removed.
cases=$((cases + 1))
echo partial > "$work/t.md.tmp.9999999"
if out=$("$build/actlab-memtable" "${tiny_mem[@]}" --out "$work/t.md" 2>&1) &&
   printf '%s\n' "$out" | grep -q "removed '$work/t.md.tmp.9999999'" &&
   [ ! -e "$work/t.md.tmp.9999999" ] && [ -s "$work/t.md" ]; then
  echo "ok   [memtable removes a killed run's temp file]"
else
  fail "[memtable removes a killed run's temp file] $(ls "$work" | grep tmp)"
fi
# A cell of several epochs says each one on the progress line as it ends (the paper preset's cells take hours).
cases=$((cases + 1))
if out=$("$build/actlab-ablate" --policies exact --models mlp --seeds 0 --epochs 2 --steps-per-epoch 4 --test-limit 64 \
           --threads 1 --out "$work/abl-epochs" 2>&1) &&
   printf '%s\n' "$out" | grep -Eq '^\[1/1\] mlp exact seed 0 .* epoch 1/2 [0-9.]+% . epoch 2/2 [0-9.]+% . .*test acc'; then
  echo "ok   [ablate shows a cell's epochs as they end]"
else
  fail "[ablate shows a cell's epochs as they end] $out"
fi
# --report-only --out alone reports that grid under the flags that trained it (its command.txt) ...
cases=$((cases + 1))
cp "$work/abl-epochs/results.csv" "$work/abl-epochs.csv"
if out=$("$build/actlab-ablate" --report-only --out "$work/abl-epochs" 2>&1) &&
   printf '%s\n' "$out" | grep -q "the grid's flags from $work/abl-epochs/command.txt" &&
   cmp -s "$work/abl-epochs/results.csv" "$work/abl-epochs.csv"; then
  echo "ok   [ablate --report-only --out alone reports the grid there]"
else
  fail "[ablate --report-only --out alone reports the grid there] $out"
fi
# ... and another grid's flags (here the preset's) would drop its finished rows: refused, nothing written.
check "ablate --report-only of another grid" "records 1 finished cell this grid does not have \\(the first mlp-" \
  actlab-ablate --report-only --out "$work/abl-epochs" --epochs 3
cmp -s "$work/abl-epochs/results.csv" "$work/abl-epochs.csv" || fail "[ablate --report-only of another grid] results.csv changed"
# A grid trained in two commands (seed 0, then seed 1): command.txt holds the second, which lacks seed 0's cell.
"$build/actlab-ablate" --policies exact --models mlp --seeds 1 --epochs 2 --steps-per-epoch 4 --test-limit 64 \
  --threads 1 --out "$work/abl-epochs" > /dev/null 2>&1 || fail "[ablate second seed] did not run"
"$build/actlab-ablate" --report-only --policies exact --models mlp --seeds 0,1 --epochs 2 --steps-per-epoch 4 \
  --test-limit 64 --out "$work/abl-epochs" > /dev/null 2>&1 || fail "[ablate report of both seeds] refused"
check "ablate --report-only --out alone, grid trained in two commands" "the first mlp-.*-s0\\); .*they came from .*command.txt, the last command that trained there; give the flags of the whole grid" \
  actlab-ablate --report-only --out "$work/abl-epochs"
mkdir -p "$work/notes" && echo "my table" > "$work/notes/tables.md"
check "ablate --out a folder of other files" "output directory '$work/notes' holds files and no grid \\(no cells/ folder\\), 'tables.md' among them" \
  actlab-ablate --policies exact --models mlp --seeds 0 --epochs 1 --out "$work/notes"
[ "$(cat "$work/notes/tables.md")" = "my table" ] && [ ! -e "$work/notes/.lock" ] ||
  fail "[ablate --out a folder of other files] changed the folder: $(ls -A "$work/notes")"
check "ablate --radar with a grid's flag" "--table is a grid's flag; --radar draws from --results" \
  actlab-ablate --radar --table 1c --results "$work/none.csv" --out "$work/r.svg"
check "ablate --dry-run, --out a file" "cannot create output directory '$work/a-file': '$work/a-file' is not a directory" \
  actlab-ablate --dry-run --policies exact --models mlp --seeds 0 --out "$work/a-file"
check "ablate seed past int64"        "--seeds needs non-negative integers below 2\\^63" \
  actlab-ablate --policies exact --models mlp --seeds 99999999999999999999 --dry-run
check "inspect unknown data set"      "unknown data set 'imagenet'" \
  actlab-inspect --model mlp --dataset imagenet --out "$work/i"
mkdir -p "$work/runs" && : >"$work/runs/last.safetensors"
check "inspect --checkpoint a directory" "checkpoint '$work/runs' is a directory; give the .safetensors file in it, e.g. $work/runs/last.safetensors" \
  actlab-inspect --checkpoint "$work/runs" --out "$work/i"
late=1 check "inspect rule matching nothing" "policy rule for 'nosuch' matched no save of mlp" \
  actlab-inspect --model mlp --out "$work/i2" --threads 1 --policies 'quant:Q=2' --policy-rule nosuch=exact
[ -e "$work/i" ] && fail "[inspect bad flags] created --out '$work/i' before failing"
[ -e "$work/i2" ] && fail "[inspect rule matching nothing] left the --out folder it made: $(find "$work/i2")"

# The good path: both files written, complete, no temp file left beside them.
cases=$((cases + 1))
if "$build/actlab-memtable" "${tiny_mem[@]}" --out "$work/t.md" --csv "$work/t.csv" >/dev/null 2>&1 &&
   grep -q "| mlp | 2 | Normal | exact |" "$work/t.md" && [ "$(wc -l < "$work/t.csv")" -eq 2 ] &&
   [ -z "$(ls "$work" | grep '\.tmp\.')" ]; then
  echo "ok   [memtable writes --out and --csv]"
else
  fail "[memtable writes --out and --csv] $(ls "$work")"
fi
# A rerun replaces its own earlier tables (above: t.md twice); a file of anything else only with --overwrite.
echo "my notes" > "$work/notes.csv"
check "memtable --csv over a file it did not write" "--csv file '$work/notes.csv' already exists; pass --overwrite" \
  actlab-memtable "${tiny_mem[@]}" --csv "$work/notes.csv"
check "bench_train --csv over a file it did not write" "--csv file '$work/notes.csv' already exists; pass --overwrite" \
  bench_train --models mlp --batch 2 --image-size 8 --channels 1 --steps 1 --warmup 0 --min-time 0 --csv "$work/notes.csv"
check "bench_compress --out over a file it did not write" "--out file '$work/notes.csv' already exists; pass --overwrite" \
  bench_compress --batch 1 --reps 1 --threads 1 --policies quant:Q=2 --out "$work/notes.csv"
check "memtable --by-kind over its own --csv table" "--by-kind file '$work/t.csv' already exists; pass --overwrite" \
  actlab-memtable "${tiny_mem[@]}" --by-kind "$work/t.csv"
echo '<svg xmlns="http://www.w3.org/2000/svg"/>' > "$work/logo.svg"
check "ablate --radar --out over an SVG it did not draw" "--out file '$work/logo.svg' already exists; pass --overwrite" \
  actlab-ablate --radar --results "$work/none.csv" --out "$work/logo.svg"
check "ablate --overwrite without --radar" "--overwrite applies to --radar's --out file only" \
  actlab-ablate --policies exact --models mlp --seeds 0 --overwrite --out "$work/abl-ow"
[ "$(cat "$work/notes.csv")" = "my notes" ] && grep -q '^<svg' "$work/logo.svg" || fail "a refused output was changed"
cases=$((cases + 1))
if "$build/actlab-memtable" "${tiny_mem[@]}" --csv "$work/notes.csv" --overwrite >/dev/null 2>&1 &&
   head -1 "$work/notes.csv" | grep -q '^model,batch,policy,method,'; then
  echo "ok   [memtable --overwrite replaces a file it did not write]"
else
  fail "[memtable --overwrite replaces a file it did not write] $(head -1 "$work/notes.csv")"
fi

# The table on stdout has its header, and a policy string with a rule stays one Markdown cell ('|' escaped).
cases=$((cases + 1))
if out=$("$build/actlab-memtable" --models mlp --batches 2 --image-size 8 --channels 1 \
           --policies 'exact;quant:Q=2|fc1=exact' --threads 1 2>/dev/null) &&
   printf '%s\n' "$out" | head -1 | grep -q '^| model | batch | method | policy | .* | peak GiB (1 thread) |' &&
   printf '%s\n' "$out" | grep -q '| quant:Q=2\\|fc1=exact | 0\.'; then
  echo "ok   [memtable prints its header and escapes '|' in a cell]"
else
  fail "[memtable prints its header and escapes '|' in a cell] $out"
fi

# Without ';' the list splits on ',' only before a policy name: one policy with parameters and a rule whose
# policy has parameters of its own stays one entry, and a ','-list of names still splits.
cases=$((cases + 1))
out2=""
if out=$("$build/actlab-memtable" --models mlp --batches 2 --image-size 8 --channels 1 --threads 1 \
           --policies 'quant:Q=2,R=1|fc1=division:B=8,Q=2,R=1' 2>&1) &&
   printf '%s\n' "$out" | grep -q '| quant:Q=2,R=1\\|fc1=division:B=8,Q=2,R=1 | 0\.' &&
   out2=$("$build/actlab-memtable" --models mlp --batches 2 --image-size 8 --channels 1 --threads 1 \
            --policies 'exact,quant:Q=2,R=1,exact@bf16' 2>&1) &&
   [ "$(printf '%s\n' "$out2" | grep -c '^| mlp | 2 |')" = 3 ]; then
  echo "ok   [memtable splits a ','-list before names only]"
else
  fail "[memtable splits a ','-list before names only] $out $out2"
fi

# The rates against exact do not depend on where exact stands in the list: with it last, the rows before it
# still get theirs, in the table and the CSV, equal to the exact-first run's. SWAP keeps nothing on the
# "device" (0 kept / 0 closed form): its ratio cell is empty, as every undefined cell is, not a 0.
cases=$((cases + 1))
field() { awk -F, -v p="$2" -v c="$3" '$3 == p { print $c }' "$1"; }  # CSV FILE POLICY COLUMN
if out=$("$build/actlab-memtable" --models mlp --batches 2 --image-size 8 --channels 1 --threads 1 \
           --policies 'quant:Q=2;swap;exact' --csv "$work/last.csv" 2>/dev/null) &&
   "$build/actlab-memtable" --models mlp --batches 2 --image-size 8 --channels 1 --threads 1 \
     --policies 'exact;quant:Q=2;swap' --csv "$work/first.csv" >/dev/null 2>&1 &&
   printf '%s\n' "$out" | grep -q '| quant:Q=2 | [0-9.]* | [0-9.]* ([0-9.]*x) |' &&
   [ -n "$(field "$work/last.csv" quant:Q=2 7)" ] &&
   [ "$(field "$work/last.csv" quant:Q=2 7)" = "$(field "$work/first.csv" quant:Q=2 7)" ] &&
   [ "$(field "$work/last.csv" quant:Q=2 19)" = "$(field "$work/first.csv" quant:Q=2 19)" ] &&
   [ "$(field "$work/last.csv" swap 9)" = 0 ] && [ "$(field "$work/last.csv" swap 10)" = 0 ] &&
   [ -z "$(field "$work/last.csv" swap 11)" ] && [ "$(field "$work/last.csv" quant:Q=2 11)" = 1 ]; then
  echo "ok   [memtable rates do not depend on the order of the list; an undefined ratio is an empty cell]"
else
  fail "[memtable rates do not depend on the order of the list; an undefined ratio is an empty cell] $out $(cat "$work/last.csv" 2>&1)"
fi

# inspect's --policy-rule reaches the gradient errors: '*=exact' overrides every module, so each policy's
# error is 0; --draws shows in the CSV. The reconstructions are the codec's alone, and the report says so.
cases=$((cases + 1))
if "$build/actlab-inspect" --model mlp --out "$work/i" --threads 1 --draws 2 --policies 'quant:Q=2' \
     --policy-rule '*=exact' >/dev/null 2>&1 &&
   grep -q '^fc1,Linear,512x784,[0-9.e-]*,quant:Q=2|\*=exact,0,2,0$' "$work/i/grad_error.csv" &&
   grep -q "Each entry's codec alone: per-module rules (--policy-rule)" "$work/i/README.md"; then
  echo "ok   [inspect applies --policy-rule and --draws]"
else
  fail "[inspect applies --policy-rule and --draws] $(head -3 "$work/i/grad_error.csv" 2>&1)"
fi

# --precision bf16: the gradient errors run under bf16 (exact keeps bf16 copies, so the bf16 entry's error is
# 0) and the report says so. A CPU without bf16 kernels refuses it in one line instead.
cases=$((cases + 1))
bf16_out=$("$build/actlab-inspect" --model mlp --out "$work/ib" --threads 1 --precision bf16 --policies 'bf16;quant:Q=2' 2>&1)
if [ $? -ne 0 ]; then
  echo "$bf16_out" | grep -qE "bf16: this CPU has neither|bf16 kernels, which a minimal" &&
    echo "ok   [inspect --precision bf16 refused on this CPU: $bf16_out]" ||
    fail "[inspect --precision bf16] $bf16_out"
elif grep -q "^- Gradient errors computed in bf16" "$work/ib/README.md" &&
     grep -q "These are each codec on the fp32 inputs, whatever --precision says" "$work/ib/README.md" &&
     grep -q '^fc1,Linear,512x784,[0-9.e-]*,bf16,0,1,0$' "$work/ib/grad_error.csv"; then
  echo "ok   [inspect --precision bf16 measures against exact at bf16]"
else
  fail "[inspect --precision bf16 measures against exact at bf16] $(head -3 "$work/ib/grad_error.csv" 2>&1)"
fi

# A bf16 run's first-step report gives the policy's ratio against fp32 saves and against exact's bf16 copies
# (half of it), and evaluating its checkpoint names the precision the figures were computed in.
cases=$((cases + 1))
tb_out=$("$build/actlab-train" --model mlp --precision bf16 --policy division:B=8,Q=2 --threads 1 --batch-size 16 \
  --steps-per-epoch 2 --train-limit 64 --test-limit 32 --save-dir "$work/tb" 2>&1)
if [ $? -ne 0 ]; then
  echo "$tb_out" | grep -qE "bf16: this CPU has neither|bf16 kernels, which a minimal" &&
    echo "ok   [train --precision bf16 refused on this CPU: $(echo "$tb_out" | tail -1)]" ||
    fail "[train --precision bf16 reports both ratios] $tb_out"
else
  fp32_ratio=$(echo "$tb_out" | sed -n 's/^policy .* kept, \([0-9.]*\)x measured.*/\1/p')
  bf16_ratio=$(echo "$tb_out" | sed -n "s/^  under bf16, raw is the saves in fp32; against exact's bf16 copies (half of raw): \([0-9.]*\)x$/\1/p")
  ev_out=$("$build/actlab-train" --resume "$work/tb/last.safetensors" --eval-only 2>&1)
  if [ -n "$fp32_ratio" ] && [ -n "$bf16_ratio" ] &&
     awk -v a="$fp32_ratio" -v b="$bf16_ratio" 'BEGIN { d = a / 2 - b; exit !(d < 0.006 && d > -0.006) }' &&
     echo "$ev_out" | grep -q "^eval .*, in bf16: test loss"; then
    echo "ok   [train --precision bf16 reports both ratios ($fp32_ratio, $bf16_ratio) and its eval names bf16]"
  else
    fail "[train --precision bf16 reports both ratios] ratios '$fp32_ratio' '$bf16_ratio'; $tb_out; $ev_out"
  fi
fi

# A checkpointed entry's reconstructions are its codec's: reconstruction.csv names the entry as grad_error.csv
# does (so the two join on it) and the codec beside it.
cases=$((cases + 1))
entry='"checkpoint:segments=auto+division:B=8,Q=2"'
if "$build/actlab-inspect" --model resnet20 --out "$work/ic" --threads 1 --batch-size 4 \
     --policies 'checkpoint+division:B=8,Q=2' >/dev/null 2>&1 &&
   grep -q "^conv1,4x1x28x28,$entry,[0-9.e-]*,[0-9.e-]*,[0-9]*,3136,\"division:B=8,Q=2\"\$" "$work/ic/reconstruction.csv" &&
   grep -q "^conv1,Conv2d,16x1x3x3,[0-9.e-]*,$entry," "$work/ic/grad_error.csv"; then
  echo "ok   [inspect labels a checkpointed entry's reconstructions by the entry and its codec]"
else
  fail "[inspect labels a checkpointed entry's reconstructions by the entry and its codec] $(head -2 "$work/ic/reconstruction.csv" 2>&1)"
fi

# A ViT has one conv (the patch embedding) and then (B, T, D) token maps, measured along the tokens: Fig. 4's
# README text and figure name both, not the conv formula alone.
cases=$((cases + 1))
if "$build/actlab-inspect" --model vit_tiny_cifar --dataset synthetic --out "$work/iv" --threads 1 --batch-size 2 \
     --policies 'division:B=8,Q=2' >/dev/null 2>&1 &&
   grep -q '^## Fig. 4: λᴸ and λᴴ of each conv input and token map$' "$work/iv/README.md" &&
   grep -q '^- Token maps (B, T, D): .*1-D DCT along the tokens, per (sample, feature)' "$work/iv/README.md" &&
   grep -q '<title>Fig. 4: low/high-frequency energy of each conv input and token map' "$work/iv/fig4_lambda.svg"; then
  echo "ok   [inspect describes a ViT's token maps in Fig. 4]"
else
  fail "[inspect describes a ViT's token maps in Fig. 4] $(grep -A3 '^## Fig. 4' "$work/iv/README.md" 2>&1)"
fi

# An MLP has no 2-D map and no token map: no Fig. 4 figure (one an earlier run left is removed), and the README
# says it was not written; its Linear inputs are coded all the same, so reconstruction.csv has their rows.
cases=$((cases + 1))
mkdir -p "$work/im" && echo stale >"$work/im/fig4_lambda.svg" && echo '# actlab-inspect report' >"$work/im/README.md"
if "$build/actlab-inspect" --model mlp --out "$work/im" --threads 1 --batch-size 4 --policies 'division:B=8,Q=2' \
     >/dev/null 2>&1 &&
   [ ! -e "$work/im/fig4_lambda.svg" ] &&
   grep -q '`fig4_lambda.svg` was not written' "$work/im/README.md" &&
   grep -q '^fc1,4x784,"division:B=8,Q=2",[0-9.e-]*,[0-9.e-]*,[0-9]*,3136,"division:B=8,Q=2"$' "$work/im/reconstruction.csv"; then
  echo "ok   [inspect writes no empty Fig. 4 for an MLP and measures its Linear inputs' reconstruction]"
else
  fail "[inspect writes no empty Fig. 4 for an MLP and measures its Linear inputs' reconstruction] $(ls "$work/im" 2>&1; cat "$work/im/reconstruction.csv" 2>&1)"
fi

echo "$cases cases, $failures failed"
[ "$failures" -eq 0 ]
