"""Benchmark linear attention (chapter 2): time against its unavoidable products, causal against the masked
N x N form, peak memory in a fresh process, the recurrent step at early and late positions, and causal
linear attention against fast-transformers' hand-written C++ kernel (``peer``, one thread).

    .venv/bin/python benchmarks/bench_linear.py                      # the recorded sections and sizes
    .venv/bin/python benchmarks/bench_linear.py --sections recurrent --repeats 50
    .venv/bin/python benchmarks/peers.py --build                     # once: build the C++ peer (minutes)
    .venv/bin/python benchmarks/bench_linear.py --sections peer --out benchmarks/results/linear_peer.json

The peer section skips (with a message, and a note in the JSON) when fast-transformers is not built.

Implementations that are compared are timed alternately in one run (attnbook.lab.profiling.compare); medians
and ratios are printed and written to benchmarks/results/linear.json (or --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnbook
from attnbook.lab.profiling import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from published import fast_transformers_linear_attention as seed_port  # noqa: E402  (the one copy of the port)

RESULTS = Path(__file__).resolve().parent / "results"


def make_inputs(B, H, N, D, Dv, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, x, generator=g) for x in (D, D, Dv))
    return tuple(x.requires_grad_(requires_grad) for x in (q, k, v))


def masked_quadratic(q, k, v, eps=1e-6):
    """Causal linear attention through the masked N x N matrix, one (b, h) slice at a time (same flops as all
    at once; one slice of 8192 x 8192 is 256 MiB, all 32 would be 8 GiB)."""
    out = torch.empty_like(v)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            fq, fk = F.elu(q[b, h]) + 1, F.elu(k[b, h]) + 1  # (N, D)
            a = (fq @ fk.T).tril_()  # (N, N)
            out[b, h] = (a @ v[b, h]) / (a.sum(-1, keepdim=True) + eps)
    return out


def ms(t):
    return round(t.median * 1e3, 2)


def bench_non_causal(a):
    B, H, N, D, Dv = a.B, a.H, a.n_non_causal, a.D, a.D
    q, k, v = make_inputs(B, H, N, D, Dv)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    q_s, k_s, v_s = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # the seed's (B, N, H, D) layout

    def two_products():
        kv = fk.transpose(-2, -1) @ v  # (B, H, D, Dv)
        return fq @ kv  # (B, H, N, Dv)

    with torch.no_grad():
        torch.testing.assert_close(
            attnbook.linear_attention(q, k, v), seed_port(q_s, k_s, v_s).transpose(1, 2), rtol=1e-4, atol=1e-5
        )
        t = compare(
            {
                "linear_attention": lambda: attnbook.linear_attention(q, k, v),
                "two_products": two_products,
                "seed_einsum_port": lambda: seed_port(q_s, k_s, v_s),
            },
            repeats=a.repeats,
            warmup=1,
        )
    res = {name: ms(x) for name, x in t.items()}
    res["ratio_linear_attention_to_two_products"] = round(t["linear_attention"].median / t["two_products"].median, 2)
    res["ratio_seed_port_to_two_products"] = round(t["seed_einsum_port"].median / t["two_products"].median, 2)
    res["speedup_vs_seed_port"] = round(t["seed_einsum_port"].median / t["linear_attention"].median, 2)
    return {"shape": dict(B=B, H=H, N=N, D=D, Dv=Dv), "median_ms": res}


def bench_causal(a):
    B, H, N, D, Dv = a.B, a.H, a.n_causal, a.D, a.D
    q, k, v = make_inputs(B, H, N, D, Dv)
    with torch.no_grad():
        fns = {"linear_attention_causal": lambda: attnbook.linear_attention(q, k, v, is_causal=True)}
        if not a.skip_quadratic:
            fns["masked_n_by_n"] = lambda: masked_quadratic(q, k, v)
        # the N x N form takes tens of seconds on two cores: one warm-up-free pair of alternating runs
        t = compare(fns, repeats=a.causal_repeats, warmup=0)
        res = {name: ms(x) for name, x in t.items()}
        if not a.skip_quadratic:
            res["speedup_vs_masked_n_by_n"] = round(t["masked_n_by_n"].median / t["linear_attention_causal"].median, 1)
            out = attnbook.linear_attention(q, k, v, is_causal=True)
            torch.testing.assert_close(
                out[:1, :1], masked_quadratic(q[:1, :1], k[:1, :1], v[:1, :1]), rtol=1e-3, atol=1e-4
            )
    qg, kg, vg = make_inputs(B, H, N, D, Dv, requires_grad=True)
    up = torch.randn(B, H, N, Dv)

    def forward_backward():
        attnbook.linear_attention(qg, kg, vg, is_causal=True).backward(up)

    tb = compare({"causal_forward_backward": forward_backward}, repeats=a.causal_repeats, warmup=1)
    res["causal_forward_backward"] = ms(tb["causal_forward_backward"])
    return {"shape": dict(B=B, H=H, N=N, D=D, Dv=Dv), "median_ms": res}


def _status_kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in KiB, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(a):
    """Run in a fresh process: peak RSS growth of one causal call over the state after creating the inputs."""
    B, H, N, D, Dv = a.B, a.H, a.n_causal, a.D, a.D
    grad = a.memory_child == "forward_backward"
    # warm up torch's lazily built machinery on a tiny problem so it is not counted
    small = make_inputs(1, 1, 128, D, Dv, requires_grad=grad)
    o = attnbook.linear_attention(*small, is_causal=True)
    if grad:
        o.sum().backward()
    q, k, v = make_inputs(B, H, N, D, Dv, requires_grad=grad)
    up = torch.ones(B, H, N, Dv) if grad else None
    # Baseline: the resident size once the inputs exist. Peak: VmHWM, the high-water mark of this process's
    # own memory. (ru_maxrss would do on a fresh interpreter, but Linux carries it over from the parent across
    # fork + exec, so a child of a big process would report the parent's peak.)
    base_kib = _status_kib("VmRSS")
    if grad:
        out = attnbook.linear_attention(q, k, v, is_causal=True)
        out.backward(up)
    else:
        with torch.no_grad():
            out = attnbook.linear_attention(q, k, v, is_causal=True)
    peak_kib = _status_kib("VmHWM")
    io_bytes = sum(x.numel() * x.element_size() for x in (q, k, v, out))
    print(
        json.dumps(
            {
                "baseline_kib": base_kib,
                "peak_kib": peak_kib,
                "extra_bytes": (peak_kib - base_kib) * 1024,
                "q_k_v_out_bytes": io_bytes,
            }
        )
    )


def bench_memory(a):
    res = {}
    for mode in ("inference", "forward_backward"):
        cmd = [
            sys.executable,
            __file__,
            "--memory-child",
            mode,
            "--B",
            str(a.B),
            "--H",
            str(a.H),
            "--n-causal",
            str(a.n_causal),
            "--D",
            str(a.D),
        ]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        r["extra_over_q_k_v_out"] = round(r["extra_bytes"] / r["q_k_v_out_bytes"], 3)
        res[mode] = r
    return {
        "shape": dict(B=a.B, H=a.H, N=a.n_causal, D=a.D, Dv=a.D),
        "rss": res,
        "note": "extra = peak resident size (VmHWM) after one causal call minus the resident size once the "
        "inputs exist, in a fresh process; forward_backward includes the input gradients",
    }


def bench_recurrent(a):
    B, H, D, Dv = a.B, a.H, a.D, a.D
    T = max(a.late_position, a.early_position) + 1
    q, k, v = make_inputs(B, H, T, D, Dv)
    state, states = None, {}
    t0 = time.perf_counter()
    with torch.no_grad():
        for t in range(T):
            _, state = attnbook.linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state)
            if t + 1 in (a.early_position, a.late_position):
                states[t + 1] = state
        walk_s = time.perf_counter() - t0
        qt, kt, vt = q[:, :, -1].clone(), k[:, :, -1].clone(), v[:, :, -1].clone()
        t = compare(
            {
                f"step_at_t={a.early_position}": lambda: attnbook.linear_attention_step(
                    qt, kt, vt, states[a.early_position]
                ),
                f"step_at_t={a.late_position}": lambda: attnbook.linear_attention_step(
                    qt, kt, vt, states[a.late_position]
                ),
            },
            repeats=a.repeats_step,
            warmup=5,
        )
    res = {name: round(x.median * 1e6, 1) for name, x in t.items()}
    res["ratio_late_to_early"] = round(
        t[f"step_at_t={a.late_position}"].median / t[f"step_at_t={a.early_position}"].median, 3
    )
    res["mean_step_over_whole_walk"] = round(walk_s / T * 1e6, 1)
    return {"shape": dict(B=B, H=H, D=D, Dv=Dv), "median_us": res}


def peer_causal_linear(causal_dot_product):
    """fast-transformers' ``CausalLinearAttention`` forward on (B, H, N, D) inputs, its C++ kernel for the
    numerator: elu + 1 features, Z = 1 / (phi(q_i) . cumsum phi(k) + eps), V = causal_dot_product(Q, K, V) Z.
    The kernel takes (B, H, N, D) itself, so the permutes of its (B, N, H, D) wrapper are left out."""

    def attend(q, k, v, eps=1e-6):
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        z = 1 / (torch.einsum("nhli,nhli->nhl", fq, fk.cumsum(2)) + eps)
        return causal_dot_product(fq, fk, v) * z[..., None]

    return attend


def bench_peer(a):
    """Causal linear attention against fast-transformers' C++ kernel, forward and forward + backward, one
    thread (the kernel's CPU code is single-threaded), for (B, H, N) in --peer-shapes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import peers

    kernel = peers.import_causal_product()
    if kernel is None:
        msg = f"fast-transformers is not built in {peers.cache_dir()}: run benchmarks/peers.py --build"
        print("peer section skipped:", msg)
        return {"skipped": msg}
    peer = peer_causal_linear(kernel)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cases = []
    try:
        for shape in a.peer_shapes:
            B, H, N = (int(x) for x in shape.split("x"))
            cases.append(_peer_case(peer, B, H, N, a.D, a.peer_repeats))
            print(json.dumps(cases[-1]), flush=True)
    finally:
        torch.set_num_threads(threads)
    return {
        "threads": 1,
        "peer": "pytorch-fast-transformers==0.4.0 CausalLinearAttention (C++ causal_dot_product), built by peers.py",
        "cases": cases,
    }


def _peer_case(peer, B, H, N, D, repeats):
    q, k, v = make_inputs(B, H, N, D, D, requires_grad=True)
    up = torch.randn(B, H, N, D)
    fns = {"ours": lambda q, k, v: attnbook.linear_attention(q, k, v, is_causal=True), "peer": peer}
    with torch.no_grad():
        torch.testing.assert_close(fns["ours"](q, k, v), peer(q, k, v), rtol=1e-3, atol=1e-4)
        tf = compare({name: functools.partial(f, q, k, v) for name, f in fns.items()}, repeats=repeats)
    tb = compare(
        {
            name: functools.partial(lambda f: torch.autograd.grad(f(q, k, v), (q, k, v), up), f)
            for name, f in fns.items()
        },
        repeats=repeats,
    )
    case = {"B": B, "H": H, "N": N, "D": D}
    for mode, t in (("forward", tf), ("forward_backward", tb)):
        case[mode] = {"ours_ms": ms(t["ours"]), "peer_ms": ms(t["peer"])}
        case[mode]["speedup_vs_peer"] = round(t["peer"].median / t["ours"].median, 2)
    return case


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--D", type=int, default=64, help="D = Dv")
    p.add_argument("--n-non-causal", type=int, default=4096)
    p.add_argument("--n-causal", type=int, default=8192)
    p.add_argument("--early-position", type=int, default=100)
    p.add_argument("--late-position", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--causal-repeats", type=int, default=2)
    p.add_argument("--repeats-step", type=int, default=200)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--skip-quadratic", action="store_true", help="do not time the masked N x N form")
    p.add_argument("--peer-shapes", nargs="+", default=["2x8x1024", "2x8x4096", "1x4x16384", "1x8x16384"])
    p.add_argument("--peer-repeats", type=int, default=15)
    p.add_argument(
        "--sections",
        nargs="+",
        default=["non_causal", "causal", "memory", "recurrent"],
        choices=["non_causal", "causal", "memory", "recurrent", "peer"],
    )
    p.add_argument("--out", type=Path, default=RESULTS / "linear.json")
    p.add_argument("--memory-child", choices=["inference", "forward_backward"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.memory_child:
        memory_child(a)
        return
    results = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "float": "float32",
        "device": "cpu",
        "load_average_at_start": os.getloadavg(),
    }
    for section in a.sections:
        print(f"== {section}", flush=True)
        results[section] = globals()[f"bench_{section}"](a)
        print(json.dumps(results[section], indent=1), flush=True)
    results["load_average_at_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
