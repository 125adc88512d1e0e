"""The cost of generating one token at position t, for every causal mechanism in one alternating run (chapter 7).

Each mechanism's :class:`~attnbook.lm.DecoderLM` generates the same byte sequence one token at a time. At each
measurement position t, every generation is first advanced (untimed) to t, then
:func:`attnbook.lab.profiling.compare` times single :meth:`~attnbook.lm.DecoderLM.step` calls, alternating between
the mechanisms, each call advancing its own generation by one token (so the timed tokens sit at positions
t .. t + warmup + repeats; a requested t that the previous point's calls already passed is measured where the
generations are, and recorded as such). ``min_s``, the fastest of the calls, is the one least disturbed by
other work on a shared machine. Memory is counted, not timed: the bytes of the decoding state after exactly t tokens
(:func:`attnbook.lm.state_bytes`: in use and allocated), and the peak extra memory of one step
(:func:`attnbook.lab.profiling.peak_memory`; on the CPU it sees the tensors torch operators return, not a fused
kernel's private scratch).

Timing does not depend on the weights, so the models are untrained (seed 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from .. import mechanisms
from .._checks import check_count, check_int
from ..lm import state_bytes
from .bench import environment, loglog_slope
from .lm import Setup
from .profiling import compare, peak_memory
from .progress import Progress

__all__ = ["POSITIONS", "measure", "series", "slope", "ratio"]

POSITIONS = tuple(2**i for i in range(4, 14))  # 16 .. 8192


class _Generation:
    """One mechanism's running generation: ``advance()`` feeds the next byte of ``text`` and keeps the state."""

    def __init__(self, model, text: torch.Tensor, device):
        self.model, self.text, self.device = model, text, device
        self.state = None
        self.t = 0

    def advance(self) -> None:
        token = self.text[self.t % self.text.numel()].view(1).to(self.device, torch.long)
        _, self.state = self.model.step(token, self.state)
        self.t += 1


def measure(
    setup: Setup,
    *,
    mechanism_names: Sequence[str] | None = None,
    positions: Sequence[int] = POSITIONS,
    repeats: int = 15,
    warmup: int = 2,
    text: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
) -> dict:
    """Per-token time and memory of generation against the position t (see the module docstring).

    Args:
        setup: the model size (``dim``, ``n_heads``, ``n_layers`` of a :class:`~attnbook.lab.lm.Setup`).
        mechanism_names: default every causal mechanism of the registry.
        positions: increasing positions t at which to measure.
        repeats, warmup: as in :func:`~attnbook.lab.profiling.compare` (each call is one token).
        text: the bytes fed to the models (cycled); default a fixed random byte string.

    Returns:
        A dict with keys ``config``, ``environment`` and ``records``: one record per mechanism and position,
        with keys ``mechanism``, ``t``, ``median_s``, ``min_s``, ``samples_s``, ``state_bytes``,
        ``allocated_bytes``, ``step_peak_bytes`` and ``recurrent``.
    """
    names = list(mechanism_names or mechanisms.names(causal=True))
    check_count(positions, "positions", name="measure", item="position")
    positions = sorted(check_int(t, "positions", name="measure", minimum=1) for t in positions)
    device = torch.device(device)
    if text is None:
        text = torch.randint(256, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    runs = {}
    for name in names:
        torch.manual_seed(0)
        model = setup.model(name).to(device=device, dtype=dtype).eval()
        runs[name] = _Generation(model, text, device)
    bar = Progress(positions[-1] * len(names), enabled=progress)
    records = []
    with torch.inference_mode():
        for t in positions:
            for run in runs.values():
                while run.t < t:
                    run.advance()
                bar.done = sum(min(r.t, positions[-1]) for r in runs.values())
                bar.update(0, note=f"t = {t}")
            at = next(iter(runs.values())).t  # = t, or later when the previous point's calls went past t
            held = {n: (state_bytes(r.state), state_bytes(r.state, allocated=True)) for n, r in runs.items()}
            timing = compare({n: r.advance for n, r in runs.items()}, repeats=repeats, warmup=warmup, device=device)
            for name, run in runs.items():
                records.append(
                    {
                        "mechanism": name,
                        "t": at,
                        "median_s": timing[name].median,
                        "min_s": min(timing[name].samples),
                        "samples_s": list(timing[name].samples),
                        "state_bytes": held[name][0],
                        "allocated_bytes": held[name][1],
                        "step_peak_bytes": peak_memory(run.advance, device),
                        "recurrent": run.model.recurrent,
                    }
                )
    bar.close()
    env = environment(device)
    try:
        env["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    return {
        "kind": "attnbook.lab.generation",
        "environment": env,
        "config": {
            "dim": setup.dim,
            "n_heads": setup.n_heads,
            "n_layers": setup.n_layers,
            "batch": 1,
            "dtype": str(dtype).removeprefix("torch."),
            "positions": positions,
            "repeats": repeats,
            "warmup": warmup,
            "mechanisms": names,
        },
        "records": records,
    }


def series(result: dict, metric: str = "median_s") -> tuple[list[int], dict[str, list[float]]]:
    """``(positions, {mechanism: values})`` of one metric of a :func:`measure` result."""
    ts = sorted({r["t"] for r in result["records"]})
    out: dict[str, list[float]] = {}
    for name in result["config"]["mechanisms"]:
        by_t = {r["t"]: r[metric] for r in result["records"] if r["mechanism"] == name}
        out[name] = [float(by_t.get(t, math.nan)) for t in ts]
    return ts, out


def slope(result: dict, name: str, metric: str = "median_s", lo: int = 256, hi: int = 8192) -> float:
    """Log-log slope of ``metric`` against t for ``name`` between positions ``lo`` and ``hi`` (inclusive)."""
    ts, s = series(result, metric)
    pts = [(t, y) for t, y in zip(ts, s[name], strict=True) if lo <= t <= hi]
    return loglog_slope([t for t, _ in pts], [y for _, y in pts])


def ratio(result: dict, numerator: str, denominator: str, t: int, metric: str = "median_s") -> float:
    """``metric`` of ``numerator`` over that of ``denominator`` at position ``t``."""
    ts, s = series(result, metric)
    i = ts.index(t)
    return s[numerator][i] / s[denominator][i]
