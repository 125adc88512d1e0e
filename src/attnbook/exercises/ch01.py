"""Checkers for chapter 1 (softmax attention): 1.1 a masked softmax, 1.2 causal attention, 1.3 the Gaussian
kernel's bandwidth λ, 1.4 the gap that saturates a softmax, 1.5 (explore) the best scale c. The references are
float64 definitions written out here (:func:`attnbook.reference.softmax_attention`'s, the tests confirm)."""

from __future__ import annotations

import functools
import math
import statistics
from functools import partial

import numpy as np
import torch

from ._core import FIXED_SIZE, Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise, randn


def _mask(*shape: int, seed: int, p: float = 0.5) -> torch.Tensor:
    """A random boolean mask (True = may attend) in which every row allows at least one key."""
    allowed = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p
    first = torch.randint(shape[-1], shape[:-1], generator=torch.Generator().manual_seed(seed + 1))
    return allowed.scatter(-1, first[..., None], True)


# --- 1.1 a masked softmax that gives zeros on empty rows ----------------------------------------------------------


def masked_softmax_solution(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` (..., N, M) over the keys where ``allowed`` is True; zeros on a row with none."""
    hidden = scores.masked_fill(~allowed, -math.inf)  # (..., N, M)
    top = hidden.amax(dim=-1, keepdim=True)  # (..., N, 1): the largest allowed score
    top = torch.where(torch.isfinite(top), top, 0.0)  # an empty row: any shift will do
    e = torch.exp(hidden - top)  # (..., N, M), exp(-inf) = 0 where hidden
    total = e.sum(dim=-1, keepdim=True)  # (..., N, 1)
    return e / torch.where(total > 0, total, 1.0)


def _exp_then_mask(s, a, *, shift="allowed", guarded=True):
    """exp of every score (shifted by the largest allowed score, or of all), then zeroed where hidden."""
    top = s.masked_fill(~a, -math.inf).amax(dim=-1, keepdim=True) if shift == "allowed" else s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(top), top, 0.0)) * a
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, 1.0) if guarded else e / total


def _rows(got, bad):
    """The student's weights in float64 and the first row where ``bad(weights)`` holds, or None."""
    w = torch.as_tensor(np.asarray(got) if isinstance(got, np.ndarray) else got).detach().to(torch.float64)
    found = bad(w).nonzero()
    return w, None if found.numel() == 0 else tuple(found[0].tolist())


def _row(index) -> str:
    return f"row {index[0]}" if len(index) == 1 else f"row {tuple(index)}"


def _shows_empty_rows(what: str):
    def shows(got, want, s, a):
        bad = (lambda w: ~torch.isfinite(w).all(-1)) if what == "nan" else (lambda w: (w != 0).any(-1))
        w, r = _rows(got, lambda w: ~a.any(-1) & bad(w))
        if r is None:
            return None
        weights = "NaN," if what == "nan" else f"{w[r].max():.3g} (1/M)"
        return f"{_row(r)} allows no key and its weights are {weights} where they should all be 0"

    return shows


def _shows_overflow(got, want, s, a):
    w, r = _rows(got, lambda w: ~torch.isfinite(w).all(-1))
    if r is not None:
        top = float(s.masked_fill(~a, -math.inf)[r].max())
        return f"{_row(r)}, whose largest allowed score is {top:.4g}, is NaN (or inf)"


def _shows_hidden_giant(got, want, s, a):
    w, r = _rows(got, lambda w: (~torch.isfinite(w).all(-1) | ((w.sum(-1) - 1).abs() > 1e-3)) & a.any(-1))
    if r is None:  # wrong only on the rows that allow no key
        return _shows_empty_rows("nan")(got, want, s, a)
    hidden, allowed = s.masked_fill(a, -math.inf)[r].max(), s.masked_fill(~a, -math.inf)[r].max()
    total = "is NaN" if not bool(torch.isfinite(w[r]).all()) else f"sums to {float(w[r].sum()):.3g}, not 1"
    scores = f"it has a hidden score of {float(hidden):.4g}, its allowed ones at most {float(allowed):.3g}"
    return f"{_row(r)} {total}; {scores}"


def _shows_row_sum(got, want, s, a):
    w, r = _rows(got, lambda w: ((w.sum(-1) - 1).abs() > 1e-3) & a.any(-1))
    if r is not None:
        return f"{_row(r)} sums to {float(w[r].sum()):.3g} where it should sum to 1 (it allows {int(a[r].sum())} keys)"


def _shows_weight_on_hidden(got, want, s, a):
    w, at = _rows(got, lambda w: (w != 0) & ~a)
    if at is not None:
        return f"hidden key {at[-1]} of {_row(at[:-1])} has weight {float(w[at]):.3g} where it should have 0"


def _shows_columns(got, want, s, a):
    w, r = _rows(got, lambda w: (w.sum(-1) - 1).abs() > 1e-3)
    if r is not None:
        column = float(w.sum(-2).reshape(-1)[0])
        return (
            f"the weights of each column sum to 1 or 0 (column 0: {column:.3g}), while {_row(r)} sums to "
            f"{float(w[r].sum()):.3g} where it should sum to 1"
        )


_SHIFT_BY_ALL = (
    "the weights of a shift by each row's largest score over all keys, hidden ones included: a large score on "
    "a hidden key then makes every allowed exp underflow to 0 (shift by the largest allowed score)"
)
_OVERFLOW = (
    "exp overflows: subtract each row's largest allowed score before taking exp (exp of a score above about "
    "709, or 88 in float32, is inf, and inf / inf = NaN)"
)


def _unshifted(s, a):
    e = torch.exp(s.masked_fill(~a, -math.inf))
    return e / e.sum(dim=-1, keepdim=True)


# Each diagnosis says first what the numbers of the failing case show, then which known variant they equal.
_SOFTMAX_MISTAKES = [
    Diagnosis("a softmax over nothing but -inf, which is 0 / 0 = NaN: give such rows zeros",
              lambda s, a: torch.softmax(s.masked_fill(~a, -math.inf), dim=-1), _shows_empty_rows("nan")),
    Diagnosis(_OVERFLOW, lambda s, a: (torch.exp(s) * a) / (torch.exp(s) * a).sum(-1, keepdim=True), _shows_overflow),
    Diagnosis(_OVERFLOW, _unshifted, _shows_overflow),
    Diagnosis("an exp of the hidden score: exp(1000 - top) is inf, and inf * 0 = NaN, so no mask applied after exp can "
              "zero it (put -inf in place of the hidden scores before exp)", _exp_then_mask, _shows_hidden_giant),
    Diagnosis(_SHIFT_BY_ALL, partial(_exp_then_mask, shift="all"), _shows_hidden_giant),
    Diagnosis(_SHIFT_BY_ALL, partial(_exp_then_mask, shift="all", guarded=False), _shows_hidden_giant),
    Diagnosis("the weights of a softmax over all keys with the hidden ones set to 0 afterwards, which no longer sum to "
              "one (mask the scores with -inf before the softmax)",
              lambda s, a: torch.softmax(s, dim=-1) * a, _shows_row_sum),
    Diagnosis("the mask read the wrong way round: True means 'may attend' (as in torch's SDPA), not 'hide'",
              lambda s, a: masked_softmax_solution(s, ~a), _shows_weight_on_hidden),
    Diagnosis("the weights of a softmax with the hidden scores set to 0 instead of -inf, so hidden keys still get "
              "weight", lambda s, a: torch.softmax(s.masked_fill(~a, 0.0), dim=-1), _shows_weight_on_hidden),
    Diagnosis("what a large negative number in place of -inf gives a row with no allowed key: uniform weights 1/M "
              "instead of zeros",
              lambda s, a: torch.softmax(s.masked_fill(~a, -1e9), dim=-1), _shows_empty_rows("uniform")),
    Diagnosis("a softmax along dim -2 (over the queries) instead of along each row",
              lambda s, a: masked_softmax_solution(s.mT, a.mT).mT, _shows_columns),
    Diagnosis("the weights of a softmax over every key, as if there were no mask",
              lambda s, a: torch.softmax(s, dim=-1), _shows_weight_on_hidden),
]  # fmt: skip


def _softmax_cases(draw: Draw) -> list[Case]:
    def scores(n, dtype):  # N or M up to 300 (the long one), some rows empty, some hidden scores large
        m = draw.int(1, 300) if dtype == torch.float64 else draw.int(1, 23)
        batch = [draw.int(1, 2) for _ in range(draw.int(0, 2))]
        s = draw.randn(*batch, n, m, scale=draw.uniform(0.5, 6.0))
        allowed = draw.rand(*batch, n, m) < draw.uniform(0.2, 0.9)
        allowed &= draw.rand(*batch, n, 1) > 0.1  # about one row in ten allows no key
        s = torch.where(allowed | (draw.rand(*batch, n, m) < 0.8), s, s + 1000)  # large hidden ones
        shape = ", ".join(str(x) for x in (*batch, n, m))
        return (s.to(dtype), allowed), f"({shape}) scores, some rows empty, some hidden scores large"

    empty = torch.ones(3, 5, dtype=torch.bool)
    empty[1], empty[2, 3:] = False, False
    empty_64 = _mask(64, 64, seed=3)
    empty_64[[5, 17, 40]] = False  # three rows with no allowed key
    big = torch.tensor([[1000.0, 999.0, 0.0], [-5.0, 2.0, 1.0]], dtype=torch.float64)
    hidden, hidden_mask = randn(6, 3, 6), torch.tensor([[True, True, False, True, False, True]] * 3)
    hidden[:, 2] = 1000.0  # a large score on a hidden key
    hidden_64, hidden_64_mask = randn(7, 2, 64, 70), _mask(2, 64, 70, seed=8, p=0.7)
    hidden_64 = torch.where(hidden_64_mask, hidden_64, 1000.0 + hidden_64)  # every hidden score large
    empty_7 = _mask(3, 7, seed=13)
    empty_7[0] = False
    return [
        Case((randn(0, 4, 6), _mask(4, 6, seed=1, p=0.6)), label="random (4, 6) scores with a random mask"),
        Case((randn(2, 3, 5), empty), label="a (3, 5) mask whose second row allows no key"),
        Case((randn(9, 2, 3, 5, 5), _tril(5).expand(2, 3, 5, 5)), label="(2, 3, 5, 5) scores with a causal mask"),
        Case((big, torch.tensor([[True, True, False], [True, False, True]])), label="scores of 1000"),
        Case((hidden, hidden_mask), label="a score of 1000 on a hidden key"),
        Case((randn(10, 2, 64, 64, scale=3.0), _mask(2, 64, 64, seed=11)), label="random (2, 64, 64) scores"),
        Case((randn(12, 64, 64, scale=3.0), empty_64), label="(64, 64) scores with three empty rows"),
        Case(
            (800 + randn(5, 4, 64, scale=5.0), torch.ones(4, 64, dtype=torch.bool)),
            label="(4, 64) scores around 800, no mask",
        ),
        Case((hidden_64, hidden_64_mask), label="(2, 64, 70) scores, every hidden one around 1000"),
        Case((randn(14, 3, 7, dtype=torch.float32), empty_7), label="float32 (3, 7) scores, the first row empty"),
        Case((hidden.float(), hidden_mask), label="float32 scores, a score of 1000 on a hidden key"),
        *draw.cases(scores, long=(129, 300), short=(1, 23), over=128),
    ]


@exercise("1.1")
def check_masked_softmax(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.1: ``fn(scores, allowed)`` -> weights (..., N, M), zeros on hidden keys and empty rows."""
    return check_function(
        fn, _softmax_cases(Draw(seed)), expected=lambda s, a: masked_softmax_solution(s.double(), a).to(s.dtype),
        name="masked_softmax", diagnoses=_SOFTMAX_MISTAKES,
        success="masked_softmax is right: weights on the allowed keys only, zeros on an empty row, no "
        "overflow at scores of 1000, hidden scores of 1000 ignored, float32 in and out.",
    )  # fmt: skip


# --- 1.2 causal attention -----------------------------------------------------------------------------------------


def _tril(n: int, diagonal: int = 0) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril(diagonal)


def _attend(q, k, v, *, diagonal: int | None = 0, transpose=False, scale=None, how="right") -> torch.Tensor:
    """Softmax attention in float64 (q's dtype out), query i over the keys j <= i + ``diagonal`` (all if None; j >= i
    ``transpose``d), scores times 1/sqrt(D) or ``scale(D)``, the weights formed "right", "nan" (a -inf softmax: 0 / 0
    on an empty row), "after" (masked after the softmax and renormalised) or "unshifted" (exp as it is)."""
    dtype, (q, k, v) = q.dtype, (x.double() for x in (q, k, v))
    n, d = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d) if scale is None else scale(d))  # (..., N, N)
    allowed = torch.ones(n, n, dtype=torch.bool) if diagonal is None else _tril(n, diagonal)
    allowed = allowed.T if transpose else allowed
    if how == "right":
        p = masked_softmax_solution(s, allowed.expand_as(s))
    elif how == "nan":
        p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
    else:
        p = (torch.softmax(s, dim=-1) if how == "after" else torch.exp(s)) * allowed
        p = p / p.sum(-1, keepdim=True)
    return (p @ v).to(dtype)  # (..., N, Dv)


def causal_reference(q, k, v) -> torch.Tensor:
    """Causal softmax attention, q.k / sqrt(D), query i over the keys j <= i, in float64 (returned in q's dtype)."""
    return _attend(q, k, v)


_CAUSAL_MISTAKES = [
    Diagnosis("the softmax is taken over every key and the future masked afterwards: a large score on a future key "
              "takes all of the row, and renormalising what is left is 0 / 0; mask the scores (-inf) before the "
              "softmax", partial(_attend, how="after")),
    Diagnosis("exp is taken of the scores as they are: a large score overflows to inf and the row becomes inf / inf; "
              "subtract each row's largest (allowed) score first, as torch.softmax does",
              partial(_attend, how="unshifted")),
    Diagnosis("the scores are not divided by sqrt(D)", partial(_attend, scale=lambda d: 1.0)),
    Diagnosis("the scores are divided by D instead of sqrt(D)", partial(_attend, scale=lambda d: 1.0 / d)),
    Diagnosis("the scores are multiplied by sqrt(D) instead of divided by it", partial(_attend, scale=math.sqrt)),
    Diagnosis("the causal mask is off by one: query i sees key i + 1 as well (it must see only j <= i)",
              partial(_attend, diagonal=1)),
    Diagnosis("the causal mask is off by one: query i does not see its own key i (it must see j <= i, diagonal "
              "included)", partial(_attend, diagonal=-1)),
    Diagnosis("the causal mask is off by one: query i does not see its own key i, so the first query has no key at all "
              "and its softmax is 0 / 0 (it must see j <= i, diagonal included)",
              partial(_attend, diagonal=-1, how="nan")),
    Diagnosis("the mask is transposed: query i sees the keys j >= i, the future, instead of j <= i",
              partial(_attend, transpose=True)),
    Diagnosis("there is no causal mask: every query sees every key", partial(_attend, diagonal=None)),
]  # fmt: skip


def _qkv(B: int, H: int, N: int, D: int, Dv: int, seed: int, dtype=torch.float64):
    return tuple(randn(seed + i, B, H, N, d, dtype=dtype) for i, d in enumerate((D, D, Dv)))  # (B, H, N, D|Dv)


def _large_score(B: int, N: int, D: int, seed: int, *, future: bool, dtype=torch.float64) -> tuple:
    """q, k, v (B, 1, N, D), one score about 2000 sqrt(D): on a key in query 0's future, or on key 0 for the last
    query, which sees it."""
    q, k, v = _qkv(B, 1, N, D, D, seed=seed)
    key, query = (N - 1, 0) if future else (0, N - 1)  # query 0 must not see key N - 1; the last query sees key 0
    k[..., key, :] = 2000 * q[..., query, :]
    return tuple(x.to(dtype) for x in (q, k, v))


LARGE_SCORE = (
    "one score on these inputs is about 2000 sqrt(D): mask the scores before the softmax (not the weights after "
    "it), and subtract each row's largest score before exp (torch.softmax does)"
)


def _causal_cases(draw: Draw) -> list[Case]:
    def qkv(n, dtype):  # widths D, Dv of 1 to 40
        B, H, D, Dv = draw.int(1, 2), draw.int(1, 3), draw.int(1, 40, avoid=(4, 8, 16)), draw.int(1, 40)
        qkv = tuple(draw.randn(B, H, n, d, dtype=dtype) for d in (D, D, Dv))
        return qkv, f"q, k ({B}, {H}, {n}, {D}), v ({B}, {H}, {n}, {Dv})"

    return [
        Case(_qkv(2, 1, 5, 4, 3, seed=10), label="q, k (2, 1, 5, 4) and v (2, 1, 5, 3)"),
        Case(_qkv(1, 2, 7, 16, 16, seed=13), label="q, k, v (1, 2, 7, 16)"),
        Case(_qkv(1, 1, 1, 4, 2, seed=16), label="a single token"),
        Case(_qkv(1, 2, 64, 8, 6, seed=19), label="q, k (1, 2, 64, 8), v (1, 2, 64, 6)", note=FIXED_SIZE),
        Case(_qkv(2, 1, 65, 3, 2, seed=22), label="q, k (2, 1, 65, 3), v (2, 1, 65, 2)", note=FIXED_SIZE),
        Case(_qkv(1, 2, 6, 4, 4, seed=25, dtype=torch.float32), label="float32 q, k, v (1, 2, 6, 4)"),
        *(
            Case(_large_score(B, N, D, seed, future=future, dtype=dtype), label=label, note=LARGE_SCORE)
            for B, N, D, seed, future, dtype, label in (
                (1, 6, 4, 40, True, torch.float64, "a large score on a future key"),
                (2, 9, 8, 43, True, torch.float64, "(2, 1, 9, 8), a large score on a future key"),
                (1, 6, 4, 46, False, torch.float64, "a large score on a visible key"),
                (2, 9, 8, 49, False, torch.float32, "float32, a large score on a visible key"),
            )
        ),
        *draw.cases(qkv, long=(129, 400), short=(2, 40), over=7),  # past any buffer made for the chapter's N
    ]


@exercise("1.2")
def check_causal_attention(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.2: ``fn(q, k, v)`` -> causal softmax attention (B, H, N, Dv), scores scaled by 1/sqrt(D)."""
    return check_function(
        fn, _causal_cases(Draw(seed)), expected=causal_reference, name="causal_attention", diagnoses=_CAUSAL_MISTAKES,
        success="causal_attention is right: scaled by 1/sqrt(D), each query sees itself and the past only "
        "(N = 1 to 400, float32 too, a large score on a future or a visible key).",
    )  # fmt: skip


# --- 1.3 the bandwidth of the Gaussian kernel, 1.4 the gap that saturates a softmax ------------------------------


BANDWIDTH_D = (16, 2, 64, 100, 3, 1)  # the fixed widths; three more are drawn on every call


@exercise("1.3")
def check_bandwidth(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.3: ``fn(D)`` -> the bandwidth λ with exp(-|q - k|^2 / 2λ^2) ~ exp(q . k / sqrt(D)), λ = D^(1/4)."""
    draw = Draw(seed)
    more = [(draw.log_int(5, 100_000, avoid=BANDWIDTH_D),) for _ in range(3)]
    return check_function(
        fn, draw.labelled(lambda d: f"D = {d}", [(d,) for d in BANDWIDTH_D], more), expected=lambda d: d**0.25,
        name="bandwidth",
        diagnoses=[
            Diagnosis("λ = sqrt(D); but it is λ^2 that equals sqrt(D)", math.sqrt),
            Diagnosis("λ = 1 / sqrt(D): the kernel divides by λ^2, the scores multiply by 1 / sqrt(D)",
                      lambda d: d**-0.5),
            Diagnosis("λ = D^(-1/4): the kernel divides by λ^2, so λ^2 = sqrt(D), not 1 / sqrt(D)", lambda d: d**-0.25),
            Diagnosis("λ^2 = sqrt(D) / 2: the 2 of 2λ^2 is already matched by the 2 q.k of the expanded square",
                      lambda d: (d**0.5 / 2) ** 0.5),
            Diagnosis("λ^2 = 2 sqrt(D): expanding the square gives -|q|^2 + 2 q.k - |k|^2, so the kernel's exponent is "
                      "q.k / λ^2, not q.k / 2λ^2", lambda d: (2 * d**0.5) ** 0.5),
            Diagnosis("λ = sqrt(D) / 2", lambda d: d**0.5 / 2),
        ],
        rtol=1e-6, atol=0.0, success="bandwidth is right: λ = D^(1/4), so λ^2 = sqrt(D).",
    )  # fmt: skip


def _gap(p: float, M: int) -> float:
    return math.log(p * (M - 1) / (1 - p))


@exercise("1.4")
def check_gap(fn, *, seed: int | None = None) -> Result:
    """Exercise 1.4: ``fn(ω, M)`` -> the lead Delta of the top score over M - 1 equal others for a top weight ω."""
    draw = Draw(seed)
    more = [(round(draw.uniform(0.05, 0.995), 4), draw.log_int(3, 50_000, avoid=(64, 1000, 5, 9))) for _ in range(2)]
    fixed = ((0.9, 64), (0.5, 2), (0.99, 1000), (0.3, 5), (0.75, 9))
    return check_function(
        fn, draw.labelled(lambda p, m: f"ω = {p}, M = {m}", fixed, more), expected=_gap, name="gap",
        diagnoses=[
            Diagnosis("M keys compete with the best one; there are M - 1 others",
                      lambda p, m: math.log(p * m / (1 - p))),
            Diagnosis("the M - 1 other keys are left out of the sum", lambda p, m: math.log(p / (1 - p))),
            Diagnosis("the factor 1 / (1 - ω) is missing: solve ω (e^Delta + M - 1) = e^Delta for e^Delta",
                      lambda p, m: math.log(p * (m - 1))),
            Diagnosis("ω and 1 - ω are swapped", lambda p, m: math.log((1 - p) * (m - 1) / p)),
            Diagnosis("the logarithm is missing: Delta is the exponent of e", lambda p, m: p * (m - 1) / (1 - p)),
            Diagnosis("the logarithm is base 10; softmax uses exp, so use the natural log",
                      lambda p, m: math.log10(p * (m - 1) / (1 - p))),
            Diagnosis("the logarithm is base 2; softmax uses exp, so use the natural log",
                      lambda p, m: math.log2(p * (m - 1) / (1 - p))),
        ],
        rtol=1e-6, atol=1e-9, success="gap is right: Delta = ln(ω (M - 1) / (1 - ω)).",
    )  # fmt: skip


# --- 1.5 the best scale -------------------------------------------------------------------------------------------

# The experiment of *Why divide by sqrt(D)* and of exercise 1.5: 512 queries against M = 64 keys of width D = 256,
# standard normal; the softmax of scale * q.k; a random upstream gradient; the median over the queries of the norm
# of the gradient of the scores. The scale is c / sqrt(D) for the c of ``cs``; the checker reruns it on ``seeds``.
SCALE_SETUP = {"queries": 512, "M": 64, "D": 256, "cs": tuple(2.0**e for e in range(-4, 5)), "seeds": 8}


def softmax_stats(scale: float, seed: int) -> tuple[float, float]:
    """(mean largest weight, median gradient norm) of softmax(scale q.k), as the chapter's ``softmax_stats``, on
    queries, keys and an upstream gradient drawn from ``seed``."""
    s, g = SCALE_SETUP, torch.Generator().manual_seed(seed)
    qs, ks = (torch.randn(n, s["D"], generator=g, dtype=torch.float64) for n in (s["queries"], s["M"]))
    logits = (qs @ ks.T * scale).requires_grad_()  # (queries, M)
    weights = torch.softmax(logits, dim=-1)
    (weights * torch.randn(weights.shape, generator=g, dtype=torch.float64)).sum().backward()
    return weights.max(dim=-1).values.mean().item(), logits.grad.norm(dim=-1).median().item()


@functools.lru_cache(maxsize=1)
def _gradients() -> dict[float, list[float]]:
    """The median gradient norm at each c of the experiment, on each of the checker's seeds."""
    s = SCALE_SETUP
    return {c: [softmax_stats(c / math.sqrt(s["D"]), seed)[1] for seed in range(s["seeds"])] for c in s["cs"]}


@exercise("1.5")
def check_best_scale(answer) -> Result:
    """Exercise 1.5: the c (of 1/16, 1/8, ..., 16) at which the median gradient norm of softmax(c q.k / sqrt(D))
    is largest. Which neighbouring c comes out on top changes with the draw: the checker reruns the experiment on
    8 seeds and accepts every c that is the largest on one, or falls short of the largest by less than twice the
    spread of that shortfall (2 or 4; c = 1 is short by about 28 %)."""
    name, value = "1.5 the best c", as_number(answer)
    if answer is None or value is None:
        return check_value(name, answer, 1.0)  # "no answer yet" / "expected a number, got ..."
    grads, seeds = _gradients(), range(SCALE_SETUP["seeds"])
    peaks = {max(grads, key=lambda c, s=s: grads[c][s]) for s in seeds}  # the c on top, seed by seed
    mean = {c: statistics.fmean(g) for c, g in grads.items()}
    top = max(grads, key=mean.get)
    for c in grads:  # within the seed-to-seed spread of the top
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
        return Result(False, f"{name}: c = {value:g} is not right: there the median gradient is "
                      f"{mean[value] / mean[top]:.0%} of the largest{scale}.")  # fmt: skip
    if 0 < value < 1e-2:
        return Result(False, f"{name}: {value:g} looks like a gradient norm; the question asks for the c at which it "
                      "is largest.")  # fmt: skip
    return Result(False, f"{name}: {value:g} is not one of the c tried (1/16, 1/8, ..., 16): answer the c of `cs` "
                  "with the largest median gradient norm.")  # fmt: skip
