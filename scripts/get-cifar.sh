#!/usr/bin/env bash
# Fetches the official binary CIFAR-10 / CIFAR-100 archives, checks their MD5 and unpacks them where
# data/cifar.h looks (DIR/cifar-10-batches-bin/, DIR/cifar-100-binary/).
#   scripts/get-cifar.sh [cifar10|cifar100|all] [DIR]     (defaults: cifar10, the default directory)
#   scripts/get-cifar.sh where                            prints the default directory
# The default directory is where actlab-train looks without --data-dir (data/cifar.h): $ACTLAB_CIFAR_DIR,
# else $XDG_CACHE_HOME/actlab/cifar, else ~/.cache/actlab/cifar: a per-user cache outside the source tree.
# Offline: put the archive in DIR yourself and rerun (it is verified and unpacked), or unpack it
# there. ACTLAB_CIFAR_URL replaces https://www.cs.toronto.edu/~kriz for a mirror.
# Exit status 0 when the files are in place; otherwise one line on stderr saying what to do.
set -euo pipefail

die() {
  echo "get-cifar: $*" >&2
  exit 1
}

which="${1:-cifar10}"
if [ -n "${ACTLAB_CIFAR_DIR:-}" ]; then default_dir="$ACTLAB_CIFAR_DIR"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then default_dir="$XDG_CACHE_HOME/actlab/cifar"
elif [ -n "${HOME:-}" ]; then default_dir="$HOME/.cache/actlab/cifar"
else default_dir=""
fi
if [ "$which" = "where" ]; then
  [ -n "$default_dir" ] || die "neither ACTLAB_CIFAR_DIR, XDG_CACHE_HOME nor HOME is set"
  echo "$default_dir"
  exit 0
fi
dir="${2:-$default_dir}"
[ -n "$dir" ] || die "neither ACTLAB_CIFAR_DIR, XDG_CACHE_HOME nor HOME is set: name the directory"
base_url="${ACTLAB_CIFAR_URL:-https://www.cs.toronto.edu/~kriz}"
[ $# -le 2 ] || die "too many arguments; usage: scripts/get-cifar.sh [cifar10|cifar100|all] [DIR]"

md5_of() {
  if command -v md5sum >/dev/null 2>&1; then
    md5sum "$1" | cut -d' ' -f1
  elif command -v md5 >/dev/null 2>&1; then
    md5 -q "$1"
  else
    die "neither md5sum nor md5 is installed: cannot verify $1"
  fi
}

download() {  # url dest; prints the tool's error message on failure
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --connect-timeout 20 --retry 2 -o "$2" "$1" 2>&1
  elif command -v wget >/dev/null 2>&1; then
    wget -nv --timeout=20 --tries=3 -O "$2" "$1" 2>&1
  else
    echo "neither curl nor wget is installed"
    return 127
  fi
}

# whole FOLDER FILE:BYTES...: every FILE is in FOLDER at its full size (an unpack cut short leaves a file
# that exists but ends early, which the reader refuses, or, cut on a record boundary, silently shrinks).
whole() {
  local folder="$1" f
  shift
  for f in "$@"; do
    [ -f "$folder/${f%%:*}" ] && [ "$(stat -c %s "$folder/${f%%:*}")" = "${f##*:}" ] || return 1
  done
}

# fetch NAME ARCHIVE MD5 SUBFOLDER FILE:BYTES...: ensures DIR/SUBFOLDER holds the files, whole.
fetch() {
  local name="$1" archive="$2" md5="$3" sub="$4"
  shift 4
  local folder
  for folder in "$dir/$sub" "$dir"; do  # the two places data/cifar.cpp looks
    if whole "$folder" "$@"; then
      echo "get-cifar: $name already in $folder"
      return 0
    fi
  done
  mkdir -p "$dir" || die "cannot create $dir"
  [ -w "$dir" ] || die "cannot write to $dir (choose another directory: scripts/get-cifar.sh $which DIR)"
  local where="put $archive (md5 $md5, from $base_url/$archive) in $dir and rerun, or unpack it there so that $dir/$sub/ holds its files"
  local downloaded=0 err got
  if [ ! -f "$dir/$archive" ]; then
    echo "get-cifar: downloading $base_url/$archive"
    if ! err="$(download "$base_url/$archive" "$dir/$archive.part")"; then
      rm -f "$dir/$archive.part"
      die "cannot download $base_url/$archive ($(echo "$err" | tail -n 1)); offline? $where"
    fi
    mv "$dir/$archive.part" "$dir/$archive"
    downloaded=1
  fi
  got="$(md5_of "$dir/$archive")"
  if [ "$got" != "$md5" ]; then
    [ $downloaded -eq 1 ] && rm -f "$dir/$archive"  # a bad download is useless; a file you put there stays
    die "$dir/$archive has md5 $got, expected $md5: not the official archive (cut short?); replace it and rerun"
  fi
  # Unpacked beside the final folder, then moved in: an unpack cut short leaves only the temporary folder
  # (removed by the next run), never a half-written data set where the reader looks.
  local tmp="$dir/.unpack.$sub"
  rm -rf "$tmp" && mkdir -p "$tmp" || die "cannot create $tmp"
  tar -xzf "$dir/$archive" -C "$tmp" || die "cannot unpack $dir/$archive into $tmp"
  whole "$tmp/$sub" "$@" || die "$dir/$archive unpacked, but $tmp/$sub does not hold its files whole"
  rm -rf "$dir/$sub" && mv "$tmp/$sub" "$dir/$sub" && rm -rf "$tmp" || die "cannot move $tmp/$sub to $dir/$sub"
  echo "get-cifar: $name ready in $dir/$sub (archive kept as $dir/$archive)"
}

cifar10() {
  # 10000 records of 1 label + 3072 pixel bytes per file
  fetch CIFAR-10 cifar-10-binary.tar.gz c32a1d4ab5d03f1284b67883e8d87530 cifar-10-batches-bin \
    data_batch_1.bin:30730000 data_batch_2.bin:30730000 data_batch_3.bin:30730000 data_batch_4.bin:30730000 \
    data_batch_5.bin:30730000 test_batch.bin:30730000
}

cifar100() {
  # 50000 and 10000 records of 2 labels + 3072 pixel bytes
  fetch CIFAR-100 cifar-100-binary.tar.gz 03b5dce01913d631647c71ecec9e9cb8 cifar-100-binary \
    train.bin:153700000 test.bin:30740000
}

case "$which" in
  cifar10) cifar10 ;;
  cifar100) cifar100 ;;
  all) cifar10 && cifar100 ;;
  *) die "unknown data set '$which'; usage: scripts/get-cifar.sh [cifar10|cifar100|all] [DIR]" ;;
esac
