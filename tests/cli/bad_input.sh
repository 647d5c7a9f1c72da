#!/usr/bin/env bash
# End-to-end bad-input checks of the real actlab-train binary: each case must exit non-zero with no
# crash signal, print exactly one line starting "actlab-train: error:" that names the problem, and
# leave an existing log file untouched.
#   tests/cli/bad_input.sh PATH/TO/actlab-train
set -u
bin="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/existing.csv"
echo "precious,log,line" > "$log"
sum_before=$(md5sum "$log")
printf 'garbage' > "$work/train-images-idx3-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/train-labels-idx1-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/t10k-images-idx3-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/t10k-labels-idx1-ubyte"
: > "$work/empty-file"
failures=0
cases=0

check() {  # check "description" "expected words (grep -E)" args...
  local what="$1" expect="$2"
  shift 2
  cases=$((cases + 1))
  local out rc
  out=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$out" | grep -c 'actlab-train: error:')
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL [$what]: exit code $rc"; failures=$((failures + 1)); return
  fi
  if [ "$lines" -ne 1 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then
    echo "FAIL [$what]: expected one error line, got:"; printf '%s\n' "$out"; failures=$((failures + 1)); return
  fi
  if ! printf '%s\n' "$out" | grep -Eq "$expect"; then
    echo "FAIL [$what]: message does not match '$expect': $out"; failures=$((failures + 1)); return
  fi
  if [ "$(md5sum "$log")" != "$sum_before" ]; then
    echo "FAIL [$what]: the existing log file was changed"; failures=$((failures + 1)); return
  fi
  echo "ok   [$what] $out"
}

check "unknown flag"            "unknown option --frobnicate"      --frobnicate 3
check "flag without value"      "needs a value"                    --epochs
check "non-numeric value"       "needs an integer"                 --batch-size ten
check "batch size 0"            "batch size must be >= 1"          --batch-size 0
check "epochs -1"               "epochs must be >= 1"              --epochs -1
check "threads 0"               "threads must be >= 1"             --threads 0
check "negative lr"             "learning rate"                    --lr -0.1
check "unknown model"           "unknown model 'resnet7'"          --model resnet7
check "unknown data set"        "unknown data set"                 --dataset imagenet21k
check "unknown policy"          "unknown policy|accepted"          --policy zip:Q=2
check "division B=0"            "B"                                --policy division:B=0,Q=2
check "division Q=3"            "Q"                                --policy division:B=8,Q=3
check "malformed policy"        "policy"                           --policy 'division:B=8,,Q=2'
check "bad policy rule"         "policy-rule|MODULE_PATTERN"       --policy-rule conv1
check "missing data directory"  "not found"                        --data-dir "$work/nope"
check "corrupt data files"      "train-images-idx3-ubyte"          --data-dir "$work"
check "existing log kept"       "already exists"                   --dataset synthetic --log "$log"
check "unwritable log dir"      "does not exist"                   --dataset synthetic --log "$work/no/dir/log.csv"
check "non-finite loss"         "non-finite loss"                  --dataset synthetic --synthetic-size 64 --batch-size 32 --lr 1e30 --model resnet20
check "stray argument"          "unexpected argument"              resnet20
printf '# test config\nmodel = resnet20\nfrobnicate = 1\n' > "$work/unknown.conf"
printf 'epochs = ten\n' > "$work/badvalue.conf"
check "missing config file"     "cannot read config file"          --config "$work/nope.conf"
check "config unknown key"      "unknown.conf:3: unknown key 'frobnicate'" --config "$work/unknown.conf"
check "config bad value"        "badvalue.conf:1: epochs needs an integer" --config "$work/badvalue.conf"
check "missing checkpoint"      "cannot open checkpoint"           --resume "$work/nope.safetensors"
check "empty checkpoint"        "truncated"                        --resume "$work/empty-file"
check "garbage checkpoint"      "header length|header"             --resume "$log"
check "eval-only alone"         "eval-only needs --resume"        --eval-only --dataset synthetic
check "save dir is a file"      "cannot create save directory"     --dataset synthetic --save-dir "$log"

echo "$cases cases, $failures failed"
[ "$failures" -eq 0 ]
