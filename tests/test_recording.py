"""Every recording script under benchmarks/ follows the quiet-machine rule: it refuses to record while the load
average is above half the cores, unless forced (and the recording says so), and it stores the load before and
after, and the commit."""

import importlib.util
import pathlib
import sys

import pytest
import torch

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import recording  # noqa: E402
from support import paths  # noqa: E402

SCRIPTS = [
    "bench_claims.py",
    "bench_generation.py",
    "bench_training.py",
    "bench_lm_training.py",
    "bench_compile.py",
    "bench_annex.py",
    "bench_recall.py",
    "bench_all.py",
]


def test_refuses_a_busy_machine_unless_forced(monkeypatch, capsys):
    monkeypatch.setattr(recording.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(recording.os, "getloadavg", lambda: (1.5, 1.0, 0.5))
    with pytest.raises(SystemExit, match=r"load average is 1.50, above half the cores \(1\).*pass --force"):
        recording.quiet_or_exit("bench_x", force=False)
    assert recording.quiet_or_exit("bench_x", force=True) == [1.5, 1.0, 0.5]
    assert "recording anyway (--force)" in capsys.readouterr().err
    environment = recording.stamp({}, [1.5, 1.0, 0.5], force=True)
    assert environment["forced"] is True and environment["load_average_before"] == [1.5, 1.0, 0.5]
    monkeypatch.setattr(recording.os, "getloadavg", lambda: (0.9, 1.0, 0.5))
    assert recording.quiet_or_exit("bench_x", force=False) == [0.9, 1.0, 0.5]
    environment = recording.stamp({}, [0.9, 1.0, 0.5], force=False)
    assert environment["forced"] is False and environment["load_average_after"] == [0.9, 1.0, 0.5]
    assert "commit" in environment and environment["cores"] == 2  # what the load is judged against


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_recording_script_checks_the_load_and_stamps_its_recording(script):
    text = (BENCHMARKS / script).read_text()
    assert "quiet_or_exit(" in text and "stamp(" in text and '"--force"' in text


def test_the_commit_ignores_recordings_but_not_code(tmp_path):
    """A script that records several studies writes the first recording before it stamps the next: a changed
    file under benchmarks/results/ is not a change of the code, any other tracked file is."""
    import shutil
    import subprocess

    bench = tmp_path / "benchmarks"
    (bench / "results").mkdir(parents=True)
    shutil.copy(pathlib.Path(recording.__file__), bench / "recording.py")
    (bench / "results" / "study.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    spec = importlib.util.spec_from_file_location("recording_copy", bench / "recording.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    head = copy.commit()
    assert head is not None and len(head) == 40
    (bench / "results" / "study.json").write_text('{"runs": []}\n')
    assert copy.commit() == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert copy.commit() == head + "+changes"


def test_bench_recall_replaces_one_mechanism_and_notes_where_its_runs_came_from(tmp_path, monkeypatch):
    """``--replace linear`` records linear attention again at the recording's own settings, puts its runs and
    results in place of the old ones, leaves every other mechanism's as they were, and notes the new runs' commit
    and loads; a name the recording lacks is refused."""
    import json

    from attnbook.lab import recall

    spec = importlib.util.spec_from_file_location("bench_recall", BENCHMARKS / "bench_recall.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    settings = dict(pairs=(8,), widths=(32,), lrs=(0.01,), seeds=1, steps=2)
    old = recall.study(mechanism_names=("softmax", "linear"), workers=1, **settings)
    old["environment"] = {"commit": "old"}
    for r in old["runs"] + old["results"]:
        r["marker"] = "old"
    out = tmp_path / "recall.json"
    out.write_text(json.dumps(old))
    monkeypatch.setattr(
        sys, "argv", ["bench_recall.py", "--replace", "linear", "--workers", "1", "--force", "--out", str(out)]
    )
    bench.main()
    new = json.loads(out.read_text())
    for key in ("runs", "results"):
        assert {(r["mechanism"], r.get("marker")) for r in new[key]} == {("softmax", "old"), ("linear", None)}
    assert new["config"] == json.loads(json.dumps(old["config"])) and new["environment"]["commit"] == "old"
    replaced = new["environment"]["replaced"]["linear"]
    assert set(replaced) == {"commit", "date_utc", "load_average_before", "load_average_after", "wall_seconds"}
    monkeypatch.setattr(sys, "argv", ["bench_recall.py", "--replace", "delta", "--force", "--out", str(out)])
    with pytest.raises(SystemExit, match=r"--replace \['delta'\]: not in"):
        bench.main()


def test_beside_busy_runs_its_jobs_during_the_block_and_stops_them_after(monkeypatch):
    """``bench_all.py --beside-busy`` and ``bench_annex.py`` measure beside processes they start themselves: the
    jobs run while the block runs and are stopped after it, also when it raises."""
    started = []
    popen = recording.subprocess.Popen

    def spy(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(recording.subprocess, "Popen", spy)
    monkeypatch.setattr(recording, "BUSY_JOB", "import time\ntime.sleep({seconds})  # {parent}\n")  # start, stop
    with recording.beside_busy(jobs=2, seconds=60) as condition:
        assert len(started) == 2 and all(job.poll() is None for job in started)
    assert "beside 2 processes" in condition and all(job.poll() is not None for job in started)
    started.clear()
    with pytest.raises(KeyError), recording.beside_busy(jobs=1, seconds=60):
        raise KeyError("a failing benchmark")
    assert len(started) == 1 and started[0].poll() is not None


def test_a_busy_job_stops_when_the_script_that_started_it_has_gone():
    """A recording killed before it could stop its jobs leaves no process multiplying matrices for an hour: the
    script below dies inside ``beside_busy`` (os._exit skips its cleanup) after printing its job's pid."""
    import os
    import subprocess
    import time

    parent = (
        f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import os, recording\n"
        "with recording.beside_busy(jobs=1, seconds=600):\n"
        "    print(open(f'/proc/{os.getpid()}/task/{os.getpid()}/children').read(), flush=True); os._exit(0)\n"
    )
    pid = int(subprocess.run([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, check=True).stdout)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = (pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        time.sleep(0.5)
    os.kill(pid, 9)
    pytest.fail(f"the busy job {pid} still ran 60 s after its parent had gone")


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench_annex.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location("bench_annex", BENCHMARKS / "bench_annex.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_annex_reports_the_spread_of_the_same_code_timed_twice(bench):
    """Where the annex did not run, annex and plain time the same code: their spread per condition and thread
    count is the bench's noise, taken from those cells only (where the annex ran is a comparison) and printed."""

    def cell(ratio, runs):
        return {"annex": 1.0, "plain": ratio, "plain/annex": ratio, "annex runs": runs}

    recording = {
        "results": {
            "a": {"size": "s", "cells": {"quiet/1": cell(0.99, False), "beside_busy/1": cell(1.4, False)}},
            "b": {"size": "s", "cells": {"quiet/1": cell(1.02, False), "beside_busy/1": cell(2.5, True)}},
        },
        "tiles_ms": {},
    }
    for r in recording["results"].values():
        r["worst"] = {}
    assert bench.same_code_spread(recording) == {"quiet/1": (0.99, 1.02), "beside_busy/1": (1.4, 1.4)}
    assert (
        "same code timed twice (plain / annex where the annex did not run): quiet/1 0.99 to 1.02, "
        "beside_busy/1 1.4 to 1.4" in bench.markdown(recording)
    )


def test_bench_annex_sees_a_call_enter_the_annex(bench):
    """The "annex runs" column: a call that reaches the annex (the causal tiles on one thread, without autograd)
    counts, a call of the plain form does not, and the entry point comes back."""
    import attnbook
    from attnbook import config
    from attnbook._fast import causal

    entry = causal.forward
    q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
    with paths(plain=False), torch.no_grad():  # the annex on, one thread
        assert bench.annex_runs(lambda: attnbook.linear_attention(q, k, v, is_causal=True))
        assert not bench.annex_runs(lambda: attnbook.linear_attention(q, k, v))
        assert not bench.annex_runs(lambda: attnbook.mobile_attention(q, k, v))
        config.set_plain(True)
        assert not bench.annex_runs(lambda: attnbook.linear_attention(q, k, v, is_causal=True))
    assert causal.forward is entry


def test_bench_annex_records_the_allocator_state_each_case_met(bench):
    """Each cell holds the time of a new 32 MiB tensor and of refilling one (the allocator's state), and the table
    shows it; an older recording without it still prints."""
    probe = bench.allocator_probe(repeats=2)
    assert set(probe) == {"new", "refill"} and all(ms > 0 for ms in probe.values()), probe

    def recording(**extra):
        cell = {"annex": 1.0, "plain": 1.0, "plain/annex": 1.0, "annex runs": False, **extra}
        return {"results": {"a": {"size": "s", "cells": {"quiet/1": cell}, "worst": {}}}, "tiles_ms": {}}

    table = bench.markdown(recording(allocator={"new": 14.9, "refill": 1.5}))
    assert "| new / refill 32 MiB |" in table and "| 14.9 / 1.5 |" in table, table
    assert "new / refill" not in bench.markdown(recording())
