"""The repository's recorded runs (``benchmarks/results/``), read by the chapters beside their live runs.

A chapter runs an experiment live at a small size and reads the larger recording beside it. The recordings live
in the repository, not in the package: after ``pip install attnbook`` there are none, and :func:`load` returns
None so that a chapter can say so instead of failing.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from .._checks import check_instance

__all__ = ["root", "load"]


def root(start: pathlib.Path | None = None) -> pathlib.Path | None:
    """The folder that holds ``benchmarks/results``: ``start`` (default the working directory) or the nearest of
    its parents that has one (a chapter runs in ``book/`` or in a copy under ``_executed/book/``), else None."""
    here = pathlib.Path.cwd() if start is None else pathlib.Path(start)
    for folder in (here, *here.resolve().parents):
        if (folder / "benchmarks" / "results").is_dir():
            return folder
    return None


def load(name: str, *, start: pathlib.Path | None = None) -> Any:
    """The recording ``benchmarks/results/<name>`` (a path such as ``"claims/heads_cpu_recorded.json"``), parsed
    from JSON; None where the repository is absent or has no such file.

    Example:
        >>> from attnbook.lab import recordings
        >>> heads = recordings.load("claims/heads_cpu_recorded.json")
        >>> heads is None or heads["study"] == "heads"
        True
    """
    check_instance(name, "name", str, name="recordings.load", what="a path under benchmarks/results, a str")
    folder = root(start)
    path = None if folder is None else folder / "benchmarks" / "results" / name
    return json.loads(path.read_text()) if path is not None and path.is_file() else None
