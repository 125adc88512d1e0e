"""The suite's own helpers can fail: a deliberately broken explorer in a real front-end.

A small notebook (written here, never part of the book) builds a box of controls that draw into an ``Image``:
a good slider and a good dropdown, a slider whose callback raises, a slider wired to nothing, and a button
whose callback raises. ``Explorer.act`` must pass on the good ones and fail, saying what went wrong, on each
broken one -- otherwise a green suite would prove nothing.
"""

from __future__ import annotations

import json

import pytest
from harness import NotebookPage

pytestmark = [pytest.mark.browser, pytest.mark.frontend]
BROKEN_EXPLORER = """\
import ipywidgets as w
import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

from attnbook.viz.static import figure_to_png


def png(text):
    fig = Figure(figsize=(2, 1))
    fig.text(0.5, 0.5, str(text), ha="center")
    return figure_to_png(fig, dpi=40)


image = w.Image(format="png", value=png("start"))


def draw(change):
    image.value = png(change["new"])


def boom(change):
    raise RuntimeError("deliberately broken control")


good = w.IntSlider(description="good", max=10, continuous_update=False)
good.observe(draw, names="value")
raising = w.IntSlider(description="raising", max=10, continuous_update=False)
raising.observe(boom, names="value")
unwired = w.IntSlider(description="unwired", max=10, continuous_update=False)
choice = w.Dropdown(description="choice", options=["a", "b", "c"])
choice.observe(draw, names="value")
button = w.Button(description="raising button")
button.on_click(lambda _: 1 / 0)
w.VBox([good, raising, unwired, choice, button, image])
"""


def _write_notebook(path):
    cell = {"cell_type": "code", "execution_count": None, "id": "broken", "metadata": {}, "outputs": []}
    cell["source"] = BROKEN_EXPLORER
    nb = {
        "cells": [cell],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


@pytest.mark.parametrize("frontend", [pytest.param(f, marks=pytest.mark.xdist_group(f)) for f in ("lab", "classic")])
def test_act_fails_on_a_raising_or_unwired_control(request, page, frontend):
    server = request.getfixturevalue({"lab": "lab_server", "classic": "classic_server"}[frontend])
    _write_notebook(server.root / frontend / "broken_explorer.ipynb")
    nb = NotebookPage(page, server, frontend, "broken_explorer.ipynb")
    nb.open()
    nb.run_all()
    nb.assert_clean("Run All")
    ex = nb.explorer()

    ex.act("slider", "good", "key:ArrowRight", expect_value="1")  # the helpers pass a working control
    ex.act("slider", "good", "drag:2")
    ex.act("dropdown", "choice", "select:b")

    with pytest.raises(AssertionError) as raised:
        ex.act("slider", "raising", "key:ArrowRight")
    message = str(raised.value)
    print(f"\n[{frontend}] a raising slider callback:\n{message}")
    assert "deliberately broken control" in message or "RuntimeError" in message

    nb.forget_problems()
    with pytest.raises(AssertionError, match="did not change the figure") as raised:
        ex.act("slider", "unwired", "key:ArrowRight")
    print(f"\n[{frontend}] a slider wired to nothing:\n{raised.value}")

    nb.forget_problems()
    with pytest.raises(AssertionError, match="ZeroDivisionError") as raised:
        ex.act("button", "raising button", "click")
    print(f"\n[{frontend}] a raising button callback:\n{raised.value}")

    nb.forget_problems()
    with pytest.raises(AssertionError, match="does not say why"):  # disabled without a printed reason
        page.evaluate("() => document.querySelector('.widget-dropdown select').disabled = true")
        ex.act("dropdown", "choice", "select:c")
