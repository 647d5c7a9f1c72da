#!/usr/bin/env bash
# Builds actlab (installing missing Debian packages first) and runs the whole test suite with CTest.
# This is what CI runs (.ci/run). With a CUDA toolkit present the CUDA backend is built too; its GPU
# tests print a skip message when no GPU is present.
set -euo pipefail
# No arguments (settings come from the environment): --help prints the comment above; anything else is a
# mistake, refused before minutes of building.
case "${1-}" in
  "") ;;
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "$(basename "$0"): takes no arguments (got '$1'); see --help" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
build_dir="${ACTLAB_BUILD_DIR:-build}"
ACTLAB_BUILD_DIR="$build_dir" bash scripts/setup.sh
cd "$build_dir"
# CTest runs two test processes at once on a 2-core machine; OpenMP's default spin-waiting then burns
# the core the other process needs (measured: 10-20x slower). Passive waiting changes no result.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
