"""Checkers for the exercises of chapter 3 (Flow-Attention, Wu et al., "Flowformer", ICML 2022).

* 3.1 (derive): the total conserved outgoing flow, sum_j O^_j = N when eps = 0;
* 3.2 (implement): the causal incoming flow I_i = (q~_i + eps) . (sum_{j<=i} k~_j + eps) / t_i;
* 3.3 (implement): the causal competition c_j = t_j exp(clamp(O^_j)) / sum_{j'<=j} exp(clamp(O^_j'));
* 3.4 (derive): the largest competition weight M e / (e + M - 1) that the clamp allows;
* 3.5 (explore): the similarity of the toy tokens at which the clamp stops acting.

Expected results come from the package (:func:`attnbook.flow_attention` with ``return_flows=True``) or, for
the competition, from its literal definition (a softmax over each prefix, written as a masked N x N matrix).
"""

from __future__ import annotations

import math

import torch

from ._core import Case, Diagnosis, Result, check_function, check_value, exercise

__all__ = [
    "check_total_outgoing",
    "check_causal_incoming",
    "check_causal_competition",
    "check_largest_competition",
    "check_clamp_similarity",
]

EPS = 1e-6


def _qk(seed: int, B: int = 1, H: int = 2, N: int = 7, D: int = 3, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    return q, k


def _causal_stats(q, k, eps=EPS):
    import attnbook  # deferred: the package imports this module through attnbook.exercises

    v = torch.zeros(*k.shape[:-1], 1, dtype=k.dtype)  # the flows do not depend on the values
    _, stats = attnbook.flow_attention(q, k, v, causal=True, eps=eps, return_flows=True)
    return stats


# ------------------------------------------------------------------------------------------------ 3.1


@exercise("3.1")
def check_total_outgoing(answer) -> Result:
    """Exercise 3.1: sum_j O^_j for N = 5 queries (sinks) and M = 7 keys (sources), eps = 0."""
    name = "3.1 total outgoing flow"
    if answer is not None and not isinstance(answer, bool) and isinstance(answer, (int, float)):
        if math.isclose(answer, 7.0):
            return Result(
                False,
                f"{name}: 7 is M, the number of sources. Conservation fixes what the sinks take: "
                "each of the N sinks takes exactly one unit.",
            )
    return check_value(name, answer, 5.0, hint="swap the sums over i and j; each sink's row sums to one")


# ------------------------------------------------------------------------------------------------ 3.2


def _reference_incoming(q, k, eps=EPS):
    return _causal_stats(q, k, eps).incoming  # (B, H, N)


def _t(x):
    return torch.arange(1, x.shape[-2] + 1, dtype=x.dtype)  # (N,): t_i = i + 1


def _dot(x, y, eps):
    return ((x + eps) * (y + eps)).sum(-1)


def _incoming_no_t(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return _dot(qs, ks.cumsum(-2), eps)


def _incoming_whole_sequence(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return _dot(qs, ks.sum(-2, keepdim=True), eps) / _t(q)


def _incoming_whole_sequence_no_t(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return _dot(qs, ks.sum(-2, keepdim=True), eps)


def _incoming_strict_prefix(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    before = ks.cumsum(-2) - ks  # sum_{j<i} k~_j
    return _dot(qs, before, eps) / _t(q)


def _incoming_divides_by_i(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return _dot(qs, ks.cumsum(-2), eps) / (_t(q) - 1)


def _incoming_eps_once(q, k, eps=EPS):
    qs, ks = torch.sigmoid(q), torch.sigmoid(k)
    return ((qs * ks.cumsum(-2)).sum(-1) + eps) / _t(q)


def _incoming_no_sigmoid(q, k, eps=EPS):
    return _dot(q, k.cumsum(-2), eps) / _t(q)


INCOMING_MISTAKES = [
    Diagnosis("the prefix sum is not divided by the prefix length t_i = i + 1", _incoming_no_t),
    Diagnosis("the sum runs over all keys instead of the prefix j <= i", _incoming_whole_sequence),
    Diagnosis(
        "the sum runs over all keys instead of the prefix j <= i, and is not divided by t_i",
        _incoming_whole_sequence_no_t,
    ),
    Diagnosis("the prefix stops before key i (j < i): sink i must see its own source", _incoming_strict_prefix),
    Diagnosis("it divides by i instead of t_i = i + 1", _incoming_divides_by_i),
    Diagnosis(
        "eps is added once to the dot product instead of to every component of both vectors",
        _incoming_eps_once,
    ),
    Diagnosis("the sigmoid features are missing: q and k are used as they are", _incoming_no_sigmoid),
]


def incoming_cases() -> list[Case]:
    cases = [Case(_qk(seed), label=f"random q, k (seed {seed}, N = 7)") for seed in (0, 1)]
    cases.append(Case(_qk(2, B=2, H=1, N=5, D=4, scale=3.0), label="large q, k (B = 2, N = 5)"))
    cases.append(Case(_qk(3, N=1), label="a single token (N = 1)"))
    return cases


@exercise("3.2")
def check_causal_incoming(fn) -> Result:
    """Exercise 3.2: ``causal_incoming(q, k)`` -> I (B, H, N) of causal Flow-Attention, eps = 1e-6."""
    return check_function(
        fn,
        incoming_cases(),
        expected=_reference_incoming,
        name="causal_incoming",
        diagnoses=INCOMING_MISTAKES,
        success="causal_incoming is right on 4 inputs, N = 1 included.",
    )


# ------------------------------------------------------------------------------------------------ 3.3


def _reference_competition(o_hat):
    """The literal definition: for every j a softmax over the prefix j' <= j, times t_j (masked N x N)."""
    n = o_hat.shape[-1]
    clamped = o_hat.clamp(-1.0, 1.0)  # (B, H, N)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()  # row j: the prefix j' <= j
    logits = clamped[..., None, :].expand(*clamped.shape, n).masked_fill(~allowed, float("-inf"))  # (B, H, N, N)
    weights = torch.softmax(logits, dim=-1)  # row j: softmax over j' <= j
    return weights.diagonal(dim1=-2, dim2=-1) * torch.arange(1, n + 1, dtype=o_hat.dtype)  # (B, H, N)


def _t_last(x):
    return torch.arange(1, x.shape[-1] + 1, dtype=x.dtype)


def _competition_no_clamp(o_hat):
    e = o_hat.exp()
    return _t_last(o_hat) * e / e.cumsum(-1)


def _competition_whole_sequence(o_hat):
    return o_hat.shape[-1] * torch.softmax(o_hat.clamp(-1.0, 1.0), dim=-1)


def _competition_no_t(o_hat):
    e = o_hat.clamp(-1.0, 1.0).exp()
    return e / e.cumsum(-1)


def _competition_clamp_after_exp(o_hat):
    e = o_hat.exp().clamp(-1.0, 1.0)
    return _t_last(o_hat) * e / e.cumsum(-1)


COMPETITION_MISTAKES = [
    Diagnosis("the clamp to [-1, 1] is missing", _competition_no_clamp),
    Diagnosis(
        "the softmax runs over the whole sequence (times N) instead of over the prefix j' <= j",
        _competition_whole_sequence,
    ),
    Diagnosis("the prefix softmax is not multiplied by t_j = j + 1", _competition_no_t),
    Diagnosis("the clamp is applied after the exponential instead of before it", _competition_clamp_after_exp),
]


def competition_cases() -> list[Case]:
    cases = []
    for seed in (0, 1):
        q, k = _qk(seed, N=9, scale=2.0)
        cases.append(Case((_causal_stats(q, k).conserved_outgoing_raw,), label=f"O^ of random q, k (seed {seed})"))
    wide = torch.tensor([[[0.2, 1.7, -0.4, 3.0, 0.9, -2.5]]], dtype=torch.float64)  # (1, 1, 6)
    cases.append(Case((wide,), label="O^ = [0.2, 1.7, -0.4, 3.0, 0.9, -2.5] (beyond the clamp on both sides)"))
    cases.append(Case((torch.full((1, 2, 1), 0.5, dtype=torch.float64),), label="a single token (N = 1)"))
    return cases


@exercise("3.3")
def check_causal_competition(fn) -> Result:
    """Exercise 3.3: ``causal_competition(o_hat)`` -> c (B, H, N) from the raw O^ (B, H, N)."""
    return check_function(
        fn,
        competition_cases(),
        expected=_reference_competition,
        name="causal_competition",
        diagnoses=COMPETITION_MISTAKES,
        success="causal_competition is right on 4 inputs, beyond the clamp too.",
    )


# ------------------------------------------------------------------------------------------------ 3.4


def largest_competition(m: int) -> float:
    """sup of c_j over inputs for M sources: O^_j = 1, every other O^ -> 0, c_j = M e / (e + M - 1)."""
    return m * math.e / (math.e + m - 1)


@exercise("3.4")
def check_largest_competition(answer) -> Result:
    """Exercise 3.4: the largest competition weight one of M = 8 sources can get (the supremum)."""
    name = "3.4 largest competition weight"
    if answer is not None and not isinstance(answer, bool) and isinstance(answer, (int, float)):
        if math.isclose(answer, math.e, rel_tol=1e-6):
            return Result(
                False,
                f"{name}: e is the ratio of the largest to the smallest weight; the weight itself is "
                "M times a softmax, and the other M - 1 sources keep a share of it.",
            )
        if math.isclose(answer, 8.0):
            return Result(False, f"{name}: 8 = M is the limit without the clamp; with it, O^ is at most 1.")
    return check_value(
        name,
        answer,
        largest_competition(8),
        rtol=1e-4,
        hint="after the clamp every O^ lies in (0, 1]; put one at 1 and let the others go to 0",
    )


# ------------------------------------------------------------------------------------------------ 3.5


@exercise("3.5")
def check_clamp_similarity(answer) -> Result:
    """Exercise 3.5: the toy similarity from which on the clamp no longer changes the competition."""
    name = "3.5 similarity"
    if answer is not None and not isinstance(answer, bool) and isinstance(answer, (int, float)) and answer < 0.995:
        return Result(
            False,
            f"{name}: at similarity {answer:g} some sources still have O^ > 1 (look at the largest O^, or at "
            "the amount the clamp cuts off, not only at how many sources it cuts).",
        )
    return check_value(name, answer, 1.0, rtol=0, atol=5e-3, hint="the mean of O^ is exactly 1 in self-attention")
