"""The GPU run's steps, one after another, and its one JSON report: what ``benchmarks/gpu_session.sh`` runs.

    python benchmarks/gpu_report.py --out _build/gpu/gpu_report.json --total-s 690     # on the GPU machine
    python benchmarks/gpu_report.py --dry --out /tmp/gpu/gpu_report.json              # a CPU rehearsal

The steps, in this order (a run cut short keeps the most important results):

1. ``chapters``: every chapter of ``_toc.yml`` at full size (``benchmarks/run_chapters.py --full``), ``JOBS`` at
   once, each with its own limit ``CHAPTER_S``; per chapter: passed or not, its time, the failing cell.
2. ``unit_cuda``: the unit tests' CUDA variants, ``pytest -k cuda`` over the test files that have them.
3. ``compile_cuda``: ``tests/test_compile.py`` with ``ATTNBOOK_COMPILE_DEVICE=cuda`` (its inductor cases on the
   GPU; ``ATTNBOOK_COMPILE_BACKEND=inductor`` is set too, for a version of the tests that reads it).
4. ``check_gpu``: ``python -m attnbook.lab.check_gpu`` (accuracy, syncs, targets; ``CHECK_GPU_ARGS``).
5. ``fla``: ``benchmarks/bench_fla.py``: causal linear attention against fla's chunked kernel and causal SDPA at
   N = 16,384 (B = 4, H = 16, D = 64, bfloat16), fla recorded as not installed when it is absent.

Each step runs with its own limit (``<NAME>_S`` in the environment overrides it), capped by what is left of
``--total-s`` from ``--started`` (the shell script's start, so that installing counts); past its limit a step
gets SIGINT (pytest still writes its summary), then SIGKILL 15 s later. A step that fails or runs out of time
does not stop the next; a step with under 10 s left is reported as not run. Without CUDA the CUDA steps are
reported as skipped. The report (``--out``) is written before the first step and rewritten whenever a step
starts or ends, atomically, so a run killed at any moment leaves valid JSON: the environment (GPU, driver,
torch, CUDA), each step's status (``passed``, ``failed``, ``timeout``, ``skipped``, ``not run``, ``running``,
``pending``), exit status, seconds, limit, command, the tail of its log (``logs/NAME.log`` beside the report)
and its summary: chapters (per chapter status, seconds, failing cell), tests (passed, failed, skipped, ...
counted from junit XML or, for a run cut short, from pytest's verbose lines), check_gpu's and bench_fla's own
reports, whole.

``--dry`` (or ``GPU_SESSION_DRY=1``) rehearses the whole thing on a CPU with tiny stand-ins written beside the
report: two one-cell chapters (one passes, one fails), a small test file for each pytest step, check_gpu at
``--device cpu --tiny``, and bench_fla (which records that there is no CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("chapters", "unit_cuda", "compile_cuda", "check_gpu", "fla")
LIMITS_S = {"chapters": 330, "unit_cuda": 90, "compile_cuda": 120, "check_gpu": 150, "fla": 75}
MIN_STEP_S = 10  # a step with less time than this left is not started
KILL_GRACE_S = 15


@dataclass
class Step:
    """One step: ``argv(limit_s)`` builds its command once its limit is known; ``summary()`` reads its results."""

    name: str
    limit_s: float
    argv: Callable[[float], list[str]]
    summary: Callable[[], dict] = lambda: {}
    env: dict[str, str] = field(default_factory=dict)
    needs_cuda: bool = True


def utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_report(path: Path, report: dict) -> None:
    """Atomically (a temporary file renamed over the report): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    report["updated_utc"] = utc()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(path)


def _run(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment(python: str) -> dict:
    """The machine as torch and nvidia-smi see it (asked in a child process: this one imports no torch)."""
    probe = (
        "import json, torch\n"
        "cuda = torch.cuda.is_available()\n"
        "p = torch.cuda.get_device_properties(0) if cuda else None\n"
        "try:\n    import attnbook; version = attnbook.__version__\nexcept Exception as e:\n    version = repr(e)\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': cuda,\n"
        " 'device': p.name if cuda else 'cpu', 'gpu_memory_bytes': p.total_memory if cuda else None,\n"
        " 'device_count': torch.cuda.device_count(), 'attnbook': version}))\n"
    )
    env: dict = {"python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count()}
    out = _run([python, "-c", probe], timeout=120)
    if out:
        try:
            env.update(json.loads(out.splitlines()[-1]))
        except ValueError:
            env["probe_output"] = out[-500:]
    else:
        env["probe_error"] = "torch did not import"
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"])
    env["nvidia_smi"] = smi
    if smi:
        env["driver"] = smi.splitlines()[0].split(",")[1].strip()
    env["commit"] = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    return env


# -- the summaries --------------------------------------------------------------------------------------------


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def chapters_summary(path: Path) -> dict:
    """Per chapter: status, seconds, how far it got and the failing cell (run_chapters.py's report)."""
    data = _load(path)
    if data is None:
        return {"error": f"no report at {path}"}
    keys = ("status", "seconds", "code_cells", "cells", "cell_reached", "cells_done", "failing_cell", "failing_cell_id")
    rows = {}
    for name, r in data.get("chapters", {}).items():
        rows[name] = {k: r.get(k) for k in keys}
        if r.get("error"):
            rows[name]["error"] = r["error"][-1500:]
    counts: dict[str, int] = {}
    for r in rows.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"jobs": data.get("jobs"), "limit_s": data.get("limit_s"), "wall_s": data.get("wall_s"),
            "counts": counts, "chapters": rows}  # fmt: skip


OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def pytest_summary(junit: Path, log: Path) -> dict:
    """Counts of a pytest run: from its junit XML, or from its ``-v`` lines when it was stopped before writing it."""
    if junit.exists():
        import xml.etree.ElementTree as ET

        try:
            root = ET.parse(junit).getroot()
            suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
            total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
            failed = [
                f"{c.get('classname')}::{c.get('name')}"
                for s in suites
                for c in s.iter("testcase")
                if c.find("failure") is not None or c.find("error") is not None
            ]
            return {
                "source": "junit",
                "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
                "failed": total["failures"],
                "errors": total["errors"],
                "skipped": total["skipped"],
                "failed_tests": failed[:100],
            }
        except ET.ParseError:
            pass
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")}
    names = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped", "XFAIL": "xfailed",
             "XPASS": "xpassed"}  # fmt: skip
    failed, seen = [], set()
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        match = OUTCOME.search(line)
        test = next((w for w in line.split() if "::" in w), None)
        if not match or test is None or (test, match.group(1)) in seen or line.startswith(("FAILED ", "ERROR ")):
            continue
        seen.add((test, match.group(1)))
        counts[names[match.group(1)]] += 1
        if match.group(1) in ("FAILED", "ERROR"):
            failed.append(test)
    return {"source": "verbose lines (no junit XML: the run was stopped)", **counts, "failed_tests": failed[:100]}


def json_summary(path: Path, keep: tuple[str, ...] = ()) -> dict:
    """A tool's own JSON report, whole (``report``), with a few of its keys lifted to the top."""
    data = _load(path)
    if data is None:
        return {"error": f"no report at {path}"}
    return {**{k: data.get(k) for k in keep}, "report": data}


# -- the plan -------------------------------------------------------------------------------------------------


def cuda_test_files() -> list[str]:
    """The unit-test files with CUDA variants (``support.DEVICES`` or a ``cuda`` mark), compile tests aside."""
    skip = {"test_compile.py", "test_notebooks.py"}
    return [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if p.name not in skip and re.search(r"DEVICES|cuda", p.read_text(errors="replace"))
    ]


def _limit(name: str) -> float:
    return float(os.environ.get(f"{name.upper()}_S", LIMITS_S[name]))


def _xdist(python: str) -> list[str]:
    return ["-n", os.environ.get("PYTEST_WORKERS", "4")] if _run([python, "-c", "import xdist"]) is not None else []


def plan(python: str, out: Path) -> list[Step]:
    """The GPU run's steps."""
    jobs = os.environ.get("JOBS", "4")
    chapter_s = os.environ.get("CHAPTER_S", "180")
    pytest = [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", *_xdist(python)]
    compile_env = {"ATTNBOOK_COMPILE_DEVICE": "cuda", "ATTNBOOK_COMPILE_BACKEND": "inductor"}
    check_args = os.environ.get("CHECK_GPU_ARGS", "--no-benchmark").split()
    return [
        Step("chapters", _limit("chapters"),
             lambda lim: [python, "benchmarks/run_chapters.py", "--full", "--jobs", jobs, "--limit-s", chapter_s,
                          "--deadline-s", str(int(lim - 10)), "--out", str(out / "chapters.json"),
                          "--executed", str(out / "executed")],
             lambda: chapters_summary(out / "chapters.json")),
        Step("unit_cuda", _limit("unit_cuda"),
             lambda lim: [*pytest, "-k", "cuda", "--junitxml", str(out / "unit_cuda.xml"), *cuda_test_files()],
             lambda: pytest_summary(out / "unit_cuda.xml", out / "logs" / "unit_cuda.log")),
        Step("compile_cuda", _limit("compile_cuda"),
             lambda lim: [*pytest, "--junitxml", str(out / "compile_cuda.xml"), "tests/test_compile.py"],
             lambda: pytest_summary(out / "compile_cuda.xml", out / "logs" / "compile_cuda.log"), env=compile_env),
        Step("check_gpu", _limit("check_gpu"),
             lambda lim: [python, "-m", "attnbook.lab.check_gpu", "--out", str(out / "check_gpu.json"),
                          "--budget-s", str(int(lim * 0.6)), *check_args],
             lambda: json_summary(out / "check_gpu.json", ("passed", "sections_done", "accuracy_failed",
                                                            "sync_failed", "total_seconds"))),
        Step("fla", _limit("fla"),
             lambda lim: [python, "benchmarks/bench_fla.py", "--out", str(out / "fla.json")],
             lambda: json_summary(out / "fla.json", ("fla", "ratios", "stages_done", "skipped"))),
    ]  # fmt: skip


def dry_plan(python: str, out: Path) -> list[Step]:
    """:func:`plan`'s steps with tiny stand-ins that run on a CPU in seconds (see the module docstring)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    dry = out / "dry"
    dry.mkdir(parents=True, exist_ok=True)
    cells = {"01_dry_pass": ["import os", "x = os.environ['ATTNBOOK_FAST']"], "02_dry_fail": ["a = 1", "1 / 0"]}
    books = []
    for name, sources in cells.items():
        nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), dry / f"{name}.ipynb")
        books.append(str(dry / f"{name}.ipynb"))
    (dry / "test_dry_unit.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('device', ['cpu', 'cuda'])\ndef test_runs(device):\n"
        "    if device == 'cuda':\n        pytest.skip('no CUDA device')\n"
    )
    (dry / "test_dry_compile.py").write_text("def test_compiles():\n    assert True\n")
    pytest = [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", "--rootdir", str(dry)]
    steps = plan(python, out)
    real = {s.name: s for s in steps}
    real["chapters"].argv = lambda lim: [
        python, "benchmarks/run_chapters.py", "--jobs", "2", "--limit-s", "60", "--deadline-s", str(int(lim - 5)),
        "--out", str(out / "chapters.json"), *books]  # fmt: skip
    unit = [*pytest, "--junitxml", str(out / "unit_cuda.xml"), str(dry / "test_dry_unit.py")]
    real["unit_cuda"].argv = lambda lim: unit
    real["compile_cuda"].argv = lambda lim: [
        *pytest, "--junitxml", str(out / "compile_cuda.xml"), str(dry / "test_dry_compile.py")]  # fmt: skip
    real["check_gpu"].argv = lambda lim: [
        python, "-m", "attnbook.lab.check_gpu", "--device", "cpu", "--tiny", "--no-benchmark", "--no-targets",
        "--compile-backend", "none", "--dtypes", "float32", "--out", str(out / "check_gpu.json")]  # fmt: skip
    for s in steps:
        s.needs_cuda = False
        s.limit_s = min(s.limit_s, 120)
    return steps


# -- the run --------------------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    kept = [line for line in text if "Kernel is running over TCP" not in line]
    return "\n".join(kept[-lines:])[-4000:]


def run_step(step: Step, limit: float, cwd: Path, log: Path) -> tuple[int | None, float, bool, list[str]]:
    """Run one step with a hard limit; returns (exit status, seconds, timed out, command)."""
    cmd = step.argv(limit)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg", **step.env)
    t0 = time.perf_counter()
    timed_out = False
    with open(log, "wb") as fh:
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        except OSError as e:
            fh.write(f"could not start: {e}\n".encode())
            return None, time.perf_counter() - t0, False, cmd
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, grace in ((signal.SIGINT, KILL_GRACE_S), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = proc.returncode
    return rc, time.perf_counter() - t0, timed_out, cmd


def run(steps: list[Step], report_path: Path, *, total_s: float, started: float, environment_info: dict,
        dry: bool = False, cwd: Path = ROOT) -> dict:  # fmt: skip
    """Run ``steps`` in order within ``total_s`` seconds from ``started`` (a ``time.time()``), the report
    rewritten before and after each step; returns the report."""
    report: dict = {
        "kind": "attnbook GPU session (benchmarks/gpu_session.sh)",
        "dry": dry,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "total_limit_s": total_s,
        "finished": False,
        "environment": environment_info,
        "order": [s.name for s in steps],
        "steps": {s.name: {"status": "pending", "limit_s": s.limit_s} for s in steps},
    }
    logs = report_path.parent / "logs"
    cuda = bool(environment_info.get("cuda_available"))

    def save() -> None:
        report["elapsed_s"] = time.time() - started
        write_report(report_path, report)

    save()
    for step in steps:
        entry = report["steps"][step.name]
        left = total_s - (time.time() - started)
        limit = min(step.limit_s, left - 5)
        if step.needs_cuda and not cuda:
            entry.update(status="skipped", reason="no CUDA device")
            save()
            continue
        if left - 5 < MIN_STEP_S:
            entry.update(status="not run", reason=f"the run's time was spent ({max(left, 0):.0f} s left)")
            save()
            continue
        entry.update(status="running", limit_s=limit, started_utc=utc())
        save()
        log = logs / f"{step.name}.log"
        print(f"== {step.name} (limit {limit:.0f} s) at +{time.time() - started:.0f} s", flush=True)
        rc, seconds, timed_out, cmd = run_step(step, limit, cwd, log)
        try:
            summary = step.summary()
        except Exception as e:  # a summary that cannot be read is reported, the run goes on
            summary = {"error": f"{type(e).__name__}: {e}"}
        status = "timeout" if timed_out else ("passed" if rc == 0 else "failed")
        entry.update(status=status, exit_status=rc, seconds=round(seconds, 2), command=cmd, log=str(log),
                     log_tail=_tail(log), summary=summary)  # fmt: skip
        print(f"== {step.name}: {status} (exit {rc}) after {seconds:.0f} s", flush=True)
        save()
    report["finished"] = True
    save()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out_dir = Path(os.environ.get("OUT", "_build/gpu"))
    parser.add_argument("--out", type=Path, default=out_dir / "gpu_report.json")
    parser.add_argument("--total-s", type=float, default=float(os.environ.get("TOTAL_S", 690)))
    parser.add_argument("--started", type=float, default=None, help="the run's start (seconds since the epoch)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the steps")
    parser.add_argument("--dry", action="store_true", default=os.environ.get("GPU_SESSION_DRY", "") == "1")
    parser.add_argument("--steps", default=os.environ.get("GPU_SESSION_STEPS") or None,
                        help="only these steps, comma-separated (in the fixed order; GPU_SESSION_STEPS)")  # fmt: skip
    args = parser.parse_args(argv)
    started = args.started or time.time()
    out = args.out.resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    steps = (dry_plan if args.dry else plan)(args.python, out)
    if args.steps:
        chosen = set(args.steps.split(","))
        steps = [s for s in steps if s.name in chosen]
    env = environment(args.python)
    env["free_disk_bytes"] = shutil.disk_usage(out).free
    report = run(steps, args.out.resolve(), total_s=args.total_s, started=started, environment_info=env, dry=args.dry)
    failed = [n for n, s in report["steps"].items() if s["status"] not in ("passed", "skipped")]
    statuses = ", ".join(f"{n} {s['status']}" for n, s in report["steps"].items())
    print(f"gpu_report: {args.out}: {statuses}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
