#!/usr/bin/env bash
# Installs what actlab needs on Debian 12 (as root, or through sudo), then configures and builds it.
#   scripts/setup.sh           install packages + build (Release, ./build)
#   scripts/setup.sh --train   ... then train ResNet-20 on Fashion-MNIST for one epoch (the Quick start)
# Extra arguments after --train go to actlab-train. Safe to run again: installed packages are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config zlib1g-dev libdnnl-dev libstb-dev doctest-dev
          dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_dir="${ACTLAB_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ACTLAB_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir"

if [ "${1:-}" = "--train" ]; then
  shift
  exec "$build_dir/actlab-train" "$@"
fi
