"""Checkers for the exercises of chapter 1 (softmax attention).

* 1.1 ``masked_softmax(scores, allowed)``: weights over the allowed keys, zeros on a row with none.
* 1.2 ``causal_attention(q, k, v)``: softmax attention in which query i sees the keys j <= i.
* 1.3 ``bandwidth(D)``: the Gaussian kernel's bandwidth h that the 1/sqrt(D) scaling amounts to.
* 1.4 ``gap(p, M)``: how far the best score must lead for its weight to reach p.

Each checker calls the student's function on random and edge-case inputs, compares with the float64
definition (:func:`attnbook.reference.softmax_attention`) or the closed form, and names the common
mistakes it recognises (a NaN on an empty row, a mask read the wrong way round, a missing 1/sqrt(D), a
causal mask off by one, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .. import reference
from ..testing import tol
from ._core import Case, Diagnosis, Result, check_function, exercise, first_difference

__all__ = [
    "check_masked_softmax",
    "check_causal_attention",
    "check_bandwidth",
    "check_gap",
    "masked_softmax_solution",
]

# --- a diagnosis for mistakes that give NaN -----------------------------------------------------------------------
# The core compares an answer with a known wrong variant value by value, and NaN never equals NaN. Mistakes
# whose signature *is* a NaN (0 / 0 on an empty row, exp overflowing) are therefore recognised here first:
# the answer has NaN exactly where the variant has, and agrees with it everywhere else.


def _call(fn: Callable, case: Case):
    try:
        return fn(*_copy(case.args), **_copy(case.kwargs))
    except Exception:  # reported by check_function, which calls again
        return None


def _copy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, tuple):
        return tuple(_copy(y) for y in x)
    if isinstance(x, dict):
        return {key: _copy(y) for key, y in x.items()}
    return x


def nan_diagnosis(
    fn: Callable, cases: Sequence[Case], *, expected: Callable, name: str, diagnoses: Sequence[Diagnosis]
) -> Result | None:
    """A failing :class:`Result` when ``fn``'s first wrong answer is a NaN that a known mistake explains, else None.

    Cases are tried in order, as :func:`attnbook.exercises.check_function` does; a case whose answer is wrong
    without NaN (or raises) ends the search, and the caller's ``check_function`` reports it.
    """
    if not callable(fn):
        return None
    for case in cases:
        got = _call(fn, case)
        want = expected(*_copy(case.args), **_copy(case.kwargs))
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or not got.is_floating_point():
            return None
        rtol, atol = tol(torch.float64).values()
        if not bool(torch.isnan(got).any()):
            if first_difference(got, want, rtol=rtol, atol=atol) is None:
                continue
            return None
        for d in diagnoses:
            try:
                variant = d.wrong(*_copy(case.args), **_copy(case.kwargs))
            except Exception:
                continue
            g, v = got.detach().cpu().double(), variant.detach().cpu().double()
            if torch.equal(torch.isnan(g), torch.isnan(v)) and torch.allclose(g, v, rtol, atol, equal_nan=True):
                problem = first_difference(got, want, rtol=rtol, atol=atol)
                return Result(False, f"{name}, on {case.label}: the result {problem}.\nIt looks like {d.message}.")
        return None
    return None


def _check(fn, cases, *, expected, name, diagnoses=(), nan_diagnoses=(), success=None) -> Result:
    found = nan_diagnosis(fn, cases, expected=expected, name=name, diagnoses=nan_diagnoses)
    if found is not None:
        return found
    return check_function(fn, cases, expected=expected, name=name, diagnoses=diagnoses, success=success)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, dtype=torch.float64, generator=_gen(seed))


# --- 1.1 a masked softmax that gives zeros on empty rows ----------------------------------------------------------


def masked_softmax_solution(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` (..., N, M) along the last dimension over the keys where ``allowed`` is True.

    Hidden keys get weight 0; a row with no allowed key gets all zeros (never NaN).
    """
    top = scores.masked_fill(~allowed, -math.inf).amax(dim=-1, keepdim=True)  # (..., N, 1)
    top = torch.where(torch.isfinite(top), top, 0.0)  # an empty row: any shift will do
    e = torch.exp(scores - top) * allowed  # (..., N, M), 0 where hidden
    total = e.sum(dim=-1, keepdim=True)  # (..., N, 1)
    return e / torch.where(total > 0, total, 1.0)


def _softmax_all(scores, allowed):
    return torch.softmax(scores, dim=-1)


_SOFTMAX_MISTAKES = [
    Diagnosis(
        "the masked weights are set to zero after a softmax over all keys: the allowed weights then no longer "
        "sum to one (mask the scores with -inf before the softmax)",
        lambda s, a: torch.softmax(s, dim=-1) * a,
    ),
    Diagnosis(
        "the mask is read the wrong way round: True means 'may attend' (as in torch's SDPA), not 'hide'",
        lambda s, a: masked_softmax_solution(s, ~a),
    ),
    Diagnosis(
        "the hidden scores are set to 0 instead of -inf, so hidden keys still get weight",
        lambda s, a: torch.softmax(s.masked_fill(~a, 0.0), dim=-1),
    ),
    Diagnosis(
        "the hidden scores get a large negative number instead of -inf: a row with no allowed key then gets "
        "uniform weights 1/M instead of zeros",
        lambda s, a: torch.softmax(s.masked_fill(~a, -1e9), dim=-1),
    ),
    Diagnosis("the mask is ignored", _softmax_all),
]

_SOFTMAX_NAN_MISTAKES = [
    Diagnosis(
        "a row with no allowed key is a softmax over nothing but -inf, which is 0 / 0 = NaN: give such rows zeros",
        lambda s, a: torch.softmax(s.masked_fill(~a, -math.inf), dim=-1),
    ),
    Diagnosis(
        "exp overflows: subtract each row's largest allowed score before taking exp",
        lambda s, a: (torch.exp(s) * a) / (torch.exp(s) * a).sum(dim=-1, keepdim=True),
    ),
]


def _softmax_cases() -> list[Case]:
    mask = torch.rand(4, 6, generator=_gen(1)) > 0.4
    mask[:, 0] = True  # every row has a key
    empty = torch.ones(3, 5, dtype=torch.bool)
    empty[1] = False
    empty[2, 3:] = False
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 3, 5, 5)
    big = torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 2.0, 1.0]], dtype=torch.float64)
    big_mask = torch.tensor([[True, True, False], [True, False, True]])
    return [
        Case((_randn(4, 6, seed=0), mask), label="random (4, 6) scores with a random mask"),
        Case((_randn(3, 5, seed=2), empty), label="a (3, 5) mask whose second row allows no key"),
        Case((_randn(2, 3, 5, 5, seed=3), causal), label="(2, 3, 5, 5) scores with a causal mask"),
        Case((big, big_mask), label="scores of 1000"),
    ]


@exercise("1.1")
def check_masked_softmax(fn) -> Result:
    """Exercise 1.1: ``fn(scores, allowed)`` -> weights (..., N, M) with zeros on hidden keys and empty rows."""
    return _check(
        fn,
        _softmax_cases(),
        expected=masked_softmax_solution,
        name="masked_softmax",
        diagnoses=_SOFTMAX_MISTAKES,
        nan_diagnoses=_SOFTMAX_NAN_MISTAKES,
        success="masked_softmax is right: weights on the allowed keys only, zeros on an empty row, no "
        "overflow at scores of 1000.",
    )


# --- 1.2 causal attention -----------------------------------------------------------------------------------------


def _causal(q, k, v):
    return reference.softmax_attention(q, k, v, causal=True)


def _with_mask(diagonal: int, *, transpose: bool = False, scale: Callable[[int], float] | None = None):
    def wrong(q, k, v):
        N = q.shape[-2]
        allowed = torch.ones(N, N, dtype=torch.bool).tril(diagonal)
        if transpose:
            allowed = allowed.T
        s = None if scale is None else scale(q.shape[-1])
        return reference.softmax_attention(q, k, v, mask=allowed, scale=s)

    return wrong


def _nan_on_empty_rows(q, k, v):
    """The diagonal left out (j < i) with a plain -inf softmax: the first query has no key, 0 / 0."""
    N, D = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (..., N, N)
    allowed = torch.ones(N, N, dtype=torch.bool).tril(-1)
    return torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1) @ v


_CAUSAL_MISTAKES = [
    Diagnosis(
        "the scores are not divided by sqrt(D)",
        lambda q, k, v: reference.softmax_attention(q, k, v, causal=True, scale=1.0),
    ),
    Diagnosis(
        "the scores are divided by D instead of sqrt(D)",
        lambda q, k, v: reference.softmax_attention(q, k, v, causal=True, scale=1.0 / q.shape[-1]),
    ),
    Diagnosis("the causal mask is off by one: query i sees key i + 1 as well (it must see only j <= i)", _with_mask(1)),
    Diagnosis(
        "the causal mask is off by one: query i does not see its own key i (it must see j <= i, diagonal included)",
        _with_mask(-1),
    ),
    Diagnosis(
        "the mask is transposed: query i sees the keys j >= i, the future, instead of j <= i",
        _with_mask(0, transpose=True),
    ),
    Diagnosis(
        "there is no causal mask: every query sees every key", lambda q, k, v: reference.softmax_attention(q, k, v)
    ),
]

_CAUSAL_NAN_MISTAKES = [
    Diagnosis(
        "the causal mask is off by one: query i does not see its own key i, so the first query has no key "
        "at all and its softmax is 0 / 0 (it must see j <= i, diagonal included)",
        _nan_on_empty_rows,
    )
]


def _causal_cases() -> list[Case]:
    return [
        Case(
            (_randn(2, 1, 5, 4, seed=10), _randn(2, 1, 5, 4, seed=11), _randn(2, 1, 5, 3, seed=12)),
            label="q, k (2, 1, 5, 4) and v (2, 1, 5, 3)",
        ),
        Case(
            (_randn(1, 2, 7, 16, seed=13), _randn(1, 2, 7, 16, seed=14), _randn(1, 2, 7, 16, seed=15)),
            label="q, k, v (1, 2, 7, 16)",
        ),
        Case(
            (_randn(1, 1, 1, 4, seed=16), _randn(1, 1, 1, 4, seed=17), _randn(1, 1, 1, 2, seed=18)),
            label="a single token",
        ),
    ]


@exercise("1.2")
def check_causal_attention(fn) -> Result:
    """Exercise 1.2: ``fn(q, k, v)`` -> causal softmax attention (B, H, N, Dv), scores scaled by 1/sqrt(D)."""
    return _check(
        fn,
        _causal_cases(),
        expected=_causal,
        name="causal_attention",
        diagnoses=_CAUSAL_MISTAKES,
        nan_diagnoses=_CAUSAL_NAN_MISTAKES,
        success="causal_attention is right: scaled by 1/sqrt(D), each query sees itself and the past only.",
    )


# --- 1.3 the bandwidth of the Gaussian kernel ---------------------------------------------------------------------


def _d_cases() -> list[Case]:
    return [Case((d,), label=f"D = {d}") for d in (16, 2, 64, 100, 1)]


@exercise("1.3")
def check_bandwidth(fn) -> Result:
    """Exercise 1.3: ``fn(D)`` -> the bandwidth h with exp(-|q - k|^2 / 2h^2) ~ exp(q . k / sqrt(D)), h = D^(1/4)."""
    return check_function(
        fn,
        _d_cases(),
        expected=lambda d: d**0.25,
        name="bandwidth",
        diagnoses=[
            Diagnosis("h = sqrt(D); but it is h^2 that equals sqrt(D)", lambda d: math.sqrt(d)),
            Diagnosis(
                "h = 1 / sqrt(D): the kernel divides by h^2, the scores multiply by 1 / sqrt(D)", lambda d: d**-0.5
            ),
            Diagnosis("h = D^(-1/4): the kernel divides by h^2, so h^2 = sqrt(D), not 1 / sqrt(D)", lambda d: d**-0.25),
            Diagnosis(
                "h^2 = sqrt(D) / 2: the 2 of 2h^2 is already matched by the 2 q.k of the expanded square",
                lambda d: (d**0.5 / 2) ** 0.5,
            ),
        ],
        rtol=1e-6,
        atol=0.0,
        success="bandwidth is right: h = D^(1/4), so h^2 = sqrt(D).",
    )


# --- 1.4 the gap that saturates a softmax -------------------------------------------------------------------------


def _gap(p: float, M: int) -> float:
    return math.log(p * (M - 1) / (1 - p))


@exercise("1.4")
def check_gap(fn) -> Result:
    """Exercise 1.4: ``fn(p, M)`` -> the lead Delta of the top score over M - 1 equal others for a top weight p."""
    cases = [Case((p, m), label=f"p = {p}, M = {m}") for p, m in ((0.9, 64), (0.5, 2), (0.99, 1000), (0.3, 5))]
    return check_function(
        fn,
        cases,
        expected=_gap,
        name="gap",
        diagnoses=[
            Diagnosis(
                "M keys compete with the best one; there are M - 1 others", lambda p, m: math.log(p * m / (1 - p))
            ),
            Diagnosis("the M - 1 other keys are left out of the sum", lambda p, m: math.log(p / (1 - p))),
            Diagnosis("the logarithm is missing: Delta is the exponent of e", lambda p, m: p * (m - 1) / (1 - p)),
            Diagnosis(
                "the logarithm is base 10; softmax uses exp, so use the natural log",
                lambda p, m: math.log10(p * (m - 1) / (1 - p)),
            ),
        ],
        rtol=1e-6,
        atol=1e-9,
        success="gap is right: Delta = ln(p (M - 1) / (1 - p)).",
    )
