"""Causal linear attention against flash-linear-attention's chunked Triton kernel and SDPA's causal kernel.

At the GPU issue's shape, B = 4, H = 16, N = 16,384, D = 64 in bfloat16, one alternating run (medians):

* ``attnbook``: :func:`attnbook.linear_attention` with ``is_causal=True`` (elu + 1 features, the chunked
  prefix product), eager and compiled;
* ``fla``: ``fla.ops.linear_attn.chunk_linear_attn`` (Yang et al., flash-linear-attention) on the same features,
  ``scale=1``, ``normalize=True``, in its own (B, N, H, D) layout, made contiguous before the clock starts;
* ``sdpa_causal``: :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``.

Forward alone and forward + backward (the gradient of q, k and v under a random upstream). The two linear
outputs are compared (their only difference is where eps sits in the denominator). Needs CUDA and the
``flash-linear-attention`` package; without either it says so and exits 0 having written nothing.

    python benchmarks/bench_fla.py --out benchmarks/results/fla_<gpu>.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from attnbook import linear_attention
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=4, default=[4, 16, 16_384, 64], metavar=("B", "H", "N", "D"))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fla: no CUDA device; nothing measured")
        return 0
    import time

    t0 = time.perf_counter()

    def progress(what: str) -> None:  # a run stopped by its limit still says how far it got
        print(f"[bench_fla +{time.perf_counter() - t0:.0f} s] {what}", flush=True)

    progress("importing fla")
    try:
        import fla
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as e:  # ImportError, or an error from Triton on import
        print(f"bench_fla: flash-linear-attention does not import ({e}); nothing measured")
        return 0

    B, H, N, D = args.shape
    device, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g).to(device, dtype) for _ in range(3))
    upstream = torch.randn(B, H, N, D, generator=g).to(device, dtype)

    def ours(q, k, v):
        return linear_attention(q, k, v, is_causal=True)

    ours_compiled = torch.compile(ours, dynamic=False)

    def theirs(q, k, v):  # (B, N, H, D) in and out
        o, _ = chunk_linear_attn(F.elu(q) + 1, F.elu(k) + 1, v, scale=1.0, normalize=True)
        return o

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    native = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    native_up = upstream.transpose(1, 2).contiguous()
    fns = {
        "attnbook_eager": (ours, (q, k, v), upstream),
        "attnbook_compiled": (ours_compiled, (q, k, v), upstream),
        "fla_chunk": (theirs, native, native_up),
        "sdpa_causal": (sdpa, (q, k, v), upstream),
    }

    def forward(fn, inputs):
        def call():
            with torch.no_grad():
                return fn(*inputs)

        return call

    def training(fn, inputs, up):
        leaves = [x.detach().requires_grad_() for x in inputs]

        def call():
            return torch.autograd.grad(fn(*leaves), leaves, up)

        return call

    progress("first calls (fla's Triton kernels compile and autotune here)")
    with torch.no_grad():
        a = ours(q, k, v).float()
        b = theirs(*native).transpose(1, 2).float()
    agreement = {"max_abs_difference": float((a - b).abs().max()), "rms_attnbook": float(a.pow(2).mean().sqrt())}
    print(
        f"attnbook vs fla outputs: max |diff| {agreement['max_abs_difference']:.3g}"
        f" (rms {agreement['rms_attnbook']:.3g})"
    )

    report: dict = {
        "environment": environment(device),
        "fla": getattr(fla, "__version__", "?"),
        "shape": {"B": B, "H": H, "N": N, "D": D},
        "dtype": "bfloat16",
        "agreement": agreement,
    }
    progress("timing")
    for mode, make in (("forward", lambda f, x, u: forward(f, x)), ("forward_backward", training)):
        timing = compare(
            {name: make(*spec) for name, spec in fns.items()}, repeats=args.repeats, warmup=2, device=device
        )
        base = timing["sdpa_causal"].median
        report[mode] = {
            name: {"median_s": t.median, "samples_s": list(t.samples), "speedup_vs_sdpa_causal": base / t.median}
            for name, t in timing.items()
        }
        print(mode, {name: f"{t.median * 1e3:.3f} ms" for name, t in timing.items()})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
