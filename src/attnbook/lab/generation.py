"""The cost of generating one token at position t, for every causal mechanism in one alternating run (chapter 7).

Each mechanism's :class:`~attnbook.lm.DecoderLM` writes the same byte sequence. At each measurement position t,
every generation is first brought to t (untimed: the first t bytes are prefilled in one parallel call), then
:func:`attnbook.lab.profiling.compare` times single steps, alternating between the mechanisms, each call
advancing its own generation by one token (so the timed tokens sit at positions t .. t + warmup + repeats; the
next position is reached by a new prefill, also when the calls went past it).
``min_s``, the fastest of the calls, is the one least disturbed by other work on a shared machine.

Two paths can be timed (``decoders``, in one alternating run): ``"eager"``, :meth:`~attnbook.lm.DecoderLM.step`
(each layer's own ``step``, what :meth:`~attnbook.lm.DecoderLM.generate` uses by default), and ``"compiled"``, that
step compiled by ``torch.compile`` with dynamic shapes (``generate(decoder="compiled")``). Memory is counted,
not timed: the bytes of the decoding state after exactly t tokens (:func:`attnbook.lm.state_bytes`: in use, and
allocated behind it), and the peak extra memory of one step (:func:`attnbook.lab.profiling.peak_memory`; on the
CPU it sees the tensors torch operators return, not a fused kernel's private scratch).

Timing does not depend on the weights, so the models are untrained (seed 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from .. import mechanisms
from .._checks import check_choice, check_count, check_int
from ..lm import state_bytes
from ..viz.lm import series
from .bench import environment, loglog_slope
from .profiling import compare, peak_memory
from .progress import Progress

__all__ = ["POSITIONS", "DECODERS", "measure", "series", "slope", "ratio", "crossover", "cost_table"]

POSITIONS = tuple(2**i for i in range(4, 14))  # 16 .. 8192
DECODERS = ("eager", "compiled")


class _Generation:
    """One mechanism's running generation: :meth:`seek` brings it to position t (a parallel prefill of the first t
    bytes of ``text``), :meth:`advance` feeds the next byte through one step."""

    def __init__(self, model, text: torch.Tensor, device, decoder: str):
        self.model, self.text, self.device = model, text, device
        # the bytes as token ids on the device once, so that a step's next token is a view, not five operations
        self.tokens = text.reshape(-1).to(device, torch.long)
        # fullgraph: past torch's recompile limit (8 graphs of DecoderLM.step in a process) a compiled step would
        # run eagerly, and be timed as compiled; fullgraph makes that an error
        self.step = torch.compile(model.step, dynamic=True, fullgraph=True) if decoder == "compiled" else model.step
        self.state: Any = None
        self.t = 0

    def _bytes(self, start: int, n: int) -> torch.Tensor:
        index = torch.arange(start, start + n) % self.text.numel()
        return self.text[index].view(1, n).to(self.device, torch.long)

    def seek(self, t: int) -> None:
        if t == self.t:
            return
        _, self.state = self.model(self._bytes(0, t), output_final_state=True)
        self.t = t

    def advance(self) -> None:
        i = self.t % self.tokens.numel()
        _, self.state = self.step(self.tokens[i : i + 1], self.state)
        self.t += 1

    def held(self) -> tuple[int, int]:
        """Bytes of the decoding state: in use, and allocated behind it."""
        return state_bytes(self.state), state_bytes(self.state, allocated=True)


def measure(
    setup: Any,
    *,
    mechanism_names: Sequence[str] | None = None,
    positions: Sequence[int] = POSITIONS,
    repeats: int = 15,
    warmup: int = 2,
    text: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    decoders: Sequence[str] = ("eager",),
    burst: int = 1,
    progress: bool = True,
) -> dict:
    """Per-token time and memory of generation against the position t (see the module docstring).

    Args:
        setup: the model size (``dim``, ``n_heads``, ``n_layers`` of a :class:`~attnbook.lab.lm.Setup`).
        mechanism_names: default every causal mechanism of the registry.
        positions: increasing positions t at which to measure.
        repeats, warmup: as in :func:`~attnbook.lab.profiling.compare` (each call is one token).
        text: the bytes fed to the models (cycled); default a fixed random byte string.
        decoders: which of ``"eager"`` and ``"compiled"`` to time (module docstring); each mechanism is timed on
            each, all in one alternating run.
        burst: tokens per timed call (their mean is recorded): 1 times a lone step right after the other
            mechanisms' (its weights and state may have left the processor's caches meanwhile); more times
            the steps of a generation that runs on, as ``generate`` does.

    Returns:
        A dict with keys ``config``, ``environment`` and ``records``: one record per decoder, mechanism and
        position, with keys ``decoder``, ``mechanism``, ``t``, ``median_s``, ``min_s``, ``samples_s``,
        ``state_bytes``, ``allocated_bytes``, ``step_peak_bytes`` (None for a compiled step on the CPU) and
        ``recurrent``.
    """
    names = list(mechanisms.names(causal=True) if mechanism_names is None else mechanism_names)
    check_count(names, "mechanism_names", name="measure", item="mechanism")  # [] measured every mechanism
    check_count(positions, "positions", name="measure", item="position")
    positions = sorted(check_int(t, "positions", name="measure", minimum=1) for t in positions)
    check_count(decoders, "decoders", name="measure", item="decoder")
    decoders = [check_choice(d, "decoders", DECODERS, name="measure") for d in decoders]
    device = torch.device(device)
    if text is None:
        text = torch.randint(256, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    burst = check_int(burst, "burst", name="measure", minimum=1)
    runs = {}
    for name in names:
        torch.manual_seed(0)
        model = setup.model(name).to(device=device, dtype=dtype).eval()
        for decoder in decoders:
            runs[decoder, name] = _Generation(model, text, device, decoder)
    bar = Progress(len(positions) * len(runs), enabled=progress)
    records = []
    with torch.inference_mode():
        for t in positions:
            for run in runs.values():
                run.seek(t)
                bar.update(1, note=f"t = {t}")
            held = {n: r.held() for n, r in runs.items()}
            calls = {n: (lambda r=r: [r.advance() for _ in range(burst)]) for n, r in runs.items()}
            timing = compare(calls, repeats=repeats, warmup=warmup, device=device)
            for (decoder, name), run in runs.items():
                samples = [x / burst for x in timing[decoder, name].samples]
                # the CPU count works by a dispatch mode, which a compiled step cannot run under (and whose fused
                # kernels' storage it would not see): None there
                peak = None if decoder == "compiled" and device.type != "cuda" else peak_memory(run.advance, device)
                records.append(
                    {"decoder": decoder, "mechanism": name, "t": t, "median_s": timing[decoder, name].median / burst,
                     "min_s": min(timing[decoder, name].samples) / burst, "samples_s": samples,
                     "state_bytes": held[decoder, name][0], "allocated_bytes": held[decoder, name][1],
                     "step_peak_bytes": peak, "recurrent": run.model.recurrent}
                )  # fmt: skip
    bar.close()
    env = environment(device)
    try:
        env["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    config = {"dim": setup.dim, "n_heads": setup.n_heads, "n_layers": setup.n_layers, "batch": 1,
              "dtype": str(dtype).removeprefix("torch."), "positions": positions, "repeats": repeats, "warmup": warmup,
              "decoders": decoders, "burst": burst, "mechanisms": names}  # fmt: skip
    return {"kind": "attnbook.lab.generation", "environment": env, "config": config, "records": records}


def slope(
    result: dict, name: str, metric: str = "median_s", lo: int = 256, hi: int = 8192, decoder: str | None = None
) -> float:
    """Log-log slope of ``metric`` against t for ``name`` between positions ``lo`` and ``hi`` (inclusive)."""
    ts, s = series(result, metric, decoder)
    pts = [(t, y) for t, y in zip(ts, s[name], strict=True) if lo <= t <= hi]
    return loglog_slope([t for t, _ in pts], [y for _, y in pts])


def ratio(
    result: dict, numerator: str, denominator: str, t: int, metric: str = "median_s", decoder: str | None = None
) -> float:
    """``metric`` of ``numerator`` over that of ``denominator`` at position ``t``."""
    ts, s = series(result, metric, decoder)
    i = ts.index(t)
    return s[numerator][i] / s[denominator][i]


def crossover(result: dict, metric: str = "median_s", decoder: str | None = None) -> int | None:
    """The first position t from which softmax attention's step stays slower than linear attention's, at every
    later position measured (None if it never does): where the recurrent step starts to win."""
    ts, s = series(result, metric, decoder)
    slower = [a > b for a, b in zip(s["softmax"], s["linear"], strict=True)]
    return next((t for i, t in enumerate(ts) if all(slower[i:])), None)


# -------------------------------------------------------------------------------------------------------------------
# Chapter 7's tables: the cost of writing, live or recorded, for an 80-column page.


def cost_table(result: dict, *, at: Sequence[int] | None = None, metric: str = "median_s") -> str:
    """Per-token time of every decoder and mechanism of a :func:`measure` result (or its recording), as text.

    Columns: milliseconds per token at the positions ``at`` (default: the first, the middle and the last
    measured), the state held after the last (KiB, counted), and softmax's time over each mechanism's there.
    """
    decoders = result["config"].get("decoders", ["eager"])
    ts = sorted({r["t"] for r in result["records"]})
    at = [ts[0], ts[len(ts) // 2], ts[-1]] if at is None else list(at)
    for t in at:
        check_choice(t, "at", ts, name="cost_table")
    last = at[-1]
    label = "median" if metric == "median_s" else "fastest"
    cols = 8 * len(at)
    lines = [
        " " * 17 + f"ms per token ({label})".center(cols) + f"{'state after':>16s}{'softmax/':>10s}",
        " " * 17 + "".join(f"{'t=' + str(t):>8s}" for t in at) + f"{f't={last} (KiB)':>16s}{'this':>10s}",
    ]
    for decoder in decoders:
        _, times = series(result, metric, decoder)
        _, held = series(result, "state_bytes", decoder)
        for i, name in enumerate(times):
            cells = "".join(f"{1e3 * times[name][ts.index(t)]:8.3f}" for t in at)
            kib = held[name][ts.index(last)] / 1024
            over = ratio(result, "softmax", name, last, metric, decoder) if "softmax" in times else math.nan
            lines.append(f"{decoder if i == 0 else '':7s}  {name:8s}{cells}{kib:16.1f}{over:10.2f}")
    return "\n".join(lines)
