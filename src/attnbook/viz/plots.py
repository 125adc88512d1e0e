"""Static matplotlib figures used across the book, and the helpers the chapters' figures share."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .._checks import check_count, check_dims, check_number, check_sequence
from .style import COLOURS, MIN_FONT, PAGE_WIDTH, book_style, line_style, shared_scale

__all__ = ["attention_heatmap", "scaling_plot", "scaling_panels", "cost_figure", "curves_and_maps"]

_GUIDE_STYLES = (":", "-.", (0, (6, 2, 1, 2, 1, 2)))
# ``legend`` keywords for a frameless legend just above the axes, as wide as they are, filled column by column:
# it can neither cover a bar nor widen the page
ABOVE = dict(loc="lower left", bbox_to_anchor=(0.0, 1.0, 1.0, 0.1), mode="expand", frameon=False, borderaxespad=0.2)
ON_TOP = dict(loc="upper center", frameon=False, bbox_to_anchor=(0.5, 1.0))  # ``fig.legend``: at the figure's top
RIGHT = dict(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)  # right of the axes


def to_numpy(x) -> np.ndarray:
    """``x`` (a tensor, an array or numbers) as a float64 numpy array on the CPU."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def field(obj, name: str):
    """``obj[name]`` of a mapping (a recording), ``obj.name`` of anything else (a live result)."""
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def page_figure(draw):
    """Decorator of a chapter's figure: drawn with :func:`~attnbook.viz.style.book_style` and closed from pyplot, so
    that a notebook shows it once, as the cell's result (the inline backend would show it a second time)."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with book_style():
            fig = draw(*args, **kwargs)
        plt.close(fig)
        return fig

    return drawn


def wrapped_panels(n: int, row_height: float, *, extra: float = 0.0, remove: bool = False):
    """A page-wide pyplot figure for ``n`` panels, two per row (one when n = 1), ``row_height`` inches per row
    and ``extra`` more; returns it and its (rows, cols) array of axes, those past the n-th hidden (or removed)."""
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, extra + row_height * rows), squeeze=False)
    for ax in list(axes.flat)[n:]:
        if remove:
            ax.remove()
        else:
            ax.set_visible(False)
    return fig, axes


def attention_heatmap(
    weights,
    *,
    ax=None,
    title: str = "attention weights",
    queries=None,
    keys=None,
    vmax: float | None = None,
    colorbar: bool = True,
    xlabel: str = "key j",
    ylabel: str = "query i",
    annotate: bool = False,
):
    """Heat map of an (N, M) weight matrix (row i = query i, column j = key j), ``ax.images[0]``; returns the Axes.

    The colour scale runs from 0 to ``vmax`` (default: the largest weight; maps meant to be compared share one,
    :func:`attnbook.viz.shared_scale`, and one colour bar: ``colorbar=False``). ``queries`` / ``keys`` label the
    ticks and ``annotate`` writes each value in its cell.
    """
    w = to_numpy(weights)
    check_dims(w, "weights", 2, name="attention_heatmap", layout="(N, M)")
    for arg, labels, size in (("queries", queries, w.shape[0]), ("keys", keys, w.shape[1])):
        if labels is not None:  # fewer or more labels than ticks mislabelled them without a word
            check_count(labels, arg, name="attention_heatmap", minimum=size, maximum=size, item="label")
    if vmax is not None:
        vmax = check_number(vmax, "vmax", name="attention_heatmap", minimum=0.0, strict_minimum=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if annotate:
        top = float(np.nanmax(w)) if vmax is None else vmax
        for (i, j), value in np.ndenumerate(w):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="black" if value > 0.6 * top else "white")
    if queries is not None:
        ax.set_yticks(range(len(queries)), queries)
    if keys is not None:
        ax.set_xticks(range(len(keys)), keys, rotation=90)
    return ax


def scaling_plot(
    ns: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    ax=None,
    title: str | None = None,
    reference_slopes: Sequence[float] = (),
    xlabel: str = "sequence length N",
    variable: str = "N",
    styles: Mapping[str, dict] | None = None,
    mechanism_styles: bool = False,
    legend: bool = True,
):
    """Log-log plot of a cost against a size (by default the sequence length N), one line per series.

    ``reference_slopes`` adds thin grey guides proportional to ``variable ** p`` through the first point of the
    first series. ``styles`` maps a series name to ``plot`` keywords, e.g. ``line_style("linear_causal")``; with
    ``mechanism_styles`` every other series named after a mechanism gets its :func:`attnbook.viz.line_style`.
    ``legend=False`` leaves the legend to the caller. A value of NaN leaves a point out.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    styles = dict(styles or {})
    n = len(ns)
    for name, ys in series.items():
        why = " (one per N)"
        check_count(ys, f"series[{name!r}]", name="scaling_plot", minimum=n, maximum=n, item="value", why=why)
        style = styles.get(name)
        if style is None and mechanism_styles and str(name).removesuffix("_causal") in COLOURS:
            style = line_style(name)  # else (not a mechanism) matplotlib's next colour
        ax.plot(ns, ys, **{"marker": "o", **(style or {})}, label=name)
    if reference_slopes and series:
        y0 = next(iter(series.values()))[0]
        x = np.asarray(ns, dtype=float)
        # thin grey guides, told apart by their dash pattern (a dashed coloured line is a causal mechanism)
        for p, ls in zip(reference_slopes, _GUIDE_STYLES * len(reference_slopes), strict=False):
            ax.plot(x, y0 * (x / x[0]) ** p, ls=ls, color="grey", lw=0.9, label=f"∝ {variable}^{p:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(fontsize=MIN_FONT)
    ax.grid(True, which="both", alpha=0.3)
    return ax


def curves_and_maps(
    curves: Mapping[str, Sequence[float]],
    maps: Mapping[str, object],
    *,
    styles: Mapping[str, dict] | None = None,
    xlabel: str = "training step",
    ylabel: str = "loss",
    logy: bool = True,
    map_xlabel: str = "head h",
    map_ylabel: str = "token type",
    annotate: bool = True,
):
    """Training curves (``curves``: label -> values per step, drawn with ``styles[label]``) above, matrices read
    from the model (``maps``: title -> (R, K), e.g. each token type's gate share per head) side by side below
    on one colour scale from 0; page wide. Returns the Figure."""
    check_count(curves, "curves", name="curves_and_maps", item="curve")
    check_count(maps, "maps", name="curves_and_maps", item="map")
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.4))
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.1])
    ax = top.subplots()
    for label, ys in curves.items():
        ax.plot(np.arange(len(ys)), to_numpy(list(ys)), label=label, **dict((styles or {}).get(label, {})))
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    top.subplots_adjust(left=0.11, right=0.97, bottom=0.2, top=0.95)
    arrays = {title: to_numpy(m) for title, m in maps.items()}
    vmax = shared_scale(*arrays.values())["vmax"]
    axes = np.atleast_1d(bottom.subplots(1, len(arrays)))
    for ax, (title, m) in zip(axes, arrays.items(), strict=True):
        attention_heatmap(m, ax=ax, title=title, xlabel=map_xlabel, ylabel=map_ylabel, vmax=vmax, annotate=annotate)
        ax.set(xticks=range(m.shape[1]), yticks=range(m.shape[0]))
    bottom.subplots_adjust(left=0.11, right=0.97, bottom=0.14, top=0.9, wspace=0.45)
    return fig


def _finite(series: Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """The series that are not NaN everywhere."""
    return {name: ys for name, ys in series.items() if np.isfinite(to_numpy(list(ys))).any()}


def scaling_panels(
    ns: Sequence[int],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str | None = None,
    reference_slopes: Sequence[float] = (1, 2),
    xlabel: str = "sequence length N",
):
    """Up to three log-log cost panels (ylabel -> {mechanism: values}) in a page-wide 2 x 2 grid, each series in
    its mechanism's :func:`attnbook.viz.style.line_style` (NaN everywhere: left out), the shared legend in the
    fourth cell. Returns the Figure."""
    check_count(panels, "panels", name="scaling_panels", minimum=1, maximum=3, item="panel")
    fig, axes = plt.subplots(2, 2, figsize=(PAGE_WIDTH, 6.6))
    for ax, (ylabel, series) in zip(list(axes.flat)[: len(panels)], panels.items(), strict=True):
        scaling_plot(ns, _finite(series), ylabel=ylabel, ax=ax, reference_slopes=reference_slopes, xlabel=xlabel,
                     mechanism_styles=True, legend=False)  # fmt: skip
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[3].legend(handles, labels, loc="center", ncols=2, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def cost_figure(
    ns: Sequence[int],
    panels: Mapping[str, tuple[str, Mapping[str, Sequence[float]]]],
    *,
    styles: Mapping[str, dict] | None = None,
    reference_slopes: Sequence[float] = (2,),
    height: float = 3.4,
    xlabel: str = "sequence length N",
):
    """Log-log cost panels, two per row of ``height`` inches, page wide: ``panels`` maps a title to ``(ylabel,
    {name: values at each N})``, each a :func:`scaling_plot` with its legend, the guides ``reference_slopes``
    and ``styles`` (name -> ``plot`` keywords). A series that is NaN everywhere is left out. Returns the Figure.
    """
    check_sequence(panels, "panels", name="cost_figure", mapping=True, minimum=1, item="panel")
    height = check_number(height, "height", name="cost_figure", minimum=1.0)
    fig, axes = wrapped_panels(len(panels), height, remove=True)
    for ax, (title, panel) in zip(axes.flat, panels.items(), strict=False):
        check_count(panel, f"panels[{title!r}]", name="cost_figure", minimum=2, maximum=2, item="part",
                    why=" (ylabel, series)")  # fmt: skip
        scaling_plot(ns, _finite(panel[1]), ylabel=panel[0], ax=ax, title=title, reference_slopes=reference_slopes,
                     xlabel=xlabel, styles=styles)  # fmt: skip
    fig.tight_layout()
    return fig
