"""Checkers for the exercises of chapter 1 (softmax attention).

* 1.1 ``masked_softmax(scores, allowed)``: weights over the allowed keys, zeros on a row with none.
* 1.2 ``causal_attention(q, k, v)``: softmax attention in which query i sees the keys j <= i.
* 1.3 ``bandwidth(D)``: the Gaussian kernel's bandwidth λ that the 1/sqrt(D) scaling amounts to (the book's
  λ; h is a head).
* 1.4 ``gap(ω, M)``: how far the best score must lead for its weight to reach ω (the book's ω; p is the
  probability of chapter 7).
* 1.5 (explore): the c of the scale c / sqrt(D) at which the median gradient norm of the softmax is largest,
  measured by rerunning the chapter's experiment on the checker's own seeds.

Each checker calls the student's function on random and edge-case inputs (up to N = 64 and beyond), compares
with the float64 definition written out here (the same as :func:`attnbook.reference.softmax_attention`, which
the tests confirm) or the closed form, and names the common mistakes it recognises (a NaN on an empty row, a
shift by a hidden key's score, a mask read the wrong way round, a missing 1/sqrt(D), a causal mask off by
one, ...). Every mistake has at least two inputs that show it, so that one coincidence cannot name it.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable

import numpy as np
import torch

from ._core import Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise

__all__ = [
    "check_masked_softmax",
    "check_causal_attention",
    "check_bandwidth",
    "check_gap",
    "check_best_scale",
    "softmax_stats",
    "SCALE_SETUP",
    "masked_softmax_solution",
    "causal_reference",
]

FIXED_SIZE = (
    "these inputs are longer than the others: does something depend on a fixed size (a mask cut from an 8 x 8 "
    "buffer, a hard-coded arange)?"
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, dtype=torch.float64, generator=_gen(seed))


def _mask(*shape: int, seed: int, p: float = 0.5) -> torch.Tensor:
    """A random boolean mask (True = may attend) in which every row allows at least one key."""
    allowed = torch.rand(*shape, generator=_gen(seed)) < p
    first = torch.randint(shape[-1], shape[:-1], generator=_gen(seed + 1))
    return allowed.scatter(-1, first[..., None], True)


# --- 1.1 a masked softmax that gives zeros on empty rows ----------------------------------------------------------


def masked_softmax_solution(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` (..., N, M) along the last dimension over the keys where ``allowed`` is True.

    Hidden keys get weight 0; a row with no allowed key gets all zeros (never NaN).
    """
    hidden = scores.masked_fill(~allowed, -math.inf)  # (..., N, M)
    top = hidden.amax(dim=-1, keepdim=True)  # (..., N, 1): the largest allowed score
    top = torch.where(torch.isfinite(top), top, 0.0)  # an empty row: any shift will do
    e = torch.exp(hidden - top)  # (..., N, M), exp(-inf) = 0 where hidden
    total = e.sum(dim=-1, keepdim=True)  # (..., N, 1)
    return e / torch.where(total > 0, total, 1.0)


def _exp_before_mask(s, a):
    """exp of every score, then zeroed: a hidden score far above the allowed ones gives inf * 0 = NaN."""
    top = s.masked_fill(~a, -math.inf).amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    e = torch.exp(s - top) * a
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0)


def _shift_by_all_keys(guarded: bool):
    def wrong(s, a):
        e = torch.exp(s - s.amax(dim=-1, keepdim=True)) * a
        total = e.sum(dim=-1, keepdim=True)
        return e / torch.where(total > 0, total, 1.0) if guarded else e / total

    return wrong


def _float(x) -> torch.Tensor:
    """The student's weights as a float64 tensor (a numpy array too), for describing what they show."""
    return torch.as_tensor(np.asarray(x) if isinstance(x, np.ndarray) else x).detach().to(torch.float64)


def _row(index) -> str:
    index = tuple(int(i) for i in index)
    return f"row {index[0]}" if len(index) == 1 else f"row {index}"


def _first(mask: torch.Tensor):
    """The index of the first True entry of ``mask``, or None."""
    found = mask.nonzero()
    return None if found.numel() == 0 else tuple(found[0].tolist())


def _shows_empty_rows(what: str):
    def shows(got, want, s, a):
        w = _float(got)
        empty = ~a.any(-1)  # (..., N)
        r = _first(empty & (~torch.isfinite(w).all(-1) if what == "nan" else (w != 0).any(-1)))
        if r is None:
            return None
        if what == "nan":
            return f"{_row(r)} allows no key and its weights are NaN, where they should all be 0"
        return f"{_row(r)} allows no key and its weights are {w[r].max():.3g} (1/M) where they should all be 0"

    return shows


def _shows_overflow(got, want, s, a):
    w = _float(got)
    r = _first(~torch.isfinite(w).all(-1))
    if r is None:
        return None
    top = float(s.masked_fill(~a, -math.inf)[r].max())
    return f"{_row(r)}, whose largest allowed score is {top:.4g}, is NaN (or inf)"


def _shows_hidden_giant(got, want, s, a):
    w = _float(got)
    r = _first((~torch.isfinite(w).all(-1) | ((w.sum(-1) - 1).abs() > 1e-3)) & a.any(-1))
    if r is None:  # wrong only on the rows that allow no key
        return _shows_empty_rows("nan")(got, want, s, a)
    hidden, allowed = s.masked_fill(a, -math.inf)[r].max(), s.masked_fill(~a, -math.inf)[r].max()
    total = "is NaN" if not bool(torch.isfinite(w[r]).all()) else f"sums to {float(w[r].sum()):.3g}, not 1"
    scores = f"it has a hidden score of {float(hidden):.4g}, its allowed ones at most {float(allowed):.3g}"
    return f"{_row(r)} {total}; {scores}"


def _shows_row_sum(got, want, s, a):
    w = _float(got)
    r = _first(((w.sum(-1) - 1).abs() > 1e-3) & a.any(-1))
    if r is None:
        return None
    return f"{_row(r)} sums to {float(w[r].sum()):.3g} where it should sum to 1 (it allows {int(a[r].sum())} keys)"


def _shows_weight_on_hidden(got, want, s, a):
    w = _float(got)
    at = _first((w != 0) & ~a)
    if at is None:
        return None
    return f"hidden key {at[-1]} of {_row(at[:-1])} has weight {float(w[at]):.3g} where it should have 0"


def _shows_columns(got, want, s, a):
    w = _float(got)
    col, r = w.sum(-2), w.sum(-1)
    bad = _first((r - 1).abs() > 1e-3)
    if bad is None:
        return None
    return (
        f"the weights of each column sum to 1 or 0 (column 0: {float(col.reshape(-1)[0]):.3g}), while "
        f"{_row(bad)} sums to {float(r[bad]):.3g} where it should sum to 1"
    )


_SHIFT_BY_ALL = (
    "the weights of a shift by each row's largest score over all keys, hidden ones included: a large score on "
    "a hidden key then makes every allowed exp underflow to 0 (shift by the largest allowed score)"
)
_OVERFLOW = (
    "exp overflows: subtract each row's largest allowed score before taking exp (exp of a score above about "
    "709, or 88 in float32, is inf, and inf / inf = NaN)"
)

# Each diagnosis says first what the numbers of the failing case show, then which known variant they equal.
_SOFTMAX_MISTAKES = [
    Diagnosis(
        "a softmax over nothing but -inf, which is 0 / 0 = NaN: give such rows zeros",
        lambda s, a: torch.softmax(s.masked_fill(~a, -math.inf), dim=-1),
        _shows_empty_rows("nan"),
    ),
    Diagnosis(
        _OVERFLOW, lambda s, a: (torch.exp(s) * a) / (torch.exp(s) * a).sum(dim=-1, keepdim=True), _shows_overflow
    ),
    Diagnosis(
        _OVERFLOW,
        lambda s, a: (
            torch.exp(s.masked_fill(~a, -math.inf)) / torch.exp(s.masked_fill(~a, -math.inf)).sum(dim=-1, keepdim=True)
        ),
        _shows_overflow,
    ),
    Diagnosis(
        "an exp of the hidden score: exp(1000 - top) is inf, and inf * 0 = NaN, so no mask applied after exp "
        "can zero it (put -inf in place of the hidden scores before exp)",
        _exp_before_mask,
        _shows_hidden_giant,
    ),
    Diagnosis(_SHIFT_BY_ALL, _shift_by_all_keys(guarded=True), _shows_hidden_giant),
    Diagnosis(_SHIFT_BY_ALL, _shift_by_all_keys(guarded=False), _shows_hidden_giant),
    Diagnosis(
        "the weights of a softmax over all keys with the hidden ones set to 0 afterwards, which no longer sum to "
        "one (mask the scores with -inf before the softmax)",
        lambda s, a: torch.softmax(s, dim=-1) * a,
        _shows_row_sum,
    ),
    Diagnosis(
        "the mask read the wrong way round: True means 'may attend' (as in torch's SDPA), not 'hide'",
        lambda s, a: masked_softmax_solution(s, ~a),
        _shows_weight_on_hidden,
    ),
    Diagnosis(
        "the weights of a softmax with the hidden scores set to 0 instead of -inf, so hidden keys still get weight",
        lambda s, a: torch.softmax(s.masked_fill(~a, 0.0), dim=-1),
        _shows_weight_on_hidden,
    ),
    Diagnosis(
        "what a large negative number in place of -inf gives a row with no allowed key: uniform weights 1/M "
        "instead of zeros",
        lambda s, a: torch.softmax(s.masked_fill(~a, -1e9), dim=-1),
        _shows_empty_rows("uniform"),
    ),
    Diagnosis(
        "a softmax along dim -2 (over the queries) instead of along each row",
        lambda s, a: masked_softmax_solution(s.transpose(-2, -1), a.transpose(-2, -1)).transpose(-2, -1),
        _shows_columns,
    ),
    Diagnosis(
        "the weights of a softmax over every key, as if there were no mask",
        lambda s, a: torch.softmax(s, dim=-1),
        _shows_weight_on_hidden,
    ),
]


def _softmax_expected(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The masked softmax in float64, returned in the scores' dtype."""
    return masked_softmax_solution(scores.double(), allowed).to(scores.dtype)


def _random_softmax_cases(draw: Draw) -> list[Case]:
    """Two inputs of sizes the statement does not mention: a long one in float64 (N or M up to 300, some rows
    empty, some hidden scores large) and a small odd one in float32."""
    cases = []
    for long, dtype in ((True, torch.float64), (False, torch.float32)):
        n = draw.int(129, 300) if long else draw.int(1, 23)
        m = draw.int(1, 300) if long else draw.int(1, 23)
        batch = [draw.int(1, 2) for _ in range(draw.int(0, 2))]
        scores = draw.randn(*batch, n, m, scale=draw.uniform(0.5, 6.0))
        allowed = draw.rand(*batch, n, m) < draw.uniform(0.2, 0.9)
        allowed &= draw.rand(*batch, n, 1) > 0.1  # about one row in ten allows no key
        scores = torch.where(allowed | (draw.rand(*batch, n, m) < 0.8), scores, scores + 1000)  # large hidden ones
        shape = ", ".join(str(x) for x in (*batch, n, m))
        kind = "" if dtype == torch.float64 else "float32 "
        cases.append(
            Case(
                (scores.to(dtype), allowed),
                label=draw.label(f"{kind}({shape}) scores, some rows empty, some hidden scores large"),
                note=FIXED_SIZE if long else None,
            )
        )
    return cases


def _softmax_cases(draw: Draw) -> list[Case]:
    empty = torch.ones(3, 5, dtype=torch.bool)
    empty[1] = False
    empty[2, 3:] = False
    empty_64 = _mask(64, 64, seed=3)
    empty_64[[5, 17, 40]] = False  # three rows with no allowed key
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 3, 5, 5)
    big = torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 2.0, 1.0]], dtype=torch.float64)
    big_mask = torch.tensor([[True, True, False], [True, False, True]])
    big_64 = 800 + _randn(4, 64, seed=5, scale=5.0)  # every allowed score far above exp's range
    hidden = _randn(3, 6, seed=6)
    hidden_mask = torch.tensor([[True, True, False, True, False, True]] * 3)
    hidden[:, 2] = 1000.0  # a large score on a hidden key
    hidden_64 = _randn(2, 64, 70, seed=7)
    hidden_64_mask = _mask(2, 64, 70, seed=8, p=0.7)
    hidden_64 = torch.where(hidden_64_mask, hidden_64, 1000.0 + hidden_64)  # every hidden score large
    empty_7 = _mask(3, 7, seed=13)
    empty_7[0] = False
    return [
        Case((_randn(4, 6, seed=0), _mask(4, 6, seed=1, p=0.6)), label="random (4, 6) scores with a random mask"),
        Case((_randn(3, 5, seed=2), empty), label="a (3, 5) mask whose second row allows no key"),
        Case((_randn(2, 3, 5, 5, seed=9), causal), label="(2, 3, 5, 5) scores with a causal mask"),
        Case((big, big_mask), label="scores of 1000"),
        Case((hidden, hidden_mask), label="a score of 1000 on a hidden key"),
        Case((_randn(2, 64, 64, seed=10, scale=3.0), _mask(2, 64, 64, seed=11)), label="random (2, 64, 64) scores"),
        Case((_randn(64, 64, seed=12, scale=3.0), empty_64), label="(64, 64) scores with three empty rows"),
        Case((big_64, torch.ones(4, 64, dtype=torch.bool)), label="(4, 64) scores around 800, no mask"),
        Case((hidden_64, hidden_64_mask), label="(2, 64, 70) scores, every hidden one around 1000"),
        Case((_randn(3, 7, seed=14).float(), empty_7), label="float32 (3, 7) scores, the first row empty"),
        Case((hidden.float(), hidden_mask), label="float32 scores, a score of 1000 on a hidden key"),
        *_random_softmax_cases(draw),
    ]


@exercise("1.1")
def check_masked_softmax(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.1: ``fn(scores, allowed)`` -> weights (..., N, M) with zeros on hidden keys and empty rows, in
    the scores' dtype. ``seed`` draws the random inputs of an earlier call again."""
    return check_function(
        fn,
        _softmax_cases(Draw(seed)),
        expected=_softmax_expected,
        name="masked_softmax",
        diagnoses=_SOFTMAX_MISTAKES,
        success="masked_softmax is right: weights on the allowed keys only, zeros on an empty row, no "
        "overflow at scores of 1000, hidden scores of 1000 ignored, float32 in and out.",
    )


# --- 1.2 causal attention -----------------------------------------------------------------------------------------


def _attend(q, k, v, allowed: torch.Tensor | None, scale: float | None = None) -> torch.Tensor:
    """Softmax attention written out in float64, returned in q's dtype: weights over the ``allowed`` keys."""
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * s  # (..., N, M)
    if allowed is None:
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool)
    return (masked_softmax_solution(scores, allowed.expand_as(scores)) @ v).to(dtype)  # (..., N, Dv)


def _tril(n: int, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril(diagonal)


def causal_reference(q, k, v) -> torch.Tensor:
    """Causal softmax attention, q.k / sqrt(D), query i over the keys j <= i, in float64 (returned in q's dtype)."""
    return _attend(q, k, v, _tril(q.shape[-2]))


def _with_mask(diagonal: int, *, transpose: bool = False) -> Callable:
    def wrong(q, k, v):
        allowed = _tril(q.shape[-2], diagonal)
        return _attend(q, k, v, allowed.T if transpose else allowed)

    return wrong


def _scaled(scale_of_d: Callable[[int], float]) -> Callable:
    return lambda q, k, v: _attend(q, k, v, _tril(q.shape[-2]), scale=scale_of_d(q.shape[-1]))


def _nan_on_first_row(q, k, v):
    """The diagonal left out (j < i) with a plain -inf softmax: the first query has no key, 0 / 0."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (..., N, N)
    return torch.softmax(scores.masked_fill(~_tril(q.shape[-2], -1), -math.inf), dim=-1) @ v


def _masked_after_softmax(q, k, v):
    """The softmax over every key, then the future zeroed and the rows renormalised: a large score on a future key
    takes all of a row's weight, nothing is left for the past, and the renormalisation is 0 / 0."""
    dtype, (q, k, v) = q.dtype, (x.double() for x in (q, k, v))
    p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) * _tril(q.shape[-2])
    return (p / p.sum(-1, keepdim=True) @ v).to(dtype)


def _exp_without_the_maximum(q, k, v):
    """exp of the masked scores without subtracting each row's maximum: a large score overflows to inf, inf / inf."""
    dtype, (q, k, v) = q.dtype, (x.double() for x in (q, k, v))
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) * _tril(q.shape[-2])
    return (e / e.sum(-1, keepdim=True) @ v).to(dtype)


_CAUSAL_MISTAKES = [
    Diagnosis(
        "the softmax is taken over every key and the future masked afterwards: a large score on a future key "
        "takes all of the row, and renormalising what is left is 0 / 0; mask the scores (-inf) before the softmax",
        _masked_after_softmax,
    ),
    Diagnosis(
        "exp is taken of the scores as they are: a large score overflows to inf and the row becomes inf / inf; "
        "subtract each row's largest (allowed) score first, as torch.softmax does",
        _exp_without_the_maximum,
    ),
    Diagnosis("the scores are not divided by sqrt(D)", _scaled(lambda d: 1.0)),
    Diagnosis("the scores are divided by D instead of sqrt(D)", _scaled(lambda d: 1.0 / d)),
    Diagnosis("the scores are multiplied by sqrt(D) instead of divided by it", _scaled(lambda d: math.sqrt(d))),
    Diagnosis("the causal mask is off by one: query i sees key i + 1 as well (it must see only j <= i)", _with_mask(1)),
    Diagnosis(
        "the causal mask is off by one: query i does not see its own key i (it must see j <= i, diagonal included)",
        _with_mask(-1),
    ),
    Diagnosis(
        "the causal mask is off by one: query i does not see its own key i, so the first query has no key "
        "at all and its softmax is 0 / 0 (it must see j <= i, diagonal included)",
        _nan_on_first_row,
    ),
    Diagnosis(
        "the mask is transposed: query i sees the keys j >= i, the future, instead of j <= i",
        _with_mask(0, transpose=True),
    ),
    Diagnosis("there is no causal mask: every query sees every key", lambda q, k, v: _attend(q, k, v, None)),
]


def _qkv(B: int, H: int, N: int, D: int, Dv: int, seed: int, dtype=torch.float64):
    return tuple(
        _randn(B, H, N, d, seed=seed + i).to(dtype) for i, d in enumerate((D, D, Dv))
    )  # q, k (B, H, N, D), v (B, H, N, Dv)


def _large_score(B: int, N: int, D: int, seed: int, *, future: bool, dtype=torch.float64) -> tuple:
    """q, k, v (B, 1, N, D) where one score is about 2000 sqrt(D): on a key in query 0's future (``future``), or on
    key 0 for the last query, which sees it. A right answer is unaffected by the first and exact with the second."""
    q, k, v = (x.clone() for x in _qkv(B, 1, N, D, D, seed=seed))
    if future:
        k[..., N - 1, :] = 2000 * q[..., 0, :]  # query 0 must not see key N - 1
    else:
        k[..., 0, :] = 2000 * q[..., N - 1, :]  # the last query sees key 0
    return tuple(x.to(dtype) for x in (q, k, v))


LARGE_SCORE = (
    "one score on these inputs is about 2000 sqrt(D): mask the scores before the softmax (not the weights after "
    "it), and subtract each row's largest score before exp (torch.softmax does)"
)


def _random_causal_cases(draw: Draw) -> list[Case]:
    """Sizes the statement does not mention: a long sequence (N = 129 to 400, past any buffer made for the
    chapter's N) and a short odd one in float32, with widths D, Dv of 1 to 40."""
    cases = []
    for n, dtype in ((draw.int(129, 400), torch.float64), (draw.int(2, 40), torch.float32)):
        B, H, D, Dv = draw.int(1, 2), draw.int(1, 3), draw.int(1, 40, avoid=(4, 8, 16)), draw.int(1, 40)
        q, k, v = (draw.randn(B, H, n, d, dtype=dtype) for d in (D, D, Dv))
        kind = "" if dtype == torch.float64 else "float32 "
        cases.append(
            Case(
                (q, k, v),
                label=draw.label(f"{kind}q, k ({B}, {H}, {n}, {D}), v ({B}, {H}, {n}, {Dv})"),
                note=FIXED_SIZE if n > 7 else None,  # longer than the fixed cases without a note
            )
        )
    return cases


def _causal_cases(draw: Draw) -> list[Case]:
    return [
        Case(_qkv(2, 1, 5, 4, 3, seed=10), label="q, k (2, 1, 5, 4) and v (2, 1, 5, 3)"),
        Case(_qkv(1, 2, 7, 16, 16, seed=13), label="q, k, v (1, 2, 7, 16)"),
        Case(_qkv(1, 1, 1, 4, 2, seed=16), label="a single token"),
        Case(_qkv(1, 2, 64, 8, 6, seed=19), label="q, k (1, 2, 64, 8), v (1, 2, 64, 6)", note=FIXED_SIZE),
        Case(_qkv(2, 1, 65, 3, 2, seed=22), label="q, k (2, 1, 65, 3), v (2, 1, 65, 2)", note=FIXED_SIZE),
        Case(_qkv(1, 2, 6, 4, 4, seed=25, dtype=torch.float32), label="float32 q, k, v (1, 2, 6, 4)"),
        Case(_large_score(1, 6, 4, 40, future=True), label="a large score on a future key", note=LARGE_SCORE),
        Case(
            _large_score(2, 9, 8, 43, future=True),
            label="(2, 1, 9, 8), a large score on a future key",
            note=LARGE_SCORE,
        ),
        Case(_large_score(1, 6, 4, 46, future=False), label="a large score on a visible key", note=LARGE_SCORE),
        Case(
            _large_score(2, 9, 8, 49, future=False, dtype=torch.float32),
            label="float32, a large score on a visible key",
            note=LARGE_SCORE,
        ),
        *_random_causal_cases(draw),
    ]


@exercise("1.2")
def check_causal_attention(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.2: ``fn(q, k, v)`` -> causal softmax attention (B, H, N, Dv), scores scaled by 1/sqrt(D).
    ``seed`` draws the random inputs of an earlier call again."""
    return check_function(
        fn,
        _causal_cases(Draw(seed)),
        expected=causal_reference,
        name="causal_attention",
        diagnoses=_CAUSAL_MISTAKES,
        success="causal_attention is right: scaled by 1/sqrt(D), each query sees itself and the past only "
        "(N = 1 to 400, float32 too, a large score on a future or a visible key).",
    )


# --- 1.3 the bandwidth of the Gaussian kernel ---------------------------------------------------------------------


BANDWIDTH_D = (16, 2, 64, 100, 3, 1)  # the fixed widths; three more are drawn on every call


@exercise("1.3")
def check_bandwidth(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.3: ``fn(D)`` -> the bandwidth λ with exp(-|q - k|^2 / 2λ^2) ~ exp(q . k / sqrt(D)), λ = D^(1/4).
    ``seed`` draws the random widths of an earlier call again."""
    draw = Draw(seed)
    drawn = [draw.log_int(5, 100_000, avoid=BANDWIDTH_D) for _ in range(3)]
    return check_function(
        fn,
        [Case((d,), label=f"D = {d}") for d in BANDWIDTH_D] + [Case((d,), label=draw.label(f"D = {d}")) for d in drawn],
        expected=lambda d: d**0.25,
        name="bandwidth",
        diagnoses=[
            Diagnosis("λ = sqrt(D); but it is λ^2 that equals sqrt(D)", lambda d: math.sqrt(d)),
            Diagnosis(
                "λ = 1 / sqrt(D): the kernel divides by λ^2, the scores multiply by 1 / sqrt(D)", lambda d: d**-0.5
            ),
            Diagnosis("λ = D^(-1/4): the kernel divides by λ^2, so λ^2 = sqrt(D), not 1 / sqrt(D)", lambda d: d**-0.25),
            Diagnosis(
                "λ^2 = sqrt(D) / 2: the 2 of 2λ^2 is already matched by the 2 q.k of the expanded square",
                lambda d: (d**0.5 / 2) ** 0.5,
            ),
            Diagnosis(
                "λ^2 = 2 sqrt(D): expanding the square gives -|q|^2 + 2 q.k - |k|^2, so the kernel's exponent "
                "is q.k / λ^2, not q.k / 2λ^2",
                lambda d: (2 * d**0.5) ** 0.5,
            ),
            Diagnosis("λ = sqrt(D) / 2", lambda d: d**0.5 / 2),
        ],
        rtol=1e-6,
        atol=0.0,
        success="bandwidth is right: λ = D^(1/4), so λ^2 = sqrt(D).",
    )


# --- 1.4 the gap that saturates a softmax -------------------------------------------------------------------------


def _gap(p: float, M: int) -> float:
    return math.log(p * (M - 1) / (1 - p))


@exercise("1.4")
def check_gap(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.4: ``fn(ω, M)`` -> the lead Delta of the top score over M - 1 equal others for a top weight ω.
    ``seed`` draws the random (ω, M) of an earlier call again."""
    cases = [
        Case((p, m), label=f"ω = {p}, M = {m}") for p, m in ((0.9, 64), (0.5, 2), (0.99, 1000), (0.3, 5), (0.75, 9))
    ]
    draw = Draw(seed)
    for _ in range(2):
        p, m = round(draw.uniform(0.05, 0.995), 4), draw.log_int(3, 50_000, avoid=(64, 1000, 5, 9))
        cases.append(Case((p, m), label=draw.label(f"ω = {p}, M = {m}")))
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
            Diagnosis(
                "the factor 1 / (1 - ω) is missing: solve ω (e^Delta + M - 1) = e^Delta for e^Delta",
                lambda p, m: math.log(p * (m - 1)),
            ),
            Diagnosis("ω and 1 - ω are swapped", lambda p, m: math.log((1 - p) * (m - 1) / p)),
            Diagnosis("the logarithm is missing: Delta is the exponent of e", lambda p, m: p * (m - 1) / (1 - p)),
            Diagnosis(
                "the logarithm is base 10; softmax uses exp, so use the natural log",
                lambda p, m: math.log10(p * (m - 1) / (1 - p)),
            ),
            Diagnosis(
                "the logarithm is base 2; softmax uses exp, so use the natural log",
                lambda p, m: math.log2(p * (m - 1) / (1 - p)),
            ),
        ],
        rtol=1e-6,
        atol=1e-9,
        success="gap is right: Delta = ln(ω (M - 1) / (1 - ω)).",
    )


# --- 1.5 the best scale -------------------------------------------------------------------------------------------

# The experiment of *Why divide by sqrt(D)* and of exercise 1.5: 512 queries against M = 64 keys of width D = 256,
# standard normal; the softmax of scale * q.k; a random upstream gradient; the median over the queries of the norm
# of the gradient of the scores. The scale is c / sqrt(D) for the c of ``cs``; the checker reruns it on ``seeds``.
SCALE_SETUP = {"queries": 512, "M": 64, "D": 256, "cs": tuple(2.0**e for e in range(-4, 5)), "seeds": 8}


def softmax_stats(scale: float, seed: int) -> tuple[float, float]:
    """(mean largest weight, median gradient norm) of softmax(scale q.k), as the chapter's ``softmax_stats``, on
    queries, keys and an upstream gradient drawn from ``seed``."""
    s = SCALE_SETUP
    g = torch.Generator().manual_seed(seed)
    qs = torch.randn(s["queries"], s["D"], generator=g, dtype=torch.float64)
    ks = torch.randn(s["M"], s["D"], generator=g, dtype=torch.float64)
    logits = (qs @ ks.T * scale).requires_grad_()  # (queries, M)
    weights = torch.softmax(logits, dim=-1)
    (weights * torch.randn(weights.shape, generator=g, dtype=torch.float64)).sum().backward()
    return weights.max(dim=-1).values.mean().item(), logits.grad.norm(dim=-1).median().item()


@functools.lru_cache(maxsize=1)
def _gradients() -> dict[float, list[float]]:
    """The median gradient norm at each c, on each of the checker's seeds: :func:`softmax_stats`'s numbers, with
    the product q.k and the draws made once per seed, and the gradient of sum(w * u) written out,
    w * (u - sum(w * u)), instead of backpropagated (the tests confirm that both agree)."""
    s = SCALE_SETUP
    out: dict[float, list[float]] = {c: [] for c in s["cs"]}
    for seed in range(s["seeds"]):
        g = torch.Generator().manual_seed(seed)
        qs = torch.randn(s["queries"], s["D"], generator=g, dtype=torch.float64)
        ks = torch.randn(s["M"], s["D"], generator=g, dtype=torch.float64)
        u = torch.randn(s["queries"], s["M"], generator=g, dtype=torch.float64)  # the upstream gradient
        qk = qs @ ks.T  # (queries, M)
        for c in s["cs"]:
            w = torch.softmax(qk * (c / math.sqrt(s["D"])), dim=-1)
            grad = w * (u - (w * u).sum(-1, keepdim=True))  # d sum(w * u) / d logits
            out[c].append(grad.norm(dim=-1).median().item())
    return out


@exercise("1.5")
def check_best_scale(answer) -> Result:
    """Exercise 1.5: the c (of 1/16, 1/8, ..., 16) at which the median gradient norm of softmax(c q.k / sqrt(D))
    is largest.

    The gradient is random (the queries, keys and upstream gradient of the student's run), so which of two
    neighbouring c comes out on top can change from run to run: the checker reruns the experiment on 8 seeds and
    accepts every c that is the largest on one of them, or whose gradient falls short of the largest by less than
    twice the spread of that shortfall from seed to seed (2 or 4; c = 1 is short by about 28 %, many spreads).
    """
    name = "1.5 the best c"
    value = as_number(answer)
    if answer is None or value is None:
        return check_value(name, answer, 1.0)  # "no answer yet" / "expected a number, got ..."
    grads = _gradients()
    cs = list(grads)
    seeds = range(SCALE_SETUP["seeds"])
    peaks = {max(cs, key=lambda c, s=s: grads[c][s]) for s in seeds}  # the c on top, seed by seed
    mean = {c: sum(g) / len(g) for c, g in grads.items()}
    top = max(cs, key=mean.get)
    for c in cs:  # within the seed-to-seed spread of the top
        short = [grads[top][s] - grads[c][s] for s in seeds]
        if c != top and statistics.fmean(short) < 2 * statistics.stdev(short):
            peaks.add(c)
    on_top = " or ".join(f"{c:g}" for c in sorted(peaks))
    if value in peaks:
        return Result(True, f"{name}: c = {value:g} is right: the gradient is largest at c = {on_top}, depending on "
                      f"the draw; at c = 1 it is {mean[1.0] / mean[top]:.0%} of that, at c = 16 "
                      f"{mean[16.0] / mean[top]:.0%}.")  # fmt: skip
    if value in mean:
        scale = f" (if {value:g} is the scale c / sqrt(D), the question asks for c itself)" if value < 1 else ""
        share = mean[value] / mean[top]
        return Result(False, f"{name}: c = {value:g} is not right: there the median gradient is {share:.0%} of the "
                      f"largest{scale}.")  # fmt: skip
    if 0 < value < 1e-2:
        return Result(False, f"{name}: {value:g} looks like a gradient norm; the question asks for the c at which it "
                      "is largest.")  # fmt: skip
    return Result(False, f"{name}: {value:g} is not one of the c tried (1/16, 1/8, ..., 16): answer the c of `cs` "
                  "with the largest median gradient norm.")  # fmt: skip
