"""Token-by-token generation at the hardware's pace (issue 30): per-token steps against their floors, prefill.

Chapter 7's 128-wide, 2-layer :class:`~attnbook.lm.DecoderLM` (``attnbook.lab.lm.RECORDED``), batch 1, one
thread by default:

* **per-token step** of every causal mechanism at t = 16 .. 8192 (each timed call 64 consecutive tokens of one
  generation, as ``generate`` runs them, the mean recorded), on the static decoder
  (:class:`attnbook.decoding.StaticDecoder`, what ``generate`` uses: on the CPU its native step, one C call a
  token, for every mechanism but MoH), on that decoder's torch operations (``native=False``) and on the eager
  teaching path (:meth:`~attnbook.lm.DecoderLM.step`), all in one alternating run
  (:func:`attnbook.lab.generation.measure`);
* **floors**: the time a step cannot beat on this machine, max(arithmetic / peak, bytes / bandwidth). The
  arithmetic is the step's multiply-adds (projections, MLP, head; the state or the KV cache); the peak is a
  large single-thread matrix product measured here. The bytes are what a step must read once: every weight
  (the projections, the MLP, the tied head, the norms), the recurrent state or the t cached keys and values
  (and write: the state, one cache row); the bandwidth is that of reading a buffer of the same size, measured
  here (a buffer that fits a cache is read at the cache's speed);
* **the ratio** of softmax's KV-cache step over the recurrent steps at the largest t, and the crossover t*, the
  first position from which linear attention's step is the faster one;
* **prefill**: a prompt of 4096 tokens in one parallel call against 4096 steps (static and eager), and that the
  logits agree.

    python benchmarks/bench_decoding.py                   # CPU, one thread; refuses a busy machine (--force)
    python benchmarks/bench_decoding.py --device cuda --compiled    # adds the compiled step (a CUDA graph)

Writes benchmarks/results/decoding_<device>.json (configuration, environment, load before and after, every
record, the floors and the summary) and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from recording import add_burst_argument, quiet_or_exit, stamp

from attnbook.decoding import StaticDecoder
from attnbook.lab import generation, lm
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare

MECHANISMS = ("softmax", "linear", "flow", "moh")


def peak_flops(device: torch.device, n: int = 1024, repeats: int = 9) -> float:
    """Multiply-adds per second x 2 of an n x n x n matrix product: the arithmetic peak a step could reach."""
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    t = compare({"mm": lambda: a @ b}, repeats=repeats, warmup=2, device=device)["mm"].median
    return 2 * n**3 / t


def read_bandwidth(device: torch.device, nbytes: int, repeats: int = 21) -> float:
    """Bytes per second of reading a buffer of ``nbytes`` once (a sum: one pass, nothing written back)."""
    x = torch.ones(max(1, nbytes // 4), device=device)
    t = compare({"read": lambda: x.sum()}, repeats=repeats, warmup=3, device=device)["read"].median
    return x.numel() * 4 / t


def step_cost(setup: lm.Setup, mechanism: str, t: int, vocab: int = 256) -> tuple[float, float]:
    """(floating-point operations, bytes read or written) of one token's step at position t, batch 1, float32."""
    C, L = setup.dim, setup.n_layers
    H = setup.n_heads
    D = C // H
    weights = L * (12 * C * C + 14 * C) + vocab * C + 2 * C  # q, k, v, out, MLP (4C), norms; the tied head; final norm
    flops = 2 * weights
    if mechanism in ("softmax", "moh"):
        cached = L * 2 * (t + 1) * C  # read every key and value, this token's written
        flops += L * 2 * 2 * (t + 1) * C  # scores and the weighted sum
        numbers = weights + cached
        if mechanism == "moh":
            numbers += L * C * H  # the router
            flops += L * 2 * C * H
    else:
        state = L * H * D * (D + 1) if mechanism == "linear" else L * H * (D * D + 4 * D + 1)
        numbers = weights + 2 * state  # read and written back
        flops += L * H * 4 * D * (D + 1)
    return float(flops), float(4 * numbers)


def floors(setup: lm.Setup, positions: list[int], device: torch.device) -> dict:
    peak = peak_flops(device)
    out: dict = {"peak_flops": peak, "bandwidth": {}, "floor_s": {}}
    for name in MECHANISMS:
        out["floor_s"][name] = {}
        for t in positions:
            flops, nbytes = step_cost(setup, name, t)
            key = str(int(nbytes))
            if key not in out["bandwidth"]:
                out["bandwidth"][key] = read_bandwidth(device, int(nbytes))
            bw = out["bandwidth"][key]
            out["floor_s"][name][str(t)] = {
                "flops": flops,
                "bytes": nbytes,
                "arithmetic_s": flops / peak,
                "memory_s": nbytes / bw,
                "floor_s": max(flops / peak, nbytes / bw),
            }
    return out


def prefill_against_steps(setup: lm.Setup, P: int, device: torch.device, eager: bool, repeats: int = 3) -> dict:
    """A prompt of P tokens: one parallel prefill against P steps (static, and the static decoder's torch
    operations; eager too when ``eager``), each the median of ``repeats`` runs, taken in turn."""
    out = {}
    prompt = torch.randint(256, (1, P), generator=torch.Generator().manual_seed(1)).to(device)
    for name in ("softmax", "linear", "flow"):
        torch.manual_seed(0)
        model = setup.model(name).to(device).eval()
        fast = StaticDecoder(model, batch=1, capacity=P)
        decoders = [("static", fast)]
        if device.type == "cpu":  # its torch operations (on CUDA "static" runs those already)
            decoders.append(("torch", StaticDecoder(model, batch=1, capacity=P, native=False)))
        times: dict[str, list[float]] = {"prefill": [], "static": [], "torch": [], "eager": []}
        error = 0.0  # the largest difference of a step's logits from the prefill's, over both decoders and every run
        with torch.inference_mode():
            for _ in range(repeats):
                t0 = time.perf_counter()
                logits = fast.prefill(prompt)
                times["prefill"].append(time.perf_counter() - t0)
                for key, decoder in decoders:
                    decoder.reset()
                    t0 = time.perf_counter()
                    stepped = [decoder.step(prompt[:, i]) for i in range(P)]
                    times[key].append(time.perf_counter() - t0)
                    error = max(error, float((torch.stack(stepped, 1) - logits).abs().max()))
                if eager:
                    state, t0 = None, time.perf_counter()
                    for i in range(P):
                        _, state = model.step(prompt[:, i], state)
                    times["eager"].append(time.perf_counter() - t0)
        record = {f"{k}_s" if k == "prefill" else f"{k}_steps_s": statistics.median(v) for k, v in times.items() if v}
        record["max_logit_difference"] = error
        record["steps_over_prefill"] = record["static_steps_s"] / record["prefill_s"]
        out[name] = record
    return out


def summarise(result: dict, floor: dict, t_max: int) -> dict:
    summary: dict = {"within_floor": {}, "ratio_at_t_max": {}, "crossover_t": None}
    for decoder in result["config"]["decoders"]:
        ts, med = generation.series(result, "median_s", decoder)
        summary["within_floor"][decoder] = {
            name: {str(t): med[name][i] / floor["floor_s"][name][str(t)]["floor_s"] for i, t in enumerate(ts)}
            for name in result["config"]["mechanisms"]
        }
        summary["ratio_at_t_max"][decoder] = {
            name: generation.ratio(result, "softmax", name, t_max, decoder=decoder) for name in ("linear", "flow")
        }
    ts, med = generation.series(result, "median_s", "static")
    slower = [t for i, t in enumerate(ts) if med["softmax"][i] > med["linear"][i]]
    # the first t from which softmax's step stays the slower one
    for i, t in enumerate(ts):
        if all(med["softmax"][j] > med["linear"][j] for j in range(i, len(ts))):
            summary["crossover_t"] = t
            break
    summary["softmax_slower_at"] = slower
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--positions", type=int, nargs="+", default=list(generation.POSITIONS))
    parser.add_argument("--repeats", type=int, default=21)
    add_burst_argument(parser)
    parser.add_argument("--prompt", type=int, default=4096, help="prefill length (default 4096)")
    parser.add_argument("--compiled", action="store_true", help="also time the compiled step (slow to compile)")
    parser.add_argument("--no-eager", action="store_true", help="leave the eager path out")
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = quiet_or_exit("bench_decoding", args.force)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # "torch": the static decoder's torch operations, which on CUDA is what "static" already runs
    torch_ops = ["torch"] if device.type == "cpu" else []
    decoders = ["static", *torch_ops] + ([] if args.no_eager else ["eager"]) + (["compiled"] if args.compiled else [])
    setup = lm.RECORDED
    started = time.perf_counter()
    result = generation.measure(
        setup, mechanism_names=MECHANISMS, positions=args.positions, repeats=args.repeats, device=device,
        decoders=decoders, burst=args.burst,
    )  # fmt: skip
    floor = floors(setup, result["config"]["positions"], device)
    prefill = prefill_against_steps(setup, args.prompt, device, eager=not args.no_eager)
    t_max = max(result["config"]["positions"])
    out = {
        "kind": "bench_decoding",
        "config": result["config"],
        "environment": stamp(environment(device), load_before, args.force),
        "records": result["records"],
        "floors": floor,
        "prefill": {"prompt": args.prompt, **prefill},
        "summary": summarise(result, floor, t_max),
        "wall_seconds": time.perf_counter() - started,
    }
    path = args.out or Path(__file__).parent / "results" / f"decoding_{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    s = out["summary"]
    for decoder in decoders:
        ts, med = generation.series(result, "median_s", decoder)
        print(f"{decoder}: per-token step in us (step / floor)")
        for name in MECHANISMS:
            cells = [f"{t}: {med[name][i] * 1e6:.0f} ({s['within_floor'][decoder][name][str(t)]:.1f}x)"
                     for i, t in enumerate(ts) if t in (ts[0], 256, 1024, t_max)]  # fmt: skip
            print(f"  {name:8s} " + ", ".join(cells))
        print(f"  softmax / linear at t = {t_max}: {s['ratio_at_t_max'][decoder]['linear']:.1f}x, "
              f"/ flow {s['ratio_at_t_max'][decoder]['flow']:.1f}x")  # fmt: skip
    print(f"crossover t* (static): {s['crossover_t']}")
    for name, r in prefill.items():
        steps = [f"{r['static_steps_s'] * 1e3:.0f} ms static ({r['steps_over_prefill']:.1f}x)"]
        steps += [f"{r[k + '_steps_s'] * 1e3:.0f} ms {k}" for k in ("torch", "eager") if k + "_steps_s" in r]
        print(
            f"prefill {args.prompt} ({name}): {r['prefill_s'] * 1e3:.0f} ms against steps: {', '.join(steps)}; "
            f"logits differ by {r['max_logit_difference']:.1e}"
        )


if __name__ == "__main__":
    main()
