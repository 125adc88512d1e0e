"""Does each fast path of the annex (attnbook._fast) earn its place? Every path against the plain form it replaces,
and the defaults against the seeds' formulations, in every condition a user's machine may be in.

Conditions (each crossed with 1 and 2 threads of torch in this process):

* ``quiet``: nothing else runs;
* ``after_work``: right after another large workload in this process (a few seconds of large matrix products
  and of tensors of 32 to 256 MiB made and dropped), so that caches, the allocator and the thread pool are in
  the state other work leaves them in;
* ``beside_busy``: beside two other processes, each running torch's matrix products on 2 threads, on a
  machine of 2 cores: every thread here has to wait for a core.

Cases, at the sizes of issue 36 (float32, CPU):

* ``linear``: non-causal linear attention without autograd, B=4 H=8 N=4096 D=64: the annex (default), the plain
  form (``config.set_plain(True)``), and the seed's formulation (fast-transformers' three einsums,
  ``tests/published.py``);
* ``mobile``: Mobile-Attention's core without autograd, same sizes: the default, plain, the published core;
* ``causal``: causal linear attention without autograd at (B, H, N) = (2, 8, 1024), (2, 8, 4096), (1, 4, 16384):
  annex, plain, and fast-transformers' C++ kernel (``benchmarks/peers.py --build``; skipped without it);
* ``causal_train``: forward and backward at (2, 8, 4096), the same three;
* ``tiles`` (quiet only): the annex's causal tiles of 1024, 2048 (its constant) and 4096 positions.

Before each case the bench times making a new 32 MiB tensor and refilling one that exists (``allocator`` in each
cell, :func:`allocator_probe`): the memory allocator's state sets much of a cell's time (a new tensor can cost page
faults or nothing, depending on what ran before in the process), so each cell records the state it met.

Every case alternates its implementations in one run (:func:`attnbook.lab.profiling.compare`) and records
medians of 15 runs (7 left the busy condition's medians noisy: one cell read 1.30 and 1.85 in two recordings of
one code). "annex" is the default (the annex on), and each cell records whether the annex took the call at all
(``annex runs``: a call reached ``attnbook._fast``; the causal tiles take one thread without autograd). The
verdict of a fast path is the smallest plain / annex ratio (of unrounded medians) over the cells where it ran (it
stays at 1.3 or more); a case where it never ran has no verdict (None). Where the annex did not run, both columns
time the same code: their ratio is the bench's own noise (:func:`same_code_spread`, printed under the tables).
The recording refuses a busy machine (the 1-minute load average above half the cores) unless ``--force``, and
stores the load before and after and the commit.

    python benchmarks/bench_annex.py                # benchmarks/results/annex.json and a markdown table
    python benchmarks/bench_annex.py --quick        # fewer repeats, the smallest causal size only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnbook
from attnbook import config
from attnbook._fast import causal as annex_causal
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import import_causal_product  # noqa: E402
from published import fast_transformers_linear_attention, published_mobile_attention  # noqa: E402
from recording import beside_busy, quiet_or_exit, stamp  # noqa: E402

CONDITIONS = ("quiet", "after_work", "beside_busy")
THRESHOLD = 1.3  # a fast path stays when plain / annex is at least this in every condition


def plain(fn):
    """fn with the annex off, then the environment's choice back."""

    def call():
        config.set_plain(True)
        try:
            return fn()
        finally:
            config.set_plain(None)

    return call


def annex_runs(fn) -> bool:
    """Whether one call of fn reaches the annex: its entry point (the causal tiles) spied on."""
    calls = []
    saved = annex_causal.forward

    def spy(*args, **kwargs):
        calls.append(1)
        return saved(*args, **kwargs)

    annex_causal.forward = spy
    try:
        fn()
    finally:
        annex_causal.forward = saved
    return bool(calls)


def large_workload(seconds: float = 4.0) -> None:
    """Other work in this process: large products, and large tensors made and dropped."""
    end = time.time() + seconds
    a = torch.randn(2048, 2048)
    while time.time() < end:
        a = torch.tanh(a @ a.T / 2048)
        for mib in (32, 64, 128, 256):
            torch.ones(mib << 18).mul_(2.0).sum()


PROBE_MIB = 32  # the size of one (4, 8, 4096, 64) float32 tensor: the features, v and the outputs of the cases


def allocator_probe(repeats: int = 7) -> dict[str, float]:
    """The state of the memory allocator as the next case meets it: medians in ms of making a new tensor of
    ``PROBE_MIB`` MiB and filling it, and of filling one that exists. Where the allocator takes memory from the
    system, the new tensor's pages fault in as they are filled, and the first is many times the second; where it
    reuses memory that earlier work freed, the two are alike."""
    numel = PROBE_MIB << 18  # float32
    kept = torch.empty(numel)
    new, refill = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.empty(numel).fill_(1.0)
        t1 = time.perf_counter()
        kept.fill_(1.0)
        t2 = time.perf_counter()
        new.append(t1 - t0)
        refill.append(t2 - t1)
    return {"new": round(statistics.median(new) * 1e3, 2), "refill": round(statistics.median(refill) * 1e3, 2)}


def fwd_bwd(fn, inputs):
    def step():
        out = fn(*inputs)
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    return step


def peer_causal(kernel):
    """fast-transformers' CausalLinearAttention on (B, H, N, D): elu + 1 features, its C++ product, its normaliser."""

    def attend(q, k, v, eps=1e-6):
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        return kernel(fq, fk, v) / ((fq * fk.cumsum(-2)).sum(-1, keepdim=True) + eps)

    return attend


def cases(quick: bool, kernel) -> dict[str, dict]:
    """Every case: its size, whether it trains, and its implementations (zero-argument callables)."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, dict] = {}
    q, k, v = (torch.randn(4, 8, 4096, 64, generator=g) for _ in range(3))
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # the seed's (B, N, H, D) layout
    with torch.no_grad():
        out["linear"] = {
            "size": "B=4 H=8 N=4096 D=64",
            "fns": {
                "annex": lambda: attnbook.linear_attention(q, k, v),
                "plain": plain(lambda: attnbook.linear_attention(q, k, v)),
                "seed": lambda: fast_transformers_linear_attention(qs, ks, vs),
            },
        }
        out["mobile"] = {
            "size": "B=4 H=8 N=4096 D=64",
            "fns": {
                "annex": lambda: attnbook.mobile_attention(q, k, v),
                "plain": plain(lambda: attnbook.mobile_attention(q, k, v)),
                "seed": lambda: published_mobile_attention(q, k, v),
            },
        }
    sizes = [(2, 8, 1024)] if quick else [(2, 8, 1024), (2, 8, 4096), (1, 4, 16384)]
    for B, H, N in sizes:
        cq, ck, cv = (torch.randn(B, H, N, 64, generator=g) for _ in range(3))

        def causal(cq=cq, ck=ck, cv=cv):
            return attnbook.linear_attention(cq, ck, cv, is_causal=True)

        fns = {"annex": causal, "plain": plain(causal)}
        if kernel is not None:
            fns["peer"] = lambda cq=cq, ck=ck, cv=cv: peer_causal(kernel)(cq, ck, cv)
        out[f"causal_{N}"] = {"size": f"B={B} H={H} N={N} D=64", "fns": fns}
    tq, tk, tv = (torch.randn(2, 8, 1024 if quick else 4096, 64, generator=g).requires_grad_() for _ in range(3))

    def causal_linear(q, k, v):
        return attnbook.linear_attention(q, k, v, is_causal=True)

    fns = {"annex": fwd_bwd(causal_linear, (tq, tk, tv)), "plain": plain(fwd_bwd(causal_linear, (tq, tk, tv)))}
    if kernel is not None:
        fns["peer"] = fwd_bwd(peer_causal(kernel), (tq, tk, tv))
    out["causal_train"] = {"size": f"B=2 H=8 N={tq.shape[2]} D=64, forward and backward", "grad": True, "fns": fns}
    return out


def tile_sizes(repeats: int) -> dict[str, float]:
    """The annex's causal tiles of half, one and twice its constant, quiet, one thread: medians in ms."""
    q, k, v = (torch.randn(2, 8, 4096, 64) for _ in range(3))

    def with_tile(positions):
        def call():
            before = annex_causal.CPU_TILE
            annex_causal.CPU_TILE = positions
            try:
                with torch.no_grad():
                    return attnbook.linear_attention(q, k, v, is_causal=True)
            finally:
                annex_causal.CPU_TILE = before

        return call

    base = annex_causal.CPU_TILE
    timing = compare({str(t): with_tile(t) for t in (base // 2, base, base * 2)}, repeats=repeats, warmup=1)
    return {name: round(t.median * 1e3, 2) for name, t in timing.items()}


def run(quick: bool, repeats: int) -> dict:
    kernel = import_causal_product()
    if kernel is None:
        print("fast-transformers' kernel is not built (benchmarks/peers.py --build): no peer column", file=sys.stderr)
    table = cases(quick, kernel)
    results: dict[str, dict] = {name: {"size": case["size"], "cells": {}} for name, case in table.items()}
    for condition in CONDITIONS:
        with beside_busy() if condition == "beside_busy" else contextlib.nullcontext():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for name, case in table.items():
                    if condition == "after_work":
                        large_workload()
                    allocator = allocator_probe()
                    with torch.set_grad_enabled(case.get("grad", False)):
                        timing = compare(case["fns"], repeats=repeats, warmup=1)
                        used = annex_runs(case["fns"]["annex"])
                    cell = {impl: round(t.median * 1e3, 2) for impl, t in timing.items()}
                    for other in ("plain", "seed", "peer"):  # from the unrounded medians: a verdict is not rounded
                        if other in timing:
                            cell[f"{other}/annex"] = round(timing[other].median / timing["annex"].median, 3)
                    cell["annex runs"] = used
                    cell["allocator"] = allocator  # measured just before the case: its memory's state
                    results[name]["cells"][f"{condition}/{threads}"] = cell
                    print(f"{condition:12s} {threads} thread(s)  {name:14s} {cell}", file=sys.stderr, flush=True)
    torch.set_num_threads(1)
    tiles = tile_sizes(repeats)
    verdicts = {}
    for name, r in results.items():
        cells = r["cells"].values()
        worst = {key: min(c[key] for c in cells) for key in next(iter(cells)) if "/" in key}
        ran = [c["plain/annex"] for c in cells if c["annex runs"]]
        worst["plain/annex where the annex ran"] = min(ran) if ran else None
        r["worst"] = worst
        verdicts[name] = min(ran) >= THRESHOLD if ran else None
    return {"results": results, "tiles_ms": tiles, "verdicts": verdicts, "threshold": THRESHOLD}


def same_code_spread(recording: dict) -> dict[str, tuple[float, float]]:
    """Per condition and thread count (``"quiet/1"``), the smallest and largest plain / annex ratio over the cells
    where the annex did not run: there both columns time the same code, so their spread is the bench's own noise."""
    spread: dict[str, list[float]] = {}
    for r in recording["results"].values():
        for key, cell in r["cells"].items():
            if not cell["annex runs"]:
                spread.setdefault(key, []).append(cell["plain/annex"])
    return {key: (min(ratios), max(ratios)) for key, ratios in spread.items()}


def markdown(recording: dict) -> str:
    lines = []
    for name, r in recording["results"].items():
        lines.append(f"**{name}** ({r['size']}), medians in ms:\n")
        first = next(iter(r["cells"].values()))
        impls = [k for k in first if "/" not in k and k not in ("annex runs", "allocator")]
        ratios = [k for k in first if "/" in k] + ["annex runs"]
        probe = ["new / refill 32 MiB"] if "allocator" in first else []  # recordings before it have none
        lines.append("| condition | threads | " + " | ".join(impls + ratios + probe) + " |")
        lines.append("|---|---|" + "---|" * (len(impls) + len(ratios) + len(probe)))
        for key, cell in r["cells"].items():
            condition, threads = key.split("/")
            values = [str(cell[c]) for c in impls + ratios]
            if probe:
                values.append(f"{cell['allocator']['new']} / {cell['allocator']['refill']}")
            lines.append(f"| {condition} | {threads} | " + " | ".join(values) + " |")
        lines.append(f"\nworst over the conditions: {r['worst']}\n")
    noise = ", ".join(f"{key} {lo:g} to {hi:g}" for key, (lo, hi) in same_code_spread(recording).items())
    lines.append(f"same code timed twice (plain / annex where the annex did not run): {noise}\n")
    lines.append(f"tiles (quiet, 1 thread, B=2 H=8 N=4096, ms): {recording['tiles_ms']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and the smallest causal size only")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "annex.json")
    parser.add_argument("--force", action="store_true", help="record on a busy machine (noted in the recording)")
    args = parser.parse_args(argv)
    load = quiet_or_exit("bench_annex.py", args.force)
    repeats = args.repeats or (3 if args.quick else 15)  # 15: beside busy processes 7 runs left medians noisy
    recording = run(args.quick, repeats)
    recording["environment"] = stamp(environment(), load, args.force)
    recording["config"] = {"repeats": repeats, "quick": args.quick, "conditions": CONDITIONS, "threads": [1, 2]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(recording, indent=1) + "\n")
    print(markdown(recording))
    print(f"\nwritten {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
