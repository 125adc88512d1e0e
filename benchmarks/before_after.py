"""Before / after: the package at a git ref (default ``main``) against the working tree, alternating in one process.

The ref's ``src/attnbook`` is extracted into a temporary directory and imported as ``attnbook_before`` (its
absolute imports renamed), so both versions run side by side on the same inputs, alternately
(attnbook.lab.profiling.compare), medians reported. Cases: linear attention non-causal and causal (forward,
forward + backward) at the recorded sizes, causal linear attention against fast-transformers' C++ kernel (one
thread, when built: benchmarks/peers.py), the causal inference peak memory, and Flow-/Mobile-Attention.

    python benchmarks/before_after.py                       # main against the working tree
    python benchmarks/before_after.py --ref HEAD~3 --repeats 9 --out /tmp/ba.json

Writes benchmarks/results/before_after.json (or --out) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

import attnbook
from attnbook.lab.profiling import compare, peak_memory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from published import fast_transformers_linear_attention as seed_port  # noqa: E402
from published import published_mobile_attention  # noqa: E402


def import_before(ref: str, into: Path):
    """``src/attnbook`` at ``ref`` as the module ``attnbook_before``."""
    blob = subprocess.run(["git", "archive", ref, "src/attnbook"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    pkg = into / "attnbook_before"
    (into / "src" / "attnbook").rename(pkg)
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\b(from|import) attnbook\b", r"\1 attnbook_before", text)
        path.write_text(text.replace('"attnbook.', '"attnbook_before.'))
    sys.path.insert(0, str(into))
    return importlib.import_module("attnbook_before")


def inputs(B, H, N, D=64, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g).requires_grad_(grad) for _ in range(3)]


def timed(fns: dict, repeats: int, threads: int, grad: bool = False) -> dict:
    torch.set_num_threads(threads)
    with torch.set_grad_enabled(grad):
        t = compare(fns, repeats=repeats, warmup=1)
    return {name: round(x.median * 1e3, 2 if x.median > 1e-3 else 4) for name, x in t.items()}


def fwd(fn, *args, **kwargs):
    return functools.partial(fn, *args, **kwargs)


def fwd_bwd(fn, q, k, v, up, **kwargs):
    return lambda: torch.autograd.grad(fn(q, k, v, **kwargs), (q, k, v), up)


def peer_attention(kernel):
    def attend(q, k, v, eps=1e-6):  # fast-transformers' CausalLinearAttention on (B, H, N, D)
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        z = 1 / (torch.einsum("nhli,nhli->nhl", fq, fk.cumsum(2)) + eps)
        return kernel(fq, fk, v) * z[..., None]

    return attend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default="main")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2, help="threads of the 2-thread cases")
    p.add_argument("--peer-shapes", nargs="+", default=["2x8x1024", "2x8x4096", "1x4x16384", "1x8x16384"])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "before_after.json")
    a = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    old = import_before(a.ref, Path(tmp.name))
    new = attnbook
    T, R = a.threads, a.repeats
    cases = []

    def add(name, settings, times, ratios):
        case = {"case": name, "settings": settings, "median_ms": times, "ratios": ratios}
        cases.append(case)
        print(json.dumps(case), flush=True)

    # linear, non-causal forward, B=4 H=8 N=4096 D=64
    q, k, v = inputs(4, 8, 4096)
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    fns = {
        "before": fwd(old.linear_attention, q, k, v),
        "after": fwd(new.linear_attention, q, k, v),
        "seed_einsum_port": fwd(seed_port, qs, ks, vs),
        "two_products": lambda: fq @ (fk.transpose(-2, -1) @ v),
    }
    t = timed(fns, R, T)
    add(
        "linear non-causal forward",
        f"B=4 H=8 N=4096 D=64 float32, {T} threads",
        t,
        {
            "before/after": round(t["before"] / t["after"], 2),
            "seed/after": round(t["seed_einsum_port"] / t["after"], 2),
            "seed/before": round(t["seed_einsum_port"] / t["before"], 2),
            "after/two_products": round(t["after"] / t["two_products"], 2),
        },
    )

    # linear, causal, B=4 H=8 N=8192 (bench_linear's causal size): forward without autograd, forward + backward
    q, k, v = inputs(4, 8, 8192, grad=True)
    up = torch.randn_like(v)
    with torch.no_grad():
        t = timed(
            {
                "before": fwd(old.linear_attention, q, k, v, causal=True),
                "after": fwd(new.linear_attention, q, k, v, is_causal=True),
            },
            max(5, R // 3),
            T,
        )
    add(
        "linear causal forward (no autograd)",
        f"B=4 H=8 N=8192 D=64, {T} threads",
        t,
        {"before/after": round(t["before"] / t["after"], 2)},
    )
    for threads in (T, 1):  # and on one thread, as linear.json records it
        t = timed(
            {
                "before": fwd_bwd(old.linear_attention, q, k, v, up, causal=True),
                "after": fwd_bwd(new.linear_attention, q, k, v, up, is_causal=True),
            },
            max(5, R // 3),
            threads,
            grad=True,
        )
        add(
            "linear causal forward+backward",
            f"B=4 H=8 N=8192 D=64, {threads} thread{'s' if threads > 1 else ''}",
            t,
            {"before/after": round(t["before"] / t["after"], 2)},
        )

    # one recurrent step (linear_attention_step: the features of one token, the state update), one thread
    g = torch.Generator().manual_seed(1)
    q1, k1, v1 = (torch.randn(4, 8, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        states = {n: m.linear_attention_step(q1, k1, v1)[1] for n, m in (("before", old), ("after", new))}
        t = timed(
            {n: fwd(m.linear_attention_step, q1, k1, v1, states[n]) for n, m in (("before", old), ("after", new))},
            200,
            1,
        )
    add(
        "linear recurrent step",
        "B=4 H=8 D=64, 1 thread (medians in ms)",
        t,
        {"before/after": round(t["before"] / t["after"], 2)},
    )

    # causal linear against fast-transformers' C++ kernel, one thread
    import peers

    kernel = peers.import_causal_product()
    if kernel is None:
        print(
            f"peer cases skipped: fast-transformers is not built in {peers.cache_dir()} (benchmarks/peers.py --build)"
        )
    else:
        peer = peer_attention(kernel)
        for shape in a.peer_shapes:
            B, H, N = (int(x) for x in shape.split("x"))
            q, k, v = inputs(B, H, N, grad=True)
            up = torch.randn_like(v)
            kw = {"causal": True}
            with torch.no_grad():
                t = timed(
                    {
                        "before": fwd(old.linear_attention, q, k, v, **kw),
                        "after": fwd(new.linear_attention, q, k, v, **kw),
                        "peer": fwd(peer, q, k, v),
                    },
                    R,
                    1,
                )
            ratios = {
                "peer/after": round(t["peer"] / t["after"], 2),
                "peer/before": round(t["peer"] / t["before"], 2),
                "before/after": round(t["before"] / t["after"], 2),
            }
            add("causal linear vs fast-transformers, forward", f"B={B} H={H} N={N} D=64, 1 thread", t, ratios)
            t = timed(
                {
                    "before": fwd_bwd(old.linear_attention, q, k, v, up, **kw),
                    "after": fwd_bwd(new.linear_attention, q, k, v, up, **kw),
                    "peer": fwd_bwd(lambda q, k, v: peer(q, k, v), q, k, v, up),
                },
                max(5, R // 2),
                1,
                grad=True,
            )
            ratios = {
                "peer/after": round(t["peer"] / t["after"], 2),
                "peer/before": round(t["peer"] / t["before"], 2),
                "before/after": round(t["before"] / t["after"], 2),
            }
            add("causal linear vs fast-transformers, forward+backward", f"B={B} H={H} N={N} D=64, 1 thread", t, ratios)

    # causal inference peak memory (tensors allocated by torch operators, the output included)
    q, k, v = inputs(1, 4, 16384)
    with torch.no_grad():
        mem = {
            name: peak_memory(fwd(m.linear_attention, q, k, v, causal=True), existing=(q, k, v))
            for name, m in (("before", old), ("after", new))
        }
    out_bytes = v.numel() * v.element_size()
    add(
        "linear causal peak memory (no autograd)",
        "B=1 H=4 N=16384 D=64, attnbook.lab.profiling.peak_memory",
        {f"{n}_MiB": round(b / 2**20, 1) for n, b in mem.items()},
        {"before/output": round(mem["before"] / out_bytes, 2), "after/output": round(mem["after"] / out_bytes, 2)},
    )

    # Flow- and Mobile-Attention (unchanged code paths: nothing may get slower)
    q, k, v = inputs(4, 8, 4096)
    with torch.inference_mode():
        t = timed(
            {
                "flow_before": fwd(old.flow_attention, q, k, v),
                "flow_after": fwd(new.flow_attention, q, k, v),
                "mobile_before": fwd(old.mobile_attention, q, k, v),
                "mobile_after": fwd(new.mobile_attention, q, k, v),
                "mobile_seed_port": fwd(published_mobile_attention, q, k, v),
            },
            R,
            T,
        )
    add(
        "flow / mobile non-causal forward",
        f"B=4 H=8 N=4096 D=64, {T} threads",
        t,
        {
            "flow before/after": round(t["flow_before"] / t["flow_after"], 2),
            "mobile before/after": round(t["mobile_before"] / t["mobile_after"], 2),
            "mobile seed/after": round(t["mobile_seed_port"] / t["mobile_after"], 2),
        },
    )
    q, k, v = inputs(4, 8, 8192)
    with torch.inference_mode():
        t = timed(
            {
                "before": fwd(old.flow_attention, q, k, v, causal=True),
                "after": fwd(new.flow_attention, q, k, v, is_causal=True),
            },
            max(5, R // 3),
            T,
        )
    add(
        "flow causal forward",
        f"B=4 H=8 N=8192 D=64, {T} threads",
        t,
        {"before/after": round(t["before"] / t["after"], 2)},
    )

    result = {
        "ref": a.ref,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_at_end": os.getloadavg(),
        "cases": cases,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| case | settings | medians (ms) | ratios |\n|---|---|---|---|")
    for c in cases:
        times = ", ".join(f"{n} {x}" for n, x in c["median_ms"].items())
        ratios = ", ".join(f"{n} **{x}**" for n, x in c["ratios"].items())
        print(f"| {c['case']} | {c['settings']} | {times} | {ratios} |")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
