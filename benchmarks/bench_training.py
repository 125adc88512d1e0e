"""Training speed of chapter 7's language model (issue 30): tokens per second of one training step, eager and
compiled, for every causal mechanism, beside a nanoGPT-style softmax model with SDPA of the same size.

The models: :class:`attnbook.lm.DecoderLM` with each causal mechanism at ``attnbook.lab.lm.RECORDED``'s size
(width 128, 4 heads, 2 blocks, windows of 128 bytes, batch 16), and :class:`NanoGPT`, the decoder of Karpathy's
nanoGPT written out at the same size (learned positions, one fused q/k/v projection, ``F.scaled_dot_product_
attention(is_causal=True)``, GELU MLP, tied head): the model an engineer would compare against. A training step
is forward, cross-entropy, backward and an AdamW update. Compiled: ``torch.compile`` (inductor) of the model;
its compilation is done before timing and reported. All steps are timed in one alternating run
(:func:`attnbook.lab.profiling.compare`), medians.

    python benchmarks/bench_training.py                  # CPU, one thread; refuses a busy machine (--force)
    python benchmarks/bench_training.py --device cuda

Writes benchmarks/results/training_<device>.json and prints tokens per second.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from recording import quiet_or_exit, stamp
from torch import nn

from attnbook import mechanisms
from attnbook.lab import lm
from attnbook.lab.bench import environment
from attnbook.lab.profiling import compare


class _GPTBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, N, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, N, C)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's decoder (Karpathy, github.com/karpathy/nanoGPT, model.py) at a given size: the SDPA baseline."""

    def __init__(self, vocab: int, dim: int, n_heads: int, n_layers: int, context: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(_GPTBlock(dim, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # (B, N, V), the head tied to the embeddings


def training_step(model: nn.Module, forward, tokens: torch.Tensor, target: torch.Tensor):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        logits = forward(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    parser.add_argument("--force", action="store_true", help="record even when the machine is busy")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = quiet_or_exit("bench_training", args.force)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    setup = lm.RECORDED
    g = torch.Generator().manual_seed(0)
    data = torch.randint(256, (setup.batch, setup.context + 1), generator=g).to(device)
    tokens, target = data[:, :-1], data[:, 1:]
    models: dict[str, nn.Module] = {}
    for name in mechanisms.names(causal=True, bidirectional=True):  # chapter 7's four
        torch.manual_seed(0)
        models[name] = setup.model(name).to(device).train()
    torch.manual_seed(0)
    models["nanogpt"] = NanoGPT(256, setup.dim, setup.n_heads, setup.n_layers, setup.context).to(device).train()
    steps, compile_s = {}, {}
    for name, model in models.items():
        steps[f"{name} eager"] = training_step(model, model, tokens, target)
        if not args.no_compile:
            compiled = torch.compile(model)
            step = training_step(model, compiled, tokens, target)
            t0 = time.perf_counter()
            step()  # compiles the forward and the backward
            step()
            compile_s[name] = time.perf_counter() - t0
            steps[f"{name} compiled"] = step
    timing = compare(steps, repeats=args.repeats, warmup=2, device=device)
    per_step = setup.batch * setup.context
    rows = {k: {"step_s": t.median, "samples_s": list(t.samples), "tokens_per_s": per_step / t.median}
            for k, t in timing.items()}  # fmt: skip
    out = {
        "kind": "bench_training",
        "config": {
            **{k: getattr(setup, k) for k in ("dim", "n_heads", "n_layers", "context", "batch")},
            "repeats": args.repeats,
            "optimizer": "AdamW",
            "compile": not args.no_compile,
        },  # fmt: skip
        "environment": stamp(environment(device), load_before, args.force),
        "parameters": {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
        "compile_seconds": compile_s,
        "steps": rows,
    }
    path = args.out or Path(__file__).parent / "results" / f"training_{device.type}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    base = rows["nanogpt eager"]["tokens_per_s"]
    for key, row in rows.items():
        ratio = row["tokens_per_s"] / base
        print(f"  {key:18s} {row['tokens_per_s']:9.0f} tokens/s ({row['step_s'] * 1e3:7.1f} ms a step, "
              f"{ratio:4.2f}x nanoGPT eager)")  # fmt: skip
    assert math.isfinite(base)


if __name__ == "__main__":
    main()
