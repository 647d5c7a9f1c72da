#!/usr/bin/env bash
# Every program the build makes (apps/*.cpp, bench/*.cpp, fuzz_make_seeds, fuzz_replay_<target>) answers
# --help with its usage on stdout and exit 0, and an unknown option with one "...: error:" line on stderr
# and a non-zero exit, without starting its work or writing a file. The list comes from the source tree
# and CMake's fuzz targets, so a new app or benchmark is checked without editing this script.
#   tests/cli/tool_flags.sh SOURCE_DIR BUILD_DIR "FUZZ_TARGET..."
set -u
src="$1"
build=$(cd "$2" && pwd)
fuzz_targets="$3"
source "$(dirname "$0")/lib.sh"
cases=0

programs=()
for f in "$src"/apps/*.cpp "$src"/bench/*.cpp; do programs+=("$(basename "$f" .cpp)"); done
programs+=(fuzz_make_seeds)
for t in $fuzz_targets; do programs+=("fuzz_replay_$t"); done
[ "${#programs[@]}" -ge 10 ] || fail "found only ${#programs[@]} programs under $src"

for p in "${programs[@]}"; do
  exe="$build/$p"
  if [ ! -x "$exe" ]; then fail "[$p] not built at $exe"; continue; fi
  cases=$((cases + 1))
  out=$(cd "$work" && timeout 60 "$exe" --help 2>"$work/err")
  rc=$?
  if [ "$rc" -ne 0 ]; then fail "[$p --help] exit code $rc: $(head -3 "$work/err")"; continue; fi
  if ! printf '%s\n' "$out" | head -1 | grep -q '^usage: '; then fail "[$p --help] no usage line: $(printf '%s\n' "$out" | head -2)"; continue; fi
  err=$(cd "$work" && timeout 60 "$exe" --no-such-option 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then fail "[$p --no-such-option] exit code $rc: $err"; continue; fi
  if [ "$(printf '%s\n' "$err" | grep -c ': error:')" -ne 1 ] || [ "$(printf '%s\n' "$err" | grep -c .)" -ne 1 ]; then
    fail "[$p --no-such-option] expected one error line, got: $err"; continue
  fi
  # Nothing written where it ran (fuzz_make_seeds once took --help for its output folder).
  if [ -n "$(ls -A "$work" | grep -v '^err$')" ]; then fail "[$p] left files behind: $(ls -A "$work")"; rm -rf "${work:?}"/*; continue; fi
  echo "ok   [$p] $(printf '%s\n' "$err")"
done

echo "$cases programs, $failures failed"
[ "$failures" -eq 0 ]
