#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md, in one call on the device machine:
#   bash tests/benchmarks/h200.sh CANDIDATES WORKERS BENCH_CANDIDATES
# It expects the wheels in .whl/ (see the README of the device tool) and writes to $OUT.
set -uo pipefail
CANDIDATES=${1:-300}; WORKERS=${2:-0}; BENCH=${3:-24}  # WORKERS 0: as many as GPU memory allows
OUT=${OUT:-/tmp/opsynth-out}
RUN=/tmp/opsynth-run  # the device returns at most 8 files: only the ones that matter are copied to $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_CACHE_DIR=/tmp/opsynth-cache
python3 -c "import torch, apache_beam, libcst; print('torch', torch.__version__, torch.cuda.get_device_name(), 'cores', __import__('os').cpu_count())"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
echo "== end-to-end run: $CANDIDATES candidates, $WORKERS workers"
start=$(date +%s.%N)
python3 -m pipeline.cli run --device cuda --num-samples 100000 --max-candidates "$CANDIDATES" \
    --workers "$WORKERS" --out "$RUN" --timeout-s 240 --max-memory-gb 24 2>&1 | tail -6
echo "run wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
mkdir -p "$OUT/run" && cp "$RUN/stats.json" "$RUN/README.md" "$RUN"/data/*.parquet "$RUN"/rejects/*.parquet "$OUT/run/"
tail -c 200000 "$RUN/workers.log" > "$OUT/run/workers.log"
python3 - "$RUN/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("composed", "accepted", "rejected", "wall_time_s", "rejected_by_reason", "time_by_check_s", "op_count_mix",
        "eager_ms_histogram")
print(json.dumps({k: s[k] for k in keys}))
print("accepted per hour", round(s["accepted"] / s["wall_time_s"] * 3600))
PY
echo "== cross-check against torch.profiler"
python3 -m tests.benchmarks.gpu_crosscheck "$RUN" --tasks 20 2>&1 | tail -24
[ "$BENCH" -gt 0 ] || exit 0
echo "== worker pool vs fresh process per candidate"
timeout 300 python3 -m tests.benchmarks.bench_validate --device cuda --candidates "$BENCH" --workers 7 2>&1 | tail -8
