#!/usr/bin/env bash
# The installed package works for a project of its own: `cmake --install` this build into a fresh
# prefix, configure examples/train_division against it with nothing but CMAKE_PREFIX_PATH, build it,
# run it for a few steps, and check what it prints. The consumer sees only the installed headers
# (under <prefix>/include/actlab) and library: the source tree is not on its include path.
#   tests/cli/example_consumer.sh BUILD_DIR
set -u
build="$1"
bin="$build"  # lib.sh wants it set
source "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
prefix="$work/prefix"
if ! cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1; then
  fail "cmake --install: $(tail -n 3 "$work/install.log")"; exit 1
fi
[ -f "$prefix/include/actlab/train/step.h" ] || fail "no actlab/train/step.h under $prefix/include"
[ -f "$prefix/lib/cmake/actlab/actlabConfig.cmake" ] || fail "no actlabConfig.cmake"
# The Python package, where the build has the module: importable from the prefix alone, with the dynamic
# loader's cache ignored, so the module's own search path must find the CUDA and MPI libraries it links.
if [ -d "$build/python/actlab" ]; then
  site=$(ls -d "$prefix"/lib/python3*/site-packages 2>/dev/null | head -n 1)
  loader=$(ldd /usr/bin/python3 | awk '/ld-linux/ {print $1}')
  [ -x "$loader" ] && loader=("$loader" --inhibit-cache) || loader=()
  if [ -z "$site" ] || ! (cd "$work" && PYTHONPATH="$site" "${loader[@]}" /usr/bin/python3 -c \
       "import actlab, numpy; p = actlab.pack(numpy.ones((2, 3, 8, 8), numpy.float32), 'quant:Q=2'); assert p.nbytes > 0"); then
    fail "the installed Python package does not import from $prefix"
  else
    echo "ok   the installed Python package imports from $site"
  fi
fi
if ! cmake -S "$src/examples/train_division" -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
     > "$work/configure.log" 2>&1; then
  fail "configuring the example: $(grep -m3 -E 'Error|error' "$work/configure.log")"; exit 1
fi
# The consumer's compile lines name the installed prefix, never the source tree.
if grep -rq -- "-I$src\b\|-isystem $src\b" "$work/example/build.ninja"; then fail "the example's include path names the source tree"; fi
if ! cmake --build "$work/example" > "$work/build.log" 2>&1; then
  fail "building the example: $(grep -m3 -E 'error' "$work/build.log")"; exit 1
fi
out=$(OMP_NUM_THREADS=2 "$work/example/train_division" 12 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || fail "train_division exited $rc"
printf '%s\n' "$out" | grep -q "^step  11  loss" || fail "no line for the last step"
printf '%s\n' "$out" | grep -q "activation_packed" || fail "no memory table"
ratio=$(printf '%s\n' "$out" | sed -n 's/.*(\([0-9.]*\)x less)/\1/p')
awk -v r="${ratio:-0}" 'BEGIN { exit !(r > 5) }' || fail "DIVISION saved ${ratio:-nothing}x, expected more than 5x"
for bad in 0 x 5x; do  # a bad step count is one error line and exit 2, before any work
  out=$("$work/example/train_division" "$bad" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "train_division $bad exited $rc"
  printf '%s\n' "$out" | grep -q "^train_division: error: STEPS must be" || fail "train_division $bad: $out"
done
echo "$failures failed"
[ "$failures" -eq 0 ]
