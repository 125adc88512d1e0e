"""Chapter 4's figures (Mobile-Attention, heads that compete): what small heads can say, and what head
competition changes. Each takes plain numbers, so that the chapter computes what it shows in a visible cell."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .. import mechanisms as _mechanisms
from .._checks import check_int, check_sequence
from .plots import ON_TOP, RIGHT, page_figure, to_numpy, wrapped_panels
from .style import PAGE_WIDTH, colour

__all__ = ["head_outputs_figure", "output_sizes", "output_growth_figure", "head_width_figure"]


def output_sizes(
    lengths: Sequence[int],
    *,
    mechanisms: Sequence[str] = ("linear", "flow", "mobile"),
    d_model: int = 32,
    n_heads: int = 4,
    seed: int = 0,
) -> dict[str, list[float]]:
    """How large a freshly initialised attention layer's output is against the sequence length N.

    For each mechanism, one self-attention module of the registry (``attnbook.mechanisms``, width ``d_model``,
    ``n_heads`` heads, no dropout, float64, weights drawn with ``seed``) reads the same random tokens
    ``(1, N, d_model)`` (standard normal, drawn with ``seed``, the first N of the longest sequence) at every
    length; the result is the RMS of its output over the RMS of its input. The global random state is left as
    it was.

    Example:
        >>> sizes = output_sizes([8, 32], mechanisms=["mobile"], d_model=8, n_heads=2)
        >>> sizes["mobile"][1] > 2 * sizes["mobile"][0]  # Mobile's rows sum to about a N / H
        True
    """
    where = "output_sizes"
    check_sequence(lengths, "lengths", name=where, minimum=1, item="length")
    lengths = [check_int(n, "lengths", name=where, minimum=1) for n in lengths]
    check_sequence(mechanisms, "mechanisms", name=where, minimum=1, item="mechanism")
    d_model = check_int(d_model, "d_model", name=where, minimum=1)
    n_heads = check_int(n_heads, "n_heads", name=where, minimum=1)
    x = torch.randn(1, max(lengths), d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    sizes: dict[str, list[float]] = {}
    for name in mechanisms:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            layer = _mechanisms.get(name).module(d_model, n_heads, dtype=torch.float64).eval()
        with torch.no_grad():  # the RMS of the output over that of the input, at each length
            sizes[name] = [(_rms(layer(x[:, :n])) / _rms(x[:, :n])).item() for n in lengths]
    return sizes


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean().sqrt()


@page_figure
def head_outputs_figure(
    outputs: dict, *, mechanism: str | dict, anchors: dict | None = None, ranks: dict | None = None
):
    """Every query's output of a head of width 2 (``outputs``: title -> (N, 2)), as points in the plane, in the
    colour of ``mechanism`` (one, or title -> mechanism); ``anchors`` (title -> (2, 2)): the head's two fixed
    vectors, between which linear attention's mixtures lie; ``ranks``: the effective rank, in the title."""
    where = "head_outputs_figure"
    check_sequence(outputs, "outputs", name=where, mapping=True, minimum=1, item="head")
    fig, axes = wrapped_panels(len(outputs), 3.0, extra=0.6)
    one_row = len(axes) == 1
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12 if one_row else 0.07, top=0.76 if one_row else 0.88,
                        wspace=0.35, hspace=0.55)  # fmt: skip
    for ax, (name, points) in zip(axes.flat, outputs.items(), strict=False):
        p = to_numpy(points)
        check_int(p.shape[-1], f"outputs[{name!r}].shape[-1]", name=where, minimum=2, maximum=2)
        m = mechanism if isinstance(mechanism, str) else mechanism[name]
        ax.scatter(p[:, 0], p[:, 1], s=10, color=colour(m), alpha=0.7, label="one query's output")
        if anchors is not None and name in anchors:
            a = to_numpy(anchors[name])
            ax.plot(a[:, 0], a[:, 1], color="black", lw=0.8, marker="x", ms=7, label="the two fixed vectors")
        rank = "" if ranks is None or name not in ranks else f"\neffective rank {float(ranks[name]):.2f}"
        ax.set(title=f"{name}{rank}", xlabel="output coordinate 1", ylabel="coordinate 2")
        ax.ticklabel_format(style="sci", scilimits=(-2, 3))
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=2, **ON_TOP)
    return fig


@page_figure
def output_growth_figure(
    lengths: Sequence[int],
    sizes: dict,
    *,
    reference: Sequence[float] | None = None,
    reference_label: str = "grows like N",
):
    """How large an attention layer's output is (``sizes``: mechanism -> e.g. output RMS over input RMS at each
    length) against the sequence length N, log-log, with a dotted guide ``reference`` (e.g. proportional to N)."""
    where = "output_growth_figure"
    check_sequence(lengths, "lengths", name=where, minimum=2, item="length")
    check_sequence(sizes, "sizes", name=where, mapping=True, minimum=1, item="mechanism")
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 3.4))
    fig.subplots_adjust(left=0.1, right=0.72, bottom=0.16, top=0.95)
    for m, values in sizes.items():
        ax.plot(lengths, to_numpy(values), marker="o", lw=1.6, color=colour(m), label=m)
    if reference is not None:
        ax.plot(lengths, to_numpy(reference), color="black", ls=":", lw=1.0, label=reference_label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(lengths), [str(n) for n in lengths])
    ax.set(xlabel="sequence length N", ylabel="output size / input size")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(**RIGHT)
    return fig


@page_figure
def head_width_figure(live: dict, recorded: dict | None = None, *, chance: float | None = None):
    """Accuracy and the heads' effective rank against the head width D, per mechanism, with the range over the
    seeds: ``live`` hollow and thin, ``recorded`` (or None) filled and thick, each ``[mechanism][D] ->
    {"accuracy": span, "rank": span}`` (:func:`attnbook.lab.claims.head_width_spans`); ``chance`` dotted."""
    where = "head_width_figure"
    check_sequence(live, "live", name=where, mapping=True, minimum=1, item="mechanism")
    # the legend on top, three entries a row: a line per variant and source, chance and the rank limit
    rows = -(-(len(live) * (2 if recorded else 1) + 1 + (chance is not None)) // 3)
    height = 2.9 + 0.25 * rows  # inches: the panels keep their height whatever the legend's
    fig, (ax_acc, ax_rank) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, height))
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.54 / height, top=1 - (0.2 + 0.25 * rows) / height, wspace=0.3)
    sources = [(live, "live", "white", 1.0)] + ([(recorded, "recorded", None, 2.0)] if recorded else [])
    widths: set[int] = set()
    for spans, kind, face, lw in sources:
        for m, per_width in spans.items():
            ds = sorted(per_width)
            widths.update(ds)
            for ax, key in ((ax_acc, "accuracy"), (ax_rank, "rank")):
                mean, low, high = (np.array([per_width[d][key][i] for d in ds]) for i in range(3))
                ax.errorbar(ds, mean, yerr=[mean - low, high - mean], color=colour(m), marker="o",
                            mfc=face or colour(m), lw=lw, capsize=2, label=f"{m}, {kind}")  # fmt: skip
    ds = sorted(widths)
    (limit,) = ax_rank.plot(ds, [d - 1 for d in ds], color="#777777", ls=":", lw=1.0, label="D - 1: linear's limit")
    if chance is not None:
        ax_acc.axhline(chance, color="black", ls=":", lw=1.0, label=f"chance {chance:.3f}")
    for ax, label in ((ax_acc, "recall accuracy"), (ax_rank, "effective rank of a head")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ds, [str(d) for d in ds])
        ax.set(xlabel="head width D (H = C / D heads)", ylabel=label)
        ax.grid(True, alpha=0.3)
    ax_acc.set_ylim(0.0, 1.05)
    handles, labels = ax_acc.get_legend_handles_labels()
    fig.legend([*handles, limit], [*labels, limit.get_label()], ncol=3, **ON_TOP)
    return fig
