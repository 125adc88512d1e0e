"""Checkers for chapter 2 (linear attention): 2.1 the recurrent step (Katharopoulos et al., ICML 2020, Eqs.
16-20, as :func:`attnbook.linear_attention_step` computes it), 2.2 second-order Taylor features (judged by their
kernel: any ordering or packing passes), 2.3 the best chunk length, 2.4 the relative variance of a positive random
feature, 2.5 (explore) the Taylor kernel's weight on the right key of the retrieval toy."""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from .._checks import check_feature_widths, check_features
from ..testing import tol
from ._core import BadReturn, Case, Diagnosis, Draw, Result, check_function, check_value, exercise, randn

EPS = 1e-6  # the eps of attnbook.linear_attention_step


def _phi(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1


# --- 2.1 the recurrent step ----------------------------------------------------------------------------------


class State(NamedTuple):
    """The recurrent state after the tokens so far."""

    S: torch.Tensor  # (B, H, R, Dv): sum of phi(k_j) v_j^T
    z: torch.Tensor  # (B, H, R): sum of phi(k_j)


class Step(NamedTuple):
    """What a step returns: the output of token t and the state after it."""

    out: torch.Tensor  # (B, H, Dv)
    state: State


def linear_step_solution(q, k, v, state) -> Step:
    """S_t = S + phi(k_t) v_t^T, z_t = z + phi(k_t), out = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)."""
    S, z = state
    fq, fk = _phi(q), _phi(k)  # (B, H, R)
    S = S + fk[..., :, None] * v[..., None, :]  # (B, H, R, Dv)
    z = z + fk  # (B, H, R)
    num = (fq[..., None, :] @ S).squeeze(-2)  # (B, H, Dv)
    den = (fq * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
    return Step(num / (den + EPS), State(S, z))


def _slip(q, k, v, state, *, phi=_phi, phi_q=True, outer=None, update_z=True, out=None, first=False, swap=False):
    """The step with one piece changed: the feature map (or none on q), the outer product, z's update, the output's
    formula, the readout ``first`` (before the update), the new state returned as (z, S)."""
    S0, z0 = state
    fq, fk = phi(q) if phi_q else q, phi(k)
    S = S0 + (fk[..., :, None] * v[..., None, :] if outer is None else outer(fk, v))
    z = z0 + fk if update_z else z0
    rS, rz = (S0, z0) if first else (S, z)
    num, den = (fq[..., None, :] @ rS).squeeze(-2), (fq * rz).sum(dim=-1, keepdim=True)
    return Step(num / (den + EPS) if out is None else out(num, den, fq, rz), (z, S) if swap else State(S, z))


_STEP_MISTAKES = [
    Diagnosis("the state is updated after the readout: the output must be read from S_t and z_t, which already contain "
              "token t (a query sees its own key, j <= t)", partial(_slip, first=True)),
    Diagnosis("the output is not normalised: divide phi(q)^T S by phi(q)^T z + eps",
              partial(_slip, out=lambda n, d, fq, z: n)),
    Diagnosis("eps is added to the numerator too: it belongs in the denominator only",
              partial(_slip, out=lambda n, d, fq, z: (n + EPS) / (d + EPS))),
    Diagnosis("eps is added to every feature of z (phi(q)^T (z + eps)) instead of once to the denominator",
              partial(_slip, out=lambda n, d, fq, z: n / (fq * (z + EPS)).sum(-1, keepdim=True))),
    Diagnosis("the denominator has no eps: out = phi(q)^T S / (phi(q)^T z + eps) with eps = 1e-6, which keeps feature "
              "maps that can be 0 (ReLU) from dividing by zero", partial(_slip, out=lambda n, d, fq, z: n / d)),
    Diagnosis("the feature map is not applied to the query", partial(_slip, phi_q=False)),
    Diagnosis("the outer product is transposed: S holds phi(k) v^T, of shape (R, Dv), not v phi(k)^T",
              partial(_slip, outer=lambda fk, v: v[..., :, None] * fk[..., None, :])),
    Diagnosis("z is not updated: z_t = z_{t-1} + phi(k_t)", partial(_slip, update_z=False)),
    Diagnosis("the feature map is applied to the values too: S sums phi(k_j) v_j^T, with the values as they are",
              partial(_slip, outer=lambda fk, v: fk[..., :, None] * _phi(v)[..., None, :])),
    Diagnosis("the feature map is elu alone; it is elu(x) + 1, which keeps every feature positive",
              partial(_slip, phi=lambda x: torch.where(x > 0, x, torch.expm1(x)))),
    Diagnosis("the new state is returned as (z, S); it is (S, z), in the order it came in", partial(_slip, swap=True)),
]  # fmt: skip


def _history(k: torch.Tensor, v: torch.Tensor, dtype=torch.float64) -> State:
    """The state after the tokens k (n, B, H, D), v (n, B, H, Dv)."""
    S = (_phi(k)[..., :, None] * v[..., None, :]).sum(0)  # (B, H, D, Dv)
    return State(S.to(dtype), _phi(k).sum(0).to(dtype))  # (B, H, D, Dv), (B, H, D)


def _token(B: int, H: int, D: int, Dv: int, seed: int, dtype=torch.float64, after: int = 0) -> tuple:
    """q, k, v (B, H, D|Dv) of a token and the state after ``after`` others (S = 0, z = 0 when none)."""
    q, k, v = (randn(seed + i, B, H, d, dtype=dtype) for i, d in enumerate((D, D, Dv)))
    past = (randn(seed + 6, after, B, H, D), randn(seed + 7, after, B, H, Dv))
    return q, k, v, _history(*past, dtype=dtype)


def _step_cases(draw: Draw) -> list[Case]:
    def token(n, dtype):  # a token after 65 to 300 others, or a float32 one; widths D, Dv of 1 to 20
        B, H, D, Dv = draw.int(1, 2), draw.int(1, 3), draw.int(1, 20, avoid=(3, 4, 8)), draw.int(1, 20)
        state = _history(draw.randn(n, B, H, D), draw.randn(n, B, H, Dv), dtype)
        args = (*(draw.randn(B, H, d, dtype=dtype) for d in (D, D, Dv)), state)
        return args, f"q, k, v of a token after {n} others, B = {B}, H = {H}, D = {D}, Dv = {Dv}"

    return [
        Case(_token(2, 3, 4, 4, seed=20), label="the first token (S = 0, z = 0), D = Dv = 4"),
        Case(_token(2, 3, 4, 4, seed=23, after=6), label="a token after 6 others, D = Dv = 4"),
        Case(_token(1, 2, 3, 5, seed=28, after=3), label="a token after 3 others, D = 3, Dv = 5"),
        Case(_token(1, 2, 8, 6, seed=33, after=64), label="a token after 64 others, D = 8, Dv = 6"),
        Case(_token(1, 1, 4, 4, seed=38, dtype=torch.float32, after=5), label="float32, a token after 5 others"),
        *draw.cases(token, long=(65, 300), short=(1, 9)),  # never an empty state
    ]


@exercise("2.1")
def check_linear_step(fn, *, seed: int | None = None) -> Result:
    """Exercise 2.1: ``fn(q, k, v, state)`` -> (out (B, H, Dv), (S (B, H, R, Dv), z (B, H, R)))."""
    return check_function(
        fn, _step_cases(Draw(seed)), expected=linear_step_solution, name="linear_step", diagnoses=_STEP_MISTAKES,
        success="linear_step is right: the state takes the token in, then the query reads it (float32 too).",
    )  # fmt: skip


# --- 2.2 second-order Taylor features --------------------------------------------------------------------------


def taylor_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1 + x.y + (x.y)^2 / 2 for x (..., N, D), y (..., M, D): (..., N, M), exp(x.y) to second order."""
    s = x @ y.transpose(-2, -1)  # (..., N, M)
    return 1 + s + s * s / 2


def _kernel_of(fn):
    """The kernel phi(x) phi(y)^T of the student's feature map, after checking that it maps only the last dim."""

    def kernel(x, y):
        fx, fy = fn(x), fn(y)
        if fx is None or fy is None:  # the unfinished stub: check_function reports it as not done yet
            return None
        # a numpy array is taken as a tensor, as every checker takes it
        fx, fy = (torch.from_numpy(np.array(f)) if isinstance(f, np.ndarray) else f for f in (fx, fy))
        try:
            check_features(fx, x, name="taylor_features", label="x")
            check_features(fy, y, name="taylor_features", label="y")
            check_feature_widths(fx, fy, name="taylor_features", labels=("x", "y"))
        except (TypeError, ValueError) as exc:  # the package's validation of what it returned
            raise BadReturn(f"what taylor_features returned cannot be used as features: {exc}") from None
        return fx @ fy.transpose(-2, -1)

    return kernel


def _dots(x, y):
    return x @ y.transpose(-2, -1)


_TAYLOR_MISTAKES = [
    Diagnosis("the quadratic features are not divided by sqrt(2): their dot products give (x.y)^2 instead of (x.y)^2 / "
              "2", lambda x, y: 1 + _dots(x, y) + _dots(x, y) ** 2),
    Diagnosis("the quadratic features are divided by 2 instead of sqrt(2): their dot products give (x.y)^2 / 4",
              lambda x, y: 1 + _dots(x, y) + _dots(x, y) ** 2 / 4),
    Diagnosis("the constant feature 1 is missing", lambda x, y: _dots(x, y) + _dots(x, y) ** 2 / 2),
    Diagnosis("the quadratic features are the squares x_d^2 only; (x.y)^2 needs every product x_d x_e (the outer "
              "product)", lambda x, y: 1 + _dots(x, y) + _dots(x * x, y * y) / 2),
    Diagnosis("the linear features x are missing", lambda x, y: 1 + _dots(x, y) ** 2 / 2),
    Diagnosis("only the pairs d <= e are kept, each once: (x.y)^2 holds every pair d != e twice (x_d x_e and x_e x_d), "
              "so the packed off-diagonal products need a factor sqrt(2) (or keep all D^2 of them)",
              lambda x, y: 1 + _dots(x, y) + (_dots(x, y) ** 2 + _dots(x * x, y * y)) / 4),
]  # fmt: skip


def _taylor_cases(draw: Draw) -> list[Case]:
    def xy(n, dtype):  # x (N up to 300) and y of widths the statement does not mention
        D, m = draw.int(2, 12, avoid=(3, 4, 5, 8)), draw.int(1, 300)
        batch = [draw.int(1, 2) for _ in range(draw.int(0, 2))]
        lead = "".join(f"{b}, " for b in batch)
        args = (draw.randn(*batch, n, D, dtype=dtype), draw.randn(*batch, m, D, dtype=dtype))
        return args, f"x ({lead}{n}, {D}), y ({lead}{m}, {D})"

    return [
        Case((randn(40, 5, 3), randn(41, 4, 3)), label="x (5, 3), y (4, 3)"),
        Case((randn(42, 2, 3, 6, 4), randn(43, 2, 3, 5, 4)), label="x (2, 3, 6, 4), y (2, 3, 5, 4)"),
        Case((randn(44, 3, 1), randn(45, 2, 1)), label="D = 1"),
        Case((randn(46, 64, 8), randn(47, 70, 8)), label="x (64, 8), y (70, 8)"),
        Case((randn(48, 2, 1, 64, 5, dtype=torch.float32), randn(49, 2, 1, 9, 5, dtype=torch.float32)),
             label="float32 x (2, 1, 64, 5), y (2, 1, 9, 5)"),
        *draw.cases(xy, long=(65, 300), short=(1, 30)),
    ]  # fmt: skip


@exercise("2.2")
def check_taylor_features(fn, *, seed: int | None = None) -> Result:
    """Exercise 2.2: ``fn(x)`` (..., D) -> (..., R) with fn(x) . fn(y) = 1 + x.y + (x.y)^2 / 2."""
    return check_function(
        _kernel_of(fn) if callable(fn) else fn,
        _taylor_cases(Draw(seed)),
        expected=taylor_kernel,
        name="taylor_features",
        diagnoses=_TAYLOR_MISTAKES,
        **tol(torch.float32),  # the kernel sums D^2 products; the mistakes are O(1) (a dtype is named anyway)
        success="taylor_features is right: phi(x) . phi(y) = 1 + x.y + (x.y)^2 / 2, which is never below 1/2.",
    )


# --- 2.3 the chunk length that minimises multiply-adds, 2.4 the relative variance of a positive random feature ---


def chunk_cost(ell: float, N: int, R: int, Dv: int) -> float:
    """Multiply-adds of the chunked causal numerator per head, the cost model of exercise 2.3.

    Per chunk of ell positions: the ell (ell + 1) / 2 pairs j <= i inside it, each a score (R) and a weighted
    value (Dv); the readout phi(Q_c) S and the update phi(K_c)^T V_c, ell R Dv each; adding the update to the
    state, R Dv. Times N / ell chunks: N [(ell + 1) (R + Dv) / 2 + 2 R Dv + R Dv / ell].
    """
    return N * ((ell + 1) * (R + Dv) / 2 + 2 * R * Dv + R * Dv / ell)


def _best(R, Dv):
    return math.sqrt(2 * R * Dv / (R + Dv))


@exercise("2.3")
def check_best_chunk(fn, *, seed: int | None = None) -> Result:
    """Exercise 2.3: ``fn(R, Dv)`` -> the ell minimising :func:`chunk_cost`, sqrt(2 R Dv / (R + Dv))."""
    draw = Draw(seed)
    more = [
        (draw.log_int(2, 4096, avoid=(16, 64, 256, 8)), draw.log_int(2, 4096, avoid=(64, 32, 24))) for _ in range(3)
    ]
    return check_function(
        fn, draw.labelled(lambda r, dv: f"R = {r}, Dv = {dv}", ((16, 64), (64, 64), (256, 32), (1, 1), (8, 24)), more),
        expected=_best, name="best_chunk",
        diagnoses=[
            Diagnosis("every ell x ell pair of a chunk is counted; only the ell (ell + 1) / 2 pairs j <= i are needed",
                      lambda r, dv: math.sqrt(r * dv / (r + dv))),
            Diagnosis("the square root is missing: ell^2 = 2 R Dv / (R + Dv)", lambda r, dv: 2 * r * dv / (r + dv)),
            Diagnosis("an in-chunk pair costs R + Dv (a score, R, and a weighted value, Dv), not R alone",
                      lambda r, dv: math.sqrt(2 * dv)),
            Diagnosis("an in-chunk pair costs R + Dv (a score, R, and a weighted value, Dv), not Dv alone",
                      lambda r, dv: math.sqrt(2 * r)),
            Diagnosis("ell = sqrt(R Dv): the in-chunk term grows like ell (R + Dv) / 2",
                      lambda r, dv: math.sqrt(r * dv)),
            Diagnosis("the minimiser is rounded to a whole number; the question asks for the real ell that sets "
                      "F'(ell) = 0", lambda r, dv: round(_best(r, dv))),
            Diagnosis("the ell (ell + 1) / 2 pairs were counted as ell^2 / 2 and the readout or update left out: ell^2 "
                      "(R + Dv) / 2 = R Dv gives the same ell* only by luck; count every term",
                      lambda r, dv: math.sqrt(r * dv / (r + dv)) * 2),
        ],
        rtol=1e-6, atol=0.0,
        success="best_chunk is right: ell* = sqrt(2 R Dv / (R + Dv)), sqrt(D) = 8 for R = Dv = D = 64.",
    )  # fmt: skip


def _squared(u: torch.Tensor) -> float:
    return float((u**2).sum())


@exercise("2.4")
def check_relative_variance(fn, *, seed: int | None = None) -> Result:
    """Exercise 2.4: ``fn(x, y)`` -> Var[Z] / E[Z]^2 for Z = exp(w.x - |x|^2/2) exp(w.y - |y|^2/2), w ~ N(0, I)."""
    x3, y3 = torch.tensor([[0.3, -0.2, 0.5], [0.1, 0.4, 0.2]], dtype=torch.float64)
    cases = [
        Case((x3, y3), label="x = (0.3, -0.2, 0.5), y = (0.1, 0.4, 0.2)"),
        Case((randn(50, 8, scale=0.4), randn(51, 8, scale=0.4)), label="x, y in R^8"),
        Case((torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)), label="x = y = 0"),
        Case((randn(52, 64, scale=0.1), randn(53, 64, scale=0.1)), label="x, y in R^64"),
    ]
    draw = Draw(seed)
    for _ in range(2):
        d, scale = draw.log_int(2, 400, avoid=(2, 3, 8, 64)), draw.uniform(0.2, 1.0)
        x, y = (draw.randn(d, scale=scale / math.sqrt(d)) for _ in range(2))  # |x + y|^2 about 2 scale^2
        cases.append(Case((x, y), label=draw.label(f"x, y in R^{d}")))
    return check_function(
        fn, cases, expected=lambda x, y: math.expm1(_squared(x + y)), name="relative_variance",
        diagnoses=[
            Diagnosis("this is E[Z^2] / E[Z]^2; the variance is E[Z^2] - E[Z]^2",
                      lambda x, y: math.exp(_squared(x + y))),
            Diagnosis("this is the variance itself, not divided by the squared mean exp(2 x.y)",
                      lambda x, y: math.exp(2 * float(x @ y)) * math.expm1(_squared(x + y))),
            Diagnosis("E[Z^2] came out as E[Z]^2, so there is no variance left: E[exp(2 w.u)] = exp(|2u|^2 / 2) = "
                      "exp(2 |u|^2), not exp(|u|^2)", lambda x, y: 0.0),
            Diagnosis("|x + y|^2 became |x|^2 + |y|^2: the cross term 2 x.y is missing",
                      lambda x, y: math.expm1(_squared(x) + _squared(y))),
            Diagnosis("it is |x - y|^2 in the exponent; w.x and w.y add: w.(x + y)",
                      lambda x, y: math.expm1(_squared(x - y))),
            Diagnosis("the exponent is |x + y|, not squared: E[exp(w.u)] = exp(|u|^2 / 2)",
                      lambda x, y: math.expm1(_squared(x + y) ** 0.5)),
        ],
        rtol=1e-6, atol=1e-12,
        success="relative_variance is right: exp(|x + y|^2) - 1, which explodes for long, aligned x and y.",
    )  # fmt: skip


# --- 2.5 the Taylor kernel on the retrieval toy --------------------------------------------------------------


def _taylor_exact(x: torch.Tensor) -> torch.Tensor:
    """(1, x, x (x) x / sqrt(2)): features whose dot products are 1 + x.y + (x.y)^2 / 2."""
    outer = (x[..., :, None] * x[..., None, :]).flatten(-2)  # (..., D^2)
    return torch.cat([torch.ones_like(x[..., :1]), x, outer / math.sqrt(2)], dim=-1)


def taylor_right_key(beta: float, *, kernel: str = "taylor", scaled: bool = True, measure: int = 1) -> float:
    """The mean weight on the right key of the retrieval toy at inverse temperature ``beta`` (``measure=0``: the mean
    row entropy), for the Taylor kernel on x / D^(1/4) (``scaled=False``: on x), elu + 1 or softmax (``kernel``)."""
    from .. import reference
    from ..viz.linear import retrieval_toy, selectivity  # deferred: viz imports the package

    q, k, v = retrieval_toy()  # (1, 1, 24, 16), float64
    q, k = q * math.sqrt(beta), k * math.sqrt(beta)
    if kernel == "softmax":
        _, w = reference.softmax_attention(q, k, v, return_weights=True)
    elif kernel == "elu":
        _, w = reference.linear_attention(q, k, v, return_weights=True)
    else:
        phi = (lambda x: _taylor_exact(x / x.shape[-1] ** 0.25)) if scaled else _taylor_exact
        _, w = reference.linear_attention(q, k, v, feature_map=phi, return_weights=True)
    return selectivity(w)[measure]


TAYLOR_BETA = 64  # the β of exercise 2.5's answer
TAYLOR_PRINTED_DIGITS = 2  # the solution prints the weights with 2 decimals (0.38), 2 significant digits


@exercise("2.5")
def check_taylor_selectivity(answer) -> Result:
    """Exercise 2.5: the Taylor kernel's mean weight on the right key of the retrieval toy at β = 64, measured again
    (:func:`taylor_right_key`); as the cell prints it, to 2 decimals, too, unless a known slip rounds the same."""
    b = TAYLOR_BETA
    return check_value(
        "2.5 weight on the right key", answer, taylor_right_key(b), digits=TAYLOR_PRINTED_DIGITS,
        hint=f"apply taylor_features to x / D^(1/4) as the feature map of reference.linear_attention on q, k "
        f"times sqrt({b}), and take selectivity(weights)[1]",
        mistakes=[
            (taylor_right_key(b, kernel="softmax"), f"that is softmax's weight at β = {b}; the question asks for "
             "the Taylor kernel's."),
            (taylor_right_key(b, kernel="elu"), f"that is elu + 1's weight at β = {b}; the question asks for the "
             "Taylor kernel's."),
            (taylor_right_key(b, scaled=False), "that is the Taylor kernel on x itself; apply it to x / D^(1/4), "
             "so that it approximates exp(q.k / sqrt(D))."),
            (taylor_right_key(1), f"that is the weight at β = 1; the question asks for β = {b}."),
            (taylor_right_key(4), f"that is the weight at β = 4; the question asks for β = {b}."),
            (taylor_right_key(b, measure=0), "that is the mean row entropy, selectivity(...)[0]; the weight on "
             "the right key is selectivity(...)[1]."),
            (1 / 24, "1/24 is the weight of a uniform map over the 24 keys."),
        ],
    )  # fmt: skip
