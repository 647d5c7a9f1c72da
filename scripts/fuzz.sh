#!/usr/bin/env bash
# Fuzzes one parser of untrusted input with libFuzzer (clang, ASan + UBSan):
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
# TARGET: idx | cifar | image_folder | safetensors | policy | config (fuzz/<TARGET>.cpp says what
# the input bytes mean). Configures and builds build-fuzz (-DACTLAB_FUZZ=ON, -O1), then runs
# fuzz_<TARGET> for SECONDS on the committed seeds (fuzz/corpus/<TARGET>, read only) plus the
# inputs it found earlier (build-fuzz/corpus/<TARGET>, kept between runs, not committed), with
# fuzz/<TARGET>.dict when present. A crash, leak, timeout or out-of-memory input is copied to
# fuzz/crashes/<TARGET>/, where the normal build's fuzz_replay_<TARGET> test replays it forever.
# Runs niced: other work on the machine keeps priority. Exit status: libFuzzer's (0: nothing found).
# Needs clang and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev): installed here through
# scripts/setup.sh --fuzz-packages when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1-}" = "--help" ] || [ "${1-}" = "-h" ]; then
  sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags]  (TARGET: idx cifar image_folder safetensors policy config)" >&2
  exit 2
fi
target="$1" seconds="$2" given="$2"
shift 2
case " idx cifar image_folder safetensors policy config " in
  *" $target "*) ;;
  *) echo "fuzz.sh: unknown target '$target'" >&2; exit 2 ;;
esac
# libFuzzer reads -max_total_time up to its first non-digit and takes 0 as "forever": '5m' ran 5 seconds.
case "$seconds" in
  "" | *[!0-9]* | 0 | *[!0]*) ;;
  *) seconds=0 ;;  # 00, 000, ...: forever to libFuzzer, as 0 is
esac
case "$seconds" in
  "" | *[!0-9]* | 0) echo "fuzz.sh: SECONDS must be a whole number of seconds >= 1, got '$given'" >&2; exit 2 ;;
esac
bash scripts/setup.sh --fuzz-packages
build="${ACTLAB_FUZZ_BUILD_DIR:-build-fuzz}"
mkdir -p "$build"
(  # one build at a time: two targets fuzzed side by side must not run ninja in one folder at once
  flock 9
  cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DACTLAB_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" >/dev/null
  nice -n 10 ninja -C "$build" -j "${ACTLAB_FUZZ_JOBS:-2}" "fuzz_$target"
) 9>"$build/.fuzz-build.lock"

corpus="$build/corpus/$target" artifacts="$build/artifacts/$target"
mkdir -p "$corpus" "$artifacts" "fuzz/crashes/$target"
dict=()
[ -f "fuzz/$target.dict" ] && dict=("-dict=fuzz/$target.dict")
log="$build/fuzz-$target.log"
set +e
started=$SECONDS
# One OpenMP thread: the decoders' parallel loops would only add scheduling noise per input.
OMP_NUM_THREADS=1 nice -n 10 "$build/fuzz_$target" "$corpus" "fuzz/corpus/$target" "${dict[@]}" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
elapsed=$((SECONDS - started))
set -e
found=0
for f in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/slow-unit-*; do
  [ -f "$f" ] || continue
  cp "$f" "fuzz/crashes/$target/"
  echo "fuzz.sh: $target: $(basename "$f") saved to fuzz/crashes/$target/ (reproduce: $build/fuzz_$target $f)"
  rm "$f"
  found=$((found + 1))
done
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
echo "fuzz.sh: $target: $execs executions in ${elapsed}s, last $cov, corpus $(ls "$corpus" | wc -l) files, $found new findings"
exit "$status"
