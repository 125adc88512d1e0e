"""The recall study of chapter 8: multi-query associative recall for every mechanism (attnbook.lab.recall).

Every mechanism of the registry and the blocks without attention, at 8, 32 and 64 key-value pairs and model
widths 32 and 64 (2 blocks of 4 heads): for each setting a sweep of three learning rates (1e-3, 3e-3, 1e-2) with
seed 0, then seeds 1 and 2 at the rate with the highest final accuracy (270 runs, about 100 minutes of two
quiet cores). Each run trains ``--steps`` steps of 64
sequences and is evaluated on 256 held-out sequences every 25 steps; the recording keeps every curve, the final
accuracies, the steps to 90 % and the numbers each mechanism's state holds per layer.

The runs are independent and go to ``--workers`` processes of one thread each; the study's own workers are the
machine's load while it runs (the load before it starts is checked, and the load after is stored with it). The
script refuses to start on a busy machine unless ``--force``, and stores the commit.

    python benchmarks/bench_recall.py                   # benchmarks/results/recall/recall_cpu.json
    python benchmarks/bench_recall.py --quick --force   # two mechanisms, one setting: a smoke test
    python benchmarks/bench_recall.py --pairs 8 16 32 64   # 16 pairs too (360 runs)
    python benchmarks/bench_recall.py --replace linear     # record one mechanism again, in the recording

``--replace`` records the named mechanisms at the recording's own settings and puts their runs and results in
place of the old ones; ``environment["replaced"]`` keeps, per mechanism, the commit, date, loads and seconds of
the new runs (the rest of the environment is the first recording's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recording import quiet_or_exit, stamp  # noqa: E402

from attnbook.lab import recall  # noqa: E402
from attnbook.lab.bench import environment  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pairs", type=int, nargs="+", default=[8, 32, 64], help="numbers of key-value pairs")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64], help="model widths")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2], help="the sweep's rates")
    parser.add_argument("--seeds", type=int, default=3, help="seeds at the best rate (seed 0 included)")
    parser.add_argument("--quick", action="store_true", help="softmax and linear, 8 pairs, width 32, 50 steps")
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "recall" / "recall_cpu.json")
    parser.add_argument("--replace", nargs="+", default=None, help="record these mechanisms again, in --out")
    args = parser.parse_args()
    load = quiet_or_exit("bench_recall", args.force)
    options = {"steps": args.steps, "pairs": args.pairs, "widths": args.widths, "lrs": args.lrs, "seeds": args.seeds}
    old = None
    if args.replace:
        old = json.loads(args.out.read_text())
        kept = {k: old["config"][k] for k in ("steps", "pairs", "widths", "lrs", "seeds")}
        missing = sorted(set(args.replace) - set(old["config"]["mechanisms"]))
        if missing:
            sys.exit(f"bench_recall: --replace {missing}: not in {args.out}'s mechanisms {old['config']['mechanisms']}")
        options = {**kept, "mechanism_names": tuple(args.replace)}
    if args.quick:
        options = {"mechanism_names": ("softmax", "linear"), "pairs": (8,), "widths": (32,), "steps": 50, "seeds": 2}
    start = time.time()
    done = []

    def progress(run: dict) -> None:
        done.append(run)
        what = f"{run['mechanism']:8s} P={run['n_pairs']:<3d} width {run['width']:<3d} lr {run['lr']:g}"
        what += f" seed {run['seed']}"
        print(f"[{time.time() - start:6.0f}s] {what}: {run['final']:.3f}, 90 % at {run['steps_to_90']}", flush=True)

    record = recall.study(workers=args.workers, progress=progress, **options)
    env = environment("cpu")
    env["threads"] = 1
    env["workers"] = args.workers
    record["environment"] = stamp(env, load, args.force)
    record["wall_seconds"] = seconds = round(time.time() - start, 1)
    if old is not None:  # the new mechanisms' runs and results in place of the old ones
        new = set(args.replace)
        for key in ("runs", "results"):
            old[key] = [r for r in old[key] if r["mechanism"] not in new] + record[key]
        stamped = ("commit", "date_utc", "load_average_before", "load_average_after")
        note = {k: record["environment"][k] for k in stamped} | {"wall_seconds": record["wall_seconds"]}
        old["environment"].setdefault("replaced", {}).update({m: note for m in args.replace})
        record = old
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for width in record["config"]["widths"]:
        print(recall.table(record, width))
    print(f"written {args.out} ({len(record['runs'])} runs; this one took {seconds:.0f} s)")


if __name__ == "__main__":
    main()
