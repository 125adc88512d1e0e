"""Flow-Attention and Mobile-Attention: time against linear attention and the published code; causal memory.

Targets, CPU float32, B=4, H=8, N=4096, D=Dv=64, forward pass:

1. ``flow_attention`` and ``mobile_attention`` at most 1.5x ``linear_attention``'s non-causal time
   (conservation adds only O(N D) work), and a direct port of the published code 2 to 3x slower than ours.
2. Causal ``flow_attention`` at N=8192 at least 10x faster than the dense masked form, with a peak memory
   under twice the bytes of q, k, v and the output together (measured in a fresh process: ru_maxrss after
   the call minus ru_maxrss once the inputs exist, the high-water mark reset in between).

Implementations alternate in one run (attnbook.lab.profiling.compare); medians and ratios are reported and written
to benchmarks/results/flow.json.

The functions named ``published_*`` are DIRECT PORTS of the published core code (Flowformer's
``Flow_Attention`` / ``Flow_Attention_Causal``, Wu et al. 2022; thuml's ``Mobile_Attention``, Yao et al.
2024), the baseline to beat. They live once, in ``tests/published.py``, which the tests check the package
against; the package never uses them.

Thread wake-ups: on a 2-core machine shared with other busy processes, OpenMP's default spin-waiting lets
the idle worker thread compete with the main thread for a core after every parallel region, and mechanisms
made of many small operations (the causal blocks, the flow bookkeeping) slow down several-fold with 2
threads; set OMP_WAIT_POLICY=PASSIVE (or --threads 1) there. The JSON records the thread count,
OMP_WAIT_POLICY and the load average at the start.

    python benchmarks/bench_flow.py                        # the target sizes
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_flow.py --out benchmarks/results/flow_passive.json
    python benchmarks/bench_flow.py --threads 1            # one thread (steadier on a shared machine)
    python benchmarks/bench_flow.py --n 1024 --causal-n 2048 --repeats 3 --out /tmp/flow_small.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch

import attnbook
from attnbook.lab.profiling import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from published import (  # noqa: E402  (the one copy of the ports, beside the tests)
    published_causal_flow_attention,
    published_flow_attention,
    published_mobile_attention,
)

# ----------------------------------------------------------------------------------------------------------
# The dense baseline (benchmark only). Layout (B, H, N, D) as in attnbook.


def dense_masked_causal_flow(q, k, v, eps=1e-6):
    """The dense masked form (benchmark only): flows by prefix sums, output through the masked N x N matrix.

    out = diag(a / (I t)) (tril(q~ k~^T) diag(c)) v, one (b, h) slice at a time so that only one N x N
    matrix lives at once (all of them together would be B H N^2 floats, 8.6 GB at the target size).
    """
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    N = q.shape[-2]
    t = torch.arange(1, N + 1, dtype=q.dtype, device=q.device)
    incoming = ((qs + eps) * (ks.cumsum(-2) + eps)).sum(-1) / t
    outgoing = ((ks + eps) * (qs.cumsum(-2) + eps)).sum(-1) / t
    conserved_in = ((qs + eps) * ((ks / outgoing[..., None]).cumsum(-2) + eps)).sum(-1) / t
    conserved_out = (((ks + eps) * ((qs / incoming[..., None]).cumsum(-2) + eps)).sum(-1) / t).clamp(-1, 1)
    expo = conserved_out.exp()
    competition = expo / expo.cumsum(-1) * t
    scale = torch.sigmoid(conserved_in) / (incoming * t)
    mask = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    out = torch.empty_like(v)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            scores = (qs[b, h] @ ks[b, h].T).masked_fill_(~mask, 0.0)  # (N, N)
            out[b, h] = (scores * competition[b, h]) @ v[b, h] * scale[b, h, :, None]
    return out


# ----------------------------------------------------------------------------------------------------------
# Peak memory in a fresh process


def _maxrss_bytes() -> int:
    """Peak resident set size of this process in bytes.

    VmHWM from /proc/self/status where it exists: Linux carries ru_maxrss across fork + exec from the parent
    (a child started by a parent holding 3 GB reports at least 3 GB), while VmHWM belongs to this process's
    own address space and is reset by :func:`_reset_peak_rss`. Elsewhere ru_maxrss.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _reset_peak_rss() -> None:
    """Reset the high-water mark (Linux >= 4.0) so that ru_maxrss starts again from the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the baseline is then the peak so far, which can only hide growth
        pass


def memory_child(kind: str, B: int, H: int, N: int, D: int, chunk_size: int) -> None:
    """Run in a fresh interpreter: print the peak RSS growth of one forward call, in bytes, as JSON."""
    fns = {
        "flow_causal": lambda q, k, v: attnbook.flow_attention(q, k, v, is_causal=True, chunk_size=chunk_size),
        "flow": lambda q, k, v: attnbook.flow_attention(q, k, v),
        "mobile": lambda q, k, v: attnbook.mobile_attention(q, k, v),
        "linear": lambda q, k, v: attnbook.linear_attention(q, k, v),
        "dense_masked_causal": dense_masked_causal_flow,
    }
    fn = fns[kind]
    with torch.inference_mode():
        small = [torch.randn(1, 1, 2 * chunk_size, D) for _ in range(3)]
        fn(*small)  # load kernels and thread pools before the baseline
        del small
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
        _reset_peak_rss()  # import and warm-up peaks must not hide the call's growth
        baseline = _maxrss_bytes()
        out = fn(q, k, v)
        peak = _maxrss_bytes()
    io_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, out))
    print(json.dumps({"kind": kind, "extra_peak_bytes": peak - baseline, "qkv_out_bytes": io_bytes}))


def measure_memory(kind: str, B: int, H: int, N: int, D: int, chunk_size: int, threads: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--memory-child",
        kind,
        "--batch",
        str(B),
        "--heads",
        str(H),
        "--causal-n",
        str(N),
        "--dim",
        str(D),
        "--chunk-size",
        str(chunk_size),
        "--threads",
        str(threads),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    r["ratio_to_qkv_out"] = r["extra_peak_bytes"] / r["qkv_out_bytes"]
    return r


# ----------------------------------------------------------------------------------------------------------


def _ms(timings, name) -> float:
    return timings[name].median * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--n", type=int, default=4096, help="sequence length of the non-causal comparison")
    parser.add_argument("--causal-n", type=int, default=8192, help="sequence length of the causal comparison")
    parser.add_argument(
        "--published-causal-n",
        type=int,
        default=1024,
        help="length for the published causal port, which builds (B, H, N, D, Dv); 0 skips",
    )
    parser.add_argument("--dim", type=int, default=64, help="D = Dv")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--causal-repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 keeps the default")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward (non-causal)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["noncausal", "causal", "memory"])
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "flow.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, H, D = args.batch, args.heads, args.dim
    if args.memory_child:
        memory_child(args.memory_child, B, H, args.causal_n, D, args.chunk_size)
        return

    torch.manual_seed(0)
    result = {
        "shape": {"B": B, "H": H, "N": args.n, "causal_N": args.causal_n, "D": D, "Dv": D},
        "dtype": "float32",
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_1_5_15": os.getloadavg(),
    }

    if "memory" not in args.skip:  # first, while this process is still small
        threads = torch.get_num_threads()
        mem = {
            kind: measure_memory(kind, B, H, args.causal_n, D, args.chunk_size, threads)
            for kind in ("flow_causal", "linear", "flow", "mobile")
        }
        result["memory_inference_fresh_process"] = {"N": args.causal_n, **mem}
        print(f"peak memory growth of one forward (inference mode, fresh process), N={args.causal_n}:")
        for kind, r in mem.items():
            print(
                f"  {kind:14s} {r['extra_peak_bytes'] / 2**20:8.1f} MiB = {r['ratio_to_qkv_out']:.2f}x "
                f"the bytes of q, k, v and out ({r['qkv_out_bytes'] / 2**20:.0f} MiB)"
            )

    if "noncausal" not in args.skip:
        q, k, v = (torch.randn(B, H, args.n, D) for _ in range(3))
        fns = {
            "linear_attention": lambda: attnbook.linear_attention(q, k, v),
            "flow_attention": lambda: attnbook.flow_attention(q, k, v),
            "mobile_attention": lambda: attnbook.mobile_attention(q, k, v),
            "published_flow (port)": lambda: published_flow_attention(q, k, v),
            "published_mobile (port)": lambda: published_mobile_attention(q, k, v),
            "two_matmuls q(k^T v)": lambda: q @ (k.transpose(-2, -1) @ v),
        }
        with torch.inference_mode():
            torch.testing.assert_close(fns["flow_attention"](), fns["published_flow (port)"](), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(
                fns["mobile_attention"](), fns["published_mobile (port)"](), rtol=1e-4, atol=1e-5
            )
            t = compare(fns, repeats=args.repeats, warmup=args.warmup)
        lin = _ms(t, "linear_attention")
        nc = {name: {"median_ms": _ms(t, name), "ratio_to_linear": _ms(t, name) / lin} for name in fns}
        nc["published_flow (port)"]["ratio_to_ours"] = _ms(t, "published_flow (port)") / _ms(t, "flow_attention")
        nc["published_mobile (port)"]["ratio_to_ours"] = _ms(t, "published_mobile (port)") / _ms(t, "mobile_attention")
        result["noncausal_forward"] = nc
        print(
            f"non-causal forward, B={B} H={H} N={args.n} D=Dv={D}, {torch.get_num_threads()} thread(s), "
            f"median of {args.repeats}:"
        )
        for name, r in nc.items():
            extra = f"  published/ours {r['ratio_to_ours']:.2f}x" if "ratio_to_ours" in r else ""
            print(f"  {name:26s} {r['median_ms']:9.1f} ms  {r['ratio_to_linear']:5.2f}x linear{extra}")

        if args.backward:
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            g = torch.randn_like(v)

            def train(fn):
                return lambda: torch.autograd.grad(fn(*leaves), leaves, g)

            tb = compare(
                {
                    "linear_attention": train(attnbook.linear_attention),
                    "flow_attention": train(attnbook.flow_attention),
                    "mobile_attention": train(attnbook.mobile_attention),
                    "published_flow (port)": train(published_flow_attention),
                },
                repeats=max(3, args.repeats // 2),
                warmup=args.warmup,
            )
            lin = _ms(tb, "linear_attention")
            result["noncausal_forward_backward"] = {
                name: {"median_ms": _ms(tb, name), "ratio_to_linear": _ms(tb, name) / lin} for name in tb
            }
            print("non-causal forward + backward:")
            for name in tb:
                print(f"  {name:26s} {_ms(tb, name):9.1f} ms  {_ms(tb, name) / lin:5.2f}x linear")

    if "causal" not in args.skip:
        N = args.causal_n
        q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
        fns = {
            "flow_attention causal (chunked)": lambda: attnbook.flow_attention(
                q, k, v, is_causal=True, chunk_size=args.chunk_size
            ),
            "linear_attention causal": lambda: attnbook.linear_attention(
                q, k, v, is_causal=True, chunk_size=args.chunk_size
            ),
            "dense masked form": lambda: dense_masked_causal_flow(q, k, v),
        }
        with torch.inference_mode():
            small = [x[:1, :2, :300] for x in (q, k, v)]
            torch.testing.assert_close(
                dense_masked_causal_flow(*small), attnbook.flow_attention(*small, is_causal=True), rtol=1e-4, atol=1e-5
            )
            t = compare(fns, repeats=args.causal_repeats, warmup=args.warmup)
        ours = _ms(t, "flow_attention causal (chunked)")
        causal = {name: {"median_ms": _ms(t, name), "ratio_to_flow_causal": _ms(t, name) / ours} for name in fns}
        result["causal_forward"] = causal
        print(f"causal forward, B={B} H={H} N={N} D=Dv={D}, chunk {args.chunk_size}, median of {args.causal_repeats}:")
        for name, r in causal.items():
            print(f"  {name:32s} {r['median_ms']:9.1f} ms  {r['ratio_to_flow_causal']:6.2f}x ours")

        Np = args.published_causal_n
        if Np:
            qp, kp, vp = (x[..., :Np, :].contiguous() for x in (q, k, v))
            fns = {
                "flow_attention causal (chunked)": lambda: attnbook.flow_attention(qp, kp, vp, is_causal=True),
                "published_causal (port)": lambda: published_causal_flow_attention(qp, kp, vp),
            }
            with torch.inference_mode():
                torch.testing.assert_close(*(f() for f in fns.values()), rtol=1e-4, atol=1e-5)
                t = compare(fns, repeats=args.causal_repeats, warmup=args.warmup)
            ours = _ms(t, "flow_attention causal (chunked)")
            result["causal_forward_published"] = {
                "N": Np,
                **{name: {"median_ms": _ms(t, name), "ratio_to_ours": _ms(t, name) / ours} for name in fns},
            }
            print(f"causal forward at N={Np} against the published causal code:")
            for name in fns:
                print(f"  {name:32s} {_ms(t, name):9.1f} ms  {_ms(t, name) / ours:6.2f}x ours")

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
