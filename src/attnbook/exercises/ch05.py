"""Checkers for the exercises of chapter 5 (mixture-of-head attention).

* 5.1 (derive): the mean gate of a token's active heads, for h_s = 3 shared heads, h_r = 1 routed head and
  a two-stage weight a_1 = 1.2; checked against a real :class:`attnbook.MoHAttention`.
* 5.2 (implement): the top-h_r router, gates from router logits; checked against the layer's own router.
* 5.3 (implement): the load-balancing loss from the router's probabilities; checked against the layer.
* 5.4 (explore): how many routed heads the router still uses after training it on skewed tokens; checked
  by rerunning the experiment with :mod:`attnbook.viz.moh`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..moh import MoHAttention
from ._core import Case, Diagnosis, Result, check_function, check_value, exercise

__all__ = [
    "check_mean_gate",
    "check_top_k_gates",
    "check_load_balancing_loss",
    "check_heads_used",
    "mean_gate_setting",
    "SKEWED",
]

# ----------------------------------------------------------------------------------------------- 5.1

mean_gate_setting = {"shared_head": 3, "routed_head": 1, "a_1": 1.2}  # the numbers of exercise 5.1


def _mean_gate_from_the_layer() -> float:
    """A layer with h_s = 3, h_r = 1 whose two-stage router gives a_1 = 1.2; its mean active gate."""
    s, k, a_1 = mean_gate_setting["shared_head"], mean_gate_setting["routed_head"], mean_gate_setting["a_1"]
    layer = MoHAttention(4, num_heads=6, shared_head=s, routed_head=k, head_dim=2)
    x = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)  # (1, 1, C): one token
    logit = math.log(a_1 / (2 - a_1))  # 2 softmax((logit, 0))_1 = a_1
    with torch.no_grad():
        layer.double()
        layer.wg_0.weight.zero_()
        layer.wg_0.weight[0, 0] = logit
        routing = layer.route(x)
    active = routing.gates[routing.selected]  # the gates of the h_s + h_r active heads
    return float(active.mean())


@exercise("5.1")
def check_mean_gate(answer) -> Result:
    """Exercise 5.1: the mean gate (a_1 h_s + a_2 h_r) / (h_s + h_r) for h_s = 3, h_r = 1, a_1 = 1.2."""
    return check_value(
        "5.1 mean gate",
        answer,
        _mean_gate_from_the_layer(),
        rtol=1e-6,
        hint="a_1 + a_2 = 2; the shared gates sum to a_1 h_s and the routed ones to a_2 h_r.",
    )


# ----------------------------------------------------------------------------------------------- 5.2


def _router_gates(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The package's routed gates for router logits (..., E): a layer whose router W_r is the identity."""
    E = logits.shape[-1]
    layer = MoHAttention(E, num_heads=E, shared_head=0, routed_head=k, head_dim=1).to(logits.dtype)
    with torch.no_grad():
        layer.wg.weight.copy_(torch.eye(E, dtype=logits.dtype))
        x = logits.reshape(1, -1, E)  # (1, tokens, E)
        return layer.route(x).gates.reshape(logits.shape)


def _kept(logits, k):
    p = F.softmax(logits, dim=-1)
    mask = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(k, dim=-1).indices, True)
    return p, mask


def _not_renormalised(logits, k):
    p, mask = _kept(logits, k)
    return torch.where(mask, p, 0) * k


def _no_factor_k(logits, k):
    p, mask = _kept(logits, k)
    return torch.where(mask, p, 0) / (p * mask).sum(-1, keepdim=True)


def _softmax_over_tokens(logits, k):
    p = F.softmax(logits, dim=-2)
    mask = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(k, dim=-1).indices, True)
    return torch.where(mask, p, 0) / (p * mask).sum(-1, keepdim=True) * k


def _no_top_k(logits, k):
    return F.softmax(logits, dim=-1) * k


def _smallest_k(logits, k):
    p = F.softmax(logits, dim=-1)
    mask = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(k, dim=-1, largest=False).indices, True)
    return torch.where(mask, p, 0) / (p * mask).sum(-1, keepdim=True) * k


def _zeros_not_minus_inf(logits, k):
    p, mask = _kept(logits, k)
    return F.softmax(torch.where(mask, logits, 0), dim=-1) * k


def _gate_cases() -> list[Case]:
    g = torch.Generator().manual_seed(5)
    cases = [
        Case((torch.randn(2, 5, 6, generator=g, dtype=torch.float64), 2), label="logits (2, 5, 6), h_r = 2"),
        Case((3 * torch.randn(1, 4, 8, generator=g, dtype=torch.float64), 3), label="logits (1, 4, 8), h_r = 3"),
        Case((torch.randn(3, 1, 4, generator=g, dtype=torch.float64), 1), label="one token per sequence, h_r = 1"),
        Case((torch.randn(1, 3, 5, generator=g, dtype=torch.float64), 5), label="h_r = E = 5 (every head chosen)"),
    ]
    return cases


@exercise("5.2")
def check_top_k_gates(fn) -> Result:
    """Exercise 5.2: ``top_k_gates(logits, k)``: logits (B, N, E) -> gates (B, N, E)."""
    return check_function(
        fn,
        _gate_cases(),
        expected=_router_gates,
        name="top_k_gates",
        success="top_k_gates matches the layer's router on all 4 inputs.",
        diagnoses=[
            Diagnosis("the kept probabilities are not renormalised (divide by their sum)", _not_renormalised),
            Diagnosis("the factor h_r is missing: the gates sum to 1 instead of h_r", _no_factor_k),
            Diagnosis("the softmax runs over the tokens (dim=-2) instead of the heads (dim=-1)", _softmax_over_tokens),
            Diagnosis("every head keeps its gate: the top-h_r choice is missing", _no_top_k),
            Diagnosis("the h_r *least* probable heads are kept (largest=False)", _smallest_k),
            Diagnosis(
                "the unchosen logits are set to 0 instead of -inf before the softmax, so they still take probability",
                _zeros_not_minus_inf,
            ),
        ],
    )


# ----------------------------------------------------------------------------------------------- 5.3


def _package_loss(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The layer's load-balancing loss for router probabilities (B, N, E): route their logarithms."""
    E = probs.shape[-1]
    layer = MoHAttention(E, num_heads=E, shared_head=0, routed_head=k, head_dim=1).to(probs.dtype)
    with torch.no_grad():
        layer.wg.weight.copy_(torch.eye(E, dtype=probs.dtype))
        return layer.route(probs.log()).loss  # softmax(log p) = p


def _load(probs, k):
    return torch.zeros_like(probs).scatter(-1, probs.topk(k, dim=-1).indices, 1.0)  # (B, N, E) one per choice


def _counts_not_fractions(probs, k):
    E = probs.shape[-1]
    f = _load(probs, k).flatten(0, -2).sum(0)
    return E * (f * probs.flatten(0, -2).mean(0)).sum()


def _no_factor_e(probs, k):
    f = _load(probs, k).flatten(0, -2).mean(0)
    return (f * probs.flatten(0, -2).mean(0)).sum()


def _importance_of_chosen_only(probs, k):
    E = probs.shape[-1]
    chosen = _load(probs, k)
    f = chosen.flatten(0, -2).mean(0)
    return E * (f * (probs * chosen).flatten(0, -2).mean(0)).sum()


def _load_from_top_1(probs, k):
    E = probs.shape[-1]
    f = _load(probs, 1).flatten(0, -2).mean(0)
    return E * (f * probs.flatten(0, -2).mean(0)).sum()


def _factor_e_squared(probs, k):
    E = probs.shape[-1]
    f = _load(probs, k).flatten(0, -2).mean(0)
    return E * E * (f * probs.flatten(0, -2).mean(0)).sum()


def _loss_cases() -> list[Case]:
    g = torch.Generator().manual_seed(7)

    def probs(*shape, scale=1.0):
        return F.softmax(scale * torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)

    return [
        Case((probs(2, 6, 5), 2), label="probabilities (2, 6, 5), h_r = 2"),
        Case((probs(1, 9, 4, scale=3.0), 1), label="sharp probabilities (1, 9, 4), h_r = 1"),
        Case((probs(3, 4, 6), 3), label="probabilities (3, 4, 6), h_r = 3"),
    ]


@exercise("5.3")
def check_load_balancing_loss(fn) -> Result:
    """Exercise 5.3: ``load_balancing_loss(probs, k)``: probs (B, N, E) -> the scalar E sum_e f_e P_e."""
    return check_function(
        fn,
        _loss_cases(),
        expected=_package_loss,
        name="load_balancing_loss",
        success="load_balancing_loss matches the layer's loss on all 3 inputs.",
        diagnoses=[
            Diagnosis("the load counts tokens instead of taking their fraction (divide by B N)", _counts_not_fractions),
            Diagnosis("the factor E is missing (the loss should be h_r at balance)", _no_factor_e),
            Diagnosis(
                "the importance P_e averages only the chosen heads' probabilities; it is the mean of the whole softmax",
                _importance_of_chosen_only,
            ),
            Diagnosis("the load counts only each token's top-1 head instead of its top h_r", _load_from_top_1),
            Diagnosis("the factor is E^2 instead of E (E^2 goes with the mean over heads)", _factor_e_squared),
        ],
    )


# ----------------------------------------------------------------------------------------------- 5.4

SKEWED = {"offset": 4.0, "seed": 0, "steps": 60, "lr": 0.01}  # the experiment of exercise 5.4


def _heads_used_after_training() -> int:
    from ..viz import moh as moh_viz

    state = moh_viz.compute_routing(offset=SKEWED["offset"], seed=SKEWED["seed"])
    run = moh_viz.train_router(state, steps=SKEWED["steps"], lr=SKEWED["lr"])
    return int((run.state.load > 0).sum())


@exercise("5.4")
def check_heads_used(answer) -> Result:
    """Exercise 5.4: routed heads chosen by at least one token after training the router on skewed tokens."""
    return check_value(
        "5.4 heads used",
        answer,
        _heads_used_after_training(),
        rtol=0.0,
        atol=0.0,
        hint="count the routed heads whose load (the share of tokens choosing them) is above 0.",
    )
