"""Checkers for the exercises of chapter 4 (Mobile-Attention, Yao et al., ICML 2024).

* 4.1 (derive): the head budget, sum_h O^_hj = H at every token when eps = 0;
* 4.2 (implement): the head-axis conserved outgoing flow O^_hj (before the clamp);
* 4.3 (derive): Mobile's row sums a_hi N / H for inputs whose features are all 1/2;
* 4.4 (explore): how much the spread of small linear-attention heads grows with larger activations, judged
  against the spread of that growth across the seeds of the chapter's own experiment.

4.2's expected result is the literal definition in float64 (the tests confirm that it is
:func:`attnbook.mobile_attention`'s flow); 4.4 reruns the experiment of its cell with
:func:`attnbook.linear_attention`.
"""

from __future__ import annotations

import functools
import math
import statistics

import torch

from ._core import Case, Diagnosis, Draw, Result, _rounded_to, as_number, check_function, check_value, exercise

__all__ = [
    "check_head_budget",
    "check_head_conserved_outgoing",
    "check_row_sums",
    "check_spread_growth",
    "head_conserved_outgoing_reference",
    "spread_growth",
    "SPREAD_SETUP",
]

EPS = 1e-6
FIXED_SIZE = "these inputs are larger than the others: does something depend on a fixed size (H, N)?"


# ------------------------------------------------------------------------------------------------ 4.1


@exercise("4.1")
def check_head_budget(answer) -> Result:
    """Exercise 4.1: sum over the H = 6 heads of O^_hj at one token, for N = 10 tokens, eps = 0."""
    return check_value(
        "4.1 head budget",
        answer,
        6.0,
        hint="swap the sums over the query heads h' and the key heads h",
        mistakes=[
            (10, "10 = N is Flow-Attention's budget of one head over the sequence; in Mobile-Attention the sums "
             "run over the heads at one token."),
            (60, "60 = H N is the total over every head and token; the question asks for one token."),
            (1, "1 is what one query head takes at the token; there are H of them."),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ 4.2


def _qk(seed: int, B: int = 1, H: int = 3, N: int = 5, D: int = 2, scale: float = 1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = scale * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def _outgoing(q, k, *, dim=1, eps_i=(EPS, EPS), eps_o=(EPS, EPS), once=False, sig=True, incoming_from="k", clamp=False):
    """O^ with one piece changed: the axis of the sums, where eps goes, the sigmoid, what I sums, the clamp.

    I_hj = (q~_hj + eps) . (sum_h' k~_h'j + eps);  O^_hj = (k~_hj + eps) . (sum_h' q~_h'j / I_h'j + eps).
    """
    qs, ks = (torch.sigmoid(q.double()), torch.sigmoid(k.double())) if sig else (q.double(), k.double())

    def dot(x, y, eps):
        if once:  # eps added once to the dot product
            return (x * y).sum(-1) + eps[0]
        return ((x + eps[0]) * (y + eps[1])).sum(-1)

    source = ks if incoming_from == "k" else qs
    incoming = dot(qs, source.sum(dim, keepdim=True), eps_i)  # (B, H, N)
    out = dot(ks, (qs / incoming[..., None]).sum(dim, keepdim=True), eps_o)  # (B, H, N)
    return (out.clamp(-1.0, 1.0) if clamp else out).to(q.dtype)


def head_conserved_outgoing_reference(q, k):
    """Mobile-Attention's O^_hj before the clamp, every sum over the heads (dim 1), eps = 1e-6, in float64."""
    return _outgoing(q, k)


CONSERVED_OUTGOING_MISTAKES = [
    Diagnosis(
        "the flow sums run over the sequence (dim -2) instead of the heads (dim 1): that is Flow-Attention's O^",
        lambda q, k: _outgoing(q, k, dim=-2),
    ),
    Diagnosis(
        "the clamp is applied: return O^ before the clamp (the competition clamps it)",
        lambda q, k: _outgoing(q, k, clamp=True),
    ),
    Diagnosis(
        "it is the outgoing flow O: each query head must first be divided by its incoming flow I",
        lambda q, k: _outgoing_only(q, k),
    ),
    Diagnosis(
        "the incoming flow I sums the query heads instead of the key heads at the token",
        lambda q, k: _outgoing(q, k, incoming_from="q"),
    ),
    Diagnosis(
        "eps is left out (the published code adds it to every component of both vectors)",
        lambda q, k: _outgoing(q, k, eps_i=(0.0, 0.0), eps_o=(0.0, 0.0)),
    ),
    Diagnosis(
        "eps is left out of the incoming flow I; it goes into both dot products",
        lambda q, k: _outgoing(q, k, eps_i=(0.0, 0.0)),
    ),
    Diagnosis(
        "eps is left out of the outgoing dot product; it goes into both dot products",
        lambda q, k: _outgoing(q, k, eps_o=(0.0, 0.0)),
    ),
    Diagnosis(
        "eps is added once to each dot product instead of to every component of both vectors",
        lambda q, k: _outgoing(q, k, once=True),
    ),
    Diagnosis(
        "eps is added to one vector of each dot product only (the features); the sums get their own eps too",
        lambda q, k: _outgoing(q, k, eps_i=(EPS, 0.0), eps_o=(EPS, 0.0)),
    ),
    Diagnosis(
        "eps is added to one vector of each dot product only (the sums); the features get their own eps too",
        lambda q, k: _outgoing(q, k, eps_i=(0.0, EPS), eps_o=(0.0, EPS)),
    ),
    Diagnosis(
        "the sigmoid features are missing: q and k are used as they are", lambda q, k: _outgoing(q, k, sig=False)
    ),
]


def _outgoing_only(q, k):
    qs, ks = torch.sigmoid(q.double()), torch.sigmoid(k.double())
    return ((ks + EPS) * (qs.sum(1, keepdim=True) + EPS)).sum(-1).to(q.dtype)  # O, not O^


def conserved_outgoing_cases(draw: Draw | None = None) -> list[Case]:
    draw = Draw(0) if draw is None else draw
    cases = [Case(_qk(seed, scale=2.0), label=f"random q, k (seed {seed}, H = 3, N = 5)") for seed in (0, 1)]
    cases.append(Case(_qk(2, B=2, H=4, N=3, D=3), label="B = 2, H = 4, N = 3, D = 3"))
    cases.append(Case(_qk(3, H=1, N=4), label="a single head (H = 1)"))
    cases.append(Case(_qk(4, B=1, H=4, N=64, D=3, scale=2.0), label="H = 4, N = 64", note=FIXED_SIZE))
    cases.append(Case(_qk(5, B=1, H=8, N=65, D=2), label="H = 8, N = 65", note=FIXED_SIZE))
    cases.append(Case(_qk(6, H=3, N=6, dtype=torch.float32), label="float32 q, k (H = 3, N = 6)"))
    for H, n, dtype in (
        (draw.int(2, 12, avoid=(3, 4, 8)), draw.int(129, 300), torch.float64),
        (draw.int(1, 6), draw.int(2, 20), torch.float32),
    ):  # sizes the statement does not mention
        B, D, scale = draw.int(1, 2), draw.int(1, 12, avoid=(2, 3)), draw.uniform(0.5, 3.0)
        q, k = (draw.randn(B, H, n, D, scale=scale, dtype=dtype) for _ in range(2))
        kind = "" if dtype == torch.float64 else "float32 "
        label = draw.label(f"{kind}q, k ({B}, {H}, {n}, {D})")
        cases.append(Case((q, k), label=label, note=FIXED_SIZE if n > 6 or H > 4 else None))
    return cases


@exercise("4.2")
def check_head_conserved_outgoing(fn, *, seed: int | None = None) -> Result:
    """Exercise 4.2: ``head_conserved_outgoing(q, k)`` -> O^ (B, H, N) of Mobile-Attention, before the clamp.
    ``seed`` draws the random inputs of an earlier call again."""
    cases = conserved_outgoing_cases(Draw(seed))
    return check_function(
        fn,
        cases,
        expected=head_conserved_outgoing_reference,
        name="head_conserved_outgoing",
        diagnoses=CONSERVED_OUTGOING_MISTAKES,
        success=f"head_conserved_outgoing is right on {len(cases)} inputs, H = 1 to 12, N up to 300, float32 included.",
    )


# ------------------------------------------------------------------------------------------------ 4.3


@exercise("4.3")
def check_row_sums(answer) -> Result:
    """Exercise 4.3: sum_j W_hij / a_hi for q = k = 0 (every feature 1/2), N = 12 tokens, H = 3 heads, eps = 0."""
    return check_value(
        "4.3 row sum",
        answer,
        4.0,
        hint="with equal features every capacity is D / 4 and c_hj = 1",
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


def _spread(out: torch.Tensor, values: torch.Tensor) -> float:
    """The chapter's spread: the variance across queries, relative to the values'."""
    return float((out.var(-2).sum(-1) / values.var(-2).sum(-1)).mean())


@functools.lru_cache(maxsize=1024)
def _spread_of(seed: int, D: int, q_scale: float, k_scale: float, v_scale: float) -> float:
    import attnbook  # deferred: the package imports this module through attnbook.exercises

    s = SPREAD_SETUP
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randn(s["batch"], s["tokens"], s["width"], generator=g, dtype=torch.float64)
    proj = [torch.randn(s["width"], s["width"], generator=g, dtype=torch.float64) / s["width"] ** 0.5 for _ in range(3)]
    q, k, v = ((tokens @ p).view(s["batch"], s["tokens"], s["width"] // D, D).transpose(1, 2) for p in proj)
    out = attnbook.linear_attention(q_scale * q, k_scale * k, v_scale * v, feature_map=torch.sigmoid)
    return _spread(out, v)


def spread_growth(seed: int, D: int = 4, q_scale: float = 4.0, k_scale: float = 4.0, v_scale: float = 1.0) -> float:
    """The spread with q, k, v scaled, divided by the spread at scale 1, for heads of width D (seed ``seed``)."""
    return _spread_of(seed, D, q_scale, k_scale, v_scale) / _spread_of(seed, D, 1.0, 1.0, 1.0)


def _measured(seeds: int | None = None, **variant) -> list[float]:
    return [spread_growth(seed, **variant) for seed in range(seeds or SPREAD_SETUP["seeds"])]


def _spread_variants() -> list[tuple[dict, str, str]]:
    """(arguments of spread_growth, a short label, what they mean) for the common slips of the experiment."""
    D, x = SPREAD_SETUP["D"], SPREAD_SETUP["scale"]
    out = [
        ({"D": d}, f"D = {d}", f"that is the growth at D = {d}; the exercise asks for D = {D}")
        for d in (32, 16, 8, 2)
        if d != D
    ]
    out += [
        ({"k_scale": 1.0}, "only q scaled", "only q is scaled; scale q and k by 4"),
        ({"q_scale": 1.0}, "only k scaled", "only k is scaled; scale q and k by 4"),
        ({"v_scale": x}, "v scaled too", "v is scaled too; only q and k are, the values stay as they are"),
        ({"q_scale": 2.0, "k_scale": 2.0}, "scale 2", "that is the growth at scale 2; the exercise scales by 4"),
        ({"q_scale": 16.0, "k_scale": 16.0}, "scale 16", "that is the growth at scale 16; the exercise scales by 4"),
    ]
    return out


def _reproduces(value: float, samples: list[float]) -> int | None:
    """The index of the sample that ``value`` reproduces (to float64 rounding of a float64 experiment), or None."""
    for i, x in enumerate(samples):
        if abs(value - x) <= 1e-6 * abs(x):
            return i
    return None


def _is_mean(value: float, samples: list[float], others: list[float]) -> bool:
    """``value`` is the mean of ``samples``, exactly or as printed (rounded to 3 significant digits or more),
    unless one of ``others`` (the means of the slips) prints the same."""
    mean = statistics.fmean(samples)
    return abs(value - mean) <= 1e-6 * abs(mean) or _rounded_to(value, mean, 1e-12, others) is not None


@exercise("4.4")
def check_spread_growth(answer) -> Result:
    """Exercise 4.4: the factor by which the spread at D = 4 grows when q and k are scaled by 4.

    The statement asks for the mean growth over the seeds 0 .. 7 of the cell's experiment
    (:data:`SPREAD_SETUP`), or the list of those growths. The checker reruns the experiment, which is exact in
    float64, so nothing is judged by the spread across seeds: the mean must be the mean of the seeds 0 .. 7 (to
    float rounding, or rounded to 3 significant digits or more as a cell prints it), each growth of a list must
    reproduce one seed's growth (of the 16 seeds the checker reruns), and so must a single number that is not
    the mean (one seed's growth, the chapter's cell as it stands). Slips of the experiment (another width, only
    q scaled, v scaled too, another scale) are named from the growths and means they give.
    """
    name = "4.4 growth of the spread"
    if isinstance(answer, torch.Tensor) and answer.dim() == 1 and answer.numel() > 1:
        answer = answer.tolist()  # the growths as the solution builds them, before .tolist()
    elif type(answer).__module__ == "numpy" and getattr(answer, "ndim", 0) == 1 and len(answer) > 1:
        answer = answer.tolist()
    if isinstance(answer, (list, tuple)) and answer and all(as_number(a) is not None for a in answer):
        values = [float(as_number(a)) for a in answer]
    else:
        number = as_number(answer)
        if number is None:
            return check_value(name, answer, 1.0)  # "no answer yet" / "expected a number"
        values = [float(number)]
    if not all(math.isfinite(v) and v > 0 for v in values):
        bad = next(v for v in values if not (math.isfinite(v) and v > 0))
        return Result(
            False, f"{name}: {bad:.3g} is not a growth factor; divide the spread at scale 4 by the one at scale 1."
        )
    right = _measured()  # the 16 seeds
    asked = right[:MEAN_OF]  # the seeds 0 .. 7 of the statement
    variants = [(label, meaning, _measured(**v)) for v, label, meaning in _spread_variants()]
    slip_means = [statistics.fmean(samples[:MEAN_OF]) for _, _, samples in variants]
    sd = statistics.stdev(right)

    if len(values) > 1:  # the list of growths: each must be one seed's
        what = f"the mean of your {len(values)} growths, {statistics.fmean(values):.3g},"
        wrong = [v for v in values if _reproduces(v, right) is None]
        if not wrong:
            return Result(
                True, f"{name}: {what} is right: each growth is one seed's; from seed to seed it varies by about "
                f"{sd:.2g}.",
            )  # fmt: skip
        for _, meaning, samples in variants:
            if all(_reproduces(v, samples) is not None for v in wrong):
                return Result(False, f"{name}: {what} is not right: {meaning}.")
        return Result(
            False, f"{name}: {what} is not right: {wrong[0]:.6g} is not the growth of any seed of the cell's "
            "experiment. Hint: run it with q and k multiplied by 4 (before the sigmoid) and divide the two spreads."
        )  # fmt: skip

    value = values[0]
    what = f"{value:.6g}" if abs(value - round(value, 3)) > 1e-12 else f"{value:g}"
    if _is_mean(value, asked, slip_means):
        return Result(
            True, f"{name}: {what} is right: the mean growth over the seeds 0 to {MEAN_OF - 1} is "
            f"{statistics.fmean(asked):.4g}; from seed to seed it varies by about {sd:.2g}.",
        )  # fmt: skip
    seed = _reproduces(value, right)
    if seed is not None:
        return Result(
            True, f"{name}: {what} is right for seed {seed}; the exercise asks for the mean over the seeds 0 to "
            f"{MEAN_OF - 1} (the growth varies by about {sd:.2g} from seed to seed).",
        )  # fmt: skip
    if value < 1:
        return Result(
            False, f"{name}: {what} would mean the spread shrinks; divide the spread with scaled q, k by the "
            "spread without (not the spread itself, nor the other way round)."
        )  # fmt: skip
    for _, meaning, samples in variants:
        if _reproduces(value, samples) is not None or _is_mean(value, samples[:MEAN_OF], [statistics.fmean(asked)]):
            return Result(False, f"{name}: {what} is not right: {meaning}.")
    for n in range(2, len(right) + 1):
        if n != MEAN_OF and abs(value - statistics.fmean(right[:n])) <= 1e-6 * value:
            return Result(
                False, f"{name}: {what} is the mean over the seeds 0 to {n - 1}; the exercise asks for the seeds 0 "
                f"to {MEAN_OF - 1}."
            )  # fmt: skip
    if value == round(value):
        return Result(
            False, f"{name}: {what} is not what the experiment gives (a whole number such as 4^2 = 16 is a guess, "
            "not a measurement). Hint: run the cell's experiment with q and k multiplied by 4 (before the "
            "sigmoid), divide the two spreads, and average over the seeds."
        )  # fmt: skip
    return Result(
        False,
        f"{name}: {what} is not what the experiment gives. Hint: run the cell's experiment with q and k "
        "multiplied by 4 (before the sigmoid), divide the two spreads, and average over the seeds 0 to 7.",
    )
