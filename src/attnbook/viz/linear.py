"""Figures for chapter 2 (linear attention): attention maps side by side, and random-feature error curves.

Pure functions (:func:`row_entropy`, :func:`relative_error`) are tested; the ``*_figure`` / ``*_plot``
functions draw them with matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from .plots import attention_heatmap, scaling_plot

__all__ = ["row_entropy", "relative_error", "attention_maps_figure", "feature_error_plot"]


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy -sum_j w_ij log w_ij of each row of non-negative weights (..., N, M) -> (..., N), in nats.

    0 log 0 counts as 0. A one-hot row has entropy 0, a uniform row over M keys log M: the lower, the more
    selective the attention. Rows are used as given (normalise them first).
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() < 1:
        raise ValueError(f"row_entropy: expected a tensor with at least one dimension, got {weights!r}")
    w = weights.to(torch.promote_types(weights.dtype, torch.float32))
    if bool((w < 0).any()):
        raise ValueError(f"row_entropy: weights must be non-negative, got a minimum of {w.min().item():g}")
    logs = torch.where(w > 0, w.clamp_min(torch.finfo(w.dtype).tiny).log(), torch.zeros_like(w))
    return -(w * logs).sum(dim=-1)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """||approx - exact|| / ||exact|| over all entries (Frobenius norms), as a 0-dim float64 tensor."""
    if approx.shape != exact.shape:
        raise ValueError(f"relative_error: shapes differ, approx {tuple(approx.shape)} vs exact {tuple(exact.shape)}")
    a, e = approx.to(torch.float64), exact.to(torch.float64)
    norm = e.norm()
    if not bool(norm > 0):
        raise ValueError("relative_error: the exact tensor is all zeros, the relative error is undefined")
    return (a - e).norm() / norm


def attention_maps_figure(maps: Mapping[str, torch.Tensor], *, suptitle: str | None = None, panel_width: float = 3.6):
    """One heat map per entry of ``maps`` (title -> (N, M) weights), side by side; returns the Figure.

    Each panel has its own colour scale (see :func:`attnbook.viz.attention_heatmap`).
    """
    if not maps:
        raise ValueError("attention_maps_figure: no maps given")
    fig, axes = plt.subplots(1, len(maps), figsize=(panel_width * len(maps), 0.85 * panel_width + 0.4), squeeze=False)
    for ax, (title, weights) in zip(axes[0], maps.items(), strict=True):
        attention_heatmap(weights, ax=ax, title=title)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def feature_error_plot(
    num_features: Sequence[int],
    errors: Mapping[str, Sequence[float]],
    *,
    ax=None,
    title: str | None = None,
    ylabel: str = "relative error",
):
    """Log-log plot of an approximation error against the number of random features R; returns the Axes.

    A dashed guide line proportional to R^(-1/2) (the Monte Carlo rate) goes through the first point of the
    first series.
    """
    if not errors:
        raise ValueError("feature_error_plot: no error series given")
    for name, ys in errors.items():
        if len(ys) != len(num_features):
            raise ValueError(
                f"feature_error_plot: series {name!r} has {len(ys)} values for {len(num_features)} feature counts"
            )
    return scaling_plot(
        num_features,
        errors,
        ylabel=ylabel,
        ax=ax,
        title=title,
        reference_slopes=[-0.5],
        xlabel="number of random features R",
        variable="R",
    )
