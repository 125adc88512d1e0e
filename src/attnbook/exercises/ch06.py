"""Checkers for chapter 6 (head to head): 6.1 the crossover N* and 6.2 a cost model worked out by hand, both
checked against the FLOPs ``torch.utils.flop_counter`` counts on the package; 6.3 (explore) Mobile-Attention's
step time predicted by a line through the race's times; 6.4 (explore) how many heads do the lookup."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .. import reference
from ..linear import linear_attention
from ._core import Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise

CROSSOVER = {"D": 32, "Dv": 64}  # the widths of exercise 6.1

_FUNCTIONS = {"softmax": reference.softmax_attention, "linear": linear_attention}


def _counted_flops(mechanism: str, B: int, H: int, N: int, D: int, Dv: int) -> int:
    """The matrix-product FLOPs torch counts while the package computes ``mechanism`` on these shapes (softmax on
    its literal float64 definition: SDPA's fused kernel hides its products from the counter on some backends)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, d, generator=g, dtype=torch.float64) for d in (D, D, Dv))
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
    D, Dv = CROSSOVER["D"], CROSSOVER["Dv"]
    return check_value(
        "6.1 crossover N*", answer, _crossover(D, Dv), rtol=1e-9,
        hint="softmax: 2 N^2 D + 2 N^2 D_v per head; linear: 4 N D D_v + 2 N D (the normaliser).",
        mistakes=[
            (D + 0.5, f"{D + 0.5:g} = D + 1/2 is the crossover for D_v = D; here D_v = {Dv}."),
            (2 * D * Dv / (D + Dv), "the normaliser's 2 N D is missing from linear attention's count."),
            (4 * D * Dv / (D + Dv), "softmax's count is 2 N^2 (D + D_v); the factor 2 is on both sides."),
            (D * (2 * Dv + 1) / Dv, "softmax's count has both products, 2 N^2 D and 2 N^2 D_v."),
        ],
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- 6.2


def _flops(mechanism, B, H, N, D, Dv, *, fma=2, av=True, normaliser=True, dv_is_d=False, batch=True, heads=True):
    """The matrix-product FLOPs with one piece changed: a multiply-add counted as ``fma`` FLOPs, softmax's product
    with V or linear attention's normaliser left out, D for D_v, the batch or the heads left out."""
    Dv = D if dv_is_d else Dv
    if mechanism == "softmax":
        per_head = N * N * D + (N * N * Dv if av else 0)  # Q K^T, then A V
    else:
        per_head = 2 * N * D * Dv + (N * D if normaliser else 0)  # phi(K)^T V and phi(Q) S, then phi(Q) z
    return (B if batch else 1) * (H if heads else 1) * fma * per_head


_half = partial(_flops, fma=1)
_no_value_product = partial(_flops, av=False)
_no_normaliser = partial(_flops, normaliser=False)
_d_for_dv = partial(_flops, dv_is_d=True)
_per_head = partial(_flops, batch=False, heads=False)
_no_batch, _no_heads = partial(_flops, batch=False), partial(_flops, heads=False)


def _flop_cases(draw: Draw) -> list[Case]:
    # No B = 2 (a forgotten B would look like a halved count), B != H, D_v != D where it matters; N up to 100, and
    # two shapes drawn on every call (N up to 300, widths the statement does not mention).
    more = []
    for mechanism, n in (("softmax", draw.int(101, 300)), ("linear", draw.int(101, 300))):
        B = draw.choice((1, 3))
        H = draw.choice([h for h in (1, 3, 4) if h != B])
        D = draw.int(3, 48, avoid=(4, 6, 8, 16))  # not 1: torch multiplies a width-1 q k^T without a product
        more.append((mechanism, B, H, n, D, draw.int(1, 48, avoid=(D,))))
    fixed = [
        (m, *shape) for shape in ((1, 3, 10, 4, 6), (1, 1, 3, 2, 2), (3, 2, 64, 8, 5)) for m in ("softmax", "linear")
    ]
    fixed += [("softmax", 5, 4, 100, 6, 8), ("linear", 5, 4, 100, 16, 4)]
    return draw.labelled(lambda m, B, H, N, D, Dv: f"{m}, B = {B}, H = {H}, N = {N}, D = {D}, D_v = {Dv}", fixed, more)


# aten's matrix products, as FlopCounterMode knows them: a cost model worked out by hand runs none of them
_PRODUCTS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "dot", "vdot", "mv", "addmv", "einsum",
                       "linear", "convolution", "_convolution", "convolution_overrideable"})  # fmt: skip


class _Products(TorchDispatchMode):
    """Appends to ``ran`` the matrix products that run while it is active (under nested modes, on meta tensors too)."""

    def __init__(self, ran: list[str]):
        super().__init__()
        self.ran = ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _PRODUCTS or name.startswith("_scaled_dot_product") or name.startswith("_flash_attention"):
            self.ran.append(name)
        return func(*args, **(kwargs or {}))


MEASURES = (
    "runs {n} matrix products ({names}) to find the count: that is a measurement (FlopCounterMode, "
    "matmul_flops), not a cost model. Work the count out by hand from the shapes of the products, with "
    "arithmetic on B, H, N, D and D_v only"
)


def _recording(fn, ran: list[str]):
    """``fn`` with the matrix products each call runs appended to ``ran``."""

    @functools.wraps(fn)
    def model(*args, **kwargs):
        with _Products(ran):
            return fn(*args, **kwargs)

    return model


@exercise("6.2")
def check_matmul_flops(fn, *, seed: int | None = None) -> Result:
    """Exercise 6.2: ``matmul_flops(mechanism, B, H, N, D, Dv)`` -> the FLOPs of the matrix products, worked out by
    hand: a function that runs matrix products to count them is rejected."""
    cases, ran = _flop_cases(Draw(seed)), []
    result = check_function(
        _recording(fn, ran) if callable(fn) else fn,
        cases,
        expected=_counted_flops,
        name="matmul_flops",
        success=f"matmul_flops matches torch's FLOP counter on all {len(cases)} shapes (N up to 300).",
        rtol=0.0,
        atol=0.0,
        diagnoses=[
            Diagnosis("a multiply-add is counted as one FLOP; torch counts it as two", _half),
            Diagnosis("softmax's second product, the weights times V, is missing", _no_value_product),
            Diagnosis("linear attention's normaliser phi(Q) z (2 N D per head) is missing", _no_normaliser),
            Diagnosis("D is used where the value width D_v belongs", _d_for_dv),
            Diagnosis("the count is for one head of one sequence: multiply by B H", _per_head),
            Diagnosis("the batch size B is missing: every sequence runs the same products", _no_batch),
            Diagnosis("the number of heads H is missing: every head runs the same products", _no_heads),
        ],
    )
    if ran:  # right or wrong, a measurement is not what the exercise asks for
        return Result(False, "matmul_flops " + MEASURES.format(n=len(ran), names=", ".join(dict.fromkeys(ran))) + ".")
    return result


# ----------------------------------------------------------------------------------------------- 6.3


def _line(ops, ms, names, at: float, *, dtype=torch.float64, lstsq=False, slope=False) -> float:
    """The least-squares line ms = a + b ops through the mechanisms ``names`` (its closed form, or
    ``torch.linalg.lstsq``), evaluated at ``at`` ops; its ``slope`` b instead."""
    x = torch.tensor([float(ops[n]) for n in names], dtype=dtype)
    y = torch.tensor([float(ms[n]) for n in names], dtype=dtype)
    if lstsq:
        a, b = torch.linalg.lstsq(torch.stack([torch.ones_like(x), x], dim=1), y[:, None]).solution[:, 0]
    else:
        b = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
        a = y.mean() - b * x.mean()
    return float(b if slope else a + b * at)


def _numbers(table, name: str) -> tuple[dict[str, float] | None, str | None]:
    """``table`` as {mechanism: float}, or None and what is wrong with it (a Summary where a number belongs)."""
    if not isinstance(table, Mapping):
        return None, f"{name} must be a dict of numbers, one per mechanism, got {type(table).__name__}"
    out = {}
    for key, value in table.items():
        number = as_number(value)
        if number is None:
            what = f"{name}[{key!r}] is a {type(value).__name__}"
            if hasattr(value, "step_ms"):
                return None, f"{what}, not a number: pass its step_ms (race.summary(m).step_ms), as the cell does"
            return None, f"{what}, expected a number"
        out[str(key)] = float(number)
    return out, None


PRINTED_MS_DECIMALS = 1  # the exercise's cell prints the times with {ms[m]:5.1f} (the operations are whole numbers)


@exercise("6.3")
def check_step_time_fit(answer, *, ops: Mapping[str, float], ms: Mapping[str, float]) -> Result:
    """Exercise 6.3: the step time of Mobile-Attention predicted from the others' (ops, ms) by a line.

    The tolerance is the spread arithmetic gives the fit, measured: float32 (two ways) against float64. The fit of
    the times as the cell prints them (to :data:`PRINTED_MS_DECIMALS` decimals) is computed and accepted too: that
    rounding moves the prediction by more than a one-digit change, so no wider tolerance could allow for it."""
    name = "6.3 predicted mobile ms/step"
    ops_, problem = _numbers(ops, "ops")
    ms_, problem = (None, problem) if problem else _numbers(ms, "ms")
    if problem:
        return Result(False, f"6.3: {problem}.")
    if "mobile" not in ops_ or set(ops_) != set(ms_) or len(ops_) < 3:
        return Result(False, "6.3: ops and ms must name the same mechanisms, mobile and at least two others")
    others, at = [n for n in ops_ if n != "mobile"], ops_["mobile"]
    expected = _line(ops_, ms_, others, at)
    if not math.isfinite(expected):
        return check_value(name, answer, expected)  # "undefined for these inputs": all the others' ops are equal
    low = [_line(ops_, ms_, others, at, dtype=torch.float32, lstsq=lstsq) for lstsq in (False, True)]
    spread = max(abs(x - expected) for x in low) / max(abs(expected), 1e-12)
    b = _line(ops_, ms_, others, at, slope=True)
    through_origin = sum(ops_[n] * ms_[n] for n in others) / sum(ops_[n] ** 2 for n in others) * at
    printed = {n: float(f"{t:.{PRINTED_MS_DECIMALS}f}") for n, t in ms_.items()}  # as the cell shows them
    from_printed = _line(ops_, printed, others, at)
    judge = functools.partial(
        check_value,
        name,
        answer,
        rtol=max(1e-9, 10 * spread),
        hint="fit ms = intercept + slope * ops by least squares on every mechanism except mobile, then "
        "evaluate it at mobile's operator count.",
        mistakes=[
            (ms_["mobile"], "that is mobile's measured time; the exercise asks what the fit predicts for it."),
            (
                _line(ops_, ms_, list(ops_), at, lstsq=True),
                "the fit includes mobile itself; fit the other mechanisms only, then predict mobile.",
            ),
            (through_origin, "the line goes through the origin; fit an intercept too (ms = intercept + slope * ops)."),
            (b, "that is the slope; predict intercept + slope * ops['mobile']."),
            (b * at, "the intercept is missing from the prediction intercept + slope * ops['mobile']."),
            (statistics.fmean(ms_[n] for n in others), "that is the others' mean time; use the line's slope too."),
        ],
    )
    exact = judge(expected)
    if exact.passed or not math.isfinite(from_printed):
        return exact
    if judge(from_printed).passed:
        value = float(as_number(answer))
        return Result(
            True, f"{name}: {value:.6g} is right: the fit of the times as the cell prints them (to "
            f"{10 ** -PRINTED_MS_DECIMALS:g} ms); the unrounded times give {expected:.6g}.",
        )  # fmt: skip
    return exact


# ----------------------------------------------------------------------------------------------- 6.4


_ROUNDING = 1e-6  # a mean share this close to the threshold may be counted either way (float rounding only)


@exercise("6.4")
def check_lookup_heads(answer, *, model, tokens, task, threshold: float = 0.5) -> Result:
    """Exercise 6.4: heads of ``model`` whose mean lookup share on ``tokens`` is above ``threshold``.

    The checker averages the same probe sequences the student does, so the count is exact: only a head whose
    mean share is within float rounding (1e-6) of the threshold may be counted either way. A wrong
    count is told which head lies close to the threshold, if one does.
    """
    from ..lab.headtohead import RecallTask, TinyModel, lookup_share

    name, race = "6.4 heads that do the lookup", "race.curves[name][seed].model"
    if isinstance(getattr(model, "model", None), TinyModel) and not isinstance(model, TinyModel):
        return Result(False, f"6.4: model= is a {type(model).__name__}, not a model: pass its trained model, {race}, "
                      "as the exercise's cell does.")  # fmt: skip
    if not isinstance(model, TinyModel):
        return Result(False, f"6.4: model= must be a trained TinyModel ({race}), got a {type(model).__name__}.")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        return Result(False, "6.4: tokens= must be the (sequences, N) probe batch of the task (task.batch(...)[0]).")
    if not isinstance(task, RecallTask):
        return Result(False, f"6.4: task= must be the race's RecallTask, got a {type(task).__name__}.")
    mean = lookup_share(model, tokens, task).double().mean(0)  # (H,): each head's mean share over the probe
    on_edge = (mean - threshold).abs() <= _ROUNDING
    sure, borderline, heads = int(((mean > threshold) & ~on_edge).sum()), int(on_edge.sum()), int(mean.numel())
    value = as_number(answer)
    if value is not None and math.isfinite(value) and value != round(value):
        return Result(False, f"{name}: {value:g} is not a count; count the heads whose mean share is above one half.")
    if value is not None and sure <= value <= sure + borderline:
        return Result(True, f"{name}: {value:g} is right.")
    if value is None:
        return check_value(name, answer, sure)  # "no answer yet" / "expected a number, got ..."
    if value == heads - sure - borderline and not sure <= heads - sure - borderline <= sure + borderline:
        return Result(False, f"{name}: {value:g} is not right: that counts the heads below one half.")
    close = [h for h in range(heads) if 0 < abs(float(mean[h]) - threshold) <= 0.05]
    if abs(value - sure) == 1 and close:
        near = ", ".join(f"head {h} ({float(mean[h]):.3f})" for h in close)
        return Result(False, f"{name}: {value:g} is not right, by one: {near} lies close to one half; compare each "
                      "head's mean share with 0.5 itself (the mean over the same sequences is exact, no margin is "
                      "allowed).")  # fmt: skip
    return Result(False, f"{name}: {value:g} is not right. Hint: lookup_share(model, tokens, task) is (sequences, "
                  "heads); average over the sequences, then count the heads above one half.")  # fmt: skip
