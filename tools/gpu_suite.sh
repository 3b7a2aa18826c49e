#!/usr/bin/env bash
# Everything GPU-side in one run (under 9 minutes on an H200 machine); results under $OUT.
#
#   run: bash tools/gpu_suite.sh          (carry: [".cache", "kernelbench"])
#
# Two lanes. With two GPUs they run at once, one per GPU (the benchmarks' GPU then runs nothing else);
# with one GPU they run one after the other.
#   lane A (tests):  pytest -m gpu (xdist when present) | export projects built, ctest, binding, timed |
#                    `optimize tests/data/mlp_small.py` (the studio's H200 recording) | a compute-sanitizer
#                    memcheck of one optimized example
#   lane B (bench):  stitchcuda bench over KernelBench level 2 | over resources/examples
# Each step has its own wall-clock cap (seconds, overridable through the environment) and appends to
# suite_summary.txt; everything ends up in $OUT/gpu_suite.tar.gz, the summary beside it.
# Kernels compile through a disk cache: $STITCHCUDA_CACHE (default .cache/stitchcuda in the repo,
# pre-filled with sm_90 cubins on a CPU machine; carry it to skip NVRTC time).
set -u
OUT=${OUT:-$(pwd)/gpu_suite_out}
RES="$OUT/suite"                # everything lands here, then in one archive (the device returns <= 8 files)
mkdir -p "$RES"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-$(pwd)/.cache/stitchcuda}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}   # parallel problems share the cores
PY=${PYTHON:-python3}
JOBS=${JOBS:-8}                 # problems benchmarked at once (their timed sections take turns)
PYTEST_CAP=${PYTEST_CAP:-200}
EXPORT_CAP=${EXPORT_CAP:-120}
RECORD_CAP=${RECORD_CAP:-90}
SANITIZE_CAP=${SANITIZE_CAP:-60}
L2_CAP=${L2_CAP:-400}
EXAMPLES_CAP=${EXAMPLES_CAP:-120}
L2_DIR=${L2_DIR:-kernelbench/KernelBench/level2}
SUMMARY="$RES/suite_summary.txt"
: > "$SUMMARY"

step() {  # step NAME CAP LOG COMMAND...
    local name=$1 cap=$2 log=$3; shift 3
    local t0=$(date +%s)
    echo "== $name (cap ${cap}s, GPU ${CUDA_VISIBLE_DEVICES:-all}): $(echo "$*" | cut -c1-160)" >> "$SUMMARY"
    timeout --signal=INT --kill-after=15 "$cap" "$@" > "$log" 2>&1
    local rc=$?
    local t1=$(date +%s)
    { echo "   $name: rc=$rc ($([ $rc -eq 124 ] && echo 'hit its time cap, partial results kept' || echo done)) in $((t1 - t0)) s; log: $(basename "$log")"
      tail -n 4 "$log" | sed 's/^/   | /'; } >> "$SUMMARY"
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
    $PY -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)" 2>&1
    echo "cpus: $(nproc); kernel cache: $STITCHCUDA_CACHE ($(ls "$STITCHCUDA_CACHE/kernels" 2>/dev/null | wc -l) files)"
} >> "$SUMMARY"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

lane_tests() {
    local xdist=""
    $PY -c "import xdist" 2>/dev/null && xdist="-n 8"
    local tmo=""
    $PY -c "import pytest_timeout" 2>/dev/null && tmo="--timeout=150"
    local files
    files=$(grep -l "mark.gpu" tests/*.py tests/gpu/*.py | grep -v test_export_gpu.py \
            | xargs grep -L "PySide6\|pytestqt\|qtbot")
    # --maxfail instead of -x: this is the one GPU run, one failure must not hide the rest
    step "pytest gpu" "$PYTEST_CAP" "$RES/pytest_gpu.log" \
        $PY -m pytest -m gpu -q -rfE --maxfail=25 $xdist $tmo -p no:cacheprovider \
        --junitxml="$RES/pytest_gpu.xml" $files
    step "export gpu" "$EXPORT_CAP" "$RES/export_gpu.log" \
        $PY -m pytest -m gpu -q -s -rfE -p no:cacheprovider tests/gpu/test_export_gpu.py
    step "record mlp_small" "$RECORD_CAP" "$RES/record_mlp_small.txt" \
        $PY -m agent_core.cli optimize tests/data/mlp_small.py -o "$RES/mlp_small_h200" --compile-budget 40
    if command -v compute-sanitizer >/dev/null; then
        step "sanitize softmax_rows" "$SANITIZE_CAP" "$RES/sanitize.txt" \
            compute-sanitizer --tool memcheck --error-exitcode 3 $PY -m agent_core.cli optimize \
            resources/examples/softmax_rows.py -o "$RES/sanitize_softmax" --no-baselines --no-tune --draws 2
    fi
}

lane_bench() {
    if [ -d "$L2_DIR" ]; then
        step "bench level2" "$L2_CAP" "$RES/bench_level2.txt" \
            $PY -m agent_core.cli bench $(ls "$L2_DIR"/*.py | sort -V) --json "$RES/bench_level2.jsonl" \
            --jobs "$JOBS" --tune-trials 3 --trials 20 --timeout 150 --time-cap $((L2_CAP - 60)) --compile-budget 60
    else
        echo "== bench level2: skipped, $L2_DIR is not here (carry kernelbench)" >> "$SUMMARY"
    fi
    step "bench examples" "$EXAMPLES_CAP" "$RES/bench_examples.txt" \
        $PY -m agent_core.cli bench resources/examples/*.py --json "$RES/bench_examples.jsonl" \
        --jobs "$JOBS" --tune-trials 3 --trials 20 --timeout 90 --time-cap $((EXAMPLES_CAP - 40)) --compile-budget 40
}

if [ "$NGPU" -ge 2 ]; then
    (export CUDA_VISIBLE_DEVICES=0; lane_tests) &
    (export CUDA_VISIBLE_DEVICES=1; lane_bench) &
    wait
else
    lane_tests
    lane_bench
fi

cp "$SUMMARY" "$OUT/" && tar -czf "$OUT/gpu_suite.tar.gz" -C "$RES" . 2>/dev/null && rm -rf "$RES"
echo "== wrote $OUT/gpu_suite.tar.gz"
cat "$OUT/suite_summary.txt"
