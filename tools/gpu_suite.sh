#!/usr/bin/env bash
# Everything GPU-side in one run (under 9 minutes on an H200 machine); results under $OUT.
#
#   run: bash tools/gpu_suite.sh          (carry: [".cache", "kernelbench"])
#
# Two lanes. With two GPUs they run at once, one per GPU (the benchmarks' GPU then runs nothing else);
# with one GPU they run one after the other.
#   lane A (tests):  pytest -m gpu (xdist when present) | export projects built, ctest, binding, timed
#                    (RUN_EXPORT=0 skips) | `optimize tests/data/mlp_small.py`, the studio's H200
#                    recording (RUN_RECORD=0 skips) | with two GPUs, the level-2 problems after L2_SPLIT
#   lane B (bench):  stitchcuda bench over KernelBench level 2 (1..L2_SPLIT with two GPUs) | the examples
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
JOBS=${JOBS:-6}                 # problems benchmarked at once (their timed sections take turns)
PYTEST_CAP=${PYTEST_CAP:-200}
EXPORT_CAP=${EXPORT_CAP:-120}
RECORD_CAP=${RECORD_CAP:-90}
L2_CAP=${L2_CAP:-400}          # the bench lane's share of level 2
L2_B_CAP=${L2_B_CAP:-200}      # the tests lane's share, after its tests
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

L2_FILES=$([ -d "$L2_DIR" ] && ls "$L2_DIR"/*.py | sort -V)
L2_SPLIT=${L2_SPLIT:-64}        # with two GPUs: problems 1..L2_SPLIT on the bench GPU, the rest after the tests

bench_l2() {  # bench_l2 TAG CAP FILE...
    local tag=$1 cap=$2; shift 2
    [ $# -eq 0 ] && { echo "== bench level2 $tag: no problems ($L2_DIR is not here: carry kernelbench)" >> "$SUMMARY"; return; }
    step "bench level2 $tag" "$cap" "$RES/bench_level2_$tag.txt" \
        $PY -m agent_core.cli bench "$@" --json "$RES/bench_level2_$tag.jsonl" \
        --jobs "$JOBS" --tune-trials 3 --trials 20 --timeout 150 --time-cap $((cap - 100)) --compile-budget 60
}

lane_tests() {   # lane_tests [LEVEL2 FILES AFTER THE TESTS...]
    local xdist="" tmo=""
    $PY -c "import xdist" 2>/dev/null && xdist="-n 8"
    $PY -c "import pytest_timeout" 2>/dev/null && tmo="--timeout=200"
    local files
    files=$(grep -l "mark.gpu" tests/*.py tests/gpu/*.py | grep -v test_export_gpu.py \
            | xargs grep -L "PySide6\|pytestqt\|qtbot")
    # --maxfail instead of -x: this is the one GPU run, one failure must not hide the rest
    step "pytest gpu" "$PYTEST_CAP" "$RES/pytest_gpu.log" \
        $PY -m pytest -m gpu -q -rfE --maxfail=25 $xdist $tmo -p no:cacheprovider \
        --junitxml="$RES/pytest_gpu.xml" $files
    [ "${RUN_EXPORT:-1}" = 1 ] && step "export gpu" "$EXPORT_CAP" "$RES/export_gpu.log" \
        $PY -m pytest -m gpu -q -s -rfE -p no:cacheprovider tests/gpu/test_export_gpu.py
    [ "${RUN_RECORD:-1}" = 1 ] && step "record mlp_small" "$RECORD_CAP" "$RES/record_mlp_small.txt" \
        $PY -m agent_core.cli optimize tests/data/mlp_small.py -o "$RES/mlp_small_h200" --compile-budget 40
    [ $# -gt 0 ] && bench_l2 b "$L2_B_CAP" "$@"
}

lane_bench() {   # lane_bench [LEVEL2 FILES...]
    bench_l2 a "$L2_CAP" "$@"
    step "bench examples" "$EXAMPLES_CAP" "$RES/bench_examples.txt" \
        $PY -m agent_core.cli bench resources/examples/*.py --json "$RES/bench_examples.jsonl" \
        --jobs "$JOBS" --tune-trials 3 --trials 20 --timeout 90 --time-cap $((EXAMPLES_CAP - 40)) --compile-budget 40
}

if [ "$NGPU" -ge 2 ]; then
    (export CUDA_VISIBLE_DEVICES=0; lane_tests $(echo "$L2_FILES" | tail -n +$((L2_SPLIT + 1)))) &
    (export CUDA_VISIBLE_DEVICES=1; lane_bench $(echo "$L2_FILES" | head -n "$L2_SPLIT")) &
    wait
else
    lane_tests
    lane_bench $L2_FILES
fi

cp "$SUMMARY" "$OUT/" && tar -czf "$OUT/gpu_suite.tar.gz" -C "$RES" . 2>/dev/null && rm -rf "$RES"
echo "== wrote $OUT/gpu_suite.tar.gz"
cat "$OUT/suite_summary.txt"
