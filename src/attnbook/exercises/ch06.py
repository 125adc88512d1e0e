"""Checkers for the exercises of chapter 6 (head to head).

* 6.1 (derive): the sequence length N* at which linear attention's matrix-product FLOPs equal softmax
  attention's, for D = 32 and D_v = 64; checked against ``torch.utils.flop_counter`` on the package.
* 6.2 (implement): a timing-free cost model, the matrix-product FLOPs of softmax and linear attention for
  any (B, H, N, D, D_v); checked against the FLOPs torch counts when the package runs.
* 6.3 (explore): does a training step's time follow its operator count? Fit the race's times and predict
  Mobile-Attention's; checked by refitting the same numbers.
* 6.4 (explore): how many heads of a trained softmax model do the lookup; checked with
  :func:`attnbook.lab.headtohead.lookup_share`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import reference
from ..linear import linear_attention
from ._core import Case, Diagnosis, Result, check_function, check_value, exercise

__all__ = ["check_crossover", "check_matmul_flops", "check_step_time_fit", "check_lookup_heads", "CROSSOVER"]

CROSSOVER = {"D": 32, "Dv": 64}  # the widths of exercise 6.1

_FUNCTIONS = {"softmax": reference.softmax_attention, "linear": linear_attention}


def _counted_flops(mechanism: str, B: int, H: int, N: int, D: int, Dv: int) -> int:
    """The matrix-product FLOPs torch counts while the package computes ``mechanism`` on these shapes.

    Softmax is counted on its literal float64 definition (SDPA's fused kernel hides its products from the
    counter on some backends); linear attention on :func:`attnbook.linear_attention` itself.
    """
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    with FlopCounterMode(display=False) as counter:
        _FUNCTIONS[mechanism](q, k, v)
    return int(counter.get_total_flops())


# ----------------------------------------------------------------------------------------------- 6.1


def _crossover(D: int, Dv: int) -> float:
    """N* with equal counts: softmax's count is a N^2 and linear's b N (N >= 2), so N* = b / a."""
    a = _counted_flops("softmax", 1, 1, 2, D, Dv) / 4  # a N^2 at N = 2
    b = _counted_flops("linear", 1, 1, 2, D, Dv) / 2  # b N at N = 2
    return b / a


@exercise("6.1")
def check_crossover(answer) -> Result:
    """Exercise 6.1: the crossover N* for D = 32, D_v = 64."""
    return check_value(
        "6.1 crossover N*",
        answer,
        _crossover(CROSSOVER["D"], CROSSOVER["Dv"]),
        rtol=1e-9,
        hint="softmax: 2 N^2 D + 2 N^2 D_v per head; linear: 4 N D D_v + 2 N D (the normaliser).",
    )


# ----------------------------------------------------------------------------------------------- 6.2


def _right(mechanism, B, H, N, D, Dv):
    if mechanism == "softmax":
        return B * H * (2 * N * N * D + 2 * N * N * Dv)
    return B * H * (4 * N * D * Dv + 2 * N * D)


def _half(mechanism, B, H, N, D, Dv):
    return _right(mechanism, B, H, N, D, Dv) // 2


def _no_value_product(mechanism, B, H, N, D, Dv):
    if mechanism == "softmax":
        return B * H * 2 * N * N * D
    return _right(mechanism, B, H, N, D, Dv)


def _no_normaliser(mechanism, B, H, N, D, Dv):
    if mechanism == "linear":
        return B * H * 4 * N * D * Dv
    return _right(mechanism, B, H, N, D, Dv)


def _d_for_dv(mechanism, B, H, N, D, Dv):
    return _right(mechanism, B, H, N, D, D)


def _per_head(mechanism, B, H, N, D, Dv):
    return _right(mechanism, 1, 1, N, D, Dv)


def _flop_cases() -> list[Case]:
    # First the cases on which every diagnosed mistake gives a different number (D_v != D, B H = 3).
    shapes = [
        ("softmax", 1, 3, 10, 4, 6, "softmax, B = 1, H = 3, N = 10, D = 4, D_v = 6"),
        ("linear", 1, 3, 10, 4, 6, "linear, B = 1, H = 3, N = 10, D = 4, D_v = 6"),
        ("softmax", 1, 1, 3, 2, 2, "softmax, the worked example (N = 3, D = 2)"),
        ("linear", 1, 1, 3, 2, 2, "linear, the worked example (N = 3, D = 2)"),
        ("softmax", 2, 4, 16, 8, 8, "softmax, B = 2, H = 4, N = 16, D = 8"),
        ("linear", 2, 4, 16, 8, 8, "linear, B = 2, H = 4, N = 16, D = 8"),
    ]
    return [Case((m, B, H, N, D, Dv), label=label) for m, B, H, N, D, Dv, label in shapes]


def _expected_flops(mechanism, B, H, N, D, Dv):
    return _counted_flops(mechanism, B, H, N, D, Dv)


@exercise("6.2")
def check_matmul_flops(fn) -> Result:
    """Exercise 6.2: ``matmul_flops(mechanism, B, H, N, D, Dv)`` -> the FLOPs of the matrix products."""
    return check_function(
        fn,
        _flop_cases(),
        expected=_expected_flops,
        name="matmul_flops",
        success="matmul_flops matches torch's FLOP counter on all 6 shapes.",
        rtol=0.0,
        atol=0.0,
        diagnoses=[
            Diagnosis("a multiply-add is counted as one FLOP; torch counts it as two", _half),
            Diagnosis("softmax's second product, the weights times V, is missing", _no_value_product),
            Diagnosis("linear attention's normaliser phi(Q) z (2 N D per head) is missing", _no_normaliser),
            Diagnosis("D is used where the value width D_v belongs", _d_for_dv),
            Diagnosis("the count is for one head of one sequence: multiply by B H", _per_head),
        ],
    )


# ----------------------------------------------------------------------------------------------- 6.3


def _fit(ops: Mapping[str, float], ms: Mapping[str, float], leave_out: str) -> float:
    """Least-squares ms = a + b ops over every mechanism but ``leave_out``; the prediction for it."""
    names = [n for n in ops if n != leave_out]
    x = torch.tensor([float(ops[n]) for n in names], dtype=torch.float64)
    y = torch.tensor([float(ms[n]) for n in names], dtype=torch.float64)
    b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    a = y.mean() - b * x.mean()
    return float(a + b * float(ops[leave_out]))


@exercise("6.3")
def check_step_time_fit(answer, *, ops: Mapping[str, float], ms: Mapping[str, float]) -> Result:
    """Exercise 6.3: the step time of Mobile-Attention predicted from the others' (ops, ms) by a line."""
    if "mobile" not in ops or set(ops) != set(ms) or len(ops) < 3:
        return Result(False, "6.3: ops and ms must name the same mechanisms, mobile and at least two others")
    return check_value(
        "6.3 predicted mobile ms/step",
        answer,
        _fit(ops, ms, "mobile"),
        rtol=1e-6,
        hint="fit ms = a + b * ops by least squares on every mechanism except mobile, then evaluate it at "
        "mobile's operator count.",
    )


# ----------------------------------------------------------------------------------------------- 6.4


@exercise("6.4")
def check_lookup_heads(answer, *, model, tokens, task, threshold: float = 0.5) -> Result:
    """Exercise 6.4: heads of ``model`` whose mean lookup share on ``tokens`` is above ``threshold``."""
    from ..lab.headtohead import lookup_share

    share = lookup_share(model, tokens, task).mean(0)  # (H,)
    return check_value(
        "6.4 heads that do the lookup",
        answer,
        int((share > threshold).sum()),
        rtol=0.0,
        atol=0.0,
        hint="lookup_share(model, tokens, task) is (B, H); average over the sequences, then count.",
    )
