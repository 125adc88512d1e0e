"""Chapter 2 (linear attention): a retrieval toy, how selective attention maps are, attention maps side by side,
random-feature error curves and :func:`temperature_explorer`, the live explorer of the inverse temperature."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from .._checks import (
    check_callable,
    check_count,
    check_dims,
    check_dtype,
    check_int,
    check_non_negative,
    check_nonzero,
    check_not_empty,
    check_number,
    check_same_shape,
    check_sequence,
    check_square,
    check_tensor,
)
from .plots import attention_heatmap, scaling_plot, to_numpy
from .static import figure_to_png
from .style import DPI, PAGE_WIDTH, shared_scale

__all__ = ["retrieval_toy", "selectivity", "row_entropy", "relative_error", "attention_maps_figure"]
__all__ += ["feature_error_plot", "temperature_explorer"]


def retrieval_toy(
    n_tokens: int = 24, dim: int = 16, *, noise: float = 0.6, seed: int = 0, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A toy retrieval task: query i is a noisy copy of key i, so the right attention map is the diagonal.

    Keys and values are standard normal, ``q_i = k_i + noise * e_i``; queries and keys are rescaled to length
    ``dim ** 0.25``, so that ``q_i . k_j / sqrt(D)`` is their cosine similarity and scaling both by ``sqrt(s)``
    scales the softmax scores by ``s``. Returns q, k, v, each (1, 1, n_tokens, dim), drawn on the CPU.
    """
    n_tokens = check_int(n_tokens, "n_tokens", name="retrieval_toy", minimum=1)
    dim = check_int(dim, "dim", name="retrieval_toy", minimum=1)
    noise = check_number(noise, "noise", name="retrieval_toy", minimum=0.0)
    seed = check_int(seed, "seed", name="retrieval_toy")
    dtype = check_dtype(dtype, "dtype", name="retrieval_toy")  # an int64 toy was all rounded to 0, -1 and 1
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 1, n_tokens, dim, dtype=torch.float64, generator=gen)  # (1, 1, N, D)
    q = k + noise * torch.randn(k.shape, dtype=torch.float64, generator=gen)  # noisy copies of the keys
    q, k = (x / x.norm(dim=-1, keepdim=True) * dim**0.25 for x in (q, k))  # q . k / sqrt(D) = cosine
    v = torch.randn(1, 1, n_tokens, dim, dtype=torch.float64, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def selectivity(weights: torch.Tensor) -> tuple[float, float]:
    """(mean row entropy, mean weight on the diagonal) of square attention weights (..., N, N): for
    :func:`retrieval_toy`, (0, 1) for a perfect look-up, (log N, 1/N) for a uniform map."""
    check_square(weights, "weights", name="selectivity")
    check_not_empty(weights, "weights", name="selectivity", why=" (their means would be NaN)")
    return row_entropy(weights).mean().item(), weights.diagonal(dim1=-2, dim2=-1).mean().item()


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy -sum_j w_ij log w_ij (0 log 0 = 0) of each row of non-negative weights (..., N, M) -> (..., N),
    in nats: 0 for a one-hot row, log M for a uniform one. Rows are used as given (normalise them first)."""
    check_tensor(weights, "weights", name="row_entropy", floating=False)
    check_dims(weights, "weights", 1, name="row_entropy", layout="(..., N, M)", at_least=True)
    w = weights.to(torch.promote_types(weights.dtype, torch.float32))
    check_non_negative(w, "weights", name="row_entropy")
    logs = torch.where(w > 0, w.clamp_min(torch.finfo(w.dtype).tiny).log(), torch.zeros_like(w))
    return -(w * logs).sum(dim=-1)


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """||approx - exact|| / ||exact|| over all entries (Frobenius norms), as a 0-dim float64 tensor."""
    check_tensor(approx, "approx", name="relative_error", floating=False)
    check_tensor(exact, "exact", name="relative_error", floating=False)
    check_same_shape(approx, exact, "approx", "exact", name="relative_error")
    check_nonzero(exact, "exact", name="relative_error", why=" (the relative error would be undefined)")
    a, e = approx.to(torch.float64), exact.to(torch.float64)
    return (a - e).norm() / e.norm()


def attention_maps_figure(
    maps: Mapping[str, torch.Tensor],
    *,
    suptitle: str | None = None,
    panel_width: float | None = None,
    shared: bool = False,
    ncols: int | None = None,
    width: float | None = None,
    labels: Sequence[str] | None = None,
):
    """One heat map per entry of ``maps`` (title -> (N, M) weights), in a grid of panels; returns the Figure.

    The figure is ``width`` inches wide (default :data:`attnbook.viz.style.PAGE_WIDTH`, or ``panel_width`` per
    panel) with at most ``ncols`` panels per row (default 2), further panels wrapping onto the next row.
    ``shared=True`` puts every map on one colour scale from 0 with one colour bar, so that they can be compared.
    ``labels`` names the tokens (tick labels on both axes, for square maps of self-attention).
    """
    check_sequence(maps, "maps", name="attention_maps_figure", mapping=True, minimum=1, item="map")
    n = len(maps)
    ncols = min(n, 2 if ncols is None else check_int(ncols, "ncols", name="attention_maps_figure", minimum=1))
    nrows = -(-n // ncols)
    if panel_width is not None:
        width = check_number(panel_width, "panel_width", name="attention_maps_figure", minimum=0.5) * ncols
    else:
        width = PAGE_WIDTH if width is None else check_number(width, "width", name="attention_maps_figure", minimum=1.0)
    panel = width / ncols
    height = nrows * (0.9 * panel + 0.35) + (0.35 if suptitle else 0.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    vmax = shared_scale(*[to_numpy(w) for w in maps.values()])["vmax"] if shared else None
    used = list(axes.flat)[:n]
    for ax, (title, weights) in zip(used, maps.items(), strict=True):
        attention_heatmap(weights, ax=ax, title=title, vmax=vmax, colorbar=not shared, queries=labels, keys=labels)
    for ax in list(axes.flat)[n:]:
        ax.remove()
    if suptitle:
        fig.suptitle(suptitle)
    # One layout pass when the figure is made (a constrained layout would redo it at every draw, three
    # times per PNG); a shared colour bar gets the strip on the right.
    right = 1.0 - 0.7 / width if shared else 1.0
    fig.tight_layout(rect=(0.0, 0.0, right, 1.0))
    if shared:
        boxes = [ax.get_position() for ax in used]
        bottom, top = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
        bar = fig.add_axes((right + 0.1 / width, bottom, 0.12 / width, top - bottom))
        fig.colorbar(used[0].images[0], cax=bar, label="weight")
    return fig


def feature_error_plot(
    num_features: Sequence[int],
    errors: Mapping[str, Sequence[float]],
    *,
    ax=None,
    title: str | None = None,
    ylabel: str = "relative error",
    styles: Mapping[str, dict] | None = None,
):
    """Log-log plot of an approximation error against the number of random features R, with a guide at the Monte
    Carlo rate R^(-1/2) (``styles`` as in :func:`attnbook.viz.scaling_plot`); returns the Axes."""
    check_count(errors, "errors", name="feature_error_plot", item="series")
    n = len(num_features)
    for name, ys in errors.items():
        why = " (one per feature count R)"
        check_count(ys, f"errors[{name!r}]", name="feature_error_plot", minimum=n, maximum=n, item="value", why=why)
    guide = dict(reference_slopes=[-0.5], xlabel="number of random features R", variable="R")
    return scaling_plot(num_features, errors, ylabel=ylabel, ax=ax, title=title, styles=styles, **guide)


def temperature_explorer(
    maps_at: Callable[[float], Mapping[str, torch.Tensor]],
    *,
    value: float = 8.0,
    lowest: float = 0.5,
    highest: float = 128.0,
):
    """A live explorer of attention maps against the inverse temperature beta: ``maps_at(beta)`` gives the maps
    (title -> (N, M) weights), drawn by :func:`attention_maps_figure` on one colour scale into an ``Image``;
    the slider "β" moves beta from ``lowest`` to ``highest`` by factors of sqrt(2), starting at ``value``.
    Returns an ``ipywidgets.VBox`` of the slider and the image."""
    name = "temperature_explorer"
    check_callable(maps_at, "maps_at", name=name, what="a callable beta -> {title: weights}")
    lowest = check_number(lowest, "lowest", name=name, minimum=0.0, strict_minimum=True)
    highest = check_number(highest, "highest", name=name, minimum=lowest, strict_minimum=True, why=" (lowest)")
    value = check_number(value, "value", name=name, minimum=lowest, maximum=highest)
    lo, hi = math.log2(lowest), math.log2(highest)
    slider = widgets.FloatLogSlider(value=value, base=2, min=lo, max=hi, step=0.5, description="β")
    slider.continuous_update = False
    image = widgets.Image(format="png")

    def draw(beta: float) -> None:
        fig = attention_maps_figure(maps_at(beta), shared=True, suptitle=f"inverse temperature β = {beta:g}")
        image.value = figure_to_png(fig, dpi=DPI)
        plt.close(fig)

    slider.observe(lambda change: draw(change["new"]), names="value")
    draw(slider.value)
    return widgets.VBox([slider, image])
