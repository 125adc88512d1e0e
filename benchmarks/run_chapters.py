"""Run the book's chapters top to bottom, each in its own kernel, and record how long each took and what failed.

    python benchmarks/run_chapters.py --full --out chapters.json             # every chapter, full size
    python benchmarks/run_chapters.py --full --jobs 7 --deadline-s 300 book/03_flow_attention.ipynb

Each chapter runs in a fresh Jupyter kernel (nbclient) from the ``book/`` folder, as ``make test`` runs them,
with ``ATTNBOOK_FAST=0`` under ``--full`` (the sizes a GPU gets; ``config.pick``) or ``1`` otherwise. ``--jobs``
runs several chapters at once (their times then include each other's load; the report says how many ran
together). A chapter still running at ``--deadline-s`` is stopped and reported as ``timeout`` with the cell it
had reached. The JSON report is rewritten as each chapter ends; ``--executed DIR`` keeps the executed notebooks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(path: Path, result: Path, executed: Path | None, cell_timeout: int) -> None:
    """In this process: execute one notebook and write {status, seconds, cells, error} to ``result``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    record: dict = {"chapter": path.name, "cells": len(nb.cells), "status": "running", "cell_reached": None}

    def write() -> None:
        result.write_text(json.dumps(record, indent=1))

    resources = {"metadata": {"path": str(path.parent)}}
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", resources=resources)
    t0 = time.perf_counter()

    def on_cell_start(cell, cell_index):  # noqa: ARG001  (nbclient's hook signature)
        record["cell_reached"] = cell_index
        record["seconds"] = time.perf_counter() - t0
        write()

    client.on_cell_start = on_cell_start
    try:
        client.execute()
        record["status"] = "passed"
    except CellExecutionError as e:
        record["status"] = "failed"
        record["error"] = str(e)[-4000:]
    except Exception as e:  # a kernel that died, a timeout of one cell: reported, not raised
        record["status"] = "error"
        record["error"] = f"{type(e).__name__}: {e}"[-4000:]
    record["seconds"] = time.perf_counter() - t0
    if executed is not None:
        executed.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, executed / path.name)
    write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: book/[0-9]*.ipynb)")
    parser.add_argument("--full", action="store_true", help="full sizes (ATTNBOOK_FAST=0); else small (=1)")
    parser.add_argument("--jobs", type=int, default=1, help="chapters run at once (default 1)")
    parser.add_argument("--deadline-s", type=float, default=3600.0, help="stop every chapter after this long")
    parser.add_argument("--cell-timeout", type=int, default=1800)
    parser.add_argument("--out", type=Path, default=Path("chapters.json"))
    parser.add_argument("--executed", type=Path, default=None, help="keep the executed notebooks here")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: the child process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args.result, args.executed, args.cell_timeout)
        return 0

    chapters = [p.resolve() for p in args.chapters] or sorted((ROOT / "book").glob("[0-9]*.ipynb"))
    env = dict(os.environ, ATTNBOOK_FAST="0" if args.full else "1", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp(prefix="chapters-"))  # each child's record, read back as it ends
    report: dict = {"full": args.full, "jobs": args.jobs, "deadline_s": args.deadline_s, "chapters": {}}
    t0 = time.perf_counter()
    waiting, running = list(chapters), {}

    def collect(path: Path, status: str | None = None) -> None:
        part = work / (path.stem + ".json")
        record = json.loads(part.read_text()) if part.exists() else {"chapter": path.name, "cell_reached": None}
        if status:
            record["status"] = status
        report["chapters"][path.name] = record
        args.out.write_text(json.dumps(report, indent=1))
        print(f"{path.name}: {record.get('status')} in {record.get('seconds', 0):.1f} s", flush=True)

    while waiting or running:
        while waiting and len(running) < args.jobs:
            path = waiting.pop(0)
            cmd = [sys.executable, __file__, "--one", str(path), "--result", str(work / (path.stem + ".json"))]
            cmd += ["--cell-timeout", str(args.cell_timeout)]
            if args.executed:
                cmd += ["--executed", str(args.executed)]
            running[path] = subprocess.Popen(cmd, env=env, cwd=path.parent, start_new_session=True)
        for path, proc in list(running.items()):
            if proc.poll() is not None:
                collect(path)
                del running[path]
        if time.perf_counter() - t0 > args.deadline_s:
            for path, proc in running.items():
                os.killpg(proc.pid, signal.SIGKILL)  # the child and its kernel
                proc.wait()
                collect(path, "timeout")
            for path in waiting:
                report["chapters"][path.name] = {"chapter": path.name, "status": "not started"}
            running, waiting = {}, []
        time.sleep(0.5)
    report["wall_s"] = time.perf_counter() - t0
    args.out.write_text(json.dumps(report, indent=1))
    return 0 if all(r.get("status") == "passed" for r in report["chapters"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
