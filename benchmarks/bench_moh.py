"""MoHAttention forward time against SoftmaxAttention at the same width and number of heads.

Target: MoH's forward at most 1.25x SoftmaxAttention's, CPU float32, B=4, N=1024, dim=512, 8 heads.
Both compute every head densely through SDPA; MoH adds the router (O(B N C H)) and the per-token gate
multiply (O(B N C)). Implementations alternate in one run (attnbook.lab.profiling.compare); medians are reported.

    python benchmarks/bench_moh.py                      # the target sizes, writes benchmarks/results/moh.json
    python benchmarks/bench_moh.py --n 256 --repeats 5  # quicker
    python benchmarks/bench_moh.py --train               # training step: forward + backward (+ MoH's loss)
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

import attnbook
from attnbook.lab.profiling import compare

CONFIGS = {  # name -> (shared_head, routed_head)
    "moh_s2_k4": (2, 4),
    "moh_s0_k4": (0, 4),
    "moh_all_shared": (None, 0),  # shared_head = heads
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 keeps the default")
    parser.add_argument(
        "--train",
        action="store_true",
        help="time forward + backward in training mode (MoH adds its load-balancing loss)",
    )
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/moh[_train].json)")
    args = parser.parse_args()
    if args.out is None:
        args.out = str(Path(__file__).parent / "results" / ("moh_train.json" if args.train else "moh.json"))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    B, N, C, H = args.batch, args.n, args.dim, args.heads
    x = torch.randn(B, N, C, device=device)

    baseline = attnbook.SoftmaxAttention(C, C, C, H).to(device).train(args.train)
    layers = {}
    for name, (shared, routed) in CONFIGS.items():
        shared = H if shared is None else shared
        layers[name] = attnbook.MoHAttention(C, H, qkv_bias=True, shared_head=shared, routed_head=routed)
        layers[name].to(device).train(args.train)

    if args.train:

        def step_softmax():
            baseline(x, x, x).sum().backward()

        def step_moh(m):
            loss = m(x).sum()
            if m.load_balancing_loss is not None:
                loss = loss + 0.01 * m.load_balancing_loss
            loss.backward()

        fns = {"softmax": step_softmax} | {name: (lambda m=m: step_moh(m)) for name, m in layers.items()}
        timings = compare(fns, repeats=args.repeats, warmup=args.warmup, device=device)
    else:
        fns = {"softmax": lambda: baseline(x, x, x)}
        fns |= {name: (lambda m=m: m(x)) for name, m in layers.items()}
        with torch.inference_mode():
            timings = compare(fns, repeats=args.repeats, warmup=args.warmup, device=device)

    base = timings["softmax"].median
    what = "training step (forward + backward)" if args.train else "forward (eval, inference_mode)"
    print(
        f"{what}: B={B} N={N} dim={C} heads={H} device={device} threads={torch.get_num_threads()} "
        f"repeats={args.repeats} (medians, alternating)"
    )
    results = {}
    for name, t in timings.items():
        ratio = t.median / base
        print(f"  {name:16s} {t.median * 1e3:9.2f} ms   x{ratio:.3f} of softmax")
        results[name] = {"median_s": t.median, "ratio_to_softmax": ratio, "samples_s": list(t.samples)}
    worst = max(results[n]["ratio_to_softmax"] for n in ("moh_s2_k4", "moh_s0_k4"))
    if not args.train:
        print(
            f"target: MoH forward <= 1.25x softmax -> worst routed config x{worst:.3f}: "
            f"{'met' if worst <= 1.25 else 'NOT met'}"
        )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": f"MoHAttention vs SoftmaxAttention, {what}",
                "shape": {"B": B, "N": N, "dim": C, "heads": H},
                "configs": {
                    n: {"shared_head": H if s is None else s, "routed_head": r} for n, (s, r) in CONFIGS.items()
                },
                "device": str(device),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "machine": platform.machine(),
                "repeats": args.repeats,
                "warmup": args.warmup,
                "results": results,
                "worst_routed_ratio": worst,
                "target_ratio": 1.25,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
