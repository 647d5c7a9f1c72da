#!/usr/bin/env bash
# A build with the CUDA backend does not open cuBLAS until a GPU is used (core/cuda/cublas.h): every app
# and the test binary start, answer --help and exit without the loader ever mapping libcublas (whose
# static initialisers alone cost 0.5-1 s per process). The loader's own trace (LD_DEBUG=libs) is the
# witness; that it names oneDNN, which every program links, shows the trace works. Registered only for
# builds with CUDA (CMakeLists.txt).
#   tests/cli/startup_libraries.sh SOURCE_DIR BUILD_DIR
set -u
src="$1"
build=$(cd "$2" && pwd)
source "$(dirname "$0")/lib.sh"
cases=0
programs=(actlab_tests)
for f in "$src"/apps/*.cpp; do programs+=("$(basename "$f" .cpp)"); done
for p in "${programs[@]}"; do
  cases=$((cases + 1))
  [ -x "$build/$p" ] || { fail "$p: not built in $build"; continue; }
  LD_DEBUG=libs "$build/$p" --help > /dev/null 2> "$work/trace" || { fail "$p --help exited non-zero"; continue; }
  grep -q "libdnnl" "$work/trace" || { fail "$p: the loader trace names no libdnnl (LD_DEBUG not honoured?)"; continue; }
  if grep -q "libcublas" "$work/trace"; then
    fail "$p: libcublas was loaded at start-up: $(grep -m1 libcublas "$work/trace")"
  else
    echo "ok   $p starts without cuBLAS"
  fi
done
echo "$cases cases, $failures failed"
[ "$failures" -eq 0 ]
