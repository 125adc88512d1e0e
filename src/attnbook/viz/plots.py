"""Static matplotlib figures used across the book."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

__all__ = ["attention_heatmap", "scaling_plot"]


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
    xlabel: str = "key j",
    ylabel: str = "query i",
    vmax: float | None = None,
    annotate: bool = False,
):
    """Heat map of an (N, M) weight matrix: row i = query i, column j = key j. Returns the Axes.

    ``xlabel`` / ``ylabel`` rename the axes (any matrix of shares: token type x head, ...), ``vmax`` fixes the
    top of the colour scale (for maps meant to be compared) and ``annotate`` writes each value in its cell.
    """
    w = _numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap: expected an (N, M) matrix, got shape {w.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if annotate:
        top = float(np.nanmax(w)) if vmax is None else vmax
        for (i, j), value in np.ndenumerate(w):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="black" if value > 0.6 * top else "white")
    ax.set_title(title)
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
    mechanism_styles: bool = False,
    legend: bool = True,
):
    """Log-log plot of a cost against a size (by default the sequence length N), one line per series.

    ``reference_slopes`` adds a grey guide line proportional to ``variable ** p`` for each slope p, through
    the first point of the first series (dotted with ``mechanism_styles``, where dashes mean "causal").
    With ``mechanism_styles`` every series named after a mechanism (``"flow"``, ``"flow_causal"``,
    ``"softmax_literal"``) gets the book's colour and line style for it
    (:func:`attnbook.viz.style.line_style`); ``legend=False`` leaves the legend to the caller (one legend
    shared by several panels).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    for name, ys in series.items():
        if len(ys) != len(ns):
            raise ValueError(f"scaling_plot: series {name!r} has {len(ys)} values for {len(ns)} lengths")
        kw = {}
        if mechanism_styles:
            from .style import line_style

            try:
                kw = line_style(name)
            except ValueError:  # not a mechanism: matplotlib's next colour
                kw = {}
        ax.plot(ns, ys, marker="o", label=name, **kw)
    if reference_slopes and series:
        y0 = next(iter(series.values()))[0]
        n = np.asarray(ns, dtype=float)
        for p in reference_slopes:
            guide = ":" if mechanism_styles else "--"  # dashes mean a causal form among mechanism styles
            ax.plot(n, y0 * (n / n[0]) ** p, ls=guide, color="grey", lw=0.8, label=f"∝ {variable}^{p:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax
