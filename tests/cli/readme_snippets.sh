#!/usr/bin/env bash
# Runs the code blocks of the README's "Use actlab from your code" section exactly as written: the sh
# block from the repository root (with HOME in a scratch directory, so "$HOME/.local/actlab" is fresh)
# and the python block with the build's module on PYTHONPATH; then the python block of docs/library.md's
# "Python" section. The Python blocks are a visible skip where the module or PyTorch is missing.
#   tests/cli/readme_snippets.sh BUILD_DIR
set -u
build="$1"
bin="$build"
source "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
block() {  # block LANG [FILE SECTION]: the first ```LANG block of the section (default: the README's)
  awk -v lang="$1" -v section="## ${3:-Use actlab from your code}" '
    $0 == section { inside = 1; next }
    inside && /^## / { exit }
    inside && $0 == "```" lang { grab = 1; next }
    grab && /^```/ { exit }
    grab { print }' "${2:-$src/README.md}"
}
block sh > "$work/snippet.sh"
block python > "$work/snippet.py"
block python "$src/docs/library.md" Python > "$work/library.py"
[ -s "$work/library.py" ] || fail "docs/library.md has no python block in 'Python'"
[ -s "$work/snippet.sh" ] || fail "README has no sh block in 'Use actlab from your code'"
[ -s "$work/snippet.py" ] || fail "README has no python block in 'Use actlab from your code'"
# The README's ./build is the Quick start's build directory; this test runs against the one CTest built.
sed -i "s#\./build/#$build/#g; s#cmake --install build #cmake --install $build #" "$work/snippet.sh"
if (cd "$src" && HOME="$work/home" OMP_NUM_THREADS=2 bash -e "$work/snippet.sh") > "$work/sh.log" 2>&1; then
  grep -q "activation memory of one step" "$work/sh.log" || fail "the example printed no memory line"
  grep -q "^eval /tmp/r18.safetensors" "$work/sh.log" || fail "no evaluation of the exported weights"
  echo "ok   [sh block] $(grep -c . "$work/snippet.sh") commands"
else
  fail "the sh block failed: $(tail -n 3 "$work/sh.log")"
fi
if [ ! -d "$build/python/actlab" ]; then
  echo "SKIPPED: missing prerequisite: the Python module is not built (bash scripts/setup.sh --python)"
elif ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: missing prerequisite: torch and numpy for /usr/bin/python3"
elif PYTHONPATH="$build/python" /usr/bin/python3 "$work/snippet.py" > "$work/py.log" 2>&1; then
  grep -q "saved for backward" "$work/py.log" || fail "the python block printed no saved-bytes line"
  echo "ok   [python block] $(tail -n 1 "$work/py.log")"
else
  fail "the python block failed: $(tail -n 3 "$work/py.log")"
fi
# docs/library.md's block prints its pack's bytes, the run's accuracy, the memory cell's packed bytes, the
# logits' shape and the PyTorch block's raw and packed bytes.
if [ -d "$build/python/actlab" ] && /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  if PYTHONPATH="$build/python" /usr/bin/python3 "$work/library.py" > "$work/library.log" 2>&1; then
    read -r packed acc cell shape1 shape2 raw kept < <(tail -n 1 "$work/library.log")
    [ "$shape1$shape2" = "(2,10)" ] || fail "docs/library.md's block: logits of shape $shape1$shape2, not (2, 10)"
    [ "${kept:-0}" -gt 0 ] && [ "$((kept * 4))" -lt "${raw:-0}" ] ||
      fail "docs/library.md's block: the hooks kept $kept of $raw bytes, not under a quarter"
    echo "ok   [docs/library.md python block] $(tail -n 1 "$work/library.log")"
  else
    fail "docs/library.md's python block failed: $(tail -n 3 "$work/library.log")"
  fi
fi
echo "$failures failed"
[ "$failures" -eq 0 ]
