"""One look for every figure of the book: a colour per mechanism, the page's width, readable text.

* :data:`COLOURS` -- one colour per mechanism of :mod:`attnbook.mechanisms` (Okabe-Ito, safe for colour-blind
  readers), used by every plot; :func:`colour` and :func:`line_style` also accept benchmark names such as
  ``"linear_causal"`` (same colour, dashed) and ``"softmax_literal"``.
* :data:`PAGE_WIDTH` -- the width in inches a figure is drawn for, the book page's text column at
  :data:`DPI`; multi-panel figures stack or wrap rather than shrink below it.
* :func:`book_style` -- matplotlib settings (rcParams) with the smallest text at :data:`MIN_FONT` points.
* :func:`shared_scale` -- one colour scale for maps that are meant to be compared.
"""

from __future__ import annotations

import contextlib

import matplotlib as mpl
import numpy as np

__all__ = ["COLOURS", "PAGE_WIDTH", "DPI", "MIN_FONT", "colour", "line_style", "book_style", "shared_scale"]

COLOURS: dict[str, str] = {
    "softmax": "#0072B2",  # blue
    "linear": "#E69F00",  # orange
    "flow": "#009E73",  # bluish green
    "mobile": "#CC79A7",  # reddish purple
    "moh": "#D55E00",  # vermillion
    "softmax_literal": "#555555",  # the definition written out: grey
    "reference": "#999999",
}

PAGE_WIDTH = 7.5  # inches: the text column of the book's pages at DPI
DPI = 100
MIN_FONT = 9  # points


def _base(name: str) -> str:
    return name.removesuffix("_causal")


def colour(name: str) -> str:
    """The colour of mechanism ``name`` (``"flow"``, ``"flow_causal"``, ...); a ValueError for an unknown one."""
    try:
        return COLOURS[name] if name in COLOURS else COLOURS[_base(name)]
    except KeyError:
        raise ValueError(f"colour: unknown mechanism {name!r}; known: {sorted(COLOURS)}") from None


def line_style(name: str) -> dict:
    """``plot`` keyword arguments for mechanism ``name``: its colour; dashed for a causal form."""
    return {"color": colour(name), "linestyle": "--" if name.endswith("_causal") else "-"}


_RC = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": MIN_FONT,
    "ytick.labelsize": MIN_FONT,
    "legend.fontsize": MIN_FONT,
    "figure.titlesize": 11,
}


@contextlib.contextmanager
def book_style():
    """A context in which figures get the book's text sizes and resolution (``with book_style(): ...``)."""
    with mpl.rc_context(_RC):
        yield


def shared_scale(*maps) -> dict:
    """``imshow`` keyword arguments (``vmin=0``, ``vmax``) that put every map on one colour scale."""
    top = max(float(np.nanmax(np.asarray(m, dtype=float))) for m in maps) if maps else 1.0
    return {"vmin": 0.0, "vmax": top if top > 0 else 1.0}
