"""One tiny model, its attention swapped between the mechanisms, trained on associative recall (chapter 6).

The task is associative recall (Ba et al. 2016, "Using Fast Weights to Attend to the Recent Past"; Zoology,
Arora et al. 2023, uses it to probe linear attention) in its one-hop form: a context of ``P`` key-value
facts, each fact one token that stands for the pair (k_i, v_i), then a query token naming one of the keys,

    (k_1, v_1) (k_2, v_2) ... (k_P, v_P) q        with q = k_i for a random i,   target: v_i.

Keys are distinct within a sequence. Solving it means finding the one fact whose key matches the query and
reading its value: a sharp, content-based lookup among P similar tokens, which softmax attention can make
exact and a positive linear kernel only approximately.

The model is ``n_layers`` pre-norm blocks (attention, then a two-layer MLP, each with a residual) over token
and learned position embeddings, read out at the last position. :func:`train` returns accuracy on a fixed
held-out batch against the wall time spent training (evaluation time excluded).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import mechanisms

__all__ = ["MECHANISMS", "RecallTask", "TinyModel", "Curve", "train", "plot_curves"]

MECHANISMS = tuple(mechanisms.MECHANISMS)  # every mechanism of the registry races


@dataclass(frozen=True)
class RecallTask:
    """Associative recall: ``n_pairs`` key-value pairs, then a query key; predict its value."""

    n_pairs: int = 6
    n_keys: int = 16
    n_values: int = 16

    def __post_init__(self):
        if self.n_pairs < 1 or self.n_values < 1:
            raise ValueError(f"RecallTask: need n_pairs >= 1 and n_values >= 1, got {self}")
        if self.n_keys < self.n_pairs:
            raise ValueError(f"RecallTask: {self.n_pairs} distinct keys cannot come from n_keys={self.n_keys}")

    @property
    def vocab(self) -> int:
        """Fact tokens (one per key-value pair), then query tokens (one per key)."""
        return self.n_keys * self.n_values + self.n_keys

    @property
    def length(self) -> int:
        return self.n_pairs + 1

    def batch(self, size: int, generator: torch.Generator, device: torch.device | str = "cpu"):
        """``(tokens (size, P + 1) long, target (size,) long in [0, n_values))``."""
        P = self.n_pairs
        keys = torch.rand(size, self.n_keys, generator=generator).argsort(dim=-1)[:, :P]  # (size, P) distinct
        values = torch.randint(self.n_values, (size, P), generator=generator)  # (size, P)
        pick = torch.randint(P, (size, 1), generator=generator)  # (size, 1)
        facts = keys * self.n_values + values  # (size, P): the token of the pair (k, v)
        query = self.n_keys * self.n_values + keys.gather(1, pick)  # (size, 1)
        tokens = torch.cat([facts, query], dim=1)  # (size, P + 1)
        target = values.gather(1, pick).squeeze(1)  # (size,)
        return tokens.to(device), target.to(device)


class _Block(nn.Module):
    def __init__(self, mechanism: str, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = mechanisms.get(mechanism).module(d, heads)  # a self-attention layer: attn(x)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h)  # (B, N, d)
        return x + self.mlp(self.norm2(x))  # (B, N, d)


class TinyModel(nn.Module):
    """Embeddings, ``n_layers`` pre-norm attention blocks of one mechanism, a classifier at the last position.

    Shape: tokens (B, N) long -> logits (B, n_out).
    """

    def __init__(
        self,
        mechanism: str,
        *,
        vocab: int,
        length: int,
        n_out: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
    ):
        super().__init__()
        if mechanism not in MECHANISMS:
            raise ValueError(f"TinyModel: unknown mechanism {mechanism!r}; choose from {MECHANISMS}")
        self.mechanism = mechanism
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(length, d_model) * 0.02)
        self.blocks = nn.ModuleList(_Block(mechanism, d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] > self.position.shape[0]:
            raise ValueError(
                f"TinyModel: expected tokens (B, N <= {self.position.shape[0]}), got {tuple(tokens.shape)}"
            )
        x = self.embed(tokens) + self.position[: tokens.shape[1]]  # (B, N, d)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, -1]))  # (B, n_out)


@dataclass
class Curve:
    """Held-out accuracy and loss of one mechanism during training; ``wall_s`` counts training time only."""

    mechanism: str
    steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[-1]


def train(
    mechanism: str,
    task: RecallTask = RecallTask(),
    *,
    steps: int = 200,
    batch: int = 64,
    lr: float = 3e-3,
    eval_every: int = 20,
    eval_size: int = 512,
    d_model: int = 64,
    n_heads: int = 4,
    n_layers: int = 2,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Curve:
    """Train a :class:`TinyModel` with ``mechanism`` on ``task`` (AdamW); accuracy vs training wall time.

    The same seed gives every mechanism the same training batches and the same held-out batch.
    """
    if steps < 1 or eval_every < 1 or batch < 1 or eval_size < 1:
        raise ValueError(
            f"train: steps, eval_every, batch and eval_size must be >= 1, got "
            f"{steps}, {eval_every}, {batch}, {eval_size}"
        )
    device = torch.device(device)
    torch.manual_seed(seed)
    model = TinyModel(
        mechanism,
        vocab=task.vocab,
        length=task.length,
        n_out=task.n_values,
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    data = torch.Generator().manual_seed(seed + 1)
    eval_tokens, eval_target = task.batch(eval_size, torch.Generator().manual_seed(seed + 2), device)
    curve = Curve(mechanism)

    def evaluate(step: int, elapsed: float) -> None:
        model.eval()
        with torch.no_grad():
            logits = model(eval_tokens)  # (eval_size, n_values)
            curve.accuracy.append((logits.argmax(-1) == eval_target).float().mean().item())
            curve.loss.append(nn.functional.cross_entropy(logits, eval_target).item())
        model.train()
        curve.steps.append(step)
        curve.wall_s.append(elapsed)

    elapsed = 0.0
    evaluate(0, 0.0)
    for step in range(1, steps + 1):
        tokens, target = task.batch(batch, data, device)
        t0 = time.perf_counter()
        out = nn.functional.cross_entropy(model(tokens), target)
        opt.zero_grad(set_to_none=True)
        out.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed += time.perf_counter() - t0
        if step % eval_every == 0 or step == steps:
            evaluate(step, elapsed)
    return curve


def plot_curves(curves: Sequence[Curve], *, chance: float | None = None, ax=None):
    """Accuracy against training wall time, one line per mechanism."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for c in curves:
        ax.plot(c.wall_s, c.accuracy, marker=".", label=c.mechanism)
    if chance is not None:
        ax.axhline(chance, ls="--", color="grey", lw=0.8, label="chance")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax
