"""One look for every figure of the book: a colour per mechanism, the page's width, readable text.

:data:`COLOURS` are Okabe-Ito, safe for colour-blind readers. Every chapter's setup cell calls
:func:`use_book_style`, which sets :func:`book_style` (text of at least :data:`MIN_FONT` points) and checks every
PNG a figure is rendered to (:func:`check_figure`: at most :data:`PAGE_WIDTH` inches wide), stamping it with what
the browser tests read back from the built pages.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys

import matplotlib as mpl
import numpy as np
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.collections import Collection
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from .._checks import check_choice, check_instance

__all__ = ["COLOURS", "PAGE_WIDTH", "DPI", "MIN_FONT", "STAMP_FONT", "STAMP_WIDTH", "STAMP_FINGERPRINT", "colour"]
__all__ += ["line_style", "book_style", "shared_scale", "smallest_text", "check_figure", "figure_fingerprint"]
__all__ += ["use_book_style"]

# Okabe-Ito: blue, orange, bluish green, reddish purple, vermillion, sky blue, black; then a wine, greys for no
# attention, the definition written out and a reference, and a dark ochre for linear attention with sigmoid features
COLOURS: dict[str, str] = {"softmax": "#0072B2", "linear": "#E69F00", "flow": "#009E73", "mobile": "#CC79A7"}
COLOURS |= {"moh": "#D55E00", "decay": "#56B4E9", "gated": "#000000", "delta": "#882255", "none": "#999999"}
COLOURS |= {"softmax_literal": "#555555", "reference": "#999999", "linear_sigmoid": "#8C6D1F"}

# The website's text column is 704 CSS px wide at a 1300 px window (sphinx-book-theme 1.3: measured in
# chromium, tests/browser), and the theme never scales an image up. A figure PAGE_WIDTH inches wide rendered at
# DPI is 700 px: it is shown at its natural size, 100 %, and its MIN_FONT text at MIN_FONT * DPI / 72 = 12.5 px.
PAGE_WIDTH = 7.0  # inches
DPI = 100
MIN_FONT = 9  # points


def colour(name: str) -> str:
    """The colour of mechanism ``name`` (``"flow"``, ``"flow_causal"``, ...); a ValueError for an unknown one."""
    known = (*COLOURS, *(f"{n}_causal" for n in COLOURS))
    check_choice(name, "name", known, name="colour", why=" (a mechanism, causal or not)")
    return COLOURS[name.removesuffix("_causal")]


def line_style(name: str) -> dict:
    """``plot`` keyword arguments for mechanism ``name``: its colour; dashed for a causal form."""
    return {"color": colour(name), "linestyle": "--" if name.endswith("_causal") else "-"}


_RC = {"figure.dpi": DPI, "savefig.dpi": DPI, "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10}
_RC |= {"xtick.labelsize": MIN_FONT, "ytick.labelsize": MIN_FONT, "legend.fontsize": MIN_FONT, "figure.titlesize": 11}


@contextlib.contextmanager
def book_style():
    """A context in which figures get the book's text sizes and resolution (``with book_style(): ...``)."""
    with mpl.rc_context(_RC):
        yield


def shared_scale(*maps) -> dict:
    """``imshow`` keyword arguments (``vmin=0``, ``vmax``) that put every map on one colour scale."""
    top = max(float(np.nanmax(np.asarray(m, dtype=float))) for m in maps) if maps else 1.0
    return {"vmin": 0.0, "vmax": top if top > 0 else 1.0}


STAMP_FONT = "attnbook:min-font-pt"  # PNG text chunk: the smallest text of the figure, in points
STAMP_WIDTH = "attnbook:width-in"  # PNG text chunk: the figure's width in inches
STAMP_FINGERPRINT = "attnbook:fingerprint"  # PNG text chunk: what the figure shows (figure_fingerprint)


def smallest_text(fig: Figure) -> float | None:
    """The size in points of the smallest visible, non-empty text of ``fig`` (None when it has no text)."""
    shown = (t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip())
    sizes = [float(t.get_fontsize()) for t in shown if t.axes is None or t.axes.get_visible()]
    return min(sizes) if sizes else None


def check_figure(fig: Figure) -> list[str]:
    """Every way in which ``fig`` breaks the page's rules (at most :data:`PAGE_WIDTH` inches wide, or the browser
    shrinks it and its text; no text under :data:`MIN_FONT` points); an empty list when it fits."""
    check_instance(fig, "fig", Figure, name="check_figure", what="a matplotlib Figure")
    problems = []
    width = float(fig.get_figwidth())
    if width > PAGE_WIDTH * 1.001:
        problems.append(f"it is {width:.2f} in wide, wider than the page's {PAGE_WIDTH} in: stack or wrap panels")
    small = smallest_text(fig)
    if small is not None and small < MIN_FONT - 1e-6:
        texts = sorted(
            {repr(t.get_text()[:30]) for t in fig.findobj(Text) if t.get_visible() and t.get_fontsize() < MIN_FONT}
        )
        problems.append(f"text at {small:g} pt, below {MIN_FONT} pt: {', '.join(texts[:3])}")
    return problems


def _feed(digest, x) -> None:
    array = np.ma.getdata(np.asarray(x))
    if array.dtype == object:
        digest.update(repr(array.tolist()).encode())
    else:
        digest.update(str(array.shape).encode() + np.ascontiguousarray(array).tobytes())


def figure_fingerprint(fig: Figure) -> str:
    """A hash of what a drawn ``fig`` shows (its size, every visible artist's data and text), whatever the
    resolution: a figure shown twice (a static default and its slider's first frame) has one fingerprint."""
    digest = hashlib.sha1(str(tuple(np.round(fig.get_size_inches(), 3))).encode())
    for artist in fig.findobj(lambda a: a.get_visible()):
        digest.update(type(artist).__name__.encode())
        if isinstance(artist, Text):
            digest.update(artist.get_text().encode())
        elif isinstance(artist, Line2D):
            _feed(digest, artist.get_xydata())
        elif isinstance(artist, AxesImage):
            _feed(digest, artist.get_array())
        elif isinstance(artist, Collection):
            _feed(digest, artist.get_offsets())
            if artist.get_array() is not None:
                _feed(digest, artist.get_array())
            for path in artist.get_paths()[:1000]:
                _feed(digest, path.vertices)
        elif isinstance(artist, Patch) and artist.axes is not None:
            _feed(digest, artist.get_path().vertices)
            _feed(digest, artist.get_patch_transform().get_matrix())
    return digest.hexdigest()[:16]


def _is_png(filename, kwargs) -> bool:
    fmt = kwargs.get("format")
    if fmt is None and isinstance(filename, str) and "." in filename:
        fmt = filename.rsplit(".", 1)[-1]
    return str(mpl.rcParams["savefig.format"] if fmt is None else fmt).lower() == "png"


_ORIGINAL_PRINT_FIGURE = FigureCanvasBase.print_figure


@functools.wraps(_ORIGINAL_PRINT_FIGURE)
def _checked_print_figure(self, filename, *args, **kwargs):
    fig = self.figure
    if _is_png(filename, kwargs):
        fig.draw_without_rendering()  # tick labels get their text only when drawn
        for problem in check_figure(fig):
            label = fig.get_suptitle() or fig.get_label() or "a figure"
            # stderr, not warnings.warn: Python shows a warning once per place, and every figure counts
            print(f"attnbook figure check: {label!r}: {problem}", file=sys.stderr)
        small = smallest_text(fig)
        metadata = dict(kwargs.get("metadata") or {})
        metadata[STAMP_FONT] = "none" if small is None else f"{small:g}"
        metadata[STAMP_WIDTH] = f"{float(fig.get_figwidth()):g}"
        metadata[STAMP_FINGERPRINT] = figure_fingerprint(fig)
        kwargs["metadata"] = metadata
    return _ORIGINAL_PRINT_FIGURE(self, filename, *args, **kwargs)


def use_book_style() -> None:
    """Set the book's figure settings for this session and check and stamp every PNG rendered from now on.

    Every figure rendered to PNG (inline, ``savefig``, :func:`attnbook.viz.static.figure_to_png`) is checked
    with :func:`check_figure` (a line on stderr per problem) and carries :data:`STAMP_FONT`, :data:`STAMP_WIDTH`
    and :data:`STAMP_FINGERPRINT`, which the browser tests read from the built pages.
    """
    mpl.rcParams.update(_RC)
    FigureCanvasBase.print_figure = _checked_print_figure
