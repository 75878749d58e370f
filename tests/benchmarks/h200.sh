#!/usr/bin/env bash
# The GPU measurements of BENCHMARKS.md, in two calls on the device machine:
#   bash tests/benchmarks/h200.sh crawl [SEEDS]                 # crawl, seed audit, sandbox check
#   bash tests/benchmarks/h200.sh run CANDIDATES WORKERS BENCH  # end-to-end run, cross-check, pool bench
#   bash tests/benchmarks/h200.sh bench CANDIDATES              # the pool bench alone
#   bash tests/benchmarks/h200.sh jail                          # the jailed sandbox on CUDA workers
#   bash tests/benchmarks/h200.sh audit [SEEDS]                 # the seed audit alone
#   bash tests/benchmarks/h200.sh runners CANDIDATES PROCESSES   # one Beam process vs multi-process
#   bash tests/benchmarks/h200.sh ops6k SECONDS [SAMPLES] [MAX]  # the ops6k recipe (template composer), resumed; MAX candidates in all
#   bash tests/benchmarks/h200.sh funnel TREE NAME [SECONDS] [TASKS]  # TASKS (.bench/cands) through `opsynth validate`, TREE's code
#   bash tests/benchmarks/h200.sh proofs [CANDIDATES]           # the jail on CUDA, GPU determinism, the pool bench as root
#   bash tests/benchmarks/h200.sh report [SECONDS]              # the ops6k run beside KernelBench L2 (validated here) and .kb/
#   bash tests/benchmarks/h200.sh readings                      # KernelBench L1-L3's shipped readings, built here (pipeline.shipped_readings)
#   bash tests/benchmarks/h200.sh reaudit [ROWS]                # ROWS random rows of the ops6k run re-audited by plain torch
#   bash tests/benchmarks/h200.sh throughput NAME TREE WORKERS [N] [TASKS]  # N of TASKS through `opsynth validate`: accepted/h, where the time goes
#   bash tests/benchmarks/h200.sh warmup [CANDIDATES] [WORKERS]  # what each GPU zygote warm-up level buys a child's compile
#   bash tests/benchmarks/h200.sh cudastart                     # what starting CUDA costs a child, alone and 2-16 at once
#   bash tests/benchmarks/h200.sh compile [CANDIDATES] [PARALLEL] # the compile check's torch.compile, autotuned or not
#   bash tests/benchmarks/h200.sh screenpool [JOBS]              # a round composed serially and screened ahead on every core
#   bash tests/benchmarks/h200.sh shapes NAME...                # bench_shapes over funnel NAMEs' accepted tasks and KernelBench L2
#   bash tests/benchmarks/h200.sh scale [TASKS]                 # cold and cached crawl on every core; opsynth dedupe on 2 cores
#   bash tests/benchmarks/h200.sh gputrace [ROWS|none|attack|in-full] # the trace on the checks' device: the attack, fairness on KernelBench and ROWS
#   bash tests/benchmarks/h200.sh disguise [KINDS...]             # bench_disguise, copies read at their own sizes on the GPU (LEVELS="2": level 2 alone)
# It expects the wheels in .whl/ (see the README of the device tool) and writes to $OUT. The
# catalog cache is kept in .device-cache/: bring $OUT/catalogs back there and carry it to
# the second call, so the run does not crawl again.
set -uo pipefail
STAGE=${1:-run}; shift
OUT=${OUT:-/tmp/opsynth-out}
mkdir -p "$OUT" && exec > >(tee -a "$OUT/h200.log") 2>&1  # what it prints comes back even if the call times out
RUN=/tmp/opsynth-run  # the device returns at most 8 files: only the ones that matter are copied to $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
[ -d .whl/lib ] && export LD_LIBRARY_PATH=$PWD/.whl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # libseccomp, where the image has none
# The caches live on the machine's local disk (the carried catalog copied in), not in the copied repo folder.
mkdir -p /tmp/opsynth-cache && cp -r .device-cache/. /tmp/opsynth-cache/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPSYNTH_CACHE_DIR=/tmp/opsynth-cache
python3 -c "import torch, transformers, apache_beam, libcst; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(), 'cores', __import__('os').cpu_count())"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
if [ "$STAGE" = audit ]; then
    echo "== seed audit: ${1:-200} transformers seeds on the GPU"
    python3 -m tests.benchmarks.seed_audit --sample "${1:-200}" --device cuda --out /tmp/audit 2>&1 | tail -30
    exit 0
fi
pool_bench() {  # CANDIDATES TIMEOUT_S
    echo "== worker pool vs fresh process per candidate"
    timeout "$2" python3 -m tests.benchmarks.bench_validate --device cuda --candidates "$1" --workers 7 2>&1 | tail -8
}
if [ "$STAGE" = bench ]; then
    pool_bench "${1:-60}" 420
    exit 0
fi
if [ "$STAGE" = jail ]; then
    echo "== hostile and benign tasks through jailed CUDA workers"
    timeout 400 python3 -m tests.benchmarks.gpu_sandbox_check --device cuda --workers 4 --jobs 24 2>&1 | tail -60
    exit 0
fi
if [ "$STAGE" = runners ]; then
    echo "== the DirectRunner: one process vs ${2:-2} processes, ${1:-120} candidates"
    python3 -m tests.benchmarks.bench_runners --device cuda --candidates "${1:-120}" --processes "${2:-2}" 2>&1 | tail -4
    exit 0
fi
if [ "$STAGE" = ops6k ]; then
    # The ops6k recipe with the template composer, against the KernelBench checkout carried in
    # .kb/, for at most SECONDS; interrupted there, it keeps its finished rounds and verdicts.
    # Its state (cache and output folder) goes back as ops6k-state.tar.gz: carry it in
    # .device-cache/ and the next call resumes the same run, from a fresh machine too.
    # SAMPLES (the recipe's 6,000 if not given) is kept in the state for the report stage.
    # the carried state is the run's whole state: a warm machine's /tmp still holds the last
    # call's, and the archive extracted over it mixed two calls' ledgers once
    rm -rf /tmp/ops6k /tmp/opsynth-cache/verdicts /tmp/opsynth-cache/op_graphs
    [ -f .device-cache/ops6k-state.tar.gz ] && tar -xzf .device-cache/ops6k-state.tar.gz -C /
    [ -n "${2:-}" ] && echo "$2" > /tmp/opsynth-cache/ops6k-samples
    ops6k=(python3 -m pipeline.cli run --config ops6k --composer template --out /tmp/ops6k
           --cache-dir /tmp/opsynth-cache --timeout-s 240 --max-memory-gb 24
           --num-samples "$(cat /tmp/opsynth-cache/ops6k-samples 2>/dev/null || echo 6000)")
    export KERNELBENCH=$PWD/.kb/KernelBench
    start=$(date +%s.%N)
    # MAX bounds the call to whole rounds (a round cut by the time limit is lost)
    bound=(); [ -n "${3:-}" ] && bound=(--max-candidates "$3")
    timeout -s INT -k 15 "${1:-480}" "${ops6k[@]}" "${bound[@]}" 2>&1 | grep -v "^WARNING" | tail -4
    echo "ops6k call wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    decided=$(cat /tmp/ops6k/.staging/round-*.jsonl 2>/dev/null | wc -l)
    # the rounds finished so far, written out as the dataset (it stops at once: nothing is left to compose)
    [ "$decided" -gt 0 ] && "${ops6k[@]}" --max-candidates "$decided" 2>&1 | tail -1
    python3 - /tmp/ops6k/stats.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({k: s.get(k) for k in ("composed", "accepted", "rejected", "rejected_by_reason", "op_count_mix")}))
PY
    grep -E "catalog:|reference traced|round of" /tmp/ops6k/run.log | tail -40
    tar -czf "$OUT/ops6k-state.tar.gz" --exclude="*.tar.gz" /tmp/ops6k /tmp/opsynth-cache 2>/dev/null
    cp /tmp/ops6k/stats.json /tmp/ops6k/run.log "$OUT/" 2>/dev/null
    exit 0
fi
if [ "$STAGE" = readings ]; then
    # the table a run reads KernelBench from (filters/similarity/kernelbench_readings.json), built
    # where every task can be read at its own sizes; written into this checkout too, so that a
    # later stage of the same call uses it
    start=$(date +%s.%N)
    # each progress line as it comes: a call cut by its limit keeps them (a tail held them all back once)
    python3 -m pipeline.shipped_readings "$PWD/.kb/KernelBench" --levels 1 2 3 --device cuda 2>&1 \
        | grep --line-buffered -v "^WARNING"
    echo "readings wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    cp filters/similarity/kernelbench_readings.json "$OUT/"
    exit 0
fi
if [ "$STAGE" = reaudit ]; then
    # tests/benchmarks/gpu_reaudit.py over the ops6k run carried in .device-cache/ (see ops6k)
    [ -d /tmp/ops6k/data ] || tar -xzf .device-cache/ops6k-state.tar.gz -C / || { echo "carry .device-cache/ops6k-state.tar.gz"; exit 1; }
    start=$(date +%s.%N)
    python3 -m tests.benchmarks.gpu_reaudit /tmp/ops6k --rows "${1:-200}" --processes 8 2>&1 | tail -60
    echo "reaudit wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    exit 0
fi
if [ "$STAGE" = report ]; then
    # `opsynth report` for the ops6k run (its state carried as for the ops6k stage): beside
    # KernelBench level 2 run through `opsynth validate` on this GPU (eager ms and output
    # magnitude on both sides), and beside the checkout's text; the run's card (its comparison
    # section) goes back with the reports. The validated level 2 goes back
    # as kb-l2.tar.gz: carry it in .device-cache/ and the next call skips the validation.
    rm -rf /tmp/ops6k /tmp/opsynth-cache/verdicts /tmp/opsynth-cache/op_graphs  # the carried state alone (see ops6k)
    tar -xzf .device-cache/ops6k-state.tar.gz -C / || { echo "carry .device-cache/ops6k-state.tar.gz"; exit 1; }
    [ -f .device-cache/kb-l2.tar.gz ] && tar -xzf .device-cache/kb-l2.tar.gz -C /
    # written out again by this checkout: the output_max_abs column and the card's comparison section
    export KERNELBENCH=$PWD/.kb/KernelBench
    decided=$(cat /tmp/ops6k/.staging/round-*.jsonl 2>/dev/null | wc -l)
    python3 -m pipeline.cli run --config ops6k --composer template --out /tmp/ops6k --cache-dir /tmp/opsynth-cache \
        --timeout-s 240 --max-memory-gb 24 --max-candidates "$decided" \
        --num-samples "$(cat /tmp/opsynth-cache/ops6k-samples 2>/dev/null || echo 6000)" 2>&1 | tail -1
    level2=$(ls -d .kb/KernelBench/KernelBench/level2 .kb/KernelBench/level2 2>/dev/null | head -1)  # either layout
    if [ ! -f /tmp/kb-l2/stats.json ]; then
        timeout -s INT -k 15 "${1:-420}" python3 -m pipeline.cli validate "$level2" --out /tmp/kb-l2 \
            --device cuda --cache-dir /tmp/opsynth-cache --timeout-s 240 --max-memory-gb 24 2>&1 | grep -v "^WARNING" | tail -3
        tar -czf "$OUT/kb-l2.tar.gz" /tmp/kb-l2/data /tmp/kb-l2/stats.json 2>/dev/null
    fi
    for against in /tmp/kb-l2 .kb/KernelBench; do
        name=report-$(basename "$against")
        start=$(date +%s.%N)
        python3 -m pipeline.cli report /tmp/ops6k --against "$against" --levels 2 --out "/tmp/$name" 2>&1 | tail -2
        echo "$name wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    done
    tar -czf "$OUT/reports.tar.gz" /tmp/report-kb-l2 /tmp/report-KernelBench /tmp/ops6k/README.md /tmp/ops6k/plots
    cp /tmp/report-kb-l2/report.md "$OUT/report-kb-l2.md"
    exit 0
fi
if [ "$STAGE" = funnel ]; then
    # The same candidates (.bench/cands, from compose_candidates) through `opsynth validate` on
    # the GPU, with this checkout's code (TREE .) or an earlier commit's (TREE .old: `git archive
    # COMMIT pipeline filters operators outputs`): the funnel before and after, on one machine.
    TREE=${1:-.}; NAME=${2:-after}; TASKS=${4:-.bench/cands}
    # `python -m` puts the working folder first on sys.path: PYTHONSAFEPATH keeps TREE's code first
    [ "$TREE" != . ] && export PYTHONPATH=/tmp/site:$PWD/$TREE:$PWD PYTHONSAFEPATH=1
    rm -rf /tmp/funnel /tmp/funnel-cache
    start=$(date +%s.%N)
    timeout -s INT -k 15 "${3:-480}" python3 -m pipeline.cli validate "$TASKS" --out /tmp/funnel --device cuda \
        --cache-dir /tmp/funnel-cache --timeout-s 240 --max-memory-gb 24 2>&1 | grep -v "^WARNING" | tail -3
    echo "funnel $NAME wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
    python3 - /tmp/funnel/stats.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({k: s.get(k) for k in ("composed", "accepted", "rejected", "wall_time_s", "accepted_per_hour",
                                        "rejected_by_reason", "time_by_check_s", "gpu_gate_s")}))
PY
    mkdir -p "$OUT/$NAME" && cp /tmp/funnel/stats.json /tmp/funnel/data/*.parquet /tmp/funnel/rejects/*.parquet "$OUT/$NAME/"
    tail -c 100000 /tmp/funnel/workers.log > "$OUT/$NAME/workers.log"
    exit 0
fi
if [ "$STAGE" = throughput ]; then
    # One run of tests/benchmarks/bench_throughput.py: the first N of TASKS (.bench/cands: 512)
    # through `opsynth validate` with TREE's code (. for this checkout; .old for an earlier
    # commit: `mkdir .old && git archive 718d2c2 pipeline filters operators outputs | tar -x -C .old`)
    # and WORKERS workers (0: the command's default). One call each, on the same machine:
    #   throughput before .old 8; throughput after . 8; throughput after-default . 0
    NAME=${1:-after}; TREE=${2:-.}; WORKERS=${3:-0}; N=${4:-512}; TASKS=${5:-.bench/cands}
    tree=(); [ "$TREE" != . ] && tree=(--tree "$TREE")
    timeout -s INT -k 15 "${LIMIT_S:-560}" python3 -m tests.benchmarks.bench_throughput "$TASKS" --limit "$N" \
        --device cuda --workers "$WORKERS" --name "$NAME" --json "$OUT/$NAME.json" --records "$OUT/$NAME.records.jsonl" ${tree[@]+"${tree[@]}"} -- --max-memory-gb 24 \
        2>&1 | grep -v "^WARNING" | tail -12
    exit 0
fi
if [ "$STAGE" = cudastart ]; then
    timeout 200 python3 -m tests.benchmarks.bench_cuda_start --rounds 3 --concurrency 1 2 4 8 16 2>&1 | grep -v Warn | tail -8
    exit 0
fi
if [ "$STAGE" = compile ]; then
    timeout 560 python3 -m tests.benchmarks.bench_compile .bench/cands --candidates "${1:-64}" --parallel "${2:-16}" \
        --device cuda 2>&1 | grep -v "^WARNING" | tail -8
    exit 0
fi
if [ "$STAGE" = screenpool ]; then
    timeout 560 python3 -m tests.benchmarks.bench_screen_pool --jobs "${1:-512}" --torch-only 2>&1 | grep -v "^WARNING" | tail -3
    exit 0
fi
if [ "$STAGE" = warmup ]; then
    echo "== GPU zygote warm-up levels: the same candidates through the jailed pool per level"
    timeout 560 python3 -m tests.benchmarks.bench_gpu_warm_up --tasks .bench/cands --candidates "${1:-48}" \
        --workers "${2:-8}" 2>&1 | grep -v "^WARNING" | tail -16
    exit 0
fi
if [ "$STAGE" = shapes ]; then
    # After `funnel` in the same call: how real the accepted tasks' sizes are, and their eager ms.
    sources=(); for name in "$@"; do sources+=("$OUT/$name"); done
    python3 -m tests.benchmarks.bench_shapes --count 0 "${sources[@]}" .kb/KernelBench/level2 2>&1 | tail -8
    exit 0
fi
if [ "$STAGE" = proofs ]; then
    python3 -c "from filters.sandbox import landlock; print('landlock on this host:', landlock.status())"
    echo "== hostile and benign tasks through jailed CUDA workers"
    timeout 200 python3 -m tests.benchmarks.gpu_sandbox_check --device cuda --workers 4 --jobs 16 2>&1 | tail -30
    echo "== GPU determinism: colliding scatter_add, in the checks"
    timeout 120 python3 -m tests.benchmarks.gpu_determinism 2>&1 | tail -6
    echo "== worker pool vs fresh process per candidate, as root"
    timeout 300 python3 -m tests.benchmarks.bench_validate --device cuda --tasks .bench/cands \
        --candidates "${1:-24}" --workers 7 2>&1 | tail -8
    exit 0
fi
if [ "$STAGE" = scale ]; then
    # Issue 27's CPU-side goals: crawl cold <= 60 s on 16 cores, cached <= 5 s; dedupe 10,000 tasks <= 120 s on 2 cores.
    rm -rf /tmp/crawl-cold
    echo "== crawl torch + transformers, cold (a scratch cache), one process per core"
    began=$(date +%s.%N); python3 -m pipeline.cli crawl --cache-dir /tmp/crawl-cold --out /tmp/crawl-cold.parquet 2>&1 | tail -6
    echo "cold crawl: $(python3 -c "import time; print(round(time.time() - $began, 1))") s"
    began=$(date +%s.%N); python3 -m pipeline.cli crawl --cache-dir /tmp/crawl-cold --out /tmp/crawl-cold.parquet 2>&1 | tail -2
    echo "cached crawl: $(python3 -c "import time; print(round(time.time() - $began, 1))") s"
    echo "== opsynth dedupe: ${1:-10000} external tasks on 2 cores (composing them first takes minutes)"
    python3 -m tests.benchmarks.bench_dedupe "$PWD/.kb/KernelBench" --tasks "${1:-10000}" --workers 2 --cores 2 \
        --alone 300 --work /tmp/bench-dedupe 2>&1 | tail -12
    exit 0
fi
if [ "$STAGE" = disguise ]; then
    # bench_disguise with copies (and partial reference tasks) read at their own sizes on the GPU,
    # as a run's checks run them: KINDS of tests/disguise.py (default: batch_twice all_at_once);
    # LEVELS="2" for level 2 alone (half the copies, where a call has less time left)
    kinds=("$@"); [ ${#kinds[@]} -eq 0 ] && kinds=(batch_twice all_at_once)
    read -ra levels <<< "${LEVELS:-1 2}"
    timeout 540 python3 -m tests.benchmarks.bench_disguise "$PWD/.kb/KernelBench" --levels "${levels[@]}" --no-templates \
        --workers 8 --device cuda --cache-dir /tmp/disguise-cache --kinds "${kinds[@]}" 2>&1 | grep --line-buffered -v "Warning"  # each kind's line as it comes: a call cut by its limit keeps them (tail held them all back once)
    exit 0
fi
if [ "$STAGE" = gputrace ]; then
    # A task traced at its own sizes on the GPU its checks ran on (filters/checks/harness.py,
    # ChecksDevice): the cross-device attack it closes, and every KernelBench L1-2 task and
    # ROWS (a run's accepted rows, .bench/rows/ops6k-500.parquet) traced as a CPU run and as a GPU run.
    # ROWS "attack": the cross-device attack alone
    rows=(--rows "${1:-.bench/rows/ops6k-500.parquet}"); [ "${1:-}" = attack ] && rows=(--attack-only)
    [ "${1:-}" = none ] && rows=()  # KernelBench alone
    [ "${1:-}" = in-full ] && rows=(--in-full-only)  # the reference read in full alone
    timeout 540 python3 -m tests.benchmarks.gpu_trace_check "$PWD/.kb/KernelBench" "${rows[@]}" 2>&1 \
        | grep -v "Warning" | tail -60
    exit 0
fi
if [ "$STAGE" = crawl ]; then
    SEEDS=${1:-200}
    echo "== crawl torch + transformers (cold unless .device-cache was carried)"
    python3 -m pipeline.cli crawl --out /tmp/catalog.parquet 2>&1 | tail -8
    mkdir -p "$OUT/catalogs" && cp "$OPSYNTH_CACHE_DIR"/catalogs/*.parquet "$OUT/catalogs/"
    echo "== seed audit: $SEEDS transformers seeds on the GPU"
    python3 -m tests.benchmarks.seed_audit --sample "$SEEDS" --device cuda --out /tmp/audit 2>&1 | tail -30
    echo "== sandbox on CUDA workers"
    python3 -m tests.benchmarks.gpu_sandbox_check --device cuda 2>&1 | tail -40
    exit 0
fi
CANDIDATES=${1:-300}; WORKERS=${2:-0}; BENCH=${3:-24}  # WORKERS 0: as many as GPU memory allows
echo "== template composition in one process (where a run composes)"
timeout 90 python3 -m tests.benchmarks.bench_compose --candidates "$CANDIDATES" 2>&1 | tail -6
echo "== end-to-end run: $CANDIDATES candidates, $WORKERS workers"
rm -rf "$RUN"  # a run left by an earlier call on a warm machine would be resumed, not measured
start=$(date +%s.%N)
# Every 30 s: how many sandbox workers live, the GPU's memory and load, the run's newest log line.
( while sleep 30; do echo "-- $(date +%T) workers $(pgrep -fc filters.sandbox.worker)" \
    "gpu $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)" \
    "| $(tail -n1 "$RUN/run.log" 2>/dev/null | cut -c1-160)"; done ) & MONITOR=$!
# a run that overstays leaves time to copy its logs back
timeout -k 20 "${RUN_LIMIT_S:-420}" python3 -m pipeline.cli run --device cuda --num-samples 100000 \
    --max-candidates "$CANDIDATES" --workers "$WORKERS" --out "$RUN" --timeout-s 240 --max-memory-gb 24 2>&1 | tail -6
echo "run wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
kill $MONITOR
mkdir -p "$OUT/run" && cp "$RUN/stats.json" "$RUN/run.log" "$RUN"/data/*.parquet "$RUN"/rejects/*.parquet "$OUT/run/"
tail -c 200000 "$RUN/workers.log" > "$OUT/run/workers.log"
[ -f "$RUN/stats.json" ] || exit 1
python3 - "$RUN/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("composed", "accepted", "rejected", "wall_time_s", "rejected_by_reason", "time_by_check_s", "gpu_gate_s",
        "op_count_mix", "eager_ms_histogram")
print(json.dumps({k: s[k] for k in keys}))
print("accepted per hour", s["accepted_per_hour"])
PY
echo "== cross-check against torch.profiler"
timeout 120 python3 -m tests.benchmarks.gpu_crosscheck "$RUN" --tasks 20 2>&1 | tail -24
[ "$BENCH" -gt 0 ] || exit 0
pool_bench "$BENCH" 300
