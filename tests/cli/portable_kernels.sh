#!/usr/bin/env bash
# The kernel files with hand-vectorized x86 paths must still compile where core/cpu/intrinsics.h defines nothing
# (another architecture, or a compiler it does not take): each file that includes it is compiled, syntax only,
# with that header shadowed by an empty one, so the portable stubs beside each AVX path are checked on every
# build machine. A stub that fell out of step with its AVX twin once broke every non-x86 build unnoticed.
#   tests/cli/portable_kernels.sh CXX SOURCE_DIR BINARY_DIR
set -euo pipefail
cxx="$1" src="$2" bin="$3"
shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
mkdir -p "$shadow/actlab/core/cpu"
echo '#pragma once' > "$shadow/actlab/core/cpu/intrinsics.h"
mapfile -t files < <(grep -l 'actlab/core/cpu/intrinsics.h' "$src"/core/cpu/*.cpp)
[ "${#files[@]}" -gt 0 ] || { echo "FAIL: no kernel file includes actlab/core/cpu/intrinsics.h (the test looks in $src/core/cpu)"; exit 1; }
for f in "${files[@]}"; do
  "$cxx" -std=c++17 -fopenmp -fsyntax-only -I"$shadow" -I"$bin/include" -I"$src" "$f" ||
    { echo "FAIL: $f does not compile without the x86 intrinsics"; exit 1; }
done
echo "ok: ${#files[@]} kernel files compile without the x86 intrinsics"
