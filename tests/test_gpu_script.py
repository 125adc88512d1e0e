"""The GPU run as one script (``benchmarks/gpu_session.sh``, its runner ``benchmarks/gpu_report.py``) and the
chapter runner (``benchmarks/run_chapters.py``), every part that runs without a GPU: the order of the steps, their
limits, the one report rewritten after every step, its summaries, and that a step that fails or runs out of time
does not stop the next."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_report = _load("gpu_report")


def _has_kernel() -> bool:
    """nbclient and a python3 kernel (ipykernel): the chapters' runner needs both (absent from the wheel's venv)."""
    try:
        import nbclient  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager

        return "python3" in KernelSpecManager().find_kernel_specs()
    except Exception:
        return False


needs_kernel = pytest.mark.skipif(not _has_kernel(), reason="nbclient or a python3 kernel is not installed")


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@needs_kernel
def test_dry_session_writes_one_report_with_every_step_in_order(tmp_path):
    """GPU_SESSION_DRY=1: the one command runs the steps' CPU stand-ins in the fixed order, and its one report
    holds the environment and each step's status, time and summary (a failing chapter is reported with its cell).
    check_gpu's stand-in (``--device cpu --tiny``, 8 s; tests/test_check_gpu.py tests it) is left out here with
    GPU_SESSION_STEPS; its summary is tested below."""
    chosen = "chapters,unit_cuda,compile_cuda,fla"
    env = dict(os.environ, GPU_SESSION_DRY="1", PYTHON=sys.executable, OUT=str(tmp_path), TOTAL_S="300")
    env["GPU_SESSION_STEPS"] = chosen
    proc = subprocess.run(["bash", str(BENCH / "gpu_session.sh")], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the dry run's second chapter fails on purpose
    report = json.loads((tmp_path / "gpu_report.json").read_text())
    assert report["dry"] and report["finished"]
    assert list(gpu_report.ORDER) == ["chapters", "unit_cuda", "compile_cuda", "check_gpu", "fla"]
    assert report["order"] == chosen.split(",")
    assert list(report["steps"]) == report["order"]
    printed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("== ") and "(limit" in line]
    assert printed == report["order"]  # started in that order
    env_info = report["environment"]
    assert {"torch", "cuda", "cuda_available", "device", "nvidia_smi", "commit"} <= set(env_info)
    assert env_info["cuda_available"] is False and env_info["device"] == "cpu"
    steps = report["steps"]
    for name, step in steps.items():
        assert 10 <= step["limit_s"] <= gpu_report.LIMITS_S[name], (name, step["limit_s"])
        assert step["seconds"] <= step["limit_s"] + 20 and (tmp_path / "logs" / f"{name}.log").exists()
    assert report["elapsed_s"] <= report["total_limit_s"] == 300
    chapters = steps["chapters"]
    assert chapters["status"] == "failed" and chapters["exit_status"] == 1
    rows = chapters["summary"]["chapters"]
    assert rows["01_dry_pass.ipynb"]["status"] == "passed" and rows["01_dry_pass.ipynb"]["seconds"] > 0
    failed = rows["02_dry_fail.ipynb"]
    assert failed["status"] == "failed" and failed["failing_cell"] == 1 and failed["cells_done"] == 1
    assert "ZeroDivisionError" in failed["error"] and "\x1b[" not in failed["error"]
    unit = steps["unit_cuda"]["summary"]
    assert (unit["source"], unit["passed"], unit["skipped"], unit["failed"]) == ("junit", 1, 1, 0)
    assert steps["compile_cuda"]["status"] == "passed" and steps["compile_cuda"]["summary"]["passed"] == 1
    fla = steps["fla"]
    assert fla["status"] == "passed" and fla["summary"]["skipped"].startswith("no CUDA")
    assert (tmp_path / "logs.tar.gz").exists()


def test_a_failing_or_timed_out_step_does_not_stop_the_next(tmp_path):
    """Steps run in order, each within its own limit; a failure and a timeout are recorded and the next step
    still runs, and it sees the report already rewritten with the earlier steps' results."""
    path = tmp_path / "report.json"
    reads = (
        "import json, sys; r = json.load(open(sys.argv[1]))['steps']; "
        "assert r['fails']['status'] == 'failed' and r['fails']['exit_status'] == 3, r; "
        "assert r['hangs']['status'] == 'timeout', r; assert r['reads']['status'] == 'running', r"
    )
    Step = gpu_report.Step
    steps = [
        Step("fails", 30, lambda lim: _py("raise SystemExit(3)"), needs_cuda=False),
        Step("hangs", 1.5, lambda lim: _py("import time; time.sleep(60)"), needs_cuda=False),
        Step("reads", 30, lambda lim: [*_py(reads), str(path)], lambda: {"read": True}, needs_cuda=False),
        Step("cuda", 30, lambda lim: _py("pass")),
    ]
    t0 = time.time()
    report = gpu_report.run(steps, path, total_s=120, started=t0, environment_info={"cuda_available": False})
    assert time.time() - t0 < 30
    s = report["steps"]
    assert [s[n]["status"] for n in ("fails", "hangs", "reads", "cuda")] == ["failed", "timeout", "passed", "skipped"]
    assert s["hangs"]["limit_s"] == 1.5 and s["hangs"]["seconds"] < 1.5 + gpu_report.KILL_GRACE_S
    assert s["reads"]["summary"] == {"read": True} and s["cuda"]["reason"] == "no CUDA device"
    written = json.loads(path.read_text())  # the last rewrite is the final report
    assert written["finished"] and {n: v["status"] for n, v in written["steps"].items()} == {
        n: v["status"] for n, v in s.items()
    }
    # a run with too little time left starts nothing more and says so
    late = gpu_report.run(steps[:1], tmp_path / "late.json", total_s=14, started=time.time(), environment_info={})
    assert late["steps"]["fails"]["status"] == "not run" and "time" in late["steps"]["fails"]["reason"]


def test_the_report_is_valid_json_when_the_run_is_killed(tmp_path):
    """Killed in the middle of a step, the run leaves a valid report that says which step was running."""
    path = tmp_path / "report.json"
    driver = (
        "import sys, time; sys.path.insert(0, sys.argv[2]); import gpu_report as g\n"
        "steps = [g.Step('quick', 30, lambda lim: [sys.executable, '-c', 'pass'], needs_cuda=False),\n"
        "         g.Step('slow', 60, lambda lim: [sys.executable, '-c', 'import time; time.sleep(60)'],"
        " needs_cuda=False)]\n"
        "g.run(steps, g.Path(sys.argv[1]), total_s=120, started=time.time(), environment_info={})\n"
    )
    proc = subprocess.Popen([*_py(driver), str(path), str(BENCH)], start_new_session=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            report = json.loads(path.read_text()) if path.exists() else {}
            if report.get("steps", {}).get("slow", {}).get("status") == "running":
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    report = json.loads(path.read_text())
    assert report["finished"] is False
    assert report["steps"]["quick"]["status"] == "passed" and report["steps"]["slow"]["status"] == "running"


def test_without_cuda_the_real_plan_skips_every_cuda_step(tmp_path):
    """On a machine without CUDA the real plan starts nothing: every step is reported as skipped. The plan holds
    the five steps in order, with the chapters at full size under a per-chapter limit, test_compile on CUDA, and
    no trace of the removed bench_decoding.py."""
    steps = gpu_report.plan(sys.executable, tmp_path)
    assert [s.name for s in steps] == list(gpu_report.ORDER)
    commands = {s.name: s.argv(s.limit_s) for s in steps}
    chapters = commands["chapters"]
    assert "--full" in chapters and "--limit-s" in chapters
    assert int(chapters[chapters.index("--deadline-s") + 1]) < steps[0].limit_s
    assert "-k" in commands["unit_cuda"] and "cuda" in commands["unit_cuda"]
    assert any(f.endswith("test_flow.py") for f in commands["unit_cuda"])
    assert "tests/test_compile.py" in commands["compile_cuda"]
    assert steps[2].env == {"ATTNBOOK_COMPILE_DEVICE": "cuda", "ATTNBOOK_COMPILE_BACKEND": "inductor"}
    assert "attnbook.lab.check_gpu" in commands["check_gpu"] and commands["fla"][1] == "benchmarks/bench_fla.py"
    for path in (BENCH / "gpu_session.sh", BENCH / "gpu_report.py"):
        assert "bench_decoding" not in path.read_text()
    assert all(s.needs_cuda for s in steps)
    report = gpu_report.run(
        steps, tmp_path / "r.json", total_s=600, started=time.time(), environment_info={"cuda_available": False}
    )
    assert {s["status"] for s in report["steps"].values()} == {"skipped"} and report["finished"]
    assert not (tmp_path / "logs").exists()  # nothing was started


def test_tool_reports_are_kept_whole_with_their_headline(tmp_path):
    """check_gpu's and bench_fla's own JSON reports go into the one report whole, a few keys lifted; a missing or
    half-written one is reported as such."""
    check = {"kind": "attnbook.lab.check_gpu", "passed": False, "accuracy_failed": ["flow/bfloat16/eager"]}
    (tmp_path / "check.json").write_text(json.dumps({**check, "targets": {}}))
    summary = gpu_report.json_summary(tmp_path / "check.json", ("passed", "accuracy_failed"))
    assert summary["passed"] is False and summary["accuracy_failed"] == ["flow/bfloat16/eager"]
    assert summary["report"]["targets"] == {}
    (tmp_path / "half.json").write_text('{"kind": ')
    assert "error" in gpu_report.json_summary(tmp_path / "half.json")
    assert "error" in gpu_report.json_summary(tmp_path / "missing.json")


def test_pytest_counts_from_verbose_lines_when_the_run_was_stopped(tmp_path):
    """A pytest step stopped by its limit writes no junit XML: its counts come from the -v lines, each test once
    (the short summary's FAILED lines are not counted twice)."""
    log = tmp_path / "unit.log"
    log.write_text(
        "[gw0] [ 25%] PASSED tests/test_flow.py::test_a[cuda]\n"
        "tests/test_flow.py::test_b[cuda] FAILED                                  [ 50%]\n"
        "[gw1] [ 75%] SKIPPED tests/test_moh.py::test_c[cuda]\n"
        "tests/test_linear.py::test_d[cuda] XFAIL (ill-conditioned)\n"
        "FAILED tests/test_flow.py::test_b[cuda] - AssertionError\n"
        "KeyboardInterrupt\n"
    )
    counts = gpu_report.pytest_summary(tmp_path / "missing.xml", log)
    assert {k: counts[k] for k in ("passed", "failed", "skipped", "xfailed", "errors")} == {
        "passed": 1,
        "failed": 1,
        "skipped": 1,
        "xfailed": 1,
        "errors": 0,
    }
    assert counts["failed_tests"] == ["tests/test_flow.py::test_b[cuda]"] and counts["source"].startswith("verbose")


@needs_kernel
def test_run_chapters_in_the_background_records_how_far_a_chapter_got(tmp_path):
    """The CPU rehearsal's runner: --detach returns at once; the chapter runs at full size (ATTNBOOK_FAST=0) with
    its thread count, is stopped at its own limit, and the report says which cell it had reached of how many."""
    seen = tmp_path / "env.txt"
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    cells = [
        new_markdown_cell("a chapter"),
        new_code_cell(
            f"import os\nopen({str(seen)!r}, 'w').write(os.environ['ATTNBOOK_FAST'] + os.environ['OMP_NUM_THREADS'])"
        ),
        new_code_cell("import time; time.sleep(120)"),
        new_code_cell("never = True"),
    ]
    chapter = tmp_path / "01_slow.ipynb"
    nbformat.write(new_notebook(cells=cells), chapter)
    out, log = tmp_path / "rehearsal.json", tmp_path / "rehearsal.log"
    cmd = [sys.executable, str(BENCH / "run_chapters.py"), "--full", "--threads", "1", "--limit-s", "4"]
    cmd += ["--every-s", "0.5", "--out", str(out), "--detach", str(log), str(chapter)]
    t0 = time.time()
    started = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert started.returncode == 0 and "background" in started.stdout
    assert time.time() - t0 < 10  # it did not wait for the chapter
    record = {}
    while time.time() - t0 < 60:
        report = json.loads(out.read_text()) if out.exists() else {}
        record = report.get("chapters", {}).get(chapter.name, {})
        if record.get("status") not in (None, "running", "not started"):
            break
        time.sleep(0.3)
    assert record["status"] == "timeout", (record, log.read_text())
    assert record["cells"] == 4 and record["code_cells"] == 3
    assert record["cell_reached"] == 2 and record["failing_cell"] == 2 and record["cells_done"] == 2
    assert 4 <= record["seconds"] < 20 and "its limit" in record["error"]
    assert seen.read_text() == "01"  # ATTNBOOK_FAST=0 and one thread
    assert report["full"] and report["limit_s"] == 4 and report["threads"] == 1
