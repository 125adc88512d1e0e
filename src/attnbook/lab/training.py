"""The one training harness and the one classifier of the book's experiments.

Chapter 6's race (:mod:`attnbook.lab.headtohead`), the claims experiments (:mod:`attnbook.lab.claims`) and
chapter 7's language model (:mod:`attnbook.lab.lm`) train with :func:`fit`, and build their models from
:class:`attnbook.lm.Block`, the package's one transformer block: the language model stacks it causally, the
other two through :class:`Classifier`.

* :class:`Optim` -- AdamW's settings and the learning-rate schedule (constant, or a linear warm-up followed by a
  cosine to a tenth), gradient clipping;
* :func:`fit` -- the loop: a batch, the loss, a step, and an evaluation every few steps, with the training time
  (batches and evaluations excluded) measured on the way;
* :class:`Classifier` -- token and learned position embeddings, blocks, a final norm and a linear head at the
  last position, at every position, or pooled over the real tokens; :data:`NO_ATTENTION` builds it without
  attention (the baseline that tells what attention adds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_divisible, check_int, check_max_size, check_module, check_number, check_tensor
from ..lm import Block

__all__ = ["Optim", "fit", "Classifier", "NO_ATTENTION"]

#: The mechanism name of the baseline without attention: the same blocks, their attention left out, so that each
#: token sees only itself (and the model only what the MLPs make of single tokens).
NO_ATTENTION = "none"


class _NoAttention(nn.Module):
    """The attention of a :data:`NO_ATTENTION` block: adds nothing to the residual stream."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(x)


@dataclass(frozen=True)
class Optim:
    """AdamW and its schedule.

    Attributes:
        lr: the (peak) learning rate.
        weight_decay: AdamW's decoupled weight decay.
        warmup: None for a constant ``lr``; else ``warmup`` linear steps up to ``lr``, then a cosine down to
            ``lr / 10`` at the last step.
        clip: the gradient norm is clipped to this (None: no clipping).
        decay_matrices_only: weight decay on the weight matrices only, not on biases, norms and positions.
        foreach: AdamW's and the clipping's ``foreach`` (None: torch's default).
    """

    lr: float
    weight_decay: float = 0.01
    warmup: int | None = None
    clip: float | None = None
    decay_matrices_only: bool = False
    foreach: bool | None = None

    def __post_init__(self) -> None:
        check_number(self.lr, "lr", name="Optim", minimum=0.0, strict_minimum=True)
        check_number(self.weight_decay, "weight_decay", name="Optim", minimum=0.0)
        if self.warmup is not None:
            check_int(self.warmup, "warmup", name="Optim", minimum=0)
        if self.clip is not None:
            check_number(self.clip, "clip", name="Optim", minimum=0.0, strict_minimum=True)

    def learning_rate(self, step: int, steps: int) -> float:
        """The rate of step ``step`` (from 0) of ``steps``."""
        if self.warmup is None:
            return self.lr
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, steps - self.warmup)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    def optimizer(self, model: nn.Module) -> torch.optim.AdamW:
        """AdamW over ``model``'s parameters with these settings."""
        params: Any = model.parameters()
        if self.decay_matrices_only:
            decay = [p for p in model.parameters() if p.dim() >= 2]
            other = [p for p in model.parameters() if p.dim() < 2]
            params = [{"params": decay, "weight_decay": self.weight_decay}, {"params": other, "weight_decay": 0.0}]
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, foreach=self.foreach)


def fit(
    model: nn.Module,
    next_batch: Callable[[int], Any],
    loss: Callable[[nn.Module, Any], torch.Tensor],
    *,
    steps: int,
    optim: Optim,
    evaluate: Callable[[int, float], bool | None],
    eval_every: int,
    device: torch.device,
    after_step: Callable[[int, torch.Tensor], None] | None = None,
) -> float:
    """Train ``model`` for ``steps`` steps; returns the training time in seconds.

    Step ``s`` (from 1) takes ``next_batch(s)`` (made before the clock starts), sets the rate of
    :meth:`Optim.learning_rate`, computes ``loss(model, batch)``, steps AdamW after clipping the gradient norm,
    and hands the loss to ``after_step(s, loss)``. ``evaluate(step, seconds)`` runs before the first step (step
    0), every ``eval_every`` steps and after the last, with the training time so far; when it returns True the
    training stops there. The clock covers the steps alone (on CUDA up to their end on the device).
    """
    steps = check_int(steps, "steps", name="fit", minimum=1)
    eval_every = check_int(eval_every, "eval_every", name="fit", minimum=1)
    opt = optim.optimizer(model)
    elapsed = 0.0
    if evaluate(0, 0.0):
        return elapsed
    model.train()
    for step in range(1, steps + 1):
        batch = next_batch(step)
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = optim.learning_rate(step - 1, steps)
        value = loss(model, batch)
        opt.zero_grad(set_to_none=True)
        value.backward()
        if optim.clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), optim.clip, foreach=optim.foreach)
        opt.step()
        if after_step is not None:
            after_step(step, value.detach())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed += time.perf_counter() - t0
        if (step % eval_every == 0 or step == steps) and evaluate(step, elapsed):
            break
    return elapsed


def held_out_evaluation(
    model: nn.Module, record: Any, forward: Callable[[], Any], target: torch.Tensor, stop_at: float | None = None
) -> Callable[[int, float], bool]:
    """An ``evaluate`` for :func:`fit`: ``forward()`` (``model`` in eval mode, no gradients) gives held-out logits
    (..., classes) for ``target`` (...); each call appends the step, the training time, the accuracy and the
    cross-entropy to ``record.steps``, ``.wall_s``, ``.accuracy`` and ``.loss``, and stops the training (True) once
    the accuracy is at least ``stop_at`` at two evaluations in a row, after the first."""

    def evaluate(step: int, elapsed: float) -> bool:
        model.eval()
        with torch.no_grad():
            logits = forward()
            record.accuracy.append((logits.argmax(-1) == target).float().mean().item())
            record.loss.append(nn.functional.cross_entropy(logits.flatten(0, -2), target.flatten()).item())
        model.train()
        record.steps.append(step)
        record.wall_s.append(elapsed)
        return stop_at is not None and len(record.accuracy) > 2 and min(record.accuracy[-2:]) >= stop_at

    return evaluate


class Classifier(nn.Module):
    """An encoder: token and learned position embeddings, ``n_layers`` blocks (:class:`attnbook.lm.Block`, MLP twice
    the width), a final norm and a linear head, read at the last position, at every position, or pooled over the
    real tokens.

    Args:
        mechanism: a name of :data:`attnbook.mechanisms.MECHANISMS`, or :data:`NO_ATTENTION`.
        vocab, length, n_classes: token ids, the longest sequence, the classes.
        d_model, n_heads, n_layers: widths and depth.
        pool: ``"mean"`` over the real tokens (padding excluded), ``"last"`` (the last position) or ``"all"``
            (logits at every position).
        causal: the blocks are causal (each position sees itself and those before it).
        embedding: replaces the token embedding (``(B, N) long -> (B, N, d_model)``).
        attn_options: keyword arguments of the mechanism's module (an ablation such as ``competition=False``).
        name: how messages name the model.

    Shape:
        ``forward(tokens, padding=None)``: tokens (B, N) long, padding (B, N) bool (True = padding) ->
        logits (B, n_classes), or (B, N, n_classes) with ``pool="all"``.
    """

    def __init__(
        self,
        mechanism: str,
        *,
        vocab: int,
        length: int,
        n_classes: int,
        d_model: int = 32,
        n_heads: int = 4,
        n_layers: int = 2,
        pool: str = "mean",
        causal: bool = False,
        embedding: nn.Module | None = None,
        attn_options: Mapping[str, Any] | None = None,
        name: str = "Classifier",
    ):
        super().__init__()
        self.name = name
        vocab = check_int(vocab, "vocab", name=name, minimum=1)
        length = check_int(length, "length", name=name, minimum=1)
        n_classes = check_int(n_classes, "n_classes", name=name, minimum=1)
        d_model = check_int(d_model, "d_model", name=name, minimum=1)
        n_heads = check_int(n_heads, "n_heads", name=name, minimum=1)
        n_layers = check_int(n_layers, "n_layers", name=name, minimum=1)
        check_divisible(d_model, n_heads, name=name, total_arg="d_model", parts_arg="n_heads")
        self.pool = check_choice(pool, "pool", ("mean", "last", "all"), name=name)
        if embedding is not None:
            check_module(embedding, "embedding", name=name)
        self.embed = nn.Embedding(vocab, d_model) if embedding is None else embedding
        self.position = nn.Parameter(torch.randn(length, d_model) * 0.02)
        options = dict(attn_options or {})
        built = "softmax" if mechanism == NO_ATTENTION else mechanism  # its attention is then left out
        self.blocks = nn.ModuleList(
            Block(built, d_model, n_heads, mlp_ratio=2, causal=causal, **options) for _ in range(n_layers)
        )
        if mechanism == NO_ATTENTION:
            for block in self.blocks:
                block.attn = _NoAttention()
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings, (B, N) -> (B, N, d_model): the input of the first block."""
        check_tensor(tokens, "tokens", name=self.name, dims=2, layout="(B, N)", floating=False)
        check_max_size(tokens, "tokens", 1, self.position.shape[0], name=self.name, label="N", why=" (length)")
        return self.embed(tokens) + self.position[: tokens.shape[1]]  # (B, N, d)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(tokens)  # (B, N, d)
        for block in self.blocks:
            x = block(x, key_padding_mask=padding)
        x = self.norm(x)
        if self.pool == "all":
            return self.head(x)  # (B, N, n_classes)
        if self.pool == "last":
            return self.head(x[:, -1])  # (B, n_classes)
        real = x.new_ones(x.shape[:2]) if padding is None else (~padding).to(x.dtype)  # (B, N)
        pooled = (x * real.unsqueeze(-1)).sum(1) / real.sum(1, keepdim=True).clamp_min(1.0)  # (B, d)
        return self.head(pooled)  # (B, n_classes)
