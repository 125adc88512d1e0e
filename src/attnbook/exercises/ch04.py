"""Checkers for the exercises of chapter 4 (Mobile-Attention, Yao et al., ICML 2024).

* 4.1 (derive): the head budget, sum_h O^_hj = H at every token when eps = 0;
* 4.2 (implement): the head-axis conserved outgoing flow O^_hj (before the clamp);
* 4.3 (derive): Mobile's row sums a_hi N / H for inputs whose features are all 1/2;
* 4.4 (explore): how much the spread of small linear-attention heads grows with larger activations.

Expected results come from the package (:func:`attnbook.mobile_attention` with ``return_flows=True``).
"""

from __future__ import annotations

import math

import torch

from ._core import Case, Diagnosis, Result, check_function, check_value, exercise

__all__ = ["check_head_budget", "check_head_conserved_outgoing", "check_row_sums", "check_spread_growth"]

EPS = 1e-6


def _number(x) -> bool:
    return x is not None and not isinstance(x, bool) and isinstance(x, (int, float))


# ------------------------------------------------------------------------------------------------ 4.1


@exercise("4.1")
def check_head_budget(answer) -> Result:
    """Exercise 4.1: sum over the H = 6 heads of O^_hj at one token, for N = 10 tokens, eps = 0."""
    name = "4.1 head budget"
    if _number(answer) and math.isclose(answer, 10.0):
        return Result(
            False,
            f"{name}: 10 = N is Flow-Attention's budget of one head over the sequence; in "
            "Mobile-Attention the sums run over the heads at one token.",
        )
    return check_value(name, answer, 6.0, hint="swap the sums over the query heads h' and the key heads h")


# ------------------------------------------------------------------------------------------------ 4.2


def _qk(seed: int, B: int = 1, H: int = 3, N: int = 5, D: int = 2, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    return q, k


def _stats(fn, q, k, eps=EPS):
    v = torch.zeros(*k.shape[:-1], 1, dtype=k.dtype)  # the flows do not depend on the values
    _, stats = fn(q, k, v, eps=eps, return_flows=True)
    return stats


def _reference_conserved_outgoing(q, k, eps=EPS):
    import attnbook  # deferred: the package imports this module through attnbook.exercises

    return _stats(attnbook.mobile_attention, q, k, eps).conserved_outgoing_raw  # (B, H, N)


def _dot(x, y, eps):
    return ((x + eps) * (y + eps)).sum(-1)


def _over_sequence(q, k, eps=EPS):
    import attnbook

    return _stats(attnbook.flow_attention, q, k, eps).conserved_outgoing_raw


def _clamped(q, k, eps=EPS):
    return _reference_conserved_outgoing(q, k, eps).clamp(-1.0, 1.0)


def _outgoing_only(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return _dot(ks, qs.sum(1, keepdim=True), eps)  # O, not O^


def _incoming_from_queries(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    incoming = _dot(qs, qs.sum(1, keepdim=True), eps)  # wrong: sums the query heads
    return _dot(ks, (qs / incoming[..., None]).sum(1, keepdim=True), eps)


def _no_eps(q, k, eps=EPS):
    return _reference_conserved_outgoing(q, k, 0.0)


def _no_sigmoid(q, k, eps=EPS):
    incoming = _dot(q, k.sum(1, keepdim=True), eps)
    return _dot(k, (q / incoming[..., None]).sum(1, keepdim=True), eps)


CONSERVED_OUTGOING_MISTAKES = [
    Diagnosis(
        "the flow sums run over the sequence (dim -2) instead of the heads (dim 1): that is Flow-Attention's O^",
        _over_sequence,
    ),
    Diagnosis("the clamp is applied: return O^ before the clamp (the competition clamps it)", _clamped),
    Diagnosis(
        "it is the outgoing flow O: each query head must first be divided by its incoming flow I", _outgoing_only
    ),
    Diagnosis("the incoming flow I sums the query heads instead of the key heads at the token", _incoming_from_queries),
    Diagnosis("eps is left out (the published code adds it to every component of both vectors)", _no_eps),
    Diagnosis("the sigmoid features are missing: q and k are used as they are", _no_sigmoid),
]


def conserved_outgoing_cases() -> list[Case]:
    cases = [Case(_qk(seed, scale=2.0), label=f"random q, k (seed {seed}, H = 3, N = 5)") for seed in (0, 1)]
    cases.append(Case(_qk(2, B=2, H=4, N=3, D=3), label="B = 2, H = 4, N = 3, D = 3"))
    cases.append(Case(_qk(3, H=1, N=4), label="a single head (H = 1)"))
    return cases


@exercise("4.2")
def check_head_conserved_outgoing(fn) -> Result:
    """Exercise 4.2: ``head_conserved_outgoing(q, k)`` -> O^ (B, H, N) of Mobile-Attention, before the clamp."""
    return check_function(
        fn,
        conserved_outgoing_cases(),
        expected=_reference_conserved_outgoing,
        name="head_conserved_outgoing",
        diagnoses=CONSERVED_OUTGOING_MISTAKES,
        success="head_conserved_outgoing is right on 4 inputs, H = 1 included.",
    )


# ------------------------------------------------------------------------------------------------ 4.3


@exercise("4.3")
def check_row_sums(answer) -> Result:
    """Exercise 4.3: sum_j W_hij / a_hi for q = k = 0 (every feature 1/2), N = 12 tokens, H = 3 heads, eps = 0."""
    name = "4.3 row sum"
    if _number(answer) and math.isclose(answer, 1.0):
        return Result(
            False, f"{name}: 1 is Flow-Attention's row sum; Mobile's normaliser I_hi sums over the H heads only."
        )
    if _number(answer) and math.isclose(answer, 12.0):
        return Result(False, f"{name}: 12 = N; the normaliser I_hi still has one term per head, H of them.")
    return check_value(name, answer, 4.0, hint="with equal features every capacity is D / 4 and c_hj = 1")


# ------------------------------------------------------------------------------------------------ 4.4


@exercise("4.4")
def check_spread_growth(answer) -> Result:
    """Exercise 4.4: the factor by which the spread at D = 4 grows when q and k are scaled by 4."""
    name = "4.4 growth of the spread"
    if _number(answer) and math.isfinite(answer) and 0 < answer < 1:
        return Result(
            False,
            f"{name}: {answer:g} would mean the spread shrinks; divide the spread with scaled q, k by the "
            "spread without.",
        )
    if _number(answer) and math.isfinite(answer) and 1 <= answer < 5:
        return Result(
            False,
            f"{name}: {answer:g} is too small; did you scale both q and k, before the sigmoid, and keep "
            "the values as they are?",
        )
    return check_value(name, answer, 15.0, rtol=0.6, hint="run the experiment cell and divide the two spreads")
