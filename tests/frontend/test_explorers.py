"""Every control of every explorer, operated in a real front-end the way a student operates it.

Each chapter with an explorer (3: flow, 4: flow in head mode, 5: head routing) is opened in JupyterLab 4
(ipywidgets 8) and in the classic notebook 6.5 with ipywidgets 7.7.1 (Colab's); all its cells are run with
the front-end's own Run All; then every slider is moved by keyboard and by dragging, every checkbox ticked,
every toggle and button clicked. After each action the figure must change (other PNG bytes in the page), or
the control must be greyed out with its reason printed, and nothing may go wrong in the page, the browser
console, the kernel or the server's log (see harness.Explorer.act). Notebook 7 gets the keyboard: the arrow,
Home and End keys on every slider of chapter 3.
"""

from __future__ import annotations

import json
import time

import pytest
from harness import CHAPTERS, NotebookPage

# browser: kept out of `make unit` (-m "not browser"); frontend: run by `make frontend`
pytestmark = [pytest.mark.browser, pytest.mark.frontend]
FRONTENDS = {"lab": "lab_server", "classic": "classic_server"}  # front-end -> its server fixture
MODES = ("Flow: tokens compete", "Mobile: heads compete")
FLOW_SLIDERS = ("tokens", "similarity", "magnitude", "heads", "seed", "head shown")


def _open(page, server, frontend: str, chapter: int) -> NotebookPage:
    nb = NotebookPage(page, server, frontend, CHAPTERS[chapter].name)
    started = time.monotonic()
    nb.open()
    opened = time.monotonic()
    nb.run_all()
    ran = time.monotonic() - opened
    print(f"{frontend} chapter {chapter}: opened in {opened - started:.0f} s, Run All to idle {ran:.0f} s")
    nb.assert_clean("Run All")
    return nb


def _labels_fit(ex) -> None:
    """No text of a toggle or button is cut off (the mode toggle showed "tokens compete (…" before)."""
    cut = ex.root.evaluate(
        "r => [...r.querySelectorAll('button')].filter(b => b.scrollWidth > b.clientWidth + 1)"
        ".map(b => b.textContent.trim())"
    )
    assert not cut, f"labels cut off: {cut}"


def _every_slider(ex, labels, *, drag: bool = True) -> None:
    """Each slider one step right by keyboard, then dragged back by about one and a half steps."""
    for label in labels:
        if ex.is_disabled("slider", label):
            ex.act("slider", label, "key:ArrowRight")  # records the printed reason
            continue
        before = ex.slider_value(label)
        ex.act("slider", label, "key:ArrowRight")
        assert ex.slider_value(label) != before, f"ArrowRight did not move {label!r}"
        if drag:
            ex.act("slider", label, "drag:-1.6")


def _flow_scenario(ex, *, start_mode: str) -> None:
    """Chapters 3 and 4: the flow-allocation explorer, starting in Flow (3) or Mobile (4) mode."""
    _labels_fit(ex)
    if start_mode == MODES[1]:  # head mode: never causal, and the explorer says so
        ex.expect_disabled("checkbox", "causal", because="no causal form")
        ex.act("checkbox", "causal", "click")
    _every_slider(ex, FLOW_SLIDERS)
    for box in ("competition", "allocation"):
        ex.act("checkbox", box, "click")
        ex.act("checkbox", box, "click")
    if start_mode == MODES[1]:  # chapter 4: the same explorer as chapter 3's, which checks the rest
        ex.act("toggle", MODES[0], "click")
        ex.expect_enabled("checkbox", "causal")
        ex.act("checkbox", "causal", "click")
        ex.act("toggle", MODES[1], "click")
        ex.expect_disabled("checkbox", "causal", because="no causal form")
        assert not ex.checkbox("causal").is_checked(), "head mode is never causal: the box must not stay ticked"
        return
    # "head shown" follows "heads": End reaches the new maximum (it stopped at the first one, 3)
    ex.act("slider", "heads", "key:End", expect_value="6")
    ex.act("slider", "head shown", "key:End", expect_value="5")
    ex.act("slider", "head shown", "key:Home", expect_value="0")
    # the mode toggle, and causal restored honestly around head mode
    ex.expect_enabled("checkbox", "causal")
    ex.act("checkbox", "causal", "click")
    assert ex.checkbox("causal").is_checked()
    ex.act("toggle", MODES[1], "click")
    ex.expect_disabled("checkbox", "causal", because="no causal form")
    assert not ex.checkbox("causal").is_checked(), "head mode is never causal: the box must not stay ticked"
    ex.act("toggle", MODES[0], "click")
    ex.expect_enabled("checkbox", "causal")
    assert ex.checkbox("causal").is_checked(), "back in Flow mode the student's causal choice comes back"
    ex.act("checkbox", "causal", "click")
    # at similarity 1 magnitude, heads, seed, head shown and competition cannot act: greyed out, with the reason
    ex.act("slider", "similarity", "key:End", expect_value="1.00")
    for label in ("magnitude", "heads", "seed", "head shown"):
        ex.expect_disabled("slider", label, because="every token is the same vector")
        ex.act("slider", label, "key:ArrowLeft")
    ex.expect_disabled("checkbox", "competition", because="every token is the same vector")
    ex.act("slider", "similarity", "key:ArrowLeft", expect_value="0.95")
    for label in ("magnitude", "heads", "seed", "head shown"):
        ex.expect_enabled("slider", label)


def _routing_scenario(ex) -> None:
    """Chapter 5: the head-routing explorer."""
    _labels_fit(ex)
    ex.expect_disabled("button", "reset router", because="untrained")
    ex.act("button", "reset router", "click")
    ex.act("button", "train router", "click")
    ex.expect_enabled("button", "reset router")
    ex.act("button", "reset router", "click")
    _every_slider(ex, ("heads H", "shared h_s", "routed h_r", "router temperature", "seed", "steps per click"))
    # shared's range follows H, h_r's follows H - h_s; End reaches the new maximum
    ex.act("slider", "heads H", "key:End", expect_value="12")
    ex.act("slider", "shared h_s", "key:End", expect_value="12")
    for kind, label in (("slider", "routed h_r"), ("slider", "steps per click"), ("button", "train router")):
        ex.expect_disabled(kind, label, because="all 12 heads are shared")
        ex.act(kind, label, "click" if kind == "button" else "key:ArrowRight")
    ex.act("slider", "shared h_s", "key:Home", expect_value="0")
    ex.act("slider", "routed h_r", "key:End", expect_value="12")
    ex.act("slider", "routed h_r", "key:Home", expect_value="1")
    ex.act("button", "train router", "click")
    ex.act("button", "train router", "click")


@pytest.mark.parametrize("chapter", sorted(CHAPTERS), ids=lambda c: f"chapter{c}")
@pytest.mark.parametrize(
    "frontend", [pytest.param(f, marks=pytest.mark.xdist_group(f)) for f in FRONTENDS], ids=list(FRONTENDS)
)
def test_every_control_of_the_explorer(request, page, frontend, chapter, action_log):
    server = request.getfixturevalue(FRONTENDS[frontend])
    nb = _open(page, server, frontend, chapter)
    ex = nb.explorer()
    ex.screenshot(f"{frontend}-chapter{chapter}-start")
    try:
        if chapter == 5:
            _routing_scenario(ex)
        else:
            _flow_scenario(ex, start_mode=MODES[1] if chapter == 4 else MODES[0])
    finally:
        action_log.extend(ex.log)
        ex.screenshot(f"{frontend}-chapter{chapter}-end")
    nb.assert_clean("the last action")
    assert nb.kernel.messages > 0


NOTEBOOK7_EXPLORER = "from attnbook.viz import flow as flow_viz\n\nflow_viz.flow_explorer()\n"


@pytest.mark.xdist_group("lab")  # Notebook 7 is served by the JupyterLab environment's server
def test_notebook7_keyboard(page, lab_server, action_log):
    """Notebook 7: arrow, Home and End keys move every slider of the flow explorer (its command-mode shortcuts
    used to swallow them). Chapter 3's explorer cell alone: Run All of the chapters is covered above."""
    cell = {"cell_type": "code", "execution_count": None, "id": "explorer", "metadata": {}, "outputs": []}
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nb_json = {
        "cells": [{**cell, "source": NOTEBOOK7_EXPLORER}],
        "metadata": kernel,
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (lab_server.root / "notebook7" / "flow_explorer.ipynb").write_text(json.dumps(nb_json))
    nb = NotebookPage(page, lab_server, "notebook7", "flow_explorer.ipynb")
    nb.open()
    nb.run_all()
    nb.assert_clean("Run All")
    ex = nb.explorer()
    try:
        _every_slider(ex, FLOW_SLIDERS, drag=False)
        ex.act("slider", "heads", "key:End", expect_value="6")
        ex.act("slider", "head shown", "key:End", expect_value="5")
        ex.act("slider", "tokens", "key:Home", expect_value="2")
        ex.act("slider", "magnitude", "key:ArrowLeft")
    finally:
        action_log.extend(ex.log)
        ex.screenshot("notebook7-flow-explorer-end")
    nb.assert_clean("the last action")
