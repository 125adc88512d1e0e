"""The explorers in real front-ends: Jupyter servers from the environments `make frontend` builds, and
Debian's chromium driven by Playwright (as the website's browser tests)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from harness import CHAPTERS, ROOT, SCREENSHOTS, JupyterServer

ENVS = ROOT / "_build" / "frontend-envs"
PARTS = ROOT / "_build" / "frontend-report"
_ACTIONS = []  # every Action of the session, for the report


def pytest_configure(config):
    config.addinivalue_line("markers", "frontend: drives a real Jupyter front-end (make frontend)")


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1300, "height": 900}}


def _server(request, tmp_path_factory, env: str, app: str) -> JupyterServer:
    path = ENVS / env
    if not (path / "bin" / "python").exists():
        pytest.fail(f"no front-end environment {path}: run `make frontend` (tests/frontend/envs.py) first")
    server = JupyterServer(path, app, tmp_path_factory.mktemp(f"jupyter-{env}"), list(CHAPTERS.values()))
    request.addfinalizer(server.stop)  # registered before start: a server that half-started is stopped too
    server.start()
    return server


@pytest.fixture(scope="session")
def lab_server(request, tmp_path_factory):
    """JupyterLab 4 + Notebook 7 with ipywidgets 8 (serves /lab and /notebooks)."""
    return _server(request, tmp_path_factory, "lab", "lab")


@pytest.fixture(scope="session")
def classic_server(request, tmp_path_factory):
    """The classic notebook 6.5 with ipywidgets 7.7.1 (Colab's)."""
    return _server(request, tmp_path_factory, "classic", "notebook")


@pytest.fixture(scope="session")
def action_log(request):
    """Every action of this process's tests; written to _build/frontend-report/ when the session ends."""
    yield _ACTIONS
    if _ACTIONS:
        worker = getattr(request.config, "workerinput", {}).get("workerid", "main")
        PARTS.mkdir(parents=True, exist_ok=True)
        (PARTS / f"{worker}.json").write_text(json.dumps([dataclasses.asdict(a) for a in _ACTIONS]))


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        shutil.rmtree(PARTS, ignore_errors=True)


def pytest_sessionfinish(session):
    """The table front-end x chapter x control of every worker, in _build/frontend-report/report.md."""
    if hasattr(session.config, "workerinput") or not PARTS.exists():
        return
    rows = [row for part in sorted(PARTS.glob("*.json")) for row in json.loads(part.read_text())]
    order = {"lab": 0, "notebook7": 1, "classic": 2}
    rows.sort(key=lambda r: (order.get(r["frontend"], 9), r["chapter"]))
    lines = ["| front-end | chapter | control | action | result | s |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['frontend']} | {r['chapter']} | {r['control']} | {r['action']} | {r['result']} | {r['seconds']:.1f} |"
        for r in rows
    ]
    (PARTS / "report.md").write_text("\n".join(lines) + f"\n\nScreenshots: {SCREENSHOTS}\n")
