"""Before / after of the generation step: :class:`attnbook.decoding.StaticDecoder` at a git ref against the
working tree, alternating in one process (issue 30).

Chapter 7's 128-wide, 2-layer :class:`~attnbook.lm.DecoderLM` (``attnbook.lab.lm.RECORDED``), batch 1, one thread.
For every causal mechanism and position t the same model (the same weights) is brought to t by a prefill in
both decoders, then bursts of consecutive steps are timed alternately (attnbook.lab.profiling.compare); medians
per token and their ratio. ``--compiled`` adds both decoders' compiled steps (at the first position only: a
compiled KV cache is read whole, so its time does not depend on t).

    python benchmarks/before_after_decoding.py --ref c030f90~1     # refuses a busy machine (--force)

Writes benchmarks/results/before_after_decoding.json and prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
from pathlib import Path

import torch
from before_after import import_before
from recording import quiet_or_exit, stamp

import attnbook.decoding
from attnbook.lab import lm
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", default="main", help="the git ref whose decoder is 'before'")
    p.add_argument("--positions", type=int, nargs="+", default=[16, 1024, 8192])
    p.add_argument("--mechanisms", nargs="+", default=["linear", "flow", "softmax", "moh"])
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--compiled", action="store_true", help="also the compiled steps (slow to compile)")
    p.add_argument("--force", action="store_true", help="record even when the machine is busy")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "before_after_decoding.json")
    a = p.parse_args()
    load_before = quiet_or_exit("before_after_decoding", a.force)
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory()
    import_before(a.ref, Path(tmp.name))
    old = importlib.import_module("attnbook_before.decoding")
    old_lm = importlib.import_module("attnbook_before.lm")
    setup = lm.RECORDED
    capacity = max(a.positions) + a.burst * (a.repeats + 4) + 1
    text = torch.randint(0, 256, (1, capacity), generator=torch.Generator().manual_seed(0))
    cases = []
    with torch.inference_mode():
        for name in a.mechanisms:
            torch.manual_seed(0)
            model = setup.model(name).eval()
            # the same weights in the ref's own DecoderLM (its decoder takes only its own class)
            before = old_lm.DecoderLM(name, dim=setup.dim, n_heads=setup.n_heads, n_layers=setup.n_layers).eval()
            before.load_state_dict(model.state_dict())
            decoders = {
                "before": old.StaticDecoder(before, capacity=capacity),
                "after": attnbook.decoding.StaticDecoder(model, capacity=capacity),
            }
            if a.compiled:
                decoders["before compiled"] = old.StaticDecoder(before, capacity=capacity, compile=True)
                decoders["after compiled"] = attnbook.decoding.StaticDecoder(model, capacity=capacity, compile=True)
            for i, t in enumerate(a.positions):
                runs = {k: d for k, d in decoders.items() if i == 0 or "compiled" not in k}
                for d in runs.values():
                    d.prefill(text[:, :t])

                # a burst: consecutive steps of one generation, each token the text's next byte
                calls = {k: (lambda d=d: [d.step(text[:, d.t]) for _ in range(a.burst)]) for k, d in runs.items()}
                timing = compare(calls, repeats=a.repeats, warmup=2)
                per_token = {k: timing[k].median / a.burst for k in runs}
                case = {
                    "mechanism": name,
                    "t": t,
                    "median_us": {k: round(v * 1e6, 1) for k, v in per_token.items()},
                    "before/after": round(per_token["before"] / per_token["after"], 3),
                }
                if "after compiled" in per_token:
                    case["compiled before/after"] = round(per_token["before compiled"] / per_token["after compiled"], 3)
                cases.append(case)
                print(json.dumps(case), flush=True)
    result = {
        "kind": "before_after_decoding",
        "config": {
            "ref": a.ref,
            "dim": setup.dim,
            "n_layers": setup.n_layers,
            "n_heads": setup.n_heads,
            "positions": a.positions,
            "repeats": a.repeats,
            "burst": a.burst,
            "threads": 1,
        },  # fmt: skip
        "environment": stamp(environment(torch.device("cpu")), load_before, a.force),
        "cases": cases,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {a.out}")
    print("| mechanism | t | before (us) | after (us) | before/after |")
    print("|---|---|---|---|---|")
    for c in cases:
        m = c["median_us"]
        print(f"| {c['mechanism']} | {c['t']} | {m['before']} | {m['after']} | {c['before/after']} |")


if __name__ == "__main__":
    main()
