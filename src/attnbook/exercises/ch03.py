"""Checkers for the exercises of chapter 3 (Flow-Attention, Wu et al., "Flowformer", ICML 2022): 3.1 the total
conserved outgoing flow, 3.2 the causal incoming flow, 3.3 the causal competition, 3.4 the largest competition
weight the clamp allows, 3.5 (explore) the toy similarity at which the clamp stops acting.

Expected results are the literal definitions in float64, written as masked N x N matrices (a prefix sum is a
lower-triangular matrix product here, not a cumsum); the tests confirm that they equal
:func:`attnbook.flow_attention`'s flows. 3.5 is measured on :func:`attnbook.viz.flow.make_toy_input`.
"""

from __future__ import annotations

import functools
import math
from functools import partial

import torch

from ._core import FIXED_SIZE, Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise

EPS = 1e-6


def _qk(seed: int, B: int = 1, H: int = 2, N: int = 7, D: int = 3, scale: float = 1.0, dtype=torch.float64):
    return Draw(seed).randns(2, B, H, N, D, scale=scale, dtype=dtype)  # q, k (B, H, N, D)


@functools.lru_cache(maxsize=16)
def _lower(n: int) -> torch.Tensor:
    """(N, N) float64, row i: 1 for j <= i (cached: every diagnosis of every case needs one; never written)."""
    return torch.ones(n, n, dtype=torch.float64).tril()


# ------------------------------------------------------------------------------------------------ 3.1


@exercise("3.1")
def check_total_outgoing(answer) -> Result:
    """Exercise 3.1: sum_j O^_j for N = 5 queries (sinks) and M = 7 keys (sources), eps = 0."""
    return check_value(
        "3.1 total outgoing flow", answer, 5.0, hint="swap the sums over i and j; each sink's row sums to one",
        mistakes=[
            (7, "7 is M, the number of sources. Conservation fixes what the sinks take: each of the N sinks takes "
             "exactly one unit."),
            (35, "35 = N M counts every edge once; each sink divides its edges by its own total, so it gives one "
             "unit, not M."),
            (1, "1 is what one sink takes; there are N of them."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 3.2


def _incoming(q, k, *, prefix="lower", eps_q=EPS, eps_k=EPS, eps_keys=0.0, after=0.0, once=0.0, divide="t", sig=True):
    """The causal incoming flow with one piece changed: the prefix, where eps goes (``after`` the division, or
    ``once`` to the dot product), the division, the sigmoid."""
    n = q.shape[-2]
    qs, ks = (torch.sigmoid(q.double()), torch.sigmoid(k.double())) if sig else (q.double(), k.double())
    ks = ks + eps_keys  # eps added to every key before the sum
    if prefix == "all":
        pre = ks.sum(-2, keepdim=True).expand_as(ks)  # every key
    else:  # (B, H, N, D): sum_{j<=i} k~_j, or sum_{j<i} ("strict")
        pre = (_lower(n).tril(-1) if prefix == "strict" else _lower(n)) @ ks
    dot = ((qs + eps_q) * (pre + eps_k)).sum(-1) + once  # (B, H, N)
    t = torch.arange(1, n + 1, dtype=torch.float64)  # (N,): t_i = i + 1
    by = {"t": t, "i": t - 1, "N": torch.full((n,), float(n), dtype=torch.float64), "none": 1.0}[divide]
    return (dot / by + after).to(q.dtype)


def causal_incoming_reference(q, k):
    """I_i = (q~_i + eps) . (sum_{j<=i} k~_j + eps) / t_i, t_i = i + 1, eps = 1e-6, in float64 (q's dtype out)."""
    return _incoming(q, k)


def _shows_incoming(kind: str):
    """What the student's I shows at the first three sinks of the first sequence and head, against the right I:
    their ratio (``"ratio"``), their difference (``"difference"``) or both values (``"values"``)."""

    def shows(got, want, q, k):
        g = torch.as_tensor(got).detach().to(torch.float64).reshape(-1, got.shape[-1])[0]
        w = want.detach().to(torch.float64).reshape(-1, want.shape[-1])[0]
        n = range(min(3, w.numel()))
        where = f"at i = {', '.join(str(i) for i in n)} (the first sequence and head)"
        if kind == "ratio":
            return f"I {where} is {', '.join(f'{float(g[i] / w[i]):.3g}' for i in n)} times the right value"
        if kind == "difference":
            return f"I minus the right value {where} is " + ", ".join(f"{float(g[i] - w[i]):.2g}" for i in n)
        values = ", ".join(f"{float(g[i]):.4g}" for i in n)
        return f"I {where} is {values} where it should be " + ", ".join(f"{float(w[i]):.4g}" for i in n)

    return shows


# Each diagnosis says first what the student's numbers show at the first sinks, then which variant they equal.
INCOMING_MISTAKES = [
    Diagnosis("the prefix sums not divided by the prefix length t_i = i + 1",
              partial(_incoming, divide="none"), _shows_incoming("ratio")),
    Diagnosis("the prefix sums divided by the sequence length N instead of the prefix length t_i = i + 1",
              partial(_incoming, divide="N"), _shows_incoming("ratio")),
    Diagnosis("a sum that runs over all keys instead of the prefix j <= i",
              partial(_incoming, prefix="all"), _shows_incoming("values")),
    Diagnosis("a sum that runs over all keys instead of the prefix j <= i, and is not divided by t_i",
              partial(_incoming, prefix="all", divide="none"), _shows_incoming("values")),
    Diagnosis("a prefix that stops before key i (j < i): sink i must see its own source",
              partial(_incoming, prefix="strict"), _shows_incoming("values")),
    Diagnosis("the prefix sums divided by i instead of t_i = i + 1",
              partial(_incoming, divide="i"), _shows_incoming("ratio")),
    Diagnosis("eps added once to the dot product instead of to every component of both vectors",
              partial(_incoming, eps_q=0.0, eps_k=0.0, once=EPS), _shows_incoming("difference")),
    Diagnosis("eps added after the division by t_i; it belongs to every component of both vectors",
              partial(_incoming, eps_q=0.0, eps_k=0.0, after=EPS), _shows_incoming("difference")),
    Diagnosis("eps added to the queries' features only; the prefix sum gets its own eps too",
              partial(_incoming, eps_k=0.0), _shows_incoming("difference")),
    Diagnosis("eps added to the prefix sum only; the queries' features get their own eps too",
              partial(_incoming, eps_q=0.0), _shows_incoming("difference")),
    Diagnosis("eps added to every key before the prefix sum, so that the prefix carries t_i eps; add eps once, to the "
              "sum", partial(_incoming, eps_keys=EPS, eps_k=0.0), _shows_incoming("difference")),
    Diagnosis("no eps at all: the published code adds eps = 1e-6 to both vectors",
              partial(_incoming, eps_q=0.0, eps_k=0.0), _shows_incoming("difference")),
    Diagnosis("q and k used as they are: the sigmoid features are missing",
              partial(_incoming, sig=False), _shows_incoming("values")),
]  # fmt: skip


def incoming_cases(draw: Draw) -> list[Case]:
    def qk(n, dtype):  # sizes the statement does not mention
        B, H, D, scale = draw.int(1, 2), draw.int(1, 3), draw.int(1, 12, avoid=(3, 4)), draw.uniform(0.5, 3.0)
        return draw.randns(2, B, H, n, D, scale=scale, dtype=dtype), f"q, k ({B}, {H}, {n}, {D})"

    return [
        *(Case(_qk(seed), label=f"random q, k (seed {seed}, N = 7)") for seed in (0, 1)),
        Case(_qk(2, B=2, H=1, N=5, D=4, scale=3.0), label="large q, k (B = 2, N = 5)"),
        Case(_qk(3, N=1), label="a single token (N = 1)"),
        Case(_qk(4, B=1, H=2, N=64, D=4), label="q, k (1, 2, 64, 4)", note=FIXED_SIZE),
        Case(_qk(5, B=2, H=1, N=70, D=3, scale=2.0), label="q, k (2, 1, 70, 3)", note=FIXED_SIZE),
        Case(_qk(6, N=6, dtype=torch.float32), label="float32 q, k (N = 6)"),
        *draw.cases(qk, over=7),
    ]


@exercise("3.2")
def check_causal_incoming(fn, *, seed: int | None = None) -> Result:
    """Exercise 3.2: ``causal_incoming(q, k)`` -> I (B, H, N) of causal Flow-Attention, eps = 1e-6."""
    cases = incoming_cases(Draw(seed))
    return check_function(
        fn, cases, expected=causal_incoming_reference, name="causal_incoming", diagnoses=INCOMING_MISTAKES,
        success=f"causal_incoming is right on {len(cases)} inputs, N = 1 to 300, float32 included.",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 3.3


def _competition(o_hat, *, low=-1.0, prefix=True, t_from=1, clamp_after_exp=False, clamp=True, times_t=True):
    """The competition with one piece changed, through the literal masked N x N softmax, in float64."""
    x = o_hat.double()
    n = x.shape[-1]
    if clamp and not clamp_after_exp:
        x = x.clamp(low, 1.0)
    e = x.exp().clamp(-1.0, 1.0) if clamp_after_exp else x.exp()
    allowed = _lower(n).bool() if prefix else torch.ones(n, n, dtype=torch.bool)
    logits = e.log()[..., None, :].expand(*e.shape, n).masked_fill(~allowed, -math.inf)  # (B, H, N, N)
    weights = torch.softmax(logits, dim=-1).diagonal(dim1=-2, dim2=-1)  # row j: softmax over j' <= j, at j
    t = torch.arange(t_from, n + t_from, dtype=torch.float64) if prefix else torch.full((n,), float(n))
    return ((t if times_t else 1.0) * weights).to(o_hat.dtype)


def causal_competition_reference(o_hat):
    """c_j = t_j exp(clamp(O^_j, -1, 1)) / sum_{j'<=j} exp(clamp(O^_j', -1, 1)), a masked N x N softmax."""
    return _competition(o_hat)


COMPETITION_MISTAKES = [
    Diagnosis("the clamp to [-1, 1] is missing", partial(_competition, clamp=False)),
    Diagnosis("only the upper bound of the clamp is applied; it is clamp(O^, -1, 1)",
              partial(_competition, low=-math.inf)),
    Diagnosis("the clamp is to [0, 1]; it is clamp(O^, -1, 1)", partial(_competition, low=0.0)),
    Diagnosis("the softmax runs over the whole sequence (times N) instead of over the prefix j' <= j",
              partial(_competition, prefix=False)),
    Diagnosis("the prefix softmax is not multiplied by t_j = j + 1", partial(_competition, times_t=False)),
    Diagnosis("the prefix softmax is multiplied by j instead of t_j = j + 1", partial(_competition, t_from=0)),
    Diagnosis("the clamp is applied after the exponential instead of before it",
              partial(_competition, clamp_after_exp=True)),
]  # fmt: skip


def competition_cases(draw: Draw) -> list[Case]:
    def o_hat(n, dtype):  # sizes the statement does not mention
        B, H = draw.int(1, 2), draw.int(1, 3)
        return (draw.randn(B, H, n, scale=draw.uniform(0.5, 3.0), dtype=dtype),), f"O^ ({B}, {H}, {n})"

    def fixed(seed, *shape, dtype=torch.float64):
        return (Draw(seed).randn(*shape, scale=1.5, dtype=dtype),)

    wide = torch.tensor([[[0.2, 1.7, -0.4, 3.0, 0.9, -2.5]]], dtype=torch.float64)  # (1, 1, 6)
    return [
        Case(fixed(0, 1, 2, 9), label="random O^ (1, 2, 9)"),
        Case(fixed(1, 2, 1, 9), label="random O^ (2, 1, 9)"),
        Case((wide,), label="O^ = [0.2, 1.7, -0.4, 3.0, 0.9, -2.5] (beyond the clamp on both sides)"),
        Case((torch.full((1, 2, 1), 0.5, dtype=torch.float64),), label="a single token (N = 1)"),
        Case(fixed(2, 1, 2, 64), label="random O^ (1, 2, 64)", note=FIXED_SIZE),
        Case(fixed(3, 1, 1, 70), label="random O^ (1, 1, 70)", note=FIXED_SIZE),
        Case(fixed(4, 1, 2, 6, dtype=torch.float32), label="float32 O^ (1, 2, 6)"),
        *draw.cases(o_hat, over=9),
    ]


@exercise("3.3")
def check_causal_competition(fn, *, seed: int | None = None) -> Result:
    """Exercise 3.3: ``causal_competition(o_hat)`` -> c (B, H, N) from the raw O^ (B, H, N)."""
    cases = competition_cases(Draw(seed))
    return check_function(
        fn, cases, expected=causal_competition_reference, name="causal_competition", diagnoses=COMPETITION_MISTAKES,
        success=f"causal_competition is right on {len(cases)} inputs, beyond the clamp too, N = 1 to 300.",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 3.4


def largest_competition(m: int) -> float:
    """sup of c_j over inputs for M sources: O^_j = 1, every other O^ -> 0, c_j = M e / (e + M - 1)."""
    return m * math.e / (math.e + m - 1)


@exercise("3.4")
def check_largest_competition(answer) -> Result:
    """Exercise 3.4: the largest competition weight one of M = 8 sources can get (the supremum)."""
    return check_value(
        "3.4 largest competition weight", answer, largest_competition(8), rtol=1e-4,
        hint="after the clamp every O^ lies in (0, 1]; put one at 1 and let the others go to 0",
        mistakes=[
            (math.e, "e is the ratio of the largest to the smallest weight; the weight itself is M times a "
             "softmax, and the other M - 1 sources keep a share of it."),
            (8.0, "8 = M is the limit without the clamp; with it, O^ is at most 1."),
            (8 * math.e**2 / (math.e**2 + 7), "that puts the other sources at -1; O^ is never negative, so "
             "after the clamp they lie in (0, 1] and go to 0, not to -1."),
            (1.0, "1 is the mean weight; one source can get more."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 3.5

CLAMP_SEEDS = (0, 1, 2, 3, 4)  # the toy's seeds over which the eps-only cut at similarity 1 is measured


def clamp_cut(similarity: float, seed: int | None = None) -> float:
    """The amount the clamp cuts off on the toy tokens: sum_j max(O^_j - 1, 0), mean over the heads.

    Measured with :func:`attnbook.viz.flow.make_toy_input` (its defaults, ``seed`` if given) and
    :func:`attnbook.flow_attention` (non-causal, the published eps).
    """
    import attnbook  # deferred: the package imports this module through attnbook.exercises

    from ..viz import flow as flow_viz

    q, k, v = flow_viz.make_toy_input(similarity=similarity, **({} if seed is None else {"seed": seed}))
    _, stats = attnbook.flow_attention(q, k, v, return_flows=True)
    raw = stats.conserved_outgoing_raw  # (1, H, N): O^ before the clamp
    return float((raw - 1).clamp_min(0).sum(-1).mean())


@functools.lru_cache(maxsize=1)
def _eps_floor() -> float:
    """What eps alone makes the clamp cut at similarity 1 (identical tokens), the most over the toy's seeds."""
    return max(clamp_cut(1.0, seed) for seed in CLAMP_SEEDS)


@exercise("3.5")
def check_clamp_similarity(answer) -> Result:
    """Exercise 3.5: the smallest toy similarity at which the clamp cuts off no more than eps alone does.

    The tolerance is measured: the amount cut off at the answer must not exceed the largest amount that eps
    alone cuts off at similarity 1 over the toy's seeds :data:`CLAMP_SEEDS` (about 1e-5).
    """
    name, s = "3.5 similarity", as_number(answer)
    if answer is None or s is None:
        return check_value(name, answer, 1.0)  # "no answer yet" / "expected a number"
    if not (0.0 <= s <= 1.0):
        return Result(False, f"{name}: {s:g} is not a similarity; make_toy_input takes one between 0 and 1.")
    cut, floor = clamp_cut(s), _eps_floor()
    if cut <= floor:
        return Result(True, f"{name}: {s:g} is right: the clamp cuts off {cut:.2g}, what eps alone does.")
    return Result(
        False,
        f"{name}: at similarity {s:g} the clamp still cuts off {cut:.3g} (the sum of max(O^ - 1, 0), mean "
        f"over heads), where eps alone cuts off at most {floor:.2g}. Look at the amount cut off, not at how "
        "many sources it cuts.",
    )
