"""Static matplotlib figures used across the book."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .._checks import check_count, check_dims, check_number, check_sequence
from .style import MIN_FONT

__all__ = ["attention_heatmap", "scaling_plot", "scaling_panels", "cost_figure", "curves_and_maps"]

_GUIDE_STYLES = (":", "-.", (0, (6, 2, 1, 2, 1, 2)))


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


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
    """Heat map of an (N, M) weight matrix: row i = query i, column j = key j. Returns the Axes.

    The colour scale starts at 0 and ends at ``vmax`` (default: the largest weight). Maps meant to be
    compared should share one ``vmax`` (:func:`attnbook.viz.shared_scale`); ``colorbar=False`` leaves the
    colour bar to the caller (one bar for several panels). The image is ``ax.images[0]``. ``xlabel`` /
    ``ylabel`` rename the axes (any matrix of shares: token type x head, ...) and ``annotate`` writes each
    value in its cell.
    """
    w = _numpy(weights)
    check_dims(w, "weights", 2, name="attention_heatmap", layout="(N, M)")
    if vmax is not None:
        vmax = check_number(vmax, "vmax", name="attention_heatmap", minimum=0.0, strict_minimum=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
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

    ``reference_slopes`` adds a thin grey guide line (dotted, then dash-dotted, ...) proportional to
    ``variable ** p`` for each slope p, through the first point of the first series. ``styles`` maps a series
    name to ``plot`` keyword arguments, e.g. ``{"linear, causal": line_style("linear_causal")}``
    (:func:`attnbook.viz.line_style`: one colour per mechanism, dashed when causal); one mapping can serve
    several plots (names not plotted are ignored). With ``mechanism_styles`` every series named after a
    mechanism (``"flow"``, ``"flow_causal"``, ``"softmax_literal"``) and not in ``styles`` gets that style
    from its name. ``legend=False`` leaves the legend to the caller (one legend shared by several panels).
    A value of NaN leaves a point out (a series measured at fewer sizes).
    """
    from .style import line_style

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    styles = dict(styles or {})
    for name, ys in series.items():
        n = len(ns)
        check_count(
            ys, f"series[{name!r}]", name="scaling_plot", minimum=n, maximum=n, item="value", why=" (one per N)"
        )
        style = styles.get(name)
        if style is None and mechanism_styles:
            try:
                style = line_style(name)
            except ValueError:  # not a mechanism: matplotlib's next colour
                style = None
        ax.plot(ns, ys, **{"marker": "o", **(style or {})}, label=name)
    if reference_slopes and series:
        y0 = next(iter(series.values()))[0]
        n = np.asarray(ns, dtype=float)
        # thin grey guides, told apart by their dash pattern (a dashed coloured line is a causal mechanism)
        for p, ls in zip(reference_slopes, _GUIDE_STYLES * len(reference_slopes), strict=False):
            ax.plot(n, y0 * (n / n[0]) ** p, ls=ls, color="grey", lw=0.9, label=f"∝ {variable}^{p:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
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
    """Training curves above, matrices side by side below (one shared colour scale, from 0).

    For a model trained in several variants (``curves``: label -> values per step, drawn with
    ``styles[label]`` as ``plot`` keywords) and matrices read from it (``maps``: title -> (R, K) matrix, e.g.
    the share of each token type's gate on each head before and after training). Drawn at the book's page
    width.

    Returns:
        the matplotlib Figure.
    """
    from .style import PAGE_WIDTH, shared_scale

    check_count(curves, "curves", name="curves_and_maps", item="curve")
    check_count(maps, "maps", name="curves_and_maps", item="map")
    fig = plt.figure(figsize=(PAGE_WIDTH, 6.4))
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.1])
    ax = top.subplots()
    for label, ys in curves.items():
        ax.plot(np.arange(len(ys)), _numpy(list(ys)), label=label, **dict((styles or {}).get(label, {})))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    top.subplots_adjust(left=0.11, right=0.97, bottom=0.2, top=0.95)
    arrays = {title: _numpy(m) for title, m in maps.items()}
    scale = shared_scale(*arrays.values())
    axes = np.atleast_1d(bottom.subplots(1, len(arrays)))
    for ax, (title, m) in zip(axes, arrays.items(), strict=True):
        attention_heatmap(
            m, ax=ax, title=title, xlabel=map_xlabel, ylabel=map_ylabel, vmax=scale["vmax"], annotate=annotate
        )
        ax.set_xticks(range(m.shape[1]))
        ax.set_yticks(range(m.shape[0]))
    bottom.subplots_adjust(left=0.11, right=0.97, bottom=0.14, top=0.9, wspace=0.45)
    return fig


def scaling_panels(
    ns: Sequence[int],
    panels: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    title: str | None = None,
    reference_slopes: Sequence[float] = (1, 2),
    xlabel: str = "sequence length N",
):
    """Up to three log-log cost panels (ylabel -> {mechanism: values}) in a 2 x 2 grid at the page width.

    Every series gets its mechanism's colour and line style (:func:`attnbook.viz.style.line_style`); the
    fourth cell holds the one legend the panels share. Series that are NaN everywhere are left out.

    Returns:
        the matplotlib Figure.
    """
    from .style import PAGE_WIDTH

    check_count(panels, "panels", name="scaling_panels", minimum=1, maximum=3, item="panel")
    fig, axes = plt.subplots(2, 2, figsize=(PAGE_WIDTH, 6.6))
    for ax, (ylabel, series) in zip(list(axes.flat)[: len(panels)], panels.items(), strict=True):
        shown = {name: ys for name, ys in series.items() if np.isfinite(_numpy(list(ys))).any()}
        scaling_plot(
            ns,
            shown,
            ylabel=ylabel,
            ax=ax,
            reference_slopes=reference_slopes,
            xlabel=xlabel,
            mechanism_styles=True,
            legend=False,
        )
    for ax in list(axes.flat)[len(panels) : 3]:
        ax.axis("off")
    legend_ax = axes.flat[3]
    legend_ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    legend_ax.legend(handles, labels, loc="center", ncols=2, frameon=False)
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
    """Log-log cost panels at the book's page width, side by side (two per row, further rows below).

    ``panels`` maps a panel's title to ``(ylabel, {name: values at each N})``, e.g.
    ``{"time": ("seconds (median)", scaling.times)}``; every panel is a :func:`scaling_plot` with its own
    legend and the guide lines ``reference_slopes``, and ``styles`` (name -> ``plot`` keywords) serves all of
    them. A NaN leaves a point out; a series that is NaN everywhere is left out of its panel.

    Returns:
        the matplotlib Figure (``height`` inches per row).
    """
    from .style import PAGE_WIDTH

    check_sequence(panels, "panels", name="cost_figure", mapping=True, minimum=1, item="panel")
    height = check_number(height, "height", name="cost_figure", minimum=1.0)
    ncols = min(len(panels), 2)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(PAGE_WIDTH, height * nrows), squeeze=False)
    for ax, (title, panel) in zip(axes.flat, panels.items(), strict=False):
        check_count(panel, f"panels[{title!r}]", name="cost_figure", minimum=2, maximum=2, item="part",
                    why=" (ylabel, series)")  # fmt: skip
        ylabel, series = panel
        shown = {name: ys for name, ys in series.items() if np.isfinite(_numpy(list(ys))).any()}
        scaling_plot(ns, shown, ylabel=ylabel, ax=ax, title=title, reference_slopes=reference_slopes,
                     xlabel=xlabel, styles=styles)  # fmt: skip
    for ax in list(axes.flat)[len(panels) :]:
        ax.remove()
    fig.tight_layout()
    return fig
