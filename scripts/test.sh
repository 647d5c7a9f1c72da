#!/usr/bin/env bash
# Builds actlab (installing missing Debian packages first) and runs the whole test suite with CTest.
# This is what CI runs (.ci/run). With a CUDA toolkit present the CUDA backend is built too; its GPU
# tests print a skip message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${ACTLAB_BUILD_DIR:-build}"
ACTLAB_BUILD_DIR="$build_dir" bash scripts/setup.sh
cd "$build_dir"
# CTest runs two test processes at once on a 2-core machine; OpenMP's default spin-waiting then burns
# the core the other process needs (measured: 10-20x slower). Passive waiting changes no result.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
