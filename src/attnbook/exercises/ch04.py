"""Checkers for the exercises of chapter 4 (Mobile-Attention, Yao et al., ICML 2024): 4.1 the head budget, 4.2 the
head-axis conserved outgoing flow O^_hj (before the clamp), 4.3 Mobile's row sums for features of 1/2, 4.4
(explore) how much the spread of small linear-attention heads grows with larger activations.

4.2's expected result is the literal definition in float64 (the tests confirm that it is
:func:`attnbook.mobile_attention`'s flow); 4.4 reruns the experiment of its cell with
:func:`attnbook.linear_attention`.
"""

from __future__ import annotations

import functools
import math
import statistics
from functools import partial

import torch

from . import _core
from ._core import FIXED_SIZE, Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise

EPS = 1e-6
_EPS, _NO_EPS = (EPS, EPS), (0.0, 0.0)  # eps on both vectors of a dot product, on neither


@exercise("4.1")
def check_head_budget(answer) -> Result:
    """Exercise 4.1: sum over the H = 6 heads of O^_hj at one token, for N = 10 tokens, eps = 0."""
    return check_value(
        "4.1 head budget", answer, 6.0, hint="swap the sums over the query heads h' and the key heads h",
        mistakes=[
            (10, "10 = N is Flow-Attention's budget of one head over the sequence; in Mobile-Attention the sums "
             "run over the heads at one token."),
            (60, "60 = H N is the total over every head and token; the question asks for one token."),
            (1, "1 is what one query head takes at the token; there are H of them."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 4.2


def _outgoing(q, k, *, dim=1, eps_i=_EPS, eps_o=_EPS, once=False, sig=True, by_q=False, clamp=False, divide=True):
    """O^ with one piece changed: the axis of the sums, where eps goes, the sigmoid, the heads I sums (``by_q``:
    the query heads), the clamp, the division by I (without it, O itself).

    I_hj = (q~_hj + eps) . (sum_h' k~_h'j + eps);  O^_hj = (k~_hj + eps) . (sum_h' q~_h'j / I_h'j + eps).
    """
    qs, ks = (torch.sigmoid(q.double()), torch.sigmoid(k.double())) if sig else (q.double(), k.double())

    def dot(x, y, eps):
        if once:  # eps added once to the dot product
            return (x * y).sum(-1) + eps[0]
        return ((x + eps[0]) * (y + eps[1])).sum(-1)

    incoming = dot(qs, (qs if by_q else ks).sum(dim, keepdim=True), eps_i) if divide else 1.0  # (B, H, N)
    out = dot(ks, (qs / (incoming[..., None] if divide else 1.0)).sum(dim, keepdim=True), eps_o)  # (B, H, N)
    return (out.clamp(-1.0, 1.0) if clamp else out).to(q.dtype)


def head_conserved_outgoing_reference(q, k):
    """Mobile-Attention's O^_hj before the clamp, every sum over the heads (dim 1), eps = 1e-6, in float64."""
    return _outgoing(q, k)


CONSERVED_OUTGOING_MISTAKES = [
    Diagnosis("the flow sums run over the sequence (dim -2) instead of the heads (dim 1): that is Flow-Attention's O^",
              partial(_outgoing, dim=-2)),
    Diagnosis("the clamp is applied: return O^ before the clamp (the competition clamps it)",
              partial(_outgoing, clamp=True)),
    Diagnosis("it is the outgoing flow O: each query head must first be divided by its incoming flow I",
              partial(_outgoing, divide=False)),
    Diagnosis("the incoming flow I sums the query heads instead of the key heads at the token",
              partial(_outgoing, by_q=True)),
    Diagnosis("eps is left out (the published code adds it to every component of both vectors)",
              partial(_outgoing, eps_i=_NO_EPS, eps_o=_NO_EPS)),
    Diagnosis("eps is left out of the incoming flow I; it goes into both dot products",
              partial(_outgoing, eps_i=_NO_EPS)),
    Diagnosis("eps is left out of the outgoing dot product; it goes into both dot products",
              partial(_outgoing, eps_o=_NO_EPS)),
    Diagnosis("eps is added once to each dot product instead of to every component of both vectors",
              partial(_outgoing, once=True)),
    Diagnosis("eps is added to one vector of each dot product only (the features); the sums get their own eps too",
              partial(_outgoing, eps_i=(EPS, 0.0), eps_o=(EPS, 0.0))),
    Diagnosis("eps is added to one vector of each dot product only (the sums); the features get their own eps too",
              partial(_outgoing, eps_i=(0.0, EPS), eps_o=(0.0, EPS))),
    Diagnosis("the sigmoid features are missing: q and k are used as they are", partial(_outgoing, sig=False)),
]  # fmt: skip


def conserved_outgoing_cases(draw: Draw) -> list[Case]:
    def qk(seed, B=1, H=3, N=5, D=2, scale=1.0, dtype=torch.float64):
        return Draw(seed).randns(2, B, H, N, D, scale=scale, dtype=dtype)

    def random_qk(n, dtype):  # more heads and longer sequences than the statement mentions
        H = draw.int(2, 12, avoid=(3, 4, 8)) if dtype == torch.float64 else draw.int(1, 6)
        B, D, scale = draw.int(1, 2), draw.int(1, 12, avoid=(2, 3)), draw.uniform(0.5, 3.0)
        return draw.randns(2, B, H, n, D, scale=scale, dtype=dtype), f"q, k ({B}, {H}, {n}, {D})", n > 6 or H > 4

    return [
        *(Case(qk(seed, scale=2.0), label=f"random q, k (seed {seed}, H = 3, N = 5)") for seed in (0, 1)),
        Case(qk(2, B=2, H=4, N=3, D=3), label="B = 2, H = 4, N = 3, D = 3"),
        Case(qk(3, H=1, N=4), label="a single head (H = 1)"),
        Case(qk(4, B=1, H=4, N=64, D=3, scale=2.0), label="H = 4, N = 64", note=FIXED_SIZE),
        Case(qk(5, B=1, H=8, N=65, D=2), label="H = 8, N = 65", note=FIXED_SIZE),
        Case(qk(6, H=3, N=6, dtype=torch.float32), label="float32 q, k (H = 3, N = 6)"),
        *draw.cases(random_qk, long=(129, 300), short=(2, 20)),
    ]


@exercise("4.2")
def check_head_conserved_outgoing(fn, *, seed: int | None = None) -> Result:
    """Exercise 4.2: ``head_conserved_outgoing(q, k)`` -> O^ (B, H, N) of Mobile-Attention, before the clamp."""
    cases = conserved_outgoing_cases(Draw(seed))
    return check_function(
        fn, cases, expected=head_conserved_outgoing_reference, name="head_conserved_outgoing",
        diagnoses=CONSERVED_OUTGOING_MISTAKES,
        success=f"head_conserved_outgoing is right on {len(cases)} inputs, H = 1 to 12, N up to 300, float32 included.",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 4.3


@exercise("4.3")
def check_row_sums(answer) -> Result:
    """Exercise 4.3: sum_j W_hij / a_hi for q = k = 0 (every feature 1/2), N = 12 tokens, H = 3 heads, eps = 0."""
    return check_value(
        "4.3 row sum", answer, 4.0, hint="with equal features every capacity is D / 4 and c_hj = 1",
        mistakes=[
            (1, "1 is Flow-Attention's row sum; Mobile's normaliser I_hi sums over the H heads only."),
            (12, "12 = N; the normaliser I_hi still has one term per head, H of them."),
            (3, "3 = H; the sum over j has N terms, each (D/4) / (H D / 4)."),
            (0.25, "0.25 = H / N is upside down: N terms, each 1 / H."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 4.4

# The experiment of the exercise's cell: for a seed, one torch.Generator draws the tokens (batch, tokens, width)
# and then three projections (width, width) / sqrt(width); q, k, v are split into heads of width D; the spread
# is measured with sigmoid features at scale 1 and with q and k multiplied by ``scale``.
SPREAD_SETUP = {"batch": 2, "tokens": 128, "width": 32, "D": 4, "scale": 4.0, "seeds": 16}
MEAN_OF = 8  # the seeds 0 .. 7 over which the statement asks for the mean growth


@functools.lru_cache(maxsize=1024)
def _spread_of(seed: int, D: int, q_scale: float, k_scale: float, v_scale: float) -> float:
    """The chapter's spread: the variance of the output across queries, relative to the values'."""
    import attnbook  # deferred: the package imports this module through attnbook.exercises

    s, g = SPREAD_SETUP, torch.Generator().manual_seed(seed)
    tokens = torch.randn(s["batch"], s["tokens"], s["width"], generator=g, dtype=torch.float64)
    proj = [torch.randn(s["width"], s["width"], generator=g, dtype=torch.float64) / s["width"] ** 0.5 for _ in range(3)]
    q, k, v = ((tokens @ p).view(s["batch"], s["tokens"], s["width"] // D, D).transpose(1, 2) for p in proj)
    out = attnbook.linear_attention(q_scale * q, k_scale * k, v_scale * v, feature_map=torch.sigmoid)
    return float((out.var(-2).sum(-1) / v.var(-2).sum(-1)).mean())


def spread_growth(seed: int, D: int = 4, q_scale: float = 4.0, k_scale: float = 4.0, v_scale: float = 1.0) -> float:
    """The spread with q, k, v scaled, divided by the spread at scale 1, for heads of width D (seed ``seed``)."""
    return _spread_of(seed, D, q_scale, k_scale, v_scale) / _spread_of(seed, D, 1.0, 1.0, 1.0)


def _measured(seeds: int | None = None, **variant) -> list[float]:
    return [spread_growth(seed, **variant) for seed in range(seeds or SPREAD_SETUP["seeds"])]


def _spread_variants() -> list[tuple[dict, str]]:
    """(arguments of spread_growth, what they mean) for the common slips of the experiment."""
    D, x = SPREAD_SETUP["D"], SPREAD_SETUP["scale"]
    return [
        ({"D": d}, f"that is the growth at D = {d}; the exercise asks for D = {D}") for d in (32, 16, 8, 2) if d != D
    ] + [
        ({"k_scale": 1.0}, "only q is scaled; scale q and k by 4"),
        ({"q_scale": 1.0}, "only k is scaled; scale q and k by 4"),
        ({"v_scale": x}, "v is scaled too; only q and k are, the values stay as they are"),
        ({"q_scale": 2.0, "k_scale": 2.0}, "that is the growth at scale 2; the exercise scales by 4"),
        ({"q_scale": 16.0, "k_scale": 16.0}, "that is the growth at scale 16; the exercise scales by 4"),
    ]


def _reproduces(value: float, samples: list[float]) -> int | None:
    """The index of the sample that ``value`` reproduces (to float64 rounding of a float64 experiment), or None."""
    return next((i for i, x in enumerate(samples) if abs(value - x) <= 1e-6 * abs(x)), None)


def _is_mean(value: float, samples: list[float], others: list[float]) -> bool:
    """``value`` is the mean of ``samples``, exactly or as printed (rounded to 3 significant digits or more),
    unless one of ``others`` (the means of the slips) prints the same."""
    mean = statistics.fmean(samples)
    return abs(value - mean) <= 1e-6 * abs(mean) or _core._rounded_to(value, mean, 1e-12, others) is not None


def _growths(answer) -> list[float] | None:
    """The answer as a list of numbers (one number, or a list, tuple, tensor or array of them), else None."""
    if type(answer).__module__ in ("torch", "numpy") and getattr(answer, "ndim", 0) == 1 and len(answer) > 1:
        answer = answer.tolist()  # the growths as the solution builds them, before .tolist()
    if isinstance(answer, (list, tuple)) and answer and all(as_number(a) is not None for a in answer):
        return [float(as_number(a)) for a in answer]
    return None if as_number(answer) is None else [float(as_number(answer))]


@exercise("4.4")
def check_spread_growth(answer) -> Result:
    """Exercise 4.4: the factor by which the spread at D = 4 grows when q and k are scaled by 4.

    The statement asks for the mean growth over the seeds 0 .. 7 of the cell's experiment (:data:`SPREAD_SETUP`),
    or the list of those growths. The checker reruns the experiment, which is exact in float64: the mean must be
    the mean of the seeds 0 .. 7 (to float rounding, or rounded to 3 significant digits or more as a cell prints
    it), and each growth of a list, or a single number that is not the mean, must reproduce one seed's growth (of
    the 16 seeds it reruns). Slips of the experiment (another width, only q scaled, v scaled too, another scale)
    are named from the growths and means they give.
    """
    name, values = "4.4 growth of the spread", _growths(answer)
    if values is None:
        return check_value(name, answer, 1.0)  # "no answer yet" / "expected a number"
    bad = next((v for v in values if not (math.isfinite(v) and v > 0)), None)
    if bad is not None:
        return Result(False, f"{name}: {bad:.3g} is not a growth factor; divide the spread at scale 4 by the one at "
                      "scale 1.")  # fmt: skip
    right = _measured()  # the 16 seeds
    asked = right[:MEAN_OF]  # the seeds 0 .. 7 of the statement
    sd = statistics.stdev(asked)  # over the same seeds, as the solution says (the 16 seeds gave 0.83, it 0.7)
    variants = [(meaning, _measured(**v)) for v, meaning in _spread_variants()]
    hint = "Hint: run the cell's experiment with q and k multiplied by 4 (before the sigmoid), divide the two spreads"

    if len(values) > 1:  # the list of growths: each must be one seed's
        what = f"the mean of your {len(values)} growths, {statistics.fmean(values):.3g},"
        wrong = [v for v in values if _reproduces(v, right) is None]
        if not wrong:
            return Result(True, f"{name}: {what} is right: each growth is one seed's; from seed to seed it varies by "
                          f"about {sd:.2g}.")  # fmt: skip
        for meaning, samples in variants:
            if all(_reproduces(v, samples) is not None for v in wrong):
                return Result(False, f"{name}: {what} is not right: {meaning}.")
        return Result(False, f"{name}: {what} is not right: {wrong[0]:.6g} is not the growth of any seed of the "
                      f"cell's experiment. {hint}.")  # fmt: skip

    value = values[0]
    what = f"{value:.6g}" if abs(value - round(value, 3)) > 1e-12 else f"{value:g}"
    if _is_mean(value, asked, [statistics.fmean(samples[:MEAN_OF]) for _, samples in variants]):
        return Result(True, f"{name}: {what} is right: the mean growth over the seeds 0 to {MEAN_OF - 1} is "
                      f"{statistics.fmean(asked):.4g}; from seed to seed it varies by about {sd:.2g}.")  # fmt: skip
    seed = _reproduces(value, right)
    if seed is not None:
        return Result(True, f"{name}: {what} is right for seed {seed}; the exercise asks for the mean over the seeds "
                      f"0 to {MEAN_OF - 1} (the growth varies by about {sd:.2g} from seed to seed).")  # fmt: skip
    if value < 1:
        return Result(False, f"{name}: {what} would mean the spread shrinks; divide the spread with scaled q, k by "
                      "the spread without (not the spread itself, nor the other way round).")  # fmt: skip
    for meaning, samples in variants:
        if _reproduces(value, samples) is not None or _is_mean(value, samples[:MEAN_OF], [statistics.fmean(asked)]):
            return Result(False, f"{name}: {what} is not right: {meaning}.")
    for n in range(2, len(right) + 1):
        if n != MEAN_OF and abs(value - statistics.fmean(right[:n])) <= 1e-6 * value:
            return Result(False, f"{name}: {what} is the mean over the seeds 0 to {n - 1}; the exercise asks for the "
                          f"seeds 0 to {MEAN_OF - 1}.")  # fmt: skip
    guess = " (a whole number such as 4^2 = 16 is a guess, not a measurement)" if value == round(value) else ""
    return Result(False, f"{name}: {what} is not what the experiment gives{guess}. {hint}, and average over the "
                  f"seeds 0 to {MEAN_OF - 1}.")  # fmt: skip
