#!/usr/bin/env bash
# The GPU issue's run, in two phases that fit a 15-minute lease on one CUDA machine (H100/H200 class):
#
#     bash benchmarks/gpu_session.sh timing   # the GPU report, generation per token, fla: alone on the GPU
#     bash benchmarks/gpu_session.sh book     # chapters 1-7 at full size, CUDA unit tests, compile on CUDA
#
# Results go to $OUT (else _build/gpu/). A later lease can run what an earlier one left out: the limits and the
# chapters are variables (CHECK_GPU_S, BUDGET_S, CHECK_GPU_ARGS, REPORT_SUFFIX, DECODING_S, FLA_S, CHAPTERS). Every step has its own time limit and a failing step does not stop the
# next; the phase's limit is PHASE_S seconds (timing: 400, book: 330 by default), after which what is left is
# reported as not run. Python packages the machine lacks (nbclient, ipykernel, ipywidgets, flash-linear-attention)
# are installed from wheels in .whl/ when that folder exists (the device machine has no package index).
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE="${1:?usage: gpu_session.sh timing|book}"
PY="${PYTHON:-python3}"
DIR="${OUT:-_build/gpu}"
mkdir -p "$DIR" _build/gpu-logs
START=$(date +%s)
case "$PHASE" in
timing) PHASE_S="${PHASE_S:-400}" ;;
book) PHASE_S="${PHASE_S:-330}" ;;
*) echo "gpu_session.sh: unknown phase '$PHASE' (timing or book)" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

left() { echo $((PHASE_S - ($(date +%s) - START))); }
step() {  # step NAME SECONDS COMMAND...: run with a limit (capped by what is left), log to _build/gpu-logs/NAME.log
    local name=$1 limit=$2
    shift 2
    local rest
    rest=$(left)
    ((rest < limit)) && limit=$rest
    if ((limit < 10)); then
        echo "== $name: not run (phase time spent)" | tee -a "$DIR/steps.txt"
        return
    fi
    echo "== $name (limit ${limit}s) at +$(($(date +%s) - START))s"
    local t0=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" "$@" >"_build/gpu-logs/$name.log" 2>&1
    local rc=$?
    tail -n 25 "_build/gpu-logs/$name.log"
    echo "== $name: exit $rc after $(($(date +%s) - t0))s" | tee -a "$DIR/steps.txt"
}

if [ -d .whl ] && ! "$PY" -c "import nbclient, ipykernel, ipywidgets" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import attnbook" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . || export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
fi
"$PY" -c "import torch, attnbook; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0), 'attnbook', attnbook.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
GPU=$("$PY" -c "import re, torch; print(re.sub(r'[^A-Za-z0-9]+', '_', torch.cuda.get_device_name(0)).strip('_'))")

if [ "$PHASE" = timing ]; then
    check_s="${CHECK_GPU_S:-200}"
    step check_gpu "$check_s" env OUT="$DIR" BUDGET_S="${BUDGET_S:-150}" LIMIT_S=$((check_s - 15)) \
        bash benchmarks/gpu_check.sh
    step decoding "${DECODING_S:-130}" "$PY" benchmarks/bench_decoding.py --device cuda --compiled --repeats 5 --force \
        --positions 16 64 256 1024 4096 8192 --out "$DIR/decoding_cuda.json"
    if [ ! -f "$DIR/decoding_cuda.json" ]; then  # the compiled (CUDA graph) step failed: the rest without it
        step decoding_eager 80 "$PY" benchmarks/bench_decoding.py --device cuda --repeats 5 --force \
            --positions 16 256 1024 8192 --out "$DIR/decoding_cuda.json"
    fi
    step fla "${FLA_S:-60}" "$PY" benchmarks/bench_fla.py --out "$DIR/fla_${GPU}.json"
else
    # Chapters at full size, all at once (their times include each other's load), beside the unit tests.
    deadline=$(($(left) - 30))
    # shellcheck disable=SC2086
    "$PY" benchmarks/run_chapters.py --full --jobs 7 --deadline-s "$deadline" --out "$DIR/chapters_${GPU}.json" \
        --executed _build/gpu-executed ${CHAPTERS:-} >_build/gpu-logs/chapters.log 2>&1 &
    chapters=$!
    step unit_cuda 120 "$PY" -m pytest -q -n 4 -p no:cacheprovider -k cuda tests/test_flow.py tests/test_linear.py \
        tests/test_mobile.py tests/test_moh.py tests/test_softmax.py tests/test_check_gpu.py
    step compile_cuda $(($(left) - 40)) env ATTNBOOK_COMPILE_DEVICE=cuda ATTNBOOK_COMPILE_BACKEND=inductor \
        "$PY" -m pytest -q -n 4 -p no:cacheprovider tests/test_compile.py
    wait $chapters
    echo "== chapters: exit $? at +$(($(date +%s) - START))s" | tee -a "$DIR/steps.txt"
    cat _build/gpu-logs/chapters.log | grep -v "WARNING | Kernel is running" | tail -n 20
    tar -czf "$DIR/executed_chapters.tar.gz" -C _build gpu-executed 2>/dev/null || true
fi
tar -czf "$DIR/logs_${PHASE}.tar.gz" -C _build gpu-logs
echo "phase $PHASE done after $(($(date +%s) - START))s"
ls -la "$DIR"
