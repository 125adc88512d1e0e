"""What every recording script under benchmarks/ shares: the quiet-machine rule and the stamp of a recording.

The machine is shared. A script records only while the 1-minute load average is at most half the cores (other
work would set the pace, not the code measured); ``--force`` records anyway and the recording says so. Every
recording stores the load average before and after it and the commit it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: One neighbour of a recording "beside busy processes": torch's matrix products on two threads, until it is
#: stopped, its parent has gone or ``seconds`` have passed.
BUSY_JOB = """
import os, time, torch
torch.set_num_threads(2)
end = time.time() + {seconds}
a = torch.randn(1024, 1024)
while time.time() < end and os.getppid() == {parent}:
    a = torch.tanh(a @ a.T / 1024)
"""


def quiet_or_exit(script: str, force: bool) -> list[float]:
    """The load average now; exits with a message when it is above half the cores, unless ``force``."""
    load = list(os.getloadavg())
    limit = (os.cpu_count() or 1) / 2
    if load[0] > limit:
        message = (
            f"{script}: the 1-minute load average is {load[0]:.2f}, above half the cores ({limit:g}); the "
            "machine is shared, and other work would set the pace of what is measured"
        )
        if not force:
            sys.exit(message + ". Wait for a quiet moment, or pass --force to record anyway (it is noted).")
        print(message + "; recording anyway (--force).", file=sys.stderr)
    return load


@contextlib.contextmanager
def beside_busy(jobs: int = 2, seconds: float = 3600) -> Iterator[str]:
    """Runs ``jobs`` copies of :data:`BUSY_JOB` while the block runs, and stops them after it (also on an error).
    Yields the condition in words, for the recording. The quiet rule is checked before, never during: the jobs are
    the condition measured, not a neighbour's work."""
    job = BUSY_JOB.format(seconds=seconds, parent=os.getpid())  # the parent's pid, read before the job starts
    busy = [subprocess.Popen([sys.executable, "-c", job], stdout=subprocess.DEVNULL) for _ in range(jobs)]
    try:
        time.sleep(2.0)  # the jobs have imported torch and are multiplying
        yield f"beside {jobs} processes started by the script, each running torch matrix products on 2 threads"
    finally:
        for job in busy:
            job.kill()
            job.wait()


def commit() -> str | None:
    """The checkout's commit, with "+changes" when tracked files differ from it (None outside git). Recordings
    under benchmarks/results/ do not count: a script that records several studies writes the first before it
    stamps the next."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"]
        dirty = subprocess.run(status, cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def stamp(environment: dict, load_before: list[float], force: bool) -> dict:
    """``environment`` with the load before and after, the cores it is judged against, whether the quiet rule was
    overridden, and the commit."""
    environment["cores"] = os.cpu_count()
    environment["load_average_before"] = load_before
    environment["load_average_after"] = list(os.getloadavg())
    environment["forced"] = bool(force and load_before[0] > (os.cpu_count() or 1) / 2)
    environment["commit"] = commit()
    return environment


def add_burst_argument(parser: argparse.ArgumentParser) -> None:
    """``--burst``, the tokens of one generation timed per call (bench_generation.py)."""
    parser.add_argument(
        "--burst",
        type=int,
        default=64,
        help="tokens per timed call (default 64: between bursts of 8 to 16 tokens the other models had evicted "
        "this one's weights from the caches, and a step measured up to 1.4x slower than in a generation that runs on)",
    )
