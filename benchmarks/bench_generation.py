"""Generation cost against the position t: per-token time and memory of every causal mechanism (chapter 7).

Measured by :func:`attnbook.lab.generation.measure`: one DecoderLM per mechanism, at the model sizes of
chapter 7 (``attnbook.lab.lm.SMALL``, ``RECORDED`` and ``FULL``), generates token by token; at each position
t all mechanisms are timed in one alternating run (:func:`attnbook.lab.profiling.compare`), one token per
call, fastest and median kept; the decoding state's bytes and one step's peak extra memory are counted.

    python benchmarks/bench_generation.py     # CPU, one thread, float32, all three sizes, t = 16 .. 8192

Writes benchmarks/results/ch07/generation_<device>_<dtype>_<size>.json with the device name, the machine's load
average before and after the run, and a summary: log-log slopes of time and memory between t = 256 and 8192,
and softmax's per-token time over each other mechanism's at the largest t.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from attnbook.lab import generation, lm

SIZES = {"small": lm.SMALL, "recorded": lm.RECORDED, "full": lm.FULL}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def summary(result: dict, lo: int, hi: int) -> dict:
    names = result["config"]["mechanisms"]
    return {
        "range": [lo, hi],
        "time_slope": {n: generation.slope(result, n, "median_s", lo, hi) for n in names},
        "time_slope_min": {n: generation.slope(result, n, "min_s", lo, hi) for n in names},
        "state_slope": {n: generation.slope(result, n, "state_bytes", lo, hi) for n in names},
        "softmax_over": {n: generation.ratio(result, "softmax", n, hi) for n in names},
        "softmax_over_min": {n: generation.ratio(result, "softmax", n, hi, "min_s") for n in names},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--positions", type=int, nargs="+", default=list(generation.POSITIONS))
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results" / "ch07")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for size in args.sizes:
        load_before = list(os.getloadavg())
        result = generation.measure(
            SIZES[size],
            positions=args.positions,
            repeats=args.repeats,
            warmup=args.warmup,
            device=args.device,
            dtype=DTYPES[args.dtype],
        )
        result["config"]["size"] = size
        result["environment"]["load_average_before"] = load_before
        result["environment"]["load_average_after"] = result["environment"].pop("load_average", None)
        result["summary"] = summary(result, 256, max(args.positions))
        path = args.out_dir / f"generation_{torch.device(args.device).type}_{args.dtype}_{size}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        s = result["summary"]
        print(f"{size}: wrote {path}")
        for n in result["config"]["mechanisms"]:
            print(
                f"  {n:8s} time slope {s['time_slope'][n]:5.2f}  state slope {s['state_slope'][n]:5.2f}  "
                f"softmax / {n} at t={max(args.positions)}: {s['softmax_over'][n]:5.2f}"
            )


if __name__ == "__main__":
    main()
