"""One tiny model, its attention swapped between the mechanisms, trained on associative recall (chapter 6).

The task is associative recall (Ba et al. 2016, "Using Fast Weights to Attend to the Recent Past"; Zoology,
Arora et al. 2023, uses it to probe linear attention) in its one-hop form: a context of ``P`` key-value
facts, each fact one token that stands for the pair (k_i, v_i), then a query token naming one of the keys,

    (k_1, v_1) (k_2, v_2) ... (k_P, v_P) q        with q = k_i for a random i,   target: v_i.

Keys are distinct within a sequence. Solving it means finding the one fact whose key matches the query and
reading its value: a sharp, content-based lookup among P similar tokens, which softmax attention can make
exact and a positive linear kernel only approximately.

The model is ``n_layers`` pre-norm blocks (attention, then a two-layer MLP, each with a residual) over token
and learned position embeddings, read out at the last position. By default a fact token is embedded as the
sum of an embedding of its key and one of its value (:class:`RecallEmbedding`), so that the race measures
the attention's lookup rather than how fast 128 unrelated token embeddings are learned.

* :func:`train` -- one mechanism, one seed: held-out accuracy against steps and training wall time
  (a :class:`Curve`);
* :func:`race` -- every mechanism over several seeds, alternating between mechanisms so that a noisy machine
  slows them alike (a :class:`Race`, with the mean, the spread and whether the curves have flattened);
* :func:`lookup_share` -- how much of each head's attention at the query falls on the fact it names,
  read from the trained model: the mechanism behind the accuracy;
* :func:`operator_count` -- how many tensor operations one training step runs: at the race's few tokens
  this, not the FLOPs, is what a step's time follows;
* :func:`plot_race` and :func:`plot_curves` -- the figures of chapter 6;
* the chapter's other plumbing, so that its cells show ideas: the benchmark's figure and recordings
  (:func:`benchmark_figure`, :func:`crossovers`, :func:`benchmark_recordings`, :func:`steadiness`,
  :func:`ratio_table`), the race's table (:func:`best_head_shares`, :func:`race_table`), the MoH router's size
  (:func:`router_rows`), the recorded tests of the papers' claims (:func:`claim_numbers`,
  :func:`claims_summary`) and the table "which mechanism when" (:func:`advice_rows`, :func:`html_table`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .. import mechanisms
from .._checks import (
    check_bool,
    check_choice,
    check_count,
    check_found,
    check_instance,
    check_int,
    check_module,
    check_number,
    check_sequence,
    check_subset,
)
from ..moh import MoHAttention
from . import bench, recordings, training

__all__ = [
    "gpu_report_lines",
    "MECHANISMS",
    "RecallTask",
    "RecallEmbedding",
    "TinyModel",
    "Curve",
    "Summary",
    "Race",
    "train",
    "race",
    "lookup_share",
    "operator_count",
    "plot_race",
    "plot_curves",
    "BENCHMARK_METRICS",
    "benchmark_figure",
    "crossovers",
    "describe_crossover",
    "sample_spread",
    "steadiness",
    "noisy_records",
    "benchmark_recordings",
    "ratio_table",
    "slopes_table",
    "best_head_shares",
    "operator_counts",
    "race_table",
    "router_rows",
    "CLAIMS_RECORDINGS",
    "claim_numbers",
    "claims_summary",
    "advice_rows",
    "html_table",
]

#: Every mechanism of the registry with a non-causal form races (in the registry's order): the race reads whole
#: sequences; chapter 8's causal-only mechanisms are compared on the recall study (:mod:`attnbook.lab.recall`).
MECHANISMS = tuple(mechanisms.names(bidirectional=True))


@dataclass(frozen=True)
class RecallTask:
    """Associative recall: ``n_pairs`` key-value facts, then a query key; predict its value.

    Tokens ``0 .. n_keys * n_values - 1`` are facts (the fact (k, v) is ``k * n_values + v``), tokens
    ``n_keys * n_values + k`` are queries for key k. Chance accuracy is ``1 / n_values``.
    """

    n_pairs: int = 6
    n_keys: int = 16
    n_values: int = 16

    def __post_init__(self):
        check_int(self.n_pairs, "n_pairs", name="RecallTask", minimum=1)
        check_int(self.n_values, "n_values", name="RecallTask", minimum=2)
        why = " (n_pairs: the keys of a sequence are distinct)"
        check_int(self.n_keys, "n_keys", name="RecallTask", minimum=self.n_pairs, why=why)

    @property
    def vocab(self) -> int:
        """Fact tokens (one per key-value pair), then query tokens (one per key)."""
        return self.n_keys * self.n_values + self.n_keys

    @property
    def length(self) -> int:
        """P facts and the query."""
        return self.n_pairs + 1

    @property
    def chance(self) -> float:
        """The accuracy of guessing: ``1 / n_values``."""
        return 1.0 / self.n_values

    def batch(self, size: int, generator: torch.Generator, device: torch.device | str = "cpu"):
        """``(tokens (size, P + 1) long, target (size,) long in [0, n_values))``."""
        size = check_int(size, "size", name="RecallTask.batch", minimum=1)
        check_instance(generator, "generator", torch.Generator, name="RecallTask.batch", what="a torch.Generator")
        P = self.n_pairs
        keys = torch.rand(size, self.n_keys, generator=generator).argsort(dim=-1)[:, :P]  # (size, P) distinct
        values = torch.randint(self.n_values, (size, P), generator=generator)  # (size, P)
        pick = torch.randint(P, (size, 1), generator=generator)  # (size, 1)
        facts = keys * self.n_values + values  # (size, P): the token of the pair (k, v)
        query = self.n_keys * self.n_values + keys.gather(1, pick)  # (size, 1)
        tokens = torch.cat([facts, query], dim=1)  # (size, P + 1)
        target = values.gather(1, pick).squeeze(1)  # (size,)
        return tokens.to(device), target.to(device)

    def fields(self, tokens: torch.Tensor):
        """``(key, value, is_query)`` of every token, each (B, N): the key it names, its value (0 for a query)."""
        n_facts = self.n_keys * self.n_values
        is_query = tokens >= n_facts
        key = torch.where(is_query, tokens - n_facts, tokens // self.n_values)
        value = torch.where(is_query, torch.zeros_like(tokens), tokens % self.n_values)
        return key, value, is_query


class RecallEmbedding(nn.Module):
    """A factored embedding of recall tokens: ``key[k] + value[v] + role[fact]``, or ``key[k] + role[query]``.

    A query and the fact it names share their key embedding, as a key and its question share a word; the
    attention still has to learn to match them and to read the value out.

    Shape: tokens (B, N) long -> (B, N, d_model).
    """

    def __init__(self, task: RecallTask, d_model: int):
        super().__init__()
        check_instance(task, "task", RecallTask, name="RecallEmbedding", what="a RecallTask")
        d_model = check_int(d_model, "d_model", name="RecallEmbedding", minimum=1)
        self.task = task
        self.key = nn.Embedding(task.n_keys, d_model)
        self.value = nn.Embedding(task.n_values, d_model)
        self.role = nn.Embedding(2, d_model)  # 0: a fact, 1: the query

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        key, value, is_query = self.task.fields(tokens)  # 3 x (B, N)
        fact = (~is_query).unsqueeze(-1).to(self.value.weight.dtype)  # (B, N, 1)
        return self.key(key) + fact * self.value(value) + self.role(is_query.long())  # (B, N, d)


class TinyModel(training.Classifier):
    """Embeddings, ``n_layers`` blocks of one mechanism, a classifier at the last position: chapter 6's
    :class:`attnbook.lab.training.Classifier`.

    Args:
        mechanism: a name of :data:`attnbook.mechanisms.MECHANISMS`.
        vocab, length, n_out: token vocabulary, longest sequence, number of classes.
        d_model, n_heads, n_layers: the model's width, heads per layer and depth.
        embedding: the token embedding, ``(B, N) long -> (B, N, d_model)``; default ``nn.Embedding(vocab, d_model)``.

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
        embedding: nn.Module | None = None,
    ):
        check_choice(mechanism, "mechanism", MECHANISMS, name="TinyModel")
        super().__init__(mechanism, vocab=vocab, length=length, n_classes=n_out, d_model=d_model, n_heads=n_heads,
                         n_layers=n_layers, pool="last", embedding=embedding, name="TinyModel")  # fmt: skip
        self.mechanism = mechanism


@dataclass
class Curve:
    """Held-out accuracy and loss of one mechanism and seed during training.

    ``wall_s`` counts training time only (evaluations excluded); ``model`` is the trained model when
    :func:`train` was asked to keep it.
    """

    mechanism: str
    steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    seed: int = 0
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[-1]

    @property
    def step_ms(self) -> float:
        """Mean training time per step in milliseconds."""
        return 1e3 * self.wall_s[-1] / max(self.steps[-1], 1)

    def steps_to(self, accuracy: float) -> int | None:
        """The first evaluated step at which the held-out accuracy reached ``accuracy`` (None if never)."""
        return next((s for s, a in zip(self.steps, self.accuracy, strict=True) if a >= accuracy), None)


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
    factored: bool = True,
    stop_at: float | None = None,
    keep_model: bool = False,
    device: torch.device | str = "cpu",
) -> Curve:
    """Train a :class:`TinyModel` with ``mechanism`` on ``task`` (AdamW); accuracy vs steps and wall time.

    The same seed gives every mechanism the same training batches and the same held-out batch; different
    seeds differ in the initialisation, the batches and the held-out set.

    Args:
        mechanism: a name of the registry.
        task: the :class:`RecallTask`.
        steps, batch, lr: optimiser steps, sequences per step, AdamW's learning rate (weight decay 0.01).
        eval_every, eval_size: evaluate every ``eval_every`` steps (and at the end) on ``eval_size`` held-out
            sequences.
        d_model, n_heads, n_layers: the model.
        seed: seeds the initialisation and the data.
        factored: embed fact tokens with :class:`RecallEmbedding` (else one embedding per token).
        stop_at: stop early once the held-out accuracy is at least ``stop_at`` at two evaluations in a row
            (there is nothing left to learn); None trains for all ``steps``.
        keep_model: keep the trained model in :attr:`Curve.model` (in eval mode).
        device: where to train.

    Returns:
        a :class:`Curve` with one point per evaluation, the first at step 0.
    """
    name = "train"
    check_choice(mechanism, "mechanism", MECHANISMS, name=name)
    check_instance(task, "task", RecallTask, name=name, what="a RecallTask")
    steps = check_int(steps, "steps", name=name, minimum=1)
    batch = check_int(batch, "batch", name=name, minimum=1)
    lr = check_number(lr, "lr", name=name, minimum=0.0, strict_minimum=True)
    eval_every = check_int(eval_every, "eval_every", name=name, minimum=1)
    eval_size = check_int(eval_size, "eval_size", name=name, minimum=1)
    seed = check_int(seed, "seed", name=name, minimum=0)
    factored = check_bool(factored, "factored", name=name)
    if stop_at is not None:
        stop_at = check_number(stop_at, "stop_at", name=name, minimum=0.0, maximum=1.0, strict_minimum=True)
    keep_model = check_bool(keep_model, "keep_model", name=name)
    device = torch.device(device)
    torch.manual_seed(seed)
    embedding = RecallEmbedding(task, d_model) if factored else None
    model = TinyModel(
        mechanism,
        vocab=task.vocab,
        length=task.length,
        n_out=task.n_values,
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
        embedding=embedding,
    ).to(device)
    data = torch.Generator().manual_seed(seed + 1)
    eval_tokens, eval_target = task.batch(eval_size, torch.Generator().manual_seed(10_000 + seed), device)
    curve = Curve(mechanism, seed=seed)
    evaluate = training.held_out_evaluation(model, curve, lambda: model(eval_tokens), eval_target, stop_at)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    training.fit(model, lambda _: task.batch(batch, data, device), loss, steps=steps, optim=training.Optim(
        lr, 0.01, foreach=True), evaluate=evaluate, eval_every=eval_every, device=device)  # fmt: skip
    if keep_model:
        curve.model = model.eval()
    return curve


@dataclass(frozen=True)
class Summary:
    """Final held-out accuracy of one mechanism over the seeds, and its cost per training step.

    Attributes:
        mean, low, high, std: mean, smallest, largest and standard deviation (0 for one seed) over seeds.
        step_ms: median over seeds of the mean training time per step, in milliseconds.
        seeds: how many seeds.
    """

    mean: float
    low: float
    high: float
    std: float
    step_ms: float
    seeds: int

    @property
    def spread(self) -> float:
        """``high - low``."""
        return self.high - self.low


def _summary(runs: Sequence) -> Summary:
    """The :class:`Summary` of one mechanism's runs (each with ``final_accuracy`` and ``step_ms``), one per seed."""
    final = [r.final_accuracy for r in runs]
    std = statistics.stdev(final) if len(final) > 1 else 0.0
    step_ms = statistics.median(r.step_ms for r in runs)
    return Summary(statistics.fmean(final), min(final), max(final), std, step_ms, len(final))


def _seeds(seeds, name: str) -> list[int]:
    """``seeds`` as a list: a count (``0 .. seeds - 1``) or the seeds themselves."""
    if isinstance(seeds, Sequence):
        check_count(seeds, "seeds", name=name, item="seed")
        return [check_int(s, "seeds", name=name, minimum=0) for s in seeds]
    return list(range(check_int(seeds, "seeds", name=name, minimum=1)))


@dataclass
class Race:
    """Every mechanism trained on one task with several seeds: ``curves[mechanism]`` holds one Curve per seed."""

    task: RecallTask
    curves: dict[str, list[Curve]]

    @property
    def mechanisms(self) -> list[str]:
        return list(self.curves)

    def final(self, mechanism: str) -> list[float]:
        """The final held-out accuracy of every seed."""
        return [c.final_accuracy for c in self._get(mechanism)]

    def summary(self, mechanism: str) -> Summary:
        """Mean and spread of the final accuracy over seeds, and the time per step."""
        return _summary(self._get(mechanism))

    def mean_curve(self, mechanism: str):
        """``(steps, mean, low, high)`` of the held-out accuracy over seeds, one entry per evaluation.

        A run that stopped early (``stop_at``) counts with its final accuracy at the later evaluations.
        """
        curves = self._get(mechanism)
        steps = max((c.steps for c in curves), key=len)
        acc = torch.tensor(
            [c.accuracy + [c.accuracy[-1]] * (len(steps) - len(c.accuracy)) for c in curves], dtype=torch.float64
        )  # (seeds, evaluations)
        return steps, acc.mean(0).tolist(), acc.min(0).values.tolist(), acc.max(0).values.tolist()

    def steps_to(self, mechanism: str, accuracy: float) -> list[int | None]:
        """For every seed, the first evaluated step at which the held-out accuracy reached ``accuracy``."""
        return [c.steps_to(accuracy) for c in self._get(mechanism)]

    def mean_steps_to(self, mechanism: str, accuracy: float = 0.9) -> float:
        """The mean over seeds of :meth:`steps_to`; a seed that never got there counts with its whole budget
        (its last evaluated step)."""
        got = [
            s if s is not None else c.steps[-1]
            for s, c in zip(self.steps_to(mechanism, accuracy), self._get(mechanism), strict=True)
        ]
        return statistics.fmean(got)

    def late_gain(self, mechanism: str, fraction: float = 0.25) -> float:
        """How much the mean accuracy rose over the last ``fraction`` of the training steps.

        A curve has flattened when this is small: training longer would change little.
        """
        fraction = check_number(
            fraction, "fraction", name="Race.late_gain", minimum=0.0, maximum=1.0, strict_minimum=True
        )
        steps, mean, _, _ = self.mean_curve(mechanism)
        start = steps[-1] * (1 - fraction)
        before = max(i for i, s in enumerate(steps) if s <= start)
        return mean[-1] - mean[before]

    def _get(self, mechanism: str) -> list[Curve]:
        check_choice(mechanism, "mechanism", self.mechanisms, name="Race")
        return self.curves[mechanism]


def race(
    task: RecallTask,
    *,
    mechanisms: Sequence[str] | None = None,
    seeds: int | Sequence[int] = 3,
    keep_models: bool = False,
    **train_kwargs,
) -> Race:
    """Train every mechanism on ``task`` with each seed (:func:`train`); the curves of all runs.

    For each seed the mechanisms run one after another, so that a slow spell of a shared machine falls on
    all of them rather than on one.

    Args:
        task: the :class:`RecallTask`.
        mechanisms: names from the registry (default: all of :data:`MECHANISMS`).
        seeds: a number of seeds (``0 .. seeds - 1``) or the seeds themselves.
        keep_models: keep every trained model in its :class:`Curve`.
        **train_kwargs: passed to :func:`train` (``steps``, ``lr``, ``d_model``, ``device``, ...).

    Returns:
        a :class:`Race`.
    """
    if mechanisms is not None:
        check_sequence(mechanisms, "mechanisms", name="race", minimum=1, item="mechanism")
    names = list(MECHANISMS if mechanisms is None else mechanisms)
    check_subset(names, "mechanisms", MECHANISMS, name="race")
    curves: dict[str, list[Curve]] = {n: [] for n in names}
    for seed in _seeds(seeds, "race"):
        for n in names:
            curves[n].append(train(n, task, seed=seed, keep_model=keep_models, **train_kwargs))
    return Race(task, curves)


def _head_weights(attn: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Every head's effective attention weights of the layer ``attn`` on its input h (B, N, C): (B, H, N, N).

    Every mechanism of the book is linear in its values, ``o_i = sum_j A_ij v_j`` with A from the queries and
    keys only, so feeding the identity matrix as the values returns A itself.
    """
    B, N, _ = h.shape
    if isinstance(attn, MoHAttention):
        H, D = attn.num_heads, attn.head_dim
        q, k, _ = attn.qkv(h).view(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, N, D)
        q, k = attn.q_norm(q), attn.k_norm(k)
        return torch.softmax((q @ k.transpose(-2, -1)) * attn.scale, dim=-1)  # (B, H, N, N)
    H = attn.n_heads
    q = attn.query_projection(h).view(B, N, H, -1).transpose(1, 2)  # (B, H, N, D)
    k = attn.key_projection(h).view(B, N, H, -1).transpose(1, 2)  # (B, H, N, D)
    eye = torch.eye(N, dtype=h.dtype, device=h.device).expand(B, H, N, N)  # values = the identity
    return attn.attend(q, k, eye)  # (B, H, N, N): row i is query i's weight on every key j


def lookup_share(model: TinyModel, tokens: torch.Tensor, task: RecallTask) -> torch.Tensor:
    """The share of each head's attention, at the query, that falls on the fact the query names.

    ``|A_{q,j*}| / sum_j |A_{q,j}|`` for the query position q (the last token) and the matching fact j*, read
    from the first block of ``model`` (for MoH: the heads' softmax weights, before the gates). 1 is a perfect
    lookup, ``1 / (P + 1)`` a uniform average over the sequence.

    Args:
        model: a trained :class:`TinyModel`.
        tokens: (B, N) recall sequences of ``task``.
        task: the :class:`RecallTask` they come from.

    Returns:
        (B, H) the share for every sequence and head.
    """
    check_instance(model, "model", TinyModel, name="lookup_share", what="a TinyModel")
    check_instance(task, "task", RecallTask, name="lookup_share", what="a RecallTask")
    block = model.blocks[0]
    with torch.no_grad():
        h = block.norm1(model.embed_tokens(tokens))  # (B, N, d)
        weights = _head_weights(block.attn, h)[:, :, -1]  # (B, H, N): the query's row
    key, _, _ = task.fields(tokens)  # (B, N)
    match = (key[:, :-1] == key[:, -1:]).nonzero()  # (B, 2): (sequence, position of the named fact)
    on_fact = weights[match[:, 0], :, match[:, 1]]  # (B, H)
    return on_fact.abs() / weights.abs().sum(-1).clamp_min(torch.finfo(weights.dtype).tiny)  # (B, H)


class _OperatorCounter(TorchDispatchMode):
    """Counts every ATen operator call made while it is active (forward and backward alike)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def operator_count(model: nn.Module, tokens: torch.Tensor, target: torch.Tensor) -> int:
    """The number of tensor operations (ATen operator calls) in one training step's forward and backward.

    On a few tokens each operation does little arithmetic, so a step's time is close to this count times
    the fixed cost of launching one operation (microseconds on a CPU, more on a GPU), whatever the FLOPs:
    a timing-free cost model for short sequences. The optimiser's update is not counted (it is the same for
    every mechanism of the same width). The model's gradients are left as they were.

    Args:
        model: e.g. a :class:`TinyModel`.
        tokens, target: one batch, ``model(tokens)`` -> logits for ``target``.
    """
    check_module(model, "model", name="operator_count")
    saved = [(p, p.grad) for p in model.parameters()]
    counter = _OperatorCounter()
    with counter:
        loss = nn.functional.cross_entropy(model(tokens), target)
        loss.backward()
    for p, grad in saved:
        p.grad = grad
    return counter.calls


def plot_race(result: Race, *, shares: dict[str, Sequence[float]] | None = None, fig=None):
    """Held-out accuracy against training steps: the mean over seeds, and a band from the lowest to the
    highest seed; with ``shares`` (mechanism -> one value per seed, e.g. from :func:`lookup_share`) a second
    panel below shows them, a bar at the mean and a dot per seed.

    Returns:
        the matplotlib Figure, drawn at the book's page width.
    """
    import matplotlib.pyplot as plt

    from ..viz import style

    check_instance(result, "result", Race, name="plot_race", what="a Race")
    if shares is not None:
        check_subset(shares, "shares", result.mechanisms, name="plot_race")
    if fig is None:
        fig = plt.figure(figsize=(style.PAGE_WIDTH, 3.8 if shares is None else 6.6))
    if shares is None:
        by_step, bars = fig.subplots(1, 1), None
    else:
        by_step, bars = fig.subplots(2, 1, height_ratios=[1.6, 1])
    for name in result.mechanisms:
        steps, mean, low, high = result.mean_curve(name)
        kw = style.line_style(name)
        by_step.plot(steps, mean, marker=".", label=name, **kw)
        by_step.fill_between(steps, low, high, color=kw["color"], alpha=0.18, lw=0)
    by_step.axhline(result.task.chance, ls=":", color="grey", lw=1, label="chance")
    by_step.set_ylabel("held-out accuracy")
    by_step.set_ylim(0, 1.02)
    by_step.grid(True, alpha=0.3)
    seeds = {len(c) for c in result.curves.values()}
    n_seeds = seeds.pop() if len(seeds) == 1 else "several"
    by_step.set_xlabel(f"training step (line: mean of {n_seeds} seeds; band: lowest to highest)")
    by_step.legend(loc="lower right", ncols=2)
    if bars is not None:
        names = list(shares)
        for x, name in enumerate(names):
            values = [float(v) for v in shares[name]]
            bars.bar(x, statistics.fmean(values), color=style.colour(name), alpha=0.55)
            bars.plot([x] * len(values), values, "o", color=style.colour(name), ms=4)
        bars.set_xticks(range(len(names)), names)
        bars.set_ylim(0, 1.02)
        bars.set_ylabel("attention on\nthe right fact")
        bars.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_curves(curves: Sequence[Curve], *, chance: float | None = None, ax=None):
    """Accuracy against training wall time, one line per curve, in the mechanism's colour."""
    import matplotlib.pyplot as plt

    from ..viz import style

    if ax is None:
        _, ax = plt.subplots(figsize=(style.PAGE_WIDTH, 3.6))
    for c in curves:
        try:
            kw = style.line_style(c.mechanism)
        except ValueError:  # not a mechanism of the book: matplotlib's next colour
            kw = {}
        ax.plot(c.wall_s, c.accuracy, marker=".", label=c.mechanism, **kw)
    if chance is not None:
        ax.axhline(chance, ls="--", color="grey", lw=0.8, label="chance")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax


# -------------------------------------------------------------------------------------------------------------------
# Chapter 6's measurements, read and summarised: the benchmark and its recordings, the race's numbers, the recorded
# tests of the papers' claims, and the table "which mechanism when" built from them.

#: The panels of :func:`benchmark_figure`: axis label -> metric of a :func:`attnbook.lab.bench.run_benchmark` record.
BENCHMARK_METRICS = {
    "forward (s)": "forward_s",
    "forward+backward (s)": "forward_backward_s",
    "forward peak memory (B)": "forward_peak_bytes",
}


def benchmark_figure(result: dict, *, title: str | None = None, skip: Sequence[str] = ("moh",)):
    """The cost panels of a :func:`attnbook.lab.bench.run_benchmark` result (or its recording).

    One log-log panel per metric of :data:`BENCHMARK_METRICS` that the result measured (forward time,
    forward+backward time, forward peak memory), a line per mechanism in its colour (dashed: a causal form),
    leaving out the mechanisms whose names start with one of ``skip`` (MoH is a whole layer, compared with a
    whole softmax layer instead). Drawn by :func:`attnbook.viz.plots.scaling_panels`; returns the Figure.
    """
    from ..viz.plots import scaling_panels

    check_instance(result, "result", dict, name="benchmark_figure", what="a run_benchmark result (a dict)")
    panels = {}
    for label, metric in BENCHMARK_METRICS.items():
        if any(r.get(metric) is not None for r in result["records"]):
            _, by_name = bench.series(result, metric)
            panels[label] = {n: ys for n, ys in by_name.items() if not n.startswith(tuple(skip))}
    return scaling_panels(list(result["config"]["lengths"]), panels, title=title)


def crossovers(result: dict, metric: str = "forward_s") -> dict[str, int | None]:
    """The first N from which each mechanism stays faster than SDPA, at every longer N measured.

    Causal forms are compared with SDPA's causal kernel (``softmax_causal``), the others with ``softmax``; the
    baselines themselves and the MoH layers are left out. None: not faster at the longest N measured.
    """
    ns, by_name = bench.series(result, metric)
    out: dict[str, int | None] = {}
    for name, ys in by_name.items():
        if name.startswith(("softmax", "moh")):
            continue
        base = by_name["softmax_causal" if name.endswith("_causal") else "softmax"]
        faster = [y < b for y, b in zip(ys, base, strict=True)]
        out[name] = next((n for i, n in enumerate(ns) if all(faster[i:])), None)
    return out


def describe_crossover(n: int | None, lengths: Sequence[int]) -> str:
    """``"from N = 512"``; ``"already at N = 128"`` when ``n`` is the shortest length measured; ``"nowhere in
    this range"`` for None."""
    if n is None:
        return "nowhere in this range"
    return f"already at N = {n}" if n == min(lengths) else f"from N = {n}"


def sample_spread(result: dict, mechanism: str) -> list[float]:
    """Largest over smallest timing sample of every forward record of ``mechanism``, in the order of N.

    1 means every repeat took the same time; a shared machine whose neighbours take a core makes it large.
    """
    return [
        max(r["forward_samples_s"]) / min(r["forward_samples_s"])
        for r in result["records"]
        if r["mechanism"] == mechanism and r.get("forward_samples_s")
    ]


def steadiness(result: dict) -> float:
    """The median :func:`sample_spread` of softmax, linear and Flow-Attention: how steady a recording is."""
    spreads = sorted(x for n in ("softmax", "linear", "flow") for x in sample_spread(result, n))
    check_found(spreads, "result", name="steadiness", expected="hold forward samples", got="none")
    return spreads[len(spreads) // 2]


def noisy_records(result: dict, factor: float = 3.0) -> set[tuple[str, int]]:
    """``(mechanism, N)`` of every record whose forward samples spread by more than ``factor``."""
    return {
        (r["mechanism"], r["N"])
        for r in result["records"]
        if r.get("forward_samples_s") and max(r["forward_samples_s"]) > factor * min(r["forward_samples_s"])
    }


def benchmark_recordings(start=None) -> dict[str, dict]:
    """Every recording of :func:`attnbook.lab.bench.run_benchmark` in ``benchmarks/results/``, by file name.

    Read with :func:`attnbook.lab.recordings.load` (``start`` as there); empty after a pip install, where the
    repository's recordings are absent. Other recordings in the folder (training, the annex) are left out.
    """
    folder = recordings.root(start)
    if folder is None:
        return {}
    out = {}
    for path in sorted((folder / "benchmarks" / "results").glob("*.json")):
        data = recordings.load(path.name, start=folder)
        rows = data.get("records") if isinstance(data, dict) else None
        if isinstance(rows, list) and rows and "forward_samples_s" in rows[0] and "environment" in data:
            out[path.name] = data
    return out


def ratio_table(result: dict, factor: float = 3.0) -> str:
    """Each linear-time mechanism's median forward time over SDPA's (causal over causal) at every N, as text
    for an 80-column page; ``*`` marks the entries whose samples spread by more than ``factor``."""
    ns, fwd = bench.series(result, "forward_s")
    noisy = noisy_records(result, factor)
    lines = [f"{'median time / SDPA':18s}" + "".join(f"{n:>9d}" for n in ns)]
    for name, ys in fwd.items():
        if name.startswith(("softmax", "moh")):
            continue
        base = fwd["softmax_causal" if name.endswith("_causal") else "softmax"]
        cells = [
            f"{y / b:8.2f}{'*' if (name, n) in noisy else ' '}" if y == y else f"{'-':>9s}"
            for n, y, b in zip(ns, ys, base, strict=True)
        ]
        lines.append(f"{name:18s}" + "".join(cells))
    return "\n".join(lines)


def best_head_shares(result: Race, tokens: torch.Tensor) -> dict[str, list[float]]:
    """For every mechanism and seed, the mean over the sequences ``tokens`` of each sequence's best head's
    :func:`lookup_share` (the largest share among the heads, per sequence; not one head for all of them).

    Needs the trained models (``race(..., keep_models=True)``); ``tokens`` are recall sequences of the race's
    task (B, N).
    """
    check_instance(result, "result", Race, name="best_head_shares", what="a Race")
    out = {}
    for name, curves in result.curves.items():
        models = [c.model for c in curves]
        check_found([m for m in models if m is not None], "result", name="best_head_shares",
                    expected="keep its models (race(..., keep_models=True))", got=f"none for {name!r}",
                    minimum=len(models))  # fmt: skip
        out[name] = [lookup_share(m, tokens, result.task).max(-1).values.mean().item() for m in models]
    return out


def operator_counts(result: Race, tokens: torch.Tensor, target: torch.Tensor) -> dict[str, int]:
    """:func:`operator_count` of one training step of each mechanism's first trained model."""
    check_instance(result, "result", Race, name="operator_counts", what="a Race")
    return {name: operator_count(curves[0].model, tokens, target) for name, curves in result.curves.items()}


def race_table(result: Race, shares: dict[str, Sequence[float]], ops: dict[str, int]) -> str:
    """The race's numbers as text for an 80-column page: final held-out accuracy (mean, lowest and highest
    seed), mean steps to 90 % (:meth:`Race.mean_steps_to`), the best head's lookup share (mean over seeds),
    milliseconds per training step (median over seeds) and tensor operations per step."""
    lines = [
        "           final accuracy      steps   lookup   ms per   ops per",
        "           mean  (low..high)   to 90%  share    step     step",
    ]
    for m in result.mechanisms:
        s = result.summary(m)
        share = statistics.fmean(shares[m])
        lines.append(
            f"{m:8s}  {s.mean:5.3f} ({s.low:.2f}..{s.high:.2f}) {result.mean_steps_to(m):7.0f}"
            f"  {share:6.2f} {s.step_ms:8.1f} {ops[m]:9d}"
        )
    return "\n".join(lines)


def router_rows(layer: MoHAttention) -> int:
    """Rows of a :class:`~attnbook.MoHAttention` router, each a C-wide dot product per token.

    ``E`` scores of the routed heads (``wg``), 2 for the two-stage weighting (``wg_0``, when the layer has
    shared and routed heads) and ``h_s`` weights of the shared heads (``wg_1``, only when ``h_s > 1``: a
    single shared head needs no router). The router costs about ``2 N C`` FLOPs per row.
    """
    check_instance(layer, "layer", MoHAttention, name="router_rows", what="a MoHAttention")
    return sum(getattr(layer, n).out_features for n in ("wg", "wg_0", "wg_1") if hasattr(layer, n))


#: The studies of ``benchmarks/results/claims/<study>_cpu_recorded.json`` that :func:`claim_numbers` reads.
CLAIMS_RECORDINGS = ("listops", "heads", "moh", "lookup")


def claim_numbers(recorded: dict[str, dict | None]) -> dict[str, float]:
    """The recorded numbers of the papers' claims that chapter 6 quotes, by a readable name.

    ``recorded`` maps ``"listops"``, ``"heads"``, ``"moh"``, ``"lookup"`` (the studies of
    ``benchmarks/results/claims/``, :func:`attnbook.lab.recordings.load`) and ``"writing"``
    (``benchmarks/results/ch07/generation_cpu_float32_recorded.json``) to their recordings, or None where absent;
    the names of an absent recording are left out. Names: ``"listops <variant>"`` (mean held-out accuracy) with
    ``"listops <variant> low"`` / ``"high"``, ``"listops chance"``, ``"listops majority"``; ``"heads <variant>
    D=<D>"`` (accuracy) and ``"rank <variant> D=<D>"`` (a trained head's effective rank, mean over seeds);
    ``"moh <fraction>"`` (accuracy with that share of the heads active), ``"moh softmax"``, ``"moh mha_<h>"`` (plain
    attention with only h heads, the control), the same with `` lookups=<n>`` for the other numbers of look-ups
    (MoH and softmax); ``"lookup <kind> <mechanism> <n>x<D>"`` (the lookup share, ``kind`` ``rescaled low`` /
    ``rescaled high`` / ``trained``);
    ``"writing ratio"`` (softmax's per-token step over linear attention's at the last position, the first decoder
    recorded) and ``"writing t"`` (that position).
    """
    out: dict[str, float] = {}
    listops = recorded.get("listops")
    if listops:
        for name, s in listops["summary"].items():
            out[f"listops {name}"] = s["mean"]
            out[f"listops {name} low"], out[f"listops {name} high"] = s["low"], s["high"]
        out["listops chance"], out["listops majority"] = listops["chance"], listops["majority"]
    heads = recorded.get("heads")
    if heads:
        for row in heads["rows"]:
            key = f"{row['variant']} D={row['head_dim']}"
            out[f"heads {key}"] = row["accuracy"]["mean"]
            out[f"rank {key}"] = statistics.fmean(row["rank_trained"])
    moh = recorded.get("moh")
    if moh:
        for row in moh["curve"]:
            out[f"moh {row['fraction']:g}"] = row["accuracy"]["mean"]
        out["moh softmax"] = moh["softmax"]["accuracy"]["mean"]
        for row in moh.get("fewer_heads", []):  # the control: plain attention with only that many heads
            out[f"moh {row['variant']}"] = row["accuracy"]["mean"]
        for n_queried, study in moh.get("lookups", {}).items():
            for row in study["curve"]:
                out[f"moh {row['fraction']:g} lookups={n_queried}"] = row["accuracy"]["mean"]
            out[f"moh softmax lookups={n_queried}"] = study["softmax"]["accuracy"]["mean"]
    lookup = recorded.get("lookup")
    if lookup:
        for demo in lookup["demos"]:
            shape = f"{demo['n_tokens']}x{demo['dim']}"
            for m, values in demo["rescaled"].items():
                out[f"lookup rescaled low {m} {shape}"] = min(values)
                out[f"lookup rescaled high {m} {shape}"] = max(values)
            for m, value in demo["trained"].items():
                out[f"lookup trained {m} {shape}"] = value
    writing = recorded.get("writing")
    if writing:
        first = writing["config"]["decoders"][0]
        out["writing ratio"] = writing["summary"][first]["softmax_over"]["linear"]
        out["writing t"] = max(writing["config"]["positions"])
    return out


def claims_summary(numbers: dict[str, float]) -> str:
    """The recorded tests of the papers' claims (:func:`claim_numbers`) as text for an 80-column page."""
    lines = []
    if "listops softmax" in numbers:
        lines.append(
            f"ListOps, held-out accuracy (chance {numbers['listops chance']:.2f},"
            f" majority class {numbers['listops majority']:.3f}):"
        )
        names = [k.removeprefix("listops ") for k in numbers if k.startswith("listops ") and k.count(" ") == 1]
        names = [n for n in names if n not in ("chance", "majority")]
        for n in names:
            lo, hi = numbers[f"listops {n} low"], numbers[f"listops {n} high"]
            lines.append(f"  {n:20s} {numbers[f'listops {n}']:.3f} ({lo:.3f}-{hi:.3f})")
    widths = sorted({int(k.split("D=")[1]) for k in numbers if k.startswith("heads ")})
    if widths:
        lines.append("Recall with heads of width D (C = 32): accuracy (rank of a trained head)")
        variants = list(dict.fromkeys(k.split()[1] for k in numbers if k.startswith("heads ")))
        lines.append(f"  {'D':>3s}" + "".join(f"{v:>16s}" for v in variants))
        for d in widths:
            cells = [
                f"{numbers[f'heads {v} D={d}']:.3f} ({numbers[f'rank {v} D={d}']:.2f})"
                if f"heads {v} D={d}" in numbers
                else "-"
                for v in variants
            ]
            lines.append(f"  {d:>3d}" + "".join(f"{c:>16s}" for c in cells))
    fractions = sorted(float(k.split()[1]) for k in numbers if k.startswith("moh ") and k.count(" ") == 1
                       and k.split()[1][0].isdigit())  # fmt: skip
    if fractions:
        lines.append("MoH, 3-key recall: accuracy against the share of heads a token uses")
        cells = [f"{100 * f:.0f} %: {numbers[f'moh {f:g}']:.3f}" for f in fractions]
        lines.append("  " + "   ".join(cells) + f"   softmax: {numbers['moh softmax']:.3f}")
        fewer = sorted((int(k.split("_")[1]), v) for k, v in numbers.items() if k.startswith("moh mha_"))
        if fewer:
            heads = ", ".join(str(h) for h, _ in fewer)
            lines.append(f"  plain attention with only {heads} heads: " + ", ".join(f"{v:.3f}" for _, v in fewer))
        for n in sorted({k.split("lookups=")[1] for k in numbers if "lookups=" in k}, key=int):
            best = max(v for k, v in numbers.items() if k.endswith(f"lookups={n}") and "softmax" not in k)
            lines.append(f"  {n} look-ups: MoH at most {best:.3f}, softmax {numbers[f'moh softmax lookups={n}']:.3f}")
    return "\n".join(lines) if lines else "no recordings here (clone the repository to see them)"


def advice_rows(
    result: Race,
    shares: dict[str, Sequence[float]],
    *,
    time_slopes: dict[str, float],
    memory_slopes: dict[str, float],
    crossovers: dict[str, int | None],
    lengths: Sequence[int],
    layer_ratios: Sequence[float],
    numbers: dict[str, float],
) -> list[list[str]]:
    """The rows of chapter 6's table "which mechanism when": mechanism, what this page measured, the paper's
    claim and whether it shows at this size, and the advice that follows.

    Args:
        result, shares: the race and :func:`best_head_shares`.
        time_slopes: log-log slope of the recorded forward time per mechanism.
        memory_slopes: log-log slope of the live forward peak memory per mechanism.
        crossovers, lengths: :func:`crossovers` of the recording and the lengths it measured.
        layer_ratios: the MoH layer's time over a softmax layer's at every length measured (live).
        numbers: :func:`claim_numbers` of the recordings, with chapter 8's recall study
            (:func:`attnbook.lab.recall.numbers`); names absent there are said to be absent.
    """

    def num(key: str, fmt: str = ".3f") -> str:
        return format(numbers[key], fmt) if key in numbers else "(not recorded here)"

    lo, hi = min(layer_ratios), max(layer_ratios)
    layer = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}x to {hi:.2f}x"

    def measured(m: str) -> str:
        s = result.summary(m)
        recall = (
            f"recall {s.mean:.2f} ({s.low:.2f}-{s.high:.2f}), 90 % after {result.mean_steps_to(m):.0f} steps,"
            f" lookup share {statistics.fmean(shares[m]):.2f}; {_recalled(numbers, m)}"
        )
        if m not in time_slopes:
            return f"a layer {layer} a softmax layer's time over the lengths measured; {recall}"
        cost = f"time ~ N<sup>{time_slopes[m]:.1f}</sup>, memory ~ N<sup>{memory_slopes[m]:.1f}</sup>"
        if m != "softmax":
            cost += f", faster than SDPA {describe_crossover(crossovers.get(m), lengths)} (CPU)"
        return f"{cost}; {recall}"

    found = sorted(n for n in crossovers.values() if n is not None)
    crossing = (
        "at every length measured (no crossover"
        if not found
        else f"below N = {found[0]}" + ("" if found[0] == found[-1] else f" to {found[-1]}") + " (the crossovers"
    )
    rows = {  # built only for the mechanisms that raced
        "softmax": lambda: [
            f"{measured('softmax')}; ListOps {num('listops softmax')}",
            "the baseline of every paper",
            "the default: exact, the sharpest lookups, one fused kernel; on this CPU the quickest"
            f" {crossing}; on a GPU expected later, not measured)",
        ],
        "linear": lambda: [
            f"{measured('linear')}; ListOps {num('listops linear')}; writing a token at t = {num('writing t', '.0f')}:"
            f" {num('writing ratio', '.1f')}x quicker than softmax (chapter 7)",
            "Katharopoulos et al. (2020): generation up to 4000x faster (long sequences, GPU); here"
            f" {num('writing ratio', '.1f')}x at t = {num('writing t', '.0f')}",
            "long sequences; writing with a state of fixed size; accepts a softer lookup",
        ],
        "flow": lambda: [
            f"{measured('flow')}; ListOps {num('listops flow')}, without competition"
            f" {num('listops flow_no_competition')}, without allocation {num('listops flow_no_allocation')}",
            "Wu et al. (2022): ListOps 38.70 against linear 16.13 and softmax 36.37 (LRA), and competition and"
            " allocation each help (the LRA average): not reproduced at 16-48 tokens (no gap between any two"
            " mechanisms, no ablation outside the seeds' spread)",
            "the paper's claim: long sequences where linear attention loses quality; on this page no better"
            " than linear attention, and slower to learn a lookup",
        ],
        "mobile": lambda: [
            f"{measured('mobile')}; recall with heads of D = 2: {num('heads mobile D=2')} against linear's"
            f" {num('heads linear D=2')}; no causal form",
            "Yao et al. (2024): competition across heads keeps small heads useful: reproduced at D = 2"
            f" (head rank {num('rank mobile D=2', '.2f')} against {num('rank linear D=2', '.2f')}); the controls,"
            f" linear with sigmoid features {num('heads linear_sigmoid D=2')} and Flow {num('heads flow D=2')},"
            " say it is the competition",
            f"many small heads (at D = 4 recall {num('heads mobile D=4')} against linear's"
            f" {num('heads linear D=4')}); non-causal models only; the most operations per step on short inputs."
            " The paper built it for vision transformers on phones (its claim, not tested here)",
        ],
        "moh": lambda: [
            f"{measured('moh')}; 3-key recall with 50 % of the heads {num('moh 0.5')}, 25 % {num('moh 0.25')},"
            f" all {num('moh 1')}; plain attention with only 2 heads {num('moh mha_2')}",
            "Jin et al. (2024): the quality of all heads from 50-90 % of them: reproduced from 50 % (not at 25 %),"
            " but no better than a plain layer with that many heads",
            f"a per-token choice of heads; on this page no gain over fewer heads, and no time saved ({layer} a"
            " softmax layer's time): that needs a kernel that runs each head on its own tokens only (chapter 5)",
        ],
    }
    raced = [[f"<b>{m}</b>", *rows[m]()] for m in result.mechanisms if m in rows]
    return raced + _recall_rows(numbers)


# Chapter 8's mechanisms (causal only, so not in the race): the paper's claim, and what the recall study showed.
_CHAPTER_8 = {  # the papers are in chapter 8's references
    "decay": ("Sun et al. (2023, chapter 8), RetNet: a fixed decay per head trains in parallel and generates at a"
              " fixed cost per token, with a Transformer's quality at scale (its claim, not tested here)",
              "causal models where recent tokens matter more than old ones (chapter 8's derivation; the recall task"
              " asks for every pair equally)"),
    "gated": ("Yang et al. (2024, chapter 8), GLA: a decay chosen by the data, per key dimension, with fast chunked"
              " training (its claim, not tested here)",
              "causal models that must choose what to forget; its chunks cost the most arithmetic (chapter 8)"),
    "delta": ("Schlag et al. (2021) and Yang et al. (2024, chapter 8), DeltaNet: a write that first corrects what the"
              " state holds for its key recalls more than linear attention's sum (its claim, on multi-query"
              " associative recall)",
              "causal models that must recall many facts from a state of fixed size, where the state has room"
              " for them"),
}  # fmt: skip


def _recall_widths(numbers: dict[str, float], m: str) -> list[int]:
    """The widths at which the recall study (in ``numbers``, :func:`attnbook.lab.recall.numbers`) has ``m``."""
    return sorted(int(k.split()[2]) for k in numbers if k.startswith(f"recall {m} ") and len(k.split()) == 3)


def _recalled(numbers: dict[str, float], m: str) -> str:
    """What the recall study says of ``m``: its mean recall of the most pairs at every width."""
    widths = _recall_widths(numbers, m)
    if not widths:
        return "recall of many pairs (chapter 8) (not recorded here)"
    at = ", ".join(f"{numbers[f'recall {m} {w}']:.2f} at width {w}" for w in widths)
    return f"recall of {numbers['recall pairs']:.0f} pairs (chapter 8) {at}"


def _recall_rows(numbers: dict[str, float]) -> list[list[str]]:
    """The rows of chapter 8's mechanisms, where the recall study is in ``numbers``: each compared with linear
    attention (the same state size) at every width studied, "more" or "less" only where the seeds' ranges do not
    overlap."""
    rows = []
    for m, (claim, use) in _CHAPTER_8.items():
        widths = [w for w in _recall_widths(numbers, m) if f"recall linear {w}" in numbers]
        if not widths:
            continue
        said = []
        for w in widths:
            ours, linear = f"recall {m} {w}", f"recall linear {w}"
            if numbers[f"{ours} low"] > numbers[f"{linear} high"]:
                than = "more than"
            elif numbers[f"{ours} high"] < numbers[f"{linear} low"]:
                than = "less than"
            else:
                than = "within the seeds' spread of"  # the ranges overlap, if only at their ends
            said.append(f"{than} linear attention at width {w} ({numbers[ours]:.2f} against {numbers[linear]:.2f},"
                        f" seeds {numbers[f'{ours} low']:.2f}-{numbers[f'{ours} high']:.2f} against"
                        f" {numbers[f'{linear} low']:.2f}-{numbers[f'{linear} high']:.2f})")  # fmt: skip
        measured = f"causal only, a state of H D<sup>2</sup> numbers, as linear attention's; {_recalled(numbers, m)}"
        rows.append([f"<b>{m}</b>", measured, claim, f"{use}; here it recalled " + ", and ".join(said)])
    return rows


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain HTML table (it renders on the website, in Jupyter and in Colab): ``IPython.display.HTML(...)``."""

    def line(tag: str, cells: Sequence[str]) -> str:
        return "<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>"

    return "<table>" + line("th", header) + "".join(line("td", r) for r in rows) + "</table>"


def slopes_table(result: dict) -> str:
    """A :func:`~attnbook.lab.bench.run_benchmark` result summarised per mechanism, as text for an 80-column
    page: the log-log slope of the forward time, of the forward+backward time and of the forward peak memory
    against N, the forward+backward time over the forward time at the longest N, and where the mechanism
    overtakes SDPA (:func:`crossovers`). A dash where the result did not measure it; the MoH layers are left
    out (they are compared with a whole softmax layer)."""
    ns = list(result["config"]["lengths"])
    got = {}
    for metric in BENCHMARK_METRICS.values():
        if any(r.get(metric) is not None for r in result["records"]):
            got[metric] = bench.series(result, metric)[1]
    fwd, fb = got.get("forward_s", {}), got.get("forward_backward_s", {})
    cross = crossovers(result)

    def slope(metric: str, name: str) -> str:
        ys = got.get(metric, {}).get(name)
        if ys is None or sum(1 for y in ys if y == y and y > 0) < 2:
            return f"{'-':>8s}"
        return f"{bench.loglog_slope(ns, ys):8.2f}"

    lines = [f"{'':16s}{'slope of: fwd':>14s}{'fwd+bwd':>8s}{'memory':>8s}{'fwd+bwd/fwd':>13s}  faster than SDPA"]
    for name in (n for n in fwd if not n.startswith("moh")):  # the MoH layers are compared with a layer
        last = fb.get(name, [math.nan])[-1] / fwd[name][-1]
        where = describe_crossover(cross[name], ns) if name in cross else ""
        lines.append(
            f"{name:16s}{slope('forward_s', name):>14s}{slope('forward_backward_s', name)}"
            f"{slope('forward_peak_bytes', name)}{last:13.1f}  {where}".rstrip()
        )
    return "\n".join(lines)


def gpu_report_lines(report: dict) -> list[str]:
    """The GPU check's report (``benchmarks/results/gpu_check_<GPU>.json``) as a few lines of text: the device,
    the accuracy cases passed per dtype and mode (with the worst error as a fraction of the tolerance), the
    forwards free of host-device syncs, and the goals that were measured. Sections the run did not reach are
    named as not run.

    Example:
        >>> report = {"environment": {"device_name": "GPU", "torch": "2.11", "cuda": "13.0", "driver": "580"},
        ...           "sections_done": ["sync"], "sync": [{"mechanism": "linear", "passed": True}]}
        >>> print("\\n".join(gpu_report_lines(report)))
        GPU, torch 2.11, CUDA 13.0, driver 580
        accuracy: not run
        sync: 1 of 1 forwards make the host wait for nothing
        targets: not run
        benchmark: not run
    """
    check_instance(report, "report", dict, name="gpu_report_lines", what="the GPU check's report, a dict")
    e = report.get("environment", {})
    lines = [f"{e.get('device_name')}, torch {e.get('torch')}, CUDA {e.get('cuda')}, driver {e.get('driver')}"]
    done = report.get("sections_done", [])
    if "accuracy" in done:
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in report["accuracy"]:
            groups.setdefault((r["dtype"], r["compile"]), []).append(r)
        for (dtype, mode), rs in groups.items():
            ok = sum(r["passed"] for r in rs)
            worst = max(r["worst"] for r in rs)
            lines.append(f"accuracy {dtype} {mode}: {ok} of {len(rs)} pass (worst {worst:.2f} of tolerance)")
    else:
        lines.append("accuracy: not run")
    if "sync" in done:
        ok = sum(r["passed"] for r in report["sync"])
        lines.append(f"sync: {ok} of {len(report['sync'])} forwards make the host wait for nothing")
    else:
        lines.append("sync: not run")
    if "targets" in done:
        t = report["targets"]
        long, causal = t["non_causal"], t["causal"]
        sh = t["shape"]
        lines.append(f"targets ({t['dtype']}, B = {sh['B']}, H = {sh['H']}, D = {sh['D']}), times in ms:")
        lines.append(f"  {'':13s}{'N':>6s}{'time':>7s}{'SDPA':>7s}{'faster':>8s}{'floor':>7s}{'x floor':>8s}")
        for name in ("linear", "flow"):
            best = long[name]["best"]
            lines.append(
                f"  {name:13s}{long['N']:6d}{long['impls'][best]['median_s'] * 1e3:7.2f}{long['sdpa_s'] * 1e3:7.1f}"
                f"{long[name]['speedup_vs_sdpa']:7.1f}x{long['memory_floor_s'] * 1e3:7.2f}"
                f"{long[name]['times_memory_floor']:7.1f}x  {best.rsplit('_', 1)[-1]}"
            )
        best = causal["best"]
        ms, base = causal["impls"][best]["median_s"] * 1e3, causal["sdpa_causal_s"] * 1e3
        lines.append(
            f"  {'causal linear':13s}{causal['N']:6d}{ms:7.2f}{base:7.2f}{base / ms:7.2f}x{'':15s}"
            f"  {best.rsplit('_', 1)[-1]}"
        )
    else:
        lines.append("targets: not run")
    lines.append("benchmark: " + ("done" if "benchmark" in done else "not run"))
    return lines
