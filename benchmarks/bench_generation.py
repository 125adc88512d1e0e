"""Generation cost against the position t: per-token time and memory of every causal mechanism (chapter 7).

Measured by :func:`attnbook.lab.generation.measure`: one DecoderLM per mechanism (chapter 7's four by default,
``--mechanisms``), at chapter 7's model sizes (``attnbook.lab.lm.SMALL`` and ``RECORDED``) and a wider one
(``wide``: width 192, 4 blocks), is brought to each position t by a parallel
prefill and then timed token by token, on the teaching step (``DecoderLM.step``, what ``generate`` uses) and on
that step compiled (``generate(decoder="compiled")``), all in one alternating run
(:func:`attnbook.lab.profiling.compare`), in bursts of 64 consecutive tokens (``--burst``), fastest and
median kept; the decoding state's bytes and one step's peak extra memory are counted. The script refuses to
record on a busy machine (load average above half the cores) unless ``--force``.

    python benchmarks/bench_generation.py     # CPU, one thread, float32, all three sizes, t = 16 .. 8192
    python benchmarks/bench_generation.py --sizes recorded --out-dir benchmarks/results/ch08 \
        --mechanisms softmax linear decay gated delta   # chapter 8's mechanisms beside two of chapter 7's

Writes benchmarks/results/ch07/generation_<device>_<dtype>_<size>.json with the device name, the machine's load
average before and after the run, and a summary: log-log slopes of time and memory between t = 256 and 8192,
and softmax's per-token time over each other mechanism's at the largest t.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from recording import add_burst_argument, quiet_or_exit, stamp

from attnbook.lab import generation, lm

SIZES = {"small": lm.SMALL, "recorded": lm.RECORDED, "wide": lm.Setup(dim=192, n_heads=6, n_layers=4)}
CHAPTER_7 = ["softmax", "linear", "flow", "moh"]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def summary(result: dict, lo: int, hi: int, decoder: str) -> dict:
    names = result["config"]["mechanisms"]
    return {
        "range": [lo, hi],
        "time_slope": {n: generation.slope(result, n, "median_s", lo, hi, decoder) for n in names},
        "time_slope_min": {n: generation.slope(result, n, "min_s", lo, hi, decoder) for n in names},
        "state_slope": {n: generation.slope(result, n, "state_bytes", lo, hi, decoder) for n in names},
        "softmax_over": {n: generation.ratio(result, "softmax", n, hi, decoder=decoder) for n in names},
        "softmax_over_min": {n: generation.ratio(result, "softmax", n, hi, "min_s", decoder) for n in names},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--mechanisms", nargs="+", default=CHAPTER_7)
    parser.add_argument("--positions", type=int, nargs="+", default=list(generation.POSITIONS))
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    add_burst_argument(parser)
    parser.add_argument("--decoders", nargs="+", default=["eager", "compiled"], choices=list(generation.DECODERS))
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results" / "ch07")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for size in args.sizes:
        load_before = quiet_or_exit("bench_generation", args.force)
        torch._dynamo.reset()  # each size compiles its own steps: torch keeps at most 8 graphs of DecoderLM.step
        result = generation.measure(
            SIZES[size],
            mechanism_names=args.mechanisms,
            positions=args.positions,
            repeats=args.repeats,
            warmup=args.warmup,
            device=args.device,
            dtype=DTYPES[args.dtype],
            decoders=args.decoders,
            burst=args.burst,
        )
        result["config"]["size"] = size
        result["environment"].pop("load_average", None)
        stamp(result["environment"], load_before, args.force)
        result["summary"] = {d: summary(result, 256, max(args.positions), d) for d in args.decoders}
        path = args.out_dir / f"generation_{torch.device(args.device).type}_{args.dtype}_{size}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{size}: wrote {path}")
        for decoder, s in result["summary"].items():
            for n in result["config"]["mechanisms"]:
                print(
                    f"  {decoder:6s} {n:8s} time slope {s['time_slope'][n]:5.2f}  state slope "
                    f"{s['state_slope'][n]:5.2f}  softmax / {n} at t={max(args.positions)}: {s['softmax_over'][n]:5.2f}"
                )


if __name__ == "__main__":
    main()
