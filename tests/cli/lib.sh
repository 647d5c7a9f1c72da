# Shared by the end-to-end scripts in tests/cli/ (sourced, not run): the scratch directory, failure
# counting and the safetensors readers. The sourcing script sets `bin` first.
#   work          a fresh directory, removed (and background jobs killed) when the script exits
#   fail MSG      prints "FAIL: MSG" and counts it in $failures
#   data_of F     the data section of safetensors file F (everything after the length and the header)
#   meta_of F K   the integer metadata value K of checkpoint F ("epoch", "global_step", ...)
#   epoch_of F    meta_of F epoch
# Passive OpenMP waits: the results do not depend on it, and spinning threads crawl on a busy machine.
export OMP_WAIT_POLICY=passive
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
data_of() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((8 + n + 1)) "$1"
}
meta_of() { head -c 65536 "$1" | grep -ao "\"$2\":\"[0-9]*\"" | head -1 | grep -o '[0-9]*'; }
epoch_of() { meta_of "$1" epoch; }
