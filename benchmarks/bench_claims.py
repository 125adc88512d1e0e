"""Record the papers' claims at a size one CPU thread can afford (issue 27): attnbook.lab.claims, four studies.

    python benchmarks/bench_claims.py                     # every study at the recorded size, one thread
    python benchmarks/bench_claims.py --study listops     # one study (listops, heads, moh, lookup)
    python benchmarks/bench_claims.py --size small        # the chapters' live size: a smoke test, seconds

Studies (the same functions the chapters call live at ``ATTNBOOK_FAST=1`` size):

* ``listops``: :func:`attnbook.lab.claims.compare` on ListOps (depth <= 3, <= 4 arguments, 16-48 tokens):
  softmax, linear, flow, flow without competition, flow without allocation, mobile, MoH and the same model
  without attention, 3 seeds;
* ``heads``: :func:`~attnbook.lab.claims.head_width_study`, Mobile-Attention against linear attention (elu + 1
  and sigmoid features) and Flow-Attention at head widths D = 2, 4, 8 of one total width C = 32, on chapter 6's
  associative recall, 3 seeds;
* ``moh``: :func:`~attnbook.lab.claims.moh_study`, MoH with 2, 4, 6 and 8 of 8 heads active per token, plain
  softmax with all 8 heads and with only 2, 4 and 6, on recall of 3 keys at once, and the same at 2 and 5 keys
  (``lookups``); and the quarter of the heads trained four times longer (``quarter_longer``), 3 seeds;
* ``lookup``: :func:`~attnbook.lab.claims.lookup_share_demo` on chapter 2's toy (24 keys, D = 16) and at
  chapter 6's shape (6 tokens, D = 8).

Each writes ``benchmarks/results/claims/<study>_<device>_<size>.json``: the configuration, the seeds, every run
(held-out accuracy and loss against steps, training seconds), the mean, lowest, highest and standard deviation
over seeds, the environment and the load average before and after. The machine is shared: the script refuses
to record while the 1-minute load average is above half the cores, unless ``--force`` (the recording then says
so). Each recording stores its wall time (``wall_seconds``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from recording import quiet_or_exit, stamp

from attnbook.lab import claims
from attnbook.lab.bench import environment

STUDIES = ("listops", "heads", "moh", "lookup")
SIZES = {
    "small": {
        "listops": (claims.LISTOPS_TASK_SMALL, claims.LISTOPS_SMALL),
        "heads": (claims.HEADS_TASK, claims.HEADS_SMALL),
        "moh": (claims.MOH_TASK, claims.MOH_SMALL),
        "lookup": {"steps": 100},
    },
    "recorded": {
        "listops": (claims.LISTOPS_TASK_RECORDED, claims.LISTOPS_RECORDED),
        "heads": (claims.HEADS_TASK, claims.HEADS_RECORDED),
        "moh": (claims.MOH_TASK, claims.MOH_RECORDED),
        "lookup": {"steps": 1000},
    },
}
LOOKUP_SHAPES = ((24, 16), (6, 8))  # chapters 2-3's toy; chapter 6's race (5 facts + the query, D = 8)


def run_study(study: str, size: str, seeds: list[int], device: str) -> dict:
    spec = SIZES[size][study]
    if study == "listops":
        result = claims.compare(*spec, seeds=seeds, device=device)
        return {"kind": "attnbook.lab.claims.compare", **result.to_dict()}
    if study == "heads":
        result = claims.head_width_study(*spec, widths=(2, 4, 8), variants=claims.HEADS_VARIANTS, seeds=seeds,
                                         device=device)  # fmt: skip
        return {"kind": "attnbook.lab.claims.head_width_study", **result.to_dict()}
    if study == "moh":
        task, setup = spec
        result = claims.moh_study(task, setup, fewer_heads=(2, 4, 6), seeds=seeds, device=device).to_dict()
        # the same at 2 and 5 look-ups, so that "half the heads" is not just "one head per look-up"
        result["lookups"] = {
            str(q): claims.moh_study(replace(task, n_queried=q), setup, fewer_heads=(2, 4, 6), seeds=seeds,
                                     device=device).to_dict()
            for q in (2, 5)
        }  # fmt: skip
        # the quarter of the heads (1 shared + 1 routed) trained four times longer, to where it stops rising
        longer = replace(setup, steps=4 * setup.steps, eval_every=4 * setup.eval_every)
        result["quarter_longer"] = claims.moh_study(task, longer, splits=[(1, 1)], include_softmax=False,
                                                    seeds=seeds, device=device).to_dict()  # fmt: skip
        return {"kind": "attnbook.lab.claims.moh_study", **result}
    demos = [claims.lookup_share_demo(n, d, steps=spec["steps"]).to_dict() for n, d in LOOKUP_SHAPES]
    return {"kind": "attnbook.lab.claims.lookup_share_demo", "demos": demos}


def report(study: str, record: dict) -> None:
    """A few lines of the result on stdout."""
    if study == "listops":
        print(f"  chance 1/10, held-out majority class {record['majority']:.3f}; skipped: {record['skipped']}")
        for name, s in record["summary"].items():
            print(f"  {name:20s} {s['mean']:.3f} (lowest {s['low']:.3f}, highest {s['high']:.3f}, std {s['std']:.3f})")
    elif study == "heads":
        for row in record["rows"]:
            a = row["accuracy"]
            print(
                f"  {row['variant']:7s} D={row['head_dim']} H={row['n_heads']:2d}: accuracy {a['mean']:.3f} "
                f"({a['low']:.3f}-{a['high']:.3f}), spread {row['spread_initial'][0]:.3f} -> "
                f"{row['spread_trained'][0]:.3f}, rank {row['rank_initial'][0]:.2f} -> {row['rank_trained'][0]:.2f}"
            )
    elif study == "moh":
        for q, sub in [("3", record), *record.get("lookups", {}).items()]:
            print(f"  {q} look-ups:")
            rows = [*sub["curve"], *([sub["softmax"]] if sub["softmax"] else []), *sub.get("fewer_heads", [])]
            for row in rows:
                a = row["accuracy"]
                print(
                    f"    {row['variant']:10s} {row['fraction']:.2f} of the heads: accuracy {a['mean']:.3f} "
                    f"({a['low']:.3f}-{a['high']:.3f}), steps to 0.9 {row['steps_to_0.9']}"
                )
        if "quarter_longer" in record:
            row = record["quarter_longer"]["curve"][0]
            print(f"  a quarter, 4x longer: accuracy {row['accuracy']['mean']:.3f}")
    else:
        for d in record["demos"]:
            rescaled = {m: f"{min(v):.2f}-{max(v):.2f}" for m, v in d["rescaled"].items()}
            trained = {m: round(v, 2) for m, v in d["trained"].items()}
            print(f"  {d['n_tokens']} keys, D={d['dim']}: rescaled {rescaled}, trained {trained}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=[*STUDIES, "all"], default="all")
    parser.add_argument("--size", choices=list(SIZES), default="recorded")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results" / "claims")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    studies = STUDIES if args.study == "all" else (args.study,)
    for study in studies:
        load_before = quiet_or_exit("bench_claims", args.force)
        start = time.perf_counter()
        record = run_study(study, args.size, args.seeds, args.device)
        seconds = time.perf_counter() - start
        env = environment(args.device)
        stamp(env, load_before, args.force)
        record = {
            "study": study,
            "size": args.size,
            "seeds": args.seeds,
            "wall_seconds": seconds,
            "environment": env,
            "command": " ".join(["python", *sys.argv]),
            **record,
        }
        path = args.out_dir / f"{study}_{torch.device(args.device).type}_{args.size}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path} ({seconds / 60:.1f} min, load {load_before[0]:.2f} -> {env['load_average_after'][0]:.2f})")
        report(study, record)


if __name__ == "__main__":
    main()
