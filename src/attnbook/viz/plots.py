"""Static matplotlib figures used across the book."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .._checks import check_number
from .style import MIN_FONT

__all__ = ["attention_heatmap", "scaling_plot"]

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
):
    """Heat map of an (N, M) weight matrix: row i = query i, column j = key j. Returns the Axes.

    The colour scale starts at 0 and ends at ``vmax`` (default: the largest weight). Maps meant to be
    compared should share one ``vmax`` (:func:`attnbook.viz.shared_scale`); ``colorbar=False`` leaves the
    colour bar to the caller (one bar for several panels). The image is ``ax.images[0]``.
    """
    w = _numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap: expected an (N, M) matrix, got shape {w.shape}")
    if vmax is not None:
        vmax = check_number(vmax, "vmax", name="attention_heatmap", minimum=0.0, strict_minimum=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 3.6))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
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
    styles: Mapping[str, dict] | None = None,
):
    """Log-log plot of a cost against a size (by default the sequence length N), one line per series.

    ``reference_slopes`` adds a thin grey guide line (dotted, then dash-dotted, ...) proportional to
    ``variable ** p`` for each slope p, through the first point of the first series. ``styles`` maps a series
    name to ``plot`` keyword arguments, e.g. ``{"linear, causal": line_style("linear_causal")}``
    (:func:`attnbook.viz.line_style`: one colour per mechanism, dashed when causal); one mapping can serve
    several plots (names not plotted are ignored). A value of NaN leaves a point out (a series measured at
    fewer sizes).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    styles = dict(styles or {})
    for name, ys in series.items():
        if len(ys) != len(ns):
            raise ValueError(f"scaling_plot: series {name!r} has {len(ys)} values for {len(ns)} lengths")
        ax.plot(ns, ys, **{"marker": "o", **styles.get(name, {})}, label=name)
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
    ax.legend(fontsize=MIN_FONT)
    ax.grid(True, which="both", alpha=0.3)
    return ax
