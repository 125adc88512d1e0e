#!/usr/bin/env bash
# The GPU verification as one command, for a session that has a CUDA GPU (H100/H200 class):
#
#     bash benchmarks/gpu_check.sh            # report -> $OUT/ if OUT is set, else benchmarks/results/
#
# Runs `python -m attnbook.lab.check_gpu`: every mechanism in float32 / bfloat16 / float16 against the float64 CPU
# oracles (outputs and input gradients; eager, then under torch.compile), the no-host-sync check, the targets
# (B=4, H=16, D=64 bfloat16: linear and flow at N=65,536 vs SDPA and vs the copy-bandwidth memory floor; causal
# linear at N=16,384 vs causal SDPA) and the full-size benchmark, writing one JSON report. Budget: about 8
# minutes; compiled checks not started within BUDGET_S seconds are reported as "not run" (not failures), and a
# hard timeout stops everything at LIMIT_S (the report is rewritten after every section, so it survives).
# Installs nothing except `pip install -e .` when attnbook is not importable. Exit status: that of check_gpu
# (0 all checks passed, 1 a check failed, 2 no CUDA), or 124 on the hard timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
BUDGET_S="${BUDGET_S:-400}"
LIMIT_S="${LIMIT_S:-500}"

if ! "$PY" -c "import attnbook" 2>/dev/null; then
    "$PY" -m pip install --quiet --no-deps -e .
fi
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device visible to torch; nothing to check here")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true

GPU=$("$PY" -c "import re, torch; print(re.sub(r'[^A-Za-z0-9]+', '_', torch.cuda.get_device_name(0)).strip('_'))")
DIR="${OUT:-benchmarks/results}"
mkdir -p "$DIR"
REPORT="$DIR/gpu_check_${GPU}${REPORT_SUFFIX:-}.json"
echo "report: $REPORT (budget ${BUDGET_S}s for compiled checks, hard limit ${LIMIT_S}s)"
set +e
# CHECK_GPU_ARGS: more options of check_gpu, e.g. "--no-targets" for a run that only adds what an earlier one
# left out (then name another REPORT_SUFFIX so that the earlier report is kept)
# shellcheck disable=SC2086
timeout --signal=INT --kill-after=20 "$LIMIT_S" "$PY" -m attnbook.lab.check_gpu --out "$REPORT" --budget-s "$BUDGET_S" \
    ${CHECK_GPU_ARGS:-}
status=$?
set -e
echo "check_gpu exit status $status; report at $REPORT"
"$PY" - "$REPORT" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print("sections:", r.get("sections_done"), "passed:", r.get("passed"))
print("accuracy failed:", r.get("accuracy_failed"), "not run:", len(r.get("accuracy_not_run", [])))
print("sync failed:", r.get("sync_failed"))
t = r.get("targets", {})
for name in ("linear", "flow"):
    print(name, t.get("non_causal", {}).get(name))
print("causal:", {k: t.get("causal", {}).get(k) for k in ("best", "met_faster_than_sdpa_causal")})
PY
exit $status
