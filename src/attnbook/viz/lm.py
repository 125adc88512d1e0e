"""Figures of chapter 7: bits per byte during training, the cost of generation against the position t.

Both figures are drawn for the book's column (:data:`~attnbook.viz.style.PAGE_WIDTH`), two panels stacked, one
colour per mechanism (:func:`~attnbook.viz.style.line_style`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .._checks import check_all_equal, check_choice
from .style import PAGE_WIDTH, book_style, line_style

__all__ = ["curve_summary", "plot_bpb", "plot_generation"]


def _get(run, key):
    return run[key] if isinstance(run, Mapping) else getattr(run, key)


def curve_summary(runs: Sequence) -> dict[str, dict[str, list[float]]]:
    """Per mechanism, over its seeds: steps, mean training seconds, mean / min / max validation bits per byte.

    ``runs`` are :class:`attnbook.lab.lm.Run` objects or their recorded dicts (``mechanism``, ``steps``,
    ``wall_s``, ``valid_bpb``); the runs of one mechanism must share their steps.
    """
    by_name: dict[str, list] = {}
    for r in runs:
        by_name.setdefault(_get(r, "mechanism"), []).append(r)
    out = {}
    for name, group in by_name.items():
        steps = list(_get(group[0], "steps"))
        by_seed = {f"run {i}": list(_get(r, "steps")) for i, r in enumerate(group)}
        check_all_equal(by_seed, f"the steps of the {name!r} runs", name="curve_summary", what="be equal")
        bpb = np.array([_get(r, "valid_bpb") for r in group], dtype=float)  # (seeds, evaluations)
        wall = np.array([_get(r, "wall_s") for r in group], dtype=float)
        out[name] = {
            "steps": steps,
            "wall_s": wall.mean(axis=0).tolist(),
            "mean": bpb.mean(axis=0).tolist(),
            "low": bpb.min(axis=0).tolist(),
            "high": bpb.max(axis=0).tolist(),
            "seeds": len(group),
        }
    return out


def plot_bpb(runs: Sequence, *, baselines: Mapping[str, float] | None = None, title: str | None = None):
    """Validation bits per byte against training steps (top) and training seconds (bottom).

    A line per mechanism is the mean over seeds, the band around it spans the lowest and highest seed.
    ``baselines`` (e.g. ``{"unigram": 4.6, "bigram": 3.5}``) are drawn as grey reference lines. The y-range
    covers the baselines and the curves after the first quarter of training (the untrained model's 8+ bits
    would squash the differences that matter).
    """
    summary = curve_summary(runs)
    with book_style():
        fig, axes = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 6.2), layout="constrained")
        for ax, x_key, xlabel in ((axes[0], "steps", "training step"), (axes[1], "wall_s", "training seconds")):
            for name, s in summary.items():
                style = line_style(name)
                ax.plot(s[x_key], s["mean"], marker=".", label=name, **style)
                ax.fill_between(s[x_key], s["low"], s["high"], color=style["color"], alpha=0.2, lw=0)
            for i, (label, value) in enumerate((baselines or {}).items()):
                ax.axhline(value, color="grey", lw=0.9, ls=(0, (4, 2 + 2 * i)), label=f"{label} ({value:.2f})")
            # the range of the curves after the first quarter of training, and of the reference lines
            skip = max(1, len(next(iter(summary.values()))["steps"]) // 4)
            shown = [v for s in summary.values() for v in s["low"][skip:] + s["high"][skip:]]
            shown += list((baselines or {}).values())
            if shown:
                ax.set_ylim(min(shown) - 0.15, max(shown) + 0.25)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("validation bits per byte")
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

    ``result`` is a :func:`attnbook.lab.generation.measure` result (or its recording); ``metric`` the timing
    to plot (``"median_s"`` or ``"min_s"``, the fastest call); ``decoder`` the path drawn in solid lines
    (default the first one timed) and ``also`` a second one drawn dotted in the same colours (e.g. ``"eager"``,
    the teaching path, beside ``"compiled"``).
    """
    ts, times = series(result, metric, decoder)
    _, held = series(result, "state_bytes", decoder)
    other = series(result, metric, also)[1] if also is not None else {}
    label = "fastest" if metric == "min_s" else "median"
    with book_style():
        fig, axes = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 6.2), layout="constrained")
        for i, name in enumerate(times):
            style = line_style(name)
            axes[0].plot(ts, [1e3 * y for y in times[name]], marker="o", ms=3, label=name, **style)
            if name in other:
                axes[0].plot(ts, [1e3 * y for y in other[name]], marker=".", ms=3, lw=1.0, ls=":", color=style["color"])
            # equal states (softmax and MoH keep the same cache) would hide each other: earlier lines wider
            width = 1.5 + 2.0 * (len(times) - 1 - i) / max(1, len(times) - 1)
            axes[1].plot(ts, [y / 1024 for y in held[name]], marker="o", ms=3, lw=width, label=name, **style)
        if other:
            axes[0].plot([], [], color="grey", lw=1.0, ls=":", label=f"dotted: {also}")
        # a guide of slope 1 through the slowest mechanism's last point: what "time grows like t" looks like
        t = np.asarray(ts, dtype=float)
        slowest = max(times, key=lambda n: times[n][-1])
        axes[0].plot(t, 1e3 * times[slowest][-1] * t / t[-1], color="grey", lw=0.8, ls="--", label="∝ t")
        shown = [y for v in (*times.values(), *other.values()) for y in v]
        axes[0].set_ylim(bottom=0.5 * 1e3 * min(shown), top=2.0 * 1e3 * max(shown))
        axes[0].set_ylabel(f"ms per token ({label})")
        axes[1].set_ylabel("decoding state (KiB)")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(plain)
        # times span a decade or two: label 1, 2 and 5 of each decade, not every minor tick (they would collide)
        axes[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes[0].yaxis.set_major_formatter(plain)
        axes[0].yaxis.set_minor_formatter(NullFormatter())
        for ax in axes:
            ax.set_xlabel("position t of the generated token")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(ncols=3)
        if title:
            axes[0].set_title(title)
    return fig
