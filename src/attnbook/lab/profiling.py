"""Measuring time and memory the same way in the book, the benchmarks and on any device.

* :func:`compare` times several implementations in one run, alternating between them so that a noisy
  neighbour slows all of them alike, and reports medians.
* :func:`peak_memory` reports the peak extra memory a call needs: on CUDA from the caching allocator's
  statistics, on the CPU by tracking every tensor that torch operators allocate while the call runs
  (scratch space private to a fused kernel is not seen there).
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._checks import check_callable, check_callables, check_device, check_instance, check_int

__all__ = ["Timing", "compare", "peak_memory"]


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Median and all samples (seconds) of one implementation."""

    median: float
    samples: tuple[float, ...]


def compare(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    warmup: int = 1,
    device: torch.device | str | None = None,
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
        self.live = 0
        self.peak = 0
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
