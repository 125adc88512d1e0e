"""Time and memory of every mechanism against the sequence length N: the one measuring routine.

Chapter 6, ``benchmarks/bench_all.py`` and ``python -m attnbook.lab.check_gpu`` all call :func:`run_benchmark`,
so a figure in the book, a JSON file in ``benchmarks/results/`` and the GPU report are measured the same way:

* **forward** is inference: the mechanism under ``torch.no_grad()``;
* **forward_backward** is one training step of the mechanism alone: forward with inputs that require
  gradients, then ``torch.autograd.grad`` of the output against a fixed random upstream gradient;
* for each N every mechanism is timed in the *same* :func:`attnbook.lab.profiling.compare` call, which alternates
  between them, so a noisy neighbour slows them all alike; medians are reported;
* peak memory is :func:`attnbook.lab.profiling.peak_memory` of one more call: the caching allocator's peak on
  CUDA, tensors allocated by torch operators on the CPU. It is the *extra* memory above the inputs.

Every mechanism sees q, k, v of shape (B, H, N, D) in the requested dtype, except ``moh``, which is a whole
layer (its ``qkv`` projection, router, attention and output projection) on x of shape (B, N, H * D): MoH
routes tokens, so it has no q, k, v interface. Its costs therefore include the projections.

Results are plain dicts and lists (JSON-ready): see :func:`run_benchmark`.
"""

from __future__ import annotations

import datetime
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from .._checks import check_bool, check_choice, check_device, check_dtype, check_found, check_int, check_number
from ..mechanisms import MECHANISMS, Mechanism
from .profiling import _slope, compare, peak_memory

__all__ = [
    "Case",
    "CASES",
    "run_benchmark",
    "environment",
    "series",
    "loglog_slope",
    "copy_bandwidth",
    "memory_floor_seconds",
]

Setup = Callable[[int, int, int, int, torch.device, torch.dtype], tuple[list[torch.Tensor], Callable]]


@dataclass(frozen=True)
class Case:
    """One line of the benchmark: how to build its inputs and the callable that is timed.

    ``setup(B, H, N, D, device, dtype)`` returns ``(inputs, fn)``; ``fn(*inputs)`` is the mechanism.
    ``quadratic_memory`` marks cases that materialise B x H x N x N scores (skipped above a size cap).
    """

    name: str
    description: str
    causal: bool
    setup: Setup
    quadratic_memory: bool = False


def _qkv(B, H, N, D, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(N)
    return [torch.randn(B, H, N, D, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


# The setups of the cases (their first arguments bound in _cases).


def _function(fn: Callable, causal: bool, B, H, N, D, device, dtype):
    kwargs = {"is_causal": True} if causal else {}
    return _qkv(B, H, N, D, device, dtype), lambda q, k, v: fn(q, k, v, **kwargs)


def _gated(mechanism: Mechanism, B, H, N, D, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(N)
    inputs = mechanism.example_inputs(B, H, N, D, generator=g)
    return [x.to(device=device, dtype=dtype) for x in inputs], mechanism.function


def _layer(mechanism: Mechanism, causal: bool, B, H, N, D, device, dtype):
    layer = mechanism.module(H * D, H, causal=causal).to(device=device, dtype=dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(N)
    return [torch.randn(B, N, H * D, generator=g).to(device=device, dtype=dtype)], layer


def _softmax_literal(q, k, v):
    """The definition with the matrix written out, in the input dtype: B x H x N x N scores."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, N, N)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, N, D)


def _cases() -> dict[str, Case]:
    """Every mechanism of the registry, and its causal form where it has one, plus the literal baseline."""
    cases = []
    for m in MECHANISMS.values():
        for causal in m.forms:
            name = f"{m.name}_causal" if causal and m.bidirectional else m.name
            if m.inputs == "x":
                what = "the whole layer (projections, router, attention) on x (B, N, H*D)"
                setup = partial(_layer, m, causal)
            else:
                what = f"attnbook.{m.function.__name__}"
                setup = partial(_gated, m) if m.inputs == "qkvg" else partial(_function, m.function, causal)
            cases.append(Case(name, f"{'causal ' if causal else ''}{m.title}: {what}", causal, setup))
        if m.name == "softmax":
            cases.append(
                Case(
                    "softmax_literal",
                    "softmax(q k^T / sqrt(D)) v with the N x N matrix materialised",
                    False,
                    lambda B, H, N, D, dev, dt: (_qkv(B, H, N, D, dev, dt), _softmax_literal),
                    quadratic_memory=True,
                )
            )
    return {c.name: c for c in cases}


#: The benchmark cases by name: each implementation that :func:`run_benchmark` times, with what it computes.
CASES: dict[str, Case] = _cases()


class _Progress:
    """One line on stderr, rewritten in place: ``[bench] 3/12 N=4096 flow forward``."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self.t0 = time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            elapsed = time.perf_counter() - self.t0
            sys.stderr.write(f"\r[bench] {self.done}/{self.total} {what:<40s} {elapsed:7.1f}s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it, or None where nvidia-smi is missing or fails."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def environment(device: torch.device | str = "cpu") -> dict:
    """Where a result came from: device name, library versions, date (UTC), threads."""
    from .. import __version__

    device = torch.device(device)
    driver = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        driver = _nvidia_driver()
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {
        "device": str(device),
        "device_name": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver,
        "attnbook": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _training_step(fn: Callable, inputs: list[torch.Tensor], upstream: torch.Tensor) -> Callable[[], object]:
    def step():
        out = fn(*inputs)
        return torch.autograd.grad(out, inputs, upstream)

    return step


def _inference(fn: Callable, inputs: list[torch.Tensor]) -> Callable[[], object]:
    def forward():
        with torch.no_grad():
            return fn(*inputs)

    return forward


#: The measurements of a record, None until made.
_MEASURES = (
    "forward_s forward_samples_s forward_backward_s forward_backward_samples_s forward_peak_bytes "
    "forward_backward_peak_bytes"
).split()


def run_benchmark(
    lengths: Sequence[int],
    *,
    mechanisms: Sequence[str] | None = None,
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 32,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    warmup: int = 1,
    backward: bool = True,
    memory: bool = True,
    max_matrix_bytes: float = 2**31,
    compile: bool = False,
    progress: bool = True,
) -> dict:
    """Forward and forward+backward time and peak memory of each mechanism at each N.

    Args:
        lengths: the sequence lengths N.
        mechanisms: names from :data:`CASES` (default: all).
        batch, heads, head_dim: B, H, D of q, k, v (MoH: x of width H * D).
        device, dtype: where and in what precision everything runs.
        repeats, warmup: passed to :func:`attnbook.lab.profiling.compare` (medians of ``repeats`` alternating runs).
        backward: also time forward+backward.
        memory: also measure peak memory (one extra call each).
        max_matrix_bytes: mechanisms that materialise B H N N scores are skipped (recorded as skipped) when
            that matrix would exceed this many bytes.
        compile: wrap every mechanism in ``torch.compile`` (compilation happens in the warmup calls).
        progress: a progress line on stderr.

    Returns:
        ``{"config": {...}, "records": [...]}`` with one record per (mechanism, N): ``mechanism``, ``N``,
        ``causal``, ``forward_s``, ``forward_samples_s``, ``forward_backward_s``,
        ``forward_backward_samples_s``, ``forward_peak_bytes``, ``forward_backward_peak_bytes`` (None when not
        measured) and ``skipped`` (None, or why it was not run). Times are medians in seconds.
    """
    name = "run_benchmark"
    names = list(CASES) if mechanisms is None else list(mechanisms)
    for i, n in enumerate(names):
        check_choice(n, f"mechanisms[{i}]", tuple(CASES), name=name)
    lengths = [check_int(n, f"lengths[{i}]", name=name, minimum=1) for i, n in enumerate(lengths)]
    check_found(lengths, "lengths", name=name, expected="hold at least one sequence length", got="none")
    batch = check_int(batch, "batch", name=name, minimum=1)
    heads = check_int(heads, "heads", name=name, minimum=1)
    head_dim = check_int(head_dim, "head_dim", name=name, minimum=1)
    device = check_device(device, name=name) or torch.device("cpu")
    dtype = check_dtype(dtype, "dtype", name=name)
    for label, flag in (("backward", backward), ("memory", memory), ("compile", compile), ("progress", progress)):
        check_bool(flag, label, name=name)
    max_matrix_bytes = check_number(max_matrix_bytes, "max_matrix_bytes", name=name, minimum=0.0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_n = 1 + int(backward) + int(memory) * (1 + int(backward))
    bar = _Progress(len(lengths) * per_n, progress)
    records = []
    try:
        for N in lengths:
            active, skipped = {}, {}
            for name in names:
                mech = CASES[name]
                matrix = batch * heads * N * N * itemsize
                if mech.quadratic_memory and matrix > max_matrix_bytes:
                    skipped[name] = f"B*H*N*N scores would take {matrix / 2**30:.1f} GiB > max_matrix_bytes"
                    continue
                inputs, fn = mech.setup(batch, heads, N, head_dim, device, dtype)
                active[name] = (inputs, torch.compile(fn) if compile else fn)
            fwd = {n: _inference(fn, inputs) for n, (inputs, fn) in active.items()}
            steps = {}
            if backward:
                for n, (inputs, fn) in active.items():
                    leaves = [x.detach().requires_grad_() for x in inputs]
                    with torch.no_grad():
                        shape = fn(*inputs).shape
                    g = torch.Generator(device="cpu").manual_seed(N + 1)
                    upstream = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
                    steps[n] = _training_step(fn, leaves, upstream)
            rec = {n: {"mechanism": n, "N": N, "causal": CASES[n].causal, **dict.fromkeys(_MEASURES)} for n in names}
            for n in names:
                rec[n]["skipped"] = skipped.get(n)
            phases = {"forward": fwd, **({"forward_backward": steps} if backward else {})}
            for phase, calls in phases.items():  # the times of every phase, then (with memory) the peaks
                if calls:
                    for n, t in compare(calls, repeats=repeats, warmup=warmup, device=device).items():
                        rec[n][f"{phase}_s"], rec[n][f"{phase}_samples_s"] = t.median, list(t.samples)
                bar.step(f"N={N} {phase.replace('_', '+')}")
            for phase, calls in phases.items() if memory else ():
                for n, f in calls.items():
                    rec[n][f"{phase}_peak_bytes"] = peak_memory(f, device)
                bar.step(f"N={N} {phase.replace('_', '+')} memory")
            records.extend(rec[n] for n in names)
            del active, fwd, steps
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        bar.close()
    config = {
        "lengths": lengths,
        "batch": batch,
        "heads": heads,
        "head_dim": head_dim,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "repeats": repeats,
        "warmup": warmup,
        "compile": compile,
        "max_matrix_bytes": max_matrix_bytes,
        "mechanisms": {n: CASES[n].description for n in names},
        "forward": "inference: torch.no_grad()",
        "forward_backward": "forward, then torch.autograd.grad of the output w.r.t. every input "
        "against a fixed random upstream gradient",
        "memory": "attnbook.lab.profiling.peak_memory: extra bytes above the inputs",
    }
    return {"config": config, "records": records}


def series(result: dict, metric: str = "forward_s") -> tuple[list[int], dict[str, list[float]]]:
    """``(lengths, {mechanism: values})`` of one metric, NaN where a mechanism was skipped; for plotting."""
    lengths = list(result["config"]["lengths"])
    out: dict[str, list[float]] = {}
    for r in result["records"]:
        check_choice(metric, "metric", tuple(sorted(r)), name="series")
        out.setdefault(r["mechanism"], [math.nan] * len(lengths))
        value = r[metric]
        out[r["mechanism"]][lengths.index(r["N"])] = math.nan if value is None else float(value)
    return lengths, out


def loglog_slope(ns: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope p of log y against log N (y ~ N^p), ignoring NaN points; needs two points."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys, strict=True) if y == y and y > 0]
    got = f"N={list(ns)}, y={list(ys)}"
    check_found(pts, "ns, ys", name="loglog_slope", expected="hold at least two positive points", got=got, minimum=2)
    check_found(set(x for x, _ in pts), "ns", name="loglog_slope", expected="hold two different N", got=got, minimum=2)
    return _slope([x for x, _ in pts], [y for _, y in pts])


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int = 2**28, repeats: int = 9) -> float:
    """Measured copy bandwidth in bytes/s: a ``nbytes`` buffer copied into another (read + write counted).

    The memory floor of a mechanism is the time to read its inputs and write its output once at this speed.
    """
    device = torch.device(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    t = compare({"copy": lambda: dst.copy_(src)}, repeats=repeats, warmup=2, device=device)["copy"]
    return 2 * nbytes / t.median


def memory_floor_seconds(B: int, H: int, N: int, D: int, dtype: torch.dtype, bandwidth: float) -> float:
    """Time to read q, k, v (B, H, N, D) and write the output (B, H, N, D) once at ``bandwidth`` bytes/s."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 4 * B * H * N * D * itemsize / bandwidth
