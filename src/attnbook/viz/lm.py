"""Figures of chapter 7, two panels stacked, page wide: bits per byte during training, the cost of generation
against the position t."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .._checks import check_all_equal, check_choice
from .plots import field
from .style import PAGE_WIDTH, book_style, line_style

__all__ = ["curve_summary", "plot_bpb", "plot_generation"]


def curve_summary(runs: Sequence) -> dict[str, dict[str, list[float]]]:
    """Per mechanism, over its seeds: steps, mean training seconds, mean / min / max validation bits per byte, of
    :class:`attnbook.lab.lm.Run` objects or their recorded dicts (the runs of one mechanism share their steps)."""
    by_name: dict[str, list] = {}
    for r in runs:
        by_name.setdefault(field(r, "mechanism"), []).append(r)
    out = {}
    for name, group in by_name.items():
        by_seed = {f"run {i}": list(field(r, "steps")) for i, r in enumerate(group)}
        check_all_equal(by_seed, f"the steps of the {name!r} runs", name="curve_summary", what="be equal")
        bpb = np.array([field(r, "valid_bpb") for r in group], dtype=float)  # (seeds, evaluations)
        wall = np.array([field(r, "wall_s") for r in group], dtype=float)
        out[name] = {"steps": by_seed["run 0"], "wall_s": wall.mean(axis=0).tolist(), "mean": bpb.mean(axis=0).tolist()}
        out[name].update(low=bpb.min(axis=0).tolist(), high=bpb.max(axis=0).tolist(), seeds=len(group))
    return out


def plot_bpb(runs: Sequence, *, baselines: Mapping[str, float] | None = None, title: str | None = None):
    """Validation bits per byte against training steps (top) and training seconds (bottom).

    A line per mechanism is the mean over seeds, its band spans the seeds; ``baselines`` (e.g. ``{"unigram":
    4.6}``) are grey lines. The y-range leaves out the first quarter of training (8+ bits would squash the rest).
    """
    summary = curve_summary(runs)
    baselines = dict(baselines or {})
    # the range of the curves after the first quarter of training, and of the reference lines
    skip = max(1, len(next(iter(summary.values()))["steps"]) // 4)
    shown = [v for s in summary.values() for v in s["low"][skip:] + s["high"][skip:]] + list(baselines.values())
    with book_style():
        fig, axes = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 6.2), layout="constrained")
        for ax, x_key, xlabel in ((axes[0], "steps", "training step"), (axes[1], "wall_s", "training seconds")):
            for name, s in summary.items():
                style = line_style(name)
                ax.plot(s[x_key], s["mean"], marker=".", label=name, **style)
                ax.fill_between(s[x_key], s["low"], s["high"], color=style["color"], alpha=0.2, lw=0)
            for i, (label, value) in enumerate(baselines.items()):
                ax.axhline(value, color="grey", lw=0.9, ls=(0, (4, 2 + 2 * i)), label=f"{label} ({value:.2f})")
            if shown:
                ax.set_ylim(min(shown) - 0.15, max(shown) + 0.25)
            ax.set(xlabel=xlabel, ylabel="validation bits per byte")
            ax.grid(True, alpha=0.3)
        axes[0].legend(ncols=3, loc="upper right")
        if title:
            axes[0].set_title(title)
    return fig


def series(
    result: Mapping, metric: str = "median_s", decoder: str | None = None
) -> tuple[list[int], dict[str, list[float]]]:
    """``(positions, {mechanism: values})`` of one metric of a :func:`attnbook.lab.generation.measure` result (or
    its recording), for one ``decoder`` (default the first one timed). Also ``attnbook.lab.generation.series``."""
    decoders = tuple(result["config"].get("decoders", ["eager"]))
    decoder = decoders[0] if decoder is None else check_choice(decoder, "decoder", decoders, name="series")
    records = [r for r in result["records"] if r.get("decoder", "eager") == decoder]
    ts = sorted({r["t"] for r in records})
    out: dict[str, list[float]] = {}
    for name in result["config"]["mechanisms"]:
        by_t = {r["t"]: r[metric] for r in records if r["mechanism"] == name}
        out[name] = [float(by_t.get(t, math.nan)) for t in ts]
    return ts, out


def plot_generation(
    result: Mapping,
    *,
    metric: str = "median_s",
    decoder: str | None = None,
    also: str | None = None,
    title: str | None = None,
):
    """Per-token generation time (top) and the bytes of the decoding state (bottom) against t, log-log.

    ``result`` is a :func:`attnbook.lab.generation.measure` result (or its recording), ``metric`` ``"median_s"``
    or ``"min_s"``; ``decoder`` is drawn solid (default: the first timed), ``also`` dotted in the same colours.
    """
    ts, times = series(result, metric, decoder)
    _, held = series(result, "state_bytes", decoder)
    other = series(result, metric, also)[1] if also is not None else {}
    with book_style():
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 6.2), layout="constrained")
        for i, name in enumerate(times):
            style = line_style(name)
            top.plot(ts, [1e3 * y for y in times[name]], marker="o", ms=3, label=name, **style)
            if name in other:
                top.plot(ts, [1e3 * y for y in other[name]], marker=".", ms=3, lw=1.0, ls=":", color=style["color"])
            # equal states (softmax and MoH keep the same cache) would hide each other: earlier lines wider
            width = 1.5 + 2.0 * (len(times) - 1 - i) / max(1, len(times) - 1)
            bottom.plot(ts, [y / 1024 for y in held[name]], marker="o", ms=3, lw=width, label=name, **style)
        if other:
            top.plot([], [], color="grey", lw=1.0, ls=":", label=f"dotted: {also}")
        # a guide of slope 1 through the slowest mechanism's last point: what "time grows like t" looks like
        t = np.asarray(ts, dtype=float)
        slowest = max(times, key=lambda n: times[n][-1])
        top.plot(t, 1e3 * times[slowest][-1] * t / t[-1], color="grey", lw=0.8, ls="--", label="∝ t")
        shown = [y for v in (*times.values(), *other.values()) for y in v]
        top.set_ylim(bottom=0.5 * 1e3 * min(shown), top=2.0 * 1e3 * max(shown))
        top.set_ylabel(f"ms per token ({'fastest' if metric == 'min_s' else 'median'})")
        bottom.set_ylabel("decoding state (KiB)")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(plain)
            ax.set_xlabel("position t of the generated token")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(ncols=3)
        # times span a decade or two: label 1, 2 and 5 of each decade, not every minor tick (they would collide)
        top.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        top.yaxis.set_major_formatter(plain)
        top.yaxis.set_minor_formatter(NullFormatter())
        if title:
            top.set_title(title)
    return fig
