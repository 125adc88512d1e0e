"""The papers' claims, tested at a size a CPU can record (issue 27): ListOps, head widths, MoH's head fraction.

Four small experiments, each a function a chapter can call at ``ATTNBOOK_FAST=1`` size (seconds to a minute
on one CPU thread) and ``benchmarks/bench_claims.py`` records at a larger size:

* :func:`compare` on :class:`ListOpsTask` -- Flowformer's Long Range Arena claim (Wu et al., ICML 2022):
  ListOps accuracy of softmax, linear, Flow-Attention, Flow-Attention without competition or without
  allocation (its ablation), Mobile-Attention and MoH, several seeds, against chance (1/10 and the
  majority class);
* :func:`head_width_study` -- Mobile-Attention's claim (Yao et al., ICML 2024): at small head widths D,
  multi-head linear attention's heads become trivial and competition across heads fixes that. Same total
  width C, D = 2, 4, 8 (H = C / D), linear against mobile: how much each head's output varies across
  queries (:func:`head_stats`) at initialisation and after training, and the accuracy on associative recall;
* :func:`moh_study` -- MoH's claim (Jin et al. 2024): the quality of multi-head attention with a fraction of
  the heads active per token. Accuracy against that fraction on :class:`MultiKeyRecallTask`, a task that is
  easy with one head per looked-up fact;
* :func:`lookup_share_demo` -- why chapter 6's trained models put most of a query's weight on the right
  fact when chapters 2 and 3 show elu + 1 and Flow-Attention staying flat under any rescaling of q and k.

Every comparison follows chapter 6's race (:mod:`attnbook.lab.headtohead`): the same seed gives every
mechanism the same initialisation seed, training batches and held-out set; for each seed the mechanisms run
one after another, so that a slow spell of a shared machine falls on all of them; results report every
seed, the mean, the lowest and highest and the standard deviation (:class:`~attnbook.lab.headtohead.Summary`).

A mechanism here is a :class:`Variant`: a registry name and the keyword arguments of its module, so that an
ablation (Flow-Attention with ``competition=False``) is one more entry of :data:`VARIANTS`, built through
``MECHANISMS[name].module(dim, n_heads, **kwargs)`` like every other. :func:`available` says whether the
installed package accepts a variant's arguments.

Padding. ListOps expressions have different lengths and are padded with PAD to one length; every layer gets
``key_padding_mask`` (True = padding, as in ``nn.MultiheadAttention``), so a padded position takes no part in
attention (for Flow- and Mobile-Attention: it sends and receives no flow), and the pooled readout ignores it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from .. import config, mechanisms
from .._checks import (
    check_bool,
    check_choice,
    check_count,
    check_dims,
    check_divisible,
    check_instance,
    check_int,
    check_number,
    check_sequence,
    check_tensor,
)
from .._module import ProjectedAttention
from ..moh import MoHAttention, moh_load_balancing_loss
from ..softmax import SoftmaxAttention
from . import training
from .headtohead import RecallEmbedding, RecallTask, Summary, _seeds, _summary
from .listops import ListOps, label_distribution

__all__ = [
    "Variant",
    "VARIANTS",
    "LISTOPS_VARIANTS",
    "HEADS_VARIANTS",
    "available",
    "mha_variant",
    "moh_variant",
    "ListOpsTask",
    "MultiKeyRecallTask",
    "MultiKeyRecallEmbedding",
    "Setup",
    "Classifier",
    "Run",
    "Comparison",
    "train",
    "compare",
    "HeadStats",
    "head_stats",
    "HeadWidthStudy",
    "head_width_study",
    "MoHStudy",
    "moh_study",
    "LookupShareDemo",
    "lookup_share_demo",
    "LISTOPS_SMALL",
    "LISTOPS_RECORDED",
    "LISTOPS_TASK_SMALL",
    "LISTOPS_TASK_RECORDED",
    "HEADS_SMALL",
    "HEADS_RECORDED",
    "HEADS_TASK",
    "MOH_SMALL",
    "MOH_RECORDED",
    "MOH_TASK",
    "MOH_SPLITS",
    "listops_sizes",
    "heads_sizes",
    "moh_sizes",
    "FLOWFORMER_PAPER",
    "effective_rank",
    "accuracy_spans",
    "listops_table",
    "head_width_spans",
    "head_width_table",
]

# ----------------------------------------------------------------------------------------------------------
# Mechanisms and their ablations


@dataclass(frozen=True)
class Variant:
    """A mechanism of the registry with fixed module arguments: ``MECHANISMS[mechanism].module(dim, H, **kw)``.

    Attributes:
        name: the key in results, e.g. ``"flow_no_competition"``.
        mechanism: a registry name (its colour in figures).
        options: the module's keyword arguments, as (name, value) pairs.
        title: what a table calls it.
    """

    name: str
    mechanism: str
    options: tuple[tuple[str, object], ...] = ()
    title: str = ""
    heads: int | None = None

    def build(self, dim: int, n_heads: int) -> nn.Module:
        """The self-attention layer ``layer(x)``, x (B, N, dim) -> (B, N, dim). With ``heads``: only that many heads
        of the width dim / n_heads (a narrower attention, as many heads as a token of MoH activates). The
        no-attention baseline (:data:`~attnbook.lab.training.NO_ATTENTION`) has no layer: it adds zeros."""
        if self.mechanism == training.NO_ATTENTION:
            return training.Classifier(training.NO_ATTENTION, vocab=1, length=1, n_classes=1, d_model=dim,
                                       n_heads=n_heads, n_layers=1).blocks[0].attn  # fmt: skip
        if self.heads is not None:
            width = self.heads * (dim // n_heads)
            return SoftmaxAttention(dim, width, dim, self.heads, drop_out=0.0, **dict(self.options))
        return mechanisms.get(self.mechanism).module(dim, n_heads, **dict(self.options))


#: The mechanisms and ablations the studies train, by name: a registry mechanism and its keyword settings.
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("softmax", "softmax", title="softmax"),
        Variant("linear", "linear", title="linear (elu + 1)"),
        Variant("flow", "flow", title="Flow-Attention"),
        Variant("flow_no_competition", "flow", (("competition", False),), "Flow, no competition (c_j = 1)"),
        Variant("flow_no_allocation", "flow", (("allocation", False),), "Flow, no allocation (a_i = 1)"),
        Variant("mobile", "mobile", title="Mobile-Attention"),
        Variant("moh", "moh", title="MoH (registry split)"),
        Variant(training.NO_ATTENTION, training.NO_ATTENTION, title="no attention"),
        Variant("linear_sigmoid", "linear", (("feature_map", torch.sigmoid),), "linear (sigmoid features)"),
    )
}
#: The mechanisms of the ListOps comparison, in the order they alternate (the no-attention baseline last).
LISTOPS_VARIANTS = ("softmax", "linear", "flow", "flow_no_competition", "flow_no_allocation", "mobile", "moh",
                    training.NO_ATTENTION)  # fmt: skip
#: The head-width study's mechanisms: Mobile-Attention's competition against linear attention with its own
#: (elu + 1) and with Mobile's (sigmoid) features, and against Flow-Attention's sequence-wise flows.
HEADS_VARIANTS = ("linear", "linear_sigmoid", "flow", "mobile")


def mha_variant(heads: int) -> Variant:
    """Plain multi-head softmax attention with only ``heads`` heads (of the study's head width): the control that
    tells MoH's routing apart from simply having fewer heads."""
    h = check_int(heads, "heads", name="mha_variant", minimum=1)
    return Variant(f"mha_{h}", "softmax", title=f"softmax, {h} heads", heads=h)


def moh_variant(shared_head: int, routed_head: int) -> Variant:
    """MoH with ``shared_head`` shared heads and ``routed_head`` routed heads per token."""
    s = check_int(shared_head, "shared_head", name="moh_variant", minimum=0)
    k = check_int(routed_head, "routed_head", name="moh_variant", minimum=0)
    return Variant(f"moh_s{s}_k{k}", "moh", (("shared_head", s), ("routed_head", k)), f"MoH {s} shared + {k} routed")


def _variant(spec, name: str) -> Variant:
    if isinstance(spec, Variant):
        return spec
    return VARIANTS[check_choice(spec, "variant", tuple(VARIANTS), name=name)]


def available(variant: str | Variant, dim: int = 8, n_heads: int = 2) -> bool:
    """Whether the installed package builds ``variant`` (an ablation needs its module arguments) at this size.

    Only a ``TypeError`` (an argument the module does not take) counts as unavailable; a size the variant cannot
    have (MoH with more shared heads than heads) raises its ``ValueError``.
    """
    v = _variant(variant, "available")
    try:
        v.build(dim, n_heads)
    except TypeError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------------
# Tasks


@dataclass(frozen=True)
class _Batch:
    tokens: torch.Tensor  # (B, N) long
    target: torch.Tensor  # (B,) long
    padding: torch.Tensor | None  # (B, N) bool, True = PAD, or None


@dataclass(frozen=True)
class ListOpsTask:
    """ListOps expressions (:class:`attnbook.lab.listops.ListOps`) padded to ``spec.max_length``; read out by a
    mean over the real tokens. Chance: 1/10, and the majority class of the held-out labels."""

    spec: ListOps = ListOps()

    def __post_init__(self):
        check_instance(self.spec, "spec", ListOps, name="ListOpsTask", what="a ListOps")

    vocab = property(lambda self: self.spec.vocab)
    length = property(lambda self: self.spec.max_length)
    n_classes = property(lambda self: self.spec.n_classes)
    chance = property(lambda self: self.spec.chance)
    pool = "mean"

    def batch(self, size: int, generator: torch.Generator, device: torch.device | str = "cpu") -> _Batch:
        b = self.spec.batch(size, generator, device, length=self.spec.max_length)
        return _Batch(b.tokens, b.target, b.padding)

    def embedding(self, d_model: int) -> nn.Module | None:
        return None


@dataclass(frozen=True)
class MultiKeyRecallTask:
    """Multi-key recall: ``n_pairs`` key-value facts, then one query naming ``n_queried`` of their keys
    (k_1, ..., k_q), in order; the target is their values in that order, ``(v_1, ..., v_q)``, one class of
    ``n_values ** n_queried`` (the number ``v_1 n^(q-1) + ... + v_q``).

    Why several heads matter: the query must read q facts *and keep them apart*. A softmax head makes one
    weighted average of the values; weighting q facts alike gives their unordered set, from which the order
    cannot be told. One head per key makes each lookup a clean copy. (A single head could still separate
    them by weighting the facts unequally and decoding the mixture: heads make the task easy, not possible.)
    Each correct lookup pins one digit of the target, so a model that has learned some lookups is rewarded
    before it has learned all (a target such as their sum mod n would not be). Chance: ``1 / n_values ** q``.

    Tokens ``0 .. n_keys * n_values - 1`` are facts (``k * n_values + v``), then one query token per tuple of
    keys (``n_facts + k_1 n_keys^(q-1) + ... + k_q``).
    """

    n_pairs: int = 6
    n_keys: int = 12
    n_values: int = 3
    n_queried: int = 2

    def __post_init__(self):
        name = "MultiKeyRecallTask"
        check_int(self.n_queried, "n_queried", name=name, minimum=1)
        why = " (n_queried: the query names distinct facts)"
        check_int(self.n_pairs, "n_pairs", name=name, minimum=self.n_queried, why=why)
        check_int(self.n_values, "n_values", name=name, minimum=2)
        why = " (n_pairs: the keys of a sequence are distinct)"
        check_int(self.n_keys, "n_keys", name=name, minimum=self.n_pairs, why=why)

    vocab = property(lambda self: self.n_keys * self.n_values + self.n_keys**self.n_queried)
    length = property(lambda self: self.n_pairs + 1)
    n_classes = property(lambda self: self.n_values**self.n_queried)
    chance = property(lambda self: 1.0 / self.n_values**self.n_queried)
    pool = "last"

    def batch(self, size: int, generator: torch.Generator, device: torch.device | str = "cpu") -> _Batch:
        """Tokens (size, P + 1) and targets (size,)."""
        name = "MultiKeyRecallTask.batch"
        size = check_int(size, "size", name=name, minimum=1)
        check_instance(generator, "generator", torch.Generator, name=name, what="a torch.Generator")
        P, q = self.n_pairs, self.n_queried
        keys = torch.rand(size, self.n_keys, generator=generator).argsort(dim=-1)[:, :P]  # (size, P) distinct
        values = torch.randint(self.n_values, (size, P), generator=generator)  # (size, P)
        pick = torch.rand(size, P, generator=generator).argsort(dim=-1)[:, :q]  # (size, q) distinct facts
        asked, answer = keys.gather(1, pick), values.gather(1, pick)  # (size, q) each
        key_place = self.n_keys ** torch.arange(q - 1, -1, -1)  # (q,): n_keys^(q-1) .. 1
        value_place = self.n_values ** torch.arange(q - 1, -1, -1)  # (q,)
        query = self.n_keys * self.n_values + (asked * key_place).sum(1, keepdim=True)  # (size, 1)
        tokens = torch.cat([keys * self.n_values + values, query], dim=1)  # (size, P + 1)
        target = (answer * value_place).sum(1)  # (size,)
        return _Batch(tokens.to(device), target.to(device), None)

    def fields(self, tokens: torch.Tensor):
        """``(key, value, asked, is_query)``: ``key``, ``value``, ``is_query`` (B, N) as in chapter 6 (a query's
        key is its first asked key, its value 0), ``asked`` (B, N, q) the keys a query names (0 for a fact)."""
        n_facts = self.n_keys * self.n_values
        is_query = tokens >= n_facts
        code = (tokens - n_facts).clamp_min(0)  # (B, N)
        place = self.n_keys ** torch.arange(self.n_queried - 1, -1, -1, device=tokens.device)  # (q,)
        asked = (code.unsqueeze(-1) // place) % self.n_keys * is_query.unsqueeze(-1)  # (B, N, q)
        key = torch.where(is_query, asked[..., 0], tokens // self.n_values)
        value = torch.where(is_query, torch.zeros_like(tokens), tokens % self.n_values)
        return key, value, asked, is_query

    def embedding(self, d_model: int) -> nn.Module:
        return MultiKeyRecallEmbedding(self, d_model)


class MultiKeyRecallEmbedding(nn.Module):
    """``key[k] + value[v] + role[fact]`` for a fact; ``slot_1[k_1] + ... + slot_q[k_q] + role[query]`` for a
    query, ``slot_1`` being the facts' key table (the first asked key shares its embedding with its fact, as
    in :class:`~attnbook.lab.headtohead.RecallEmbedding`); the other slots have tables of their own, so that
    the lookups can be told apart.
    """

    def __init__(self, task: MultiKeyRecallTask, d_model: int):
        super().__init__()
        name = "MultiKeyRecallEmbedding"
        check_instance(task, "task", MultiKeyRecallTask, name=name, what="a MultiKeyRecallTask")
        d_model = check_int(d_model, "d_model", name=name, minimum=1)
        self.task = task
        self.key = nn.Embedding(task.n_keys, d_model)
        self.slots = nn.ModuleList(nn.Embedding(task.n_keys, d_model) for _ in range(task.n_queried - 1))
        self.value = nn.Embedding(task.n_values, d_model)
        self.role = nn.Embedding(2, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        key, value, asked, is_query = self.task.fields(tokens)  # (B, N) x 3, (B, N, q)
        q = is_query.unsqueeze(-1).to(self.value.weight.dtype)  # (B, N, 1)
        x = self.key(key) + (1 - q) * self.value(value) + self.role(is_query.long())  # (B, N, d)
        for i, slot in enumerate(self.slots, start=1):
            x = x + q * slot(asked[..., i])
        return x


@dataclass(frozen=True)
class _Recall:
    """Chapter 6's :class:`RecallTask` in this module's task interface (read out at the query)."""

    task: RecallTask
    pool = "last"

    vocab = property(lambda self: self.task.vocab)
    length = property(lambda self: self.task.length)
    n_classes = property(lambda self: self.task.n_values)
    chance = property(lambda self: self.task.chance)

    def batch(self, size, generator, device="cpu") -> _Batch:
        tokens, target = self.task.batch(size, generator, device)
        return _Batch(tokens, target, None)

    def embedding(self, d_model: int) -> nn.Module:
        return RecallEmbedding(self.task, d_model)


_TASKS = (ListOpsTask, MultiKeyRecallTask, _Recall)


def _task_setup(task, setup, sizes, name: str) -> tuple:
    """``(task, setup)`` of a study: ``sizes()`` when ``task`` is None (a ``setup`` given replaces its setup),
    else ``task`` in this module's task interface and ``setup`` (default ``Setup()``)."""
    if task is None:
        task, default = sizes()
        setup = default if setup is None else setup
    if isinstance(task, RecallTask):
        task = _Recall(task)
    elif isinstance(task, ListOps):
        task = ListOpsTask(task)
    what = "a ListOpsTask (or ListOps), a MultiKeyRecallTask or a RecallTask"
    check_instance(task, "task", _TASKS, name=name, what=what)
    return task, Setup() if setup is None else check_instance(setup, "setup", Setup, name=name, what="a Setup")


def _config(task) -> dict:
    inner = task.task if isinstance(task, _Recall) else task
    spec = asdict(inner.spec) if isinstance(inner, ListOpsTask) else asdict(inner)
    return {"kind": type(inner).__name__, **spec, "chance": task.chance, "n_classes": task.n_classes}


# ----------------------------------------------------------------------------------------------------------
# The model and its training


@dataclass(frozen=True)
class Setup:
    """Model sizes and training schedule, shared by every mechanism of a comparison.

    Attributes:
        d_model, n_heads, n_layers: the :class:`Classifier`.
        batch, steps: sequences per step (freshly generated), optimiser steps.
        lr: AdamW's peak learning rate: ``warmup`` linear steps up to it, then a cosine down to ``lr / 10``.
        weight_decay: AdamW's decoupled weight decay.
        clip: the gradient norm is clipped to this.
        eval_every, eval_size: held-out accuracy every ``eval_every`` steps (and at 0 and at the end) on a
            fixed set of ``eval_size`` sequences.
        moh_balance: beta of MoH's load-balancing loss (the MoH paper's 0.01), added for MoH layers with
            routed heads.
    """

    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    batch: int = 32
    steps: int = 150
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.01
    clip: float = 1.0
    eval_every: int = 25
    eval_size: int = 256
    moh_balance: float = 0.01

    def __post_init__(self):
        name = "Setup"
        for arg in ("d_model", "n_heads", "n_layers", "batch", "steps", "eval_every", "eval_size"):
            check_int(getattr(self, arg), arg, name=name, minimum=1)
        check_int(self.warmup, "warmup", name=name, minimum=0)
        check_divisible(self.d_model, self.n_heads, name=name, total_arg="d_model", parts_arg="n_heads")
        check_number(self.lr, "lr", name=name, minimum=0.0, strict_minimum=True)
        check_number(self.weight_decay, "weight_decay", name=name, minimum=0.0)
        check_number(self.clip, "clip", name=name, minimum=0.0, strict_minimum=True)
        check_number(self.moh_balance, "moh_balance", name=name, minimum=0.0)

    def learning_rate(self, step: int) -> float:
        """Linear warm-up to ``lr``, then a cosine to ``lr / 10`` at the last step (``step`` from 0)."""
        return training.Optim(self.lr, self.weight_decay, warmup=self.warmup).learning_rate(step, self.steps)


class Classifier(training.Classifier):
    """:class:`attnbook.lab.training.Classifier` with the attention of a :class:`Variant`.

    Args:
        variant: a :class:`Variant` or a name of :data:`VARIANTS`.
        vocab, length, n_classes, d_model, n_heads, n_layers, pool, embedding: as there.

    Shape:
        ``forward(tokens, padding=None)``: tokens (B, N) long, padding (B, N) bool (True = PAD) ->
        logits (B, n_classes).
    """

    def __init__(
        self,
        variant: str | Variant,
        *,
        vocab: int,
        length: int,
        n_classes: int,
        d_model: int = 32,
        n_heads: int = 4,
        n_layers: int = 2,
        pool: str = "mean",
        embedding: nn.Module | None = None,
    ):
        v = _variant(variant, "Classifier")
        n_classes = check_int(n_classes, "n_classes", name="Classifier", minimum=2)
        sizes = {"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers, "pool": pool, "embedding": embedding}
        super().__init__(v.mechanism, vocab=vocab, length=length, n_classes=n_classes, attn_options=dict(v.options),
                         **sizes)  # fmt: skip
        if v.heads is not None:  # plain attention with fewer heads than n_heads
            for block in self.blocks:
                block.attn = v.build(d_model, n_heads)
        self.variant = v


@dataclass
class Run:
    """One variant, one seed: held-out accuracy and loss at every evaluation, and the training time.

    ``wall_s`` counts training only (batch generation and evaluations excluded); ``model`` is the trained
    model when :func:`train` was asked to keep it; ``majority`` is the majority-class rate of the held-out
    labels (the accuracy of always answering the commonest class).
    """

    variant: str
    mechanism: str
    seed: int
    steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    majority: float = 0.0
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[-1]

    @property
    def seconds(self) -> float:
        """Training wall time in seconds."""
        return self.wall_s[-1]

    @property
    def step_ms(self) -> float:
        return 1e3 * self.wall_s[-1] / max(self.steps[-1], 1)

    def steps_to(self, accuracy: float) -> int | None:
        """The first evaluated step at which the held-out accuracy reached ``accuracy`` (None if never)."""
        return next((s for s, a in zip(self.steps, self.accuracy, strict=True) if a >= accuracy), None)

    def to_dict(self) -> dict:
        """JSON-ready, without the model."""
        record = {f: getattr(self, f) for f in ("variant", "mechanism", "seed", "steps", "accuracy", "loss", "wall_s")}
        return {
            **record,
            "final_accuracy": self.final_accuracy,
            "final_loss": self.loss[-1],
            "majority": self.majority,
            "train_seconds": self.seconds,
        }


def _build(variant: Variant, task, setup: Setup, seed: int, device) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(
        variant,
        vocab=task.vocab,
        length=task.length,
        n_classes=task.n_classes,
        d_model=setup.d_model,
        n_heads=setup.n_heads,
        n_layers=setup.n_layers,
        pool=task.pool,
        embedding=task.embedding(setup.d_model),
    ).to(device)


def train(
    variant: str | Variant,
    task=None,
    setup: Setup | None = None,
    *,
    seed: int = 0,
    keep_model: bool = False,
    device: torch.device | str = "cpu",
) -> Run:
    """Train a :class:`Classifier` with ``variant``'s attention on ``task``; held-out accuracy against steps.

    AdamW (``setup.lr`` with warm-up and cosine, weight decay, gradient clipping) on fresh batches of
    ``setup.batch`` sequences; for MoH, ``setup.moh_balance`` times the load-balancing loss is added.
    The same seed gives every variant the same initialisation seed, the same training batches and the same
    held-out set (generator ``10_000 + seed``); different seeds differ in all three.

    Args:
        variant: a name of :data:`VARIANTS` or a :class:`Variant`.
        task: a :class:`ListOpsTask` (or a :class:`~attnbook.lab.listops.ListOps`), a :class:`MultiKeyRecallTask`
            or chapter 6's :class:`~attnbook.lab.headtohead.RecallTask`; default: :func:`listops_sizes`.
        setup: a :class:`Setup`; default: :func:`listops_sizes`'s when ``task`` is None, else ``Setup()``.
        seed: seeds the initialisation and the data.
        keep_model: keep the trained model in :attr:`Run.model` (in eval mode).
        device: where to train.

    Returns:
        a :class:`Run`, one point per evaluation, the first at step 0.
    """
    name = "train"
    v = _variant(variant, name)
    task, setup = _task_setup(task, setup, listops_sizes, name)
    seed = check_int(seed, "seed", name=name, minimum=0)
    keep_model = check_bool(keep_model, "keep_model", name=name)
    device = torch.device(device)
    model = _build(v, task, setup, seed, device)
    balance = setup.moh_balance > 0 and any(isinstance(m, MoHAttention) and m.routed_head > 0 for m in model.modules())
    data = torch.Generator().manual_seed(seed + 1)
    held = task.batch(setup.eval_size, torch.Generator().manual_seed(10_000 + seed), device)
    run = Run(v.name, v.mechanism, seed, majority=_majority(held.target, task.n_classes))
    evaluate = training.held_out_evaluation(model, run, lambda: model(held.tokens, held.padding), held.target)

    def loss(model: nn.Module, b: _Batch) -> torch.Tensor:
        value = nn.functional.cross_entropy(model(b.tokens, b.padding), b.target)
        return value + setup.moh_balance * moh_load_balancing_loss(model) if balance else value

    optim = training.Optim(setup.lr, setup.weight_decay, warmup=setup.warmup, clip=setup.clip, foreach=True)
    training.fit(model, lambda _: task.batch(setup.batch, data, device), loss, steps=setup.steps, optim=optim,
                 evaluate=evaluate, eval_every=setup.eval_every, device=device)  # fmt: skip
    if keep_model:
        run.model = model.eval()
    return run


def _majority(target: torch.Tensor, n_classes: int) -> float:
    """The majority-class rate of ``target``: the share of its commonest class."""
    if n_classes == 10:
        return label_distribution(target).max().item()
    return torch.bincount(target.cpu(), minlength=n_classes).max().item() / target.numel()


def _summary_dict(s: Summary) -> dict:
    return {**asdict(s), "spread": s.spread}


@dataclass
class Comparison:
    """Every variant trained on one task with several seeds: ``runs[variant]`` holds one :class:`Run` per seed.

    Attributes:
        task: the task's configuration (a dict, JSON-ready).
        setup: the :class:`Setup`.
        runs: variant name -> runs, one per seed, in seed order.
        chance: 1 / classes.
        skipped: variants the installed package could not build (their module arguments are unknown).
    """

    task: dict
    setup: Setup
    runs: dict[str, list[Run]]
    chance: float
    skipped: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[str]:
        return list(self.runs)

    @property
    def majority(self) -> float:
        """The majority-class rate of the held-out labels, averaged over seeds."""
        first = next(iter(self.runs.values()))
        return statistics.fmean(r.majority for r in first)

    def summary(self, variant: str) -> Summary:
        """Mean and spread of the final held-out accuracy over seeds, and the time per step."""
        return _summary(self.runs[check_choice(variant, "variant", self.variants, name="Comparison")])

    def to_dict(self) -> dict:
        return {
            "task": self.task,
            "setup": asdict(self.setup),
            "chance": self.chance,
            "majority": self.majority,
            "skipped": self.skipped,
            "summary": {v: _summary_dict(self.summary(v)) for v in self.variants},
            "runs": [r.to_dict() for v in self.variants for r in self.runs[v]],
        }


def compare(
    task=None,
    setup: Setup | None = None,
    *,
    variants: Sequence[str | Variant] | None = None,
    seeds: int | Sequence[int] = 3,
    skip_unavailable: bool = True,
    keep_models: bool = False,
    device: torch.device | str = "cpu",
) -> Comparison:
    """Train every variant on ``task`` with each seed (:func:`train`), alternating between variants.

    Args:
        task: as in :func:`train` (default: :class:`ListOpsTask` at :func:`listops_sizes`).
        setup: as in :func:`train` (default: :func:`listops_sizes`'s for ListOps, else ``Setup()``).
        variants: names of :data:`VARIANTS` or :class:`Variant` s (default :data:`LISTOPS_VARIANTS`).
        seeds: a number of seeds (``0 .. seeds - 1``) or the seeds themselves.
        skip_unavailable: leave out (and list in :attr:`Comparison.skipped`) variants the installed package
            cannot build, such as Flow-Attention's ablations before their arguments exist; False builds every
            variant first, so that the module's own ``TypeError`` names the argument it does not take.
        keep_models: keep every trained model.

    Returns:
        a :class:`Comparison`.
    """
    name = "compare"
    task, setup = _task_setup(task, setup, listops_sizes, name)
    if variants is not None:
        check_sequence(variants, "variants", name=name, minimum=1, item="variant")
    chosen = [_variant(v, name) for v in (LISTOPS_VARIANTS if variants is None else variants)]
    skip_unavailable = check_bool(skip_unavailable, "skip_unavailable", name=name)
    if not skip_unavailable:
        for v in chosen:
            v.build(setup.d_model, setup.n_heads)  # now: the module's TypeError names the argument it lacks
    skipped = [v.name for v in chosen if skip_unavailable and not available(v, setup.d_model, setup.n_heads)]
    chosen = [v for v in chosen if v.name not in skipped]
    runs: dict[str, list[Run]] = {v.name: [] for v in chosen}
    for seed in _seeds(seeds, name):
        for v in chosen:
            runs[v.name].append(train(v, task, setup, seed=seed, keep_model=keep_models, device=device))
    return Comparison(_config(task), setup, runs, task.chance, skipped)


# ----------------------------------------------------------------------------------------------------------
# Head widths: Mobile-Attention's claim


@dataclass(frozen=True)
class HeadStats:
    """How much each head's output varies across the queries of a sequence, in one block.

    Attributes:
        spread: per head, how much of the head's output varies across the queries of a sequence:
            ``sqrt(sum_d Var_i o_id / sum_d mean_i o_id^2)`` (mean over sequences), 0 when every query gets the
            same vector (a trivial head: a uniform average), 1 when the outputs vary around a mean of zero.
            Scale-free, so that mechanisms whose outputs differ in size compare.
        rank: per head, the effective rank (exp of the entropy of the normalised singular values, Roy &
            Vetterli 2007) of the head's outputs across queries, centred: at most min(D, N - 1).
        value_spread, value_rank: the same for the head's values, what an output that copied them would have.
        head_dim: D.
    """

    spread: list[float]
    rank: list[float]
    value_spread: list[float]
    value_rank: list[float]
    head_dim: int

    @property
    def mean_spread(self) -> float:
        return statistics.fmean(self.spread)

    @property
    def mean_rank(self) -> float:
        return statistics.fmean(self.rank)

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_spread": self.mean_spread, "mean_rank": self.mean_rank}


def _relative_spread(x: torch.Tensor) -> torch.Tensor:
    """sqrt(sum_d Var_n x_nd / sum_d mean_n x_nd^2) of x (..., N, D) -> (...): the share of x's size that varies
    across the N rows, 0 (every row the same) to 1 (rows of mean zero). Scale-free, so that heads whose outputs
    have different sizes (Mobile-Attention's grow like N / H) compare."""
    x = x.double()
    var = x.var(-2, unbiased=False).sum(-1)  # (...)
    second = x.pow(2).mean(-2).sum(-1)  # (...)
    return (var / second.clamp_min(torch.finfo(x.dtype).tiny)).sqrt()


def head_stats(model: Classifier, tokens: torch.Tensor, *, block: int = 0) -> HeadStats:
    """Each head's output across queries in ``model.blocks[block]`` on ``tokens`` (B, N): :class:`HeadStats`.

    The block's attention must be of the projected family (softmax, linear, flow, mobile): the heads are read
    at the input of its output projection (the merged heads, before they are mixed) and the values at the
    output of its value projection, in one ordinary forward of the layer on the block's normalised input.
    """
    name = "head_stats"
    check_instance(model, "model", Classifier, name=name, what="a Classifier")
    block = check_int(block, "block", name=name, minimum=0, maximum=len(model.blocks) - 1)
    attn = model.blocks[block].attn
    what = "a projected attention layer (softmax, linear, flow or mobile)"
    check_instance(attn, f"model.blocks[{block}].attn", ProjectedAttention, name=name, what=what)
    captured = {}
    hooks = [
        attn.value_projection.register_forward_hook(lambda _m, _i, out: captured.__setitem__("v", out)),
        attn.out_projection.register_forward_pre_hook(lambda _m, args: captured.__setitem__("heads", args[0])),
    ]
    try:
        with torch.no_grad():
            x = model.embed_tokens(tokens)  # (B, N, d)
            for b in model.blocks[:block]:
                x = b(x)
            model.blocks[block].attn(model.blocks[block].norm1(x))  # the hooks keep v and the merged heads
    finally:
        for hook in hooks:
            hook.remove()
    B, N, _ = x.shape
    H = attn.n_heads
    v = captured["v"].view(B, N, H, -1).transpose(1, 2)  # (B, H, N, D)
    out = captured["heads"].to(v.dtype).view(B, N, H, -1).transpose(1, 2)  # (B, H, N, D)
    spread = _relative_spread(out).mean(0)  # (H,)
    value_spread = _relative_spread(v).mean(0)  # (H,)
    rank = effective_rank(out).mean(0)  # (H,)
    value_rank = effective_rank(v).mean(0)  # (H,)
    return HeadStats(spread.tolist(), rank.tolist(), value_spread.tolist(), value_rank.tolist(), v.shape[-1])


@dataclass
class HeadWidthStudy:
    """Linear against Mobile-Attention at several head widths D, one total width C (H = C / D).

    Attributes:
        task: the task's configuration.
        setup: the :class:`Setup` (its ``n_heads`` is replaced by C / D for each width).
        widths: the head widths D.
        runs: ``runs[variant][D]`` one :class:`Run` per seed.
        initial, trained: ``[variant][D]`` one :class:`HeadStats` per seed, at initialisation and after training.
        chance: 1 / classes.
    """

    task: dict
    setup: Setup
    widths: list[int]
    runs: dict[str, dict[int, list[Run]]]
    initial: dict[str, dict[int, list[HeadStats]]]
    trained: dict[str, dict[int, list[HeadStats]]]
    chance: float

    @property
    def variants(self) -> list[str]:
        return list(self.runs)

    def summary(self, variant: str, width: int) -> Summary:
        return _summary(self.runs[variant][width])

    def spread(self, variant: str, width: int, *, trained: bool = True) -> tuple[float, float, float]:
        """(mean, lowest, highest) over seeds of the mean head spread."""
        values = [s.mean_spread for s in (self.trained if trained else self.initial)[variant][width]]
        return statistics.fmean(values), min(values), max(values)

    def rank(self, variant: str, width: int, *, trained: bool = True) -> tuple[float, float, float]:
        """(mean, lowest, highest) over seeds of the mean effective rank of the heads' outputs."""
        values = [s.mean_rank for s in (self.trained if trained else self.initial)[variant][width]]
        return statistics.fmean(values), min(values), max(values)

    def to_dict(self) -> dict:
        rows = [
            {
                "variant": v,
                "head_dim": d,
                "n_heads": self.setup.d_model // d,
                "accuracy": _summary_dict(self.summary(v, d)),
                "spread_initial": self.spread(v, d, trained=False),
                "spread_trained": self.spread(v, d),
                "rank_initial": self.rank(v, d, trained=False),
                "rank_trained": self.rank(v, d),
                "runs": [r.to_dict() for r in self.runs[v][d]],
                "stats_initial": [s.to_dict() for s in self.initial[v][d]],
                "stats_trained": [s.to_dict() for s in self.trained[v][d]],
            }
            for v in self.variants
            for d in self.widths
        ]
        return {"task": self.task, "setup": asdict(self.setup), "widths": self.widths, "chance": self.chance,
                "rows": rows}  # fmt: skip


def head_width_study(
    task=None,
    setup: Setup | None = None,
    *,
    widths: Sequence[int] = (2, 4, 8),
    variants: Sequence[str] = HEADS_VARIANTS,
    seeds: int | Sequence[int] = 3,
    probe_size: int = 256,
    device: torch.device | str = "cpu",
) -> HeadWidthStudy:
    """Mobile-Attention's claim at one total width C = ``setup.d_model``: heads of width D in ``widths``.

    For each seed, width and variant (alternating): the :class:`HeadStats` of the first block at
    initialisation and after training on ``task``, measured on ``probe_size`` held-out sequences (generator
    ``20_000 + seed``), and the :class:`Run`.

    The default task is chapter 6's associative recall (:func:`heads_sizes`): finding the one fact whose key
    the query names is a sharp selection among P similar tokens; a head that averages uniformly contributes
    nothing to it, so the accuracy shows whether the heads do more than average.
    """
    name = "head_width_study"
    task, setup = _task_setup(task, setup, heads_sizes, name)
    check_sequence(widths, "widths", name=name, minimum=1, item="width")
    widths = [check_int(d, "widths", name=name, minimum=1) for d in widths]
    for d in widths:
        check_divisible(setup.d_model, d, name=name, total_arg="setup.d_model", parts_arg="every head width")
    check_sequence(variants, "variants", name=name, minimum=1, item="variant")
    chosen = [_variant(v, name) for v in variants]
    probe_size = check_int(probe_size, "probe_size", name=name, minimum=2)
    device = torch.device(device)
    runs, initial, trained = ({v.name: {d: [] for d in widths} for v in chosen} for _ in range(3))
    for seed in _seeds(seeds, name):
        probe = task.batch(probe_size, torch.Generator().manual_seed(20_000 + seed), device).tokens
        for d in widths:
            s = replace(setup, n_heads=setup.d_model // d)
            for v in chosen:
                initial[v.name][d].append(head_stats(_build(v, task, s, seed, device).eval(), probe))
                run = train(v, task, s, seed=seed, keep_model=True, device=device)
                trained[v.name][d].append(head_stats(run.model, probe))
                run.model = None
                runs[v.name][d].append(run)
    return HeadWidthStudy(_config(task), setup, widths, runs, initial, trained, task.chance)


# ----------------------------------------------------------------------------------------------------------
# MoH: quality against the fraction of heads each token activates

#: (shared_head, routed_head) of H = 8 heads: 2, 4, 6 and 8 active heads per token (25 % to 100 %).
MOH_SPLITS = ((1, 1), (2, 2), (2, 4), (8, 0))


@dataclass
class MoHStudy:
    """MoH layers that activate different fractions of H heads per token, and plain multi-head softmax.

    Attributes:
        task: the task's configuration.
        setup: the :class:`Setup`.
        splits: (shared_head, routed_head) per MoH configuration.
        comparison: a :class:`Comparison` whose variants are ``moh_variant(s, k).name`` and, when included,
            ``"softmax"`` (every head, no gates).
    """

    task: dict
    setup: Setup
    splits: list[tuple[int, int]]
    comparison: Comparison

    def fraction(self, split: tuple[int, int]) -> float:
        """The fraction of the heads each token activates: (h_s + k) / H."""
        return sum(split) / self.setup.n_heads

    def curve(self) -> list[tuple[float, Summary]]:
        """(fraction of heads active, accuracy summary) for each MoH split, in the order of ``splits``."""
        return [(self.fraction(sp), self.comparison.summary(moh_variant(*sp).name)) for sp in self.splits]

    def steps_to(self, variant: str, accuracy: float = 0.9) -> list[int | None]:
        """For every seed of ``variant``, the first evaluated step with held-out accuracy >= ``accuracy``."""
        return [r.steps_to(accuracy) for r in self.comparison.runs[variant]]

    def final_loss(self, variant: str) -> list[float]:
        """For every seed of ``variant``, the final held-out cross-entropy (finer than a saturated accuracy)."""
        return [r.loss[-1] for r in self.comparison.runs[variant]]

    def to_dict(self) -> dict:
        def row(variant: str, fraction: float) -> dict:
            return {
                "variant": variant,
                "fraction": fraction,
                "accuracy": _summary_dict(self.comparison.summary(variant)),
                "final_loss": self.final_loss(variant),
                "steps_to_0.9": self.steps_to(variant, 0.9),
            }

        curve = [{"shared_head": sp[0], "routed_head": sp[1], **row(moh_variant(*sp).name, self.fraction(sp))}
                 for sp in self.splits]  # fmt: skip
        softmax = row("softmax", 1.0) if "softmax" in self.comparison.runs else None
        fewer = [row(v, int(v.removeprefix("mha_")) / self.setup.n_heads) for v in self.comparison.runs
                 if v.startswith("mha_")]  # fmt: skip
        return {
            "fewer_heads": fewer,
            "task": self.task,
            "setup": asdict(self.setup),
            "splits": [list(sp) for sp in self.splits],
            "curve": curve,
            "softmax": softmax,
            "comparison": self.comparison.to_dict(),
        }


def moh_study(
    task=None,
    setup: Setup | None = None,
    *,
    splits: Sequence[tuple[int, int]] = MOH_SPLITS,
    include_softmax: bool = True,
    fewer_heads: Sequence[int] = (),
    seeds: int | Sequence[int] = 3,
    device: torch.device | str = "cpu",
) -> MoHStudy:
    """MoH's claim: accuracy against the fraction of heads each token activates (default :func:`moh_sizes`).

    Each split (shared_head, routed_head) is one MoH layer of ``setup.n_heads`` heads; ``include_softmax``
    adds plain multi-head softmax attention with the same heads (the quality MoH is compared with), and
    ``fewer_heads`` plain softmax attention with only that many heads (:func:`mha_variant`): MoH's routing
    against simply having fewer heads.
    """
    name = "moh_study"
    task, setup = _task_setup(task, setup, moh_sizes, name)
    check_sequence(splits, "splits", name=name, minimum=1, item="split")
    splits = [tuple(check_int(x, "splits", name=name, minimum=0) for x in sp) for sp in splits]
    for sp in splits:
        check_count(sp, "every split", name=name, minimum=2, maximum=2, item="count")
    include_softmax = check_bool(include_softmax, "include_softmax", name=name)
    chosen = [moh_variant(*sp) for sp in splits] + ([VARIANTS["softmax"]] if include_softmax else [])
    chosen += [mha_variant(h) for h in fewer_heads]
    for v in chosen[: len(splits)]:
        v.build(setup.d_model, setup.n_heads)  # raises now, with MoH's message, on an impossible split
    comparison = compare(task, setup, variants=chosen, seeds=seeds, skip_unavailable=False, device=device)
    return MoHStudy(_config(task), setup, splits, comparison)


# ----------------------------------------------------------------------------------------------------------
# Trained projections against uniform rescaling


@dataclass(frozen=True)
class LookupShareDemo:
    """The weight on the right key in chapter 2's retrieval toy: q and k rescaled, against q and k projected
    by trained matrices.

    Attributes:
        n_tokens, dim: the toy (``retrieval_toy(n_tokens, dim)``); 1 / n_tokens is the uniform share.
        scales: the inverse temperatures s (q and k multiplied by sqrt(s)).
        rescaled: mechanism -> the mean weight on the right key at each scale.
        trained: mechanism -> the same after training W_q, W_k (D x D, started at the identity) for ``steps``
            Adam steps to put weight on the right key.
        overlap_rescaled: mechanism -> the mean cosine between the feature vectors of two different keys,
            at the largest scale (positive features can only be orthogonal by not sharing a coordinate).
        overlap_trained: the same after training.
        scale_trained: the ratio of the trained queries' and keys' norms to the untrained ones' (how much
            of what training did is a plain rescaling).
        direction_trained: the mean cosine between a trained key and its untrained self (1: only rescaled).
        steps: the training steps.
    """

    n_tokens: int
    dim: int
    scales: list[float]
    rescaled: dict[str, list[float]]
    trained: dict[str, float]
    overlap_rescaled: dict[str, float]
    overlap_trained: dict[str, float]
    scale_trained: dict[str, float]
    direction_trained: dict[str, float]
    steps: int

    @property
    def uniform(self) -> float:
        return 1.0 / self.n_tokens

    def to_dict(self) -> dict:
        return {**asdict(self), "uniform": self.uniform}


def _toy_weights(mechanism: str, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Row-normalised attention weights (N, N) of ``mechanism`` on q, k (1, 1, N, D): the values are the
    identity, so the output is the weight matrix (every mechanism here is linear in its values)."""
    eye = torch.eye(q.shape[-2], dtype=q.dtype).expand(1, 1, -1, -1)  # (1, 1, N, N)
    w = mechanisms.get(mechanism)(q, k, eye)[0, 0]  # (N, N)
    return w / w.sum(-1, keepdim=True)


def _features(mechanism: str, x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) if mechanism == "flow" else nn.functional.elu(x) + 1


def _overlap(mechanism: str, k: torch.Tensor) -> float:
    f = nn.functional.normalize(_features(mechanism, k[0, 0]), dim=-1)  # (N, D)
    cos = f @ f.T  # (N, N)
    n = cos.shape[0]
    return ((cos.sum() - cos.diagonal().sum()) / max(n * (n - 1), 1)).item()


def lookup_share_demo(
    n_tokens: int = 24,
    dim: int = 16,
    *,
    names: Sequence[str] = ("linear", "flow"),
    scales: Sequence[float] = (0.5, 1, 2, 4, 8, 16, 32, 128),
    steps: int = 300,
    lr: float = 0.05,
    seed: int = 0,
) -> LookupShareDemo:
    """Uniform rescaling against trained projections on chapter 2's retrieval toy (query i is a noisy key i).

    Rescaling q and k by sqrt(s) scales elu + 1's features towards ``sqrt(s) max(x, 0)`` and sigmoid's
    towards a 0/1 pattern: the *pattern* of which coordinates are large stays the one q and k had, so the
    weights converge to a fixed, flat map. Training W_q and W_k changes the directions of q and k: it can
    give each key features that the other keys lack (a large positive coordinate where the others are
    negative), and then the kernel of the matching query and key dominates the row. Both numbers on the same
    toy, with the same mechanisms (the package's functions, identity values).

    Args:
        n_tokens, dim: the toy's size (chapters 2 and 3 use 24 and 16).
        names: registry names of kernel mechanisms with a q, k, v function and N == M allowed
            (``"linear"``: elu + 1; ``"flow"``; ``"mobile"`` works too, with one head).
        scales: inverse temperatures.
        steps, lr: Adam on W_q, W_k (float64, from the identity), loss -mean_i log w_ii.
        seed: the toy's seed.

    Returns:
        a :class:`LookupShareDemo`. Cost: a few seconds of one CPU thread at the defaults.
    """
    from ..viz.linear import retrieval_toy

    name = "lookup_share_demo"
    n_tokens = check_int(n_tokens, "n_tokens", name=name, minimum=2)
    dim = check_int(dim, "dim", name=name, minimum=1)
    check_sequence(names, "names", name=name, minimum=1, item="mechanism")
    for m in names:
        check_choice(m, "names", ("linear", "flow", "mobile"), name=name)
    check_sequence(scales, "scales", name=name, minimum=1, item="scale")
    scales = [check_number(s, "scales", name=name, minimum=0.0, strict_minimum=True) for s in scales]
    steps = check_int(steps, "steps", name=name, minimum=1)
    lr = check_number(lr, "lr", name=name, minimum=0.0, strict_minimum=True)
    seed = check_int(seed, "seed", name=name, minimum=0)
    q, k, _ = retrieval_toy(n_tokens, dim, seed=seed)  # (1, 1, N, D) float64
    rescaled, trained, over_r, over_t, scale_t, direction_t = {}, {}, {}, {}, {}, {}
    for m in names:
        rescaled[m] = [_toy_weights(m, q * math.sqrt(s), k * math.sqrt(s)).diagonal().mean().item() for s in scales]
        over_r[m] = _overlap(m, k * math.sqrt(max(scales)))
        wq = torch.eye(dim, dtype=q.dtype, requires_grad=True)
        wk = torch.eye(dim, dtype=q.dtype, requires_grad=True)
        opt = torch.optim.Adam([wq, wk], lr=lr)
        for _ in range(steps):
            w = _toy_weights(m, q @ wq, k @ wk)
            loss = -w.diagonal().clamp_min(1e-300).log().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            qt, kt = q @ wq, k @ wk
            trained[m] = _toy_weights(m, qt, kt).diagonal().mean().item()
            over_t[m] = _overlap(m, kt)
            scale_t[m] = ((qt.norm() + kt.norm()) / (q.norm() + k.norm())).item()
            direction_t[m] = nn.functional.cosine_similarity(kt[0, 0], k[0, 0], dim=-1).mean().item()
    return LookupShareDemo(n_tokens, dim, scales, rescaled, trained, over_r, over_t, scale_t, direction_t, steps)


# ----------------------------------------------------------------------------------------------------------
# Sizes: small (a chapter's live run on a CPU), recorded (benchmarks/bench_claims.py)

#: The ListOps task of a chapter's live run: depth <= 2, 8 to 24 tokens.
LISTOPS_TASK_SMALL = ListOpsTask(ListOps(max_depth=2, max_args=4, min_length=8, max_length=24))
#: The training setup of a chapter's live ListOps run (CPU, seconds).
LISTOPS_SMALL = Setup(d_model=32, n_heads=4, n_layers=2, batch=32, steps=150, lr=3e-3, warmup=15, eval_every=25,
                      eval_size=256)  # fmt: skip
#: The ListOps task of the recording (benchmarks/bench_claims.py): depth <= 3, 16 to 48 tokens.
LISTOPS_TASK_RECORDED = ListOpsTask(ListOps(max_depth=3, max_args=4, min_length=16, max_length=48))
#: The training setup of the recorded ListOps run.
LISTOPS_RECORDED = Setup(d_model=64, n_heads=4, n_layers=2, batch=32, steps=1200, lr=2e-3, warmup=100,
                         eval_every=150, eval_size=2000)  # fmt: skip

#: The training setup of the live ListOps run at full size (a GPU): 2 seeds, within a minute of an H200 and ten
#: of a T4 (benchmarks/estimate_chapters.py).
LISTOPS_FULL = Setup(d_model=64, n_heads=4, n_layers=2, batch=32, steps=400, lr=2e-3, warmup=40, eval_every=50,
                     eval_size=500)  # fmt: skip

#: The associative-recall task of the head-width study (8 facts, 16 keys, 8 values).
HEADS_TASK = RecallTask(n_pairs=8, n_keys=16, n_values=8)
#: The training setup of a chapter's live head-width run.
HEADS_SMALL = Setup(d_model=32, n_heads=4, n_layers=1, batch=64, steps=150, lr=1e-2, warmup=10, eval_every=25,
                    eval_size=256)  # fmt: skip
#: The training setup of the recorded head-width run.
HEADS_RECORDED = Setup(d_model=32, n_heads=4, n_layers=1, batch=64, steps=1000, lr=5e-3, warmup=30,
                       eval_every=50, eval_size=1000)  # fmt: skip

#: The multi-key recall task of the MoH study (6 facts, 3 of them asked for at once).
MOH_TASK = MultiKeyRecallTask(n_pairs=6, n_keys=12, n_values=3, n_queried=3)
#: The training setup of a chapter's live MoH run.
MOH_SMALL = Setup(d_model=64, n_heads=8, n_layers=1, batch=64, steps=200, lr=5e-3, warmup=10, eval_every=25,
                  eval_size=256)  # fmt: skip
#: The training setup of the recorded MoH run.
MOH_RECORDED = Setup(d_model=64, n_heads=8, n_layers=1, batch=64, steps=800, lr=5e-3, warmup=30, eval_every=25,
                     eval_size=1000)  # fmt: skip


def listops_sizes() -> tuple[ListOpsTask, Setup]:
    """(task, setup) of the ListOps comparison: small on a CPU / in CI, the recorded size on a GPU."""
    return config.pick(small=(LISTOPS_TASK_SMALL, LISTOPS_SMALL), full=(LISTOPS_TASK_RECORDED, LISTOPS_FULL))


def heads_sizes() -> tuple[RecallTask, Setup]:
    """(task, setup) of the head-width study (:func:`attnbook.config.pick`)."""
    return HEADS_TASK, config.pick(small=HEADS_SMALL, full=HEADS_RECORDED)


def moh_sizes() -> tuple[MultiKeyRecallTask, Setup]:
    """(task, setup) of the MoH study (:func:`attnbook.config.pick`)."""
    return MOH_TASK, config.pick(small=MOH_SMALL, full=MOH_RECORDED)


# ----------------------------------------------------------------------------------------------------------
# What the chapters print: a live result and its recording side by side

#: Flowformer's own numbers (Wu et al., ICML 2022; Long Range Arena, test accuracy in %): Table 1 for ListOps and
#: Retrieval, the ablation table for the LRA average. Chapter 3 quotes them as the paper's, beside its own runs.
FLOWFORMER_PAPER: dict[str, dict[str, float]] = {
    "ListOps": {"softmax": 36.37, "linear": 16.13, "flow": 38.70},
    "Retrieval": {"linear": 53.09, "flow": 62.24},
    "LRA average": {"flow": 56.48, "flow_no_competition": 55.25, "flow_no_allocation": 55.58},
}

#: (mean, lowest, highest) over seeds.
Span = tuple[float, float, float]


def effective_rank(x: torch.Tensor) -> torch.Tensor:
    """The effective rank of the rows of ``x`` (..., N, D) after removing their mean -> (...).

    ``exp`` of the entropy of the normalised singular values (Roy and Vetterli, 2007): 1 when the centred rows
    lie on one line, ``r`` when they spread evenly over ``r`` directions, at most ``min(N - 1, D)``; 0 when every
    row is the same (singular values below ``1e-9`` of ``x``'s size, the rounding left by centring equal rows,
    count as 0, rather than making a rank of rounding errors).

    Example:
        >>> import torch
        >>> line = torch.tensor([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]])  # three points on one line
        >>> round(effective_rank(line).item(), 6)
        1.0
        >>> round(effective_rank(torch.eye(3)).item(), 3)  # a triangle: two even directions
        2.0
    """
    x = check_tensor(x, "x", name="effective_rank").double()
    check_dims(x, "x", 2, name="effective_rank", layout="(..., N, D)", at_least=True)
    s = torch.linalg.svdvals(x - x.mean(-2, keepdim=True))  # (..., min(N, D))
    size = torch.linalg.matrix_norm(x).unsqueeze(-1)  # (..., 1)
    s = torch.where(s > 1e-9 * size, s, torch.zeros_like(s))
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(s.dtype).tiny)
    entropy = -(p * p.clamp_min(torch.finfo(s.dtype).tiny).log()).sum(-1)
    return torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.zeros_like(entropy))


def _span_of(s: Summary | dict) -> Span:
    if isinstance(s, Summary):
        return s.mean, s.low, s.high
    return s["mean"], s["low"], s["high"]


def accuracy_spans(result: Comparison | dict) -> dict[str, Span]:
    """variant -> (mean, lowest, highest) final held-out accuracy, from a :class:`Comparison` or its recording
    (the JSON of ``benchmarks/bench_claims.py --study listops``, as :func:`attnbook.lab.recordings.load` gives it).

    Example:
        >>> recorded = {"summary": {"flow": {"mean": 0.30, "low": 0.29, "high": 0.31}}}
        >>> accuracy_spans(recorded)
        {'flow': (0.3, 0.29, 0.31)}
    """
    if isinstance(result, Comparison):
        return {v: _span_of(result.summary(v)) for v in result.variants}
    check_instance(result, "result", dict, name="accuracy_spans", what="a Comparison or its recording (a dict)")
    return {v: _span_of(s) for v, s in result["summary"].items()}


def listops_table(live: Comparison, recorded: dict | None = None) -> str:
    """The ListOps comparison as text for an 80-column page: per variant the live run and the recording, mean
    (lowest-highest) over seeds, then chance and the majority class of each.

    ``recorded`` is the recording (or None after a pip install: the table says so).
    """
    check_instance(live, "live", Comparison, name="listops_table", what="a Comparison")
    ours = accuracy_spans(live)
    theirs = {} if recorded is None else accuracy_spans(recorded)
    n_live = len(next(iter(live.runs.values())))
    n_rec = 0 if recorded is None else len(recorded.get("seeds", []))
    head = f"{'':31s}{'live (' + str(n_live) + ' seeds)':>22s}"
    head += f"{'recorded (' + str(n_rec) + ' seeds)':>24s}" if recorded is not None else "   (no recording here)"
    lines = [head]
    for v in dict.fromkeys([*ours, *theirs]):
        cells = [f"{s[0]:.3f} ({s[1]:.3f}-{s[2]:.3f})" if s else "-" for s in (ours.get(v), theirs.get(v))]
        title = VARIANTS[v].title if v in VARIANTS else v
        lines.append(f"{title:31s}{cells[0]:>22s}" + (f"{cells[1]:>24s}" if recorded is not None else ""))
    chance = f"{'chance (1/10) / majority class':31s}{f'{live.chance:.2f} / {live.majority:.3f}':>22s}"
    if recorded is not None:
        rec_chance = f"{recorded['chance']:.2f} / {recorded['majority']:.3f}"
        chance += f"{rec_chance:>24s}"
    lines.append(chance)
    return "\n".join(lines)


def head_width_spans(result: HeadWidthStudy | dict, *, trained: bool = True) -> dict[str, dict[int, dict[str, Span]]]:
    """``[variant][D]`` -> ``{"accuracy": span, "rank": span}`` (mean, lowest, highest over seeds) of a
    :class:`HeadWidthStudy` or its recording (``bench_claims.py --study heads``); ``rank`` is the mean effective
    rank of a head's centred outputs, after training (or at initialisation, ``trained=False``).

    Example:
        >>> row = {"variant": "linear", "head_dim": 2, "accuracy": {"mean": 0.67, "low": 0.66, "high": 0.68},
        ...        "rank_trained": [1.0, 1.0, 1.0], "rank_initial": [1.0, 1.0, 1.0]}
        >>> head_width_spans({"rows": [row]})["linear"][2]["rank"]
        (1.0, 1.0, 1.0)
    """
    out: dict[str, dict[int, dict[str, Span]]] = {}
    if isinstance(result, HeadWidthStudy):
        for v in result.variants:
            out[v] = {
                d: {"accuracy": _span_of(result.summary(v, d)), "rank": result.rank(v, d, trained=trained)}
                for d in result.widths
            }
        return out
    check_instance(result, "result", dict, name="head_width_spans", what="a HeadWidthStudy or its recording (a dict)")
    for row in result["rows"]:
        rank = row["rank_trained" if trained else "rank_initial"]  # [mean, low, high]
        out.setdefault(row["variant"], {})[row["head_dim"]] = {
            "accuracy": _span_of(row["accuracy"]),
            "rank": (rank[0], rank[1], rank[2]),
        }
    return out


def head_width_table(live: HeadWidthStudy, recorded: dict | None = None) -> str:
    """The head-width study as text at most 70 columns wide (the website's output column): per head width D and
    variant, the accuracy (mean over seeds, and their range when there are several) and the trained heads'
    effective rank, live and recorded."""
    check_instance(live, "live", HeadWidthStudy, name="head_width_table", what="a HeadWidthStudy")
    ours = head_width_spans(live)
    theirs = {} if recorded is None else head_width_spans(recorded)
    n_live = len(live.runs[live.variants[0]][live.widths[0]])
    n_rec = 0 if recorded is None else len(recorded["seeds"])

    def seeds(n: int) -> str:
        return f"{n} seed" + ("" if n == 1 else "s")

    legend = f"live: {live.setup.steps} steps, {seeds(n_live)}; "
    legend += (
        "no recording here" if recorded is None else f"recorded: {recorded['setup']['steps']} steps, {seeds(n_rec)}"
    )
    sources = [(ours, n_live)] + ([(theirs, n_rec)] if recorded is not None else [])
    lines = [legend, f"{'':18s}" + "".join(f"{name:>25s}" for name in ("live", "recorded")[: len(sources)])]
    lines.append(f"{'D  variant':18s}" + f"{'accuracy':>19s}{'rank':>6s}" * len(sources))
    for d in live.widths:
        for v in live.variants:
            row = f"{d:<3d}{v:15s}"
            for spans, n in sources:
                s = spans.get(v, {}).get(d)
                if s is None:
                    row += f"{'-':>19s}{'-':>6s}"
                    continue
                a, r = s["accuracy"], s["rank"]
                acc = f"{a[0]:.3f}" if n == 1 else f"{a[0]:.3f} ({a[1]:.2f}-{a[2]:.2f})"  # one seed: no range
                row += f"{acc:>19s}{r[0]:>6.2f}"
            lines.append(row)
    return "\n".join(lines)
