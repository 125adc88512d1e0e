"""Figures for chapter 2 (linear attention): attention maps side by side, and random-feature error curves.

Pure functions (:func:`row_entropy`, :func:`relative_error`) are tested; the ``*_figure`` / ``*_plot``
functions draw them with matplotlib, and :func:`temperature_explorer` is the chapter's live explorer of the
inverse temperature beta.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from .._checks import (
    check_callable,
    check_count,
    check_dims,
    check_int,
    check_non_negative,
    check_nonzero,
    check_number,
    check_same_shape,
    check_square,
    check_tensor,
)
from .plots import attention_heatmap, scaling_plot
from .style import PAGE_WIDTH, shared_scale

__all__ = [
    "retrieval_toy",
    "selectivity",
    "row_entropy",
    "relative_error",
    "attention_maps_figure",
    "feature_error_plot",
    "temperature_explorer",
]


def retrieval_toy(
    n_tokens: int = 24, dim: int = 16, *, noise: float = 0.6, seed: int = 0, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A toy retrieval task: query i is a noisy copy of key i, so the right attention map is the diagonal.

    Keys and values are standard normal; ``q_i = k_i + noise * e_i``. Queries and keys are then rescaled to
    length ``dim ** 0.25``, so that ``q_i . k_j / sqrt(D)`` is their cosine similarity: multiplying both by
    ``sqrt(s)`` multiplies the softmax scores by ``s`` (an inverse temperature). The same seed gives the same
    numbers on every device (drawn on the CPU).

    Returns:
        q, k, v, each of shape (1, 1, n_tokens, dim) on the CPU in ``dtype``.
    """
    n_tokens = check_int(n_tokens, "n_tokens", name="retrieval_toy", minimum=1)
    dim = check_int(dim, "dim", name="retrieval_toy", minimum=1)
    noise = check_number(noise, "noise", name="retrieval_toy", minimum=0.0)
    seed = check_int(seed, "seed", name="retrieval_toy")
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 1, n_tokens, dim, dtype=torch.float64, generator=gen)  # (1, 1, N, D)
    q = k + noise * torch.randn(k.shape, dtype=torch.float64, generator=gen)  # noisy copies of the keys
    q, k = (x / x.norm(dim=-1, keepdim=True) * dim**0.25 for x in (q, k))  # q . k / sqrt(D) = cosine
    v = torch.randn(1, 1, n_tokens, dim, dtype=torch.float64, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def selectivity(weights: torch.Tensor) -> tuple[float, float]:
    """(mean row entropy, mean weight on the diagonal) of square attention weights (..., N, N).

    For :func:`retrieval_toy` the diagonal is the right key: a perfect look-up has entropy 0 and diagonal 1,
    a uniform map entropy log N and diagonal 1/N.
    """
    check_square(weights, "weights", name="selectivity")
    return row_entropy(weights).mean().item(), weights.diagonal(dim1=-2, dim2=-1).mean().item()


def row_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy -sum_j w_ij log w_ij of each row of non-negative weights (..., N, M) -> (..., N), in nats.

    0 log 0 counts as 0. A one-hot row has entropy 0, a uniform row over M keys log M: the lower, the more
    selective the attention. Rows are used as given (normalise them first).
    """
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
    norm = e.norm()
    return (a - e).norm() / norm


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

    The figure is drawn for the book's page (``width``, default :data:`attnbook.viz.style.PAGE_WIDTH`
    inches): at most ``ncols`` panels per row (default 2, the book's limit), further panels wrap onto the
    next row instead of shrinking. ``shared=True`` puts every map on one colour scale, 0 to the largest
    weight of all maps (:func:`attnbook.viz.shared_scale`), with one colour bar, so that the panels can be
    compared; otherwise each panel has its own scale and bar. ``panel_width`` (inches per panel) overrides ``width``.
    ``labels`` names the tokens (tick labels on both axes, for square maps of self-attention).
    """
    check_count(maps, "maps", name="attention_maps_figure", item="map")
    n = len(maps)
    ncols = min(n, 2) if ncols is None else check_int(ncols, "ncols", name="attention_maps_figure", minimum=1)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    if panel_width is not None:
        width = check_number(panel_width, "panel_width", name="attention_maps_figure", minimum=0.5) * ncols
    elif width is None:
        width = PAGE_WIDTH
    else:
        width = check_number(width, "width", name="attention_maps_figure", minimum=1.0)
    panel = width / ncols
    height = nrows * (0.9 * panel + 0.35) + (0.35 if suptitle else 0.0)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    scale = shared_scale(*[_as_numpy(w) for w in maps.values()]) if shared else {}
    used = []
    for ax, (title, weights) in zip(axes.flat, maps.items(), strict=False):
        attention_heatmap(
            weights, ax=ax, title=title, vmax=scale.get("vmax"), colorbar=not shared, queries=labels, keys=labels
        )
        used.append(ax)
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


def _as_numpy(w):
    if isinstance(w, torch.Tensor):
        return w.detach().to("cpu", torch.float64).numpy()
    return w


def feature_error_plot(
    num_features: Sequence[int],
    errors: Mapping[str, Sequence[float]],
    *,
    ax=None,
    title: str | None = None,
    ylabel: str = "relative error",
    styles: Mapping[str, dict] | None = None,
):
    """Log-log plot of an approximation error against the number of random features R; returns the Axes.

    A guide line proportional to R^(-1/2) (the Monte Carlo rate) goes through the first point of the first
    series. ``styles``: ``plot`` keyword arguments per series, as in :func:`attnbook.viz.scaling_plot`.
    """
    check_count(errors, "errors", name="feature_error_plot", item="series")
    n = len(num_features)
    for name, ys in errors.items():
        why = " (one per feature count R)"
        check_count(ys, f"errors[{name!r}]", name="feature_error_plot", minimum=n, maximum=n, item="value", why=why)
    return scaling_plot(
        num_features,
        errors,
        ylabel=ylabel,
        ax=ax,
        title=title,
        reference_slopes=[-0.5],
        xlabel="number of random features R",
        variable="R",
        styles=styles,
    )


def temperature_explorer(
    maps_at: Callable[[float], Mapping[str, torch.Tensor]],
    *,
    value: float = 8.0,
    lowest: float = 0.5,
    highest: float = 128.0,
):
    """A live explorer of attention maps against the inverse temperature beta (needs a running kernel).

    ``maps_at(beta)`` gives the maps to show (title -> (N, M) weights), for example the softmax and
    elu + 1 weights of :func:`retrieval_toy` with q and k scaled by sqrt(beta); they are drawn by
    :func:`attention_maps_figure` on one colour scale. The slider, labelled "β", moves beta from ``lowest`` to
    ``highest`` in steps of a factor sqrt(2), starting at ``value``. The figure goes into an
    ``ipywidgets.Image`` as PNG bytes, which every supported front-end shows (an ``Output`` widget stays empty
    in the classic notebook with ipywidgets 7.7.1). The static page shows a frame slider instead.

    Returns:
        an ``ipywidgets.VBox`` holding the slider and the image.
    """
    import math

    import ipywidgets as widgets

    from .static import figure_to_png
    from .style import DPI

    name = "temperature_explorer"
    check_callable(maps_at, "maps_at", name=name, what="a callable beta -> {title: weights}")
    lowest = check_number(lowest, "lowest", name=name, minimum=0.0, strict_minimum=True)
    highest = check_number(highest, "highest", name=name, minimum=lowest, strict_minimum=True, why=" (lowest)")
    value = check_number(value, "value", name=name, minimum=lowest, maximum=highest)
    slider = widgets.FloatLogSlider(
        value=value,
        base=2,
        min=math.log2(lowest),
        max=math.log2(highest),
        step=0.5,
        description="β",
        continuous_update=False,
    )
    image = widgets.Image(format="png")

    def draw(beta: float) -> None:
        fig = attention_maps_figure(maps_at(beta), shared=True, suptitle=f"inverse temperature β = {beta:g}")
        image.value = figure_to_png(fig, dpi=DPI)
        plt.close(fig)

    slider.observe(lambda change: draw(change["new"]), names="value")
    draw(slider.value)
    return widgets.VBox([slider, image])
