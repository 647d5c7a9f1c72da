#!/usr/bin/env bash
# gpu-check.sh: everything actlab's CUDA backend must show on a bare GPU host (x86-64, nvcc + CMake + ninja +
# PyTorch with its pip cuDNN/cuBLAS, no Debian packages, no network), in one run of at most ~8 minutes:
#   1. configure a minimal CUDA build (-DACTLAB_GPU_CHECK=ON: no oneDNN/stb/zlib; doctest from a carried
#      copy) against the cuDNN (and, if the toolkit lacks it, cuBLAS) of PyTorch's pip packages, build
#      actlab_tests and bench_cuda;
#   2. run the CUDA suites (actlab_tests -tc='cuda*': CPU-vs-GPU parity of every op and codec);
#   3. bench_cuda: copy and codec-kernel bandwidth, ResNet-18 CIFAR batch 256 training under exact,
#      division:B=8,Q=2 and swap:P=2, and exact and DIVISION in bf16/fp16 (img/s, activation memory, peak memory);
#   4. scripts/gpu_torch_bench.py: the same model and step in PyTorch, in fp32 and under AMP bf16 and fp16;
#   5. write $OUT/table.md (and logs, JSON) — every step's log is kept even when a step fails.
# Usage: OUT=/some/dir scripts/gpu-check.sh   (env: DOCTEST_DIR, CUDNN_ROOT, CUBLAS_ROOT, BUILD, JOBS, PREBUILT)
# PREBUILT=dir: use dir/actlab_tests, dir/bench_cuda and dir/actlab-train built elsewhere (an ACTLAB_GPU_CHECK
# build for sm_90, carried to the GPU host) when they start there; otherwise build as in step 1. Building
# elsewhere saves the GPU host's minutes.
# STEPS=list: which of tests,bench,vit,fig7,train,torch,ncu,prof to run (default all but ncu and prof). fig7: every method
# of the paper's Fig. 7 (Normal, Checkpoint, SWAP, BLPA, AC-GC, ActNN, DIVISION, Checkpoint + DIVISION) on
# ResNet-18 b256 in one run, with SWAP's hidden copy fraction from the pinned copy bandwidth. train:
# actlab-train on the GPU with synthetic data (its --deterministic twice, which must repeat, and
# --cudnn-benchmark under division). ncu: Nsight Compute's speed-of-light, memory and occupancy sections of the codec's pack and
# unpack kernels (ncu.txt). prof: GPU time by kernel over one step of PROF_MODEL (default vit_tiny_cifar),
# exact and DIVISION, from Nsight Compute's kernel durations (prof_*.txt).
# Needs in the tree: CMakeLists.txt with ACTLAB_GPU_CHECK (or build-cuda/cmake.patch to apply) and a
# doctest copy: $DOCTEST_DIR/doctest/doctest.h, default build-cuda/gpu-deps/doctest/doctest.h (318 KB).
set -uo pipefail
# No arguments (settings come from the environment): --help prints the comment above; anything else is a
# mistake, refused before minutes of building.
case "${1-}" in
  "") ;;
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "$(basename "$0"): takes no arguments (got '$1'); see --help" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-/tmp/actlab-gpu-check-build}
JOBS=${JOBS:-$(nproc)}
STEPS=",${STEPS:-tests,bench,vit,fig7,train,torch},"
# A misspelt step would run nothing and report success: every name is checked first.
for step in ${STEPS//,/ }; do
  case "$step" in
    tests | bench | vit | fig7 | train | torch | ncu | prof) ;;
    *) echo "$(basename "$0"): unknown step '$step' in STEPS (tests,bench,vit,fig7,train,torch,ncu,prof)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
START=$(date +%s)
STATUS=0
want() { [[ $STEPS == *",$1,"* ]]; }
# A wanted step whose program is missing (a failed build) is a failure, not a silent skip.
have() { [ -x "$BUILD/$1" ] || { fail "no $BUILD/$1 for a wanted step"; return 1; }; }
log() { echo "[gpu-check +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/summary.log"; }
fail() { log "FAILED: $*"; STATUS=1; }

log "repo $ROOT, build $BUILD, output $OUT, $JOBS jobs"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { fail "no nvcc"; exit 1; }
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
"$NVCC" --version | tail -1 | tee -a "$OUT/summary.log"
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version())" \
  2>&1 | tee -a "$OUT/summary.log"

# ---- where PyTorch's pip packages keep cuDNN / cuBLAS (nvidia.* are namespace packages: use __path__)
pip_root() { python3 -c "import importlib; m = importlib.import_module('$1'); print(list(m.__path__)[0])" 2>/dev/null; }
CUDNN_ROOT=${CUDNN_ROOT:-$(pip_root nvidia.cudnn)}
CMAKE_EXTRA=()
LIBPATH=""
if [ -n "$CUDNN_ROOT" ] && [ -f "$CUDNN_ROOT/include/cudnn.h" ]; then
  CUDNN_LIB=$(ls "$CUDNN_ROOT"/lib/libcudnn.so* 2>/dev/null | sort | head -1)
  CMAKE_EXTRA+=(-DCUDNN_INCLUDE_DIR="$CUDNN_ROOT/include" -DCUDNN_LIBRARY="$CUDNN_LIB")
  LIBPATH="$CUDNN_ROOT/lib"
  log "cuDNN: $CUDNN_LIB"
else
  log "cuDNN: not found in pip packages; relying on the toolkit (convolutions fail without it)"
fi
if ! ls "$CUDA_HOME"/lib64/libcublas.so* >/dev/null 2>&1; then
  CUBLAS_ROOT=${CUBLAS_ROOT:-$(pip_root nvidia.cublas)}
  if [ -n "$CUBLAS_ROOT" ]; then
    CMAKE_EXTRA+=(-DCUDA_cublas_LIBRARY="$(ls "$CUBLAS_ROOT"/lib/libcublas.so* | sort | head -1)"
                  -DCUDA_cublasLt_LIBRARY="$(ls "$CUBLAS_ROOT"/lib/libcublasLt.so* | sort | head -1)"
                  -DCMAKE_CXX_FLAGS="-I$CUBLAS_ROOT/include" -DCMAKE_CUDA_FLAGS="-I$CUBLAS_ROOT/include")
    LIBPATH="$LIBPATH:$CUBLAS_ROOT/lib"
    log "cuBLAS: from pip ($CUBLAS_ROOT)"
  else
    fail "cuBLAS: neither in $CUDA_HOME/lib64 nor in pip packages"
  fi
fi
# NCCL (the GPU-check build links it for the one-rank case of tests/test_cuda_dist.cpp): the toolkit's, or
# the one PyTorch's pip packages bring (nvidia-nccl-*), wherever under nvidia/ it lies.
if ! ls "$CUDA_HOME"/lib64/libnccl.so* >/dev/null 2>&1; then
  NCCL_LIB=$(python3 -c "
import glob, os
try:
    import nvidia
    hits = [h for root in nvidia.__path__ for h in sorted(glob.glob(os.path.join(root, '**', 'libnccl.so*'), recursive=True))]
    print(hits[0] if hits else '')
except Exception:
    print('')" 2>/dev/null)
  if [ -n "$NCCL_LIB" ]; then
    NCCL_DIR=$(dirname "$NCCL_LIB")
    LIBPATH="$LIBPATH:$NCCL_DIR"
    CMAKE_EXTRA+=(-DNCCL_LIBRARY="$NCCL_LIB")
    [ -f "$NCCL_DIR/../include/nccl.h" ] && CMAKE_EXTRA+=(-DNCCL_INCLUDE_DIR="$(cd "$NCCL_DIR/../include" && pwd)")
    log "NCCL: $NCCL_LIB"
  else
    log "NCCL: not in the toolkit nor in pip packages (binaries that link it will not start; a build here leaves it out)"
  fi
fi
export LD_LIBRARY_PATH="${LIBPATH}:${CUDA_HOME}/lib64:${LD_LIBRARY_PATH:-}"

DOCTEST_DIR=${DOCTEST_DIR:-$ROOT/build-cuda/gpu-deps}
[ -f "$DOCTEST_DIR/doctest/doctest.h" ] || DOCTEST_DIR=/usr/include
[ -f "$DOCTEST_DIR/doctest/doctest.h" ] || fail "no doctest/doctest.h (set DOCTEST_DIR)"

if ! grep -q ACTLAB_GPU_CHECK "$ROOT/CMakeLists.txt"; then
  log "CMakeLists.txt has no ACTLAB_GPU_CHECK: applying build-cuda/cmake.patch"
  (cd "$ROOT" && (git apply build-cuda/cmake.patch 2>/dev/null || patch -p1 < build-cuda/cmake.patch)) \
    > "$OUT/patch.log" 2>&1 || fail "could not apply build-cuda/cmake.patch (see patch.log)"
fi

# ---- 1. configure and build (or take the carried binaries when they start here)
if [ -n "${PREBUILT:-}" ] && [ -x "$PREBUILT/actlab_tests" ] && [ -x "$PREBUILT/bench_cuda" ] \
   && [ -x "$PREBUILT/actlab-train" ] \
   && timeout 60 "$PREBUILT/actlab_tests" -tc='cuda: device present,cuda cublas*' > "$OUT/prebuilt.log" 2>&1; then
  BUILD=$PREBUILT
  log "using the carried binaries in $PREBUILT"
else
  if [ -n "${PREBUILT:-}" ]; then
    log "the carried binaries in $PREBUILT do not start here (see prebuilt.log): building"
    ldd "$PREBUILT/actlab_tests" 2>&1 | grep "not found" | tee -a "$OUT/summary.log"
  fi
  log "configure"
  timeout 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTLAB_GPU_CHECK=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" \
    -DACTLAB_DOCTEST_DIR="$DOCTEST_DIR" "${CMAKE_EXTRA[@]}" > "$OUT/configure.log" 2>&1 \
    || fail "configure (see configure.log)"
  log "build"
  timeout 300 ninja -C "$BUILD" -j"$JOBS" actlab_tests bench_cuda actlab-train > "$OUT/build.log" 2>&1 \
    || fail "build (see build.log; tail below)"
  tail -5 "$OUT/build.log"
fi

# ---- 2. the CUDA suites
if want tests && have actlab_tests; then
  log "tests: actlab_tests -tc='cuda*'"
  timeout 150 "$BUILD/actlab_tests" -tc='cuda*' > "$OUT/tests.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || fail "CUDA test suites, exit $rc (see tests.log)"
  grep -E "^\[doctest\] (test cases|assertions|Status)" "$OUT/tests.log" | tee -a "$OUT/summary.log"
  grep -E "ERROR|FATAL|CHECK.*is NOT correct" "$OUT/tests.log" | head -40 | tee -a "$OUT/summary.log"
  if [ $rc -gt 1 ]; then
    # A crash or a time-out ends the whole run: run each case alone so every case gets its verdict.
    log "the suite ended abnormally: each test case alone (tests-each.log)"
    "$BUILD/actlab_tests" -ltc -tc='cuda*' | sed -n '/^=====/,/^=====/p' | grep -v '^=====' > "$OUT/cases.txt"
    while IFS= read -r name; do
      [ $(( $(date +%s) - START )) -lt $(( ${CASES_UNTIL_S:-330} )) ] || { log "out of time for single cases"; break; }
      pattern=$(printf '%s' "$name" | sed 's/[],*?[]/?/g')
      timeout 60 "$BUILD/actlab_tests" -tc="$pattern" > "$OUT/case.log" 2>&1
      crc=$?
      echo "exit $crc: $name" | tee -a "$OUT/tests-each.log"
      [ $crc -eq 0 ] || tail -25 "$OUT/case.log" >> "$OUT/tests-each.log"
    done < "$OUT/cases.txt"
  fi
  if grep -q "SKIPPED: no CUDA device" "$OUT/tests.log"; then fail "the GPU suites were skipped: no device seen"; fi
fi

# ---- 3. actlab benchmarks, 4. PyTorch
if want bench && have bench_cuda; then
  log "bench_cuda (kernels, ResNet-18 b256: exact, division:B=8,Q=2, swap:P=2, exact@bf16, exact@fp16, division@bf16)"
  timeout 240 "$BUILD/bench_cuda" --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.log" 2>&1 \
    || fail "bench_cuda (see bench_cuda.log)"
  cat "$OUT/bench_cuda.log"
fi
if want vit && have bench_cuda; then
  # division:B=8,Q=2,R=1 (a range per token) is the DIVISION that trains within 0.5 points of exact under AdamW.
  log "bench_cuda: ViT-Tiny (patch 4, 32x32) b256: exact, division:B=8,Q=2 and its R=1, exact and division in bf16"
  timeout 170 "$BUILD/bench_cuda" --what train --model vit_tiny_cifar --min-time 3 \
    --policies 'exact;division:B=8,Q=2;division:B=8,Q=2,R=1;exact@bf16;division:B=8,Q=2@bf16' --json "$OUT/bench_vit.json" \
    > "$OUT/bench_vit.log" 2>&1 || fail "bench_cuda ViT (see bench_vit.log)"
  cat "$OUT/bench_vit.log"
fi
FIG7_POLICIES='exact;checkpoint;swap;swap:F=0;blpa:Q=4;acgc;actnn:G=256,Q=2;division:B=8,Q=2;checkpoint+division:B=8,Q=2'
if want fig7 && have bench_cuda; then
  log "bench_cuda: Fig. 7, every method on ResNet-18 b256 fp32 ($FIG7_POLICIES)"
  timeout 240 "$BUILD/bench_cuda" --what train --min-time 2 --policies "$FIG7_POLICIES" \
    --json "$OUT/bench_fig7.json" > "$OUT/bench_fig7.log" 2>&1 || fail "bench_cuda Fig. 7 (see bench_fig7.log)"
  cat "$OUT/bench_fig7.log"
fi
if want train && have actlab-train; then
  log "actlab-train --device cuda (synthetic 1x28x28, ResNet-18, batch 256): --deterministic twice, then division"
  train_run() {  # name, extra flags...
    local name=$1; shift
    timeout 120 "$BUILD/actlab-train" --device cuda --dataset synthetic --synthetic-size 4096 --model resnet18 \
      --batch-size 256 --epochs 1 --summary-json "$OUT/train_$name.json" "$@" > "$OUT/train_$name.log" 2>&1 \
      || fail "actlab-train $name (see train_$name.log)"
    tail -1 "$OUT/train_$name.log"
  }
  train_run det1 --deterministic
  train_run det2 --deterministic
  train_run division --policy division:B=8,Q=2 --cudnn-benchmark
  python3 - "$OUT" <<'EOF' || fail "--deterministic did not repeat the run bit for bit"
import json, os, sys
a, b = (json.load(open(os.path.join(sys.argv[1], "train_%s.json" % n))) for n in ("det1", "det2"))
def losses(d):
    return [r["train_loss"] for r in d["epoch_rows"]] + [d["final_test_loss"]]
print("deterministic runs: losses %r and %r" % (losses(a), losses(b)))
sys.exit(0 if losses(a) == losses(b) else 1)
EOF
fi
if want torch; then
  log "PyTorch ResNet-18 b256 (fp32, then AMP bf16 and fp16)"
  timeout 120 python3 "$ROOT/scripts/gpu_torch_bench.py" --json "$OUT/torch.json" > "$OUT/torch.log" 2>&1 \
    || fail "gpu_torch_bench.py (see torch.log)"
  cat "$OUT/torch.log"
  for amp in bf16 fp16; do
    timeout 120 python3 "$ROOT/scripts/gpu_torch_bench.py" --amp "$amp" --json "$OUT/torch_$amp.json" \
      > "$OUT/torch_$amp.log" 2>&1 || fail "gpu_torch_bench.py --amp $amp (see torch_$amp.log)"
    cat "$OUT/torch_$amp.log"
  done
fi
if want ncu && have bench_cuda; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$NCU" ]; then
    fail "ncu: not found"
  else
    # The team kernels (plane_pack/unpack) and the large planes' three pack grids (plane_pool/range/code:
    # the token maps'), each shape's warm-up and timed launch.
    log "ncu: the codec pack and unpack kernels of each shape, warm-up and timed launch (ncu.txt)"
    timeout 200 "$NCU" --clock-control none --kernel-name regex:'plane_(un)?pack_kernel|plane_(pool|range|code)_kernel' \
      --launch-skip 0 --launch-count 80 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section ComputeWorkloadAnalysis \
      "$BUILD/bench_cuda" --what kernels --kernel-reps 1 > "$OUT/ncu.txt" 2>&1 || fail "ncu (see ncu.txt)"
    grep -E "plane_(un)?pack_kernel|plane_(pool|range|code)_kernel|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|Compute \(SM\)|Achieved Occupancy|Registers Per|Executed Ipc A" \
      "$OUT/ncu.txt" | head -240
  fi
fi

if want prof && have bench_cuda; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  PROF_MODEL=${PROF_MODEL:-vit_tiny_cifar}
  if [ -z "$NCU" ]; then
    fail "ncu: not found"
  else
    # GPU time per kernel over one warm-up and one timed step (ncu serializes kernels; the step's wall time
    # under it means nothing, the kernel durations do): where a model's step goes, by kernel.
    for p in exact 'division:B=8,Q=2'; do
      name=$(printf '%s' "$p" | tr -c 'a-zA-Z0-9' _)
      log "prof: GPU time by kernel, $PROF_MODEL b256 $p (prof_$name.txt)"
      timeout 200 "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --launch-count 50000 "$BUILD/bench_cuda" --what train --model "$PROF_MODEL" --policies "$p" --warmup 1 \
        --steps 1 --min-time 0 --max-steps 1 > "$OUT/prof_$name.csv" 2> "$OUT/prof_$name.err" \
        || fail "ncu $p (see prof_$name.err)"
      python3 - "$OUT/prof_$name.csv" <<'PY' | tee "$OUT/prof_$name.txt" || fail "prof table $p"
import collections, csv, sys
header, totals = None, collections.defaultdict(lambda: [0, 0.0])
unit_us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
for row in csv.reader(open(sys.argv[1])):
    if "Kernel Name" in row and "Metric Value" in row:
        header = row
        continue
    if not header or len(row) != len(header):
        continue
    r = dict(zip(header, row))
    try:
        us = float(r["Metric Value"].replace(",", "")) * unit_us[r["Metric Unit"]]
    except (KeyError, ValueError):
        continue
    t = totals[r["Kernel Name"][:100]]
    t[0] += 1
    t[1] += us
all_us = sum(t[1] for t in totals.values())
print("kernels %d, GPU time %.1f ms over 2 steps" % (sum(t[0] for t in totals.values()), all_us / 1e3))
for name, (n, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:25]:
    print("%8.2f ms %5.1f%% %6d  %s" % (us / 1e3, 100 * us / all_us, n, name))
PY
      gzip -f "$OUT/prof_$name.csv"
    done
  fi
fi

# ---- 5. one table
python3 - "$OUT" <<'EOF' || fail "table"
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else {}
a, t, v, f7 = load("bench_cuda.json"), load("torch.json"), load("bench_vit.json"), load("bench_fig7.json")
amp = [load("torch_bf16.json"), load("torch_fp16.json")]
mib = 1024.0 * 1024.0
device = a.get("device") or v.get("device") or f7.get("device") or t.get("device", "?")
lines = ["# actlab GPU check: %s" % device, ""]
if a.get("train") or t:
    lines += ["ResNet-18 CIFAR, batch 256, fp32 (no TF32) unless a row says @bf16/@fp16 or AMP, cuDNN benchmark "
              "mode, median of timed steps.", "",
              "| framework / policy | img/s | activation MiB | peak MiB | reserved peak MiB |", "|---|---|---|---|---|"]
for r in a.get("train", []):
    lines.append("| actlab %s | %.0f | %.1f | %.1f | %.1f |" % (r["policy"], r["img_per_s"], r["activation_bytes"] / mib,
                                                            r["peak_bytes"] / mib, r["reserved_peak_bytes"] / mib))
for r in [t] + amp:
    if not r:
        continue
    what = "exact" if r.get("amp", "none") == "none" else "AMP " + r["amp"]
    lines.append("| %s (%s) | %.0f | %.1f | %.1f | %.1f |" % (r["framework"], what, r["img_per_s"],
                                                           r["activation_bytes"] / mib, r["peak_bytes"] / mib,
                                                           r["reserved_peak_bytes"] / mib))
if v.get("train"):
    lines += ["", "ViT-Tiny (patch 4, 32x32 inputs, dim 192, depth 12), batch 256, same protocol.", "",
              "| policy | img/s | activation MiB | peak MiB | reserved peak MiB |", "|---|---|---|---|---|"]
    for r in v["train"]:
        lines.append("| actlab %s | %.0f | %.1f | %.1f | %.1f |" % (r["policy"], r["img_per_s"], r["activation_bytes"] / mib,
                                                                r["peak_bytes"] / mib, r["reserved_peak_bytes"] / mib))
copies = {k["kernel"].split()[1]: k["gbps"] for k in a.get("kernels", []) if k["kernel"].startswith("copy ")}
if f7.get("train"):
    rows = f7["train"]
    exact = next((r for r in rows if r["policy"] == "exact"), None)
    lines += ["", "Fig. 7: every method, ResNet-18 CIFAR b256 fp32, one run; step vs exact: the method's step time over exact's.", "",
              "| method | img/s | step vs exact | activation MiB | pinned host MiB |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = exact["img_per_s"] / r["img_per_s"] if exact else float("nan")
        lines.append("| %s | %.0f | %.3fx | %.1f | %.1f |" % (r["policy"], r["img_per_s"], ratio,
                                                            r["activation_bytes"] / mib, r.get("offloaded_bytes", 0) / mib))
    swap = next((r for r in rows if r["policy"].startswith("swap")), None)
    if exact and swap and swap.get("offloaded_bytes") and "d2h" in copies and "h2d" in copies:
        # The copies alone would take bytes/d2h + bytes/h2d; what the step lost is the part not hidden.
        moved = swap["offloaded_bytes"]
        copy_s = moved / (copies["d2h"] * 1e9) + moved / (copies["h2d"] * 1e9)
        lost_s = max(0.0, 256.0 / swap["img_per_s"] - 256.0 / exact["img_per_s"])
        lines += ["", "SWAP: %.1f MiB each way per step; copies alone %.2f ms (d2h %.1f, h2d %.1f GB/s), step longer "
                  "by %.2f ms: %.0f%% of the copying hidden." % (moved / mib, 1e3 * copy_s, copies["d2h"], copies["h2d"],
                                                              1e3 * lost_s, 100 * max(0.0, 1 - lost_s / copy_s))]
if a.get("kernels"):
    lines += ["", "| kernel (bytes read + written) | GB/s | of copy (target >= 70% for pack/unpack) |", "|---|---|---|"]
for k in a.get("kernels", []):
    lines.append("| %s | %.0f | %.0f%% |" % (k["kernel"], k["gbps"], 100 * k["of_copy"]))
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
log "done, status $STATUS (0 = every step passed); results in $OUT"
exit $STATUS
