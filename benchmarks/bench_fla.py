"""Causal linear attention against flash-linear-attention's chunked Triton kernel and SDPA's causal kernel.

At the GPU issue's shape, B = 4, H = 16, N = 16,384, D = 64 in bfloat16, alternating runs (medians):

* ``attnbook``: :func:`attnbook.linear_attention` with ``is_causal=True`` (elu + 1 features, the chunked
  prefix product), eager, and compiled last (``--no-compiled`` leaves it out);
* ``fla_chunk``: ``fla.ops.linear_attn.chunk_linear_attn`` (Yang et al., flash-linear-attention) on the same
  features, ``scale=1``, ``normalize=True``, in its own (B, N, H, D) layout, made contiguous before the clock
  starts; recorded as not installed (and left out) when ``fla`` does not import;
* ``sdpa_causal``: :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``.

Forward alone and forward + backward (the gradient of q, k and v under a random upstream), each entry with its
median, samples and ``speedup_vs_sdpa_causal``; ``ratios`` holds attnbook / SDPA, fla / SDPA and attnbook / fla
(times: above 1 is slower). The two linear outputs are compared (their only difference is where eps sits in
the denominator). The report is written at every stage (a run stopped by its limit keeps what it had) and
also without CUDA, saying so (exit status 0).

    python benchmarks/bench_fla.py --out benchmarks/results/fla_<gpu>.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnbook import linear_attention
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare


def _write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(path)


def _ratios(times: dict[str, float]) -> dict[str, float]:
    """Time ratios (above 1: the first is slower) between the entries present."""
    pairs = [("attnbook_eager", "sdpa_causal"), ("attnbook_compiled", "sdpa_causal"), ("fla_chunk", "sdpa_causal"),
             ("attnbook_eager", "fla_chunk"), ("attnbook_compiled", "fla_chunk")]  # fmt: skip
    return {f"{a}/{b}": times[a] / times[b] for a, b in pairs if a in times and b in times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 16, 16_384, 64], metavar=("B", "H", "N", "D"))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--no-compiled", action="store_true", help="leave out the compiled attnbook form")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    B, H, N, D = args.shape
    report: dict = {
        "kind": "benchmarks/bench_fla.py",
        "shape": {"B": B, "H": H, "N": N, "D": D},
        "dtype": "bfloat16",
        "cuda": torch.cuda.is_available(),
        "stages_done": [],
    }
    if not torch.cuda.is_available():
        report["skipped"] = "no CUDA device: nothing measured"
        _write(args.out, report)
        print("bench_fla: no CUDA device; nothing measured (report written)")
        return 0
    device, dtype = torch.device("cuda"), torch.bfloat16
    report["environment"] = environment(device)
    t0 = time.perf_counter()

    def progress(what: str) -> None:  # a run stopped by its limit still says how far it got
        report["progress"] = what
        report["elapsed_s"] = time.perf_counter() - t0
        _write(args.out, report)
        print(f"[bench_fla +{time.perf_counter() - t0:.0f} s] {what}", flush=True)

    progress("importing fla")
    try:
        import fla
        from fla.ops.linear_attn import chunk_linear_attn

        report["fla"] = getattr(fla, "__version__", "?")
    except Exception as e:  # ImportError, or an error from Triton on import
        chunk_linear_attn = None
        report["fla"] = "not installed" if isinstance(e, ModuleNotFoundError) else f"does not import: {e}"[:500]
        print(f"bench_fla: flash-linear-attention: {report['fla']}; attnbook and SDPA only")

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(device, dtype) for _ in range(3))
    upstream = torch.randn(B, H, N, D, generator=g).to(device, dtype)

    def ours(q, k, v):
        return linear_attention(q, k, v, is_causal=True)

    def theirs(q, k, v):  # (B, N, H, D) in and out
        o, _ = chunk_linear_attn(F.elu(q) + 1, F.elu(k) + 1, v, scale=1.0, normalize=True)
        return o

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    native = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    native_up = upstream.transpose(1, 2).contiguous()
    fns = {"attnbook_eager": (ours, (q, k, v), upstream), "sdpa_causal": (sdpa, (q, k, v), upstream)}
    if chunk_linear_attn is not None:
        fns["fla_chunk"] = (theirs, native, native_up)
        progress("first calls (fla's Triton kernels compile and autotune here)")
        with torch.no_grad():
            a = ours(q, k, v).float()
            b = theirs(*native).transpose(1, 2).float()
        report["agreement"] = {
            "max_abs_difference": float((a - b).abs().max()),
            "rms_attnbook": float(a.pow(2).mean().sqrt()),
        }
        del a, b

    def forward(fn, inputs, up):  # noqa: ARG001
        def call():
            with torch.no_grad():
                return fn(*inputs)

        return call

    def training(fn, inputs, up):
        leaves = [x.detach().requires_grad_() for x in inputs]

        def call():
            return torch.autograd.grad(fn(*leaves), leaves, up)

        return call

    def stage(label: str, entries: dict, make) -> None:
        progress(f"timing {label}: {', '.join(entries)}")
        timing = compare({n: make(*spec) for n, spec in entries.items()}, repeats=args.repeats, warmup=2, device=device)
        part = report.setdefault(label, {})
        for name, t in timing.items():
            part[name] = {"median_s": t.median, "samples_s": list(t.samples)}
        base = part.get("sdpa_causal", {}).get("median_s")
        for entry in part.values():
            if base:
                entry["speedup_vs_sdpa_causal"] = base / entry["median_s"]
        report.setdefault("ratios", {})[label] = _ratios({n: e["median_s"] for n, e in part.items()})
        report["stages_done"].append(f"{label}: {', '.join(entries)}")
        progress(f"{label} done: " + ", ".join(f"{n} {e['median_s'] * 1e3:.3f} ms" for n, e in part.items()))

    stage("forward", fns, forward)
    stage("forward_backward", fns, training)
    if not args.no_compiled:  # compiling takes the longest: last, so that a limit cuts it first
        compiled = {"attnbook_compiled": (torch.compile(ours, dynamic=False), (q, k, v), upstream)}
        stage("forward", compiled, forward)
        stage("forward_backward", compiled, training)
    progress("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
