#!/usr/bin/env bash
# The GPU run as one command, for one CUDA machine (H100/H200 class) and at most 12 minutes, installs included:
#
#     bash benchmarks/gpu_session.sh                      # report: $OUT/gpu_report.json (OUT defaults to _build/gpu)
#     GPU_SESSION_DRY=1 bash benchmarks/gpu_session.sh    # a CPU rehearsal with tiny stand-in steps
#
# In this order, so that a run cut short keeps the most important results: every chapter of _toc.yml at full size
# (JOBS at once, CHAPTER_S seconds each), the CUDA unit tests, tests/test_compile.py on CUDA under inductor,
# check_gpu, and fla's chunked kernel against attnbook's causal form and causal SDPA (bench_fla.py). Each step has
# its own limit (CHAPTERS_S, UNIT_CUDA_S, COMPILE_CUDA_S, CHECK_GPU_S, FLA_S) within TOTAL_S seconds (default 690)
# from this script's start; a step that fails or runs out of time does not stop the next. benchmarks/gpu_report.py
# runs the steps and rewrites the one JSON report after every step (its docstring lists what it holds).
#
# The device machine has no package index: Python packages it lacks (nbclient, ipykernel, ipywidgets, pytest-xdist,
# flash-linear-attention, ...) are installed from wheels in .whl/ when that folder exists; attnbook itself from
# this checkout (editable, or through PYTHONPATH when that fails).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s.%N)
PY="${PYTHON:-python3}"
export OUT="${OUT:-_build/gpu}"
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [ "${GPU_SESSION_DRY:-0}" != 1 ]; then
    if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import nbclient, ipykernel, ipywidgets, xdist, fla" 2>/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    if ! "$PY" -c "import attnbook" 2>/dev/null; then
        "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>/dev/null ||
            export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # the chapters' kernels: the kernel spec of this Python
    "$PY" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
fi

# GPU_SESSION_DRY=1 is read there too (tiny stand-in steps)
"$PY" benchmarks/gpu_report.py --out "$OUT/gpu_report.json" --started "$START" --total-s "${TOTAL_S:-690}" --python "$PY"
status=$?
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs 2>/dev/null || true
exit $status
