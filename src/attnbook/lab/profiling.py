"""Measuring time and memory the same way in the book, the benchmarks and on any device.

* :func:`compare` times several implementations in one run, alternating between them so that a noisy
  neighbour slows all of them alike, and reports medians.
* :func:`peak_memory` reports the peak extra memory a call needs: on CUDA from the caching allocator's
  statistics, on the CPU by tracking every tensor that torch operators allocate while the call runs
  (scratch space private to a fused kernel is not seen there).
* :func:`measure_scaling` does both for several implementations at several sequence lengths (the book's
  cost figures), and :class:`Scaling` holds the result and fits its exponents.
* :func:`matmul_flops` counts the floating-point operations of the matrix products a call makes.
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._checks import (
    check_callable,
    check_callables,
    check_choice,
    check_device,
    check_found,
    check_instance,
    check_int,
    check_number,
    check_sequence,
    check_subset,
)

__all__ = ["Timing", "compare", "peak_memory", "Scaling", "measure_scaling", "matmul_flops"]


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Median and all samples (seconds) of one implementation."""

    median: float
    samples: tuple[float, ...]


def compare(
    fns: dict[str, Callable[[], object]], *, repeats: int = 7, warmup: int = 1, device: torch.device | str | None = None
) -> dict[str, Timing]:
    """Time each zero-argument callable ``repeats`` times, alternating between them; medians per name.

    ``device`` (e.g. ``"cuda"``) synchronises around each call so GPU work is counted.
    """
    check_callables(fns, "fns", name="compare")
    repeats = check_int(repeats, "repeats", name="compare", minimum=1)
    warmup = check_int(warmup, "warmup", name="compare", minimum=0)
    device = check_device(device, name="compare")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeats):
        order = list(fns.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            samples[name].append(time.perf_counter() - t0)
    return {name: Timing(statistics.median(s), tuple(s)) for name, s in samples.items()}


class _AllocationTracker(TorchDispatchMode):
    """Counts bytes of tensors produced by torch operators while alive; remembers the peak.

    Storages in ``existing`` (data pointers) are not new memory: outputs that are views of them count nothing.
    """

    def __init__(self, existing: set[int] = frozenset()):
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set(existing)

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Outputs that share storage with an input (views, in-place ops) allocate nothing new.
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.device.type == "cpu"
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in inputs or key in self._seen or storage.nbytes() == 0:
                    continue
                self._seen.add(key)
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._release, key, storage.nbytes())
        return out


def peak_memory(
    fn: Callable[[], object], device: torch.device | str = "cpu", *, existing: Sequence[torch.Tensor] = ()
) -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before it started.

    On CUDA this is the caching allocator's peak. On the CPU it counts tensors returned by torch operators
    (a tensor is released when its Python object is; storage private to a fused kernel is invisible).
    ``existing`` (CPU) lists tensors that are already there, such as the inputs: an operator's output that
    shares one of their storages (a view, a reshape, an in-place write) is not new memory, even when the
    operator's own arguments did not include that tensor.
    """
    check_callable(fn, "fn", name="peak_memory", what="a zero-argument callable")
    device = check_device(device, name="peak_memory") or torch.device("cpu")
    for i, x in enumerate(existing):
        check_instance(x, f"existing[{i}]", torch.Tensor, name="peak_memory", what="a torch.Tensor")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    tracker = _AllocationTracker({x.untyped_storage().data_ptr() for x in existing})
    with tracker:
        fn()
    return tracker.peak


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (the fit of an exponent on log scales)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


@dataclass(frozen=True)
class Scaling:
    """Time and memory of several implementations against the sequence length N (:func:`measure_scaling`).

    Attributes:
        lengths: the sequence lengths N, in the order measured.
        times: name -> median seconds at each N (NaN where that implementation was not timed at that N).
        memory: name -> peak extra bytes at each N (NaN where not measured).
    """

    lengths: tuple[int, ...]
    times: dict[str, list[float]]
    memory: dict[str, list[float]]

    def measured(self, name: str, metric: str = "time") -> tuple[list[int], list[float]]:
        """The lengths and values where ``name`` was measured (``metric``: ``"time"`` or ``"memory"``)."""
        where = "Scaling.measured"
        check_choice(metric, "metric", ("time", "memory"), name=where)
        table = self.times if metric == "time" else self.memory
        check_choice(name, "name", tuple(table), name=where, why=f" (the implementations whose {metric} was measured)")
        pairs = [(n, y) for n, y in zip(self.lengths, table[name], strict=True) if not math.isnan(y)]
        return [n for n, _ in pairs], [y for _, y in pairs]

    def exponent(self, name: str, metric: str = "time", *, last: int | None = 2) -> float:
        """The exponent p of ``value ~ N^p``: the least-squares slope of log value against log N over the
        ``last`` largest lengths where ``name`` was measured (2: between the two largest; None: all of them)."""
        where = "Scaling.exponent"
        pairs = sorted(zip(*self.measured(name, metric), strict=True))  # by N: the lengths may be measured in any order
        for n, y in pairs:  # on a log scale
            check_number(y, f"the {metric} at N = {n}", name=where, minimum=0.0, strict_minimum=True)
        ns, ys = [n for n, _ in pairs], [y for _, y in pairs]
        if last is not None:
            last = check_int(last, "last", name=where, minimum=2)
            ns, ys = ns[-last:], ys[-last:]
        check_found(ns, f"the {metric} of {name!r}", name=where, expected="be measured at two lengths at least",
                    got=f"{len(ns)}", minimum=2)  # fmt: skip
        return _slope([math.log(n) for n in ns], [math.log(y) for y in ys])


def measure_scaling(
    fns: Mapping[str, Callable[..., object]],
    lengths: Sequence[int],
    make_inputs: Callable[[int], Sequence[torch.Tensor]],
    *,
    timed: bool | Iterable[str] = True,
    memory: bool | Iterable[str] = False,
    up_to: Mapping[str, int] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    device: torch.device | str | None = None,
) -> Scaling:
    """Median time and peak memory of ``fn(*make_inputs(N))`` for every implementation and every length N.

    At each N the inputs are made once and shared; the timed implementations run in one :func:`compare` call
    (alternating, so a noisy neighbour slows them alike), then :func:`peak_memory` measures one more call of
    each implementation whose memory is asked for. Nothing is checked about the results: timings on a shared
    machine are for printing, not for asserting.

    Args:
        fns: name -> callable taking the inputs, e.g. ``{"SDPA": attnbook.softmax_attention}``.
        lengths: the sequence lengths N.
        make_inputs: N -> the inputs (for example ``[q, k, v]``).
        timed, memory: True (every implementation), False (none) or the names to time / to measure.
        up_to: name -> the largest N at which to run it (a quadratic implementation stops early); NaN above.
        repeats, warmup: passed to :func:`compare`.
        device: synchronised around each timed call; the memory counter's device (default the CPU).

    Returns:
        a :class:`Scaling`.
    """
    where = "measure_scaling"
    check_sequence(fns, "fns", name=where, mapping=True, minimum=1, item="implementation")
    for key, fn in fns.items():
        check_callable(fn, f"fns[{key!r}]", name=where)
    check_sequence(lengths, "lengths", name=where, minimum=1, item="length")
    lengths = tuple(check_int(n, f"lengths[{i}]", name=where, minimum=1) for i, n in enumerate(lengths))
    check_callable(make_inputs, "make_inputs", name=where, what="a callable N -> inputs")
    timed, counted = (_names(sel, arg, fns, where) for sel, arg in ((timed, "timed"), (memory, "memory")))
    limits = dict(up_to or {})
    check_subset(limits, "up_to", fns, name=where)
    limits = {key: check_int(n, f"up_to[{key!r}]", name=where, minimum=1) for key, n in limits.items()}
    repeats = check_int(repeats, "repeats", name=where, minimum=1)
    warmup = check_int(warmup, "warmup", name=where, minimum=0)
    device = check_device(device, name=where)
    times = {key: [math.nan] * len(lengths) for key in timed}
    peaks = {key: [math.nan] * len(lengths) for key in counted}
    for i, n in enumerate(lengths):
        inputs = make_inputs(n)
        runs = {key: (lambda fn=fns[key], x=inputs: fn(*x)) for key in fns if n <= limits.get(key, n)}
        now = {key: fn for key, fn in runs.items() if key in times}
        if now:
            for key, t in compare(now, repeats=repeats, warmup=warmup, device=device).items():
                times[key][i] = t.median
        for key in peaks:
            if key in runs:
                peaks[key][i] = float(peak_memory(runs[key], device=device or "cpu"))
        del inputs, runs, now
    return Scaling(lengths, times, peaks)


def _names(selection, arg: str, fns: Mapping[str, object], where: str) -> list[str]:
    if isinstance(selection, bool):
        return list(fns) if selection else []
    chosen = list(check_sequence(list(selection) if isinstance(selection, (set, frozenset)) else selection,
                                 arg, name=where, what="True, False or a list of names"))  # fmt: skip
    check_subset(chosen, arg, fns, name=where)
    return [key for key in fns if key in chosen]


def matmul_flops(fn: Callable[[], object]) -> int:
    """The floating-point operations of the matrix products ``fn()`` makes, as torch's ``FlopCounterMode``
    counts them: 2 per multiply-add of ``mm``, ``bmm``, ``matmul``, convolutions and the attention kernels it
    knows; elementwise operations (exp, division, ...) count 0. On the CPU it sees the math inside
    ``scaled_dot_product_attention`` only for the kernels it has a formula for.

    Example:
        >>> import torch
        >>> from attnbook.lab.profiling import matmul_flops
        >>> a, b = torch.ones(3, 4), torch.ones(4, 5)
        >>> matmul_flops(lambda: a @ b)  # 3 x 5 outputs, 4 multiply-adds each
        120
    """
    from torch.utils.flop_counter import FlopCounterMode

    check_callable(fn, "fn", name="matmul_flops", what="a zero-argument callable")
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())
