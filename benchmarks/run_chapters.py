"""Run the book's chapters top to bottom, each in its own kernel, and record how far each got and how long it took.

    python benchmarks/run_chapters.py --full --out chapters.json                   # every chapter of _toc.yml
    python benchmarks/run_chapters.py --full --jobs 4 --limit-s 180 --deadline-s 300 book/03_flow_attention.ipynb
    python benchmarks/run_chapters.py --full --jobs 2 --limit-s 1200 --out benchmarks/results/rehearsal_cpu.json \\
        --detach _build/rehearsal.log                   # the CPU rehearsal at full size, in the background

Each chapter runs in a fresh Jupyter kernel (nbclient) from the ``book/`` folder, as ``make test`` runs them,
with ``ATTNBOOK_FAST=0`` under ``--full`` (the full sizes, ``config.pick``) or ``1`` otherwise. The chapters are
those of ``_toc.yml`` unless named. ``--jobs`` runs several at once (their times then include each other's
load; the report says how many ran together); each gets ``--threads`` CPU threads (default: the cores shared
out, so that two chapters on two cores do not stall each other's operators). A chapter still running after
``--limit-s`` seconds of its own, or at ``--deadline-s`` from the start, is stopped and reported as ``timeout``.

The JSON report is rewritten whenever a chapter starts or ends and every ``--every-s`` seconds while they run,
so that it says at any moment, per chapter: ``status`` (``running``, ``passed``, ``failed``, ``error``,
``timeout``, ``not started``), ``seconds`` (wall time), ``code_cells`` and ``cells`` (the notebook's), the cell
being run (``cell_reached``, its ``cell_id``), the cells completed (``cells_done``), the failing cell
(``failing_cell``, ``failing_cell_id``) and the ``error``. ``--executed DIR`` keeps the executed notebooks.
``--detach LOG`` starts the same run in a new session in the background, its output in LOG, and returns.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of a traceback


def toc_chapters(toc: Path = ROOT / "_toc.yml") -> list[Path]:
    """The chapters that ``_toc.yml`` lists (``book/NN_name`` entries), in order."""
    found = re.findall(r"^\s*-\s*file:\s*(book/\d+_[A-Za-z0-9_]+)\s*$", toc.read_text(), flags=re.M)
    return [toc.parent / f"{f}.ipynb" for f in found]


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def run_one(path: Path, result: Path, executed: Path | None, cell_timeout: int) -> None:
    """In this process: execute one notebook, keeping ``result`` up to date (see the module docstring)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    record: dict = {
        "chapter": path.name,
        "cells": len(nb.cells),
        "code_cells": len(code),
        "status": "running",
        "cell_reached": None,
        "cell_id": None,
        "cells_done": 0,
        "code_cells_done": 0,
        "seconds": 0.0,
    }
    t0 = time.perf_counter()

    def write() -> None:
        record["seconds"] = time.perf_counter() - t0
        _write_json(result, record)

    resources = {"metadata": {"path": str(path.parent)}}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", resources=resources)

    def on_cell_start(cell, cell_index):  # nbclient's hook signature
        record["cell_reached"] = cell_index
        record["cell_id"] = cell.get("id")
        write()

    def on_cell_executed(cell, cell_index, execute_reply):  # noqa: ARG001
        if (execute_reply or {}).get("content", {}).get("status", "ok") != "ok":
            return  # the failing cell: reported below
        record["cells_done"] = cell_index + 1
        record["code_cells_done"] = sum(1 for i in code if i <= cell_index)
        write()

    client.on_cell_start = on_cell_start
    client.on_cell_executed = on_cell_executed
    write()
    try:
        client.execute()
        record["status"] = "passed"
        record["cells_done"] = len(nb.cells)
        record["code_cells_done"] = len(code)
    except CellExecutionError as e:
        record["status"] = "failed"
        record["error"] = ANSI.sub("", str(e))[-4000:]
        record["failing_cell"], record["failing_cell_id"] = record["cell_reached"], record["cell_id"]
    except Exception as e:  # a kernel that died, a timeout of one cell: reported, not raised
        record["status"] = "error"
        record["error"] = ANSI.sub("", f"{type(e).__name__}: {e}")[-4000:]
        record["failing_cell"], record["failing_cell_id"] = record["cell_reached"], record["cell_id"]
    if executed is not None:
        executed.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, executed / path.name)
    write()


def _stop(proc: subprocess.Popen) -> None:
    """The child and its kernel (one process group), at once: its record stays as the cell it had reached."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the chapters of _toc.yml)")
    parser.add_argument("--toc", type=Path, default=ROOT / "_toc.yml")
    parser.add_argument("--full", action="store_true", help="full sizes (ATTNBOOK_FAST=0); else small (=1)")
    parser.add_argument("--jobs", type=int, default=1, help="chapters run at once (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per chapter (default cores / jobs)")
    parser.add_argument("--limit-s", type=float, default=3600.0, help="stop a chapter after this long (its own)")
    parser.add_argument("--deadline-s", type=float, default=None, help="stop everything this long after the start")
    parser.add_argument("--cell-timeout", type=int, default=None, help="seconds a cell may take (default: --limit-s)")
    parser.add_argument("--every-s", type=float, default=15.0, help="rewrite the report this often while running")
    parser.add_argument("--out", type=Path, default=Path("chapters.json"))
    parser.add_argument("--executed", type=Path, default=None, help="keep the executed notebooks here")
    parser.add_argument("--detach", type=Path, default=None, metavar="LOG", help="run in the background, log to LOG")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: the child process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cell_timeout = int(args.cell_timeout or args.limit_s)
    if args.one:
        run_one(args.one, args.result, args.executed, cell_timeout)
        return 0
    if args.detach:
        argv = [a for a in (sys.argv[1:] if argv is None else argv)]
        i = argv.index("--detach")
        rest = argv[:i] + argv[i + 2 :]
        args.detach.parent.mkdir(parents=True, exist_ok=True)
        with open(args.detach, "ab") as log:
            proc = subprocess.Popen([sys.executable, __file__, *rest], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=os.getcwd())  # fmt: skip
        print(f"run_chapters: running in the background as process {proc.pid}; log {args.detach}, report {args.out}")
        return 0

    chapters = [p.resolve() for p in args.chapters] or toc_chapters(args.toc)
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    env = dict(os.environ, ATTNBOOK_FAST="0" if args.full else "1", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    work = Path(tempfile.mkdtemp(prefix="chapters-"))  # each child's record, read back as it goes
    report: dict = {
        "full": args.full,
        "jobs": args.jobs,
        "threads": threads,
        "limit_s": args.limit_s,
        "deadline_s": args.deadline_s,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "chapters": {p.name: {"chapter": p.name, "status": "not started"} for p in chapters},
    }
    t0 = time.perf_counter()
    waiting: list[Path] = list(chapters)
    running: dict[Path, tuple[subprocess.Popen, float]] = {}

    def part(path: Path) -> Path:
        return work / (path.stem + ".json")

    def read(path: Path) -> dict:
        try:
            return json.loads(part(path).read_text())
        except (OSError, ValueError):  # not written yet
            return {"chapter": path.name, "status": "running", "cell_reached": None}

    def write() -> None:
        for path, (_, started) in running.items():
            record = read(path)
            record["seconds"] = time.perf_counter() - started
            report["chapters"][path.name] = record
        report["wall_s"] = time.perf_counter() - t0
        report["running"] = [p.name for p in running]
        _write_json(args.out, report)

    def collect(path: Path, started: float, status: str | None = None) -> None:
        record = read(path)
        if status:
            record["status"] = status
            record["seconds"] = time.perf_counter() - started
            if status == "timeout":
                record["failing_cell"], record["failing_cell_id"] = record.get("cell_reached"), record.get("cell_id")
                why = "its limit" if time.perf_counter() - started > args.limit_s else "the run's deadline"
                cell = record.get("cell_reached")
                record["error"] = f"stopped after {record['seconds']:.0f} s ({why}) in cell {cell}"
        elif record.get("status") == "running":  # the child ended without a final record: it crashed
            record["status"] = "error"
            record.setdefault("error", "the chapter's process ended without a result")
        report["chapters"][path.name] = record
        print(f"{path.name}: {record.get('status')} in {record.get('seconds', 0):.1f} s", flush=True)

    last_write = 0.0
    while waiting or running:
        while waiting and len(running) < args.jobs:
            path = waiting.pop(0)
            cmd = [sys.executable, __file__, "--one", str(path), "--result", str(part(path))]
            cmd += ["--cell-timeout", str(cell_timeout)]
            if args.executed:
                cmd += ["--executed", str(args.executed.resolve())]
            proc = subprocess.Popen(cmd, env=env, cwd=path.parent, start_new_session=True)
            running[path] = (proc, time.perf_counter())
            report["chapters"][path.name] = {"chapter": path.name, "status": "running"}
            write()
        now = time.perf_counter()
        past_deadline = args.deadline_s is not None and now - t0 > args.deadline_s
        for path, (proc, started) in list(running.items()):
            if proc.poll() is not None:
                collect(path, started)
            elif past_deadline or now - started > args.limit_s:
                _stop(proc)
                collect(path, started, "timeout")
            else:
                continue
            del running[path]
            write()
        if past_deadline:
            for path in waiting:
                report["chapters"][path.name] = {"chapter": path.name, "status": "not started"}
            waiting = []
        if now - last_write > args.every_s:
            write()
            last_write = now
        time.sleep(0.2)
    write()
    return 0 if all(r.get("status") == "passed" for r in report["chapters"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
