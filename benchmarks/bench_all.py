"""Every mechanism against N: forward and forward+backward time, peak memory; one JSON per run.

Measured by :func:`attnbook.lab.bench.run_benchmark` (the same code as chapter 6 and
``python -m attnbook.lab.check_gpu``):
for each N all mechanisms are timed in one run, alternating, and medians are reported; peak memory is the extra
memory above the inputs (CUDA allocator peak, or tensors allocated by torch operators on the CPU).

    python benchmarks/bench_all.py                                     # CPU, moderate sizes
    python benchmarks/bench_all.py --device cuda --dtype bfloat16 --batch 4 --heads 16 --head-dim 64 \\
        --lengths 1024 4096 16384 65536                               # the full-size GPU run

Writes benchmarks/results/<device>_<dtype>.json (or --out) with the device name, dtype, torch / attnbook /
python versions and the date, the load average before and after and the commit. It refuses to record while the
1-minute load average is above half the cores, unless ``--force`` (then the recording says so).

``--beside-busy`` measures the shared machine on purpose: on a quiet machine (the same rule) the script starts two
processes of its own, each running torch's matrix products on two threads, records beside them and stops them;
the recording names the condition, and its load average after includes the two jobs.

    python benchmarks/bench_all.py --threads 2 --beside-busy --lengths 256 512 1024 2048 4096 8192 \
        --out benchmarks/results/cpu_float32_busy.json                 # chapter 6's busy recording
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recording import beside_busy, quiet_or_exit, stamp  # noqa: E402

from attnbook import mechanisms  # noqa: E402
from attnbook.lab.bench import CASES, environment, run_benchmark, series  # noqa: E402

#: Chapter 6's contestants (the mechanisms of chapters 1 to 5, their causal forms and the literal softmax); chapter
#: 8's causal-only mechanisms with ``--mechanisms decay gated delta ...``.
CHAPTERS_1_TO_5 = [n for n in CASES if n.removesuffix("_causal") in [*mechanisms.names(bidirectional=True),
                                                                        "softmax_literal"]]  # fmt: skip

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--mechanisms", nargs="+", default=CHAPTERS_1_TO_5, choices=list(CASES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--max-matrix-gib", type=float, default=2.0, help="skip mechanisms whose B*H*N*N scores would exceed this"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile every mechanism")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 keeps the default")
    parser.add_argument("--out", default=None)
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument(
        "--beside-busy", action="store_true", help="record beside two busy processes that the script starts itself"
    )
    args = parser.parse_args()
    load = quiet_or_exit("bench_all", args.force)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    with beside_busy() if args.beside_busy else contextlib.nullcontext(None) as condition:
        result = run_benchmark(
            args.lengths,
            mechanisms=args.mechanisms,
            batch=args.batch,
            heads=args.heads,
            head_dim=args.head_dim,
            device=device,
            dtype=DTYPES[args.dtype],
            repeats=args.repeats,
            warmup=args.warmup,
            backward=not args.no_backward,
            memory=not args.no_memory,
            max_matrix_bytes=args.max_matrix_gib * 2**30,
            compile=args.compile,
        )
    env = stamp(environment(device), load, args.force)
    env["condition"] = condition or ("busy (--force)" if env["forced"] else "quiet")
    report = {"benchmark": "attnbook.lab.bench.run_benchmark", "environment": env, **result}

    c = result["config"]
    print(
        f"{report['environment']['device_name']} ({device}), {c['dtype']}, B={c['batch']} H={c['heads']} "
        f"D={c['head_dim']}, medians of {c['repeats']} alternating runs, threads={torch.get_num_threads()}"
    )
    for metric, unit, scale in (
        ("forward_s", "ms", 1e3),
        ("forward_backward_s", "ms", 1e3),
        ("forward_peak_bytes", "MiB", 2**-20),
        ("forward_backward_peak_bytes", "MiB", 2**-20),
    ):
        ns, table = series(result, metric)
        if all(v != v for vs in table.values() for v in vs):
            continue
        print(f"\n{metric} [{unit}]" + ("" if metric.endswith("bytes") else "   (x = ratio to softmax SDPA)"))
        print(f"  {'N':>16s}" + "".join(f"{n:>16d}" for n in ns))
        base = table.get("softmax")
        for name, vs in table.items():
            cells = []
            for i, v in enumerate(vs):
                if v != v:
                    cells.append(f"{'-':>16s}")
                elif base is not None and not metric.endswith("bytes") and base[i] == base[i]:
                    cells.append(f"{v * scale:9.2f} x{v / base[i]:5.2f}")
                else:
                    cells.append(f"{v * scale:16.2f}")
            print(f"  {name:>16s}" + "".join(cells))

    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"{device.type}_{args.dtype}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
