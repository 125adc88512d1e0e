"""Compiled layers at many lengths (issue 28): every registry layer under ``torch.compile(dynamic=True)`` over ten
sequence lengths, the number of recompilations after the first graph (the target: none), and compiled against
eager time at N = 1024 (forward, and forward + backward), alternating, medians.

    python benchmarks/bench_compile.py                 # CPU, one thread, inductor; refuses a busy machine (--force)
    python benchmarks/bench_compile.py --device cuda

Writes benchmarks/results/compile_<device>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from recording import quiet_or_exit, stamp

from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare
from attnbook.mechanisms import MECHANISMS

LENGTHS = (64, 100, 128, 200, 256, 333, 512, 700, 1000, 1024)


def graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def timings(layer, compiled, x: torch.Tensor, repeats: int, device: torch.device):
    """Forward (no autograd) and forward + backward of eager and compiled, alternating: two compare results."""

    def train(fn) -> None:
        fn(x.detach().requires_grad_()).sum().backward()

    with torch.no_grad():
        fwd = compare({"eager": lambda: layer(x), "compiled": lambda: compiled(x)}, repeats=repeats, warmup=2,
                      device=device)  # fmt: skip
    both = compare({"eager": lambda: train(layer), "compiled": lambda: train(compiled)}, repeats=repeats,
                   warmup=2, device=device)  # fmt: skip
    return fwd, both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = quiet_or_exit("bench_compile", args.force)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = {}
    for name, mech in MECHANISMS.items():
        for causal in (False, True) if mech.causal else (False,):
            key = f"{name}{'_causal' if causal else ''}"
            torch._dynamo.reset()
            torch.manual_seed(0)
            layer = mech.module(args.dim, args.heads, causal=causal).to(device)
            compiled = torch.compile(layer, dynamic=True, backend=args.backend)
            t0 = time.perf_counter()
            with torch.no_grad():
                compiled(torch.randn(args.batch, LENGTHS[0], args.dim, device=device))
            first_s, first = time.perf_counter() - t0, graphs()
            worst = 0.0
            with torch.no_grad():
                for n in LENGTHS[1:]:
                    x = torch.randn(args.batch, n, args.dim, device=device)
                    worst = max(worst, float((compiled(x) - layer(x)).abs().max()))
            recompiled = graphs() - first
            x = torch.randn(args.batch, 1024, args.dim, device=device)

            fwd, both = timings(layer, compiled, x, args.repeats, device)
            rows[key] = {
                "first_compile_s": first_s,
                "recompilations": recompiled,
                "max_difference": worst,
                "forward_s": {k: t.median for k, t in fwd.items()},
                "forward_backward_s": {k: t.median for k, t in both.items()},
            }
            r = rows[key]
            print(f"{key:15s} recompilations {recompiled}  first compile {first_s:5.1f} s  eager/compiled at N=1024: "
                  f"forward {r['forward_s']['eager'] / r['forward_s']['compiled']:.2f}x, forward+backward "
                  f"{r['forward_backward_s']['eager'] / r['forward_backward_s']['compiled']:.2f}x")  # fmt: skip
    out = {
        "kind": "bench_compile",
        "config": {
            **{k: getattr(args, k) for k in ("dim", "heads", "batch", "repeats", "backend")},
            "lengths": LENGTHS,
        },
        "environment": stamp(environment(device), load_before, args.force),
        "layers": rows,
    }
    path = args.out or Path(__file__).parent / "results" / f"compile_{device.type}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
