#!/usr/bin/env bash
# The scripts in scripts/ read their arguments before doing any work: --help prints the header and exits 0;
# an unknown or extra argument, a misspelt STEPS entry or a SECONDS that libFuzzer would read as "forever" is
# one error line and exit 2, with nothing installed, built or written. (Nothing here reaches a step that
# installs or builds: each refusal comes first.)
#   tests/cli/script_flags.sh SOURCE_DIR
set -u
src="$1"
bin=""
source "$(dirname "$0")/lib.sh"
refused() {  # refused "description" "expected words (grep -E)" command...
  local what="$1" want="$2" out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 2 ]; then
    fail "$what: exit $rc, expected 2: $out"
  elif [ "$(printf '%s\n' "$out" | grep -c .)" -ne 1 ] || ! printf '%s\n' "$out" | grep -qE -e "$want"; then
    fail "$what: expected one line with '$want', got: $out"
  fi
}
helps() {  # helps script: --help prints something and exits 0
  local out
  out=$(bash "$src/scripts/$1" --help 2>&1) || { fail "$1 --help exited non-zero"; return; }
  [ -n "$out" ] || fail "$1 --help printed nothing"
}
# Should a refusal ever regress, the script must fail here at once, not install packages or start a build:
# the tools it would reach first are stubs that fail.
mkdir -p "$work/stubs"
for tool in apt-get sudo dpkg-query cmake ninja nvcc debootstrap unshare; do
  printf '#!/bin/sh\necho "script_flags: %s was reached: a refusal came too late" >&2\nexit 97\n' "$tool" > "$work/stubs/$tool"
  chmod +x "$work/stubs/$tool"
done
export PATH="$work/stubs:$PATH"
for s in setup.sh test.sh test-sanitize.sh fresh-machine-test.sh gpu-check.sh fuzz.sh; do helps "$s"; done
refused "setup.sh unknown"           "unknown argument '--bogus'"     bash "$src/scripts/setup.sh" --bogus
refused "setup.sh --python extra"    "--python takes only --train"    bash "$src/scripts/setup.sh" --python --bogus
refused "setup.sh two modes"         "--python takes only --train"    bash "$src/scripts/setup.sh" --python --packages-only
refused "setup.sh --packages-only x" "takes no further arguments"     bash "$src/scripts/setup.sh" --packages-only extra
refused "setup.sh --fuzz-packages x" "takes no further arguments"     bash "$src/scripts/setup.sh" --fuzz-packages extra
refused "test.sh argument"           "takes no arguments"             bash "$src/scripts/test.sh" extra
refused "fresh-machine unknown"      "unknown argument '--bogus'"     bash "$src/scripts/fresh-machine-test.sh" --bogus
refused "gpu-check misspelt step"    "unknown step 'test' in STEPS"   env STEPS=test OUT="$work/gc" bash "$src/scripts/gpu-check.sh"
[ ! -e "$work/gc" ] || fail "gpu-check wrote its output directory before refusing STEPS"
refused "fuzz.sh 00 seconds"         "got '00'"                       bash "$src/scripts/fuzz.sh" idx 00
refused "fuzz.sh unknown target"     "unknown target 'zip'"           bash "$src/scripts/fuzz.sh" zip 5
# bench/'s scripts refuse (exit 1, not the 2 of scripts/) before any training: a non-number used to launch a
# default run, and a missing build directory showed only after PyTorch's minutes of work (compare_torch.sh
# runs /usr/bin/python3 by its path, so only its order of checks keeps PyTorch from starting). mpirun is a stub.
for tool in mpirun; do
  printf '#!/bin/sh\necho "script_flags: %s was reached: a refusal came too late" >&2\nexit 97\n' "$tool" > "$work/stubs/$tool"
  chmod +x "$work/stubs/$tool"
done
bench_refused() {  # bench_refused "description" "expected words (grep -E)" script args...
  local what="$1" want="$2" out rc
  shift 2
  out=$(bash "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 1 ] || [ "$(printf '%s\n' "$out" | grep -c .)" -ne 1 ] || ! printf '%s\n' "$out" | grep -qE -e "$want"; then
    fail "$what: expected exit 1 and one line with '$want', got exit $rc: $out"
  fi
}
bench_refused "bench_dist batch not a number" "GLOBAL_BATCH must be a positive even integer .* got 'abc'" \
  "$src/bench/bench_dist.sh" "$work/nobuild" mlp abc 1
bench_refused "bench_dist odd batch"          "GLOBAL_BATCH must be a positive even integer .* got '7'" \
  "$src/bench/bench_dist.sh" "$work/nobuild" mlp 7 1
bench_refused "bench_dist steps not a number" "STEPS must be a positive integer, got 'x'" \
  "$src/bench/bench_dist.sh" "$work/nobuild" mlp 8 x
bench_refused "bench_dist no build"           "nobuild/actlab-train not found" \
  "$src/bench/bench_dist.sh" "$work/nobuild" mlp 8 1
bench_refused "compare_torch no build"        "nobuild/bench_train not found" \
  "$src/bench/compare_torch.sh" "$work/nobuild"
echo "script flag checks: $failures failed"
[ "$failures" -eq 0 ]
