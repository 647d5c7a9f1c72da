#!/usr/bin/env bash
# Builds actlab (installing missing Debian packages first) and runs the whole test suite with CTest.
# This is what CI runs (.ci/run). With a CUDA toolkit present the CUDA backend is built too; its GPU
# tests print a skip message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${ACTLAB_BUILD_DIR:-build}"
ACTLAB_BUILD_DIR="$build_dir" bash scripts/setup.sh
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 900
