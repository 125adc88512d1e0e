"""Estimate each chapter's time at full size on an NVIDIA T4 and an H200, from the operations it runs.

    python benchmarks/estimate_chapters.py                          # every chapter of _toc.yml, table on stdout
    python benchmarks/estimate_chapters.py --out _build/estimate.json 06_head_to_head
    python benchmarks/estimate_chapters.py --set "06:ch06-002:RACE=dict(pairs=8, seeds=3, steps=400, every=50,
        width=64, lr=5e-3)" --lab "lm.FULL = dataclasses.replace(lm.FULL, steps=300)"   # what-if sizes

Nothing here needs a GPU, and no chapter is executed at full size: each chapter's heavy workloads (its
training runs, its timing sweeps, its checks on full-size tensors; :data:`WORKLOADS` lists them with the cell
they stand for) are run once at full size, counted, and multiplied by how often the chapter runs them.

**The sizes** come from where the chapter takes them: the ``config.pick(small=..., full=...)`` calls of its
cells, parsed from the notebook (their ``full=`` expressions; literal assignments such as ``B, H, D = 1, 4,
64`` are read too), and the lab's full-size setups (``attnbook.lab.claims.listops_sizes()``,
``attnbook.lab.lm.setup()``, ...) under ``ATTNBOOK_FAST=0``. ``--set`` and ``--lab`` try other sizes without
editing anything.

**What is counted**, by a ``TorchDispatchMode`` around each workload: every ATen operator call that launches a
kernel (views, ``empty`` and ``detach`` launch nothing and are not counted), its FLOPs
(``torch.utils.flop_counter``'s formulas for matmuls and SDPA; SDPA counts as one fused kernel, 4 B H N M D
forward, twice that backward, half of each when causal) and its bytes moved (the tensors it reads and writes,
each at most its storage). Tensor functions run on the ``meta`` device (shapes only, nothing computed; an
``.item()`` there is counted as one kernel and answers 1.0, or 0 / False for integers and booleans); SDPA on
``meta`` is routed to the fused CPU kernel's ``meta`` form, so it is counted as the fused kernel a GPU runs,
not as torch's N x M math fallback. Training runs go through the lab's own code (``training.fit``, the one
training harness; on the CPU at full size, or on ``meta`` for chapter 7's language model, whose step is 100
GFLOP) with ``fit`` replaced: it runs one evaluation and one step under the counter, weighted by the number of
evaluations (``1 + steps // eval_every``, plus one after the last step if that is not a multiple) and of
steps; models of the same shape are counted once. ``profiling.compare`` runs each callable once, weighted by
``warmup + repeats``; ``profiling.peak_memory`` runs it once. Loops of identical steps (token by token
generation, recurrent steps) are counted at two lengths and extrapolated linearly. The plain torch forms are
counted (``config.set_plain(True)``), as a GPU runs them.

**The time model**, per operator on each card: ``max(launch, FLOPs / (peak * 0.5), bytes / (bandwidth *
0.7))``, summed. ``launch`` (8 us on a T4, 5 us on an H200) is the fixed cost of an eager operator: Python,
the dispatcher and the kernel launch; small models on a GPU are bound by it. The peaks: float32 without
tensor cores, float16 and bfloat16 on tensor cores (a T4 has none for bfloat16: its float32 rate), float64 at
the card's float64 rate. 0.5 and 0.7 are the fractions of peak compute and bandwidth an eager kernel is
assumed to reach. Host work that does not shrink on a GPU is added as measured on this machine's CPU, one
thread, the least of a few timings: the lab's batches (ListOps expressions are made in Python), and the
workloads that a chapter runs on the CPU whatever the device (a claims study whose cell passes no
``device=device``; chapter 3's retrieval toy; chapter 7's checks, whose tensors are made on the CPU), for which
the measured CPU time *is* the estimate (one step timed, times the steps).
Each chapter is also charged a fixed ``10 s + 0.1 s per code cell`` for the kernel's start, imports, figures
and the small cells.

**What is not counted**: the cells not listed in :data:`WORKLOADS` (beyond the fixed charge), compilation
(no chapter compiles at full size), early stopping (chapter 6's race stops a run at 98 % twice in a row: its
estimate is an upper bound), the difference between this CPU and the GPU machine's host CPU (a Colab T4's two
vCPUs are slower than most), data-dependent kernels (a kernel's real efficiency at small sizes is often far
below the fractions above, which makes the ``FLOPs`` term optimistic for small matmuls; the ``launch`` term
usually dominates there anyway), and memory: ``largest_tensor_gb`` reports the largest single tensor, not the
peak, so a chapter near a T4's 16 GB needs a real run to know.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

ROOT = Path(__file__).resolve().parents[1]

# -- the cards ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    """A GPU's peak rates, as the model uses them."""

    name: str
    flops: dict[torch.dtype, float]  # peak FLOP/s per operand dtype
    bandwidth: float  # bytes/s
    memory: float  # bytes
    launch_s: float  # fixed cost of one eager operator

    def peak(self, dtype: torch.dtype | None) -> float:
        return self.flops.get(dtype, self.flops[torch.float32])


CARDS = {
    "T4": Card(
        "NVIDIA T4",
        {torch.float32: 8.1e12, torch.float16: 65e12, torch.bfloat16: 8.1e12, torch.float64: 0.25e12},
        bandwidth=320e9,
        memory=16e9,
        launch_s=8e-6,
    ),
    "H200": Card(
        "NVIDIA H200",
        {torch.float32: 60e12, torch.float16: 990e12, torch.bfloat16: 990e12, torch.float64: 34e12},
        bandwidth=4.8e12,
        memory=141e9,
        launch_s=5e-6,
    ),
}
COMPUTE_EFFICIENCY = 0.5
BANDWIDTH_EFFICIENCY = 0.7
CHAPTER_FIXED_S = 10.0
PER_CELL_S = 0.1
BUDGET_S = {"T4": 600.0, "H200": 60.0}

# ATen operators that launch no kernel: allocation, aliasing, metadata
NO_KERNEL = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "set_",
    "resize_",
    "_local_scalar_dense_",
}


def _sdpa_cpu_flops(backward: bool):
    """FLOPs of the CPU flash kernel's forward / backward (not in torch's flop registry): counted as the fused
    kernel of a GPU, 4 B H N M D forward (2 for Q K^T, 2 for P V), twice that backward, halved when causal."""

    def count(*args, **kwargs) -> int:
        q, k = (args[1], args[2]) if backward else (args[0], args[1])
        at = 7 if backward else 4  # is_causal's position in the operator's schema
        causal = args[at] if len(args) > at else kwargs.get("is_causal", False)
        *batch, n, d = q.shape
        m = k.shape[-2]
        flops = 4 * math.prod(batch) * n * m * d * (2 if backward else 1)
        return flops // 2 if causal else flops

    return count


EXTRA_FLOPS = {
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu_flops(False),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_flops(True),
}


def _nbytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches reading or writing ``t``: its elements, at most its storage (expanded views)."""
    n = t.numel() * t.element_size()
    try:
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return n


# -- the counter ----------------------------------------------------------------------------------------------


@dataclass
class Totals:
    """What a workload costs: counts and the modelled seconds per card, plus measured host seconds."""

    flops: float = 0.0
    bytes: float = 0.0
    launches: float = 0.0
    card_s: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CARDS})
    host_s: float = 0.0
    largest_tensor: int = 0

    def add(self, other: Totals, weight: float = 1.0) -> None:
        self.flops += weight * other.flops
        self.bytes += weight * other.bytes
        self.launches += weight * other.launches
        for c in self.card_s:
            self.card_s[c] += weight * other.card_s[c]
        self.host_s += weight * other.host_s
        self.largest_tensor = max(self.largest_tensor, other.largest_tensor)

    def copy(self) -> Totals:
        out = Totals()
        out.add(self)
        return out

    def minus(self, other: Totals) -> Totals:
        out = self.copy()
        out.add(other, -1.0)
        out.largest_tensor = self.largest_tensor
        return out


class Meter(TorchDispatchMode):
    """Counts kernels, FLOPs and bytes of every operator run while it is active, each weighted by the current
    :meth:`scaled` factor, and models their time on every card of :data:`CARDS`."""

    def __init__(self) -> None:
        super().__init__()
        self.totals = Totals()
        self.scale = 1.0
        self.active = True
        self.on_stack = False

    def __enter__(self):
        self.on_stack = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.on_stack = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            # .item() on meta (a training loop's loss, a check's any()): a host sync counted as one kernel, and a
            # stand-in value: 1.0 for a float, 0 / False otherwise (so that no check raises)
            self._count(func, args, kwargs, [])
            return 1.0 if args[0].is_floating_point() else (False if args[0].dtype == torch.bool else 0)
        out = func(*args, **kwargs)
        self._count(func, args, kwargs, out)
        return out

    def _count(self, func, args, kwargs, out) -> None:
        if not self.active or self.scale == 0:
            return
        name = func._overloadpacket.__name__
        if func.is_view or name in NO_KERNEL:
            return
        packet = func._overloadpacket
        flops = 0
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        elif name in EXTRA_FLOPS:
            flops = EXTRA_FLOPS[name](*args, **kwargs)
        tensors_in = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        tensors_out = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        moved = sum(_nbytes(t) for t in tensors_in + tensors_out)
        dtype = next((t.dtype for t in tensors_in if t.is_floating_point()), None)
        t = self.totals
        w = self.scale
        t.flops += w * flops
        t.bytes += w * moved
        t.launches += w
        for key, card in CARDS.items():
            compute = flops / (card.peak(dtype) * COMPUTE_EFFICIENCY)
            memory = moved / (card.bandwidth * BANDWIDTH_EFFICIENCY)
            t.card_s[key] += w * max(card.launch_s, compute, memory)
        if tensors_out:
            t.largest_tensor = max(t.largest_tensor, *(_nbytes(x) for x in tensors_out))

    @contextlib.contextmanager
    def scaled(self, factor: float) -> Iterator[None]:
        """Everything counted inside counts ``factor`` times (nested factors multiply)."""
        before = self.scale
        self.scale = before * factor
        try:
            yield
        finally:
            self.scale = before

    @contextlib.contextmanager
    def counting(self, on: bool) -> Iterator[None]:
        before = self.active
        self.active = on
        try:
            yield
        finally:
            self.active = before

    def measure(self, fn: Callable[[], object]) -> Totals:
        """What one call of ``fn`` counts, unweighted, kept apart from the running totals."""
        saved = self.totals, self.scale, self.active
        self.totals, self.scale, self.active = Totals(), 1.0, True
        try:
            with contextlib.nullcontext() if self.on_stack else self:
                fn()
            return self.totals
        finally:
            self.totals, self.scale, self.active = saved

    def host(self, seconds: float) -> None:
        """Host seconds measured on this CPU, weighted like the operators."""
        self.totals.host_s += self.scale * seconds


def linear_count(meter: Meter, run: Callable[[int], object], target: int, small: int = 2, large: int = 6) -> None:
    """Count ``run(target)`` as ``run(small)`` and ``run(large)`` extrapolated linearly in the count: for loops
    whose every iteration costs the same (token-by-token generation, recurrent steps)."""
    if target <= large:
        run(target)
        return
    f = (target - small) / (large - small)
    with meter.scaled(1 - f):
        run(small)
    with meter.scaled(f):
        run(large)


# -- stand-ins for the lab's loops ------------------------------------------------------------------------------


class Stand:
    """Replaces ``training.fit``, ``profiling.compare`` and ``profiling.peak_memory`` while a workload runs.

    ``cpu`` (the chapter runs this workload on the CPU whatever the device): steps are timed without the
    counter on this CPU and the time, times the steps, is host time; the counter still counts one step for
    the table. Otherwise (a GPU workload) one step is counted, weighted by the steps.
    """

    def __init__(self, meter: Meter, cpu: bool):
        self.meter = meter
        self.cpu = cpu
        self.inside_s = 0.0  # real time spent inside the stand-ins (not part of the estimate)
        self.cache: dict[tuple, tuple[Totals, Totals, float, float, float]] = {}

    # training.fit ---------------------------------------------------------------------------------------------
    def fit(self, model, next_batch, loss, *, steps, optim, evaluate, eval_every, device, after_step=None):
        t_enter = time.perf_counter()
        evals = 1 + steps // eval_every + (1 if steps % eval_every else 0)
        meter = self.meter
        with _disable_current_modes():
            batch = next_batch(1)
            # the host's share of a step: its batch (the first few calls run up to 100 times slower here)
            batch_s = _least(lambda: next_batch(1), 5, warmup=8)
        shapes = tuple(tuple(x.shape) for x in tree_leaves(batch) if isinstance(x, torch.Tensor))
        key = (repr(model), shapes, type(optim).__name__, optim.clip, optim.foreach)
        opt = optim.optimizer(model)
        model.train()

        def one_step() -> None:
            for group in opt.param_groups:
                group["lr"] = optim.learning_rate(0, steps)
            value = loss(model, batch)
            opt.zero_grad(set_to_none=True)
            value.backward()
            if optim.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip, foreach=optim.foreach)
            opt.step()
            if after_step is not None:
                after_step(1, value.detach())

        if key in self.cache:
            step_t, eval_t, step_s, eval_s, _ = self.cache[key]
            with meter.counting(False):
                evaluate(0, 0.0)  # the lab's bookkeeping wants one point
        else:
            eval_t = meter.measure(lambda: evaluate(0, 0.0))  # as fit: an evaluation before the first step
            step_t = meter.measure(one_step)
            step_s = eval_s = 0.0
            if self.cpu:
                with _disable_current_modes():
                    step_s = _least(one_step, CPU_SAMPLES)  # the least: a busy machine only slows a step
                    eval_s = _least(lambda: evaluate(0, 0.0), 2)
            self.cache[key] = (step_t, eval_t, step_s, eval_s, batch_s)
        w = meter.scale
        meter.totals.add(step_t, w * steps)
        meter.totals.add(eval_t, w * evals)
        meter.host(batch_s * steps + (step_s * steps + eval_s * evals if self.cpu else 0.0))
        self.inside_s += time.perf_counter() - t_enter
        return 0.0

    # profiling.compare -------------------------------------------------------------------------------------------
    def compare(self, fns, *, repeats=7, warmup=1, device=None):
        from attnbook.lab.profiling import Timing

        t_enter = time.perf_counter()
        out = {}
        for name, fn in fns.items():
            if self.cpu:
                with _disable_current_modes():
                    t0 = time.perf_counter()
                    fn()
                    self.meter.host((time.perf_counter() - t0) * (repeats + warmup))
            else:
                with self.meter.scaled(repeats + warmup):
                    fn()
            out[name] = Timing(1e-3, (1e-3,) * repeats)
        self.inside_s += time.perf_counter() - t_enter
        return out

    # profiling.peak_memory ----------------------------------------------------------------------------------------
    def peak_memory(self, fn, device="cpu", *, existing=()):
        t_enter = time.perf_counter()
        if self.cpu:
            with _disable_current_modes():
                t0 = time.perf_counter()
                fn()
                self.meter.host(time.perf_counter() - t0)
        else:
            fn()
        self.inside_s += time.perf_counter() - t_enter
        return 0


CPU_SAMPLES = 5


def _least(fn: Callable[[], object], samples: int, warmup: int = 1) -> float:
    """The least of ``samples`` timings of ``fn()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


_SDPA = F.scaled_dot_product_attention


def _sdpa_fused_on_meta(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    """SDPA as one fused kernel on ``meta`` tensors (the CPU flash kernel's meta form), as a GPU runs it; torch's
    meta dispatch would otherwise take the math fallback and count an N x M matrix a GPU never writes."""
    if query.device.type == "meta" and not kwargs.get("enable_gqa", False) and query.dim() == 4:
        out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return out
    return _SDPA(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs
    )


@contextlib.contextmanager
def instrumented(stand: Stand) -> Iterator[None]:
    """The stand-ins in place of the lab's loops, wherever the lab imported them by name."""
    from attnbook import config
    from attnbook.lab import bench, generation, lm, profiling, training

    patches = [
        (training, "fit", stand.fit),
        (lm, "fit", stand.fit),
        (profiling, "compare", stand.compare),
        (bench, "compare", stand.compare),
        (generation, "compare", stand.compare),
        (profiling, "peak_memory", stand.peak_memory),
        (bench, "peak_memory", stand.peak_memory),
        (generation, "peak_memory", stand.peak_memory),
        (F, "scaled_dot_product_attention", _sdpa_fused_on_meta),
    ]
    saved = [(m, a, getattr(m, a)) for m, a, _ in patches]
    for m, a, v in patches:
        setattr(m, a, v)
    # the plain torch forms, as on a GPU (the CPU annex takes causal linear attention on one thread)
    config.set_plain(True)
    try:
        yield
    finally:
        config.set_plain(None)
        for m, a, v in saved:
            setattr(m, a, v)


# -- the chapters' sizes, read from their cells ----------------------------------------------------------------


def _is_pick(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "pick"
        and any(k.arg == "full" for k in node.keywords)
    )


def _full_source(call: ast.Call) -> str:
    return ast.unparse(next(k.value for k in call.keywords if k.arg == "full"))


SIZE_NAMESPACE: dict[str, Any] = {"torch": torch, "range": range, "dict": dict, "list": list, "tuple": tuple}


class Notebook:
    """A chapter's code cells by id, and the sizes its cells pick: ``full(cell, name)``."""

    def __init__(self, path: Path, overrides: dict[tuple[str, str], str] | None = None):
        self.path = path
        nb = json.loads(path.read_text())
        self.cells = {
            c.get("id", str(i)): "".join(c["source"]) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
        }
        self.overrides = dict(overrides or {})
        self.picks: dict[tuple[str, str], str] = {}  # (cell, name) -> full expression source
        self.shown: dict[str, str] = {}  # "cell/target" -> full expression, as written
        self.literals: dict[tuple[str, str], str] = {}  # (cell, name) -> literal expression source
        for cell, src in self.cells.items():
            try:
                tree = ast.parse(src)
            except SyntaxError:  # a cell with magics
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    self._assign(cell, node.targets[0], node.value)
                elif isinstance(node, ast.keyword) and node.arg and _is_pick(node.value):
                    self.picks[(cell, node.arg)] = self.shown[f"{cell}/{node.arg}"] = _full_source(node.value)
                elif isinstance(node, ast.keyword) and node.arg and _literal(node.value):  # repeats=3
                    self.literals.setdefault((cell, node.arg), ast.unparse(node.value))

    def _assign(self, cell: str, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            if _is_pick(value):
                self.picks[(cell, target.id)] = self.shown[f"{cell}/{target.id}"] = _full_source(value)
            elif _literal(value):
                self.literals[(cell, target.id)] = ast.unparse(value)
        elif isinstance(target, ast.Tuple):
            names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
            if _is_pick(value):  # B, H, N, D = config.pick(full=(4, 8, 512, 64))
                src = _full_source(value)
                for i, n in enumerate(names):
                    if n:
                        self.picks[(cell, n)] = f"({src})[{i}]"
                self.shown[f"{cell}/{', '.join(n or '_' for n in names)}"] = src
            elif isinstance(value, ast.Tuple) and len(value.elts) == len(names):
                for n, v in zip(names, value.elts, strict=True):
                    if n and _is_pick(v):
                        self.picks[(cell, n)] = self.shown[f"{cell}/{n}"] = _full_source(v)
                    elif n and _literal(v):
                        self.literals[(cell, n)] = ast.unparse(v)

    def full(self, cell: str, name: str) -> Any:
        """The full-size value of ``name`` as cell ``cell`` sets it (a ``config.pick`` or a literal)."""
        key = (cell, name)
        src = self.overrides.get(key) or self.picks.get(key) or self.literals.get(key)
        if src is None:
            known = sorted(n for c, n in {**self.picks, **self.literals} if c == cell)
            raise KeyError(f"{self.path.name}: cell {cell!r} sets no {name!r} (it sets {known})")
        return eval(src, dict(SIZE_NAMESPACE))  # noqa: S307  (the book's own cells)

    def full_or(self, cell: str, name: str, default: Any) -> Any:
        """:meth:`full`, or ``default`` when the cell does not set ``name`` (a size written inline today)."""
        try:
            return self.full(cell, name)
        except KeyError:
            return default

    def passes_device(self, cell: str) -> bool:
        """Whether cell ``cell`` passes ``device=device`` (or ``--set`` gives it a device)."""
        return (cell, "device") in self.overrides or bool(re.search(r"\bdevice\s*=\s*device\b", self.source(cell)))

    def source(self, cell: str) -> str:
        if cell not in self.cells:
            raise KeyError(f"{self.path.name}: no code cell with id {cell!r}")
        return self.cells[cell]

    def sizes(self) -> dict[str, str]:
        """Every pick of the chapter, ``"cell/name": full expression`` (overrides applied)."""
        out = dict(self.shown)
        out.update({f"{c}/{n}": s for (c, n), s in self.overrides.items()})
        return out


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except Exception:  # ValueError, TypeError, SyntaxError: not a literal
        return False


def toc_chapters(toc: Path) -> list[Path]:
    """The chapters of ``_toc.yml`` (its ``book/NN_name`` entries), in order, as notebook paths."""
    found = re.findall(r"^\s*-\s*file:\s*(book/\d+_[A-Za-z0-9_]+)\s*$", toc.read_text(), flags=re.M)
    return [toc.parent / f"{f}.ipynb" for f in found]


# -- the workloads ---------------------------------------------------------------------------------------------


@dataclass
class Context:
    nb: Notebook
    meter: Meter
    stand: Stand

    def on_cpu(self, fn: Callable[[], object], times: float = 1) -> None:
        """Run ``fn`` as the chapter runs it on the CPU; its time here, ``times`` over, is host time (the stand-ins
        inside add what their loops stand for, also ``times`` over)."""
        inside = self.stand.inside_s
        t0 = time.perf_counter()
        with self.meter.scaled(times):
            fn()
        own = time.perf_counter() - t0 - (self.stand.inside_s - inside)
        self.meter.totals.host_s += self.meter.scale * times * own

    def full(self, cell: str, name: str) -> Any:
        return self.nb.full(cell, name)

    def full_or(self, cell: str, name: str, default: Any) -> Any:
        return self.nb.full_or(cell, name, default)

    def run(self, fn: Callable[[], object], times: float = 1) -> None:
        """``fn`` counted ``times`` over: timed (:meth:`on_cpu`) in a CPU workload, counted otherwise."""
        if self.stand.cpu:
            self.on_cpu(fn, times)
        else:
            with self.meter.scaled(times):
                fn()

    def exec_cells(self, namespace: dict, *cells: str) -> dict:
        """Run the chapter's own cells (definitions, small checks) in ``namespace``."""
        for cell in cells:
            exec(compile(self.nb.source(cell), f"{self.nb.path.name}:{cell}", "exec"), namespace)  # noqa: S102
        return namespace


@dataclass(frozen=True)
class Workload:
    cell: str  # the cell it stands for
    what: str
    run: Callable[[Context], None]
    cpu: bool = False  # the chapter runs it on the CPU whatever the device: measured here, not modelled
    device_cell: str | None = None  # on the CPU unless this cell passes device=device

    def on_cpu(self, nb: Notebook) -> bool:
        return self.cpu or (self.device_cell is not None and not nb.passes_device(self.device_cell))


META = torch.device("meta")


def _qkv(*shape: int, dtype=torch.float32, n: int = 3, grad: bool = False) -> list[torch.Tensor]:
    return [torch.empty(*shape, device=META, dtype=dtype).requires_grad_(grad) for _ in range(n)]


def _fwd_bwd(fn: Callable, inputs: list[torch.Tensor]) -> None:
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    torch.autograd.grad(out, leaves, torch.empty_like(out))


# chapter 1 -------------------------------------------------------------------------------------------------------


def ch01_cost(ctx: Context) -> None:
    import attnbook
    from attnbook import reference
    from attnbook.lab import profiling

    lengths = ctx.full("cost-code", "lengths")
    B, H, D = (ctx.full("cost-code", x) for x in ("B", "H", "D"))
    fns = {"literal": reference.softmax_attention, "fused": attnbook.softmax_attention}
    profiling.measure_scaling(fns, lengths, lambda n: _qkv(B, H, n, D), memory=["literal"])


# chapter 2 -------------------------------------------------------------------------------------------------------


def ch02_rnn(ctx: Context) -> None:
    import attnbook

    B, H, D = (ctx.full("setup", x) for x in ("B", "H", "D"))
    T = ctx.full("rnn-code", "T")
    C = H * D
    layer = attnbook.LinearAttention(d_input=C, d_model=C, d_output=C, n_heads=H, causal=True).to(META).eval()

    def tokens(n: int) -> None:
        x_t, state = torch.empty(B, 1, C, device=META), None
        with torch.no_grad():
            for _ in range(n):
                q_t = layer.query_projection(x_t).view(B, H, D)
                k_t = layer.key_projection(x_t).view(B, H, D)
                v_t = layer.value_projection(x_t).view(B, H, D)
                o_t, state = attnbook.linear_attention_step(q_t, k_t, v_t, state)
                y_t = layer.out_projection(o_t.reshape(B, 1, C))
                x_t = torch.tanh(y_t) + 0.1 * torch.randn_like(y_t)
        torch.cat([x_t] * n, dim=1)

    linear_count(ctx.meter, tokens, T)


def ch02_sweeps(ctx: Context) -> None:
    import attnbook
    from attnbook.feature_maps import PerformerFeatures
    from attnbook.lab import profiling

    H, D = ctx.full("setup", "H"), ctx.full("setup", "D")
    n_mem, d_mem = ctx.full("chunked-memory-code", "n_mem"), ctx.full("chunked-memory-code", "d_mem")
    qm = _qkv(1, 2, n_mem, d_mem)
    profiling.peak_memory(lambda: attnbook.linear_attention(*qm, is_causal=True))
    qp = _qkv(1, H, 64, D)  # n_pf = 64 in the cell
    for r in ctx.full("performer-code", "feature_counts"):
        for seed in range(3):
            phi = PerformerFeatures(r, D, seed=1000 * r + seed).to(META)
            phi(qp[0]) @ phi(qp[1]).transpose(-2, -1)
            attnbook.linear_attention(*qp, feature_map=phi)
    lengths = ctx.full("time-code", "lengths")
    up, Bt, Ht = (ctx.full("time-code", x) for x in ("softmax_up_to", "Bt", "Ht"))
    Dt = 64  # flop_lengths, Dt = [...], 64 in the FLOP-counting cell

    def causal(fn):
        return lambda q, k, v: fn(q, k, v, is_causal=True)

    runs = {
        "softmax (SDPA)": attnbook.softmax_attention,
        "linear": attnbook.linear_attention,
        "softmax, causal (SDPA)": causal(attnbook.softmax_attention),
        "linear, causal": causal(attnbook.linear_attention),
    }
    up_to = {name: up for name in runs if name.startswith("softmax")}
    profiling.measure_scaling(runs, lengths, lambda n: _qkv(Bt, Ht, n, Dt), up_to=up_to, warmup=0)

    def softmax_matrix(q, k, v):  # the chapter's literal form in float32
        scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
        return torch.softmax(scores, dim=-1) @ v

    matrix_up_to = ctx.full("memory-code", "matrix_up_to")
    mem_runs = {"matrix": softmax_matrix, "sdpa": runs["softmax (SDPA)"], "linear": runs["linear"]}
    mem_runs["linear, causal"] = runs["linear, causal"]
    mem_lengths = [n for n in lengths if n <= matrix_up_to]
    profiling.measure_scaling(mem_runs, mem_lengths, lambda n: _qkv(Bt, Ht, n, Dt), timed=False, memory=True)


# chapter 3 -------------------------------------------------------------------------------------------------------


def ch03_checks(ctx: Context) -> None:
    import attnbook
    from attnbook import reference
    from attnbook.lab import profiling

    B, H, N, D = (ctx.full("cell-002", x) for x in ("B", "H", "N", "D"))
    ns = ctx.exec_cells({"torch": torch, "math": math}, "teaching-full", "teaching-causal")
    f64 = torch.float64
    q, k, v = _qkv(B, H, N, D, dtype=f64)
    ns["flow_attention_teaching"](q, k, v)  # cells 19-25 compute the same quantities step by step
    q[0, 0] @ k[0, 0].T  # one head's capacities
    attnbook.flow_attention(q, k, v, return_flows=True)
    reference.flow_attention(q, k, v)
    attnbook.flow_attention(q, k, v)
    # cell-018: cross-attention N/2 x (N + 7), gradients against the float64 reference, both dtypes
    x = [torch.empty(B, H, n, D, device=META, dtype=f64) for n in (N // 2, N + 7, N + 7)]
    _fwd_bwd(reference.flow_attention, x)
    ns["flow_attention_teaching"](*x)
    for dtype in (f64, torch.float32):
        _fwd_bwd(attnbook.flow_attention, [t.to(dtype) for t in x])
    qf = _qkv(1, H, N, D)
    profiling.peak_memory(lambda: attnbook.flow_attention(*qf))
    profiling.peak_memory(lambda: reference.flow_attention(*qf))
    # the clamp table: a FlowAttention module of width 64 at (N, N), (4N, 4N), (N, 4N), (4N, N)
    module = attnbook.FlowAttention(64, 64, 64, n_heads=4).to(META)
    with torch.no_grad():
        for n_, m_ in [(N, N), (4 * N, 4 * N), (N, N), (N, 4 * N), (4 * N, N)]:
            xq, xk = torch.empty(2, n_, 64, device=META), torch.empty(2, m_, 64, device=META)

            def heads(t):
                return t.view(*t.shape[:2], 4, -1).transpose(1, 2)

            qm, km, vm = (heads(p(z)) for p, z in [(module.query_projection, xq), (module.key_projection, xk),
                                                    (module.value_projection, xk)])  # fmt: skip
            attnbook.flow_attention(qm, km, vm, return_flows=True)
    # cell-022 and the recurrent steps: causal at Nc in float64
    Nc = ctx.full("cell-022", "Nc")
    qc, kc, vc = _qkv(B, H, Nc, D, dtype=f64)
    attnbook.flow_attention(qc, kc, vc, is_causal=True, return_flows=True)
    reference.flow_attention(qc, kc, vc, is_causal=True)
    attnbook.flow_attention(qc, kc, vc, is_causal=True, chunk_size=7)
    attnbook.flow_attention(qc, kc, vc, is_causal=True)
    linear_count(ctx.meter, lambda n: ns["causal_flow_loop"](qc[..., :n, :], kc[..., :n, :], vc[..., :n, :]), Nc)

    q1, k1, v1 = (torch.randn(B, H, 8, D, dtype=f64) for _ in range(3))  # on the CPU: the step checks its state

    def steps(n: int) -> None:
        state = None
        for i in range(n):
            _, state = attnbook.flow_attention_step(q1[..., i, :], k1[..., i, :], v1[..., i, :], state)

    linear_count(ctx.meter, steps, Nc)


def ch03_lookup(ctx: Context) -> None:
    from attnbook.lab import claims

    steps = ctx.full("lookup-demo", "steps")
    a, b = 20, 80  # as in the cell: its time at a and b steps, extrapolated
    claims.lookup_share_demo(6, 8, steps=2)  # untimed: the first call's one-off costs
    for n, d in [(24, 16), (6, 8)]:
        ctx.on_cpu(lambda n=n, d=d: claims.lookup_share_demo(n, d, steps=a), times=(b - steps) / (b - a))
        ctx.on_cpu(lambda n=n, d=d: claims.lookup_share_demo(n, d, steps=b), times=(steps - a) / (b - a))


def ch03_listops(ctx: Context) -> None:
    from attnbook.lab import claims

    spec, setup = claims.listops_sizes()
    seeds = ctx.full("listops-live", "seeds")  # one seed run, as every seed costs the same
    ctx.run(lambda: claims.compare(spec, setup, seeds=1), times=seeds)


# chapter 4 -------------------------------------------------------------------------------------------------------


def ch04_checks(ctx: Context) -> None:
    import attnbook
    from attnbook import reference

    B, H, N, D = (ctx.full("cell-002", x) for x in ("B", "H", "N", "D"))
    f64 = torch.float64
    q, k, v = _qkv(B, H, N, D, dtype=f64)
    attnbook.mobile_attention(q, k, v, return_flows=True)
    reference.mobile_attention(q, k, v)
    _fwd_bwd(reference.mobile_attention, [q, k, v])
    for dtype in (f64, torch.float32):
        _fwd_bwd(attnbook.mobile_attention, [t.to(dtype) for t in (q, k, v)])
    for _ in range(4):  # the boosted key, one head, N - 1 keys, the eps variants
        attnbook.mobile_attention(q, k, v, return_flows=True)
    # the causal teaching form: the (B, H, N, N) capacities below the diagonal
    kappa = (torch.sigmoid(q) @ torch.sigmoid(k).transpose(-2, -1)).tril()
    kappa @ v


def ch04_heads(ctx: Context) -> None:
    from attnbook.lab import claims

    task, setup = claims.heads_sizes()
    seeds = ctx.full("claim-live", "seeds")  # one seed run, as every seed costs the same
    ctx.run(lambda: claims.head_width_study(task, setup, widths=(2, 4, 8), seeds=1), times=seeds)


# chapter 5 -------------------------------------------------------------------------------------------------------


def ch05_layers(ctx: Context) -> None:
    import attnbook

    B, N, C, H = (ctx.full("ch05-002", x) for x in ("B", "N", "C", "H"))
    x = torch.empty(B, N, C, device=META)
    with torch.no_grad():
        for shared, routed in [(H, 0), (3, 2), (2, 2), (1, 1), (2, 4)]:  # the chapter's layers on x
            layer = attnbook.MoHAttention(C, num_heads=H, shared_head=shared, routed_head=routed).to(META)
            layer(x)


def ch05_typed(ctx: Context) -> None:
    import attnbook

    ns = {"torch": torch, "F": F, "attnbook": attnbook, "device": torch.device("cpu")}
    ctx.exec_cells(ns, "ch05-038", "ch05-039", "ch05-039b")
    ns["typed_batch"](512, torch.Generator().manual_seed(2))
    for kind in ("routed", "frozen router", "all heads"):
        model = ns["typed_model"](kind)
        with ctx.meter.scaled(150):  # train_typed's default steps
            ns["train_typed"](model, steps=1)


def ch05_moh(ctx: Context) -> None:
    from attnbook.lab import claims

    task, setup = claims.moh_sizes()
    claims.moh_study(task, setup, seeds=1, device="cpu")  # seeds=1 in the cell; device=device there


# chapter 6 -------------------------------------------------------------------------------------------------------


def ch06_benchmark(ctx: Context) -> None:
    from attnbook import mechanisms
    from attnbook.lab import bench, profiling

    lengths, shape, dtype = (ctx.full("ch06-002", x) for x in ("LENGTHS", "SHAPE", "DTYPE"))
    cases = [n for n in bench.CASES if not n.startswith("moh")]
    bench.run_benchmark(lengths, mechanisms=cases, device=META, dtype=dtype, repeats=3, warmup=1, backward=True,
                        progress=False, **shape)  # fmt: skip
    H6, D6 = ctx.full("ch06-023", "H6"), ctx.full("ch06-023", "D6")
    C6 = H6 * D6
    layers = {n: mechanisms.get(n).module(C6, H6).to(META, dtype).eval() for n in ("softmax", "moh")}
    for n in lengths[-3:]:
        xs = torch.empty(shape["batch"], n, C6, device=META, dtype=dtype)
        with torch.no_grad():
            profiling.compare({k: (lambda m=m, xs=xs: m(xs)) for k, m in layers.items()}, repeats=5)


def ch06_race(ctx: Context) -> None:
    from attnbook.lab import headtohead

    race = ctx.full("ch06-002", "RACE")
    task = headtohead.RecallTask(n_pairs=race["pairs"], n_keys=2 * race["pairs"], n_values=race["pairs"])
    headtohead.race(task, seeds=race["seeds"], keep_models=True, steps=race["steps"], eval_every=race["every"],
                    lr=race["lr"], d_model=race["width"], n_heads=4, n_layers=1, batch=64, eval_size=256,
                    stop_at=0.98, device="cpu")  # fmt: skip


# chapter 7 -------------------------------------------------------------------------------------------------------


def _ch07_names() -> list[str]:
    """Chapter 7's mechanisms (its NAMES): the causal ones of chapters 1 to 5."""
    from attnbook import mechanisms

    return mechanisms.names(causal=True, bidirectional=True)


def ch07_race(ctx: Context) -> None:
    from attnbook.lab import corpus, lm

    text = corpus.load_stdlib()
    # on meta (shapes only; .item() gets a stand-in value): a full-size step is 100 GFLOP, too slow to run here
    lm.race(_ch07_names(), text, lm.setup(), seeds=ctx.full("setup", "SEEDS"), device=META, progress=False)


def ch07_generation(ctx: Context) -> None:
    from attnbook.lab import generation, lm, profiling

    setup = lm.setup()
    names = _ch07_names()
    n_new = ctx.full("write", "N_NEW")
    prompt = torch.tensor([list(b"def ")])
    models = {}
    for name in names:
        torch.manual_seed(0)
        models[name] = setup.model(name).eval()
    with torch.no_grad():
        for model in models.values():
            linear_count(ctx.meter, lambda n, m=model: m.generate(prompt, n, temperature=0.8, top_k=40, seed=0), n_new)
    # the live per-token cost (cell ee054722): positions, repeats and burst as written there
    generation.measure(setup, mechanism_names=names, positions=(16, 256, 4096), repeats=9, burst=4, progress=False)
    # a 1024-byte prefill against 1024 steps, timed (repeats 3 + warmup 1), then once more in the check
    n_long = ctx.full_or("2dd262f3", "n_long", 1024)
    calls = ctx.full_or("2dd262f3", "repeats", 3) + ctx.full_or("2dd262f3", "warmup", 1) + 1
    long_prompt = torch.randint(256, (1, n_long), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for model in models.values():
            with ctx.meter.scaled(calls):
                model(long_prompt, output_final_state=True)

            def stepped(n: int, model=model) -> None:
                state = None
                for t in range(n):
                    _, state = model.step(long_prompt[:, t], state)

            with ctx.meter.scaled(calls):
                linear_count(ctx.meter, stepped, long_prompt.shape[1], small=4, large=12)
    del profiling


def ch07_cpu_cells(ctx: Context) -> None:
    import inspect
    import textwrap

    from attnbook import linear_attention, linear_attention_step, softmax_attention
    from attnbook.lab import lm
    from attnbook.lm import Block, DecoderLM, state_bytes

    ns = {
        "torch": torch, "F": F, "math": math, "inspect": inspect, "textwrap": textwrap, "Block": Block,
        "DecoderLM": DecoderLM, "state_bytes": state_bytes, "linear_attention": linear_attention,
        "linear_attention_step": linear_attention_step, "softmax_attention": softmax_attention,
        "SETUP": lm.setup(), "NAMES": _ch07_names(), "print": lambda *a, **k: None,
    }  # fmt: skip
    ctx.on_cpu(lambda: ctx.exec_cells(ns, "model", "causal-check", "step-check", "memory"))  # CPU tensors


# chapter 8 -------------------------------------------------------------------------------------------------------


def ch08_recall(ctx: Context) -> None:
    from attnbook.lab import recall

    steps = ctx.full("live-recall", "live_steps")
    for name in ("softmax", "linear", "delta", "none"):
        for pairs in (8, 32):
            task = recall.MultiQueryRecall(n_pairs=pairs)
            ctx.run(lambda name=name, task=task: recall.train(name, task, width=32, steps=steps, lr=3e-3))


def ch08_costs(ctx: Context) -> None:
    from attnbook.lab import recall

    ctx.run(lambda: recall.costs(("softmax", "linear", "decay", "gated", "delta"), width=64, tokens=1024))


WORKLOADS: dict[str, list[Workload]] = {
    "01": [Workload("cost-code", "literal softmax and SDPA against N (time, memory)", ch01_cost)],
    "02": [
        Workload("rnn-code", "T token steps of a LinearAttention layer", ch02_rnn),
        Workload(
            "chunked-memory-code .. memory-code", "chunked memory, Performer R, time and memory sweeps", ch02_sweeps
        ),  # fmt: skip
    ],
    "03": [
        Workload(
            "cell-007 .. cell-024", "float64 checks at (B, H, N, D), the clamp table, causal at Nc", ch03_checks
        ),  # fmt: skip
        Workload("lookup-demo", "trained projections on the retrieval toy (the CPU)", ch03_lookup, cpu=True),
        Workload(
            "listops-live", "ListOps: 7 variants x seeds (claims.compare)", ch03_listops, device_cell="listops-live"
        ),  # fmt: skip
    ],
    "04": [
        Workload("teaching checks", "float64 checks at (B, H, N, D) against the reference", ch04_checks),
        Workload(
            "claim-live", "head widths: linear and Mobile, 3 widths x seeds", ch04_heads, device_cell="claim-live"
        ),
    ],
    "05": [
        Workload("ch05-004 ..", "MoH layers on x (B, N, C)", ch05_layers),
        Workload("ch05-040", "the typed task: 3 models x 150 steps", ch05_typed),
        Workload("moh-claim-code", "MoH fractions of heads: 5 variants x 1 seed", ch05_moh),
    ],
    "06": [
        Workload("ch06-010, ch06-023", "run_benchmark at LENGTHS (fwd, fwd+bwd, memory); MoH layers", ch06_benchmark),
        Workload("ch06-029", "the recall race: every mechanism x seeds (upper bound: no early stop)", ch06_race),
    ],
    "07": [
        Workload("race", "the language-model race: 4 mechanisms x seeds", ch07_race),
        Workload("write, ee054722, 2dd262f3", "generation, per-token cost, prefill against steps", ch07_generation),
        Workload("model .. memory", "checks whose tensors are made on the CPU", ch07_cpu_cells, cpu=True),
    ],
    "08": [
        Workload("live recall", "the recall task live: 4 mechanisms x 2 numbers of pairs", ch08_recall),
        Workload("costs", "one layer of 5 mechanisms at 1,024 tokens, timed", ch08_costs),
    ],
}


# -- the estimate ----------------------------------------------------------------------------------------------


def estimate_workload(w: Workload, nb: Notebook) -> dict:
    meter = Meter()
    cpu = w.on_cpu(nb)
    stand = Stand(meter, cpu=cpu)
    ctx = Context(nb, meter, stand)
    t0 = time.perf_counter()
    error = None
    # a CPU workload runs without the counter (it would slow what is timed); its stand-ins count one step
    threads = torch.get_num_threads()
    if cpu:  # one thread, as the recordings: two threads beside other work stall each other's operators
        torch.set_num_threads(1)
    with instrumented(stand), contextlib.nullcontext() if cpu else meter:
        try:
            w.run(ctx)
        except Exception as e:  # reported with the chapter, the other workloads still run
            error = f"{type(e).__name__}: {e}"[:1000]
        finally:
            torch.set_num_threads(threads)
    wall = time.perf_counter() - t0
    t = meter.totals
    return {
        "cell": w.cell,
        "what": w.what,
        "where": "cpu" if cpu else "gpu",
        "gflop": t.flops / 1e9,
        "gb_moved": t.bytes / 1e9,
        "launches": t.launches,
        "host_s": t.host_s,
        "largest_tensor_gb": t.largest_tensor / 1e9,
        "seconds": {c: (t.host_s if cpu else t.card_s[c] + t.host_s) for c in CARDS},
        "counted_in_s": wall,
        "error": error,
    }


@contextlib.contextmanager
def full_sizes() -> Iterator[None]:
    """``ATTNBOOK_FAST=0`` while it lasts (the lab's ``config.pick`` reads it at every call), then as it was."""
    before = os.environ.get("ATTNBOOK_FAST")
    os.environ["ATTNBOOK_FAST"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["ATTNBOOK_FAST"]
        else:
            os.environ["ATTNBOOK_FAST"] = before


def estimate_chapter(path: Path, overrides: dict[tuple[str, str], str], only: set[str] | None = None) -> dict:
    with full_sizes():
        return _estimate_chapter(path, overrides, only)


def _estimate_chapter(path: Path, overrides: dict[tuple[str, str], str], only: set[str] | None) -> dict:
    nb = Notebook(path, overrides)
    key = path.name[:2]
    parts = [estimate_workload(w, nb) for w in WORKLOADS.get(key, []) if only is None or w.cell in only]
    fixed = CHAPTER_FIXED_S + PER_CELL_S * len(nb.cells)
    seconds = {c: fixed + sum(p["seconds"][c] for p in parts) for c in CARDS}
    return {
        "chapter": path.name,
        "workloads": parts,
        "described": key in WORKLOADS,
        "fixed_s": fixed,
        "gflop": sum(p["gflop"] for p in parts),
        "gb_moved": sum(p["gb_moved"] for p in parts),
        "launches": sum(p["launches"] for p in parts),
        "host_s": sum(p["host_s"] for p in parts),
        "largest_tensor_gb": max((p["largest_tensor_gb"] for p in parts), default=0.0),
        "seconds": seconds,
        "within_budget": {c: seconds[c] <= BUDGET_S[c] for c in CARDS},
        "sizes": nb.sizes(),
        "errors": [p["error"] for p in parts if p["error"]],
    }


def assumptions() -> dict:
    return {
        "cards": {
            k: {
                "name": c.name,
                "peak_flops": {str(d).removeprefix("torch."): f for d, f in c.flops.items()},
                "bandwidth_bytes_s": c.bandwidth,
                "memory_bytes": c.memory,
                "launch_s": c.launch_s,
            }
            for k, c in CARDS.items()
        },
        "compute_efficiency": COMPUTE_EFFICIENCY,
        "bandwidth_efficiency": BANDWIDTH_EFFICIENCY,
        "per_operator": "max(launch_s, flops / (peak * compute_efficiency), "
        "bytes / (bandwidth * bandwidth_efficiency))",
        "chapter_fixed_s": f"{CHAPTER_FIXED_S} + {PER_CELL_S} per code cell",
        "host": "measured on this machine's CPU: batches made on the host; workloads marked cpu",
        "budget_s": BUDGET_S,
        "not_counted": "cells outside WORKLOADS, compilation, early stopping (upper bound), host CPU speed, "
        "kernel efficiency at small sizes, peak memory",
    }


def table(chapters: list[dict]) -> str:
    head = (
        f"{'chapter':24s} {'GFLOP':>9s} {'GB moved':>9s} {'launches':>10s} {'host s':>8s} {'T4 s':>8s} {'H200 s':>8s}"
    )
    lines = [head, "-" * len(head)]
    for ch in chapters:
        mark = {c: ("" if ch["within_budget"][c] else "*") for c in CARDS}
        t4, h200 = ch["seconds"]["T4"], ch["seconds"]["H200"]
        lines.append(
            f"{ch['chapter'][:-6][:24]:24s} {ch['gflop']:9.1f} {ch['gb_moved']:9.1f} {ch['launches']:10.3g}"
            f" {ch['host_s']:8.1f} {t4:7.0f}{mark['T4']:1s} {h200:7.0f}{mark['H200']:1s}"
        )
        for e in ch["errors"]:
            lines.append(f"    error: {e[:100]}")
        if not ch["described"]:
            lines.append("    no workloads described in WORKLOADS: only the fixed charge")
    lines.append(f"* over the budget ({BUDGET_S['T4']:.0f} s on a T4, {BUDGET_S['H200']:.0f} s on an H200)")
    return "\n".join(lines)


def _parse_set(items: list[str], chapters: list[Path]) -> dict[str, dict[tuple[str, str], str]]:
    """``CHAPTER:CELL:NAME=EXPR`` -> {chapter file: {(cell, name): expr}}; CHAPTER is a prefix (``06``)."""
    out: dict[str, dict[tuple[str, str], str]] = {}
    for item in items:
        where, _, expr = item.partition("=")
        parts = where.split(":")
        if len(parts) != 3 or not expr:
            raise SystemExit(f"--set {item!r}: expected CHAPTER:CELL:NAME=EXPRESSION")
        matches = [p.name for p in chapters if p.name.startswith(parts[0])]
        if len(matches) != 1:
            raise SystemExit(f"--set {item!r}: {parts[0]!r} names {len(matches)} chapters")
        out.setdefault(matches[0], {})[(parts[1], parts[2])] = expr
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter file names or prefixes (default: every one of _toc.yml)")
    parser.add_argument("--toc", type=Path, default=ROOT / "_toc.yml")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--set", action="append", default=[], metavar="CHAPTER:CELL:NAME=EXPR",
                        help="another full size for a cell's pick, e.g. 06:ch06-002:DTYPE=torch.bfloat16")  # fmt: skip
    parser.add_argument("--lab", action="append", default=[], metavar="STATEMENT",
                        help="a Python statement run first (claims, lm, headtohead, dataclasses in scope)")  # fmt: skip
    parser.add_argument("--workload", action="append", default=None, help="only the workloads of these cells")
    args = parser.parse_args(argv)

    chapters = toc_chapters(args.toc)
    sets = _parse_set(args.set, chapters)
    if args.chapters:
        chapters = [p for p in chapters if any(p.name.startswith(c) or p.stem == c for c in args.chapters)]
    from attnbook.lab import claims, headtohead, lm

    scope = {"claims": claims, "lm": lm, "headtohead": headtohead, "dataclasses": dataclasses, "torch": torch}
    for statement in args.lab:
        exec(statement, scope)  # noqa: S102  (what-if sizes, from the command line)
    torch.manual_seed(0)
    results = []
    for path in chapters:
        t0 = time.perf_counter()
        only = set(args.workload) if args.workload else None
        results.append(estimate_chapter(path, sets.get(path.name, {}), only))
        print(f"[estimate] {path.name}: counted in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    report = {
        "kind": "benchmarks/estimate_chapters.py",
        "torch": torch.__version__,
        "assumptions": assumptions(),
        "set": args.set,
        "lab": args.lab,
        "chapters": results,
    }
    print(table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
