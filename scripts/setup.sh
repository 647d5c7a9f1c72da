#!/usr/bin/env bash
# Installs what actlab needs on Debian 12 (as root, or through sudo), then configures and builds it.
#   scripts/setup.sh                   install packages + build (Release, ./build)
#   scripts/setup.sh --train [ARGS]    ... then train ResNet-20 on Fashion-MNIST for one epoch (the Quick
#                                      start); ARGS go to actlab-train, which runs in the directory setup.sh
#                                      was called from (relative paths, and MNIST's default data/mnist, are
#                                      looked up there)
#   scripts/setup.sh --packages-only   install the packages, build nothing
#   scripts/setup.sh --fuzz-packages   install the packages and the fuzzing toolchain (scripts/fuzz.sh)
#   scripts/setup.sh --python [ARGS]   also install what the Python module needs (pybind11, Python's
#                                      headers, numpy; PyTorch for actlab.torch), then build as above
# Safe to run again: installed packages are skipped. This is the one list of what actlab needs from
# Debian (third_party/README.md says why each is there); scripts/fresh-machine-test.sh proves it is
# complete on a bare Debian 12 root file system.
set -euo pipefail
caller="$PWD"  # --train's ARGS name files relative to where setup.sh was called from
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config zlib1g-dev libdnnl-dev libstb-dev doctest-dev
          dataset-fashion-mnist libopenmpi-dev openmpi-bin)
fuzz_packages=(clang libclang-rt-14-dev)  # libFuzzer's runtime and the sanitizers for clang 14
python_packages=(pybind11-dev python3-dev python3-numpy python3-torch python3-torchvision)

install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup: installing ${missing[*]}"
  local SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: error: not root and no sudo: install ${missing[*]} as root" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

usage_error() {
  echo "setup: error: $1 (--train [ARGS], --packages-only, --fuzz-packages, --python [--train [ARGS]]; see --help)" >&2
  exit 2
}
# Every argument is checked before anything is installed: only --train passes the rest on (to actlab-train).
case "${1:-}" in
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  --packages-only | --fuzz-packages) [ $# -eq 1 ] || usage_error "$1 takes no further arguments (got '$2')" ;;
  --python) [ $# -eq 1 ] || [ "$2" = "--train" ] || usage_error "--python takes only --train [ARGS] after it (got '$2')" ;;
  "" | --train) ;;
  *) usage_error "unknown argument '$1'" ;;
esac
case "${1:-}" in
  --packages-only) install_missing "${packages[@]}"; exit 0 ;;
  --fuzz-packages) install_missing "${packages[@]}" "${fuzz_packages[@]}"; exit 0 ;;
  --python) install_missing "${python_packages[@]}"; shift ;;
esac
install_missing "${packages[@]}"

build_dir="${ACTLAB_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ACTLAB_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir"

if [ "${1:-}" = "--train" ]; then
  shift
  bin="$(cd "$build_dir" && pwd)/actlab-train"
  cd "$caller"
  exec "$bin" "$@"
fi
