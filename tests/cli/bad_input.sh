#!/usr/bin/env bash
# End-to-end bad-input catalog of the real actlab-train binary: bad flags and values, missing, empty,
# truncated, oversized, random and mislabelled data files (IDX, CIFAR, image folders), corrupt,
# truncated, foreign and other-model checkpoints, unwritable outputs and a full disk. Every case
# must exit non-zero with no crash signal, print exactly one line, starting "actlab-train: error:",
# that names the problem, and leave the existing log and checkpoints byte for byte as they were.
#   tests/cli/bad_input.sh PATH/TO/actlab-train
set -u
bin="$1"
src=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/lib.sh"
log="$work/existing.csv"
echo "precious,log,line" > "$log"
printf 'garbage' > "$work/train-images-idx3-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/train-labels-idx1-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/t10k-images-idx3-ubyte"
cp "$work/train-images-idx3-ubyte" "$work/t10k-labels-idx1-ubyte"
: > "$work/empty-file"
tiny=(--dataset synthetic --synthetic-size 64 --batch-size 32 --model mlp --threads 1)
# An existing run whose checkpoints no bad invocation may touch.
ckpt="$work/run"
"$bin" "${tiny[@]}" --save-dir "$ckpt" --quiet || { echo "FAIL: could not create the reference checkpoint"; exit 1; }
echo "precious configuration" > "$work/side.csv.config.txt"  # beside a log that does not exist yet
protected=("$log" "$ckpt/last.safetensors" "$ckpt/best.safetensors" "$work/side.csv.config.txt")
sums_before=$(md5sum "${protected[@]}")
failures=0
cases=0
runner=("$bin")

check() {  # check "description" "expected words (grep -E)" args...
  local what="$1" expect="$2"
  shift 2
  cases=$((cases + 1))
  local out rc
  out=$("${runner[@]}" "$@" 2>&1 >/dev/null)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$out" | grep -c 'actlab-train: error:')
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL [$what]: exit code $rc"; printf '%s\n' "$out"; failures=$((failures + 1)); return
  fi
  if [ "$lines" -ne 1 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then
    echo "FAIL [$what]: expected one error line, got:"; printf '%s\n' "$out"; failures=$((failures + 1)); return
  fi
  if ! printf '%s\n' "$out" | grep -Eq "$expect"; then
    echo "FAIL [$what]: message does not match '$expect': $out"; failures=$((failures + 1)); return
  fi
  if [ "$(md5sum "${protected[@]}")" != "$sums_before" ]; then
    echo "FAIL [$what]: an existing log or checkpoint was changed"; failures=$((failures + 1)); return
  fi
  if ls "$ckpt" | grep -q '\.tmp\.'; then
    echo "FAIL [$what]: a temp file was left in the save directory"; failures=$((failures + 1)); return
  fi
  echo "ok   [$what] $out"
}

# ---- flags and values
check "unknown flag"            "unknown option --frobnicate"      --frobnicate 3
check "flag without value"      "needs a value"                    --epochs
check "non-numeric value"       "needs an integer"                 --batch-size ten
check "batch size 0"            "batch size must be >= 1"          --batch-size 0
check "epochs -1"               "epochs must be >= 1"              --epochs -1
check "print-every -1"          "print-every must be >= 0"         --print-every -1
check "threads 0"               "threads must be in \\[1, 1024\\]" --threads 0
check "unknown device"          "bad device 'gpu'"                 --device gpu
check "memory limit not a size" "memory-limit '12XB' is not a size" --memory-limit 12XB
check "loss scale not 2^k"      "loss-scale must be a power of two" --loss-scale 1000
check "fp16 on a CPU"           "fp16 needs a GPU"                 --precision fp16
check "TF32 on a CPU"           "choose GPU math; this run is on cpu" --tf32
# Out of memory: one error line on stderr (the allocator table goes to stdout), exit 3, nothing touched.
check "out of memory"           "out of memory on cpu: asked for [0-9]+ bytes" --memory-limit 2MiB --save-dir "$ckpt" --resume "$ckpt/last.safetensors"
# No machine has 10000 GPUs: fails as "built without CUDA" / "no device is usable" / "only N CUDA device(s)".
check "absent CUDA device"      "CUDA"                             --device cuda:9999
check "negative lr"             "learning rate"                    --lr -0.1
check "unknown model"           "unknown model 'resnet7'"          --model resnet7
check "unknown data set"        "unknown data set"                 --dataset imagenet21k
check "sync-bn alone"           "sync-bn needs --distributed"      --sync-bn
check "bucket size 0"           "bucket-mib must be in \\(0, 2\\^40\\]" --distributed --bucket-mib 0
check "bucket size past int64"  "bucket-mib must be in \\(0, 2\\^40\\]" --distributed --bucket-mib 1e308
check "negative bucket tail"    "bucket-tail-mib must be in \\[0, 2\\^40\\]" --distributed --bucket-tail-mib -1
check "hexadecimal lr"          "option --lr needs a number, got '0x10'" --lr 0x10
check "coarse without cifar100" "coarse .*needs --dataset cifar100" --coarse
# A size whose element count wraps int64 would allocate a small buffer and write past it.
check "data set past int64"     "has more elements than a 64-bit count holds" "${tiny[@]}" --synthetic-size 4611686018427387904
# A rule that names no module of the model is a typo, refused after the first step (nothing written).
check "rule matching nothing"   "policy rule for 'conv9' matched no save of mlp" "${tiny[@]}" --policy-rule conv9=exact
check "unknown policy"          "unknown policy|accepted"          --policy zip:Q=2
check "division B=0"            "B"                                --policy division:B=0,Q=2
check "division Q=3"            "Q"                                --policy division:B=8,Q=3
check "malformed policy"        "policy"                           --policy 'division:B=8,,Q=2'
check "bad policy rule"         "policy-rule|MODULE_PATTERN"       --policy-rule conv1
check "empty rule after |"      "empty rule after '\|'"            --policy 'division:B=8,Q=2|'
check "bad rule after |"        "MODULE_PATTERN=POLICY"            --policy 'division:B=8,Q=2|conv1'
check "bad on-nonfinite"        "on-nonfinite must be stop or skip-step, got 'retry'" --on-nonfinite retry
check "stray argument"          "unexpected argument"              resnet20
check "eval-only alone"         "eval-only needs --resume"         --eval-only --dataset synthetic
check "unknown optimizer"       "unknown optimizer 'adam' \\(sgd or adamw\\)" --optimizer adam
check "nesterov with adamw"     "nesterov is SGD's, not adamw's" --optimizer adamw --nesterov
check "adam beta2 of 1"         "adam-beta2 must be in \\[0, 1\\), got 1" --optimizer adamw --adam-beta2 1
check "adam eps of 0"           "adam-eps must be > 0"             --optimizer adamw --adam-eps 0
check "drop path of 1"          "drop-path must be in \\[0, 1\\), or -1" --model vit_tiny_cifar --drop-path 1
check "drop path on a CNN"      "drop-path: model 'resnet20' has no drop path" --model resnet20 --drop-path 0.1

# ---- config files
printf '# test config\nmodel = resnet20\nfrobnicate = 1\n' > "$work/unknown.conf"
printf 'epochs = ten\n' > "$work/badvalue.conf"
check "missing config file"     "cannot read config file"          --config "$work/nope.conf"
check "config unknown key"      "unknown.conf:3: unknown key 'frobnicate'" --config "$work/unknown.conf"
check "config bad value"        "badvalue.conf:1: epochs needs an integer" --config "$work/badvalue.conf"
# A binary file named by --config: one short line (printable excerpt), not its bytes.
head -c 2000 /dev/zero | tr '\0' '\001' > "$work/binary.conf"
check "binary config file"      "binary.conf:1: expected 'key = value', got '\\?{60}\\.\\.\\.'" --config "$work/binary.conf"
# An endless file is refused after 1 MiB, not read until memory runs out.
check "endless config file"     "config file '/dev/zero' is larger than 1 MiB" --config /dev/zero
check "config file a directory" "config file '$work' is a directory" --config "$work"
# A UTF-8 byte-order mark (some editors write one) is not part of the first key.
printf '\xef\xbb\xbfepochs = x\n' > "$work/bom.conf"
check "config file with a BOM"  "bom.conf:1: epochs needs an integer" --config "$work/bom.conf"

# ---- IDX data files: a valid tiny MNIST layout, then one defect per copy
make_idx() {  # make_idx DIR: 8 train and 8 test images of 28x28, labels 1..8
  mkdir -p "$1"
  { printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x1c\x00\x00\x00\x1c'; head -c $((8 * 784)) /dev/zero; } \
    > "$1/train-images-idx3-ubyte"
  printf '\x00\x00\x08\x01\x00\x00\x00\x08\x01\x02\x03\x04\x05\x06\x07\x08' > "$1/train-labels-idx1-ubyte"
  cp "$1/train-images-idx3-ubyte" "$1/t10k-images-idx3-ubyte"
  cp "$1/train-labels-idx1-ubyte" "$1/t10k-labels-idx1-ubyte"
}
idx_case() {  # idx_case NAME EXPECT SETUP-COMMAND...: SETUP runs inside a fresh valid copy
  local name="$1" expect="$2"
  shift 2
  local d="$work/idx-$name"
  make_idx "$d"
  (cd "$d" && "$@")
  check "IDX $name" "$expect" --dataset mnist --data-dir "$d" --model mlp
}
pseudo_random() {  # pseudo_random N: N deterministic bytes that are no known format
  local i
  for i in $(seq 1 "$1"); do printf "\\$(printf %03o $(((i * 167 + 91) % 256)))"; done
}
make_idx "$work/idx-valid"
"$bin" --dataset mnist --data-dir "$work/idx-valid" --model mlp --batch-size 4 --quiet ||
  { echo "FAIL: the valid IDX layout does not train"; failures=$((failures + 1)); }
check "missing data directory"  "not found"                        --data-dir "$work/nope"
# ... also with a --save-dir to be made: the folders it made (and its lock file) are taken back.
check "missing data, new save dir" "not found"                     --data-dir "$work/nope" --save-dir "$work/new/run"
[ ! -e "$work/new" ] || fail "a run that failed before its first checkpoint left '$work/new': $(find "$work/new")"
check "garbage data files"      "train-images-idx3-ubyte"          --data-dir "$work"
idx_case "missing file"   "train-images-idx3-ubyte: not found"     rm train-images-idx3-ubyte
idx_case "empty file"     "train-images-idx3-ubyte: empty file"    truncate -s 0 train-images-idx3-ubyte
idx_case "truncated"      "train-images-idx3-ubyte: truncated"     truncate -s 5000 train-images-idx3-ubyte
idx_case "short header"   "train-labels-idx1-ubyte: truncated header" truncate -s 6 train-labels-idx1-ubyte
idx_case "oversized"      "train-images-idx3-ubyte: trailing bytes" sh -c 'printf xyz >> train-images-idx3-ubyte'
idx_case "random bytes"   "train-images-idx3-ubyte: bad magic"     sh -c "$(declare -f pseudo_random); pseudo_random 3000 > train-images-idx3-ubyte"
idx_case "wrong magic"    "t10k-labels-idx1-ubyte: bad magic 0x00000803.*images file" cp t10k-images-idx3-ubyte t10k-labels-idx1-ubyte
idx_case "label range"    "train-labels-idx1-ubyte: label 12 at index 2.*out of range \[0, 10\)" \
  sh -c "printf '\\014' | dd of=train-labels-idx1-ubyte bs=1 seek=10 conv=notrunc 2>/dev/null"
idx_case "count mismatch" "8 images but .* 4 labels|count" sh -c "printf '\\000\\000\\010\\001\\000\\000\\000\\004\\001\\002\\003\\004' > train-labels-idx1-ubyte"
# test images 28x30: the width alone differs (a convolutional net evaluated on them without a word)
idx_case "test width"     "different image shapes: 1x28x28 and 1x28x30" \
  sh -c "{ printf '\\000\\000\\010\\003\\000\\000\\000\\010\\000\\000\\000\\034\\000\\000\\000\\036'; head -c \$((8 * 840)) /dev/zero; } > t10k-images-idx3-ubyte"
idx_case "corrupt gzip"   "corrupt gzip|gzip"                     sh -c 'gzip -c train-images-idx3-ubyte | head -c 60 > train-images-idx3-ubyte.gz && rm train-images-idx3-ubyte'

# ---- CIFAR-10 binary: one record per file, then one defect per copy
make_cifar() {
  mkdir -p "$1"
  local f
  for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
    { printf '\x03'; head -c 3072 /dev/zero; } > "$1/$f.bin"
  done
}
cifar_case() {  # cifar_case NAME EXPECT SETUP-COMMAND...
  local name="$1" expect="$2"
  shift 2
  local d="$work/cifar-$name"
  make_cifar "$d"
  (cd "$d" && "$@")
  check "CIFAR $name" "$expect" --dataset cifar10 --data-dir "$d" --model mlp --batch-size 1
}
cifar_case "missing file" "lacks data_batch_3.bin.*get-cifar.sh"  rm data_batch_3.bin
cifar_case "empty file"   "data_batch_2.bin.*empty"                truncate -s 0 data_batch_2.bin
cifar_case "truncated"    "test_batch.bin.*(whole number|records)" truncate -s 3000 test_batch.bin
cifar_case "oversized"    "data_batch_5.bin.*(whole number|records)" sh -c 'printf ab >> data_batch_5.bin'
cifar_case "label range"  "data_batch_4.bin: record 0 has label 10, must be < 10"   sh -c "printf '\\012' | dd of=data_batch_4.bin bs=1 conv=notrunc 2>/dev/null"

# ---- image folders
mkdir -p "$work/folder/cat" "$work/folder/dog"
tail -c +3 "$src/fuzz/corpus/image_folder/seed-png-rgb" > "$work/folder/cat/good.png"  # a real 7x5 PNG
cp "$work/folder/cat/good.png" "$work/folder/dog/good.png"
cp "$work/folder/cat/good.png" "$work/folder/dog/also-good.png"
pseudo_random 300 > "$work/folder/dog/broken.jpg"
check "undecodable image"       "folder/dog/broken.jpg: cannot decode image" --dataset folder --data-dir "$work/folder" --model mlp
check "undecodable image, streamed" "folder/dog/broken.jpg: cannot decode image" --dataset folder --data-dir "$work/folder" --model mlp --stream
check "stream without a folder" "stream needs --dataset folder" --stream
check "data workers out of range" "data-workers must be in"    --data-workers -1
mkdir -p "$work/crafted/cat" "$work/crafted/dog"
cp "$work/folder/cat/good.png" "$work/crafted/cat/good.png"
cp "$work/folder/cat/good.png" "$work/crafted/dog/good.png"
# The JPEG that overflowed stb_image 2.27's Huffman tables (fuzz/crashes/image_folder/; its first
# two bytes are the fuzz target's options): refused before stb decodes it.
tail -c +3 "$src/fuzz/crashes/image_folder/jpeg-dht-more-than-256-codes" > "$work/crafted/dog/evil.jpg"
check "crafted JPEG"            "evil.jpg: cannot decode image \(corrupt JPEG: a Huffman table declares" \
  --dataset folder --data-dir "$work/crafted" --model mlp
mkdir -p "$work/nofolders"
check "image folder, no classes" "nofolders"                         --dataset folder --data-dir "$work/nofolders" --model mlp

# ---- checkpoints
good="$ckpt/last.safetensors"
cp "$good" "$work/corrupt.safetensors"
printf '\xff' | dd of="$work/corrupt.safetensors" bs=1 seek=$(($(stat -c %s "$good") - 3)) conv=notrunc 2>/dev/null
head -c $(($(stat -c %s "$good") / 2)) "$good" > "$work/truncated.safetensors"
tail -c +1 "$src/fuzz/corpus/safetensors/seed-dtypes" > "$work/foreign.safetensors"
check "missing checkpoint"      "cannot open checkpoint"           --resume "$work/nope.safetensors"
check "empty checkpoint"        "truncated"                        --resume "$work/empty-file"
check "garbage checkpoint"      "header length|header"             --resume "$log"
check "corrupt checkpoint"      "corrupt checkpoint .*checksum"    --resume "$work/corrupt.safetensors"
check "truncated checkpoint"    "truncated"                        --resume "$work/truncated.safetensors"
check "foreign safetensors"     "not an actlab training checkpoint" --resume "$work/foreign.safetensors"
check "another optimizer's checkpoint" "trained with optimizer 'sgd' and this run uses 'adamw'" --resume "$ckpt/last.safetensors" --optimizer adamw --epochs 2
check "other-model checkpoint"  "trained with model mlp, this run has resnet20" --resume "$good" --model resnet20 --epochs 3
check "finished checkpoint"     "already completed 1 of 1 epochs"  --resume "$good"

# ---- outputs: unwritable, already there, disk full
check "existing log kept"       "already exists"                   --dataset synthetic --log "$log"
check "unwritable log dir"      "does not exist"                   --dataset synthetic --log "$work/no/dir/log.csv"
check "save dir is a file"      "cannot create save directory"     --dataset synthetic --save-dir "$log"
check "save dir not creatable"  "cannot create save directory '/proc/actlab-nope'" --dataset synthetic --save-dir /proc/actlab-nope
check "checkpoint exists"       "already exists; pass --resume"    "${tiny[@]}" --save-dir "$ckpt"
# No output on a file the run reads or another output writes: each would be destroyed with exit 0.
check "log on the resumed checkpoint" "name the same file|would be overwritten" \
  "${tiny[@]}" --resume "$ckpt/last.safetensors" --epochs 99 --log "$ckpt/last.safetensors"
mkdir -p "$work/run2"
check "export over best.safetensors" "export-weights and --save-dir's best.safetensors name the same file" \
  "${tiny[@]}" --save-dir "$work/run2" --export-weights "$work/run2/best.safetensors"
check "two outputs, one file"   "log and --summary-json name the same file" \
  "${tiny[@]}" --log "$work/one.csv" --summary-json "$work/./one.csv"
# A symbolic link whose target does not exist yet is the file its target names (relative to the link's
# directory, through a chain of links): a write through it creates that file.
ln -s dangling-save/last.safetensors "$work/export-link"
check "export through a dangling link to last.safetensors" "export-weights and --save-dir's last.safetensors name the same file" \
  "${tiny[@]}" --save-dir "$work/dangling-save" --export-weights "$work/export-link"
ln -s two.csv "$work/two-link" && ln -s two-link "$work/two-chain"
check "summary through a chain of dangling links to the log" "log and --summary-json name the same file" \
  "${tiny[@]}" --log "$work/two.csv" --summary-json "$work/two-chain"
[ ! -e "$work/dangling-save" ] && [ ! -e "$work/two.csv" ] || fail "a refused run wrote through a dangling link"
check "export over --init-weights" "export-weights names the file --init-weights reads" \
  "${tiny[@]}" --init-weights "$ckpt/last.safetensors" --export-weights "$ckpt/last.safetensors" --eval-only
check "log's side file exists"  "configuration file .*side.csv.config.txt' already exists" \
  --dataset synthetic --log "$work/side.csv"
# The --config file is an input: no output may replace it.
printf 'dataset = synthetic\nsynthetic-size = 64\nbatch-size = 32\nmodel = mlp\nthreads = 1\n' > "$work/run.conf"
protected+=("$work/run.conf")
sums_before=$(md5sum "${protected[@]}")
check "summary over --config"   "summary-json names the file --config reads" --config "$work/run.conf" --summary-json "$work/run.conf"
check "export over --config"    "export-weights names the file --config reads" --config "$work/run.conf" --export-weights "$work/run.conf"
# A resume replaces its own checkpoints and appends to its own log, nobody else's.
"$bin" "${tiny[@]}" --save-dir "$work/other" --seed 2 --quiet || { echo "FAIL: could not create the second run"; exit 1; }
protected+=("$work/other/last.safetensors")
sums_before=$(md5sum "${protected[@]}")
check "resume into another run's save dir" "other/last.safetensors' already exists and is not the checkpoint being resumed" \
  --resume "$ckpt/last.safetensors" --save-dir "$work/other" --epochs 3
check "resume appending to a file that is no log" "log file .*existing.csv' exists and is not an epoch log" \
  --resume "$ckpt/last.safetensors" --epochs 3 --log "$log"
# --summary-json and --export-weights replace an earlier run's file only: not a user's JSON, not a checkpoint.
echo '{"config": "mine"}' > "$work/mine.json"
protected+=("$work/mine.json")
sums_before=$(md5sum "${protected[@]}")
check "summary over a file of other content" "summary file .*mine.json' already exists; pass --overwrite" \
  "${tiny[@]}" --summary-json "$work/mine.json"
check "export over another run's checkpoint" "export-weights file .*other/last.safetensors' already exists; pass --overwrite" \
  "${tiny[@]}" --export-weights "$work/other/last.safetensors"
# Two runs on one --save-dir: the second is refused while the first holds the directory's lock (flock(1) holds
# it here; -o: the lock stays with flock itself, which the kill below ends).
flock -o "$ckpt/.lock" sleep 60 &
holder=$!
for _ in $(seq 100); do flock -n "$ckpt/.lock" true 2>/dev/null || break; sleep 0.05; done
check "save dir in use by another run" "another training run is using --save-dir .* \(it holds .*/\.lock\)" \
  --resume "$ckpt/last.safetensors" --epochs 3
kill "$holder" && wait "$holder" 2>/dev/null
# A name whose temporary file (<name>.tmp.<pid>) would pass the file system's limit fails before training.
check "output name too long"    "the name is too long" "${tiny[@]}" --export-weights "$work/$(printf 'c%.0s' $(seq 252))"
if [ "$(id -u)" -ne 0 ]; then  # root may write anywhere: the mode bits would not stop it
  mkdir -p "$work/readonly" && chmod 555 "$work/readonly"
  check "read-only save dir"    "not writable"                     "${tiny[@]}" --save-dir "$work/readonly/run"
fi
# Disk full: the log is a link to /dev/full (every write fails with ENOSPC) ...
ln -s /dev/full "$work/full.csv"
check "disk full: log"          "writing log file .*full.csv' failed: No space left on device" \
  "${tiny[@]}" --log "$work/full.csv" --overwrite
# ... and a checkpoint written under a 64 KiB file-size limit (EFBIG, as a full disk would fail the
# write): the previous checkpoint must stay as it was and no temp file may be left.
fsize_limited() { (trap '' XFSZ; ulimit -f 64; exec "$@"); }
runner=(fsize_limited "$bin")
# The first epoch is a new best: best.safetensors is written before last.safetensors (which records that best),
# so it is the write that fails.
check "disk full: checkpoint"   "best.safetensors.*File too large" "${tiny[@]}" --save-dir "$ckpt" --overwrite
runner=("$bin")
check "non-finite loss"         "non-finite loss"                  --dataset synthetic --synthetic-size 64 --batch-size 32 --lr 1e30 --model resnet20

# An evaluation of a checkpoint writes only what its own command line names: the training run's summary and
# exported weights stay as they were, and the result is printed even though that run was --quiet.
cases=$((cases + 1))
"$bin" "${tiny[@]}" --save-dir "$work/evaluated" --summary-json "$work/evaluated.json" \
  --export-weights "$work/evaluated.safetensors" --quiet || { echo "FAIL: could not create the evaluated run"; exit 1; }
evaluated_sums=$(md5sum "$work/evaluated.json" "$work/evaluated.safetensors")
eval_out=$("$bin" --resume "$work/evaluated/last.safetensors" --eval-only 2>&1)
eval_rc=$?
if [ "$eval_rc" -ne 0 ] || ! echo "$eval_out" | grep -q "^eval .*test loss"; then
  echo "FAIL: eval-only of a quiet run: exit $eval_rc, printed: $eval_out"; failures=$((failures + 1))
elif [ "$(md5sum "$work/evaluated.json" "$work/evaluated.safetensors")" != "$evaluated_sums" ]; then
  echo "FAIL: eval-only rewrote the training run's --summary-json or --export-weights"; failures=$((failures + 1))
fi

echo "$cases cases, $failures failed"
[ "$failures" -eq 0 ]
