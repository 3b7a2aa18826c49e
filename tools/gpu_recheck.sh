#!/usr/bin/env bash
# Follow-up to tools/gpu_suite.sh: bench what its time caps skipped, and re-time a sample of problems
# alone on a quiet GPU (--jobs 1) to check the parallel run's numbers. Lists: one file per line.
#
#   run: bash tools/gpu_recheck.sh QUIET.txt SKIPPED_L2.txt SKIPPED_EXAMPLES.txt   (results: $OUT/recheck.tar.gz)
set -u
OUT=${OUT:-$(pwd)/gpu_recheck_out}; RES="$OUT/recheck"; mkdir -p "$RES"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-$(pwd)/.cache/stitchcuda}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
PY=${PYTHON:-python3}
QUIET_CAP=${QUIET_CAP:-300}; SKIPPED_CAP=${SKIPPED_CAP:-330}
FLAGS="--tune-trials 3 --trials 20 --timeout 150 --compile-budget 60"
quiet() {
    timeout -s INT -k 15 "$QUIET_CAP" $PY -m agent_core.cli bench $(cat "$1") --json "$RES/quiet_level2.jsonl" \
        $FLAGS --jobs 1 --time-cap $((QUIET_CAP - 40)) > "$RES/quiet_level2.txt" 2>&1
}
skipped() {
    timeout -s INT -k 15 $((SKIPPED_CAP / 2)) $PY -m agent_core.cli bench $(cat "$1") --json "$RES/bench_level2_c.jsonl" \
        $FLAGS --jobs 4 --time-cap $((SKIPPED_CAP / 2 - 60)) > "$RES/bench_level2_c.txt" 2>&1
    timeout -s INT -k 15 $((SKIPPED_CAP / 2)) $PY -m agent_core.cli bench $(cat "$2") --json "$RES/bench_examples_c.jsonl" \
        $FLAGS --jobs 6 --time-cap $((SKIPPED_CAP / 2 - 40)) > "$RES/bench_examples_c.txt" 2>&1
}
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ) commit: $(git rev-parse --short HEAD 2>/dev/null)" > "$RES/recheck_summary.txt"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    (export CUDA_VISIBLE_DEVICES=0; quiet "$1") &
    (export CUDA_VISIBLE_DEVICES=1; skipped "$2" "$3") &
    wait
else
    quiet "$1"; skipped "$2" "$3"
fi
for f in "$RES"/*.txt; do echo "== $(basename "$f")"; tail -n 3 "$f"; done >> "$RES/recheck_summary.txt"
cp "$RES/recheck_summary.txt" "$OUT/" && tar -czf "$OUT/recheck.tar.gz" -C "$RES" . && rm -rf "$RES"
cat "$OUT/recheck_summary.txt"
