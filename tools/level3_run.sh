#!/usr/bin/env bash
# KernelBench level 3 (all 50) on one GPU, resumable across device calls of at most ~10 minutes.
#
#   run: bash tools/level3_run.sh RECORDS.jsonl [CAP_SECONDS]     (carry: ["kernelbench", RECORDS' folder])
#
# Each call starts the problems RECORDS does not yet hold (bench --resume) and stops starting new ones
# CAP - 150 s in, so the call ends inside the device's limit; copy $OUT/level3.jsonl back over RECORDS
# before the next call. A problem that ran out of GPU memory beside the others runs again alone at the
# end of its call (bench --jobs). The merged table: python3 tools/bench_merge.py RECORDS.
set -u
RECORDS=${1:?records file (JSON lines; created if absent)}
CAP=${2:-540}
OUT=${OUT:-$(pwd)/level3_out}
mkdir -p "$OUT" "$(dirname "$RECORDS")"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-/tmp/stitchcuda-cache}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
unset STITCHCUDA_BLOCKS_SMALL
echo "$(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
python3 -m agent_core.cli bench kernelbench/KernelBench/level3/*.py --jobs 8 --trials 20 --draws 5 \
    --timeout 420 --compile-budget 90 --time-cap $((CAP - 150)) --resume --json "$RECORDS" > "$OUT/level3_log.txt" 2>&1
echo "bench rc=$?"
cp "$RECORDS" "$OUT/level3.jsonl"
tail -12 "$OUT/level3_log.txt"
python3 tools/bench_merge.py --title "KernelBench level 3" "$RECORDS" > "$OUT/level3_table.md"
tail -10 "$OUT/level3_table.md"
