"""Checkers for the exercises of chapter 5 (mixture-of-head attention): 5.1 the mean gate of a token's active
heads, checked against a real :class:`attnbook.MoHAttention`; 5.2 the top-h_r router and 5.3 the
load-balancing loss, checked against the layer's own; 5.4 (explore) how many routed heads the router still uses
after training on skewed tokens, checked by rerunning the experiment with :mod:`attnbook.viz.moh`.
"""

from __future__ import annotations

import functools
import math
from functools import partial

import torch
import torch.nn.functional as F

from ..moh import MoHAttention
from ._core import FIXED_SIZE, Case, Diagnosis, Draw, Result, check_function, check_value, exercise

# ----------------------------------------------------------------------------------------------- 5.1

mean_gate_setting = {"shared_head": 3, "routed_head": 1, "a_1": 1.2}  # the numbers of exercise 5.1


def _mean_gate_from_the_layer() -> float:
    """A layer with h_s = 3, h_r = 1 whose two-stage router gives α_1 = 1.2; its mean active gate."""
    s, k, a_1 = mean_gate_setting["shared_head"], mean_gate_setting["routed_head"], mean_gate_setting["a_1"]
    layer = MoHAttention(4, num_heads=6, shared_head=s, routed_head=k, head_dim=2)
    x = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)  # (1, 1, C): one token
    with torch.no_grad():
        layer.double()
        layer.wg_0.weight.zero_()
        layer.wg_0.weight[0, 0] = math.log(a_1 / (2 - a_1))  # 2 softmax((logit, 0))_1 = α_1
        routing = layer.route(x)
    return float(routing.gates[routing.selected].mean())  # the gates of the h_s + h_r active heads


@exercise("5.1")
def check_mean_gate(answer) -> Result:
    """Exercise 5.1: the mean gate (α_1 h_s + α_2 h_r) / (h_s + h_r) for h_s = 3, h_r = 1, α_1 = 1.2."""
    s, k, a_1 = mean_gate_setting["shared_head"], mean_gate_setting["routed_head"], mean_gate_setting["a_1"]
    a_2 = 2 - a_1
    return check_value(
        "5.1 mean gate", answer, _mean_gate_from_the_layer(), rtol=1e-6,
        hint="α_1 + α_2 = 2; the shared gates sum to α_1 h_s and the routed ones to α_2 h_r.",
        mistakes=[
            (1.0, "1 is the mean gate when h_s = h_r; here h_s = 3 and h_r = 1."),
            (a_1, f"{a_1:g} is α_1, the weight of the shared heads; the mean runs over all h_s + h_r active gates."),
            ((a_2 * s + a_1 * k) / (s + k), "α_1 and α_2 are swapped: α_1 weighs the shared heads, α_2 the routed."),
            (a_1 * s + a_2 * k, "that is the sum of the active gates; divide by the h_s + h_r active heads."),
            ((a_1 * s + a_2 * k) / 2, "divide by the h_s + h_r active heads, not by the 2 stages."),
        ],
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- 5.2 and 5.3


def _routed(x: torch.Tensor, k: int):
    """The package's routing of router logits x (B, N, E) by a layer whose router W_r is the identity."""
    E = x.shape[-1]
    layer = MoHAttention(E, num_heads=E, shared_head=0, routed_head=k, head_dim=1).to(x.dtype)
    with torch.no_grad():
        layer.wg.weight.copy_(torch.eye(E, dtype=x.dtype))
        return layer.route(x)


def _top(p: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """(..., E) True at the k largest (or smallest) entries of each row of ``p``."""
    return torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(k, dim=-1, largest=largest).indices, True)


def _gates(logits, k, *, dim=-1, largest=True, top=True, zeros=False, renorm=True, times_k=True, eps=0.0):
    """The gates with one piece changed: the softmax's dim, the k smallest kept, every head kept (``top=False``),
    the unchosen logits set to 0 instead of -inf, no renormalising, no factor h_r, an eps in the sum."""
    p = F.softmax(logits, dim=dim)
    mask = _top(p, k, largest)
    if zeros or not top:
        return k * (F.softmax(torch.where(mask, logits, 0), dim=-1) if zeros else p)
    kept = torch.where(mask, p, 0)
    kept = kept / (kept.sum(-1, keepdim=True) + eps) if renorm else kept
    return k * kept if times_k else kept


_not_renormalised = partial(_gates, renorm=False)
_no_factor_k = partial(_gates, times_k=False)
_softmax_over_tokens = partial(_gates, dim=-2)
_no_top_k = partial(_gates, top=False)
_smallest_k = partial(_gates, largest=False)
_zeros_not_minus_inf = partial(_gates, zeros=True)

LARGE_LOGITS = (
    "every logit on these inputs is shifted by a constant, which changes no probability: subtract each row's "
    "largest logit before exp (torch.softmax does), or exp overflows to inf"
)
_EPS_IN_SUM = (
    "an eps is added to the renormalising sum: the kept probabilities are positive, so their sum never is 0 and "
    "needs no eps; with it the gates sum to a little less than h_r"
)


def _random_routing(draw: Draw, probabilities: bool):
    """Router logits (or probabilities) of sizes the statement does not mention: N up to 300, E of 2 to 24 heads
    with any h_r, in float64, and a small float32 one."""

    def routing(n, dtype):
        B, E = draw.int(1, 3), draw.int(2, 24, avoid=(4, 5, 6, 8, 16))
        k = draw.int(1, E)
        x = draw.randn(B, n, E, scale=draw.uniform(0.5, 3.0))
        x = (F.softmax(x, dim=-1) if probabilities else x).to(dtype)
        return (x, k), f"{'probabilities' if probabilities else 'logits'} ({B}, {n}, {E}), h_r = {k}"

    return draw.cases(routing, long=(71, 300), short=(1, 12), over=9)


def _gate_cases(draw: Draw) -> list[Case]:
    d = Draw(5)
    return [
        Case((d.randn(2, 5, 6), 2), label="logits (2, 5, 6), h_r = 2"),
        Case((d.randn(1, 4, 8, scale=3.0), 3), label="logits (1, 4, 8), h_r = 3"),
        Case((d.randn(3, 1, 4), 1), label="one token per sequence, h_r = 1"),
        Case((d.randn(1, 3, 5), 5), label="h_r = E = 5 (every head chosen)"),
        Case((d.randn(2, 64, 8, scale=2.0), 2), label="logits (2, 64, 8), h_r = 2", note=FIXED_SIZE),
        Case((d.randn(1, 70, 16), 4), label="logits (1, 70, 16), h_r = 4", note=FIXED_SIZE),
        Case((d.randn(1, 5, 6, dtype=torch.float32), 2), label="float32 logits (1, 5, 6), h_r = 2"),
        Case((d.randn(2, 6, 8) + 800, 3), label="logits (2, 6, 8) shifted by 800, h_r = 3", note=LARGE_LOGITS),
        Case(
            (d.randn(1, 5, 6, dtype=torch.float32) + 100, 2),
            label="float32 logits shifted by 100, h_r = 2",
            note=LARGE_LOGITS,
        ),
        *_random_routing(draw, probabilities=False),
    ]


@exercise("5.2")
def check_top_k_gates(fn, *, seed: int | None = None) -> Result:
    """Exercise 5.2: ``top_k_gates(logits, k)``: logits (B, N, E) -> gates (B, N, E)."""
    return check_function(
        fn, _gate_cases(Draw(seed)),
        expected=lambda logits, k: _routed(logits.reshape(1, -1, logits.shape[-1]), k).gates.reshape(logits.shape),
        name="top_k_gates",
        success="top_k_gates matches the layer's router on all 11 inputs (up to 300 tokens, 24 heads, float32, "
        "logits shifted by a large constant).",
        diagnoses=[
            Diagnosis("the kept probabilities are not renormalised (divide by their sum)", _not_renormalised),
            Diagnosis("the kept probabilities are neither renormalised nor multiplied by h_r: divide them by their "
                      "sum, then multiply by h_r", partial(_gates, renorm=False, times_k=False)),
            Diagnosis(_EPS_IN_SUM, partial(_gates, eps=1e-6)),
            Diagnosis(_EPS_IN_SUM, partial(_gates, eps=1e-8)),
            Diagnosis("the factor h_r is missing: the gates sum to 1 instead of h_r", _no_factor_k),
            Diagnosis("the softmax runs over the tokens (dim=-2) instead of the heads (dim=-1)", _softmax_over_tokens),
            Diagnosis("every head keeps its gate: the top-h_r choice is missing", _no_top_k),
            Diagnosis("the h_r *least* probable heads are kept (largest=False)", _smallest_k),
            Diagnosis("the unchosen logits are set to 0 instead of -inf before the softmax, so they still take "
                      "probability", _zeros_not_minus_inf),
        ],
    )  # fmt: skip


def _package_loss(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The layer's load-balancing loss for router probabilities (B, N, E): route their logarithms."""
    return _routed(probs.log(), k).loss  # softmax(log p) = p


def _loss(probs, k, *, power=1, top=None, counts=False, over_k=False, importance="probabilities"):
    """E^power sum_e f_e P_e with one piece changed: the load from the ``top`` heads (not h_r), as ``counts``, or
    divided by h_r; the importance of the chosen heads' probabilities only, or of the renormalised gates."""
    E, p = probs.shape[-1], probs.flatten(0, -2)  # (B N, E)
    load = _top(p, top or k).to(p.dtype)  # one per choice
    f = load.sum(0) if counts else load.mean(0) / (k if over_k else 1)
    if importance != "probabilities":
        p = p * _top(p, k)
        p = k * p / p.sum(-1, keepdim=True) if importance == "gates" else p
    return E**power * (f * p.mean(0)).sum()


_counts_not_fractions = partial(_loss, counts=True)
_no_factor_e = partial(_loss, power=0)
_importance_of_chosen_only = partial(_loss, importance="chosen")
_load_from_top_1 = partial(_loss, top=1)
_factor_e_squared = partial(_loss, power=2)


def _loss_cases(draw: Draw) -> list[Case]:
    d = Draw(7)

    def probs(*shape, scale=1.0, dtype=torch.float64):
        return F.softmax(d.randn(*shape, scale=scale), dim=-1).to(dtype)

    return [
        Case((probs(2, 6, 5), 2), label="probabilities (2, 6, 5), h_r = 2"),
        Case((probs(1, 9, 4, scale=3.0), 1), label="sharp probabilities (1, 9, 4), h_r = 1"),
        Case((probs(3, 4, 6), 3), label="probabilities (3, 4, 6), h_r = 3"),
        Case((probs(2, 64, 8, scale=2.0), 2), label="probabilities (2, 64, 8), h_r = 2", note=FIXED_SIZE),
        Case((probs(3, 70, 6), 3), label="probabilities (3, 70, 6), h_r = 3", note=FIXED_SIZE),
        Case((probs(2, 5, 4, dtype=torch.float32), 2), label="float32 probabilities (2, 5, 4), h_r = 2"),
        *_random_routing(draw, probabilities=True),
    ]


@exercise("5.3")
def check_load_balancing_loss(fn, *, seed: int | None = None) -> Result:
    """Exercise 5.3: ``load_balancing_loss(probs, k)``: probs (B, N, E) -> the scalar E sum_e f_e P_e."""
    return check_function(
        fn, _loss_cases(Draw(seed)), expected=_package_loss, name="load_balancing_loss",
        success="load_balancing_loss matches the layer's loss on all 8 inputs (up to 3 x 300 tokens, float32).",
        diagnoses=[
            Diagnosis("the load f_e is divided by h_r: it is the fraction of tokens, which sums to h_r",
                      partial(_loss, over_k=True)),
            Diagnosis("only the first sequence is used: f_e and P_e average over all B N tokens",
                      lambda probs, k: _package_loss(probs[:1], k)),
            Diagnosis("the importance P_e averages the renormalised gates; it is the mean of the router's "
                      "probabilities", partial(_loss, importance="gates")),
            Diagnosis("the load counts tokens instead of taking their fraction (divide by B N)", _counts_not_fractions),
            Diagnosis("the factor E is missing (the loss should be h_r at balance)", _no_factor_e),
            Diagnosis("the importance P_e averages only the chosen heads' probabilities; it is the mean of the whole "
                      "softmax", _importance_of_chosen_only),
            Diagnosis("the load counts only each token's top-1 head instead of its top h_r", _load_from_top_1),
            Diagnosis("the factor is E^2 instead of E (E^2 goes with the mean over heads)", _factor_e_squared),
        ],
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- 5.4

SKEWED = {"offset": 4.0, "seed": 0, "steps": 60, "lr": 0.01}  # the experiment of exercise 5.4


@functools.lru_cache(maxsize=1)
def _heads_used_after_training() -> tuple[int, int, int]:
    """(heads used after training, heads used before, routed heads E) for the experiment of exercise 5.4."""
    from ..viz import moh as moh_viz

    state = moh_viz.compute_routing(offset=SKEWED["offset"], seed=SKEWED["seed"])
    run = moh_viz.train_router(state, steps=SKEWED["steps"], lr=SKEWED["lr"])
    return int((run.state.load > 0).sum()), int((state.load > 0).sum()), int(state.load.numel())


@exercise("5.4")
def check_heads_used(answer) -> Result:
    """Exercise 5.4: routed heads chosen by at least one token after training the router on skewed tokens.

    The experiment is deterministic (seeded), so the count is exact; the checker reruns it.
    """
    after, before, routed = _heads_used_after_training()
    return check_value(
        "5.4 heads used", answer, after, rtol=0.0, atol=0.0,
        hint="count the routed heads whose load (the share of tokens choosing them) is above 0.",
        mistakes=[
            (before, f"{before} is the count before training; train the router first (train_router(...).state)."),
            (routed, f"{routed} is every routed head; count those whose load after training is above 0."),
        ],
    )  # fmt: skip
