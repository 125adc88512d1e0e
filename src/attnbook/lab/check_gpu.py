"""Verify every mechanism on a GPU and measure it at full size: ``python -m attnbook.lab.check_gpu``.

What it does, writing the JSON report after every section (a run cut short keeps what it had); the compiled
half of step 1 runs last, because compiling is the slow part (``--budget-s`` caps it):

1. **accuracy**: every mechanism in float32, bfloat16 and float16 on the device against its float64 oracle in
   :mod:`attnbook.reference` computed on the CPU -- the output and the gradient of every input under a random
   upstream gradient -- eagerly and under ``torch.compile``. Tolerances per dtype in :data:`TOLERANCES`.
2. **sync**: the forward of every mechanism must not synchronise host and device: on CUDA under
   ``torch.cuda.set_sync_debug_mode("error")``, on any device by watching for the operators that need the
   host to read device memory (``.item()``, ``bool(tensor)``, ``nonzero``, ...).
3. **targets** (B=4, H=16, D=64, bfloat16 on an H100/H200 class GPU): non-causal linear and flow
   attention at N = 65,536 at least 10x faster than SDPA and within 3x of the memory floor (q, k, v read and
   the output written once at the card's measured copy bandwidth), eager and compiled; causal linear attention
   at N = 16,384 faster than SDPA's causal kernel.
4. **benchmark**: :func:`attnbook.lab.bench.run_benchmark` at full size.

Without CUDA it exits with a message; ``--device cpu --tiny`` runs the same logic at tiny sizes (for tests).
The exit status is 1 when an accuracy or sync check failed (targets are reported, not enforced), else 0.
Cases left out by the time budget are listed under ``accuracy_not_run``; they are not failures.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import mechanisms
from ..flow import flow_attention
from ..linear import linear_attention
from ..softmax import softmax_attention
from .bench import _inference, copy_bandwidth, environment, memory_floor_seconds, run_benchmark
from .profiling import compare

__all__ = ["TOLERANCES", "CASES", "check_accuracy", "check_sync", "check_targets", "run", "main"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ALL_DTYPES = tuple(DTYPES.values())

# Per dtype, for outputs and gradients alike. An element passes when |x - ref| <= atol * rms(ref) + rtol |ref|:
# atol is relative to the root-mean-square of the reference tensor, so the same numbers judge outputs of
# size 1 and gradients of size 1e-3. The half types allow a few units of their rounding (2^-8 for bfloat16,
# 2^-11 for float16) accumulated through the kernels; float32 allows for summation order on the device.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: dict(rtol=1e-3, atol=1e-4),
    torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
}


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run of the check."""

    accuracy: tuple[int, int, int, int]  # B, H, N, D of the accuracy checks (N not a multiple of 64)
    target_shape: tuple[int, int, int]  # B, H, D of the targets and the benchmark
    n_long: int  # non-causal target length
    n_causal: int  # causal target length
    lengths: tuple[int, ...]  # benchmark lengths
    repeats: int


FULL = Sizes(
    accuracy=(2, 4, 300, 64),
    target_shape=(4, 16, 64),
    n_long=65_536,
    n_causal=16_384,
    lengths=(1024, 4096, 16_384, 65_536),
    repeats=5,
)
TINY = Sizes(accuracy=(1, 2, 37, 16), target_shape=(1, 2, 16), n_long=256, n_causal=128, lengths=(32, 64), repeats=2)


# -- the mechanisms and their oracles -----------------------------------------------------------------------
# Each case builds (fast, ref, inputs): fast(*inputs_on_device) in the dtype, ref(*inputs_float64_cpu). The
# mechanism is looked up in the registry at call time, so a test can replace an entry and see the check fail.


def _qkv_case(name: str, causal: bool, B, H, N, D, device, dtype, g):
    mech = mechanisms.get(name)
    kwargs = {"is_causal": True} if causal and mech.inputs == "qkv" else {}  # "qkvg": causal only
    inputs = mech.example_inputs(B, H, N, D, generator=g)
    return (lambda *qkv: mech.function(*qkv, **kwargs)), (lambda *qkv: mech.reference(*qkv, **kwargs)), inputs


def _layer_case(name: str, causal: bool, B, H, N, D, device, dtype, g):
    mech = mechanisms.get(name)
    layer = mech.module(H * D, H, causal=causal).eval()
    with torch.no_grad():
        for p in layer.parameters():  # weights exactly representable in the dtype, so both sides see them
            p.copy_(p.to(dtype).to(p.dtype))
    reference_layer = copy.deepcopy(layer)  # float32 weights on the CPU, read by the float64 oracle
    fast_layer = layer.to(device=device, dtype=dtype)
    ref = functools.partial(mech.reference, reference_layer, is_causal=causal)
    return fast_layer, ref, [torch.randn(B, N, H * D, generator=g)]


def _cases() -> dict[str, Callable]:
    cases = {}
    for m in mechanisms.MECHANISMS.values():
        for causal in m.forms:
            name = f"{m.name}_causal" if causal and m.bidirectional else m.name
            cases[name] = functools.partial(_layer_case if m.inputs == "x" else _qkv_case, m.name, causal)
    return cases


CASES: dict[str, Callable] = _cases()


def _error(x: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> dict:
    """How far x is from ref, in units of the dtype's tolerance (``worst`` <= 1 passes)."""
    tol = TOLERANCES[dtype]
    x, ref = x.detach().to("cpu", torch.float64), ref.detach().to(torch.float64)
    if x.shape != ref.shape:
        note = f"shape {tuple(x.shape)} != reference {tuple(ref.shape)}"
        return {"worst": math.inf, "max_abs": math.inf, "rel_rms": math.inf, "finite": False, "note": note}
    diff = (x - ref).abs()
    rms = ref.pow(2).mean().sqrt().item() if ref.numel() else 0.0
    allowed = tol["atol"] * rms + tol["rtol"] * ref.abs()
    finite = bool(torch.isfinite(x).all())
    worst = (diff / allowed.clamp_min(torch.finfo(torch.float64).tiny)).max().item() if x.numel() else 0.0
    return {
        "worst": worst if finite else math.inf,
        "max_abs": diff.max().item() if x.numel() else 0.0,
        "rel_rms": (diff.pow(2).mean().sqrt().item() / rms) if rms else 0.0,
        "finite": finite,
    }


def _head(name: str, dtype: torch.dtype, compiled: str | None) -> dict:
    """The fields that name an accuracy case in its record."""
    mode = f"compiled:{compiled}" if compiled else "eager"
    return {"mechanism": name, "dtype": str(dtype).removeprefix("torch."), "compile": mode}


def _crash(record: dict, exc: Exception) -> None:
    """A crash is a failure of that case, reported, not the end of the run."""
    record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    record["passed"] = False


def _check_one(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    sizes: tuple[int, int, int, int],
    compiled: str | None,
    seed: int,
) -> dict:
    B, H, N, D = sizes
    g = torch.Generator().manual_seed(seed)
    record = {**_head(name, dtype, compiled), "shape": [B, H, N, D]}
    try:
        fast, ref, inputs = CASES[name](B, H, N, D, device, dtype, g)
        rounded = [x.to(dtype) for x in inputs]  # both sides see the same (rounded) numbers
        ref_in = [x.to(torch.float64).requires_grad_() for x in rounded]
        fast_in = [x.to(device).requires_grad_() for x in rounded]
        if compiled:
            fast = torch.compile(fast, backend=compiled, dynamic=False)
        out = fast(*fast_in)
        expected = ref(*ref_in)
        # the upstream gradient, too, is rounded to the dtype first, so both sides start from the same numbers
        upstream = torch.randn(expected.shape, generator=g).to(dtype).to(torch.float64)
        grads = torch.autograd.grad(out, fast_in, upstream.to(device=device, dtype=out.dtype))
        ref_grads = torch.autograd.grad(expected, ref_in, upstream)
        record["output_dtype_ok"] = out.dtype == dtype
        record["output"] = _error(out, expected, dtype)
        record["grads"] = [_error(a, b, dtype) for a, b in zip(grads, ref_grads, strict=True)]
        worst = max([record["output"]["worst"]] + [e["worst"] for e in record["grads"]])
        record["worst"] = worst
        record["passed"] = bool(worst <= 1.0 and record["output_dtype_ok"])
    except Exception as exc:
        _crash(record, exc)
    return record


def _fresh_compiler() -> None:
    """Forget earlier compilations and allow enough recompilations that nothing falls back to eager."""
    torch._dynamo.reset()
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)


def check_accuracy(
    device: torch.device | str,
    *,
    dtypes=ALL_DTYPES,
    mechanisms=None,
    sizes=FULL.accuracy,
    compile_backend: str | None = "inductor",
    eager: bool = True,
    deadline: float | None = None,
    log=print,
) -> list[dict]:
    """One record per (mechanism, dtype, eager/compiled): errors in units of the tolerance, ``passed``.

    ``eager`` checks the mechanisms as they are; ``compile_backend`` (unless None) also checks them under
    ``torch.compile``. Cases not started before ``deadline`` (a ``time.perf_counter()`` value) are recorded
    with ``passed=None`` and ``skipped="time budget"``.
    """
    device = torch.device(device)
    names = list(CASES) if mechanisms is None else list(mechanisms)
    modes = ([None] if eager else []) + ([compile_backend] if compile_backend else [])
    records = []
    for mode in modes:
        if mode:
            _fresh_compiler()
        # bfloat16 first: the targets' dtype gets its compiled checks before a time budget runs out
        for dtype in sorted(dtypes, key=lambda d: d != torch.bfloat16) if mode else dtypes:
            for i, name in enumerate(names):
                if deadline is not None and time.perf_counter() > deadline:
                    r = {**_head(name, dtype, mode), "passed": None, "skipped": "time budget"}
                    verdict, detail = "not run", "(time budget)"
                else:
                    r = _check_one(name, dtype, device, sizes, mode, seed=1000 + i)
                    verdict = "ok" if r["passed"] else "FAILED"
                    detail = r.get("error") or f"worst {r['worst']:.3g} of tolerance"
                records.append(r)
                log(f"  accuracy {name:15s} {r['dtype']:9s} {r['compile']:17s} {verdict:6s} {detail}")
    return records


# -- host-device synchronisation ----------------------------------------------------------------------------

# Operators whose result size or value the host must read from device memory.
SYNC_OPS = set(
    "_local_scalar_dense is_nonzero nonzero nonzero_static masked_select unique _unique _unique2 unique_consecutive "
    "unique_dim equal allclose item".split()
)


class SyncDetector(TorchDispatchMode):
    """Records every operator that makes the host wait for the device (``.item()``, ``if t.any():``, ...)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        if op in SYNC_OPS or (op == "repeat_interleave" and "output_size" not in (kwargs or {})):
            self.seen.append(op)
        return func(*args, **(kwargs or {}))


def check_sync(
    device: torch.device | str, *, mechanisms=None, sizes=FULL.accuracy, dtype: torch.dtype = torch.bfloat16, log=print
) -> list[dict]:
    """Run every forward under :class:`SyncDetector` (and, on CUDA, ``set_sync_debug_mode("error")``)."""
    device = torch.device(device)
    names = list(CASES) if mechanisms is None else list(mechanisms)
    B, H, N, D = sizes
    records = []
    for i, name in enumerate(names):
        rec = {"mechanism": name, "dtype": str(dtype).removeprefix("torch.")}
        try:
            fast, _, inputs = CASES[name](B, H, N, D, device, dtype, torch.Generator().manual_seed(i))
            inputs = [x.to(device=device, dtype=dtype) for x in inputs]
            with torch.no_grad():
                fast(*inputs)  # warm up (lazy initialisation may synchronise once)
                detector = SyncDetector()
                with detector:
                    fast(*inputs)
                rec["sync_ops"] = detector.seen
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        fast(*inputs)
                        rec["cuda_sync_debug"] = "no sync"
                    except RuntimeError as exc:
                        rec["cuda_sync_debug"] = f"synchronised: {exc}"[:1000]
                    finally:
                        torch.cuda.set_sync_debug_mode(0)
                else:
                    rec["cuda_sync_debug"] = "not applicable on " + device.type
            rec["passed"] = not rec["sync_ops"] and not rec["cuda_sync_debug"].startswith("synchronised")
        except Exception as exc:
            _crash(rec, exc)
        log(f"  sync     {name:15s} {'ok' if rec['passed'] else 'FAILED'} {rec.get('sync_ops', rec.get('error'))}")
        records.append(rec)
    return records


# -- the performance targets --------------------------------------------------------------------------------


def check_targets(
    device: torch.device | str,
    *,
    B: int,
    H: int,
    D: int,
    n_long: int,
    n_causal: int,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 5,
    compile_backend: str | None = "inductor",
    log=print,
) -> dict:
    """The GPU goals: speed-up over SDPA, distance to the memory floor, causal linear vs causal SDPA."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(7)

    def timed(n, baseline, fns):
        """Forwards on fresh q, k, v of length n: ``baseline``, then each of ``fns`` eager and compiled."""
        x = [torch.randn(B, H, n, D, generator=g).to(device=device, dtype=dtype) for _ in range(3)]
        calls = {baseline[0]: _inference(baseline[1], x)}
        for name, fn in fns:
            calls[f"{name}_eager"] = _inference(fn, x)
            if compile_backend:
                calls[f"{name}_compiled"] = _inference(torch.compile(fn, backend=compile_backend, dynamic=False), x)
        return compare(calls, repeats=repeats, warmup=2, device=device)

    def fastest(impls, prefix):
        return min((k for k in impls if k.startswith(prefix)), key=lambda k: impls[k]["median_s"])

    if compile_backend:
        _fresh_compiler()
    bandwidth = copy_bandwidth(device, nbytes=2**30 if device.type == "cuda" else 2**26)
    log(f"  targets  copy bandwidth {bandwidth / 1e9:.1f} GB/s")

    # Non-causal at n_long.
    timing = timed(n_long, ("sdpa", softmax_attention), [("linear", linear_attention), ("flow", flow_attention)])
    floor = memory_floor_seconds(B, H, n_long, D, dtype, bandwidth)
    sdpa = timing["sdpa"].median
    long = {"N": n_long, "memory_floor_s": floor, "sdpa_s": sdpa, "impls": {}}
    for impl, t in timing.items():
        long["impls"][impl] = {
            "median_s": t.median,
            "samples_s": list(t.samples),
            "speedup_vs_sdpa": sdpa / t.median,
            "times_memory_floor": t.median / floor,
        }
    for name in ("linear", "flow"):
        best = fastest(long["impls"], name + "_")
        b = long["impls"][best]
        long[name] = {
            "best": best,
            "speedup_vs_sdpa": b["speedup_vs_sdpa"],
            "times_memory_floor": b["times_memory_floor"],
            "met_10x_sdpa": b["speedup_vs_sdpa"] >= 10,
            "met_3x_floor": b["times_memory_floor"] <= 3,
        }
        log(
            f"  targets  {name} N={n_long}: best {best} {b['median_s'] * 1e3:.3f} ms, "
            f"{b['speedup_vs_sdpa']:.1f}x faster than SDPA ({sdpa * 1e3:.3f} ms), "
            f"{b['times_memory_floor']:.2f}x the memory floor ({floor * 1e3:.3f} ms)"
        )

    # Causal at n_causal.
    timing = timed(
        n_causal,
        ("sdpa_causal", lambda q, k, v: softmax_attention(q, k, v, is_causal=True)),
        [("linear_causal", lambda q, k, v: linear_attention(q, k, v, is_causal=True))],
    )
    base = timing["sdpa_causal"].median
    impls = {
        k: {"median_s": t.median, "samples_s": list(t.samples), "speedup_vs_sdpa_causal": base / t.median}
        for k, t in timing.items()
    }
    best = fastest(impls, "linear")
    causal = {"N": n_causal, "sdpa_causal_s": base, "impls": impls, "best": best}
    causal["met_faster_than_sdpa_causal"] = impls[best]["median_s"] < base
    log(
        f"  targets  causal linear N={n_causal}: best {best} {impls[best]['median_s'] * 1e3:.3f} ms "
        f"vs SDPA causal {base * 1e3:.3f} ms"
    )
    return {
        "shape": {"B": B, "H": H, "D": D},
        "dtype": str(dtype).removeprefix("torch."),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "non_causal": long,
        "causal": causal,
    }


# -- the whole run ------------------------------------------------------------------------------------------


def _write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(path)


def run(
    device: torch.device | str,
    out: Path,
    *,
    sizes: Sizes = FULL,
    dtypes=ALL_DTYPES,
    compile_backend: str | None = "inductor",
    benchmark: bool = True,
    targets: bool = True,
    budget_s: float | None = None,
    log=print,
) -> dict:
    """Every section, the report rewritten after each; returns the report.

    Order: eager accuracy, sync, targets, benchmark, then the compiled accuracy checks (the slowest part,
    compilation); with ``budget_s`` the compiled cases not started within the budget are reported as not run.
    """
    device = torch.device(device)
    t0 = time.perf_counter()
    deadline = None if budget_s is None else t0 + budget_s
    report = {
        "kind": "attnbook.lab.check_gpu",
        "environment": environment(device),
        "sizes": {
            "accuracy_BHND": list(sizes.accuracy),
            "targets_BHD": list(sizes.target_shape),
            "n_long": sizes.n_long,
            "n_causal": sizes.n_causal,
            "lengths": list(sizes.lengths),
        },
        "tolerances": {str(d).removeprefix("torch."): t for d, t in TOLERANCES.items()},
        "tolerance_rule": "|x - ref| <= atol * rms(ref) + rtol * |ref| elementwise, outputs and gradients",
        "compile_backend": compile_backend,
        "budget_s": budget_s,
        "sections_done": [],
    }
    if device.type == "cuda":
        report["environment"]["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory

    def section(name, fn, *args, **kwargs):
        log(f"[check_gpu] {name} ...")
        s = time.perf_counter()
        try:
            report[name] = fn(*args, **kwargs)
        except Exception as exc:  # keep the other sections
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        report["sections_done"].append(name)
        report[f"{name}_seconds"] = time.perf_counter() - s
        _write(out, report)

    accuracy = dict(dtypes=dtypes, sizes=sizes.accuracy, log=log)
    section("accuracy", check_accuracy, device, compile_backend=None, **accuracy)
    section("sync", check_sync, device, sizes=sizes.accuracy, log=log)
    B, H, D = sizes.target_shape
    if targets:
        shape = dict(B=B, H=H, D=D, n_long=sizes.n_long, n_causal=sizes.n_causal, repeats=sizes.repeats)
        section("targets", check_targets, device, **shape, compile_backend=compile_backend, log=log)
    if benchmark:
        shape = dict(batch=B, heads=H, head_dim=D, device=device, dtype=torch.bfloat16, repeats=sizes.repeats)
        section("benchmark", run_benchmark, sizes.lengths, **shape, max_matrix_bytes=8 * 2**30, progress=True)
    if compile_backend:
        compiled = dict(compile_backend=compile_backend, eager=False, deadline=deadline)
        section("accuracy_compiled", check_accuracy, device, **compiled, **accuracy)
    checks = report["accuracy"], report.get("accuracy_compiled", [])
    report["accuracy_failed"], report["accuracy_not_run"] = [], []
    for part in checks:
        if not isinstance(part, list):
            report["accuracy_failed"].append("an accuracy section crashed: " + str(part.get("error")))
            continue
        for r in part:
            label = f"{r['mechanism']}/{r['dtype']}/{r['compile']}"
            if r["passed"] is None:
                report["accuracy_not_run"].append(label)
            elif not r["passed"]:
                report["accuracy_failed"].append(label)
    syn = report["sync"]
    report["sync_failed"] = (
        [r["mechanism"] for r in syn if not r["passed"]] if isinstance(syn, list) else ["sync section crashed"]
    )
    report["passed"] = not report["accuracy_failed"] and not report["sync_failed"]
    report["total_seconds"] = time.perf_counter() - t0
    _write(out, report)
    return report


NO_CUDA = (
    "attnbook.lab.check_gpu: no CUDA device here (torch.cuda.is_available() is False), so there is nothing to "
    "verify on a GPU.\nTo exercise the check's logic on the CPU at tiny sizes, run:\n"
    "    python -m attnbook.lab.check_gpu --device cpu --tiny"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.lab.check_gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (only with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: tests the logic, measures nothing")
    parser.add_argument(
        "--out",
        default=None,
        help="report path (default benchmarks/results/gpu_check.json; "
        "with --tiny, gpu_check_tiny_<device>.json in the temporary directory)",
    )
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend for the compiled checks, or 'none' to skip them (default: "
        "inductor on CUDA; eager on the CPU, where inductor would compile C++ for minutes)",
    )
    parser.add_argument("--no-benchmark", action="store_true", help="skip the full benchmark")
    parser.add_argument("--no-targets", action="store_true", help="skip the target measurements")
    budget = "compiled accuracy cases not started within this many seconds are reported as not run"
    parser.add_argument("--budget-s", type=float, default=None, help=budget)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    if device.type != "cuda" and not args.tiny:
        why = f"full sizes on {device.type} would take hours; add --tiny to test the logic"
        print(f"attnbook.lab.check_gpu: {why}", file=sys.stderr)
        return 2
    try:
        dtypes = tuple(DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip())
    except KeyError as exc:
        parser.error(f"--dtypes: unknown dtype {exc}; choose from {list(DTYPES)}")
    backend = args.compile_backend or ("inductor" if device.type == "cuda" else "eager")
    backend = None if backend == "none" else backend
    # a tiny run measures nothing worth keeping: by default it goes to the temporary directory
    tiny = Path(tempfile.gettempdir()) / f"gpu_check_tiny_{device.type}.json"
    out = Path(args.out or (tiny if args.tiny else Path("benchmarks") / "results" / "gpu_check.json"))
    report = run(
        device,
        out,
        sizes=TINY if args.tiny else FULL,
        dtypes=dtypes,
        compile_backend=backend,
        benchmark=not args.no_benchmark,
        targets=not args.no_targets,
        budget_s=args.budget_s,
    )
    print(
        f"[check_gpu] wrote {out}; accuracy failures: {report['accuracy_failed'] or 'none'}; "
        f"not run: {len(report['accuracy_not_run'])}; sync failures: {report['sync_failed'] or 'none'}; "
        f"{report['total_seconds']:.0f} s"
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
